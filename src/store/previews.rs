//! Previews of stored files (DESIGN.md §2), kept beside the blobs in
//! `previews/<hash[0..2]>/<hash>/<kind>/` (`page-0001.png`..., `document.pdf` when one was
//! made). They are keyed by the blob and the kind its bytes are rendered as, which the file's
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

use super::db::{Conn as Connection, OptionalExtension, TransactionBehavior, params};
use bytes::Bytes;

use super::blobs::{BlobFile, Blobs};
use super::nodes::file_by_id;
use super::{Scope, Store, now_ns, ns_to_time};
use crate::api::{Error, PageSize, Result};
use crate::preview::{self, DocumentPdf, Kind, Kinds, Limits};

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
    kind: Kind,
    name: String,
    asked: bool,
}

impl Job {
    /// What identifies a preview: the bytes and their kind.
    fn key(&self) -> String {
        key(&self.hash, self.kind)
    }
}

fn key(hash: &str, kind: Kind) -> String {
    format!("{hash}/{}", kind.as_str())
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
        let key = job.key();
        if q.closed || q.queued.contains_key(&key) || q.running.contains_key(&key) {
            return;
        }
        q.queued.insert(key, Tier::Background);
        // A thread only sleeps without a timeout on an empty queue (or until an asked-for job
        // ends, which wakes it): no wake-up per commit during a burst of writes.
        let wake = q.background.is_empty();
        q.background.push_back(job);
        if wake {
            self.more.notify_all();
        }
    }

    /// Moves an asked-for job to the front; true when there is one (queued or running).
    fn bump(&self, key: &str) -> bool {
        let mut q = self.lock();
        if q.queued.get(key) == Some(&Tier::Asked) {
            if let Some(i) = q.asked.iter().position(|j| j.key() == key) {
                let job = q.asked.remove(i).expect("found");
                q.asked.push_front(job);
            }
            return true;
        }
        q.running.contains_key(key)
    }

    /// Queues a job somebody asked for at the front (taking it out of the background).
    fn push_asked(&self, hash: &str, kind: Kind, name: &str) {
        let key = key(hash, kind);
        let mut q = self.lock();
        if q.closed || q.running.contains_key(&key) {
            return;
        }
        if q.queued.get(&key) == Some(&Tier::Asked) {
            drop(q);
            self.bump(&key);
            return;
        }
        q.queued.insert(key, Tier::Asked);
        q.asked.push_front(Job {
            hash: hash.to_string(),
            kind,
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
                q.queued.remove(&job.key());
                *q.running.entry(job.key()).or_default() += 1;
                return Some(job);
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn done_asked(&self, key: &str) {
        let mut q = self.lock();
        if let Some(n) = q.running.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                q.running.remove(key);
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
                    if q.queued.get(&job.key()) == Some(&Tier::Background) {
                        q.queued.remove(&job.key());
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

/// Scaled page images made on request (by preview key, page, width, height), bounded by their
/// bytes.
struct Scaled {
    lru: lru::LruCache<(String, u32, u32, u32), Bytes>,
    bytes: usize,
}

pub(super) struct Previews {
    /// `<data dir>/previews`
    root: PathBuf,
    db: super::db::Engine,
    shared: Arc<Shared>,
    scaled: Mutex<Scaled>,
    started: OnceLock<()>,
}

impl Previews {
    pub(super) fn new(
        data_dir: &Path,
        db: super::db::Engine,
        mode: PreviewMode,
        cache_size: u64,
    ) -> std::io::Result<Self> {
        let root = data_dir.join("previews");
        fs::create_dir_all(root.join("tmp"))?;
        Ok(Previews {
            root,
            db,
            shared: Arc::new(Shared::new(mode, cache_size)),
            scaled: Mutex::new(Scaled {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            started: OnceLock::new(),
        })
    }

    fn dir_of(&self, hash: &str, kind: Kind) -> PathBuf {
        dir_of(&self.root, hash, kind)
    }

    /// Removes the preview files of a blob that is gone, of every kind (their rows went with
    /// the blob's).
    pub(super) fn remove_files(&self, hash: &str) {
        remove_blob_dir(&self.root, hash);
    }

    /// `<data dir>/previews`
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// After a crash, alone with the store: empties `previews/tmp` (jobs that died with their
    /// process) and removes preview directories that no ready row accounts for (a row removed
    /// whose files were not yet).
    pub(super) fn recover(&self, conn: &Connection) -> Result<()> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp)? {
            let _ = fs::remove_dir_all(entry?.path());
        }
        let mut ready =
            conn.prepare("SELECT 1 FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 1")?;
        let mut removed = 0;
        for prefix in fs::read_dir(&self.root)? {
            let prefix = prefix?;
            if prefix.file_name() == "tmp" || !prefix.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(prefix.path())? {
                let entry = entry?;
                let hash = entry.file_name();
                let Some(hash) = hash.to_str().filter(|_| entry.path().is_dir()) else {
                    remove_dir(&entry.path());
                    removed += 1;
                    continue;
                };
                for kind in fs::read_dir(entry.path())? {
                    let kind = kind?;
                    let known = match kind.file_name().to_str().and_then(Kind::parse) {
                        Some(k) => ready.exists(params![hash, k.as_str()])?,
                        None => false,
                    };
                    if !known {
                        remove_dir(&kind.path());
                        removed += 1;
                    }
                }
                // Gone when no kind is left.
                let _ = fs::remove_dir(entry.path());
            }
        }
        if removed > 0 {
            log::info!("removed {removed} preview(s) no longer recorded");
        }
        Ok(())
    }

    /// Queues the preview of a stored version for the background (the commit path).
    pub(super) fn enqueue(&self, hash: &str, kind: Kind, name: &str) {
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
}

impl Drop for Previews {
    fn drop(&mut self) {
        // A job in progress finishes (or is dropped) on its own; nothing new starts.
        self.shared.close();
    }
}

/// `previews/<hash[0..2]>/<hash>/<kind>/`: every kind of some bytes in one folder, which goes
/// with the bytes.
fn dir_of(root: &Path, hash: &str, kind: Kind) -> PathBuf {
    root.join(&hash[..2]).join(hash).join(kind.as_str())
}

fn remove_dir(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log::warn!("could not remove the preview {}: {e}", dir.display());
        }
    }
}

/// Removes the previews of every kind of a blob that is gone, under the previews' `root`.
pub(super) fn remove_blob_dir(root: &Path, hash: &str) {
    remove_dir(&root.join(&hash[..2]).join(hash));
}

/// Removes the preview of one kind, and the blob's folder when it was the last.
fn remove_kind_dir(dir: &Path) {
    remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = fs::remove_dir(parent);
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

/// The kind of a blob's bytes for each class of name, judged by their first bytes once and
/// kept in `blobs.kinds`. Bytes that are gone have no kind with a preview.
pub(super) fn blob_kinds(conn: &Connection, blobs: &Blobs, hash: &str) -> Result<Kinds> {
    let none = [Kind::Unsupported; 3];
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
pub(super) fn kind_of(conn: &Connection, blobs: &Blobs, hash: &str, name: &str) -> Result<Kind> {
    Ok(blob_kinds(conn, blobs, hash)?[preview::name_class(name)])
}

fn format_kinds(kinds: &Kinds) -> String {
    kinds.map(|k| k.as_str()).join(",")
}

fn parse_kinds(s: &str) -> Option<Kinds> {
    let mut it = s.split(',').map(Kind::parse);
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
) -> Result<Option<Kind>> {
    let kind = kind_of(conn, blobs, hash, name)?;
    if kind == Kind::Unsupported {
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
    kind: Kind,
}

/// Opens a blob and tells whether it can have a preview of that kind (`Err(reason)` when it
/// cannot).
fn judge(
    blobs: &Blobs,
    hash: &str,
    kind: Kind,
) -> std::io::Result<std::result::Result<Judged, String>> {
    let mut file = blobs.open(hash)?;
    let size = file.len();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
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

/// A ready preview: its blob and kind, page sizes, and whether it made its own PDF.
struct ReadyPreview {
    hash: String,
    kind: Kind,
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
        let pending: Vec<(String, String, String)> = {
            let conn = self.lock()?;
            let mut stmt = conn.prepare(
                "SELECT blob, kind, name FROM previews WHERE status = 0 ORDER BY updated_on",
            )?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<super::db::Result<_>>()?
        };
        for (hash, kind, name) in &pending {
            if let Some(kind) = Kind::parse(kind) {
                p.enqueue(hash, kind, name);
            }
        }
        let pool = Pool {
            root: p.root.clone(),
            blobs: self.blobs.clone(),
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
        let conn = self.lock()?;
        let (ready, bytes, unrequested, unrequested_bytes): (i64, i64, i64, i64) = conn.query_row(
            &format!(
                "SELECT count(*), CAST(COALESCE(SUM({max}(bytes, 0)), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN 1 ELSE 0 END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN {max}(bytes, 0) END), 0)
                            AS BIGINT)
                 FROM previews WHERE status = 1",
                max = conn.greatest()
            ),
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

    /// The preview state and the preview it is (the blob and the kind the file's name chooses;
    /// when ready, whether it has its own PDF).
    fn preview_of(
        &self,
        scope: Scope,
        file_id: &str,
    ) -> Result<(PreviewState, String, Kind, bool)> {
        let conn = self.lock()?;
        let (name, Some(hash)) = Self::current_blob(&conn, scope, file_id)? else {
            return Ok((
                PreviewState::NotSupported,
                String::new(),
                Kind::Unsupported,
                false,
            ));
        };
        let kind = kind_of(&conn, &self.blobs, &hash, &name)?;
        if kind == Kind::Unsupported {
            return Ok((PreviewState::NotSupported, hash, kind, false));
        }
        type Row = (i64, Option<String>, bool, i64, bool);
        let row: Option<Row> = conn
            .prepare_cached(
                "SELECT status, pages, own_pdf, used_on, requested FROM previews
                 WHERE blob = ?1 AND kind = ?2",
            )?
            .query_row(params![hash, kind.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()?;
        if let (Scope::Account(account), Some((status, ..))) = (scope, &row) {
            if *status != IN_PROGRESS && Self::still_making_for(&conn, account, &hash, kind)? {
                return Ok((PreviewState::InProgress, hash, kind, false));
            }
        }
        let waiting = |conn: &Connection| -> Result<()> {
            if let Scope::Account(account) = scope {
                // Being made while this account waits: it sees it when it is done.
                conn.prepare_cached(
                    "INSERT INTO preview_access (account_id, blob, kind, ready_on) VALUES (?1, ?2, ?3, 0)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![account, hash, kind.as_str()])?;
            }
            Ok(())
        };
        let state = match row {
            None => {
                want(&conn, &self.blobs, &hash, &name)?;
                waiting(&conn)?;
                drop(conn);
                self.ask(&hash, kind, &name)?
            }
            Some((IN_PROGRESS, ..)) => {
                waiting(&conn)?;
                drop(conn);
                self.ask(&hash, kind, &name)?
            }
            Some((READY, pages, own_pdf, used_on, requested)) => {
                let now = now_ns();
                if !requested || now - used_on > USE_GRANULARITY_NS {
                    conn.prepare_cached(
                        "UPDATE previews SET used_on = ?3, requested = 1 WHERE blob = ?1 AND kind = ?2",
                    )?
                    .execute(params![hash, kind.as_str(), now])?;
                }
                let pages = pages
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default();
                return Ok((PreviewState::Ready { pages }, hash, kind, own_pdf));
            }
            Some(_) => PreviewState::NotSupported,
        };
        Ok((state, hash, kind, false))
    }

    /// Whether `account` is to be told a finished preview is still being made: the first time it
    /// asks for a preview made before (maybe for another account), it waits as long as making
    /// it took, as it would have for bytes nobody had. Later answers follow the preview.
    fn still_making_for(conn: &Connection, account: i64, hash: &str, kind: Kind) -> Result<bool> {
        let now = now_ns();
        let ready_on: Option<i64> = conn
            .prepare_cached(
                "SELECT ready_on FROM preview_access WHERE account_id = ?1 AND blob = ?2 AND kind = ?3",
            )?
            .query_row(params![account, hash, kind.as_str()], |r| r.get(0))
            .optional()?;
        let ready_on = match ready_on {
            Some(t) => t,
            None => {
                let took: i64 = conn
                    .prepare_cached("SELECT render_ns FROM previews WHERE blob = ?1 AND kind = ?2")?
                    .query_row(params![hash, kind.as_str()], |r| r.get(0))?;
                let t = now.saturating_add(took.max(0));
                conn.prepare_cached(
                    "INSERT INTO preview_access (account_id, blob, kind, ready_on) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![account, hash, kind.as_str(), t])?;
                t
            }
        };
        Ok(ready_on > now)
    }

    /// Somebody asked for a preview in progress: its job goes to the front. Bytes that cannot
    /// have a preview of that kind (too large) are recorded so at once, without rendering.
    fn ask(&self, hash: &str, kind: Kind, name: &str) -> Result<PreviewState> {
        let shared = &self.previews.shared;
        if shared.bump(&key(hash, kind)) {
            return Ok(PreviewState::InProgress);
        }
        if let Ok(Err(reason)) = judge(&self.blobs, hash, kind) {
            log::info!("no preview for {name}: {reason}");
            self.lock()?
                .prepare_cached(
                    "UPDATE previews SET status = ?3, reason = ?4, updated_on = ?5
                     WHERE blob = ?1 AND kind = ?2 AND status = 0",
                )?
                .execute(params![
                    hash,
                    kind.as_str(),
                    NOT_SUPPORTED,
                    reason,
                    now_ns()
                ])?;
            return Ok(PreviewState::NotSupported);
        }
        shared.push_asked(hash, kind, name);
        Ok(PreviewState::InProgress)
    }

    /// The blob of a file whose preview is ready, and its page sizes.
    fn ready(&self, scope: Scope, file_id: &str) -> Result<ReadyPreview> {
        match self.preview_of(scope, file_id)? {
            (PreviewState::Ready { pages }, hash, kind, own_pdf) => Ok(ReadyPreview {
                hash,
                kind,
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
        let ReadyPreview {
            hash, kind, pages, ..
        } = self.ready(scope, file_id)?;
        let (w, h) = *pages
            .get((page as usize).wrapping_sub(1))
            .ok_or_else(|| Error::not_found(format!("the preview has {} page(s)", pages.len())))?;
        let (tw, th) = preview::fit(w, h, size);
        let cache_key = (key(&hash, kind), page, tw, th);
        let cache = &self.previews.scaled;
        if let Some(b) = cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lru
            .get(&cache_key)
        {
            return Ok(b.clone());
        }
        let path = self
            .previews
            .dir_of(&hash, kind)
            .join(page_file(page as usize));
        let png = fs::read(&path).map_err(|e| self.evicted_meanwhile(scope, file_id, e))?;
        if (tw, th) == (w, h) {
            return Ok(Bytes::from(png));
        }
        let scaled = preview::scale_png(&png, tw, th)
            .map_err(|e| Error::internal(format!("could not scale page {page}: {e}")))?;
        let scaled = Bytes::from(scaled);
        let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
        c.bytes += scaled.len();
        if let Some(old) = c.lru.put(cache_key, scaled.clone()) {
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
    pub fn preview_pdf(&self, scope: Scope, file_id: &str) -> Result<(BlobFile, u64)> {
        let ready = self.ready(scope, file_id)?;
        let file = if ready.own_pdf {
            BlobFile::from_file(
                File::open(
                    self.previews
                        .dir_of(&ready.hash, ready.kind)
                        .join("document.pdf"),
                )
                .map_err(|e| self.evicted_meanwhile(scope, file_id, e))?,
            )?
        } else {
            // The preview of a PDF is the PDF itself.
            let _guard = self.lock()?; // a delete cannot remove the blob meanwhile
            self.blobs.open(&ready.hash)?
        };
        let len = file.len();
        Ok((file, len))
    }

    /// Gives the previews of a database from before kinds (schema 7) their kind: the one their
    /// bytes have under the name they were rendered by, which their files move under. Rows of
    /// bytes that are gone, or of a kind with no preview, go.
    pub(super) fn migrate_preview_kinds(&self) -> Result<()> {
        let conn = self.lock()?;
        let old: Vec<(String, String)> = conn
            .prepare("SELECT blob, name FROM previews WHERE kind = ''")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        if old.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction()?;
        let mut moved = 0;
        for (hash, name) in &old {
            let kind = kind_of(&tx, &self.blobs, hash, name)?;
            let folder = self.previews.root.join(&hash[..2]).join(hash);
            if kind == Kind::Unsupported {
                tx.execute("DELETE FROM previews WHERE blob = ?1 AND kind = ''", [hash])?;
                let _ = fs::remove_dir_all(&folder);
                continue;
            }
            tx.execute(
                "UPDATE preview_access SET kind = ?2 WHERE blob = ?1 AND kind = ''",
                params![hash, kind.as_str()],
            )?;
            tx.execute(
                "UPDATE previews SET kind = ?2 WHERE blob = ?1 AND kind = ''",
                params![hash, kind.as_str()],
            )?;
            // The files of the old layout, `<hash>/page-0001.png`..., into `<hash>/<kind>/`.
            let Ok(entries) = fs::read_dir(&folder) else {
                continue;
            };
            let dest = folder.join(kind.as_str());
            fs::create_dir_all(&dest)?;
            for entry in entries {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    fs::rename(entry.path(), dest.join(entry.file_name()))?;
                }
            }
            moved += 1;
        }
        tx.commit()?;
        log::info!(
            "{} preview(s) from before preview kinds given theirs ({moved} with files moved)",
            old.len()
        );
        Ok(())
    }
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

/// What the preview threads share.
#[derive(Clone)]
struct Pool {
    root: PathBuf,
    blobs: Blobs,
    db: super::db::Engine,
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
                    self.shared.done_asked(&job.key());
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
        Ok(self.db.connect()?)
    }

    fn work(&self, slot: &Slot) {
        lower_priority(slot.tier);
        // The database down (PostgreSQL): the worker waits for it rather than leaving the pool
        // a worker short; its jobs wait in the queue meanwhile.
        let mut conn = loop {
            match self.open_db() {
                Ok(c) => break c,
                Err(e) if self.shared.closed() => {
                    return log::debug!("preview thread: cannot open the database: {e}");
                }
                Err(e) => {
                    log::warn!("preview thread: cannot open the database: {e}; trying again");
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        };
        loop {
            let job = match slot.tier {
                Tier::Asked => self.shared.take_asked(),
                Tier::Background => self.shared.take_background(),
            };
            let Some(job) = job else { return };
            let go_on = self.run(&mut conn, slot, &job);
            match slot.tier {
                Tier::Asked if go_on => self.shared.done_asked(&job.key()),
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
            if let Err(e) = self.keep_bound(conn, Some(job), *bytes) {
                log::warn!("could not keep the previews within their bound: {e}");
            }
        }
        if let Err(e) = self.finish(conn, job, outcome, started.elapsed()) {
            log::warn!("could not record the preview of {}: {e}", job.name);
        }
        if let Err(e) = self.keep_bound(conn, Some(job), 0) {
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
                     LEFT JOIN blobs b ON b.hash = p.blob WHERE p.blob = ?1 AND p.kind = ?2"
                ),
                params![job.hash, job.kind.as_str()],
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
        let judged = match judge(&self.blobs, &job.hash, job.kind) {
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
        let kind = job.kind.as_str();
        let status: Option<i64> = tx
            .query_row(
                "SELECT status FROM previews WHERE blob = ?1 AND kind = ?2",
                params![job.hash, kind],
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
                let dest = dir_of(&self.root, &job.hash, job.kind);
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
                    tx.execute(
                        "DELETE FROM previews WHERE blob = ?1 AND kind = ?2",
                        params![job.hash, kind],
                    )?;
                } else {
                    let sizes = serde_json::to_string(&pages).expect("sizes serialize");
                    let now = now_ns();
                    tx.execute(
                        &format!(
                            "UPDATE previews SET status = ?2, pages = ?3, own_pdf = ?4,
                                updated_on = ?5, used_on = ?5, bytes = ?6,
                                requested = {}(requested, ?7), render_ns = ?8
                             WHERE blob = ?1 AND kind = ?9",
                            tx.greatest()
                        ),
                        params![
                            job.hash,
                            READY,
                            sizes,
                            own_pdf,
                            now,
                            bytes as i64,
                            job.asked,
                            took.as_nanos() as i64,
                            kind
                        ],
                    )?;
                }
            }
            Outcome::NotSupported(reason) => {
                log::info!("no preview for {}: {reason}", job.name);
                tx.execute(
                    "UPDATE previews SET status = ?2, reason = ?3, updated_on = ?4, render_ns = ?5
                     WHERE blob = ?1 AND kind = ?6",
                    params![
                        job.hash,
                        NOT_SUPPORTED,
                        reason,
                        now_ns(),
                        took.as_nanos() as i64,
                        kind
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
    fn keep_bound(&self, conn: &mut Connection, keep: Option<&Job>, incoming: u64) -> Result<()> {
        let (total, _) = preview_bytes(conn)?;
        let bound = self.shared.cache_size.saturating_sub(incoming);
        let mut total = total;
        if total <= bound {
            return Ok(());
        }
        let (keep_hash, keep_kind) = keep.map_or(("", ""), |j| (&j.hash, j.kind.as_str()));
        let candidates: Vec<(String, String, i64)> = {
            let mut stmt = conn.prepare(&format!(
                "SELECT p.blob, p.kind, p.bytes FROM previews p
                 WHERE p.status = 1 AND NOT (p.blob = ?1 AND p.kind = ?2)
                 ORDER BY {}, p.requested, p.used_on",
                IS_CURRENT.replace("?1", "p.blob")
            ))?;
            stmt.query_map(params![keep_hash, keep_kind], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<super::db::Result<_>>()?
        };
        let mut evict = Vec::new();
        for (hash, kind, bytes) in candidates {
            if total <= bound {
                break;
            }
            total = total.saturating_sub(bytes.max(0) as u64);
            evict.push((hash, kind));
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut gone = Vec::new();
        for (hash, kind) in evict {
            // Only if still ready (a row asked for again meanwhile is left as it is).
            if tx.execute(
                "DELETE FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 1",
                params![hash, kind],
            )? == 1
            {
                gone.push((hash, kind));
            }
        }
        tx.commit()?;
        for (hash, kind) in &gone {
            if let Some(kind) = Kind::parse(kind) {
                remove_kind_dir(&dir_of(&self.root, hash, kind));
            }
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
        let old: Vec<(String, String)> = conn
            .prepare("SELECT blob, kind FROM previews WHERE status = 1 AND bytes < 0")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        if old.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for (hash, kind) in &old {
            let Some(k) = Kind::parse(kind) else { continue };
            let bytes = dir_bytes(&dir_of(&self.root, hash, k));
            tx.execute(
                "UPDATE previews SET bytes = ?3 WHERE blob = ?1 AND kind = ?2",
                params![hash, kind, bytes as i64],
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
        &format!(
            "SELECT CAST(COALESCE(SUM({max}(bytes, 0)), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN {max}(bytes, 0) END), 0)
                        AS BIGINT)
             FROM previews WHERE status = 1",
            max = conn.greatest()
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(version, 8);
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
        let moved = dir_of(&dir.join("previews"), &text, Kind::Text);
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
