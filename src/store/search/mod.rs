//! Full-text search (issue 35): the text of every file the store can read (text files, the
//! text layer of PDFs: `crate::preview::extract_text`), indexed in idle time, asked by words.
//!
//! **Keyed by the bytes, placed by the tree.** The index holds the text of each blob
//! (`search_docs`, and FTS5's `search_text` on SQLite or a tsvector under a GIN index on
//! PostgreSQL), as previews do: copies share it, a new version gets its own. Which files match,
//! whose they are and where they are come from the tree when the question is asked (a file
//! matches through its *current* version; its path is read up its parents; another account's
//! files are filtered out in the same statement, as listings check the account). So a new
//! version's old words are gone the moment it is current, a delete or a move needs no index
//! change, and a blob's text goes with the blob (a trigger).
//!
//! **Idle time** ([`index`]): one thread, at the background previews' priority, waits for the
//! store to be idle as they do (no write for `IDLE_AFTER`, no asked-for preview), then indexes
//! the current versions not indexed yet. A text file is read in process (its first
//! [`INDEX_MAX_CHARS`] bytes, as UTF-8); a PDF is read in the previews' child process, under
//! the same memory, CPU and time bounds (`previews::sandbox`, `render-preview pdf-text`).

mod context;
mod index;

pub(super) use index::Indexer;

use super::db::{Conn as Connection, OptionalExtension, params};
use super::nodes::{MAX_WALK_DEPTH, resolve};
use super::{Scope, Store};
use crate::api::{Error, NodePath, Result, SearchHit, SearchResults};
pub use crate::preview::INDEX_MAX_CHARS;

/// The most hits an answer holds.
pub const MAX_LIMIT: u64 = 1000;
/// Rows read per round while hits outside the folder asked for are skipped.
const ROUND: i64 = 200;

impl Store {
    /// The files under `dir` (the root: the whole scope) whose current text holds every word
    /// of `query` (a trailing `*` makes a word a prefix, on SQLite), best first, at most
    /// `limit`.
    pub fn search(
        &self,
        scope: Scope,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> Result<SearchResults> {
        let words: Vec<&str> = query.split_whitespace().collect();
        if words.is_empty() {
            return Err(Error::bad_request(
                "bad_parameter",
                "`q`: no words to search for",
            ));
        }
        let limit = limit.clamp(1, MAX_LIMIT) as usize;
        let conn = self.lock()?;
        let within = if dir.is_root() {
            None
        } else {
            Some(resolve(&conn, scope, dir)?.id)
        };
        let account = match scope {
            Scope::All => 0,
            Scope::Account(a) => a,
        };
        let pg = conn.is_pg();
        let (sql, q) = if pg {
            (PG_QUERY, words.join(" "))
        } else {
            (SQLITE_QUERY, fts5_query(&words))
        };
        let terms = context::Terms::new(&words, !pg);
        let mut hits = Vec::new();
        let mut offset = 0;
        loop {
            let rows: Vec<(i64, i64)> = conn
                .prepare_cached(sql)?
                .query_map(params![q.as_str(), account, ROUND, offset], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect::<super::db::Result<_>>()?;
            let n = rows.len() as i64;
            for (id, doc) in rows {
                let Some(path) = place(&conn, id, within)? else {
                    continue;
                };
                if hits.len() == limit {
                    return Ok(SearchResults { hits, more: true });
                }
                // Only for the hits kept (made for every row read, a word in every document
                // took 450 ms of a 10,000-document vault's answer: docs/benchmarks-search.md).
                let context = context_of(&conn, pg, &q, doc, &terms)?;
                hits.push(SearchHit {
                    id: id.to_string(),
                    uri: path.uri(),
                    context,
                });
            }
            if n < ROUND {
                return Ok(SearchResults { hits, more: false });
            }
            offset += ROUND;
        }
    }
}

impl Store {
    /// Current versions not indexed yet (the indexer's backlog; for the tests and the bench).
    pub fn search_backlog(&self) -> Result<u64> {
        let conn = self.lock()?;
        let n: i64 = conn.query_row(
            "SELECT count(DISTINCT v.blob) FROM nodes n JOIN versions v ON v.id = n.current_version
             WHERE n.kind = 3 AND v.blob IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM search_docs d WHERE d.blob = v.blob)",
            [],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }
}

/// Matching files and their documents' rows, best first (?1 the words, ?2 the account or 0 for
/// all, ?3 and ?4 the page). Files of trees being purged are left to [`place`].
const SQLITE_QUERY: &str = "
    SELECT n.id, d.id
    FROM search_text JOIN search_docs d ON d.id = search_text.rowid
    JOIN versions v ON v.blob = d.blob JOIN nodes n ON n.current_version = v.id
    WHERE search_text MATCH ?1 AND n.kind = 3 AND (n.account_id = ?2 OR ?2 = 0)
    ORDER BY search_text.rank, n.id LIMIT ?3 OFFSET ?4";

/// The text of document ?1.
const SQLITE_BODY: &str = "SELECT body FROM search_text WHERE rowid = ?1";

/// The line of context of document ?2 for the words ?1, by FTS5 (reads the whole text).
const SQLITE_CONTEXT: &str = "
    SELECT snippet(search_text, 0, '', '', '…', 16) FROM search_text
    WHERE search_text MATCH ?1 AND rowid = ?2";

const PG_QUERY: &str = "
    SELECT n.id, d.id
    FROM search_docs d JOIN versions v ON v.blob = d.blob
    JOIN nodes n ON n.current_version = v.id, plainto_tsquery('simple', ?1) q
    WHERE d.tsv @@ q AND n.kind = 3 AND (n.account_id = ?2 OR ?2 = 0)
    ORDER BY ts_rank(d.tsv, q) DESC, n.id LIMIT ?3 OFFSET ?4";

const PG_BODY: &str = "SELECT body FROM search_docs WHERE id = ?1";

/// As `SQLITE_CONTEXT`, by `ts_headline` (reads the whole text too).
const PG_CONTEXT: &str = "
    SELECT ts_headline('simple', d.body, q,
        'MaxWords=16, MinWords=8, StartSel=\"\", StopSel=\"\", MaxFragments=1')
    FROM search_docs d, plainto_tsquery('simple', ?1) q WHERE d.id = ?2";

/// The line of context of document `doc`: made from its text by [`context::line`], or by the
/// database's own function (which tokenizes the whole text) where that finds none of the words
/// (one the database folds otherwise: a diacritic FTS5 removes, a token of PostgreSQL's parser).
fn context_of(
    conn: &Connection,
    pg: bool,
    q: &str,
    doc: i64,
    terms: &context::Terms,
) -> Result<String> {
    let (body_sql, whole_sql) = if pg {
        (PG_BODY, PG_CONTEXT)
    } else {
        (SQLITE_BODY, SQLITE_CONTEXT)
    };
    let body: Option<String> = conn
        .prepare_cached(body_sql)?
        .query_row(params![doc], |r| r.get(0))
        .optional()?
        .flatten();
    let line = match body.as_deref().and_then(|b| context::line(b, terms)) {
        Some(line) => line,
        None => conn
            .prepare_cached(whole_sql)?
            .query_row(params![q, doc], |r| r.get(0))
            .optional()?
            .unwrap_or_default(),
    };
    Ok(line.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The words as an FTS5 query: each a quoted string (so no word is read as an operator), all
/// of them required; `word*` a prefix.
fn fts5_query(words: &[&str]) -> String {
    let quoted: Vec<String> = words
        .iter()
        .map(|w| {
            let (w, prefix) = match w.strip_suffix('*') {
                Some(stem) if !stem.is_empty() => (stem, "*"),
                _ => (*w, ""),
            };
            format!("\"{}\"{prefix}", w.replace('"', "\"\""))
        })
        .collect();
    quoted.join(" ")
}

/// The path of node `id` read up its parents, when it is attached to its account (not in a
/// tree being purged) and, with `within`, under that folder.
fn place(conn: &Connection, id: i64, within: Option<i64>) -> Result<Option<NodePath>> {
    let mut stmt = conn.prepare_cached("SELECT parent_id, name, kind FROM nodes WHERE id = ?1")?;
    let mut names = Vec::new();
    let mut inside = within.is_none();
    let mut at = id;
    loop {
        inside |= Some(at) == within;
        let (parent, name, kind): (Option<i64>, String, i64) =
            stmt.query_row([at], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        names.push(name);
        match parent {
            _ if names.len() as i64 > MAX_WALK_DEPTH => return Ok(None),
            Some(p) => at = p,
            // An account at the top; a detached tree's top is a folder.
            None if kind == 0 && inside => break,
            None => return Ok(None),
        }
    }
    names.reverse();
    Ok(Some(NodePath::from_segments(names)?))
}

#[cfg(test)]
mod tests {
    use super::fts5_query;
    use crate::api::{Base, FileAttrs, NodePath};
    use crate::store::{PutFile, Retention, Scope, Store, StoreConfig, test_path, this_program};
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// Stores `text` as `name` (staged in `tmp`).
    fn put_text(store: &Store, tmp: &Path, name: &str, text: &str) {
        let staged = tmp.join(name);
        std::fs::write(&staged, text).unwrap();
        let put = PutFile {
            base: Base::Any,
            path: test_path(name),
            file_id: None,
            source: std::sync::Arc::new(std::fs::File::open(&staged).unwrap()),
            len: text.len() as u64,
            sealed: false,
            digests: None,
            attrs: FileAttrs::default(),
            cancel: Default::default(),
        };
        store.put_files(Scope::All, &[put]).remove(0).unwrap();
    }

    /// Starts the indexer and waits until it has indexed everything.
    fn indexed(store: &Store) {
        store.start_previews(1, &this_program()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.search_backlog().unwrap() > 0 {
            assert!(Instant::now() < deadline, "not indexed after 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A store of schema 11 (deleted files kept, no index) opened by this one: the index is
    /// added and made of what the store holds; its deleted file (kept restorable, so its text
    /// is indexed too) is not found until restored.
    #[test]
    fn a_store_of_schema_11_gets_the_index_of_what_it_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let config = || StoreConfig {
            retention: Retention {
                count: Some(50),
                age: Some(Duration::from_secs(30 * 24 * 3600)),
                bytes: None,
            },
            ..StoreConfig::default()
        };
        {
            let store = Store::open_local_with(&dir, config()).unwrap();
            for (name, text) in [("a.txt", "the okapi grazes"), ("b.txt", "another okapi")] {
                put_text(&store, tmp.path(), name, text);
            }
            store.delete(Scope::All, &test_path("b.txt")).unwrap();
        }
        let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
        conn.execute_batch(
            "DROP TRIGGER blobs_drop_search; DROP TABLE search_text; DROP TABLE search_docs;
             DROP INDEX nodes_by_version; PRAGMA user_version = 11;",
        )
        .unwrap();
        drop(conn);
        let store = Store::open_local_with(&dir, config()).unwrap();
        assert_eq!(store.search_backlog().unwrap(), 2);
        indexed(&store);
        let found = |q: &str| -> Vec<String> {
            let r = store.search(Scope::All, &NodePath::root(), q, 10).unwrap();
            r.hits.into_iter().map(|h| h.uri).collect()
        };
        assert_eq!(found("okapi"), [test_path("a.txt").uri()]);
        let gone = store.deleted_files(Scope::All, &test_path("")).unwrap();
        assert_eq!(gone.len(), 1);
        store.restore_deleted(Scope::All, &gone[0].id).unwrap();
        assert_eq!(found("another okapi"), [test_path("b.txt").uri()]);
        assert_eq!(found("okapi").len(), 2);
        assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
    }

    /// The line of context shows the word found: far into a long text (made from a window of
    /// it), and through a diacritic FTS5 removes (made by FTS5's `snippet()` then).
    #[test]
    fn the_line_of_context_shows_the_word_found() {
        let tmp = tempfile::tempdir().unwrap();
        let store =
            Store::open_local_with(&tmp.path().join("store"), StoreConfig::default()).unwrap();
        let long = format!(
            "{}the okapi grazes {}",
            "filler words here. ".repeat(20_000),
            "more. ".repeat(100)
        );
        put_text(&store, tmp.path(), "long.txt", &long);
        put_text(
            &store,
            tmp.path(),
            "cafe.txt",
            "a note on the Café de Flore, then tea",
        );
        indexed(&store);
        let line = |q: &str| {
            let r = store.search(Scope::All, &NodePath::root(), q, 10).unwrap();
            assert_eq!(r.hits.len(), 1, "{q}: {r:?}");
            r.hits[0].context.clone()
        };
        assert_eq!(
            line("OKAPI"),
            "…filler words here. filler words here. the okapi grazes more. more. more. more. \
             more. more. more…"
        );
        assert_eq!(line("cafe"), "a note on the Café de Flore, then tea");
    }

    #[test]
    fn words_are_quoted_not_operators() {
        assert_eq!(
            fts5_query(&["NOT", "a\"b", "inv*", "*"]),
            "\"NOT\" \"a\"\"b\" \"inv\"* \"*\""
        );
    }
}
