//! The indexer thread (see the module's note in `search`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::INDEX_MAX_CHARS;
use crate::api::Result;
use crate::preview::{self, Limits, PreviewKind};
use crate::store::blobs::Blobs;
use crate::store::db::{Conn as Connection, Engine, OptionalExtension, params};
use crate::store::previews::sandbox::{self, Ended, PDF_TEXT, TEXT_FILE};
use crate::store::previews::{IdleProbe, MAX_INPUT, idle_priority, kind_of};
use crate::sync::relock;

/// How often the thread looks for work nobody told it about (another process's commits).
const POLL: Duration = Duration::from_secs(30);
/// Files taken per look. The look orders every current version not indexed yet (fair across
/// accounts): a cost that grows with the backlog, so a look takes many (32 a look made the
/// catch-up after 100,000 new files the square of their number), and a commit meanwhile makes
/// the next look come sooner (`State::dirty`), so another account's new file need not wait for
/// them all.
const BATCH: i64 = 1024;
/// How long a document's text is extracted while others wait before it is stopped, set aside
/// as slow and tried again (whole, then) once no quicker document waits (issue 47: one PDF held
/// every account's new files for a minute).
const SLICE: Duration = Duration::from_secs(2);
/// Slow documents remembered (more: the oldest forgotten, then taken as any other).
const MAX_SLOW: usize = 4096;

const INDEXED: i64 = 1;
const NOTHING: i64 = 2;

#[derive(Default)]
struct State {
    /// Something was committed since the thread last looked.
    dirty: bool,
    closed: bool,
}

/// The thread's handle in the store: wakes it after a commit, ends it with the store.
#[derive(Default)]
pub(in crate::store) struct Indexer {
    state: Arc<(Mutex<State>, Condvar)>,
    started: std::sync::OnceLock<()>,
}

impl Indexer {
    /// A version was committed: the thread looks once the store is idle.
    pub(in crate::store) fn wake(&self) {
        relock(&self.state.0).dirty = true;
        self.state.1.notify_all();
    }

    /// Starts the thread (once).
    pub(in crate::store) fn start(
        &self,
        db: Engine,
        blobs: Blobs,
        idle: IdleProbe,
        program: &Path,
        tmp: PathBuf,
    ) -> Result<()> {
        if self.started.set(()).is_err() {
            return Ok(());
        }
        let work = Work {
            db,
            blobs,
            idle,
            program: program.to_path_buf(),
            tmp,
            state: self.state.clone(),
            slow: Default::default(),
        };
        relock(&self.state.0).dirty = true;
        std::thread::Builder::new()
            .name("search-index".into())
            .spawn(move || work.run())?;
        Ok(())
    }
}

impl Drop for Indexer {
    fn drop(&mut self) {
        relock(&self.state.0).closed = true;
        self.state.1.notify_all();
    }
}

struct Work {
    db: Engine,
    blobs: Blobs,
    idle: IdleProbe,
    program: PathBuf,
    tmp: PathBuf,
    state: Arc<(Mutex<State>, Condvar)>,
    /// Documents stopped after [`SLICE`] while others waited: taken after the others.
    slow: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl Work {
    fn closed(&self) -> bool {
        relock(&self.state.0).closed
    }

    fn run(self) {
        idle_priority();
        let conn = loop {
            match self.db.connect() {
                Ok(c) => break c,
                Err(_) if self.closed() => return,
                Err(e) => {
                    log::warn!("search index: cannot open the database: {e}; trying again");
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        };
        loop {
            {
                let (lock, cv) = &*self.state;
                let mut st = relock(lock);
                if !st.dirty && !st.closed {
                    st = cv
                        .wait_timeout(st, POLL)
                        .map_or_else(|e| e.into_inner().0, |r| r.0);
                }
                if st.closed {
                    return;
                }
                st.dirty = false;
            }
            if let Err(e) = self.catch_up(&conn) {
                log::warn!("search index: {e}");
            }
        }
    }

    /// Indexes what is not indexed yet, while the store stays idle.
    fn catch_up(&self, conn: &Connection) -> Result<()> {
        loop {
            while let Some(wait) = self.idle.writes_for() {
                if self.closed() {
                    return Ok(());
                }
                std::thread::sleep(wait);
            }
            // What is committed from here on is found by this look, or makes the next.
            relock(&self.state.0).dirty = false;
            // Fair across accounts: each account's oldest file not indexed, then each one's
            // second, ... (round-robin), not one account's backlog before another's new file.
            let rows: Vec<(String, String)> = conn
                .prepare_cached(
                    "SELECT blob, name FROM (
                       SELECT v.blob AS blob, n.name AS name, n.account_id AS account,
                              row_number() OVER (PARTITION BY n.account_id ORDER BY n.id) AS turn
                       FROM nodes n JOIN versions v ON v.id = n.current_version
                       WHERE n.kind = 3 AND v.blob IS NOT NULL
                         AND NOT EXISTS (SELECT 1 FROM search_docs d WHERE d.blob = v.blob)
                     ) t ORDER BY turn, account LIMIT ?1",
                )?
                .query_map([BATCH], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<crate::store::db::Result<_>>()?;
            if rows.is_empty() {
                return Ok(());
            }
            let mut todo: Vec<(String, String)> = Vec::with_capacity(rows.len());
            let mut seen = std::collections::HashSet::with_capacity(rows.len());
            for row in rows {
                if seen.insert(row.0.clone()) {
                    todo.push(row);
                }
            }
            // The ones found slow before go last (a stable sort: fair order kept otherwise).
            todo.sort_by_key(|(h, _)| self.slow.borrow().contains(h));
            // One transaction (one disk flush) for the texts of a batch, not one a document:
            // the index catches up right after writes, beside the user's first reads.
            let mut done = Done::default();
            for (i, (hash, name)) in todo.iter().enumerate() {
                if self.closed() {
                    return done.record(conn);
                }
                if self.idle.busy() {
                    // Back to waiting for idle time (the outer loop).
                    relock(&self.state.0).dirty = true;
                    return done.record(conn);
                }
                if i > 0 && relock(&self.state.0).dirty {
                    // New commits: looked at again, in turn with what is left.
                    break;
                }
                // Others wait: this one's turn ends after SLICE, unless it is already known slow
                // (then only the store's activity stops it: it runs whole when nothing else
                // waits).
                let others = i + 1 < todo.len() && !self.slow.borrow().contains(hash);
                let sliced = std::cell::Cell::new(false);
                let started = std::time::Instant::now();
                let stop = || {
                    if self.idle.busy() {
                        return true;
                    }
                    let over = others && started.elapsed() >= SLICE;
                    sliced.set(over);
                    over
                };
                let text = self.text_of(conn, hash, name, &stop, &mut done);
                if matches!(text, Ok(None)) && started.elapsed() >= SLICE {
                    self.note_slow(hash);
                }
                match text {
                    Ok(Some(text)) => {
                        self.slow.borrow_mut().remove(hash);
                        done.push(hash, text);
                    }
                    Ok(None) if sliced.get() => {
                        log::debug!("search index: {name} set aside after {SLICE:?}: others wait");
                    }
                    Ok(None) => return done.record(conn), // stopped: the store got busy
                    Err(e) => {
                        log::info!("search index: nothing indexed of {name}: {e}");
                        done.push(hash, Err(()));
                    }
                }
                if done.due() {
                    done.record(conn)?;
                }
            }
            done.record(conn)?;
        }
    }

    /// Remembers `hash` as slow to extract (taken after the others).
    fn note_slow(&self, hash: &str) {
        let mut slow = self.slow.borrow_mut();
        if slow.len() >= MAX_SLOW {
            slow.clear();
        }
        slow.insert(hash.to_string());
    }

    /// The text of the bytes `hash` under `name`; `Ok(None)`: stopped half-way (`stop` said so).
    /// Before a text extractor runs, the texts in `done` are recorded.
    fn text_of(
        &self,
        conn: &Connection,
        hash: &str,
        name: &str,
        stop: &dyn Fn() -> bool,
        done: &mut Done,
    ) -> std::result::Result<Option<std::result::Result<String, ()>>, String> {
        let kind = kind_of(conn, &self.blobs, hash, name).map_err(|e| e.to_string())?;
        let mut file = self.blobs.open(hash).map_err(|e| e.to_string())?;
        match kind {
            PreviewKind::Text => {
                // Text needs no parser: read in process, bounded.
                let mut data = Vec::new();
                (&mut file)
                    .take(INDEX_MAX_CHARS as u64)
                    .read_to_end(&mut data)
                    .map_err(|e| e.to_string())?;
                let text =
                    preview::extract_text(kind, &data, &Limits::default()).map_err(|e| e.0)?;
                Ok(Some(Ok(text)))
            }
            PreviewKind::Pdf if file.len() <= MAX_INPUT => {
                // What is found so far searchable now, not after this one's seconds.
                if let Err(e) = done.record(conn) {
                    log::warn!("search index: {e}");
                }
                let dir = self.tmp.join(hash);
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let len = file.len();
                let ended = sandbox::run(&self.program, PDF_TEXT, &dir, &mut file, len, stop);
                let text = std::fs::read(dir.join(TEXT_FILE));
                let _ = std::fs::remove_dir_all(&dir);
                match ended.map_err(|e| format!("the text extractor could not run: {e}"))? {
                    Ended::Done { .. } => {
                        let text = text.map_err(|e| e.to_string())?;
                        Ok(Some(Ok(String::from_utf8_lossy(&text).into_owned())))
                    }
                    Ended::Stopped => Ok(None),
                    Ended::TimedOut => Err("took too long".into()),
                    Ended::Unsupported(why) | Ended::Died(why) => Err(why),
                }
            }
            _ => Ok(Some(Err(()))),
        }
    }
}

/// Texts found and not recorded yet: recorded together when [`Done::due`], before a PDF's
/// extractor runs, or at the end of a batch.
#[derive(Default)]
struct Done {
    texts: Vec<(String, std::result::Result<String, ()>)>,
    bytes: usize,
    since: Option<std::time::Instant>,
}

impl Done {
    /// Text held in memory before it is recorded, and for how long (a slow PDF's neighbours
    /// are searchable within a second).
    const MAX_BYTES: usize = 4 << 20;
    const MAX_WAIT: Duration = Duration::from_secs(1);

    fn push(&mut self, hash: &str, text: std::result::Result<String, ()>) {
        self.bytes += text.as_ref().map_or(0, String::len);
        self.since.get_or_insert_with(std::time::Instant::now);
        self.texts.push((hash.to_string(), text));
    }

    fn due(&self) -> bool {
        self.bytes >= Self::MAX_BYTES || self.since.is_some_and(|t| t.elapsed() >= Self::MAX_WAIT)
    }

    /// Records the texts held, in one transaction.
    fn record(&mut self, conn: &Connection) -> Result<()> {
        if self.texts.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction()?;
        for (hash, text) in self.texts.drain(..) {
            record(&tx, &hash, text)?;
        }
        tx.commit()?;
        self.bytes = 0;
        self.since = None;
        Ok(())
    }
}

/// Records the text of `hash` (or that it has none) in `tx`, unless the bytes are gone
/// meanwhile or another thread was first.
fn record(tx: &Connection, hash: &str, text: std::result::Result<String, ()>) -> Result<()> {
    let status = if text.is_ok() { INDEXED } else { NOTHING };
    // PostgreSQL's text holds no NUL.
    let body = text.ok().map(|t| t.replace('\0', " "));
    let id: Option<i64> = if tx.is_pg() {
        tx.prepare_cached(
            "INSERT INTO search_docs (blob, status, body, tsv)
             SELECT ?1, ?2, ?3, to_tsvector('simple', coalesce(?3, ''))
             WHERE EXISTS (SELECT 1 FROM blobs WHERE hash = ?1)
             ON CONFLICT (blob) DO NOTHING RETURNING id",
        )?
        .query_row(params![hash, status, body.as_deref()], |r| r.get(0))
        .optional()?
    } else {
        tx.prepare_cached(
            "INSERT INTO search_docs (blob, status) SELECT ?1, ?2
             WHERE EXISTS (SELECT 1 FROM blobs WHERE hash = ?1)
             ON CONFLICT (blob) DO NOTHING RETURNING id",
        )?
        .query_row(params![hash, status], |r| r.get(0))
        .optional()?
    };
    if let (Some(id), Some(body), false) = (id, &body, tx.is_pg()) {
        tx.prepare_cached("INSERT INTO search_text (rowid, body) VALUES (?1, ?2)")?
            .execute(params![id, body.as_str()])?;
    }
    Ok(())
}
