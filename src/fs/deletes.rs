//! Write-back deletes: an UNLINK of a stored file is answered once the name has left the
//! table; the store's delete goes with the next batch. `rm -rf` waits for each unlink before
//! the next, so a delete answered only after the store's round trip (a transaction of some
//! twenty WAL pages on the built-in store, a request over a server) made the store's latency
//! the whole cost of every file. Batched, the built-in store commits hundreds in one
//! transaction (`Store::delete_files_if`) and a server takes several requests at once, while
//! the kernel sends the next unlinks.
//!
//! **The store sees the mount's changes in their order.** Everything else this mount asks the
//! store that a pending delete could change the answer of waits until the deletes queued before
//! it are through ([`Deletes::settled`]): listings and lookups (the name would come back),
//! folders made and renames (a name taken, a file replaced), and uploads, which may make a file
//! under a name just deleted and continue its document (`history`). Reads by document ID do
//! not wait.
//!
//! **Each delete keeps its conditions.** It is sent with the version this mount knew
//! (`Base`): an edit made elsewhere meanwhile beats it, as before. A delete the store refuses
//! (that edit; a folder made under the name; the store failing, again after a few tries) leaves
//! the file where it was, and the folder is listed again at its next use: the name comes back.
//!
//! **A crash loses nothing.** Pending deletes live in memory only: a daemon killed before they
//! were sent leaves those files on the store, and the next mount shows them again. An unmount
//! sends them first (within the flush timeout, as uploads).
//!
//! Only files stored and not being uploaded go this way, and only where the store checks the
//! version in the delete itself (`Backend::checks_deletes`); folders, and a built-in store that
//! another process has open (which sees only what is stored), are deleted at once as before.

use std::sync::{Arc, Mutex};

use super::Fs;
use crate::api::{Base, Error, ErrorKind, NodePath};
use crate::backend::Backend;
use crate::sync::relock;

/// The most deletes one batch sends: a transaction of the built-in store stays short, so a
/// listing or an upload that waits for the deletes waits for little more than one batch.
const MAX_BATCH: usize = 512;

/// A delete answered here and not yet made on the store.
pub(super) struct Pending {
    pub(super) path: NodePath,
    /// The version this mount knew: the store deletes only that.
    pub(super) base: Base,
    /// The file's ID, to take back what the table remembers of its name (`vacate_deleted`).
    pub(super) id: Option<String>,
}

/// The queue of pending deletes and its worker's count.
pub(super) struct Deletes {
    queue: Mutex<Vec<Pending>>,
    /// Deletes queued or being sent: what a barrier waits to see at zero.
    outstanding: tokio::sync::watch::Sender<usize>,
    wake: tokio::sync::Notify,
}

impl Default for Deletes {
    fn default() -> Self {
        Deletes {
            queue: Mutex::new(Vec::new()),
            outstanding: tokio::sync::watch::Sender::new(0),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl Deletes {
    /// Queues a delete (its unlink is answered next).
    pub(super) fn push(&self, p: Pending) {
        // Counted before it is visible to the worker, so the count never goes below zero.
        self.outstanding.send_modify(|n| *n += 1);
        relock(&self.queue).push(p);
        self.wake.notify_one();
    }

    /// Returns once every delete queued before the call is made on the store (or refused).
    pub(super) async fn settled(&self) {
        if *self.outstanding.borrow() == 0 {
            return;
        }
        let mut rx = self.outstanding.subscribe();
        // The sender lives as long as `self`: wait_for fails only when it is gone.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Whether deletes are queued or being sent.
    pub(super) fn pending(&self) -> usize {
        *self.outstanding.borrow()
    }

    fn take(&self) -> Vec<Pending> {
        let mut q = relock(&self.queue);
        let n = q.len().min(MAX_BATCH);
        q.drain(..n).collect()
    }

    fn sent(&self, n: usize) {
        self.outstanding.send_modify(|c| *c -= n);
    }
}

/// Starts the worker (once per mount): a batch of what is queued at a time, so the batches grow
/// with the rate of unlinks (one when idle, hundreds through an `rm -rf`).
pub(super) fn start<B: Backend>(fs: &Arc<Fs<B>>) {
    let fs = fs.clone();
    fs.rt.clone().spawn(async move {
        loop {
            let batch = fs.deletes.take();
            if batch.is_empty() {
                fs.deletes.wake.notified().await;
                continue;
            }
            let n = batch.len();
            send(&fs, batch).await;
            fs.deletes.sent(n);
        }
    });
}

/// Sends `batch`; what failed for a passing reason (`error::is_transient`: the server away or
/// busy, which its HTTP client has already retried) goes again after [`RETRY_AFTER`], up to
/// [`ATTEMPTS`] times in all. Not for ever, as an upload is: what waits for the deletes (a
/// listing, an upload) would wait with them. What is still refused then stays on the store.
async fn send<B: Backend>(fs: &Arc<Fs<B>>, mut batch: Vec<Pending>) {
    for attempt in 1..=ATTEMPTS {
        let files = (batch.iter())
            .map(|p| (p.path.clone(), p.base.clone()))
            .collect();
        let results = fs.backend.delete_files_if(files).await;
        let mut again = Vec::new();
        for (i, p) in batch.into_iter().enumerate() {
            let r = results.get(i).cloned().unwrap_or_else(|| {
                Err(Error::internal("the store gave no answer for this delete"))
            });
            match r {
                // Gone already counts as deleted.
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) if attempt < ATTEMPTS && super::error::is_transient(&e) => {
                    log::info!("{}: delete failed ({e}); trying again", p.path);
                    again.push(p);
                }
                Err(e) => fs.delete_refused(&p, &e),
            }
        }
        if again.is_empty() {
            return;
        }
        tokio::time::sleep(RETRY_AFTER * attempt).await;
        batch = again;
    }
}

/// Sends of a delete that fails for a passing reason, and the wait before the second (the
/// third waits twice as long).
const ATTEMPTS: u32 = 3;
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl<B: Backend> Fs<B> {
    /// Whether the unlink of a stored file may be answered before the store's delete (see the
    /// module's text for which may).
    pub(super) fn deletes_later(&self, uploading: bool) -> bool {
        !uploading
            && self.backend.checks_deletes()
            && self.backend.local().is_none_or(|l| !l.shared())
    }

    /// Waits for the deletes queued before (see "The store sees the mount's changes in their
    /// order").
    pub(super) async fn deletes_sent(&self) {
        self.deletes.settled().await;
    }

    /// A pending delete the store refused: the file stays, and its name comes back at the
    /// folder's next listing.
    fn delete_refused(&self, p: &Pending, e: &Error) {
        if e.kind == ErrorKind::Precondition {
            log::warn!(
                "{} was changed elsewhere just now; not deleted from the store (an edit beats \
                 a delete)",
                p.path
            );
        } else {
            log::error!(
                "{} could not be deleted from the store: {e}; it stays",
                p.path
            );
        }
        self.nodes.delete_undone(&p.path, p.id.as_deref());
    }
}
