//! md5, the interface's checksum, in the two spellings servers use: hex (DESIGN.md, our nodes)
//! and base64 (the public service's step 2 and nodes). What a server sends is read in either
//! form and kept as lowercase hex; what a client sends in step 2 is base64, as documented.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use base64::Engine;
use md5::{Digest, Md5};

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

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
    let mut h = Md5::new();
    read_chunks(f, len, |b| h.update(b))?;
    Ok(hex(&h.finalize()))
}

/// Feeds the first `len` bytes of `f` to `eat`, a chunk at a time; a sparse or short tail
/// reads as zeros (as a staging file's size says).
pub fn read_chunks(f: &File, len: u64, mut eat: impl FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; (len.min(1 << 20) as usize).max(1)];
    let mut off = 0u64;
    while off < len {
        let want = (len - off).min(buf.len() as u64) as usize;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
