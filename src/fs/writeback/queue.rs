//! The write-back queue: the closed files waiting for the next batch, the fsync callers
//! waiting for their bytes, and the failures in a row of each file. The worker around it
//! (`writeback`) takes batches from it and stores them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

use crate::backend::Backend;
use crate::fs::Fs;
use crate::fs::staging::{Next, Retry, Staged};
use crate::fs::table::Ino;
use crate::sync::relock;

/// Most files in one batch, and at most half the descriptor pool's bound: a batch holds its
/// files open while it is stored (a copy of each too, where the store cannot link it), and under
/// `ulimit -n 1024` a batch of 1,024 ran the process out of descriptors.
const MAX_FILES: usize = 1024;

fn max_files() -> usize {
    MAX_FILES.min(crate::fs::descriptors::Pool::global().cap() / 2)
}
#[derive(Default)]
pub struct Writeback {
    queue: Mutex<Queue>,
    /// A file was queued.
    pub(super) wake: Notify,
    /// An fsync is waiting: a gathering pause ends at once.
    pub(super) urgent: Notify,
}

#[derive(Default)]
struct Queue {
    order: VecDeque<Ino>,
    queued: HashSet<Ino>,
    /// fsync callers waiting for a file's bytes: true once stored.
    waiters: HashMap<Ino, Vec<Waiter>>,
    /// Failed attempts in a row, per file.
    failures: HashMap<Ino, Retry>,
}

/// An fsync caller: the staged copy it synced and that copy's generation then. Answered by
/// what that very copy says (`Staged::synced`), never by news of another copy of the inode:
/// a batch that stored the copy before (retired since) once answered the fsync of the next
/// copy with true before its bytes were sent (the lifecycle test of an open joining a
/// settling copy, 3 runs in 150 under load).
pub(super) struct Waiter {
    copy: Arc<Staged>,
    need: u64,
    answer: oneshot::Sender<bool>,
}

impl Writeback {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        relock(&self.queue)
    }

    /// Whether `ino` waits for a batch.
    pub(in crate::fs) fn is_queued(&self, ino: Ino) -> bool {
        self.queue().queued.contains(&ino)
    }

    /// A batch stored `ino`, or gave up on it: its failures are forgotten.
    pub(super) fn succeeded(&self, ino: Ino) {
        self.queue().failures.remove(&ino);
    }

    /// A batch failed to store `ino` with `e`: when to try again, as the retry policy says.
    pub(super) fn failed(&self, ino: Ino, e: &crate::api::Error) -> Next {
        self.queue().failures.entry(ino).or_default().failed(e)
    }

    /// Queues `ino` for the next batch (once, however often it is asked).
    pub fn enqueue(&self, ino: Ino) {
        let mut q = self.queue();
        if q.queued.insert(ino) {
            q.order.push_back(ino);
        }
        drop(q);
        self.wake.notify_one();
    }

    /// An fsync of `ino` waits for the bytes of `copy` as they are now: true once stored, false
    /// when the attempt failed.
    pub(super) fn wait_for(&self, ino: Ino, copy: &Arc<Staged>) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            copy: copy.clone(),
            need: copy.generation(),
            answer: tx,
        };
        self.queue().waiters.entry(ino).or_default().push(waiter);
        rx
    }

    pub(super) fn has_waiters(&self) -> bool {
        !self.queue().waiters.is_empty()
    }

    /// Takes what the next batch holds, within the bounds.
    pub(super) fn take<B: Backend>(&self, fs: &Fs<B>) -> Vec<(Ino, bool)> {
        let mut q = self.queue();
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let max_bytes = fs.backend.batches().map_or(0, |b| b.batch_bounds().total);
        while let Some(&ino) = q.order.front() {
            let size = fs
                .nodes
                .inode(ino, |i| i.staged.as_ref().map(|s| s.size()))
                .flatten()
                .unwrap_or(0);
            if !out.is_empty() && (out.len() >= max_files() || bytes + size > max_bytes) {
                break;
            }
            q.order.pop_front();
            q.queued.remove(&ino);
            bytes += size;
            out.push((ino, q.waiters.contains_key(&ino)));
        }
        out
    }

    /// Answers the fsync callers of `ino` whose copy is stored (true) or set aside (false);
    /// those of copy `failed` (an attempt to store it failed) with false. The others wait on.
    pub(super) fn answer(&self, ino: Ino, failed: Option<&Arc<Staged>>) {
        let mut q = self.queue();
        let Some(waiters) = q.waiters.remove(&ino) else {
            return;
        };
        let mut left = Vec::new();
        for w in waiters {
            let now = match failed {
                Some(f) if Arc::ptr_eq(f, &w.copy) => Some(false),
                _ => w.copy.synced(w.need),
            };
            match now {
                Some(stored) => drop(w.answer.send(stored)),
                None => left.push(w),
            }
        }
        if !left.is_empty() {
            q.waiters.insert(ino, left);
        }
    }
}
