//! The checksums of a file's bytes: md5 (the interface's `md5_checksum`) and sha256 (the
//! built-in store's content address), computed in one place for every layer.
//!
//! [`Digests`] can be fed while sequential writes arrive and finished from the file later, so
//! a large file is not read twice: what was hashed as it was written is not hashed again.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use md5::{Digest, Md5};
use sha2::Sha256;

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Feeds bytes `from..to` of `f` to `eat`, a chunk at a time; a sparse or short tail reads as
/// zeros (as a staging file's size says).
pub fn read_range(f: &File, from: u64, to: u64, mut eat: impl FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; (to.saturating_sub(from).min(1 << 20) as usize).max(1)];
    let mut off = from;
    while off < to {
        let want = (to - off).min(buf.len() as u64) as usize;
        let n = match f.read_at(&mut buf[..want], off) {
            Ok(0) => {
                buf[..want].fill(0);
                want
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        eat(&buf[..n]);
        off += n as u64;
    }
    Ok(())
}

/// `read_range` from the start.
pub fn read_chunks(f: &File, len: u64, eat: impl FnMut(&[u8])) -> io::Result<()> {
    read_range(f, 0, len, eat)
}

/// md5 (hex) of the first `len` bytes of `f`.
pub fn md5_of(f: &File, len: u64) -> io::Result<String> {
    let mut h = Md5::new();
    read_chunks(f, len, |b| h.update(b))?;
    Ok(hex(&h.finalize()))
}

/// md5 and sha256 of a file's first [`Digests::len`] bytes.
#[derive(Clone, Default)]
pub struct Digests {
    md5: Md5,
    sha256: Sha256,
    len: u64,
}

/// A remainder from this size on is hashed by two threads (md5 is the slower by far).
const PARALLEL_FROM: u64 = 4 << 20;

impl Digests {
    /// How many bytes are hashed.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.md5.update(bytes);
        self.sha256.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Hashes `f` from `self.len()` to `len` (the bytes before are the ones already hashed)
    /// and gives (md5, sha256) in hex. A large remainder is read twice from the page cache,
    /// md5 on a thread of its own beside sha256, which takes its time from md5's instead of
    /// adding it.
    pub fn finish_from(self, f: &File, len: u64) -> io::Result<(String, String)> {
        let Digests {
            mut md5,
            mut sha256,
            len: from,
        } = self;
        if from > len {
            return Err(io::Error::other("hashed past the end of the file"));
        }
        if len - from < PARALLEL_FROM {
            read_range(f, from, len, |b| {
                md5.update(b);
                sha256.update(b);
            })?;
            return Ok((hex(&md5.finalize()), hex(&sha256.finalize())));
        }
        std::thread::scope(|s| {
            let md5 = s.spawn(move || {
                read_range(f, from, len, |b| md5.update(b)).map(|()| hex(&md5.finalize()))
            });
            read_range(f, from, len, |b| sha256.update(b))?;
            let md5 = md5
                .join()
                .map_err(|_| io::Error::other("the md5 thread panicked"))??;
            Ok((md5, hex(&sha256.finalize())))
        })
    }
}

/// md5 and sha256 (hex) of the first `len` bytes of `f`.
pub fn hash_file(f: &File, len: u64) -> io::Result<(String, String)> {
    Digests::default().finish_from(f, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_fed_in_part_and_finished_from_the_file_equals_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0u64, 1, 4096, PARALLEL_FROM + 12345] {
            let p = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            let f = File::open(&p).unwrap();
            let want = (hex(&Md5::digest(&data)), hex(&Sha256::digest(&data)));
            assert_eq!(hash_file(&f, len).unwrap(), want);
            for cut in [0, len / 3, len] {
                let mut d = Digests::default();
                d.update(&data[..cut as usize]);
                assert_eq!(d.len(), cut);
                assert_eq!(d.finish_from(&f, len).unwrap(), want, "{len} cut at {cut}");
            }
        }
        // A sparse tail reads as zeros.
        let p = dir.path().join("short");
        std::fs::write(&p, b"abc").unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(md5_of(&f, 5).unwrap(), hex(&Md5::digest(b"abc\0\0")));
    }
}
