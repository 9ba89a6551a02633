//! Previews of stored files (docs/design.md §2), kept where the blobs are (`Blobs`: in
//! `previews/<hash[0..2]>/<hash>/<kind>/` beside a folder of blobs, under `PREFIX/previews/` in
//! a bucket, so every server of a store reads what any of them rendered): `page-0001.png`...,
//! `document.pdf` when one was made. They are keyed by the blob and the kind its bytes are rendered as, which the file's
//! name chooses (`crate::preview::name_class`; the kind of the bytes for each class of name is
//! judged once and kept in `blobs.kinds`): copies and files whose names pick the same kind share
//! one, each name gets the kind its own type implies, a new version gets its own; the
//! `previews` table says where each (blob, kind) stands.
//!
//! **Asked-for work first.** Two queues: jobs somebody asked for (the metadata, page and PDF
//! calls, whether from the mount's `.preview/` or over HTTP, all reach [`Store::preview`]) and
//! background jobs (every version stored). An asked-for job goes to the front of its queue (the
//! latest request first) and is rendered by its own threads at near-normal priority; background
//! jobs are rendered by other threads at idle CPU and I/O priority (`SCHED_IDLE`), and only while
//! nothing else wants the store: no asked-for job queued or running and no write activity
//! ([`Store::note_write_activity`]) for [`IDLE_AFTER`]. A background job that finds the store
//! busy again between two pages stops and goes back to its queue.
//!
//! **What the background renders** ([`PreviewMode`]): `eager` renders every version; `on-demand`
//! (the default) only files of [`BACKGROUND_MIN_BYTES`] or more (a smaller one renders on request
//! within about a second, so rendering it ahead buys nothing and its preview would outweigh it),
//! and only while previews nobody asked for stay within a quarter of the bytes of the stored
//! files. A background job never records a file as not supported for taking too long (it may just
//! have been starved of CPU): it is left for a request to render.
//!
//! **A cache with a bound.** Each preview's bytes (in 4 KiB blocks, as `du` counts them) and when
//! it was last asked for are recorded; once the previews exceed the cache size, the least
//! recently used are removed (previews of bytes that are no file's current version first, then
//! ones nobody asked for, then the rest by age) and rendered again when asked for. Previews of
//! bytes that are gone go with them (`Store::forget_blob`), and a store opened alone removes
//! preview directories no row accounts for.
//!
//! Bounds: each job renders in a child process ([`sandbox`]: `vaultfs render-preview`) under a
//! memory and CPU bound, killed when still running after [`sandbox::KILL_AFTER`]: whatever a
//! file makes the renderer do, the server loses at most that job, recorded as not supported
//! (so a restart does not render it again). The child gives up between pages after
//! [`JOB_TIME`] (the renderer checks its deadline); a worker still in one job after
//! [`JOB_HARD_LIMIT`] (stuck reading its input, say) is abandoned: marked not supported
//! (asked-for jobs), its worker replaced, whatever it produces later thrown away. Inputs over
//! [`MAX_INPUT`] are not previewed; the renderer bounds pages, page sizes and image decoding
//! (`crate::preview::Limits`).
//!
//! Here: the types, the jobs and the kinds of bytes. [`queue`]: the two queues and what the
//! threads share; [`workers`]: the threads that take jobs and record them; [`sandbox`]: the
//! child process that renders; [`cache`]: the bound, the eviction and the cleanup; [`reads`]:
//! what the store answers (state, pages, PDF, stats).

mod cache;
mod queue;
mod reads;
pub(super) mod sandbox;
mod workers;

pub use sandbox::{child_main as render_preview_main, this_program};

use std::io::Read;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use super::blobs::{BlobFile, Blobs};
use super::db::{Conn as Connection, OptionalExtension, params};
use super::now_ns;
use crate::api::Result;
use crate::preview::{self, Kinds, PreviewKind};
use queue::Shared;
use reads::Scaled;

/// Cooperative time bound of one job (the renderer checks it between pages).
const JOB_TIME: Duration = Duration::from_secs(60);
/// A job still running this long is given up and its worker replaced.
const JOB_HARD_LIMIT: Duration = Duration::from_secs(180);
/// PDFs and images larger than this are not previewed (the renderer reads them whole).
pub const MAX_INPUT: u64 = 256 << 20;
/// Bytes of scaled page images kept in memory.
const SCALED_CACHE_BYTES: usize = 64 << 20;
/// Bytes of the file the type is judged by.
const SNIFF_BYTES: usize = 8192;
/// Background rendering waits until no write has been seen for this long.
pub const IDLE_AFTER: Duration = Duration::from_millis(1500);
/// In `on-demand` mode, smaller files are rendered only when asked for.
pub const BACKGROUND_MIN_BYTES: u64 = 128 << 10;
/// In `on-demand` mode, previews nobody asked for stay within 1/this of the files' bytes.
const UNREQUESTED_SHARE: u64 = 4;
/// Default bound of the previews on disk.
pub const DEFAULT_PREVIEW_CACHE_SIZE: u64 = 1 << 30;
/// When a preview was last asked for is recorded at most this often (a write per request would
/// make every metadata poll a database write).
const USE_GRANULARITY_NS: i64 = 1_000_000_000;
/// How long the sum of the files' bytes (the background budget) is reused.
const FILES_BYTES_TTL: Duration = Duration::from_secs(5);

const IN_PROGRESS: i64 = 0;
const READY: i64 = 1;
const NOT_SUPPORTED: i64 = 2;

/// Preview threads by default: half the cores (at least one) for asked-for jobs, as many for
/// the background, so rendering never takes the whole machine from uploads and downloads.
pub fn default_preview_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// What is rendered without being asked for (`--previews`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreviewMode {
    /// Every stored version, when the machine is idle.
    Eager,
    /// What is asked for, at once; in idle time, large files within a budget.
    #[default]
    OnDemand,
}

impl std::str::FromStr for PreviewMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "eager" => Ok(PreviewMode::Eager),
            "on-demand" | "on_demand" | "ondemand" => Ok(PreviewMode::OnDemand),
            _ => Err(format!("`{s}`: expected eager or on-demand")),
        }
    }
}

impl std::fmt::Display for PreviewMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreviewMode::Eager => "eager",
            PreviewMode::OnDemand => "on-demand",
        })
    }
}

/// Where the preview of a file's current bytes stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreviewState {
    InProgress,
    /// Width and height (pixels at 100%) of each page.
    Ready {
        pages: Vec<(u32, u32)>,
    },
    NotSupported,
}

/// What the previews hold and what the threads did (for `status`, the tests and the bench).
#[derive(Debug, Clone, Default)]
pub struct PreviewStats {
    pub mode: PreviewMode,
    /// The bound of `bytes`.
    pub cache_size: u64,
    /// Ready previews and their bytes on disk (4 KiB blocks).
    pub ready: u64,
    pub bytes: u64,
    /// Of those, previews nobody has asked for yet.
    pub unrequested: u64,
    pub unrequested_bytes: u64,
    /// Bytes of the files' current versions (the background budget is a share of it).
    pub files_bytes: u64,
    /// Background jobs queued or being rendered.
    pub background_pending: u64,
    /// Jobs started by this process: asked for, and in the background.
    pub requested_started: u64,
    pub background_started: u64,
    /// Background jobs that stopped because the store got busy (put back in the queue).
    pub background_yielded: u64,
    /// When this process first and last started a background job.
    pub first_background_start: Option<SystemTime>,
    pub last_background_start: Option<SystemTime>,
    /// Previews removed to keep the bound.
    pub evicted: u64,
}

/// One job: the bytes of a blob, the kind they are rendered as (chosen by a name they had),
/// that name (for the logs), and whether somebody asked for it.
#[derive(Clone, Debug)]
struct Job {
    hash: String,
    kind: PreviewKind,
    name: String,
    asked: bool,
}

impl Job {
    /// What identifies a preview: the bytes and their kind.
    fn key(&self) -> String {
        key(&self.hash, self.kind)
    }
}

fn key(hash: &str, kind: PreviewKind) -> String {
    format!("{hash}/{}", kind.as_str())
}

pub(super) struct Previews {
    db: super::db::Engine,
    shared: Arc<Shared>,
    scaled: Mutex<Scaled>,
    started: OnceLock<()>,
}

impl Previews {
    pub(super) fn new(db: super::db::Engine, mode: PreviewMode, cache_size: u64) -> Self {
        Previews {
            db,
            shared: Arc::new(Shared::new(mode, cache_size)),
            scaled: Mutex::new(Scaled {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            started: OnceLock::new(),
        }
    }

    /// Queues the preview of a stored version for the background (the commit path).
    pub(super) fn enqueue(&self, hash: &str, kind: PreviewKind, name: &str) {
        self.shared.push_background(Job {
            hash: hash.to_string(),
            kind,
            name: name.to_string(),
            asked: false,
        });
    }

    /// A write is under way: the background waits [`IDLE_AFTER`] after the last one.
    pub(crate) fn note_write_activity(&self) {
        self.shared.note_activity();
    }

    /// For other idle-time work (the search indexer): how long until the store is idle as the
    /// background previews see it (None: idle now), and whether it is busy (a request's
    /// preview queued or rendering, a write within [`IDLE_AFTER`], the store closed).
    pub(super) fn idle_probe(&self) -> IdleProbe {
        let shared = self.shared.clone();
        IdleProbe(Arc::new(move |wait| {
            if wait {
                shared.writes_for()
            } else {
                shared.busy().then_some(Duration::ZERO)
            }
        }))
    }
}

/// See [`Previews::idle_probe`].
#[derive(Clone)]
pub(super) struct IdleProbe(Arc<dyn Fn(bool) -> Option<Duration> + Send + Sync>);

impl IdleProbe {
    /// How long writes go on being recent (None: none for [`IDLE_AFTER`]).
    pub(super) fn writes_for(&self) -> Option<Duration> {
        (self.0)(true)
    }
    pub(super) fn busy(&self) -> bool {
        (self.0)(false).is_some()
    }
}

/// The calling thread at idle CPU and I/O priority, as the background previews' threads.
pub(super) fn idle_priority() {
    workers::lower_priority(queue::Tier::Background);
}

impl Drop for Previews {
    fn drop(&mut self) {
        // A job in progress finishes (or is dropped) on its own; nothing new starts.
        self.shared.close();
    }
}

fn page_file(n: usize) -> String {
    format!("page-{n:04}.png")
}

/// The kind of a blob's bytes for each class of name, judged by their first bytes once and
/// kept in `blobs.kinds`. Bytes that are gone have no kind with a preview.
pub(super) fn blob_kinds(conn: &Connection, blobs: &Blobs, hash: &str) -> Result<Kinds> {
    let none = [PreviewKind::Unsupported; 3];
    let kept: Option<Option<String>> = conn
        .prepare_cached("SELECT kinds FROM blobs WHERE hash = ?1")?
        .query_row([hash], |r| r.get(0))
        .optional()?;
    let Some(kept) = kept else {
        return Ok(none);
    };
    if let Some(kinds) = kept.as_deref().and_then(parse_kinds) {
        return Ok(kinds);
    }
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    match blobs.open(hash) {
        Ok(f) => f.take(SNIFF_BYTES as u64).read_to_end(&mut head)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(none),
        Err(e) => return Err(e.into()),
    };
    let kinds = preview::kinds(&head);
    conn.prepare_cached("UPDATE blobs SET kinds = ?2 WHERE hash = ?1")?
        .execute(params![hash, format_kinds(&kinds)])?;
    Ok(kinds)
}

/// The kind of the bytes `hash` under `name`.
pub(super) fn kind_of(
    conn: &Connection,
    blobs: &Blobs,
    hash: &str,
    name: &str,
) -> Result<PreviewKind> {
    Ok(blob_kinds(conn, blobs, hash)?[preview::name_class(name)])
}

/// The kinds of new bytes, not yet recorded, judged by the first bytes of `file` (read at
/// offset 0; its position is left alone): for a blob recorded with its kinds
/// ([`format_kinds`]), so that [`want_judged`] has no need to read the blob back (from a bucket,
/// requests made under the writers' lock).
pub(in crate::store) fn judge_file(file: &std::fs::File) -> std::io::Result<Kinds> {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0; SNIFF_BYTES];
    let mut got = 0;
    while got < head.len() {
        match file.read_at(&mut head[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(got);
    Ok(preview::kinds(&head))
}

/// `blobs.kinds` as the store keeps it.
pub(in crate::store) fn format_kinds(kinds: &Kinds) -> String {
    kinds.map(|k| k.as_str()).join(",")
}

fn parse_kinds(s: &str) -> Option<Kinds> {
    let mut it = s.split(',').map(PreviewKind::parse);
    let kinds = [it.next()??, it.next()??, it.next()??];
    it.next().is_none().then_some(kinds)
}

/// Marks the preview of the blob under `name` (the kind the name chooses) as wanted (in
/// progress) unless the store already knows about it; the kind when the row is new and a job
/// should be queued (none for a kind with no preview). Runs inside the caller's transaction.
pub(super) fn want(
    conn: &Connection,
    blobs: &Blobs,
    hash: &str,
    name: &str,
) -> Result<Option<PreviewKind>> {
    want_judged(conn, hash, name, &blob_kinds(conn, blobs, hash)?)
}

/// [`want`] of bytes whose kinds are known already (see [`judge_file`]).
pub(in crate::store) fn want_judged(
    conn: &Connection,
    hash: &str,
    name: &str,
    kinds: &Kinds,
) -> Result<Option<PreviewKind>> {
    let kind = kinds[preview::name_class(name)];
    if kind == PreviewKind::Unsupported {
        return Ok(None);
    }
    let now = now_ns();
    let n = conn
        .prepare_cached(
            "INSERT INTO previews (blob, kind, status, name, updated_on, used_on) VALUES (?1, ?2, 0, ?3, ?4, ?4)
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![hash, kind.as_str(), name, now])?;
    Ok((n == 1).then_some(kind))
}

/// A blob opened and judged by its first bytes and its name.
struct Judged {
    file: BlobFile,
    size: u64,
    head: Vec<u8>,
    kind: PreviewKind,
}

/// Opens a blob and tells whether it can have a preview of that kind (`Err(reason)` when it
/// cannot).
fn judge(
    blobs: &Blobs,
    hash: &str,
    kind: PreviewKind,
) -> std::io::Result<std::result::Result<Judged, String>> {
    let mut file = blobs.open(hash)?;
    let size = file.len();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    Ok(match kind {
        PreviewKind::Unsupported => Err("not a type with previews".into()),
        _ if size == 0 => Err("empty file".into()),
        PreviewKind::Pdf | PreviewKind::Image if size > MAX_INPUT => {
            Err(format!("larger than {} MiB", MAX_INPUT >> 20))
        }
        _ => Ok(Judged {
            file,
            size,
            head,
            kind,
        }),
    })
}

/// Bytes of the files' current versions.
fn files_bytes(conn: &Connection) -> Result<u64> {
    let n: i64 = conn.query_row(
        "SELECT CAST(COALESCE(SUM(v.length), 0) AS BIGINT)
         FROM nodes n JOIN versions v ON v.id = n.current_version",
        [],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as u64)
}

/// Whether the blob is some file's current version (SQL, for the blob in `?1`).
const IS_CURRENT: &str = "EXISTS (SELECT 1 FROM versions v WHERE v.blob = ?1
     AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = v.file_id AND n.current_version = v.id))";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use std::fs;

    /// A store of schema 6 (previews keyed by their bytes alone, files in `<hash>/`) opened by
    /// this one: each preview gets the kind its bytes have under the name it was rendered by,
    /// its files and its accounts' access move with it; one of a kind with no preview goes.
    #[test]
    fn previews_from_before_kinds_get_theirs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut noisy = b"log line\n".repeat(20);
        noisy.extend_from_slice(&[0x01; 8]);
        let (text, none) = ("aa".repeat(32), "bb".repeat(32));
        {
            let mut conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
            super::super::schema::prepare_to(&mut conn, 6).unwrap();
            super::super::schema::preview_cache_columns(&conn).unwrap();
            let conn = Connection::sqlite(conn);
            for (hash, name, status) in [(&text, "a.log", READY), (&none, "b.dat", NOT_SUPPORTED)] {
                let blob = dir.join("blobs").join(&hash[..2]).join(hash);
                fs::create_dir_all(blob.parent().unwrap()).unwrap();
                fs::write(&blob, &noisy).unwrap();
                conn.execute(
                    "INSERT INTO blobs (hash, size, md5) VALUES (?1, ?2, 'x')",
                    params![hash, noisy.len() as i64],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO previews (blob, status, pages, own_pdf, name, updated_on, bytes)
                     VALUES (?1, ?2, '[[1224,1584]]', 1, ?3, 1, 8192)",
                    params![hash, status, name],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO preview_access (account_id, blob, ready_on) VALUES (1, ?1, 5)",
                    [hash],
                )
                .unwrap();
                let files = dir.join("previews").join(&hash[..2]).join(hash);
                fs::create_dir_all(&files).unwrap();
                fs::write(files.join("page-0001.png"), b"png").unwrap();
                fs::write(files.join("document.pdf"), b"pdf").unwrap();
            }
        }
        let store = Store::open(dir, Default::default()).unwrap();
        let conn = store.lock().unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, crate::store::schema::VERSION);
        let rows: Vec<(String, String, i64)> = conn
            .prepare("SELECT blob, kind, status FROM previews")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<crate::store::db::Result<_>>()
            .unwrap();
        assert_eq!(rows, [(text.clone(), "text".to_string(), READY)]);
        let access: Vec<(String, String, i64)> = conn
            .prepare("SELECT blob, kind, ready_on FROM preview_access")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<crate::store::db::Result<_>>()
            .unwrap();
        assert_eq!(access, [(text.clone(), "text".to_string(), 5)]);
        let kinds: String = conn
            .query_row("SELECT kinds FROM blobs WHERE hash = ?1", [&text], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(kinds, "none,text,none");
        let moved = dir
            .join("previews")
            .join(&text[..2])
            .join(&text)
            .join("text");
        assert_eq!(fs::read(moved.join("page-0001.png")).unwrap(), b"png");
        assert_eq!(fs::read(moved.join("document.pdf")).unwrap(), b"pdf");
        assert!(!moved.parent().unwrap().join("page-0001.png").exists());
        let gone = dir.join("previews").join(&none[..2]).join(&none);
        assert!(!gone.exists(), "the preview of no kind is removed");
        // Opened again: nothing left to do, nothing undone.
        drop(conn);
        drop(store);
        let _store = Store::open(dir, Default::default()).unwrap();
        assert!(moved.join("page-0001.png").exists());
    }
}
