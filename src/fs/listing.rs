//! Names and listings: folder listings fetched from the backend, cached while fresh (younger
//! than `dir_ttl`, and no change by another process since: `freshness`) and merged with what
//! exists only here; LOOKUP and GETATTR (from memory when fresh, else with a
//! short wait on a refresh); directory handles' snapshots for READDIR(PLUS) and rewinddir.
//! A listing we have, even an old one, beats waiting on a slow or silent server.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use super::table::{Ino, InodeKind, ROOT};
use super::virtual_dirs::{is_virtual, is_virtual_name};
use super::{Fs, Handle, OpResult};
use crate::api::NodePath;
use crate::backend::{Backend, LIST_PAGE, list_all};
use crate::sync::relock;

/// After the backend was unreachable, cached listings are served without retrying for this long.
const OFFLINE_GRACE: Duration = Duration::from_secs(5);

/// How long a request waits for the refresh of a folder listing it has (older than the listing
/// TTL) before it is answered from that listing while the refresh goes on.
const STALE_LISTING_WAIT: Duration = Duration::from_millis(100);

/// ESTALE for a node the store no longer has (`Inode::gone_elsewhere`) that the kernel still
/// names (the follower's removal of its entry on its way): the kernel then looks the whole path
/// up again (lookups, creates, renames and removals retry once so), and finds what the store has
/// there now, a folder made again (`rm -rf d; mkdir d` elsewhere) rather than ENOENT from the
/// old one (fstests generic/732: `cat d/f` through the old `d` failed).
fn stale_entry(t: &super::table::Table, ino: Ino) -> OpResult<()> {
    if t.get(ino).is_some_and(|i| i.gone_elsewhere) {
        return Err(Errno::ESTALE.into());
    }
    Ok(())
}

impl<B: Backend> Fs<B> {
    pub(super) fn ttl(&self) -> std::time::Duration {
        self.opts.attr_ttl
    }

    pub(super) fn attr(&self, ino: Ino) -> OpResult<FileAttr> {
        self.table()
            .attr(ino, self.uid, self.gid)
            .ok_or(Errno::ENOENT.into())
    }

    pub(super) fn path_of(&self, ino: Ino) -> OpResult<(NodePath, InodeKind)> {
        let t = self.table();
        stale_entry(&t, ino)?;
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        if i.unlinked {
            return Err(Errno::ENOENT.into());
        }
        Ok((i.path.clone(), i.kind))
    }

    pub(super) fn dir_path(&self, ino: Ino) -> OpResult<NodePath> {
        match self.path_of(ino)? {
            (p, InodeKind::Dir) => Ok(p),
            _ => Err(Errno::ENOTDIR.into()),
        }
    }

    /// Makes sure the directory's listing is loaded and younger than `dir_ttl`.
    pub(super) async fn ensure_listing(self: &Arc<Self>, dir: Ino) -> OpResult<()> {
        self.nodes.follow.used(dir);
        let (path, have) = {
            let t = self.table();
            let i = t.get(dir).ok_or(Errno::ENOENT)?;
            if i.kind != InodeKind::Dir {
                return Err(Errno::ENOTDIR.into());
            }
            if i.listing().is_some_and(|(at, _)| self.fresh(*at)) {
                return Ok(());
            }
            (i.path.clone(), i.listing().is_some())
        };
        if have && self.offline.now() {
            return Ok(());
        }
        if !have {
            return self.refresh_listing(dir, &path).await;
        }
        // A listing we have, even old, beats waiting on a slow or silent server.
        let fs = self.clone();
        let refresh = async move {
            let r = fs.refresh_listing(dir, &path).await;
            match &r {
                // Backend away: for a while no `ls` waits for the network to fail again.
                Err(e) if e.errno() == Errno::EIO => {
                    log::debug!("listing {path} from cache: backend unreachable ({e})");
                    fs.offline.note_unreachable(OFFLINE_GRACE);
                }
                _ => {}
            }
            r
        };
        match self
            .refresh_briefly(|fs| &fs.nodes.refreshing, dir, refresh)
            .await
        {
            Some(Err(e)) if e.errno() != Errno::EIO => Err(e),
            _ => Ok(()),
        }
    }

    /// Runs `refresh` of `ino` as its own task, unless one runs already (`running` picks the
    /// refreshes of listings or of attributes), and waits for it at most
    /// [`STALE_LISTING_WAIT`]: its result if it came by then. A request is then answered from
    /// what the mount has, and a slow or silent server never holds it up for longer. The
    /// built-in store in this process is never away: there the request waits for the refresh,
    /// its own or the one under way, as what the mount has is known to be stale (another
    /// process changed the store: answered from it, `cat` of a file just moved there failed).
    pub(super) async fn refresh_briefly(
        self: &Arc<Self>,
        running: fn(&Self) -> &std::sync::Mutex<super::nodes::Refreshing>,
        ino: Ino,
        refresh: impl std::future::Future<Output = OpResult<()>> + Send + 'static,
    ) -> Option<OpResult<()>> {
        let bounded = self.backend.local().is_none();
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let joined = {
            let mut under_way = relock(running(self));
            let joined = under_way.get(&ino).cloned();
            if joined.is_none() {
                under_way.insert(ino, done_rx);
            }
            joined
        };
        if let Some(mut done) = joined {
            if !bounded {
                // (Err: the task ended without a word, dropped at shutdown.)
                let _ = done.wait_for(|d| *d).await;
            }
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fs = self.clone();
        self.rt.spawn(async move {
            let r = refresh.await;
            relock(running(&fs)).remove(&ino);
            let _ = done_tx.send(true);
            let _ = tx.send(r);
        });
        if bounded {
            tokio::time::timeout(STALE_LISTING_WAIT, rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            rx.await.ok()
        }
    }

    /// Fetches a listing from the backend and merges it with what exists only here.
    pub(super) async fn refresh_listing(
        self: &Arc<Self>,
        dir: Ino,
        path: &NodePath,
    ) -> OpResult<()> {
        let started = Instant::now();
        let mut node = list_all(self.backend.as_ref(), path, LIST_PAGE).await?;
        let children = node.children.take().unwrap_or_default();
        // Kept for a start without the server (the built-in store is never out of reach).
        if self.backend.local().is_none() {
            self.offline.record(path, &node, &children);
        }
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        let added;
        {
            let mut t = self.table();
            let mut names = std::collections::BTreeMap::new();
            let mut hidden_preview = false;
            for child in &children {
                // A real `.preview` or `.versions` is hidden by the virtual one and never touched.
                if is_virtual_name(&child.name) {
                    hidden_preview = true;
                    continue;
                }
                let Ok(cpath) = path.child(&child.name) else {
                    continue;
                };
                if t.removed_since(&cpath, started) {
                    continue; // removed here while the listing was on its way
                }
                // Changed here (created, renamed, uploaded) or told by the backend since the
                // listing was asked for: what the listing says of it is older.
                let newer = t
                    .ino_of(&cpath)
                    .filter(|i| t.sending(*i) || t.get(*i).is_some_and(|i| i.newer_than(started)));
                let (ino, content_changed) = match newer {
                    Some(ino) => (ino, false),
                    None => t.upsert(&cpath, child),
                };
                if content_changed {
                    changed.push(ino);
                }
                names.insert(child.name.clone(), ino);
            }
            for (name, ino) in t.local_children(path, started) {
                log::debug!("listing {path}: {name} kept (changed here, or staged)");
                names.insert(name, ino);
            }
            let old = t.get(dir).and_then(|i| i.listing()).map(|(_, n)| n.clone());
            let listed_before = old.is_some();
            let old = old.unwrap_or_default();
            // Pages fetched while the folder changed here can skip names that did not change
            // (a name taken out before the offset of the next page moves one past it): then no
            // name goes for being absent (fstests generic/736 over a server: 1 of 5,000 files
            // gone from the listing while it was still there). A later listing settles them.
            let unsettled = t.names_changed_since(path, started);
            added = names.keys().any(|n| !old.contains_key(n));
            for (name, ino) in old {
                if names.contains_key(&name) {
                    continue;
                }
                // Created, renamed here or uploaded after the listing was asked for: keep.
                let recent = t.get(ino).is_some_and(|i| {
                    !i.unlinked
                        && (unsettled || i.touched >= started)
                        && i.path.name() == Some(&name)
                });
                if recent {
                    log::debug!("listing {path}: {name} kept (changed here since asked)");
                    names.insert(name, ino);
                } else {
                    let dir_kind = t.get(ino).is_some_and(|i| i.kind == InodeKind::Dir);
                    gone.push((name, ino, dir_kind));
                }
            }
            if listed_before && (added || !gone.is_empty()) {
                // Entries came or went elsewhere: the folder's time is the store's again.
                t.entries_changed_elsewhere(dir);
            }
            if dir != ROOT {
                t.update_from(dir, &node);
            }
            if let Some(i) = t.get_mut(dir) {
                i.set_fetched_listing(names, started, self.nodes.freshness.expired());
                i.hidden_preview = hidden_preview;
            }
            for (name, ino, dir_kind) in &gone {
                if let Ok(cpath) = path.child(name) {
                    self.thumbnails_gone(*ino, &cpath, *dir_kind);
                }
                t.detach_gone(*ino);
            }
        }
        if added || !changed.is_empty() || !gone.is_empty() {
            self.pins_learned(path);
        }
        // Changes made elsewhere: the kernel drops what it cached (outside any request).
        if let Some(n) = self.notifier.get().cloned() {
            if !changed.is_empty() {
                tokio::task::spawn_blocking(move || {
                    for ino in changed {
                        let _ = n.inval_inode(INodeNo(ino), 0, 0);
                    }
                });
            }
        }
        // Gone elsewhere: the kernel forgets them, and watchers are told (`follow`).
        let gone = gone
            .into_iter()
            .filter_map(|(name, ino, is_dir)| Some((path.child(&name).ok()?, ino, is_dir)))
            .map(|(p, ino, is_dir)| super::follow::Kernel::Delete(dir, ino, p, is_dir))
            .collect();
        super::follow::notify(self, gone);
        Ok(())
    }

    /// The inode of `name` in `dir`, from a fresh listing.
    pub(super) async fn child(self: &Arc<Self>, dir: Ino, name: &str) -> OpResult<Option<Ino>> {
        stale_entry(&self.table(), dir)?;
        self.ensure_listing(dir).await?;
        let t = self.table();
        Ok(t.get(dir)
            .and_then(|i| i.listing())
            .and_then(|(_, n)| n.get(name).copied()))
    }

    pub(super) async fn lookup(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<FileAttr> {
        if let Some(answer) = self.virtual_lookup(parent, name).await {
            return answer;
        }
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        let mut t = self.table();
        t.get_mut(ino).ok_or(Errno::ENOENT)?.lookups += 1;
        t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT.into())
    }

    pub(super) async fn getattr(self: &Arc<Self>, ino: Ino) -> OpResult<FileAttr> {
        if is_virtual(ino) {
            return self.virtual_getattr(ino).await;
        }
        let stale = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (ino != ROOT
                && !self.offline.now()
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
                .refresh_briefly(|fs| &fs.nodes.attr_refreshing, ino, refresh)
                .await
            {
                return Err(e);
            }
        }
        self.attr(ino)
    }

    /// The kernel forgets `name` in `dir` now (outside any request), not only when its entry
    /// TTL runs out: its next lookup comes here.
    pub(super) fn kernel_forgets_name(&self, dir: Ino, name: &str) {
        if let Some(n) = self.notifier.get().cloned() {
            let name = name.to_string();
            tokio::task::spawn_blocking(move || {
                let _ = n.inval_entry(INodeNo(dir), OsStr::new(&name));
            });
        }
    }

    /// Asks the backend for a node's attributes again; ENOENT when it is gone.
    pub(super) async fn refresh_attr(self: &Arc<Self>, ino: Ino, path: &NodePath) -> OpResult<()> {
        let started = Instant::now();
        let answer = self.backend.node(path).await;
        // Changed here or told by the backend while the answer was on its way: it is older.
        if self.table().get(ino).is_some_and(|i| i.newer_than(started)) {
            return Ok(());
        }
        match answer {
            Ok(node) => {
                let changed = {
                    let mut t = self.table();
                    let changed = t.update_from(ino, &node);
                    self.thumbnails_stored(&t, ino);
                    changed
                };
                if changed {
                    self.pins_learned(path);
                    if let Some(n) = self.notifier.get().cloned() {
                        tokio::task::spawn_blocking(move || n.inval_inode(INodeNo(ino), 0, 0));
                    }
                }
                Ok(())
            }
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => {
                let parent = {
                    let mut t = self.table();
                    let parent = path.parent().and_then(|p| t.ino_of(&p));
                    let dir = t.get(ino).is_some_and(|i| i.kind == InodeKind::Dir);
                    self.thumbnails_gone(ino, path, dir);
                    t.detach_gone(ino);
                    parent
                };
                if let (Some(dir), Some(name)) = (parent, path.name()) {
                    self.kernel_forgets_name(dir, name);
                }
                Err(Errno::ENOENT.into())
            }
            // Offline: the attributes we have are the best answer.
            Err(e) => {
                log::debug!("getattr of {path} from cache: {e}");
                Ok(())
            }
        }
    }

    /// The listing of `dir` when it is loaded and younger than its TTL (no backend call needed).
    pub(super) fn fresh_listing<'t>(
        &self,
        t: &'t super::table::Table,
        dir: Ino,
    ) -> Option<&'t std::collections::BTreeMap<String, Ino>> {
        let (at, names) = t.get(dir)?.listing()?;
        self.fresh(*at).then_some(names)
    }

    /// LOOKUP answered from memory when the folder's listing is fresh: on the FUSE thread, with
    /// no task and no wait (`None`: the backend may be needed).
    /// `pid`: the process asking (the follower's removal answers its own child's lookups).
    pub(super) fn lookup_cached(
        &self,
        parent: Ino,
        name: &str,
        pid: u32,
    ) -> Option<OpResult<FileAttr>> {
        if self.maybe_virtual(parent, name) {
            return None;
        }
        // The follower removing the name through the mount (`follow::echo`): the node it
        // removes, gone from the table already, so that the removal reaches it.
        let echo = self.nodes.follow.echo_of(parent, name, pid);
        let mut t = self.table();
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
            t.get_mut(ino)?.lookups += 1;
            return Some(t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT.into()));
        }
        if let Err(e) = stale_entry(&t, parent) {
            return Some(Err(e));
        }
        let child = self.fresh_listing(&t, parent)?.get(name).copied();
        let Some(ino) = child else {
            return Some(Err(Errno::ENOENT.into()));
        };
        t.get_mut(ino)?.lookups += 1;
        Some(t.attr(ino, self.uid, self.gid).ok_or(Errno::ENOENT.into()))
    }

    /// GETATTR answered from memory when the attributes need no refresh (see `getattr`).
    pub(super) fn getattr_cached(&self, ino: Ino) -> Option<FileAttr> {
        if is_virtual(ino) {
            return None;
        }
        let t = self.table();
        let i = t.get(ino)?;
        let stale = ino != ROOT && i.staged.is_none() && !i.unlinked && !self.fresh(i.fetched);
        if stale && !self.offline.now() {
            return None;
        }
        t.attr(ino, self.uid, self.gid)
    }

    /// A read from offset 0 of a directory handle already read (`rewinddir`), or of one whose
    /// folder changed since its snapshot: names added since `opendir` must show (POSIX), so the
    /// folder is listed again.
    pub(super) fn rewound(&self, ino: Ino, fh: u64, offset: u64) -> bool {
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
    pub(super) fn folder_time(&self, ino: Ino) -> Option<std::time::SystemTime> {
        self.table().get(ino).map(|i| i.mtime)
    }

    /// Takes a new snapshot of folder `ino` for handle `fh` (see [`Fs::rewound`]).
    pub(super) async fn relist(self: &Arc<Self>, ino: Ino, fh: u64) -> OpResult<()> {
        // Read before the snapshot: a change while it is taken shows as a change after it.
        let before = self.folder_time(ino);
        let fresh = self.readdir_snapshot(ino).await?;
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
            _ => Err(Errno::EBADF.into()),
        }
    }

    pub(super) async fn readdir_snapshot(
        self: &Arc<Self>,
        ino: Ino,
    ) -> OpResult<Vec<(Ino, FileType, String)>> {
        if is_virtual(ino) {
            return self.virtual_readdir(ino).await;
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
                    Some(InodeKind::Dir) => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                out.push((*cino, kind, name.clone()));
            }
        }
        self.thumbnails_listed(&t, ino);
        Ok(out)
    }

    /// FORGET: the kernel dropped `n` references to `ino`.
    pub(super) fn forget(&self, ino: Ino, n: u64) {
        self.table().forget(ino, n);
    }

    /// OPENDIR: a handle on a snapshot of the folder's entries.
    pub(super) async fn opendir(self: &Arc<Self>, ino: Ino) -> OpResult<u64> {
        let before = self.folder_time(ino);
        let entries = self.readdir_snapshot(ino).await?;
        Ok(self.handles.insert(Handle::Dir {
            entries,
            read: false,
            taken: before,
        }))
    }

    /// READDIR from the handle's snapshot: `add(ino, next offset, kind, name)` for each entry
    /// from `offset` on, until it says the reply is full (true).
    pub(super) fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(Ino, u64, FileType, &str) -> bool,
    ) -> OpResult<()> {
        let mut handles = self.handles();
        let Some(Handle::Dir { entries, read, .. }) = handles.get_mut(&fh) else {
            return Err(Errno::EBADF.into());
        };
        *read = true;
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// READDIRPLUS from the handle's snapshot, with each entry's attributes:
    /// `add(ino, next offset, name, validity, attr)` until it says the reply is full (true).
    /// Each entry taken counts as a LOOKUP.
    pub(super) fn readdirplus(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(Ino, u64, &str, &Duration, &FileAttr) -> bool,
    ) -> OpResult<()> {
        // At most this many per reply (the kernel asks again from the next offset); cloned so
        // the handle and table locks are never held together.
        const MAX_BATCH: usize = 4096;
        let batch: Vec<(Ino, FileType, String)> = {
            let mut handles = self.handles();
            let Some(Handle::Dir { entries, read, .. }) = handles.get_mut(&fh) else {
                return Err(Errno::EBADF.into());
            };
            *read = true;
            entries
                .iter()
                .skip(offset as usize)
                .take(MAX_BATCH)
                .cloned()
                .collect()
        };
        let ttl = self.ttl();
        let mut t = self.table();
        for (i, (cino, kind, name)) in batch.iter().enumerate() {
            let dots = name == "." || name == "..";
            let virt = is_virtual(*cino) || is_virtual(ino);
            let real = if virt {
                None
            } else {
                t.attr(*cino, self.uid, self.gid)
            };
            let (attr, valid) = match real {
                Some(attr) => (attr, ttl),
                // Preview entries: their sizes are known only once fetched, so they come with
                // no validity and the kernel asks (LOOKUP, GETATTR) when one is used.
                None if virt || dots => {
                    let dir = *kind == FileType::Directory;
                    (
                        self.virtual_attr(*cino, dir, 0, SystemTime::now()),
                        Duration::ZERO,
                    )
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
        Ok(())
    }

    /// RELEASEDIR: the snapshot goes.
    pub(super) fn releasedir(&self, fh: u64) {
        self.handles().remove(&fh);
    }
}
