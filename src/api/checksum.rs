//! The checksums of a file's bytes, in one place for every layer: md5 (the interface's
//! `md5_checksum`) and sha256 (the built-in store's content address).
//!
//! md5 comes in the two spellings servers use: hex (docs/design.md, our nodes) and base64 (the
//! public service's step 2 and nodes). What a server sends is read in either form and kept as
//! lowercase hex; what a client sends in step 2 is base64, as documented.
//!
//! [`Digests`] can be fed while sequential writes arrive and finished from the file later, so
//! a large file is not read twice: what was hashed as it was written is not hashed again.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use base64::Engine;
use sha2::{Digest, Sha256};

use super::files::{Cancel, Progress, copy_range_telling};

/// An md5 hasher: AWS-LC's (linked already for TLS), whose assembly runs 1.4x the md-5
/// crate's here; md5 is what bounds a large write until stored (see Cargo.toml).
#[derive(Clone)]
pub struct Md5(aws_lc_sys::MD5_CTX);

impl Default for Md5 {
    fn default() -> Md5 {
        Md5::new()
    }
}

impl Md5 {
    pub fn new() -> Md5 {
        // SAFETY: MD5_CTX is plain data; MD5_Init sets every field before any use.
        let mut ctx: aws_lc_sys::MD5_CTX = unsafe { std::mem::zeroed() };
        // SAFETY: a valid, exclusively borrowed context. It cannot fail (returns 1).
        unsafe { aws_lc_sys::MD5_Init(&mut ctx) };
        Md5(ctx)
    }

    pub fn update(&mut self, bytes: &[u8]) {
        // SAFETY: an initialized context and `bytes.len()` readable bytes at `bytes`.
        unsafe { aws_lc_sys::MD5_Update(&mut self.0, bytes.as_ptr().cast(), bytes.len()) };
    }

    pub fn finalize(mut self) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: an initialized context and 16 writable bytes (MD5_DIGEST_LENGTH).
        unsafe { aws_lc_sys::MD5_Final(out.as_mut_ptr(), &mut self.0) };
        out
    }

    /// The md5 of `bytes`.
    pub fn digest(bytes: &[u8]) -> [u8; 16] {
        let mut h = Md5::new();
        h.update(bytes);
        h.finalize()
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The md5 of no bytes: what a file without content shows.
pub const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

/// An md5 given as 32 hex digits (any case) or as base64 of its 16 bytes (standard or URL-safe
/// alphabet, padded or not), as lowercase hex; `None` for anything else.
pub fn md5_hex(s: &str) -> Option<String> {
    let s = s.trim();
    if s.len() == 32 && s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Some(s.to_ascii_lowercase());
    }
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    if !(22..=24).contains(&s.len()) {
        return None;
    }
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(s).ok())
        .filter(|b| b.len() == 16)
        .map(|b| hex(&b))
}

/// The base64 form of a hex md5 (`None` when `hex` is not one).
pub fn md5_base64(hex: &str) -> Option<String> {
    let hex = md5_hex(hex)?;
    let bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits"))
        .collect();
    Some(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// md5 (hex) of the first `len` bytes of `f`; a sparse or short tail reads as zeros.
pub fn md5_of_file(f: &File, len: u64) -> io::Result<String> {
    Digests::default().md5_from(f, len)
}

/// Feeds bytes `from..to` of `f` to `eat`, a chunk at a time; a sparse or short tail reads as
/// zeros (as a staging file's size says).
/// Stops with an error at the next chunk once `cancel` is given up. With `behind`, `f` is a
/// copy under way: each chunk is read once it is copied.
pub fn read_range(
    f: &File,
    from: u64,
    to: u64,
    cancel: Option<&Cancel>,
    behind: Option<&Progress>,
    mut eat: impl FnMut(&[u8]),
) -> io::Result<()> {
    let mut buf = vec![0u8; (to.saturating_sub(from).min(1 << 20) as usize).max(1)];
    let mut off = from;
    while off < to {
        if let Some(c) = cancel {
            c.check()?;
        }
        let want = (to - off).min(buf.len() as u64) as usize;
        if let Some(p) = behind {
            p.wait_for(off + want as u64)?;
        }
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
    read_range(f, 0, len, None, None, eat)
}

/// md5 and sha256 of a file's first [`Digests::len`] bytes (md5 alone for an upload to a
/// server, which needs no sha256: [`Digests::md5_only`]).
#[derive(Clone)]
pub struct Digests {
    md5: Md5,
    sha256: Option<Sha256>,
    len: u64,
    /// Reading the file stops once this is given up (see [`Digests::unless`]).
    cancel: Option<Cancel>,
}

impl Default for Digests {
    fn default() -> Digests {
        Digests {
            md5: Md5::new(),
            sha256: Some(Sha256::new()),
            len: 0,
            cancel: None,
        }
    }
}

/// A copy from this size on is hashed while it is made ([`Digests::copy_and_hash`]).
const COPY_BEHIND_FROM: u64 = 16 << 20;

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

    /// md5 alone.
    pub fn md5_only() -> Digests {
        Digests {
            sha256: None,
            ..Digests::default()
        }
    }

    /// The same, reading the file only until `cancel` is given up (then an error).
    pub fn unless(mut self, cancel: &Cancel) -> Digests {
        self.cancel = Some(cancel.clone());
        self
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.md5.update(bytes);
        if let Some(sha) = &mut self.sha256 {
            sha.update(bytes);
        }
        self.len += bytes.len() as u64;
    }

    /// `finish_from` for the md5 alone (an upload to a server, which needs no sha256).
    pub fn md5_from(self, f: &File, len: u64) -> io::Result<String> {
        let (mut md5, from) = (self.md5, self.len);
        if from > len {
            return Err(io::Error::other("hashed past the end of the file"));
        }
        read_range(f, from, len, self.cancel.as_ref(), None, |b| md5.update(b))?;
        Ok(hex(&md5.finalize()))
    }

    /// Hashes `f` from `self.len()` to `len` (the bytes before are the ones already hashed)
    /// and gives (md5, sha256) in hex.
    pub fn finish_from(mut self, f: &File, len: u64) -> io::Result<(String, String)> {
        if self.sha256.is_none() {
            // Hashed ahead for md5 alone: both from the start.
            let fresh = Digests {
                cancel: self.cancel,
                ..Digests::default()
            };
            return fresh.finish_from(f, len);
        }
        self.extend_from(f, len)?;
        let sha = self.sha256.take().expect("checked above").finalize();
        Ok((hex(&self.md5.finalize()), hex(&sha)))
    }

    /// Copies the first `len` bytes of `from` into `to` (a new, empty file) and hashes the copy
    /// from the start: what is hashed is what is kept, even if `from` is written meanwhile. A
    /// large copy is hashed right behind the copying (md5 is as slow as the copy: one after
    /// the other took twice as long).
    pub fn copy_and_hash(self, from: &File, to: &File, len: u64) -> io::Result<(String, String)> {
        let fresh = Digests {
            cancel: self.cancel,
            ..Digests::default()
        };
        if len < COPY_BEHIND_FROM {
            super::files::copy_range(from, to, len)?;
            return fresh.finish_from(to, len);
        }
        let progress = Progress::default();
        let (copied, hashed) = std::thread::scope(|s| {
            let copier = s.spawn(|| copy_range_telling(from, to, len, &progress));
            let hashed = fresh.finish_behind(to, len, &progress);
            if hashed.is_err() {
                progress.stop();
            }
            (copier.join(), hashed)
        });
        // The copy's own failure first (ENOSPC, say); a copy given up by a failed hashing ends
        // without one, and the hashing's error tells why.
        copied.map_err(|_| io::Error::other("the copying thread panicked"))??;
        hashed
    }

    /// [`Digests::finish_from`] of a copy under way.
    fn finish_behind(
        mut self,
        f: &File,
        len: u64,
        progress: &Progress,
    ) -> io::Result<(String, String)> {
        self.extend(f, len, Some(progress))?;
        let sha = self
            .sha256
            .take()
            .expect("a fresh Digests has sha256")
            .finalize();
        Ok((hex(&self.md5.finalize()), hex(&sha)))
    }

    /// Feeds bytes `self.len()..to` of `f`. A large range is read twice from the page cache,
    /// md5 on a thread of its own beside sha256, which takes its time from md5's instead of
    /// adding it (md5 alone runs at half the speed of SHA-NI sha256, and one thread doing
    /// both was what bounded a large write until stored).
    pub fn extend_from(&mut self, f: &File, to: u64) -> io::Result<()> {
        self.extend(f, to, None)
    }

    fn extend(&mut self, f: &File, to: u64, behind: Option<&Progress>) -> io::Result<()> {
        let from = self.len;
        if from > to {
            return Err(io::Error::other("hashed past the end of the file"));
        }
        let cancel = self.cancel.clone();
        let cancel = cancel.as_ref();
        let (md5, sha256) = match &mut self.sha256 {
            Some(sha256) if to - from >= PARALLEL_FROM => (&mut self.md5, sha256),
            // A small range, or md5 alone: one pass on this thread.
            _ => return read_range(f, from, to, cancel, behind, |b| self.update(b)),
        };
        std::thread::scope(|s| {
            let md5 = s.spawn(move || read_range(f, from, to, cancel, behind, |b| md5.update(b)));
            let sha = read_range(f, from, to, cancel, behind, |b| sha256.update(b));
            md5.join()
                .map_err(|_| io::Error::other("the md5 thread panicked"))??;
            sha
        })?;
        self.len = to;
        Ok(())
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
    fn md5_gives_the_rfc_1321_digests_whole_or_in_parts() {
        for (input, want) in [
            ("", "d41d8cd98f00b204e9800998ecf8427e"),
            ("abc", "900150983cd24fb0d6963f7d28e17f72"),
            ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ] {
            assert_eq!(hex(&Md5::digest(input.as_bytes())), want, "{input:?}");
            let mut h = Md5::default();
            for part in input.as_bytes().chunks(7) {
                h.clone().update(b"a clone is a hasher of its own");
                h.update(part);
            }
            assert_eq!(hex(&h.finalize()), want, "{input:?} in parts");
        }
    }

    #[test]
    fn md5_in_either_spelling() {
        // The public service's documented sample and its hex.
        let hex = "0ffa63d699e0f3c243bb31c067cc6810";
        assert_eq!(md5_base64(hex).as_deref(), Some("D/pj1png88JDuzHAZ8xoEA=="));
        for s in [
            hex,
            "0FFA63D699E0F3C243BB31C067CC6810",
            "D/pj1png88JDuzHAZ8xoEA==",
            "D/pj1png88JDuzHAZ8xoEA",
            "D_pj1png88JDuzHAZ8xoEA==",
            " D/pj1png88JDuzHAZ8xoEA==\n",
        ] {
            assert_eq!(md5_hex(s).as_deref(), Some(hex), "{s:?}");
        }
        for bad in [
            "",
            "xyz",
            "0ffa63d699e0f3c243bb31c067cc681",
            "AAAA",
            "D/pj1png88JDuzHAZ8xoEAAA",
        ] {
            assert_eq!(md5_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_copy_hashed_behind_its_copying_is_the_source_with_its_holes_and_short_tail() {
        let dir = tempfile::tempdir().unwrap();
        for (len, on_disk) in [
            (5u64, 5u64),
            (COPY_BEHIND_FROM + 4097, COPY_BEHIND_FROM + 4097),
            // A source shorter than its size says (a staging file's sparse tail).
            (COPY_BEHIND_FROM * 2, COPY_BEHIND_FROM + 100),
        ] {
            let src = dir.path().join(format!("src{len}"));
            let mut data: Vec<u8> = (0..on_disk).map(|i| (i * 13 % 253) as u8 + 1).collect();
            std::fs::write(&src, &data).unwrap();
            let from = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
            // A hole in the middle of the large ones.
            if on_disk > 3 << 20 {
                from.set_len(1 << 20).unwrap();
                from.write_all_at(&data[3 << 20..on_disk as usize], 3 << 20)
                    .unwrap();
                data[1 << 20..3 << 20].fill(0);
            }
            data.resize(len as usize, 0);
            let to_path = dir.path().join(format!("copy{len}"));
            let to = crate::api::files::new_private(&to_path).unwrap();
            let got = Digests::default()
                .copy_and_hash(&File::open(&src).unwrap(), &to, len)
                .unwrap();
            assert_eq!(got, (hex(&Md5::digest(&data)), hex(&Sha256::digest(&data))));
            assert!(std::fs::read(&to_path).unwrap() == data, "copy of {len}");
        }
    }

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
            for (cut, mut d) in [0, len / 3, len]
                .into_iter()
                .flat_map(|cut| [(cut, Digests::default()), (cut, Digests::md5_only())])
            {
                d.update(&data[..cut as usize]);
                assert_eq!(d.len(), cut);
                let mut ahead = d.clone();
                ahead.extend_from(&f, (cut + len) / 2).unwrap();
                assert_eq!(
                    ahead.md5_from(&f, len).unwrap(),
                    want.0,
                    "{len} cut at {cut}"
                );
                assert_eq!(
                    d.clone().md5_from(&f, len).unwrap(),
                    want.0,
                    "{len} cut at {cut}"
                );
                // md5 alone hashed ahead: both from the start.
                assert_eq!(d.finish_from(&f, len).unwrap(), want, "{len} cut at {cut}");
            }
        }
        // A sparse tail reads as zeros.
        let p = dir.path().join("short");
        std::fs::write(&p, b"abc").unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(md5_of_file(&f, 5).unwrap(), hex(&Md5::digest(b"abc\0\0")));
    }
}
