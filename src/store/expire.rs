//! The retention rule's age bound for what no write touches (issue 32, item 4): a file's
//! versions are pruned when it gets a new one (`nodes::prune_versions`), so a file not written
//! since, and a deleted file, would keep theirs for ever. A thread of the store looks every
//! [`EXPIRE_EVERY`] (and once soon after it starts), in idle time as the preview renderer's
//! background does (no write for `previews::IDLE_AFTER`), and drops, in chunks of at most
//! [`CHUNK`] files each under the store's lock:
//!
//! - deleted files deleted longer ago than the age bound, and those whose folder is gone (a
//!   folder too large to delete at once is purged by `purge`, which does not see them);
//! - earlier versions older than the bound, by the same rule as at a save (`prune_versions`:
//!   the current version always stays).
//!
//! Without an age bound there is nothing to do (and a delete keeps no file).

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::db::params;
use super::nodes::{free_blobs, prune_versions};
use super::{Store, now_ns};
use crate::api::Result;

/// How often the thread looks, and how soon after the store opens it looks first.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(3600);
const FIRST_AFTER: Duration = Duration::from_secs(60);
/// Files handled by one transaction at most.
const CHUNK: i64 = 200;

/// What one pass dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// Deleted files pruned (with their versions).
    pub deleted_files: u64,
    /// Files whose earlier versions were pruned by age.
    pub files_pruned: u64,
}

impl Store {
    /// One pass of the age bound over the whole store (see the module): what it dropped.
    pub fn expire(&self) -> Result<Expired> {
        let mut done = Expired::default();
        let Some(age) = self.config.retention.age else {
            return Ok(done);
        };
        let cutoff = now_ns().saturating_sub(i64::try_from(age.as_nanos()).unwrap_or(i64::MAX));
        loop {
            let (deleted, pruned) = self.expire_chunk(cutoff)?;
            done.deleted_files += deleted;
            done.files_pruned += pruned;
            if deleted + pruned == 0 {
                break;
            }
            // The lock is free between chunks for requests waiting on it.
            std::thread::sleep(Duration::from_millis(2));
        }
        if done != Expired::default() {
            log::info!(
                "retention: {} deleted file(s) and earlier versions of {} file(s) older than {} \
                 day(s) dropped",
                done.deleted_files,
                done.files_pruned,
                age.as_secs().div_ceil(24 * 3600)
            );
        }
        Ok(done)
    }

    /// At most [`CHUNK`] deleted files and [`CHUNK`] files with expired versions, in one
    /// transaction: how many of each.
    fn expire_chunk(&self, cutoff: i64) -> Result<(u64, u64)> {
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let gone: Vec<(i64, i64)> = tx
            .prepare_cached(
                "SELECT node_id, account_id FROM deleted
                 WHERE deleted_on < ?1 OR NOT EXISTS (SELECT 1 FROM nodes f WHERE f.id = folder_id)
                 LIMIT ?2",
            )?
            .query_map(params![cutoff, CHUNK], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        let mut hashes = Vec::new();
        let mut trees = 0;
        for (id, account) in &gone {
            // A deleted folder's tree goes to the purge, which takes it in bounded steps.
            let kind: i64 =
                tx.query_row("SELECT kind FROM nodes WHERE id = ?1", [id], |r| r.get(0))?;
            if kind != super::nodes::NodeKind::File as i64 {
                tx.prepare_cached("DELETE FROM deleted WHERE node_id = ?1")?
                    .execute([id])?;
                super::purge::hand_over(&tx, *id, *account, super::now_ns())?;
                trees += 1;
                continue;
            }
            let blobs: Vec<String> = tx
                .prepare_cached(
                    "SELECT DISTINCT blob FROM versions WHERE file_id = ?1 AND blob IS NOT NULL",
                )?
                .query_map([id], |r| r.get(0))?
                .collect::<super::db::Result<_>>()?;
            hashes.extend(blobs);
            // Its versions and its `deleted` row go with it (cascades).
            tx.prepare_cached("DELETE FROM nodes WHERE id = ?1")?
                .execute([id])?;
        }
        let mut freed = free_blobs(&tx, hashes)?;
        let files: Vec<i64> = tx
            .prepare_cached(
                "SELECT DISTINCT v.file_id FROM versions v JOIN nodes n ON n.id = v.file_id
                 WHERE v.created_on < ?1 AND v.committed = 1 AND v.id <> n.current_version
                 LIMIT ?2",
            )?
            .query_map(params![cutoff, CHUNK], |r| r.get(0))?
            .collect::<super::db::Result<_>>()?;
        for f in &files {
            freed.extend(prune_versions(&tx, *f, &self.config.retention)?);
        }
        tx.commit()?;
        self.forget_blobs(&conn, &freed);
        if trees > 0 {
            drop(conn);
            self.purger().wake();
        }
        Ok((gone.len() as u64, files.len() as u64))
    }

    /// Starts the thread that applies the age bound every `every` in idle time (see the module).
    /// It holds the store weakly: it ends once the store is dropped.
    pub fn start_expiry(self: &Arc<Self>, every: Duration) -> std::io::Result<()> {
        if self.config.retention.age.is_none() {
            return Ok(());
        }
        let store: Weak<Store> = Arc::downgrade(self);
        let first = FIRST_AFTER.min(every);
        std::thread::Builder::new()
            .name("expire".into())
            .spawn(move || {
                let mut wait = first;
                loop {
                    std::thread::sleep(wait);
                    let Some(store) = store.upgrade() else { return };
                    // In idle time only: writes going on push the pass back.
                    if let Some(busy) = store.writes_for() {
                        wait = busy;
                        continue;
                    }
                    if let Err(e) = store.expire() {
                        log::warn!("retention: the pass by age failed: {e}");
                    }
                    wait = every;
                }
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Retention, Scope, StoreConfig, test_path};

    /// A folder emptied file by file, then removed (as `rm -rf` does through a mount): kept
    /// whole, whatever its size; restored, every file comes back with it. Past the age bound,
    /// the pass sends the folder's tree to the purge, and the files deleted from it go too.
    #[test]
    fn a_removed_folder_is_kept_restorable_and_then_goes_with_the_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let with_age = |age: Duration| StoreConfig {
            retention: Retention {
                count: Some(50),
                age: Some(age),
                bytes: None,
            },
            ..StoreConfig::default()
        };
        let store =
            Store::open_local_with(&dir, with_age(Duration::from_secs(30 * 24 * 3600))).unwrap();
        let deleted = |store: &Store| -> i64 {
            store
                .lock()
                .unwrap()
                .query_row("SELECT count(*) FROM deleted", [], |r| r.get(0))
                .unwrap()
        };
        let names = |store: &Store, folder: &str| -> usize {
            store
                .list(Scope::All, &test_path(folder), 0, 5000)
                .map(|n| n.children.unwrap_or_default().len())
                .unwrap_or(0)
        };
        for (folder, files) in [("few", 3), ("many", 1001)] {
            let before = deleted(&store);
            store.create_folder(Scope::All, &test_path(folder)).unwrap();
            for i in 0..files {
                store
                    .create_file(Scope::All, &test_path(folder), &format!("f{i}.txt"))
                    .unwrap();
                store
                    .delete(Scope::All, &test_path(&format!("{folder}/f{i}.txt")))
                    .unwrap();
            }
            store.delete(Scope::All, &test_path(folder)).unwrap();
            assert_eq!(deleted(&store) - before, files + 1, "{folder}");
            assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
            let listed = store.deleted_files(Scope::All, &test_path("")).unwrap();
            let gone = listed.iter().find(|d| d.name == folder).unwrap();
            assert!(gone.folder, "{gone:?}");
            store.restore_deleted(Scope::All, &gone.id).unwrap();
            assert_eq!(names(&store, folder), files as usize, "{folder}");
            assert_eq!(deleted(&store), before);
            assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
            // And removed again, the same way, for the pass below.
            for i in 0..files {
                store
                    .delete(Scope::All, &test_path(&format!("{folder}/f{i}.txt")))
                    .unwrap();
            }
            store.delete(Scope::All, &test_path(folder)).unwrap();
        }
        drop(store);
        let store = Store::open_local_with(&dir, with_age(Duration::from_millis(1))).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let done = store.expire().unwrap();
        // Every deleted file and both folders (their trees to the purge).
        assert_eq!(done.deleted_files, 3 + 1 + 1001 + 1);
        assert!(store.wait_purged(Duration::from_secs(60)));
        store.expire().unwrap();
        assert_eq!(deleted(&store), 0);
        let nodes: i64 = store
            .lock()
            .unwrap()
            .query_row("SELECT count(*) FROM nodes WHERE kind = 3", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(nodes, 0, "every file gone");
        assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
    }
}
