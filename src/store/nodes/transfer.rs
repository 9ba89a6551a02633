//! Copy and move: a file or a subtree to another place, a copy sharing the source's bytes.

use super::delete::delete_subtree;
use super::limits::{check_quota, subtree_size};
use super::resolve::{child_row, get_row, has_children, require_folder, resolve, split};
use super::{NodeRow, SELECT, insert_node, read_row, touch};
use crate::api::{Error, Node, NodePath, Result};
use crate::store::db::{Conn as Connection, Tx as Transaction, params};
use crate::store::{Scope, Store, now_ns};

/// Copy or move, for [`Store::transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    Copy,
    Move,
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
            .collect::<crate::store::db::Result<_>>()?;
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

impl Store {
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
        self.forget_blobs(&conn, &freed);
        Ok(row.to_api(dst))
    }
}
