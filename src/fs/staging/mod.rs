//! Write staging: a file opened for writing works on a staging file on local disk, whose entry
//! in the upload journal (`journal.rs`) says where its bytes belong.
//!
//! Here: the staged file and what the daemon's own writes, cuts and reservations do to it.
//! `state`: where a staged file is in its life, and which step may be taken from where.
//! `lifecycle`: every step that moves it on, as the mount takes it (opened, closed, settled,
//! stored, retired, removed, renamed, set aside); it alone of `staging` sits above the inode
//! table, which holds staged files. `retry`: how a failed store
//! is tried again. `ahead`: hashing sequential writes while they arrive. `kernel`: files the
//! kernel writes itself (passthrough).
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::SystemTime;

use crate::api::Base;
use crate::api::checksum::Digests;
use crate::api::files::Cancel;
use crate::fs::descriptors::LazyFile;
use crate::sync::relock;

mod ahead;
mod kernel;
pub(super) mod lifecycle;
mod retry;
pub(super) mod state;

use ahead::{Ahead, HashAhead};
pub use kernel::kernel_writes_safe;
pub use retry::{Next, Retry};

/// A staged file: the bytes a writer sees, and how far they are from being uploaded.
///
/// Sealing: a backend that keeps the staging file itself (a hard link into the built-in store)
/// gets it sealed first; the next change copies it to a fresh staging file under the same name
/// (copy-on-write), so the sealed file is never written again.
pub struct Staged {
    pub id: u64,
    /// The staging file as it is now (replaced by its copy when written to after sealing), open
    /// while used (`descriptors`): thousands of files waiting for upload hold no descriptor.
    data: LazyFile,
    /// Handed over to the read cache once stored (`hand_over`): the journal leaves the file
    /// when the entry ends, and the cache removes it.
    handed_over: AtomicBool,
    /// `data` is shared with the backend: copy before changing it.
    sealed: AtomicBool,
    /// How many times `data` was replaced by a copy (names the file for `backing_key`).
    copies: AtomicU64,
    size: AtomicU64,
    /// The largest file the backend takes: a write, cut or reservation past it is EFBIG at
    /// once, not an upload refused later (or a sparse terabyte hashed first).
    max_size: u64,
    /// Whether hashing ahead computes sha256 too (the built-in store names blobs by it; a
    /// server needs md5 alone).
    sha256: bool,
    /// Bumped by every change; an upload records the generation it sent.
    generation: AtomicU64,
    uploaded: AtomicU64,
    /// Where the file is in its life, and its writers (`state`).
    state: Mutex<state::State>,
    /// Of those, the handles the kernel writes through itself (passthrough): their writes never
    /// reach the daemon, so size and time are read from the file (`observe`) and each of their
    /// releases counts as a change.
    kernel_writers: AtomicU32,
    /// The kernel has written the file: what was hashed ahead says nothing about its bytes.
    kernel_wrote: AtomicBool,
    /// Size, mtime and ctime (ns) of the file at the last generation the kernel's writes
    /// made (`kernel_changed`).
    synced: Mutex<(u64, i64, i64)>,
    /// That generation may hold the bytes stored already (see `kernel_changed`).
    unsure: AtomicBool,
    /// A map the kernel writes through outlives the file's handles (`mapped_elsewhere`).
    mapped: AtomicBool,
    mtime: Mutex<SystemTime>,
    /// Orders writes, truncates, seals and copies with the size they change.
    order: Mutex<()>,
    /// Orders journal writes of this file; remembers what was last written (to skip rewriting
    /// the same entry) and whether the entry is finished (never written back after that).
    pub(super) journal: Mutex<JournalState>,
    /// md5 and sha256 of the bytes written so far, hashed in the background while sequential
    /// writes arrive (`hash_ahead`), so an upload reads only what is not hashed yet.
    ahead: Arc<Ahead>,
    /// Given up once the file is removed: its upload under way stops (see `Fs::remove`).
    removal: Cancel,
    /// The version these bytes replace (the conflict check, docs/design.md §5): what the mount
    /// knew when staging began (`Absent` for a new name), then what it last stored. Journaled.
    base: Mutex<Base>,
}

/// What the journal last wrote for a staged file, and whether its entry is finished (never
/// written back after that).
#[derive(Default)]
pub(super) struct JournalState {
    pub finished: bool,
    pub last: Option<(String, Option<String>, Base)>,
}

/// What an upload sends: the file, its length and the generation it holds.
pub struct Snapshot {
    /// Open while the upload holds it, whatever the descriptor pool closes.
    pub file: Arc<File>,
    pub size: u64,
    pub generation: u64,
    /// md5 and sha256 of the first bytes of `file`, as hashed ahead.
    pub digests: Option<Digests>,
    /// The modification time that goes with this generation.
    pub mtime: SystemTime,
}

impl Staged {
    /// The staged file `id` whose bytes are at `data_path` (opened when first used), to
    /// replace `base` when uploaded.
    pub(super) fn new(id: u64, data_path: PathBuf, size: u64, dirty: bool, base: Base) -> Staged {
        Staged {
            id,
            data: LazyFile::new(data_path, true),
            handed_over: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
            copies: AtomicU64::new(0),
            size: AtomicU64::new(size),
            max_size: u64::MAX,
            sha256: true,
            generation: AtomicU64::new(u64::from(dirty)),
            uploaded: AtomicU64::new(0),
            state: Mutex::default(),
            kernel_writers: AtomicU32::new(0),
            kernel_wrote: AtomicBool::new(false),
            synced: Mutex::new((0, 0, 0)),
            unsure: AtomicBool::new(false),
            mapped: AtomicBool::new(false),
            mtime: Mutex::new(SystemTime::now()),
            order: Mutex::new(()),
            journal: Mutex::new(JournalState::default()),
            removal: Cancel::default(),
            base: Mutex::new(base),
            ahead: Arc::new(Ahead {
                state: Mutex::new(HashAhead {
                    // Content already there (a copy of the stored file) is hashed at upload.
                    valid: size == 0,
                    digests: Some(Digests::default()),
                    ..HashAhead::default()
                }),
                idle: Condvar::new(),
            }),
        }
    }

    /// The same with the backend's largest file size.
    pub(super) fn limited(mut self, max_size: u64) -> Staged {
        self.max_size = max_size;
        self
    }

    /// The same hashed ahead for md5 alone (for a backend that uploads file by file).
    pub(super) fn md5_only(mut self) -> Staged {
        self.sha256 = false;
        if let Some(d) = &mut self.ahead().digests {
            *d = Digests::md5_only();
        }
        self
    }

    /// Digests of nothing yet, of the kinds this file is hashed for.
    fn fresh_digests(&self) -> Digests {
        if self.sha256 {
            Digests::default()
        } else {
            Digests::md5_only()
        }
    }

    /// EFBIG when the file would end past `max_size`.
    fn fits(&self, end: u64) -> io::Result<()> {
        if end > self.max_size {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        Ok(())
    }

    /// The staging file as it is now (opened again if the descriptor pool closed it).
    pub fn file(&self) -> io::Result<Arc<File>> {
        self.data.get()
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    pub fn mtime(&self) -> SystemTime {
        *relock(&self.mtime)
    }

    fn set_mtime(&self, t: SystemTime) {
        *relock(&self.mtime) = t;
    }

    fn changed(&self) {
        self.unsure.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.set_mtime(SystemTime::now());
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Changes not yet stored remotely.
    /// What an upload of these bytes replaces ([`Staged::base`]: docs/design.md §5).
    pub fn base(&self) -> Base {
        relock(&self.base).clone()
    }

    /// The base from now on: given when staging begins; set by the steps of `lifecycle` when a
    /// rename puts the file over another, after each upload (the version stored), and to
    /// `Absent` for a file stored anew. The caller journals it again (`Journal::record`).
    fn set_base(&self, base: Base) {
        *relock(&self.base) = base;
    }

    pub fn is_dirty(&self) -> bool {
        self.generation() != self.uploaded.load(Ordering::SeqCst)
    }

    /// Whether this mount stored a generation of it (its time is then the stored version's).
    pub fn was_stored(&self) -> bool {
        self.uploaded.load(Ordering::SeqCst) > 0
    }

    fn mark_uploaded(&self, generation: u64) {
        self.uploaded.store(generation, Ordering::SeqCst);
    }

    fn order(&self) -> std::sync::MutexGuard<'_, ()> {
        relock(&self.order)
    }

    /// The content as it is now, never to be written again: later changes go to a copy.
    fn seal(&self) -> io::Result<Snapshot> {
        let _order = self.order();
        debug_assert_eq!(
            self.kernel_writers(),
            0,
            "a file the kernel writes is never sealed"
        );
        self.sealed.store(true, Ordering::SeqCst);
        self.current()
    }

    /// The content as it is now, for an upload that reads it while writers may go on.
    pub fn snapshot(&self) -> io::Result<Snapshot> {
        let _order = self.order();
        self.observe_locked();
        self.current()
    }

    /// What the file holds now (with `order` held).
    fn current(&self) -> io::Result<Snapshot> {
        Ok(Snapshot {
            file: self.file()?,
            size: self.size(),
            generation: self.generation(),
            digests: self.digests(),
            mtime: self.mtime(),
        })
    }

    /// Before a change (with `order` held): a sealed file is copied to a fresh one under the
    /// same name, which takes its place.
    fn unshare(&self) -> io::Result<()> {
        if !self.sealed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let tmp = self.data_path().with_extension("cow");
        let _ = fs::remove_file(&tmp);
        let copy = crate::api::files::copy_to_new(&*self.file()?, self.size(), &tmp)?;
        fs::rename(&tmp, self.data_path())?;
        self.data.set(copy);
        self.copies.fetch_add(1, Ordering::SeqCst);
        self.sealed.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// A change of attributes (a time set, a chmod). With content not yet stored it is a
    /// generation to store like a write (true), so an upload under way that took the earlier
    /// ones is followed by one that carries these. Otherwise (a stored file open for writing,
    /// `touch` does that) the bytes need no new version: the caller stores the attributes alone.
    pub fn set_attrs(&self, mtime: Option<SystemTime>) -> bool {
        let _order = self.order();
        let pending = self.is_dirty();
        if pending {
            // Stored even with the same bytes: the attributes are the change.
            self.unsure.store(false, Ordering::SeqCst);
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(t) = mtime {
            self.set_mtime(t);
            // Also the staging file's own, which a crash leaves for the journal's recovery
            // (`Staged::with_file_mtime`). Writes after this move both on.
            if let Err(e) = self.file().and_then(|f| f.set_modified(t)) {
                log::debug!("time of staging file {}: {e}", self.data_path().display());
            }
        }
        pending
    }

    /// After a crash: the modification time is the staging file's (its last write, or a time
    /// set through the mount before the crash), not the time of the recovery.
    pub(super) fn with_file_mtime(self, meta: &fs::Metadata) -> Staged {
        if let Ok(t) = meta.modified() {
            self.set_mtime(t);
        }
        self
    }

    /// A change with no bytes written (a new file must be created remotely even if empty).
    pub fn mark_changed(&self) {
        let _order = self.order();
        self.changed();
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.fits(offset.saturating_add(data.len() as u64))?;
        let _order = self.order();
        self.unshare()?;
        self.begin_change(offset);
        let written = self.file().and_then(|f| f.write_all_at(data, offset));
        self.end_change();
        written?;
        self.size
            .fetch_max(offset + data.len() as u64, Ordering::SeqCst);
        self.changed();
        Ok(())
    }

    /// md5 of the whole staged content: what was hashed ahead, and the rest read back from
    /// the page cache (hashing on the write path made md5 the bottleneck of every write).
    pub fn md5(&self) -> io::Result<String> {
        let snap = self.snapshot()?;
        let digests = snap.digests.unwrap_or_default();
        digests
            .unless(&self.removal)
            .md5_from(&snap.file, snap.size)
    }

    /// Given up once the file is removed (its upload stops): see `Fs::remove`.
    pub fn removal(&self) -> &Cancel {
        &self.removal
    }

    pub fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let size = self.size();
        if offset >= size {
            return Ok(Vec::new());
        }
        let file = self.file()?;
        let len = len.min((size - offset) as usize);
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let n = file.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break; // sparse tail: zeros
            }
            done += n;
        }
        Ok(buf)
    }

    pub fn truncate(&self, size: u64) -> io::Result<()> {
        self.fits(size)?;
        let _order = self.order();
        self.unshare()?;
        self.begin_change(size);
        let cut = self.file().and_then(|f| f.set_len(size));
        self.end_change();
        cut?;
        self.size.store(size, Ordering::SeqCst);
        if size == 0 && !self.kernel_wrote.load(Ordering::SeqCst) {
            // Emptied (O_TRUNC): hashing starts over (a running hasher's work is void).
            let mut a = self.ahead();
            a.valid = true;
            a.digests = Some(self.fresh_digests());
            a.reading_to = 0;
            a.epoch += 1;
        }
        self.changed();
        Ok(())
    }

    /// Reserves space (fallocate mode 0 or KEEP_SIZE), so a later write cannot hit ENOSPC.
    pub fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if !keep_size {
            self.fits(offset.saturating_add(len))?;
        }
        let _order = self.order();
        self.unshare()?;
        let file = self.file()?;
        let meta = file.metadata()?;
        // More than the disk could give even reusing every block the file has: refused before
        // the staging disk (shared with the rest of the system) is filled to the last block.
        if len > free_bytes(&file)?.saturating_add(meta.blocks() * 512) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let before = meta.len();
        if let Err(e) = reserve(&file, offset, len, keep_size) {
            // ext4 keeps what it allocated before running out of room, and moves the size up
            // to it: the file would keep the disk full, and be stored at a size nobody wrote.
            // Cutting back to the size it had frees all of it (past the end included).
            if let Err(t) = file.set_len(before) {
                log::warn!("staged file {}: {t}", self.data_path().display());
            }
            return Err(e);
        }
        if !keep_size && offset + len > self.size() {
            self.size.fetch_max(offset + len, Ordering::SeqCst);
            self.changed();
        }
        Ok(())
    }

    pub fn data_path(&self) -> &Path {
        self.data.path()
    }

    /// The stored file's bytes for the read cache to keep (`ReadCache::adopt`): from now on
    /// the staging file is the cache's to remove, not the journal's.
    pub fn hand_over(&self) -> LazyFile {
        self.handed_over.store(true, Ordering::SeqCst);
        LazyFile::new(self.data_path().to_path_buf(), false)
    }

    /// Whether the read cache took the staging file over.
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::SeqCst)
    }

    /// Which file the kernel writes and reads itself for this staged copy (`passthrough`): it
    /// changes only when a sealed file is copied, which never happens while the kernel holds
    /// it.
    pub fn backing_key(&self) -> String {
        format!("staged-{}-{}", self.id, self.copies.load(Ordering::SeqCst))
    }
}

/// fallocate(2) of `offset..offset + len`, the size kept or moved up to its end.
#[cfg(target_os = "linux")]
fn reserve(f: &File, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mode = if keep_size {
        libc::FALLOC_FL_KEEP_SIZE
    } else {
        0
    };
    // SAFETY: fallocate on a descriptor the caller holds.
    match unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Where there is no fallocate(2) (macOS): the size moves up, nothing is reserved ahead.
#[cfg(not(target_os = "linux"))]
fn reserve(f: &File, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
    let end = offset.saturating_add(len);
    if !keep_size && end > f.metadata()?.len() {
        f.set_len(end)?;
    }
    Ok(())
}

/// The bytes an unprivileged writer may still take on `f`'s file system.
pub(in crate::fs) fn free_bytes(f: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatvfs fills the zeroed struct we pass, for a descriptor the caller holds.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::fstatvfs(f.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::checksum::hash_file;

    fn staged(dir: &Path) -> Arc<Staged> {
        let path = dir.join("1.data");
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        Arc::new(Staged::new(1, path, 0, false, Base::Any))
    }

    /// Whatever the writes (appends with a hasher running beside them, overwrites, cuts), the
    /// digests a snapshot carries are those of its file's first bytes.
    #[test]
    fn digests_hashed_ahead_always_match_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let s = staged(dir.path());
        let chunk: Vec<u8> = (0..128 * 1024u32).map(|i| (i % 253) as u8).collect();
        let check = |s: &Staged| {
            let snap = s.snapshot().unwrap();
            let known = snap.digests.clone();
            let want = hash_file(&snap.file, snap.size).unwrap();
            if let Some(d) = known {
                assert!(d.len() <= snap.size);
                assert_eq!(d.finish_from(&snap.file, snap.size).unwrap(), want);
            }
            snap.digests.is_some_and(|d| !d.is_empty())
        };
        let mut hashed_ahead = false;
        for round in 0..3u64 {
            s.truncate(0).unwrap();
            let hasher = std::thread::scope(|sc| {
                let mut handles = Vec::new();
                for i in 0..200u64 {
                    s.write_at(i * chunk.len() as u64, &chunk).unwrap();
                    if let Some(job) = s.hash_ahead() {
                        handles.push(sc.spawn(job));
                    }
                    // Round 1 overwrites now and then, racing the hasher.
                    if round == 1 && i % 50 == 49 {
                        s.write_at(i * 1000, b"changed").unwrap();
                    }
                }
                handles.len()
            });
            hashed_ahead |= check(&s);
            if round == 1 {
                // Below what is hashed (the hashers have caught up): nothing is known after.
                s.write_at(1000, b"changed").unwrap();
                assert!(s.snapshot().unwrap().digests.is_none());
                check(&s);
            }
            assert!(hasher > 0);
        }
        assert!(hashed_ahead, "the hasher never got ahead");
        // Sealed, then written to: the copy takes the change, the sealed file keeps its digests.
        let sealed = s.seal().unwrap();
        s.write_at(0, b"after the seal").unwrap();
        let want = hash_file(&sealed.file, sealed.size).unwrap();
        let d = sealed.digests.expect("hashed ahead before the seal");
        assert_eq!(d.finish_from(&sealed.file, sealed.size).unwrap(), want);
        check(&s);
    }
}
