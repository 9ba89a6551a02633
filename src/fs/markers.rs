//! Desktop indexers stay out of the mount by default (issue 35, item 3): the mount's root
//! answers `.trackerignore` and `.nomedia` as empty read-only files, which GNOME's indexer
//! (Tracker 3, LocalSearch: `ignored-directories-with-content` holds both by default) takes as
//! "skip this folder and everything under it", and other media scanners honour `.nomedia`
//! too. Without them an indexer walking the home folder opens every file of the vault, and a
//! remote mount downloads it whole.
//!
//! Reached by name, never listed, as `.preview` is: the indexer asks for the name (LocalSearch
//! stats `DIR/.trackerignore`), while `cp -r`, backups and `find` never see a file that would
//! keep their copy out of the index too. A real file of that name in the root is shown instead.
//! `--allow-indexing` turns them off. updatedb is kept out by its own configuration
//! (`PRUNEFS`, which `scripts/install.sh` extends with `fuse.vaultfs`); Baloo honours neither
//! (its own excluded folders only: see README).

use fuser::{Errno, FileAttr};

use super::table::{Ino, ROOT};
use super::{Fs, OpResult, virtual_names};
use crate::backend::Backend;

/// The marker files at the mount's root.
pub const NAMES: [&str; 2] = [".trackerignore", ".nomedia"];
/// Their inodes: the virtual nodes' flag and the markers' bit, then the name's index.
const MFLAG: Ino = virtual_names::FLAG | virtual_names::MARKERS_BIT;

/// Whether `ino` is a marker file.
pub fn owns(ino: Ino) -> bool {
    ino & !0xff == MFLAG
}

impl<B: Backend> Fs<B> {
    /// Whether the lookup of `name` in `parent` is a marker's: at the root, while indexers are
    /// kept out, where no real file has the name.
    pub(super) async fn is_marker(self: &std::sync::Arc<Self>, parent: Ino, name: &str) -> bool {
        parent == ROOT
            && !self.opts.allow_indexing
            && NAMES.contains(&name)
            && matches!(self.child(ROOT, name).await, Ok(None))
    }

    /// Whether a LOOKUP may be a marker's: then it is not answered from the listing alone.
    pub(super) fn maybe_marker(&self, parent: Ino, name: &str) -> bool {
        parent == ROOT && !self.opts.allow_indexing && NAMES.contains(&name)
    }

    pub(super) fn marker_lookup(&self, name: &str) -> OpResult<FileAttr> {
        let i = NAMES.iter().position(|n| *n == name).ok_or(Errno::ENOENT)?;
        self.marker_getattr(MFLAG | i as Ino)
    }

    pub(super) fn marker_getattr(&self, ino: Ino) -> OpResult<FileAttr> {
        let time = self.nodes.inode(ROOT, |i| i.mtime).ok_or(Errno::ENOENT)?;
        Ok(virtual_names::attr(ino, false, 0, time, self.uid, self.gid))
    }
}
