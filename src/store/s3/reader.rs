//! Reading a blob from the bucket as a file is read ([`Read`] and [`Seek`]), by ranged GETs.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;

use reqwest::blocking::Response;

use super::{Bucket, blocking};

/// A blob being read from the bucket: a ranged GET from the current position, started on the
/// first read after an open or a seek, so a reader that seeks first (a ranged download) costs
/// one request.
pub struct ObjectReader {
    bucket: Arc<Bucket>,
    key: String,
    len: u64,
    pos: u64,
    body: Option<Response>,
}

impl ObjectReader {
    pub fn new(bucket: Arc<Bucket>, hash: &str, len: u64) -> ObjectReader {
        let key = bucket.key(hash);
        ObjectReader::at_key(bucket, key, len)
    }

    /// The object `key` (a whole key), of `len` bytes.
    pub fn at_key(bucket: Arc<Bucket>, key: String, len: u64) -> ObjectReader {
        ObjectReader {
            bucket,
            key,
            len,
            pos: 0,
            body: None,
        }
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        if self.body.is_none() {
            self.body = Some(self.bucket.get_from(&self.key, self.pos)?);
        }
        let body = self.body.as_mut().expect("opened above");
        let n = blocking(|| body.read(buf))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "object {} ended at {} of {} bytes",
                    self.key, self.pos, self.len
                ),
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ObjectReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        if pos != self.pos {
            self.body = None;
            self.pos = pos;
        }
        Ok(pos)
    }
}
