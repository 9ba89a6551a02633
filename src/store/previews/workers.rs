//! The preview threads: workers of each tier taking jobs from the queues, rendering into a
//! folder of their own and recording the result; the supervisor that replaces a stuck worker.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cache::{self, on_disk};
use super::queue::{Shared, Tier};
use super::sandbox::{self, Ended};
use super::{
    BACKGROUND_MIN_BYTES, FILES_BYTES_TTL, IN_PROGRESS, IS_CURRENT, JOB_HARD_LIMIT, JOB_TIME, Job,
    Judged, NOT_SUPPORTED, PreviewMode, READY, UNREQUESTED_SHARE, files_bytes, judge,
};
use crate::api::Result;
use crate::preview::{self, PreviewKind};
use crate::store::blobs::{Blobs, StagedPreview};
use crate::store::db::{Conn as Connection, OptionalExtension, TransactionBehavior, params};
use crate::store::now_ns;
use crate::sync::relock;

/// What a worker is doing, for the supervisor.
pub(super) struct Slot {
    pub(super) tier: Tier,
    pub(super) current: Mutex<Option<(Job, Instant)>>,
    pub(super) abandoned: AtomicBool,
}

/// What the preview threads share.
#[derive(Clone)]
pub(super) struct Pool {
    pub(super) blobs: Blobs,
    pub(super) db: crate::store::db::Engine,
    pub(super) shared: Arc<Shared>,
    /// The files' bytes, and when they were summed.
    pub(super) files_bytes: Arc<Mutex<Option<(Instant, u64)>>>,
    /// The program that renders in a child process (`vaultfs render-preview`).
    pub(super) renderer: Arc<Path>,
}

/// A job's result: the folder with its files, or why there is no preview.
pub(super) enum Outcome {
    Done {
        staged: StagedPreview,
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
    pub(super) fn spawn(&self, tier: Tier) -> Arc<Slot> {
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
    pub(super) fn supervise(&self, mut slots: Vec<Arc<Slot>>) {
        if let Err(e) = self.open_db().and_then(|mut c| {
            cache::measure_old(&mut c, &self.blobs)?;
            cache::keep_bound(&mut c, &self.blobs, &self.shared, None, 0)
        }) {
            log::warn!("could not check the preview cache: {e}");
        }
        while !self.shared.closed() {
            std::thread::sleep(Duration::from_secs(1));
            for slot in slots.iter_mut() {
                let stuck = {
                    let cur = relock(&slot.current);
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

    pub(super) fn open_db(&self) -> Result<Connection> {
        Ok(self.db.connect()?)
    }

    pub(super) fn work(&self, slot: &Slot) {
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
    pub(super) fn run(&self, conn: &mut Connection, slot: &Slot, job: &Job) -> bool {
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
        *relock(&slot.current) = Some((job.clone(), Instant::now()));
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.render(job)))
            .unwrap_or_else(|_| Outcome::NotSupported("the renderer failed".into()));
        if slot.abandoned.load(Ordering::SeqCst) {
            drop(outcome); // (its files with it)
            return false;
        }
        *relock(&slot.current) = None;
        let mut outcome = match outcome {
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
            Outcome::Done { bytes, .. } if !job.asked && !self.fits_budget(conn, bytes) => {
                log::debug!(
                    "background preview of {} dropped: over the share of unrequested previews",
                    job.name
                );
                return true;
            }
            o => o,
        };
        // Into the bucket before the store's lock is taken (a folder has nothing to do here).
        if let Outcome::Done { staged, .. } = &mut outcome {
            if let Err(e) = self.blobs.upload_preview(staged) {
                // Forgotten, so the next request tries again.
                log::warn!("could not store the preview of {}: {e}", job.name);
                if let Err(e) = conn.execute(
                    "DELETE FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 0",
                    params![job.hash, job.kind.as_str()],
                ) {
                    log::warn!("could not record the preview of {}: {e}", job.name);
                }
                return true;
            }
        }
        log::debug!("preview of {} done in {:?}", job.name, started.elapsed());
        // Room is made before the new preview is placed, so the bound holds at every moment.
        if let Outcome::Done { bytes, .. } = &outcome {
            if let Err(e) = cache::keep_bound(conn, &self.blobs, &self.shared, Some(job), *bytes) {
                log::warn!("could not keep the previews within their bound: {e}");
            }
        }
        let ready = match &outcome {
            Outcome::Done { bytes, .. } => Some(*bytes),
            _ => None,
        };
        match self.finish(conn, job, outcome, started.elapsed()) {
            Ok(()) => {
                if let Some(bytes) = ready {
                    cache::note_ready(&self.shared, bytes, !job.asked);
                }
            }
            Err(e) => log::warn!("could not record the preview of {}: {e}", job.name),
        }
        if let Err(e) = cache::keep_bound(conn, &self.blobs, &self.shared, Some(job), 0) {
            log::warn!("could not keep the previews within their bound: {e}");
        }
        true
    }

    /// Whether a job is still to be done. Asked-for jobs: while in progress. Background jobs
    /// also need the bytes to be a file's current version, and room: the cache not full, and
    /// in `on-demand` mode a large enough file and unrequested previews within their share.
    pub(super) fn admit(&self, conn: &Connection, job: &Job) -> Result<bool> {
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
        let (total, unrequested) = cache::preview_bytes_seen(conn, &self.shared, false)?;
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
    pub(super) fn share(&self, conn: &Connection) -> Result<u64> {
        let mut cached = relock(&self.files_bytes);
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
    pub(super) fn fits_budget(&self, conn: &Connection, bytes: u64) -> bool {
        if self.shared.mode == PreviewMode::Eager {
            return true;
        }
        match (
            cache::preview_bytes_seen(conn, &self.shared, false),
            self.share(conn),
        ) {
            (Ok((_, unrequested)), Ok(share)) => unrequested + bytes <= share,
            _ => false,
        }
    }

    /// Renders one blob into a new directory under `previews/tmp`.
    pub(super) fn render(&self, job: &Job) -> Outcome {
        match self.try_render(job) {
            Ok(o) => o,
            Err(e) => Outcome::NotSupported(format!("could not render: {e}")),
        }
    }

    pub(super) fn try_render(&self, job: &Job) -> std::io::Result<Outcome> {
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
            file,
            size,
            head,
            kind,
        } = judged;
        let cap = match kind {
            PreviewKind::Text => preview::TEXT_MAX_BYTES as u64,
            _ => size,
        };
        let head_len = (head.len() as u64).min(cap);
        let mut input = std::io::Cursor::new(head)
            .take(head_len)
            .chain(file.take(cap - head_len));

        let staged = self.blobs.preview_staging(&job.hash)?;
        let started = Instant::now();
        let stop = || background && self.shared.busy();
        let ended = match sandbox::run(
            &self.renderer,
            kind.as_str(),
            staged.dir(),
            &mut input,
            cap,
            &stop,
        ) {
            Ok(ended) => ended,
            // Not the file's fault (the program missing, no processes left): not recorded, so
            // the next request tries again.
            Err(e) => {
                log::error!(
                    "cannot run the preview renderer {}: {e}",
                    self.renderer.display()
                );
                return Ok(Outcome::Dropped(format!("the renderer could not run: {e}")));
            }
        };
        let (pages, own_pdf, truncated) = match ended {
            Ended::Done {
                pages,
                own_pdf,
                truncated,
            } => (pages, own_pdf, truncated),
            Ended::Stopped => return Ok(Outcome::Yielded),
            // A background job may just have been starved of CPU: left for a request.
            // (A death is not: its bounds are of memory and CPU time.)
            Ended::Unsupported(why) if background && started.elapsed() >= JOB_TIME => {
                return Ok(Outcome::Dropped(why));
            }
            Ended::TimedOut if background => {
                return Ok(Outcome::Dropped("rendering took too long".into()));
            }
            Ended::TimedOut => return Ok(Outcome::NotSupported("rendering took too long".into())),
            Ended::Unsupported(why) | Ended::Died(why) => return Ok(Outcome::NotSupported(why)),
        };
        if truncated {
            log::info!(
                "preview of {}: only the first {} pages",
                job.name,
                pages.len()
            );
        }
        let mut bytes: u64 = pages.iter().map(|p| on_disk(p.2)).sum();
        if own_pdf {
            bytes += on_disk(std::fs::metadata(staged.dir().join("document.pdf"))?.len());
        }
        Ok(Outcome::Done {
            staged,
            pages: pages.into_iter().map(|(w, h, _)| (w, h)).collect(),
            own_pdf,
            bytes,
        })
    }

    /// Records a job's result and places its files, unless the blob went away meanwhile (or
    /// another process finished it first): then its files are dropped. The files of the render
    /// recorded go under their name inside the transaction that records them, so no other
    /// render (of this server or another) and no eviction comes between.
    pub(super) fn finish(
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
            return Ok(()); // (the outcome's files dropped with it)
        }
        // What is left of a placed render (temporary objects) is removed after the commit.
        let mut placed_from = None;
        match outcome {
            Outcome::Done {
                mut staged,
                pages,
                own_pdf,
                bytes,
            } => {
                let placed = self.blobs.place_preview(&mut staged, &job.hash, kind);
                placed_from = Some(staged);
                if let Err(e) = placed {
                    // Disk full, say: forget it, so the next request tries again.
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
        drop(placed_from);
        Ok(())
    }
}

/// Asked-for rendering runs a little below normal priority (somebody waits for it, but uploads
/// and downloads come first); background rendering only on CPU and disk time nobody else wants
/// (`SCHED_IDLE`, idle I/O class; nice 19 where `SCHED_IDLE` is refused).
#[cfg(target_os = "linux")]
pub(super) fn lower_priority(tier: Tier) {
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
pub(super) fn lower_priority(_: Tier) {}
