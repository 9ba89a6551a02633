//! Reading an object from the bucket as a file is read ([`Read`] and [`Seek`]), by ranged GETs.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::{Bucket, io_error};

type Body = BoxStream<'static, object_store::Result<Bytes>>;

/// An object being read from the bucket: a ranged GET from the current position, started on
/// the first read after an open or a seek, so a reader that seeks first (a ranged download)
/// costs one request.
pub struct ObjectReader {
    bucket: Arc<Bucket>,
    key: String,
    len: u64,
    pos: u64,
    body: Option<Body>,
    /// What the body gave and was not read yet.
    chunk: Bytes,
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
            chunk: Bytes::new(),
        }
    }

    /// The next piece of the body (opened from the current position if it is not yet).
    fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let body = self.body.take();
        let (store, key, pos): (Arc<dyn ObjectStore>, _, _) = (
            self.bucket.store.clone(),
            Key::from(self.key.as_str()),
            self.pos,
        );
        let (body, next) = self.bucket.run(async move {
            let mut body = match body {
                Some(b) => b,
                None => {
                    let options = GetOptions {
                        range: Some(GetRange::Offset(pos)),
                        ..GetOptions::default()
                    };
                    match store.get_opts(&key, options).await {
                        Ok(r) => r.into_stream(),
                        Err(e) => return (None, Some(Err(e))),
                    }
                }
            };
            let next = body.next().await;
            (Some(body), next)
        });
        self.body = body;
        next.transpose().map_err(|e| io_error(&self.key, e))
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        while self.chunk.is_empty() {
            match self.next_chunk()? {
                Some(c) => self.chunk = c,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "object {} ended at {} of {} bytes",
                            self.key, self.pos, self.len
                        ),
                    ));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
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
            self.chunk = Bytes::new();
            self.pos = pos;
        }
        Ok(pos)
    }
}
