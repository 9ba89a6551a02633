//! The change feed of `vaultfs serve` (an extension of ours, `GET /changes`): what changed in
//! the caller's account after a cursor, oldest first. A client keeps the last cursor it was
//! given and asks again with it; nothing is lost or repeated between pages.

use serde::{Deserialize, Serialize};

use super::types::NodeType;

/// What happened to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A new file (upload step 1) or folder at `uri`.
    Created,
    /// A new version of the file at `uri` became current (upload step 3).
    Version,
    /// The file's attributes (modification time, mode) were set without new bytes.
    Attributes,
    /// The node at `uri` is gone, with everything under it (a folder's descendants are not
    /// listed one by one).
    Deleted,
    /// The node moved (or was renamed) from `from_uri` to `uri`, with everything under it.
    Moved,
    /// `uri` is a new copy of `from_uri` (a folder with everything under it).
    Copied,
    /// A kind this client does not know: drop what is cached at `uri` (and `from_uri`).
    #[serde(other)]
    Other,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The cursor just past this change: asking with it returns what came after.
    pub cursor: u64,
    pub kind: ChangeKind,
    /// `FileNodeType` or `FolderNodeType`.
    #[serde(rename = "nodeType")]
    pub node_type: NodeType,
    /// Files: the file ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The decoded path after the change (`/nodes/pth/...`); a delete's: where it was.
    pub uri: String,
    /// Moves: where the node was; copies: what it copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_uri: Option<String>,
    /// When it happened (RFC 3339, UTC).
    pub at: String,
    /// Versions: the md5 (hex) of the file's current bytes when the feed was read, not when
    /// the change was made. A client that holds those bytes already (its own upload coming
    /// back) has nothing to fetch; one that holds others does, whatever its clock says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<String>,
}

/// One answer of the feed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesPage {
    /// Where to go on from: the last change's cursor, or the one asked with when nothing
    /// changed (without a cursor: the current one, to start following from).
    pub cursor: u64,
    /// The cursor asked with is older than the oldest change kept (or not of this server):
    /// changes may have been missed. Drop everything cached and list again, then follow from
    /// `cursor`. `changes` is empty.
    #[serde(default)]
    pub reset: bool,
    /// More changes past this page: ask again at once.
    #[serde(default)]
    pub more: bool,
    #[serde(default)]
    pub changes: Vec<Change>,
}
