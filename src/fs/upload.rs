//! The uploader: takes staged files to the backend in the interface's order (`create_file` for a
//! new file, a version with the exact length and md5, the bytes), retried as `staging::retry`
//! says. The journal entry goes only after the backend has the bytes.

use super::Fs;
use super::staging::{Next, Retry};
use super::table::Ino;
use crate::api::{Error, ErrorKind, FileAttrs, Result, whole_mode};
use crate::backend::{Backend, PutTo, Whole, reader_stream};
use crate::sync::relock;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A file sent whole up to this size is answered in about the server's delay, as step 2 is:
/// the window's signal (larger ones take the time of their bytes).
const WINDOW_SIGNAL_BYTES: u64 = 64 << 10;

/// The uploader's part of the mount: which files have an upload going, the window they share,
/// the batch queue, and the journal's hand-over to a new daemon (`fs::mount`). The staged
/// files' state is `staging::lifecycle`'s; this schedules and counts.
pub(super) struct Uploads {
    /// Files with an upload going, and which way: a task of their own, or a batch (waiting
    /// for it, or in it).
    uploading: std::sync::Mutex<std::collections::HashMap<Ino, Way>>,
    /// The uploads' window and the batching of their first step (`pacing`).
    pub(super) pacing: super::pacing::Pacing,
    /// Closed files waiting for the next batch (backends that store batches).
    pub(super) writeback: super::writeback::queue::Writeback,
    /// The journal is being handed to a new daemon: no upload or batch starts any more.
    handing_over: std::sync::atomic::AtomicBool,
    /// Uploads and batches between their start and their journal entry's end.
    storing: std::sync::atomic::AtomicUsize,
    /// Uploads in flight and recent errors, for `vaultfs status`.
    pub(super) tracker: super::status::Tracker,
}

impl Uploads {
    /// `concurrency` uploads in flight at first (the window then adapts).
    pub(super) fn new(concurrency: usize) -> Uploads {
        Uploads {
            uploading: Default::default(),
            pacing: super::pacing::Pacing::new(concurrency),
            writeback: Default::default(),
            handing_over: Default::default(),
            storing: Default::default(),
            tracker: Default::default(),
        }
    }

    /// `ino` goes to the next batch (a backend that stores batches: `writeback`), counted as
    /// uploading until the batch is through.
    pub(super) fn to_batch(&self, ino: Ino) {
        relock(&self.uploading).entry(ino).or_insert(Way::Batch);
        self.writeback.enqueue(ino);
    }

    /// Whether `ino` has an upload going (or waits for its batch).
    pub(super) fn is_uploading(&self, ino: Ino) -> bool {
        relock(&self.uploading).contains_key(&ino)
    }

    /// How many files have an upload going.
    pub(super) fn running(&self) -> usize {
        relock(&self.uploading).len()
    }

    /// `ino`'s batch is through and it waits for no other: no upload goes any more.
    pub(super) fn batch_ended(&self, ino: Ino) {
        if !self.writeback.is_queued(ino) {
            let mut up = relock(&self.uploading);
            if up.get(&ino) == Some(&Way::Batch) {
                up.remove(&ino);
            }
        }
    }

    /// An upload or a batch starts storing: counted until the guard goes. None while the
    /// journal is handed to a new daemon, which stores it instead (`fs::mount`).
    pub(super) fn storing(&self) -> Option<Storing<'_>> {
        if self.handing_over.load(Ordering::SeqCst) {
            return None;
        }
        self.storing.fetch_add(1, Ordering::SeqCst);
        Some(Storing(&self.storing))
    }

    /// The journal goes to a new daemon: nothing starts storing any more, and what is being
    /// stored gets until `cut` to finish (and end its journal entry, so the next daemon does
    /// not store it again).
    pub(super) async fn hand_over(&self, cut: tokio::time::Instant) {
        self.handing_over.store(true, Ordering::SeqCst);
        while self.storing.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < cut {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// How a file's upload goes (`Uploads::uploading`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// In the write-back's batches (`writeback`).
    Batch,
    /// A task of its own (`run`), which goes round again while the file is written meanwhile.
    OneByOne,
}

/// An upload or batch storing (`Uploads::storing`).
pub(super) struct Storing<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Storing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Queues the uploads a previous run left in the journal.
pub fn recover<B: Backend>(fs: &Arc<Fs<B>>) -> std::io::Result<()> {
    let entries = fs.journal.recover()?;
    if !entries.is_empty() {
        log::info!("resuming {} upload(s) from the journal", entries.len());
    }
    for (path, _file_id, staged) in entries {
        let ino = fs.recovered(&path, staged);
        schedule(fs, ino);
    }
    Ok(())
}

/// Makes sure an upload runs for `ino`: in the next batch, for a backend with batches and a
/// file within their bounds (`writeback`); else a task of its own, which keeps going until the
/// file is clean. A file keeps the way it is on: a batch that finds one grown past the bounds
/// hands it to a task of its own (`one_by_one`).
pub fn schedule<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) {
    let small = fs.backend.batches().is_some_and(|b| {
        let size = fs.nodes.staged(ino).map_or(0, |s| s.size());
        size <= b.batch_bounds().file
    });
    let mut up = relock(&fs.uploads.uploading);
    match up.get(&ino) {
        // Its task goes round again (it checks under this lock before it ends).
        Some(Way::OneByOne) => {}
        Some(Way::Batch) => {
            drop(up);
            fs.uploads.to_batch(ino);
        }
        None if small => {
            drop(up);
            fs.uploads.to_batch(ino);
        }
        None => {
            up.insert(ino, Way::OneByOne);
            drop(up);
            spawn_run(fs, ino);
        }
    }
}

/// A file a batch took that has grown past the batches' bounds: a task of its own from now on.
pub(super) fn one_by_one<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) {
    relock(&fs.uploads.uploading).insert(ino, Way::OneByOne);
    spawn_run(fs, ino);
}

fn spawn_run<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) {
    let fs = fs.clone();
    fs.rt.clone().spawn(async move { run(&fs, ino).await });
}

async fn run<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) {
    let mut retry = Retry::default();
    let mut resolved = 0;
    // A temporary copy about to take a document's name waits for it (`history`).
    while let Some(wait) = fs.held_back(ino) {
        tokio::time::sleep(wait.min(std::time::Duration::from_millis(100))).await;
    }
    loop {
        let result = {
            // A file saved by a rename takes its history back first (`history`).
            // (Each step boxed: a task waiting for its place holds a few hundred bytes, not
            // the state of every step; 10,000 files queued held 55 MB.)
            Box::pin(fs.continue_document(ino)).await;
            // Step 1 with the folder's other new files, before waiting for a place (`pacing`).
            let created = Box::pin(super::pacing::create_ahead(fs, ino)).await;
            let _slot = fs.uploads.pacing.window.acquire().await;
            let Some(storing) = fs.uploads.storing() else {
                return; // the next daemon uploads it (see `fs::mount`)
            };
            let removal = fs
                .nodes
                .inode(ino, |i| {
                    Some((i.staged.as_ref()?.removal().clone(), i.io.clone()))
                })
                .flatten();
            let r = match created {
                Ok(()) => Box::pin(upload_once(fs, ino)).await,
                Err(e) => Err(e),
            };
            let r = match removal {
                // The file is being removed (`Fs::remove`): its hashing and the sending of its
                // bytes stopped at the next chunk (a version whose bytes did not all arrive is
                // never stored). Once the removal is through (it waits for `io`), the file is
                // gone, or still there to store if the removal failed.
                Some((removal, io)) if removal.is_cancelled() => {
                    drop(io.lock().await);
                    Ok(())
                }
                _ => r,
            };
            drop(storing);
            r
        };
        match &result {
            Ok(()) => fs.uploads.pacing.window.succeeded(),
            Err(e) => fs.uploads.pacing.window.failed(e),
        }
        if let Err(e) = result {
            // A conflict, or the file deleted elsewhere: stored as a copy, or again.
            if resolved < super::conflict::RESOLVE_AT_MOST
                && Box::pin(fs.resolve_refusal(ino, &e)).await
            {
                resolved += 1;
                continue;
            }
            fs.uploads
                .tracker
                .error(format!("upload of {}: {e}", fs.nodes.describe(ino)));
            match retry.failed(&e) {
                Next::After(wait) => {
                    if e.kind == crate::api::ErrorKind::Network {
                        // Offline until the next attempt says otherwise.
                        fs.offline.note_unreachable(wait * 2);
                    }
                    log::warn!(
                        "upload of inode {ino} failed, retrying in {:.1}s: {e}",
                        wait.as_secs_f64()
                    );
                    tokio::select! {
                        () = fs.uploads.pacing.window.backs_off(wait, &e) => {}
                        () = fs.offline.reconnected.notified() => {}
                    }
                    continue;
                }
                Next::SetAside => fs.set_aside(ino, &e),
            }
        } else {
            retry = Retry::default();
            fs.offline.note_reachable();
        }
        // Done unless a writer made it dirty again (and has closed it since).
        let mut up = relock(&fs.uploads.uploading);
        let again = fs
            .nodes
            .inode(ino, |i| i.staged.clone())
            .flatten()
            .is_some_and(|s| s.waits_for_upload());
        if !again {
            up.remove(&ino);
            return;
        }
    }
}

/// One attempt: snapshot, hash, the three steps; on success the staged copy is stored
/// (`Fs::stored`: retired if no change came in meanwhile).
pub async fn upload_once<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) -> Result<()> {
    // (fsync comes here without `run`: a file saved by a rename takes its history back first.)
    fs.continue_document(ino).await;
    let Some(io) = fs.nodes.io(ino) else {
        return Ok(());
    };
    let _io = io.lock().await;
    let due = fs.nodes.inode(ino, |inode| {
        let staged = inode.staged.clone()?;
        if inode.unlinked || !staged.is_dirty() {
            return None;
        }
        let r = inode.remote.as_ref();
        Some((
            inode.path.clone(),
            r.map(|r| r.id.clone()),
            r.and_then(|r| r.md5.clone()),
            staged,
            inode.perm,
        ))
    });
    let Some((path, remote_id, remote_md5, staged, perm)) = due.flatten() else {
        return Ok(());
    };
    let generation = staged.generation();
    // Read after the generation: attributes set later make another round.
    let attrs = FileAttrs {
        modified: Some(staged.mtime()),
        mode: perm.map(whole_mode),
    };
    let size = staged.size();
    if size > fs.opts.max_file_size {
        // Written past the limit by the kernel itself (see `io`): refused before hashing it.
        return Err(Error::new(
            crate::api::ErrorKind::TooLarge,
            "file_too_large",
            format!(
                "{size} bytes is over the limit of {} bytes",
                fs.opts.max_file_size
            ),
        ));
    }
    // A backend in this process hashes what it stores anyway; a remote one gets the md5 so
    // the server can check the bytes that crossed the network.
    let md5 = if fs.backend.local().is_none() {
        let s2 = staged.clone();
        let md5 = tokio::task::spawn_blocking(move || s2.md5())
            .await
            .map_err(|e| Error::internal(format!("hash task failed: {e}")))??;
        Some(md5)
    } else {
        None
    };

    let (parent, name) = match (path.parent(), path.name()) {
        (Some(p), Some(n)) => (p, n.to_string()),
        _ => return Err(Error::bad_path("cannot upload to the root")),
    };
    // The bytes to send: their own descriptor (own offset), the staging file stays open for
    // readers and writers.
    let body = || -> Result<crate::backend::ByteStream> {
        let file = std::fs::File::open(staged.data_path())?;
        let body = staged.removal().reader(std::io::Read::take(file, size));
        let body = reader_stream(body, size);
        Ok(fs.uploads.tracker.track(ino, path.to_string(), size, body))
    };
    let node = if let (Some(id), true) = (&remote_id, md5.is_some() && remote_md5 == md5) {
        // Same bytes as stored (opened for writing, or only its attributes changed): no bytes
        // to send.
        super::attrs::store(fs, id, md5.clone(), attrs).await?;
        None
    } else if let (true, Some(md5)) = (fs.backend.puts_whole(), &md5) {
        // A server that takes a file in one request (ours): one round trip, not three, and
        // the conflict check is its own.
        let to = match &remote_id {
            Some(id) => PutTo::File(id),
            None => PutTo::Path(&path),
        };
        let base = staged.base();
        let asked = std::time::Instant::now();
        let stored = fs
            .backend
            .put_whole(
                Whole {
                    to,
                    length: size,
                    md5,
                    attrs,
                    base: &base,
                },
                body()?,
            )
            .await;
        fs.uploads.tracker.done(ino);
        if size <= WINDOW_SIGNAL_BYTES && stored.is_ok() {
            // A small file's answer is the server's delay, as step 2's is (`pacing`).
            fs.uploads.pacing.window.answered(asked.elapsed());
        }
        match stored {
            Err(e) if e.kind == ErrorKind::BadRequest && staged.generation() != generation => {
                // Written to while being sent (the checksum did not match): the next round.
                return Ok(());
            }
            other => Some(other?),
        }
    } else {
        let id = match remote_id {
            Some(id) => id,
            None => {
                let file = fs.backend.create_file(&parent, &name).await?;
                let id = file
                    .file_id()
                    .ok_or_else(|| Error::internal("create_file returned no file ID"))?;
                fs.nodes.update_from(ino, &file);
                id
            }
        };
        let asked = std::time::Instant::now();
        let ticket = fs
            .backend
            .begin_version_with(&id, size, md5.as_deref(), attrs, &staged.base())
            .await?;
        fs.uploads.pacing.window.answered(asked.elapsed());
        let vid = ticket
            .version_id()
            .ok_or_else(|| Error::internal("upload step 2 returned no version"))?;
        let uploaded = fs.backend.upload(&id, &vid, size, body()?).await;
        fs.uploads.tracker.done(ino);
        match uploaded {
            Err(e) if e.kind == ErrorKind::BadRequest && staged.generation() != generation => {
                // Written to while being sent: the checksum did not match; the next round sends
                // the new bytes.
                return Ok(());
            }
            other => {
                let node = other?;
                if let Some(m) = md5
                    .as_deref()
                    .filter(|_| staged.base() != crate::api::Base::Any)
                {
                    if fs.committed_after(&ticket, &path, m).await {
                        // Overwritten right after by another writer: these bytes go to a
                        // conflict copy (the run resolves it as a refusal).
                        return Err(staged.base().conflict(&path.to_string()));
                    }
                }
                Some(node)
            }
        }
    };
    log::info!("uploaded {path} ({size} bytes)");
    if fs.upload_answered(ino, &staged, generation, node.as_ref(), Some(attrs)) {
        fs.journal.finish(&staged);
    }
    Ok(())
}
