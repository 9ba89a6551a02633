//! The tree: resolution of paths and IDs (with the account check, in one place), listing,
//! folders, the three upload steps, copy/move and delete.

use std::sync::{Arc, Mutex};

use super::db::{Conn as Connection, OptionalExtension, Row, Tx as Transaction, params};

use super::blobs::{BlobFile, BlobWriter, StagedBlob};
use super::{FIRST_VAULT, Scope, Store, now_ns, ns_to_time, time_to_ns};
use crate::api::{
    EXEC_BITS, Error, FileAttrs, FileExProperties, Node, NodePath, NodeType, Result, file_links,
    file_mode, format_time,
};
use crate::sync::relock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Account = 0,
    Vault = 1,
    Folder = 2,
    File = 3,
}

impl NodeKind {
    fn from_i64(v: i64) -> NodeKind {
        match v {
            0 => NodeKind::Account,
            1 => NodeKind::Vault,
            2 => NodeKind::Folder,
            _ => NodeKind::File,
        }
    }
    fn node_type(self) -> NodeType {
        match self {
            NodeKind::Account => NodeType::AccountNodeType,
            NodeKind::Vault => NodeType::VaultNodeType,
            NodeKind::Folder => NodeType::FolderNodeType,
            NodeKind::File => NodeType::FileNodeType,
        }
    }
}

/// Copy or move, for [`Store::transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    Copy,
    Move,
}

/// A node as stored, with the size and md5 of its current version.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: i64,
    pub parent_id: Option<i64>,
    pub account_id: i64,
    pub kind: NodeKind,
    pub name: String,
    pub created_on: i64,
    pub modified_on: i64,
    pub size: Option<u64>,
    pub md5: Option<String>,
    /// Files: the execute bits a client set.
    pub exec: u32,
}

/// md5 of no bytes: the checksum of a file created in step 1 and not uploaded yet.
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

const SELECT: &str = "SELECT n.id, n.parent_id, n.account_id, n.kind, n.name, n.created_on, n.modified_on, \
                      v.length, v.md5, n.exec FROM nodes n LEFT JOIN versions v ON v.id = n.current_version";

fn read_row(r: &Row) -> super::db::Result<NodeRow> {
    Ok(NodeRow {
        id: r.get(0)?,
        parent_id: r.get(1)?,
        account_id: r.get(2)?,
        kind: NodeKind::from_i64(r.get(3)?),
        name: r.get(4)?,
        created_on: r.get(5)?,
        modified_on: r.get(6)?,
        size: r.get::<_, Option<i64>>(7)?.map(|s| s as u64),
        md5: r.get(8)?,
        exec: r.get(9)?,
    })
}

impl NodeRow {
    pub fn is_file(&self) -> bool {
        self.kind == NodeKind::File
    }

    /// The wire object of this node at `path`.
    pub fn to_api(&self, path: &NodePath) -> Node {
        let mut node = Node {
            name: self.name.clone(),
            uri: path.uri(),
            node_type: self.kind.node_type(),
            created_on: Some(format_time(ns_to_time(self.created_on))),
            modified_on: Some(format_time(ns_to_time(self.modified_on))),
            ..Default::default()
        };
        if self.is_file() {
            let id = self.id.to_string();
            node.size = Some(self.size.unwrap_or(0));
            node.md5_checksum = Some(self.md5.clone().unwrap_or_else(|| EMPTY_MD5.to_string()));
            node.mode = Some(file_mode(self.exec));
            file_links(&mut node, &id);
            node.id = Some(id);
        }
        node
    }
}

/// The synthetic root `/nodes/pth`, whose children are the accounts the caller may see.
fn root_node() -> Node {
    Node {
        name: String::new(),
        uri: NodePath::root().uri(),
        node_type: NodeType::FolderNodeType,
        ..Default::default()
    }
}

// The statements run for every file (by the batched writes and listings) are prepared once
// per connection (`prepare_cached`): parsing them each time was a visible share of a burst.
fn get_row(conn: &Connection, id: i64) -> Result<Option<NodeRow>> {
    Ok(conn
        .prepare_cached(&format!("{SELECT} WHERE n.id = ?1"))?
        .query_row([id], read_row)
        .optional()?)
}

fn child_row(conn: &Connection, parent: i64, name: &str) -> Result<Option<NodeRow>> {
    Ok(conn
        .prepare_cached(&format!("{SELECT} WHERE n.parent_id = ?1 AND n.name = ?2"))?
        .query_row(params![parent, name], read_row)
        .optional()?)
}

/// The child `name` of `parent`, spelled as given or, as new names are stored, in NFC.
fn find_child(conn: &Connection, parent: i64, name: &str) -> Result<Option<NodeRow>> {
    if let Some(row) = child_row(conn, parent, name)? {
        return Ok(Some(row));
    }
    let nfc = crate::api::path::nfc(name);
    if nfc == name {
        return Ok(None);
    }
    child_row(conn, parent, &nfc)
}

fn has_children(conn: &Connection, id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM nodes WHERE parent_id = ?1 LIMIT 1")?
        .exists([id])?)
}

fn outside() -> Error {
    Error::forbidden("that path is outside your account")
}

/// Resolves a non-root path to its node, checking the account against the scope first, so a
/// caller learns nothing about other accounts.
fn resolve(conn: &Connection, scope: Scope, path: &NodePath) -> Result<NodeRow> {
    let (first, rest) = path
        .segments()
        .split_first()
        .ok_or_else(|| Error::bad_path("the root has no node"))?;
    let account = conn
        .prepare_cached(&format!(
            "{SELECT} WHERE n.parent_id IS NULL AND n.kind = 0 AND n.name = ?1"
        ))?
        .query_row([first], read_row)
        .optional()?;
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
pub(super) fn file_by_id(conn: &Connection, scope: Scope, id: &str) -> Result<NodeRow> {
    let not_found = || Error::not_found(format!("no file with ID {id}"));
    let n: i64 = id.parse().map_err(|_| not_found())?;
    let row = get_row(conn, n)?
        .filter(|row| row.is_file())
        .filter(|row| match scope {
            Scope::Account(a) => a == row.account_id,
            Scope::All => true,
        })
        .ok_or_else(not_found)?;
    // A file of a tree being purged (deleted, detached from its account) is gone already.
    if !attached(conn, row.id)? {
        return Err(not_found());
    }
    Ok(row)
}

/// Whether the node is under an account, not in a tree a delete detached (`store::purge`).
fn attached(conn: &Connection, id: i64) -> Result<bool> {
    let root_kind: Option<i64> = conn
        .prepare_cached(
            "WITH RECURSIVE up(id, parent_id, kind) AS (
                 SELECT id, parent_id, kind FROM nodes WHERE id = ?1
                 UNION ALL SELECT n.id, n.parent_id, n.kind FROM nodes n JOIN up ON n.id = up.parent_id)
             SELECT kind FROM up WHERE parent_id IS NULL",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(root_kind == Some(NodeKind::Account as i64))
}

/// 507 `quota_exceeded` when `scope`'s account would hold more than its quota with `nodes` more
/// nodes and `bytes` more bytes (a server's account; the mount's store has no quota).
pub(super) fn check_quota(
    conn: &Connection,
    config: &super::StoreConfig,
    scope: Scope,
    nodes: u64,
    bytes: u64,
) -> Result<()> {
    let Scope::Account(account) = scope else {
        return Ok(());
    };
    let (held_nodes, held_bytes): (i64, i64) = conn
        .prepare_cached("SELECT nodes, bytes FROM usage WHERE account_id = ?1")?
        .query_row([account], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0));
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

/// The nodes and bytes (committed versions) of the subtree at `id`, counted up to `limit`
/// nodes: a copy beyond it is refused before any is made.
fn subtree_size(conn: &Connection, id: i64, limit: u64) -> Result<(u64, u64)> {
    // PostgreSQL has no LIMIT inside a recursive query: the limit of the one reading it stops
    // the walk there instead.
    let sql = if conn.is_pg() {
        "WITH RECURSIVE sub(id) AS (SELECT CAST(?1 AS BIGINT) UNION ALL
             SELECT n.id FROM nodes n JOIN sub ON n.parent_id = sub.id),
         bounded AS (SELECT id FROM sub LIMIT ?2)
         SELECT count(*), (SELECT CAST(coalesce(sum(v.length), 0) AS BIGINT) FROM versions v
             WHERE v.committed = 1 AND v.file_id IN (SELECT id FROM bounded)) FROM bounded"
    } else {
        "WITH RECURSIVE sub(id) AS (SELECT ?1 UNION ALL
             SELECT n.id FROM nodes n JOIN sub ON n.parent_id = sub.id LIMIT ?2)
         SELECT count(*), (SELECT coalesce(sum(v.length), 0) FROM versions v
             WHERE v.committed = 1 AND v.file_id IN sub) FROM sub"
    };
    let (n, bytes): (i64, i64) = conn.query_row(
        sql,
        params![id, limit.saturating_add(1).min(i64::MAX as u64) as i64],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((n as u64, bytes as u64))
}

/// The row of a node known to exist.
pub(super) fn row(conn: &Connection, id: i64) -> Result<NodeRow> {
    get_row(conn, id)?.ok_or_else(|| Error::internal(format!("node {id} vanished")))
}

/// Upload step 1 inside the caller's transaction: the file at `path`, created empty (its
/// folder's time moved) unless it exists; a folder of that name is a conflict.
pub(super) fn create_file_row(
    tx: &Connection,
    scope: Scope,
    path: &NodePath,
    now: i64,
) -> Result<NodeRow> {
    create_file_row_in(tx, scope, path, now, &mut Folders::default())
}

/// Folders resolved within one transaction, for a batch of files that mostly share a few: a
/// path is walked from its account down once, not once per file, and the folder's path as
/// stored (names in NFC, which the caller's spelling may not be) is read once. Valid while
/// the caller holds the store's lock and the transaction (nothing can move or remove a folder).
#[derive(Default)]
pub(super) struct Folders(std::collections::HashMap<NodePath, (NodeRow, NodePath)>);

impl Folders {
    /// The folder at `path` and its path as stored.
    pub(super) fn resolve(
        &mut self,
        conn: &Connection,
        scope: Scope,
        path: &NodePath,
    ) -> Result<(NodeRow, NodePath)> {
        if let Some(found) = self.0.get(path) {
            return Ok(found.clone());
        }
        let row = resolve(conn, scope, path)?;
        let stored = path_of(conn, row.id)?;
        self.0.insert(path.clone(), (row.clone(), stored.clone()));
        Ok((row, stored))
    }
}

/// `create_file_row` with the folder looked up in (and remembered by) `folders`.
pub(super) fn create_file_row_in(
    tx: &Connection,
    scope: Scope,
    path: &NodePath,
    now: i64,
    folders: &mut Folders,
) -> Result<NodeRow> {
    let (folder, name) = split(path)?;
    let name = &crate::api::path::new_name(name)?;
    let parent = folders.resolve(tx, scope, &folder)?.0;
    require_folder(&parent, &folder)?;
    match find_child(tx, parent.id, name)? {
        Some(existing) if existing.is_file() => Ok(existing),
        Some(_) => Err(Error::conflict("exists", format!("{path} is a folder"))),
        None => {
            let id = insert_node(tx, &parent, NodeKind::File, name, now)?;
            touch(tx, Some(parent.id), now)?;
            row(tx, id)
        }
    }
}

/// The path of a node, walking up its parents.
pub(super) fn path_of(conn: &Connection, mut id: i64) -> Result<NodePath> {
    let mut names = Vec::new();
    let mut stmt = conn.prepare_cached("SELECT parent_id, name FROM nodes WHERE id = ?1")?;
    loop {
        let (parent, name): (Option<i64>, String) =
            stmt.query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        names.push(name);
        match parent {
            Some(p) => id = p,
            None => break,
        }
    }
    names.reverse();
    NodePath::from_segments(names)
}

fn insert_node(
    tx: &Connection,
    parent: &NodeRow,
    kind: NodeKind,
    name: &str,
    now: i64,
) -> Result<i64> {
    tx.prepare_cached(
        "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
    )?
    .execute(params![parent.id, parent.account_id, kind as i64, name, now])?;
    Ok(tx.last_insert_rowid()?)
}

/// A folder's modification time follows its entries (as a directory's mtime does).
fn touch(tx: &Connection, id: Option<i64>, now: i64) -> Result<()> {
    if let Some(id) = id {
        tx.prepare_cached("UPDATE nodes SET modified_on = ?2 WHERE id = ?1")?
            .execute(params![id, now])?;
    }
    Ok(())
}

/// A container that can hold files and folders (a vault or a folder).
fn require_folder(row: &NodeRow, path: &NodePath) -> Result<()> {
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

pub(super) fn ensure_account(tx: &Transaction, name: &str) -> Result<i64> {
    if let Some(id) = tx
        .query_row(
            "SELECT id FROM nodes WHERE parent_id IS NULL AND kind = 0 AND name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()?
    {
        return Ok(id);
    }
    let now = now_ns();
    tx.execute(
        "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on) VALUES (NULL, 0, ?1, ?2, ?3, ?3)",
        params![NodeKind::Account as i64, name, now],
    )?;
    let id = tx.last_insert_rowid()?;
    tx.execute("UPDATE nodes SET account_id = ?1 WHERE id = ?1", [id])?;
    let account = get_row(tx, id)?.expect("account just inserted");
    insert_node(tx, &account, NodeKind::Vault, FIRST_VAULT, now)?;
    log::info!("created account {name} with vault {FIRST_VAULT}");
    Ok(id)
}

/// Deletes a node and everything under it; returns the blobs no version uses any more, to be
/// removed from disk once the transaction has committed.
///
/// Bottom-up, one level at a time: deleting the top node alone would let SQLite's `ON DELETE
/// CASCADE` walk the tree as nested triggers, which fails past 1000 levels ("too many levels of
/// trigger recursion"). Here each level's nodes have no children left when they go, so the
/// cascade reaches only their versions, whatever the depth. (The recursive CTE is a queue in
/// SQLite, not a recursion.)
fn delete_subtree(tx: &Transaction, id: i64) -> Result<Vec<String>> {
    tx.execute_batch(if tx.is_pg() {
        "CREATE TEMP TABLE IF NOT EXISTS doomed (id BIGINT PRIMARY KEY, depth BIGINT NOT NULL);
         CREATE INDEX IF NOT EXISTS doomed_by_depth ON pg_temp.doomed(depth);
         DELETE FROM pg_temp.doomed;"
    } else {
        "CREATE TEMP TABLE IF NOT EXISTS doomed (id INTEGER PRIMARY KEY, depth INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS temp.doomed_by_depth ON doomed(depth);
         DELETE FROM temp.doomed;"
    })?;
    tx.execute(
        "INSERT INTO temp.doomed (id, depth)
         WITH RECURSIVE sub(id, depth) AS (SELECT CAST(?1 AS BIGINT), CAST(0 AS BIGINT) UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id)
         SELECT id, depth FROM sub",
        [id],
    )?;
    let hashes: Vec<String> = tx
        .prepare(
            "SELECT DISTINCT v.blob FROM versions v JOIN temp.doomed d ON v.file_id = d.id
             WHERE v.blob IS NOT NULL",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<super::db::Result<_>>()?;
    let deepest: i64 =
        tx.query_row("SELECT coalesce(max(depth), 0) FROM temp.doomed", [], |r| {
            r.get(0)
        })?;
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

/// Of `hashes`, the blobs no version uses any more: their rows are deleted and they are
/// returned, for the caller to remove their files once the transaction is committed.
pub(super) fn free_blobs(
    tx: &Connection,
    hashes: impl IntoIterator<Item = String>,
) -> Result<Vec<String>> {
    let mut freed = Vec::new();
    let mut free = tx.prepare_cached(
        "DELETE FROM blobs WHERE hash = ?1 AND NOT EXISTS (SELECT 1 FROM versions WHERE blob = ?1)",
    )?;
    for h in hashes {
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
pub(super) fn prune_versions(tx: &Connection, file: i64, keep: Option<u64>) -> Result<Vec<String>> {
    let Some(keep) = keep else {
        return Ok(Vec::new());
    };
    let hashes: Vec<Option<String>> = tx
        .prepare_cached(
            "DELETE FROM versions WHERE id IN (
                 SELECT v.id FROM versions v JOIN nodes n ON n.id = v.file_id
                 WHERE v.file_id = ?1 AND v.committed = 1 AND v.id <> n.current_version
                 ORDER BY v.id DESC LIMIT -1 OFFSET ?2)
             RETURNING blob",
        )?
        .query_map(params![file, keep as i64], |r| r.get(0))?
        .collect::<super::db::Result<_>>()?;
    free_blobs(tx, hashes.into_iter().flatten())
}

/// Levels of the subtree at `id`: 1 for a file or an empty folder.
fn subtree_height(conn: &Connection, id: i64) -> Result<usize> {
    let h: i64 = conn.query_row(
        "WITH RECURSIVE sub(id, depth) AS (SELECT CAST(?1 AS BIGINT), CAST(1 AS BIGINT) UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id)
         SELECT max(depth) FROM sub",
        [id],
        |r| r.get(0),
    )?;
    Ok(h as usize)
}

/// Copies the subtree `src` as `name` into `dst_parent`; returns the new top node's ID. A
/// work list, not a recursion: the depth of the tree costs no stack.
fn copy_tree(
    tx: &Transaction,
    src: &NodeRow,
    dst_parent: &NodeRow,
    name: &str,
    now: i64,
) -> Result<i64> {
    let top = copy_node(tx, src, dst_parent, name, now)?;
    // (source folder, its copy) pairs whose children are still to copy.
    let mut todo: Vec<(i64, NodeRow)> = Vec::new();
    if !src.is_file() {
        todo.push((src.id, get_row(tx, top)?.expect("node just inserted")));
    }
    let mut children_of = tx.prepare(&format!("{SELECT} WHERE n.parent_id = ?1"))?;
    while let Some((from, to)) = todo.pop() {
        let children: Vec<NodeRow> = children_of
            .query_map([from], read_row)?
            .collect::<super::db::Result<_>>()?;
        for child in &children {
            let new_id = copy_node(tx, child, &to, &child.name, now)?;
            if !child.is_file() {
                todo.push((child.id, get_row(tx, new_id)?.expect("node just inserted")));
            }
        }
    }
    Ok(top)
}

/// Copies one node (a file with its current version, or a folder without its children).
fn copy_node(
    tx: &Transaction,
    src: &NodeRow,
    dst_parent: &NodeRow,
    name: &str,
    now: i64,
) -> Result<i64> {
    let new_id = insert_node(tx, dst_parent, src.kind, name, now)?;
    if src.is_file() {
        // The copy is a new file whose one version shares the source's blob: no byte is copied.
        let copied = tx.execute(
            "INSERT INTO versions (file_id, length, md5, blob, committed, created_on, committed_on)
             SELECT ?1, v.length, v.md5, v.blob, 1, ?2, ?2 FROM versions v
             WHERE v.id = (SELECT current_version FROM nodes WHERE id = ?3)",
            params![new_id, now, src.id],
        )?;
        if copied == 1 {
            let vid = tx.last_insert_rowid()?;
            tx.execute(
                "UPDATE nodes SET current_version = ?2, exec = ?3 WHERE id = ?1",
                params![new_id, vid, src.exec],
            )?;
        }
    }
    Ok(new_id)
}

/// One version of a file, as kept in the database.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    pub id: i64,
    pub length: u64,
    pub md5: Option<String>,
    pub committed: bool,
}

/// What upload step 3 needs to know before it reads the body.
#[derive(Debug, Clone)]
pub struct PendingUpload {
    pub length: u64,
    pub md5: Option<String>,
    pub committed: bool,
}

impl Store {
    /// A node (without children).
    pub fn node(&self, scope: Scope, path: &NodePath) -> Result<Node> {
        if path.is_root() {
            return Ok(root_node());
        }
        let conn = self.lock()?;
        Ok(resolve(&conn, scope, path)?.to_api(path))
    }

    /// A node with one page of its children (by name) and their total count.
    pub fn list(&self, scope: Scope, path: &NodePath, page: u64, per_page: u64) -> Result<Node> {
        let conn = self.lock()?;
        let offset = page.saturating_mul(per_page).min(i64::MAX as u64) as i64;
        let limit = per_page.min(i64::MAX as u64) as i64;
        let (mut node, rows, total) = if path.is_root() {
            let (filter, arg) = match scope {
                Scope::All => ("n.parent_id IS NULL AND n.kind = 0 AND ?1 = 0", 0),
                Scope::Account(a) => ("n.parent_id IS NULL AND n.kind = 0 AND n.id = ?1", a),
            };
            let total: i64 = conn.query_row(
                &format!("SELECT count(*) FROM nodes n WHERE {filter}"),
                [arg],
                |r| r.get(0),
            )?;
            let rows = conn
                .prepare(&format!(
                    "{SELECT} WHERE {filter} ORDER BY n.name LIMIT ?2 OFFSET ?3"
                ))?
                .query_map(params![arg, limit, offset], read_row)?
                .collect::<super::db::Result<Vec<_>>>()?;
            (root_node(), rows, total)
        } else {
            let row = resolve(&conn, scope, path)?;
            let total: i64 = conn.query_row(
                "SELECT count(*) FROM nodes WHERE parent_id = ?1",
                [row.id],
                |r| r.get(0),
            )?;
            let rows = conn
                .prepare_cached(&format!(
                    "{SELECT} WHERE n.parent_id = ?1 ORDER BY n.name LIMIT ?2 OFFSET ?3"
                ))?
                .query_map(params![row.id, limit, offset], read_row)?
                .collect::<super::db::Result<Vec<_>>>()?;
            (row.to_api(path), rows, total)
        };
        let mut children = Vec::with_capacity(rows.len());
        for r in &rows {
            children.push(r.to_api(&path.child(&r.name)?));
        }
        node.total_children = Some(total as u64);
        node.children = Some(children);
        Ok(node)
    }

    /// Creates the folder `path` (its parent must exist).
    pub fn create_folder(&self, scope: Scope, path: &NodePath) -> Result<Node> {
        path.check_depth()?;
        let (parent_path, name) = split(path)?;
        let name = &crate::api::path::new_name(name)?;
        let path = &parent_path.child(name)?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let parent = resolve(&tx, scope, &parent_path)?;
        require_folder(&parent, &parent_path)?;
        if let Some(existing) = child_row(&tx, parent.id, name)? {
            let what = if existing.is_file() {
                "a file"
            } else {
                "a folder"
            };
            return Err(Error::conflict(
                "exists",
                format!("{path} already exists as {what}"),
            ));
        }
        check_quota(&tx, &self.config, scope, 1, 0)?;
        let now = now_ns();
        let id = insert_node(&tx, &parent, NodeKind::Folder, name, now)?;
        touch(&tx, Some(parent.id), now)?;
        let row = get_row(&tx, id)?.expect("node just inserted");
        tx.commit()?;
        Ok(row.to_api(path))
    }

    /// Upload step 1: the file `name` in `folder`, created empty unless it exists.
    pub fn create_file(&self, scope: Scope, folder: &NodePath, name: &str) -> Result<Node> {
        let path = folder.child(&crate::api::path::new_name(name)?)?;
        path.check_depth()?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        check_quota(&tx, &self.config, scope, 1, 0)?;
        let row = create_file_row(&tx, scope, &path, now_ns())?;
        tx.commit()?;
        Ok(row.to_api(&path))
    }

    /// A version of `length` bytes is within the configured limit (413 `file_too_large`).
    pub(super) fn check_file_size(&self, length: u64) -> Result<()> {
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

    /// Upload step 2: opens a pending version of `length` bytes (and the md5, if given), with
    /// the attributes the file takes when it is committed.
    pub fn begin_version(
        &self,
        scope: Scope,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
    ) -> Result<Node> {
        let md5 = md5.map(normalize_md5).transpose()?;
        self.check_file_size(length)?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let file = file_by_id(&tx, scope, file_id)?;
        // Versions are kept: each one counts, the announced length now.
        check_quota(&tx, &self.config, scope, 0, length)?;
        tx.execute(
            "INSERT INTO versions (file_id, length, md5, committed, created_on, modified_on, exec) VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6)",
            params![file.id, length as i64, md5, now_ns(), attrs.modified.map(time_to_ns), attrs.mode.map(|m| m & EXEC_BITS)],
        )?;
        let vid = tx.last_insert_rowid()?;
        let path = path_of(&tx, file.id)?;
        tx.commit()?;
        let mut node = file.to_api(&path);
        node.file_ex_properties = Some(FileExProperties {
            upload_uri: format!("/nodes/upload/{}/{vid}", file.id),
            version_id: Some(vid.to_string()),
        });
        Ok(node)
    }

    /// Sets a file's attributes without a new version (our step 2 without `length`).
    pub fn set_attrs(&self, scope: Scope, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let file = file_by_id(&tx, scope, file_id)?;
        tx.execute(
            "UPDATE nodes SET modified_on = coalesce(?2, modified_on), exec = coalesce(?3, exec) WHERE id = ?1",
            params![file.id, attrs.modified.map(time_to_ns), attrs.mode.map(|m| m & EXEC_BITS)],
        )?;
        let row = row(&tx, file.id)?;
        let path = path_of(&tx, file.id)?;
        tx.commit()?;
        Ok(row.to_api(&path))
    }

    /// Upload step 3, before the body: the version's announced length and md5.
    pub fn pending_upload(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
    ) -> Result<PendingUpload> {
        let conn = self.lock()?;
        let file = file_by_id(&conn, scope, file_id)?;
        let (length, md5, committed) = version_of(&conn, file.id, version_id)?;
        Ok(PendingUpload {
            length,
            md5,
            committed,
        })
    }

    /// A staging file for upload bytes, hashed as it is written.
    pub fn blob_writer(&self) -> std::io::Result<BlobWriter> {
        self.blobs.writer()
    }

    /// Upload step 3, after the body: checks length and md5 against step 2, stores the bytes and
    /// makes the version current, atomically. On any error the file keeps its content.
    /// Repeating a step 3 that already succeeded with the same bytes succeeds again (so a client
    /// may retry it safely).
    ///
    /// Group commit: each step 3 must be durable before it returns (the client drops its copy),
    /// and a durable transaction costs a directory fsync and a WAL fsync under the store's lock.
    /// Uploads that arrive while one commits queue up, and the next to get the lock commits
    /// them all in one transaction (one savepoint each, so one failing fails alone).
    pub fn commit_upload(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
        staged: StagedBlob,
    ) -> Result<Node> {
        self.note_write_activity();
        // Held in the database too, for the other servers of a shared store (`hold_blob`).
        let hold = self.hold_blob(&staged.sha256)?;
        let done = self.commit_upload_held(scope, file_id, version_id, staged);
        self.release_blob(hold);
        done
    }

    fn commit_upload_held(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
        mut staged: StagedBlob,
    ) -> Result<Node> {
        // Into the bucket (if any) before the lock: see `Blobs::store_ahead`.
        self.blobs.store_ahead(&mut staged, |hash| {
            Ok(self
                .lock()?
                .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
                .exists([hash])?)
        })?;
        let me = Arc::new(PendingCommit {
            scope,
            file_id: file_id.to_string(),
            version_id: version_id.to_string(),
            staged: Mutex::new(Some(staged)),
            result: Mutex::new(None),
        });
        relock(&self.commits).push(me.clone());
        let conn = self.lock()?;
        // Results are set with the connection locked: a commit that took ours is finished.
        if let Some(done) = relock(&me.result).take() {
            return done;
        }
        // Ours is in the batch, unless a commit that took it panicked (then ours has no result).
        let batch = std::mem::take(&mut *relock(&self.commits));
        let outcome = self.commit_batch(&conn, &batch);
        drop(conn);
        for (render, name, sha) in outcome {
            if let Some(kind) = render {
                self.previews.enqueue(&sha, kind, &name);
            }
        }
        relock(&me.result)
            .take()
            .unwrap_or_else(|| Err(Error::internal("upload commit lost its result")))
    }

    /// Commits the queued step 3s in one durable transaction and gives each its result. Returns
    /// the previews to queue (after the lock is released).
    fn commit_batch(
        &self,
        conn: &Connection,
        batch: &[Arc<PendingCommit>],
    ) -> Vec<(Option<crate::preview::Kind>, String, String)> {
        let mut results: Vec<Result<Committed>> = Vec::new();
        let committed = (|| -> Result<()> {
            // Durable before it returns: the clients will drop their copies of these bytes.
            let _durable = super::schema::Durable::new(conn)?;
            let mut tx = conn.unchecked_transaction()?;
            for p in batch {
                let Some(mut staged) = relock(&p.staged).take() else {
                    results.push(Err(Error::internal("upload committed twice")));
                    continue;
                };
                let sp = tx.savepoint()?;
                let r = self.commit_one(&sp, p, &mut staged);
                match r {
                    Ok(v) => {
                        sp.commit()?;
                        results.push(Ok(v));
                    }
                    Err(e) => {
                        drop(sp); // rolls this upload back, and only it
                        results.push(Err(e));
                    }
                }
            }
            tx.commit()?;
            // Under the lock still: no upload can be about to reuse these bytes.
            for h in results.iter().flatten().flat_map(|c| &c.freed) {
                self.forget_blob(conn, h);
            }
            Ok(())
        })();
        let mut previews = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let r = match (&committed, results.get(i)) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Some(Ok(c))) => {
                    previews.push((c.render, c.name.clone(), c.sha.clone()));
                    Ok(c.node.clone())
                }
                (Ok(()), Some(Err(e))) => Err(e.clone()),
                (Ok(()), None) => Err(Error::internal("upload commit lost its result")),
            };
            *relock(&p.result) = Some(r);
        }
        previews
    }

    /// One step 3 inside the group's transaction: the node, whether its preview is to be made,
    /// its name and blob hash.
    fn commit_one(
        &self,
        tx: &Connection,
        p: &PendingCommit,
        staged: &mut StagedBlob,
    ) -> Result<Committed> {
        let file = file_by_id(tx, p.scope, &p.file_id)?;
        let (length, md5, committed) = version_of(tx, file.id, &p.version_id)?;
        let vid: i64 = p.version_id.parse().expect("checked by version_of");
        if committed {
            let blob: Option<String> =
                tx.query_row("SELECT blob FROM versions WHERE id = ?1", [vid], |r| {
                    r.get(0)
                })?;
            if blob.as_deref() != Some(staged.sha256.as_str()) {
                return Err(Error::conflict(
                    "version_committed",
                    "this version was already uploaded with other bytes",
                ));
            }
        } else {
            check_upload(length, md5.as_deref(), staged)?;
            // Again at commit: versions announced together could pass the check of step 2.
            check_quota(tx, &self.config, p.scope, 0, length)?;
            let known = tx
                .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
                .exists([&staged.sha256])?;
            if !known {
                self.blobs.commit(staged)?;
                tx.execute(
                    "INSERT INTO blobs (hash, size, md5) VALUES (?1, ?2, ?3)",
                    params![staged.sha256, staged.len as i64, staged.md5],
                )?;
            }
            let now = now_ns();
            tx.execute(
                "UPDATE versions SET blob = ?2, md5 = ?3, committed = 1, committed_on = ?4 WHERE id = ?1",
                params![vid, staged.sha256, staged.md5, now],
            )?;
            tx.execute(
                "UPDATE nodes SET current_version = v.id, modified_on = coalesce(v.modified_on, ?2),
                 exec = coalesce(v.exec, nodes.exec) FROM versions v WHERE nodes.id = ?1 AND v.id = ?3",
                params![file.id, now, vid],
            )?;
        }
        // Its preview is wanted from now on (InProgress until rendered), unless these bytes
        // have one already.
        let render = super::previews::want(tx, &self.blobs, &staged.sha256, &file.name)?;
        let freed = prune_versions(tx, file.id, self.config.earlier_versions)?;
        let row = get_row(tx, file.id)?.expect("file exists");
        let path = path_of(tx, file.id)?;
        Ok(Committed {
            node: row.to_api(&path),
            render,
            name: file.name,
            sha: staged.sha256.clone(),
            freed,
        })
    }

    /// The file of that ID with its current bytes opened (`None` for a file never uploaded).
    /// The blob is opened under the lock, so a concurrent delete cannot remove it first.
    pub fn open_file(&self, scope: Scope, file_id: &str) -> Result<(Node, Option<BlobFile>)> {
        let conn = self.lock()?;
        let row = file_by_id(&conn, scope, file_id)?;
        let path = path_of(&conn, row.id)?;
        let blob: Option<String> = conn.query_row(
            "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
            [row.id],
            |r| r.get(0),
        ).optional()?.flatten();
        let file = blob.map(|h| self.blobs.open(&h)).transpose()?;
        Ok((row.to_api(&path), file))
    }

    /// The file of that ID with the blob of its current bytes opened, and the blob's path, when
    /// blobs are kept in a folder (`None`: in a bucket, or a file never uploaded). The mount
    /// hands such a file to the kernel to read from (FUSE passthrough); a blob is immutable.
    pub fn open_local_blob(
        &self,
        scope: Scope,
        file_id: &str,
    ) -> Result<Option<(Node, std::path::PathBuf, std::fs::File)>> {
        let Some(dir) = self.blobs.local() else {
            return Ok(None);
        };
        let conn = self.lock()?;
        let row = file_by_id(&conn, scope, file_id)?;
        let blob: Option<String> = conn.query_row(
            "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
            [row.id],
            |r| r.get(0),
        ).optional()?.flatten();
        let Some(hash) = blob else { return Ok(None) };
        let path = dir.path(&hash);
        // Opened under the lock, like `open_file`: a concurrent delete cannot remove it first.
        let file = std::fs::File::open(&path)?;
        Ok(Some((row.to_api(&path_of(&conn, row.id)?), path, file)))
    }

    /// Every version of a file, oldest first (earlier versions are kept).
    pub fn version_history(&self, file_id: &str) -> Result<Vec<VersionInfo>> {
        let conn = self.lock()?;
        let file = file_by_id(&conn, Scope::All, file_id)?;
        let rows = conn
            .prepare(
                "SELECT id, length, md5, committed FROM versions WHERE file_id = ?1 ORDER BY id",
            )?
            .query_map([file.id], |r| {
                Ok(VersionInfo {
                    id: r.get(0)?,
                    length: r.get::<_, i64>(1)? as u64,
                    md5: r.get(2)?,
                    committed: r.get::<_, i64>(3)? != 0,
                })
            })?
            .collect::<super::db::Result<_>>()?;
        Ok(rows)
    }

    /// The file of that ID (for routes addressed by document ID).
    pub fn file(&self, scope: Scope, file_id: &str) -> Result<Node> {
        let conn = self.lock()?;
        let row = file_by_id(&conn, scope, file_id)?;
        Ok(row.to_api(&path_of(&conn, row.id)?))
    }

    /// Copy or move `src` to `dst` (the full destination path, name included).
    pub fn transfer(
        &self,
        scope: Scope,
        src: &NodePath,
        dst: &NodePath,
        replace: bool,
        mode: TransferMode,
    ) -> Result<Node> {
        if src.depth() < 3 {
            return Err(Error::forbidden(
                "accounts and vaults cannot be copied or moved",
            ));
        }
        let (dst_parent_path, name) = split(dst)?;
        let name = &crate::api::path::new_name(name)?;
        let dst = &dst_parent_path.child(name)?;
        if dst.depth() < 3 {
            return Err(Error::forbidden("the destination must be inside a vault"));
        }
        dst.check_depth()?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let s = resolve(&tx, scope, src)?;
        let dp = match resolve(&tx, scope, &dst_parent_path) {
            Err(e) if e.is(crate::api::ErrorKind::NotFound) => {
                return Err(Error::not_found(format!(
                    "destination folder {dst_parent_path} not found"
                )));
            }
            other => other?,
        };
        require_folder(&dp, &dst_parent_path)?;
        if src == dst {
            if mode == TransferMode::Copy && !replace {
                return Err(Error::conflict("exists", format!("{dst} already exists")));
            }
            return Ok(s.to_api(src));
        }
        if !s.is_file() && src.contains(dst) {
            return Err(Error::bad_request(
                "move_into_self",
                format!("cannot put {src} inside itself"),
            ));
        }
        // Deeper than it was: its deepest node must stay within the bound of a path.
        if !s.is_file() && dst.depth() > src.depth() {
            let deepest = dst.depth() - 1 + subtree_height(&tx, s.id)?;
            if deepest > crate::api::path::MAX_PATH_DEPTH {
                return Err(crate::api::path::path_too_deep(deepest));
            }
        }
        let mut freed = Vec::new();
        if let Some(existing) = child_row(&tx, dp.id, name)? {
            if !replace {
                return Err(Error::conflict("exists", format!("{dst} already exists")));
            }
            if existing.is_file() != s.is_file() {
                return Err(Error::conflict(
                    "type_mismatch",
                    format!("{dst} exists and is not of the same kind"),
                ));
            }
            if !existing.is_file() && has_children(&tx, existing.id)? {
                return Err(Error::conflict(
                    "not_empty",
                    format!("{dst} is a folder that is not empty"),
                ));
            }
            freed = delete_subtree(&tx, existing.id)?;
        }
        let now = now_ns();
        let id = match mode {
            TransferMode::Move => {
                tx.execute(
                    "UPDATE nodes SET parent_id = ?2, name = ?3 WHERE id = ?1",
                    params![s.id, dp.id, name],
                )?;
                if dp.account_id != s.account_id {
                    tx.execute(
                        "WITH RECURSIVE sub(id) AS (SELECT CAST(?1 AS BIGINT) UNION ALL
                             SELECT n.id FROM nodes n JOIN sub ON n.parent_id = sub.id)
                         UPDATE nodes SET account_id = ?2 WHERE id IN (SELECT id FROM sub)",
                        params![s.id, dp.account_id],
                    )?;
                }
                touch(&tx, s.parent_id, now)?;
                s.id
            }
            TransferMode::Copy => {
                let limit = self.config.max_nodes_per_request;
                let (nodes, bytes) = subtree_size(&tx, s.id, limit)?;
                if nodes > limit {
                    return Err(Error::new(
                        crate::api::ErrorKind::TooLarge,
                        "too_many_nodes",
                        format!(
                            "{src} holds more than {limit} files and folders, the most one copy \
                             may create on this server; copy its parts one by one"
                        ),
                    ));
                }
                check_quota(&tx, &self.config, scope, nodes, bytes)?;
                copy_tree(&tx, &s, &dp, name, now)?
            }
        };
        touch(&tx, Some(dp.id), now)?;
        let row = get_row(&tx, id)?.expect("node exists");
        tx.commit()?;
        for h in freed {
            self.forget_blob(&conn, &h);
        }
        Ok(row.to_api(dst))
    }

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

    /// Deletes a file, or a folder with everything under it, and frees unshared bytes.
    ///
    /// A tree of more than [`super::purge::INLINE_NODES`] nodes is detached in this transaction
    /// (its name is gone when this returns) and purged by the store's thread in bounded chunks,
    /// so no request holds the store's lock for long (`store::purge`).
    pub fn delete(&self, scope: Scope, path: &NodePath) -> Result<()> {
        if path.depth() < 3 {
            return Err(Error::forbidden("accounts and vaults cannot be deleted"));
        }
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let row = resolve(&tx, scope, path)?;
        let now = now_ns();
        let (nodes, _) = subtree_size(&tx, row.id, super::purge::INLINE_NODES)?;
        if nodes > super::purge::INLINE_NODES {
            tx.prepare_cached("UPDATE nodes SET parent_id = NULL, name = '/' || id WHERE id = ?1")?
                .execute([row.id])?;
            tx.prepare_cached(
                "INSERT INTO trash (node_id, account_id, detached_on) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![row.id, row.account_id, now])?;
            touch(&tx, row.parent_id, now)?;
            tx.commit()?;
            drop(conn);
            log::debug!("{path} detached, to be purged");
            self.purger().wake();
            return Ok(());
        }
        let freed = delete_subtree(&tx, row.id)?;
        touch(&tx, row.parent_id, now)?;
        tx.commit()?;
        for h in freed {
            self.forget_blob(&conn, &h);
        }
        Ok(())
    }
}

fn split(path: &NodePath) -> Result<(NodePath, &str)> {
    match (path.parent(), path.name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(Error::forbidden("the root cannot be changed")),
    }
}

/// The md5 of step 2 as hex, from hex or base64 (the public service's clients send base64).
fn normalize_md5(md5: &str) -> Result<String> {
    crate::api::checksum::md5_hex(md5).ok_or_else(|| {
        Error::bad_request(
            "bad_checksum",
            "md5_checksum must be an md5: 32 hexadecimal digits or 24 characters of base64",
        )
    })
}

/// (length, md5, committed) of a version of `file_id`.
fn version_of(
    conn: &Connection,
    file_id: i64,
    version_id: &str,
) -> Result<(u64, Option<String>, bool)> {
    let not_found = || {
        Error::new(
            crate::api::ErrorKind::NotFound,
            "version_not_found",
            format!("no pending version {version_id} for this file"),
        )
    };
    let vid: i64 = version_id.parse().map_err(|_| not_found())?;
    conn.query_row(
        "SELECT length, md5, committed FROM versions WHERE id = ?1 AND file_id = ?2",
        params![vid, file_id],
        |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get(1)?,
                r.get::<_, i64>(2)? != 0,
            ))
        },
    )
    .optional()?
    .ok_or_else(not_found)
}

/// The checks of step 3 against step 2, in one place.
pub fn check_upload(length: u64, md5: Option<&str>, staged: &StagedBlob) -> Result<()> {
    if staged.len != length {
        return Err(length_mismatch(length, staged.len));
    }
    if let Some(m) = md5 {
        if m != staged.md5 {
            return Err(Error::bad_request(
                "checksum_mismatch",
                format!("the bytes have md5 {}, step 2 announced {m}", staged.md5),
            ));
        }
    }
    Ok(())
}

pub fn length_mismatch(expected: u64, got: u64) -> Error {
    Error::bad_request(
        "length_mismatch",
        format!("step 2 announced {expected} bytes, {got} were sent"),
    )
}

/// A file stored: its node, the kind of preview to queue (when its bytes and kind are new),
/// its name and blob hash.
/// A version made current: the file, whether its preview is to be made, its name, the blob's
/// hash, and the blobs the earlier versions it dropped no longer need.
pub(super) struct Committed {
    pub node: Node,
    pub render: Option<crate::preview::Kind>,
    pub name: String,
    pub sha: String,
    pub freed: Vec<String>,
}

/// A step 3 waiting for the next group commit (see `Store::commit_upload`).
pub(super) struct PendingCommit {
    scope: Scope,
    file_id: String,
    version_id: String,
    staged: Mutex<Option<StagedBlob>>,
    result: Mutex<Option<Result<Node>>>,
}
