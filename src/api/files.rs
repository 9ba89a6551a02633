//! Local files that several layers handle the same way: the mount's staging files, its upload
//! journal and the built-in store's blobs are copied with these (in the kernel where it can).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::sync::{relock, unpoisoned};

/// Work on a file given up from elsewhere: its hashing and upload stop at the next chunk once
/// the file is removed (a user's `rm` does not wait for the upload of what it removes). Clones
/// share one flag; the default is never given up.
#[derive(Clone, Default, Debug)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Takes it back (the removal failed: the file is still there to store).
    pub fn resume(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// An error once given up, for loops that read a chunk at a time.
    pub fn check(&self) -> io::Result<()> {
        if self.is_cancelled() {
            return Err(io::Error::other("given up: the file was removed"));
        }
        Ok(())
    }

    /// `r`, failing once given up: a request streaming it stops with its body incomplete.
    pub fn reader<R: io::Read>(&self, r: R) -> Reader<R> {
        Reader {
            inner: r,
            cancel: self.clone(),
        }
    }
}

/// See [`Cancel::reader`].
pub struct Reader<R> {
    inner: R,
    cancel: Cancel,
}

impl<R: io::Read> io::Read for Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.cancel.check()?;
        self.inner.read(buf)
    }
}

/// A new, empty private file (0600, readable and writable) at `path`, which must not exist.
pub fn new_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// A new private file at `dest` (see [`new_private`]) holding the first `len` bytes of `from`
/// (see [`copy_range`]).
pub fn copy_to_new(from: &File, len: u64, dest: &Path) -> io::Result<File> {
    let out = new_private(dest)?;
    copy_range(from, &out, len)?;
    Ok(out)
}

/// How far a copy under way is whole, for a reader behind it (see [`copy_range_telling`]), or
/// that it stopped (failed, or given up by the reader).
#[derive(Default)]
pub struct Progress {
    state: Mutex<(u64, bool)>,
    moved: Condvar,
}

impl Progress {
    fn reach(&self, upto: u64) {
        let mut s = relock(&self.state);
        s.0 = s.0.max(upto);
        self.moved.notify_all();
    }

    /// The copy ended, or is given up (its reader failed): waits for bytes it did not copy end
    /// with an error.
    pub fn stop(&self) {
        relock(&self.state).1 = true;
        self.moved.notify_all();
    }

    fn stopped(&self) -> bool {
        relock(&self.state).1
    }

    /// Waits until the bytes below `upto` are copied; an error once the copy stopped short.
    pub fn wait_for(&self, upto: u64) -> io::Result<()> {
        let mut s = relock(&self.state);
        while s.0 < upto {
            if s.1 {
                return Err(io::Error::other("the copy stopped before the bytes read"));
            }
            s = unpoisoned(self.moved.wait(s));
        }
        Ok(())
    }
}

/// What [`copy_range_telling`] copies at a time.
const COPY_STEP: u64 = 8 << 20;

/// [`copy_range`], telling `progress` as it goes, so that a reader (the hashing of the copy)
/// runs right behind it instead of after it. The copy is sized first, so what is not copied yet
/// reads as zeros, never short; each step's writeback starts at once. Given up by the reader
/// ([`Progress::stop`]), it ends early without an error: the reader's own tells why.
pub fn copy_range_telling(from: &File, to: &File, len: u64, progress: &Progress) -> io::Result<()> {
    // However this ends (a panic included), a reader waiting for more stops waiting.
    struct Ends<'a>(&'a Progress);
    impl Drop for Ends<'_> {
        fn drop(&mut self) {
            self.0.stop();
        }
    }
    let _ends = Ends(progress);
    // Ok(false): given up.
    let copied = (|| -> io::Result<bool> {
        to.set_len(len)?;
        let mut off = 0;
        while off < len {
            let Some((start, end)) = next_data(from, off, len)? else {
                break;
            };
            // The hole before `start` reads as zeros already.
            progress.reach(start);
            let mut at = start;
            while at < end {
                if progress.stopped() {
                    return Ok(false);
                }
                let stop = (at + COPY_STEP).min(end);
                copy_span(from, to, at, stop)?;
                start_writeback(to, at, stop);
                progress.reach(stop);
                at = stop;
            }
            off = end;
        }
        Ok(true)
    })();
    if copied? {
        progress.reach(len);
    }
    Ok(())
}

/// Starts writing bytes `start..end` of `f` to disk, without waiting (a later flush waits
/// for less).
#[cfg(target_os = "linux")]
fn start_writeback(f: &File, start: u64, end: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: on a descriptor the caller holds open; a hint, whose failure changes nothing.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            start as i64,
            (end - start) as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_: &File, _: u64, _: u64) {}

/// Copies the first `len` bytes of `from` into `to` (in the kernel: copy_file_range, which
/// shares extents where the file system can), then sets `to`'s length to `len`. Only the data
/// is copied: holes stay holes (a sparse file costs no work or disk in proportion to its
/// holes; ext4's copy_file_range alone would write them out as zeros).
pub fn copy_range(from: &File, to: &File, len: u64) -> io::Result<()> {
    let mut off = 0;
    while off < len {
        let Some((start, end)) = next_data(from, off, len)? else {
            break;
        };
        copy_span(from, to, start, end)?;
        off = end;
    }
    to.set_len(len)
}

/// The next run of data at or after `off` (below `len`), or None when only a hole is left.
/// Where the file system cannot tell data from holes, all of it is data.
fn next_data(f: &File, off: u64, len: u64) -> io::Result<Option<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor we hold open; it moves no state another call relies on
    // (copy_span passes explicit offsets).
    let seek = |at: u64, whence| unsafe { libc::lseek(f.as_raw_fd(), at as i64, whence) };
    let start = seek(off, libc::SEEK_DATA);
    if start < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None), // no data from `off` on
            Some(libc::EINVAL | libc::EOPNOTSUPP) => Ok(Some((off, len))),
            _ => Err(e),
        };
    }
    let start = (start as u64).min(len);
    let end = seek(start, libc::SEEK_HOLE);
    let end = if end < 0 { len } else { (end as u64).min(len) };
    Ok((start < end).then_some((start, end)))
}

/// Copies bytes `start..end` of `from` to the same offsets of `to` (no in-kernel copy here).
#[cfg(not(target_os = "linux"))]
fn copy_span(from: &File, to: &File, start: u64, end: u64) -> io::Result<()> {
    copy_buffered(from, to, start, end)
}

/// Copies bytes `start..end` of `from` to the same offsets of `to`, in the kernel where it can.
#[cfg(target_os = "linux")]
fn copy_span(from: &File, to: &File, start: u64, end: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut off_in, mut off_out) = (start as i64, start as i64);
    let mut left = end - start;
    while left > 0 {
        // SAFETY: both descriptors are open for the call; the offsets are ours.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut off_in,
                to.as_raw_fd(),
                &mut off_out,
                left.min(1 << 30) as usize,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Across file systems (or where the call is missing): copy through a buffer.
                Some(libc::EXDEV | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                    return copy_buffered(from, to, off_in as u64, end);
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break; // a short source: the rest is a sparse tail
        }
        left -= n as u64;
    }
    Ok(())
}

/// Copies bytes `from..len` of `from` to the same offsets of `to` through a buffer.
fn copy_buffered(from: &File, to: &File, mut off: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; (len - off).min(1 << 20) as usize];
    while off < len {
        let want = (len - off).min(buf.len() as u64) as usize;
        let n = from.read_at(&mut buf[..want], off)?;
        if n == 0 {
            break; // a short source: the rest is a sparse tail
        }
        to.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

/// The read cache keeps each cached file open, and every file being written has its staging
/// file open: the soft limit of open files (often 1,024) goes up to the hard limit, so a large
/// tree copied in or read does not end in EMFILE. (`vaultfs serve` too, for its connections.)
/// Returns the limit now in force.
pub fn raise_open_file_limit() -> libc::rlim_t {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a struct of ours.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let before = lim.rlim_cur;
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                log::debug!("open files: limit raised from {before} to {}", lim.rlim_max);
            } else {
                lim.rlim_cur = before;
            }
        }
    }
    grow_fd_table(lim.rlim_cur.min(FD_TABLE) as libc::c_int);
    lim.rlim_cur
}

/// Descriptors the process's table is grown to at start.
const FD_TABLE: libc::rlim_t = 16_384;

/// Grows the kernel's descriptor table to hold `n` descriptors now, once: a multi-threaded
/// process whose table fills waits for an RCU grace period at each doubling, and every thread
/// opening a file waits with it. During a burst of new files (one open staging file each) an
/// off-CPU trace showed 120 ms of such waits on the FUSE threads (`expand_files`).
fn grow_fd_table(n: libc::c_int) {
    // SAFETY: F_DUPFD gives the lowest free descriptor >= n - 1 (a copy of stderr), closed at
    // once; nothing else is touched.
    unsafe {
        let fd = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, n.saturating_sub(1).max(0));
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn copies_keep_holes_and_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let src = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("src"))
            .unwrap();
        let len = 256 << 20;
        src.set_len(len).unwrap();
        src.write_all_at(b"head", 0).unwrap();
        src.write_all_at(&[7u8; 100_000], 100 << 20).unwrap();
        src.write_all_at(b"tail", len - 4).unwrap();
        src.sync_all().unwrap();

        let dst = copy_to_new(&src, len, &dir.path().join("dst")).unwrap();
        let meta = dst.metadata().unwrap();
        assert_eq!(meta.len(), len);
        // The data is a few blocks; the holes were not written out.
        assert!(meta.blocks() * 512 < 8 << 20, "{} blocks", meta.blocks());
        let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        let mut off = 0;
        while off < len {
            src.read_exact_at(&mut a, off).unwrap();
            dst.read_exact_at(&mut b, off).unwrap();
            assert!(a == b, "bytes differ in the MiB at {off}");
            off += 1 << 20;
        }
        // A copy of a prefix ends where asked, holes or not.
        let short = copy_to_new(&src, 5 << 20, &dir.path().join("short")).unwrap();
        assert_eq!(short.metadata().unwrap().len(), 5 << 20);
    }
}
