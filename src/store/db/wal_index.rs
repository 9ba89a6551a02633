//! A look at SQLite's wal-index header without a transaction: the cheap first half of
//! [`crate::store::Store::foreign_commits`], which a mount asks on every LOOKUP answered from a
//! cached listing (a `stat` storm). Starting the read transaction that `PRAGMA data_version`
//! needs costs four `fcntl` locks; reading the header costs six loads.
//!
//! The header (the first 48 bytes of `<db>-shm`, which every connection of every process maps)
//! changes with every commit, ours and others': while it reads the same as when
//! `data_version` was last asked, nobody committed since, so the answer then still holds. When
//! it differs, `data_version` is asked again (it tells others' commits from ours).
//!
//! The file stays the one SQLite uses while our connection is open: SQLite truncates or removes
//! it only when the last connection of every process closes (it holds a shared lock on it
//! until then). Still, the shortcut is taken for at most [`WalIndex::TRUSTED_FOR`] after the
//! last real ask, so whatever happens to the file, a stale answer cannot outlive that.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::relock;

/// SQLite's WalIndexHdr: the copy readers trust, at the start of the file.
const HEADER: usize = 48;
const WORDS: usize = HEADER / 8;
const PAGE: usize = 4096;

pub struct WalIndex {
    /// The file's first page, mapped read-only and shared.
    page: *const u64,
    /// The header as it read just before the last real ask, and when that was.
    seen: Mutex<Option<([u64; WORDS], Instant)>>,
}

// SAFETY: the mapping is read-only and lives as long as the value; reads go through
// `read_volatile` (the bytes change under us, which is the point).
unsafe impl Send for WalIndex {}
unsafe impl Sync for WalIndex {}

impl WalIndex {
    const TRUSTED_FOR: Duration = Duration::from_millis(500);

    /// The wal-index of the database at `db`, once SQLite made it a page long (`None`
    /// otherwise, or where it cannot be mapped: then every ask is a real one).
    pub fn open(db: &Path) -> Option<WalIndex> {
        use std::os::fd::AsRawFd;
        let mut shm = db.as_os_str().to_owned();
        shm.push("-shm");
        let f = std::fs::File::open(shm).ok()?;
        // A page past the end of the file would fault when read.
        if f.metadata().ok()?.len() < PAGE as u64 {
            return None;
        }
        // SAFETY: a read-only shared mapping of one page of a file we opened; the mapping
        // outlives the descriptor.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(WalIndex {
            page: p.cast(),
            seen: Mutex::new(None),
        })
    }

    fn header(&self) -> [u64; WORDS] {
        let mut h = [0; WORDS];
        for (i, w) in h.iter_mut().enumerate() {
            // SAFETY: within the mapped page, 8-aligned (mmap returns a page boundary).
            *w = unsafe { std::ptr::read_volatile(self.page.add(i)) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        h
    }

    /// Whether nobody committed since the last real ask (and it is recent).
    pub fn unchanged(&self) -> bool {
        let h = self.header();
        matches!(*relock(&self.seen), Some((seen, at)) if seen == h && at.elapsed() < Self::TRUSTED_FOR)
    }

    /// Before a real ask: the header as it reads now, which the answer will be at least as new
    /// as. (Taken after the answer, a commit in between would be taken as answered.)
    pub fn before_asking(&self) -> impl FnOnce() + '_ {
        let h = (self.header(), Instant::now());
        move || *relock(&self.seen) = Some(h)
    }
}

impl Drop for WalIndex {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.page as *mut libc::c_void, PAGE) };
    }
}
