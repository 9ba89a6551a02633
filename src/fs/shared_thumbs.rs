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
//! Like `.preview` (see `preview`), `.sh_thumbnails` is reached by name, never listed in its
//! folder, so tools walking trees (`find`, `cp -r`, `rsync`, backups) never meet it, and GIO and
//! KIO, which do not look there, are not told anything new. Nothing in it can be made, changed or
//! removed (EROFS). Its inodes carry the preview module's flag and [`TFLAG`] besides.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType};
use futures_util::StreamExt;

use super::Fs;
use super::errno::errno;
use super::preview::{Content, VirtualInos};
use super::table::{Ino, InodeKind};
use super::thumbnails::{SIZES, file_uri, tagged_png, thumbnailed};
use crate::api::{PageSize, PreviewStatus};
use crate::backend::Backend;
use crate::sync::relock;

/// The name of the virtual directory.
pub const DIR_NAME: &str = super::virtual_names::SHARED_THUMBS;
/// Set, beside the preview module's flag, in every inode of the `.sh_thumbnails` trees (the
/// other trees' are bits 59 to 61: each tree's own counter never gets that far).
const TFLAG: Ino = super::virtual_names::FLAG | super::virtual_names::SHARED_THUMBS_BIT;

/// Whether `ino` is a node of a `.sh_thumbnails` tree.
pub fn owns(ino: Ino) -> bool {
    ino & TFLAG == TFLAG
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Node {
    /// `<folder>/.sh_thumbnails`
    Root(Ino),
    /// `<folder>/.sh_thumbnails/<size>`: an index into [`SIZES`].
    Size(Ino, usize),
    /// `<folder>/.sh_thumbnails/<size>/<md5>.png`, of the file named.
    Entry(Ino, usize, String),
}

#[derive(Default)]
pub struct Tree {
    ids: VirtualInos<Node, TFLAG>,
    /// By folder: its files by their entries' names, as its listing was (fetched at, folder
    /// time): made once a listing, not for each lookup (tumbler looks up every file's).
    names: HashMap<Ino, (Instant, SystemTime, Arc<ByEntry>)>,
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

impl<B: Backend> Fs<B> {
    fn shared_tree(&self) -> MutexGuard<'_, Tree> {
        relock(&self.virtual_dirs.shared_thumbs)
    }

    fn shared_folder_time(&self, folder: Ino) -> Result<SystemTime, Errno> {
        let t = self.table();
        t.get(folder).map(|i| i.mtime).ok_or(Errno::ENOENT)
    }

    /// The stored files of `folder` of a kind thumbnailed, and when its listing was fetched
    /// and its time.
    async fn shared_files(
        self: &Arc<Self>,
        folder: Ino,
    ) -> Result<(Instant, SystemTime, Vec<String>), Errno> {
        self.ensure_listing(folder).await?;
        let t = self.table();
        let dir = t.get(folder).ok_or(Errno::ENOENT)?;
        let (fetched, names) = dir.listing().ok_or(Errno::ENOENT)?;
        let files = (names.iter())
            .filter(|(name, c)| {
                thumbnailed(name)
                    && t.get(**c)
                        .is_some_and(|c| c.kind == InodeKind::File && c.remote.is_some())
            })
            .map(|(name, _)| name.clone())
            .collect();
        Ok((*fetched, dir.mtime, files))
    }

    /// The file of `folder` whose entry is named `entry`.
    async fn shared_file_of(self: &Arc<Self>, folder: Ino, entry: &str) -> Result<String, Errno> {
        self.ensure_listing(folder).await?;
        let now = {
            let t = self.table();
            let dir = t.get(folder).ok_or(Errno::ENOENT)?;
            dir.listing().map(|(fetched, _)| (*fetched, dir.mtime))
        };
        let kept = self.shared_tree().names.get(&folder).cloned();
        let by_entry = match kept {
            Some((f, m, by_entry)) if Some((f, m)) == now => by_entry,
            _ => {
                let (fetched, mtime, files) = self.shared_files(folder).await?;
                let by_entry: ByEntry = files.into_iter().map(|f| (entry_name(&f), f)).collect();
                let by_entry = Arc::new(by_entry);
                let mut tree = self.shared_tree();
                if tree.names.len() >= MAX_FOLDERS {
                    tree.names.clear();
                }
                tree.names
                    .insert(folder, (fetched, mtime, by_entry.clone()));
                by_entry
            }
        };
        by_entry.get(entry).cloned().ok_or(Errno::ENOENT)
    }

    /// The entry of `file` of `folder` at size `k`, made from page one of its preview (kept in
    /// the read cache by the file's version and time); ENOENT while the preview is not ready.
    async fn shared_entry(
        self: &Arc<Self>,
        folder: Ino,
        k: usize,
        file: &str,
    ) -> Result<(Content, SystemTime), Errno> {
        let (r, mtime) = self.preview_source(folder, file).await?;
        let meta = self.preview_meta(&r).await?;
        if meta.status != PreviewStatus::Ready || meta.pages.is_empty() {
            return Err(Errno::ENOENT);
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
        let img = (self.backend.preview_page(&r.id, 1, size).await).map_err(|e| errno(&e))?;
        let uri = format!("./{file}");
        let png =
            tokio::task::spawn_blocking(move || tagged_png(&img.data, px, &uri, &stamp, r.size))
                .await
                .map_err(|_| Errno::EIO)?
                .map_err(|e| {
                    log::debug!("no shared thumbnail of {file}: {e}");
                    Errno::ENOENT
                })?;
        let len = png.len() as u64;
        let body = futures_util::stream::once(async move { Ok(bytes::Bytes::from(png)) }).boxed();
        let entry = (self.reads.cache.fill(&key, md5, len, body).await).map_err(|e| errno(&e))?;
        Ok((Content::Cached(entry), mtime))
    }

    pub(super) async fn shared_getattr(self: &Arc<Self>, ino: Ino) -> Result<FileAttr, Errno> {
        let node = self.shared_tree().ids.node(ino).ok_or(Errno::ENOENT)?;
        match node {
            Node::Root(folder) | Node::Size(folder, _) => {
                Ok(self.virtual_attr(ino, true, 0, self.shared_folder_time(folder)?))
            }
            Node::Entry(folder, k, file) => {
                let (content, mtime) = self.shared_entry(folder, k, &file).await?;
                Ok(self.virtual_attr(ino, false, content.len(), mtime))
            }
        }
    }

    /// Lookup of `name` in a `.sh_thumbnails` directory, or of `.sh_thumbnails` in a folder.
    pub(super) async fn shared_lookup(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
    ) -> Result<FileAttr, Errno> {
        let known = self.shared_tree().ids.node(parent);
        let node = match known {
            // Thumbnails off (`--no-thumbnails`): none here either.
            None if owns(parent) || self.opts.thumbnails.is_none() => return Err(Errno::ENOENT),
            None => match self.table().get(parent).map(|i| i.kind) {
                Some(InodeKind::Dir) => Node::Root(parent),
                Some(InodeKind::File) => return Err(Errno::ENOTDIR),
                None => return Err(Errno::ENOENT),
            },
            Some(Node::Root(folder)) => {
                let k = SIZES.iter().position(|(d, _)| *d == name);
                Node::Size(folder, k.ok_or(Errno::ENOENT)?)
            }
            Some(Node::Size(folder, k)) => {
                Node::Entry(folder, k, self.shared_file_of(folder, name).await?)
            }
            Some(Node::Entry(..)) => return Err(Errno::ENOTDIR),
        };
        let ino = self.shared_tree().ids.ino(node);
        self.shared_getattr(ino).await
    }

    /// The entries of a `.sh_thumbnails` directory: its sizes; in a size's, the entries of the
    /// folder's files of a kind thumbnailed (each made when looked up).
    pub(super) async fn shared_readdir(
        self: &Arc<Self>,
        ino: Ino,
    ) -> Result<Vec<(Ino, FileType, String)>, Errno> {
        let node = self.shared_tree().ids.node(ino).ok_or(Errno::ENOENT)?;
        let mut out = vec![(ino, FileType::Directory, ".".to_string())];
        match node {
            Node::Root(folder) => {
                out.push((folder, FileType::Directory, "..".into()));
                let mut tree = self.shared_tree();
                for (k, (dir, _)) in SIZES.iter().enumerate() {
                    let c = tree.ids.ino(Node::Size(folder, k));
                    out.push((c, FileType::Directory, dir.to_string()));
                }
            }
            Node::Size(folder, k) => {
                let root = self.shared_tree().ids.ino(Node::Root(folder));
                out.push((root, FileType::Directory, "..".into()));
                let (_, _, files) = self.shared_files(folder).await?;
                let mut tree = self.shared_tree();
                for file in files {
                    let name = entry_name(&file);
                    let c = tree.ids.ino(Node::Entry(folder, k, file));
                    out.push((c, FileType::RegularFile, name));
                }
            }
            Node::Entry(..) => return Err(Errno::ENOTDIR),
        }
        Ok(out)
    }

    /// Opening an entry: reading only.
    pub(super) fn shared_open(&self, ino: Ino, write: bool) -> Result<fuser::FopenFlags, Errno> {
        match self.shared_tree().ids.node(ino) {
            None => Err(Errno::ENOENT),
            Some(Node::Root(_) | Node::Size(..)) => Err(Errno::EISDIR),
            Some(_) if write => Err(Errno::EROFS),
            Some(_) => Ok(fuser::FopenFlags::empty()),
        }
    }

    pub(super) async fn shared_read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let Some(Node::Entry(folder, k, file)) = self.shared_tree().ids.node(ino) else {
            return Err(Errno::EISDIR);
        };
        self.shared_entry(folder, k, &file)
            .await?
            .0
            .read(offset, size)
            .await
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
