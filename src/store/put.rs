//! Whole files stored in batches: the built-in store's side of the mount's write-back.
//!
//! The three upload steps cost three transactions, a blob copy, a blob fsync, a directory fsync
//! and a WAL fsync per file. A mount in the same process has the bytes in a local file already,
//! so [`Store::put_files`] takes a batch of them and does the durable work once per batch:
//!
//! 1. without the store's lock: each file is hashed (md5 and sha256 in one pass, from the page
//!    cache); a file its owner has sealed is kept as it is (it becomes the blob by a hard link:
//!    no byte copied), any other is copied into `tmp/` first. Their writeback is started for all
//!    of them first and waited for after (`sync_file_range`, or `fdatasync` each), so the file
//!    system commits its journal once for the batch, not once per file;
//! 2. under the lock, in one transaction: the file nodes (created when new), one committed
//!    version each, blobs linked (or renamed) into place where their hash is new; the folders
//!    that got a blob fsynced (again one journal commit in all), then the commit with the WAL
//!    fsynced (`Durable`).
//!
//! Not `syncfs`: it would also wait for every other dirty file of the file system (a build
//! beside the store made it take seconds).
//!
//! A crash before the commit leaves the tree as it was (blobs placed are unrecorded: the next
//! batch of the same bytes takes them, recovery sweeps the rest); after it, every file of the
//! batch is stored. Each file has its own savepoint, so one failing (its folder removed
//! meanwhile, say) fails alone.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::db::params;

use super::nodes::{self, NodeKind};
use super::{Scope, Store, now_ns, time_to_ns};
use crate::api::checksum::Digests;
use crate::api::{Base, Error, FileAttrs, Node, NodePath, Result, kept_mode};

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
    /// md5 and sha256 of the first bytes of `source` (of a sealed one), hashed as they were
    /// written: only the rest is read.
    pub digests: Option<Digests>,
    /// The staged file's modification time and mode, kept with the version.
    pub attrs: FileAttrs,
    /// Given up (the file was removed meanwhile): not stored, and not hashed to the end.
    pub cancel: crate::api::files::Cancel,
    /// What the bytes replace: refused (`version_conflict`) when another version became
    /// current meanwhile (another process on the same store).
    pub base: Base,
    /// The md5 (hex) the bytes were announced with, by a client whose bytes crossed a network
    /// (`server::batch`): other bytes are refused (`checksum_mismatch`) and not stored.
    pub expect_md5: Option<String>,
}

/// A file of the batch after phase 1: its hashes and its bytes.
struct Prepared {
    /// The copy in `tmp/` of an unsealed source (empty for a sealed one, and once placed).
    tmp: PathBuf,
    /// The bytes to keep: the copy, or the sealed source itself.
    file: std::sync::Arc<File>,
    md5: String,
    sha256: String,
    /// Their kinds of document (`previews::judge_file`).
    kinds: crate::preview::Kinds,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // Renamed into place on success; otherwise garbage.
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
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
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    OneCommit,
    /// Anything else: each file and each folder fsynced.
    EachFile,
}

/// Whether the ext4 file system holding `dir` has a journal: jbd2 lists it in
/// `/proc/fs/jbd2/<device>-8` (the device from the mount table, by the folder's st_dev).
#[cfg(target_os = "linux")]
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
    /// Elsewhere than Linux, each file is flushed on its own.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn of(_dir: &Path) -> SyncMode {
        SyncMode::EachFile
    }

    #[cfg(target_os = "linux")]
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
            #[cfg(not(target_os = "linux"))]
            SyncMode::OneCommit => files.into_iter().try_for_each(File::sync_data),
            #[cfg(target_os = "linux")]
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
        // The account's writers' lock, as a group commit of step 3 takes it (on PostgreSQL
        // another account's batch commits beside this one).
        let conn = match self.conn() {
            Ok(c) => c,
            Err(e) => return files.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut previews = Vec::new();
        let results = (|| -> Result<Vec<Result<Node>>> {
            let durable = super::schema::Durable::new(&conn)?;
            let tx = conn.transaction_for(scope.writers())?;
            let mut results = Vec::with_capacity(files.len());
            let mut dirs = Vec::new();
            let mut folders = nodes::Folders::default();
            let mut freed = Vec::new();
            for (f, p) in files.iter().zip(prepared) {
                let p = match p.and_then(|p| f.cancel.check().map(|()| p).map_err(Error::from)) {
                    Ok(p) => p,
                    Err(e) => {
                        results.push(Err(e));
                        continue;
                    }
                };
                // One savepoint per file, its statements prepared once (rusqlite's `Savepoint`
                // parses them anew each time, a visible share of a burst's commit).
                let run = |sql: &str| tx.prepare_cached(sql)?.execute([]).map(drop);
                run("SAVEPOINT put_file")?;
                match self.put_one(&tx, scope, f, p, &mut dirs, &mut folders) {
                    Ok(c) => {
                        run("RELEASE put_file")?;
                        if let Some(kind) = c.render {
                            previews.push((c.sha, kind, c.name));
                        }
                        freed.extend(c.freed);
                        results.push(Ok(c.node));
                    }
                    Err(e) => {
                        run("ROLLBACK TO put_file")?;
                        run("RELEASE put_file")?;
                        results.push(Err(e));
                    }
                }
            }
            // The renames, durable before the commit that refers to them.
            self.sync_mode.renames(&dirs)?;
            tx.commit()?;
            durable.done()?;
            self.feed.wake(scope);
            // Under the lock still: no upload can be about to reuse these bytes.
            self.forget_blobs(&conn, &freed);
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
                for (sha, kind, name) in previews {
                    self.previews.enqueue(&sha, kind, &name);
                }
                self.search.wake();
                results
            }
            Err(e) => files.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// A new private file on the blobs' file system, for bytes a server receives for a batch
    /// (`server::batch`): given sealed to [`Store::put_files`], it becomes the blob by a hard
    /// link. The caller removes the name after; a crash leaves it to the sweep of `tmp/`.
    pub fn batch_file(&self) -> io::Result<(PathBuf, File)> {
        let path = self.blobs.tmp_name("batch");
        let file = crate::api::files::new_private(&path)?;
        Ok((path, file))
    }

    /// Phase 1 of one file: its hashes, and its bytes where phase 2 can place them. A sealed
    /// source on the blobs' file system is never written again: it is hashed as it is and
    /// linked into place in phase 2 (no byte copied, no name in `tmp/`). Any other source is
    /// copied into `tmp/` first (in the kernel where it can) and the copy hashed: what is
    /// hashed is what is kept, even if the source is written to meanwhile.
    fn prepare(&self, f: &PutFile) -> Result<Prepared> {
        self.check_file_size(f.len)?;
        let mut prepared = Prepared {
            tmp: PathBuf::new(),
            file: f.source.clone(),
            md5: String::new(),
            sha256: String::new(),
            kinds: [crate::preview::PreviewKind::Unsupported; 3],
        };
        if f.sealed && self.blobs.can_link(&f.source) {
            let digests = f.digests.clone().filter(|d| d.len() <= f.len);
            let digests = digests.unwrap_or_default().unless(&f.cancel);
            (prepared.md5, prepared.sha256) = digests.finish_from(&prepared.file, f.len)?;
        } else {
            prepared.tmp = self.blobs.tmp_name("put");
            let copy = crate::api::files::new_private(&prepared.tmp)?;
            let digests = Digests::default().unless(&f.cancel);
            (prepared.md5, prepared.sha256) = digests.copy_and_hash(&f.source, &copy, f.len)?;
            prepared.file = std::sync::Arc::new(copy);
        }
        if let Some(want) = f.expect_md5.as_deref().filter(|m| *m != prepared.md5) {
            return Err(Error::bad_request(
                "checksum_mismatch",
                format!(
                    "the bytes have md5 {}, the batch announced {want}",
                    prepared.md5
                ),
            ));
        }
        prepared.kinds = super::previews::judge_file(&prepared.file)?;
        Ok(prepared)
    }

    /// Gives a new blob its name: the copy in `tmp/` renamed, or the sealed source linked.
    /// Its bytes are durable already (phase 1), so a blob name never holds less than its
    /// bytes; a name already there is such a blob, left by a batch that did not commit.
    /// True when the name is new.
    fn place(&self, p: &mut Prepared, dest: &Path, len: u64) -> io::Result<bool> {
        let attempt = |p: &Prepared| {
            if p.tmp.as_os_str().is_empty() {
                link_fd(&p.file, dest)
            } else {
                fs::rename(&p.tmp, dest)
            }
        };
        let r = match attempt(p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(dest.parent().expect("a blob path has a folder"))?;
                attempt(p).map(|()| true)
            }
            r => r.map(|()| false),
        };
        match r {
            Ok(new_dir) => {
                p.tmp = PathBuf::new();
                Ok(new_dir)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            // A link refused for another reason (a file system without hard links): a copy,
            // made durable before it is named, as phase 1 would have.
            Err(e) if p.tmp.as_os_str().is_empty() => {
                log::debug!("linking a blob failed ({e}); copying it");
                p.tmp = self.blobs.tmp_name("put");
                let copy = crate::api::files::copy_to_new(&p.file, len, &p.tmp)?;
                copy.sync_data()?;
                self.place(p, dest, len)
            }
            Err(e) => Err(e),
        }
    }

    /// Phase 2 of one file, inside the batch's transaction: (node, preview wanted, name, sha256).
    fn put_one(
        &self,
        tx: &super::db::Conn,
        scope: Scope,
        f: &PutFile,
        mut p: Prepared,
        dirs: &mut Vec<PathBuf>,
        folders: &mut nodes::Folders,
    ) -> Result<nodes::Committed> {
        let now = now_ns();
        let file = match &f.file_id {
            Some(id) => nodes::file_by_id(tx, scope, id)?,
            None => {
                nodes::create_file_row_in(tx, scope, &f.path, now, folders, self.change_limits())?
            }
        };
        debug_assert_eq!(file.kind, NodeKind::File);
        if !f.base.holds(file.md5.as_deref()) {
            return Err(f.base.conflict(&f.path.to_string()));
        }
        // The account's quota, as step 2 and its commit check it (versions are kept: each
        // counts); a file made here counts as a node (rolled back with it when refused).
        nodes::check_quota(tx, &self.config, scope, 0, f.len)?;
        // A server's client sending the bytes the file has already (written again the same, or
        // only its times changed): its attributes alone, no new version, as its uploads one by
        // one do (a `tar x` over the same tree made a version of every file).
        if f.expect_md5.is_some() && file.md5.as_deref() == Some(p.md5.as_str()) {
            tx.prepare_cached(
                "UPDATE nodes SET modified_on = coalesce(?2, modified_on), exec = coalesce(?3, exec) WHERE id = ?1",
            )?
            .execute(params![
                file.id,
                f.attrs.modified.map(time_to_ns),
                f.attrs.mode.map(kept_mode)
            ])?;
            let row = nodes::row(tx, file.id)?;
            let path = nodes::path_of(tx, file.id)?;
            self.log_change(
                tx,
                super::changes::NewChange::new(&row, crate::api::ChangeKind::Attributes, &path),
            )?;
            return Ok(nodes::Committed {
                node: row.to_api(&path),
                render: None,
                name: file.name,
                sha: p.sha256.clone(),
                freed: Vec::new(),
            });
        }
        // The blob's lock first (PostgreSQL): blobs are shared by accounts, whose batches
        // commit side by side, and another account's version may be letting go of these bytes
        // now (`free_blobs` takes the same lock): either it comes first and the bytes are
        // placed again here, or it comes after and sees this version.
        tx.lock_blob(&p.sha256)?;
        let known = tx
            .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
            .exists([&p.sha256])?;
        if !known {
            if let Some(local) = self.blobs.local() {
                let dest = local.path(&p.sha256);
                let dir = dest.parent().expect("a blob path has a folder");
                if self.place(&mut p, &dest, f.len)? {
                    // A new folder: its own entry, too.
                    dirs.push(dir.parent().expect("blobs/ has a parent").to_path_buf());
                }
                // Last placed into, last in the list (OneCommit syncs that one).
                dirs.retain(|d| d != dir);
                dirs.push(dir.to_path_buf());
            } else {
                // A bucket (a mount's store never has one; `vaultfs serve` uploads by
                // `commit_upload`, which stores ahead of the lock).
                self.blobs.put_file(&p.file, f.len, &p.sha256)?;
            }
            tx.prepare_cached(
                "INSERT INTO blobs (hash, size, md5, kinds) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                p.sha256,
                f.len as i64,
                p.md5,
                super::previews::format_kinds(&p.kinds)
            ])?;
        }
        tx.prepare_cached(
            "INSERT INTO versions (file_id, length, md5, blob, committed, created_on, committed_on) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)",
        )?
        .execute(params![file.id, f.len as i64, p.md5, p.sha256, now])?;
        let vid = tx.last_insert_rowid()?;
        tx.prepare_cached(
            "UPDATE nodes SET current_version = ?2, modified_on = ?3, exec = coalesce(?4, exec) WHERE id = ?1",
        )?
        .execute(params![
            file.id,
            vid,
            f.attrs.modified.map_or(now, time_to_ns),
            f.attrs.mode.map(kept_mode)
        ])?;
        let render = super::previews::want_judged(tx, &p.sha256, &file.name, &p.kinds)?;
        // A file new in this batch has no earlier version to drop (one found by its path, as
        // one named by its ID, may have).
        let freed = match file.md5 {
            Some(_) => nodes::prune_versions(tx, file.id, &self.config.retention)?,
            None => Vec::new(),
        };
        let row = nodes::row(tx, file.id)?;
        // By path: in a folder of the batch, whose path as stored is known already.
        let path = match (&f.file_id, f.path.parent()) {
            (None, Some(folder)) => folders.resolve(tx, scope, &folder)?.1.child(&file.name)?,
            _ => nodes::path_of(tx, file.id)?,
        };
        self.log_change(
            tx,
            super::changes::NewChange::new(&row, crate::api::ChangeKind::Version, &path),
        )?;
        Ok(nodes::Committed {
            node: row.to_api(&path),
            render,
            name: file.name,
            sha: p.sha256.clone(),
            freed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ChangeKind;
    use crate::api::checksum::{Md5, hex};
    use sha2::{Digest, Sha256};

    #[test]
    #[cfg(target_os = "linux")]
    fn only_a_journaled_file_system_gets_one_commit_per_batch() {
        // /proc is neither ext4 nor XFS.
        assert_eq!(SyncMode::of(Path::new("/proc")), SyncMode::EachFile);
        assert!(!ext4_has_journal(Path::new("/proc")));
        assert_eq!(SyncMode::of(Path::new("/no/such/dir")), SyncMode::EachFile);
    }

    fn staged(dir: &Path, name: &str, data: &[u8]) -> PutFile {
        let p = dir.join(name);
        fs::write(&p, data).unwrap();
        let source = std::sync::Arc::new(File::open(&p).unwrap());
        PutFile {
            base: Base::Any,
            expect_md5: None,
            path: NodePath::from_segments(["Local", "My First Vault", name]).unwrap(),
            file_id: None,
            source,
            len: data.len() as u64,
            sealed: true,
            digests: None,
            attrs: FileAttrs::default(),
            cancel: Default::default(),
        }
    }

    /// The feed's version rows say the md5 of the bytes current when it is read, so a mount
    /// whose upload was answered between two writers' versions tells its own echo from the
    /// other's by the bytes, not by the clock (`follow::apply`).
    #[test]
    fn the_feeds_versions_say_the_bytes_current_now() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        let src = tmp.path().join("staging");
        fs::create_dir(&src).unwrap();
        let head = store.changes(Scope::All, None, 1).unwrap().cursor;
        let md5 = |n: &Result<Node>| n.as_ref().unwrap().md5_checksum.clone().unwrap();
        let first = store.put_files(Scope::All, &[staged(&src, "a.txt", b"ours")]);
        let ours = md5(&first[0]);
        let seen = |store: &Store| -> Vec<Option<String>> {
            let page = store.changes(Scope::All, Some(head), 100).unwrap();
            let versions = page
                .changes
                .iter()
                .filter(|c| c.kind == ChangeKind::Version);
            versions.map(|c| c.md5.clone()).collect()
        };
        assert_eq!(seen(&store), [Some(ours.clone())]);
        let second = store.put_files(Scope::All, &[staged(&src, "a.txt", b"theirs")]);
        let theirs = md5(&second[0]);
        assert_ne!(ours, theirs);
        assert_eq!(seen(&store), [Some(theirs.clone()), Some(theirs)]);
        // Gone: nothing to say.
        let path = NodePath::from_segments(["Local", "My First Vault", "a.txt"]).unwrap();
        store.delete(Scope::All, &path).unwrap();
        assert_eq!(seen(&store), [None, None]);
    }

    /// Two processes on one store folder (a mount beside `vaultfs serve`): one removes the last
    /// file with some bytes, the other stores the same bytes again before the first removes
    /// the blob. The blob the second recorded stays.
    #[test]
    fn bytes_stored_again_by_another_process_outlive_the_first_ones_removal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let (first, second) = (
            Store::open_local(&dir).unwrap(),
            Store::open_local(&dir).unwrap(),
        );
        let src = tmp.path().join("staging");
        fs::create_dir(&src).unwrap();
        let data = b"the same bytes in two files";
        let hash = hex(&Sha256::digest(data));
        let a = first.put_files(Scope::All, &[staged(&src, "a.txt", data)]);
        assert!(a[0].is_ok());
        // The race leaves this state: the first's delete dropped the last row of the bytes and
        // committed, the second stored them again (finding the file still there) and recorded
        // them, then the first removes what it believes unused.
        let b = second.put_files(Scope::All, &[staged(&src, "b.txt", data)]);
        assert!(b[0].is_ok());
        first.forget_blobs(&first.lock().unwrap(), [&hash]);
        assert!(first.blobs.local().unwrap().path(&hash).exists());
        assert!(second.check_integrity().unwrap().is_empty());
        // Unrecorded, it goes.
        let p = NodePath::from_segments(["Local", "My First Vault"]).unwrap();
        for name in ["a.txt", "b.txt"] {
            second.delete(Scope::All, &p.child(name).unwrap()).unwrap();
        }
        assert!(!first.blobs.local().unwrap().path(&hash).exists());
    }

    /// A store that keeps one earlier version: a file stored four times keeps its last two,
    /// the bytes of the others are gone from disk, and bytes a kept version shares stay.
    #[test]
    fn earlier_versions_beyond_the_kept_number_are_dropped_with_their_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let config = crate::store::StoreConfig {
            retention: crate::store::Retention {
                count: Some(1),
                ..crate::store::Retention::default()
            },
            ..Default::default()
        };
        let store = Store::open_local_with(&tmp.path().join("store"), config).unwrap();
        let src = tmp.path().join("staging");
        fs::create_dir(&src).unwrap();
        let mut id = None;
        for (i, data) in [&b"one"[..], b"two", b"one", b"three"].iter().enumerate() {
            let mut f = staged(&src, &format!("v{i}"), data);
            f.path = NodePath::from_segments(["Local", "My First Vault", "f.txt"]).unwrap();
            f.file_id = id.clone();
            let node = store.put_files(Scope::All, &[f]).remove(0).unwrap();
            id = node.id.clone();
        }
        let id = id.unwrap();
        let kept: Vec<Option<String>> = store
            .version_history(&id)
            .unwrap()
            .into_iter()
            .map(|v| v.md5)
            .collect();
        let md5 = |d: &[u8]| Some(hex(&Md5::digest(d)));
        assert_eq!(kept, [md5(b"one"), md5(b"three")]);
        // "two" is gone; "one" is kept by the earlier version that holds it.
        assert_eq!(store.blob_count().unwrap(), 2);
        assert!(
            !store
                .blobs
                .local()
                .unwrap()
                .path(&hex(&Sha256::digest(b"two")))
                .exists()
        );
        assert!(
            store
                .blobs
                .local()
                .unwrap()
                .path(&hex(&Sha256::digest(b"one")))
                .exists()
        );
        assert!(store.check_integrity().unwrap().is_empty());
    }

    /// Stores `saves` as successive versions of one file under `keep`, calling `between`
    /// after each save; the md5s of the versions kept, oldest first.
    fn kept_under(
        keep: crate::store::Retention,
        saves: &[&[u8]],
        between: impl Fn(&Store),
    ) -> Vec<Option<String>> {
        let tmp = tempfile::tempdir().unwrap();
        let config = crate::store::StoreConfig {
            retention: keep,
            ..Default::default()
        };
        let store = Store::open_local_with(&tmp.path().join("store"), config).unwrap();
        let src = tmp.path().join("staging");
        fs::create_dir(&src).unwrap();
        let mut id = None;
        for (i, data) in saves.iter().enumerate() {
            let mut f = staged(&src, &format!("v{i}"), data);
            f.path = NodePath::from_segments(["Local", "My First Vault", "f.txt"]).unwrap();
            f.file_id = id.clone();
            let node = store.put_files(Scope::All, &[f]).remove(0).unwrap();
            id = node.id.clone();
            between(&store);
        }
        assert!(store.check_integrity().unwrap().is_empty());
        let kept = store.version_history(&id.unwrap()).unwrap();
        kept.into_iter().map(|v| v.md5).collect()
    }

    /// The retention rule by bytes (newest first, the newest earlier version kept whatever
    /// its size) and by age.
    #[test]
    fn earlier_versions_are_kept_within_the_byte_and_age_bounds() {
        let md5 = |d: &[u8]| Some(hex(&Md5::digest(d)));
        let by_bytes = crate::store::Retention {
            bytes: Some(10),
            ..Default::default()
        };
        let saves: [&[u8]; 5] = [b"aaaa", b"bbbbbbbbbbbb", b"cccc", b"dddd", b"eeee"];
        // Earlier, newest first: d (4), c (8), b (20: over), a (dropped after b).
        assert_eq!(
            kept_under(by_bytes, &saves, |_| {}),
            [md5(b"cccc"), md5(b"dddd"), md5(b"eeee")]
        );
        // One earlier version larger than the bound is still kept.
        let big: [&[u8]; 2] = [b"a version of more than ten bytes", b"now"];
        assert_eq!(
            kept_under(by_bytes, &big, |_| {}),
            [md5(big[0]), md5(b"now")]
        );
        // By age: after each save every version so far is made two days old, so each save
        // drops the earlier ones and only the current version is left.
        let by_age = crate::store::Retention {
            age: Some(std::time::Duration::from_secs(24 * 3600)),
            ..Default::default()
        };
        let old = |store: &Store| {
            let two_days = 2 * 24 * 3600 * 1_000_000_000i64;
            store
                .lock()
                .unwrap()
                .execute(
                    "UPDATE versions SET created_on = created_on - ?1",
                    crate::store::db::params![two_days],
                )
                .unwrap();
        };
        assert_eq!(
            kept_under(by_age, &[b"one", b"two", b"three"], old),
            [md5(b"three")]
        );
        // Within the age, all are kept (no count bound).
        assert_eq!(
            kept_under(by_age, &[b"one", b"two", b"three"], |_| {}),
            [md5(b"one"), md5(b"two"), md5(b"three")]
        );
    }

    /// A batch where one file fails: the others are stored with their bytes (a sealed source
    /// linked, equal bytes stored once), the failing one leaves nothing behind, and a blob
    /// name left by a batch that never committed is taken, not refused.
    #[test]
    fn one_failing_file_fails_alone_and_equal_bytes_share_a_blob() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        let src = tmp.path().join("staging");
        fs::create_dir(&src).unwrap();
        let mut orphan = staged(&src, "c.txt", b"left by a crash");
        let sha = hex(&Sha256::digest(b"left by a crash"));
        // As a batch that crashed after placing its blob and before its commit would leave it.
        let dest = store.blobs.local().unwrap().path(&sha);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(&dest, b"left by a crash").unwrap();
        let mut lost = staged(&src, "lost.txt", b"no folder");
        lost.path =
            NodePath::from_segments(["Local", "My First Vault", "gone", "lost.txt"]).unwrap();
        orphan.path = NodePath::from_segments(["Local", "My First Vault", "c.txt"]).unwrap();
        let batch = vec![
            staged(&src, "a.txt", b"same bytes"),
            lost,
            staged(&src, "b.txt", b"same bytes"),
            orphan,
        ];
        let results = store.put_files(Scope::All, &batch);
        assert_eq!(results.len(), 4);
        assert!(results[1].is_err(), "{:?}", results[1]);
        for (i, want) in [
            (0, &b"same bytes"[..]),
            (2, b"same bytes"),
            (3, b"left by a crash"),
        ] {
            let node = results[i].as_ref().unwrap();
            let (_, file) = store
                .open_file(Scope::All, node.id.as_deref().unwrap())
                .unwrap();
            let mut got = Vec::new();
            io::Read::read_to_end(&mut file.unwrap(), &mut got).unwrap();
            assert_eq!(got, want, "file {i}");
            assert_eq!(
                node.md5_checksum.as_deref(),
                Some(&*hex(&Md5::digest(want)))
            );
        }
        // a.txt and b.txt share one blob, linked from a.txt's staging file (no copy).
        let a = fs::metadata(src.join("a.txt")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::nlink(&a), 2);
        assert_eq!(store.blob_count().unwrap(), 2);
        let lost = NodePath::from_segments(["Local", "My First Vault", "gone", "lost.txt"]);
        assert!(store.node(Scope::All, &lost.unwrap()).is_err());
        assert!(store.check_integrity().unwrap().is_empty());
    }
}
