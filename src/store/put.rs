//! Whole files stored in batches: the built-in store's side of the mount's write-back.
//!
//! The three upload steps cost three transactions, a blob copy, a blob fsync, a directory fsync
//! and a WAL fsync per file. A mount in the same process has the bytes in a local file already,
//! so [`Store::put_files`] takes a batch of them and does the durable work once per batch:
//!
//! 1. without the store's lock: each file is hashed (md5 and sha256 in one pass, from the page
//!    cache) and linked into `tmp/` (a hard link of a file its owner has sealed: no byte copied;
//!    otherwise an in-kernel copy); their writeback is started for all of them first and waited
//!    for after (`sync_file_range`, then `fdatasync` each), so the file system commits its
//!    journal once for the batch, not once per file;
//! 2. under the lock, in one transaction: the file nodes (created when new), one committed
//!    version each, blobs renamed into place where their hash is new; the folders that got a
//!    blob fsynced (again one journal commit in all), then the commit with the WAL fsynced
//!    (`Durable`).
//!
//! Not `syncfs`: it would also wait for every other dirty file of the file system (a build
//! beside the store made it take seconds).
//!
//! A crash before the commit leaves the tree as it was (renamed blobs are unrecorded and swept
//! by the next recovery); after it, every file of the batch is stored. Each file has its own
//! savepoint, so one failing (its folder removed meanwhile, say) fails alone.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use rusqlite::params;
use sha2::Sha256;

use super::nodes::{self, Kind};
use super::{Scope, Store, now_ns};
use crate::api::checksum::{hex, read_chunks};
use crate::api::{Error, Node, NodePath, Result};

/// One whole file to store: the first `len` bytes of `source` become the current version of the
/// file (by ID when it has one, else at `path`, created when missing).
pub struct PutFile {
    pub path: NodePath,
    pub file_id: Option<String>,
    pub source: std::sync::Arc<File>,
    pub len: u64,
    /// The caller never writes to `source` again: the store may keep the very file (a hard
    /// link) instead of a copy.
    pub sealed: bool,
}

/// A file of the batch after phase 1: its hashes and its bytes in `tmp/`.
struct Prepared {
    tmp: PathBuf,
    /// The bytes as placed in `tmp/` (the source itself when linked).
    file: std::sync::Arc<File>,
    md5: String,
    sha256: String,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // Renamed into place on success; otherwise garbage.
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Files from this size on are hashed by two threads (md5 is the slower by far).
const PARALLEL_HASH_FROM: u64 = 4 << 20;

/// md5 and sha256 (hex) of the first `len` bytes of `f` (a sparse or short tail reads as
/// zeros, as a staging file's size says). A large file is read twice from the page cache, md5
/// on a thread of its own beside sha256, which takes its time from md5's instead of adding it.
fn hash_file(f: &File, len: u64) -> io::Result<(String, String)> {
    if len < PARALLEL_HASH_FROM {
        let (mut md5, mut sha) = (Md5::new(), Sha256::new());
        read_chunks(f, len, |b| {
            md5.update(b);
            sha.update(b);
        })?;
        return Ok((hex(&md5.finalize()), hex(&sha.finalize())));
    }
    std::thread::scope(|s| {
        let md5 = s.spawn(|| {
            let mut h = Md5::new();
            read_chunks(f, len, |b| h.update(b)).map(|()| hex(&h.finalize()))
        });
        let mut sha = Sha256::new();
        read_chunks(f, len, |b| sha.update(b))?;
        let md5 = md5
            .join()
            .map_err(|_| io::Error::other("the md5 thread panicked"))??;
        Ok((md5, hex(&sha.finalize())))
    })
}

/// Links the open file `f` at `dest` (through /proc: the descriptor, not a path someone may
/// have renamed over since).
fn link_fd(f: &File, dest: &Path) -> io::Result<()> {
    let src = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    let dst = std::ffi::CString::new(dest.as_os_str().as_encoded_bytes())?;
    // SAFETY: two NUL-terminated paths; linkat does not keep them.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How a batch is made durable on the file system of the blobs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum SyncMode {
    /// XFS, ext4 with a journal: one journal (log), committed in order. The bytes of every file are written
    /// out and waited for without a flush (`sync_file_range`), then one fsync of the folder
    /// renamed into last commits the journal up to that change, every earlier file's metadata
    /// with it, and flushes the disk's cache once (git's `core.fsyncMethod=batch` idea).
    OneCommit,
    /// Anything else: each file and each folder fsynced.
    EachFile,
}

/// Whether the ext4 file system holding `dir` has a journal: jbd2 lists it in
/// `/proc/fs/jbd2/<device>-8` (the device from the mount table, by the folder's st_dev).
fn ext4_has_journal(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(dev) = fs::metadata(dir).map(|m| m.dev()) else {
        return false;
    };
    let id = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let Ok(table) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    table.lines().any(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2) != Some(id.as_str()) {
            return false;
        }
        // After " - ": the file system type, then the source (the device).
        let Some((_, tail)) = line.split_once(" - ") else {
            return false;
        };
        let Some(source) = tail.split(' ').nth(1) else {
            return false;
        };
        let device = fs::canonicalize(source).unwrap_or_else(|_| PathBuf::from(source));
        device.file_name().is_some_and(|name| {
            Path::new("/proc/fs/jbd2")
                .join(format!("{}-8", name.to_string_lossy()))
                .exists()
        })
    })
}

impl SyncMode {
    pub(super) fn of(dir: &Path) -> SyncMode {
        const EXT4: i64 = 0xEF53;
        const XFS: i64 = 0x5846_5342;
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return SyncMode::EachFile;
        };
        // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
            return SyncMode::EachFile;
        }
        match st.f_type as i64 {
            XFS => SyncMode::OneCommit,
            // ext4 can run without a journal (mkfs -O ^has_journal): then an fsync writes only
            // its own inode, and each file needs its own.
            EXT4 if ext4_has_journal(dir) => SyncMode::OneCommit,
            _ => SyncMode::EachFile,
        }
    }

    /// Phase 1: the bytes of `files` on disk (OneCommit: written, not yet flushed).
    fn data<'a>(self, files: impl Iterator<Item = &'a File> + Clone) -> io::Result<()> {
        match self {
            SyncMode::OneCommit => {
                for (f, flags) in files
                    .clone()
                    .map(|f| (f, libc::SYNC_FILE_RANGE_WRITE))
                    .chain(files.map(|f| {
                        (
                            f,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        )
                    }))
                {
                    // SAFETY: on a descriptor the caller keeps open.
                    if unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, flags) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            }
            SyncMode::EachFile => files.into_iter().try_for_each(File::sync_data),
        }
    }

    /// Phase 2: the renames into `dirs` (the last one renamed into last) durable, and with
    /// them (OneCommit) the bytes of phase 1.
    fn renames(self, dirs: &[PathBuf]) -> io::Result<()> {
        let dirs = match self {
            SyncMode::OneCommit => dirs.last().into_iter().collect::<Vec<_>>(),
            SyncMode::EachFile => dirs.iter().collect(),
        };
        for d in dirs {
            File::open(d)?.sync_all()?;
        }
        Ok(())
    }
}

impl Store {
    /// Stores a batch of whole files (see the module's comment). One result per file, in order.
    pub fn put_files(&self, scope: Scope, files: &[PutFile]) -> Vec<Result<Node>> {
        // Background previews wait while files are being written.
        self.note_write_activity();
        let started = std::time::Instant::now();
        let prepared: Vec<Result<Prepared>> = files.iter().map(|f| self.prepare(f)).collect();
        let hashed = started.elapsed();
        let placed = prepared.iter().flatten().map(|p| &*p.file);
        if let Err(e) = self.sync_mode.data(placed) {
            let e = Error::from(e);
            return files.iter().map(|_| Err(e.clone())).collect();
        }
        let synced = started.elapsed();
        let conn = self.lock();
        let mut previews = Vec::new();
        let results = (|| -> Result<Vec<Result<Node>>> {
            let _durable = super::schema::Durable::new(&conn)?;
            let mut tx = conn.unchecked_transaction()?;
            let mut results = Vec::with_capacity(files.len());
            let mut dirs = Vec::new();
            for (f, p) in files.iter().zip(prepared) {
                let p = match p {
                    Ok(p) => p,
                    Err(e) => {
                        results.push(Err(e));
                        continue;
                    }
                };
                let sp = tx.savepoint()?;
                match self.put_one(&sp, scope, f, p, &mut dirs) {
                    Ok((node, render, name, sha)) => {
                        sp.commit()?;
                        if render {
                            previews.push((sha, name));
                        }
                        results.push(Ok(node));
                    }
                    Err(e) => {
                        drop(sp);
                        results.push(Err(e));
                    }
                }
            }
            // The renames, durable before the commit that refers to them.
            self.sync_mode.renames(&dirs)?;
            tx.commit()?;
            Ok(results)
        })();
        drop(conn);
        log::debug!(
            "stored {} file(s): placed and hashed in {hashed:?}, bytes durable at {synced:?}, committed at {:?}",
            files.len(),
            started.elapsed()
        );
        match results {
            Ok(results) => {
                for (sha, name) in previews {
                    self.previews.enqueue(&sha, &name);
                }
                results
            }
            Err(e) => files.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Phase 1 of one file: hashes, and the bytes in `tmp/`.
    fn prepare(&self, f: &PutFile) -> Result<Prepared> {
        self.check_file_size(f.len)?;
        // Placed first, hashed after: what is hashed is what is kept, even if an unsealed
        // source is written to meanwhile.
        let tmp = self.blobs.tmp_name("put");
        let same_size = f.source.metadata().is_ok_and(|m| m.len() == f.len);
        let linked = f.sealed && same_size && link_fd(&f.source, &tmp).is_ok();
        let mut prepared = Prepared {
            tmp,
            file: f.source.clone(),
            md5: String::new(),
            sha256: String::new(),
        };
        if !linked {
            let copy = crate::api::files::copy_to_new(&f.source, f.len, &prepared.tmp)?;
            prepared.file = std::sync::Arc::new(copy);
        }
        (prepared.md5, prepared.sha256) = hash_file(&prepared.file, f.len)?;
        Ok(prepared)
    }

    /// Phase 2 of one file, inside the batch's transaction: (node, preview wanted, name, sha256).
    fn put_one(
        &self,
        tx: &rusqlite::Connection,
        scope: Scope,
        f: &PutFile,
        mut p: Prepared,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<(Node, bool, String, String)> {
        let now = now_ns();
        let file = match &f.file_id {
            Some(id) => nodes::file_by_id(tx, scope, id)?,
            None => nodes::create_file_row(tx, scope, &f.path, now)?,
        };
        debug_assert_eq!(file.kind, Kind::File);
        let known = tx
            .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
            .exists([&p.sha256])?;
        if !known {
            let dest = self.blobs.path(&p.sha256);
            let dir = dest.parent().expect("a blob path has a folder");
            if !dir.is_dir() {
                fs::create_dir_all(dir)?;
                // The new folder's own entry, too.
                dirs.push(dir.parent().expect("blobs/ has a parent").to_path_buf());
            }
            fs::rename(&p.tmp, &dest)?;
            p.tmp = PathBuf::new();
            // Last renamed into, last in the list (OneCommit syncs that one).
            dirs.retain(|d| d != dir);
            dirs.push(dir.to_path_buf());
            tx.prepare_cached("INSERT INTO blobs (hash, size, md5) VALUES (?1, ?2, ?3)")?
                .execute(params![p.sha256, f.len as i64, p.md5])?;
        }
        tx.prepare_cached(
            "INSERT INTO versions (file_id, length, md5, blob, committed, created_on, committed_on) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)",
        )?
        .execute(params![file.id, f.len as i64, p.md5, p.sha256, now])?;
        let vid = tx.last_insert_rowid();
        tx.prepare_cached("UPDATE nodes SET current_version = ?2, modified_on = ?3 WHERE id = ?1")?
            .execute(params![file.id, vid, now])?;
        let render = super::previews::want(tx, &p.sha256, &file.name)?;
        let row = nodes::row(tx, file.id)?;
        let path = nodes::path_of(tx, file.id)?;
        Ok((row.to_api(&path), render, file.name, p.sha256.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_journaled_file_system_gets_one_commit_per_batch() {
        // /proc is neither ext4 nor XFS.
        assert_eq!(SyncMode::of(Path::new("/proc")), SyncMode::EachFile);
        assert!(!ext4_has_journal(Path::new("/proc")));
        assert_eq!(SyncMode::of(Path::new("/no/such/dir")), SyncMode::EachFile);
    }

    #[test]
    fn large_and_small_files_hash_the_same_as_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0u64, 1, 4096, PARALLEL_HASH_FROM + 12345] {
            let p = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            fs::write(&p, &data).unwrap();
            let (md5, sha) = hash_file(&File::open(&p).unwrap(), len).unwrap();
            assert_eq!(md5, hex(&Md5::digest(&data)));
            assert_eq!(sha, hex(&Sha256::digest(&data)));
        }
    }
}
