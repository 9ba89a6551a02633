//! The tree: resolution of paths and IDs (with the account check, in one place), listing,
//! folders, the three upload steps, copy/move and delete.
//!
//! One submodule a concern: [`resolve`] paths and IDs to rows; [`folders`] listings and new
//! folders and accounts; [`upload`] the three upload steps; [`files`] files by ID for reading;
//! [`transfer`] copy and move; [`delete`] deletes and freed blobs; [`restore`] versions and
//! deleted files brought back; [`limits`] quotas and sizes; [`staged`] a whole staged file put
//! at a path (WebDAV's PUT).
//! This file holds what they share: a node's row, read and written.

mod delete;
mod files;
mod folders;
mod limits;
pub(in crate::store) use limits::check_quota;
pub(super) mod resolve;
mod restore;
pub(super) mod retention;
mod staged;
mod transfer;
mod upload;

pub use files::VersionInfo;
pub(super) use folders::ensure_account;
pub(super) use resolve::{Folders, file_by_id, path_of, resolve, row};
pub(super) use retention::{free_blobs, prune_versions};
pub use transfer::TransferMode;
pub(super) use upload::{Committed, PendingCommit, create_file_row_in};
pub use upload::{PendingUpload, length_mismatch};

use super::db::{Conn as Connection, Row, params};
use super::ns_to_time;
use crate::api::{
    Node, NodePath, NodeType, Result, file_links, file_mode, format_time, whole_mode,
};

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
    /// Files: the mode a client set, as kept (`api::kept_mode`).
    pub exec: u32,
}

/// Levels a walk of the tree (up the parents, or down a subtree) goes at most: far more than any
/// path can have ([`crate::api::path::MAX_PATH_DEPTH`]) or than trees made before that bound
/// plausibly have, so a walk that gets this far has met a cycle of parents an older build left
/// (issue 31), and stops with [`resolve::damaged`] instead of running forever under the
/// store's lock. `vaultfs check` finds and mends such cycles.
pub(in crate::store) const MAX_WALK_DEPTH: i64 = 10_000;

/// md5 of no bytes: the checksum of a file created in step 1 and not uploaded yet.
use crate::api::checksum::EMPTY_MD5;

pub(super) const SELECT: &str = "SELECT n.id, n.parent_id, n.account_id, n.kind, n.name, n.created_on, n.modified_on, \
                      v.length, v.md5, n.exec FROM nodes n LEFT JOIN versions v ON v.id = n.current_version";

pub(super) fn read_row(r: &Row) -> super::db::Result<NodeRow> {
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
            node.mode = Some(whole_mode(file_mode(self.exec)));
            file_links(&mut node, &id);
            node.id = Some(id);
        }
        node
    }
}

pub(super) fn insert_node(
    tx: &Connection,
    parent: &NodeRow,
    kind: NodeKind,
    name: &str,
    now: i64,
) -> Result<i64> {
    // `RETURNING` rather than asking for the ID after: on PostgreSQL each is a round trip,
    // under the writers' lock.
    Ok(tx
        .prepare_cached(
            "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on) VALUES (?1, ?2, ?3, ?4, ?5, ?5) RETURNING id",
        )?
        .query_row(params![parent.id, parent.account_id, kind as i64, name, now], |r| r.get(0))?)
}

/// Takes node `id` (and its tree) out of the tree: no parent, and the name `/<id>`, which no
/// path can spell and which is unique. A deleted file or folder kept restorable, or a tree
/// handed to the purge.
pub(super) fn detach(tx: &Connection, id: i64) -> Result<()> {
    tx.prepare_cached("UPDATE nodes SET parent_id = NULL, name = '/' || id WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

/// A folder's modification time follows its entries (as a directory's mtime does).
pub(super) fn touch(tx: &Connection, id: Option<i64>, now: i64) -> Result<()> {
    if let Some(id) = id {
        tx.prepare_cached("UPDATE nodes SET modified_on = ?2 WHERE id = ?1")?
            .execute(params![id, now])?;
    }
    Ok(())
}
