//! Empty staging files made ahead of need, by a thread of their own.
//!
//! Creating a file on ext4 usually takes 15 us, but now and then it waits several milliseconds
//! behind a journal commit, and during a burst of small files the store's batches commit one
//! every few milliseconds on the same file system. A create made by the process that is
//! writing pays each of those waits; a spare made here beforehand does not.
//!
//! IDs stay in the order of use: every ID is taken, and its file made, under one lock (`make`),
//! and spares are handed out first in, first out, so a file staged later always has the larger
//! ID, which is what the journal's recovery counts on to find the newest of two entries.
//!
//! A spare has no journal entry: if the daemon dies, the next mount's recovery removes it with
//! every other staging file that belongs to nothing. The thread starts with the first file
//! staged, after that recovery ran.

use crate::sync::{relock, unpoisoned};
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::Duration;

/// Spares kept ready (made, then closed: a staged file opens its own when used, see
/// `descriptors`): enough for a burst of a few thousand files a
/// second to ride out the thread's own creates waiting on journal commits for tens of
/// milliseconds (with 128, an off-CPU trace of a 5,000-file burst still showed creates waiting
/// for the thread; with 512, none).
const READY: usize = 512;
/// The thread makes more once fewer than this are left.
const REFILL_BELOW: usize = 480;

/// One empty staging file: its ID and its name.
pub struct Spare {
    pub id: u64,
    pub path: PathBuf,
}

pub struct Spares {
    dir: PathBuf,
    next: AtomicU64,
    ready: Mutex<VecDeque<Spare>>,
    /// Held while an ID is taken and its file made (see the module's comment).
    make: Mutex<()>,
    low: Condvar,
    stop: AtomicBool,
    started: Once,
}

impl Spares {
    /// Spares in `dir` (the staging folder), IDs from `next` on.
    pub fn new(dir: PathBuf, next: u64) -> Arc<Spares> {
        Arc::new(Spares {
            dir,
            next: AtomicU64::new(next),
            ready: Mutex::default(),
            make: Mutex::default(),
            low: Condvar::new(),
            stop: AtomicBool::new(false),
            started: Once::new(),
        })
    }

    /// An empty staging file: a spare when one is ready, else one made now.
    pub fn take(self: &Arc<Self>) -> io::Result<Spare> {
        self.started.call_once(|| self.start());
        if let Some(s) = self.pop() {
            return Ok(s);
        }
        let _make = relock(&self.make);
        // Made meanwhile by the thread (it held `make`): older than any ID taken now.
        if let Some(s) = self.pop() {
            return Ok(s);
        }
        self.make_one()
    }

    fn pop(&self) -> Option<Spare> {
        let mut ready = relock(&self.ready);
        let s = ready.pop_front();
        if ready.len() < REFILL_BELOW {
            self.low.notify_one();
        }
        s
    }

    /// Takes the next ID and makes its file (with `make` held).
    fn make_one(&self) -> io::Result<Spare> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let path = self.dir.join(format!("{id}.data"));
        crate::api::files::new_private(&path)?;
        Ok(Spare { id, path })
    }

    fn start(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("staging-spares".into())
            .spawn(move || {
                while let Some(s) = me.upgrade() {
                    if !s.refill() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("no thread for spare staging files ({e}); each create makes its own");
        }
    }

    /// Waits until spares are wanted, then makes them; false once stopped.
    fn refill(&self) -> bool {
        {
            let ready = relock(&self.ready);
            let ready = unpoisoned(self.low.wait_timeout_while(
                ready,
                Duration::from_secs(1),
                |r| r.len() >= REFILL_BELOW && !self.stop.load(Ordering::SeqCst),
            ))
            .0;
            if ready.len() >= REFILL_BELOW {
                return !self.stop.load(Ordering::SeqCst);
            }
        }
        while !self.stop.load(Ordering::SeqCst) && relock(&self.ready).len() < READY {
            let made = {
                let _make = relock(&self.make);
                self.make_one().map(|s| relock(&self.ready).push_back(s))
            };
            if let Err(e) = made {
                // ENOSPC, EMFILE: the creates that need a file meet the error themselves.
                log::debug!("cannot make a spare staging file: {e}");
                std::thread::sleep(Duration::from_millis(100));
                break;
            }
        }
        !self.stop.load(Ordering::SeqCst)
    }

    /// Stops the thread and removes the spares not handed out.
    pub fn shut(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.low.notify_all();
        let _make = relock(&self.make);
        for s in relock(&self.ready).drain(..) {
            let _ = std::fs::remove_file(&s.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_handed_out_in_order_and_leftovers_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = Spares::new(tmp.path().to_path_buf(), 7);
        let mut last = 0;
        for _ in 0..(READY * 3) {
            let s = spares.take().unwrap();
            assert!(s.id > last, "{} after {last}", s.id);
            assert_eq!(std::fs::metadata(&s.path).unwrap().len(), 0);
            assert!(s.path.exists());
            last = s.id;
        }
        assert!(last >= 7);
        // Let the thread fill up, then stop it: only the files handed out stay.
        std::thread::sleep(Duration::from_millis(200));
        spares.shut();
        let left = std::fs::read_dir(tmp.path()).unwrap().count();
        assert_eq!(left, READY * 3);
    }
}
