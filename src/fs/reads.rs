//! The reads part of the mount, around the read cache: the cache knows none of the parts that
//! use it here (prefetching, pins, passthrough).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::cache::ReadCache;
use super::passthrough::Passthrough;
use super::pinned::Pinned;
use super::prefetch::Prefetch;

/// The reads part of the mount: the read cache, the small files fetched into it ahead of a
/// reader, the pins that keep files in it whole, the opens passed through to local files, the
/// kernel's read-ahead, and the requests the daemon answered (for `vaultfs status`).
pub(super) struct Reads {
    pub(super) cache: ReadCache,
    /// The small files fetched ahead of a reader going through a folder.
    pub(super) prefetch: Prefetch,
    /// Files and folders kept whole on disk.
    pub(super) pinned: Pinned,
    /// Whether opens are passed through, and the blobs opened so far.
    pub(super) passthrough: Passthrough,
    /// The read-ahead the kernel granted, the requests the daemon answered.
    pub(super) counts: Counts,
    /// When a reader last had a READ of stored bytes answered (background work waits for a
    /// quiet spell: [`LastRead`]).
    pub(super) last_read: LastRead,
}

/// The read-ahead the kernel granted and the READ and WRITE requests the daemon answered (those
/// passed through make none), for `vaultfs status`.
#[derive(Default)]
pub(super) struct Counts {
    read_ahead_kb: AtomicU32,
    reads: AtomicU64,
    writes: AtomicU64,
}

impl Counts {
    /// A READ answered.
    pub(super) fn read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// A WRITE answered.
    pub(super) fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// The kernel granted `kb` KiB of read-ahead (once set after mounting).
    pub(super) fn read_ahead_granted(&self, kb: u32) {
        self.read_ahead_kb.store(kb, Ordering::Relaxed);
    }

    /// The read-ahead granted (KiB), READs and WRITEs answered.
    pub(super) fn now(&self) -> (u32, u64, u64) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let kb = self.read_ahead_kb.load(Ordering::Relaxed);
        (kb, load(&self.reads), load(&self.writes))
    }
}

/// When a reader last had a READ of stored bytes answered by the daemon. Background fetches
/// (the thumbnails for file managers) wait until the mount has gone a while without one: over a
/// link, a reader's first bytes would otherwise wait for a new connection (the warm one busy
/// with a preview) and share the bandwidth with them. The mount's start counts as a read: the
/// first reads after a mount come before the thumbnails of the folders it lists.
pub(super) struct LastRead {
    since: std::time::Instant,
    /// Milliseconds after `since`.
    at_ms: AtomicU64,
}

impl LastRead {
    pub(super) fn new() -> LastRead {
        LastRead {
            since: std::time::Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn note(&self) {
        let now = self.since.elapsed().as_millis() as u64;
        self.at_ms
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long until the mount will have gone `quiet` without a read (zero once it has).
    pub(super) fn quiet_in(&self, quiet: std::time::Duration) -> std::time::Duration {
        let last =
            std::time::Duration::from_millis(self.at_ms.load(std::sync::atomic::Ordering::Relaxed));
        (last + quiet).saturating_sub(self.since.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Background work waits for a quiet spell after the mount's start and after each read,
    /// and not once the spell has passed.
    #[test]
    fn background_work_waits_for_readers_to_go_quiet() {
        use std::time::Duration;
        let last = LastRead::new();
        assert!(last.quiet_in(Duration::from_secs(10)) > Duration::from_secs(9));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(last.quiet_in(Duration::from_millis(50)), Duration::ZERO);
        last.note();
        assert!(last.quiet_in(Duration::from_secs(10)) > Duration::from_secs(9));
    }
}
