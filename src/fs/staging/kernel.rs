//! Kernel writers: a file created or truncated through the mount may be written by the kernel
//! itself (FUSE passthrough, `io::kernel_writer`), with no WRITE reaching the daemon. Then:
//! - size and mtime are read from the file (`observe`), and each release, fsync, or end of a map
//!   makes a new generation (`kernel_changed`), told by the file's size and times, which the
//!   kernel moves on every write once they were read (multigrain timestamps, checked at mount
//!   by `kernel_writes_safe`); when they did not move, the bytes are compared with the stored
//!   version before anything is stored again;
//! - nothing is hashed ahead, and the file is never sealed (linked as a blob) nor retired while
//!   the kernel may write it: a handle open, or a shared map that outlived its handles (a
//!   passthrough map holds the staging file, not the mount's file; a lease tells,
//!   `mapped_elsewhere`).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Staged;
use crate::api::checksum::Digests;
use crate::sync::relock;

/// Files up to this size are compared with their stored version at once when the kernel may
/// have left them as they were (`Staged::kernel_changed`).
const COMPARE_AT_ONCE: u64 = 1 << 20;

impl Staged {
    /// The file as it is now, ready for the kernel to write (a sealed one is copied first).
    pub fn own_file(&self) -> io::Result<Arc<File>> {
        let _order = self.order();
        self.unshare()?;
        self.file()
    }

    /// A handle the kernel writes through itself opens (after [`Staged::own_file`], with the
    /// inode table locked, so nothing seals the file in between): hashing ahead stops for
    /// good. `afresh`: the open created or cut the file, a change whatever the kernel writes
    /// (`synced` stays as it was: no file's state at first, and the cut moved the times since).
    /// Else the file is empty, and its state now is the last generation's: no page of it
    /// exists that a map could write again unseen, so any change moves its size or times.
    pub(super) fn kernel_writer_joins(&self, afresh: bool) {
        let _order = self.order();
        if !afresh && self.kernel_writers() == 0 {
            let now = self.stat();
            *relock(&self.synced) = now;
        }
        self.kernel_wrote.store(true, Ordering::SeqCst);
        self.kernel_writers.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the kernel ever wrote the file (the page cache of the mount's inode may be
    /// older than the file's bytes).
    pub fn kernel_wrote(&self) -> bool {
        self.kernel_wrote.load(Ordering::SeqCst)
    }

    /// Such a handle is released (its writes through write(2) are done): what it wrote is a
    /// change to store. (A shared map of it may write on: see [`Staged::mapped_elsewhere`].)
    pub(super) fn kernel_writer_leaves(&self, stored: Option<&(String, u64)>) {
        let _order = self.order();
        self.kernel_changed(stored);
        self.kernel_writers.fetch_sub(1, Ordering::SeqCst);
    }

    /// An fsync while the kernel writes (no write(2) of it runs meanwhile: the kernel holds
    /// the inode's lock across both): what it wrote so far is a change to store.
    pub(super) fn kernel_sync(&self, stored: Option<&(String, u64)>) {
        let _order = self.order();
        if self.kernel_holds() {
            self.kernel_changed(stored);
        }
    }

    /// After the kernel let go of the file (a map gone, the last reader of it closed): what
    /// a map wrote is a change to store.
    pub(super) fn kernel_recheck(&self, stored: Option<&(String, u64)>) {
        let _order = self.order();
        self.kernel_changed(stored);
    }

    /// The kernel may have changed the file since the last generation. Its size or times tell
    /// for sure when they moved (timestamps are fine-grained once read, see
    /// `kernel_writes_safe`): a new generation. When they did not, a map may still have written
    /// a dirty page again without a fault: a small file is compared with the `stored` version
    /// (md5, size) here, and is no change when the same; else the new generation is `unsure`,
    /// and its upload compares first (storing the same bytes again would make a new version
    /// of old bytes, over one another client stored meanwhile).
    pub(super) fn kernel_changed(&self, stored: Option<&(String, u64)>) {
        let now = self.stat();
        let moved = std::mem::replace(&mut *relock(&self.synced), now) != now;
        if !moved {
            if let Some((md5, size)) = stored.filter(|s| s.1 == now.0 && s.1 <= COMPARE_AT_ONCE) {
                let same = (self.file()).and_then(|f| Digests::md5_only().md5_from(&f, *size));
                if same.is_ok_and(|m| m == *md5) {
                    return;
                }
            }
        }
        self.unsure.store(!moved, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the last change may have left the bytes as they were (see `kernel_changed`).
    pub fn unsure(&self) -> bool {
        self.unsure.load(Ordering::SeqCst)
    }

    /// Whether the file holds exactly the `len` bytes of `stored` (the stored version, whole on
    /// local disk): what an `unsure` generation is compared by when it can, at the speed of
    /// reading both from the page cache rather than of md5.
    pub fn same_bytes_as(&self, stored: &File, len: u64) -> io::Result<bool> {
        let file = self.file()?;
        if file.metadata()?.len() != len {
            return Ok(false);
        }
        let chunk = len.clamp(1, 1 << 20) as usize;
        let (mut a, mut b) = (vec![0u8; chunk], vec![0u8; chunk]);
        let mut off = 0;
        while off < len {
            self.removal.check()?;
            let n = (len - off).min(chunk as u64) as usize;
            file.read_exact_at(&mut a[..n], off)?;
            stored.read_exact_at(&mut b[..n], off)?;
            if a[..n] != b[..n] {
                return Ok(false);
            }
            off += n as u64;
        }
        Ok(true)
    }

    /// Whether the file holds the version of this md5 (hex, any case) and size: compared by
    /// size, then by md5 (hashed ahead, the rest read back).
    pub fn is_version(&self, md5: &str, size: u64) -> bool {
        self.size() == size && self.md5().is_ok_and(|m| m.eq_ignore_ascii_case(md5))
    }

    /// The bytes were found to be those of the version now stored at the name (a conflict
    /// that is none, see `conflict`): the next round compares them with it before it sends
    /// anything, as it does after a change the kernel may have made to the same bytes.
    pub fn same_as_stored(&self) {
        self.unsure.store(true, Ordering::SeqCst);
    }

    /// The bytes were compared with the stored version and found changed.
    pub(super) fn make_sure(&self) {
        self.unsure.store(false, Ordering::SeqCst);
    }

    /// Size, mtime and ctime (ns) of the file; size and mtime also become the staged file's.
    pub(super) fn stat(&self) -> (u64, i64, i64) {
        use std::os::unix::fs::MetadataExt;
        match self.file().and_then(|f| f.metadata()) {
            Ok(m) => {
                self.size.store(m.len(), Ordering::SeqCst);
                if let Ok(t) = m.modified() {
                    self.set_mtime(t);
                }
                let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
                let (mtime, ctime) = (ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec()));
                (m.len(), mtime, ctime)
            }
            Err(e) => {
                log::warn!("staged file {}: {e}", self.data_path().display());
                (u64::MAX, 0, 0)
            }
        }
    }

    /// Whether the file is open anywhere but here. A map the kernel wrote through keeps the
    /// staging file itself open (a passthrough map maps the backing file, and the kernel lets
    /// go of the mount's file, so its release came already): its writes land here after the
    /// last release, and the file may be neither stored by a link nor retired before it ends.
    /// Asked as the kernel's own test is: a write lease is granted only to the sole opener.
    /// (A file that cannot be opened counts as held: it is neither linked nor retired.)
    pub fn mapped_elsewhere(&self) -> bool {
        self.file().map_or(true, |f| !sole_opener(&f))
    }

    pub fn kernel_writers(&self) -> u32 {
        self.kernel_writers.load(Ordering::SeqCst)
    }

    /// Sealed for the store (the kernel never writes a sealed file: a writer copies it first).
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::SeqCst)
    }

    /// Whether the kernel may write the file now (a handle, or a map after the handles): it
    /// is then neither sealed nor retired.
    pub fn kernel_holds(&self) -> bool {
        self.kernel_writers() > 0 || self.mapped.load(Ordering::SeqCst)
    }

    pub(super) fn set_mapped(&self, mapped: bool) {
        self.mapped.store(mapped, Ordering::SeqCst);
    }

    /// Size and time as the kernel's writes left them (they never pass through `write_at`).
    pub fn observe(&self) {
        if self.kernel_writers() > 0 {
            let _order = self.order();
            self.observe_locked();
        }
    }

    pub(super) fn observe_locked(&self) {
        if !self.kernel_wrote.load(Ordering::SeqCst) {
            return;
        }
        match self.file().and_then(|f| f.metadata()) {
            Ok(m) => {
                self.size.store(m.len(), Ordering::SeqCst);
                if let Ok(t) = m.modified() {
                    self.set_mtime(t);
                }
            }
            Err(e) => log::warn!("staged file {}: {e}", self.data_path().display()),
        }
    }
}

/// Whether `f`'s is the only open of its file: a write lease is granted (and given back at
/// once) only then. False also where the file system grants no leases.
#[cfg(not(target_os = "linux"))]
fn sole_opener(_: &File) -> bool {
    false
}

/// Whether `f`'s is the only open of its file: a write lease is granted (and given back at
/// once) only then. False also where the file system grants no leases.
#[cfg(target_os = "linux")]
fn sole_opener(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor the caller holds open.
    unsafe {
        let granted = libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) == 0;
        if granted {
            libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK);
        }
        granted
    }
}

/// Whether the kernel may write staging files in `dir` itself: its file system grants leases
/// ([`Staged::mapped_elsewhere`] asks with one) and gives a change after a stat a new ctime
/// (multigrain timestamps: `Staged::kernel_changed` tells a change by them).
pub fn kernel_writes_safe(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
    else {
        return false;
    };
    let _ = fs::remove_file(&probe);
    let leases = sole_opener(&f);
    let fine = (0..64u8).all(|i| {
        let ctime = |f: &File| f.metadata().map(|m| (m.ctime(), m.ctime_nsec())).ok();
        let before = ctime(&f);
        f.write_all_at(&[i], 0).is_ok() && before.is_some() && ctime(&f) != before
    });
    leases && fine
}
