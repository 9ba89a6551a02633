//! Names and listings: folder listings fetched from the backend, cached while fresh (younger
//! than `dir_ttl`, and no change by another process since: `freshness`) and merged with what
//! exists only here; LOOKUP and GETATTR (from memory when fresh, else with a
//! short wait on a refresh); directory handles' snapshots for READDIR(PLUS) and rewinddir.
//! A listing we have, even an old one, beats waiting on a slow or silent server.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use super::nodes::Refresh;
use super::table::{Ino, InodeKind};
use super::virtual_dirs::is_virtual;
use super::{Fs, Handle, OpResult};
use crate::api::NodePath;
use crate::backend::{Backend, LIST_PAGE, list_all};
use crate::sync::relock;

/// After the backend was unreachable, cached listings are served without retrying for this long.
const OFFLINE_GRACE: Duration = Duration::from_secs(5);

/// How long a request waits for the refresh of a folder listing it has (older than the listing
/// TTL) before it is answered from that listing while the refresh goes on.
const STALE_LISTING_WAIT: Duration = Duration::from_millis(100);

impl<B: Backend> Fs<B> {
    pub(super) fn ttl(&self) -> std::time::Duration {
        self.opts.attr_ttl
    }

    pub(super) fn attr(&self, ino: Ino) -> OpResult<FileAttr> {
        self.nodes
            .attr(ino, self.uid, self.gid)
            .ok_or(Errno::ENOENT.into())
    }

    pub(super) fn path_of(&self, ino: Ino) -> OpResult<(NodePath, InodeKind)> {
        Ok(self.nodes.named(ino)?)
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
        let Some((path, have)) = self.nodes.listing_due(dir)? else {
            return Ok(());
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
        match self.refresh_briefly(Refresh::Listing, dir, refresh).await {
            Some(Err(e)) if e.errno() != Errno::EIO => Err(e),
            _ => Ok(()),
        }
    }

    /// Runs `refresh` of `ino` as its own task, unless one runs already (`what` picks the
    /// refreshes of listings or of attributes), and waits for it at most
    /// [`STALE_LISTING_WAIT`]: its result if it came by then. A request is then answered from
    /// what the mount has, and a slow or silent server never holds it up for longer. The
    /// built-in store in this process is never away: there the request waits for the refresh,
    /// its own or the one under way, as what the mount has is known to be stale (another
    /// process changed the store: answered from it, `cat` of a file just moved there failed).
    pub(super) async fn refresh_briefly(
        self: &Arc<Self>,
        what: Refresh,
        ino: Ino,
        refresh: impl std::future::Future<Output = OpResult<()>> + Send + 'static,
    ) -> Option<OpResult<()>> {
        let bounded = self.backend.local().is_none();
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let joined = {
            let mut under_way = relock(self.nodes.refreshes(what));
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
            relock(fs.nodes.refreshes(what)).remove(&ino);
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
        // Names deleted here are gone from the store first (`deletes`).
        self.deletes_sent().await;
        let started = Instant::now();
        let mut node = list_all(self.backend.as_ref(), path, LIST_PAGE).await?;
        let children = node.children.take().unwrap_or_default();
        // Kept for a start without the server (the built-in store is never out of reach).
        if self.backend.local().is_none() {
            self.offline.record(path, &node, &children);
        }
        let super::table::Merged {
            changed,
            gone,
            added,
        } = (self.nodes).merge_listing(dir, path, &node, &children, started);
        for (name, ino, dir_kind) in &gone {
            if let Ok(cpath) = path.child(name) {
                self.thumbnails_gone(*ino, &cpath, *dir_kind);
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
        self.nodes.not_stale(dir)?;
        self.ensure_listing(dir).await?;
        Ok(self.nodes.listed_child(dir, name))
    }

    pub(super) async fn lookup(self: &Arc<Self>, parent: Ino, name: &str) -> OpResult<FileAttr> {
        if let Some(answer) = self.virtual_lookup(parent, name).await {
            return answer;
        }
        let ino = self.child(parent, name).await?.ok_or(Errno::ENOENT)?;
        Ok(self.nodes.looked_up(ino, self.uid, self.gid)?)
    }

    pub(super) async fn getattr(self: &Arc<Self>, ino: Ino) -> OpResult<FileAttr> {
        if is_virtual(ino) {
            return self.virtual_getattr(ino).await;
        }
        let stale = self.nodes.attrs_due(ino, self.offline.now())?;
        // Attributes we have beat waiting on a slow or silent server.
        if let Some(path) = stale {
            let fs = self.clone();
            let refresh = async move { fs.refresh_attr(ino, &path).await };
            if let Some(Err(e)) = self.refresh_briefly(Refresh::Attrs, ino, refresh).await {
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
        self.deletes_sent().await;
        let started = Instant::now();
        let answer = self.backend.node(path).await;
        // Changed here or told by the backend while the answer was on its way: it is older.
        if self
            .nodes
            .inode(ino, |i| i.newer_than(started))
            .unwrap_or(false)
        {
            return Ok(());
        }
        match answer {
            Ok(node) => {
                let changed = self.nodes.update_from(ino, &node);
                self.thumbnails_stored(ino);
                if changed {
                    self.pins_learned(path);
                    if let Some(n) = self.notifier.get().cloned() {
                        tokio::task::spawn_blocking(move || n.inval_inode(INodeNo(ino), 0, 0));
                    }
                }
                Ok(())
            }
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => {
                let (parent, dir) = self.nodes.gone_elsewhere(ino, path);
                self.thumbnails_gone(ino, path, dir);
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
        let answer = (self.nodes).lookup_cached(parent, name, echo, self.uid, self.gid)?;
        Some(answer.map_err(Into::into))
    }

    /// GETATTR answered from memory when the attributes need no refresh (see `getattr`).
    pub(super) fn getattr_cached(&self, ino: Ino) -> Option<FileAttr> {
        if is_virtual(ino) {
            return None;
        }
        (self.nodes).attr_if_fresh(ino, self.offline.now(), self.uid, self.gid)
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
        self.nodes.inode(ino, |i| i.mtime)
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
        let out = self.nodes.entries(ino)?;
        self.thumbnails_listed(ino);
        Ok(out)
    }

    /// FORGET: the kernel dropped `n` references to `ino`.
    pub(super) fn forget(&self, ino: Ino, n: u64) {
        self.nodes.forget(ino, n);
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
        add: impl FnMut(Ino, u64, &str, &Duration, &FileAttr) -> bool,
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
        let (ttl, owner) = (self.ttl(), (self.uid, self.gid));
        (self.nodes).readdirplus(ino, &batch, offset, ttl, owner, add);
        Ok(())
    }

    /// RELEASEDIR: the snapshot goes.
    pub(super) fn releasedir(&self, fh: u64) {
        self.handles().remove(&fh);
    }
}
