//! Steps of a staged file whose name or stored file changes (a conflict copy, a file taken
//! back by its history, one stored anew), each under the table's lock, taken here: the inode
//! and its copy move together.

use std::sync::Arc;

use crate::api::{Node, NodePath};
use crate::backend::Backend;
use crate::fs::Fs;
use crate::fs::staging::Staged;
use crate::fs::table::Ino;

impl<B: Backend> Fs<B> {
    /// **Conflict copy**: `ino`'s staged bytes at `path` move to the new name `copy` (in folder
    /// `dir`), to be stored as a new file; the name shows the store's version again. None,
    /// and nothing changed, when the inode moved or `staged` is not its copy any more; else
    /// the folder's inode, if the table has it.
    pub(in crate::fs) fn to_conflict_copy(
        &self,
        ino: Ino,
        staged: &Arc<Staged>,
        path: &NodePath,
        copy: &NodePath,
        dir: &NodePath,
    ) -> Option<Option<Ino>> {
        let mut t = self.nodes.lock();
        let still = t.get(ino).is_some_and(|i| i.path == *path);
        if !still || !Self::becomes_new_file(&mut t, ino, staged) {
            return None;
        }
        t.rename(ino, copy);
        t.give_back(path);
        self.renamed(&t, ino, copy);
        let dir_ino = t.ino_of(dir);
        if let Some(d) = dir_ino {
            t.entries_changed(d);
        }
        Some(dir_ino)
    }

    /// **Takes a stored version**, found to be the very bytes staged: `staged`, still `ino`'s
    /// copy, has `node` as its stored file and base. False when it is not, or `node` is no file.
    pub(in crate::fs) fn adopts_stored(&self, ino: Ino, staged: &Arc<Staged>, node: &Node) -> bool {
        let mut t = self.nodes.lock();
        let still = t
            .get(ino)
            .is_some_and(|i| i.staged.as_ref().is_some_and(|s| Arc::ptr_eq(s, staged)));
        if !still || node.file_id().is_none() {
            return false;
        }
        Self::takes_version(&mut t, ino, node);
        true
    }

    /// **Becomes a new file**, the stored one deleted elsewhere: `staged` is stored anew, its
    /// journal entry saying so. False when it is not `ino`'s copy any more.
    pub(in crate::fs) fn stored_anew(&self, ino: Ino, staged: &Arc<Staged>) -> bool {
        let mut t = self.nodes.lock();
        if !Self::becomes_new_file(&mut t, ino, staged) {
            return false;
        }
        // (The inode has no stored file now: the entry names none.)
        if let Some(i) = t.get(ino) {
            let _ = self.journal_at(staged, i);
        }
        true
    }

    /// **Takes a stored version** back by its history: the new file `ino` at `name` continues
    /// the stored file `id`, whose version `node` its staged bytes now replace; `renamed`, the
    /// renamed file's inode moved back (with what the store said of it, if anything). Both
    /// count as changed here (the feed's word of these moves, which may come after, is ours).
    /// False when `ino` has no staged copy any more.
    pub(in crate::fs) fn continues_history(
        &self,
        ino: Ino,
        (name, id): (&NodePath, &str),
        node: &Node,
        renamed: Option<(Ino, Option<&Node>)>,
    ) -> bool {
        let mut t = self.nodes.lock();
        if let Some((x, seen)) = renamed {
            if let Some(c) = seen {
                t.update_from(x, c);
            }
            t.touch(x);
        }
        t.touch(ino);
        let Some(staged) = Self::takes_version(&mut t, ino, node) else {
            return false;
        };
        let _ = self.journal.record(&staged, name, Some(id.to_string()));
        true
    }
}
