//! The virtual folders of every folder (docs/design.md §3), each a [`VirtualDir`]: `.preview`
//! (`preview`: page images, thumbnails and a PDF of each file), `.versions` (`versions`: each
//! file's earlier versions), `.search` (`search`: the files found for a query) and
//! `.sh_thumbnails` (`shared_thumbs`: Thunar's shared thumbnails); and the router the request
//! logic asks whether an inode or a name is virtual, and then for the answer. The marker files of
//! the root (`markers`) are virtual too: the router hands their inodes to `markers`.
//!
//! Each is reached by name and never listed in its folder, as NetApp's `.snapshot` is: `cp -r`,
//! `rm -r`, `find`, `du`, `git add -A` and backup tools walk trees through listings and would
//! otherwise render, copy, index or try to delete what they pass. A real node stored under the
//! name is hidden by the virtual one and never listed, changed or deleted; nothing can be made,
//! changed or removed in them (EROFS, `namespace`).
//!
//! Every virtual folder is a tree of three levels: the virtual folder of a folder
//! ([`Node::Root`]), the folders in it ([`Node::Dir`]: a file's previews or versions, a query, a
//! thumbnail size) and their entries ([`Node::Leaf`], read-only files). A [`VirtualDir`] says
//! what its folders and entries are, by keys that name them for as long as they live; the router
//! does the rest once for all of them: the inode numbers (each node's first time handed to the
//! kernel, never reused; [`virtual_names::FLAG`] and the folder's bit set, so they never meet the
//! inode table's), the lookups, `.` and `..`, and the refusals (ENOTDIR, EISDIR, EROFS).
//!
//! These modules sit above the inode table and the read cache, which they use; nothing below
//! them imports them (what lower modules need to know of virtual nodes is in `virtual_names`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType, FopenFlags};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use crate::backend::Backend;
use crate::fs::cache::CachedFile;
use crate::fs::error::Error as FsError;
use crate::fs::table::{Ino, InodeKind, Remote};
use crate::fs::{Fs, OpResult, virtual_names};
use crate::sync::relock;

mod preview;
mod search;
mod shared_thumbs;
mod versions;

// The request logic asks the router, not the folders or the names below them.
pub(super) use virtual_names::{is_virtual, is_virtual_name};

/// A virtual folder: its name, and what the folders and entries in it are. Keys name a folder
/// or an entry of the virtual folder of `folder`, as [`Node`] holds them; the router calls
/// these only with keys they gave (from a lookup or a listing).
pub(super) trait VirtualDir<B: Backend>: Send + Sync {
    /// Its name in every folder (one of `virtual_names`).
    fn name(&self) -> &'static str;
    /// The bit its inode numbers carry beside [`virtual_names::FLAG`].
    fn bit(&self) -> Ino;
    /// Whether the folders have it (an option may leave it out).
    fn shown(&self, _fs: &Fs<B>) -> bool {
        true
    }
    /// LOOKUP of `name` in the virtual folder of `folder`: the key of the folder it names
    /// (by default the name itself: any name is a folder, found or not when listed).
    fn dir_key<'a>(
        &'a self,
        _fs: &'a Arc<Fs<B>>,
        _folder: Ino,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        futures_util::future::ready(Ok(name.to_string())).boxed()
    }
    /// LOOKUP of `name` in the folder `dir`: the key of the entry it names.
    fn leaf_key<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>>;
    /// GETATTR of the folder `dir`: its time, or why it is not there.
    fn dir_time<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
    ) -> BoxFuture<'a, OpResult<SystemTime>>;
    /// GETATTR of the entry `leaf`: its size and time.
    fn leaf_attr<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
        leaf: &'a str,
    ) -> BoxFuture<'a, OpResult<(u64, SystemTime)>>;
    /// READDIR of the virtual folder: the folders in it, as (key, name).
    fn list<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>>;
    /// READDIR of the folder `dir`: its entries, as (key, name), in the order shown.
    fn list_dir<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>>;
    /// OPEN of the entry `leaf` for reading (writing is EROFS): the flags the kernel gets.
    fn open_flags(&self, _leaf: &str) -> FopenFlags {
        FopenFlags::empty()
    }
    /// READ of `size` bytes at `offset` of the entry `leaf` (short at the end).
    fn read<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        dir: &'a str,
        leaf: &'a str,
        offset: u64,
        size: u32,
    ) -> BoxFuture<'a, OpResult<Vec<u8>>>;
}

/// A virtual node, in the virtual folder of the folder `Ino`.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Node {
    /// `<folder>/.name`
    Root(Ino),
    /// `<folder>/.name/<dir>`, by the folder's key.
    Dir(Ino, String),
    /// `<folder>/.name/<dir>/<entry>`, by the folder's key and the entry's.
    Leaf(Ino, String, String),
}

/// How many kinds of virtual folder there are ([`VirtualDirs::all`]).
const KINDS: usize = 4;

/// The virtual nodes handed to the kernel, each with its kind (its folder's place in
/// [`VirtualDirs::all`]).
#[derive(Default)]
struct Inos {
    inos: HashMap<(usize, Node), Ino>,
    nodes: HashMap<Ino, (usize, Node)>,
    /// The last number each kind gave.
    last: [u64; KINDS],
}

impl Inos {
    fn ino(&mut self, kind: usize, bit: Ino, node: Node) -> Ino {
        let key = (kind, node);
        if let Some(&ino) = self.inos.get(&key) {
            return ino;
        }
        self.last[kind] += 1;
        let ino = virtual_names::FLAG | bit | self.last[kind];
        self.inos.insert(key.clone(), ino);
        self.nodes.insert(ino, key);
        ino
    }
}

/// The virtual folders' part of the mount: the nodes handed to the kernel, and each folder's
/// own state (what it fetched and keeps a while).
#[derive(Default)]
pub(super) struct VirtualDirs {
    inos: Mutex<Inos>,
    previews: preview::Previews,
    versions: versions::Versions,
    searches: search::Searches,
    shared_thumbs: shared_thumbs::SharedThumbs,
}

impl VirtualDirs {
    /// Every virtual folder; its place here is its kind.
    fn all<B: Backend>(&self) -> [&dyn VirtualDir<B>; KINDS] {
        [
            &self.previews,
            &self.versions,
            &self.searches,
            &self.shared_thumbs,
        ]
    }
}

/// What a virtual file holds.
enum Content {
    Bytes(Vec<u8>),
    Cached(Arc<CachedFile>),
}

impl Content {
    fn len(&self) -> u64 {
        match self {
            Content::Bytes(b) => b.len() as u64,
            Content::Cached(e) => e.size,
        }
    }

    /// READ of `size` bytes at `offset` (short at the end).
    async fn read(&self, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        match self {
            Content::Bytes(b) => {
                let start = (offset as usize).min(b.len());
                let end = start.saturating_add(size as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
            Content::Cached(e) => e
                .read_cached(offset, size as usize)
                .await
                .map_err(FsError::from),
        }
    }
}

/// A folder's stored files (uploaded: files waiting for upload have no previews or versions
/// yet), as its listing has them.
struct StoredFiles {
    /// When the listing was fetched.
    fetched: Instant,
    /// The folder's time.
    mtime: SystemTime,
    /// By name, in the listing's order.
    files: Vec<(String, Remote)>,
}

impl<B: Backend> Fs<B> {
    /// The attributes of a virtual node.
    pub(super) fn virtual_attr(
        &self,
        ino: Ino,
        dir: bool,
        size: u64,
        time: SystemTime,
    ) -> FileAttr {
        virtual_names::attr(ino, dir, size, time, self.uid, self.gid)
    }

    /// Whether a LOOKUP of `name` in `parent` may be a virtual node's (then it is not
    /// answered from the folder's listing alone).
    pub(super) fn maybe_virtual(&self, parent: Ino, name: &str) -> bool {
        is_virtual(parent) || is_virtual_name(name) || self.maybe_marker(parent, name)
    }

    /// LOOKUP of `name` in `parent`, where a virtual node answers it; None: a real node's.
    pub(super) async fn virtual_lookup(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
    ) -> Option<OpResult<FileAttr>> {
        if self.maybe_marker(parent, name) {
            // A real file of the name is shown instead.
            return (self.is_marker(parent, name).await).then(|| self.marker_lookup(name));
        }
        if !is_virtual(parent) && !is_virtual_name(name) {
            return None;
        }
        Some(self.route_lookup(parent, name).await)
    }

    fn virtual_node(&self, ino: Ino) -> Option<(usize, Node)> {
        relock(&self.virtual_dirs.inos).nodes.get(&ino).cloned()
    }

    fn virtual_ino(&self, kind: usize, node: Node) -> Ino {
        let bit = self.virtual_dirs.all::<B>()[kind].bit();
        relock(&self.virtual_dirs.inos).ino(kind, bit, node)
    }

    /// Lookup of `name` in a virtual folder, or of a virtual folder's name in a real one.
    async fn route_lookup(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<FileAttr> {
        let all = self.virtual_dirs.all::<B>();
        let (kind, node) = match self.virtual_node(parent) {
            None if is_virtual(parent) => return Err(Errno::ENOENT.into()),
            None => {
                let kind = (all.iter().position(|d| d.name() == name)).ok_or(Errno::ENOENT)?;
                if !all[kind].shown(self) {
                    return Err(Errno::ENOENT.into());
                }
                match self.nodes.kind(parent) {
                    Some(InodeKind::Dir) => (kind, Node::Root(parent)),
                    Some(InodeKind::File) => return Err(Errno::ENOTDIR.into()),
                    None => return Err(Errno::ENOENT.into()),
                }
            }
            Some((kind, Node::Root(folder))) => {
                let dir = all[kind].dir_key(self, folder, name).await?;
                (kind, Node::Dir(folder, dir))
            }
            Some((kind, Node::Dir(folder, dir))) => {
                let leaf = all[kind].leaf_key(self, folder, &dir, name).await?;
                (kind, Node::Leaf(folder, dir, leaf))
            }
            Some((_, Node::Leaf(..))) => return Err(Errno::ENOTDIR.into()),
        };
        let ino = self.virtual_ino(kind, node);
        self.virtual_getattr(ino).await
    }

    /// GETATTR of a virtual node.
    pub(super) async fn virtual_getattr(self: &Arc<Self>, ino: Ino) -> OpResult<FileAttr> {
        if super::markers::owns(ino) {
            return self.marker_getattr(ino);
        }
        let (kind, node) = self.virtual_node(ino).ok_or(Errno::ENOENT)?;
        let folder = self.virtual_dirs.all::<B>()[kind];
        match node {
            Node::Root(f) => {
                Ok(self.virtual_attr(ino, true, 0, self.folder_time(f).ok_or(Errno::ENOENT)?))
            }
            Node::Dir(f, dir) => {
                let time = folder.dir_time(self, f, &dir).await?;
                Ok(self.virtual_attr(ino, true, 0, time))
            }
            Node::Leaf(f, dir, leaf) => {
                let (size, time) = folder.leaf_attr(self, f, &dir, &leaf).await?;
                Ok(self.virtual_attr(ino, false, size, time))
            }
        }
    }

    /// READDIR of a virtual folder: `.`, `..` and what the folder lists.
    pub(super) async fn virtual_readdir(
        self: &Arc<Self>,
        ino: Ino,
    ) -> OpResult<Vec<(Ino, FileType, String)>> {
        if super::markers::owns(ino) {
            return Err(Errno::ENOTDIR.into());
        }
        let (kind, node) = self.virtual_node(ino).ok_or(Errno::ENOENT)?;
        let folder = self.virtual_dirs.all::<B>()[kind];
        let mut out = vec![(ino, FileType::Directory, ".".to_string())];
        match node {
            Node::Root(f) => {
                out.push((f, FileType::Directory, "..".into()));
                let dirs = folder.list(self, f).await?;
                let mut inos = relock(&self.virtual_dirs.inos);
                for (dir, name) in dirs {
                    let c = inos.ino(kind, folder.bit(), Node::Dir(f, dir));
                    out.push((c, FileType::Directory, name));
                }
            }
            Node::Dir(f, dir) => {
                let root = self.virtual_ino(kind, Node::Root(f));
                out.push((root, FileType::Directory, "..".into()));
                let leaves = folder.list_dir(self, f, &dir).await?;
                let mut inos = relock(&self.virtual_dirs.inos);
                for (leaf, name) in leaves {
                    let c = inos.ino(kind, folder.bit(), Node::Leaf(f, dir.clone(), leaf));
                    out.push((c, FileType::RegularFile, name));
                }
            }
            Node::Leaf(..) => return Err(Errno::ENOTDIR.into()),
        }
        Ok(out)
    }

    /// OPEN of a virtual node: reading only.
    pub(super) fn virtual_open(&self, ino: Ino, write: bool) -> OpResult<FopenFlags> {
        if super::markers::owns(ino) {
            return if write {
                Err(Errno::EROFS.into())
            } else {
                Ok(FopenFlags::empty())
            };
        }
        match self.virtual_node(ino) {
            None => Err(Errno::ENOENT.into()),
            Some((_, Node::Root(_) | Node::Dir(..))) => Err(Errno::EISDIR.into()),
            Some(_) if write => Err(Errno::EROFS.into()),
            Some((kind, Node::Leaf(_, _, leaf))) => {
                Ok(self.virtual_dirs.all::<B>()[kind].open_flags(&leaf))
            }
        }
    }

    /// READ of a virtual file.
    pub(super) async fn virtual_read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> OpResult<Vec<u8>> {
        if super::markers::owns(ino) {
            return Ok(Vec::new());
        }
        let Some((kind, Node::Leaf(f, dir, leaf))) = self.virtual_node(ino) else {
            return Err(Errno::EISDIR.into());
        };
        let folder = self.virtual_dirs.all::<B>()[kind];
        folder.read(self, f, &dir, &leaf, offset, size).await
    }

    /// The stored file `name` of `folder`: its version, time and path.
    async fn stored_file(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> OpResult<(Remote, SystemTime, crate::api::NodePath)> {
        let ino = self.child(folder, name).await?.ok_or(Errno::ENOENT)?;
        let stored = self.nodes.inode(ino, |i| match (&i.kind, &i.remote) {
            (InodeKind::File, Some(r)) => Some((r.clone(), i.mtime, i.path.clone())),
            _ => None,
        });
        Ok(stored.flatten().ok_or(Errno::ENOENT)?)
    }

    /// The stored files of `folder`, its listing fetched first if it is not fresh; None where
    /// the folder or its listing went meanwhile.
    async fn stored_files(self: &Arc<Self>, folder: Ino) -> OpResult<Option<StoredFiles>> {
        self.ensure_listing(folder).await?;
        Ok(self.nodes.read(|t| {
            let dir = t.get(folder)?;
            let (fetched, names) = dir.listing()?;
            let files = (names.iter())
                .filter_map(|(name, c)| {
                    let i = t.get(*c)?;
                    (i.kind == InodeKind::File).then(|| Some((name.clone(), i.remote.clone()?)))?
                })
                .collect();
            Some(StoredFiles {
                fetched: *fetched,
                mtime: dir.mtime,
                files,
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::backend::Backend;
    use crate::backend::local::LocalBackend;
    use crate::fs::table::ROOT;

    /// The router tells the folders apart by name (a lookup in a real folder) and by inode
    /// (everything below): each needs a reserved name and a bit of its own.
    #[test]
    fn each_virtual_folder_has_a_reserved_name_and_a_bit_of_its_own() {
        let dirs = VirtualDirs::default();
        let all = dirs.all::<LocalBackend>();
        let names: HashSet<&str> = all.iter().map(|d| d.name()).collect();
        assert_eq!(names.len(), KINDS);
        assert!(names.iter().all(|n| is_virtual_name(n)));
        let bits: HashSet<Ino> = all.iter().map(|d| d.bit()).collect();
        assert_eq!(bits.len(), KINDS);
        let taken = virtual_names::FLAG | virtual_names::MARKERS_BIT;
        assert!(bits.iter().all(|b| b & taken == 0 && b.count_ones() <= 1));
    }

    /// What the router answers for every folder alike: numbers kept, `.` and `..`, and the
    /// refusals, here through `.versions` (a file with an earlier version), `.search`, the
    /// `.sh_thumbnails` of a mount without thumbnails, and a marker file. Over the built-in
    /// store itself (the tests' `Faulty` keeps no versions).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_router_answers_lookups_listings_opens_and_reads_of_virtual_nodes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::Store::open_local(&tmp.path().join("d")).unwrap());
        let local = LocalBackend::new(store);
        let vault = crate::api::NodePath::from_segments(["Local", "My First Vault"]).unwrap();
        let id = local.create_file(&vault, "a.txt").await.unwrap().file_id();
        let id = id.unwrap();
        for data in [&b"one"[..], b"two"] {
            let ticket = local.begin_version(&id, 3, None).await.unwrap();
            let body: crate::backend::ByteStream = Box::pin(futures_util::stream::once(
                futures_util::future::ready(Ok(bytes::Bytes::from_static(data))),
            ));
            let vid = ticket.version_id().unwrap();
            local.upload(&id, &vid, 3, body).await.unwrap();
        }
        let opts = crate::fs::MountOptions {
            root: vault,
            cache_dir: tmp.path().join("cache"),
            ..crate::fs::MountOptions::default()
        };
        let fs = Fs::start(local, opts, tokio::runtime::Handle::current()).unwrap();
        let read_all = |ino| fs.read(ino, 0, 1 << 20);
        let file = fs.lookup(ROOT, "a.txt").await.unwrap().ino.0;
        let dir_of = |e: Vec<(Ino, FileType, String)>| -> Vec<(FileType, String)> {
            e.into_iter().map(|(_, k, n)| (k, n)).collect()
        };

        let root = fs.lookup(ROOT, ".versions").await.unwrap();
        assert!(is_virtual(root.ino.0) && root.kind == FileType::Directory);
        assert_eq!(fs.lookup(ROOT, ".versions").await.unwrap().ino, root.ino);
        assert_eq!(
            fs.lookup(file, ".versions").await.err().map(|e| e.errno()),
            Some(Errno::ENOTDIR)
        );
        let root = root.ino.0;
        let listed = dir_of(fs.readdir_snapshot(root).await.unwrap());
        assert_eq!(listed[2..], [(FileType::Directory, "a.txt".to_string())]);
        assert_eq!(
            fs.lookup(root, "b.txt").await.err().map(|e| e.errno()),
            Some(Errno::ENOENT)
        );
        let dir = fs.lookup(root, "a.txt").await.unwrap().ino.0;
        let entries = fs.readdir_snapshot(dir).await.unwrap();
        assert_eq!((entries[0].0, entries[1].0), (dir, root));
        let [.., (_, FileType::RegularFile, name)] = &entries[..] else {
            panic!("no version listed: {entries:?}");
        };
        let leaf = fs.lookup(dir, name).await.unwrap();
        assert_eq!((leaf.size, leaf.perm), (3, 0o444));
        let leaf = leaf.ino.0;
        assert_eq!(fs.virtual_open(leaf, true), Err(Errno::EROFS.into()));
        assert_eq!(
            fs.virtual_open(leaf, false),
            Ok(FopenFlags::FOPEN_KEEP_CACHE)
        );
        assert_eq!(fs.virtual_open(dir, false), Err(Errno::EISDIR.into()));
        assert_eq!(read_all(leaf).await.as_deref(), Ok(&b"one"[..]));
        assert_eq!(read_all(dir).await, Err(Errno::EISDIR.into()));
        assert_eq!(
            fs.lookup(leaf, "x").await.err().map(|e| e.errno()),
            Some(Errno::ENOTDIR)
        );
        assert_eq!(
            fs.readdir_snapshot(leaf).await.err().map(|e| e.errno()),
            Some(Errno::ENOTDIR)
        );
        let unknown = virtual_names::FLAG | 999_999;
        assert_eq!(
            fs.getattr(unknown).await.err().map(|e| e.errno()),
            Some(Errno::ENOENT)
        );
        assert_eq!(
            fs.lookup(unknown, "x").await.err().map(|e| e.errno()),
            Some(Errno::ENOENT)
        );

        let search = fs.lookup(ROOT, ".search").await.unwrap().ino.0;
        let listed = dir_of(fs.readdir_snapshot(search).await.unwrap());
        assert_eq!(
            listed,
            [
                (FileType::Directory, ".".into()),
                (FileType::Directory, "..".into())
            ]
        );
        let no_thumbnails = fs.lookup(ROOT, ".sh_thumbnails").await;
        assert_eq!(no_thumbnails.err().map(|e| e.errno()), Some(Errno::ENOENT));

        let marker = fs.lookup(ROOT, ".nomedia").await.unwrap();
        assert_eq!((marker.size, marker.kind), (0, FileType::RegularFile));
        let marker = marker.ino.0;
        assert_eq!(fs.virtual_open(marker, true), Err(Errno::EROFS.into()));
        assert_eq!(read_all(marker).await, Ok(Vec::new()));
        assert_eq!(
            fs.readdir_snapshot(marker).await.err().map(|e| e.errno()),
            Some(Errno::ENOTDIR)
        );
    }
}
