//! Reading the tree and making its containers: a node, a page of a node's children, a new
//! folder, and an account with its first vault.

use super::limits::check_quota;
use super::resolve::{child_row, get_row, path_of, require_folder, resolve, split};
use super::{NodeKind, SELECT, insert_node, read_row, touch};
use crate::api::{ChangeKind, Error, Node, NodePath, NodeType, Result};
use crate::store::changes::NewChange;
use crate::store::db::{OptionalExtension, Tx as Transaction, params};
use crate::store::{FIRST_VAULT, Scope, Store, now_ns};

/// The synthetic root `/nodes/pth`, whose children are the accounts the caller may see.
fn root_node() -> Node {
    Node {
        name: String::new(),
        uri: NodePath::root().uri(),
        node_type: NodeType::FolderNodeType,
        ..Default::default()
    }
}

pub(in crate::store) fn ensure_account(tx: &Transaction, name: &str) -> Result<i64> {
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

impl Store {
    /// A node (without children).
    pub fn node(&self, scope: Scope, path: &NodePath) -> Result<Node> {
        if path.is_root() {
            return Ok(root_node());
        }
        let conn = self.conn()?;
        // The walk down the path's folders of one state (a move meanwhile is before or after).
        let snapshot = conn.snapshot()?;
        Ok(resolve(&snapshot, scope, path)?.to_api(path))
    }

    /// A node with one page of its children (by name) and their total count.
    pub fn list(&self, scope: Scope, path: &NodePath, page: u64, per_page: u64) -> Result<Node> {
        let pooled = self.conn()?;
        // The count and the page of one state.
        let conn = pooled.snapshot()?;
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
                .collect::<crate::store::db::Result<Vec<_>>>()?;
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
                .collect::<crate::store::db::Result<Vec<_>>>()?;
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
        // One account's tree and log: its writers' lock, beside other accounts' (`db::Writers`).
        let conn = self.conn()?;
        let tx = conn.transaction_for(scope.writers())?;
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
        self.log_change(
            &tx,
            NewChange::new(&row, ChangeKind::Created, &path_of(&tx, id)?),
        )?;
        tx.commit()?;
        self.changed(row.account_id);
        Ok(row.to_api(path))
    }
}
