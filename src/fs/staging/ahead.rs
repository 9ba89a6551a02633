//! Hashing ahead: md5 and sha256 of the bytes written so far, computed in the background while
//! sequential writes arrive, so an upload reads only what is not hashed yet. Never for a file
//! the kernel writes itself (see `kernel`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::Staged;
use crate::api::checksum::Digests;
use crate::sync::{relock, unpoisoned};

/// The hashing-ahead state, shared with the hasher task, which holds the staged file only
/// while it reads a chunk: a file removed while being hashed gives its space back at once.
#[derive(Default)]
pub(super) struct Ahead {
    pub(super) state: Mutex<HashAhead>,
    pub(super) idle: Condvar,
}

impl Ahead {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashAhead> {
        relock(&self.state)
    }

    /// Stops a running hasher after its current chunk and waits for it to be gone.
    pub(super) fn pause(&self) -> MutexGuard<'_, HashAhead> {
        let mut a = self.lock();
        a.stop = true;
        while a.running {
            a = unpoisoned(self.idle.wait(a));
        }
        a.stop = false;
        a
    }
}

/// Hashing ahead of the upload. The invariant: bytes below `reading_to` are never changed
/// while `valid` holds. A change below it (an overwrite, a cut) ends the hashing until the
/// file is emptied; appends, the sequential writer's case, go on. The hasher never reads the
/// range of a change in progress (`changing`).
#[derive(Default)]
pub(super) struct HashAhead {
    pub(super) valid: bool,
    /// The prefix hashed so far (taken out while a hasher works on it).
    pub(super) digests: Option<Digests>,
    /// Hashed, or being hashed, up to here.
    pub(super) reading_to: u64,
    /// The offset of a change under way (changes are ordered by `Staged::order`).
    pub(super) changing: Option<u64>,
    /// Bumped when the prefix is dropped or restarted: a hasher's work from before is void.
    pub(super) epoch: u64,
    pub(super) running: bool,
    /// An upload wants the prefix now: the hasher stops after its current chunk.
    pub(super) stop: bool,
}

/// The hasher starts once this much is written and not hashed (small files are hashed at
/// upload, from the page cache, in less time than a task takes to start).
const HASH_AHEAD_FROM: u64 = 8 << 20;
/// What the hasher reads at a time (between chunks it checks for a waiting upload).
const HASH_CHUNK: u64 = 4 << 20;

impl Staged {
    pub(super) fn ahead(&self) -> MutexGuard<'_, HashAhead> {
        self.ahead.lock()
    }

    /// Before a change of the bytes from `offset` on (with `order` held).
    pub(super) fn begin_change(&self, offset: u64) {
        let mut a = self.ahead();
        if a.valid && offset < a.reading_to {
            a.valid = false;
            a.digests = None;
            a.epoch += 1;
        }
        a.changing = Some(offset);
    }

    pub(super) fn end_change(&self) {
        self.ahead().changing = None;
    }

    /// A hasher to run on a blocking thread, when one should start now: once enough is
    /// written and not hashed, and none runs. It hashes what is written a chunk at a time until
    /// it has caught up (or an upload wants the prefix, or a change voids it).
    pub fn hash_ahead(self: &Arc<Self>) -> Option<impl FnOnce() + Send + 'static> {
        {
            let mut a = self.ahead();
            let start = a.valid
                && !self.kernel_wrote.load(Ordering::SeqCst)
                && !a.running
                && self.size().saturating_sub(a.reading_to) >= HASH_AHEAD_FROM;
            if !start {
                return None;
            }
            a.running = true;
        }
        let (staged, ahead) = (Arc::downgrade(self), self.ahead.clone());
        Some(move || {
            while let Some(s) = staged.upgrade() {
                if !s.hash_chunk() {
                    break;
                }
            }
            ahead.lock().running = false;
            ahead.idle.notify_all();
        })
    }

    /// One chunk of `hash_ahead`; false when there is nothing (more) to do.
    fn hash_chunk(&self) -> bool {
        let (mut d, to, epoch) = {
            let mut a = self.ahead();
            let limit = a.changing.unwrap_or(u64::MAX).min(self.size());
            let d = match a.digests.take() {
                Some(d) if a.valid && !a.stop && d.len() < limit => d,
                d => {
                    a.digests = d;
                    return false;
                }
            };
            let to = limit.min(d.len() + HASH_CHUNK);
            a.reading_to = to;
            (d, to, a.epoch)
        };
        let read = self.file().and_then(|f| d.extend_from(&f, to));
        let mut a = self.ahead();
        if a.epoch == epoch {
            match read {
                Ok(()) => a.digests = Some(d),
                Err(e) => {
                    log::debug!("hashing staged file {} ahead: {e}", self.id);
                    a.valid = false;
                }
            }
        }
        true
    }

    /// The digests of the first bytes of the file, for an upload to finish; `None` when they
    /// are not known. Taken with `order` held, as the snapshot is: a later change cannot slip in.
    pub(super) fn digests(&self) -> Option<Digests> {
        let a = self.ahead.pause();
        let known = a.valid && !self.kernel_wrote.load(Ordering::SeqCst);
        if known { a.digests.clone() } else { None }
    }

    /// The file is done with (stored, or removed): a hasher still reading it stops.
    pub fn stop_hashing(&self) {
        let mut a = self.ahead.pause();
        a.valid = false;
        a.digests = None;
        a.epoch += 1;
    }
}
