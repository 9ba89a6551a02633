//! What a running mount tells about itself (`vaultfs status`): read-cache use, uploads waiting
//! and in flight with the bytes sent so far, recent errors; and the [`Control`] handle through
//! which the command layer asks for that status or for a clean unmount.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use super::Fs;
use super::table::Ino;
use crate::backend::{Backend, ByteStream};
use crate::sync::relock;

/// Errors kept for `vaultfs status`.
const RECENT_ERRORS: usize = 20;
/// Waiting uploads named one by one in a status (the oldest); the rest are counted. `vaultfs
/// sync` asks up to ten times a second, so a status must not grow with 100,000 files waiting.
const LISTED_WAITING: usize = 50;
/// A long upload logs its progress this often.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

/// Where a mount's store is: a server (logged in with `vaultfs login`) or the built-in store's
/// data dir.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum StoreAt {
    Server(String),
    DataDir(std::path::PathBuf),
}

/// A snapshot of a running mount.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    /// The mount point, as mounted.
    pub mountpoint: String,
    /// The backend path shown at the mount point.
    pub root: String,
    pub read_only: bool,
    /// The backend, in words (filled in by the command layer).
    #[serde(default)]
    pub backend: String,
    /// When the server's token expires (RFC 3339; remote backends only).
    #[serde(default)]
    pub token_expires: Option<String>,
    /// Where the store is (filled in by the command layer).
    #[serde(default)]
    pub store: Option<StoreAt>,
    pub pid: u32,
    /// Whether the backend currently counts as unreachable.
    pub offline: bool,
    /// Since when it is out of reach (RFC 3339).
    #[serde(default)]
    pub offline_since: Option<String>,
    pub cache: CacheUse,
    /// The descriptors of the mount's own files (staging and cache files) kept open.
    #[serde(default)]
    pub open_files: OpenFiles,
    /// How reads are served: passed through to local files by the kernel, or by the daemon
    /// (and why).
    #[serde(default)]
    pub reads: String,
    /// How writes reach the staging files: by the kernel itself for new or truncated files,
    /// or through the daemon.
    #[serde(default)]
    pub writes: String,
    /// The kernel's read-ahead for the mount in KiB, as it holds it (0: not set).
    #[serde(default)]
    pub read_ahead_kb: u32,
    /// READ requests the daemon answered since mounting (a passthrough read makes none).
    #[serde(default)]
    pub daemon_reads: u64,
    /// WRITE requests the daemon answered since mounting (a write the kernel makes itself to
    /// a staging file makes none).
    #[serde(default)]
    pub daemon_writes: u64,
    /// Uploads in flight first, then those waiting (for a slot, a retry or a writer to close):
    /// the oldest [`LISTED_WAITING`] of them, the rest counted in `waiting`.
    pub uploads: Vec<Upload>,
    /// Uploads waiting, listed or not, and their bytes.
    #[serde(default)]
    pub waiting: usize,
    #[serde(default)]
    pub waiting_bytes: u64,
    /// Unlinks answered whose deletes are not on the store yet (`fs::deletes`).
    #[serde(default)]
    pub deletes_pending: usize,
    /// The most recent errors, oldest first.
    pub errors: Vec<RecentError>,
    /// Conflict copies this mount made (`fs::conflict`), oldest first.
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// Edits that could not be stored, kept in `lost+found` (until moved or deleted there),
    /// oldest first.
    #[serde(default)]
    pub set_aside: Vec<SetAside>,
    /// Pinned files and folders (`vaultfs pin`), kept whole on disk.
    #[serde(default)]
    pub pins: Vec<Pin>,
}

impl Status {
    /// Uploads running or waiting, listed or not.
    pub fn uploads_pending(&self) -> usize {
        self.running().count() + self.waiting.max(self.listed_waiting())
    }

    /// Waiting uploads not named in `uploads` (a daemon before `waiting` named them all).
    pub fn unlisted_waiting(&self) -> usize {
        self.waiting.saturating_sub(self.listed_waiting())
    }

    /// Bytes of the uploads running or waiting.
    pub fn pending_bytes(&self) -> u64 {
        let listed_waiting: u64 = self
            .uploads
            .iter()
            .filter(|u| !u.running)
            .map(|u| u.size)
            .sum();
        self.running().map(|u| u.size).sum::<u64>() + self.waiting_bytes.max(listed_waiting)
    }

    /// The uploads being sent now.
    pub fn running(&self) -> impl Iterator<Item = &Upload> {
        self.uploads.iter().filter(|u| u.running)
    }

    fn listed_waiting(&self) -> usize {
        self.uploads.len() - self.running().count()
    }
}

/// A pinned file or folder and how much of it is whole on disk.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pin {
    /// Its path in the store (`/nodes/pth/...`).
    pub path: String,
    /// Where it is in the mount (empty when outside this mount's root).
    #[serde(default)]
    pub local_path: String,
    /// Stored files it holds, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Those whole on disk (kept across remounts, readable offline).
    pub whole_files: u64,
    pub whole_bytes: u64,
    /// Files written here and not stored yet (on disk in the staging area).
    #[serde(default)]
    pub local_files: u64,
    /// `on disk`, `fetching`, `listing` (not walked yet), `incomplete` (part of it not listed,
    /// or it is gone: see `problem`), or `offline: ...`.
    pub state: String,
    /// Why part of it is not on disk, when known.
    #[serde(default)]
    pub problem: Option<String>,
    /// When it was last walked (RFC 3339).
    #[serde(default)]
    pub checked: Option<String>,
}

/// An edit that could not be stored: its bytes kept in the mount's `lost+found`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SetAside {
    /// The file's path (`/nodes/pth/...`).
    pub path: String,
    /// Where its bytes are kept.
    pub kept: String,
    /// Why the store would not take them.
    pub why: String,
    /// When (RFC 3339).
    pub at: String,
}

/// A conflict copy: the local edit of `original`, which had changed elsewhere, stored as `copy`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Conflict {
    /// The copy's path (`/nodes/pth/...`).
    pub copy: String,
    /// The file it conflicts with, which kept the store's version.
    pub original: String,
    /// That version, as the store described it when the copy was made.
    #[serde(default)]
    pub server_md5: Option<String>,
    #[serde(default)]
    pub server_modified: Option<String>,
    /// When the copy was made (RFC 3339).
    pub at: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CacheUse {
    /// Bytes the read cache holds (sizes of the cached versions, an upper bound of disk use).
    pub used_bytes: u64,
    pub max_bytes: u64,
    pub files: usize,
    /// Bytes of pinned files among them: never evicted, not counted against `max_bytes`.
    #[serde(default)]
    pub pinned_bytes: u64,
}

/// The descriptor pool (`descriptors`): files kept open now, at most `bound` (a share of the
/// process's limit), and files opened so far.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpenFiles {
    pub open: usize,
    pub bound: usize,
    pub opened: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Upload {
    /// Path in the store.
    pub path: String,
    /// Bytes to send.
    pub size: u64,
    /// Bytes sent so far (0 while waiting).
    pub sent: u64,
    /// Whether the bytes are being sent now.
    pub running: bool,
    /// Mean rate since this attempt started, in bytes per second.
    pub rate: f64,
    /// Seconds since this attempt started.
    pub elapsed: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecentError {
    /// RFC 3339, UTC.
    pub at: String,
    pub message: String,
}

/// How an unmount ended for the uploads and the pins.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Shutdown {
    /// Files still not uploaded: they stay in the journal for the next mount.
    pub left_in_journal: usize,
    /// Pins not yet whole on disk, in words (`DIR: 3 of 40 file(s) on disk`): the pins are
    /// kept, and the next mount fetches the rest.
    #[serde(default)]
    pub pins_pending: Vec<String>,
}

/// The mount's record of uploads in flight and of recent errors.
#[derive(Default)]
pub(crate) struct Tracker {
    running: Mutex<HashMap<Ino, Running>>,
    errors: Mutex<VecDeque<RecentError>>,
}

struct Running {
    path: String,
    size: u64,
    sent: Arc<AtomicU64>,
    started: Instant,
}

impl Tracker {
    /// Counts the bytes `body` yields as sent for `ino` until [`Tracker::done`].
    pub fn track(&self, ino: Ino, path: String, size: u64, body: ByteStream) -> ByteStream {
        let sent = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        relock(&self.running).insert(
            ino,
            Running {
                path: path.clone(),
                size,
                sent: sent.clone(),
                started,
            },
        );
        Box::pin(counted(body, sent, path, size, started))
    }

    pub fn done(&self, ino: Ino) {
        relock(&self.running).remove(&ino);
    }

    pub fn error(&self, message: String) {
        let mut e = relock(&self.errors);
        if e.len() == RECENT_ERRORS {
            e.pop_front();
        }
        e.push_back(RecentError {
            at: crate::api::format_time(SystemTime::now()),
            message,
        });
    }

    pub fn errors(&self) -> Vec<RecentError> {
        let e = relock(&self.errors);
        e.iter().cloned().collect()
    }

    /// Uploads in flight, and whether `ino` is one of them.
    pub fn running(&self) -> HashMap<Ino, Upload> {
        let r = relock(&self.running);
        r.iter()
            .map(|(ino, r)| {
                let sent = r.sent.load(Ordering::Relaxed);
                let elapsed = r.started.elapsed().as_secs_f64();
                let rate = if elapsed > 0.0 {
                    sent as f64 / elapsed
                } else {
                    0.0
                };
                let u = Upload {
                    path: r.path.clone(),
                    size: r.size,
                    sent,
                    running: true,
                    rate,
                    elapsed,
                };
                (*ino, u)
            })
            .collect()
    }
}

/// The status of the mount `fs` at `mountpoint`.
pub(crate) fn snapshot<B: Backend>(fs: &Fs<B>, mountpoint: &str) -> Status {
    let running = fs.uploads.tracker.running();
    let mut uploads: Vec<Upload> = running.values().cloned().collect();
    uploads.sort_by(|a, b| a.path.cmp(&b.path));
    // The oldest waiting files (the lowest inode numbers) by a bounded heap, the rest counted.
    let mut oldest = std::collections::BinaryHeap::new();
    let (mut waiting_count, mut waiting_bytes) = (0, 0);
    let mut waiting = fs.nodes.read(|t| {
        for ino in t.staged_inos() {
            if running.contains_key(&ino) {
                continue;
            }
            let Some(i) = t.get(ino) else { continue };
            let Some(s) = &i.staged else { continue };
            if i.unlinked || !s.is_dirty() {
                continue;
            }
            waiting_count += 1;
            waiting_bytes += s.size();
            oldest.push(ino);
            if oldest.len() > LISTED_WAITING {
                oldest.pop();
            }
        }
        oldest
            .iter()
            .filter_map(|ino| t.get(*ino))
            .map(|i| Upload {
                path: i.path.to_string(),
                size: i.staged.as_ref().map_or(0, |s| s.size()),
                sent: 0,
                running: false,
                rate: 0.0,
                elapsed: 0.0,
            })
            .collect::<Vec<_>>()
    });
    waiting.sort_by(|a, b| a.path.cmp(&b.path));
    uploads.extend(waiting);
    let (used_bytes, max_bytes, files, pinned_bytes) = fs.reads.cache.usage();
    let offline = fs.offline.now();
    let pool = super::descriptors::Pool::global();
    let (open, opened) = pool.usage();
    let (read_ahead_kb, daemon_reads, daemon_writes) = fs.reads.counts.now();
    Status {
        mountpoint: mountpoint.to_string(),
        root: fs.opts.root.to_string(),
        read_only: fs.opts.read_only,
        backend: String::new(),
        token_expires: None,
        store: None,
        pid: std::process::id(),
        offline,
        offline_since: fs.offline.since().map(crate::api::format_time),
        cache: CacheUse {
            used_bytes,
            max_bytes,
            files,
            pinned_bytes,
        },
        open_files: OpenFiles {
            open,
            bound: pool.cap(),
            opened,
        },
        reads: fs.reads.passthrough.describe(),
        writes: fs.describe_writes(),
        read_ahead_kb,
        daemon_reads,
        daemon_writes,
        deletes_pending: fs.deletes.pending(),
        uploads,
        waiting: waiting_count,
        waiting_bytes,
        errors: fs.uploads.tracker.errors(),
        conflicts: fs.conflicts.list(),
        set_aside: fs.journal.set_aside(),
        pins: fs.pin_status(mountpoint),
    }
}

/// `body`, counting what it yields into `sent` and logging the progress of long uploads.
fn counted(
    body: ByteStream,
    sent: Arc<AtomicU64>,
    path: String,
    size: u64,
    started: Instant,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let mut last_log = started;
    body.inspect(move |item| {
        if let Ok(b) = item {
            let n = sent.fetch_add(b.len() as u64, Ordering::Relaxed) + b.len() as u64;
            if last_log.elapsed() >= PROGRESS_LOG_EVERY {
                last_log = Instant::now();
                let secs = started.elapsed().as_secs_f64().max(0.001);
                log::info!(
                    "uploading {path}: {} of {} ({}%), {}/s",
                    human_bytes(n),
                    human_bytes(size),
                    (n * 100).checked_div(size).unwrap_or(100),
                    human_bytes((n as f64 / secs) as u64)
                );
            }
        }
    })
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Pins (`true`) or unpins a path relative to the mount point: the errno on failure.
pub(crate) type PinFn = dyn Fn(&std::path::Path, bool) -> Result<(), i32> + Send + Sync;

/// The command layer's handle on a running mount: its status, and a clean unmount.
#[derive(Clone)]
pub struct Control {
    pub(crate) status: Arc<dyn Fn() -> Status + Send + Sync>,
    pub(crate) pin: Arc<PinFn>,
    pub(crate) stop: Arc<tokio::sync::Notify>,
    pub(crate) finished: tokio::sync::watch::Receiver<Option<Shutdown>>,
}

impl Control {
    pub fn status(&self) -> Status {
        (self.status)()
    }

    /// Pins or unpins `rel` (relative to the mount point), as the `user.vaultfs.pinned`
    /// attribute does.
    pub fn pin(&self, rel: &std::path::Path, on: bool) -> Result<(), i32> {
        (self.pin)(rel, on)
    }

    /// Asks the mount to unmount as SIGTERM does: uploads in flight get their time, the
    /// journal keeps the rest.
    pub fn unmount(&self) {
        self.stop.notify_one();
    }

    /// Waits until the mount has ended and its uploads are done or left to the journal.
    pub async fn finished(&self) -> Shutdown {
        let mut rx = self.finished.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_default(),
            Err(_) => Shutdown::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }

    #[tokio::test]
    async fn tracked_bodies_count_their_bytes() {
        let t = Tracker::default();
        let body: ByteStream = Box::pin(futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Ok(Bytes::from_static(b"defg")),
        ]));
        let mut s = t.track(7, "/x".into(), 7, body);
        s.next().await.unwrap().unwrap();
        assert_eq!(t.running()[&7].sent, 3);
        s.next().await.unwrap().unwrap();
        assert_eq!(t.running()[&7].sent, 7);
        t.done(7);
        assert!(t.running().is_empty());
        t.error("boom".into());
        assert_eq!(t.errors()[0].message, "boom");
    }
}
