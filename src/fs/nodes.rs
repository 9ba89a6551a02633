//! The namespace part of the mount, around the inode table: the table sits below all of its
//! neighbours here and knows none of them.

use std::collections::HashMap;
use std::sync::Arc;

use super::follow::Follow;
use super::freshness::Freshness;
use super::table::{Ino, Table};

/// Refreshes under way (`Fs::refresh_briefly`), by node: true once each has ended.
pub(super) type Refreshing = HashMap<Ino, tokio::sync::watch::Receiver<bool>>;

/// The namespace part of the mount: the inode table, the refreshes of its listings and
/// attributes under way, whether what it fetched may still be used, and the follower of
/// changes made elsewhere, which drops what they make stale.
pub(super) struct Nodes {
    pub(super) table: std::sync::Mutex<Table>,
    /// Folders whose listing is being fetched again, each with word of its end.
    pub(super) refreshing: std::sync::Mutex<Refreshing>,
    /// Nodes whose attributes are being fetched again.
    pub(super) attr_refreshing: std::sync::Mutex<Refreshing>,
    /// Whether a listing or attributes fetched at some time may still be used.
    pub(super) freshness: Freshness,
    /// What the follower of changes made elsewhere keeps (`follow`).
    pub(super) follow: Arc<Follow>,
}

impl Nodes {
    /// `table`, with listings reused for `dir_ttl`.
    pub(super) fn new(table: Table, dir_ttl: std::time::Duration) -> Nodes {
        Nodes {
            table: std::sync::Mutex::new(table),
            refreshing: Default::default(),
            attr_refreshing: Default::default(),
            freshness: Freshness::new(dir_ttl),
            follow: Arc::default(),
        }
    }
}
