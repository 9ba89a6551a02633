//! The inode table: inode numbers for paths, the attributes the backend last told us, cached
//! directory listings, and the staged (locally written) state of files. Inode numbers are never
//! reused, so a stale kernel reference can never reach another file.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr};

use super::staging::Staged;
use crate::api::{Node, NodePath};

pub type Ino = u64;
pub const ROOT: Ino = 1;

mod backing;
mod feed;
mod inode;
mod kept;
mod merge;
mod vacated;
pub use backing::Backing;
pub use feed::{Effects, Kernel, Told};
pub use inode::{Continues, Inode, InodeKind, Remote, kind_of};
pub use kept::{Kept, KeptHere};
pub use merge::Merged;

pub struct Table {
    /// Boxed: growing the map moves 16 bytes an inode, not the inode (at 100,000 files the
    /// old and new maps of whole inodes were 130 MB at once).
    inodes: HashMap<Ino, Box<Inode>>,
    by_path: HashMap<NodePath, Ino>,
    next: Ino,
    /// Files with a staged copy (for merging into listings fetched from the backend).
    staged: HashSet<Ino>,
    /// Paths removed or renamed away here, and when: a listing fetched before that still shows
    /// them.
    removed: HashMap<NodePath, Instant>,
    /// When `removed` was last pruned.
    removed_pruned: Instant,
    /// Files created, renamed or uploaded here lately, and when (see `local_children`).
    recent: HashMap<Ino, Instant>,
    /// When `recent` was last pruned.
    recent_pruned: Instant,
    /// Folders whose entries changed here since the offline snapshot last took them
    /// (`snapshot_due`).
    snapshot_due: HashSet<Ino>,
    /// Large folders the snapshot took lately, and until when it leaves them be
    /// (`SNAPSHOT_REST_PER_ENTRY`).
    snapshot_resting: HashMap<Ino, Instant>,
    /// Renames and deletes of this mount under way (sent, not answered), by node: the change
    /// feed can tell of one before its answer comes (`follow::Ours`).
    in_flight: HashMap<Ino, u32>,
    /// Names this mount is making on the store (a folder, a rename's destination), sent and
    /// not answered: the feed's word of one may come before its answer is in the table.
    names_in_flight: HashMap<NodePath, u32>,
    /// Attributes kept here for a backend that does not keep them.
    pub kept: KeptHere,
    /// Names stored files were renamed away from lately, and the new files that took them
    /// (`vacated.rs`).
    vacated: vacated::Vacated,
}

/// A folder the offline snapshot took rests this long for each entry before it is taken again:
/// taking it costs its every entry (a node each, written whole), so a folder of 100,000 files
/// filled over minutes is written every 25 s rather than every 2 s, and the snapshot's share
/// of the mount's time stays the same at any size.
const SNAPSHOT_REST_PER_ENTRY: std::time::Duration = std::time::Duration::from_micros(250);

/// How long removals are remembered (longer than any listing takes to fetch).
const REMOVED_MEMORY: std::time::Duration = std::time::Duration::from_secs(120);

impl Table {
    pub fn new(root: NodePath) -> Table {
        let mut t = Table {
            inodes: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
            staged: HashSet::new(),
            removed: HashMap::new(),
            removed_pruned: Instant::now(),
            recent: HashMap::new(),
            recent_pruned: Instant::now(),
            in_flight: HashMap::new(),
            names_in_flight: HashMap::new(),
            snapshot_due: HashSet::new(),
            snapshot_resting: HashMap::new(),
            kept: KeptHere::default(),
            vacated: Default::default(),
        };
        let mut r = Inode::new(ROOT, root.clone(), InodeKind::Dir);
        r.lookups = 1;
        t.inodes.insert(ROOT, Box::new(r));
        t.by_path.insert(root, ROOT);
        t
    }

    /// The attributes of `ino` (a folder's link count from its loaded listing).
    pub fn attr(&self, ino: Ino, uid: u32, gid: u32) -> Option<FileAttr> {
        let i = self.inodes.get(&ino)?;
        let subdirs = match (i.subdirs.get(), &i.listing) {
            (Some(n), _) => n,
            (None, None) => 0,
            (None, Some((_, names))) => {
                let n = names
                    .values()
                    .filter(|c| self.inodes.get(c).is_some_and(|c| c.kind == InodeKind::Dir))
                    .count() as u32;
                i.subdirs.set(Some(n));
                n
            }
        };
        Some(i.attr_with(uid, gid, subdirs))
    }

    /// A folder's entries changed here: its times move now, not when it is listed again, and
    /// stay as this mount's uploads into it land and move the store's time of it (`tar` after
    /// `vaultfs sync` said "file changed as we read it" of every folder it had written).
    pub fn entries_changed(&mut self, dir: Ino) {
        self.entries_moved(dir, true);
    }

    /// A folder's entries changed elsewhere, as the change feed says: its times move now, and
    /// give way to the store's when it is listed again.
    pub fn entries_changed_by_feed(&mut self, dir: Ino) {
        self.entries_moved(dir, false);
    }

    fn entries_moved(&mut self, dir: Ino, here: bool) {
        if let Some(i) = self.inodes.get_mut(&dir) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
            i.times_here = here;
        }
        self.snapshot_due.insert(dir);
    }

    /// A folder's listing shows entries made or removed elsewhere: times set here give way to
    /// the store's, taken from the next node that says them.
    pub fn entries_changed_elsewhere(&mut self, dir: Ino) {
        if let Some(i) = self.inodes.get_mut(&dir) {
            i.times_here = false;
            i.store_time = None;
        }
    }

    /// The folders whose entries changed here since last asked, for the offline snapshot,
    /// which would otherwise hold only listings fetched (and a listing the change feed keeps
    /// fresh is not fetched again after this mount's own changes). None when `keep` is false:
    /// the marks are dropped. A large folder taken lately is left for a later save unless
    /// `every` (the last save, at unmount).
    pub fn snapshot_due(&mut self, keep: bool, every: bool, now: Instant) -> Vec<Ino> {
        if !keep {
            self.snapshot_due.clear();
            return Vec::new();
        }
        self.snapshot_resting.retain(|_, until| *until > now);
        let resting = &self.snapshot_resting;
        let due: Vec<Ino> = self
            .snapshot_due
            .iter()
            .copied()
            .filter(|d| every || !resting.contains_key(d))
            .collect();
        for dir in &due {
            self.snapshot_due.remove(dir);
            let entries = self.inodes.get(dir).and_then(|d| d.listing.as_ref());
            let n = entries.map_or(0, |(_, names)| names.len());
            let rest = SNAPSHOT_REST_PER_ENTRY.saturating_mul(n as u32);
            self.snapshot_resting.insert(*dir, now + rest);
        }
        due
    }

    /// `dir` is due for the offline snapshot again.
    pub fn snapshot_again(&mut self, dir: Ino) {
        self.snapshot_due.insert(dir);
    }

    /// The listed folder `dir` as a node (for the offline snapshot).
    pub fn listed_folder(&self, dir: Ino) -> Option<Node> {
        let d = self.inodes.get(&dir)?;
        d.listing.as_ref()?;
        d.as_node()
    }

    /// Up to `n` of the listed folder `dir`'s entries after the name `after`, as nodes (files
    /// known to the backend only: one that exists only here is the journal's), and the last
    /// name looked at (None: no more). The offline snapshot writes a large folder a part at a
    /// time, never all its entries as nodes at once.
    pub fn entries_after(
        &self,
        dir: Ino,
        after: Option<&str>,
        n: usize,
    ) -> (Vec<Node>, Option<String>) {
        use std::ops::Bound::{Excluded, Unbounded};
        let Some((_, names)) = self.inodes.get(&dir).and_then(|d| d.listing.as_ref()) else {
            return (Vec::new(), None);
        };
        let from = after.map_or(Unbounded, Excluded);
        let part: Vec<(&String, &Ino)> = names.range::<str, _>((from, Unbounded)).take(n).collect();
        let last = part.last().map(|(name, _)| name.to_string());
        let nodes = part
            .into_iter()
            .filter_map(|(_, c)| self.get(*c))
            .filter(|c| !c.unlinked)
            .filter_map(Inode::as_node)
            .collect();
        (nodes, last)
    }

    /// A change made elsewhere (`follow`): the listing of `dir` counts as fetched at `past`,
    /// so its next use fetches it again (the old one still answers while that is under way).
    pub fn expire_listing(&mut self, dir: Ino, past: Instant) {
        if let Some(i) = self.inodes.get_mut(&dir) {
            i.listing_expired = Some(Instant::now());
            if let Some((at, _)) = i.listing.as_mut() {
                *at = past;
            }
        }
    }

    /// The attributes of `ino` count as fetched at `past` (see `expire_listing`).
    pub fn expire_attrs(&mut self, ino: Ino, past: Instant) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.fetched = i.fetched.min(past);
        }
    }

    /// Every listing and attribute counts as fetched at `past`; returns the folders.
    pub fn expire_all(&mut self, past: Instant) -> Vec<Ino> {
        let mut dirs = Vec::new();
        for i in self.inodes.values_mut() {
            i.fetched = i.fetched.min(past);
            if i.kind == InodeKind::Dir {
                i.listing_expired = Some(Instant::now());
            }
            if let Some((at, _)) = i.listing.as_mut() {
                *at = past;
                dirs.push(i.ino);
            }
        }
        dirs
    }

    /// md5 and size of `ino`'s stored version, when the backend gave an md5.
    pub fn stored_version(&self, ino: Ino) -> Option<(String, u64)> {
        let r = self.get(ino)?.remote.as_ref()?;
        Some((r.md5.clone()?, r.size))
    }

    /// ESTALE for a node the store no longer has (`Inode::gone_elsewhere`) that the kernel
    /// still names (the follower's removal of its entry on its way): the kernel then looks the
    /// whole path up again (lookups, creates, renames and removals retry once so), and finds
    /// what the store has there now, a folder made again (`rm -rf d; mkdir d` elsewhere) rather
    /// than ENOENT from the old one (fstests generic/732: `cat d/f` through the old `d` failed).
    pub fn not_stale(&self, ino: Ino) -> Result<(), Errno> {
        match self.get(ino) {
            Some(i) if i.gone_elsewhere => Err(Errno::ESTALE),
            _ => Ok(()),
        }
    }

    /// The path and kind of `ino` while it has a name (see `not_stale`).
    pub fn named(&self, ino: Ino) -> Result<(NodePath, InodeKind), Errno> {
        self.not_stale(ino)?;
        match self.get(ino) {
            Some(i) if !i.unlinked => Ok((i.path.clone(), i.kind)),
            _ => Err(Errno::ENOENT),
        }
    }

    /// A reference to `ino` handed to the kernel (LOOKUP, CREATE, MKDIR...): its attributes.
    pub fn looked_up(&mut self, ino: Ino, uid: u32, gid: u32) -> Result<FileAttr, Errno> {
        self.get_mut(ino).ok_or(Errno::ENOENT)?.lookups += 1;
        self.attr(ino, uid, gid).ok_or(Errno::ENOENT)
    }

    /// A folder `path` made here in `parent` (its `node` as the store answered): an empty
    /// listing, a reference handed to the kernel, and its attributes.
    pub fn folder_made(
        &mut self,
        parent: Ino,
        path: &NodePath,
        node: &Node,
        uid: u32,
        gid: u32,
    ) -> Result<FileAttr, Errno> {
        let (ino, _) = self.upsert(path, node);
        let i = self.get_mut(ino).expect("just inserted");
        i.set_listing(Default::default());
        i.lookups += 1;
        self.touch(ino);
        self.link_into_parent(ino);
        self.entries_changed(parent);
        self.attr(ino, uid, gid).ok_or(Errno::ENOENT)
    }

    /// A file `path` created here, with permission bits `perm`: its inode, not yet in its
    /// folder's listing (its staged copy is attached first). A new file under a name a stored
    /// file left moments ago continues it (`vacated`).
    pub fn file_made(&mut self, path: &NodePath, perm: u32) -> Ino {
        let ino = self.ensure(path, InodeKind::File);
        self.touch(ino);
        if let Some(i) = self.get_mut(ino) {
            i.unlinked = false;
            i.perm = Some(perm);
        }
        self.claim_vacated(ino);
        ino
    }

    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino).map(|i| &**i)
    }

    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Inode> {
        self.inodes.get_mut(&ino).map(|i| &mut **i)
    }

    pub fn ino_of(&self, path: &NodePath) -> Option<Ino> {
        self.by_path.get(path).copied()
    }

    /// The inode of `path`, created when new (or when the node changed kind).
    pub fn ensure(&mut self, path: &NodePath, kind: InodeKind) -> Ino {
        if let Some(&ino) = self.by_path.get(path) {
            if self.inodes[&ino].kind == kind {
                return ino;
            }
            self.detach_gone(ino);
        }
        let ino = self.next;
        self.next += 1;
        self.removed.remove(path);
        self.inodes
            .insert(ino, Box::new(Inode::new(ino, path.clone(), kind)));
        self.by_path.insert(path.clone(), ino);
        ino
    }

    /// An inode for a node gone from the table already, which the kernel looks up again (the
    /// follower removing its name through the mount, `follow::echo`, after the kernel let go
    /// of its entry): no name, nothing cached, dropped once the kernel forgets it.
    pub fn ghost(&mut self, path: &NodePath, kind: InodeKind) -> Ino {
        let ino = self.next;
        self.next += 1;
        let mut inode = Inode::new(ino, path.clone(), kind);
        inode.unlinked = true;
        inode.gone_elsewhere = true;
        self.inodes.insert(ino, Box::new(inode));
        ino
    }

    /// The inode for a backend node at `path`, updated from it; true in `.1` when its content
    /// changed remotely.
    pub fn upsert(&mut self, path: &NodePath, node: &Node) -> (Ino, bool) {
        let ino = self.ensure(path, kind_of(node));
        (ino, self.update_from(ino, node))
    }

    /// Updates inode `ino` from a backend node (see [`Inode::update_from`]); true when its
    /// content changed remotely.
    pub fn update_from(&mut self, ino: Ino, node: &Node) -> bool {
        let kept = node
            .file_id()
            .and_then(|id| self.kept.get(&id, node.md5_checksum.as_deref()));
        match self.inodes.get_mut(&ino) {
            Some(i) => i.update_from(node, kept),
            None => false,
        }
    }

    fn note_removed(&mut self, path: &NodePath) {
        let now = Instant::now();
        // Old marks go once a second, not at every removal (`rm -rf` of n files: n^2).
        if now.duration_since(self.removed_pruned) >= std::time::Duration::from_secs(1) {
            self.removed
                .retain(|_, at| now.duration_since(*at) < REMOVED_MEMORY);
            self.removed_pruned = now;
        }
        self.removed.insert(path.clone(), now);
    }

    /// The name `path` belongs to the store again (a conflict copy took this mount's inode
    /// away from it): not removed here, and its folder's listing is fetched again.
    pub fn give_back(&mut self, path: &NodePath) {
        self.removed.remove(path);
        let dir = path.parent().and_then(|p| self.by_path.get(&p).copied());
        if let Some(i) = dir.and_then(|d| self.inodes.get_mut(&d)) {
            i.listing = None;
            i.subdirs.set(None);
        }
    }

    /// Whether `path` was removed or renamed away here after `since`.
    pub fn removed_since(&self, path: &NodePath, since: Instant) -> bool {
        self.removed.get(path).is_some_and(|at| *at >= since)
    }

    /// Takes out of the namespace a node the store no longer has (see `Inode::gone_elsewhere`).
    pub fn detach_gone(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.gone_elsewhere = true;
        }
        self.detach(ino);
    }

    /// Takes a path out of the namespace (the inode lives on while the kernel references it).
    pub fn detach(&mut self, ino: Ino) {
        if let Some(path) = self.inodes.get(&ino).map(|i| i.path.clone()) {
            self.note_removed(&path);
        }
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.unlinked = true;
            if self.by_path.get(&inode.path) == Some(&ino) {
                self.by_path.remove(&inode.path);
            }
            let path = inode.path.clone();
            self.unlist(&path, Some(ino));
        }
        self.maybe_drop(ino);
    }

    /// Adds `ino` to its parent's cached listing, if that listing is loaded.
    pub fn link_into_parent(&mut self, ino: Ino) {
        let Some(inode) = self.inodes.get(&ino) else {
            return;
        };
        let (Some(parent), Some(name)) =
            (inode.path.parent(), inode.path.name().map(str::to_string))
        else {
            return;
        };
        let Some(pino) = self.by_path.get(&parent).copied() else {
            return;
        };
        let Some(names) = self.get_mut(pino).and_then(Inode::listing_mut) else {
            return;
        };
        let old = names.insert(name, ino);
        self.count_subdirs(pino, old, Some(ino));
    }

    /// Takes the name of `path` out of its parent's cached listing (only while it names `only`,
    /// when given).
    fn unlist(&mut self, path: &NodePath, only: Option<Ino>) {
        let (Some(parent), Some(name)) = (path.parent(), path.name()) else {
            return;
        };
        let Some(pino) = self.by_path.get(&parent).copied() else {
            return;
        };
        let Some(names) = self.get_mut(pino).and_then(Inode::listing_mut) else {
            return;
        };
        if only.is_some_and(|o| names.get(name) != Some(&o)) {
            return;
        }
        let old = names.remove(name);
        self.count_subdirs(pino, old, None);
    }

    /// Keeps folder `dir`'s count of subfolders (its link count) as one entry of its listing
    /// goes from `old` to `new`: a change costs the same in a folder of 100,000 names as in
    /// one of 10, where a recount at every GETATTR made `rm -rf` cost the square of the size.
    fn count_subdirs(&mut self, dir: Ino, old: Option<Ino>, new: Option<Ino>) {
        let is_dir = |i: Option<Ino>| {
            i.and_then(|i| self.inodes.get(&i))
                .is_some_and(|i| i.kind == InodeKind::Dir) as i64
        };
        let delta = is_dir(new) - is_dir(old);
        if delta == 0 {
            return;
        }
        if let Some(d) = self.inodes.get(&dir) {
            if let Some(n) = d.subdirs.get() {
                d.subdirs.set(u32::try_from(i64::from(n) + delta).ok());
            }
        }
    }

    /// Moves `ino` (and everything below it) to `to`; whatever was at `to` is detached first.
    pub fn rename(&mut self, ino: Ino, to: &NodePath) {
        if let Some(existing) = self.by_path.get(to).copied() {
            if existing != ino {
                self.detach(existing);
            }
        }
        let from = self.inodes[&ino].path.clone();
        self.note_removed(&from);
        self.removed.remove(to);
        // Out of the old parent's listing, paths rewritten, into the new parent's listing.
        self.unlist(&from, None);
        // A file has no path below it: no walk of every path known (a rename in a table of
        // 100,000 names costs what it does in one of 10).
        let moved: Vec<(NodePath, Ino)> = if self.inodes[&ino].kind == InodeKind::File {
            self.by_path
                .get(&from)
                .map(|i| (from.clone(), *i))
                .into_iter()
                .collect()
        } else {
            self.by_path
                .iter()
                .filter(|(p, _)| from.contains(p))
                .map(|(p, i)| (p.clone(), *i))
                .collect()
        };
        for (p, i) in moved {
            self.by_path.remove(&p);
            let rest = p.iter().skip(from.depth());
            let np =
                NodePath::from_segments(to.iter().chain(rest)).expect("segments already valid");
            if let Some(inode) = self.inodes.get_mut(&i) {
                inode.path = np.clone();
            }
            self.by_path.insert(np, i);
        }
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.ctime = SystemTime::now();
        }
        self.touch(ino);
        self.link_into_parent(ino);
    }

    pub fn forget(&mut self, ino: Ino, n: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.lookups = inode.lookups.saturating_sub(n);
        }
        self.maybe_drop(ino);
    }

    /// Drops an inode nobody references: no kernel lookups, no open handles, nothing staged,
    /// not listed in a cached listing.
    pub fn maybe_drop(&mut self, ino: Ino) {
        let Some(inode) = self.inodes.get(&ino) else {
            return;
        };
        if ino == ROOT || inode.lookups > 0 || inode.open_handles > 0 || inode.staged.is_some() {
            return;
        }
        if !inode.unlinked {
            // Still reachable by name: keep it while its parent's listing refers to it.
            let listed = inode
                .path
                .parent()
                .and_then(|p| self.by_path.get(&p))
                .and_then(|p| self.inodes.get(p))
                .is_some_and(|p| {
                    p.listing.as_ref().is_some_and(|(_, names)| {
                        inode
                            .path
                            .name()
                            .is_some_and(|n| names.get(n) == Some(&ino))
                    })
                });
            // Or while a listing fetched before its upload landed may still be merged: that
            // listing lacks it, and `local_children` finds it only through the table.
            let recent = self
                .recent
                .get(&ino)
                .is_some_and(|at| at.elapsed() < REMOVED_MEMORY);
            if listed || recent {
                return;
            }
            self.by_path.remove(&inode.path);
        }
        self.inodes.remove(&ino);
    }

    /// Gives the name of file `ino` to a new inode with the same attributes, and leaves `ino`
    /// to its open handles as a file replaced by a rename would be (see `passthrough`). None
    /// when `ino` is not a clean file reachable by its name.
    pub fn reissue(&mut self, ino: Ino) -> Option<Ino> {
        let old = self.inodes.get(&ino)?;
        if old.unlinked
            || old.kind != InodeKind::File
            || old.staged.is_some()
            || self.by_path.get(&old.path) != Some(&ino)
        {
            return None;
        }
        let new = self.next;
        self.next += 1;
        let path = old.path.clone();
        let mut n = Inode::new(new, path.clone(), InodeKind::File);
        n.remote = old.remote.clone();
        n.mtime = old.mtime;
        n.perm = old.perm;
        n.ctime = old.ctime;
        n.crtime = old.crtime;
        n.atime = old.atime;
        n.store_time = old.store_time;
        n.fetched = old.fetched;
        n.touched = old.touched;
        // Uploads and namespace changes of the node stay serialized across both.
        n.io = old.io.clone();
        self.inodes.insert(new, Box::new(n));
        self.by_path.insert(path.clone(), new);
        if let Some(at) = self.recent.get(&ino).copied() {
            self.recent.insert(new, at);
        }
        if let (Some(parent), Some(name)) = (path.parent(), path.name()) {
            if let Some(names) = self
                .by_path
                .get(&parent)
                .copied()
                .and_then(|p| self.inodes.get_mut(&p))
                .and_then(|i| i.listing_mut())
            {
                if names.get(name) == Some(&ino) {
                    names.insert(name.to_string(), new);
                }
            }
        }
        if let Some(o) = self.inodes.get_mut(&ino) {
            o.unlinked = true;
        }
        Some(new)
    }

    pub fn set_staged(&mut self, ino: Ino, staged: Option<Arc<Staged>>) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            if staged.is_some() {
                self.staged.insert(ino);
            } else {
                self.staged.remove(&ino);
            }
            inode.staged = staged;
        }
    }

    /// Marks a local change to `ino`'s name or existence (created, renamed, uploaded).
    pub fn touch(&mut self, ino: Ino) {
        let now = Instant::now();
        // Forget old marks once a second, not on every call: a burst of n creates would
        // otherwise cost O(n^2) (a third of the daemon's CPU in docs/benchmarks.md's profile).
        if now.duration_since(self.recent_pruned) >= std::time::Duration::from_secs(1) {
            self.recent
                .retain(|_, at| now.duration_since(*at) < REMOVED_MEMORY);
            self.recent_pruned = now;
        }
        self.recent.insert(ino, now);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.touched = now;
        }
        // Its folder's entry in the offline snapshot (a new ID, size or md5 after an upload),
        // and a folder's own listing under its new path (a rename).
        let Some(i) = self.inodes.get(&ino) else {
            return;
        };
        if i.kind == InodeKind::Dir {
            self.snapshot_due.insert(ino);
        }
        if let Some(p) = i.path.parent().and_then(|p| self.by_path.get(&p).copied()) {
            self.snapshot_due.insert(p);
        }
    }

    /// Whether `ino` was created, renamed or uploaded here at or after `at` (`touch`), or is
    /// being changed here now.
    pub fn changed_here_since(&self, ino: Ino, at: Instant) -> bool {
        self.in_flight.contains_key(&ino) || self.recent.get(&ino).is_some_and(|t| *t >= at)
    }

    /// Whether a rename or delete of `ino` by this mount is under way (sent, not answered).
    pub fn sending(&self, ino: Ino) -> bool {
        self.in_flight.contains_key(&ino)
    }

    /// A change of `ino` by this mount is sent (`follow::Ours`).
    pub(super) fn change_sent(&mut self, ino: Ino) {
        *self.in_flight.entry(ino).or_default() += 1;
    }

    /// ... and answered, or given up: from now on its time tells (`touch`).
    pub(super) fn change_answered(&mut self, ino: Ino) {
        if let Some(n) = self.in_flight.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&ino);
            }
        }
        self.touch(ino);
    }

    /// Whether this mount is making `path` on the store now (`follow::Ours::sending_to`).
    pub fn making(&self, path: &NodePath) -> bool {
        self.names_in_flight.contains_key(path)
    }

    /// A change that makes `path` is sent ...
    pub(super) fn name_sent(&mut self, path: &NodePath) {
        *self.names_in_flight.entry(path.clone()).or_default() += 1;
    }

    /// ... and answered (its node, if made, is in the table), or given up.
    pub(super) fn name_answered(&mut self, path: &NodePath) {
        if let Some(n) = self.names_in_flight.get_mut(path) {
            *n -= 1;
            if *n == 0 {
                self.names_in_flight.remove(path);
            }
        }
    }

    /// Files of `dir` that a listing fetched from the backend at `since` may lack: those with
    /// staged bytes, those created, renamed or uploaded here since (a listing paged while
    /// the folder changes can miss entries), and those this mount is changing on the store
    /// right now (their own answer says where they are: `history` moves a backup away and
    /// makes it again, and a listing fetched in between lacked it).
    pub fn local_children(&self, dir: &NodePath, since: Instant) -> Vec<(String, Ino)> {
        let recent = self
            .recent
            .iter()
            .filter(|(_, at)| **at >= since)
            .map(|(i, _)| i);
        self.staged
            .iter()
            .chain(recent)
            .chain(self.in_flight.keys())
            .filter_map(|i| self.inodes.get(i))
            .filter(|i| !i.unlinked && i.path.parent().as_ref() == Some(dir))
            .map(|i| (i.path.name().unwrap_or_default().to_string(), i.ino))
            .collect()
    }

    /// Whether the names of folder `dir` changed here after `since` (created, uploaded,
    /// renamed in or away, removed): the backend's listing of it, paged meanwhile, may then
    /// lack names that did not change, its pages having moved under it.
    pub fn names_changed_since(&self, dir: &NodePath, since: Instant) -> bool {
        let in_dir = |p: &NodePath| p.parent().as_ref() == Some(dir);
        self.removed.iter().any(|(p, at)| *at >= since && in_dir(p))
            || self
                .recent
                .iter()
                .any(|(i, at)| *at >= since && self.inodes.get(i).is_some_and(|i| in_dir(&i.path)))
    }

    /// The inodes with staged bytes, in no order.
    pub fn staged_inos(&self) -> impl Iterator<Item = Ino> + '_ {
        self.staged.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large folder changed again right after the snapshot took it waits for its rest; the
    /// last save (`every`) takes it at once. Its entries are read a part at a time.
    #[test]
    fn a_large_folder_rests_between_snapshots_but_for_the_last() {
        let root = NodePath::parse_uri("/nodes/pth/Local/V").unwrap();
        let mut t = Table::new(root.clone());
        let dir_path = root.child("big").unwrap();
        let dir = t.ensure(&dir_path, InodeKind::Dir);
        let n = 4000;
        let names = (0..n)
            .map(|i| {
                let name = format!("d{i:05}");
                let ino = t.ensure(&dir_path.child(&name).unwrap(), InodeKind::Dir);
                (name, ino)
            })
            .collect();
        t.get_mut(dir).unwrap().set_listing(names);
        let rest = SNAPSHOT_REST_PER_ENTRY * n;
        let now = Instant::now();
        t.entries_changed(dir);
        assert_eq!(t.snapshot_due(true, false, now), [dir]);
        t.entries_changed(dir);
        assert_eq!(
            t.snapshot_due(true, false, now + rest / 2),
            Vec::<Ino>::new()
        );
        assert_eq!(t.snapshot_due(true, false, now + rest * 2), [dir]);
        t.entries_changed(dir);
        assert_eq!(t.snapshot_due(true, true, now + rest * 2), [dir]);
        // Nothing changed since: nothing to take, rested or not.
        assert_eq!(
            t.snapshot_due(true, true, now + rest * 10),
            Vec::<Ino>::new()
        );

        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let (part, last) = t.entries_after(dir, after.as_deref(), 1000);
            let Some(last) = last else { break };
            assert!(part.len() <= 1000);
            seen.extend(part.into_iter().map(|c| c.name));
            after = Some(last);
        }
        let want: Vec<String> = (0..n).map(|i| format!("d{i:05}")).collect();
        assert_eq!(seen, want);
    }
}
