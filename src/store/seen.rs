//! What each WebDAV device was shown (issue 50), so that a PUT without preconditions over a
//! version the device never saw keeps both, as the mount's conflict copies do: the version
//! there stays at the name, the device's bytes become a conflict copy beside it.
//!
//! **The device** is the secret a client signs in with, by its sha256 as `app_passwords` and
//! `tokens` key it: an app password is one device (`vaultfs user app-password add`), a token of
//! the API one sign-in of the program that holds it.
//!
//! **Shown** (`dav_seen`, a row per device and node, in the database so that every server of
//! one PostgreSQL agrees): a file's version the device was answered (GET, HEAD, PROPFIND and
//! LOCK of the file, and the version its own PUT stored); a folder it listed, as the account's
//! newest change ID then. A listing of 10,000 files is one row: a file's version was in it
//! unless the change log has a change of that file (made, new version, moved or copied there)
//! after that ID, and the log still holds every change after it (its floor, `changes`). An
//! account's change IDs commit in order (`changes`), so none committed later is below it. A row
//! unchanged is written again at most daily; rows older than [`SEEN_KEPT`] are pruned, now and
//! then as rows are written, and a device's go when its app password is revoked.
//!
//! **The PUT** ([`Store::put_keeping_both`]) decides against the file as it is, then stores
//! with that version as the base, which the commit checks again (docs/design.md §5): another
//! version that came in between gives the bytes back, and the decision is made again.

use std::time::{Duration, SystemTime};

use super::changes::kind_code;
use super::db::{Conn, OptionalExtension, params};
use super::nodes::{NodeRow, resolve};
use super::{Scope, Store, now_ns};
use crate::api::{Base, ChangeKind, Error, ErrorKind, Node, NodePath, Result};
use crate::store::blobs::StagedBlob;

/// How long what a device was shown is remembered.
pub const SEEN_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);
/// A row that would be written unchanged is written again after this long, so that one in use
/// is never pruned.
const SEEN_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// One write of a row in this many (at random) prunes the old ones.
const PRUNE_ONE_IN: u32 = 64;
/// Names tried for a conflict copy (` 2`, ` 3`... after the first).
const COPY_NAMES: u32 = 20;
/// Decisions made again when other versions keep coming in between.
const ROUNDS: u32 = 4;

/// A WebDAV client's device (see the module's comment).
#[derive(Clone, PartialEq, Eq)]
pub struct Device(Vec<u8>);

impl Device {
    /// The device of the secret whose hash this is (`store::auth::dav_device`).
    pub(in crate::store) fn of_hash(hash: Vec<u8>) -> Device {
        Device(hash)
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short: String = self.0.iter().take(4).map(|b| format!("{b:02x}")).collect();
        write!(f, "Device({short}…)")
    }
}

/// Where a PUT's bytes went.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The file that holds them now.
    pub node: Node,
    /// Set when that is a conflict copy: the path it was made at (the name asked for kept a
    /// version the device was never shown).
    pub copy: Option<NodePath>,
}

/// What a PUT does with the file it names.
enum Over {
    /// A new version over this base.
    Version(Base),
    /// Nothing: the bytes are its current version (a retry).
    Same(Box<Node>),
    /// A conflict copy beside it: a version the device never saw is current (its md5).
    Copy(String),
}

fn age(d: Duration) -> i64 {
    now_ns().saturating_sub(d.as_nanos() as i64)
}

/// Prunes rows older than [`SEEN_KEPT`] with a chance of one in [`PRUNE_ONE_IN`] (by the index
/// of their time: nothing read when nothing is that old).
fn maybe_prune(tx: &Conn) -> Result<()> {
    if rand::random::<u32>() % PRUNE_ONE_IN == 0 {
        prune(tx)?;
    }
    Ok(())
}

fn prune(tx: &Conn) -> Result<usize> {
    Ok(tx
        .prepare_cached("DELETE FROM dav_seen WHERE at < ?1")?
        .execute([age(SEEN_KEPT)])?)
}

/// Whether `device` was shown `file`'s current version (see the module's comment).
fn saw(conn: &Conn, device: &Device, file: &NodeRow) -> Result<bool> {
    let row = |node: i64| -> Result<Option<(Option<String>, Option<i64>)>> {
        Ok(conn
            .prepare_cached(
                "SELECT md5, change_id FROM dav_seen WHERE device = ?1 AND node_id = ?2",
            )?
            .query_row(params![device.0, node], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    };
    if let Some((Some(md5), _)) = row(file.id)?
        && file.md5.as_ref() == Some(&md5)
    {
        return Ok(true);
    }
    let Some(parent) = file.parent_id else {
        return Ok(false);
    };
    let Some((_, Some(listed))) = row(parent)? else {
        return Ok(false);
    };
    let floor: Option<i64> = conn
        .prepare_cached("SELECT floor FROM change_floors WHERE account_id = ?1")?
        .query_row([file.account_id], |r| r.get(0))
        .optional()?;
    if floor.is_some_and(|f| f > listed) {
        // Changes after the listing were pruned: one of them may be of this file.
        return Ok(false);
    }
    // The account's changes after the listing (at most the log's length), by its index.
    let changed = conn
        .prepare_cached(
            "SELECT 1 FROM changes WHERE account_id = ?1 AND id > ?2 AND node_id = ?3
             AND kind <> ?4 LIMIT 1",
        )?
        .exists(params![
            file.account_id,
            listed,
            file.id,
            kind_code(ChangeKind::Attributes)
        ])?;
    Ok(!changed)
}

/// Forgets what the devices of `hashes` were shown (their app passwords revoked).
pub(in crate::store) fn forget_devices(tx: &Conn, hashes: &[Vec<u8>]) -> Result<()> {
    for h in hashes {
        tx.prepare_cached("DELETE FROM dav_seen WHERE device = ?1")?
            .execute([h])?;
    }
    Ok(())
}

/// The name the device goes by in its conflict copies: its app password's, else the client ID
/// of its token.
fn device_name(conn: &Conn, device: &Device) -> Result<String> {
    let name: Option<String> = conn
        .prepare_cached(
            "SELECT name FROM app_passwords WHERE hash = ?1
             UNION ALL SELECT client_id FROM tokens WHERE hash = ?1",
        )?
        .query_row([&device.0], |r| r.get(0))
        .optional()?;
    Ok(name.unwrap_or_else(|| "WebDAV".to_string()))
}

impl Store {
    /// `device` was answered the version `md5` of the file `file_id`.
    pub fn dav_shown(&self, device: &Device, file_id: &str, md5: &str) -> Result<()> {
        let Ok(id) = file_id.parse::<i64>() else {
            return Ok(());
        };
        let conn = self.conn()?;
        let tx = conn.unordered_transaction()?;
        tx.prepare_cached(
            "INSERT INTO dav_seen (device, node_id, md5, change_id, at) VALUES (?1, ?2, ?3, NULL, ?4)
             ON CONFLICT (device, node_id) DO UPDATE
             SET md5 = excluded.md5, change_id = NULL, at = excluded.at
             WHERE dav_seen.md5 IS NULL OR dav_seen.md5 <> excluded.md5 OR dav_seen.at < ?5",
        )?
        .execute(params![device.0, id, md5, now_ns(), age(SEEN_REFRESH)])?;
        maybe_prune(&tx)?;
        tx.commit()?;
        Ok(())
    }

    /// `device` is listing the folder at `path`: the account's newest change ID is noted now,
    /// before the listing is read (a change in between counts as after it: never a version
    /// taken for seen that was not).
    pub fn dav_listed(&self, scope: Scope, device: &Device, path: &NodePath) -> Result<()> {
        if path.is_root() {
            return Ok(());
        }
        let conn = self.conn()?;
        let tx = conn.unordered_transaction()?;
        let folder = resolve(&tx, scope, path)?;
        if folder.is_file() {
            return Ok(());
        }
        tx.prepare_cached(
            "INSERT INTO dav_seen (device, node_id, md5, change_id, at) VALUES (?1, ?2, NULL,
                 (SELECT coalesce(max(id), 0) FROM changes WHERE account_id = ?3), ?4)
             ON CONFLICT (device, node_id) DO UPDATE
             SET md5 = NULL, change_id = excluded.change_id, at = excluded.at
             WHERE dav_seen.change_id IS NULL OR dav_seen.change_id <> excluded.change_id
                 OR dav_seen.at < ?5",
        )?
        .execute(params![
            device.0,
            folder.id,
            folder.account_id,
            now_ns(),
            age(SEEN_REFRESH)
        ])?;
        maybe_prune(&tx)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores `staged` at `path` for a WebDAV PUT of `device` without preconditions: a new
    /// version over one the device was shown (or stored), or over no content; nothing over the
    /// same bytes (a retry of a PUT that was stored); over a version it was never shown, a
    /// conflict copy beside it (`NAME (conflict TIME DEVICE).EXT`, `api::path::conflict_name`),
    /// the version there kept at the name.
    pub fn put_keeping_both(
        &self,
        scope: Scope,
        path: &NodePath,
        mut staged: StagedBlob,
        device: &Device,
    ) -> Result<Kept> {
        for _ in 0..ROUNDS {
            let (target, stored) = match self.judge(scope, path, &staged, device)? {
                Over::Same(node) => return self.kept(device, *node, None),
                Over::Version(base) => (path.clone(), self.put_staged(scope, path, staged, &base)),
                Over::Copy(theirs) => {
                    let copy = self.free_copy_path(scope, path, device)?;
                    log::info!(
                        "webdav: {path} holds a version (md5 {theirs}) its writer {device:?} \
                         was never shown: that version stays, the bytes written are kept \
                         beside it as {copy}"
                    );
                    let stored = self.put_staged(scope, &copy, staged, &Base::Absent);
                    (copy, stored)
                }
            };
            match stored {
                Ok(node) => {
                    let copy = (target != *path).then_some(target);
                    return self.kept(device, node, copy);
                }
                // Another version came in between: judged again.
                Err((e, Some(back))) if e.kind == ErrorKind::Precondition => staged = *back,
                Err((e, _)) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "busy",
            format!("{path} kept changing while this was stored; nothing was changed: try again"),
        ))
    }

    /// What a PUT of `staged` by `device` does at `path`, as the file is now.
    fn judge(
        &self,
        scope: Scope,
        path: &NodePath,
        staged: &StagedBlob,
        device: &Device,
    ) -> Result<Over> {
        let conn = self.conn()?;
        let snapshot = conn.snapshot()?;
        let file = match resolve(&snapshot, scope, path) {
            Ok(row) if row.is_file() => row,
            // A new name (or a folder, which the put refuses as any).
            Ok(_) => return Ok(Over::Version(Base::Absent)),
            Err(e) if e.kind == ErrorKind::NotFound => return Ok(Over::Version(Base::Absent)),
            Err(e) => return Err(e),
        };
        let over = match &file.md5 {
            Some(md5) if *md5 == staged.md5 => Over::Same(Box::new(file.to_api(path))),
            _ if Base::Absent.holds(file.md5.as_deref()) => Over::Version(Base::Absent),
            Some(md5) if saw(&snapshot, device, &file)? => Over::Version(Base::Md5(md5.clone())),
            Some(md5) => Over::Copy(md5.clone()),
            None => Over::Version(Base::Absent),
        };
        Ok(over)
    }

    /// A name beside `path` for the device's conflict copy that nothing has.
    fn free_copy_path(&self, scope: Scope, path: &NodePath, device: &Device) -> Result<NodePath> {
        let (Some(folder), Some(name)) = (path.parent(), path.name()) else {
            return Err(Error::forbidden("the root holds no files"));
        };
        let conn = self.conn()?;
        let snapshot = conn.snapshot()?;
        let by = device_name(&snapshot, device)?;
        let now = SystemTime::now();
        for n in 1..=COPY_NAMES {
            let copy = folder.child(&crate::api::path::conflict_name(name, now, &by, n))?;
            match resolve(&snapshot, scope, &copy) {
                Err(e) if e.kind == ErrorKind::NotFound => return Ok(copy),
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        Err(Error::conflict(
            "exists",
            format!("{COPY_NAMES} conflict copies of {path} have this minute's name already"),
        ))
    }

    /// The PUT's answer: what the device is shown of the file it stored.
    fn kept(&self, device: &Device, node: Node, copy: Option<NodePath>) -> Result<Kept> {
        if let (Some(id), Some(md5)) = (node.file_id(), &node.md5_checksum) {
            // The bytes are stored whatever happens here; a row not written makes the next PUT
            // over them a conflict copy, never a loss.
            if let Err(e) = self.dav_shown(device, &id, md5) {
                log::warn!("webdav: could not note the version stored by {device:?}: {e}");
            }
        }
        Ok(Kept { node, copy })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows a week old go; younger ones stay.
    #[test]
    fn old_rows_are_pruned() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        let conn = store.conn().unwrap();
        for (node, at) in [(1, age(SEEN_KEPT) - 1), (2, now_ns())] {
            conn.execute(
                "INSERT INTO dav_seen (device, node_id, md5, at) VALUES (?1, ?2, 'x', ?3)",
                params![vec![1u8], node, at],
            )
            .unwrap();
        }
        assert_eq!(prune(&conn).unwrap(), 1);
        let left: i64 = conn
            .query_row("SELECT node_id FROM dav_seen", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 2);
    }
}
