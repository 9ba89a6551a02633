//! The freedesktop standard's shared thumbnail repository of every folder, virtual and
//! read-only: `.sh_thumbnails/normal/<md5>.png` and `.sh_thumbnails/large/<md5>.png`, for
//! Thunar. Its tumbler compares the `Thumb::MTime` of an entry to the file's time to the
//! microsecond (`sec.usec`), which GIO and KIO refuse in the shared cache's entries (`thumbnails`
//! writes them in whole seconds, valid for tumbler only for files of a whole-second time); when
//! its own entry does not hold, tumbler looks in the folder's shared repository before it reads
//! the file (since tumbler and Thunar 4.17.1, through libxfce4util's
//! `xfce_create_shared_thumbnail_path`: `<md5 of "./" and the name as the URI spells it>.png`).
//! Here its entries have the time as tumbler reads it, made from page one of the store's preview
//! when looked up, never from the file.
//!
//! Like `.preview` (see `virtual_dirs`), `.sh_thumbnails` is reached by name, never listed in its
//! folder, so tools walking trees (`find`, `cp -r`, `rsync`, backups) never meet it, and GIO and
//! KIO, which do not look there, are not told anything new. Nothing in it can be made, changed or
//! removed (EROFS).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use fuser::Errno;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::{Content, VirtualDir};
use crate::api::{PageSize, PreviewStatus};
use crate::backend::Backend;
use crate::fs::table::Ino;
use crate::fs::thumbnails::{SIZES, file_uri, tagged_png, thumbnailed};
use crate::fs::{Fs, OpResult, virtual_names};
use crate::sync::relock;

/// By folder: its files by their entries' names, as its listing was (fetched at, folder time):
/// made once a listing, not for each lookup (tumbler looks up every file's).
type Names = HashMap<Ino, (Instant, SystemTime, Arc<ByEntry>)>;

/// `.sh_thumbnails`: its folders are the sizes (by their names, [`SIZES`]), their entries the
/// folder's files of a kind thumbnailed (by the file's name).
#[derive(Default)]
pub(super) struct SharedThumbs {
    names: Mutex<Names>,
}

/// A folder's files by their entries' names.
type ByEntry = HashMap<String, String>;

/// Folders whose entries' names are kept at most (all forgotten past it, then made again).
const MAX_FOLDERS: usize = 1000;

/// The name of a file's entry: the md5 of `./` and its name as a `file://` URI spells it.
fn entry_name(file: &str) -> String {
    let uri = file_uri(std::path::Path::new(file));
    let rel = format!("./{}", uri.strip_prefix("file://").unwrap_or(&uri));
    let md5 = crate::api::checksum::Md5::digest(rel.as_bytes());
    format!("{}.png", crate::api::checksum::hex(&md5))
}

/// `Thumb::MTime` as tumbler compares it: seconds and microseconds of `t`, as GIO gives them.
fn tumbler_mtime(t: SystemTime) -> String {
    let ns = crate::api::time::time_to_ns(t);
    let (secs, sub) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    format!("{secs}.{:06}", sub / 1000)
}

/// The index into [`SIZES`] of the size named `dir`.
fn size_index(dir: &str) -> OpResult<usize> {
    SIZES
        .iter()
        .position(|(d, _)| *d == dir)
        .ok_or(Errno::ENOENT.into())
}

impl<B: Backend> VirtualDir<B> for SharedThumbs {
    fn name(&self) -> &'static str {
        virtual_names::SHARED_THUMBS
    }

    fn bit(&self) -> Ino {
        virtual_names::SHARED_THUMBS_BIT
    }

    /// Thumbnails off (`--no-thumbnails`): none here either.
    fn shown(&self, fs: &Fs<B>) -> bool {
        fs.opts.thumbnails.is_some()
    }

    fn dir_key<'a>(
        &'a self,
        _fs: &'a Arc<Fs<B>>,
        _folder: Ino,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        futures_util::future::ready(size_index(name).map(|_| name.to_string())).boxed()
    }

    fn leaf_key<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        _size: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        fs.shared_file_of(folder, name).boxed()
    }

    fn dir_time<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        _size: &'a str,
    ) -> BoxFuture<'a, OpResult<SystemTime>> {
        futures_util::future::ready(fs.folder_time(folder).ok_or(Errno::ENOENT.into())).boxed()
    }

    fn leaf_attr<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
        file: &'a str,
    ) -> BoxFuture<'a, OpResult<(u64, SystemTime)>> {
        async move {
            let (content, mtime) = fs.shared_entry(folder, size_index(dir)?, file).await?;
            Ok((content.len(), mtime))
        }
        .boxed()
    }

    /// The sizes.
    fn list<'a>(
        &'a self,
        _fs: &'a Arc<Fs<B>>,
        _folder: Ino,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        let sizes = SIZES.iter().map(|(d, _)| (d.to_string(), d.to_string()));
        futures_util::future::ready(Ok(sizes.collect())).boxed()
    }

    /// The entries of the folder's files of a kind thumbnailed (each made when looked up).
    fn list_dir<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        _size: &'a str,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let (_, _, files) = fs.shared_files(folder).await?;
            Ok(files
                .into_iter()
                .map(|f| {
                    let name = entry_name(&f);
                    (f, name)
                })
                .collect())
        }
        .boxed()
    }

    fn read<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
        file: &'a str,
        offset: u64,
        size: u32,
    ) -> BoxFuture<'a, OpResult<Vec<u8>>> {
        async move {
            let (content, _) = fs.shared_entry(folder, size_index(dir)?, file).await?;
            content.read(offset, size).await
        }
        .boxed()
    }
}

impl<B: Backend> Fs<B> {
    fn shared_names(&self) -> MutexGuard<'_, Names> {
        relock(&self.virtual_dirs.shared_thumbs.names)
    }

    /// The stored files of `folder` of a kind thumbnailed, and when its listing was fetched
    /// and its time.
    async fn shared_files(
        self: &Arc<Self>,
        folder: Ino,
    ) -> OpResult<(Instant, SystemTime, Vec<String>)> {
        let stored = self.stored_files(folder).await?.ok_or(Errno::ENOENT)?;
        let files = (stored.files.into_iter())
            .filter(|(name, _)| thumbnailed(name))
            .map(|(name, _)| name)
            .collect();
        Ok((stored.fetched, stored.mtime, files))
    }

    /// The file of `folder` whose entry is named `entry`.
    async fn shared_file_of(self: &Arc<Self>, folder: Ino, entry: &str) -> OpResult<String> {
        self.ensure_listing(folder).await?;
        let now = (self.nodes)
            .inode(folder, |dir| {
                dir.listing().map(|(fetched, _)| (*fetched, dir.mtime))
            })
            .ok_or(Errno::ENOENT)?;
        let kept = self.shared_names().get(&folder).cloned();
        let by_entry = match kept {
            Some((f, m, by_entry)) if Some((f, m)) == now => by_entry,
            _ => {
                let (fetched, mtime, files) = self.shared_files(folder).await?;
                let by_entry: ByEntry = files.into_iter().map(|f| (entry_name(&f), f)).collect();
                let by_entry = Arc::new(by_entry);
                let mut names = self.shared_names();
                if names.len() >= MAX_FOLDERS {
                    names.clear();
                }
                names.insert(folder, (fetched, mtime, by_entry.clone()));
                by_entry
            }
        };
        by_entry.get(entry).cloned().ok_or(Errno::ENOENT.into())
    }

    /// The entry of `file` of `folder` at size `k`, made from page one of its preview (kept in
    /// the read cache by the file's version and time); ENOENT while the preview is not ready.
    async fn shared_entry(
        self: &Arc<Self>,
        folder: Ino,
        k: usize,
        file: &str,
    ) -> OpResult<(Content, SystemTime)> {
        let (r, mtime) = self.preview_source(folder, file).await?;
        let meta = self.preview_meta(&r).await?;
        if meta.status != PreviewStatus::Ready || meta.pages.is_empty() {
            return Err(Errno::ENOENT.into());
        }
        let (dir, px) = SIZES[k];
        let stamp = tumbler_mtime(mtime);
        let key = format!("sh-thumb-{}-{dir}-{stamp}", r.id);
        let md5 = r.md5.as_deref();
        if let Some(e) = self.reads.cache.complete(&key, md5) {
            return Ok((Content::Cached(e), mtime));
        }
        let size = PageSize {
            scale: None,
            max_width: Some(px),
            max_height: Some(px),
        };
        let img = (self.backend.preview_page(&r.id, 1, size).await)?;
        let uri = format!("./{file}");
        let png =
            tokio::task::spawn_blocking(move || tagged_png(&img.data, px, &uri, &stamp, r.size))
                .await
                .map_err(|e| crate::fs::error::Error::bug(format!("making a thumbnail: {e}")))?
                .map_err(|e| {
                    log::debug!("no shared thumbnail of {file}: {e}");
                    Errno::ENOENT
                })?;
        let len = png.len() as u64;
        let body = futures_util::stream::once(async move { Ok(bytes::Bytes::from(png)) }).boxed();
        let entry = (self.reads.cache.fill(&key, md5, len, body).await)?;
        Ok((Content::Cached(entry), mtime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As libxfce4util's `xfce_create_shared_thumbnail_path` names them (the md5 of
    /// `./a%20b.pdf` for `a b.pdf`), and the time as tumbler reads it from GIO.
    #[test]
    fn entries_are_named_and_timed_as_tumbler_looks_for_them() {
        use crate::api::checksum::{Md5, hex};
        assert_eq!(
            entry_name("a b.pdf"),
            format!("{}.png", hex(&Md5::digest(b"./a%20b.pdf")))
        );
        assert_eq!(
            entry_name("x.pdf"),
            format!("{}.png", hex(&Md5::digest(b"./x.pdf")))
        );
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(tumbler_mtime(t), "1700000000.123456");
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 999);
        assert_eq!(tumbler_mtime(t), "1700000000.000000");
    }
}
