//! What WebDAV keeps beside the tree (issue 50, `server::dav`): the dead properties clients set
//! with PROPPATCH (Windows Explorer its Win32 times, macOS Finder its own, any client its
//! metadata), by node, so that they follow a node's moves and renames and go with it when it
//! is deleted for good (`ON DELETE CASCADE`). In the database, so every server of one
//! PostgreSQL sees them.

use super::db::params;
use super::nodes::resolve;
use super::{Scope, Store};
use crate::api::{Error, ErrorKind, Lock, NodePath, Result};

/// Dead properties one node may hold.
pub const MAX_PROPS_PER_NODE: i64 = 256;
/// The largest value of one (its XML).
pub const MAX_PROP_BYTES: usize = 64 * 1024;

/// A dead property: its name in its namespace (`""` for none), the prefix the client wrote, and
/// its value as XML (`None` when only names were asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadProp {
    pub namespace: String,
    pub name: String,
    pub prefix: Option<String>,
    pub xml: Option<Vec<u8>>,
}

impl Store {
    /// The dead properties of the node at `path`, by namespace and name.
    pub fn dead_props(&self, scope: Scope, path: &NodePath) -> Result<Vec<DeadProp>> {
        if path.is_root() {
            return Ok(Vec::new());
        }
        let conn = self.conn()?;
        let snapshot = conn.snapshot()?;
        let node = resolve(&snapshot, scope, path)?;
        let props = snapshot
            .prepare_cached(
                "SELECT namespace, name, prefix, xml FROM dav_props WHERE node_id = ?1
                 ORDER BY namespace, name",
            )?
            .query_map([node.id], |r| {
                Ok(DeadProp {
                    namespace: r.get(0)?,
                    name: r.get(1)?,
                    prefix: r.get(2)?,
                    xml: r.get(3)?,
                })
            })?
            .collect::<super::db::Result<Vec<_>>>()?;
        Ok(props)
    }

    /// Sets (`true`) and removes (`false`) dead properties of the node at `path`, all or none:
    /// 507 `too_many_properties` past [`MAX_PROPS_PER_NODE`], 413 past [`MAX_PROP_BYTES`].
    pub fn patch_dead_props(
        &self,
        scope: Scope,
        path: &NodePath,
        patch: &[(bool, DeadProp)],
    ) -> Result<()> {
        if path.is_root() {
            return Err(Error::new(
                ErrorKind::Forbidden,
                "forbidden",
                "the root has no properties to set",
            ));
        }
        if let Some((_, p)) = patch
            .iter()
            .find(|(_, p)| p.xml.as_ref().is_some_and(|x| x.len() > MAX_PROP_BYTES))
        {
            return Err(Error::new(
                ErrorKind::TooLarge,
                "property_too_large",
                format!(
                    "the value of property {} is over {MAX_PROP_BYTES} bytes",
                    p.name
                ),
            ));
        }
        let conn = self.conn()?;
        // The account's writers' lock: its nodes' properties only.
        let tx = conn.transaction_for(scope.writers())?;
        let node = resolve(&tx, scope, path)?;
        for (set, p) in patch {
            if *set {
                tx.prepare_cached(
                    "INSERT INTO dav_props (node_id, namespace, name, prefix, xml)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (node_id, namespace, name)
                     DO UPDATE SET prefix = excluded.prefix, xml = excluded.xml",
                )?
                .execute(params![
                    node.id,
                    p.namespace,
                    p.name,
                    p.prefix,
                    p.xml
                ])?;
            } else {
                tx.prepare_cached(
                    "DELETE FROM dav_props WHERE node_id = ?1 AND namespace = ?2 AND name = ?3",
                )?
                .execute(params![node.id, p.namespace, p.name])?;
            }
        }
        let held: i64 = tx
            .prepare_cached("SELECT count(*) FROM dav_props WHERE node_id = ?1")?
            .query_row([node.id], |r| r.get(0))?;
        if held > MAX_PROPS_PER_NODE {
            // Dropped uncommitted: nothing of the patch is kept.
            return Err(Error::new(
                ErrorKind::InsufficientStorage,
                "too_many_properties",
                format!("{path} would hold more than {MAX_PROPS_PER_NODE} properties"),
            ));
        }
        tx.commit()?;
        Ok(())
    }
}

/// A WebDAV lock (`server::dav::locks` speaks for it), by the path it was taken on: held by the
/// store, so every server of one PostgreSQL sees it, and let go of when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DavLockRow {
    /// `urn:uuid:...`: what the client sends back (`If`, `Lock-Token`).
    pub token: String,
    /// The first segment of `path`: locks are read by account.
    pub account: String,
    /// The locked path below `/dav`, as WebDAV spells it (percent-encoded).
    pub path: String,
    /// Who took it (the e-mail signed in).
    pub principal: Option<String>,
    /// The client's `owner` element, as XML.
    pub owner: Option<String>,
    pub shared: bool,
    pub deep: bool,
    /// The timeout the lock was given, in seconds.
    pub timeout_secs: Option<i64>,
    /// When it expires (ns); `None`: never.
    pub expires_on: Option<i64>,
}

fn lock_row(r: &super::db::Row) -> super::db::Result<DavLockRow> {
    Ok(DavLockRow {
        token: r.get(0)?,
        account: r.get(1)?,
        path: r.get(2)?,
        principal: r.get(3)?,
        owner: r.get(4)?,
        shared: r.get::<_, i64>(5)? != 0,
        deep: r.get::<_, i64>(6)? != 0,
        timeout_secs: r.get(7)?,
        expires_on: r.get(8)?,
    })
}

const LOCK_COLUMNS: &str =
    "token, account, path, principal, owner, shared, deep, timeout_secs, expires_on";

fn live_locks(conn: &super::db::Conn, account: &str, now: i64) -> Result<Vec<DavLockRow>> {
    let sql = format!(
        "SELECT {LOCK_COLUMNS} FROM dav_locks
         WHERE account = ?1 AND (expires_on IS NULL OR expires_on > ?2)"
    );
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(params![account, now], lock_row)?
        .collect::<super::db::Result<Vec<_>>>()?)
}

impl Store {
    /// The live locks of an account's paths.
    pub fn dav_locks(&self, account: &str) -> Result<Vec<DavLockRow>> {
        let conn = self.conn()?;
        live_locks(&conn, account, super::now_ns())
    }

    /// Takes `lock` unless `conflict` finds one among the account's live locks that it
    /// conflicts with: checked and written in one transaction under the lock of that account's
    /// WebDAV locks (`db::Writers::DavLocks`), so two servers cannot both grant conflicting
    /// locks, and other accounts' grants and uploads do not wait. Expired locks (of any
    /// account: a row lock each, which a refresh of the same lock meets) are dropped on the way.
    pub fn dav_lock(
        &self,
        lock: DavLockRow,
        conflict: impl FnOnce(&[DavLockRow]) -> Option<DavLockRow>,
    ) -> Result<std::result::Result<DavLockRow, DavLockRow>> {
        let now = super::now_ns();
        let conn = self.conn()?;
        let tx = conn.transaction_for(super::db::Writers::dav_locks(&lock.account))?;
        tx.prepare_cached("DELETE FROM dav_locks WHERE expires_on <= ?1")?
            .execute([now])?;
        let live = live_locks(&tx, &lock.account, now)?;
        if let Some(other) = conflict(&live) {
            return Ok(Err(other));
        }
        let sql = format!(
            "INSERT INTO dav_locks ({LOCK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        );
        tx.prepare_cached(&sql)?.execute(params![
            lock.token,
            lock.account,
            lock.path,
            lock.principal,
            lock.owner,
            lock.shared as i64,
            lock.deep as i64,
            lock.timeout_secs,
            lock.expires_on
        ])?;
        tx.commit()?;
        Ok(Ok(lock))
    }

    /// A live lock's new timeout; `None` when it is no longer held. Without a writers' lock:
    /// one row's update, which a grant's conflict check sees or not as a whole (before or
    /// after it), as it would in either order.
    pub fn dav_refresh_lock(
        &self,
        token: &str,
        timeout_secs: Option<i64>,
        expires_on: Option<i64>,
    ) -> Result<Option<DavLockRow>> {
        let now = super::now_ns();
        let conn = self.conn()?;
        let tx = conn.unordered_transaction()?;
        let n = tx
            .prepare_cached(
                "UPDATE dav_locks SET timeout_secs = ?2, expires_on = ?3
                 WHERE token = ?1 AND (expires_on IS NULL OR expires_on > ?4)",
            )?
            .execute(params![token, timeout_secs, expires_on, now])?;
        if n == 0 {
            return Ok(None);
        }
        let sql = format!("SELECT {LOCK_COLUMNS} FROM dav_locks WHERE token = ?1");
        let row = tx.prepare_cached(&sql)?.query_row([token], lock_row)?;
        tx.commit()?;
        Ok(Some(row))
    }

    /// The live locks that hold the node at `path` (taken on it, or for the whole tree on a
    /// folder above it), as the API shows them (`locks=1`, the mount's `user.vaultfs.lock`,
    /// the web page). Keys are WebDAV paths as dav-server spells them: every byte but letters,
    /// digits and `-._~` percent-encoded, as `api::path` encodes a segment; they are decoded
    /// and compared in NFC, as the store takes paths.
    pub fn dav_locks_on(&self, path: &NodePath) -> Result<Vec<Lock>> {
        let Some(account) = path.account() else {
            return Ok(Vec::new());
        };
        let rows = self.dav_locks(&crate::api::path::encode_segment(account))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let on = decoded_key(&r.path)?;
                (on == *path || (r.deep && on.contains(path))).then(|| lock_info(r, &on))
            })
            .collect())
    }

    /// Lets go of locks by their tokens; how many were held. Without a writers' lock, as
    /// [`Store::dav_refresh_lock`]: deletes of rows by key.
    pub fn dav_unlock(&self, tokens: &[String]) -> Result<usize> {
        let conn = self.conn()?;
        let tx = conn.unordered_transaction()?;
        let mut n = 0;
        for t in tokens {
            n += tx
                .prepare_cached("DELETE FROM dav_locks WHERE token = ?1")?
                .execute([t])?;
        }
        tx.commit()?;
        Ok(n)
    }
}

/// The node path of a lock's key; `None` for one that names no node path. (In NFC: keys of
/// locks taken before they were kept in NFC are as the client spelled them.)
fn decoded_key(key: &str) -> Option<NodePath> {
    NodePath::parse_encoded(key).ok()?.into_nfc().ok()
}

/// A lock as the API shows it: its owner element as the text in it (a name, a `mailto:`).
fn lock_info(row: &DavLockRow, on: &NodePath) -> Lock {
    fn words(e: &xmltree::Element, out: &mut Vec<String>) {
        for c in &e.children {
            match c {
                xmltree::XMLNode::Element(c) => words(c, out),
                xmltree::XMLNode::Text(t) | xmltree::XMLNode::CData(t) => {
                    out.extend(t.split_whitespace().map(str::to_string))
                }
                _ => {}
            }
        }
    }
    let owner = row.owner.as_ref().and_then(|x| {
        let mut text = Vec::new();
        words(&xmltree::Element::parse(x.as_bytes()).ok()?, &mut text);
        (!text.is_empty()).then(|| text.join(" "))
    });
    Lock {
        on: on.uri(),
        by: row.principal.clone(),
        owner,
        shared: row.shared,
        expires_on: row.expires_on.map(|ns| {
            crate::api::format_time(
                std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64),
            )
        }),
    }
}
