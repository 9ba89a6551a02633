//! What `df` shows of a mount (issue 35, item 5): where the store keeps a byte quota for the
//! account (`vaultfs serve --max-bytes-per-account`, through `GET /usage`), its size is the
//! quota and its use the account's bytes; elsewhere (the mount's own store, the public service)
//! the disk under the cache dir, where writes are staged (`namespace::statfs`).
//!
//! STATFS is answered at once from what was last asked; an answer older than [`USAGE_TTL`]
//! starts a new question beside it, so a mount never waits on the backend for `df`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Fs;
use super::namespace::Statfs;
use crate::api::Usage;
use crate::backend::Backend;
use crate::sync::relock;

/// The account's use is asked again after this long.
const USAGE_TTL: Duration = Duration::from_secs(5);
/// The block size shown with a quota.
const BLOCK: u64 = 4096;

/// The account's use as last asked (locked alone: see the lock order in `fs`).
#[derive(Default)]
pub(super) struct Space {
    known: std::sync::Mutex<Known>,
}

#[derive(Default)]
struct Known {
    usage: Option<Usage>,
    asked: Option<Instant>,
    asking: bool,
}

impl<B: Backend> Fs<B> {
    /// Asks the backend for the account's use when what is known is older than [`USAGE_TTL`]
    /// (in the background; at most one question at a time).
    pub(super) fn refresh_usage(self: &Arc<Self>) {
        {
            let mut k = relock(&self.space.known);
            if k.asking || k.asked.is_some_and(|t| t.elapsed() < USAGE_TTL) {
                return;
            }
            k.asking = true;
        }
        let fs = self.clone();
        self.rt.spawn(async move {
            let answer = fs.backend.usage().await;
            let mut k = relock(&fs.space.known);
            match answer {
                Ok(u) => k.usage = u,
                // Out of reach: what was known still holds.
                Err(e) => log::debug!("usage: {e}"),
            }
            k.asked = Some(Instant::now());
            k.asking = false;
        });
    }

    /// STATFS from the account's byte quota, where the backend has told one; `local` is the
    /// cache dir's disk, which bounds what can be written (staged there first).
    pub(super) fn quota_statfs(self: &Arc<Self>, local: &Statfs) -> Option<Statfs> {
        self.refresh_usage();
        let u = relock(&self.space.known).usage?;
        let max = u.max_bytes?;
        let blocks = max / BLOCK;
        let bfree = max.saturating_sub(u.bytes) / BLOCK;
        let local_avail = local.bavail.saturating_mul(u64::from(local.frsize)) / BLOCK;
        let (files, ffree) = match u.max_nodes {
            Some(n) => (n, n.saturating_sub(u.nodes)),
            None => (local.files, local.ffree),
        };
        Some(Statfs {
            blocks,
            bfree,
            bavail: bfree.min(local_avail),
            files,
            ffree,
            bsize: BLOCK as u32,
            namelen: local.namelen,
            frsize: BLOCK as u32,
        })
    }
}
