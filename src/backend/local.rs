//! The backend over the built-in store, in process: what `vaultfs mount` uses by default and
//! what `vaultfs serve` exposes. Store calls run on blocking threads; upload bytes are gathered in
//! batches, each hashed and written by a short blocking task while the next batch arrives, so the
//! network side and the disk side overlap, memory stays bounded (two batches per upload), and no
//! thread waits for a slow client.

use std::io::{Seek, SeekFrom};
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::StreamExt;

use super::{Backend, ByteStream, Download, PreviewImage, reader_stream};
use crate::api::{
    Base, ChangesPage, DeletedFile, Error, FileAttrs, Lock, Node, NodePath, PageSize, PreviewMeta,
    PreviewPage, PreviewStatus, RangeRequest, Result, Version,
};
use crate::store::blobs::{BlobFile, BlobWriter};
use crate::store::seen::{Device, Kept};
use crate::store::{PreviewState, Scope, Store, TransferMode, length_mismatch};

/// Changes per page of [`Backend::changes`].
pub const CHANGES_PAGE: u64 = 1000;

/// Bytes of an upload gathered before a blocking task writes them.
const WRITE_BATCH: usize = 256 * 1024;

/// The writer back from a write task.
fn joined(
    r: std::result::Result<std::io::Result<BlobWriter>, tokio::task::JoinError>,
) -> Result<BlobWriter> {
    r.map_err(|e| Error::internal(format!("upload write task failed: {e}")))?
        .map_err(Error::from)
}

#[derive(Clone)]
pub struct LocalBackend {
    store: Arc<Store>,
    scope: Scope,
}

impl LocalBackend {
    /// Everything in the store (the local mount).
    pub fn new(store: Arc<Store>) -> Self {
        LocalBackend {
            store,
            scope: Scope::All,
        }
    }

    /// One account's nodes only (a request of `vaultfs serve`).
    pub fn for_account(store: Arc<Store>, account_id: i64) -> Self {
        LocalBackend {
            store,
            scope: Scope::Account(account_id),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The file of that ID, with its path in `uri` (what a browser link by ID opens). Not in
    /// [`Backend`]: the interface has no such call.
    pub async fn file(&self, file_id: &str) -> Result<Node> {
        let id = file_id.to_string();
        self.run(move |s, scope| s.file(scope, &id)).await
    }

    /// Upload step 1 for several names of one folder, as the interface answers it: the folder
    /// (with `total_children`) and each name's file or error (see [`Store::create_files`]).
    pub async fn create_files_in(
        &self,
        folder: &NodePath,
        names: Vec<String>,
    ) -> Result<(Node, Vec<Result<Node>>)> {
        let folder = folder.clone();
        self.run(move |s, scope| s.create_files(scope, &folder, &names))
            .await
    }

    /// Makes a kept version of the file current again, as a new version (our server's
    /// extension; not in [`Backend`]: the public interface has no such call).
    pub async fn restore_version(&self, file_id: &str, version_id: &str) -> Result<Node> {
        let (id, vid) = (file_id.to_string(), version_id.to_string());
        self.run(move |s, scope| s.restore_version(scope, &id, &vid))
            .await
    }

    /// The files deleted from the folder at `path` and kept restorable (our extension).
    pub async fn deleted_files(&self, path: &NodePath) -> Result<Vec<DeletedFile>> {
        let path = path.clone();
        self.run(move |s, scope| s.deleted_files(scope, &path))
            .await
    }

    /// Brings a deleted file back into its folder (our extension).
    pub async fn restore_deleted(&self, file_id: &str) -> Result<Node> {
        let id = file_id.to_string();
        self.run(move |s, scope| s.restore_deleted(scope, &id))
            .await
    }

    /// WebDAV's dead properties of the node at `path` (`store::dav`).
    pub async fn dead_props(&self, path: &NodePath) -> Result<Vec<crate::store::dav::DeadProp>> {
        let path = path.clone();
        self.run(move |s, scope| s.dead_props(scope, &path)).await
    }

    /// Sets and removes WebDAV dead properties of the node at `path`, all or none.
    pub async fn patch_dead_props(
        &self,
        path: &NodePath,
        patch: Vec<(bool, crate::store::dav::DeadProp)>,
    ) -> Result<()> {
        let path = path.clone();
        self.run(move |s, scope| s.patch_dead_props(scope, &path, &patch))
            .await
    }

    /// A staging file for the bytes of a whole upload whose length is not known before its
    /// end (a WebDAV PUT): hashed as written, given to [`LocalBackend::put_staged`].
    pub async fn staging_writer(&self) -> Result<BlobWriter> {
        self.run(|s, _| Ok(s.blob_writer()?)).await
    }

    /// Stores the staged bytes as the new version of the file at `path`, through the
    /// interface's upload steps, in one trip to a blocking thread ([`Store::put_staged`]:
    /// `base` checked again inside the commit, so a stale one changes nothing).
    pub async fn put_staged(
        &self,
        path: &NodePath,
        staged: crate::store::blobs::StagedBlob,
        base: &Base,
    ) -> Result<Node> {
        let (path, base) = (path.clone(), base.clone());
        self.run(move |s, scope| {
            s.put_staged(scope, &path, staged, &base)
                .map_err(|(e, _)| e)
        })
        .await
    }

    /// A WebDAV PUT without preconditions by `device`: stored unless another version the
    /// device was never shown is current, then kept beside it as a conflict copy
    /// ([`Store::put_keeping_both`]).
    pub async fn put_keeping_both(
        &self,
        path: &NodePath,
        staged: crate::store::blobs::StagedBlob,
        device: &Device,
    ) -> Result<Kept> {
        let (path, device) = (path.clone(), device.clone());
        self.run(move |s, scope| s.put_keeping_both(scope, &path, staged, &device))
            .await
    }

    /// `device` (WebDAV) was answered `node`'s current version.
    pub async fn dav_shown(&self, device: &Device, node: &Node) -> Result<()> {
        let (Some(id), Some(md5)) = (node.file_id(), node.md5_checksum.clone()) else {
            return Ok(());
        };
        let device = device.clone();
        self.run(move |s, _| s.dav_shown(&device, &id, &md5)).await
    }

    /// `device` (WebDAV) is listing the folder at `path`.
    pub async fn dav_listed(&self, device: &Device, path: &NodePath) -> Result<()> {
        let (path, device) = (path.clone(), device.clone());
        self.run(move |s, scope| s.dav_listed(scope, &device, &path))
            .await
    }

    /// [`Backend::changes`] with pages of at most `limit` changes: the store's log read, then
    /// (when nothing is new) a sleep on its wake-ups until this scope's log moved or `wait` is
    /// over. Nothing runs while it sleeps.
    pub async fn changes_page(
        &self,
        cursor: Option<u64>,
        wait: std::time::Duration,
        limit: u64,
    ) -> Result<ChangesPage> {
        let feed = self.store.feed().clone();
        let mut woken = feed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Read before the log: a change committed after the read moves it.
            let seen = feed.generation(self.scope);
            let page = self
                .run(move |s, scope| s.changes(scope, cursor, limit))
                .await?;
            if cursor.is_none() || page.reset || !page.changes.is_empty() {
                return Ok(page);
            }
            while feed.generation(self.scope) == seen {
                match tokio::time::timeout_at(deadline, woken.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return Ok(page),
                }
            }
        }
    }

    /// [`Backend::search`] (also the server's `GET /search`).
    pub async fn search_in(
        &self,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> Result<crate::api::SearchResults> {
        let (dir, query) = (dir.clone(), query.to_string());
        self.run(move |s, scope| s.search(scope, &dir, &query, limit))
            .await
    }

    /// Upload steps 1 and 2 in one transaction: the file at `path` (made when absent, unless
    /// `base` is a condition on its bytes) and a pending version of it; whether it was made
    /// (`Store::begin_version_at`, our server's whole PUT by path).
    pub async fn begin_version_at(
        &self,
        path: &NodePath,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<(Node, bool)> {
        let (path, md5, base) = (path.clone(), md5.map(str::to_string), base.clone());
        self.run(move |s, scope| {
            s.begin_version_at(scope, &path, length, md5.as_deref(), attrs, &base)
        })
        .await
    }

    /// Runs a store call on a blocking thread.
    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store, Scope) -> Result<T> + Send + 'static,
    {
        let store = self.store.clone();
        let scope = self.scope;
        tokio::task::spawn_blocking(move || f(&store, scope))
            .await
            .map_err(|e| Error::internal(format!("store task failed: {e}")))?
    }
}

/// The built-in store takes batches of any size, up to 256 MiB of bytes (a few large files do
/// not hold up the small ones for long).
const BATCH_BOUNDS: super::BatchBounds = super::BatchBounds {
    file: u64::MAX,
    total: 256 << 20,
};

impl super::Batches for LocalBackend {
    fn put_files(&self, files: Vec<super::PutFile>) -> super::BoxFuture<'_, Vec<Result<Node>>> {
        Box::pin(async move {
            let n = files.len();
            match self
                .run(move |s, scope| Ok(s.put_files(scope, &files)))
                .await
            {
                Ok(results) => results,
                Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
            }
        })
    }

    fn batch_bounds(&self) -> super::BatchBounds {
        BATCH_BOUNDS
    }
}

impl super::LocalStore for LocalBackend {
    fn local_file<'a>(
        &'a self,
        file_id: &'a str,
    ) -> super::BoxFuture<'a, Result<Option<super::LocalFile>>> {
        let id = file_id.to_string();
        Box::pin(self.run(move |s, scope| s.open_local_blob(scope, &id)))
    }

    fn read_local<'a>(
        &'a self,
        file_id: &'a str,
        offset: u64,
        len: usize,
    ) -> super::BoxFuture<'a, Result<Option<super::LocalBytes>>> {
        let id = file_id.to_string();
        Box::pin(self.run(move |s, scope| {
            let Some((node, _, file)) = s.open_local_blob(scope, &id)? else {
                return Ok(None);
            };
            let end = offset
                .saturating_add(len as u64)
                .min(node.size.unwrap_or(0));
            let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
            // A blob shorter than its version says is damage, not a short file.
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, offset)?;
            Ok(Some((node, buf)))
        }))
    }

    fn foreign_changes(&self) -> Option<u64> {
        Some(self.store.foreign_commits())
    }

    fn shared(&self) -> bool {
        self.store.shared()
    }
}

impl Backend for LocalBackend {
    fn local(&self) -> Option<&dyn super::LocalStore> {
        Some(self)
    }

    fn batches(&self) -> Option<&dyn super::Batches> {
        Some(self)
    }

    /// The store compares the base in the delete's own transaction.
    fn checks_deletes(&self) -> bool {
        true
    }

    async fn changes(
        &self,
        cursor: Option<u64>,
        wait: std::time::Duration,
    ) -> Result<Option<ChangesPage>> {
        self.changes_page(cursor, wait, CHANGES_PAGE)
            .await
            .map(Some)
    }

    async fn search(
        &self,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> Result<crate::api::SearchResults> {
        self.search_in(dir, query, limit).await
    }

    async fn usage(&self) -> Result<Option<crate::api::Usage>> {
        self.run(|s, scope| s.usage(scope)).await.map(Some)
    }

    async fn node(&self, path: &NodePath) -> Result<Node> {
        let path = path.clone();
        self.run(move |s, scope| s.node(scope, &path)).await
    }

    async fn list(&self, path: &NodePath, page: u64, per_page: u64) -> Result<Node> {
        let path = path.clone();
        self.run(move |s, scope| s.list(scope, &path, page, per_page))
            .await
    }

    async fn create_folder(&self, path: &NodePath) -> Result<Node> {
        let path = path.clone();
        self.run(move |s, scope| s.create_folder(scope, &path))
            .await
    }

    async fn create_file(&self, folder: &NodePath, name: &str) -> Result<Node> {
        let (folder, name) = (folder.clone(), name.to_string());
        self.run(move |s, scope| s.create_file(scope, &folder, &name))
            .await
    }

    async fn create_files(&self, folder: &NodePath, names: &[String]) -> Result<Vec<Result<Node>>> {
        Ok(self.create_files_in(folder, names.to_vec()).await?.1)
    }

    async fn begin_version_with(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        let (id, md5, base) = (file_id.to_string(), md5.map(str::to_string), base.clone());
        self.run(move |s, scope| s.begin_version(scope, &id, length, md5.as_deref(), attrs, &base))
            .await
    }

    async fn set_attrs(&self, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        let id = file_id.to_string();
        self.run(move |s, scope| s.set_attrs(scope, &id, attrs))
            .await
    }

    async fn upload(
        &self,
        file_id: &str,
        version_id: &str,
        _length: u64,
        mut body: ByteStream,
    ) -> Result<Node> {
        let (id, vid) = (file_id.to_string(), version_id.to_string());
        // The version's own length is what counts; stop reading as soon as the body exceeds it.
        // The version, and a staging file for its bytes, in one trip to a blocking thread.
        let (pending, w) = {
            let (id, vid) = (id.clone(), vid.clone());
            self.run(move |s, scope| Ok((s.pending_upload(scope, &id, &vid)?, s.blob_writer()?)))
                .await?
        };
        let expected = pending.length;
        // No thread waits for the network: the bytes are gathered here and each batch is
        // written (and hashed) by a short blocking task, while the next batch arrives; the
        // last is written by the task that commits (a small file makes one trip).
        let mut writer = Some(w);
        let mut writing: Option<tokio::task::JoinHandle<std::io::Result<BlobWriter>>> = None;
        let mut batch = BytesMut::new();
        let mut received = 0u64;
        loop {
            let item = body.next().await;
            let end = match item {
                Some(Ok(b)) => {
                    received += b.len() as u64;
                    if received > expected {
                        return Err(length_mismatch(expected, received));
                    }
                    batch.extend_from_slice(&b);
                    false
                }
                Some(Err(e)) => {
                    log::debug!("upload body broke off: {e}");
                    return Err(Error::bad_request(
                        "upload_interrupted",
                        "the upload was interrupted",
                    ));
                }
                None => true,
            };
            if batch.len() >= WRITE_BATCH && !end {
                if let Some(w) = writing.take() {
                    writer = Some(joined(w.await)?);
                }
                let mut w = writer.take().expect("the writer is back");
                let data = batch.split().freeze();
                writing = Some(tokio::task::spawn_blocking(move || {
                    w.write(data)?;
                    Ok(w)
                }));
            }
            if end {
                break;
            }
        }
        if let Some(w) = writing.take() {
            writer = Some(joined(w.await)?);
        }
        let mut w = writer.take().expect("the writer is back");
        let store = self.store.clone();
        let scope = self.scope;
        let rest = batch.split().freeze();
        tokio::task::spawn_blocking(move || -> Result<Node> {
            if !rest.is_empty() {
                w.write(rest)?;
            }
            let staged = w.finish()?;
            store.commit_upload(scope, &id, &vid, staged)
        })
        .await
        .map_err(|e| Error::internal(format!("upload task failed: {e}")))?
    }

    async fn download(&self, file_id: &str, range: Option<RangeRequest>) -> Result<Download> {
        let id = file_id.to_string();
        self.run(move |s, scope| {
            let (node, file) = s.open_file(scope, &id)?;
            serve(node, file, range)
        })
        .await
    }

    async fn versions(&self, path: &NodePath) -> Result<Vec<Version>> {
        let path = path.clone();
        self.run(move |s, scope| {
            let node = s.node(scope, &path)?;
            let id = node
                .file_id()
                .ok_or_else(|| Error::bad_request("not_a_file", format!("{path} is a folder")))?;
            s.versions(scope, &id)
        })
        .await
    }

    async fn restore_deleted(&self, id: &str) -> Result<Node> {
        LocalBackend::restore_deleted(self, id).await
    }

    async fn locks(&self, path: &NodePath) -> Result<Vec<Lock>> {
        let path = path.clone();
        self.run(move |s, scope| {
            // Only a node the caller may see.
            s.node(scope, &path)?;
            s.dav_locks_on(&path)
        })
        .await
    }

    async fn deleted_versions(&self, path: &NodePath) -> Result<Option<(String, Vec<Version>)>> {
        let path = path.clone();
        self.run(move |s, scope| {
            let (Some(folder), Some(name)) = (path.parent(), path.name()) else {
                return Ok(None);
            };
            let found = match s.deleted_files(scope, &folder) {
                Ok(d) => d.into_iter().find(|d| d.name == name && !d.folder),
                Err(e) if e.kind == crate::api::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            let Some(d) = found else { return Ok(None) };
            let mut versions = s.versions(scope, &d.id)?;
            for v in &mut versions {
                v.current = false;
            }
            Ok(Some((d.id, versions)))
        })
        .await
    }

    async fn download_version(
        &self,
        file_id: &str,
        version_id: &str,
        range: Option<RangeRequest>,
    ) -> Result<Download> {
        let (id, vid) = (file_id.to_string(), version_id.to_string());
        self.run(move |s, scope| {
            let (node, file) = s.open_version(scope, &id, &vid)?;
            serve(node, file, range)
        })
        .await
    }

    async fn copy(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        let (src, dst) = (src.clone(), dst.clone());
        self.run(move |s, scope| s.transfer(scope, &src, &dst, replace, TransferMode::Copy))
            .await
    }

    async fn rename(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        let (src, dst) = (src.clone(), dst.clone());
        self.run(move |s, scope| s.transfer(scope, &src, &dst, replace, TransferMode::Move))
            .await
    }

    async fn delete(&self, path: &NodePath) -> Result<()> {
        let path = path.clone();
        self.run(move |s, scope| s.delete(scope, &path)).await
    }

    async fn delete_if(&self, path: &NodePath, base: &Base) -> Result<()> {
        let (path, base) = (path.clone(), base.clone());
        self.run(move |s, scope| s.delete_if(scope, &path, &base))
            .await
    }

    async fn delete_files_if(&self, files: Vec<(NodePath, Base)>) -> Vec<Result<()>> {
        let n = files.len();
        let all = self
            .run(move |s, scope| Ok(s.delete_files_if(scope, &files)))
            .await;
        all.unwrap_or_else(|e| vec![Err(e); n])
    }

    async fn preview(&self, file_id: &str) -> Result<PreviewMeta> {
        let id = file_id.to_string();
        let state = self.run(move |s, scope| s.preview(scope, &id)).await?;
        Ok(preview_meta(file_id, state))
    }

    async fn preview_page(&self, file_id: &str, page: u32, size: PageSize) -> Result<PreviewImage> {
        let id = file_id.to_string();
        let data = self
            .run(move |s, scope| s.preview_page(scope, &id, page, &size))
            .await?;
        Ok(PreviewImage {
            content_type: "image/png".into(),
            data,
        })
    }

    async fn preview_pdf(&self, file_id: &str) -> Result<Download> {
        let id = file_id.to_string();
        self.run(move |s, scope| {
            let (file, len) = s.preview_pdf(scope, &id)?;
            let mut node = s.file(scope, &id)?;
            // The headers describe the PDF, not the file it shows.
            node.size = Some(len);
            node.md5_checksum = None;
            Ok(Download {
                node,
                total_size: len,
                range: None,
                body: reader_stream(file, len),
            })
        })
        .await
    }
}

/// The metadata envelope's message (docs/design.md §2) for a preview state.
fn preview_meta(file_id: &str, state: PreviewState) -> PreviewMeta {
    let base = format!(
        "/preview/id/Document/{}",
        crate::api::path::encode_segment(file_id)
    );
    match state {
        PreviewState::Ready { pages } => PreviewMeta {
            status: PreviewStatus::Ready,
            pdf_uri: Some(format!("{base}/pdf")),
            pages: pages
                .into_iter()
                .enumerate()
                .map(|(i, (width, height))| PreviewPage {
                    page_number: i as u32 + 1,
                    page_uri: format!("{base}/{}", i + 1),
                    width,
                    height,
                })
                .collect(),
        },
        PreviewState::InProgress => PreviewMeta {
            status: PreviewStatus::InProgress,
            ..PreviewMeta::default()
        },
        PreviewState::NotSupported => PreviewMeta::default(),
    }
}

/// A download of `node` from its opened bytes (`None`: no bytes), whole or the one range.
fn serve(node: Node, file: Option<BlobFile>, range: Option<RangeRequest>) -> Result<Download> {
    let total_size = node.size.unwrap_or(0);
    let resolved = range.map(|r| r.resolve(total_size)).transpose()?;
    let (start, len) = match resolved {
        Some((a, b)) => (a, b - a + 1),
        None => (0, total_size),
    };
    let body: ByteStream = match file {
        Some(mut f) => {
            f.seek(SeekFrom::Start(start))?;
            reader_stream(f, len)
        }
        None => Box::pin(futures_util::stream::empty()),
    };
    Ok(Download {
        node,
        total_size,
        range: resolved,
        body,
    })
}
