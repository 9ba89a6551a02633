//! Write staging: a file opened for writing works on a staging file on local disk, whose entry
//! in the upload journal (`journal.rs`) says where its bytes belong.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A staged file: the bytes a writer sees, and how far they are from being uploaded.
///
/// Sealing: a backend that keeps the staging file itself (a hard link into the built-in store)
/// gets it sealed first; the next change copies it to a fresh staging file under the same name
/// (copy-on-write), so the sealed file is never written again.
pub struct Staged {
    pub id: u64,
    /// The staging file as it is now (replaced by its copy when written to after sealing).
    data: std::sync::RwLock<Arc<File>>,
    /// `data` is shared with the backend: copy before changing it.
    sealed: AtomicBool,
    data_path: PathBuf,
    size: AtomicU64,
    /// Bumped by every change; an upload records the generation it sent.
    generation: AtomicU64,
    uploaded: AtomicU64,
    /// Open writable handles. Changed only with the inode table locked (see `fs::writeback`),
    /// so a staged file is never retired while a writer is about to use it.
    pub writers: AtomicU32,
    mtime: Mutex<SystemTime>,
    /// Orders writes, truncates, seals and copies with the size they change.
    order: Mutex<()>,
    /// Orders journal writes of this file; remembers what was last written (to skip rewriting
    /// the same entry) and whether the entry is finished (never written back after that).
    pub(super) journal: Mutex<JournalState>,
}

/// What the journal last wrote for a staged file, and whether its entry is finished (never
/// written back after that).
#[derive(Default)]
pub(super) struct JournalState {
    pub finished: bool,
    pub last: Option<(String, Option<String>)>,
}

/// What an upload sends: the file, its length and the generation it holds.
pub struct Snapshot {
    pub file: Arc<File>,
    pub size: u64,
    pub generation: u64,
}

impl Staged {
    pub(super) fn new(id: u64, file: File, data_path: PathBuf, size: u64, dirty: bool) -> Staged {
        Staged {
            id,
            data: std::sync::RwLock::new(Arc::new(file)),
            sealed: AtomicBool::new(false),
            data_path,
            size: AtomicU64::new(size),
            generation: AtomicU64::new(u64::from(dirty)),
            uploaded: AtomicU64::new(0),
            writers: AtomicU32::new(0),
            mtime: Mutex::new(SystemTime::now()),
            order: Mutex::new(()),
            journal: Mutex::new(JournalState::default()),
        }
    }

    /// The staging file as it is now.
    pub fn file(&self) -> Arc<File> {
        self.data.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    pub fn mtime(&self) -> SystemTime {
        *self.mtime.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_mtime(&self, t: SystemTime) {
        *self.mtime.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.set_mtime(SystemTime::now());
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Changes not yet stored remotely.
    pub fn is_dirty(&self) -> bool {
        self.generation() != self.uploaded.load(Ordering::SeqCst)
    }

    pub fn mark_uploaded(&self, generation: u64) {
        self.uploaded.store(generation, Ordering::SeqCst);
    }

    fn order(&self) -> std::sync::MutexGuard<'_, ()> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The content as it is now, never to be written again: later changes go to a copy.
    pub fn seal(&self) -> Snapshot {
        let _order = self.order();
        self.sealed.store(true, Ordering::SeqCst);
        Snapshot {
            file: self.file(),
            size: self.size(),
            generation: self.generation(),
        }
    }

    /// The content as it is now, for an upload that reads it while writers may go on.
    pub fn snapshot(&self) -> Snapshot {
        let _order = self.order();
        Snapshot {
            file: self.file(),
            size: self.size(),
            generation: self.generation(),
        }
    }

    /// Before a change (with `order` held): a sealed file is copied to a fresh one under the
    /// same name, which takes its place.
    fn unshare(&self) -> io::Result<()> {
        if !self.sealed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let tmp = self.data_path.with_extension("cow");
        let _ = fs::remove_file(&tmp);
        let copy = crate::api::files::copy_to_new(&self.file(), self.size(), &tmp)?;
        fs::rename(&tmp, &self.data_path)?;
        *self.data.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(copy);
        self.sealed.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// A change with no bytes written (a new file must be created remotely even if empty).
    pub fn mark_changed(&self) {
        let _order = self.order();
        self.changed();
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let _order = self.order();
        self.unshare()?;
        self.file().write_all_at(data, offset)?;
        self.size
            .fetch_max(offset + data.len() as u64, Ordering::SeqCst);
        self.changed();
        Ok(())
    }

    /// md5 of the whole staged content (read back from the page cache, off the write path:
    /// hashing while writing made md5 the bottleneck of every write).
    pub fn md5(&self) -> io::Result<String> {
        let snap = self.snapshot();
        crate::api::checksum::md5_of_file(&snap.file, snap.size)
    }

    pub fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let size = self.size();
        if offset >= size {
            return Ok(Vec::new());
        }
        let file = self.file();
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
        let _order = self.order();
        self.unshare()?;
        self.file().set_len(size)?;
        self.size.store(size, Ordering::SeqCst);
        self.changed();
        Ok(())
    }

    /// Reserves space (fallocate mode 0 or KEEP_SIZE), so a later write cannot hit ENOSPC.
    pub fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let _order = self.order();
        self.unshare()?;
        let mode = if keep_size {
            libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        let file = self.file();
        // SAFETY: fallocate on our own open descriptor.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        if !keep_size && offset + len > self.size() {
            self.size.fetch_max(offset + len, Ordering::SeqCst);
            self.changed();
        }
        Ok(())
    }

    pub fn data_path(&self) -> &Path {
        &self.data_path
    }
}
