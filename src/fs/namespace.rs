//! Changes to names and attributes: mkdir, create, unlink, rmdir, rename, setattr, and what
//! the mount refuses (links, device nodes, anything under `.preview`). Each change is made on
//! the backend before it is acknowledged, except a new file's creation, which its upload
//! carries. (The extended attributes: `xattrs`.)

use std::sync::Arc;

use fuser::{Errno, FileAttr, OpenFlags, RenameFlags, TimeOrNow};

use super::attrs::Keep;
use super::follow::Ours;
use super::io::Opened;
use super::passthrough::Register;
use super::staging::lifecycle::{Moved, Removal};
use super::table::{Ino, InodeKind};
use super::virtual_dirs::{is_virtual, is_virtual_name};
use super::{Fs, OpResult};
use crate::api::NodePath;
use crate::api::path::MAX_NAME_BYTES;
use crate::backend::Backend;

/// What a SETATTR without a size leaves after the inode table has the new attributes.
pub(crate) enum SetattrNow {
    /// Nothing to store: the attributes as they are now.
    Done(FileAttr),
    /// To be kept by the backend: [`Fs::setattr_keep`].
    Keep(Keep),
}

/// The numbers STATFS reports.
pub(crate) struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

impl<B: Backend> Fs<B> {
    /// The virtual folders (and their names in any folder: `.preview`, `.versions`...) cannot
    /// be made, changed or removed.
    pub(super) fn outside_previews(parent: Ino, name: &str) -> OpResult<()> {
        if is_virtual(parent) || is_virtual_name(name) {
            Err(Errno::EROFS.into())
        } else {
            Ok(())
        }
    }

    pub(super) fn writable(&self) -> OpResult<()> {
        if self.opts.read_only {
            Err(Errno::EROFS.into())
        } else {
            Ok(())
        }
    }

    pub(super) async fn mkdir(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<FileAttr> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let dir = self.dir_path(parent)?;
        if self.child(parent, name).await?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        let path = new_entry(&dir, name)?;
        let _ours = Ours::sending_to(self, Vec::new(), vec![path.clone()]);
        self.deletes_sent().await;
        let node = self.backend.create_folder(&path).await?;
        Ok(self
            .nodes
            .folder_made(parent, &path, &node, self.uid, self.gid)?)
    }

    /// `perm`: the permission bits a new file is created with (kept like a chmod's).
    pub(super) async fn create(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        flags: i32,
        perm: u32,
        register: &Register<'_>,
    ) -> OpResult<(FileAttr, Opened)> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let dir = self.dir_path(parent)?;
        let existing = self.child(parent, name).await?;
        let ino = match existing {
            Some(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST.into()),
            Some(ino) => {
                if self.nodes.kind(ino) == Some(InodeKind::Dir) {
                    return Err(Errno::EISDIR.into());
                }
                ino
            }
            None => self.nodes.file_made(&new_entry(&dir, name)?, perm),
        };
        let afresh = existing.is_none() || flags & libc::O_TRUNC != 0;
        let staged = self.stage(ino, afresh).await?;
        if existing.is_none() {
            // A new file is a change even with no bytes written: it must be created remotely.
            staged.mark_changed();
        }
        let fh = self.handles.next_fh();
        let new = existing.is_none();
        let open = (fh, OpenFlags(flags), afresh);
        let opened = self.created_open(ino, (parent, new), &staged, open, register);
        let (attr, backing) = match opened {
            Ok(o) => o,
            Err(e) => {
                self.release_staged(ino, &staged);
                return Err(e);
            }
        };
        Ok((attr, self.writer_handle(ino, fh, staged, backing)))
    }

    /// CREATE of a name a fresh listing does not have: all of it is local (the staging file,
    /// its journal entry), so it is answered on the FUSE thread. `None`: the slow path decides.
    pub(super) fn create_cached(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        flags: i32,
        perm: u32,
        register: &Register<'_>,
    ) -> Option<OpResult<(FileAttr, Opened)>> {
        if let Err(e) = Self::outside_previews(parent, name).and_then(|()| self.writable()) {
            return Some(Err(e));
        }
        let path = new_entry(&self.nodes.free_name_in(parent, name)?, name).ok()?;
        let staged = match self.journal.create(&path, None, crate::api::Base::Absent) {
            Ok(s) => Arc::new(s),
            Err(e) => return Some(Err(e.into())),
        };
        // A new file is a change even with no bytes written: it must be created remotely.
        staged.mark_changed();
        let Some((ino, fh, attr, backing)) =
            self.created_here((parent, name), &path, &staged, (perm, flags), register)
        else {
            return None; // made or listed meanwhile: the slow path sorts it out
        };
        Some(Ok((attr, self.writer_handle(ino, fh, staged, backing))))
    }

    pub(super) async fn setattr(
        self: &Arc<Self>,
        ino: Ino,
        size: Option<u64>,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
        (uid, gid): (Option<u32>, Option<u32>),
    ) -> OpResult<FileAttr> {
        self.may_setattr(ino, uid, gid)?;
        if let Some(size) = size {
            self.writable()?;
            if self.path_of(ino)?.1 == InodeKind::Dir {
                return Err(Errno::EISDIR.into());
            }
            // A writer for the time of the truncate: released, it settles the file like a
            // close (truncate(2) without an open handle is the whole change).
            let staged = self.stage(ino, size == 0).await?;
            let r = staged.truncate(size);
            self.release_staged(ino, &staged);
            r?;
        }
        self.set_attrs(ino, times, mode).await
    }

    /// Nothing in `.preview` changes; files belong to the mounting user. A node the store no
    /// longer has is looked up again first (ESTALE: truncate(2), chmod(2) and utimensat(2)
    /// retry once so), or a truncate through the kernel's old entry would change nothing.
    pub(super) fn may_setattr(&self, ino: Ino, uid: Option<u32>, gid: Option<u32>) -> OpResult<()> {
        if is_virtual(ino) {
            return Err(Errno::EROFS.into());
        }
        if self.nodes.inode(ino, |i| i.gone_elsewhere).unwrap_or(false) {
            return Err(Errno::ESTALE.into());
        }
        if uid.is_some_and(|u| u != self.uid) || gid.is_some_and(|g| g != self.gid) {
            return Err(Errno::EPERM.into());
        }
        Ok(())
    }

    /// SETATTR of times and mode (and a chown to oneself): set in the inode table, then kept
    /// by the backend (`attrs.rs`).
    pub(super) async fn set_attrs(
        self: &Arc<Self>,
        ino: Ino,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
    ) -> OpResult<FileAttr> {
        let keep = self.set_attrs_here(ino, times, mode);
        self.keep_attrs(ino, keep).await;
        self.attr(ino)
    }

    pub(super) async fn remove(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        dir: bool,
    ) -> OpResult<()> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let (path, kind, io) = (self.nodes)
            .inode(ino, |i| (i.path.clone(), i.kind, i.io.clone()))
            .ok_or(Errno::ENOENT)?;
        match (kind, dir) {
            (InodeKind::Dir, false) => return Err(Errno::EISDIR.into()),
            (InodeKind::File, true) => return Err(Errno::ENOTDIR.into()),
            _ => {}
        }
        if dir {
            self.refresh_listing(ino, &path).await?;
            let empty = self
                .nodes
                .inode(ino, |i| {
                    !i.hidden_preview && i.listing().is_none_or(|(_, n)| n.is_empty())
                })
                .unwrap_or(true);
            if !empty {
                return Err(Errno::ENOTEMPTY.into());
            }
        }
        // An upload of the file under way stops instead of being waited for (it holds `io`);
        // a file it made remotely already (`create_file`) is deleted below.
        let uploading = self.uploads.is_uploading(ino);
        let removing = Removal::start(self, ino);
        let _io = io.lock().await;
        let remote = (self.nodes)
            .inode(ino, |i| i.kind == InodeKind::Dir || i.remote.is_some())
            .unwrap_or(false);
        if !remote && uploading && kind == InodeKind::File && self.backend.puts_whole() {
            // A new file's upload in one request (`Backend::put_whole`) that stopped may have
            // made the file on the store without its bytes: it goes while still empty. (The
            // server takes it away itself too, where its request failed.)
            if let Err(e) = (self.delete_unless_changed(&path, &crate::api::Base::Absent)).await {
                log::warn!("{path}: the empty file a stopped upload may have made stays: {e}");
            }
        }
        let _ours = Ours::sending(self, vec![ino]);
        // A file changed elsewhere since this mount knew it stays on the store: an edit beats
        // a delete (`conflict`). The name goes here, and comes back with the next listing.
        let known = match kind {
            InodeKind::File if remote => self.known_of(ino),
            _ => None,
        };
        let mut kept = match &known {
            Some(k) => self.changed_since_known(k, &path).await,
            None => false,
        };
        let known_id = known.as_ref().map(|(id, _)| id.clone());
        let base = known.map_or(crate::api::Base::Any, |(_, b)| b);
        // A backup a new file continues (an editor's save by rename): the new file takes it
        // back under its own name (`history`), so it is not deleted here.
        let handed_over =
            kind == InodeKind::File && remote && !kept && self.hand_over_delete(ino, &path, &base);
        if remote && !kept && !handed_over {
            if !dir && self.deletes_later(uploading) {
                // Answered now, sent with the next batch (`deletes`), still only if the store's
                // file holds `base` then.
                (self.deletes).push(super::deletes::Pending {
                    path: path.clone(),
                    base: base.clone(),
                    id: known_id.clone(),
                });
            } else {
                // Checked again by the store where nothing comes in between (the model: a
                // first version stored between the look and the delete went with the file).
                kept = self.delete_unless_changed(&path, &base).await?;
            }
            if let (false, Some(id)) = (kept, known_id) {
                // A new file made under the name moments from now continues it (`history`).
                self.nodes.vacate_deleted(path.clone(), id);
            }
        }
        if !dir {
            // A new file removed before it continued a renamed one: that one goes too.
            self.drop_claim(ino).await;
        }
        self.unlinked(ino, (parent, &path), removing, kept);
        if dir {
            self.pins_moved(&path, None);
        }
        Ok(())
    }

    /// Deletes `path` from the store if it still holds `base`; true when it was changed
    /// elsewhere and stays (an edit beats a delete). Gone already counts as deleted.
    pub(super) async fn delete_unless_changed(
        &self,
        path: &NodePath,
        base: &crate::api::Base,
    ) -> crate::api::Result<bool> {
        match self.backend.delete_if(path, base).await {
            Ok(()) => Ok(false),
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => Ok(false),
            Err(e) if e.kind == crate::api::ErrorKind::Precondition => {
                log::warn!(
                    "{path} was changed elsewhere just now; not deleted from the store (an edit \
                     beats a delete)"
                );
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Before a rename of `ino`: a file not stored yet is stored first when another
    /// process has the built-in store open (a mount of the same folder, `vaultfs serve`), so
    /// that the moved name is on the store when the rename returns: that process sees only
    /// what is stored, and the file would have turned up there later, under the new name
    /// (fstests generic/732: `touch a/f; mv a/f b/` here, `cat b/f` there). Alone with the
    /// store, the move waits for nothing (rsync's and the editors' saves by rename), and a
    /// temporary copy held back for a save by rename stays so (`history`). Over a server the
    /// upload goes on after the rename as before: its other clients see the name once stored.
    async fn store_before_moving(self: &Arc<Self>, ino: Ino) {
        let Some(local) = self.backend.local() else {
            return;
        };
        let staged = (self.nodes)
            .inode(ino, |i| {
                i.staged
                    .clone()
                    .filter(|_| i.remote.is_none() && !i.unlinked)
            })
            .flatten();
        // (Its writer too may not have left yet: the kernel sends RELEASE after close(2)
        // returns, and `touch f; mv f g` renames before it comes.)
        let Some(staged) = staged.filter(|s| s.is_dirty()) else {
            return;
        };
        if self.held_back(ino).is_some() || !local.shared() {
            return;
        }
        if !super::writeback::flush(self, ino, &staged).await {
            // Left to the retry policy; the rename goes on here as it would alone.
            log::debug!("inode {ino}: not stored before its rename");
        }
    }

    pub(super) async fn rename(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        newparent: Ino,
        newname: &str,
        flags: RenameFlags,
    ) -> OpResult<()> {
        Self::outside_previews(parent, name)?;
        Self::outside_previews(newparent, newname)?;
        self.writable()?;
        if flags.bits() & RENAME_EXCHANGE != 0 {
            return Err(Errno::EINVAL.into());
        }
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let dst_dir = self.dir_path(newparent)?;
        let dst = new_entry(&dst_dir, newname)?;
        let target = self.child(newparent, newname).await?;
        let (src, kind, io) = (self.nodes)
            .inode(ino, |i| (i.path.clone(), i.kind, i.io.clone()))
            .ok_or(Errno::ENOENT)?;
        if src == dst {
            return Ok(());
        }
        if kind == InodeKind::Dir && src.contains(&dst) {
            return Err(Errno::EINVAL.into());
        }
        if let Some(tino) = target {
            if flags.bits() & RENAME_NOREPLACE != 0 {
                return Err(Errno::EEXIST.into());
            }
            let tkind = self.nodes.kind(tino);
            match (kind, tkind) {
                (InodeKind::File, Some(InodeKind::Dir)) => return Err(Errno::EISDIR.into()),
                (InodeKind::Dir, Some(InodeKind::File)) => return Err(Errno::ENOTDIR.into()),
                (InodeKind::Dir, Some(InodeKind::Dir)) => {
                    let tpath = dst.clone();
                    self.refresh_listing(tino, &tpath).await?;
                    let empty = self
                        .nodes
                        .inode(tino, |i| i.listing().is_none_or(|(_, n)| n.is_empty()))
                        .unwrap_or(true);
                    if !empty {
                        return Err(Errno::ENOTEMPTY.into());
                    }
                }
                _ => {}
            }
        }
        if kind == InodeKind::File {
            self.store_before_moving(ino).await;
        }
        // The target's upload, if one runs, must not land after the move and overwrite what
        // was moved there: hold both files' locks (in inode order, so two renames cannot wait on
        // each other). After the lock, an upload that was running may have created the source
        // remotely.
        let target_io = target.and_then(|t| self.nodes.inode(t, |i| (t, i.io.clone())));
        let _locked = super::lock_io_in_order((ino, io.clone()), target_io).await;
        let remote = self
            .nodes
            .inode(ino, |i| i.kind == InodeKind::Dir || i.remote.is_some())
            .unwrap_or(false);
        // `rm b; mv a b`: the store has let go of `b` before the move (`deletes`).
        self.deletes_sent().await;
        let inos = [Some(ino), target].into_iter().flatten().collect();
        let _ours = Ours::sending_to(self, inos, vec![dst.clone()]);
        // A stored file put over one changed elsewhere since this mount knew it: it goes to a
        // conflict copy instead, and the name keeps the store's version (`conflict`).
        let known = match target {
            Some(tino) => (self.nodes)
                .inode(tino, |i| {
                    (i.kind == InodeKind::File).then(|| i.known_base_here())
                })
                .flatten(),
            // A name this mount knows no file at: one another writer put there is not
            // replaced either.
            None if kind == InodeKind::File => Some(crate::api::Base::Absent),
            None => None,
        };
        let copy = match (&known, remote) {
            (Some(known), true) => self.rename_over_changed(&dst, known).await,
            _ => None,
        };
        if let Some(copy) = copy {
            self.backend.rename(&src, &copy, false).await?;
            self.renamed_to_copy(ino, &copy, &dst, [parent, newparent]);
            // The kernel moves its entry to `dst` when this returns: dropped again after that.
            if let Some(n) = self.notifier.get().cloned() {
                let name = newname.to_string();
                tokio::task::spawn_blocking(move || {
                    let _ = n.inval_entry(fuser::INodeNo(newparent), std::ffi::OsStr::new(&name));
                });
            }
            return Ok(());
        }
        let moved = if remote {
            let node = self.backend.rename(&src, &dst, true).await;
            if let (Err(e), Some(past)) = (&node, self.nodes.freshness.expired()) {
                // Gone meanwhile, maybe (the feed's word of it waits for this answer:
                // `follow::gone`): both folders are listed again.
                if e.kind == crate::api::ErrorKind::NotFound {
                    self.nodes.expire_listings(&[parent, newparent], past);
                }
            }
            Some(node?)
        } else {
            None
        };
        // A file that exists only here takes the name; a remote file under that name gets its
        // bytes as a new version when the upload runs. Nothing else of the target stays.
        let moved = Moved {
            ino,
            kind,
            stored: remote,
            target,
            node: moved,
            parents: [parent, newparent],
        };
        self.renamed_here(moved, &src, &dst);
        if kind == InodeKind::Dir {
            self.pins_moved(&src, Some(&dst));
        }
        Ok(())
    }

    /// SETATTR without a size, on the FUSE thread: applied to the inode table at once; what
    /// the backend is to keep, if anything, is left to [`Fs::setattr_keep`].
    pub(super) fn setattr_now(
        &self,
        ino: Ino,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
        (uid, gid): (Option<u32>, Option<u32>),
    ) -> OpResult<SetattrNow> {
        self.may_setattr(ino, uid, gid)?;
        match self.set_attrs_here(ino, times, mode) {
            Keep::Nothing => self.attr(ino).map(SetattrNow::Done),
            keep => Ok(SetattrNow::Keep(keep)),
        }
    }

    /// The rest of [`Fs::setattr_now`]: the backend keeps the attributes.
    pub(super) async fn setattr_keep(self: &Arc<Self>, ino: Ino, keep: Keep) -> OpResult<FileAttr> {
        self.keep_attrs(ino, keep).await;
        self.attr(ino)
    }

    pub(super) async fn unlink(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<()> {
        self.remove(parent, name, false).await
    }

    pub(super) async fn rmdir(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<()> {
        self.remove(parent, name, true).await
    }

    /// Links, symlinks and special files (MKNOD, SYMLINK, LINK into `parent`): not in a
    /// document store (EPERM), and nothing at all inside `.preview` (EROFS).
    pub(super) fn refused(parent: Ino) -> Errno {
        if is_virtual(parent) {
            Errno::EROFS
        } else {
            Errno::EPERM
        }
    }

    /// STATFS: the account's byte quota and use where the store keeps one (`space`); else the
    /// cache dir's disk: writes are staged there first, so its free space is what a writer can
    /// use.
    pub(super) fn statfs(self: &Arc<Self>) -> Statfs {
        let local = self.cache_disk();
        self.quota_statfs(&local).unwrap_or(local)
    }

    /// The cache dir's disk as STATFS shows it.
    fn cache_disk(&self) -> Statfs {
        let dir = std::ffi::CString::new(self.opts.cache_dir.as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: statvfs fills the zeroed struct we pass for a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(dir.as_ptr(), &mut st) } != 0 {
            return Statfs {
                blocks: 0,
                bfree: 0,
                bavail: 0,
                files: 0,
                ffree: 0,
                bsize: 4096,
                namelen: MAX_NAME_BYTES as u32,
                frsize: 4096,
            };
        }
        // (u32 on macOS.)
        #[allow(clippy::unnecessary_cast)]
        Statfs {
            blocks: st.f_blocks as u64,
            bfree: st.f_bfree as u64,
            bavail: st.f_bavail as u64,
            files: st.f_files as u64,
            ffree: st.f_ffree as u64,
            bsize: st.f_bsize as u32,
            namelen: MAX_NAME_BYTES as u32,
            frsize: st.f_frsize as u32,
        }
    }
}

/// rename(2)'s flags as the kernel sends them: renameat2's on Linux, renamex_np's through
/// macFUSE (`RENAME_SWAP`, `RENAME_EXCL`).
#[cfg(target_os = "linux")]
const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;
#[cfg(target_os = "linux")]
const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
#[cfg(not(target_os = "linux"))]
const RENAME_EXCHANGE: u32 = 0x2;
#[cfg(not(target_os = "linux"))]
const RENAME_NOREPLACE: u32 = 0x4;

/// The path of a new entry `name` in `dir`. Made where the store keeps no files or folders
/// (the root, an account), it is refused now (EACCES, as the store's 403 for the same): else the
/// create would succeed and every upload of it fail.
fn new_entry(dir: &NodePath, name: &str) -> OpResult<NodePath> {
    if !dir.holds_entries() {
        return Err(Errno::EACCES.into());
    }
    dir.child(name).map_err(|_| Errno::EINVAL.into())
}
