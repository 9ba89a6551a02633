//! Write-back in batches, for a backend that stores whole files together
//! ([`crate::backend::Batches`]: the built-in store in this process, and our server, whose
//! batches take small files). Closed files wait in a queue; one worker takes everything queued
//! (up to the backend's bounds) and stores it with one `put_files` call, whose durable work
//! (fsyncs, the transaction, a server's round trip) is paid once per batch. While a batch is
//! stored the next one gathers, so the batch size follows the load: one file when idle,
//! hundreds in a burst.
//!
//! The staged file is sealed for the batch (the store may keep that very file as its blob); a
//! writer that comes back later writes to a copy (`Staged::seal`). Backends without batches
//! upload file by file (`upload.rs`); both end in `Fs::stored` (`staging/lifecycle.rs`).
//!
//! The queue's place in the file system's lock order: after a file's `io`, before the
//! `uploading` set and the inode table (see `fs`, "Locks").

use std::sync::Arc;
use std::time::Duration;

use super::Fs;
use super::staging::lifecycle::ToStore;
use super::staging::{Next, Staged};
use super::table::Ino;
use crate::api::{Error, ErrorKind};
use crate::backend::Backend;

pub(super) mod queue;

/// During a burst, batches start at most this often unless an fsync waits. A batch's durable
/// work (a journal commit for the blobs, one for the WAL) costs the same for 5 files as for
/// 500, and while it runs it holds up every other metadata change on the file system, the
/// staging files of the next creates included. Gathering for a few milliseconds turns a
/// burst of 5,000 files from a thousand small batches into a hundred large ones. An idle
/// mount stores a closed file at once: the pause applies only right after a batch.
const BURST_GATHER: Duration = Duration::from_millis(10);

/// Starts the worker (once per mount; it works only for backends with batches).
pub fn start<B: Backend>(fs: &Arc<Fs<B>>) {
    let fs = fs.clone();
    fs.rt.clone().spawn(async move {
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            if let Some(at) = last.take() {
                let urgent = fs.uploads.writeback.urgent.notified();
                if !fs.uploads.writeback.has_waiters() {
                    tokio::select! {
                        () = tokio::time::sleep_until(at + BURST_GATHER) => {}
                        () = urgent => {}
                    }
                }
            }
            let Some(storing) = fs.uploads.storing() else {
                return; // the next daemon stores the rest (see `fs::mount`)
            };
            let batch = fs.uploads.writeback.take(&fs);
            if batch.is_empty() {
                drop(storing);
                fs.uploads.writeback.wake.notified().await;
                continue;
            }
            last = Some(tokio::time::Instant::now());
            run_batch(&fs, batch).await;
            drop(storing);
        }
    });
}

/// fsync: the file goes into the next batch, and this returns once the bytes of `copy` as they
/// are now are stored (true), or the attempt failed (false).
pub async fn flush<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino, copy: &Arc<Staged>) -> bool {
    let rx = fs.uploads.writeback.wait_for(ino, copy);
    fs.uploads.writeback.urgent.notify_one();
    fs.uploads.to_batch(ino);
    rx.await.unwrap_or(false)
}

/// One file of a batch, held (its `io` lock) until the batch is done.
struct Item {
    ino: Ino,
    staged: Arc<Staged>,
    generation: u64,
    size: u64,
    /// The times and mode sent with the bytes (what a server did not keep is kept here).
    attrs: crate::api::FileAttrs,
    _io: tokio::sync::OwnedMutexGuard<()>,
}

async fn run_batch<B: Backend>(fs: &Arc<Fs<B>>, batch: Vec<(Ino, bool)>) {
    let mut items = Vec::with_capacity(batch.len());
    let mut puts = Vec::with_capacity(batch.len());
    let mut busy = Vec::new();
    let mut unsure = Vec::new();
    // A file saved by a rename takes its history back first (`history`), before any of the
    // batch's `io` locks is held: the renamed file may be in the batch too.
    for &(ino, _) in &batch {
        fs.continue_document(ino).await;
    }
    let mut held = Vec::new();
    let bounds = fs.backend.batches().map(|b| b.batch_bounds());
    for (ino, fsync) in batch {
        // Grown past what a batch takes since it was queued: a task of its own.
        let size = fs.nodes.staged(ino).map_or(0, |s| s.size());
        if bounds.is_some_and(|b| size > b.file) {
            fs.uploads.writeback.succeeded(ino);
            super::upload::one_by_one(fs, ino);
            continue;
        }
        let Some(io) = fs.nodes.io(ino) else {
            finished(fs, ino, true);
            continue;
        };
        // A temporary copy about to take a document's name waits for it (`history`); an
        // fsync does not.
        if let Some(wait) = fs.held_back(ino).filter(|_| !fsync) {
            held.push((ino, wait));
            continue;
        }
        // A rename or unlink of this file is under way: it goes in a later batch.
        let Ok(guard) = io.try_lock_owned() else {
            busy.push(ino);
            continue;
        };
        match fs.to_store(ino, fsync) {
            ToStore::Nothing { clean } => finished(fs, ino, clean),
            ToStore::Failed(e) => {
                drop(guard);
                failed(fs, ino, &Error::from(e));
            }
            ToStore::Compare {
                staged,
                generation,
                size,
                stored,
            } => {
                let item = Item {
                    ino,
                    staged,
                    generation,
                    size,
                    attrs: Default::default(),
                    _io: guard,
                };
                unsure.push((item, stored));
            }
            ToStore::Send {
                staged,
                generation,
                size,
                put,
            } => {
                let attrs = put.attrs;
                puts.push(put);
                items.push(Item {
                    ino,
                    staged,
                    generation,
                    size,
                    attrs,
                    _io: guard,
                });
            }
        }
    }
    for (ino, wait) in held {
        enqueue_after(fs, vec![ino], wait);
    }
    if !busy.is_empty() {
        enqueue_after(fs, busy, Duration::from_millis(20));
    }
    let mut retired = Vec::new();
    if !unsure.is_empty() {
        same_as_stored(fs, unsure, &mut retired).await;
    }
    if puts.is_empty() {
        end_entries(fs, retired).await;
        return;
    }
    let results = match fs.backend.batches() {
        Some(store) => store.put_files(puts).await,
        // (Never: only a backend with batches has files queued, see `upload::schedule`.)
        None => (puts.iter())
            .map(|_| Err(Error::internal("no batches")))
            .collect(),
    };
    // A server away: offline until a batch goes through (as the one-by-one uploads say it);
    // one that went through lets those waiting for room at the server go again (`pacing`).
    let remote = fs.backend.local().is_none();
    if remote {
        match results.iter().find_map(|r| r.as_ref().err()) {
            Some(e) if e.kind == ErrorKind::Network => {
                fs.offline.note_unreachable(Duration::from_secs(2))
            }
            _ => fs.offline.note_reachable(),
        }
        if results.iter().any(Result::is_ok) {
            fs.uploads.pacing.window.succeeded();
        }
    }
    for (item, result) in items.into_iter().zip(results) {
        match result {
            Ok(node) => {
                fs.uploads.writeback.succeeded(item.ino);
                log::debug!("stored inode {} ({} bytes)", item.ino, item.size);
                let (staged, generation) = (&item.staged, item.generation);
                let attrs = Some(item.attrs).filter(|_| remote);
                if fs.upload_answered(item.ino, staged, generation, Some(&node), attrs) {
                    retired.push(item.staged.clone());
                }
                fs.uploads.writeback.answer(item.ino, None);
                // Written to again and closed since: it goes in the next batch.
                let again = item.staged.waits_for_upload();
                drop(item._io);
                if again {
                    fs.uploads.writeback.enqueue(item.ino);
                } else {
                    finished(fs, item.ino, !item.staged.is_dirty());
                }
            }
            Err(_) if item.staged.removal().is_cancelled() => {
                // Removed meanwhile (`Fs::remove` waits for this file's lock, then goes on):
                // nothing to retry. A removal that fails after all queues it again.
                log::debug!("inode {}: removed while being stored", item.ino);
                let ino = item.ino;
                drop(item._io);
                finished(fs, ino, true);
            }
            Err(e) if matches!(e.kind, ErrorKind::Precondition | ErrorKind::NotFound) => {
                // A conflict, or the file deleted elsewhere: stored as a copy, or again, in a
                // later batch (fsync waits for that); else the retry policy decides.
                let (ino, copy) = (item.ino, item.staged.clone());
                drop(item._io);
                let fs = fs.clone();
                fs.rt.clone().spawn(async move {
                    if fs.resolve_refusal(ino, &e).await {
                        fs.uploads.writeback.enqueue(ino);
                    } else {
                        fs.uploads.writeback.answer(ino, Some(&copy));
                        failed(&fs, ino, &e);
                    }
                });
            }
            Err(e) => {
                fs.uploads.writeback.answer(item.ino, Some(&item.staged));
                let ino = item.ino;
                drop(item._io);
                failed(fs, ino, &e);
            }
        }
    }
    end_entries(fs, retired).await;
}

/// `inos` go in a batch again after `wait`.
fn enqueue_after<B: Backend>(fs: &Arc<Fs<B>>, inos: Vec<Ino>, wait: Duration) {
    let fs = fs.clone();
    fs.rt.clone().spawn(async move {
        tokio::time::sleep(wait).await;
        for ino in inos {
            fs.uploads.writeback.enqueue(ino);
        }
    });
}

/// The journal entries of retired files end: a write and an unlink per file, file system work
/// off the runtime's threads.
async fn end_entries<B: Backend>(fs: &Arc<Fs<B>>, retired: Vec<Arc<Staged>>) {
    if retired.is_empty() {
        return;
    }
    let journal_fs = fs.clone();
    let ended = tokio::task::spawn_blocking(move || {
        journal_fs.journal.finish_all(retired.iter().map(|s| &**s));
    });
    if let Err(e) = ended.await {
        log::error!("ending journal entries failed: {e}");
    }
}

/// Files of `unsure` generations (see `Staged::kernel_changed`): those whose bytes are the
/// stored version's are clean without storing anything (storing them again would make a new
/// version of old bytes, over one another client stored meanwhile); the others go in the next
/// batch. Compared byte for byte with the stored version where it is whole on local disk (the
/// built-in store's blob, a complete read-cache file: a `dd conv=fsync` of 512 MiB then costs
/// 0.1 s at its close, not an md5 of 0.7 s), else by md5.
async fn same_as_stored<B: Backend>(
    fs: &Arc<Fs<B>>,
    unsure: Vec<(Item, (String, u64))>,
    retired: &mut Vec<Arc<Staged>>,
) {
    let mut files = Vec::with_capacity(unsure.len());
    for (item, known) in &unsure {
        let remote = fs.nodes.remote(item.ino);
        let local = match remote.filter(|r| r.md5.as_ref() == Some(&known.0)) {
            Some(r) => fs.local_source(&r).await.map(|(_, source)| source),
            None => None,
        };
        files.push((item.staged.clone(), known.clone(), local));
    }
    let same = tokio::task::spawn_blocking(move || {
        files
            .iter()
            .map(|(s, (md5, size), local)| match local {
                Some(stored) => s.same_bytes_as(stored.file(), *size).unwrap_or(false),
                None => s.is_version(md5, *size),
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for ((item, _), same) in unsure.into_iter().zip(same) {
        let Item {
            ino,
            staged,
            generation,
            _io: guard,
            ..
        } = item;
        if same {
            if fs.stored_already(ino, &staged, generation) {
                retired.push(staged.clone());
            }
            fs.uploads.writeback.answer(ino, None);
            drop(guard);
            finished(fs, ino, !staged.is_dirty());
        } else {
            Fs::<B>::found_changed(&staged);
            drop(guard);
            fs.uploads.writeback.enqueue(ino);
        }
    }
}

/// A failed attempt: tried again as `staging::retry` says, or set aside.
fn failed<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino, e: &Error) {
    let path = fs.nodes.describe(ino);
    fs.uploads.tracker.error(format!("upload of {path}: {e}"));
    let next = fs.uploads.writeback.failed(ino, e);
    let wait = match next {
        Next::After(wait) => wait,
        Next::SetAside => {
            fs.uploads.writeback.succeeded(ino);
            fs.set_aside(ino, e);
            fs.uploads.writeback.answer(ino, None);
            finished(fs, ino, false);
            return;
        }
    };
    log::warn!(
        "storing {path} failed, retrying in {:.1}s: {e}",
        wait.as_secs_f64()
    );
    let (fs, e) = (fs.clone(), e.clone());
    fs.rt.clone().spawn(async move {
        // A server away, or full: tried again once it answers (`offline`), or once an upload
        // goes through (`pacing`), not after the whole wait.
        tokio::select! {
            () = fs.uploads.pacing.window.backs_off(wait, &e) => {}
            () = fs.offline.reconnected.notified() => {}
        }
        fs.uploads.writeback.enqueue(ino);
    });
}

/// The file leaves the write-back: `clean` when nothing is left to store (its fsync callers
/// whose copy says so are answered), else its release will queue it again.
fn finished<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino, clean: bool) {
    if clean {
        fs.uploads.writeback.answer(ino, None);
    }
    fs.uploads.batch_ended(ino);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::table::ROOT;
    use crate::fs::tests::{TTL, harness};

    /// A batch that stored the file's previous copy ends (`finished`, clean) after the next
    /// copy's fsync began waiting: that fsync learns nothing from it, and returns true only
    /// once its own bytes are stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_fsync_is_answered_by_its_own_copy_only() {
        let h = harness(false, TTL);
        let ino = h.write_file(ROOT, "f.txt", b"one").await;
        let opened =
            h.fs.open(ino, fuser::OpenFlags(libc::O_RDWR))
                .await
                .unwrap();
        assert_eq!(h.fs.write(opened.fh, 0, b"two"), Ok(3));
        let copy = h.fs.writing(opened.fh).unwrap();
        let wb = &h.fs.uploads.writeback;
        let mut rx = wb.wait_for(ino, &copy);

        // The end of the batch that stored "one".
        finished(&h.fs, ino, true);
        assert!(
            rx.try_recv().is_err(),
            "answered before its bytes were sent"
        );
        // Another copy failing is not this one's failure either.
        let other = h.fs.journal.create(&h.vault, None, copy.base()).unwrap();
        wb.answer(ino, Some(&Arc::new(other)));
        assert!(rx.try_recv().is_err());

        h.fs.release(opened.fh);
        h.fs.fsync(ino).await.unwrap();
        assert_eq!(rx.await, Ok(true));
        assert_eq!(h.stored("f.txt").await.as_deref(), Some(&b"two"[..]));
    }
}
