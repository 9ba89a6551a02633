//! Deletes: a subtree removed bottom-up (or detached for the purge thread when large), and the
//! blobs that no version uses any more freed, as after a version is pruned.

use super::limits::subtree_size;
use super::resolve::{resolve, resolve_with_path};
use super::restore::{keep_deleted, keeps_deleted};
use super::retention::free_blobs;
use super::{detach, touch};
use crate::api::{Base, ChangeKind, Error, NodePath, Result};
use crate::store::changes::NewChange;
use crate::store::db::{Tx as Transaction, params};
use crate::store::purge::INLINE_NODES;
use crate::store::{Scope, Store, now_ns};

/// Deletes a node and everything under it; returns the blobs no version uses any more, to be
/// removed from disk once the transaction has committed.
///
/// Bottom-up, one level at a time: deleting the top node alone would let SQLite's `ON DELETE
/// CASCADE` walk the tree as nested triggers, which fails past 1000 levels ("too many levels of
/// trigger recursion"). Here each level's nodes have no children left when they go, so the
/// cascade reaches only their versions, whatever the depth. (The recursive CTE is a queue in
/// SQLite, not a recursion.)
pub(super) fn delete_subtree(tx: &Transaction, id: i64) -> Result<Vec<String>> {
    tx.execute_batch(if tx.is_pg() {
        "CREATE TEMP TABLE IF NOT EXISTS doomed (id BIGINT PRIMARY KEY, depth BIGINT NOT NULL);
         CREATE INDEX IF NOT EXISTS doomed_by_depth ON pg_temp.doomed(depth);
         DELETE FROM pg_temp.doomed;"
    } else {
        "CREATE TEMP TABLE IF NOT EXISTS doomed (id INTEGER PRIMARY KEY, depth INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS temp.doomed_by_depth ON doomed(depth);
         DELETE FROM temp.doomed;"
    })?;
    // Bounded in depth (`MAX_WALK_DEPTH`); a node met twice (a cycle) breaks the key.
    tx.execute(
        "INSERT INTO temp.doomed (id, depth)
         WITH RECURSIVE sub(id, depth) AS (SELECT CAST(?1 AS BIGINT), CAST(0 AS BIGINT) UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id
             WHERE sub.depth < ?2)
         SELECT id, depth FROM sub",
        params![id, super::MAX_WALK_DEPTH],
    )?;
    // The files deleted from its folders and kept restorable go with them (detached: no level
    // of the walk reaches them), here when they are few; many (a large folder emptied file by
    // file, then removed) are left to the store's pass by age, which drops deleted files whose
    // folder is gone in bounded chunks, so this transaction stays bounded as the tree is.
    let orphans: i64 = tx.query_row(
        "SELECT count(*) FROM deleted WHERE folder_id IN (SELECT id FROM temp.doomed)",
        [],
        |r| r.get(0),
    )?;
    if orphans as u64 <= INLINE_NODES {
        tx.execute(
            "INSERT INTO temp.doomed (id, depth) SELECT d.node_id, 0 FROM deleted d
             WHERE d.folder_id IN (SELECT id FROM temp.doomed)",
            [],
        )?;
    }
    let hashes: Vec<String> = tx
        .prepare(
            "SELECT DISTINCT v.blob FROM versions v JOIN temp.doomed d ON v.file_id = d.id
             WHERE v.blob IS NOT NULL",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<crate::store::db::Result<_>>()?;
    let deepest: i64 =
        tx.query_row("SELECT coalesce(max(depth), 0) FROM temp.doomed", [], |r| {
            r.get(0)
        })?;
    if deepest >= super::MAX_WALK_DEPTH {
        return Err(super::resolve::damaged(id));
    }
    {
        let mut level = tx.prepare_cached(
            "DELETE FROM nodes WHERE id IN (SELECT id FROM temp.doomed WHERE depth = ?1)",
        )?;
        for depth in (0..=deepest).rev() {
            level.execute([depth])?;
        }
    }
    tx.execute("DELETE FROM temp.doomed", [])?;
    free_blobs(tx, hashes)
}

impl Store {
    /// Deletes a tree in one transaction, whatever its size, as every delete did before
    /// deletes were bounded, then rolls it back (the tree stays): only for tests that measure
    /// what the bound buys. Returns how long the store's lock was held.
    #[doc(hidden)]
    pub fn delete_in_one_transaction_rolled_back(
        &self,
        scope: Scope,
        path: &NodePath,
    ) -> Result<std::time::Duration> {
        let conn = self.lock()?;
        let started = std::time::Instant::now();
        let tx = conn.transaction()?;
        let row = resolve(&tx, scope, path)?;
        delete_subtree(&tx, row.id)?;
        touch(&tx, row.parent_id, now_ns())?;
        tx.rollback()?;
        Ok(started.elapsed())
    }

    /// Deletes a file, or a folder with everything under it, and frees unshared bytes. While
    /// the retention rule bounds versions by age, either stays restorable for that age
    /// (`restore`): detached whole, whatever its size.
    ///
    /// A tree of more than [`crate::store::purge::INLINE_NODES`] nodes is detached in this transaction
    /// (its name is gone when this returns) and purged by the store's thread in bounded chunks,
    /// so no request holds the store's lock for long (`store::purge`).
    pub fn delete(&self, scope: Scope, path: &NodePath) -> Result<()> {
        self.delete_if(scope, path, &Base::Any)
    }

    /// [`Store::delete`] of a file only while `base` holds for it (its current version is the
    /// one the caller knew), checked in the delete's transaction: another writer's version
    /// committed since is refused (412 `version_conflict`), not deleted with it. Folders are
    /// deleted whatever `base` says.
    pub fn delete_if(&self, scope: Scope, path: &NodePath, base: &Base) -> Result<()> {
        if path.depth() < 3 {
            return Err(Error::forbidden("accounts and vaults cannot be deleted"));
        }
        // Idle-time work (previews, the search index) waits while deletes come (an `rm -rf`).
        self.note_write_activity();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        // With its path as stored, which the statement that finds it gives (a walk up from
        // the node after was a tenth of an `rm -rf`'s time in the store).
        let (row, stored) = resolve_with_path(&tx, scope, path)?;
        if row.is_file() && !base.holds(row.md5.as_deref()) {
            return Err(base.conflict(&path.to_string()));
        }
        let now = now_ns();
        // One change for the whole tree: a client drops what it has under it.
        self.log_change(&tx, NewChange::new(&row, ChangeKind::Deleted, &stored))?;
        let freed = if keeps_deleted(&self.config.retention) {
            keep_deleted(&tx, &row, now, &self.config.retention)?
        } else if subtree_size(&tx, row.id, INLINE_NODES)?.0 > INLINE_NODES {
            detach(&tx, row.id)?;
            crate::store::purge::hand_over(&tx, row.id, row.account_id, now)?;
            touch(&tx, row.parent_id, now)?;
            tx.commit()?;
            drop(conn);
            self.changed(row.account_id);
            log::debug!("{path} detached, to be purged");
            self.purger().wake();
            return Ok(());
        } else {
            delete_subtree(&tx, row.id)?
        };
        touch(&tx, row.parent_id, now)?;
        tx.commit()?;
        self.changed(row.account_id);
        self.forget_blobs(&conn, &freed);
        Ok(())
    }

    /// [`Store::delete_if`] of many files in one transaction (a mount's `rm -rf` sends its
    /// deletes in batches: one commit for hundreds, where each delete alone wrote some twenty
    /// pages of the WAL). One result a file. A name that holds a folder now is refused as an
    /// edit would be (412): a folder made elsewhere under a deleted file's name is not that
    /// file. The checks only read, so a refused delete writes nothing and fails alone; should a
    /// write fail, the batch is rolled back and its deletes made one by one.
    pub fn delete_files_if(&self, scope: Scope, files: &[(NodePath, Base)]) -> Vec<Result<()>> {
        match self.delete_files_together(scope, files) {
            Ok(results) => results,
            Err(e) if files.len() > 1 => {
                log::warn!(
                    "a batch of {} deletes failed ({e}): one by one",
                    files.len()
                );
                (files.iter())
                    .map(|f| {
                        self.delete_files_if(scope, std::slice::from_ref(f))
                            .remove(0)
                    })
                    .collect()
            }
            Err(e) => vec![Err(e)],
        }
    }

    fn delete_files_together(
        &self,
        scope: Scope,
        files: &[(NodePath, Base)],
    ) -> Result<Vec<Result<()>>> {
        self.note_write_activity();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let now = now_ns();
        let keep = keeps_deleted(&self.config.retention);
        let (mut results, mut freed) = (Vec::with_capacity(files.len()), Vec::new());
        let (mut folders, mut accounts) = (Vec::new(), Vec::new());
        for (path, base) in files {
            let found = if path.depth() < 3 {
                Err(Error::forbidden("accounts and vaults cannot be deleted"))
            } else {
                resolve_with_path(&tx, scope, path)
            };
            let (row, stored) = match found {
                Ok(found) => found,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            if !row.is_file() || !base.holds(row.md5.as_deref()) {
                results.push(Err(base.conflict(&path.to_string())));
                continue;
            }
            self.log_change(&tx, NewChange::new(&row, ChangeKind::Deleted, &stored))?;
            freed.extend(if keep {
                keep_deleted(&tx, &row, now, &self.config.retention)?
            } else {
                delete_subtree(&tx, row.id)?
            });
            folders.extend(row.parent_id.filter(|p| !folders.contains(p)));
            if !accounts.contains(&row.account_id) {
                accounts.push(row.account_id);
            }
            results.push(Ok(()));
        }
        for folder in folders {
            touch(&tx, Some(folder), now)?;
        }
        tx.commit()?;
        for account in accounts {
            self.changed(account);
        }
        self.forget_blobs(&conn, &freed);
        Ok(results)
    }
}
