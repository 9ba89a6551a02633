//! Open descriptors, bounded (issue 46). The mount keeps files of its own on local disk for
//! every file written (staging files) or read (read-cache files), tens of thousands of them in
//! a day's work; one open descriptor each ran the daemon into its open-files limit (`tar c` of
//! 50,000 files failed from file 19,968 on, and at the limit neither `vaultfs status` nor an
//! unmount could open a socket).
//!
//! So such a file is a [`LazyFile`]: a name, opened when used and closed again when the
//! process holds too many. One process-wide pool ([`Pool`]) keeps the descriptors of the most
//! recently used files open, at most [`Pool::cap`] (a quarter of the process's limit, at most
//! 1,024), and closes the least recently used beyond that; the next use opens the file again
//! by its name (a few microseconds). Process-wide because the limit is the process's: two
//! mounts in one process (the tests) share it as they share the limit.
//!
//! A descriptor handed out (`LazyFile::get`) stays open while the caller holds it, whatever
//! the pool closes meanwhile, so what is open beyond the bound is the work in flight (reads,
//! uploads, a batch being stored), never the history.
//!
//! Lock order: the pool's lock, then a file's slot (eviction closes a slot under the pool's
//! lock); `get` takes them one after the other, never both.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use lru::LruCache;

use crate::sync::relock;

/// The most descriptors the pool keeps open, whatever the limit.
const MAX_CAP: usize = 1024;

/// The open descriptors of lazily opened files, least recently used closed first.
pub struct Pool {
    cap: usize,
    open: Mutex<LruCache<u64, Weak<Slot>>>,
    next: AtomicU64,
    /// Files opened (again) so far: for `vaultfs status` and the tests.
    opened: AtomicU64,
}

/// Where a lazily opened file's descriptor lives while it is open.
#[derive(Default)]
struct Slot {
    file: Mutex<Option<Arc<File>>>,
}

impl Pool {
    /// A pool keeping at most `cap` descriptors open (at least one).
    pub fn new(cap: usize) -> Arc<Pool> {
        Arc::new(Pool {
            cap: cap.max(1),
            open: Mutex::new(LruCache::unbounded()),
            next: AtomicU64::new(0),
            opened: AtomicU64::new(0),
        })
    }

    /// The process's pool, bounded by its open-files limit as it is at first use (the mount
    /// raises the soft limit to the hard one before: [`raise_limit`]).
    pub fn global() -> &'static Arc<Pool> {
        static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
        POOL.get_or_init(|| Pool::new(cap_for(open_files_limit())))
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Descriptors open in the pool now, and files opened so far.
    pub fn usage(&self) -> (usize, u64) {
        (
            relock(&self.open).len(),
            self.opened.load(Ordering::Relaxed),
        )
    }

    /// `slot` was just opened: it becomes the most recently used, and the least recently used
    /// beyond the bound are closed.
    fn admit(&self, key: u64, slot: &Arc<Slot>) {
        let mut open = relock(&self.open);
        open.put(key, Arc::downgrade(slot));
        while open.len() > self.cap {
            close_lru(&mut open);
        }
    }

    fn touch(&self, key: u64) {
        relock(&self.open).promote(&key);
    }

    fn forget(&self, key: u64) {
        relock(&self.open).pop(&key);
    }

    /// Closes half the descriptors held (the process ran out: something else needs them).
    fn shrink(&self) {
        let mut open = relock(&self.open);
        for _ in 0..open.len().div_ceil(2) {
            close_lru(&mut open);
        }
    }
}

/// Closes the least recently used descriptor of the pool (a user holding it keeps it open
/// until done).
fn close_lru(open: &mut LruCache<u64, Weak<Slot>>) {
    if let Some((_, weak)) = open.pop_lru() {
        if let Some(s) = weak.upgrade() {
            relock(&s.file).take();
        }
    }
}

/// A quarter of the limit, at most [`MAX_CAP`]: the rest is for sockets, the store's own
/// files, the kernel's requests in flight and batches being stored.
pub fn cap_for(limit: u64) -> usize {
    (limit / 4).clamp(16, MAX_CAP as u64) as usize
}

/// The process's soft limit of open files.
pub fn open_files_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    rl.rlim_cur
}

/// Raises the soft limit of open files to the hard one, as systemd does for its services (the
/// soft limit of 1,024 is for programs that still use `select`, which the daemon does not).
/// Returns the limit now in force.
pub fn raise_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                log::debug!("could not raise the open-files limit to {}", rl.rlim_max);
            }
        }
    }
    open_files_limit()
}

/// A file of the mount's own on local disk, open only while used (see the module's comment).
pub struct LazyFile {
    key: u64,
    path: PathBuf,
    write: bool,
    slot: Arc<Slot>,
    pool: Arc<Pool>,
}

impl LazyFile {
    /// The file at `path`, opened for reading (and writing, with `write`) when first used.
    pub fn new(path: PathBuf, write: bool) -> LazyFile {
        LazyFile::in_pool(Pool::global(), path, write)
    }

    pub fn in_pool(pool: &Arc<Pool>, path: PathBuf, write: bool) -> LazyFile {
        LazyFile {
            key: pool.next.fetch_add(1, Ordering::Relaxed),
            path,
            write,
            slot: Arc::default(),
            pool: pool.clone(),
        }
    }

    /// The same, with `file` (open on `path` already) as its descriptor for now.
    pub fn opened(path: PathBuf, write: bool, file: File) -> LazyFile {
        let lazy = LazyFile::new(path, write);
        lazy.set(file);
        lazy
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file: the descriptor held, or the file opened again by its name.
    pub fn get(&self) -> io::Result<Arc<File>> {
        // The slot's lock let go before the pool's is taken (the lock order): an `if let` on
        // the guard would hold it through the touch.
        let held = relock(&self.slot.file).clone();
        if let Some(f) = held {
            self.pool.touch(self.key);
            return Ok(f);
        }
        let file = match self.open() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                self.pool.shrink();
                self.open()?
            }
            r => r?,
        };
        let file = {
            let mut slot = relock(&self.slot.file);
            // Opened by another caller meanwhile: one descriptor is enough.
            slot.get_or_insert_with(|| Arc::new(file)).clone()
        };
        self.pool.admit(self.key, &self.slot);
        Ok(file)
    }

    fn open(&self) -> io::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(self.write)
            .open(&self.path)?;
        self.pool.opened.fetch_add(1, Ordering::Relaxed);
        Ok(f)
    }

    /// `file` is what the name holds from now on (a copy renamed over it, or the file just
    /// made there).
    pub fn set(&self, file: File) {
        *relock(&self.slot.file) = Some(Arc::new(file));
        self.pool.admit(self.key, &self.slot);
    }

    /// Whether a descriptor is held now (for the tests).
    #[cfg(test)]
    pub fn is_open(&self) -> bool {
        relock(&self.slot.file).is_some()
    }
}

impl Drop for LazyFile {
    fn drop(&mut self) {
        self.pool.forget(self.key);
    }
}

impl std::fmt::Debug for LazyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyFile")
            .field("path", &self.path)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// A file used while the pool closes it for another (the lock order: the pool's, then a
    /// slot's): no deadlock. `get` of an open file held its slot's lock while it touched the
    /// pool, and an `admit` holding the pool's lock waited for that slot (a mount hung in the
    /// descriptors test, a read against the save of the cache's index).
    #[test]
    fn files_used_while_the_pool_closes_them_never_deadlock() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = Pool::new(1);
        let files: Arc<Vec<LazyFile>> = Arc::new(
            (0..2)
                .map(|i| {
                    let p = tmp.path().join(format!("f{i}"));
                    std::fs::File::create(&p).unwrap();
                    LazyFile::in_pool(&pool, p, true)
                })
                .collect(),
        );
        let (done, finished) = std::sync::mpsc::channel();
        for i in 0..2 {
            let (files, done) = (files.clone(), done.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    files[i].get().unwrap();
                }
                done.send(()).unwrap();
            });
        }
        for _ in 0..2 {
            finished
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("a deadlock between get and the pool's eviction");
        }
    }

    /// However many files are used, the pool keeps at most its bound open, and a file closed
    /// by it reads the same when used again.
    #[test]
    fn at_most_the_bound_stays_open_and_closed_files_open_again() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = Pool::new(8);
        let files: Vec<LazyFile> = (0..100)
            .map(|i| {
                let p = tmp.path().join(format!("f{i}"));
                std::fs::File::create(&p)
                    .unwrap()
                    .write_all(format!("file {i}").as_bytes())
                    .unwrap();
                LazyFile::in_pool(&pool, p, true)
            })
            .collect();
        for f in &files {
            let mut buf = [0u8; 4];
            f.get().unwrap().read_exact_at(&mut buf, 0).unwrap();
            assert_eq!(&buf, b"file");
        }
        assert_eq!(pool.usage().0, 8);
        assert_eq!(files.iter().filter(|f| f.is_open()).count(), 8);
        // The most recently used are the open ones.
        assert!(files[92..].iter().all(LazyFile::is_open));
        let mut buf = vec![0u8; 6];
        files[3].get().unwrap().read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, b"file 3");
        assert!(files[3].is_open() && !files[92].is_open());
        drop(files);
        assert_eq!(pool.usage().0, 0);
    }

    /// A descriptor handed out stays usable while held, even once the pool closed its slot;
    /// the pool's bound is what stays open when nothing is in flight.
    #[test]
    fn a_descriptor_in_use_outlives_its_eviction() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = Pool::new(1);
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::write(&a, b"aaaa").unwrap();
        std::fs::write(&b, b"bbbb").unwrap();
        let (la, lb) = (
            LazyFile::in_pool(&pool, a, false),
            LazyFile::in_pool(&pool, b, false),
        );
        let held = la.get().unwrap();
        lb.get().unwrap();
        assert!(!la.is_open());
        let mut buf = [0u8; 4];
        held.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"aaaa");
        drop(held);
        assert_eq!(pool.usage().0, 1);
        assert!(lb.is_open());
    }

    #[test]
    fn the_bound_is_a_quarter_of_the_limit_within_reason() {
        assert_eq!(cap_for(1024), 256);
        assert_eq!(cap_for(1 << 20), MAX_CAP);
        assert_eq!(cap_for(20), 16);
    }
}
