//! The two queues of preview jobs (asked for, background) and what the request path, the
//! commit path and the threads share: which job is next, whether the store is busy, the
//! counters of [`super::PreviewStats`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{IDLE_AFTER, Job, PreviewMode, key};
use crate::preview::PreviewKind;
use crate::sync::{relock, unpoisoned};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Tier {
    Asked,
    Background,
}

#[derive(Default)]
pub(super) struct Jobs {
    /// Asked for, the latest request at the front.
    pub(super) asked: VecDeque<Job>,
    /// Every version stored, the newest at the back (taken first); entries whose `queued` tier
    /// is no longer Background are stale and skipped.
    pub(super) background: VecDeque<Job>,
    pub(super) queued: HashMap<String, Tier>,
    /// Asked-for jobs being rendered (blob -> threads on it).
    pub(super) running: HashMap<String, usize>,
    /// Background jobs taken and not yet done.
    pub(super) background_running: u64,
    /// The store was closed: the threads end.
    pub(super) closed: bool,
}

/// The queues and what the request path, the commit path and the threads share.
pub(super) struct Shared {
    pub(super) jobs: Mutex<Jobs>,
    pub(super) more: Condvar,
    pub(super) mode: PreviewMode,
    pub(super) cache_size: u64,
    pub(super) born: Instant,
    /// Milliseconds after `born` (plus one) of the last write; 0: none yet.
    pub(super) activity: AtomicU64,
    pub(super) requested_started: AtomicU64,
    pub(super) background_started: AtomicU64,
    pub(super) background_yielded: AtomicU64,
    pub(super) first_background_ns: AtomicI64,
    pub(super) last_background_ns: AtomicI64,
    pub(super) evicted: AtomicU64,
    /// The bytes of ready previews (all, unrequested), when summed last and as this process
    /// changed them since (`cache::preview_bytes_seen`).
    pub(super) bytes_seen: Mutex<Option<(Instant, u64, u64)>>,
}

impl Shared {
    pub(super) fn new(mode: PreviewMode, cache_size: u64) -> Shared {
        Shared {
            jobs: Mutex::default(),
            more: Condvar::new(),
            mode,
            cache_size,
            born: Instant::now(),
            activity: AtomicU64::new(0),
            requested_started: AtomicU64::new(0),
            background_started: AtomicU64::new(0),
            background_yielded: AtomicU64::new(0),
            first_background_ns: AtomicI64::new(0),
            last_background_ns: AtomicI64::new(0),
            evicted: AtomicU64::new(0),
            bytes_seen: Mutex::new(None),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Jobs> {
        relock(&self.jobs)
    }

    pub(super) fn note_activity(&self) {
        let ms = self.born.elapsed().as_millis() as u64 + 1;
        self.activity.fetch_max(ms, Ordering::Relaxed);
    }

    /// How much longer the background has to wait for the writes to be over (None: idle).
    pub(super) fn writes_for(&self) -> Option<Duration> {
        let at = self.activity.load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        let since = self
            .born
            .elapsed()
            .saturating_sub(Duration::from_millis(at - 1));
        IDLE_AFTER.checked_sub(since).filter(|d| !d.is_zero())
    }

    pub(super) fn push_background(&self, job: Job) {
        let mut q = self.lock();
        let key = job.key();
        if q.closed || q.queued.contains_key(&key) || q.running.contains_key(&key) {
            return;
        }
        q.queued.insert(key, Tier::Background);
        // A thread only sleeps without a timeout on an empty queue (or until an asked-for job
        // ends, which wakes it): no wake-up per commit during a burst of writes.
        let wake = q.background.is_empty();
        q.background.push_back(job);
        if wake {
            self.more.notify_all();
        }
    }

    /// Moves an asked-for job to the front; true when there is one (queued or running).
    pub(super) fn bump(&self, key: &str) -> bool {
        let mut q = self.lock();
        if q.queued.get(key) == Some(&Tier::Asked) {
            if let Some(i) = q.asked.iter().position(|j| j.key() == key) {
                let job = q.asked.remove(i).expect("found");
                q.asked.push_front(job);
            }
            return true;
        }
        q.running.contains_key(key)
    }

    /// Queues a job somebody asked for at the front (taking it out of the background).
    pub(super) fn push_asked(&self, hash: &str, kind: PreviewKind, name: &str) {
        let key = key(hash, kind);
        let mut q = self.lock();
        if q.closed || q.running.contains_key(&key) {
            return;
        }
        if q.queued.get(&key) == Some(&Tier::Asked) {
            drop(q);
            self.bump(&key);
            return;
        }
        q.queued.insert(key, Tier::Asked);
        q.asked.push_front(Job {
            hash: hash.to_string(),
            kind,
            name: name.to_string(),
            asked: true,
        });
        self.more.notify_all();
    }

    /// The next asked-for job; None once the store is closed.
    pub(super) fn take_asked(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.asked.pop_front() {
                q.queued.remove(&job.key());
                *q.running.entry(job.key()).or_default() += 1;
                return Some(job);
            }
            q = unpoisoned(self.more.wait(q));
        }
    }

    pub(super) fn done_asked(&self, key: &str) {
        let mut q = self.lock();
        if let Some(n) = q.running.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                q.running.remove(key);
            }
        }
        self.more.notify_all();
    }

    /// The next background job, once nothing else wants the machine; None once closed.
    pub(super) fn take_background(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if q.asked.is_empty() && q.running.is_empty() && !q.background.is_empty() {
                if let Some(left) = self.writes_for() {
                    q = unpoisoned(self.more.wait_timeout(q, left)).0;
                    continue;
                }
                while let Some(job) = q.background.pop_back() {
                    if q.queued.get(&job.key()) == Some(&Tier::Background) {
                        q.queued.remove(&job.key());
                        q.background_running += 1;
                        return Some(job);
                    }
                }
                continue;
            }
            q = unpoisoned(self.more.wait(q));
        }
    }

    pub(super) fn done_background(&self) {
        let mut q = self.lock();
        q.background_running = q.background_running.saturating_sub(1);
    }

    /// Background jobs queued or being rendered.
    pub(super) fn background_pending(&self) -> u64 {
        let q = self.lock();
        let queued = q
            .queued
            .values()
            .filter(|t| **t == Tier::Background)
            .count();
        queued as u64 + q.background_running
    }

    /// A background job stops between pages when this is true.
    pub(super) fn busy(&self) -> bool {
        let q = self.lock();
        q.closed || !q.asked.is_empty() || !q.running.is_empty() || self.writes_for().is_some()
    }

    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.more.notify_all();
    }

    pub(super) fn closed(&self) -> bool {
        self.lock().closed
    }
}
