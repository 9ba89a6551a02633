//! The table's steps for names and listings (`listing.rs` asks them): each under the table's
//! lock, taken here.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use fuser::{Errno, FileAttr, FileType};

use super::Nodes;
use crate::api::NodePath;
use crate::fs::follow::Echo;
use crate::fs::table::{Ino, InodeKind, ROOT, Table};
use crate::fs::virtual_names::{self, is_virtual};

/// A folder's entries for a directory handle: `.`, `..`, then its listing.
pub(in crate::fs) type Entries = Vec<(Ino, FileType, String)>;

impl Nodes {
    /// `Table::not_stale`.
    pub(in crate::fs) fn not_stale(&self, ino: Ino) -> Result<(), Errno> {
        self.lock().not_stale(ino)
    }

    /// `Table::named`.
    pub(in crate::fs) fn named(&self, ino: Ino) -> Result<(NodePath, InodeKind), Errno> {
        self.lock().named(ino)
    }

    /// `Table::looked_up`.
    pub(in crate::fs) fn looked_up(&self, ino: Ino, uid: u32, gid: u32) -> Result<FileAttr, Errno> {
        self.lock().looked_up(ino, uid, gid)
    }

    /// The names of `dir` when its listing is loaded and fresh.
    pub(in crate::fs) fn fresh_names<'t>(
        &self,
        t: &'t Table,
        dir: Ino,
    ) -> Option<&'t BTreeMap<String, Ino>> {
        let (at, names) = t.get(dir)?.listing()?;
        self.fresh(*at).then_some(names)
    }

    /// The path of folder `parent` when its fresh listing has no `name`; None when the
    /// backend must be asked.
    pub(in crate::fs) fn free_name_in(&self, parent: Ino, name: &str) -> Option<NodePath> {
        let t = self.lock();
        if self.fresh_names(&t, parent)?.contains_key(name) {
            return None;
        }
        Some(t.get(parent)?.path.clone())
    }

    /// Whether the listing of folder `dir` must be fetched: None when it is loaded and fresh,
    /// else its path and whether an older listing is loaded.
    pub(in crate::fs) fn listing_due(&self, dir: Ino) -> Result<Option<(NodePath, bool)>, Errno> {
        let t = self.lock();
        let i = t.get(dir).ok_or(Errno::ENOENT)?;
        if i.kind != InodeKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if i.listing().is_some_and(|(at, _)| self.fresh(*at)) {
            return Ok(None);
        }
        Ok(Some((i.path.clone(), i.listing().is_some())))
    }

    /// The inode of `name` in the loaded listing of `dir`.
    pub(in crate::fs) fn listed_child(&self, dir: Ino, name: &str) -> Option<Ino> {
        let t = self.lock();
        let (_, names) = t.get(dir)?.listing()?;
        names.get(name).copied()
    }

    /// The path of `ino` when its attributes must be fetched again (not the root, not staged
    /// or unlinked, fetched too long ago, and the backend in reach: `offline` false).
    pub(in crate::fs) fn attrs_due(
        &self,
        ino: Ino,
        offline: bool,
    ) -> Result<Option<NodePath>, Errno> {
        let t = self.lock();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        let due = ino != ROOT && !offline && i.staged.is_none() && !i.unlinked;
        Ok((due && !self.fresh(i.fetched)).then(|| i.path.clone()))
    }

    /// The attributes of `ino` when they need no fetch (see `attrs_due`); while the backend is
    /// away (`offline`), what the table has.
    pub(in crate::fs) fn attr_if_fresh(
        &self,
        ino: Ino,
        offline: bool,
        uid: u32,
        gid: u32,
    ) -> Option<FileAttr> {
        let t = self.lock();
        let i = t.get(ino)?;
        let stale = ino != ROOT && i.staged.is_none() && !i.unlinked && !self.fresh(i.fetched);
        if stale && !offline {
            return None;
        }
        t.attr(ino, uid, gid)
    }

    /// `ino`, the store says, is gone: detached from the table. Its folder, and whether it was
    /// a folder.
    pub(in crate::fs) fn gone_elsewhere(&self, ino: Ino, path: &NodePath) -> (Option<Ino>, bool) {
        let mut t = self.lock();
        let parent = path.parent().and_then(|p| t.ino_of(&p));
        let dir = t.get(ino).is_some_and(|i| i.kind == InodeKind::Dir);
        t.detach_gone(ino);
        (parent, dir)
    }

    /// LOOKUP from memory: the follower's removal of `echo` (see `follow::echo`), else `name`
    /// in the fresh listing of `parent`. None when the listing is not fresh.
    pub(in crate::fs) fn lookup_cached(
        &self,
        parent: Ino,
        name: &str,
        echo: Option<Echo>,
        uid: u32,
        gid: u32,
    ) -> Option<Result<FileAttr, Errno>> {
        let mut t = self.lock();
        if let Some(e) = echo {
            let ino = match t.get(e.ino) {
                Some(_) => e.ino,
                // The kernel let go of it meanwhile (an entry that aged: the removal's own
                // lookup is the kernel's first of the name since): one to remove all the same,
                // or watchers get no IN_DELETE.
                None => {
                    let kind = if e.dir {
                        InodeKind::Dir
                    } else {
                        InodeKind::File
                    };
                    t.ghost(&e.path, kind)
                }
            };
            t.get(ino)?;
            return Some(t.looked_up(ino, uid, gid));
        }
        if let Err(e) = t.not_stale(parent) {
            return Some(Err(e));
        }
        let Some(ino) = self.fresh_names(&t, parent)?.get(name).copied() else {
            return Some(Err(Errno::ENOENT));
        };
        t.get(ino)?;
        Some(t.looked_up(ino, uid, gid))
    }

    /// The entries of folder `ino`'s loaded listing, for a directory handle.
    pub(in crate::fs) fn entries(&self, ino: Ino) -> Result<Entries, Errno> {
        let t = self.lock();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        let parent = i
            .path
            .parent()
            .and_then(|p| t.ino_of(&p))
            .filter(|_| ino != ROOT)
            .unwrap_or(ROOT);
        let mut out = vec![
            (ino, FileType::Directory, ".".to_string()),
            (parent, FileType::Directory, "..".to_string()),
        ];
        if let Some((_, names)) = i.listing() {
            for (name, cino) in names {
                let kind = match t.get(*cino).map(|c| c.kind) {
                    Some(InodeKind::Dir) => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                out.push((*cino, kind, name.clone()));
            }
        }
        Ok(out)
    }

    /// READDIRPLUS of `batch`, entries of folder `ino` from `offset`: `add(ino, next offset,
    /// name, validity, attr)` for each until it says the reply is full (true); each entry
    /// taken counts as a LOOKUP, in the same hold of the table as its attributes (a FORGET in
    /// between would drop a node the reply then hands out).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::fs) fn readdirplus(
        &self,
        ino: Ino,
        batch: &[(Ino, FileType, String)],
        offset: u64,
        ttl: Duration,
        (uid, gid): (u32, u32),
        mut add: impl FnMut(Ino, u64, &str, &Duration, &FileAttr) -> bool,
    ) {
        let mut t = self.lock();
        for (i, (cino, kind, name)) in batch.iter().enumerate() {
            let dots = name == "." || name == "..";
            let virt = is_virtual(*cino) || is_virtual(ino);
            let real = if virt { None } else { t.attr(*cino, uid, gid) };
            let (attr, valid) = match real {
                Some(attr) => (attr, ttl),
                // Preview entries: their sizes are known only once fetched, so they come with
                // no validity and the kernel asks (LOOKUP, GETATTR) when one is used.
                None if virt || dots => {
                    let dir = *kind == FileType::Directory;
                    let attr = virtual_names::attr(*cino, dir, 0, SystemTime::now(), uid, gid);
                    (attr, Duration::ZERO)
                }
                // Gone since the listing was taken.
                None => continue,
            };
            let next = offset + i as u64 + 1;
            if add(*cino, next, name, &valid, &attr) {
                break;
            }
            // Like a LOOKUP, each entry but `.` and `..` is a reference the kernel will forget.
            if !dots && !virt {
                if let Some(c) = t.get_mut(*cino) {
                    c.lookups += 1;
                }
            }
        }
    }
}
