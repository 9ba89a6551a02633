//! The table's side of a change made elsewhere, as the change feed tells it (`follow` reads
//! the feed and tells the kernel): what it makes stale, detaches or leaves to a new listing.
//! A change this mount made itself, or one older than what the table has, changes nothing.

use std::time::Instant;

use super::{Ino, InodeKind, Table};
use crate::api::checksum::md5_hex;
use crate::api::{Change, ChangeKind, NodePath};

/// What the kernel is told.
pub enum Kernel {
    /// `inval_entry`: the name is looked up again.
    Entry(Ino, String),
    /// A node gone elsewhere (parent, node, its path, a folder): removed through the mount
    /// itself (see `Follow::is_echo`), so that inotify watchers get `IN_DELETE`; else
    /// `FUSE_NOTIFY_DELETE`.
    Delete(Ino, Ino, NodePath, bool),
    /// `inval_inode` of the attributes only.
    Attrs(Ino),
}

/// One change of the feed: the change, its path and where it moved from, when it was made
/// (on this machine's clock), and whether the same page makes a folder at a path again later.
pub struct Told<'a> {
    pub c: &'a Change,
    pub path: &'a NodePath,
    pub from: Option<&'a NodePath>,
    pub at: Instant,
    pub again: &'a dyn Fn(&NodePath) -> bool,
}

/// What a page of changes asks of the mount beyond the table.
#[derive(Default)]
pub struct Effects {
    /// What the kernel is told.
    pub kernel: Vec<Kernel>,
    /// Files whose attributes are fetched again (new bytes or times elsewhere).
    pub refetch: Vec<(Ino, NodePath)>,
    /// Folders removed and made again elsewhere: listed again (what was in them is gone).
    pub relist: Vec<(Ino, NodePath)>,
}

impl Table {
    /// Applies the change `told` (`past`: a time anything fetched at is stale).
    pub fn changed_elsewhere(&mut self, told: Told<'_>, past: Instant, out: &mut Effects) {
        let Told {
            c,
            path,
            from,
            at,
            again,
        } = told;
        let mut away = |t: &mut Table, p: &NodePath| {
            let by = Gone {
                c,
                at,
                again: again(p),
            };
            out.relist.extend(gone(t, p, by, past, &mut out.kernel));
        };
        match c.kind {
            ChangeKind::Deleted => away(self, path),
            ChangeKind::Moved | ChangeKind::Created | ChangeKind::Copied | ChangeKind::Other => {
                if let Some(from) = from {
                    away(self, from);
                }
                if c.kind == ChangeKind::Other {
                    away(self, path);
                }
                appeared(self, path, at, past, &mut out.kernel);
            }
            ChangeKind::Version | ChangeKind::Attributes => {
                let Some(ino) = self.ino_of(path) else { return };
                let Some(i) = self.get(ino) else { return };
                // Bytes waiting here: kept as they are.
                if i.kind != InodeKind::File || i.staged.is_some() {
                    return;
                }
                // Ours coming back: the bytes the store has now are the ones known here. Where
                // the server says which (`Change::md5`), that decides, not the clocks: a
                // version another writer stored while this mount's own upload was answered
                // came out "changed here since" and was never fetched (the model, seed
                // 1796589137872955081).
                let known = match (c.kind, c.md5.as_deref().and_then(md5_hex)) {
                    (ChangeKind::Version, Some(now)) => {
                        let held = i.remote.as_ref().and_then(|r| r.md5.as_deref());
                        held.and_then(md5_hex).as_deref() == Some(now.as_str())
                    }
                    _ => self.changed_here_since(ino, at),
                };
                if !known {
                    out.refetch.push((ino, path.clone()));
                }
            }
        }
    }
}

/// A change that took a node away from a path: the change, when it was made, and whether the
/// same page makes a folder there again after it.
struct Gone<'a> {
    c: &'a Change,
    at: Instant,
    again: bool,
}

/// The node at `path` is gone (deleted, or moved away) by `by`. A folder that is there again
/// (made again by the page, or seen there since) stays, to be listed again: returned.
fn gone(
    t: &mut Table,
    path: &NodePath,
    by: Gone<'_>,
    past: Instant,
    kernel: &mut Vec<Kernel>,
) -> Option<(Ino, NodePath)> {
    let Gone { c, at, again } = by;
    let parent = path.parent()?;
    // Never seen here (nothing cached), or gone here already (or never listed).
    let pino = t.ino_of(&parent)?;
    let ino = t.ino_of(path)?;
    let i = t.get(ino)?;
    // This mount's own delete or rename of it, told by the feed before its answer came: the
    // answer takes the name out. (Listing the folder again for it made every unlink of an
    // `rm -rf` over a server fetch the whole folder: 22 ms a file at 10,000 files.)
    if t.sending(ino) {
        return None;
    }
    // Made again here since (or with bytes waiting here): the delete is older than what we have.
    // The folder is listed again all the same: a listing followed by the feed is trusted until
    // the feed says otherwise, and the next one keeps the name only if it is still to be kept
    // (bytes waiting here, or on the store), not for ever (the model, seed 32: a file deleted
    // elsewhere right after a change here stayed listed, and ENOENT to open, for good).
    if i.staged.is_some() || t.changed_here_since(ino, at) {
        log::debug!("{path}: gone elsewhere, kept until listed again (changed here since)");
        t.expire_listing(pino, past);
        return None;
    }
    let dir = i.kind == InodeKind::Dir;
    // Not the node gone: a file of another ID now (made again at that name), or, where the
    // change names no ID, a node the store showed there after the change.
    let other = match (c.id.as_deref(), i.remote.as_ref()) {
        (Some(id), Some(r)) => r.id != id,
        _ => i.fetched > at,
    };
    if other && !dir {
        log::debug!("{path}: gone elsewhere, kept until listed again (another file there)");
        t.expire_listing(pino, past);
        return None;
    }
    // A folder is its path here, as in the interface: one removed and made again (`rm -rf d;
    // mkdir d` elsewhere, while the page was on its way) is the same folder, emptied. Detached,
    // it vanished from under programs that held it (fstests generic/732: `mv d/f e/` opens
    // `e/` and renames into it; the kernel's entry of the old `e` was the follower's to drop).
    // Listed again instead: what was in it leaves the kernel from there.
    if dir && (again || other) {
        log::debug!("{path}: removed elsewhere and made again: listed again");
        t.expire_attrs(ino, past);
        t.expire_listing(ino, past);
        t.expire_listing(pino, past);
        kernel.push(Kernel::Attrs(ino));
        return Some((ino, path.clone()));
    }
    log::debug!("{path}: gone elsewhere");
    t.detach_gone(ino);
    t.entries_changed_by_feed(pino);
    t.expire_listing(pino, past);
    kernel.push(Kernel::Delete(pino, ino, path.clone(), dir));
    kernel.push(Kernel::Attrs(pino));
    None
}

/// A node appeared at `path` (created, moved or copied there) since `at`.
fn appeared(t: &mut Table, path: &NodePath, at: Instant, past: Instant, kernel: &mut Vec<Kernel>) {
    let (Some(parent), Some(name)) = (path.parent(), path.name()) else {
        return;
    };
    let Some(pino) = t.ino_of(&parent) else {
        return;
    };
    // Made by this mount, its answer not in yet: the answer makes the kernel's entry.
    if t.making(path) {
        return;
    }
    if let Some(i) = t.ino_of(path).and_then(|i| t.get(i)) {
        // Made here (our own change coming back), or with bytes waiting here.
        let ino = i.ino;
        if i.staged.is_some() || t.changed_here_since(ino, at) {
            return;
        }
        // Something else now has this name: its attributes are asked again.
        t.expire_attrs(ino, past);
        kernel.push(Kernel::Attrs(ino));
    }
    t.entries_changed_by_feed(pino);
    t.expire_listing(pino, past);
    // A negative entry the kernel keeps for the name goes too.
    kernel.push(Kernel::Entry(pino, name.to_string()));
    kernel.push(Kernel::Attrs(pino));
}
