//! Local files that several layers handle the same way: the mount's staging files, its upload
//! journal and the built-in store's blobs are copied with these (in the kernel where it can).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// A new private file (0600, readable and writable) at `dest` holding the first `len` bytes of
/// `from` (see [`copy_range`]); `dest` must not exist.
pub fn copy_to_new(from: &File, len: u64, dest: &Path) -> io::Result<File> {
    let out = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)?;
    copy_range(from, &out, len)?;
    Ok(out)
}

/// Copies the first `len` bytes of `from` into `to` (in the kernel: copy_file_range, which
/// shares extents where the file system can), then sets `to`'s length to `len`.
pub fn copy_range(from: &File, to: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut off_in, mut off_out): (i64, i64) = (0, 0);
    let mut left = len;
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
                    copy_buffered(from, to, off_in as u64, len)?;
                    break;
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break; // a short source: the rest is a sparse tail
        }
        left -= n as u64;
    }
    to.set_len(len)
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
