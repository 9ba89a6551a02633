//! The backing file an inode's passthrough opens share (`passthrough`): the kernel binds one to
//! an inode while any passthrough open of it lasts, so the inode holds it, under the table's
//! lock with the inode's other opens.

use std::collections::HashSet;
use std::sync::Arc;

use fuser::BackingId;

/// Passthrough opens of one inode: the backing file they share.
pub struct Backing {
    key: String,
    id: Arc<BackingId>,
    handles: HashSet<u64>,
    /// What the backing file is made of, kept alive while it is open (a read-cache file:
    /// never evicted meanwhile).
    _keep: Option<Arc<dyn Send + Sync>>,
}

impl Backing {
    /// The backing file `id` of version `key`, opened by handle `fh`.
    pub fn new(key: String, id: BackingId, fh: u64, keep: Option<Arc<dyn Send + Sync>>) -> Self {
        Backing {
            key,
            id: Arc::new(id),
            handles: HashSet::from([fh]),
            _keep: keep,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// One more open sharing the backing file.
    pub fn join(&mut self, fh: u64) -> Arc<BackingId> {
        self.handles.insert(fh);
        self.id.clone()
    }

    pub fn id(&self) -> Arc<BackingId> {
        self.id.clone()
    }

    /// A handle closed; true when it was the last one.
    pub fn leave(&mut self, fh: u64) -> bool {
        self.handles.remove(&fh);
        self.handles.is_empty()
    }
}
