//! The namespace part of the mount, around the inode table: the table sits below all of its
//! neighbours here and knows none of them. Its lock is taken here only (and by the staged
//! file's steps, `staging/lifecycle`, through [`Nodes::lock`]): every other part asks one of
//! the steps below (`names.rs`: those of lookups and listings), each of which lets go of the
//! lock before it returns, so no caller holds the table across anything of its own
//! (`src/layers.rs` checks it).

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use fuser::FileAttr;

mod names;

use super::follow::Follow;
use super::freshness::Freshness;
use super::staging::Staged;
use super::table::{
    Continues, Effects, Ino, Inode, InodeKind, KeptHere, Merged, Remote, Table, Told,
};
use crate::api::{Base, Node, NodePath};
use crate::sync::relock;

/// Refreshes under way (`Fs::refresh_briefly`), by node: true once each has ended.
pub(super) type Refreshing = HashMap<Ino, tokio::sync::watch::Receiver<bool>>;

/// The namespace part of the mount: the inode table, the refreshes of its listings and
/// attributes under way, whether what it fetched may still be used, and the follower of
/// changes made elsewhere, which drops what they make stale.
pub(super) struct Nodes {
    /// Taken by the steps here and in `names.rs`, and by the staged file's (`lock`).
    table: std::sync::Mutex<Table>,
    /// Folders whose listing is being fetched again, each with word of its end.
    refreshing: std::sync::Mutex<Refreshing>,
    /// Nodes whose attributes are being fetched again.
    attr_refreshing: std::sync::Mutex<Refreshing>,
    /// Whether a listing or attributes fetched at some time may still be used.
    pub(super) freshness: Freshness,
    /// What the follower of changes made elsewhere keeps (`follow`).
    pub(super) follow: Arc<Follow>,
    /// The backend's count of others' changes, where it can tell at once (`Freshness::fresh`).
    foreign: Foreign,
}

/// Whether the name of a file held by passthrough opens moved off (`Nodes::move_off_passthrough`).
pub(super) enum MovedOff {
    /// No passthrough open holds it any more.
    Free,
    /// Moved to a new inode (the new inode, its folder, the path).
    Moved(Ino, Ino, NodePath),
    /// Held, and not a clean file reachable by its name: it stays.
    Stays,
}

/// What an OPEN needs of a node (`Nodes::opened`).
pub(super) type ToOpen = (InodeKind, Option<Remote>, bool);

/// What is fetched again ([`Nodes::refreshes`]).
#[derive(Clone, Copy)]
pub(super) enum Refresh {
    /// A folder's listing.
    Listing,
    /// A node's attributes.
    Attrs,
}

/// Reads the backend's count of others' changes (`LocalStore::foreign_changes`).
pub(super) type Foreign = Box<dyn Fn() -> Option<u64> + Send + Sync>;

impl Nodes {
    /// `table`, with listings reused for `dir_ttl`.
    pub(super) fn new(table: Table, dir_ttl: std::time::Duration, foreign: Foreign) -> Nodes {
        Nodes {
            table: std::sync::Mutex::new(table),
            refreshing: Default::default(),
            attr_refreshing: Default::default(),
            freshness: Freshness::new(dir_ttl),
            follow: Arc::default(),
            foreign,
        }
    }

    /// The refreshes of `what` under way, by node.
    pub(super) fn refreshes(&self, what: Refresh) -> &std::sync::Mutex<Refreshing> {
        match what {
            Refresh::Listing => &self.refreshing,
            Refresh::Attrs => &self.attr_refreshing,
        }
    }

    /// Whether a listing or attributes fetched at `at` may be used without asking the backend.
    pub(super) fn fresh(&self, at: Instant) -> bool {
        self.freshness.fresh(at, &self.foreign)
    }
}

/// The table's one-step operations: each takes the table's lock and lets go of it before it
/// returns, so no caller holds it across anything else ("Locks", 4, in `fs/mod.rs`).
impl Nodes {
    /// The table, locked: for the steps of the table's own parts (`nodes/`), and the staged
    /// file's life (`staging/lifecycle.rs`), whose steps move a staged copy and its inode
    /// together under it.
    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        relock(&self.table)
    }

    /// What `f` reads of the table: for a question over several nodes (a folder and its
    /// entries); a change is one of the named steps.
    pub(super) fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        f(&self.lock())
    }

    /// `f` applied to the attributes kept here for a backend that does not keep them.
    pub(super) fn kept<R>(&self, f: impl FnOnce(&mut KeptHere) -> R) -> R {
        f(&mut self.lock().kept)
    }

    /// What `f` reads of the inode `ino`, if the table has it.
    pub(super) fn inode<R>(&self, ino: Ino, f: impl FnOnce(&Inode) -> R) -> Option<R> {
        self.lock().get(ino).map(f)
    }

    /// `f` applied to the inode `ino`, if the table has it.
    pub(super) fn inode_mut<R>(&self, ino: Ino, f: impl FnOnce(&mut Inode) -> R) -> Option<R> {
        self.lock().get_mut(ino).map(f)
    }

    /// Whether the table has `ino`.
    pub(super) fn has(&self, ino: Ino) -> bool {
        self.lock().get(ino).is_some()
    }

    /// The `io` lock of `ino` ("Locks", 1).
    pub(super) fn io(&self, ino: Ino) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.inode(ino, |i| i.io.clone())
    }

    /// The kind of `ino`.
    pub(super) fn kind(&self, ino: Ino) -> Option<InodeKind> {
        self.inode(ino, |i| i.kind)
    }

    /// The staged copy of `ino`, if it has one.
    pub(super) fn staged(&self, ino: Ino) -> Option<Arc<Staged>> {
        self.inode(ino, |i| i.staged.clone()).flatten()
    }

    /// What the backend last said of `ino`.
    pub(super) fn remote(&self, ino: Ino) -> Option<Remote> {
        self.inode(ino, |i| i.remote.clone()).flatten()
    }

    /// What an OPEN of `ino` needs of it: its kind, what the backend last said of it, and
    /// whether it has a staged copy; ESTALE for a node gone elsewhere (`Table::not_stale`).
    pub(super) fn opened(&self, ino: Ino) -> Option<Result<ToOpen, fuser::Errno>> {
        self.inode(ino, |i| {
            if i.gone_elsewhere {
                log::debug!("{}: open of inode {ino}, gone elsewhere: ESTALE", i.path);
                return Err(fuser::Errno::ESTALE);
            }
            Ok((i.kind, i.remote.clone(), i.staged.is_some()))
        })
    }

    /// Passthrough opens of another version hold `ino`: its name moves to a new inode with
    /// the same attributes (`Table::reissue`), which the kernel opens after an ESTALE.
    pub(super) fn move_off_passthrough(&self, ino: Ino) -> MovedOff {
        let mut t = self.lock();
        if t.get(ino).is_some_and(|i| i.pt.is_none()) {
            return MovedOff::Free;
        }
        let path = t.get(ino).map(|i| i.path.clone());
        let parent = path.as_ref().and_then(|p| t.ino_of(&p.parent()?));
        match (t.reissue(ino), parent, path) {
            (Some(new), Some(parent), Some(path)) => MovedOff::Moved(new, parent, path),
            _ => MovedOff::Stays,
        }
    }

    /// The path of `ino` for a log line: its inode number when the table has forgotten it.
    pub(super) fn describe(&self, ino: Ino) -> String {
        self.inode(ino, |i| i.path.to_string())
            .unwrap_or_else(|| format!("inode {ino}"))
    }

    /// The inode of `path`, if the table has one.
    pub(super) fn ino_of(&self, path: &NodePath) -> Option<Ino> {
        self.lock().ino_of(path)
    }

    /// `Table::attr`.
    pub(super) fn attr(&self, ino: Ino, uid: u32, gid: u32) -> Option<FileAttr> {
        self.lock().attr(ino, uid, gid)
    }

    /// `Table::update_from`.
    pub(super) fn update_from(&self, ino: Ino, node: &Node) -> bool {
        self.lock().update_from(ino, node)
    }

    /// `Table::forget`.
    pub(super) fn forget(&self, ino: Ino, n: u64) {
        self.lock().forget(ino, n)
    }

    /// `Table::expire_all`.
    pub(super) fn expire_all(&self, past: Instant) -> Vec<Ino> {
        self.lock().expire_all(past)
    }

    /// `Table::folder_made`.
    pub(super) fn folder_made(
        &self,
        parent: Ino,
        path: &NodePath,
        node: &Node,
        uid: u32,
        gid: u32,
    ) -> Result<FileAttr, fuser::Errno> {
        self.lock().folder_made(parent, path, node, uid, gid)
    }

    /// `Table::file_made`.
    pub(super) fn file_made(&self, path: &NodePath, perm: u32) -> Ino {
        self.lock().file_made(path, perm)
    }

    /// `Table::expire_listing` of each of `dirs`.
    pub(super) fn expire_listings(&self, dirs: &[Ino], past: Instant) {
        let mut t = self.lock();
        for d in dirs {
            t.expire_listing(*d, past);
        }
    }

    /// `Table::expire_listing`.
    #[cfg(test)]
    pub(super) fn expire_listing(&self, dir: Ino, past: Instant) {
        self.lock().expire_listing(dir, past)
    }

    /// `Table::stored_version`.
    pub(super) fn stored_version(&self, ino: Ino) -> Option<(String, u64)> {
        self.lock().stored_version(ino)
    }

    /// `Table::hand_over_delete`.
    pub(super) fn hand_over_delete(&self, x: Ino, at: &NodePath, base: &Base) -> bool {
        self.lock().hand_over_delete(x, at, base)
    }

    /// `Table::take_claim`.
    pub(super) fn take_claim(&self, ino: Ino) -> Option<Continues> {
        self.lock().take_claim(ino)
    }

    /// `Table::vacate_deleted`.
    pub(super) fn vacate_deleted(&self, name: NodePath, id: String) {
        self.lock().vacate_deleted(name, id)
    }

    /// A delete answered here that the store refused (`deletes`): the file at `path` (`id`)
    /// is still there. A new file under the name does not continue it, and its folder is
    /// listed again at its next use, where the name comes back.
    pub(super) fn delete_undone(&self, path: &NodePath, id: Option<&str>) {
        let mut t = self.lock();
        if let Some(id) = id {
            t.unvacate_deleted(path, id);
        }
        let parent = path.parent().and_then(|p| t.ino_of(&p));
        if let (Some(parent), Some(past)) = (parent, self.freshness.expired()) {
            t.expire_listing(parent, past);
        }
    }

    /// `Table::merge_listing`, with what counts as expired now.
    pub(super) fn merge_listing(
        &self,
        dir: Ino,
        path: &NodePath,
        node: &Node,
        children: &[Node],
        started: Instant,
    ) -> Merged {
        let expired = self.freshness.expired();
        (self.lock()).merge_listing(dir, path, node, children, started, expired)
    }

    /// Changes of `inos` and names `names` this mount is sending (`follow::Ours`).
    pub(super) fn sending(&self, inos: &[Ino], names: &[NodePath]) {
        let mut t = self.lock();
        for &i in inos {
            t.change_sent(i);
        }
        for n in names {
            t.name_sent(n);
        }
    }

    /// The changes `sending` told of are answered.
    pub(super) fn answered(&self, inos: &[Ino], names: &[NodePath]) {
        let mut t = self.lock();
        for &i in inos {
            t.change_answered(i);
        }
        for n in names {
            t.name_answered(n);
        }
    }

    /// Folder `dir` at `path` is gone elsewhere after all: detached, its folder's entries
    /// changed. That folder, if the table has it.
    pub(super) fn folder_gone_elsewhere(&self, dir: Ino, path: &NodePath) -> Option<Ino> {
        let mut t = self.lock();
        let pino = path.parent().and_then(|p| t.ino_of(&p))?;
        t.detach_gone(dir);
        t.entries_changed_by_feed(pino);
        Some(pino)
    }

    /// `Table::changed_elsewhere`.
    pub(super) fn changed_elsewhere(&self, told: Told<'_>, past: Instant, out: &mut Effects) {
        self.lock().changed_elsewhere(told, past, out)
    }

    /// `Table::restore`.
    pub(super) fn restore(
        &self,
        root: &NodePath,
        load: impl FnMut(&NodePath) -> Option<Node>,
    ) -> usize {
        self.lock().restore(root, load)
    }

    /// `dir` is due for the offline snapshot again (its last write failed).
    pub(super) fn snapshot_again(&self, dir: Ino) {
        self.lock().snapshot_again(dir);
    }

    /// `Table::snapshot_due`.
    pub(super) fn snapshot_due(&self, keep: bool, every: bool) -> Vec<Ino> {
        self.lock().snapshot_due(keep, every, Instant::now())
    }
}
