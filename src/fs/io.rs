//! File contents: read, write, release, fsync and fallocate (opens: `open.rs`). Writes go to a
//! staged copy on local disk (`staging/`); the last writer's release settles it
//! (`staging/lifecycle.rs`); fsync returns once the bytes are stored. Reads come
//! from the staged copy while there is one, else from the read cache (`cache.rs`), or on the
//! built-in store, for a file of up to `BLOB_READS_UP_TO`, from its blob.

use std::sync::Arc;

use fuser::{Errno, FopenFlags};

use super::error::Error as FsError;
use super::staging::Staged;
use super::staging::lifecycle::Found;
use super::table::Ino;
use super::virtual_dirs::is_virtual;
use super::{Fs, Handle, OpResult, upload};
use crate::api::ErrorKind;
use crate::backend::Backend;

/// An open file: its handle, how the kernel is to treat its cached pages, and the backing file
/// it reads from itself (passthrough).
#[derive(Debug)]
pub(crate) struct Opened {
    pub fh: u64,
    pub flags: FopenFlags,
    pub backing: Option<Arc<fuser::BackingId>>,
}

/// Stored files up to this size are read on the built-in store straight from their blob, in
/// one trip to the store (the look-up and the read together), not copied into the read cache
/// first: a cold `tar` of small files spent most of its time making those copies, each a second
/// file on the same disk. Larger ones keep the cache's read-ahead (or passthrough, when opened
/// so, reads the blob itself).
const BLOB_READS_UP_TO: u64 = 1 << 20;

impl<B: Backend> Fs<B> {
    /// The staged copy of a file, created (with its content, unless `truncate`) if there is
    /// none, with one more writer joined (`staging::lifecycle`); the caller gives it back with
    /// `release_staged`.
    pub(super) async fn stage(self: &Arc<Self>, ino: Ino, truncate: bool) -> OpResult<Arc<Staged>> {
        // A file rewritten faster than it can be copied, again and again: give up at last.
        for _ in 0..STAGE_ATTEMPTS {
            if let Some(s) = self.try_stage(ino, truncate).await? {
                return Ok(s);
            }
        }
        Err(Errno::EAGAIN.into())
    }

    /// One attempt of [`Fs::stage`]; `None` when the file got a new stored version while its
    /// content was being copied (the copy would stage the old bytes: fstests generic/451), and
    /// the inode now knows it.
    async fn try_stage(
        self: &Arc<Self>,
        ino: Ino,
        truncate: bool,
    ) -> OpResult<Option<Arc<Staged>>> {
        let (path, remote, base) = match self.writer_finds(ino, truncate)? {
            Found::Joined(s) => return self.emptied_if(ino, s, truncate).map(Some),
            Found::LetGo => return Ok(None),
            Found::Copy { path, remote, base } => (path, remote, base),
        };
        let staged = self
            .journal
            .create(&path, remote.as_ref().map(|r| r.id.clone()), base)?;
        if let Some(r) = remote.as_ref().filter(|r| !truncate && r.size > 0) {
            let entry = self.reads.cache.entry(&r.id, r.md5.as_deref(), r.size)?;
            let copied = match staged.file() {
                Ok(dest) => {
                    (self.reads.cache)
                        .copy_into(self.backend.as_ref(), &entry, &dest)
                        .await
                }
                Err(e) => Err(e.into()),
            };
            if let Err(e) = copied {
                self.discard(&staged);
                if e.code == super::cache::CHANGED {
                    // Another version came while downloading: learn which, and copy that.
                    self.refresh_attr(ino, &path).await?;
                    return Ok(None);
                }
                return Err(e.into());
            }
            staged.truncate(r.size)?;
            Self::copied_stored(&staged);
        }
        let attached = self.attach_copy(ino, Arc::new(staged), remote.as_ref())?;
        let Some((staged, ours)) = attached else {
            return Ok(None);
        };
        // (Cut here where it holds a version, so that the cut counts: a new file's copy is new.)
        let truncate = truncate && (!ours || remote.is_some());
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
                return Err(e.into());
            }
        }
        Ok(staged)
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
            self.closed(ino, fh, staged, kernel);
        }
    }

    /// READ: from the staged copy, else from the read cache (which downloads what it lacks).
    pub(super) async fn read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> OpResult<Vec<u8>> {
        if is_virtual(ino) {
            return self.virtual_read(ino, offset, size).await;
        }
        let mut learned = false;
        loop {
            let (staged, remote, path) = (self.nodes)
                .inode(ino, |i| {
                    (i.staged.clone(), i.remote.clone(), i.path.clone())
                })
                .ok_or(Errno::ENOENT)?;
            if let Some(s) = staged {
                return s.read_at(offset, size as usize).map_err(FsError::from);
            }
            let Some(r) = remote else {
                return Ok(Vec::new());
            };
            self.reads.last_read.note();
            if let (Some(local), true) = (self.backend.local(), r.size <= BLOB_READS_UP_TO) {
                match local.read_local(&r.id, offset, size as usize).await {
                    Ok(Some((node, bytes))) if r.is_version(&node) => {
                        return Ok(bytes);
                    }
                    // Another version is current (written elsewhere): learned, and read.
                    Ok(Some(_)) if !learned => {
                        learned = true;
                        self.refresh_attr(ino, &path).await?;
                        continue;
                    }
                    // Not local files, or still another version: the read cache's way.
                    Ok(_) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let entry = self.reads.cache.entry(&r.id, r.md5.as_deref(), r.size)?;
            match self
                .reads
                .cache
                .read(&self.backend, &entry, offset, size as usize)
                .await
            {
                // The store has a newer version than this mount knew (written elsewhere, the
                // feed's news not here yet): learned, and read, as a read after the news
                // would (ESTALE reached the reader: the model, a read racing a write by the
                // interface).
                Err(e) if e.code == super::cache::CHANGED && !learned => {
                    learned = true;
                    self.refresh_attr(ino, &path).await?;
                }
                r => return r.map_err(FsError::from),
            }
        }
    }

    /// FSYNC: returns once the file's bytes as they are now are stored, or says why not.
    pub(super) async fn fsync(self: &Arc<Self>, ino: Ino) -> OpResult<()> {
        // An unlinked file's bytes have no name to be stored under: nothing to wait for.
        let staged = self
            .nodes
            .inode(ino, |i| i.staged.clone().filter(|_| !i.unlinked))
            .flatten();
        let Some(staged) = staged else { return Ok(()) };
        self.fsync_started(ino, &staged);
        if !staged.is_dirty() {
            return Ok(());
        }
        self.journal_entry_now(ino, &staged);
        // fsync returns only once the bytes are stored remotely, or reports why not.
        if self.backend.local().is_some() {
            // Stored with the next batch (one durable commit for all of it).
            return if super::writeback::flush(self, ino, &staged).await {
                Ok(())
            } else {
                Err(FsError::failed("the batch that stores it failed"))
            };
        }
        // A conflict, or the file deleted elsewhere: its bytes go to a conflict copy, or are
        // stored again (by this call, or by the file's uploader if it met the refusal first),
        // and this returns once they are: the open file is that copy now, and it is stored.
        let mut resolved = 0;
        while let Err(e) = upload::upload_once(self, ino).await {
            let refused = matches!(e.kind, ErrorKind::Precondition | ErrorKind::NotFound);
            if refused && resolved < super::conflict::RESOLVE_AT_MOST {
                resolved += 1;
                self.resolve_refusal(ino, &e).await;
                continue;
            }
            upload::schedule(self, ino);
            return Err(FsError::failed(format!("upload failed: {e}")));
        }
        if staged.is_dirty() {
            // Written to while uploading: upload again.
            upload::upload_once(self, ino).await.map_err(|e| {
                FsError::failed(format!("upload of the bytes written meanwhile failed: {e}"))
            })?;
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
        let staged = self.nodes.staged(ino)?;
        Some(staged.read_at(offset, size as usize).map_err(FsError::from))
    }

    /// The staged copy a handle writes to (EBADF: not open for writing).
    pub(super) fn writing(&self, fh: u64) -> OpResult<Arc<Staged>> {
        match self.handles().get(&fh) {
            Some(Handle::File {
                staged: Some(s), ..
            }) => Ok(s.clone()),
            _ => Err(Errno::EBADF.into()),
        }
    }

    /// WRITE through handle `fh`, to its staged copy: the number of bytes written.
    pub(super) fn write(&self, fh: u64, offset: u64, data: &[u8]) -> OpResult<u32> {
        self.reads.counts.write();
        let staged = self.writing(fh)?;
        staged.write_at(offset, data)?;
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
        if mode & !KEEP_SIZE != 0 {
            return Err(Errno::ENOTSUP.into());
        }
        let staged = self.writing(fh)?;
        staged
            .allocate(offset, length, mode & KEEP_SIZE != 0)
            .map_err(FsError::from)
    }

    /// COPY_FILE_RANGE: not offered; the kernel falls back to reads and writes.
    pub(super) fn copy_file_range(&self) -> OpResult<u32> {
        Err(Errno::ENOSYS.into())
    }
}

/// FALLOC_FL_KEEP_SIZE as FUSE carries it: Linux's value, whatever the system.
const KEEP_SIZE: i32 = 0x01;
#[cfg(target_os = "linux")]
const _: () = assert!(KEEP_SIZE == libc::FALLOC_FL_KEEP_SIZE);

/// How many times an open copies a file that keeps getting new versions meanwhile.
const STAGE_ATTEMPTS: usize = 5;
