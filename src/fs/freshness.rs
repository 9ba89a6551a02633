//! Whether what the mount fetched from the store (a folder's listing, a node's attributes) may
//! still be used without asking again: younger than the listing TTL, and fetched after the last
//! change someone else made to the store, where the backend can tell at once (two mounts of one
//! built-in store see each other's renames at once: fstests generic/732). A server's changes by
//! other clients show once the TTL has run out; while the mount follows the server's change
//! feed (`follow`), which drops what a change makes stale, the TTL is [`FOLLOWED_TTL`].

use crate::sync::relock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The listing TTL while the change feed is followed: a listing is fresh until the feed says
/// it changed; this bounds what a change the feed never told (a bug) can hide.
pub(super) const FOLLOWED_TTL: Duration = Duration::from_secs(300);

pub(super) struct Freshness {
    ttl: Duration,
    /// The change feed answers (`follow`): listings live for [`FOLLOWED_TTL`].
    following: AtomicBool,
    /// The backend's count of others' changes seen last, and since when it has that value.
    seen: Mutex<(Option<u64>, Instant)>,
}

impl Freshness {
    pub(super) fn new(ttl: Duration) -> Freshness {
        Freshness {
            ttl,
            following: AtomicBool::new(false),
            seen: Mutex::new((None, Instant::now())),
        }
    }

    /// Whether the change feed answers (`follow`): listings live for [`FOLLOWED_TTL`] while
    /// it does.
    pub(super) fn following(&self, answers: bool) {
        self.following.store(answers, Ordering::Relaxed);
    }

    /// Whether something fetched at `at` is fresh; `foreign` reads the backend's count of
    /// others' changes (`LocalStore::foreign_changes`), only when the TTL leaves it to decide.
    pub(super) fn fresh(&self, at: Instant, foreign: impl FnOnce() -> Option<u64>) -> bool {
        if at.elapsed() >= self.ttl() {
            return false;
        }
        let Some(now) = foreign() else { return true };
        let mut seen = relock(&self.seen);
        match seen.0 {
            Some(v) if v == now => {}
            // The first count read says nothing about what came before it: what was fetched
            // before is fetched again (it was kept: a listing fetched after the mount came
            // up, before another process's change, answered for it, fstests generic/732).
            _ => *seen = (Some(now), Instant::now()),
        }
        at >= seen.1
    }

    /// The TTL now: a TTL of 0 (always ask) stays 0.
    fn ttl(&self) -> Duration {
        if self.following.load(Ordering::Relaxed) && !self.ttl.is_zero() {
            self.ttl.max(FOLLOWED_TTL)
        } else {
            self.ttl
        }
    }

    /// A time anything fetched at is stale (older than any TTL); None just after boot.
    pub(super) fn expired(&self) -> Option<Instant> {
        Instant::now().checked_sub(self.ttl.max(FOLLOWED_TTL) + Duration::from_secs(1))
    }
}
