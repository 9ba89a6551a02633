//! The virtual, read-only `.preview/` of every folder (docs/design.md §3): `.preview/<file>/` holds
//! `status` (one line), and once the preview is ready `page-0001.png`... (100%),
//! `thumb-0001.png`... (25%) and `document.pdf`. Files whose type has no preview have no entry.
//!
//! Reached by name, never listed (see `virtual_dirs`): a real `.preview` stored in a folder is
//! hidden by the virtual one; the mount never lists, changes or deletes it (removing its folder
//! answers ENOTEMPTY).
//!
//! The entries' contents are fetched whole on lookup (so `ls -l` shows true sizes) into the read
//! cache, keyed by the file's ID and md5: a new version of the file gets new previews.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FopenFlags};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::{Content, VirtualDir};
use crate::api::{PageSize, PreviewMeta, PreviewStatus};
use crate::backend::Backend;
use crate::fs::table::{Ino, Remote};
use crate::fs::{Fs, OpResult, virtual_names};
use crate::sync::relock;

/// The metadata of a preview in progress is asked again after this long (each ask also keeps
/// its job at the front of the store's queue; a small file's preview takes about this long).
const IN_PROGRESS_TTL: Duration = Duration::from_millis(200);
/// Previews asked for at once while listing a `.preview` directory.
const LIST_CONCURRENCY: usize = 8;
/// Thumbnails are pages at this scale (percent).
const THUMB_SCALE: u32 = 25;

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

struct Meta {
    md5: Option<String>,
    meta: PreviewMeta,
    at: Instant,
}

/// `.preview`: its folders are the files (by name), their entries the items (by name).
#[derive(Default)]
pub(super) struct Previews {
    /// The preview metadata fetched, by file ID.
    metas: Mutex<HashMap<String, Meta>>,
}

/// The item an entry's key names (the key is its name, as [`Item::parse`] reads it).
fn item(key: &str) -> OpResult<Item> {
    Item::parse(key).ok_or(Errno::ENOENT.into())
}

impl<B: Backend> VirtualDir<B> for Previews {
    fn name(&self) -> &'static str {
        virtual_names::PREVIEW
    }

    fn bit(&self) -> Ino {
        0
    }

    fn leaf_key<'a>(
        &'a self,
        _fs: &'a Arc<Fs<B>>,
        _folder: Ino,
        _dir: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        // One spelling per item: the name it parses from is its own.
        futures_util::future::ready(item(name).map(|_| name.to_string())).boxed()
    }

    /// A file's folder: while its type has a preview.
    fn dir_time<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
    ) -> BoxFuture<'a, OpResult<SystemTime>> {
        async move {
            let (r, mtime, _) = fs.stored_file(folder, file).await?;
            if fs.preview_meta(&r).await?.status == PreviewStatus::TypeNotSupported {
                return Err(Errno::ENOENT.into());
            }
            Ok(mtime)
        }
        .boxed()
    }

    fn leaf_attr<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
        leaf: &'a str,
    ) -> BoxFuture<'a, OpResult<(u64, SystemTime)>> {
        async move {
            let (content, mtime) = fs.preview_content(folder, file, item(leaf)?).await?;
            Ok((content.len(), mtime))
        }
        .boxed()
    }

    /// The stored files whose preview is ready or being made, by name.
    fn list<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let stored = fs.stored_files(folder).await?;
            let files = stored.map(|s| s.files).unwrap_or_default();
            let mut shown: Vec<String> = futures_util::stream::iter(files)
                .map(|(name, r)| async move {
                    // A file whose preview cannot be asked for is left out, not an error for
                    // the whole listing.
                    let status = fs.preview_meta(&r).await.map(|m| m.status);
                    (name, status)
                })
                .buffer_unordered(LIST_CONCURRENCY)
                .filter_map(|(name, status)| async move {
                    matches!(status, Ok(PreviewStatus::Ready | PreviewStatus::InProgress))
                        .then_some(name)
                })
                .collect()
                .await;
            shown.sort();
            Ok(shown.into_iter().map(|n| (n.clone(), n)).collect())
        }
        .boxed()
    }

    /// The status, and once ready the PDF, the pages and the thumbnails.
    fn list_dir<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let (r, _, _) = fs.stored_file(folder, file).await?;
            let meta = fs.preview_meta(&r).await?;
            let mut items = vec![Item::Status];
            if meta.status == PreviewStatus::Ready {
                items.push(Item::Pdf);
                let n = meta.pages.len() as u32;
                items.extend((1..=n).map(Item::Page));
                items.extend((1..=n).map(Item::Thumb));
            }
            Ok(items.into_iter().map(|i| (i.name(), i.name())).collect())
        }
        .boxed()
    }

    /// The status line changes size as the preview progresses, so it is read around the
    /// kernel's cache.
    fn open_flags(&self, leaf: &str) -> FopenFlags {
        if item(leaf).is_ok_and(|i| i == Item::Status) {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    fn read<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
        leaf: &'a str,
        offset: u64,
        size: u32,
    ) -> BoxFuture<'a, OpResult<Vec<u8>>> {
        async move {
            let (content, _) = fs.preview_content(folder, file, item(leaf)?).await?;
            content.read(offset, size).await
        }
        .boxed()
    }
}

impl<B: Backend> Fs<B> {
    fn previews(&self) -> std::sync::MutexGuard<'_, HashMap<String, Meta>> {
        relock(&self.virtual_dirs.previews.metas)
    }

    /// The stored file `name` of `folder` (files not uploaded yet have no preview yet).
    pub(super) async fn preview_source(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> OpResult<(Remote, SystemTime)> {
        let (r, mtime, _) = self.stored_file(folder, name).await?;
        Ok((r, mtime))
    }

    /// The preview metadata of a stored file's current version (cached while it holds).
    pub(super) async fn preview_meta(self: &Arc<Self>, r: &Remote) -> OpResult<PreviewMeta> {
        if let Some(m) = self.previews().get(&r.id) {
            let fresh = m.md5 == r.md5
                && (m.meta.status != PreviewStatus::InProgress || m.at.elapsed() < IN_PROGRESS_TTL);
            if fresh {
                return Ok(m.meta.clone());
            }
        }
        let meta = self.backend.preview(&r.id).await?;
        self.previews().insert(
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
    ) -> OpResult<(Content, SystemTime)> {
        let (r, mtime) = self.preview_source(folder, name).await?;
        let meta = self.preview_meta(&r).await?;
        if !item.exists_in(&meta) {
            return Err(Errno::ENOENT.into());
        }
        let key = format!("preview-{}-{}", r.id, item.name());
        let md5 = r.md5.as_deref();
        if let Some(e) = self.reads.cache.complete(&key, md5) {
            return Ok((Content::Cached(e), mtime));
        }
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
                let img = self.backend.preview_page(&r.id, n, size).await?;
                let len = img.data.len() as u64;
                let body = futures_util::stream::once(async move { Ok(img.data) }).boxed();
                self.reads.cache.fill(&key, md5, len, body).await?
            }
            Item::Pdf => {
                let d = self.backend.preview_pdf(&r.id).await?;
                let len = d.len();
                self.reads.cache.fill(&key, md5, len, d.body).await?
            }
        };
        Ok((Content::Cached(entry), mtime))
    }
}
