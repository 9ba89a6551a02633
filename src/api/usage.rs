//! What an account holds and may hold (`GET /usage` of `vaultfs serve`, an extension of ours):
//! what `df` on a mount shows.

use serde::{Deserialize, Serialize};

/// One account's use and quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Bytes held: every version kept, of files deleted but kept restorable too (what the quota
    /// is checked against).
    pub bytes: u64,
    /// The account's quota of bytes; absent where there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Files and folders held.
    pub nodes: u64,
    /// The account's quota of files and folders; absent where there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u64>,
}
