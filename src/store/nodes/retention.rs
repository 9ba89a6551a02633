//! The retention rule applied to a file's versions (`--keep-versions`, `-days`, `-bytes`: docs/
//! design.md §5, Versions): the earlier versions it no longer keeps dropped, and the blobs that
//! no version uses any more freed. Used by a save, a restore, a delete kept restorable and the
//! idle-time pass (`store::expire`); below the deletes and restores that call it.

use crate::api::Result;
use crate::store::db::{Conn as Connection, params};
use crate::store::now_ns;

/// Of `hashes`, the blobs no version uses any more: their rows are deleted and they are
/// returned, for the caller to remove their files once the transaction is committed.
///
/// On PostgreSQL each blob's lock is taken first, in a statement of its own: another account's
/// upload, which runs beside this transaction, takes it to record a version of the same bytes
/// (`nodes::upload`), so the delete's look for versions, a statement begun once the lock is
/// held, sees that version if it came first; if it comes after, it records the blob again.
/// In sorted order, as two transactions freeing blobs both take them.
pub(in crate::store) fn free_blobs(
    tx: &Connection,
    hashes: impl IntoIterator<Item = String>,
) -> Result<Vec<String>> {
    let mut hashes: Vec<String> = hashes.into_iter().collect();
    hashes.sort_unstable();
    hashes.dedup();
    let mut freed = Vec::new();
    let mut free = tx.prepare_cached(
        "DELETE FROM blobs WHERE hash = ?1 AND NOT EXISTS (SELECT 1 FROM versions WHERE blob = ?1)",
    )?;
    for h in hashes {
        tx.lock_blob(&h)?;
        if free.execute([&h])? == 1 {
            freed.push(h);
        }
    }
    Ok(freed)
}

/// After a new version of `file` became current: drops its committed versions older than the
/// `keep` newest earlier ones (`None`: all are kept), and returns the blobs that freed (see
/// [`free_blobs`]). Nothing in the interface reads an earlier version; a mount's store keeps
/// none, so a file saved a thousand times takes the room of one.
pub(in crate::store) fn prune_versions(
    tx: &Connection,
    file: i64,
    keep: &crate::store::Retention,
) -> Result<Vec<String>> {
    // An empty earlier version is no version: restoring it gives nothing back. Programs that
    // make a file empty before they write it left one at every save (LibreOffice: its
    // temporary file, made empty and closed, then written and renamed over the document, whose
    // history it joins: `Store::transfer`).
    let empty: Vec<Option<String>> = tx
        .prepare_cached(
            "DELETE FROM versions WHERE file_id = ?1 AND committed = 1 AND length = 0
             AND id <> (SELECT current_version FROM nodes WHERE id = ?1) RETURNING blob",
        )?
        .query_map(params![file], |r| r.get(0))?
        .collect::<crate::store::db::Result<_>>()?;
    let mut hashes: Vec<String> = empty.into_iter().flatten().collect();
    if keep.is_unbounded() {
        return free_blobs(tx, hashes);
    }
    // Newest first: the rule keeps a prefix of this list (by count and bytes) younger than
    // the age bound.
    let earlier: Vec<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT v.id, v.length, v.created_on FROM versions v JOIN nodes n ON n.id = v.file_id
             WHERE v.file_id = ?1 AND v.committed = 1 AND v.id <> n.current_version
             ORDER BY v.id DESC",
        )?
        .query_map(params![file], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<crate::store::db::Result<_>>()?;
    let oldest = keep
        .age
        .map(|a| now_ns().saturating_sub(i64::try_from(a.as_nanos()).unwrap_or(i64::MAX)));
    let mut bytes = 0u64;
    for (rank, (id, length, created)) in earlier.into_iter().enumerate() {
        bytes = bytes.saturating_add(length.max(0) as u64);
        let kept = keep.count.is_none_or(|n| (rank as u64) < n)
            && oldest.is_none_or(|o| created >= o)
            // The newest earlier version (the last save's undo) is kept whatever its size.
            && (rank == 0 || keep.bytes.is_none_or(|b| bytes <= b));
        if !kept {
            let blob: Option<String> = tx
                .prepare_cached("DELETE FROM versions WHERE id = ?1 RETURNING blob")?
                .query_row(params![id], |r| r.get(0))?;
            hashes.extend(blob);
        }
    }
    free_blobs(tx, hashes)
}
