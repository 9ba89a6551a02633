//! Steps of a staged file that make, remove or rename its entry in its folder, each under the
//! table's lock, taken here: the folder's listing, the inode and its copy move together.

use std::sync::Arc;

use fuser::{BackingId, Errno, FileAttr, OpenFlags};

use crate::api::{Base, Node, NodePath};
use crate::backend::Backend;
use crate::fs::passthrough::Register;
use crate::fs::staging::Staged;
use crate::fs::staging::lifecycle::Removal;
use crate::fs::table::{Ino, InodeKind};
use crate::fs::{Fs, OpResult};

/// A rename made on the store (or only here), as the table takes it ([`Fs::renamed_here`]).
pub(in crate::fs) struct Moved {
    pub ino: Ino,
    pub kind: InodeKind,
    /// Whether the node is on the store (a folder, or a file stored once).
    pub stored: bool,
    /// The node the rename replaced, if any.
    pub target: Option<Ino>,
    /// What the store answered, where it was asked.
    pub node: Option<Node>,
    /// The folders left and entered.
    pub parents: [Ino; 2],
}

impl<B: Backend> Fs<B> {
    /// **Attach**, a created file's first writer (CREATE): `ino` joins its folder's listing
    /// (`parent`'s entries changed where it is `new`), its writer opens `staged` (`fh`, the
    /// open's flags, `afresh`: created or cut) and the kernel gets a reference: its attributes
    /// and the backing file it writes through, if any.
    pub(in crate::fs) fn created_open(
        &self,
        ino: Ino,
        (parent, new): (Ino, bool),
        staged: &Arc<Staged>,
        (fh, flags, afresh): (u64, OpenFlags, bool),
        register: &Register<'_>,
    ) -> OpResult<(FileAttr, Option<Arc<BackingId>>)> {
        let mut t = self.nodes.lock();
        t.link_into_parent(ino);
        if new {
            t.entries_changed(parent);
        }
        let i = t.get_mut(ino).ok_or(Errno::ENOENT)?;
        let backing = self.kernel_writer(i, staged, fh, flags, afresh, register)?;
        i.lookups += 1;
        i.open_handles += 1;
        Ok((
            t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT)?,
            backing,
        ))
    }

    /// **Attach**, a file created on the FUSE thread (CREATE of a name the fresh listing of
    /// `parent` does not have): the inode made for `path` (permission bits `perm`) takes the
    /// new copy `staged` with its first writer in, and joins the listing. Its inode, handle,
    /// attributes and backing file; None (and `staged` discarded) when the name was made or
    /// listed meanwhile, or the listing aged: the slow path decides.
    pub(in crate::fs) fn created_here(
        &self,
        (parent, name): (Ino, &str),
        path: &NodePath,
        staged: &Arc<Staged>,
        (perm, flags): (u32, i32),
        register: &Register<'_>,
    ) -> Option<(Ino, u64, FileAttr, Option<Arc<BackingId>>)> {
        let mut t = self.nodes.lock();
        let taken = (self.nodes)
            .fresh_names(&t, parent)
            .is_none_or(|n| n.contains_key(name))
            || t.ino_of(path)
                .and_then(|i| t.get(i))
                .is_some_and(|i| i.staged.is_some() || i.kind == InodeKind::Dir);
        if taken {
            drop(t);
            self.discard(staged);
            return None;
        }
        let ino = t.ensure(path, InodeKind::File);
        t.touch(ino);
        t.claim_vacated(ino);
        if !Self::attach(&mut t, ino, staged) {
            drop(t);
            self.discard(staged);
            return None;
        }
        t.link_into_parent(ino);
        t.entries_changed(parent);
        let fh = self.handles.next_fh();
        let i = t.get_mut(ino)?;
        i.unlinked = false;
        i.perm = Some(perm);
        // A fresh inode: nothing else has it open, no registration can conflict.
        let backing = self
            .kernel_writer(i, staged, fh, OpenFlags(flags), true, register)
            .unwrap_or(None);
        i.lookups += 1;
        i.open_handles += 1;
        let attr = t.attr(ino, self.uid, self.gid)?;
        Some((ino, fh, attr, backing))
    }

    /// **Remove** (UNLINK, RMDIR): `ino` at `path` leaves its folder `parent`, its cached
    /// bytes and staged copy with it; `kept`: the store kept its file (changed elsewhere),
    /// so the folder is listed again at its next use.
    pub(in crate::fs) fn unlinked(
        &self,
        ino: Ino,
        (parent, path): (Ino, &NodePath),
        removing: Removal<'_, B>,
        kept: bool,
    ) {
        let mut t = self.nodes.lock();
        if let Some(r) = t.get(ino).and_then(|i| i.remote.as_ref()) {
            self.reads.cache.invalidate(&r.id);
        }
        t.detach(ino);
        // (A folder removed here was empty.)
        self.thumbnails_gone(ino, path, false);
        removing.done();
        self.removed(&mut t, ino);
        t.entries_changed(parent);
        if kept {
            // Fetched again at its next use (no change on the store tells a follower).
            if let Some(past) = self.nodes.freshness.expired() {
                t.expire_listing(parent, past);
            }
        }
    }

    /// **Rename** to a conflict copy: the stored file at `dst` was changed elsewhere, so
    /// `ino` took the free name `copy` instead, and `dst` shows the store's file again.
    pub(in crate::fs) fn renamed_to_copy(
        &self,
        ino: Ino,
        copy: &NodePath,
        dst: &NodePath,
        parents: [Ino; 2],
    ) {
        let mut t = self.nodes.lock();
        t.rename(ino, copy);
        t.give_back(dst);
        self.renamed(&t, ino, copy);
        for p in parents {
            t.entries_changed(p);
        }
    }

    /// **Rename**: `m.ino` moved from `src` to `dst`. A file that exists only here takes the
    /// name; a remote file under that name gets its bytes as a new version when the upload
    /// runs. Nothing else of the target stays.
    pub(in crate::fs) fn renamed_here(&self, m: Moved, src: &NodePath, dst: &NodePath) {
        let Moved {
            ino,
            kind,
            stored: remote,
            target,
            node: moved,
            parents,
        } = m;
        let mut t = self.nodes.lock();
        if let Some(tino) = target {
            // The replaced file's bytes are gone (or about to be superseded): free their cache.
            if let Some(r) = t.get(tino).and_then(|i| i.remote.as_ref()) {
                self.reads.cache.invalidate(&r.id);
            }
            // What the bytes put here replace is what this mount knew of the target (its
            // own base while it had edits staged): a target changed elsewhere meanwhile makes
            // the upload a conflict (editors' save-by-rename).
            let target_base = t.get(tino).map(|i| i.known_base_here());
            self.replaced(&mut t, tino);
            // The replaced remote file's ID now belongs to the renamed one (same path).
            if !remote {
                let rid = t.get(tino).and_then(|i| i.remote.clone());
                if let Some(i) = t.get_mut(ino) {
                    i.remote = rid;
                }
                if let Some(b) = target_base {
                    Self::replaces(&t, ino, b);
                }
            }
        }
        t.rename(ino, dst);
        // A store that keeps the file it replaces (ours: `Store::transfer`) answers with that
        // file, the moved bytes its new version: the file here is that one now.
        let kept = moved.filter(|n| {
            kind == InodeKind::File && target.is_some() && {
                let id = t.get(ino).and_then(|i| i.remote.as_ref()).map(|r| &r.id);
                n.file_id().as_ref() != id
            }
        });
        if let Some(node) = kept {
            let moved_md5 = t.get(ino).and_then(|i| i.remote.as_ref()?.md5.clone());
            t.update_from(ino, &node);
            // Bytes staged here replace what the name holds now: the version moved (their
            // own base stays), or, the moved file having none, the file that was there.
            let now = node.md5_checksum.filter(|m| Some(m) != moved_md5.as_ref());
            if let Some(md5) = now {
                Self::replaces(&t, ino, Base::Md5(md5));
            }
        }
        if kind == InodeKind::File && !remote && target.is_none() {
            // A new file, not stored yet, renamed into a name a stored file left moments
            // before (Word's save: its new copy takes the name of the original, renamed
            // away): it continues that file (`history`).
            t.claim_vacated(ino);
        }
        let backup = dst.name().is_some_and(crate::fs::history::backup_name);
        if kind == InodeKind::File && remote && backup {
            // Renamed to a backup's name: the name it left may be taken by a new file that
            // continues it (`history`).
            if let Some(id) = t.get(ino).and_then(|i| Some(i.remote.as_ref()?.id.clone())) {
                t.vacate(src.clone(), ino, id);
            }
        }
        self.renamed(&t, ino, dst);
        for p in parents {
            t.entries_changed(p);
        }
    }
}
