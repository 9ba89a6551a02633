//! Previews of stored files (DESIGN.md §2), kept beside the blobs in
//! `previews/<hash[0..2]>/<hash>/` (`page-0001.png`..., `document.pdf` when one was made). They
//! are keyed by the blob, so copies share them and a new version gets its own; the `previews`
//! table says where each blob stands.
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
//! Bounds: a job gives up between pages after [`JOB_TIME`] (the renderer checks its deadline),
//! and a job stuck inside one page is abandoned after [`JOB_HARD_LIMIT`]: marked not supported
//! (asked-for jobs), its worker replaced, whatever it produces later thrown away. Inputs over
//! [`MAX_INPUT`] are not previewed; the renderer bounds pages, page sizes and image decoding
//! (`crate::preview::Limits`).

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::nodes::file_by_id;
use super::{Scope, Store, now_ns, ns_to_time};
use crate::api::{Error, PageSize, Result};
use crate::preview::{self, DocumentPdf, Kind, Limits};

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

/// One job: the bytes of a blob, a name they had (a hint to their type), and whether somebody
/// asked for it.
#[derive(Clone, Debug)]
struct Job {
    hash: String,
    name: String,
    asked: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tier {
    Asked,
    Background,
}

#[derive(Default)]
struct Jobs {
    /// Asked for, the latest request at the front.
    asked: VecDeque<Job>,
    /// Every version stored, the newest at the back (taken first); entries whose `queued` tier
    /// is no longer Background are stale and skipped.
    background: VecDeque<Job>,
    queued: HashMap<String, Tier>,
    /// Asked-for jobs being rendered (blob -> threads on it).
    running: HashMap<String, usize>,
    /// Background jobs taken and not yet done.
    background_running: u64,
    /// The store was closed: the threads end.
    closed: bool,
}

/// The queues and what the request path, the commit path and the threads share.
struct Shared {
    jobs: Mutex<Jobs>,
    more: Condvar,
    mode: PreviewMode,
    cache_size: u64,
    born: Instant,
    /// Milliseconds after `born` (plus one) of the last write; 0: none yet.
    activity: AtomicU64,
    requested_started: AtomicU64,
    background_started: AtomicU64,
    background_yielded: AtomicU64,
    first_background_ns: AtomicI64,
    last_background_ns: AtomicI64,
    evicted: AtomicU64,
}

impl Shared {
    fn new(mode: PreviewMode, cache_size: u64) -> Shared {
        Shared {
            jobs: Mutex::default(),
            more: Condvar::new(),
            mode,
            cache_size,
            born: Instant::now(),
            activity: AtomicU64::new(0),
            requested_started: AtomicU64::new(0),
            background_started: AtomicU64::new(0),
            background_yielded: AtomicU64::new(0),
            first_background_ns: AtomicI64::new(0),
            last_background_ns: AtomicI64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_activity(&self) {
        let ms = self.born.elapsed().as_millis() as u64 + 1;
        self.activity.fetch_max(ms, Ordering::Relaxed);
    }

    /// How much longer the background has to wait for the writes to be over (None: idle).
    fn writes_for(&self) -> Option<Duration> {
        let at = self.activity.load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        let since = self
            .born
            .elapsed()
            .saturating_sub(Duration::from_millis(at - 1));
        IDLE_AFTER.checked_sub(since).filter(|d| !d.is_zero())
    }

    fn push_background(&self, job: Job) {
        let mut q = self.lock();
        if q.closed || q.queued.contains_key(&job.hash) || q.running.contains_key(&job.hash) {
            return;
        }
        q.queued.insert(job.hash.clone(), Tier::Background);
        // A thread only sleeps without a timeout on an empty queue (or until an asked-for job
        // ends, which wakes it): no wake-up per commit during a burst of writes.
        let wake = q.background.is_empty();
        q.background.push_back(job);
        if wake {
            self.more.notify_all();
        }
    }

    /// Moves an asked-for job to the front; true when there is one (queued or running).
    fn bump(&self, hash: &str) -> bool {
        let mut q = self.lock();
        if q.queued.get(hash) == Some(&Tier::Asked) {
            if let Some(i) = q.asked.iter().position(|j| j.hash == hash) {
                let job = q.asked.remove(i).expect("found");
                q.asked.push_front(job);
            }
            return true;
        }
        q.running.contains_key(hash)
    }

    /// Queues a job somebody asked for at the front (taking it out of the background).
    fn push_asked(&self, hash: &str, name: &str) {
        let mut q = self.lock();
        if q.closed || q.running.contains_key(hash) {
            return;
        }
        if q.queued.get(hash) == Some(&Tier::Asked) {
            drop(q);
            self.bump(hash);
            return;
        }
        q.queued.insert(hash.to_string(), Tier::Asked);
        q.asked.push_front(Job {
            hash: hash.to_string(),
            name: name.to_string(),
            asked: true,
        });
        self.more.notify_all();
    }

    /// The next asked-for job; None once the store is closed.
    fn take_asked(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.asked.pop_front() {
                q.queued.remove(&job.hash);
                *q.running.entry(job.hash.clone()).or_default() += 1;
                return Some(job);
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn done_asked(&self, hash: &str) {
        let mut q = self.lock();
        if let Some(n) = q.running.get_mut(hash) {
            *n -= 1;
            if *n == 0 {
                q.running.remove(hash);
            }
        }
        self.more.notify_all();
    }

    /// The next background job, once nothing else wants the machine; None once closed.
    fn take_background(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if q.asked.is_empty() && q.running.is_empty() && !q.background.is_empty() {
                if let Some(left) = self.writes_for() {
                    q = self
                        .more
                        .wait_timeout(q, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
                while let Some(job) = q.background.pop_back() {
                    if q.queued.get(&job.hash) == Some(&Tier::Background) {
                        q.queued.remove(&job.hash);
                        q.background_running += 1;
                        return Some(job);
                    }
                }
                continue;
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn done_background(&self) {
        let mut q = self.lock();
        q.background_running = q.background_running.saturating_sub(1);
    }

    /// Background jobs queued or being rendered.
    fn background_pending(&self) -> u64 {
        let q = self.lock();
        let queued = q
            .queued
            .values()
            .filter(|t| **t == Tier::Background)
            .count();
        queued as u64 + q.background_running
    }

    /// A background job stops between pages when this is true.
    fn busy(&self) -> bool {
        let q = self.lock();
        q.closed || !q.asked.is_empty() || !q.running.is_empty() || self.writes_for().is_some()
    }

    fn close(&self) {
        self.lock().closed = true;
        self.more.notify_all();
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }
}

/// What a worker is doing, for the supervisor.
struct Slot {
    tier: Tier,
    current: Mutex<Option<(Job, Instant)>>,
    abandoned: AtomicBool,
}

/// Scaled page images made on request, bounded by their bytes.
struct Scaled {
    lru: lru::LruCache<(String, u32, u32, u32), Bytes>,
    bytes: usize,
}

pub(super) struct Previews {
    /// `<data dir>/previews`
    root: PathBuf,
    db: PathBuf,
    shared: Arc<Shared>,
    scaled: Mutex<Scaled>,
    started: OnceLock<()>,
}

impl Previews {
    pub(super) fn new(
        data_dir: &Path,
        mode: PreviewMode,
        cache_size: u64,
    ) -> std::io::Result<Self> {
        let root = data_dir.join("previews");
        fs::create_dir_all(root.join("tmp"))?;
        Ok(Previews {
            root,
            db: data_dir.join("vault.db"),
            shared: Arc::new(Shared::new(mode, cache_size)),
            scaled: Mutex::new(Scaled {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            started: OnceLock::new(),
        })
    }

    fn dir_of(&self, hash: &str) -> PathBuf {
        dir_of(&self.root, hash)
    }

    /// Removes the preview files of a blob that is gone (its row went with the blob's).
    pub(super) fn remove_files(&self, hash: &str) {
        remove_dir(&self.dir_of(hash));
    }

    /// After a crash, alone with the store: empties `previews/tmp` (jobs that died with their
    /// process) and removes preview directories that no ready row accounts for (a row removed
    /// whose files were not yet).
    pub(super) fn recover(&self, conn: &Connection) -> Result<()> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp)? {
            let _ = fs::remove_dir_all(entry?.path());
        }
        let mut ready = conn.prepare("SELECT 1 FROM previews WHERE blob = ?1 AND status = 1")?;
        let mut removed = 0;
        for prefix in fs::read_dir(&self.root)? {
            let prefix = prefix?;
            if prefix.file_name() == "tmp" || !prefix.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(prefix.path())? {
                let entry = entry?;
                let name = entry.file_name();
                let known = match name.to_str() {
                    Some(hash) => ready.exists([hash])?,
                    None => false,
                };
                if !known {
                    remove_dir(&entry.path());
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            log::info!("removed {removed} preview(s) no longer recorded");
        }
        Ok(())
    }

    /// Queues the preview of a stored version for the background (the commit path).
    pub(super) fn enqueue(&self, hash: &str, name: &str) {
        self.shared.push_background(Job {
            hash: hash.to_string(),
            name: name.to_string(),
            asked: false,
        });
    }

    /// A write is under way: the background waits [`IDLE_AFTER`] after the last one.
    pub(crate) fn note_write_activity(&self) {
        self.shared.note_activity();
    }
}

impl Drop for Previews {
    fn drop(&mut self) {
        // A job in progress finishes (or is dropped) on its own; nothing new starts.
        self.shared.close();
    }
}

fn dir_of(root: &Path, hash: &str) -> PathBuf {
    root.join(&hash[..2]).join(hash)
}

fn remove_dir(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log::warn!("could not remove the preview {}: {e}", dir.display());
        }
    }
}

fn page_file(n: usize) -> String {
    format!("page-{n:04}.png")
}

/// Bytes a file of `len` bytes takes on disk, in 4 KiB blocks (as `du` counts them).
fn on_disk(len: u64) -> u64 {
    len.div_ceil(4096).max(1) * 4096
}

fn not_ready() -> Error {
    Error::conflict(
        "preview_not_ready",
        "the preview is still being generated; ask again when its status is Ready",
    )
}

fn not_supported() -> Error {
    Error::new(
        crate::api::ErrorKind::NotFound,
        "preview_not_supported",
        "this file type has no preview",
    )
}

/// Adds the columns of the preview cache to a database from before it (idempotent; run when
/// the store opens). Ready previews of such a database have their sizes measured once the
/// threads start.
pub(super) fn migrate(conn: &Connection) -> Result<()> {
    let has = |tx: &Connection| -> rusqlite::Result<bool> {
        tx.prepare("SELECT 1 FROM pragma_table_info('previews') WHERE name = 'requested'")?
            .exists([])
    };
    if has(conn)? {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    if !has(&tx)? {
        tx.execute_batch(
            "ALTER TABLE previews ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;  -- on disk, 4 KiB blocks; -1: not measured yet
             ALTER TABLE previews ADD COLUMN used_on INTEGER NOT NULL DEFAULT 0; -- last asked for (ns)
             ALTER TABLE previews ADD COLUMN requested INTEGER NOT NULL DEFAULT 0; -- 1: somebody asked for it
             UPDATE previews SET bytes = -1 WHERE status = 1;",
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Marks the blob's preview as wanted (in progress) unless the store already knows about it;
/// true when the row is new and a job should be queued. Runs inside the caller's transaction.
pub(super) fn want(conn: &Connection, hash: &str, name: &str) -> Result<bool> {
    let now = now_ns();
    let n = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO previews (blob, status, name, updated_on, used_on) VALUES (?1, 0, ?2, ?3, ?3)",
        )?
        .execute(params![hash, name, now])?;
    Ok(n == 1)
}

/// A blob opened and judged by its first bytes and its name.
struct Judged {
    file: File,
    size: u64,
    head: Vec<u8>,
    kind: Kind,
}

/// Opens a blob and tells whether it can have a preview (`Err(reason)` when it cannot).
fn judge(path: &Path, name: &str) -> std::io::Result<std::result::Result<Judged, String>> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    let kind = preview::sniff(name, &head);
    Ok(match kind {
        Kind::Unsupported => Err("not a type with previews".into()),
        _ if size == 0 => Err("empty file".into()),
        Kind::Pdf | Kind::Image if size > MAX_INPUT => {
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

/// A ready preview: its blob, page sizes, and whether it made its own PDF.
struct ReadyPreview {
    hash: String,
    pages: Vec<(u32, u32)>,
    own_pdf: bool,
}

impl Store {
    /// Starts the preview threads (once per process; later calls do nothing): `workers` for
    /// asked-for jobs and as many for the background, and queues every preview left in
    /// progress by an earlier run for the background.
    pub fn start_previews(&self, workers: usize) -> Result<()> {
        let p = &self.previews;
        if p.started.set(()).is_err() {
            return Ok(());
        }
        let pending: Vec<(String, String)> = {
            let conn = self.lock();
            let mut stmt = conn
                .prepare("SELECT blob, name FROM previews WHERE status = 0 ORDER BY updated_on")?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        for (hash, name) in &pending {
            p.enqueue(hash, name);
        }
        let pool = Pool {
            root: p.root.clone(),
            blobs: self.dir().join("blobs"),
            db: p.db.clone(),
            shared: p.shared.clone(),
            files_bytes: Arc::default(),
        };
        let mut slots = Vec::new();
        for _ in 0..workers.max(1) {
            slots.push(pool.spawn(Tier::Asked));
            slots.push(pool.spawn(Tier::Background));
        }
        std::thread::Builder::new()
            .name("preview-watch".into())
            .spawn(move || pool.supervise(slots))?;
        if !pending.is_empty() {
            log::info!(
                "{} preview(s) left from an earlier run queued",
                pending.len()
            );
        }
        Ok(())
    }

    /// A write is under way (an upload committing): background previews wait until writes
    /// have stopped for [`IDLE_AFTER`]. Cheap (one atomic); call it as often as convenient.
    pub(crate) fn note_write_activity(&self) {
        self.previews.note_write_activity();
    }

    /// What the previews hold and what the threads did.
    pub fn preview_stats(&self) -> Result<PreviewStats> {
        let sh = &self.previews.shared;
        let conn = self.lock();
        let (ready, bytes, unrequested, unrequested_bytes): (i64, i64, i64, i64) = conn.query_row(
            "SELECT count(*), COALESCE(SUM(MAX(bytes, 0)), 0),
                    COALESCE(SUM(requested = 0), 0),
                    COALESCE(SUM(CASE WHEN requested = 0 THEN MAX(bytes, 0) END), 0)
             FROM previews WHERE status = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        let files_bytes = files_bytes(&conn)?;
        let time = |a: &AtomicI64| match a.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns_to_time(ns)),
        };
        Ok(PreviewStats {
            mode: sh.mode,
            cache_size: sh.cache_size,
            ready: ready as u64,
            bytes: bytes as u64,
            unrequested: unrequested as u64,
            unrequested_bytes: unrequested_bytes as u64,
            files_bytes,
            background_pending: sh.background_pending(),
            requested_started: sh.requested_started.load(Ordering::Relaxed),
            background_started: sh.background_started.load(Ordering::Relaxed),
            background_yielded: sh.background_yielded.load(Ordering::Relaxed),
            first_background_start: time(&sh.first_background_ns),
            last_background_start: time(&sh.last_background_ns),
            evicted: sh.evicted.load(Ordering::Relaxed),
        })
    }

    /// The file's current bytes: their blob hash, or None for a file never uploaded.
    fn current_blob(
        conn: &Connection,
        scope: Scope,
        file_id: &str,
    ) -> Result<(String, Option<String>)> {
        let row = file_by_id(conn, scope, file_id)?;
        let blob: Option<String> = conn
            .query_row(
                "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
                [row.id],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        Ok((row.name, blob))
    }

    /// The preview of a file's current bytes. Asking puts its rendering at the front of the
    /// queue (or starts it, for bytes nobody has asked about yet), and marks it used.
    pub fn preview(&self, scope: Scope, file_id: &str) -> Result<PreviewState> {
        Ok(self.preview_of(scope, file_id)?.0)
    }

    /// The preview state and the blob it is of (and, when ready, whether it has its own PDF).
    fn preview_of(&self, scope: Scope, file_id: &str) -> Result<(PreviewState, String, bool)> {
        let conn = self.lock();
        let (name, Some(hash)) = Self::current_blob(&conn, scope, file_id)? else {
            return Ok((PreviewState::NotSupported, String::new(), false));
        };
        type Row = (i64, Option<String>, bool, i64, bool);
        let row: Option<Row> = conn
            .query_row(
                "SELECT status, pages, own_pdf, used_on, requested FROM previews WHERE blob = ?1",
                [&hash],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        if let (Scope::Account(account), Some((status, ..))) = (scope, &row) {
            if *status != IN_PROGRESS && Self::still_making_for(&conn, account, &hash)? {
                return Ok((PreviewState::InProgress, hash, false));
            }
        }
        let state = match row {
            None => {
                want(&conn, &hash, &name)?;
                if let Scope::Account(account) = scope {
                    conn.prepare_cached(
                        "INSERT OR IGNORE INTO preview_access (account_id, blob, ready_on) VALUES (?1, ?2, 0)",
                    )?
                    .execute(params![account, hash])?;
                }
                drop(conn);
                self.ask(&hash, &name)?
            }
            Some((IN_PROGRESS, ..)) => {
                if let Scope::Account(account) = scope {
                    // Being made while this account waits: it sees it when it is done.
                    conn.prepare_cached(
                        "INSERT OR IGNORE INTO preview_access (account_id, blob, ready_on) VALUES (?1, ?2, 0)",
                    )?
                    .execute(params![account, hash])?;
                }
                drop(conn);
                self.ask(&hash, &name)?
            }
            Some((READY, pages, own_pdf, used_on, requested)) => {
                let now = now_ns();
                if !requested || now - used_on > USE_GRANULARITY_NS {
                    conn.prepare_cached(
                        "UPDATE previews SET used_on = ?2, requested = 1 WHERE blob = ?1",
                    )?
                    .execute(params![hash, now])?;
                }
                let pages = pages
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default();
                return Ok((PreviewState::Ready { pages }, hash, own_pdf));
            }
            Some(_) => PreviewState::NotSupported,
        };
        Ok((state, hash, false))
    }

    /// Whether `account` is to be told a finished preview is still being made: the first time it
    /// asks for a preview made before (maybe for another account), it waits as long as making
    /// it took, as it would have for bytes nobody had. Later answers follow the preview.
    fn still_making_for(conn: &Connection, account: i64, hash: &str) -> Result<bool> {
        let now = now_ns();
        let ready_on: Option<i64> = conn
            .prepare_cached(
                "SELECT ready_on FROM preview_access WHERE account_id = ?1 AND blob = ?2",
            )?
            .query_row(params![account, hash], |r| r.get(0))
            .optional()?;
        let ready_on = match ready_on {
            Some(t) => t,
            None => {
                let took: i64 = conn
                    .prepare_cached("SELECT render_ns FROM previews WHERE blob = ?1")?
                    .query_row([hash], |r| r.get(0))?;
                let t = now.saturating_add(took.max(0));
                conn.prepare_cached(
                    "INSERT INTO preview_access (account_id, blob, ready_on) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![account, hash, t])?;
                t
            }
        };
        Ok(ready_on > now)
    }

    /// Somebody asked for a preview in progress: its job goes to the front. Bytes of a type
    /// with no preview are recorded so at once (judged by their first bytes, no rendering).
    fn ask(&self, hash: &str, name: &str) -> Result<PreviewState> {
        let shared = &self.previews.shared;
        if shared.bump(hash) {
            return Ok(PreviewState::InProgress);
        }
        if let Ok(Err(reason)) = judge(&self.blobs.path(hash), name) {
            log::info!("no preview for {name}: {reason}");
            self.lock()
                .prepare_cached(
                    "UPDATE previews SET status = ?2, reason = ?3, updated_on = ?4 WHERE blob = ?1 AND status = 0",
                )?
                .execute(params![hash, NOT_SUPPORTED, reason, now_ns()])?;
            return Ok(PreviewState::NotSupported);
        }
        shared.push_asked(hash, name);
        Ok(PreviewState::InProgress)
    }

    /// The blob of a file whose preview is ready, and its page sizes.
    fn ready(&self, scope: Scope, file_id: &str) -> Result<ReadyPreview> {
        match self.preview_of(scope, file_id)? {
            (PreviewState::Ready { pages }, hash, own_pdf) => Ok(ReadyPreview {
                hash,
                pages,
                own_pdf,
            }),
            (PreviewState::InProgress, ..) => Err(not_ready()),
            (PreviewState::NotSupported, ..) => Err(not_supported()),
        }
    }

    /// A file of a ready preview was not there: it was evicted meanwhile. Asking again
    /// renders it again; meanwhile it is not ready.
    fn evicted_meanwhile(&self, scope: Scope, file_id: &str, e: std::io::Error) -> Error {
        if e.kind() != std::io::ErrorKind::NotFound {
            return e.into();
        }
        match self.preview_of(scope, file_id) {
            Ok(_) => not_ready(),
            Err(e) => e,
        }
    }

    /// Page `page` (from 1) as PNG, scaled as asked (made from the stored page and cached).
    pub fn preview_page(
        &self,
        scope: Scope,
        file_id: &str,
        page: u32,
        size: &PageSize,
    ) -> Result<Bytes> {
        let ReadyPreview { hash, pages, .. } = self.ready(scope, file_id)?;
        let (w, h) = *pages
            .get((page as usize).wrapping_sub(1))
            .ok_or_else(|| Error::not_found(format!("the preview has {} page(s)", pages.len())))?;
        let (tw, th) = preview::fit(w, h, size);
        let key = (hash.clone(), page, tw, th);
        let cache = &self.previews.scaled;
        if let Some(b) = cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lru
            .get(&key)
        {
            return Ok(b.clone());
        }
        let path = self.previews.dir_of(&hash).join(page_file(page as usize));
        let png = fs::read(&path).map_err(|e| self.evicted_meanwhile(scope, file_id, e))?;
        if (tw, th) == (w, h) {
            return Ok(Bytes::from(png));
        }
        let scaled = preview::scale_png(&png, tw, th)
            .map_err(|e| Error::internal(format!("could not scale page {page}: {e}")))?;
        let scaled = Bytes::from(scaled);
        let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
        c.bytes += scaled.len();
        if let Some(old) = c.lru.put(key, scaled.clone()) {
            c.bytes -= old.len();
        }
        while c.bytes > SCALED_CACHE_BYTES {
            match c.lru.pop_lru() {
                Some((_, b)) => c.bytes -= b.len(),
                None => break,
            }
        }
        Ok(scaled)
    }

    /// The document PDF of a ready preview, opened, with its size.
    pub fn preview_pdf(&self, scope: Scope, file_id: &str) -> Result<(File, u64)> {
        let ready = self.ready(scope, file_id)?;
        let file = if ready.own_pdf {
            File::open(self.previews.dir_of(&ready.hash).join("document.pdf"))
                .map_err(|e| self.evicted_meanwhile(scope, file_id, e))?
        } else {
            // The preview of a PDF is the PDF itself.
            let _guard = self.lock(); // a delete cannot remove the blob meanwhile
            File::open(self.blobs.path(&ready.hash))?
        };
        let len = file.metadata()?.len();
        Ok((file, len))
    }
}

/// Bytes of the files' current versions.
fn files_bytes(conn: &Connection) -> Result<u64> {
    let n: i64 = conn.query_row(
        "SELECT COALESCE(SUM(v.length), 0) FROM nodes n JOIN versions v ON v.id = n.current_version",
        [],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as u64)
}

/// Whether the blob is some file's current version (SQL, for the blob in `?1`).
const IS_CURRENT: &str = "EXISTS (SELECT 1 FROM versions v WHERE v.blob = ?1
     AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = v.file_id AND n.current_version = v.id))";

/// What the preview threads share.
#[derive(Clone)]
struct Pool {
    root: PathBuf,
    blobs: PathBuf,
    db: PathBuf,
    shared: Arc<Shared>,
    /// The files' bytes, and when they were summed.
    files_bytes: Arc<Mutex<Option<(Instant, u64)>>>,
}

/// A job's result: the directory with its files, or why there is no preview.
enum Outcome {
    Done {
        tmp: PathBuf,
        pages: Vec<(u32, u32)>,
        own_pdf: bool,
        bytes: u64,
    },
    NotSupported(String),
    /// A background job stopped because the store got busy.
    Yielded,
    /// A background job ran out of time (maybe starved): left for a request.
    Dropped(String),
}

impl Pool {
    fn spawn(&self, tier: Tier) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            tier,
            current: Mutex::new(None),
            abandoned: AtomicBool::new(false),
        });
        let (pool, s) = (self.clone(), slot.clone());
        let name = match tier {
            Tier::Asked => "preview",
            Tier::Background => "preview-idle",
        };
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || pool.work(&s));
        if let Err(e) = spawned {
            log::error!("could not start a preview thread: {e}");
        }
        slot
    }

    /// Measures previews of an older database, keeps the bound, then replaces workers stuck
    /// in one job for longer than the hard limit.
    fn supervise(&self, mut slots: Vec<Arc<Slot>>) {
        if let Err(e) = self.open_db().and_then(|mut c| {
            self.measure_old(&mut c)?;
            self.keep_bound(&mut c, None, 0)
        }) {
            log::warn!("could not check the preview cache: {e}");
        }
        while !self.shared.closed() {
            std::thread::sleep(Duration::from_secs(1));
            for slot in slots.iter_mut() {
                let stuck = {
                    let cur = slot.current.lock().unwrap_or_else(|p| p.into_inner());
                    cur.as_ref()
                        .filter(|(_, since)| since.elapsed() > JOB_HARD_LIMIT)
                        .map(|(job, _)| job.clone())
                };
                let Some(job) = stuck else { continue };
                slot.abandoned.store(true, Ordering::SeqCst);
                if slot.tier == Tier::Asked {
                    log::warn!(
                        "preview of {} took over {}s: given up",
                        job.name,
                        JOB_HARD_LIMIT.as_secs()
                    );
                    let outcome = Outcome::NotSupported("rendering took too long".into());
                    if let Err(e) = self
                        .open_db()
                        .and_then(|mut c| self.finish(&mut c, &job, outcome, JOB_HARD_LIMIT))
                    {
                        log::warn!("could not record the preview of {}: {e}", job.name);
                    }
                    self.shared.done_asked(&job.hash);
                } else {
                    // Starved or stuck: either way left for a request to render.
                    log::info!(
                        "background preview of {} still running after {}s: left for a request",
                        job.name,
                        JOB_HARD_LIMIT.as_secs()
                    );
                }
                *slot = self.spawn(slot.tier);
            }
        }
    }

    fn open_db(&self) -> Result<Connection> {
        let conn = Connection::open(&self.db)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        Ok(conn)
    }

    fn work(&self, slot: &Slot) {
        lower_priority(slot.tier);
        let mut conn = match self.open_db() {
            Ok(c) => c,
            Err(e) => return log::error!("preview thread: cannot open the database: {e}"),
        };
        loop {
            let job = match slot.tier {
                Tier::Asked => self.shared.take_asked(),
                Tier::Background => self.shared.take_background(),
            };
            let Some(job) = job else { return };
            let go_on = self.run(&mut conn, slot, &job);
            match slot.tier {
                Tier::Asked if go_on => self.shared.done_asked(&job.hash),
                Tier::Asked => {}
                // (A yielded job is queued again before this.)
                Tier::Background => self.shared.done_background(),
            }
            if !go_on {
                return; // the supervisor recorded it and started another worker
            }
        }
    }

    /// One job; false when this worker was abandoned meanwhile.
    fn run(&self, conn: &mut Connection, slot: &Slot, job: &Job) -> bool {
        match self.admit(conn, job) {
            Ok(true) => {}
            Ok(false) => return true,
            Err(e) => {
                log::warn!("preview of {}: {e}", job.name);
                return true;
            }
        }
        if job.asked {
            self.shared
                .requested_started
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared
                .background_started
                .fetch_add(1, Ordering::Relaxed);
            let now = now_ns();
            let _ = self.shared.first_background_ns.compare_exchange(
                0,
                now,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.shared.last_background_ns.store(now, Ordering::Relaxed);
        }
        *slot.current.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((job.clone(), Instant::now()));
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.render(job)))
            .unwrap_or_else(|_| Outcome::NotSupported("the renderer failed".into()));
        if slot.abandoned.load(Ordering::SeqCst) {
            if let Outcome::Done { tmp, .. } = outcome {
                let _ = fs::remove_dir_all(tmp);
            }
            return false;
        }
        *slot.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let outcome = match outcome {
            Outcome::Yielded => {
                self.shared
                    .background_yielded
                    .fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "background preview of {} paused: the store is busy",
                    job.name
                );
                self.shared.push_background(job.clone());
                return true;
            }
            Outcome::Dropped(why) => {
                log::info!(
                    "background preview of {}: {why}; left for a request",
                    job.name
                );
                return true;
            }
            Outcome::Done { tmp, bytes, .. } if !job.asked && !self.fits_budget(conn, bytes) => {
                log::debug!(
                    "background preview of {} dropped: over the share of unrequested previews",
                    job.name
                );
                let _ = fs::remove_dir_all(tmp);
                return true;
            }
            o => o,
        };
        log::debug!("preview of {} done in {:?}", job.name, started.elapsed());
        // Room is made before the new preview is placed, so the bound holds at every moment.
        if let Outcome::Done { bytes, .. } = &outcome {
            if let Err(e) = self.keep_bound(conn, Some(&job.hash), *bytes) {
                log::warn!("could not keep the previews within their bound: {e}");
            }
        }
        if let Err(e) = self.finish(conn, job, outcome, started.elapsed()) {
            log::warn!("could not record the preview of {}: {e}", job.name);
        }
        if let Err(e) = self.keep_bound(conn, Some(&job.hash), 0) {
            log::warn!("could not keep the previews within their bound: {e}");
        }
        true
    }

    /// Whether a job is still to be done. Asked-for jobs: while in progress. Background jobs
    /// also need the bytes to be a file's current version, and room: the cache not full, and
    /// in `on-demand` mode a large enough file and unrequested previews within their share.
    fn admit(&self, conn: &Connection, job: &Job) -> Result<bool> {
        let row: Option<(i64, Option<i64>, bool)> = conn
            .query_row(
                &format!(
                    "SELECT p.status, b.size, {IS_CURRENT} FROM previews p
                     LEFT JOIN blobs b ON b.hash = p.blob WHERE p.blob = ?1"
                ),
                [&job.hash],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((status, size, current)) = row else {
            return Ok(false); // gone (or evicted: asked for again, it gets a new row)
        };
        if status != IN_PROGRESS {
            return Ok(false); // done meanwhile (queued twice, another process)
        }
        if job.asked {
            return Ok(true);
        }
        let (total, unrequested) = preview_bytes(conn)?;
        if !current || total >= self.shared.cache_size {
            return Ok(false);
        }
        if self.shared.mode == PreviewMode::Eager {
            return Ok(true);
        }
        let size = size.unwrap_or(0).max(0) as u64;
        Ok(size >= BACKGROUND_MIN_BYTES && unrequested < self.share(conn)?)
    }

    /// The bytes previews nobody asked for may take (`on-demand`).
    fn share(&self, conn: &Connection) -> Result<u64> {
        let mut cached = self.files_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let n = match *cached {
            Some((at, n)) if at.elapsed() < FILES_BYTES_TTL => n,
            _ => {
                let n = files_bytes(conn)?;
                *cached = Some((Instant::now(), n));
                n
            }
        };
        Ok(n / UNREQUESTED_SHARE)
    }

    /// Whether a background render of `bytes` may be kept (`on-demand`: within the share).
    fn fits_budget(&self, conn: &Connection, bytes: u64) -> bool {
        if self.shared.mode == PreviewMode::Eager {
            return true;
        }
        match (preview_bytes(conn), self.share(conn)) {
            (Ok((_, unrequested)), Ok(share)) => unrequested + bytes <= share,
            _ => false,
        }
    }

    /// Renders one blob into a new directory under `previews/tmp`.
    fn render(&self, job: &Job) -> Outcome {
        match self.try_render(job) {
            Ok(o) => o,
            Err(e) => Outcome::NotSupported(format!("could not render: {e}")),
        }
    }

    fn try_render(&self, job: &Job) -> std::io::Result<Outcome> {
        let background = !job.asked;
        if background && self.shared.busy() {
            return Ok(Outcome::Yielded);
        }
        let path = self.blobs.join(&job.hash[..2]).join(&job.hash);
        let judged = match judge(&path, &job.name) {
            Ok(Ok(j)) => j,
            Ok(Err(why)) => return Ok(Outcome::NotSupported(why)),
            // Deleted meanwhile: finish() finds no row and drops the job.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Outcome::NotSupported("the bytes are gone".into()));
            }
            Err(e) => return Err(e),
        };
        let Judged {
            mut file,
            size,
            head,
            kind,
        } = judged;
        let cap = match kind {
            Kind::Text => preview::TEXT_MAX_BYTES as u64,
            _ => size,
        };
        let mut data = head;
        (&mut file)
            .take(cap.saturating_sub(data.len() as u64))
            .read_to_end(&mut data)?;
        data.truncate(cap as usize);

        let tmp =
            self.root
                .join("tmp")
                .join(format!("{}-{:016x}", job.hash, rand::random::<u64>()));
        fs::create_dir_all(&tmp)?;
        let deadline = Instant::now() + JOB_TIME;
        let limits = Limits {
            deadline: Some(deadline),
            ..Limits::default()
        };
        let mut pages = Vec::new();
        let mut bytes = 0;
        let mut yielded = false;
        let mut write_page = |page: preview::Page| -> std::result::Result<(), String> {
            if background && self.shared.busy() {
                yielded = true;
                return Err("the store is busy".into());
            }
            let name = page_file(pages.len() + 1);
            write_synced(&tmp.join(name), &page.png).map_err(|e| format!("writing a page: {e}"))?;
            bytes += on_disk(page.png.len() as u64);
            pages.push((page.width, page.height));
            Ok(())
        };
        let rendered = preview::render(kind, &data, &limits, &mut write_page);
        let rendered = match rendered {
            Ok(r) => r,
            Err(why) => {
                let _ = fs::remove_dir_all(&tmp);
                return Ok(if yielded {
                    Outcome::Yielded
                } else if background && Instant::now() >= deadline {
                    Outcome::Dropped(why.0)
                } else {
                    Outcome::NotSupported(why.0)
                });
            }
        };
        if rendered.truncated {
            log::info!(
                "preview of {}: only the first {} pages",
                job.name,
                pages.len()
            );
        }
        let own_pdf = match rendered.pdf {
            DocumentPdf::Made(pdf) => {
                write_synced(&tmp.join("document.pdf"), &pdf)?;
                bytes += on_disk(pdf.len() as u64);
                true
            }
            DocumentPdf::Original => false,
        };
        Ok(Outcome::Done {
            tmp,
            pages,
            own_pdf,
            bytes,
        })
    }

    /// Records a job's result, unless the blob went away meanwhile (or another process
    /// finished it first): then its files are dropped.
    fn finish(
        &self,
        conn: &mut Connection,
        job: &Job,
        outcome: Outcome,
        took: Duration,
    ) -> Result<()> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let status: Option<i64> = tx
            .query_row(
                "SELECT status FROM previews WHERE blob = ?1",
                [&job.hash],
                |r| r.get(0),
            )
            .optional()?;
        if status != Some(IN_PROGRESS) {
            if let Outcome::Done { tmp, .. } = outcome {
                let _ = fs::remove_dir_all(tmp);
            }
            return Ok(());
        }
        match outcome {
            Outcome::Done {
                tmp,
                pages,
                own_pdf,
                bytes,
            } => {
                let dest = dir_of(&self.root, &job.hash);
                let placed = (|| -> std::io::Result<()> {
                    let _ = fs::remove_dir_all(&dest);
                    let parent = dest.parent().expect("preview dir has a parent");
                    fs::create_dir_all(parent)?;
                    fs::rename(&tmp, &dest)?;
                    File::open(parent)?.sync_all()
                })();
                if let Err(e) = placed {
                    // Disk full, say: forget it, so the next request tries again.
                    let _ = fs::remove_dir_all(&tmp);
                    log::warn!("could not store the preview of {}: {e}", job.name);
                    tx.execute("DELETE FROM previews WHERE blob = ?1", [&job.hash])?;
                } else {
                    let sizes = serde_json::to_string(&pages).expect("sizes serialize");
                    let now = now_ns();
                    tx.execute(
                        "UPDATE previews SET status = ?2, pages = ?3, own_pdf = ?4, updated_on = ?5,
                                used_on = ?5, bytes = ?6, requested = MAX(requested, ?7), render_ns = ?8
                         WHERE blob = ?1",
                        params![
                            job.hash,
                            READY,
                            sizes,
                            own_pdf,
                            now,
                            bytes as i64,
                            job.asked,
                            took.as_nanos() as i64
                        ],
                    )?;
                }
            }
            Outcome::NotSupported(reason) => {
                log::info!("no preview for {}: {reason}", job.name);
                tx.execute(
                    "UPDATE previews SET status = ?2, reason = ?3, updated_on = ?4, render_ns = ?5
                     WHERE blob = ?1",
                    params![
                        job.hash,
                        NOT_SUPPORTED,
                        reason,
                        now_ns(),
                        took.as_nanos() as i64
                    ],
                )?;
            }
            Outcome::Yielded | Outcome::Dropped(_) => {}
        }
        tx.commit()?;
        Ok(())
    }

    /// Removes least recently used previews until they and `incoming` more bytes fit the cache
    /// size (never `keep`, the one being made): first those of bytes that are no file's current
    /// version, then those nobody asked for, then the rest, oldest use first.
    fn keep_bound(&self, conn: &mut Connection, keep: Option<&str>, incoming: u64) -> Result<()> {
        let (total, _) = preview_bytes(conn)?;
        let bound = self.shared.cache_size.saturating_sub(incoming);
        let mut total = total;
        if total <= bound {
            return Ok(());
        }
        let candidates: Vec<(String, i64)> = {
            let mut stmt = conn.prepare(&format!(
                "SELECT p.blob, p.bytes FROM previews p WHERE p.status = 1 AND p.blob != ?1
                 ORDER BY {}, p.requested, p.used_on",
                IS_CURRENT.replace("?1", "p.blob")
            ))?;
            stmt.query_map([keep.unwrap_or("")], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut evict = Vec::new();
        for (hash, bytes) in candidates {
            if total <= bound {
                break;
            }
            total = total.saturating_sub(bytes.max(0) as u64);
            evict.push(hash);
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut gone = Vec::new();
        for hash in evict {
            // Only if still ready (a row asked for again meanwhile is left as it is).
            if tx.execute(
                "DELETE FROM previews WHERE blob = ?1 AND status = 1",
                [&hash],
            )? == 1
            {
                gone.push(hash);
            }
        }
        tx.commit()?;
        for hash in &gone {
            remove_dir(&dir_of(&self.root, hash));
        }
        if !gone.is_empty() {
            self.shared
                .evicted
                .fetch_add(gone.len() as u64, Ordering::Relaxed);
            log::debug!(
                "{} preview(s) removed to stay within {} bytes",
                gone.len(),
                self.shared.cache_size
            );
        }
        Ok(())
    }

    /// Ready previews from a database older than the cache get their sizes measured.
    fn measure_old(&self, conn: &mut Connection) -> Result<()> {
        let old: Vec<String> = conn
            .prepare("SELECT blob FROM previews WHERE status = 1 AND bytes < 0")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if old.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for hash in &old {
            let bytes = dir_bytes(&dir_of(&self.root, hash));
            tx.execute(
                "UPDATE previews SET bytes = ?2 WHERE blob = ?1",
                params![hash, bytes as i64],
            )?;
        }
        tx.commit()?;
        log::info!(
            "measured {} preview(s) from before the preview cache",
            old.len()
        );
        Ok(())
    }
}

/// Bytes of all ready previews and of those nobody asked for.
fn preview_bytes(conn: &Connection) -> Result<(u64, u64)> {
    let (all, unrequested): (i64, i64) = conn.query_row(
        "SELECT COALESCE(SUM(MAX(bytes, 0)), 0),
                COALESCE(SUM(CASE WHEN requested = 0 THEN MAX(bytes, 0) END), 0)
         FROM previews WHERE status = 1",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((all.max(0) as u64, unrequested.max(0) as u64))
}

/// Bytes of the files in a preview directory, in 4 KiB blocks.
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| on_disk(m.len()))
                .sum()
        })
        .unwrap_or(0)
}

fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Asked-for rendering runs a little below normal priority (somebody waits for it, but uploads
/// and downloads come first); background rendering only on CPU and disk time nobody else wants
/// (`SCHED_IDLE`, idle I/O class; nice 19 where `SCHED_IDLE` is refused).
#[cfg(target_os = "linux")]
fn lower_priority(tier: Tier) {
    // SAFETY: plain syscalls on the calling thread; failure only leaves the priority as it was.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        match tier {
            Tier::Asked => {
                libc::setpriority(libc::PRIO_PROCESS, tid, 5);
            }
            Tier::Background => {
                libc::setpriority(libc::PRIO_PROCESS, tid, 19);
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    log::debug!(
                        "SCHED_IDLE refused ({}); background previews at nice 19",
                        std::io::Error::last_os_error()
                    );
                }
                // ioprio_set(IOPRIO_WHO_PROCESS, this thread, IOPRIO_CLASS_IDLE)
                const IOPRIO_WHO_PROCESS: libc::c_long = 1;
                const IOPRIO_CLASS_IDLE: libc::c_long = 3;
                libc::syscall(
                    libc::SYS_ioprio_set,
                    IOPRIO_WHO_PROCESS,
                    0 as libc::c_long,
                    IOPRIO_CLASS_IDLE << 13,
                );
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_: Tier) {}
