//! The store as dav-server's file system: each call one call of the local backend scoped to the
//! caller's account, as the API's handlers make them (`server/nodes.rs`), so WebDAV and the API
//! cannot drift: a PUT is the three upload steps, a DELETE the API's delete, MOVE and COPY the
//! interface's move and copy.
//!
//! dav-server walks trees itself (a DELETE of a folder removes each file, then each folder; an
//! overwriting COPY or MOVE deletes the destination first; a COPY of a folder copies file by
//! file). Our store does each of those in one transaction, with the semantics of the interface
//! (a file moved or copied over a file becomes its new version, keeping its ID and history;
//! a folder copied is one change of the feed), so the walk is cut short where the request says
//! what it is ([`Request`]): the folder being deleted lists as empty and goes whole, the file
//! about to be replaced is not deleted but replaced by the store's own move or copy, a folder
//! copied whole lists as empty to the walk that would copy it again.

use std::io::SeekFrom;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, DavProp, FsError, FsFuture, FsResult, FsStream,
    GuardedFileSystem, OpenOptions, ReadDirMeta,
};
use futures_util::{FutureExt, StreamExt};

use super::Request;
use crate::api::{Base, Error, ErrorKind, Node, NodePath, RangeRequest};
use crate::backend::local::LocalBackend;
use crate::backend::{Backend, ByteStream, LIST_PAGE};
use crate::store::blobs::BlobWriter;
use crate::store::dav::DeadProp;
use axum::http::StatusCode;

/// Bytes of a PUT gathered before a blocking task writes them to the staging file.
const WRITE_BATCH: usize = 256 * 1024;

/// Who asks, and what the whole request is (dav-server's "credentials", one per request).
#[derive(Clone)]
pub struct DavCaller {
    pub backend: LocalBackend,
    pub request: Arc<Request>,
}

/// The file system: stateless, everything it needs comes with each call's [`DavCaller`].
#[derive(Clone, Default)]
pub struct StoreFs;

/// The store's path of a dav-server path (its prefix `/dav` already taken off), in NFC as the
/// API takes paths.
pub fn node_path(path: &DavPath) -> FsResult<NodePath> {
    let text = std::str::from_utf8(path.as_bytes()).map_err(|_| FsError::NotFound)?;
    NodePath::from_segments(text.split('/').filter(|s| !s.is_empty()))
        .and_then(NodePath::into_nfc)
        .map_err(|e| fs_error(&e))
}

/// The nearest of dav-server's results to one of ours; what it cannot say (412, 429, 503) the
/// handler puts back from [`Request::failed`].
pub fn fs_error(e: &Error) -> FsError {
    match e.kind {
        ErrorKind::NotFound => FsError::NotFound,
        ErrorKind::Conflict | ErrorKind::Precondition => FsError::Exists,
        ErrorKind::TooLarge => FsError::TooLarge,
        ErrorKind::InsufficientStorage => FsError::InsufficientStorage,
        ErrorKind::BadRequest if e.code == "path_too_deep" => FsError::PathTooLong,
        ErrorKind::BadRequest | ErrorKind::Forbidden | ErrorKind::Auth => FsError::Forbidden,
        ErrorKind::MethodNotAllowed => FsError::Forbidden,
        _ => FsError::GeneralFailure,
    }
}

impl DavCaller {
    /// Keeps the error for the handler (see [`fs_error`]) and maps it.
    fn failed(&self, e: Error) -> FsError {
        if e.kind == ErrorKind::Server {
            log::error!("webdav: {e}");
        }
        let mapped = fs_error(&e);
        *crate::sync::relock(&self.request.failed) = Some(e);
        mapped
    }

    fn path(&self, path: &DavPath) -> FsResult<NodePath> {
        node_path(path)
    }

    async fn node(&self, path: &NodePath) -> FsResult<Node> {
        self.backend.node(path).await.map_err(|e| self.failed(e))
    }
}

/// A node's metadata as dav-server asks for it.
#[derive(Debug, Clone)]
pub struct Meta {
    dir: bool,
    len: u64,
    modified: SystemTime,
    created: Option<SystemTime>,
    /// A file's current version (its md5): the ETag.
    md5: Option<String>,
    exec: bool,
}

impl Meta {
    fn of(node: &Node) -> Meta {
        let time = |t: &Option<String>| t.as_deref().and_then(crate::api::parse_time);
        Meta {
            dir: !node.is_file(),
            len: node.size.unwrap_or(0),
            modified: time(&node.modified_on).unwrap_or(UNIX_EPOCH),
            created: time(&node.created_on),
            md5: node.is_file().then(|| {
                node.md5_checksum
                    .clone()
                    .unwrap_or_else(|| crate::api::checksum::EMPTY_MD5.to_string())
            }),
            exec: node.mode.is_some_and(|m| m & 0o111 != 0),
        }
    }
}

impl DavMetaData for Meta {
    fn len(&self) -> u64 {
        self.len
    }
    fn modified(&self) -> FsResult<SystemTime> {
        Ok(self.modified)
    }
    fn is_dir(&self) -> bool {
        self.dir
    }
    fn created(&self) -> FsResult<SystemTime> {
        self.created.ok_or(FsError::NotImplemented)
    }
    fn executable(&self) -> FsResult<bool> {
        if self.dir {
            return Err(FsError::NotImplemented);
        }
        Ok(self.exec)
    }
    /// A file's ETag is its version (the md5 of its bytes, what the store's conflict check
    /// compares: docs/design.md §5); a folder's, its time.
    fn etag(&self) -> Option<String> {
        if let Some(md5) = &self.md5 {
            return Some(md5.clone());
        }
        let t = self.modified.duration_since(UNIX_EPOCH).ok()?;
        Some(format!("{:x}", t.as_micros()))
    }
}

struct Entry {
    name: String,
    meta: Meta,
}

impl DavDirEntry for Entry {
    fn name(&self) -> Vec<u8> {
        self.name.as_bytes().to_vec()
    }
    fn metadata(&self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        Box::pin(std::future::ready(Ok(m)))
    }
    fn is_dir(&self) -> FsFuture<'_, bool> {
        Box::pin(std::future::ready(Ok(self.meta.dir)))
    }
}

impl GuardedFileSystem<DavCaller> for StoreFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        async move {
            let p = c.path(path)?;
            if !options.write {
                let node = c.node(&p).await?;
                if !node.is_file() {
                    return Err(FsError::Forbidden);
                }
                return Ok(Box::new(Reader::new(c, &node)?) as Box<dyn DavFile>);
            }
            let existing = match c.backend.node(&p).await {
                Ok(n) => Some(n),
                Err(e) if e.kind == ErrorKind::NotFound => None,
                Err(e) => return Err(c.failed(e)),
            };
            if existing.is_none() {
                // A new file in a folder that is not there: 409 (RFC 4918 9.7.1, dav-server's
                // answer to NotFound here), as clients expect to make the folder then; not a 404
                // from the store once the body was read.
                let parent = p.parent().ok_or(FsError::Forbidden)?;
                match c.backend.node(&parent).await {
                    Ok(n) if !n.is_file() => {}
                    Ok(_) => return Err(FsError::NotFound),
                    Err(e) if e.kind == ErrorKind::NotFound => return Err(FsError::NotFound),
                    Err(e) => return Err(c.failed(e)),
                }
            }
            match &existing {
                Some(n) if !n.is_file() => return Err(FsError::Forbidden),
                Some(_) if options.create_new => return Err(FsError::Exists),
                None if !options.create && !options.create_new => return Err(FsError::NotFound),
                _ => {}
            }
            if options.append {
                // Writes at a file's end (PATCH): the store keeps whole versions only.
                return Err(FsError::NotImplemented);
            }
            if !options.truncate {
                // A LOCK of a name: the file, made empty (no version) when new, its bytes
                // untouched. (Writes into a file's middle, Content-Range, are refused: the
                // handle writes nothing.)
                let node = match existing {
                    Some(n) => n,
                    None => {
                        let (Some(folder), Some(name)) = (p.parent(), p.name()) else {
                            return Err(FsError::Forbidden);
                        };
                        c.backend
                            .create_file(&folder, name)
                            .await
                            .map_err(|e| c.failed(e))?
                    }
                };
                return Ok(Box::new(Reader::new(c, &node)?) as Box<dyn DavFile>);
            }
            let max = c.backend.store().config().max_file_size;
            if let Some(n) = options.size {
                if n > max {
                    return Err(FsError::TooLarge);
                }
                // Refused before the body is read when it cannot fit the account's quota (the
                // commit checks again, and alone where the length is not announced).
                let usage = c.backend.usage().await.map_err(|e| c.failed(e))?;
                if let Some(u) = usage
                    && u.max_bytes.is_some_and(|m| u.bytes.saturating_add(n) > m)
                {
                    return Err(c.failed(Error::new(
                        ErrorKind::InsufficientStorage,
                        "quota_exceeded",
                        format!("{n} more bytes would take the account over its quota"),
                    )));
                }
            }
            let mut base = c.request.base.clone();
            if options.create_new {
                base = Base::Absent;
            }
            let writer = c.backend.staging_writer().await.map_err(|e| c.failed(e))?;
            let f: Box<dyn DavFile> = Box::new(Writer {
                caller: c.clone(),
                path: p,
                base,
                expected: options.size,
                max,
                writer: Mutex::new(Some(writer)),
                batch: BytesMut::new(),
                written: 0,
                stored: None,
            });
            Ok(f)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
        c: &'a DavCaller,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        async move {
            let p = c.path(path)?;
            if c.request.walk_cut_short(&p) {
                let none: FsStream<Box<dyn DavDirEntry>> = Box::pin(futures_util::stream::empty());
                return Ok(none);
            }
            // The first page now (a missing folder is an error of the call, not of the
            // stream); the others as the answer is written, so a folder of a million names
            // holds one page in memory, not all.
            let first = c
                .backend
                .list(&p, 0, LIST_PAGE)
                .await
                .map_err(|e| c.failed(e))?;
            if first.is_file() {
                return Err(FsError::Forbidden);
            }
            let total = first.total_children.unwrap_or(0);
            let pages = Pages {
                backend: c.backend.clone(),
                path: p,
                next: 1,
                // Pages after the first that the count calls for, and one more (names made
                // meanwhile); never more.
                left: total.div_ceil(LIST_PAGE),
                last_full: first.children.as_ref().map_or(0, Vec::len) as u64 == LIST_PAGE,
            };
            let first = futures_util::stream::iter(entries(first.children.unwrap_or_default()));
            let rest = futures_util::stream::unfold(pages, |mut pages| async move {
                if pages.left == 0 || !pages.last_full {
                    return None;
                }
                pages.left -= 1;
                let listed = pages.backend.list(&pages.path, pages.next, LIST_PAGE).await;
                pages.next += 1;
                let batch = match listed {
                    Ok(node) => {
                        let children = node.children.unwrap_or_default();
                        pages.last_full = children.len() as u64 == LIST_PAGE;
                        entries(children)
                    }
                    Err(e) => {
                        pages.last_full = false;
                        vec![Err(fs_error(&e))]
                    }
                };
                Some((futures_util::stream::iter(batch), pages))
            })
            .flatten();
            let s: FsStream<Box<dyn DavDirEntry>> = Box::pin(first.chain(rest));
            Ok(s)
        }
        .boxed()
    }

    fn metadata<'a>(
        &'a self,
        path: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Box<dyn DavMetaData>> {
        async move {
            let p = c.path(path)?;
            let node = c.node(&p).await?;
            let m: Box<dyn DavMetaData> = Box::new(Meta::of(&node));
            Ok(m)
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            // A COPY of a folder, to infinite depth: the store copies the tree at once (one
            // transaction, its quota checked for all of it), and the walk stops there.
            if let Some(src) = c.request.whole_tree_copy(&p) {
                c.backend
                    .copy(&src, &p, false)
                    .await
                    .map_err(|e| c.failed(e))?;
                c.request
                    .copied
                    .store(true, std::sync::atomic::Ordering::Release);
                return Ok(());
            }
            match c.backend.create_folder(&p).await {
                Ok(_) => Ok(()),
                // MKCOL where the parent is missing is 409 (RFC 4918 9.3.1): dav-server's answer
                // to NotFound (Exists is 405, "already there", after which rclone never makes the
                // parent and every PUT below fails).
                Err(e) if e.kind == ErrorKind::NotFound => Err(FsError::NotFound),
                Err(e) => Err(c.failed(e)),
            }
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            if !c.request.walk_cut_short(&p) {
                // A folder dav-server believes empty: it must be (a DELETE of Depth 0).
                let listed = c.backend.list(&p, 0, 1).await.map_err(|e| c.failed(e))?;
                if listed.total_children.unwrap_or(0) > 0 {
                    return Err(FsError::Exists);
                }
            }
            c.backend.delete(&p).await.map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            // The file an overwriting MOVE or COPY of a file replaces: the store's own move or
            // copy replaces it (a new version of it), so it is not deleted first.
            if c.request.replaces(&p) {
                let src = c.request.path.clone().ok_or(FsError::NotFound)?;
                if c.node(&src).await?.is_file() {
                    return Ok(());
                }
            }
            // A DELETE with `If-Match`: checked again by the store inside the delete.
            if c.request.is("DELETE") && c.request.path.as_ref() == Some(&p) {
                return c
                    .backend
                    .delete_if(&p, &c.request.base)
                    .await
                    .map_err(|e| c.failed(e));
            }
            c.backend.delete(&p).await.map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn rename<'a>(
        &'a self,
        from: &'a DavPath,
        to: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, ()> {
        async move {
            let (src, dst) = (c.path(from)?, c.path(to)?);
            c.backend
                .rename(&src, &dst, c.request.overwrite)
                .await
                .map(drop)
                .map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn copy<'a>(
        &'a self,
        from: &'a DavPath,
        to: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, ()> {
        async move {
            let (src, dst) = (c.path(from)?, c.path(to)?);
            c.backend
                .copy(&src, &dst, c.request.overwrite)
                .await
                .map_err(|e| c.failed(e))?;
            // A copy carries the file's dead properties (RFC 4918 9.8.2).
            let props = c.backend.dead_props(&src).await.map_err(|e| c.failed(e))?;
            if !props.is_empty() {
                let patch = props.into_iter().map(|p| (true, p)).collect();
                c.backend
                    .patch_dead_props(&dst, patch)
                    .await
                    .map_err(|e| c.failed(e))?;
            }
            Ok(())
        }
        .boxed()
    }

    fn have_props<'a>(
        &'a self,
        _path: &'a DavPath,
        _c: &'a DavCaller,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(std::future::ready(true))
    }

    fn patch_props<'a>(
        &'a self,
        path: &'a DavPath,
        patch: Vec<(bool, DavProp)>,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<(StatusCode, DavProp)>> {
        async move {
            let p = c.path(path)?;
            let dead = patch
                .iter()
                .map(|(set, prop)| (*set, dead_prop(prop)))
                .collect();
            c.backend
                .patch_dead_props(&p, dead)
                .await
                .map_err(|e| c.failed(e))?;
            Ok(patch
                .into_iter()
                .map(|(_, mut prop)| {
                    prop.xml = None;
                    (StatusCode::OK, prop)
                })
                .collect())
        }
        .boxed()
    }

    fn get_props<'a>(
        &'a self,
        path: &'a DavPath,
        do_content: bool,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<DavProp>> {
        async move {
            let p = c.path(path)?;
            let props = c.backend.dead_props(&p).await.map_err(|e| c.failed(e))?;
            Ok(props.into_iter().map(|d| dav_prop(d, do_content)).collect())
        }
        .boxed()
    }

    fn get_prop<'a>(
        &'a self,
        path: &'a DavPath,
        prop: DavProp,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<u8>> {
        async move {
            let p = c.path(path)?;
            let want = dead_prop(&prop);
            let props = c.backend.dead_props(&p).await.map_err(|e| c.failed(e))?;
            props
                .into_iter()
                .find(|d| d.namespace == want.namespace && d.name == want.name)
                .and_then(|d| d.xml)
                .ok_or(FsError::NotFound)
        }
        .boxed()
    }

    fn get_quota<'a>(&'a self, c: &'a DavCaller) -> FsFuture<'a, (u64, Option<u64>)> {
        async move {
            match c.backend.usage().await.map_err(|e| c.failed(e))? {
                Some(u) => Ok((u.bytes, u.max_bytes)),
                None => Err(FsError::NotImplemented),
            }
        }
        .boxed()
    }
}

/// The pages of a listing still to fetch, as dav-server reads the entries.
struct Pages {
    backend: LocalBackend,
    path: NodePath,
    next: u64,
    left: u64,
    /// The page before was full: there may be more.
    last_full: bool,
}

fn entries(children: Vec<Node>) -> Vec<FsResult<Box<dyn DavDirEntry>>> {
    children
        .into_iter()
        .map(|child| {
            let e: Box<dyn DavDirEntry> = Box::new(Entry {
                meta: Meta::of(&child),
                name: child.name,
            });
            Ok(e)
        })
        .collect()
}

/// dav-server's property as the store keeps it.
fn dead_prop(p: &DavProp) -> DeadProp {
    DeadProp {
        namespace: p.namespace.clone().unwrap_or_default(),
        name: p.name.clone(),
        prefix: p.prefix.clone(),
        xml: p.xml.clone(),
    }
}

/// The store's property for dav-server, its value only when asked for.
fn dav_prop(d: DeadProp, content: bool) -> DavProp {
    DavProp {
        name: d.name,
        prefix: d.prefix,
        namespace: (!d.namespace.is_empty()).then_some(d.namespace),
        xml: if content { d.xml } else { None },
    }
}

/// A file opened for reading: its bytes are asked of the store from the position read at,
/// once, and streamed; a seek elsewhere asks again from there (a range).
struct Reader {
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
    fn new(caller: &DavCaller, node: &Node) -> Result<Reader, FsError> {
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
struct Writer {
    caller: DavCaller,
    path: NodePath,
    /// What the bytes replace (`If-Match`, `If-None-Match: *`), checked in the commit.
    base: Base,
    /// The length the request announced, if it did.
    expected: Option<u64>,
    /// The server's largest file.
    max: u64,
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
        self.batch.extend_from_slice(&data);
        if self.batch.len() >= WRITE_BATCH {
            self.write_batch().await?;
        }
        Ok(())
    }
}

impl DavFile for Writer {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(self.stored.clone().unwrap_or(Meta {
            dir: false,
            len: self.written,
            modified: SystemTime::now(),
            created: None,
            md5: None,
            exec: false,
        }));
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
            let node = self
                .caller
                .backend
                .put_staged(&self.path, staged, &self.base)
                .await
                .map_err(|e| self.caller.failed(e))?;
            self.stored = Some(Meta::of(&node));
            Ok(())
        }
        .boxed()
    }
}
