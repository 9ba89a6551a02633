//! One inode of the table: what the mount knows of a node (its path, kind, attributes, the
//! backend's last word on it, a folder's cached listing, a file's staged copy).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fuser::{FileAttr, FileType, INodeNo};

use super::Ino;
use super::{Backing, Kept};
use crate::api::{Base, Node, NodePath, NodeType, file_mode, whole_mode};
use crate::fs::staging::Staged;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InodeKind {
    Dir,
    File,
}

/// What the backend last said about a file. (Not its web links: asked for when read, as
/// `xattrs` does, rather than three URLs kept for every file listed.)
#[derive(Clone, Debug, Default)]
pub struct Remote {
    pub id: String,
    pub size: u64,
    pub md5: Option<String>,
}

impl Remote {
    /// Whether `node` (the backend's answer for this file) is the version known here: the
    /// same md5 and size.
    pub fn is_version(&self, node: &Node) -> bool {
        node.md5_checksum == self.md5 && node.size == Some(self.size)
    }
}

/// The document a new file continues (`history`): the stored file this mount renamed away from
/// the new file's name moments before.
#[derive(Clone, Debug)]
pub struct Continues {
    /// The renamed file's inode, and its file ID then.
    pub x: Ino,
    pub id: String,
    /// The name it left, which the new file took.
    pub name: NodePath,
    /// Where the renamed file is on the store after this mount removed its new name, and the
    /// version it knew there: the delete was handed to the new file, which takes the file
    /// back (or deletes it after all, if still that version).
    pub removed_at: Option<(NodePath, Base)>,
}

pub struct Inode {
    pub ino: Ino,
    pub path: NodePath,
    pub kind: InodeKind,
    /// Files known to the backend; `None` for a file that so far exists only here.
    pub remote: Option<Remote>,
    pub mtime: SystemTime,
    /// Files: the permission bits (of 0o777) a chmod or the create gave, kept by the backend
    /// like times. `None` until known (from the backend, or set here): an upload then leaves
    /// the stored ones as they are (a file whose upload resumes after a restart keeps them).
    pub perm: Option<u32>,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    pub atime: SystemTime,
    /// The time the store (or the cache dir) last gave it: a listing that gives it again leaves
    /// the times set here since as they are (a folder's, which the store does not keep; an
    /// atime). Reset to the store's at every listing, `touch -d` on a folder, or any atime, held
    /// only until the parent was listed again.
    pub store_time: Option<SystemTime>,
    /// Folders: times set here (`touch -d`, `rsync -a`, or by an entry made or removed here:
    /// `Table::entries_changed`), which the store does not keep for a folder. They stay while
    /// its entries do: the store's time moves as this mount's uploads into it land (after the
    /// set, as `rsync` sets a folder's time once its files are written), and that is no change
    /// to show. An entry made or removed elsewhere (`entries_changed_by_feed`,
    /// `entries_changed_elsewhere`) ends them.
    pub times_here: bool,
    /// When the attributes were last confirmed by the backend.
    pub fetched: Instant,
    /// The kernel's references (lookup count).
    pub lookups: u64,
    pub open_handles: u32,
    /// Directories: the cached listing (names to inodes) and when it was fetched.
    pub(super) listing: Option<(Instant, BTreeMap<String, Ino>)>,
    /// Directories: when a change made elsewhere last made the listing stale (`follow`): a
    /// listing asked for before that is stale as soon as it comes.
    pub(super) listing_expired: Option<Instant>,
    /// Directories: how many of the listed entries are folders (nlink), counted when first
    /// asked after a listing is set, then kept as entries come and go (`Table::count_subdirs`):
    /// a GETATTR after each change would otherwise walk the listing each time.
    pub(super) subdirs: Cell<Option<u32>>,
    /// Directories: the store has a real `.preview` here, hidden by the virtual one.
    pub hidden_preview: bool,
    /// Files with local changes, written or being uploaded.
    pub staged: Option<Arc<Staged>>,
    /// Serializes uploads and namespace changes of this node.
    pub io: Arc<tokio::sync::Mutex<()>>,
    /// md5 of the content the kernel may have in its page cache for this file.
    pub kernel_md5: Option<String>,
    /// md5 of the version last opened for reading here, or stored from here: what a whole
    /// rewrite (O_TRUNC, a save-by-rename over it) replaces (`Inode::base`).
    pub read_md5: Option<String>,
    /// Removed from the namespace while still open.
    pub unlinked: bool,
    /// Unlinked because the store no longer has it (deleted or moved elsewhere), not by a
    /// call here: the kernel may still hold its name for a moment, and an open through that
    /// name is refused with ESTALE, so that the kernel looks the name up again (an edit made
    /// there is a new file, never bytes written into a detached inode and dropped).
    pub gone_elsewhere: bool,
    /// Passthrough opens and the backing file they share (see `passthrough`). Boxed, as
    /// every part an inode rarely has: an inode is kept for every file listed.
    pub pt: Option<Box<Backing>>,
    /// Plain opens on their way (a writer staging its copy): no passthrough open starts meanwhile.
    pub plain_pending: u32,
    /// A new file that continues the document this mount renamed away from its name moments
    /// before it was made (`history`).
    pub continues: Option<Box<Continues>>,
    /// A new file made under the name of a stored file this mount deleted moments before:
    /// that file's ID. Before the first upload the deleted file is brought back where the
    /// store keeps it, and these bytes become its next version (`history`).
    pub revives: Option<String>,
    /// Last change made here to its name or existence (created, renamed, uploaded): a listing
    /// fetched before that does not know about it yet.
    pub touched: Instant,
}

impl Inode {
    pub(super) fn new(ino: Ino, path: NodePath, kind: InodeKind) -> Inode {
        let now = SystemTime::now();
        Inode {
            ino,
            path,
            kind,
            remote: None,
            mtime: now,
            perm: None,
            ctime: now,
            crtime: now,
            atime: now,
            store_time: None,
            times_here: false,
            fetched: Instant::now(),
            lookups: 0,
            open_handles: 0,
            listing: None,
            listing_expired: None,
            subdirs: Cell::new(None),
            hidden_preview: false,
            staged: None,
            io: Arc::new(tokio::sync::Mutex::new(())),
            kernel_md5: None,
            read_md5: None,
            unlinked: false,
            gone_elsewhere: false,
            pt: None,
            plain_pending: 0,
            continues: None,
            revives: None,
            touched: Instant::now(),
        }
    }

    /// Whether this inode changed here, or heard from the backend, at or after `t`: an answer
    /// of the backend to a request sent at `t` is older than what it holds.
    pub fn newer_than(&self, t: Instant) -> bool {
        self.touched >= t || self.fetched >= t
    }

    /// Directories: the cached listing (names to inodes) and when it was fetched.
    pub fn listing(&self) -> Option<&(Instant, BTreeMap<String, Ino>)> {
        self.listing.as_ref()
    }

    /// A listing fetched (or known to be empty) now.
    pub fn set_listing(&mut self, names: BTreeMap<String, Ino>) {
        self.listing = Some((Instant::now(), names));
        self.subdirs.set(None);
    }

    /// A listing fetched from the backend, asked for at `asked`: stale at once if a change made
    /// elsewhere expired it since (`past`, see `Table::expire_listing`).
    pub fn set_fetched_listing(
        &mut self,
        names: BTreeMap<String, Ino>,
        asked: Instant,
        past: Option<Instant>,
    ) {
        self.set_listing(names);
        if let (Some(e), Some(past)) = (self.listing_expired, past) {
            if e >= asked {
                self.listing = self.listing.take().map(|(_, n)| (past, n));
            }
        }
    }

    /// The names of a loaded listing, for a change made here (the subfolder count is the
    /// caller's to keep: `Table::unlist`, `Table::list`).
    pub(super) fn listing_mut(&mut self) -> Option<&mut BTreeMap<String, Ino>> {
        self.listing.as_mut().map(|(_, names)| names)
    }

    /// The size a reader sees: the staged copy's while there is one.
    pub fn size(&self) -> u64 {
        match (&self.staged, &self.remote) {
            (Some(s), _) => s.size(),
            (None, Some(r)) => r.size,
            (None, None) => 0,
        }
    }

    /// Attributes as the kernel sees them; `subdirs` counts a folder's subfolders (for nlink).
    pub(super) fn attr_with(&self, uid: u32, gid: u32, subdirs: u32) -> FileAttr {
        if let Some(s) = &self.staged {
            // Written by the kernel itself (passthrough): the file knows its size and time.
            s.observe();
        }
        let (kind, perm, nlink, size) = match self.kind {
            // A removed folder (or one renamed over) still open has no links left.
            InodeKind::Dir if self.unlinked => (FileType::Directory, 0o755, 0, 4096),
            InodeKind::Dir => (FileType::Directory, 0o755, 2 + subdirs, 4096),
            // An unlinked file that is still open has no name left.
            InodeKind::File => (
                FileType::RegularFile,
                self.perm.unwrap_or(0o644) as u16,
                u32::from(!self.unlinked),
                self.size(),
            ),
        };
        let mtime = match &self.staged {
            Some(s) => s.mtime(),
            None => self.mtime,
        };
        FileAttr {
            ino: INodeNo(self.ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.atime,
            mtime,
            ctime: self.ctime.max(mtime),
            crtime: self.crtime,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: 128 * 1024,
            flags: 0,
        }
    }

    /// Takes what a backend node says (and what the cache dir keeps of it where the backend
    /// keeps no attributes), keeping local changes that are not uploaded yet. Returns true
    /// when the file's content changed remotely.
    pub(super) fn update_from(&mut self, node: &Node, kept: Option<&Kept>) -> bool {
        self.fetched = Instant::now();
        if self.staged.is_none() {
            let t = kept.and_then(|k| k.mtime).or(node.modified_time());
            let moved = t.filter(|t| self.store_time != Some(*t));
            if let Some(t) = moved.filter(|_| !self.times_here) {
                self.store_time = Some(t);
                self.mtime = t;
                // The store keeps no ctime: a file known here keeps the time of its last change
                // here unless the store's time is later (a change elsewhere). Set to the store's
                // time at every listing, a file stored a moment ago had its ctime move back, and
                // `tar` reading it after `vaultfs sync` said "file changed as we read it".
                self.ctime = match (&self.kind, &self.remote) {
                    (InodeKind::File, Some(_)) => self.ctime.max(t),
                    _ => t,
                };
                self.atime = t;
            }
            // A backend that keeps no modes says none: the bits set here stay.
            if let Some(m) = kept.and_then(|k| k.mode).or(node.mode) {
                self.perm = Some(file_mode(m));
            }
        }
        if let Some(t) = node.created_time() {
            self.crtime = t;
        }
        if self.kind != InodeKind::File {
            return false;
        }
        let Some(id) = node.file_id() else {
            return false;
        };
        let changed = self
            .remote
            .as_ref()
            .is_some_and(|r| r.md5 != node.md5_checksum || r.size != node.size.unwrap_or(0));
        self.remote = Some(Remote {
            id,
            size: node.size.unwrap_or(0),
            md5: node.md5_checksum.clone(),
        });
        changed
    }
}

impl Inode {
    /// What bytes copied from the stored version replace (a write into them): the version the
    /// mount knows (no check where the backend gave no md5), or nothing for a name that is new
    /// here.
    pub fn known_base(&self) -> Base {
        match &self.remote {
            Some(r) => match (&r.md5, r.size) {
                (Some(md5), _) => Base::Md5(md5.clone()),
                // A file made (step 1) with no version yet, from a server that sends no md5 for
                // it: nothing stored, as empty as a new name (as "any", a delete of it would
                // take another writer's first version with it unchecked).
                (None, 0) => Base::Absent,
                // A server that sends no md5s: nothing to compare.
                (None, _) => Base::Any,
            },
            None => Base::Absent,
        }
    }

    /// What a whole rewrite replaces (O_TRUNC, a save-by-rename over it): the version last
    /// read or stored here (the bytes an editor has), else the one the mount knows.
    pub fn base(&self) -> Base {
        match (&self.read_md5, &self.remote) {
            (Some(read), Some(_)) => Base::Md5(read.clone()),
            _ => self.known_base(),
        }
    }

    /// What bytes put over this file replace, as this mount knew it: its staged copy's base
    /// while it has edits staged, else `base`.
    pub fn known_base_here(&self) -> Base {
        match &self.staged {
            Some(s) => s.base(),
            None => self.base(),
        }
    }
}

impl Inode {
    /// What the backend holds of this node, as this mount knows it (`None` for a file that
    /// exists only here).
    pub(super) fn as_node(&self) -> Option<Node> {
        let mut n = Node {
            name: self.path.name()?.to_string(),
            uri: self.path.uri(),
            modified_on: Some(crate::api::format_time(self.mtime)),
            created_on: Some(crate::api::format_time(self.crtime)),
            ..Node::default()
        };
        match self.kind {
            InodeKind::Dir => n.node_type = NodeType::FolderNodeType,
            InodeKind::File => {
                let r = self.remote.as_ref()?;
                n.node_type = NodeType::FileNodeType;
                n.id = Some(r.id.clone());
                n.size = Some(r.size);
                n.md5_checksum = r.md5.clone();
                n.mode = self.perm.map(whole_mode);
            }
        }
        Some(n)
    }
}

pub fn kind_of(node: &Node) -> InodeKind {
    if node.node_type == NodeType::FileNodeType {
        InodeKind::File
    } else {
        InodeKind::Dir
    }
}
