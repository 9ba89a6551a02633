//! The interface as async Rust calls. The mount and the server are written against
//! [`Backend`]; [`local::LocalBackend`] implements it in process over the store, and the remote
//! backend over HTTP.

pub mod bwlimit;
#[cfg(test)]
pub mod faulty;
pub mod local;
pub mod remote;

use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::Stream;

use crate::api::{
    Base, FileAttrs, Lock, Node, NodePath, PageSize, PreviewMeta, RangeRequest, Result, Version,
};

/// A body of bytes flowing in either direction, never held whole in memory.
pub type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send + 'static>>;

/// Size of the chunks a reader stream yields.
const READ_CHUNK: usize = 256 * 1024;

/// Streams the first `len` bytes of a blocking reader (a file) in chunks. Each chunk is read by
/// a short blocking task (the next one is read ahead while the current one is sent), so no
/// thread waits on a slow or stalled consumer, and memory stays bounded whatever the size: at
/// most two chunks per stream. A chunk's buffer is sized to what is left, and the stream ends
/// once `len` bytes came: a small file is one read of its size (not a zeroed `READ_CHUNK`,
/// then a second task to find the end: most of a cold `tar` of small files' cost).
pub fn reader_stream<R: std::io::Read + Send + 'static>(reader: R, len: u64) -> ByteStream {
    type Read<R> = tokio::task::JoinHandle<(R, u64, io::Result<Option<Bytes>>)>;
    fn read_next<R: std::io::Read + Send + 'static>(mut reader: R, left: u64) -> Read<R> {
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; left.min(READ_CHUNK as u64) as usize];
            let r = loop {
                match reader.read(&mut buf) {
                    Ok(0) => break Ok(None),
                    Ok(n) => {
                        buf.truncate(n);
                        break Ok(Some(Bytes::from(buf)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => break Err(e),
                }
            };
            (reader, left, r)
        })
    }
    if len == 0 {
        return Box::pin(futures_util::stream::empty());
    }
    Box::pin(futures_util::stream::unfold(
        Some(read_next(reader, len)),
        |pending: Option<Read<R>>| async move {
            let (reader, left, r) = match pending?.await {
                Ok(done) => done,
                Err(e) => return Some((Err(io::Error::other(e)), None)),
            };
            match r {
                Ok(Some(chunk)) => {
                    let left = left.saturating_sub(chunk.len() as u64);
                    let next = (left > 0).then(|| read_next(reader, left));
                    Some((Ok(chunk), next))
                }
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        },
    ))
}

/// Where [`Backend::put_whole`] stores: a file by ID (steps 2 and 3), or by path (1 to 3).
#[derive(Clone, Copy, Debug)]
pub enum PutTo<'a> {
    File(&'a str),
    Path(&'a NodePath),
}

/// A file for [`Backend::put_whole`]: where, and step 2's terms.
#[derive(Clone, Copy, Debug)]
pub struct Whole<'a> {
    pub to: PutTo<'a>,
    pub length: u64,
    /// Of the bytes (hex or base64).
    pub md5: &'a str,
    pub attrs: FileAttrs,
    pub base: &'a Base,
}

/// A download in progress: what is being sent, and the bytes.
pub struct Download {
    /// The file as it is now (name, size, md5, times).
    pub node: Node,
    /// Size of the whole file.
    pub total_size: u64,
    /// The inclusive byte range being sent, when a range was asked for.
    pub range: Option<(u64, u64)>,
    pub body: ByteStream,
}

impl Download {
    /// Number of bytes `body` yields.
    pub fn len(&self) -> u64 {
        match self.range {
            Some((a, b)) => b - a + 1,
            None => self.total_size,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A rendered preview page.
pub struct PreviewImage {
    pub content_type: String,
    pub data: Bytes,
}

/// Children fetched per page by the mount's listings.
pub const LIST_PAGE: u64 = 1000;

/// What one listing of a backend that is not trusted (a server) may cost the mount: beyond
/// either bound it fails with EIO instead of going on asking for pages (a hostile or broken
/// server that claims an endless folder and sends new names on every page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListingLimits {
    /// Most children one listing takes.
    pub entries: u64,
    /// Most memory its children may hold while it is read ([`Node::held_bytes`]): a server
    /// can make each child as large as it likes (issue 47: 704 MiB before the time bound).
    pub bytes: u64,
    /// Longest a whole listing may take, all its pages together.
    pub time: std::time::Duration,
}

/// The memory one listing of a server may hold (issue 47, item 14).
pub const MAX_LISTING_BYTES: u64 = 256 << 20;

/// A listing of a server may take this many `--timeout`s ([`remote::RemoteConfig`]'s
/// `total_timeout`). Each page is one call bounded by `--timeout`; a few make room for a large
/// folder (a million children are a thousand pages) while `ls` on a server that never ends its
/// listing fails within minutes, not never.
pub const LISTING_TIMEOUTS: u32 = 4;

/// A folder with all its children (`children=1`), following `page`/`per_page` until
/// `total_children` is reached. A server may cap pages below what was asked, so without a count
/// a short page does not end the listing: an empty page does, or one that brings no name not
/// seen before (a server that ignores `page`), so a miscounting server loops no more than that.
/// A server that keeps sending new names is stopped by the backend's [`ListingLimits`]: past
/// either, the listing fails (`listing_too_large`, `listing_too_slow`: EIO in the mount).
pub async fn list_all<B: Backend>(b: &B, path: &NodePath, per_page: u64) -> Result<Node> {
    let Some(limits) = b.listing_limits() else {
        let unbounded = ListingLimits {
            entries: u64::MAX,
            bytes: u64::MAX,
            time: std::time::Duration::MAX,
        };
        return list_pages(b, path, per_page, unbounded).await;
    };
    match tokio::time::timeout(limits.time, list_pages(b, path, per_page, limits)).await {
        Ok(r) => r,
        Err(_) => Err(crate::api::Error::new(
            crate::api::ErrorKind::Server,
            "listing_too_slow",
            format!(
                "the listing of {path} did not end within {:?}: given up",
                limits.time
            ),
        )),
    }
}

async fn list_pages<B: Backend>(
    b: &B,
    path: &NodePath,
    per_page: u64,
    limits: ListingLimits,
) -> Result<Node> {
    let per_page = per_page.max(1);
    let mut node = b.list(path, 0, per_page).await?;
    let mut children = node.children.take().unwrap_or_default();
    children.iter_mut().for_each(without_links);
    let mut seen: std::collections::HashSet<String> =
        children.iter().map(|c| c.name.clone()).collect();
    // What each child holds beyond its slot in `children` (counted by the vector's capacity,
    // which runs ahead of its length), and its name again in `seen` (the string, and a slot
    // of a table kept at most half full).
    let node_size = std::mem::size_of::<Node>() as u64;
    let held = |c: &Node| c.held_bytes() as u64 - node_size + c.name.len() as u64 + 16 + 50;
    let mut heap: u64 = children.iter().map(held).sum();
    let mut last = children.len() as u64;
    let mut page = 1;
    loop {
        let too_large = if children.len() as u64 > limits.entries {
            Some(format!("more than {} children", limits.entries))
        } else {
            let bytes = heap + children.capacity() as u64 * node_size;
            (bytes > limits.bytes)
                .then(|| format!("children of more than {} MiB", limits.bytes >> 20))
        };
        if let Some(what) = too_large {
            return Err(crate::api::Error::new(
                crate::api::ErrorKind::Server,
                "listing_too_large",
                format!("the listing of {path} has {what}: given up"),
            ));
        }
        let done = match node.total_children {
            Some(total) => children.len() as u64 >= total,
            None => false,
        };
        if done || last == 0 {
            break;
        }
        let next = b.list(path, page, per_page).await?;
        let got = next.children.unwrap_or_default();
        let fresh: Vec<Node> = got
            .into_iter()
            .filter(|c| seen.insert(c.name.clone()))
            .map(|mut c| {
                without_links(&mut c);
                c
            })
            .collect();
        heap += fresh.iter().map(held).sum::<u64>();
        last = fresh.len() as u64;
        children.extend(fresh);
        page += 1;
    }
    node.children = Some(children);
    Ok(node)
}

/// A listed child as the mount keeps it until merged: its web links go (four strings a file,
/// a quarter of a listing's memory; the mount asks for them by name when read, `fs/xattrs.rs`).
/// The file ID they carry stays: a server that names it only there (the public service's
/// step 1 does) still gives the mount its file.
fn without_links(c: &mut Node) {
    if c.id.is_none() {
        c.id = c.file_id();
    }
    c.link_uri = None;
    c.preview_link_uri = None;
    c.download_link_uri = None;
    c.download_uri = None;
}

/// Requests of [`Backend::delete_files_if`] in flight at once over a server: enough to hide the
/// round trip, few enough that a server's other clients are not held up behind an `rm -rf`.
pub const DELETES_IN_FLIGHT: usize = 8;

/// What a backend that keeps no deleted files answers of them.
pub fn no_deleted() -> crate::api::Error {
    crate::api::Error::new(
        crate::api::ErrorKind::MethodNotAllowed,
        "no_deleted",
        "this server keeps no deleted files",
    )
}

/// What a backend without versions answers.
pub fn no_versions() -> crate::api::Error {
    crate::api::Error::new(
        crate::api::ErrorKind::MethodNotAllowed,
        "no_versions",
        "this server shows no earlier versions of files",
    )
}

/// What a backend without full-text search answers.
pub fn no_search() -> crate::api::Error {
    crate::api::Error::new(
        crate::api::ErrorKind::MethodNotAllowed,
        "no_search",
        "this server has no full-text search (the public service's API offers none; \
         vaultfs serve and a local mount do)",
    )
}

/// A whole local file to store, for [`Batches::put_files`].
pub use crate::store::PutFile;

/// A boxed future, for the calls of [`LocalStore`] (a trait object).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whole files stored together, beyond the interface: by the built-in store in this process,
/// and by our server (`POST /nodes/batch`, [`crate::api::EXT_BATCH_PUT`]). A mount asks for it
/// with [`Backend::batches`]; without it, files go one by one (`fs/upload.rs`).
pub trait Batches: Send + Sync {
    /// Stores whole files together, durably before it returns: one result per file, in order.
    /// A batch's durable work (fsyncs, the transaction, a server's round trip) is paid once for
    /// all of it. Each file is stored only while its `base` holds, as a version's commit is.
    fn put_files(&self, files: Vec<PutFile>) -> BoxFuture<'_, Vec<Result<crate::api::Node>>>;

    /// Which files a batch takes and how many bytes it holds at most.
    fn batch_bounds(&self) -> BatchBounds;
}

/// The bounds of [`Batches`]: a file larger than `file` goes file by file; a batch holds up to
/// `total` bytes (more only for a single file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchBounds {
    pub file: u64,
    pub total: u64,
}

/// What only a store in this process can do beyond the interface (the built-in store): hand
/// out a file's bytes on local disk, tell at once that another process changed it. A mount asks
/// for it with [`Backend::local`] and uses the interface alone where it is not offered (a
/// server, a bucket).
pub trait LocalStore: Send + Sync {
    /// A file's current bytes whole on local disk, opened, with the version they are (md5 and
    /// size in `node`) and the file's path: the store's blob when its blobs are in a folder.
    /// `None` where they are not. The file is immutable under that path, so it may be opened
    /// again by it while the version is current.
    fn local_file<'a>(&'a self, file_id: &'a str) -> BoxFuture<'a, Result<Option<LocalFile>>>;

    /// Up to `len` bytes from `offset` of a file's current version, read from its blob on local
    /// disk in the same trip as the look-up, with the version they are of (md5 and size in the
    /// node). `None` where blobs are not local files.
    fn read_local<'a>(
        &'a self,
        file_id: &'a str,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'a, Result<Option<LocalBytes>>>;

    /// A number that changes when someone else changed the store, known at once and without
    /// waiting: the built-in store counts other processes' commits (another mount of the same
    /// folder, `vaultfs serve` on it). `None` when it cannot say (others' changes then show
    /// when a listing is fetched again, after the listing TTL).
    fn foreign_changes(&self) -> Option<u64>;

    /// Whether another process has the store open now, and so can see that a file is not
    /// stored yet (a mount's rename of one then stores it first: `Fs::store_before_moving`).
    fn shared(&self) -> bool;
}

/// Bytes read from a file's blob ([`LocalStore::read_local`]), with the node of the version.
pub type LocalBytes = (crate::api::Node, Vec<u8>);

/// A file's bytes on local disk ([`LocalStore::local_file`]): its node, path and open file.
pub type LocalFile = (crate::api::Node, std::path::PathBuf, std::fs::File);

/// The interface of the document store (docs/design.md §2).
pub trait Backend: Send + Sync + 'static {
    /// What this backend can do beyond the interface, when it is a store in this process
    /// ([`LocalStore`]). Without it, the mount uploads file by file (the three steps of the
    /// interface) and announces an md5 with each version, for the server to check the bytes
    /// that crossed the network; a store in this process hashes what it receives anyway.
    fn local(&self) -> Option<&dyn LocalStore> {
        None
    }

    /// Whole files stored together ([`Batches`]): the built-in store, our server.
    fn batches(&self) -> Option<&dyn Batches> {
        None
    }

    /// Bounds on one [`list_all`]; `None` where the backend is trusted (the built-in store in
    /// this process).
    fn listing_limits(&self) -> Option<ListingLimits> {
        None
    }

    /// The change feed (`GET /changes` of `vaultfs serve`): the changes after `cursor`, waiting
    /// up to `wait` for one when there is none yet (then an empty page with the same cursor);
    /// without a cursor, the one to follow from. `Ok(None)`: this backend or its server has no
    /// feed (the public service), so the caller polls what it has cached instead.
    fn changes(
        &self,
        cursor: Option<u64>,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<Option<crate::api::ChangesPage>>> + Send {
        let _ = (cursor, wait);
        async { Ok(None) }
    }

    /// Full-text search (`GET /search` of `vaultfs serve`): the files under `dir` whose text
    /// holds every word of `query`, best first, at most `limit`. The public service has no
    /// such call: the default says so.
    fn search(
        &self,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> impl Future<Output = Result<crate::api::SearchResults>> + Send {
        let _ = (dir, query, limit);
        async { Err(no_search()) }
    }

    /// What the caller's account holds and may hold (`GET /usage` of `vaultfs serve`), for
    /// `df`. `Ok(None)` where the backend cannot say (the public service).
    fn usage(&self) -> impl Future<Output = Result<Option<crate::api::Usage>>> + Send {
        async { Ok(None) }
    }

    /// The node at `path` (docs/design.md §2, without children).
    fn node(&self, path: &NodePath) -> impl Future<Output = Result<Node>> + Send;

    /// The node at `path` with one page of its children and `total_children` (`children=1`).
    fn list(
        &self,
        path: &NodePath,
        page: u64,
        per_page: u64,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Creates the folder `path`; its parent must exist.
    fn create_folder(&self, path: &NodePath) -> impl Future<Output = Result<Node>> + Send;

    /// Upload step 1: the file `name` in `folder` (returned as it is when it exists).
    fn create_file(
        &self,
        folder: &NodePath,
        name: &str,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Upload step 1 for several files of one folder: one request where the backend takes a
    /// list (the interface's `create_file` is an array), else one by one. One result per name,
    /// in order; `Err` when the request itself failed (nothing is known of any name).
    fn create_files(
        &self,
        folder: &NodePath,
        names: &[String],
    ) -> impl Future<Output = Result<Vec<Result<Node>>>> + Send {
        async move {
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                out.push(self.create_file(folder, n).await);
            }
            Ok(out)
        }
    }

    /// Upload step 2: a new version of `length` bytes; the node's `fileExProperties` says where
    /// to send them.
    fn begin_version(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
    ) -> impl Future<Output = Result<Node>> + Send {
        self.begin_version_with(file_id, length, md5, FileAttrs::default(), &Base::Any)
    }

    /// [`Backend::begin_version`] with the attributes (modification time, mode) the file takes
    /// when the version is committed, and what it replaces: an error of kind `Precondition`
    /// (`version_conflict`) when `base` no longer holds, here or when step 3 commits. A server
    /// that keeps no attributes ignores them: the node it returns then says what it kept. One
    /// without the conflict check of step 3 is checked here, at step 2 only.
    fn begin_version_with(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Sets a file's attributes without new bytes; returns the file as the backend has it now
    /// (its `modifiedOn` and `mode` unchanged where the backend keeps no attributes).
    fn set_attrs(
        &self,
        file_id: &str,
        attrs: FileAttrs,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Upload step 3: the bytes of the version, streamed. `length` is the length of step 2.
    fn upload(
        &self,
        file_id: &str,
        version_id: &str,
        length: u64,
        body: ByteStream,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// The content of a file, whole or one range.
    fn download(
        &self,
        file_id: &str,
        range: Option<RangeRequest>,
    ) -> impl Future<Output = Result<Download>> + Send;

    /// [`Backend::download`] of a file whose size the caller knows (from its node): a server that
    /// sends no Content-Length is held to it.
    fn download_sized(
        &self,
        file_id: &str,
        range: Option<RangeRequest>,
        size: Option<u64>,
    ) -> impl Future<Output = Result<Download>> + Send {
        let _ = size;
        self.download(file_id, range)
    }

    /// Copies `src` to `dst` (full path, name included).
    fn copy(
        &self,
        src: &NodePath,
        dst: &NodePath,
        replace: bool,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Moves (renames) `src` to `dst`.
    fn rename(
        &self,
        src: &NodePath,
        dst: &NodePath,
        replace: bool,
    ) -> impl Future<Output = Result<Node>> + Send;

    /// Deletes a file, or a folder with everything under it.
    fn delete(&self, path: &NodePath) -> impl Future<Output = Result<()>> + Send;

    /// Deletes the file at `path` only while `base` holds for it (its current version is the
    /// one the caller knew: an edit beats a delete). Atomic where the server offers it (ours:
    /// the `Vaultfs-If-Match` / `Vaultfs-If-None-Match` headers, 412 `version_conflict`); a
    /// server without it ignores the headers and deletes, so the caller looks first too.
    fn delete_if(&self, path: &NodePath, base: &Base) -> impl Future<Output = Result<()>> + Send;

    /// [`Backend::delete_if`] of many files, a result each, in any order between them (a
    /// mount's write-back deletes, `fs::deletes`). Here: [`DELETES_IN_FLIGHT`] requests at a
    /// time; the built-in store makes them one transaction.
    fn delete_files_if(
        &self,
        files: Vec<(NodePath, Base)>,
    ) -> impl Future<Output = Vec<Result<()>>> + Send {
        use futures_util::StreamExt;
        async move {
            futures_util::stream::iter(files)
                .map(|(path, base)| async move { self.delete_if(&path, &base).await })
                .buffered(DELETES_IN_FLIGHT)
                .collect()
                .await
        }
    }

    /// Whether [`Backend::put_whole`] is offered: a server that said so
    /// ([`crate::api::EXT_WHOLE_PUT`]).
    fn puts_whole(&self) -> bool {
        false
    }

    /// A file's bytes in one request where [`Backend::puts_whole`] (our server's extension):
    /// a new version of `length` bytes with this md5, on step 2's terms, current when this
    /// returns; for [`PutTo::Path`], the file made first when absent. One round trip where
    /// the interface's three steps take three.
    fn put_whole(
        &self,
        whole: Whole<'_>,
        body: ByteStream,
    ) -> impl Future<Output = Result<Node>> + Send {
        let _ = (whole, body);
        async {
            Err(crate::api::Error::internal(
                "this backend takes no file in one request",
            ))
        }
    }

    /// Whether [`Backend::delete_if`] is known to be checked where nothing comes in between
    /// (the store's transaction): the caller then need not look first. A server says so in
    /// its answers ([`crate::api::EXT_DELETE_IF`]); until one has, the caller looks.
    fn checks_deletes(&self) -> bool {
        false
    }

    /// The versions kept of the file at `path`, newest first (`vprop=1` on our server). An
    /// error of kind `MethodNotAllowed` where the server shows none in a form we know.
    fn versions(&self, path: &NodePath) -> impl Future<Output = Result<Vec<Version>>> + Send {
        let _ = path;
        async { Err(no_versions()) }
    }

    /// The WebDAV locks that hold the node at `path` (`locks=1` on our server); none where the
    /// backend keeps none, or a server says nothing of them.
    fn locks(&self, path: &NodePath) -> impl Future<Output = Result<Vec<Lock>>> + Send {
        let _ = path;
        async { Ok(Vec::new()) }
    }

    /// The file most recently deleted from the folder as `path` and kept restorable (the
    /// built-in store): its ID and its kept versions, newest first, none marked current (the
    /// file is gone). `None` where there is none, or the backend keeps no deleted files.
    fn deleted_versions(
        &self,
        path: &NodePath,
    ) -> impl Future<Output = Result<Option<(String, Vec<Version>)>>> + Send {
        let _ = path;
        async { Ok(None) }
    }

    /// Brings back the deleted file `id` kept restorable (our store and server), into the
    /// folder it was deleted from, with its ID and versions. An error of kind
    /// `MethodNotAllowed` where the backend keeps no deleted files.
    fn restore_deleted(&self, id: &str) -> impl Future<Output = Result<Node>> + Send {
        let _ = id;
        async { Err(no_deleted()) }
    }

    /// The bytes of one kept version of a file (by the IDs [`Backend::versions`] gave), whole
    /// or one range; the node says that version's size and md5.
    fn download_version(
        &self,
        file_id: &str,
        version_id: &str,
        range: Option<RangeRequest>,
    ) -> impl Future<Output = Result<Download>> + Send {
        let _ = (file_id, version_id, range);
        async { Err(no_versions()) }
    }

    /// Preview metadata of a file.
    fn preview(&self, file_id: &str) -> impl Future<Output = Result<PreviewMeta>> + Send;

    /// One preview page, as an image.
    fn preview_page(
        &self,
        file_id: &str,
        page: u32,
        size: PageSize,
    ) -> impl Future<Output = Result<PreviewImage>> + Send;

    /// The whole document as PDF.
    fn preview_pdf(&self, file_id: &str) -> impl Future<Output = Result<Download>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_child_keeps_the_file_id_its_links_carried() {
        let mut c = Node {
            name: "a.txt".into(),
            link_uri: Some("https://example.com/file?x=1&id=4711".into()),
            download_link_uri: Some("https://example.com/dl?x=1&id=4711".into()),
            ..Node::default()
        };
        without_links(&mut c);
        assert_eq!(c.file_id().as_deref(), Some("4711"));
        assert!(c.link_uri.is_none() && c.download_link_uri.is_none());
        // An ID of its own is kept as it is.
        let mut d = Node {
            id: Some("own".into()),
            link_uri: Some("https://example.com/file?&id=other".into()),
            ..Node::default()
        };
        without_links(&mut d);
        assert_eq!(d.file_id().as_deref(), Some("own"));
    }
}
