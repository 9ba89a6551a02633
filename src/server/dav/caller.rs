//! Who a WebDAV call is for (`DavCaller`: the caller's backend, device and the request), what
//! it is shown (`store::seen`), and how the store's paths and errors become dav-server's. Below
//! the file system (`fs.rs`) and its open files (`handles.rs`), which both take these.

use std::sync::Arc;

use dav_server::davpath::DavPath;
use dav_server::fs::{FsError, FsResult};

use super::Request;
use crate::api::{Error, ErrorKind, Node, NodePath};
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::store::seen::Device;

/// Who asks, and what the whole request is (dav-server's "credentials", one per request).
#[derive(Clone)]
pub struct DavCaller {
    pub backend: LocalBackend,
    /// The device signed in (`store::seen`).
    pub device: Device,
    pub request: Arc<Request>,
}

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
    pub(super) fn failed(&self, e: Error) -> FsError {
        if e.kind == ErrorKind::Server {
            log::error!("webdav: {e}");
        }
        let mapped = fs_error(&e);
        *crate::sync::relock(&self.request.failed) = Some(e);
        mapped
    }

    pub(super) fn path(&self, path: &DavPath) -> FsResult<NodePath> {
        node_path(path)
    }

    pub(super) async fn node(&self, path: &NodePath) -> FsResult<Node> {
        self.backend.node(path).await.map_err(|e| self.failed(e))
    }

    /// Notes what this request shows the device of `node` (`store::seen`): a file's version
    /// in the answer of a GET, HEAD, PROPFIND or LOCK of it. Not a PUT's look before it writes,
    /// nor any other method's. A note that fails is logged (the next PUT over the file may
    /// make a conflict copy needlessly: nothing is lost).
    pub(super) async fn shown(&self, node: &Node) {
        let shows = ["GET", "HEAD", "PROPFIND", "LOCK"];
        if node.is_file() && shows.iter().any(|m| self.request.is(m)) {
            if let Err(e) = self.backend.dav_shown(&self.device, node).await {
                log::warn!("webdav: could not note {} as shown: {e}", node.uri);
            }
        }
    }

    /// Notes that the device is listing the folder at `path` (a PROPFIND of depth 1), before
    /// the listing is read.
    pub(super) async fn listing(&self, path: &NodePath) {
        if self.request.is("PROPFIND")
            && let Err(e) = self.backend.dav_listed(&self.device, path).await
        {
            log::warn!("webdav: could not note the listing of {path}: {e}");
        }
    }
}
