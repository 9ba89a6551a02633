//! The kernel's requests (fuser's `Filesystem`), mapped onto the backend as DESIGN.md §3 says.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::errno::{errno, io_errno};
use super::preview::{DIR_NAME, is_virtual};
use super::staging::Staged;
use super::table::{Ino, Kind, ROOT};
use super::{Fs, Handle, upload};
use crate::api::NodePath;
use crate::api::path::{MAX_NAME_BYTES, validate_name};
use crate::backend::{Backend, LIST_PAGE, list_all};

/// The `Filesystem` the session runs: a handle on the shared state.
pub struct VaultFs<B: Backend>(pub Arc<Fs<B>>);

type OpResult<T> = Result<T, Errno>;

/// After the backend was unreachable, cached listings are served without retrying for this long.
const OFFLINE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a request waits for the refresh of a folder listing it has (older than the listing
/// TTL) before it is answered from that listing while the refresh goes on.
const STALE_LISTING_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

const XATTRS: [&str; 4] = [
    "user.vaultfs.id",
    "user.vaultfs.link_uri",
    "user.vaultfs.preview_link_uri",
    "user.vaultfs.download_link_uri",
];

fn name_of(name: &OsStr) -> OpResult<&str> {
    let s = name.to_str().ok_or(Errno::EINVAL)?;
    if s.len() > MAX_NAME_BYTES {
        return Err(Errno::ENAMETOOLONG);
    }
    validate_name(s).map_err(|_| Errno::EINVAL)?;
    Ok(s)
}

impl<B: Backend> Fs<B> {
    fn ttl(&self) -> std::time::Duration {
        self.opts.attr_ttl
    }

    /// The backend failed recently: serve what we have without asking again.
    fn offline(&self) -> bool {
        self.offline_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() < t)
    }

    fn attr(&self, ino: Ino) -> OpResult<fuser::FileAttr> {
        self.table()
            .attr(ino, self.uid, self.gid)
            .ok_or(Errno::ENOENT)
    }

    fn path_of(&self, ino: Ino) -> OpResult<(NodePath, Kind)> {
        let t = self.table();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        if i.unlinked {
            return Err(Errno::ENOENT);
        }
        Ok((i.path.clone(), i.kind))
    }

    fn dir_path(&self, ino: Ino) -> OpResult<NodePath> {
        match self.path_of(ino)? {
            (p, Kind::Dir) => Ok(p),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The virtual `.preview` tree (and the name `.preview` in any folder) cannot be made,
    /// changed or removed.
    fn outside_previews(parent: Ino, name: &str) -> OpResult<()> {
        if is_virtual(parent) || name == DIR_NAME {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    fn writable(&self) -> OpResult<()> {
        if self.opts.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// Makes sure the directory's listing is loaded and younger than `dir_ttl`.
    pub(super) async fn ensure_listing(self: &Arc<Self>, dir: Ino) -> OpResult<()> {
        let (path, have) = {
            let t = self.table();
            let i = t.get(dir).ok_or(Errno::ENOENT)?;
            if i.kind != Kind::Dir {
                return Err(Errno::ENOTDIR);
            }
            if i.listing().is_some_and(|(at, _)| self.fresh(*at)) {
                return Ok(());
            }
            (i.path.clone(), i.listing().is_some())
        };
        if have && self.offline() {
            return Ok(());
        }
        if !have {
            return self.refresh_listing(dir, &path).await;
        }
        // A listing we have, even old, beats waiting on a slow or silent server.
        let fs = self.clone();
        let refresh = async move {
            let r = fs.refresh_listing(dir, &path).await;
            if r == Err(Errno::EIO) {
                // Backend away: for a while no `ls` waits for the network to fail again.
                log::debug!("listing {path} from cache: backend unreachable");
                *fs.offline_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Instant::now() + OFFLINE_GRACE);
            }
            r
        };
        match self
            .refresh_briefly(|fs| &fs.refreshing, dir, refresh)
            .await
        {
            Some(Err(e)) if e != Errno::EIO => Err(e),
            _ => Ok(()),
        }
    }

    /// Runs `refresh` of `ino` as its own task, unless one runs already (`running` picks the
    /// set of inodes with such a refresh under way), and waits for it at most [`STALE_LISTING_WAIT`]: its
    /// result if it came by then. A request is then answered from what the mount has, and a
    /// slow or silent server never holds it up for longer.
    async fn refresh_briefly(
        self: &Arc<Self>,
        running: fn(&Self) -> &std::sync::Mutex<std::collections::HashSet<Ino>>,
        ino: Ino,
        refresh: impl std::future::Future<Output = OpResult<()>> + Send + 'static,
    ) -> Option<OpResult<()>> {
        if !running(self)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ino)
        {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fs = self.clone();
        self.rt.spawn(async move {
            let r = refresh.await;
            running(&fs)
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&ino);
            let _ = tx.send(r);
        });
        tokio::time::timeout(STALE_LISTING_WAIT, rx)
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Fetches a listing from the backend and merges it with what exists only here.
    async fn refresh_listing(self: &Arc<Self>, dir: Ino, path: &NodePath) -> OpResult<()> {
        let started = Instant::now();
        let mut node = list_all(self.backend.as_ref(), path, LIST_PAGE)
            .await
            .map_err(|e| errno(&e))?;
        let children = node.children.take().unwrap_or_default();
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        {
            let mut t = self.table();
            let mut names = std::collections::BTreeMap::new();
            let mut hidden_preview = false;
            for child in &children {
                // A real `.preview` is hidden by the virtual one and never touched.
                if child.name == DIR_NAME {
                    hidden_preview = true;
                    continue;
                }
                let Ok(cpath) = path.child(&child.name) else {
                    continue;
                };
                if t.removed_since(&cpath, started) {
                    continue; // removed here while the listing was on its way
                }
                let (ino, content_changed) = t.upsert(&cpath, child);
                if content_changed {
                    changed.push(ino);
                }
                names.insert(child.name.clone(), ino);
            }
            for (name, ino) in t.local_children(path, started) {
                names.insert(name, ino);
            }
            let old = t
                .get(dir)
                .and_then(|i| i.listing())
                .map(|(_, n)| n.clone())
                .unwrap_or_default();
            for (name, ino) in old {
                if names.contains_key(&name) {
                    continue;
                }
                // Created, renamed here or uploaded after the listing was asked for: keep.
                let recent = t.get(ino).is_some_and(|i| {
                    !i.unlinked && i.touched >= started && i.path.name() == Some(&name)
                });
                if recent {
                    names.insert(name, ino);
                } else {
                    gone.push((name, ino));
                }
            }
            if dir != ROOT {
                t.update_from(dir, &node);
            }
            if let Some(i) = t.get_mut(dir) {
                i.set_listing(names);
                i.hidden_preview = hidden_preview;
            }
            for (_, ino) in &gone {
                t.detach(*ino);
            }
        }
        // Changes made elsewhere: the kernel drops what it cached (outside any request).
        if let Some(n) = self.notifier.get().cloned() {
            if !changed.is_empty() || !gone.is_empty() {
                tokio::task::spawn_blocking(move || {
                    for ino in changed {
                        let _ = n.inval_inode(INodeNo(ino), 0, 0);
                    }
                    for (name, _) in gone {
                        let _ = n.inval_entry(INodeNo(dir), OsStr::new(&name));
                    }
                });
            }
        }
        Ok(())
    }

    /// The inode of `name` in `dir`, from a fresh listing.
    pub(super) async fn child(self: &Arc<Self>, dir: Ino, name: &str) -> OpResult<Option<Ino>> {
        self.ensure_listing(dir).await?;
        let t = self.table();
        Ok(t.get(dir)
            .and_then(|i| i.listing())
            .and_then(|(_, n)| n.get(name).copied()))
    }

    fn new_fh(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.handles().insert(fh, h);
        fh
    }

    /// The staged copy of a file, created (with its content, unless `truncate`) if there is
    /// none, with one more writer counted. The count is taken with the table locked, where a
    /// finished upload decides to retire the staged copy, so a writer never writes to a retired
    /// copy; the caller gives it back with `release_staged`.
    async fn stage(self: &Arc<Self>, ino: Ino, truncate: bool) -> OpResult<Arc<Staged>> {
        let (path, remote) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            if let Some(s) = &i.staged {
                let s = s.clone();
                s.writers.fetch_add(1, Ordering::SeqCst);
                drop(t);
                if truncate {
                    if let Err(e) = s.truncate(0) {
                        self.release_staged(ino, &s);
                        return Err(io_errno(&e));
                    }
                }
                return Ok(s);
            }
            (i.path.clone(), i.remote.clone())
        };
        let staged = self
            .journal
            .create(&path, remote.as_ref().map(|r| r.id.clone()))
            .map_err(|e| io_errno(&e))?;
        if let Some(r) = remote.as_ref().filter(|r| !truncate && r.size > 0) {
            let entry = self
                .cache
                .entry(&r.id, r.md5.as_deref(), r.size)
                .map_err(|e| errno(&e))?;
            if let Err(e) = self
                .cache
                .copy_into(self.backend.as_ref(), &entry, &staged.file())
                .await
            {
                self.journal.finish(&staged);
                return Err(errno(&e));
            }
            staged.truncate(r.size).map_err(|e| io_errno(&e))?;
            // The copy is the stored content: not a change to upload by itself.
            staged.mark_uploaded(staged.generation());
        }
        let staged = Arc::new(staged);
        let mut t = self.table();
        let (staged, truncate) = match t.get(ino).and_then(|i| i.staged.clone()) {
            // Someone staged it meanwhile: use theirs.
            Some(other) => {
                self.journal.finish(&staged);
                (other, truncate)
            }
            None => {
                t.set_staged(ino, Some(staged.clone()));
                (staged, truncate && remote.is_some())
            }
        };
        staged.writers.fetch_add(1, Ordering::SeqCst);
        drop(t);
        if truncate {
            if let Err(e) = staged.truncate(0) {
                self.release_staged(ino, &staged);
                return Err(io_errno(&e));
            }
        }
        Ok(staged)
    }

    /// A writer is done with a staged file: journal it and start its upload when it was the
    /// last one and something changed; drop the staged copy when nothing did.
    fn release_staged(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        if staged.writers.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        self.settle(ino, staged);
    }

    /// With no writer left: upload if dirty, else retire the staged copy.
    pub(super) fn settle(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        let mut t = self.table();
        let Some(inode) = t.get(ino) else { return };
        if inode.unlinked {
            self.journal.finish(staged);
            t.set_staged(ino, None);
            t.maybe_drop(ino);
            return;
        }
        if staged.is_dirty() {
            let (path, id) = (
                inode.path.clone(),
                inode.remote.as_ref().map(|r| r.id.clone()),
            );
            if let Err(e) = self.journal.record(staged, &path, id) {
                log::error!("could not journal {path}: {e}");
            }
            drop(t);
            upload::schedule(self, ino);
        } else {
            // Clean: every generation is stored (or nothing was written). An upload task that
            // still holds it finds nothing to do. (No `uploading` lock here: the uploader takes
            // that lock before the table's, and the order must not be reversed.)
            self.journal.finish(staged);
            t.set_staged(ino, None);
            t.maybe_drop(ino);
        }
    }

    fn release_handle(self: &Arc<Self>, fh: u64) {
        let Some(h) = self.handles().remove(&fh) else {
            return;
        };
        if let Handle::File { ino, staged } = h {
            if let Some(s) = staged {
                self.release_staged(ino, &s);
            }
            let mut t = self.table();
            if let Some(i) = t.get_mut(ino) {
                i.open_handles = i.open_handles.saturating_sub(1);
            }
            t.maybe_drop(ino);
        }
    }

    async fn do_lookup(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<fuser::FileAttr> {
        if is_virtual(parent) || name == DIR_NAME {
            return self.preview_lookup(parent, name).await;
        }
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let mut t = self.table();
        t.get_mut(ino).ok_or(Errno::ENOENT)?.lookups += 1;
        t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT)
    }

    async fn do_getattr(self: &Arc<Self>, ino: Ino) -> OpResult<fuser::FileAttr> {
        if is_virtual(ino) {
            return self.preview_getattr(ino).await;
        }
        let stale = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (ino != ROOT
                && !self.offline()
                && i.staged.is_none()
                && !i.unlinked
                && !self.fresh(i.fetched))
            .then(|| i.path.clone())
        };
        // Attributes we have beat waiting on a slow or silent server.
        if let Some(path) = stale {
            let fs = self.clone();
            let refresh = async move { fs.refresh_attr(ino, &path).await };
            if let Some(Err(e)) = self
                .refresh_briefly(|fs| &fs.attr_refreshing, ino, refresh)
                .await
            {
                return Err(e);
            }
        }
        self.attr(ino)
    }

    /// Asks the backend for a node's attributes again; ENOENT when it is gone.
    async fn refresh_attr(self: &Arc<Self>, ino: Ino, path: &NodePath) -> OpResult<()> {
        match self.backend.node(path).await {
            Ok(node) => {
                let changed = self.table().update_from(ino, &node);
                if changed {
                    if let Some(n) = self.notifier.get().cloned() {
                        tokio::task::spawn_blocking(move || n.inval_inode(INodeNo(ino), 0, 0));
                    }
                }
                Ok(())
            }
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => {
                self.table().detach(ino);
                Err(Errno::ENOENT)
            }
            // Offline: the attributes we have are the best answer.
            Err(e) => {
                log::debug!("getattr of {path} from cache: {e}");
                Ok(())
            }
        }
    }

    async fn do_mkdir(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<fuser::FileAttr> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let dir = self.dir_path(parent)?;
        if self.child(parent, name).await?.is_some() {
            return Err(Errno::EEXIST);
        }
        let path = dir.child(name).map_err(|_| Errno::EINVAL)?;
        let node = self
            .backend
            .create_folder(&path)
            .await
            .map_err(|e| errno(&e))?;
        let mut t = self.table();
        let (ino, _) = t.upsert(&path, &node);
        let i = t.get_mut(ino).expect("just inserted");
        i.set_listing(Default::default());
        i.lookups += 1;
        t.touch(ino);
        t.link_into_parent(ino);
        t.entries_changed(parent);
        t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT)
    }

    /// `exec`: the execute bits of the mode a new file is created with (kept like a chmod's).
    async fn do_create(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        flags: i32,
        exec: u32,
    ) -> OpResult<(fuser::FileAttr, u64)> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let dir = self.dir_path(parent)?;
        let existing = self.child(parent, name).await?;
        let ino = match existing {
            Some(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST),
            Some(ino) => {
                if self.table().get(ino).map(|i| i.kind) == Some(Kind::Dir) {
                    return Err(Errno::EISDIR);
                }
                ino
            }
            None => {
                let path = dir.child(name).map_err(|_| Errno::EINVAL)?;
                let mut t = self.table();
                let ino = t.ensure(&path, Kind::File);
                t.touch(ino);
                if let Some(i) = t.get_mut(ino) {
                    i.unlinked = false;
                    i.exec = Some(exec);
                }
                ino
            }
        };
        let staged = self
            .stage(ino, existing.is_none() || flags & libc::O_TRUNC != 0)
            .await?;
        if existing.is_none() {
            // A new file is a change even with no bytes written: it must be created remotely.
            staged.mark_changed();
        }
        let attr = {
            let mut t = self.table();
            t.link_into_parent(ino);
            if existing.is_none() {
                t.entries_changed(parent);
            }
            let i = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            i.lookups += 1;
            i.open_handles += 1;
            t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT)?
        };
        let fh = self.new_fh(Handle::File {
            ino,
            staged: Some(staged),
        });
        Ok((attr, fh))
    }

    /// The listing of `dir` when it is loaded and younger than its TTL (no backend call needed).
    fn fresh_listing<'t>(
        &self,
        t: &'t super::table::Table,
        dir: Ino,
    ) -> Option<&'t std::collections::BTreeMap<String, Ino>> {
        let (at, names) = t.get(dir)?.listing()?;
        self.fresh(*at).then_some(names)
    }

    /// LOOKUP answered from memory when the folder's listing is fresh: on the FUSE thread, with
    /// no task and no wait (`None`: the backend may be needed).
    fn lookup_cached(&self, parent: Ino, name: &str) -> Option<OpResult<fuser::FileAttr>> {
        if is_virtual(parent) || name == DIR_NAME {
            return None;
        }
        let mut t = self.table();
        let child = self.fresh_listing(&t, parent)?.get(name).copied();
        let Some(ino) = child else {
            return Some(Err(Errno::ENOENT));
        };
        t.get_mut(ino)?.lookups += 1;
        Some(t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT))
    }

    /// GETATTR answered from memory when the attributes need no refresh (see `do_getattr`).
    fn getattr_cached(&self, ino: Ino) -> Option<fuser::FileAttr> {
        if is_virtual(ino) {
            return None;
        }
        let t = self.table();
        let i = t.get(ino)?;
        let stale = ino != ROOT && i.staged.is_none() && !i.unlinked && !self.fresh(i.fetched);
        if stale && !self.offline() {
            return None;
        }
        t.attr(ino, self.uid, self.gid)
    }

    /// CREATE of a name a fresh listing does not have: all of it is local (the staging file,
    /// its journal entry), so it is answered on the FUSE thread. `None`: the slow path decides.
    fn create_cached(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
        exec: u32,
    ) -> Option<OpResult<(fuser::FileAttr, u64)>> {
        if let Err(e) = Self::outside_previews(parent, name).and_then(|()| self.writable()) {
            return Some(Err(e));
        }
        let path = {
            let t = self.table();
            if self.fresh_listing(&t, parent)?.contains_key(name) {
                return None;
            }
            t.get(parent)?.path.child(name).ok()?
        };
        let staged = match self.journal.create(&path, None) {
            Ok(s) => Arc::new(s),
            Err(e) => return Some(Err(io_errno(&e))),
        };
        // A new file is a change even with no bytes written: it must be created remotely.
        staged.mark_changed();
        staged.writers.store(1, Ordering::SeqCst);
        let mut t = self.table();
        let taken = self
            .fresh_listing(&t, parent)
            .is_none_or(|n| n.contains_key(name))
            || t.ino_of(&path)
                .and_then(|i| t.get(i))
                .is_some_and(|i| i.staged.is_some() || i.kind == Kind::Dir);
        if taken {
            // Made or listed meanwhile: the slow path sorts it out.
            drop(t);
            self.journal.finish(&staged);
            return None;
        }
        let ino = t.ensure(&path, Kind::File);
        t.touch(ino);
        t.set_staged(ino, Some(staged.clone()));
        t.link_into_parent(ino);
        t.entries_changed(parent);
        let i = t.get_mut(ino)?;
        i.unlinked = false;
        i.exec = Some(exec);
        i.lookups += 1;
        i.open_handles += 1;
        let attr = t.attr(ino, self.uid, self.gid)?;
        drop(t);
        let fh = self.new_fh(Handle::File {
            ino,
            staged: Some(staged),
        });
        Some(Ok((attr, fh)))
    }

    async fn do_open(self: &Arc<Self>, ino: Ino, flags: OpenFlags) -> OpResult<(u64, FopenFlags)> {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        if is_virtual(ino) {
            let open = self.preview_open(ino, write || flags.0 & libc::O_TRUNC != 0)?;
            return Ok((self.new_fh(Handle::File { ino, staged: None }), open));
        }
        let (kind, keep) = {
            let mut t = self.table();
            let i = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            // The kernel may keep its cached pages when the content is what it last saw.
            let md5 = i.remote.as_ref().and_then(|r| r.md5.clone());
            let keep = i.staged.is_some() || (md5.is_some() && md5 == i.kernel_md5);
            if i.staged.is_none() {
                i.kernel_md5 = md5;
            }
            (i.kind, keep)
        };
        if kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        let staged = if write {
            self.writable()?;
            Some(self.stage(ino, flags.0 & libc::O_TRUNC != 0).await?)
        } else {
            None
        };
        if let Some(i) = self.table().get_mut(ino) {
            i.open_handles += 1;
        }
        let fh = self.new_fh(Handle::File { ino, staged });
        Ok((
            fh,
            if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            },
        ))
    }

    async fn do_read(self: &Arc<Self>, ino: Ino, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        if is_virtual(ino) {
            return self.preview_read(ino, offset, size).await;
        }
        let (staged, remote) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (i.staged.clone(), i.remote.clone())
        };
        if let Some(s) = staged {
            return s.read_at(offset, size as usize).map_err(|e| io_errno(&e));
        }
        let Some(r) = remote else {
            return Ok(Vec::new());
        };
        let entry = self
            .cache
            .entry(&r.id, r.md5.as_deref(), r.size)
            .map_err(|e| errno(&e))?;
        self.cache
            .read(self.backend.as_ref(), &entry, offset, size as usize)
            .await
            .map_err(|e| errno(&e))
    }

    async fn do_setattr(
        self: &Arc<Self>,
        ino: Ino,
        size: Option<u64>,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
        (uid, gid): (Option<u32>, Option<u32>),
    ) -> OpResult<fuser::FileAttr> {
        self.may_setattr(ino, uid, gid)?;
        if let Some(size) = size {
            self.writable()?;
            if self.path_of(ino)?.1 == Kind::Dir {
                return Err(Errno::EISDIR);
            }
            // A writer for the time of the truncate: released, it settles the file like a
            // close (truncate(2) without an open handle is the whole change).
            let staged = self.stage(ino, size == 0).await?;
            let r = staged.truncate(size);
            self.release_staged(ino, &staged);
            r.map_err(|e| io_errno(&e))?;
        }
        self.set_attrs(ino, times, mode).await
    }

    /// Nothing in `.preview` changes; files belong to the mounting user.
    fn may_setattr(&self, ino: Ino, uid: Option<u32>, gid: Option<u32>) -> OpResult<()> {
        if is_virtual(ino) {
            return Err(Errno::EROFS);
        }
        if uid.is_some_and(|u| u != self.uid) || gid.is_some_and(|g| g != self.gid) {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// SETATTR of times and mode (and a chown to oneself): set in the inode table, then kept
    /// by the backend (`attrs.rs`).
    async fn set_attrs(
        self: &Arc<Self>,
        ino: Ino,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
    ) -> OpResult<fuser::FileAttr> {
        let keep = self.set_attrs_here(ino, times, mode);
        self.keep_attrs(ino, keep).await;
        self.attr(ino)
    }

    async fn do_unlink(self: &Arc<Self>, parent: Ino, name: &str, dir: bool) -> OpResult<()> {
        Self::outside_previews(parent, name)?;
        self.writable()?;
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let (path, kind, io) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (i.path.clone(), i.kind, i.io.clone())
        };
        match (kind, dir) {
            (Kind::Dir, false) => return Err(Errno::EISDIR),
            (Kind::File, true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        if dir {
            self.refresh_listing(ino, &path).await?;
            let empty = self
                .table()
                .get(ino)
                .is_none_or(|i| !i.hidden_preview && i.listing().is_none_or(|(_, n)| n.is_empty()));
            if !empty {
                return Err(Errno::ENOTEMPTY);
            }
        }
        let _io = io.lock().await;
        let remote = {
            let t = self.table();
            t.get(ino)
                .is_some_and(|i| i.kind == Kind::Dir || i.remote.is_some())
        };
        if remote {
            match self.backend.delete(&path).await {
                Ok(()) => {}
                Err(e) if e.kind == crate::api::ErrorKind::NotFound => {}
                Err(e) => return Err(errno(&e)),
            }
        }
        let mut t = self.table();
        let staged = t.get(ino).and_then(|i| i.staged.clone());
        if let Some(r) = t.get(ino).and_then(|i| i.remote.as_ref()) {
            self.cache.invalidate(&r.id);
        }
        t.detach(ino);
        if let Some(s) = staged {
            if s.writers.load(Ordering::SeqCst) == 0 {
                self.journal.finish(&s);
                t.set_staged(ino, None);
                t.maybe_drop(ino);
            }
        }
        t.entries_changed(parent);
        Ok(())
    }

    async fn do_rename(
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
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let dst_dir = self.dir_path(newparent)?;
        let dst = dst_dir.child(newname).map_err(|_| Errno::EINVAL)?;
        let target = self.child(newparent, newname).await?;
        let (src, kind, io) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (i.path.clone(), i.kind, i.io.clone())
        };
        if src == dst {
            return Ok(());
        }
        if kind == Kind::Dir && src.contains(&dst) {
            return Err(Errno::EINVAL);
        }
        if let Some(tino) = target {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            let tkind = self.table().get(tino).map(|i| i.kind);
            match (kind, tkind) {
                (Kind::File, Some(Kind::Dir)) => return Err(Errno::EISDIR),
                (Kind::Dir, Some(Kind::File)) => return Err(Errno::ENOTDIR),
                (Kind::Dir, Some(Kind::Dir)) => {
                    let tpath = dst.clone();
                    self.refresh_listing(tino, &tpath).await?;
                    let empty = self
                        .table()
                        .get(tino)
                        .and_then(|i| i.listing())
                        .is_none_or(|(_, n)| n.is_empty());
                    if !empty {
                        return Err(Errno::ENOTEMPTY);
                    }
                }
                _ => {}
            }
        }
        // The target's upload, if one runs, must not land after the move and overwrite what
        // was moved there: hold both files' locks (in inode order, so two renames cannot wait on
        // each other). After the lock, an upload that was running may have created the source
        // remotely.
        let target_io = target.and_then(|t| self.table().get(t).map(|i| (t, i.io.clone())));
        let (_first, _second) = match target_io {
            Some((tino, tio)) if tino < ino => {
                let a = tio.lock_owned().await;
                (Some(a), Some(io.clone().lock_owned().await))
            }
            Some((_, tio)) => {
                let a = io.clone().lock_owned().await;
                (Some(a), Some(tio.lock_owned().await))
            }
            None => (Some(io.clone().lock_owned().await), None),
        };
        let remote = self
            .table()
            .get(ino)
            .is_some_and(|i| i.kind == Kind::Dir || i.remote.is_some());
        if remote {
            self.backend
                .rename(&src, &dst, true)
                .await
                .map_err(|e| errno(&e))?;
        } else if let Some(tino) = target {
            // A file that exists only here takes the name; a remote file under that name gets
            // its bytes as a new version when the upload runs. Nothing else of the target stays.
            let t = self.table();
            if let Some(s) = t.get(tino).and_then(|i| i.staged.clone()) {
                if s.writers.load(Ordering::SeqCst) == 0 {
                    self.journal.finish(&s);
                }
            }
        }
        let mut t = self.table();
        if let Some(tino) = target {
            // The replaced file's bytes are gone (or about to be superseded): free their cache.
            if let Some(r) = t.get(tino).and_then(|i| i.remote.as_ref()) {
                self.cache.invalidate(&r.id);
            }
            let target_staged = t.get(tino).and_then(|i| i.staged.clone());
            if let Some(s) = target_staged.filter(|s| s.writers.load(Ordering::SeqCst) == 0) {
                self.journal.finish(&s);
                t.set_staged(tino, None);
            }
            // The replaced remote file's ID now belongs to the renamed one (same path).
            if !remote {
                let rid = t.get(tino).and_then(|i| i.remote.clone());
                if let Some(i) = t.get_mut(ino) {
                    i.remote = rid;
                }
            }
        }
        t.rename(ino, &dst);
        // Journal entries follow their files (all staged files under a renamed folder too).
        for sino in t.staged_inos() {
            if let Some(i) = t.get(sino) {
                if dst.contains(&i.path) {
                    if let Some(s) = &i.staged {
                        let _ = self.journal.record(
                            s,
                            &i.path,
                            i.remote.as_ref().map(|r| r.id.clone()),
                        );
                    }
                }
            }
        }
        t.entries_changed(parent);
        t.entries_changed(newparent);
        Ok(())
    }

    /// A read from offset 0 of a directory handle already read (`rewinddir`), or of one whose
    /// folder changed since its snapshot: names added since `opendir` must show (POSIX), so the
    /// folder is listed again.
    fn rewound(&self, ino: Ino, fh: u64, offset: u64) -> bool {
        if offset != 0 {
            return false;
        }
        let now = self.folder_time(ino);
        matches!(
            self.handles().get(&fh),
            Some(Handle::Dir { read, taken, .. }) if *read || *taken != now
        )
    }

    /// A folder's time as this mount last changed or saw it (`Table::entries_changed`).
    fn folder_time(&self, ino: Ino) -> Option<std::time::SystemTime> {
        self.table().get(ino).map(|i| i.mtime)
    }

    /// Takes a new snapshot of folder `ino` for handle `fh` (see [`Fs::rewound`]).
    async fn relist(self: &Arc<Self>, ino: Ino, fh: u64) -> OpResult<()> {
        // Read before the snapshot: a change while it is taken shows as a change after it.
        let before = self.folder_time(ino);
        let fresh = self.do_readdir_snapshot(ino).await?;
        match self.handles().get_mut(&fh) {
            Some(Handle::Dir {
                entries,
                read,
                taken,
            }) => {
                *entries = fresh;
                *read = false;
                *taken = before;
                Ok(())
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// READDIR from the handle's snapshot.
    fn fill_readdir(&self, fh: u64, offset: u64, mut reply: ReplyDirectory) {
        let mut handles = self.handles();
        let Some(Handle::Dir { entries, read, .. }) = handles.get_mut(&fh) else {
            return reply.error(Errno::EBADF);
        };
        *read = true;
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// READDIRPLUS from the handle's snapshot, with each entry's attributes.
    fn fill_readdirplus(&self, ino: Ino, fh: u64, offset: u64, mut reply: ReplyDirectoryPlus) {
        // At most this many per reply (the kernel asks again from the next offset); cloned so
        // the handle and table locks are never held together.
        const MAX_BATCH: usize = 4096;
        let batch: Vec<(Ino, FileType, String)> = {
            let mut handles = self.handles();
            let Some(Handle::Dir { entries, read, .. }) = handles.get_mut(&fh) else {
                return reply.error(Errno::EBADF);
            };
            *read = true;
            entries
                .iter()
                .skip(offset as usize)
                .take(MAX_BATCH)
                .cloned()
                .collect()
        };
        let fs = self;
        let ttl = fs.ttl();
        let mut t = fs.table();
        for (i, (cino, kind, name)) in batch.iter().enumerate() {
            let dots = name == "." || name == "..";
            let virt = is_virtual(*cino) || is_virtual(ino);
            let real = if virt {
                None
            } else {
                t.attr(*cino, fs.uid, fs.gid)
            };
            let (attr, valid) = match real {
                Some(attr) => (attr, ttl),
                // Preview entries: their sizes are known only once fetched, so they come with
                // no validity and the kernel asks (LOOKUP, GETATTR) when one is used.
                None if virt || dots => {
                    let dir = *kind == FileType::Directory;
                    (
                        fs.virtual_attr(*cino, dir, 0, SystemTime::now()),
                        Duration::ZERO,
                    )
                }
                // Gone since the listing was taken.
                None => continue,
            };
            let next = offset + i as u64 + 1;
            if reply.add(INodeNo(*cino), next, name, &valid, &attr, Generation(0)) {
                break;
            }
            // Like a LOOKUP, each entry but `.` and `..` is a reference the kernel will forget.
            if !dots && !virt {
                if let Some(c) = t.get_mut(*cino) {
                    c.lookups += 1;
                }
            }
        }
        drop(t);
        reply.ok();
    }

    async fn do_readdir_snapshot(
        self: &Arc<Self>,
        ino: Ino,
    ) -> OpResult<Vec<(Ino, FileType, String)>> {
        if is_virtual(ino) {
            return self.preview_readdir(ino).await;
        }
        self.ensure_listing(ino).await?;
        let t = self.table();
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
                    Some(Kind::Dir) => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                out.push((*cino, kind, name.clone()));
            }
        }
        Ok(out)
    }

    async fn do_fsync(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        let staged = self.table().get(ino).and_then(|i| i.staged.clone());
        let Some(staged) = staged else { return Ok(()) };
        if !staged.is_dirty() {
            return Ok(());
        }
        {
            let t = self.table();
            if let Some(i) = t.get(ino) {
                let _ =
                    self.journal
                        .record(&staged, &i.path, i.remote.as_ref().map(|r| r.id.clone()));
            }
        }
        // fsync returns only once the bytes are stored remotely, or reports why not.
        if self.backend.puts_batches() {
            // Stored with the next batch (one durable commit for all of it).
            return if super::writeback::flush(self, ino, staged.generation()).await {
                Ok(())
            } else {
                Err(Errno::EIO)
            };
        }
        upload::upload_once(self, ino).await.map_err(|e| {
            log::warn!("fsync: upload failed: {e}");
            upload::schedule(self, ino);
            Errno::EIO
        })?;
        if staged.is_dirty() {
            // Written to while uploading: upload again.
            upload::upload_once(self, ino)
                .await
                .map_err(|_| Errno::EIO)?;
        }
        Ok(())
    }
}

/// Runs `f` on the runtime and hands its result to `reply`.
fn spawn<B, T, F, R>(fs: &Arc<Fs<B>>, f: F, reply: R)
where
    B: Backend,
    T: Send + 'static,
    F: std::future::Future<Output = OpResult<T>> + Send + 'static,
    R: FnOnce(OpResult<T>) + Send + 'static,
{
    fs.rt.spawn(async move { reply(f.await) });
}

impl<B: Backend> Filesystem for VaultFs<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        // READDIRPLUS: a listing carries each entry's attributes, so `ls -l`, `find` and
        // `stat` of a fresh folder need no LOOKUP per file (AUTO: the kernel uses it while
        // the listing's entries are then looked at).
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_of(name) {
            Ok(n) => n.to_string(),
            Err(e) => return reply.error(e),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        match fs.lookup_cached(parent.0, &name) {
            Some(Ok(attr)) => return reply.entry(&ttl, &attr, Generation(0)),
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
        spawn(
            &self.0,
            async move { fs.do_lookup(parent.0, &name).await },
            move |r| match r {
                Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
                Err(e) => reply.error(e),
            },
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.table().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.0.clone();
        let ttl = fs.ttl();
        if let Some(attr) = fs.getattr_cached(ino.0) {
            return reply.attr(&ttl, &attr);
        }
        spawn(
            &self.0,
            async move { fs.do_getattr(ino.0).await },
            move |r| match r {
                Ok(attr) => reply.attr(&ttl, &attr),
                Err(e) => reply.error(e),
            },
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // chmod keeps the execute bits (DESIGN.md §3). Without a size and with nothing the
        // backend keeps (atime, a folder's time), answered on the FUSE thread: `tar x` and
        // `cp -p` set times on every file.
        let fs = self.0.clone();
        let ttl = fs.ttl();
        let times = (atime, mtime);
        if size.is_none() {
            if let Err(e) = fs.may_setattr(ino.0, uid, gid) {
                return reply.error(e);
            }
            match fs.set_attrs_here(ino.0, times, mode) {
                super::attrs::Keep::Nothing => {
                    return match fs.attr(ino.0) {
                        Ok(attr) => reply.attr(&ttl, &attr),
                        Err(e) => reply.error(e),
                    };
                }
                keep => {
                    return spawn(
                        &self.0,
                        async move {
                            fs.keep_attrs(ino.0, keep).await;
                            fs.attr(ino.0)
                        },
                        move |r| match r {
                            Ok(attr) => reply.attr(&ttl, &attr),
                            Err(e) => reply.error(e),
                        },
                    );
                }
            }
        }
        spawn(
            &self.0,
            async move { fs.do_setattr(ino.0, size, times, mode, (uid, gid)).await },
            move |r| match r {
                Ok(attr) => reply.attr(&ttl, &attr),
                Err(e) => reply.error(e),
            },
        );
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files come through create(); device nodes, FIFOs and sockets have no place in a
        // document store.
        let _ = mode;
        reply.error(Self::refused(parent));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match name_of(name) {
            Ok(n) => n.to_string(),
            Err(e) => return reply.error(e),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        spawn(
            &self.0,
            async move { fs.do_mkdir(parent.0, &name).await },
            move |r| match r {
                Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
                Err(e) => reply.error(e),
            },
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _link: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Self::refused(parent));
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Self::refused(newparent));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = match (name_of(name), name_of(newname)) {
            (Ok(a), Ok(b)) => (a.to_string(), b.to_string()),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move {
                fs.do_rename(parent.0, &name, newparent.0, &newname, flags)
                    .await
            },
            move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.do_open(ino.0, flags).await },
            move |r| match r {
                Ok((fh, f)) => reply.opened(FileHandle(fh), f),
                Err(e) => reply.error(e),
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Staged bytes are local: answer at once; the rest may need the network.
        let staged = self.0.table().get(ino.0).and_then(|i| i.staged.clone());
        if let Some(s) = staged {
            return match s.read_at(offset, size as usize) {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(io_errno(&e)),
            };
        }
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.do_read(ino.0, offset, size).await },
            move |r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let staged = match self.0.handles().get(&fh.0) {
            Some(Handle::File {
                staged: Some(s), ..
            }) => s.clone(),
            _ => return reply.error(Errno::EBADF),
        };
        match staged.write_at(offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => return reply.error(io_errno(&e)),
        }
        // A large file written in order is hashed while it is written, beside the writer.
        if let Some(job) = staged.hash_ahead() {
            self.0.rt.spawn_blocking(job);
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The journal entry is on disk before this returns (written when staging began and
        // rewritten here); the upload itself runs in the background.
        self.0.release_handle(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.do_fsync(ino.0).await },
            move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move {
                let before = fs.folder_time(ino.0);
                fs.do_readdir_snapshot(ino.0).await.map(|e| (e, before))
            },
            {
                let fs = self.0.clone();
                move |r| match r {
                    Ok((entries, taken)) => reply.opened(
                        FileHandle(fs.new_fh(Handle::Dir {
                            entries,
                            read: false,
                            taken,
                        })),
                        FopenFlags::empty(),
                    ),
                    Err(e) => reply.error(e),
                }
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let fs = self.0.clone();
        if !fs.rewound(ino.0, fh.0, offset) {
            return fs.fill_readdir(fh.0, offset, reply);
        }
        spawn(
            &self.0,
            {
                let fs = fs.clone();
                async move { fs.relist(ino.0, fh.0).await }
            },
            move |r| match r {
                Ok(()) => fs.fill_readdir(fh.0, offset, reply),
                Err(e) => reply.error(e),
            },
        );
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let fs = self.0.clone();
        if !fs.rewound(ino.0, fh.0, offset) {
            return fs.fill_readdirplus(ino.0, fh.0, offset, reply);
        }
        spawn(
            &self.0,
            {
                let fs = fs.clone();
                async move { fs.relist(ino.0, fh.0).await }
            },
            move |r| match r {
                Ok(()) => fs.fill_readdirplus(ino.0, fh.0, offset, reply),
                Err(e) => reply.error(e),
            },
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0.handles().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are made on the backend before they are acknowledged.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Writes are staged in the cache dir first, so its free space is what a writer can use.
        let dir = std::ffi::CString::new(self.0.opts.cache_dir.as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: statvfs fills the zeroed struct we pass for a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(dir.as_ptr(), &mut st) } != 0 {
            return reply.statfs(0, 0, 0, 0, 0, 4096, MAX_NAME_BYTES as u32, 4096);
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            MAX_NAME_BYTES as u32,
            st.f_frsize as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _pos: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOTSUP);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Only `user.vaultfs.*` exists. Other namespaces (security.selinux, the POSIX ACLs) are
        // "not supported" rather than "not set": `ls -l` and other tools then stop asking this
        // file system for them, instead of two round trips per file listed.
        if !name.as_encoded_bytes().starts_with(b"user.") {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let value = {
            let t = self.0.table();
            let r = t.get(ino.0).and_then(|i| i.remote.clone());
            match (name.to_str(), r) {
                (Some("user.vaultfs.id"), Some(r)) => Some(r.id),
                (Some("user.vaultfs.link_uri"), Some(r)) => r.link_uri,
                (Some("user.vaultfs.preview_link_uri"), Some(r)) => r.preview_link_uri,
                (Some("user.vaultfs.download_link_uri"), Some(r)) => r.download_link_uri,
                _ => None,
            }
        };
        match value {
            None => reply.error(Errno::NO_XATTR),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some(v) => reply.data(v.as_bytes()),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let has = self
            .0
            .table()
            .get(ino.0)
            .is_some_and(|i| i.remote.is_some());
        let mut buf = Vec::new();
        if has {
            for n in XATTRS {
                buf.extend_from_slice(n.as_bytes());
                buf.push(0);
            }
        }
        if size == 0 {
            reply.size(buf.len() as u32);
        } else if buf.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&buf);
        }
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOTSUP);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks modes itself.
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let exec = mode & !umask & crate::api::EXEC_BITS;
        let name = match name_of(name) {
            Ok(n) => n.to_string(),
            Err(e) => return reply.error(e),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        match fs.create_cached(parent.0, &name, exec) {
            Some(Ok((attr, fh))) => {
                return reply.created(
                    &ttl,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                );
            }
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
        spawn(
            &self.0,
            async move { fs.do_create(parent.0, &name, flags, exec).await },
            move |r| match r {
                Ok((attr, fh)) => reply.created(
                    &ttl,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(e),
            },
        );
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _off_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _off_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel falls back to reads and writes.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Only plain allocation is meaningful on a staging file; punching holes or zeroing ranges
        // is refused explicitly rather than half-done.
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::ENOTSUP);
        }
        let staged = match self.0.handles().get(&fh.0) {
            Some(Handle::File {
                staged: Some(s), ..
            }) => s.clone(),
            _ => return reply.error(Errno::EBADF),
        };
        match staged.allocate(offset, length, mode & libc::FALLOC_FL_KEEP_SIZE != 0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(io_errno(&e)),
        }
    }
}

impl<B: Backend> VaultFs<B> {
    /// Links, symlinks and special files: not in a document store (EPERM), and nothing at all
    /// inside `.preview` (EROFS).
    fn refused(parent: INodeNo) -> Errno {
        if is_virtual(parent.0) {
            Errno::EROFS
        } else {
            Errno::EPERM
        }
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n.to_string(),
            Err(e) => return reply.error(e),
        };
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.do_unlink(parent.0, &name, dir).await },
            move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
        );
    }
}
