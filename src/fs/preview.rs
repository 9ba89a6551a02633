//! The virtual, read-only `.preview/` of every folder (docs/design.md §3): `.preview/<file>/` holds
//! `status` (one line), and once the preview is ready `page-0001.png`... (100%),
//! `thumb-0001.png`... (25%) and `document.pdf`. Files whose type has no preview have no entry.
//!
//! `.preview` is reached by name but not listed in its folder, as NetApp's `.snapshot` is:
//! `cp -r`, `rm -r`, `find`, `du`, `git add -A` and backup tools walk trees through listings and
//! would otherwise render, copy, index or try to delete the previews of everything they pass.
//! A real `.preview` stored in a folder is hidden by the virtual one; the mount never lists,
//! changes or deletes it (removing its folder answers ENOTEMPTY).
//!
//! Virtual inodes carry [`FLAG`] and live here, not in the inode table. Their contents are
//! fetched whole on lookup (so `ls -l` shows true sizes) into the read cache, keyed by the
//! file's ID and md5: a new version of the file gets new previews.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType};
use futures_util::StreamExt;

use super::cache::CachedFile;
use super::errno::errno;
use super::table::{Ino, InodeKind, Remote};
use super::{Fs, markers, search, shared_thumbs, versions, virtual_names};
use crate::api::{PageSize, PreviewMeta, PreviewStatus};
use crate::backend::Backend;
use crate::sync::relock;

const FLAG: Ino = virtual_names::FLAG;
/// The metadata of a preview in progress is asked again after this long (each ask also keeps
/// its job at the front of the store's queue; a small file's preview takes about this long).
const IN_PROGRESS_TTL: Duration = Duration::from_millis(200);
/// Previews asked for at once while listing a `.preview` directory.
const LIST_CONCURRENCY: usize = 8;
/// Thumbnails are pages at this scale (percent).
const THUMB_SCALE: u32 = 25;

pub use super::virtual_names::{is_virtual, is_virtual_name};

/// A virtual node: its folder's inode and, below `.preview`, the file's name.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Node {
    /// `<folder>/.preview`
    Root(Ino),
    /// `<folder>/.preview/<name>`
    File(Ino, String),
    /// `<folder>/.preview/<name>/<item>`
    Item(Ino, String, Item),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Item {
    Status,
    Page(u32),
    Thumb(u32),
    Pdf,
}

impl Item {
    fn parse(name: &str) -> Option<Item> {
        let numbered = |prefix: &str| {
            let n: u32 = name
                .strip_prefix(prefix)?
                .strip_suffix(".png")?
                .parse()
                .ok()?;
            // One spelling per page: `page-0001.png`, not `page-1.png`.
            (n >= 1 && format!("{prefix}{n:04}.png") == name).then_some(n)
        };
        match name {
            "status" => Some(Item::Status),
            "document.pdf" => Some(Item::Pdf),
            _ => numbered("page-")
                .map(Item::Page)
                .or_else(|| numbered("thumb-").map(Item::Thumb)),
        }
    }

    fn name(self) -> String {
        match self {
            Item::Status => "status".into(),
            Item::Pdf => "document.pdf".into(),
            Item::Page(n) => format!("page-{n:04}.png"),
            Item::Thumb(n) => format!("thumb-{n:04}.png"),
        }
    }

    /// Whether a preview in this state has the item.
    fn exists_in(self, meta: &PreviewMeta) -> bool {
        match (self, meta.status) {
            (Item::Status, _) => true,
            (_, PreviewStatus::Ready) => match self {
                Item::Page(n) | Item::Thumb(n) => n as usize <= meta.pages.len(),
                _ => true,
            },
            _ => false,
        }
    }
}

fn status_line(status: PreviewStatus) -> Vec<u8> {
    let s = match status {
        PreviewStatus::Ready => "Ready",
        PreviewStatus::InProgress => "InProgress",
        PreviewStatus::TypeNotSupported => "TypeNotSupported",
    };
    format!("{s}\n").into_bytes()
}

/// What a virtual file holds.
pub enum Content {
    Bytes(Vec<u8>),
    Cached(Arc<CachedFile>),
}

impl Content {
    pub(super) fn len(&self) -> u64 {
        match self {
            Content::Bytes(b) => b.len() as u64,
            Content::Cached(e) => e.size,
        }
    }

    /// READ of `size` bytes at `offset` (short at the end).
    pub(super) async fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        match self {
            Content::Bytes(b) => {
                let start = (offset as usize).min(b.len());
                let end = start.saturating_add(size as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
            Content::Cached(e) => e
                .read_cached(offset, size as usize)
                .await
                .map_err(|e| errno(&e)),
        }
    }
}

struct Meta {
    md5: Option<String>,
    meta: PreviewMeta,
    at: Instant,
}

/// The virtual folders' part of the mount: the `.preview` tree (here), the `.versions` one
/// (`versions`), the `.search` one (`search`) and the `.sh_thumbnails` one (`shared_thumbs`),
/// each with the virtual nodes it handed to the kernel.
#[derive(Default)]
pub(super) struct VirtualDirs {
    pub(super) previews: std::sync::Mutex<Tree>,
    pub(super) versions: std::sync::Mutex<super::versions::Tree>,
    pub(super) searches: std::sync::Mutex<super::search::Tree>,
    pub(super) shared_thumbs: std::sync::Mutex<super::shared_thumbs::Tree>,
}

/// The virtual nodes handed to the kernel (never reused) and the preview metadata fetched.
#[derive(Default)]
pub struct Tree {
    ids: VirtualInos<Node, FLAG>,
    metas: HashMap<String, Meta>,
}

/// Inode numbers of virtual nodes (`.preview` here, `.versions`): each node gets one, with
/// `F` set, the first time it is handed to the kernel, and keeps it (never reused).
pub(super) struct VirtualInos<N, const F: Ino> {
    inos: HashMap<N, Ino>,
    nodes: HashMap<Ino, N>,
    next: u64,
}

impl<N, const F: Ino> Default for VirtualInos<N, F> {
    fn default() -> Self {
        VirtualInos {
            inos: HashMap::new(),
            nodes: HashMap::new(),
            next: 0,
        }
    }
}

impl<N: std::hash::Hash + Eq + Clone, const F: Ino> VirtualInos<N, F> {
    pub(super) fn ino(&mut self, node: N) -> Ino {
        if let Some(&ino) = self.inos.get(&node) {
            return ino;
        }
        self.next += 1;
        let ino = F | self.next;
        self.inos.insert(node.clone(), ino);
        self.nodes.insert(ino, node);
        ino
    }

    pub(super) fn node(&self, ino: Ino) -> Option<N> {
        self.nodes.get(&ino).cloned()
    }
}

impl<B: Backend> Fs<B> {
    fn previews(&self) -> MutexGuard<'_, Tree> {
        relock(&self.virtual_dirs.previews)
    }

    pub(super) fn virtual_attr(
        &self,
        ino: Ino,
        dir: bool,
        size: u64,
        time: SystemTime,
    ) -> FileAttr {
        virtual_names::attr(ino, dir, size, time, self.uid, self.gid)
    }

    /// The stored file `name` of `folder` (files not uploaded yet have no preview yet).
    pub(super) async fn preview_source(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> Result<(Remote, SystemTime), Errno> {
        let ino = self.child(folder, name).await?.ok_or(Errno::ENOENT)?;
        let t = self.table();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        match (&i.kind, &i.remote) {
            (InodeKind::File, Some(r)) => Ok((r.clone(), i.mtime)),
            _ => Err(Errno::ENOENT),
        }
    }

    /// The preview metadata of a stored file's current version (cached while it holds).
    pub(super) async fn preview_meta(self: &Arc<Self>, r: &Remote) -> Result<PreviewMeta, Errno> {
        if let Some(m) = self.previews().metas.get(&r.id) {
            let fresh = m.md5 == r.md5
                && (m.meta.status != PreviewStatus::InProgress || m.at.elapsed() < IN_PROGRESS_TTL);
            if fresh {
                return Ok(m.meta.clone());
            }
        }
        let meta = self.backend.preview(&r.id).await.map_err(|e| errno(&e))?;
        self.previews().metas.insert(
            r.id.clone(),
            Meta {
                md5: r.md5.clone(),
                meta: meta.clone(),
                at: Instant::now(),
            },
        );
        Ok(meta)
    }

    /// The bytes of an item, fetched whole into the read cache if they are not there.
    async fn preview_content(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
        item: Item,
    ) -> Result<(Content, SystemTime), Errno> {
        let (r, mtime) = self.preview_source(folder, name).await?;
        let meta = self.preview_meta(&r).await?;
        if !item.exists_in(&meta) {
            return Err(Errno::ENOENT);
        }
        let key = format!("preview-{}-{}", r.id, item.name());
        let md5 = r.md5.as_deref();
        if let Some(e) = self.reads.cache.complete(&key, md5) {
            return Ok((Content::Cached(e), mtime));
        }
        let failed = |e: crate::api::Error| errno(&e);
        let entry = match item {
            Item::Status => return Ok((Content::Bytes(status_line(meta.status)), mtime)),
            Item::Page(n) | Item::Thumb(n) => {
                let size = PageSize {
                    scale: Some(if matches!(item, Item::Thumb(_)) {
                        THUMB_SCALE
                    } else {
                        100
                    }),
                    ..PageSize::default()
                };
                let img = self
                    .backend
                    .preview_page(&r.id, n, size)
                    .await
                    .map_err(failed)?;
                let len = img.data.len() as u64;
                let body = futures_util::stream::once(async move { Ok(img.data) }).boxed();
                self.reads
                    .cache
                    .fill(&key, md5, len, body)
                    .await
                    .map_err(failed)?
            }
            Item::Pdf => {
                let d = self.backend.preview_pdf(&r.id).await.map_err(failed)?;
                let len = d.len();
                self.reads
                    .cache
                    .fill(&key, md5, len, d.body)
                    .await
                    .map_err(failed)?
            }
        };
        Ok((Content::Cached(entry), mtime))
    }

    pub(super) async fn preview_getattr(self: &Arc<Self>, ino: Ino) -> Result<FileAttr, Errno> {
        if versions::owns(ino) {
            return self.versions_getattr(ino).await;
        }
        if search::owns(ino) {
            return self.search_getattr(ino).await;
        }
        if shared_thumbs::owns(ino) {
            return self.shared_getattr(ino).await;
        }
        if markers::owns(ino) {
            return self.marker_getattr(ino);
        }
        let node = self.previews().ids.node(ino).ok_or(Errno::ENOENT)?;
        match node {
            Node::Root(folder) => {
                let time = self.table().get(folder).ok_or(Errno::ENOENT)?.mtime;
                Ok(self.virtual_attr(ino, true, 0, time))
            }
            Node::File(folder, name) => {
                let (r, mtime) = self.preview_source(folder, &name).await?;
                if self.preview_meta(&r).await?.status == PreviewStatus::TypeNotSupported {
                    return Err(Errno::ENOENT);
                }
                Ok(self.virtual_attr(ino, true, 0, mtime))
            }
            Node::Item(folder, name, item) => {
                let (content, mtime) = self.preview_content(folder, &name, item).await?;
                Ok(self.virtual_attr(ino, false, content.len(), mtime))
            }
        }
    }

    /// Lookup of `name` in a virtual directory, or of `.preview` in a real one.
    pub(super) async fn preview_lookup(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
    ) -> Result<FileAttr, Errno> {
        if versions::owns(parent) || (!is_virtual(parent) && name == versions::DIR_NAME) {
            return self.versions_lookup(parent, name).await;
        }
        if search::owns(parent) || (!is_virtual(parent) && name == search::DIR_NAME) {
            return self.search_lookup(parent, name).await;
        }
        if shared_thumbs::owns(parent) || (!is_virtual(parent) && name == shared_thumbs::DIR_NAME) {
            return self.shared_lookup(parent, name).await;
        }
        let node = match self.previews().ids.node(parent) {
            None if is_virtual(parent) => return Err(Errno::ENOENT),
            None => {
                let t = self.table();
                match t.get(parent).map(|i| i.kind) {
                    Some(InodeKind::Dir) => Node::Root(parent),
                    Some(InodeKind::File) => return Err(Errno::ENOTDIR),
                    None => return Err(Errno::ENOENT),
                }
            }
            Some(Node::Root(folder)) => Node::File(folder, name.to_string()),
            Some(Node::File(folder, file)) => {
                Node::Item(folder, file, Item::parse(name).ok_or(Errno::ENOENT)?)
            }
            Some(Node::Item(..)) => return Err(Errno::ENOTDIR),
        };
        let ino = self.previews().ids.ino(node);
        self.preview_getattr(ino).await
    }

    /// The entries of a virtual directory.
    pub(super) async fn preview_readdir(
        self: &Arc<Self>,
        ino: Ino,
    ) -> Result<Vec<(Ino, FileType, String)>, Errno> {
        if versions::owns(ino) {
            return self.versions_readdir(ino).await;
        }
        if search::owns(ino) {
            return self.search_readdir(ino).await;
        }
        if shared_thumbs::owns(ino) {
            return self.shared_readdir(ino).await;
        }
        if markers::owns(ino) {
            return Err(Errno::ENOTDIR);
        }
        let node = self.previews().ids.node(ino).ok_or(Errno::ENOENT)?;
        let mut out = vec![(ino, FileType::Directory, ".".to_string())];
        match node {
            Node::Root(folder) => {
                out.push((folder, FileType::Directory, "..".into()));
                self.ensure_listing(folder).await?;
                let files: Vec<(String, Remote)> = {
                    let t = self.table();
                    let names = t
                        .get(folder)
                        .and_then(|i| i.listing())
                        .map(|(_, n)| n.clone())
                        .unwrap_or_default();
                    names
                        .into_iter()
                        .filter_map(|(name, c)| {
                            let i = t.get(c)?;
                            (i.kind == InodeKind::File).then(|| Some((name, i.remote.clone()?)))?
                        })
                        .collect()
                };
                let fs = self.clone();
                let shown: Vec<String> = futures_util::stream::iter(files)
                    .map(|(name, r)| {
                        let fs = fs.clone();
                        async move {
                            // A file whose preview cannot be asked for is left out, not an error
                            // for the whole listing.
                            let status = fs.preview_meta(&r).await.map(|m| m.status);
                            (name, status)
                        }
                    })
                    .buffer_unordered(LIST_CONCURRENCY)
                    .filter_map(|(name, status)| async move {
                        matches!(status, Ok(PreviewStatus::Ready | PreviewStatus::InProgress))
                            .then_some(name)
                    })
                    .collect()
                    .await;
                let mut tree = self.previews();
                let mut entries: Vec<_> = shown
                    .into_iter()
                    .map(|name| {
                        let c = tree.ids.ino(Node::File(folder, name.clone()));
                        (c, FileType::Directory, name)
                    })
                    .collect();
                entries.sort_by(|a, b| a.2.cmp(&b.2));
                out.extend(entries);
            }
            Node::File(folder, name) => {
                let root = self.previews().ids.ino(Node::Root(folder));
                out.push((root, FileType::Directory, "..".into()));
                let (r, _) = self.preview_source(folder, &name).await?;
                let meta = self.preview_meta(&r).await?;
                let mut items = vec![Item::Status];
                if meta.status == PreviewStatus::Ready {
                    items.push(Item::Pdf);
                    let n = meta.pages.len() as u32;
                    items.extend((1..=n).map(Item::Page));
                    items.extend((1..=n).map(Item::Thumb));
                }
                let mut tree = self.previews();
                for item in items {
                    let c = tree.ids.ino(Node::Item(folder, name.clone(), item));
                    out.push((c, FileType::RegularFile, item.name()));
                }
            }
            Node::Item(..) => return Err(Errno::ENOTDIR),
        }
        Ok(out)
    }

    /// Opening a virtual file: reading only. The status line changes size as the preview
    /// progresses, so it is read around the kernel's cache.
    pub(super) fn preview_open(&self, ino: Ino, write: bool) -> Result<fuser::FopenFlags, Errno> {
        if versions::owns(ino) {
            return self.versions_open(ino, write);
        }
        if search::owns(ino) {
            return self.search_open(ino, write);
        }
        if shared_thumbs::owns(ino) {
            return self.shared_open(ino, write);
        }
        if markers::owns(ino) {
            return if write {
                Err(Errno::EROFS)
            } else {
                Ok(fuser::FopenFlags::empty())
            };
        }
        match self.previews().ids.node(ino) {
            None => Err(Errno::ENOENT),
            Some(Node::Root(_) | Node::File(..)) => Err(Errno::EISDIR),
            Some(_) if write => Err(Errno::EROFS),
            Some(Node::Item(_, _, Item::Status)) => Ok(fuser::FopenFlags::FOPEN_DIRECT_IO),
            Some(_) => Ok(fuser::FopenFlags::empty()),
        }
    }

    pub(super) async fn preview_read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        if versions::owns(ino) {
            return self.versions_read(ino, offset, size).await;
        }
        if search::owns(ino) {
            return self.search_read(ino, offset, size).await;
        }
        if shared_thumbs::owns(ino) {
            return self.shared_read(ino, offset, size).await;
        }
        if markers::owns(ino) {
            return Ok(Vec::new());
        }
        let Some(Node::Item(folder, name, item)) = self.previews().ids.node(ino) else {
            return Err(Errno::EISDIR);
        };
        self.preview_content(folder, &name, item)
            .await?
            .0
            .read(offset, size)
            .await
    }
}
