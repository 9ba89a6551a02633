//! A look at SQLite's wal-index header without a transaction: the cheap first half of
//! [`crate::store::Store::foreign_commits`], which a mount asks on every LOOKUP answered from a
//! cached listing (a `stat` storm). Starting the read transaction that `PRAGMA data_version`
//! needs costs four `fcntl` locks; reading the header costs six loads.
//!
//! The header (the first 48 bytes of the wal-index, `<db>-shm`, which every connection of
//! every process maps) changes with every commit, ours and others': while it reads the same as
//! just before `data_version` was last asked, nobody committed since, and that answer holds.
//! When it differs, `data_version` is asked again (it tells others' commits from ours).
//!
//! The header is read through SQLite's own mapping of the file (its VFS `xShmMap`), never a
//! descriptor of ours: closing one would drop every POSIX lock the process holds on the file,
//! SQLite's included. The mapping lives as long as the connection, which the store keeps open
//! for its life. Even so the shortcut is trusted for [`WalIndex::TRUSTED_FOR`] at most.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::relock;

/// SQLite's WalIndexHdr: the copy readers trust, at the start of the wal-index.
const WORDS: usize = 48 / 8;
/// The size of a wal-index region (`WALINDEX_PGSZ`).
const REGION: i32 = 32768;

pub struct WalIndex {
    /// Region 0 of the wal-index as SQLite maps it.
    header: *const u64,
    /// The header as it read just before the last real ask, and when that was.
    seen: Mutex<Option<([u64; WORDS], Instant)>>,
}

// SAFETY: the region is shared memory that every connection reads and SQLite writes under its
// own locks; this only reads it, through `read_volatile` (it changes under us: that is the
// point), while the connection that mapped it is open (see the module's comment).
unsafe impl Send for WalIndex {}
unsafe impl Sync for WalIndex {}

impl WalIndex {
    const TRUSTED_FOR: Duration = Duration::from_millis(500);

    /// The wal-index of `conn`'s main database, as SQLite mapped it (`None` when it has not,
    /// or the VFS maps none: then every ask is a real one). Call it with the connection in WAL
    /// mode and used once.
    pub fn of(conn: &rusqlite::Connection) -> Option<WalIndex> {
        use rusqlite::ffi;
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: the connection's handle, asked for its main database's file object (a
        // pointer SQLite owns, valid while the connection is open).
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&mut file as *mut *mut ffi::sqlite3_file).cast(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return None;
        }
        // SAFETY: `file` is SQLite's; xShmMap of a region already mapped (bExtend 0) hands back
        // SQLite's own pointer to it and changes nothing.
        let region = unsafe {
            let methods = (*file).pMethods;
            if methods.is_null() || (*methods).iVersion < 2 {
                return None;
            }
            let map = (*methods).xShmMap?;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            let p_ptr: *mut *mut std::ffi::c_void = &mut p;
            if map(file, 0, REGION, 0, p_ptr.cast()) != ffi::SQLITE_OK {
                return None;
            }
            p
        };
        (!region.is_null()).then(|| WalIndex {
            header: region.cast(),
            seen: Mutex::new(None),
        })
    }

    fn header(&self) -> [u64; WORDS] {
        let mut h = [0; WORDS];
        for (i, w) in h.iter_mut().enumerate() {
            // SAFETY: within the mapped region, 8-aligned (a region starts on a page).
            *w = unsafe { std::ptr::read_volatile(self.header.add(i)) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        h
    }

    /// Whether nobody committed since the last real ask (and it is recent).
    pub fn unchanged(&self) -> bool {
        let h = self.header();
        matches!(*relock(&self.seen), Some((seen, at)) if seen == h && at.elapsed() < Self::TRUSTED_FOR)
    }

    /// Before a real ask: the header as it reads now, which the answer is at least as new as.
    /// (Taken after the answer, a commit in between would be taken as answered.)
    pub fn before_asking(&self) -> impl FnOnce() + '_ {
        let h = (self.header(), Instant::now());
        move || *relock(&self.seen) = Some(h)
    }
}
