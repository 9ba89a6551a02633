//! File contents: open, read, write, release, fsync and fallocate. Writes go to a staged copy
//! on local disk (`staging.rs`); the last writer's release journals it and starts its upload
//! (`upload.rs`, `writeback.rs`); fsync returns once the bytes are stored. Reads come from the
//! staged copy while there is one, else from the read cache (`cache.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{Errno, FopenFlags, OpenAccMode, OpenFlags};

use super::errno::{errno, io_errno};
use super::passthrough::{self, Register};
use super::preview::is_virtual;
use super::staging::Staged;
use super::table::{Ino, InodeKind};
use super::{Fs, Handle, OpResult, upload};
use crate::backend::Backend;

/// An open file: its handle, how the kernel is to treat its cached pages, and the backing file
/// it reads from itself (passthrough).
#[derive(Debug)]
pub(crate) struct Opened {
    pub fh: u64,
    pub flags: FopenFlags,
    pub backing: Option<Arc<fuser::BackingId>>,
}

impl<B: Backend> Fs<B> {
    pub(super) fn new_fh(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.handles().insert(fh, h);
        fh
    }

    /// The staged copy of a file, created (with its content, unless `truncate`) if there is
    /// none, with one more writer counted. The count is taken with the table locked, where a
    /// finished upload decides to retire the staged copy, so a writer never writes to a retired
    /// copy; the caller gives it back with `release_staged`.
    pub(super) async fn stage(self: &Arc<Self>, ino: Ino, truncate: bool) -> OpResult<Arc<Staged>> {
        // A file rewritten faster than it can be copied, again and again: give up at last.
        for _ in 0..STAGE_ATTEMPTS {
            if let Some(s) = self.try_stage(ino, truncate).await? {
                return Ok(s);
            }
        }
        Err(Errno::EAGAIN)
    }

    /// One attempt of [`Fs::stage`]; `None` when the file got a new stored version while its
    /// content was being copied (the copy would stage the old bytes: fstests generic/451), and
    /// the inode now knows it.
    async fn try_stage(
        self: &Arc<Self>,
        ino: Ino,
        truncate: bool,
    ) -> OpResult<Option<Arc<Staged>>> {
        let (path, remote) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            if let Some(s) = &i.staged {
                let s = s.clone();
                s.writers.fetch_add(1, Ordering::SeqCst);
                drop(t);
                return self.emptied_if(ino, s, truncate).map(Some);
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
                if e.code == super::cache::CHANGED {
                    // Another version came while downloading: learn which, and copy that.
                    self.refresh_attr(ino, &path).await?;
                    return Ok(None);
                }
                return Err(errno(&e));
            }
            staged.truncate(r.size).map_err(|e| io_errno(&e))?;
            // The copy is the stored content: not a change to upload by itself.
            staged.mark_uploaded(staged.generation());
        }
        let staged = Arc::new(staged);
        let mut t = self.table();
        let Some(i) = t.get(ino) else {
            self.journal.finish(&staged);
            return Err(Errno::ENOENT);
        };
        let (staged, truncate) = match i.staged.clone() {
            // Someone staged it meanwhile: use theirs.
            Some(other) => {
                self.journal.finish(&staged);
                (other, truncate)
            }
            None if !same_version(i.remote.as_ref(), remote.as_ref()) => {
                drop(t);
                self.journal.finish(&staged);
                return Ok(None);
            }
            None => {
                t.set_staged(ino, Some(staged.clone()));
                (staged, truncate && remote.is_some())
            }
        };
        staged.writers.fetch_add(1, Ordering::SeqCst);
        drop(t);
        self.emptied_if(ino, staged, truncate).map(Some)
    }

    /// A staged copy its new writer opened with O_TRUNC (`truncate`) is cut to nothing; if that
    /// fails, the writer is counted out again.
    fn emptied_if(
        self: &Arc<Self>,
        ino: Ino,
        staged: Arc<Staged>,
        truncate: bool,
    ) -> OpResult<Arc<Staged>> {
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
    pub(super) fn release_staged(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        if staged.writers.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        self.settle(ino, staged);
    }

    /// With no writer left: upload if dirty, else retire the staged copy.
    pub(super) fn settle(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        let mut t = self.table();
        let Some(inode) = t.get(ino) else { return };
        // The last close counted itself out before taking the table; an open may have joined
        // this copy since (it counts itself in under the table). Its own close settles it
        // then: dropping the copy now would leave that writer's bytes where nobody reads or
        // stores them (fstests generic/451).
        if staged.writers.load(Ordering::SeqCst) > 0 {
            return;
        }
        if !inode
            .staged
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, staged))
        {
            // No longer the inode's copy (set aside, replaced): nothing of the inode's to
            // retire. Stored bytes need no journal entry; others stay for the next mount.
            if !staged.is_dirty() {
                self.journal.finish(staged);
            }
            return;
        }
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
        } else if staged.kernel_wrote() && (inode.pt.is_some() || staged.kernel_holds()) {
            // Clean, but the kernel may write it on (see `writeback::retire`).
        } else if staged.kernel_wrote() && staged.mapped_elsewhere() {
            drop(t);
            super::writeback::until_unmapped(self, ino, staged);
        } else {
            // Clean: every generation is stored (or nothing was written). An upload task that
            // still holds it finds nothing to do. (No `uploading` lock here: the uploader takes
            // that lock before the table's, and the order must not be reversed.)
            self.journal.finish(staged);
            t.set_staged(ino, None);
            t.maybe_drop(ino);
        }
    }

    /// RELEASE: the journal entry is on disk before this returns (written when staging began
    /// and rewritten here); the upload itself runs in the background.
    pub(super) fn release(self: &Arc<Self>, fh: u64) {
        let Some(h) = self.handles().remove(&fh) else {
            return;
        };
        if let Handle::File {
            ino,
            staged,
            kernel,
        } = h
        {
            // The passthrough share first: a batch stores the file sealed (by a link, no copy)
            // only once the kernel holds it no more.
            let mut t = self.table();
            let mut last_pt = None;
            if let Some(i) = t.get_mut(ino) {
                if i.pt.as_mut().is_some_and(|pt| pt.leave(fh)) {
                    last_pt = i.pt.take();
                }
            }
            // The kernel's last handle of a staged file it wrote: a map of it may still write.
            let pt_ended = last_pt.is_some();
            let kernel_staged = t
                .get(ino)
                .and_then(|i| i.staged.clone())
                .filter(|s| s.kernel_wrote());
            let stored = t.stored_version(ino);
            if let Some(s) = kernel_staged.filter(|_| pt_ended && staged.is_none()) {
                // The last reader of it, after the writers: a map of a writer may have written
                // meanwhile (`retire` left the file to this release).
                s.kernel_recheck(stored.as_ref());
                drop(t);
                self.settle(ino, &s);
                t = self.table();
            }
            // A writer is counted open until its staged file is settled: the inode must not
            // be dropped before.
            if let Some(s) = staged {
                drop(t);
                drop(last_pt);
                if kernel {
                    s.kernel_writer_leaves(stored.as_ref());
                }
                self.release_staged(ino, &s);
                t = self.table();
                last_pt = None;
            }
            if let Some(i) = t.get_mut(ino) {
                i.open_handles = i.open_handles.saturating_sub(1);
            }
            t.maybe_drop(ino);
            drop(t);
            // The backing file is closed in the kernel outside the table's lock.
            drop(last_pt);
        }
    }

    /// OPEN without a kernel to pass files through to (tests).
    #[cfg(test)]
    pub(super) async fn open(self: &Arc<Self>, ino: Ino, flags: OpenFlags) -> OpResult<Opened> {
        let refuse = |_: std::os::fd::BorrowedFd<'_>| -> std::io::Result<fuser::BackingId> {
            Err(std::io::ErrorKind::Unsupported.into())
        };
        self.open_with(ino, flags, &refuse).await
    }

    /// OPEN: a handle; one opened for writing counts as a writer of the file's staged copy. A
    /// read-only open of bytes whole on local disk is passed through (`register` hands the file
    /// to the kernel); ESTALE when the open needs another mode than passthrough opens of the
    /// inode (see `passthrough`: the kernel then opens the name's new inode).
    pub(super) async fn open_with(
        self: &Arc<Self>,
        ino: Ino,
        flags: OpenFlags,
        register: &Register<'_>,
    ) -> OpResult<Opened> {
        // O_TRUNC cuts the file even with O_RDONLY (the kernel checked the right to).
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || truncates(flags);
        if is_virtual(ino) {
            let flags = self.preview_open(ino, write)?;
            let fh = self.new_fh(Handle::File {
                ino,
                staged: None,
                kernel: false,
            });
            return Ok(Opened {
                fh,
                flags,
                backing: None,
            });
        }
        let (kind, remote, staged) = {
            let t = self.table();
            let i = t.get(ino).ok_or(Errno::ENOENT)?;
            (i.kind, i.remote.clone(), i.staged.is_some())
        };
        if kind == InodeKind::Dir {
            return Err(Errno::EISDIR);
        }
        if write {
            self.writable()?;
            return self.open_writer(ino, flags, register).await;
        }
        let mut source =
            match remote.filter(|_| !staged && self.passthrough.on() && passable(flags)) {
                Some(r) => self.local_source(&r).await,
                None => None,
            };
        // A second conflict after the name moved cannot happen to this inode: it is unlinked.
        for _ in 0..2 {
            match self.attach_reader(ino, flags, &mut source, register)? {
                Some(o) => return Ok(o),
                None => self.move_off(ino).await?,
            }
        }
        Err(Errno::ESTALE)
    }

    /// OPEN of a reader answered on the FUSE thread when all it needs is local; `None`: the
    /// slow path decides ([`Fs::open_with`]).
    pub(super) fn open_now(
        self: &Arc<Self>,
        ino: Ino,
        flags: OpenFlags,
        register: &Register<'_>,
    ) -> Option<OpResult<Opened>> {
        if is_virtual(ino) || !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || truncates(flags)
        {
            return None;
        }
        let (kind, remote, staged) = {
            let t = self.table();
            let i = t.get(ino)?;
            (i.kind, i.remote.clone(), i.staged.is_some())
        };
        if kind == InodeKind::Dir {
            return Some(Err(Errno::EISDIR));
        }
        let mut source = None;
        if let Some(r) = remote.filter(|_| !staged && self.passthrough.on() && passable(flags)) {
            source = self.local_source_now(&r);
            // The store may have it: asked on the slow path.
            if source.is_none() && passthrough::key(&r).is_some() && r.size > 0 {
                return None;
            }
        }
        self.attach_reader(ino, flags, &mut source, register)
            .transpose()
    }

    /// A writer's open: beside passthrough opens of the inode only when they share its staged
    /// file (then it is one of them); else the name moves first ([`Fs::move_off`]).
    async fn open_writer(
        self: &Arc<Self>,
        ino: Ino,
        flags: OpenFlags,
        register: &Register<'_>,
    ) -> OpResult<Opened> {
        let truncate = truncates(flags);
        // No passthrough open may start while the copy is staged: counted as coming.
        let keep = loop {
            {
                let mut t = self.table();
                let i = t.get_mut(ino).ok_or(Errno::ENOENT)?;
                if i.pt.is_none() || shares_staged(i) {
                    i.plain_pending += 1;
                    break keep_cache(i);
                }
            }
            self.move_off(ino).await?;
        };
        let staged = self.stage(ino, truncate).await;
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        let backing = {
            let mut t = self.table();
            match t.get_mut(ino) {
                Some(i) => {
                    i.plain_pending -= 1;
                    match &staged {
                        Ok(s) => {
                            let b = self.kernel_writer(i, s, fh, flags, truncate, register);
                            if b.is_ok() {
                                i.open_handles += 1;
                            }
                            Some(b)
                        }
                        Err(_) => None,
                    }
                }
                None => None,
            }
        };
        let staged = staged?;
        let backing = match backing {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                self.release_staged(ino, &staged);
                return Err(e);
            }
            None => {
                self.release_staged(ino, &staged);
                return Err(Errno::ENOENT);
            }
        };
        let keep = keep && backing.is_none();
        let mut opened = self.writer_handle(ino, fh, staged, backing);
        if keep {
            opened.flags = FopenFlags::FOPEN_KEEP_CACHE;
        }
        Ok(opened)
    }

    /// Whether files created or truncated here are written by the kernel itself. Not under a
    /// file size limit below the usual (`--max-file-size`): the kernel cannot refuse a write
    /// past it with EFBIG, as the daemon does.
    fn kernel_writes(&self) -> bool {
        self.opts.kernel_writes
            && self.opts.max_file_size >= KERNEL_WRITES_LIMIT
            && self.journal.leases()
    }

    /// What `vaultfs status` and the mount's log say about writes.
    pub(super) fn describe_writes(&self) -> String {
        if self.kernel_writes() && self.passthrough.on() {
            "passthrough for new and truncated files (the kernel writes their staging files)".into()
        } else {
            "through the daemon".into()
        }
    }

    /// The handle of a writer: the kernel writes for it when it has a backing file.
    pub(super) fn writer_handle(
        &self,
        ino: Ino,
        fh: u64,
        staged: Arc<Staged>,
        backing: Option<Arc<fuser::BackingId>>,
    ) -> Opened {
        self.handles().insert(
            fh,
            Handle::File {
                ino,
                staged: Some(staged),
                kernel: backing.is_some(),
            },
        );
        Opened {
            fh,
            flags: FopenFlags::empty(),
            backing,
        }
    }

    /// Whether the kernel writes the staged file itself for writer `fh` (passthrough), decided
    /// with the table locked: it must when passthrough opens share the file already (no plain
    /// open may join them), and may for a file written afresh (created or truncated: a change
    /// whatever is written, since what the kernel writes is never seen here) that nobody else
    /// has open. `Some`: the backing file to open with.
    pub(super) fn kernel_writer(
        &self,
        i: &mut super::table::Inode,
        staged: &Arc<Staged>,
        fh: u64,
        flags: OpenFlags,
        afresh: bool,
        register: &Register<'_>,
    ) -> OpResult<Option<Arc<fuser::BackingId>>> {
        if let Some(pt) = &mut i.pt {
            if pt.key() != staged.backing_key() {
                log::error!("{}: passthrough opens of another file hold it", i.path);
                return Err(Errno::EIO);
            }
            staged.kernel_writer_joins();
            return Ok(Some(pt.join(fh)));
        }
        let alone = i.open_handles == 0 && i.plain_pending == 0;
        let wanted = self.kernel_writes() && afresh && alone && passable(flags);
        if !(wanted && self.passthrough.on()) {
            return Ok(None);
        }
        let file = staged.own_file().map_err(|e| io_errno(&e))?;
        let source = passthrough::Source::Staged(file);
        let Some(id) = self.passthrough.register(&source, register) else {
            return Ok(None);
        };
        staged.kernel_writer_joins();
        // What the kernel caches of the inode is older than what it now writes past it.
        i.kernel_md5 = None;
        let shared = passthrough::Shared::new(staged.backing_key(), id, fh, source);
        let id = shared.id();
        i.pt = Some(shared);
        Ok(Some(id))
    }

    /// A reader's open decided with the table locked: passed through when `source` holds the
    /// current version's bytes and no plain open stands in the way, else the plain way.
    /// `Ok(None)`: passthrough opens of another version hold the inode ([`Fs::move_off`]).
    fn attach_reader(
        &self,
        ino: Ino,
        flags: OpenFlags,
        source: &mut Option<(String, passthrough::Source)>,
        register: &Register<'_>,
    ) -> OpResult<Option<Opened>> {
        // Read-only: nothing to flush at close.
        let noflush = FopenFlags::FOPEN_NOFLUSH;
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        let backing = {
            let mut t = self.table();
            let i = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            let current = i.remote.as_ref().and_then(passthrough::key);
            if let Some(pt) = &mut i.pt {
                // Opens of a staged file the kernel writes are all passed through: none can
                // be plain, and its name cannot move.
                let joins = match &i.staged {
                    Some(s) => pt.key() == s.backing_key(),
                    None => current.as_deref() == Some(pt.key()) && passable(flags),
                };
                if !joins {
                    return Ok(None);
                }
                i.open_handles += 1;
                Some(pt.join(fh))
            } else {
                let plain_busy = i.plain_pending > 0 || i.open_handles > 0 || i.staged.is_some();
                let registered = match source.take() {
                    Some((key, src)) if !plain_busy && current.as_ref() == Some(&key) => self
                        .passthrough
                        .register(&src, register)
                        .map(|id| passthrough::Shared::new(key, id, fh, src)),
                    _ => None,
                };
                i.open_handles += 1;
                match registered {
                    Some(shared) => {
                        let id = shared.id();
                        i.pt = Some(shared);
                        Some(id)
                    }
                    None => None,
                }
            }
        };
        self.handles().insert(
            fh,
            Handle::File {
                ino,
                staged: None,
                kernel: false,
            },
        );
        if let Some(id) = backing {
            return Ok(Some(Opened {
                fh,
                flags: noflush,
                backing: Some(id),
            }));
        }
        // The plain way: the kernel may keep its cached pages when the content is what it
        // last saw through the daemon.
        let keep = self.table().get_mut(ino).is_some_and(keep_cache);
        let flags = if keep {
            noflush | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            noflush
        };
        Ok(Some(Opened {
            fh,
            flags,
            backing: None,
        }))
    }

    /// Passthrough opens of another version (or beside which a writer must open) hold `ino`:
    /// its name moves to a new inode and the open gets ESTALE, so the kernel opens that one.
    /// `Ok`: they closed meanwhile, try again.
    async fn move_off(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        let io = self.table().get(ino).map(|i| i.io.clone());
        // Not while an upload or a namespace change of the node runs.
        let _io = match io {
            Some(io) => io.lock_owned().await,
            None => return Err(Errno::ENOENT),
        };
        let moved = {
            let mut t = self.table();
            if t.get(ino).is_some_and(|i| i.pt.is_none()) {
                return Ok(());
            }
            let path = t.get(ino).map(|i| i.path.clone());
            let parent = path
                .as_ref()
                .and_then(|p| p.parent())
                .and_then(|p| t.ino_of(&p));
            let new = t.reissue(ino);
            new.zip(parent).zip(path)
        };
        if let Some(((new, parent), path)) = moved {
            log::debug!(
                "{path}: inode {ino} stays with its passthrough readers, the name moves to {new}"
            );
            // Cached lookups of the name go: the next one finds the new inode.
            if let Some(name) = path.name() {
                self.kernel_forgets_name(parent, name);
            }
        }
        Err(Errno::ESTALE)
    }

    /// Whether passthrough opens of a stored version hold `ino` (a truncate by name must move
    /// it first; one of a staged file the kernel writes cuts that file).
    pub(super) fn held_by_passthrough(&self, ino: Ino) -> bool {
        self.table()
            .get(ino)
            .is_some_and(|i| i.pt.is_some() && !shares_staged(i))
    }

    /// SETATTR of a size on an inode held by passthrough opens: the name moves (ESTALE, and
    /// truncate(2) looks it up again).
    pub(super) async fn truncate_elsewhere(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        self.move_off(ino).await
    }

    /// The current version's bytes whole on local disk, if they are (see `passthrough`).
    async fn local_source(
        self: &Arc<Self>,
        r: &super::table::Remote,
    ) -> Option<(String, passthrough::Source)> {
        if let Some(s) = self.local_source_now(r) {
            return Some(s);
        }
        let key = passthrough::key(r).filter(|_| r.size > 0)?;
        match self.backend.local_file(&r.id).await {
            Ok(Some((node, path, file)))
                if node.md5_checksum == r.md5 && node.size == Some(r.size) =>
            {
                self.passthrough.remember(&key, path);
                Some((key, passthrough::Source::File(file)))
            }
            _ => None,
        }
    }

    /// [`Fs::local_source`] from what is at hand: a complete read-cache file, a blob opened
    /// before.
    fn local_source_now(&self, r: &super::table::Remote) -> Option<(String, passthrough::Source)> {
        let key = passthrough::key(r).filter(|_| r.size > 0)?;
        if let Some(e) = self
            .cache
            .complete(&r.id, r.md5.as_deref())
            .filter(|e| e.size == r.size)
        {
            return Some((key, passthrough::Source::CachedFile(e)));
        }
        let f = self.passthrough.reopen(&key, r.size)?;
        Some((key, passthrough::Source::File(f)))
    }

    /// READ: from the staged copy, else from the read cache (which downloads what it lacks).
    pub(super) async fn read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> OpResult<Vec<u8>> {
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

    /// FSYNC: returns once the file's bytes as they are now are stored, or says why not.
    pub(super) async fn fsync(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        let staged = self.table().get(ino).and_then(|i| i.staged.clone());
        let Some(staged) = staged else { return Ok(()) };
        // What the kernel wrote itself is news here.
        let stored = self.table().stored_version(ino);
        staged.kernel_sync(stored.as_ref());
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

    /// READ of a file with a staged copy: answered from local disk, on the FUSE thread
    /// (`None`: not staged, [`Fs::read`] may need the network).
    pub(super) fn read_staged(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Option<OpResult<Vec<u8>>> {
        let staged = self.table().get(ino).and_then(|i| i.staged.clone())?;
        Some(
            staged
                .read_at(offset, size as usize)
                .map_err(|e| io_errno(&e)),
        )
    }

    /// The staged copy a handle writes to (EBADF: not open for writing).
    pub(super) fn writing(&self, fh: u64) -> OpResult<Arc<Staged>> {
        match self.handles().get(&fh) {
            Some(Handle::File {
                staged: Some(s), ..
            }) => Ok(s.clone()),
            _ => Err(Errno::EBADF),
        }
    }

    /// WRITE through handle `fh`, to its staged copy: the number of bytes written.
    pub(super) fn write(&self, fh: u64, offset: u64, data: &[u8]) -> OpResult<u32> {
        self.daemon_writes.fetch_add(1, Ordering::Relaxed);
        let staged = self.writing(fh)?;
        staged.write_at(offset, data).map_err(|e| io_errno(&e))?;
        // A large file written in order is hashed while it is written, beside the writer.
        if let Some(job) = staged.hash_ahead() {
            self.rt.spawn_blocking(job);
        }
        Ok(data.len() as u32)
    }

    /// FLUSH (each close(2)): nothing to do; the last release starts the upload.
    pub(super) fn flush(&self, _fh: u64) -> OpResult<()> {
        Ok(())
    }

    /// FALLOCATE: only plain allocation is meaningful on a staging file; punching holes or
    /// zeroing ranges is refused explicitly rather than half-done.
    pub(super) fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> OpResult<()> {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(Errno::ENOTSUP);
        }
        let staged = self.writing(fh)?;
        staged
            .allocate(offset, length, mode & libc::FALLOC_FL_KEEP_SIZE != 0)
            .map_err(|e| io_errno(&e))
    }

    /// COPY_FILE_RANGE: not offered; the kernel falls back to reads and writes.
    pub(super) fn copy_file_range(&self) -> OpResult<u32> {
        Err(Errno::ENOSYS)
    }
}

/// Whether the kernel may keep its cached pages of a file opened the plain way: the content is
/// what it last saw through the daemon (or the staged copy, which it saw written).
fn keep_cache(i: &mut super::table::Inode) -> bool {
    let md5 = i.remote.as_ref().and_then(|r| r.md5.clone());
    // The kernel saw a staged file written through the daemon, not one it wrote itself.
    let staged = i.staged.as_ref().map(|s| !s.kernel_wrote());
    let keep = staged.unwrap_or(false) || (md5.is_some() && md5 == i.kernel_md5);
    if i.staged.is_none() {
        i.kernel_md5 = md5;
    }
    keep
}

/// Whether the passthrough opens of `i` share its staged file (the kernel writes it).
fn shares_staged(i: &super::table::Inode) -> bool {
    match (&i.pt, &i.staged) {
        (Some(pt), Some(s)) => pt.key() == s.backing_key(),
        _ => false,
    }
}

/// Whether an open cuts the file (the kernel sends O_TRUNC with it: FUSE_ATOMIC_O_TRUNC).
fn truncates(flags: OpenFlags) -> bool {
    flags.0 & libc::O_TRUNC != 0
}

/// Whether an open may be passed through: not with O_DIRECT (the backing file would take
/// aligned requests only, where FUSE takes any). (An O_TRUNC open is a writer's.)
fn passable(flags: OpenFlags) -> bool {
    #[cfg(target_os = "linux")]
    let direct = libc::O_DIRECT;
    #[cfg(not(target_os = "linux"))]
    let direct = 0;
    flags.0 & direct == 0
}

/// Below this file size limit, writes go through the daemon, which refuses one past the limit
/// at once (a larger file written by the kernel is refused when stored, before it is hashed).
const KERNEL_WRITES_LIMIT: u64 = 1 << 40;

/// How many times an open copies a file that keeps getting new versions meanwhile.
const STAGE_ATTEMPTS: usize = 5;

/// Whether two views of a file's stored version name the same bytes.
fn same_version(a: Option<&super::table::Remote>, b: Option<&super::table::Remote>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.id == b.id && a.md5 == b.md5 && a.size == b.size,
        (None, None) => true,
        _ => false,
    }
}
