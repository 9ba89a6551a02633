//! The files dav-server opens: a `Reader` streams a file's current bytes from the store (a GET,
//! or a LOCK's handle), a `Writer` stages a PUT's bytes and stores them through the upload
//! steps when it ends.

use std::io::SeekFrom;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use dav_server::fs::{DavFile, DavMetaData, FsError, FsFuture, FsResult};
use futures_util::{FutureExt, StreamExt};

use super::caller::DavCaller;
use super::meta::Meta;
use crate::api::{Base, Error, Node, NodePath, RangeRequest};
use crate::backend::{Backend, ByteStream};
use crate::store::blobs::BlobWriter;

/// Bytes of a PUT gathered before a blocking task writes them to the staging file.
const WRITE_BATCH: usize = 256 * 1024;

/// A file opened for reading: its bytes are asked of the store from the position read at,
/// once, and streamed; a seek elsewhere asks again from there (a range).
pub(super) struct Reader {
    caller: DavCaller,
    meta: Meta,
    id: String,
    pos: u64,
    /// The download under way from `pos` (a Mutex only to be `Sync`, as dav-server wants).
    body: Mutex<Option<ByteStream>>,
    /// Bytes of it received and not read yet.
    pending: Bytes,
}

impl Reader {
    /// A handle reading `node`'s current bytes from the start.
    pub(super) fn new(caller: &DavCaller, node: &Node) -> Result<Reader, FsError> {
        Ok(Reader {
            caller: caller.clone(),
            meta: Meta::of(node),
            id: node.file_id().ok_or(FsError::NotFound)?,
            pos: 0,
            body: Mutex::new(None),
            pending: Bytes::new(),
        })
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reader({}, at {})", self.id, self.pos)
    }
}

impl DavFile for Reader {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        Box::pin(std::future::ready(Ok(m)))
    }

    fn write_buf(&mut self, _: Box<dyn bytes::Buf + Send>) -> FsFuture<'_, ()> {
        Box::pin(std::future::ready(Err(FsError::NotImplemented)))
    }

    fn write_bytes(&mut self, _: Bytes) -> FsFuture<'_, ()> {
        Box::pin(std::future::ready(Err(FsError::NotImplemented)))
    }

    fn read_bytes(&mut self, count: usize) -> FsFuture<'_, Bytes> {
        async move {
            if self.pos >= self.meta.len || count == 0 {
                return Ok(Bytes::new());
            }
            if self.pending.is_empty() {
                if !matches!(self.body.get_mut(), Ok(Some(_))) {
                    let range = (self.pos > 0).then_some(RangeRequest::From {
                        start: self.pos,
                        end: None,
                    });
                    let d = self
                        .caller
                        .backend
                        .download(&self.id, range)
                        .await
                        .map_err(|e| self.caller.failed(e))?;
                    // Another version became current since the file was opened: its bytes
                    // would not be the ones the headers announced.
                    if d.node.md5_checksum.is_some() && d.node.md5_checksum != self.meta.md5 {
                        return Err(FsError::GeneralFailure);
                    }
                    *crate::sync::relock(&self.body) = Some(d.body);
                }
                let body = self.body.get_mut().map_err(|_| FsError::GeneralFailure)?;
                let next = body.as_mut().expect("opened above").next().await;
                match next {
                    Some(Ok(b)) => self.pending = b,
                    Some(Err(e)) => {
                        log::warn!("webdav: reading file {} failed: {e}", self.id);
                        return Err(FsError::GeneralFailure);
                    }
                    // Shorter than its length: an error, never a short file (dav-server would
                    // pad it with zeros).
                    None => return Err(FsError::GeneralFailure),
                }
            }
            let n = count.min(self.pending.len());
            let out = self.pending.split_to(n);
            self.pos += n as u64;
            Ok(out)
        }
        .boxed()
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        let len = self.meta.len as i128;
        let to = match pos {
            SeekFrom::Start(n) => n as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
            SeekFrom::End(d) => len + d as i128,
        };
        if to < 0 {
            return Box::pin(std::future::ready(Err(FsError::GeneralFailure)));
        }
        let to = to as u64;
        if to != self.pos {
            self.pos = to;
            self.pending = Bytes::new();
            *crate::sync::relock(&self.body) = None;
        }
        Box::pin(std::future::ready(Ok(to)))
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A file opened by a PUT: its bytes go to a staging file of the store, hashed as they come;
/// at the end (`flush`) they become the file's new version through the upload steps.
pub(super) struct Writer {
    caller: DavCaller,
    path: NodePath,
    /// What the bytes replace (`If-Match`, `If-None-Match: *`), checked in the commit.
    base: Base,
    /// No preconditions: stored unless a version the device was never shown is current, else
    /// kept beside it (`Store::put_keeping_both`).
    keep_both: bool,
    /// The length the request announced, if it did.
    expected: Option<u64>,
    /// The server's largest file.
    max: u64,
    /// The account's room when the handle was opened (None: no quota).
    room: Option<u64>,
    writer: Mutex<Option<BlobWriter>>,
    batch: BytesMut,
    written: u64,
    /// The file once stored.
    stored: Option<Meta>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Writer({}, {} bytes)", self.path, self.written)
    }
}

impl Writer {
    /// A handle storing what is written as `path`'s new version over `base` (see the fields).
    pub(super) fn new(
        caller: &DavCaller,
        path: NodePath,
        base: Base,
        keep_both: bool,
        expected: Option<u64>,
        max: u64,
        writer: BlobWriter,
    ) -> Writer {
        Writer {
            caller: caller.clone(),
            path,
            base,
            keep_both,
            expected,
            max,
            room: None,
            writer: Mutex::new(Some(writer)),
            batch: BytesMut::new(),
            written: 0,
            stored: None,
        }
    }

    /// The same, refusing a body that outgrows `room` (the account's quota) as it comes.
    pub(super) fn within(self, room: Option<u64>) -> Writer {
        Writer { room, ..self }
    }

    /// Writes the gathered bytes to the staging file, on a blocking thread.
    async fn write_batch(&mut self) -> FsResult<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let data = self.batch.split().freeze();
        let mut w = self
            .writer
            .get_mut()
            .ok()
            .and_then(Option::take)
            .ok_or(FsError::GeneralFailure)?;
        let w = tokio::task::spawn_blocking(move || w.write(data).map(|()| w))
            .await
            .map_err(|_| FsError::GeneralFailure)?
            .map_err(|e| self.caller.failed(Error::from(e)))?;
        *crate::sync::relock(&self.writer) = Some(w);
        Ok(())
    }

    async fn take(&mut self, data: Bytes) -> FsResult<()> {
        self.written += data.len() as u64;
        if self.written > self.max || self.expected.is_some_and(|n| self.written > n) {
            return Err(FsError::TooLarge);
        }
        if self.room.is_some_and(|r| self.written > r) {
            return Err(self.caller.failed(over_quota(self.written)));
        }
        self.batch.extend_from_slice(&data);
        if self.batch.len() >= WRITE_BATCH {
            self.write_batch().await?;
        }
        Ok(())
    }
}

impl DavFile for Writer {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(
            self.stored
                .clone()
                .unwrap_or_else(|| Meta::unstored(self.written)),
        );
        Box::pin(std::future::ready(Ok(m)))
    }

    fn write_buf(&mut self, mut buf: Box<dyn bytes::Buf + Send>) -> FsFuture<'_, ()> {
        let data = buf.copy_to_bytes(buf.remaining());
        self.take(data).boxed()
    }

    fn write_bytes(&mut self, buf: Bytes) -> FsFuture<'_, ()> {
        self.take(buf).boxed()
    }

    fn read_bytes(&mut self, _: usize) -> FsFuture<'_, Bytes> {
        Box::pin(std::future::ready(Err(FsError::Forbidden)))
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        // Only where the bytes already are: the store takes whole versions, in order.
        let ok = match pos {
            SeekFrom::Start(n) => n == self.written,
            SeekFrom::Current(0) | SeekFrom::End(0) => true,
            _ => false,
        };
        let r = if ok {
            Ok(self.written)
        } else {
            Err(FsError::NotImplemented)
        };
        Box::pin(std::future::ready(r))
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        async move {
            if self.stored.is_some() {
                return Ok(());
            }
            if self.expected.is_some_and(|n| n != self.written) {
                // A body that ended early: nothing is stored.
                return Err(FsError::GeneralFailure);
            }
            self.write_batch().await?;
            let w = self
                .writer
                .get_mut()
                .ok()
                .and_then(Option::take)
                .ok_or(FsError::GeneralFailure)?;
            let staged = tokio::task::spawn_blocking(move || w.finish())
                .await
                .map_err(|_| FsError::GeneralFailure)?
                .map_err(|e| self.caller.failed(Error::from(e)))?;
            let c = &self.caller;
            let node = if self.keep_both {
                let kept = c
                    .backend
                    .put_keeping_both(&self.path, staged, &c.device)
                    .await;
                let kept = kept.map_err(|e| c.failed(e))?;
                *crate::sync::relock(&c.request.kept_as) = kept.copy;
                kept.node
            } else {
                let stored = c.backend.put_staged(&self.path, staged, &self.base).await;
                stored.map_err(|e| c.failed(e))?
            };
            self.stored = Some(Meta::of(&node));
            Ok(())
        }
        .boxed()
    }
}

/// A body of `n` bytes that the account's quota has no room for (507).
pub(super) fn over_quota(n: u64) -> Error {
    Error::new(
        crate::api::ErrorKind::InsufficientStorage,
        "quota_exceeded",
        format!("{n} more bytes would take the account over its quota"),
    )
}
