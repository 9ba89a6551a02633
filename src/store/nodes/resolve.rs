//! Paths and IDs to rows, with the account check in one place: a path is walked from its
//! account down ([`resolve`]), a file ID is found only under the caller's account and only while
//! attached ([`file_by_id`]), and a row's path is read back up its parents ([`path_of`]).

use super::{MAX_WALK_DEPTH, NodeKind, NodeRow, SELECT, read_row};
use crate::api::{Error, NodePath, Result};
use crate::store::Scope;
use crate::store::db::{Conn as Connection, OptionalExtension, params};

// The statements run for every file (by the batched writes and listings) are prepared once
// per connection (`prepare_cached`): parsing them each time was a visible share of a burst.
pub(super) fn get_row(conn: &Connection, id: i64) -> Result<Option<NodeRow>> {
    Ok(conn
        .prepare_cached(&format!("{SELECT} WHERE n.id = ?1"))?
        .query_row([id], read_row)
        .optional()?)
}

pub(super) fn child_row(conn: &Connection, parent: i64, name: &str) -> Result<Option<NodeRow>> {
    Ok(conn
        .prepare_cached(&format!("{SELECT} WHERE n.parent_id = ?1 AND n.name = ?2"))?
        .query_row(params![parent, name], read_row)
        .optional()?)
}

/// The other spellings a stored name may have for `name`: in NFC (as new names are stored) and
/// in NFD (as older builds stored what a client sent, macOS's names typically). Worked out only
/// once the name as given is not found: most lookups find it.
fn other_spellings(name: &str) -> Vec<String> {
    let (nfc, nfd) = (crate::api::path::nfc(name), crate::api::path::nfd(name));
    let nfd = (nfd != nfc && nfd != name).then_some(nfd);
    let nfc = (nfc != name).then_some(nfc);
    nfc.into_iter().chain(nfd).collect()
}

/// The child `name` of `parent`, as given or in one of its [`other_spellings`].
pub(super) fn find_child(conn: &Connection, parent: i64, name: &str) -> Result<Option<NodeRow>> {
    if let Some(row) = child_row(conn, parent, name)? {
        return Ok(Some(row));
    }
    for spelling in other_spellings(name) {
        if let Some(row) = child_row(conn, parent, &spelling)? {
            return Ok(Some(row));
        }
    }
    Ok(None)
}

/// [`find_child`] and what `account` holds (nodes, bytes, as the quota counts them), in one
/// statement when the name has no other spelling (upload step 1 reads both under the writers'
/// lock, where each round trip holds up every writer of the store).
pub(super) fn find_child_and_held(
    conn: &Connection,
    parent: i64,
    account: i64,
    name: &str,
) -> Result<(Option<NodeRow>, (i64, i64))> {
    if !other_spellings(name).is_empty() {
        let child = find_child(conn, parent, name)?;
        return Ok((child, super::limits::held(conn, account)?));
    }
    Ok(conn
        .prepare_cached(
            "SELECT n.id, n.parent_id, n.account_id, n.kind, n.name, n.created_on, n.modified_on,
                    v.length, v.md5, n.exec, u.nodes, u.bytes
             FROM (SELECT 1 AS one) o
             LEFT JOIN usage u ON u.account_id = ?3
             LEFT JOIN nodes n ON n.parent_id = ?1 AND n.name = ?2
             LEFT JOIN versions v ON v.id = n.current_version",
        )?
        .query_row(params![parent, name, account], |r| {
            let child = match r.get::<_, Option<i64>>(0)? {
                Some(_) => Some(read_row(r)?),
                None => None,
            };
            let held = (
                r.get::<_, Option<i64>>(10)?.unwrap_or(0),
                r.get::<_, Option<i64>>(11)?.unwrap_or(0),
            );
            Ok((child, held))
        })?)
}

pub(super) fn has_children(conn: &Connection, id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM nodes WHERE parent_id = ?1 LIMIT 1")?
        .exists([id])?)
}

fn outside() -> Error {
    Error::forbidden("that path is outside your account")
}

/// Resolves a non-root path to its node, checking the account against the scope first, so a
/// caller learns nothing about other accounts.
pub(in crate::store) fn resolve(
    conn: &Connection,
    scope: Scope,
    path: &NodePath,
) -> Result<NodeRow> {
    match resolve_at_once(conn, scope, path)? {
        Some((row, _)) => Ok(row),
        None => resolve_by_steps(conn, scope, path),
    }
}

/// [`resolve`] with the node's path as stored (its names as the store spells them).
pub(in crate::store) fn resolve_with_path(
    conn: &Connection,
    scope: Scope,
    path: &NodePath,
) -> Result<(NodeRow, NodePath)> {
    if let Some(found) = resolve_at_once(conn, scope, path)? {
        return Ok(found);
    }
    let row = resolve_by_steps(conn, scope, path)?;
    let stored = path_of(conn, row.id)?;
    Ok((row, stored))
}

/// Paths of at most this many segments are resolved in one statement (one join a level: more
/// would cost the planner more than the round trips they save).
const AT_ONCE_DEPTH: usize = 8;

/// The node at `path` and its path as stored, in one statement (on PostgreSQL a round trip,
/// where a walk down took one a level and another for the stored names): `None` when the path
/// is deeper than [`AT_ONCE_DEPTH`] or not found as spelled (then [`resolve_by_steps`] finds
/// other spellings of its names, and says which error). Another account's path is refused
/// when found, as the steps refuse it.
fn resolve_at_once(
    conn: &Connection,
    scope: Scope,
    path: &NodePath,
) -> Result<Option<(NodeRow, NodePath)>> {
    let segments = path.segments();
    let depth = segments.len();
    if depth == 0 || depth > AT_ONCE_DEPTH {
        return Ok(None);
    }
    let last = depth - 1;
    let mut sql = format!(
        "SELECT n{last}.id, n{last}.parent_id, n{last}.account_id, n{last}.kind, n{last}.name,
         n{last}.created_on, n{last}.modified_on, v.length, v.md5, n{last}.exec, n0.id"
    );
    for i in 0..depth {
        sql.push_str(&format!(", n{i}.name"));
    }
    sql.push_str(" FROM nodes n0");
    for i in 1..depth {
        sql.push_str(&format!(
            " JOIN nodes n{i} ON n{i}.parent_id = n{}.id AND n{i}.name = ?{}",
            i - 1,
            i + 1
        ));
    }
    sql.push_str(&format!(
        " LEFT JOIN versions v ON v.id = n{last}.current_version
         WHERE n0.parent_id IS NULL AND n0.kind = 0 AND n0.name = ?1"
    ));
    let names: Vec<&dyn crate::store::db::Param> = segments
        .iter()
        .map(|s| s as &dyn crate::store::db::Param)
        .collect();
    let found = conn
        .prepare_cached(&sql)?
        .query_row(&names[..], |r| {
            let names = (0..depth)
                .map(|i| r.get::<_, String>(11 + i))
                .collect::<crate::store::db::Result<Vec<_>>>()?;
            Ok((read_row(r)?, r.get::<_, i64>(10)?, names))
        })
        .optional()?;
    let Some((row, account, names)) = found else {
        return Ok(None);
    };
    if let Scope::Account(a) = scope {
        if a != account {
            return Err(outside());
        }
    }
    Ok(Some((row, NodePath::from_segments(names)?)))
}

/// [`resolve`] a level at a time, each name as given or in its other spellings.
fn resolve_by_steps(conn: &Connection, scope: Scope, path: &NodePath) -> Result<NodeRow> {
    let segments = path.segments();
    let (first, rest) = segments
        .split_first()
        .ok_or_else(|| Error::bad_path("the root has no node"))?;
    let account_named = |name: &str| -> Result<Option<NodeRow>> {
        Ok(conn
            .prepare_cached(&format!(
                "{SELECT} WHERE n.parent_id IS NULL AND n.kind = 0 AND n.name = ?1"
            ))?
            .query_row([name], read_row)
            .optional()?)
    };
    let mut account = account_named(first)?;
    if account.is_none() {
        for spelling in other_spellings(first) {
            account = account_named(&spelling)?;
            if account.is_some() {
                break;
            }
        }
    }
    let mut row = match (scope, account) {
        (Scope::Account(a), Some(acc)) if acc.id == a => acc,
        (Scope::Account(_), _) => return Err(outside()),
        (Scope::All, Some(acc)) => acc,
        (Scope::All, None) => return Err(Error::not_found(format!("{path} not found"))),
    };
    for seg in rest {
        if row.is_file() {
            return Err(Error::not_found(format!("{path} not found")));
        }
        row = find_child(conn, row.id, seg)?
            .ok_or_else(|| Error::not_found(format!("{path} not found")))?;
    }
    Ok(row)
}

/// Resolves a file ID (opaque to clients; decimal digits here) with the account check. Another
/// account's file is "not found", exactly as an unused ID: IDs are sequential, and a different
/// answer would let anyone count the files of others.
pub(in crate::store) fn file_by_id(conn: &Connection, scope: Scope, id: &str) -> Result<NodeRow> {
    Ok(file_and_path(conn, scope, id)?.0)
}

/// [`file_by_id`] with the file's path as stored, all from one walk up the tree (which also
/// reads the file's row and tells whether it is attached): one statement, where the row, a
/// walk to check it is attached and a walk for its path took three.
pub(in crate::store) fn file_and_path(
    conn: &Connection,
    scope: Scope,
    id: &str,
) -> Result<(NodeRow, NodePath)> {
    let (row, path, _) = file_walk(conn, scope, id, None)?;
    Ok((row, path))
}

/// A version of a file and what the file's account holds (nodes, bytes), read by the same
/// walk as the file ([`file_path_version`]).
pub(in crate::store) struct Beside {
    pub version: Option<VersionRow>,
    pub held: (i64, i64),
}

/// A version of a file, as upload step 3 reads it.
pub(in crate::store) struct VersionRow {
    pub id: i64,
    pub length: u64,
    pub md5: Option<String>,
    pub committed: bool,
    pub base: crate::api::Base,
    /// The bytes (once committed).
    pub blob: Option<String>,
    /// The attributes the file takes when the version becomes current.
    pub modified_on: Option<i64>,
    pub exec: Option<u32>,
}

/// [`file_and_path`] with the file's version `version` (if it has it) and its account's usage,
/// in the same statement: upload step 3 reads these under the writers' lock, where each
/// round trip holds up every writer of the store.
pub(in crate::store) fn file_path_version(
    conn: &Connection,
    scope: Scope,
    id: &str,
    version: &str,
) -> Result<(NodeRow, NodePath, Beside)> {
    file_walk(conn, scope, id, Some(version.parse().unwrap_or(-1)))
}

fn file_walk(
    conn: &Connection,
    scope: Scope,
    id: &str,
    version: Option<i64>,
) -> Result<(NodeRow, NodePath, Beside)> {
    let not_found = || Error::not_found(format!("no file with ID {id}"));
    let n: i64 = id.parse().map_err(|_| not_found())?;
    let (row, walk, beside) = walk_up(conn, n, version)?;
    let row = row
        .filter(|row| row.is_file())
        .filter(|row| match scope {
            Scope::Account(a) => a == row.account_id,
            Scope::All => true,
        })
        .ok_or_else(not_found)?;
    // A file of a tree being purged (deleted, detached from its account) is gone already.
    match walk {
        Walk::Attached(path) => Ok((row, path, beside)),
        Walk::Detached(_) | Walk::Damaged | Walk::Vanished => Err(not_found()),
    }
}

/// Where a walk up from a node ended.
enum Walk {
    /// At an account: the node's path.
    Attached(NodePath),
    /// At a top that is no account (a tree a delete detached): the names from that top
    /// (which may not make a path: a detached top's name is the purge's own).
    Detached(Vec<String>),
    /// At a missing parent, or not within [`MAX_WALK_DEPTH`] levels (a cycle).
    Damaged,
    /// The node is not there.
    Vanished,
}

/// Walks up from node `id` to the top of its tree, in one statement (on PostgreSQL a statement
/// is a round trip, and a file's path is read in most transactions of an upload): the node's
/// row, where the walk ended, and beside the node its version `version` (when asked for and
/// there) and its account's usage.
fn walk_up(
    conn: &Connection,
    id: i64,
    version: Option<i64>,
) -> Result<(Option<NodeRow>, Walk, Beside)> {
    let mut names = Vec::new();
    let mut top = None;
    let mut first = None;
    let mut beside = Beside {
        version: None,
        held: (0, 0),
    };
    let mut rows = conn.prepare_cached(
        "WITH RECURSIVE up(id, parent_id, kind, name, depth) AS (
             SELECT id, parent_id, kind, name, CAST(0 AS BIGINT) FROM nodes WHERE id = ?1
             UNION ALL SELECT n.id, n.parent_id, n.kind, n.name, up.depth + 1 FROM nodes n
                 JOIN up ON n.id = up.parent_id WHERE up.depth < ?2)
         SELECT n.id, up.parent_id, n.account_id, up.kind, up.name, n.created_on,
                n.modified_on, v.length, v.md5, n.exec,
                pv.id, pv.length, pv.md5, pv.committed, pv.base, pv.blob, pv.modified_on,
                pv.exec, u.nodes, u.bytes
         FROM up LEFT JOIN nodes n ON n.id = up.id AND up.depth = 0
         LEFT JOIN versions v ON v.id = n.current_version
         LEFT JOIN versions pv ON pv.id = ?3 AND pv.file_id = n.id
         LEFT JOIN usage u ON u.account_id = n.account_id
         ORDER BY up.depth",
    )?;
    for r in rows.query_map(params![id, MAX_WALK_DEPTH, version.unwrap_or(-1)], |r| {
        let row = match r.get::<_, Option<i64>>(0)? {
            Some(_) => Some(read_row(r)?),
            None => None,
        };
        let version = match r.get::<_, Option<i64>>(10)? {
            Some(vid) => Some(VersionRow {
                id: vid,
                length: r.get::<_, i64>(11)? as u64,
                md5: r.get(12)?,
                committed: r.get::<_, i64>(13)? != 0,
                base: crate::api::Base::from_column(r.get(14)?),
                blob: r.get(15)?,
                modified_on: r.get(16)?,
                exec: r.get::<_, Option<i64>>(17)?.map(|e| e as u32),
            }),
            None => None,
        };
        let held = (
            r.get::<_, Option<i64>>(18)?.unwrap_or(0),
            r.get::<_, Option<i64>>(19)?.unwrap_or(0),
        );
        Ok((
            row,
            r.get::<_, Option<i64>>(1)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
            version,
            held,
        ))
    })? {
        let (row, parent, kind, name, version, held) = r?;
        if first.is_none() && row.is_some() {
            first = row;
            beside = Beside { version, held };
        }
        names.push(name);
        top = Some((parent, kind));
    }
    let walk = match top {
        None => Walk::Vanished,
        Some((None, kind)) if names.len() as i64 <= MAX_WALK_DEPTH => {
            names.reverse();
            if kind == NodeKind::Account as i64 {
                Walk::Attached(NodePath::from_segments(names)?)
            } else {
                Walk::Detached(names)
            }
        }
        // The walk ended at a parent that is not there, or went on too long: a cycle.
        Some(_) => Walk::Damaged,
    };
    Ok((first, walk, beside))
}

pub(super) fn attached(conn: &Connection, id: i64) -> Result<bool> {
    Ok(matches!(walk_up(conn, id, None)?.1, Walk::Attached(_)))
}

/// The error of a walk of the tree that went [`MAX_WALK_DEPTH`] levels from node `id`: the
/// tree is damaged (a cycle of parents), which `vaultfs check --repair` mends.
pub(in crate::store) fn damaged(id: i64) -> Error {
    Error::internal(format!(
        "the tree at node {id} is more than {MAX_WALK_DEPTH} levels deep or a cycle: \
         the operator can repair it with `vaultfs check --repair`"
    ))
}

/// Whether `ancestor` is `id` or one of its parents, by IDs walking up (at most
/// [`MAX_WALK_DEPTH`] levels): what "inside itself" means, whatever the spelling of the paths.
pub(super) fn is_within(conn: &Connection, id: i64, ancestor: i64) -> Result<bool> {
    let mut stmt = conn.prepare_cached("SELECT parent_id FROM nodes WHERE id = ?1")?;
    let mut at = id;
    for _ in 0..=MAX_WALK_DEPTH {
        if at == ancestor {
            return Ok(true);
        }
        match stmt
            .query_row([at], |r| r.get::<_, Option<i64>>(0))
            .optional()?
        {
            Some(Some(parent)) => at = parent,
            _ => return Ok(false),
        }
    }
    Err(damaged(id))
}

/// The row of a node known to exist.
pub(in crate::store) fn row(conn: &Connection, id: i64) -> Result<NodeRow> {
    get_row(conn, id)?.ok_or_else(|| Error::internal(format!("node {id} vanished")))
}

/// The path of a node, walking up its parents (at most [`MAX_WALK_DEPTH`] levels), in one
/// statement: on PostgreSQL a statement is a round trip, and a file's path is read in most
/// transactions of an upload.
pub(in crate::store) fn path_of(conn: &Connection, id: i64) -> Result<NodePath> {
    match walk_up(conn, id, None)?.1 {
        Walk::Attached(path) => Ok(path),
        Walk::Detached(names) => NodePath::from_segments(names),
        Walk::Vanished => Err(Error::internal(format!("node {id} vanished"))),
        Walk::Damaged => Err(damaged(id)),
    }
}

/// Folders resolved within one transaction, for a batch of files that mostly share a few: a
/// path is walked from its account down once, not once per file, and the folder's path as
/// stored (names in NFC, which the caller's spelling may not be) is read once. Valid while
/// the caller holds the store's lock and the transaction (nothing can move or remove a folder).
#[derive(Default)]
pub(in crate::store) struct Folders(std::collections::HashMap<NodePath, (NodeRow, NodePath)>);

impl Folders {
    /// The folder at `path` and its path as stored.
    pub(in crate::store) fn resolve(
        &mut self,
        conn: &Connection,
        scope: Scope,
        path: &NodePath,
    ) -> Result<(NodeRow, NodePath)> {
        if let Some(found) = self.0.get(path) {
            return Ok(found.clone());
        }
        let (row, stored) = resolve_with_path(conn, scope, path)?;
        self.0.insert(path.clone(), (row.clone(), stored.clone()));
        Ok((row, stored))
    }
}

pub(super) fn split(path: &NodePath) -> Result<(NodePath, &str)> {
    match (path.parent(), path.name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(Error::forbidden("the root cannot be changed")),
    }
}

/// A container that can hold files and folders (a vault or a folder).
pub(super) fn require_folder(row: &NodeRow, path: &NodePath) -> Result<()> {
    match row.kind {
        NodeKind::Vault | NodeKind::Folder => Ok(()),
        NodeKind::Account => Err(Error::forbidden(
            "an account holds vaults only; vaults come with accounts",
        )),
        NodeKind::File => Err(Error::conflict(
            "not_a_folder",
            format!("{path} is a file, not a folder"),
        )),
    }
}
