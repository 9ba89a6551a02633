//! Deletes of large trees, bounded per transaction (issue 19, item 12).
//!
//! A tree of more than [`INLINE_NODES`] nodes is not deleted in the request's transaction: that
//! transaction only **detaches** it (its top node gets no parent and the name `/<id>`, which no
//! path can spell, and is listed in `trash`), so its name is gone at once and it can be reached
//! neither by path nor by ID (`nodes::file_by_id` finds only files under an account). A thread
//! of the store then **purges** the detached trees in chunks of at most [`CHUNK_ROWS`] nodes
//! (and about [`CHUNK_TIME`]), one transaction each under the store's lock, released between
//! chunks (for [`PAUSE`] at least, and half the chunk's time), so that any other request waits for one chunk at most. A chunk takes children of the top: a file or an empty
//! folder is deleted (its versions with it), a folder with children has them moved up under the
//! top (renamed `/<id>`, unique there), so the tree flattens as it goes, whatever its depth,
//! and no node is visited more than twice. Blobs no version uses any more are removed with the
//! chunk that freed them, under the lock (as every delete does). The account's usage counts go
//! down as its nodes go (its quota frees up while the purge runs). On open, trees left detached
//! by a process that stopped are purged again from where it was.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::db::{Conn as Connection, OptionalExtension, params};

use super::blobs::Blobs;
use crate::api::Result;
use crate::sync::{relock, unpoisoned};

/// A tree of at most this many nodes is deleted in the request's own transaction.
pub const INLINE_NODES: u64 = 1000;
/// Nodes deleted or moved by one transaction of a purge, at most...
pub const CHUNK_ROWS: usize = 1000;
/// ...and for about this long at most (the chunk stops early on a busy machine).
const CHUNK_TIME: Duration = Duration::from_millis(10);
/// The lock is left free this long between two chunks at least, and half as long as the last
/// chunk took (a busy machine slows the purge, not the requests), so waiting requests get it.
const PAUSE: Duration = Duration::from_millis(2);

#[derive(Default)]
struct State {
    /// Trees were detached since the thread last looked (or it has not looked yet).
    pending: bool,
    /// The thread is purging.
    busy: bool,
    stop: bool,
    /// Chunks purged by this process, and the longest one's time under the lock.
    chunks: u64,
    longest: Duration,
}

/// What the store and its purge thread share.
pub(super) struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    idle: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        relock(&self.state)
    }
}

/// The purge thread of a store: started when the store opens (to resume trees a stopped
/// process left), woken by each detach, stopped (after its current chunk) when the store closes.
pub(super) struct Purger {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Purger {
    pub(super) fn start(db: Arc<super::db::Db>, blobs: Blobs) -> std::io::Result<Purger> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: true,
                ..State::default()
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("purge".into())
            .spawn(move || run(&s, &db, &blobs))?;
        Ok(Purger {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A tree was detached: the thread purges it.
    pub(super) fn wake(&self) {
        self.shared.lock().pending = true;
        self.shared.wake.notify_all();
    }

    /// Waits until the thread finds nothing left to purge (or `timeout`); true when so.
    pub(super) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while (st.pending || st.busy) && !st.stop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            st = unpoisoned(self.shared.idle.wait_timeout(st, left)).0;
        }
        !(st.pending || st.busy)
    }

    /// Chunks purged by this process, and the longest one's time under the lock.
    pub(super) fn chunks(&self) -> (u64, Duration) {
        let st = self.shared.lock();
        (st.chunks, st.longest)
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        let thread = relock(&self.thread).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Inside a transaction: the detached tree topped by `id` (of `account`) is the purge's, from
/// `now`; the caller wakes the purger once it has committed.
pub(super) fn hand_over(conn: &Connection, id: i64, account: i64, now: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO trash (node_id, account_id, detached_on) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![id, account, now])?;
    Ok(())
}

fn run(shared: &Shared, db: &super::db::Db, blobs: &Blobs) {
    loop {
        {
            let mut st = shared.lock();
            while !st.pending && !st.stop {
                st = unpoisoned(shared.wake.wait(st));
            }
            if st.stop {
                return;
            }
            // A detach from now on sets it again, and the thread looks again after this round.
            st.pending = false;
            st.busy = true;
        }
        let started = Instant::now();
        let mut chunks = 0u64;
        loop {
            if shared.lock().stop {
                return;
            }
            let (more, took) = match db.lock() {
                Ok(c) => {
                    let t = Instant::now();
                    (chunk(&c, blobs), t.elapsed())
                }
                // The database down: tried again later, as a failed chunk is.
                Err(e) => (Err(e.into()), Duration::ZERO),
            };
            match more {
                Ok(true) => {
                    chunks += 1;
                    let mut st = shared.lock();
                    st.chunks += 1;
                    st.longest = st.longest.max(took);
                    drop(st);
                    std::thread::sleep(PAUSE.max(took / 2));
                }
                Ok(false) => break,
                Err(e) => {
                    log::warn!("purging deleted trees: {e}; trying again later");
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
        if chunks > 0 {
            log::info!(
                "deleted trees purged in {chunks} step(s) of at most {CHUNK_ROWS} nodes, {:?}",
                started.elapsed()
            );
        }
        shared.lock().busy = false;
        shared.idle.notify_all();
    }
}

/// One transaction of the purge: up to [`CHUNK_ROWS`] nodes of the first detached tree deleted
/// or moved, the blobs they freed removed. False when no tree is left.
fn chunk(conn: &Connection, blobs: &Blobs) -> Result<bool> {
    let tx = conn.transaction()?;
    let Some(top) = tx
        .prepare_cached("SELECT node_id FROM trash ORDER BY node_id LIMIT 1")?
        .query_row([], |r| r.get::<_, i64>(0))
        .optional()?
    else {
        return Ok(false);
    };
    let started = Instant::now();
    let mut budget = CHUNK_ROWS;
    let mut hashes = std::collections::BTreeSet::new();
    {
        let mut children =
            tx.prepare_cached("SELECT id FROM nodes WHERE parent_id = ?1 LIMIT ?2")?;
        let mut has_children =
            tx.prepare_cached("SELECT 1 FROM nodes WHERE parent_id = ?1 LIMIT 1")?;
        let mut move_up = tx.prepare_cached(
            "UPDATE nodes SET parent_id = ?1, name = '/' || id
             WHERE id IN (SELECT id FROM nodes WHERE parent_id = ?2 LIMIT ?3)",
        )?;
        let mut blobs_of = tx.prepare_cached(
            "SELECT DISTINCT blob FROM versions WHERE file_id = ?1 AND blob IS NOT NULL",
        )?;
        let mut delete = tx.prepare_cached("DELETE FROM nodes WHERE id = ?1")?;
        let mut forget = |id: i64, hashes: &mut std::collections::BTreeSet<String>| -> Result<()> {
            for h in blobs_of.query_map([id], |r| r.get::<_, String>(0))? {
                hashes.insert(h?);
            }
            delete.execute([id])?;
            Ok(())
        };
        while budget > 0 {
            let ids: Vec<i64> = children
                .query_map(params![top, budget.min(256) as i64], |r| r.get(0))?
                .collect::<super::db::Result<_>>()?;
            if ids.is_empty() {
                forget(top, &mut hashes)?;
                tx.prepare_cached("DELETE FROM trash WHERE node_id = ?1")?
                    .execute([top])?;
                break;
            }
            for id in ids {
                if started.elapsed() > CHUNK_TIME {
                    budget = 0;
                }
                if budget == 0 {
                    break;
                }
                if has_children.exists([id])? {
                    budget -= move_up.execute(params![top, id, budget as i64])?;
                } else {
                    forget(id, &mut hashes)?;
                    budget -= 1;
                }
            }
        }
    }
    let freed = super::nodes::retention::free_blobs(&tx, hashes)?;
    tx.commit()?;
    let freed: Vec<&String> = freed.iter().collect();
    if let Err(e) = super::remove_unrecorded(conn, blobs, &freed) {
        // Kept when in doubt: an unreferenced blob costs room, a removed one a file.
        log::warn!("{} blob(s) kept: {e}", freed.len());
    }
    for h in freed {
        blobs.remove_preview(h, None);
    }
    Ok(true)
}
