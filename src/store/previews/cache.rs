//! The previews kept, as a cache with a bound: their sizes, the eviction of the least recently
//! used, the measure of previews older than the bound, and the cleanup after a crash and after
//! the move to previews by kind.

use std::fs;
use std::sync::atomic::Ordering;

use super::queue::Shared;
use super::{IS_CURRENT, Job, Previews, kind_of};
use crate::api::Result;
use crate::preview::PreviewKind;
use crate::store::Store;
use crate::store::blobs::Blobs;
use crate::store::db::{Conn as Connection, TransactionBehavior, params};
use crate::sync::relock;

impl Previews {
    /// After a crash, alone with the store (its data directory): empties `previews/tmp` (jobs
    /// that died with their process) and removes the previews that no ready row accounts for
    /// (a row removed whose files were not yet), wherever they are kept (`Blobs::sweep_previews`).
    pub(in crate::store) fn recover(&self, conn: &Connection, blobs: &Blobs) -> Result<()> {
        let mut ready =
            conn.prepare("SELECT 1 FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 1")?;
        let removed =
            blobs.sweep_previews(conn.is_pg(), |hash, kind| match PreviewKind::parse(kind) {
                Some(k) => Ok(ready.exists(params![hash, k.as_str()])?),
                None => Ok(false),
            })?;
        if removed > 0 {
            log::info!("removed {removed} preview(s) no longer recorded");
        }
        Ok(())
    }
}

impl Store {
    /// Gives the previews of a database from before kinds (schema 7) their kind: the one their
    /// bytes have under the name they were rendered by, which their files move under. Rows of
    /// bytes that are gone, or of a kind with no preview, go.
    pub(in crate::store) fn migrate_preview_kinds(&self) -> Result<()> {
        let conn = self.lock()?;
        let old: Vec<(String, String)> = conn
            .prepare("SELECT blob, name FROM previews WHERE kind = ''")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<crate::store::db::Result<_>>()?;
        if old.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction()?;
        let mut moved = 0;
        for (hash, name) in &old {
            let kind = kind_of(&tx, &self.blobs, hash, name)?;
            // (Stores of before kinds kept their previews in the data directory.)
            let folder = self.blobs.local_previews().join(&hash[..2]).join(hash);
            if kind == PreviewKind::Unsupported {
                tx.execute("DELETE FROM previews WHERE blob = ?1 AND kind = ''", [hash])?;
                let _ = fs::remove_dir_all(&folder);
                continue;
            }
            tx.execute(
                "UPDATE preview_access SET kind = ?2 WHERE blob = ?1 AND kind = ''",
                params![hash, kind.as_str()],
            )?;
            tx.execute(
                "UPDATE previews SET kind = ?2 WHERE blob = ?1 AND kind = ''",
                params![hash, kind.as_str()],
            )?;
            // The files of the old layout, `<hash>/page-0001.png`..., into `<hash>/<kind>/`.
            let Ok(entries) = fs::read_dir(&folder) else {
                continue;
            };
            let dest = folder.join(kind.as_str());
            fs::create_dir_all(&dest)?;
            for entry in entries {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    fs::rename(entry.path(), dest.join(entry.file_name()))?;
                }
            }
            moved += 1;
        }
        tx.commit()?;
        log::info!(
            "{} preview(s) from before preview kinds given theirs ({moved} with files moved)",
            old.len()
        );
        Ok(())
    }
}

// The bound is this file's to keep: the workers (`workers.rs`) call these with what they hold,
// so the cache does not reach back into the workers' pool.

/// Removes least recently used previews until they and `incoming` more bytes fit the cache
/// size (never `keep`, the one being made): first those of bytes that are no file's current
/// version, then those nobody asked for, then the rest, oldest use first.
pub(super) fn keep_bound(
    conn: &mut Connection,
    blobs: &Blobs,
    shared: &Shared,
    keep: Option<&Job>,
    incoming: u64,
) -> Result<()> {
    // On PostgreSQL several servers make previews into one store, so the bound is kept with
    // a fresh sum (one per render, beside an upload to the bucket); on SQLite this process is
    // nearly always the store's only one, and a sum per render was the cost that grew.
    let (total, _) = preview_bytes_seen(conn, shared, conn.is_pg())?;
    let bound = shared.cache_size.saturating_sub(incoming);
    let mut total = total;
    if total <= bound {
        return Ok(());
    }
    let (keep_hash, keep_kind) = keep.map_or(("", ""), |j| (&j.hash, j.kind.as_str()));
    let candidates: Vec<(String, String, i64)> = {
        let mut stmt = conn.prepare(&format!(
            "SELECT p.blob, p.kind, p.bytes FROM previews p
             WHERE p.status = 1 AND NOT (p.blob = ?1 AND p.kind = ?2)
             ORDER BY {}, p.requested, p.used_on",
            IS_CURRENT.replace("?1", "p.blob")
        ))?;
        stmt.query_map(params![keep_hash, keep_kind], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<crate::store::db::Result<_>>()?
    };
    let mut evict = Vec::new();
    for (hash, kind, bytes) in candidates {
        if total <= bound {
            break;
        }
        total = total.saturating_sub(bytes.max(0) as u64);
        evict.push((hash, kind));
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut gone = Vec::new();
    for (hash, kind) in evict {
        // Only if still ready (a row asked for again meanwhile is left as it is).
        if tx.execute(
            "DELETE FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 1",
            params![hash, kind],
        )? == 1
        {
            gone.push((hash, kind));
        }
    }
    tx.commit()?;
    for (hash, kind) in &gone {
        if PreviewKind::parse(kind).is_some() {
            blobs.remove_preview(hash, Some(kind));
        }
    }
    if !gone.is_empty() {
        // Summed again at the next ask.
        *relock(&shared.bytes_seen) = None;
        shared
            .evicted
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        log::debug!(
            "{} preview(s) removed to stay within {} bytes",
            gone.len(),
            shared.cache_size
        );
    }
    Ok(())
}

/// Ready previews from a database older than the cache get their sizes measured.
pub(super) fn measure_old(conn: &mut Connection, blobs: &Blobs) -> Result<()> {
    let old: Vec<(String, String)> = conn
        .prepare("SELECT blob, kind FROM previews WHERE status = 1 AND bytes < 0")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<crate::store::db::Result<_>>()?;
    if old.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (hash, kind) in &old {
        let Some(k) = PreviewKind::parse(kind) else {
            continue;
        };
        let bytes: u64 = blobs
            .preview_sizes(hash, k.as_str())
            .unwrap_or_default()
            .into_iter()
            .map(on_disk)
            .sum();
        tx.execute(
            "UPDATE previews SET bytes = ?3 WHERE blob = ?1 AND kind = ?2",
            params![hash, kind, bytes as i64],
        )?;
    }
    tx.commit()?;
    log::info!(
        "measured {} preview(s) from before the preview cache",
        old.len()
    );
    Ok(())
}

/// Bytes a file of `len` bytes takes on disk, in 4 KiB blocks (as `du` counts them).
pub(super) fn on_disk(len: u64) -> u64 {
    len.div_ceil(4096).max(1) * 4096
}

/// How long a sum of the previews' bytes stands (each sum reads every ready preview's row).
const BYTES_SEEN_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// [`preview_bytes`], summed again at most once a [`BYTES_SEEN_TTL`] and kept up to date with
/// what this process adds and removes meanwhile: summed at every job, three times, it made
/// the previews of n new files cost the square of n (a third of the CPU of a mount writing
/// 20,000 files). Other processes' previews show within the TTL; `fresh` sums again at once
/// (the bound itself on PostgreSQL: [`keep_bound`]).
pub(super) fn preview_bytes_seen(
    conn: &Connection,
    shared: &Shared,
    fresh: bool,
) -> Result<(u64, u64)> {
    let mut seen = relock(&shared.bytes_seen);
    if let Some((at, all, unrequested)) = *seen {
        if !fresh && at.elapsed() < BYTES_SEEN_TTL {
            return Ok((all, unrequested));
        }
    }
    let (all, unrequested) = preview_bytes(conn)?;
    *seen = Some((std::time::Instant::now(), all, unrequested));
    Ok((all, unrequested))
}

/// A preview of `bytes` made ready by this process (unrequested: nobody asked for it).
pub(super) fn note_ready(shared: &Shared, bytes: u64, unrequested: bool) {
    if let Some((_, all, unreq)) = relock(&shared.bytes_seen).as_mut() {
        *all += bytes;
        if unrequested {
            *unreq += bytes;
        }
    }
}

/// Bytes of all ready previews and of those nobody asked for.
pub(super) fn preview_bytes(conn: &Connection) -> Result<(u64, u64)> {
    let (all, unrequested): (i64, i64) = conn.query_row(
        &format!(
            "SELECT CAST(COALESCE(SUM({max}(bytes, 0)), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN {max}(bytes, 0) END), 0)
                        AS BIGINT)
             FROM previews WHERE status = 1",
            max = conn.greatest()
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((all.max(0) as u64, unrequested.max(0) as u64))
}
