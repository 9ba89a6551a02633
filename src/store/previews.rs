//! Previews of stored files (DESIGN.md §2): rendered in the background after a version becomes
//! current, by a small pool of low-priority threads (never on a request's path), and kept beside
//! the blobs in `previews/<hash[0..2]>/<hash>/` (`page-0001.png`..., `document.pdf` when one was
//! made). They are keyed by the blob, so copies share them and a new version gets its own; the
//! `previews` table says where each blob stands. Bytes stored before previews existed get theirs
//! on first request.
//!
//! Bounds: a job gives up between pages after [`JOB_TIME`] (the renderer checks its deadline),
//! and a job stuck inside one page is abandoned after [`JOB_HARD_LIMIT`]: marked not supported,
//! its worker replaced, whatever it produces later thrown away. Inputs over [`MAX_INPUT`] are not
//! previewed; the renderer bounds pages, page sizes and image decoding (`crate::preview::Limits`).

use std::collections::{HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::nodes::file_by_id;
use super::{Scope, Store, now_ns};
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

const IN_PROGRESS: i64 = 0;
const READY: i64 = 1;
const NOT_SUPPORTED: i64 = 2;

/// Preview threads by default: half the cores (at least one), so rendering never takes the
/// whole machine from uploads and downloads.
pub fn default_preview_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
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

/// One job: the bytes of a blob, and a name they had (a hint to their type).
#[derive(Clone)]
struct Job {
    hash: String,
    name: String,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    queued: HashSet<String>,
    /// The store was closed: the threads end.
    closed: bool,
}

#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    more: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, job: Job) {
        let mut q = self.lock();
        if q.queued.insert(job.hash.clone()) {
            q.queue.push_back(job);
            self.more.notify_one();
        }
    }

    /// The next job; None once the store is closed.
    fn take(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.queue.pop_front() {
                q.queued.remove(&job.hash);
                return Some(job);
            }
            q = self.more.wait(q).unwrap_or_else(|p| p.into_inner());
        }
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
#[derive(Default)]
struct Slot {
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
    queue: Arc<Queue>,
    scaled: Mutex<Scaled>,
    started: OnceLock<()>,
}

impl Previews {
    pub(super) fn new(data_dir: &Path) -> std::io::Result<Previews> {
        let root = data_dir.join("previews");
        fs::create_dir_all(root.join("tmp"))?;
        Ok(Previews {
            root,
            db: data_dir.join("vault.db"),
            queue: Arc::default(),
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
        let dir = self.dir_of(hash);
        if let Err(e) = fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!("could not remove the preview {}: {e}", dir.display());
            }
        }
    }

    /// Empties `previews/tmp` (jobs that died with their process). Only when alone with the store.
    pub(super) fn clear_tmp(&self) -> std::io::Result<()> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp)? {
            let _ = fs::remove_dir_all(entry?.path());
        }
        Ok(())
    }

    pub(super) fn enqueue(&self, hash: &str, name: &str) {
        self.queue.push(Job {
            hash: hash.to_string(),
            name: name.to_string(),
        });
    }
}

impl Drop for Previews {
    fn drop(&mut self) {
        // A job in progress finishes (or is dropped) on its own; nothing new starts.
        self.queue.close();
    }
}

fn dir_of(root: &Path, hash: &str) -> PathBuf {
    root.join(&hash[..2]).join(hash)
}

fn page_file(n: usize) -> String {
    format!("page-{n:04}.png")
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

/// Marks the blob's preview as wanted (in progress) unless the store already knows about it;
/// true when the row is new and a job should be queued. Runs inside the caller's transaction.
pub(super) fn want(conn: &Connection, hash: &str, name: &str) -> Result<bool> {
    let n = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO previews (blob, status, name, updated_on) VALUES (?1, 0, ?2, ?3)",
        )?
        .execute(params![hash, name, now_ns()])?;
    Ok(n == 1)
}

impl Store {
    /// Starts `workers` preview threads (once per process; later calls do nothing) and queues
    /// every preview left in progress by an earlier run.
    pub fn start_previews(&self, workers: usize) -> Result<()> {
        let p = &self.previews;
        if p.started.set(()).is_err() {
            return Ok(());
        }
        let pending: Vec<(String, String)> = {
            let conn = self.lock();
            let mut stmt = conn.prepare("SELECT blob, name FROM previews WHERE status = 0")?;
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
            queue: p.queue.clone(),
        };
        let slots: Vec<Arc<Slot>> = (0..workers.max(1)).map(|_| pool.spawn()).collect();
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

    /// The preview of a file's current bytes; asking starts its rendering if nobody has yet.
    pub fn preview(&self, scope: Scope, file_id: &str) -> Result<PreviewState> {
        Ok(self.preview_of(scope, file_id)?.0)
    }

    /// The preview state and the blob it is of.
    fn preview_of(&self, scope: Scope, file_id: &str) -> Result<(PreviewState, String)> {
        let conn = self.lock();
        let (name, Some(hash)) = Self::current_blob(&conn, scope, file_id)? else {
            return Ok((PreviewState::NotSupported, String::new()));
        };
        let row: Option<(i64, Option<String>)> = conn
            .query_row(
                "SELECT status, pages FROM previews WHERE blob = ?1",
                [&hash],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let state = match row {
            None => {
                want(&conn, &hash, &name)?;
                drop(conn);
                self.previews.enqueue(&hash, &name);
                PreviewState::InProgress
            }
            Some((IN_PROGRESS, _)) => PreviewState::InProgress,
            Some((READY, pages)) => PreviewState::Ready {
                pages: pages
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default(),
            },
            Some(_) => PreviewState::NotSupported,
        };
        Ok((state, hash))
    }

    /// The blob of a file whose preview is ready, and its page sizes.
    fn ready(&self, scope: Scope, file_id: &str) -> Result<(String, Vec<(u32, u32)>)> {
        match self.preview_of(scope, file_id)? {
            (PreviewState::Ready { pages }, hash) => Ok((hash, pages)),
            (PreviewState::InProgress, _) => Err(not_ready()),
            (PreviewState::NotSupported, _) => Err(not_supported()),
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
        let (hash, pages) = self.ready(scope, file_id)?;
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
        let png = fs::read(&path)?;
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
        let (hash, _) = self.ready(scope, file_id)?;
        let own = self.previews.dir_of(&hash).join("document.pdf");
        // The preview of a PDF is the PDF itself.
        let file = match File::open(&own) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _guard = self.lock(); // a delete cannot remove the blob meanwhile
                File::open(self.blobs.path(&hash))?
            }
            Err(e) => return Err(e.into()),
        };
        let len = file.metadata()?.len();
        Ok((file, len))
    }
}

/// What the preview threads share.
#[derive(Clone)]
struct Pool {
    root: PathBuf,
    blobs: PathBuf,
    db: PathBuf,
    queue: Arc<Queue>,
}

/// A job's result: the directory with its files, or why there is no preview.
enum Outcome {
    Done {
        tmp: PathBuf,
        pages: Vec<(u32, u32)>,
        own_pdf: bool,
    },
    NotSupported(String),
}

impl Pool {
    fn spawn(&self) -> Arc<Slot> {
        let slot = Arc::new(Slot::default());
        let (pool, s) = (self.clone(), slot.clone());
        let spawned = std::thread::Builder::new()
            .name("preview".into())
            .spawn(move || pool.work(&s));
        if let Err(e) = spawned {
            log::error!("could not start a preview thread: {e}");
        }
        slot
    }

    /// Replaces workers stuck in one job for longer than the hard limit.
    fn supervise(&self, mut slots: Vec<Arc<Slot>>) {
        while !self.queue.closed() {
            std::thread::sleep(Duration::from_secs(1));
            for slot in slots.iter_mut() {
                let stuck = {
                    let cur = slot.current.lock().unwrap_or_else(|p| p.into_inner());
                    cur.as_ref()
                        .filter(|(_, since)| since.elapsed() > JOB_HARD_LIMIT)
                        .map(|(job, _)| job.clone())
                };
                if let Some(job) = stuck {
                    slot.abandoned.store(true, Ordering::SeqCst);
                    log::warn!(
                        "preview of {} took over {}s: given up",
                        job.name,
                        JOB_HARD_LIMIT.as_secs()
                    );
                    let outcome = Outcome::NotSupported("rendering took too long".into());
                    if let Err(e) = self
                        .open_db()
                        .and_then(|mut c| self.finish(&mut c, &job, outcome))
                    {
                        log::warn!("could not record the preview of {}: {e}", job.name);
                    }
                    *slot = self.spawn();
                }
            }
        }
    }

    fn open_db(&self) -> Result<Connection> {
        let conn = Connection::open(&self.db)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        Ok(conn)
    }

    fn work(&self, slot: &Slot) {
        lower_priority();
        let mut conn = match self.open_db() {
            Ok(c) => c,
            Err(e) => return log::error!("preview thread: cannot open the database: {e}"),
        };
        while let Some(job) = self.queue.take() {
            // Done meanwhile (queued twice, another process) or its bytes gone: nothing to do.
            if !wanted(&conn, &job.hash) {
                continue;
            }
            *slot.current.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((job.clone(), Instant::now()));
            let started = Instant::now();
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.render(&job)))
                    .unwrap_or_else(|_| Outcome::NotSupported("the renderer failed".into()));
            if slot.abandoned.load(Ordering::SeqCst) {
                if let Outcome::Done { tmp, .. } = outcome {
                    let _ = fs::remove_dir_all(tmp);
                }
                return; // the supervisor recorded it and started another worker
            }
            *slot.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
            log::debug!("preview of {} done in {:?}", job.name, started.elapsed());
            if let Err(e) = self.finish(&mut conn, &job, outcome) {
                log::warn!("could not record the preview of {}: {e}", job.name);
            }
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
        let path = self.blobs.join(&job.hash[..2]).join(&job.hash);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            // Deleted meanwhile: finish() finds no row and drops the job.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Outcome::NotSupported("the bytes are gone".into()));
            }
            Err(e) => return Err(e),
        };
        let size = file.metadata()?.len();
        let mut head = Vec::with_capacity(SNIFF_BYTES);
        (&mut file)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut head)?;
        let kind = preview::sniff(&job.name, &head);
        let cap = match kind {
            Kind::Unsupported => {
                return Ok(Outcome::NotSupported("not a type with previews".into()));
            }
            Kind::Text => preview::TEXT_MAX_BYTES as u64,
            _ if size > MAX_INPUT => {
                return Ok(Outcome::NotSupported(format!(
                    "larger than {} MiB",
                    MAX_INPUT >> 20
                )));
            }
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
        let limits = Limits {
            deadline: Some(Instant::now() + JOB_TIME),
            ..Limits::default()
        };
        let mut pages = Vec::new();
        let mut write_page = |page: preview::Page| -> std::result::Result<(), String> {
            let name = page_file(pages.len() + 1);
            write_synced(&tmp.join(name), &page.png).map_err(|e| format!("writing a page: {e}"))?;
            pages.push((page.width, page.height));
            Ok(())
        };
        let rendered = preview::render(kind, &data, &limits, &mut write_page);
        let rendered = match rendered {
            Ok(r) => r,
            Err(why) => {
                let _ = fs::remove_dir_all(&tmp);
                return Ok(Outcome::NotSupported(why.0));
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
                true
            }
            DocumentPdf::Original => false,
        };
        Ok(Outcome::Done {
            tmp,
            pages,
            own_pdf,
        })
    }

    /// Records a job's result, unless the blob went away meanwhile (or another process
    /// finished it first): then its files are dropped.
    fn finish(&self, conn: &mut Connection, job: &Job, outcome: Outcome) -> Result<()> {
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
                    tx.execute(
                        "UPDATE previews SET status = ?2, pages = ?3, own_pdf = ?4, updated_on = ?5 WHERE blob = ?1",
                        params![job.hash, READY, sizes, own_pdf, now_ns()],
                    )?;
                }
            }
            Outcome::NotSupported(reason) => {
                log::info!("no preview for {}: {reason}", job.name);
                tx.execute(
                    "UPDATE previews SET status = ?2, reason = ?3, updated_on = ?4 WHERE blob = ?1",
                    params![job.hash, NOT_SUPPORTED, reason, now_ns()],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// Whether the blob's preview is still waiting to be rendered.
fn wanted(conn: &Connection, hash: &str) -> bool {
    conn.query_row("SELECT status FROM previews WHERE blob = ?1", [hash], |r| {
        r.get::<_, i64>(0)
    })
    .optional()
    .map_or(true, |s| s == Some(IN_PROGRESS))
}

fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Rendering yields the CPU to uploads, downloads and the user's own work.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread; failure only leaves the priority as it was.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}
