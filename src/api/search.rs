//! Full-text search of `vaultfs serve` (an extension of ours, `GET /search`): the files of the
//! caller's account whose text holds every word asked for, best first.

use serde::{Deserialize, Serialize};

/// Hits per answer by default: `GET /search`, its web page, `vaultfs search` and the mount's
/// `.search/` ask for as many, so all four show the same files.
pub const DEFAULT_LIMIT: u64 = 50;

/// One file found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The file ID.
    pub id: String,
    /// The decoded path (`/nodes/pth/...`), as the tree has it now.
    pub uri: String,
    /// A line of context around the first words found (whitespace folded).
    pub context: String,
}

/// One answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchResults {
    pub hits: Vec<SearchHit>,
    /// More files matched than `limit`, or may have: the search ran out of its time before it
    /// had read them all (`store::search::BUDGET`).
    pub more: bool,
}
