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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::db::{Conn as Connection, OptionalExtension, Snapshot, params};
use super::nodes::{MAX_WALK_DEPTH, path_of, resolve};
use super::{Scope, Store};
use crate::api::{Error, NodePath, Result, SearchHit, SearchResults};
pub use crate::preview::INDEX_MAX_CHARS;

/// The most hits an answer holds.
pub const MAX_LIMIT: u64 = 1000;
/// The most different words a query may hold (the same word twice counts once), and the
/// most bytes: a query of 19,500 words held the store for a minute (issue 47).
pub const MAX_WORDS: usize = 32;
pub const MAX_QUERY_BYTES: usize = 1024;
/// How long a search reads at most: then it answers the hits found so far, with `more`.
pub const BUDGET: Duration = Duration::from_secs(2);

impl Store {
    /// The files under `dir` (the root: the whole scope) whose current text holds every word
    /// of `query` (a trailing `*` makes a word a prefix, on SQLite), best first, at most
    /// `limit`; as many as were found within [`BUDGET`], with `more` when time ran out.
    pub fn search(
        &self,
        scope: Scope,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> Result<SearchResults> {
        self.search_for(scope, dir, query, limit, BUDGET)
    }

    /// [`Store::search`] within `budget`.
    ///
    /// **Bounded, and holding nobody up** (issue 47). The words are checked first (at most
    /// [`MAX_WORDS`] different ones in [`MAX_QUERY_BYTES`]). Everything is read on a reader
    /// of its own (`db::Db::reader`), in one read-only snapshot that takes no lock, so no
    /// write and no other request waits for a search; its statements stop at the deadline
    /// (`Conn::read_snapshot`). The folder asked for is in the index's query, as the subtree
    /// of folders under it: one statement finds the hits of that folder, best first, and no
    /// more than the answer holds (a loop of re-queries skipping the hits elsewhere made a
    /// search of an empty folder quadratic in the files found elsewhere). Each hit's line of
    /// context is made once per document, in time linear in its text.
    pub(crate) fn search_for(
        &self,
        scope: Scope,
        dir: &NodePath,
        query: &str,
        limit: u64,
        budget: Duration,
    ) -> Result<SearchResults> {
        let words = words(query)?;
        let limit = limit.clamp(1, MAX_LIMIT) as usize;
        let deadline = Instant::now() + budget;
        let reader = self.db.reader()?;
        let conn = reader.read_snapshot(deadline)?;
        let mut hits = Vec::new();
        match find(&conn, scope, dir, &words, limit, deadline, &mut hits) {
            Ok(more) => Ok(SearchResults { hits, more }),
            // Past the deadline a statement fails (interrupted): the answer is what was found.
            Err(e) if Instant::now() >= deadline => {
                log::debug!("search stopped at its deadline: {e}");
                Ok(SearchResults { hits, more: true })
            }
            Err(e) => Err(e),
        }
    }
}

/// [`Store::search_for`] in `conn`'s snapshot: the hits into `hits`, best first, until
/// `limit` or `deadline`; whether there are more (or may be, the deadline passed).
fn find(
    conn: &Snapshot,
    scope: Scope,
    dir: &NodePath,
    words: &[&str],
    limit: usize,
    deadline: Instant,
    hits: &mut Vec<SearchHit>,
) -> Result<bool> {
    let top = search_top(conn, scope, dir)?;
    let pg = conn.is_pg();
    let q = if pg {
        words.join(" ")
    } else {
        fts5_query(words)
    };
    let account = match scope {
        Scope::All => 0,
        Scope::Account(a) => a,
    };
    let found = candidates(conn, &q, account, top, limit + 1)?;
    let terms = context::Terms::new(words, !pg);
    // Copies share their document, and its line.
    let mut lines: HashMap<i64, String> = HashMap::new();
    for &(id, doc) in found.iter().take(limit) {
        if Instant::now() >= deadline {
            return Ok(true);
        }
        let path = path_of(conn, id)?;
        let context = match lines.get(&doc) {
            Some(line) => line.clone(),
            None => {
                let line = context_of(conn, &q, doc, &terms)?;
                lines.insert(doc, line.clone());
                line
            }
        };
        hits.push(SearchHit {
            id: id.to_string(),
            uri: path.uri(),
            context,
        });
    }
    Ok(found.len() > limit)
}

/// The words of `query` to search for: each once (case aside), at most [`MAX_WORDS`] of
/// them in at most [`MAX_QUERY_BYTES`]; 400 `bad_parameter` otherwise, and for a NUL (which
/// PostgreSQL's text cannot hold).
fn words(query: &str) -> Result<Vec<&str>> {
    let bad = |why: String| Error::bad_request("bad_parameter", format!("`q`: {why}"));
    if query.len() > MAX_QUERY_BYTES {
        return Err(bad(format!(
            "at most {MAX_QUERY_BYTES} bytes (this one has {})",
            query.len()
        )));
    }
    if query.contains('\0') {
        return Err(bad("a NUL character is no word to search for".into()));
    }
    let mut seen = std::collections::HashSet::new();
    let words: Vec<&str> = query
        .split_whitespace()
        .filter(|w| seen.insert(w.to_lowercase()))
        .collect();
    if words.is_empty() {
        return Err(bad("no words to search for".into()));
    }
    if words.len() > MAX_WORDS {
        return Err(bad(format!(
            "at most {MAX_WORDS} different words (this one has {})",
            words.len()
        )));
    }
    Ok(words)
}

/// Where a search looks: under one node (a folder, vault or account), or under every account
/// (the root, for the whole store).
#[derive(Clone, Copy)]
enum Top {
    Node(i64),
    Accounts,
}

/// The top of the tree a search of `dir` looks under, resolved in `conn`'s snapshot, with the
/// account check a listing has.
fn search_top(conn: &Connection, scope: Scope, dir: &NodePath) -> Result<Top> {
    Ok(match (dir.is_root(), scope) {
        (false, _) => Top::Node(resolve(conn, scope, dir)?.id),
        // An account's node has the account's ID.
        (true, Scope::Account(a)) => Top::Node(a),
        (true, Scope::All) => Top::Accounts,
    })
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

/// The folders a search looks in (?3 the top node, or 0 with every account for top; ?5 the
/// depth a walk goes at most): the top and the containers under it, by a walk down in the
/// index's query itself. Only attached trees are reached: a tree being purged (detached, its
/// top no account) is not under any account.
fn under(top: Top) -> &'static str {
    match top {
        Top::Node(_) => {
            "under(id, depth) AS (
                SELECT id, CAST(0 AS BIGINT) FROM nodes WHERE id = ?3
                UNION ALL SELECT n.id, under.depth + 1 FROM nodes n JOIN under ON n.parent_id = under.id
                WHERE n.kind <> 3 AND under.depth < ?5)"
        }
        Top::Accounts => {
            "under(id, depth) AS (
                SELECT id, CAST(0 AS BIGINT) FROM nodes
                WHERE parent_id IS NULL AND kind = 0 AND ?3 = 0
                UNION ALL SELECT n.id, under.depth + 1 FROM nodes n JOIN under ON n.parent_id = under.id
                WHERE n.kind <> 3 AND under.depth < ?5)"
        }
    }
}

/// Matching files under the folders of [`under`] and their documents' rows, best first, at
/// most ?4 (?1 the words, ?2 the account or 0 for all). The documents found are ranked once
/// each (`MATERIALIZED`), not once for every copy of them.
const SQLITE_QUERY: &str = "
    found(doc, rank) AS MATERIALIZED (
        SELECT rowid, rank FROM search_text WHERE search_text MATCH ?1)
    SELECT n.id, d.id
    FROM found JOIN search_docs d ON d.id = found.doc
    JOIN versions v ON v.blob = d.blob JOIN nodes n ON n.current_version = v.id
    WHERE n.kind = 3 AND (n.account_id = ?2 OR ?2 = 0)
      AND n.parent_id IN (SELECT id FROM under)
    ORDER BY found.rank, n.id LIMIT ?4";

/// The text of document ?1.
const SQLITE_BODY: &str = "SELECT body FROM search_text WHERE rowid = ?1";

/// The line of context of document ?2 for the words ?1, by FTS5 (reads the whole text).
const SQLITE_CONTEXT: &str = "
    SELECT snippet(search_text, 0, '', '', '…', 16) FROM search_text
    WHERE search_text MATCH ?1 AND rowid = ?2";

/// As `SQLITE_QUERY`. The folders' test is a hashed set built once (a sublink inside an
/// expression, which PostgreSQL leaves a subplan): as a join, it was planned from the
/// statistics of the moment, and those of tables just grown by copies (before autovacuum's
/// `ANALYZE`) made it a nested loop reading every folder under the top for every file found,
/// 13 s for 16,384 copies (80 ms with fresh statistics, as with the set).
const PG_QUERY: &str = "
    found(doc, blob, rank) AS MATERIALIZED (
        SELECT d.id, d.blob, ts_rank(d.tsv, q) FROM search_docs d, plainto_tsquery('simple', ?1) q
        WHERE d.tsv @@ q)
    SELECT n.id, found.doc
    FROM found JOIN versions v ON v.blob = found.blob JOIN nodes n ON n.current_version = v.id
    WHERE n.kind = 3 AND (n.account_id = ?2 OR ?2 = 0)
      AND COALESCE(n.parent_id IN (SELECT id FROM under), FALSE)
    ORDER BY found.rank DESC, n.id LIMIT ?4";

const PG_BODY: &str = "SELECT body FROM search_docs WHERE id = ?1";

/// As `SQLITE_CONTEXT`, by `ts_headline` (reads the whole text too).
const PG_CONTEXT: &str = "
    SELECT ts_headline('simple', d.body, q,
        'MaxWords=16, MinWords=8, StartSel=\"\", StopSel=\"\", MaxFragments=1')
    FROM search_docs d, plainto_tsquery('simple', ?1) q WHERE d.id = ?2";

/// The files of `account` (0: every account's) found for `q` under `top` and their documents,
/// best first, at most `n`: one statement.
fn candidates(
    conn: &Snapshot,
    q: &str,
    account: i64,
    top: Top,
    n: usize,
) -> Result<Vec<(i64, i64)>> {
    let query = if conn.is_pg() { PG_QUERY } else { SQLITE_QUERY };
    let sql = format!("WITH RECURSIVE {}, {query}", under(top));
    let top = match top {
        Top::Node(id) => id,
        Top::Accounts => 0,
    };
    conn.tighten()?;
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(params![q, account, top, n as i64, MAX_WALK_DEPTH], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<super::db::Result<_>>()?)
}

/// The line of context of document `doc`: made from its text by [`context::line`], or by the
/// database's own function (which tokenizes the whole text) where that finds none of the words
/// (one the database folds otherwise: a diacritic FTS5 removes, a token of PostgreSQL's parser).
fn context_of(conn: &Snapshot, q: &str, doc: i64, terms: &context::Terms) -> Result<String> {
    let (body_sql, whole_sql) = if conn.is_pg() {
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
        None => {
            conn.tighten()?;
            conn.prepare_cached(whole_sql)?
                .query_row(params![q, doc], |r| r.get(0))
                .optional()?
                .unwrap_or_default()
        }
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

#[cfg(test)]
mod tests {
    use super::{MAX_QUERY_BYTES, MAX_WORDS, fts5_query, words};
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
            expect_md5: None,
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

    /// Each word once (case aside), at most `MAX_WORDS` of them in `MAX_QUERY_BYTES`, no NUL:
    /// anything else is 400 `bad_parameter` (issue 47).
    #[test]
    fn words_are_bounded_and_counted_once() {
        assert_eq!(
            words("okapi OKAPI zebra okapi").unwrap(),
            ["okapi", "zebra"]
        );
        assert_eq!(words(&"a ".repeat(500)).unwrap(), ["a"]);
        let many: Vec<String> = (0..MAX_WORDS).map(|i| format!("w{i}")).collect();
        assert_eq!(words(&many.join(" ")).unwrap().len(), MAX_WORDS);
        let refused = |q: &str| {
            let e = words(q).unwrap_err();
            assert_eq!(
                (e.kind, &*e.code),
                (crate::api::ErrorKind::BadRequest, "bad_parameter"),
                "{q:?}: {e:?}"
            );
            e.message
        };
        let over = format!("{} w{MAX_WORDS}", many.join(" "));
        assert!(refused(&over).contains("at most 32 different words (this one has 33)"));
        let long = "a ".repeat(19_500);
        assert!(refused(&long).contains("at most 1024 bytes"));
        assert!(words(&"x".repeat(MAX_QUERY_BYTES)).is_ok());
        assert!(refused(&"x".repeat(MAX_QUERY_BYTES + 1)).contains("1025"));
        assert!(refused("okapi\0").contains("NUL"));
        assert!(refused(" \t\n").contains("no words"));
    }

    /// A search reads in a snapshot of its own, without the store's lock: it answers while a
    /// writer holds the lock and a write transaction (before, it waited for both); past its
    /// budget it answers what it found, with `more`.
    #[test]
    fn a_search_waits_for_no_writer_and_stops_at_its_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let store =
            Store::open_local_with(&tmp.path().join("store"), StoreConfig::default()).unwrap();
        for i in 0..3 {
            put_text(&store, tmp.path(), &format!("{i}.txt"), "the okapi grazes");
        }
        indexed(&store);
        let found = |budget| {
            let r = store.search_for(Scope::All, &NodePath::root(), "okapi", 10, budget);
            r.unwrap()
        };
        assert_eq!(
            (found(super::BUDGET).hits.len(), found(super::BUDGET).more),
            (3, false)
        );
        let late = found(Duration::ZERO);
        assert_eq!((late.hits.len(), late.more), (0, true), "{late:?}");

        let (send, answered) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            // Held in here: a failure lets go of them before the scope waits for the search.
            let held = store.lock().unwrap();
            let tx = held.transaction().unwrap();
            tx.execute("UPDATE nodes SET modified_on = modified_on + 1", [])
                .unwrap();
            s.spawn(|| send.send(found(super::BUDGET)).unwrap());
            let r = answered.recv_timeout(Duration::from_secs(20));
            let r = r.expect("a search waited for the store's lock");
            assert_eq!(r.hits.len(), 3, "{r:?}");
            tx.rollback().unwrap();
        });
    }

    #[test]
    fn words_are_quoted_not_operators() {
        assert_eq!(
            fts5_query(&["NOT", "a\"b", "inv*", "*"]),
            "\"NOT\" \"a\"\"b\" \"inv\"* \"*\""
        );
    }
}
