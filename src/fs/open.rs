//! Opens: which way the kernel reads and writes each open file. A file whose bytes are whole
//! on local disk (a blob, a complete read-cache file) is passed through to that file, and a
//! file created or cut through the mount is passed through to its staging file, so the kernel
//! reads and writes it without the daemon (`passthrough.rs`); every other open is served by the
//! daemon (`io.rs`). One inode's opens all go one way: the kernel refuses a mix.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{Errno, FopenFlags, OpenAccMode, OpenFlags};

use super::io::Opened;
use super::nodes::MovedOff;
use super::passthrough::{self, Register};
use super::staging::Staged;
use super::table::{Backing, Ino, InodeKind, Remote};
use super::virtual_dirs::is_virtual;
use super::{Fs, Handle, OpResult};
use crate::backend::Backend;
use crate::sync::relock;

/// The mount's open handles: what each is, the number of the next, and those the kernel opened
/// to run a program. The maps are locked alone (see the lock order in `fs`).
pub(super) struct Handles {
    /// Open files and directories, by handle.
    open: std::sync::Mutex<std::collections::HashMap<u64, Handle>>,
    next_fh: std::sync::atomic::AtomicU64,
    /// Handles the kernel opened to run the file (exec), by handle: see [`FMODE_EXEC`].
    running: std::sync::Mutex<std::collections::HashMap<u64, Ino>>,
}

impl Handles {
    pub(super) fn new() -> Handles {
        Handles {
            open: Default::default(),
            next_fh: std::sync::atomic::AtomicU64::new(1),
            running: Default::default(),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Handle>> {
        relock(&self.open)
    }

    /// The number of a new handle (never one given before).
    pub(super) fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::SeqCst)
    }

    /// A new handle, `h`.
    pub(super) fn insert(&self, h: Handle) -> u64 {
        let fh = self.next_fh();
        self.lock().insert(fh, h);
        fh
    }

    /// Whether a program runs from `ino`: a handle the kernel opened for exec(2) is open.
    fn runs(&self, ino: Ino) -> bool {
        relock(&self.running).values().any(|&i| i == ino)
    }

    /// Notes an open for exec(2) that succeeded (see [`FMODE_EXEC`]); `r` passes through.
    pub(super) fn note_running(
        &self,
        ino: Ino,
        flags: OpenFlags,
        r: OpResult<Opened>,
    ) -> OpResult<Opened> {
        if let Ok(o) = &r {
            if flags.0 & FMODE_EXEC != 0 {
                relock(&self.running).insert(o.fh, ino);
            }
        }
        r
    }

    /// RELEASE of handle `fh`: a program run from it has ended.
    pub(super) fn release_running(&self, fh: u64) {
        relock(&self.running).remove(&fh);
    }
}

impl<B: Backend> Fs<B> {
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
    /// inode (see `passthrough`: the kernel then opens the name's new inode), or of an inode
    /// the store no longer has (`Inode::gone_elsewhere`: the kernel looks the name up again).
    pub(super) async fn open_with(
        self: &Arc<Self>,
        ino: Ino,
        flags: OpenFlags,
        register: &Register<'_>,
    ) -> OpResult<Opened> {
        // O_TRUNC cuts the file even with O_RDONLY (the kernel checked the right to).
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || truncates(flags);
        if is_virtual(ino) {
            let flags = self.virtual_open(ino, write)?;
            let fh = self.handles.insert(Handle::File {
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
        let (kind, remote, staged) = self.nodes.opened(ino).ok_or(Errno::ENOENT)??;
        if kind == InodeKind::Dir {
            return Err(Errno::EISDIR.into());
        }
        if truncates(flags)
            && matches!(flags.acc_mode(), OpenAccMode::O_RDONLY)
            && self.handles.runs(ino)
        {
            return Err(Errno::ETXTBSY.into());
        }
        if write {
            self.writable()?;
            return self.open_writer(ino, flags, register).await;
        }
        let mut source = match remote.filter(|r| self.reads_through(r, staged, flags)) {
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
        log::debug!("inode {ino}: a reader's open met passthrough opens twice: ESTALE");
        Err(Errno::ESTALE.into())
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
        super::prefetch::opened(self, ino);
        let (kind, remote, staged) = match self.nodes.opened(ino)? {
            Ok(found) => found,
            Err(e) => return Some(Err(e.into())),
        };
        if kind == InodeKind::Dir {
            return Some(Err(Errno::EISDIR.into()));
        }
        let mut source = None;
        if let Some(r) = remote.filter(|r| self.reads_through(r, staged, flags)) {
            source = self.local_source_now(&r);
            // The store may have it: asked on the slow path.
            if source.is_none() && passthrough::key(&r).is_some() && r.size > 0 {
                return None;
            }
        }
        self.attach_reader(ino, flags, &mut source, register)
            .transpose()
    }

    /// Whether a reader's open of the stored version `r` is passed through to its bytes on
    /// local disk (when they are there): not while the file is staged.
    fn reads_through(&self, r: &Remote, staged: bool, flags: OpenFlags) -> bool {
        !staged
            && self.reads.passthrough.on()
            && passable(flags)
            && r.size >= PASSTHROUGH_READS_FROM
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
            let plain = self.nodes.inode_mut(ino, |i| {
                let plain = i.pt.is_none() || shares_staged(i);
                if plain {
                    i.plain_pending += 1;
                }
                plain.then(|| keep_cache(i))
            });
            if let Some(keep) = plain.ok_or(Errno::ENOENT)? {
                break keep;
            }
            self.move_off(ino).await?;
        };
        let staged = self.stage(ino, truncate).await;
        let fh = self.handles.next_fh();
        let backing = self.nodes.inode_mut(ino, |i| {
            i.plain_pending -= 1;
            let s = staged.as_ref().ok()?;
            let b = self.kernel_writer(i, s, fh, flags, truncate, register);
            if b.is_ok() {
                i.open_handles += 1;
            }
            Some(b)
        });
        let backing = backing.flatten();
        let staged = staged?;
        let backing = match backing {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                self.release_staged(ino, &staged);
                return Err(e);
            }
            None => {
                self.release_staged(ino, &staged);
                return Err(Errno::ENOENT.into());
            }
        };
        let keep = keep && backing.is_none();
        let mut opened = self.writer_handle(ino, fh, staged, backing);
        if keep {
            opened.flags |= FopenFlags::FOPEN_KEEP_CACHE;
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
        if self.kernel_writes() && self.reads.passthrough.on() {
            "passthrough for new, truncated and empty files (the kernel writes their staging files)"
                .into()
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
            // FLUSH does nothing here (the last release stores the file; POSIX locks are the
            // kernel's own): each close(2) spares a round trip.
            flags: FopenFlags::FOPEN_NOFLUSH,
            backing,
        }
    }

    /// Whether the kernel writes the staged file itself for writer `fh` (passthrough), decided
    /// with the table locked: it must when passthrough opens share the file already (no plain
    /// open may join them), and may for a file nobody else has open that is written `afresh`
    /// (created or truncated: a change whatever is written, since what the kernel writes is
    /// never seen here) or is empty (fio creates its file, then opens it again to write it: a
    /// change of an empty file moves its size or times, see `Staged::kernel_writer_joins`).
    /// `Some`: the backing file to open with.
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
                return Err(super::error::Error::bug(format!(
                    "{}: passthrough opens of another file hold it",
                    i.path
                )));
            }
            Self::kernel_writer_joins(staged, true);
            return Ok(Some(pt.join(fh)));
        }
        let alone = i.open_handles == 0 && i.plain_pending == 0;
        let empty = staged.size() == 0;
        let wanted = self.kernel_writes() && (afresh || empty) && alone && passable(flags);
        if !(wanted && self.reads.passthrough.on()) {
            return Ok(None);
        }
        let file = staged.own_file()?;
        let source = passthrough::Source::Staged(file);
        let Some(id) = self.reads.passthrough.register(&source, register) else {
            return Ok(None);
        };
        Self::kernel_writer_joins(staged, afresh);
        // What the kernel caches of the inode is older than what it now writes past it.
        i.kernel_md5 = None;
        let shared = Backing::new(staged.backing_key(), id, fh, source.keep());
        let id = shared.id();
        i.pt = Some(Box::new(shared));
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
        let fh = self.handles.next_fh();
        let backing = self.nodes.inode_mut(ino, |i| {
            if i.staged.is_none() {
                // What a reader here saw: an editor's whole rewrite replaces this version.
                i.read_md5 = i.remote.as_ref().and_then(|r| r.md5.clone());
            }
            let current = i.remote.as_ref().and_then(passthrough::key);
            if let Some(pt) = &mut i.pt {
                // Opens of a staged file the kernel writes are all passed through: none can
                // be plain, and its name cannot move.
                let joins = match &i.staged {
                    Some(s) => pt.key() == s.backing_key(),
                    None => current.as_deref() == Some(pt.key()) && passable(flags),
                };
                if !joins {
                    return None;
                }
                i.open_handles += 1;
                Some(Some(pt.join(fh)))
            } else {
                let plain_busy = i.plain_pending > 0 || i.open_handles > 0 || i.staged.is_some();
                let registered = match source.take() {
                    Some((key, src)) if !plain_busy && current.as_ref() == Some(&key) => self
                        .reads
                        .passthrough
                        .register(&src, register)
                        .map(|id| Backing::new(key, id, fh, src.keep())),
                    _ => None,
                };
                i.open_handles += 1;
                Some(registered.map(|shared| {
                    let id = shared.id();
                    i.pt = Some(Box::new(shared));
                    id
                }))
            }
        });
        // Passthrough opens of another version hold it.
        let Some(backing) = backing.ok_or(Errno::ENOENT)? else {
            return Ok(None);
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
        let keep = self.nodes.inode_mut(ino, keep_cache).unwrap_or(false);
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
        let io = self.nodes.io(ino);
        // Not while an upload or a namespace change of the node runs.
        let _io = match io {
            Some(io) => io.lock_owned().await,
            None => return Err(Errno::ENOENT.into()),
        };
        let moved = match self.nodes.move_off_passthrough(ino) {
            MovedOff::Free => return Ok(()),
            MovedOff::Moved(new, parent, path) => Some(((new, parent), path)),
            MovedOff::Stays => None,
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
        Err(Errno::ESTALE.into())
    }

    /// Whether passthrough opens of a stored version hold `ino` (a truncate by name must move
    /// it first; one of a staged file the kernel writes cuts that file).
    pub(super) fn held_by_passthrough(&self, ino: Ino) -> bool {
        self.nodes
            .inode(ino, |i| i.pt.is_some() && !shares_staged(i))
            .unwrap_or(false)
    }

    /// SETATTR of a size on an inode held by passthrough opens: the name moves (ESTALE, and
    /// truncate(2) looks it up again).
    pub(super) async fn truncate_elsewhere(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        self.move_off(ino).await
    }

    /// The current version's bytes whole on local disk, if they are (see `passthrough`).
    pub(super) async fn local_source(
        self: &Arc<Self>,
        r: &super::table::Remote,
    ) -> Option<(String, passthrough::Source)> {
        if let Some(s) = self.local_source_now(r) {
            return Some(s);
        }
        let key = passthrough::key(r).filter(|_| r.size > 0)?;
        match self.backend.local()?.local_file(&r.id).await {
            Ok(Some((node, path, file))) if r.is_version(&node) => {
                self.reads.passthrough.remember(&key, path);
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
            .reads
            .cache
            .complete(&r.id, r.md5.as_deref())
            .filter(|e| e.size == r.size)
        {
            // (Opened again if the descriptor pool closed it; a file gone meanwhile is not
            // local after all.)
            let f = e.file().ok()?;
            return Some((key, passthrough::Source::CachedFile(e, f)));
        }
        let f = self.reads.passthrough.reopen(&key, r.size)?;
        Some((key, passthrough::Source::File(f)))
    }
}

/// Stored files smaller than this are read the plain way: the kernel keeps their pages across
/// opens (FOPEN_KEEP_CACHE), so a warm one costs an OPEN alone, where a passthrough open also
/// opens and registers the blob (`grep -r` over 5,000 small files: 2.3x the null file system
/// the plain way, 1.7-2.0x through passthrough); a cold one is a single READ.
const PASSTHROUGH_READS_FROM: u64 = 128 << 10;

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

/// The flag of the kernel's own open for exec(2) (`__FMODE_EXEC`, in FUSE's open flags).
///
/// The kernel refuses a write open of a running program (ETXTBSY) before it asks the daemon,
/// but checks an `O_RDONLY|O_TRUNC` open only after OPEN, where the daemon has cut the file
/// already (FUSE_ATOMIC_O_TRUNC): the program died of SIGBUS on its next page, and when it died
/// before the kernel's check, the open succeeded (pjdfstest open::etxtbsy under load). So the
/// daemon refuses such an open itself while a handle opened for exec is open (the kernel holds
/// it, and its denial of writes, as long as the program runs). Write opens are left to the
/// kernel: its RELEASE of the handle comes a little after the program's end, and a build that
/// writes the program again at once must not see ETXTBSY.
const FMODE_EXEC: i32 = 0x20;

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
