//! What an account and a request may hold: the account's quota of nodes and bytes, the size of a
//! subtree (for a copy's quota and a delete's bound), and the largest file.

use crate::api::{Error, Result};
use crate::store::db::{Conn as Connection, OptionalExtension, params};
use crate::store::{Scope, Store};

/// 507 `quota_exceeded` when `scope`'s account would hold more than its quota with `nodes` more
/// nodes and `bytes` more bytes (a server's account; the mount's store has no quota).
pub(in crate::store) fn check_quota(
    conn: &Connection,
    config: &crate::store::StoreConfig,
    scope: Scope,
    nodes: u64,
    bytes: u64,
) -> Result<()> {
    let Scope::Account(account) = scope else {
        return Ok(());
    };
    check_held(config, scope, held(conn, account)?, nodes, bytes)
}

/// What `account` holds: (nodes, bytes).
pub(super) fn held(conn: &Connection, account: i64) -> Result<(i64, i64)> {
    Ok(conn
        .prepare_cached("SELECT nodes, bytes FROM usage WHERE account_id = ?1")?
        .query_row([account], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0)))
}

/// [`check_quota`] of what the account holds, `(nodes, bytes)`, read already.
pub(in crate::store) fn check_held(
    config: &crate::store::StoreConfig,
    scope: Scope,
    (held_nodes, held_bytes): (i64, i64),
    nodes: u64,
    bytes: u64,
) -> Result<()> {
    if scope == Scope::All {
        return Ok(());
    }
    for (what, held, more, max) in [
        (
            "files and folders",
            held_nodes,
            nodes,
            config.max_nodes_per_account,
        ),
        ("bytes", held_bytes, bytes, config.max_bytes_per_account),
    ] {
        if (held.max(0) as u64).saturating_add(more) > max {
            return Err(Error::new(
                crate::api::ErrorKind::InsufficientStorage,
                "quota_exceeded",
                format!("your account holds {held} {what}; this server allows {max}"),
            ));
        }
    }
    Ok(())
}

impl Store {
    /// What `scope`'s account holds and its quota, as [`check_quota`] counts them; every
    /// account together for [`Scope::All`] (the mount's own store), which has no quota.
    pub fn usage(&self, scope: Scope) -> Result<crate::api::Usage> {
        let account = match scope {
            Scope::Account(a) => a,
            Scope::All => 0,
        };
        let conn = self.lock()?;
        let (nodes, bytes): (i64, i64) = conn
            .prepare_cached(
                "SELECT CAST(coalesce(sum(nodes), 0) AS BIGINT), \
                        CAST(coalesce(sum(bytes), 0) AS BIGINT) \
                 FROM usage WHERE account_id = ?1 OR ?1 = 0",
            )?
            .query_row(params![account], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let quota = |max: u64| (account != 0 && max != u64::MAX).then_some(max);
        Ok(crate::api::Usage {
            bytes: bytes.max(0) as u64,
            max_bytes: quota(self.config.max_bytes_per_account),
            nodes: nodes.max(0) as u64,
            max_nodes: quota(self.config.max_nodes_per_account),
        })
    }
}

/// The nodes and bytes (committed versions) of the subtree at `id`, counted up to `limit`
/// nodes: a copy beyond it is refused before any is made.
pub(super) fn subtree_size(conn: &Connection, id: i64, limit: u64) -> Result<(u64, u64)> {
    // PostgreSQL has no LIMIT inside a recursive query: the limit of the one reading it stops
    // the walk there instead.
    // Bounded in depth too, as every walk of the tree (`MAX_WALK_DEPTH`).
    let sql = if conn.is_pg() {
        "WITH RECURSIVE sub(id, depth) AS (SELECT CAST(?1 AS BIGINT), CAST(0 AS BIGINT) UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id
             WHERE sub.depth < ?3),
         bounded AS (SELECT id FROM sub LIMIT ?2)
         SELECT count(*), (SELECT CAST(coalesce(sum(v.length), 0) AS BIGINT) FROM versions v
             WHERE v.committed = 1 AND v.file_id IN (SELECT id FROM bounded)) FROM bounded"
    } else {
        "WITH RECURSIVE sub(id, depth) AS (SELECT ?1, 0 UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id
             WHERE sub.depth < ?3 LIMIT ?2)
         SELECT count(*), (SELECT coalesce(sum(v.length), 0) FROM versions v
             WHERE v.committed = 1 AND v.file_id IN (SELECT id FROM sub)) FROM sub"
    };
    let (n, bytes): (i64, i64) = conn.query_row(
        sql,
        params![
            id,
            limit.saturating_add(1).min(i64::MAX as u64) as i64,
            super::MAX_WALK_DEPTH
        ],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((n as u64, bytes as u64))
}

impl Store {
    /// A version of `length` bytes is within the configured limit (413 `file_too_large`).
    pub(in crate::store) fn check_file_size(&self, length: u64) -> Result<()> {
        if length > self.config.max_file_size {
            return Err(Error::new(
                crate::api::ErrorKind::TooLarge,
                "file_too_large",
                format!(
                    "{length} bytes is over this server's limit of {} bytes",
                    self.config.max_file_size
                ),
            ));
        }
        Ok(())
    }
}
