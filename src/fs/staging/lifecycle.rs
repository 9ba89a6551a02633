//! The staged file's life, in one place: every step that moves a staged file on (a writer
//! joins or leaves, its last close settles it, an upload or a batch stores it, it is retired,
//! removed, replaced by a rename, set aside) is a method here that checks it may happen. `io`,
//! `namespace` and the two uploaders (`upload`: file by file; `writeback`: the built-in
//! store's batches) call these; nothing else changes where a staged file is. What the bytes
//! go through meanwhile (writes, cuts, seals and copies; the kernel's own writes) is in the
//! rest of `staging`; how a failed store is tried again, in `retry`.
//!
//! The states and which step may be taken from which are `state`'s (its diagram); here,
//! each step as the mount takes it, with the inode table's lock where the inode lets go.
//!
//! - **Attach** ([`Fs::attach`], [`Fs::joins`], [`Fs::recovered`]): a new copy (empty, or made
//!   from the stored version: [`Fs::copied_stored`]) becomes its inode's with its first writer
//!   in; a later writer joins the inode's copy, unless it let go meanwhile; a copy an earlier
//!   run journaled is its inode's again at start.
//! - **Kernel writers** ([`Fs::kernel_writer_joins`], [`Fs::release_kernel_writer`],
//!   [`Fs::fsync_started`], [`Fs::kernel_let_go`]): a handle the kernel writes through never
//!   shows its writes here; its close, an fsync and the kernel letting go make them a change.
//! - **Base** (what an upload replaces, docs/design.md §5): given when the copy is made, then
//!   set only here: the version stored ([`Fs::stored`]), taken over ([`Fs::takes_version`]),
//!   renamed over ([`Fs::replaces`]), none when stored anew ([`Fs::becomes_new_file`]).
//! - **Write** (`write_at`, `truncate`, `allocate`, `set_attrs`): a new generation, dirty until
//!   an upload stores it. A sealed file (its bytes shared with the store) is copied first.
//! - **Close** ([`Fs::release_staged`]): the last writer leaves; [`Fs::settle`] decides.
//! - **Settle**: with a writer back meanwhile, nothing (its own close settles); removed, it is
//!   dropped; dirty, it is journaled and its upload scheduled; clean, it is retired, unless the
//!   kernel may still write it (a passthrough open, a map: `kernel`), which lets go later.
//! - **Upload**: the per-file uploader reads the generation and sends the bytes; a batch seals
//!   the file ([`Fs::to_store`]) so the store may keep it as its blob. Finished,
//!   [`Fs::stored`] marks the generation clean and gives the inode its new version under one
//!   lock (a close in between would drop the copy while the inode still named the old version,
//!   and the next open stage the old bytes: fstests generic/451), then retires the file if
//!   nothing new came. Failed: `retry`.
//! - **Remove** ([`Removal`], [`Fs::removed`]): an upload under way stops; the file is dropped
//!   once no writer holds it (else at its last close).
//! - **Rename** ([`Fs::renamed`], [`Fs::replaced`]): the staged file goes with its inode, its
//!   journal entry (and those under a renamed folder) rewritten to the new path; a staged file
//!   the rename replaced is dropped, unless it is open for writing.
//!
//! The steps above that take `&mut Table` are parts of the steps the mount takes, which take
//! the table's lock themselves (the only module beside the table's own that does): a writer's
//! open ([`Fs::writer_finds`], [`Fs::attach_copy`]), its close ([`Fs::closed`]), an upload's
//! answer ([`Fs::upload_answered`], [`Fs::stored_already`]); those that make, remove or rename
//! an entry (`entries.rs`: a create, an unlink, a rename); and those of conflict copies and of a
//! file taking its history back (`names.rs`).

use std::sync::Arc;
use std::time::Duration;

use fuser::Errno;

use super::{Snapshot, Staged};
use crate::api::{Base, Error, FileAttrs, Node, NodePath, whole_mode};
use crate::backend::{Backend, PutFile};
use crate::fs::Fs;
use crate::fs::table::{Ino, Inode, InodeKind, Remote, Table};

mod entries;
mod names;
pub(in crate::fs) use entries::Moved;
#[cfg(test)]
mod tests;

/// Whether `staged` is `inode`'s copy.
fn current(inode: &Inode, staged: &Arc<Staged>) -> bool {
    inode
        .staged
        .as_ref()
        .is_some_and(|s| Arc::ptr_eq(s, staged))
}

/// What a new writer of a file finds ([`Fs::writer_finds`]).
pub(in crate::fs) enum Found {
    /// The inode's copy, joined.
    Joined(Arc<Staged>),
    /// The inode's copy, letting go: the writer looks again.
    LetGo,
    /// No copy: what a new one needs (its path, the stored version, its base).
    Copy {
        path: NodePath,
        remote: Option<Remote>,
        base: Base,
    },
}

/// Whether two views of a file's stored version name the same bytes.
fn same_version(a: Option<&Remote>, b: Option<&Remote>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.id == b.id && a.md5 == b.md5 && a.size == b.size,
        (None, None) => true,
        _ => false,
    }
}

/// What a batch does with one file, decided with its `io` held ([`Fs::to_store`]). (Taken
/// apart as soon as it is returned: no box for the large variant.)
#[allow(clippy::large_enum_variant)]
pub(in crate::fs) enum ToStore {
    /// Nothing to send: `clean` when nothing is left to store (stored already, removed, never
    /// changed), else its release (or the end of a map) queues it again.
    Nothing { clean: bool },
    /// Written by the kernel, maybe to the same bytes: compared with the stored version
    /// (md5 and size) first.
    Compare {
        staged: Arc<Staged>,
        generation: u64,
        size: u64,
        stored: (String, u64),
    },
    /// Its bytes could not be read (the staging file cannot be opened): a failed attempt.
    Failed(std::io::Error),
    /// To send as this.
    Send {
        staged: Arc<Staged>,
        generation: u64,
        size: u64,
        put: PutFile,
    },
}

impl<B: Backend> Fs<B> {
    /// A made copy nobody will use (another copy took its place, the stored version changed
    /// while it was copied, the open failed): its journal entry ends.
    pub(in crate::fs) fn discard(&self, staged: &Staged) {
        if let Err(e) = staged.drop_copy() {
            log::warn!("{e}");
        }
        self.journal.finish(staged);
    }

    /// **Made from the stored version**: a new copy holds the bytes of the version it was
    /// copied from, before its writer attaches: not a change to upload by itself.
    pub(in crate::fs) fn copied_stored(staged: &Staged) {
        if let Err(e) = staged.holds_stored() {
            log::error!("{e}");
        }
    }

    /// **Attach**: `staged`, made for `ino` (new, or a copy of its stored version), becomes the
    /// inode's copy with its first writer in. False, and nothing changed, when the inode is
    /// gone or has a copy already, or this one takes no writer.
    pub(in crate::fs) fn attach(t: &mut Table, ino: Ino, staged: &Arc<Staged>) -> bool {
        if t.get(ino).is_none_or(|i| i.staged.is_some()) || staged.join().is_err() {
            return false;
        }
        t.set_staged(ino, Some(staged.clone()));
        true
    }

    /// **Join**: a writer opens `ino`'s copy `staged` (taken from the inode under the same
    /// lock). False when that copy let go of its inode meanwhile (retired or dropped by the
    /// close that counted out its last writer): the opener stages the file again.
    pub(in crate::fs) fn joins(t: &Table, ino: Ino, staged: &Arc<Staged>) -> bool {
        t.get(ino).is_some_and(|i| current(i, staged)) && staged.join().is_ok()
    }

    /// **Attach** or **join**, a writer's first look at `ino`: it joins the inode's copy, else
    /// it is told what a new copy needs. A whole rewrite (`truncate`) replaces what was read
    /// here; a write into the bytes, the version they are copied from.
    pub(in crate::fs) fn writer_finds(&self, ino: Ino, truncate: bool) -> Result<Found, Errno> {
        let t = self.nodes.lock();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        if let Some(s) = &i.staged {
            let s = s.clone();
            return Ok(match Self::joins(&t, ino, &s) {
                true => Found::Joined(s),
                false => Found::LetGo,
            });
        }
        let base = if truncate { i.base() } else { i.known_base() };
        let (path, remote) = (i.path.clone(), i.remote.clone());
        Ok(Found::Copy { path, remote, base })
    }

    /// **Attach** of a new copy, made of `remote` (the version the writer found, copied in
    /// where it writes into the bytes): the inode's with its first writer in (true: ours). A
    /// copy another writer attached meanwhile is joined instead (false). None when the inode's
    /// version moved on (the copy holds old bytes) or its copy let go: the writer looks again.
    /// ESTALE when deleted or moved elsewhere meanwhile: the kernel looks the name up again,
    /// rather than a writer writing into an inode with no name to store under (the model lost
    /// an fsynced rewrite so). A copy not attached is discarded.
    pub(in crate::fs) fn attach_copy(
        &self,
        ino: Ino,
        staged: Arc<Staged>,
        remote: Option<&Remote>,
    ) -> Result<Option<(Arc<Staged>, bool)>, Errno> {
        let mut t = self.nodes.lock();
        let found = match t.get(ino) {
            None => Err(Errno::ENOENT),
            Some(i) if i.gone_elsewhere => Err(Errno::ESTALE),
            Some(i) => Ok((i.staged.clone(), same_version(i.remote.as_ref(), remote))),
        };
        let attached = match found {
            // Someone staged it meanwhile: theirs.
            Ok((Some(other), _)) => Ok(Self::joins(&t, ino, &other).then_some((other, false))),
            Ok((None, false)) => Ok(None),
            Ok((None, true)) => {
                Ok(Self::attach(&mut t, ino, &staged).then(|| (staged.clone(), true)))
            }
            Err(e) => Err(e),
        };
        drop(t);
        if !matches!(attached, Ok(Some((_, true)))) {
            self.discard(&staged);
        }
        attached
    }

    /// **Recover**: a staged file an earlier run left in the journal is the copy of the inode
    /// at `path`, with no writer; its upload is the caller's to schedule.
    pub(in crate::fs) fn recovered(&self, path: &NodePath, staged: Staged) -> Ino {
        let mut t = self.nodes.lock();
        let ino = t.ensure(path, InodeKind::File);
        t.set_staged(ino, Some(Arc::new(staged)));
        ino
    }

    /// **A kernel writer joins**: a handle the kernel writes through itself (passthrough,
    /// `open::kernel_writer`, the table locked) opens `staged`; `afresh`, created or cut.
    pub(in crate::fs) fn kernel_writer_joins(staged: &Staged, afresh: bool) {
        staged.kernel_writer_joins(afresh);
    }

    /// **Close** of a handle the kernel wrote through: what it wrote is a change (unless the
    /// file still is the `stored` version, size and times unmoved), then as any close.
    pub(in crate::fs) fn release_kernel_writer(
        self: &Arc<Self>,
        ino: Ino,
        staged: &Arc<Staged>,
        stored: Option<&(String, u64)>,
    ) {
        staged.kernel_writer_leaves(stored);
        self.release_staged(ino, staged);
    }

    /// **The kernel lets go**: the last passthrough handle of `staged`, a file the kernel
    /// wrote, is released after its writers: a map of it may have written meanwhile (compared
    /// with the `stored` version under the table `t`, which is let go after: an upload ending
    /// meanwhile would otherwise retire the copy before that change is counted), and retiring,
    /// left to this release, is settled now.
    pub(in crate::fs) fn kernel_let_go(
        self: &Arc<Self>,
        t: std::sync::MutexGuard<'_, Table>,
        ino: Ino,
        staged: &Arc<Staged>,
        stored: Option<&(String, u64)>,
    ) {
        staged.kernel_recheck(stored);
        drop(t);
        self.settle(ino, staged);
    }

    /// **Close** of the handle `fh` of `ino` (RELEASE): the passthrough share first (a batch
    /// stores the file sealed, by a link and no copy, only once the kernel holds it no more),
    /// then its writer (`staged`; `kernel`: the kernel wrote through it itself) leaves, and
    /// the inode is let go of if nothing holds it.
    pub(in crate::fs) fn closed(
        self: &Arc<Self>,
        ino: Ino,
        fh: u64,
        staged: Option<Arc<Staged>>,
        kernel: bool,
    ) {
        // The passthrough share first: a batch stores the file sealed (by a link, no copy)
        // only once the kernel holds it no more.
        let mut t = self.nodes.lock();
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
            // meanwhile (retiring left the file to this release: `retire`).
            self.kernel_let_go(t, ino, &s, stored.as_ref());
            t = self.nodes.lock();
        }
        // A writer is counted open until its staged file is settled: the inode must not
        // be dropped before.
        if let Some(s) = staged {
            drop(t);
            drop(last_pt);
            if kernel {
                self.release_kernel_writer(ino, &s, stored.as_ref());
            } else {
                self.release_staged(ino, &s);
            }
            t = self.nodes.lock();
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

    /// The journal entry of `ino`'s copy `staged` names the path and stored file the inode has
    /// now (before an fsync waits for the upload).
    pub(in crate::fs) fn journal_entry_now(&self, ino: Ino, staged: &Staged) {
        if let Some(i) = self.nodes.lock().get(ino) {
            let _ = self.journal_at(staged, i);
        }
    }

    /// **Fsync**: what the kernel wrote itself to `ino`'s copy so far is news here (a change,
    /// unless it still is the stored version).
    pub(in crate::fs) fn fsync_started(&self, ino: Ino, staged: &Staged) {
        let stored = self.nodes.stored_version(ino);
        staged.kernel_sync(stored.as_ref());
    }

    /// **Close**: a writer is done with a staged file; the last one settles it.
    pub(in crate::fs) fn release_staged(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        match staged.leave() {
            Ok(true) => self.settle(ino, staged),
            Ok(false) => {}
            Err(e) => log::error!("inode {ino}: {e}"),
        }
    }

    /// **Settle**, with no writer left: upload if dirty, else retire the staged copy.
    pub(in crate::fs) fn settle(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        let mut t = self.nodes.lock();
        let Some(inode) = t.get(ino) else { return };
        // The last close counted itself out before taking the table; an open may have joined
        // this copy since (it counts itself in under the table). Its own close settles it
        // then: dropping the copy now would leave that writer's bytes where nobody reads or
        // stores them (fstests generic/451).
        if staged.has_writers() {
            return;
        }
        if !current(inode, staged) {
            // No longer the inode's copy (set aside): nothing of the inode's to retire. Stored
            // bytes need no journal entry; others stay for the next mount.
            if !staged.is_dirty() {
                self.journal.finish(staged);
            }
            return;
        }
        if inode.unlinked {
            self.drop_staged(&mut t, ino);
            t.maybe_drop(ino);
            return;
        }
        if staged.is_dirty() {
            if let Err(e) = self.journal_at(staged, inode) {
                log::error!("could not journal {}: {e}", inode.path);
            }
            drop(t);
            crate::fs::upload::schedule(self, ino);
        } else if self.retire(&mut t, ino, staged, false) {
            // Clean: every generation is stored (or nothing was written). An upload task that
            // still holds it finds nothing to do. (No `uploading` lock here: the uploader takes
            // that lock before the table's, and the order must not be reversed.)
            drop(t);
            self.journal.finish(staged);
        }
    }

    /// **Takes a stored version**: the staged bytes of `ino`, not stored yet, now replace the
    /// stored file `node` (a renamed or deleted file taken back under their name, `history`;
    /// the version a conflict found them to be already, `conflict`): the inode takes it as its
    /// stored file, the staged copy its version as the base. The staged copy, if any.
    pub(in crate::fs) fn takes_version(
        t: &mut Table,
        ino: Ino,
        node: &Node,
    ) -> Option<Arc<Staged>> {
        t.update_from(ino, node);
        let staged = t.get(ino)?.staged.clone()?;
        staged.set_base(node.md5_checksum.clone().map_or(Base::Any, Base::Md5));
        Some(staged)
    }

    /// **Compared** (`ToStore::Compare`): a generation the kernel may have left as it was
    /// stored is not: it is stored like any other. (The same: [`Fs::stored`] with no node.)
    pub(in crate::fs) fn found_changed(staged: &Staged) {
        staged.found_changed();
    }

    /// **Becomes a new file**: the stored file `ino`'s staged bytes were to replace is gone
    /// (deleted elsewhere) or stays as it is (a conflict copy takes the bytes): they are
    /// stored as a new file. False, and nothing changed, when `staged` is no longer the
    /// inode's copy.
    pub(in crate::fs) fn becomes_new_file(t: &mut Table, ino: Ino, staged: &Arc<Staged>) -> bool {
        let Some(i) = t.get_mut(ino).filter(|i| current(i, staged)) else {
            return false;
        };
        staged.set_base(Base::Absent);
        i.remote = None;
        i.read_md5 = None;
        true
    }

    /// **Rename over a file**: `ino`'s staged bytes, renamed over a name, replace what it
    /// holds: `base`. (Its journal entry is rewritten by [`Fs::renamed`].)
    pub(in crate::fs) fn replaces(t: &Table, ino: Ino, base: Base) {
        if let Some(s) = t.get(ino).and_then(|i| i.staged.as_ref()) {
            s.set_base(base);
        }
    }

    /// **Upload finished**: `generation` of `staged` is stored, as `node` when the backend
    /// made a new version, which is what the next upload replaces (saves in sequence never
    /// conflict), whatever else came meanwhile. Clean and the inode's new version together, under the table: a
    /// close that settles the copy in between would otherwise find it clean while the inode
    /// still names the old version, drop it, and the next open would stage the old bytes
    /// (fstests generic/451, "stale data from DIO read"). Then retired if nothing new came:
    /// true, and the caller ends its journal entry after letting go of the table (a crash in
    /// between stores the same bytes once more).
    fn stored(
        self: &Arc<Self>,
        t: &mut Table,
        ino: Ino,
        staged: &Arc<Staged>,
        generation: u64,
        node: Option<&Node>,
    ) -> bool {
        if let Some(md5) = node.and_then(|n| n.md5_checksum.clone()) {
            staged.set_base(Base::Md5(md5));
        }
        if let Err(e) = staged.stored(generation) {
            log::debug!("inode {ino}: {e}");
            return false;
        }
        if let Some(node) = node {
            t.update_from(ino, node);
            if let Some(i) = t.get_mut(ino) {
                // This mount's own bytes: what its next whole rewrite replaces.
                i.read_md5 = node.md5_checksum.clone();
            }
        }
        let retired = self.retire(t, ino, staged, true);
        self.thumbnails_stored_in(t, ino);
        retired
    }

    /// `staged`'s journal entry names where its inode `i` is now: its path and stored file.
    fn journal_at(&self, staged: &Staged, i: &Inode) -> std::io::Result<()> {
        let id = i.remote.as_ref().map(|r| r.id.clone());
        self.journal.record(staged, &i.path, id)
    }

    /// **Stored**, as an uploader is answered: `stored` under the table's lock, with the
    /// attributes `attrs` sent with the bytes kept here where the store did not keep them. A
    /// copy still staged (written again meanwhile) has its journal entry name the new base,
    /// under the same lock. Else a daemon after this one (a journal handed over at a remount,
    /// or a crash) sends the next bytes on the old base, and the store's version, this very
    /// one, counts as a change made elsewhere: the name kept old bytes, the new went to a
    /// conflict copy (fstests generic/412, 2 runs in 3 of the chosen list). True when retired:
    /// the caller ends its journal entry.
    pub(in crate::fs) fn upload_answered(
        self: &Arc<Self>,
        ino: Ino,
        staged: &Arc<Staged>,
        generation: u64,
        node: Option<&Node>,
        attrs: Option<FileAttrs>,
    ) -> bool {
        let mut t = self.nodes.lock();
        if let Some((node, id, attrs)) = node.and_then(|n| Some((n, n.file_id()?, attrs?))) {
            crate::fs::attrs::answered(&mut t.kept, &id, node, attrs);
        }
        if self.stored(&mut t, ino, staged, generation, node) {
            return true;
        }
        if let Some(i) = t.get(ino).filter(|i| current(i, staged)) {
            let _ = self.journal_at(staged, i);
        }
        false
    }

    /// **Stored**, where a batch found the bytes stored already: `stored` under the table's
    /// lock. True when retired.
    pub(in crate::fs) fn stored_already(
        self: &Arc<Self>,
        ino: Ino,
        staged: &Arc<Staged>,
        generation: u64,
    ) -> bool {
        self.stored(&mut self.nodes.lock(), ino, staged, generation, None)
    }

    /// **Retire**: a staged file with no writer and nothing new lets go of its inode, which
    /// reads from the backend again. `stored_now`: an upload just stored it (the read cache
    /// adopts its bytes, the inode takes its time); else it was clean when settled (opened
    /// for writing and left as it was, or stored while a writer still held it). True when
    /// retired: the caller ends its journal entry.
    fn retire(
        self: &Arc<Self>,
        t: &mut Table,
        ino: Ino,
        staged: &Arc<Staged>,
        stored_now: bool,
    ) -> bool {
        let Some(inode) = t.get_mut(ino) else {
            return false;
        };
        if !current(inode, staged) || staged.is_dirty() || staged.has_writers() {
            return false;
        }
        // Passthrough opens of a file the kernel wrote: one of them may have mapped it, and the
        // map write on after its close. Their last release retires it (see `io`), or the end of
        // a map that outlived them.
        if staged.kernel_wrote() {
            if inode.pt.is_some() || staged.kernel_holds() {
                return false;
            }
            // (A sealed file was asked before it was sealed, and no map of it can start since.)
            if !staged.is_sealed() && staged.mapped_elsewhere() {
                self.until_unmapped(ino, staged);
                return false;
            }
        }
        if let Err(e) = staged.retire() {
            log::warn!("inode {ino}: {e}");
            return false;
        }
        if staged.was_stored() {
            // The time it was stored with, also when it lets go later than its upload (the
            // kernel wrote it and held it meanwhile): the inode's own time is older, and the
            // next listing would move it back and forth (vim: "The file has been changed since
            // reading it", and the save was not written).
            inode.mtime = staged.mtime();
        }
        if let Some(r) = inode.remote.clone().filter(|_| stored_now) {
            // What the kernel caches of the inode is what it saw written, unless it wrote the
            // staged file itself (passthrough).
            inode.kernel_md5 = r.md5.clone().filter(|_| !staged.kernel_wrote());
            // The staging file handed to the read cache: reading back what was written needs
            // no copy.
            (self.reads.cache).adopt(&r.id, r.md5.as_deref(), staged.size(), staged.hand_over());
            // Stored into a pinned folder: kept on disk for the next mount too.
            self.pins_learned(&inode.path);
        }
        t.set_staged(ino, None);
        if stored_now {
            t.touch(ino);
        }
        t.maybe_drop(ino);
        true
    }

    /// **Drop** the staged file of `ino` (removed, replaced by a rename) when no writer holds
    /// it; one that does is dropped at its last close (`settle`, the inode unlinked).
    fn drop_staged(&self, t: &mut Table, ino: Ino) {
        let Some(s) = t.get(ino).and_then(|i| i.staged.clone()) else {
            return;
        };
        if s.drop_copy().is_ok() {
            self.journal.finish(&s);
            t.set_staged(ino, None);
        }
    }

    /// **Remove**: the file `ino` is gone (detached from its folder): its staged file too.
    pub(in crate::fs) fn removed(&self, t: &mut Table, ino: Ino) {
        if t.get(ino).is_some_and(|i| i.staged.is_some()) {
            self.drop_staged(t, ino);
            t.maybe_drop(ino);
        }
    }

    /// **Rename**, the target: a file that a rename replaced loses its staged bytes.
    pub(in crate::fs) fn replaced(&self, t: &mut Table, target: Ino) {
        self.drop_staged(t, target);
    }

    /// **Rename**, the source: staged files follow their inodes; their journal entries (all
    /// those under a renamed folder too) are rewritten to the paths under `dst`. A file renamed
    /// rewrites its own entry alone: rsync renames every file it writes, and a walk of all
    /// staged files per rename would grow with the files waiting.
    pub(in crate::fs) fn renamed(&self, t: &Table, ino: Ino, dst: &NodePath) {
        let rewrite = |sino: Ino| {
            if let Some(i) = t.get(sino).filter(|i| dst.contains(&i.path)) {
                if let Some(s) = &i.staged {
                    let _ = self.journal_at(s, i);
                }
            }
        };
        if t.get(ino).is_some_and(|i| i.kind == InodeKind::File) {
            rewrite(ino);
        } else {
            t.staged_inos().for_each(rewrite);
        }
    }

    /// **Upload started**, in a batch: what to do with `ino`, whose `io` the caller holds.
    /// The file is sealed for the store (which may keep that very file as its blob) unless the
    /// kernel may still write it.
    pub(in crate::fs) fn to_store(self: &Arc<Self>, ino: Ino, fsync: bool) -> ToStore {
        let t = self.nodes.lock();
        let Some(inode) = t.get(ino) else {
            return ToStore::Nothing { clean: true };
        };
        let staged = match inode.staged.clone() {
            Some(s) if !inode.unlinked && s.is_dirty() => s,
            // Stored already, removed, or never changed: nothing to send.
            _ => return ToStore::Nothing { clean: true },
        };
        // Still open for writing and nobody asked for it: its last release queues it again.
        if staged.has_writers() && !fsync {
            return ToStore::Nothing { clean: false };
        }
        // Written by the kernel, maybe to the same bytes (see `Staged::kernel_changed`):
        // compared with the stored version first.
        if staged.unsure() {
            if let Some(stored) = t.stored_version(ino) {
                return ToStore::Compare {
                    generation: staged.generation(),
                    size: staged.size(),
                    staged,
                    stored,
                };
            }
            staged.make_sure();
        }
        // A file the kernel may still write (passthrough opens share it, or a map that
        // outlived them) is never sealed: the store copies it. Decided with the table locked,
        // where such opens start.
        let mut held = inode.pt.is_some() || staged.kernel_holds();
        if !held && staged.kernel_wrote() && staged.mapped_elsewhere() {
            log::trace!("inode {ino}: held elsewhere, stored later");
            self.until_unmapped(ino, &staged);
            if !fsync {
                // Stored once the map is gone (by a link then, not a copy now).
                return ToStore::Nothing { clean: false };
            }
            // An fsync waits: a copy now, and what the map writes after it later.
            held = true;
        }
        let snap = if held {
            staged.snapshot()
        } else {
            staged.seal()
        };
        let snap: Snapshot = match snap {
            Ok(snap) => snap,
            Err(e) => return ToStore::Failed(e),
        };
        let put = PutFile {
            path: inode.path.clone(),
            file_id: inode.remote.as_ref().map(|r| r.id.clone()),
            source: snap.file,
            len: snap.size,
            sealed: !held,
            digests: snap.digests,
            attrs: FileAttrs {
                modified: Some(snap.mtime),
                mode: inode.perm.map(whole_mode),
            },
            cancel: staged.removal().clone(),
            base: staged.base(),
            expect_md5: None,
        };
        ToStore::Send {
            staged,
            generation: snap.generation,
            size: snap.size,
            put,
        }
    }

    /// A staged file the kernel wrote is still open through a map of it, its handles gone (see
    /// `Staged::mapped_elsewhere`; most often the kernel is only about to close the backing
    /// file of a handle just released): it is not retired until the map is gone, and what the
    /// map wrote is stored then.
    pub(in crate::fs) fn until_unmapped(self: &Arc<Self>, ino: Ino, staged: &Arc<Staged>) {
        staged.set_mapped(true);
        // Held weakly: a file removed meanwhile gives its space back at once.
        let (fs, weak) = (self.clone(), Arc::downgrade(staged));
        self.rt.spawn(async move {
            let mut wait = Duration::ZERO;
            let staged = loop {
                if wait.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(wait).await;
                }
                // Let go of with the table locked, where a batch decides to seal.
                let t = fs.nodes.lock();
                let Some(staged) = weak.upgrade() else { return };
                if !t.get(ino).is_some_and(|i| current(i, &staged)) {
                    return; // removed, or set aside: nothing of the inode's to store
                }
                if !staged.mapped_elsewhere() {
                    staged.set_mapped(false);
                    break staged;
                }
                drop(t);
                if wait >= Duration::from_millis(100) {
                    log::debug!("inode {ino}: mapped after its last close, stored once unmapped");
                }
                wait = (wait * 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
            };
            // Still to store: the store takes the bytes as the map left them. Stored already:
            // the map may have written since.
            if !staged.is_dirty() {
                let stored = fs.nodes.stored_version(ino);
                staged.kernel_recheck(stored.as_ref());
            }
            if staged.is_dirty() {
                crate::fs::upload::schedule(&fs, ino);
            } else {
                fs.settle(ino, &staged);
            }
        });
    }

    /// **Set aside**: the bytes of an upload that cannot succeed go to `lost+found`, loudly.
    pub(in crate::fs) fn set_aside(self: &Arc<Self>, ino: Ino, err: &Error) {
        let mut t = self.nodes.lock();
        let Some(inode) = t.get(ino) else { return };
        let Some(staged) = inode.staged.clone() else {
            return;
        };
        let path = inode.path.clone();
        match self.journal.quarantine(&staged, &path, &err.to_string()) {
            Ok(dest) => log::error!(
                "cannot upload {path} ({err}); its bytes are kept in {}",
                dest.display()
            ),
            Err(e) => {
                log::error!(
                    "cannot upload {path} ({err}) nor set it aside ({e}); it stays in the journal"
                );
                return;
            }
        }
        if let Err(e) = staged.set_aside() {
            log::warn!("inode {ino}: {e}");
        }
        t.set_staged(ino, None);
        t.maybe_drop(ino);
        drop(t);
        // What the store has from now on (an older version, or nothing at all): readers must
        // not go on seeing the size of bytes that are now only in lost+found.
        let fs = self.clone();
        tokio::spawn(async move {
            if fs.nodes.has(ino) {
                let _ = fs.refresh_attr(ino, &path).await;
            }
        });
    }
}

/// **Remove** started: a removal's hold on the file's upload, given up so that `rm` does not
/// wait for it (the upload stops at its next chunk): taken back, and the file queued to be
/// stored again, unless the removal goes through ([`Removal::done`]).
pub(in crate::fs) struct Removal<'a, B: Backend> {
    fs: &'a Arc<Fs<B>>,
    ino: Ino,
    staged: Option<Arc<Staged>>,
}

impl<'a, B: Backend> Removal<'a, B> {
    pub(in crate::fs) fn start(fs: &'a Arc<Fs<B>>, ino: Ino) -> Self {
        let staged = fs.nodes.staged(ino);
        if let Some(s) = &staged {
            s.removal().cancel();
        }
        Removal { fs, ino, staged }
    }

    pub(in crate::fs) fn done(mut self) {
        self.staged = None;
    }
}

impl<B: Backend> Drop for Removal<'_, B> {
    fn drop(&mut self) {
        if let Some(s) = self.staged.take() {
            s.removal().resume();
            crate::fs::upload::schedule(self.fs, self.ino);
        }
    }
}
