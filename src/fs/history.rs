//! A file's history follows its name, as programs save (issue 49): vim and emacs rename the
//! file away (`f` to `f~`) and write a new `f`; Word renames it to `~WRL0001.tmp` before its
//! new copy takes the name. On the store the history belongs to a file ID, so the new `f` would
//! start with none, and the old versions stay with the backup, deleted a moment later.
//!
//! A program that deletes the file first and then writes the new one is met the same way: a
//! new file made under the name of a stored file this mount deleted within the window, in the
//! same folder, continues it ([`Fs::revive`]): where the store keeps deleted files (ours), the
//! deleted file is brought back before the first upload and the new bytes become its next
//! version; elsewhere it stays a new file.
//!
//! So a new file made under a name that this mount renamed a stored file away from within a
//! few seconds (`table::vacated`) continues that file: before its first upload
//! ([`Fs::continue_document`]) the renamed file is moved back to the name, and the new bytes
//! are stored as its next version. Where the backup keeps its name, it is made again as a copy
//! of the old bytes (a file of its own: emacs's `f~`); where this mount removed it meanwhile
//! (vim, Word), its delete was handed to the new file ([`Fs::hand_over_delete`]) and nothing
//! more is asked of the store. Any step that fails leaves the new file a new file, as before:
//! nothing is lost, only the link to the history.
//!
//! Only this mount's own renames count, to a backup's name ([`backup_name`]: `f~`, Word's
//! `~WRL0001.tmp`), and only files it has not stored yet: a file renamed on purpose
//! (`mv report.txt old.txt`) keeps its history, and a file that another writer made at the
//! name, or one stored already, is never joined to another's past. Word closes its new copy
//! (`~WRD0001.tmp`) before the renames, and its upload would have started, and stored it, by
//! the time the copy takes the name: a new file under such a temporary name waits
//! [`TEMPORARY_SETTLE`] after its last write before its upload starts ([`Fs::held_back`]; an
//! fsync does not wait), so the rename finds it unstored.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Fs;
use super::follow::Ours;
use super::table::{Continues, Ino};
use crate::api::{Base, NodePath};
use crate::backend::Backend;

/// How long a new file under a temporary copy's name ([`temporary_copy`]) waits after its last
/// write before its upload starts.
pub(super) const TEMPORARY_SETTLE: Duration = Duration::from_secs(2);

impl<B: Backend> Fs<B> {
    /// How much longer the upload of `ino` waits: a new file (never stored) under a temporary
    /// copy's name, written less than [`TEMPORARY_SETTLE`] ago. None for any other file, and
    /// once it has another name.
    pub(super) fn held_back(&self, ino: Ino) -> Option<Duration> {
        let mtime = self.nodes.inode(ino, |i| {
            let temporary = i.path.name().is_some_and(temporary_copy);
            let s = i.staged.as_ref()?;
            (i.remote.is_none() && !i.unlinked && temporary).then(|| s.mtime())
        });
        // (A time set ahead, `touch -d` into the future, holds nothing.)
        let since = SystemTime::now()
            .duration_since(mtime??)
            .unwrap_or(Duration::MAX);
        TEMPORARY_SETTLE.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// Before the first upload of `ino`: where it continues a renamed file, the renamed file
    /// takes the name back and becomes `ino`'s stored file, whose next version the upload
    /// stores. Nothing to do (one table lookup) for any other file.
    pub(super) async fn continue_document(self: &Arc<Self>, ino: Ino) {
        // Every upload comes here first: a file made under a name just deleted here (and the
        // deleted file it may continue) reaches the store after that delete (`deletes`).
        self.deletes_sent().await;
        if self
            .nodes
            .inode(ino, |i| i.revives.is_some())
            .unwrap_or(false)
        {
            self.revive(ino).await;
            return;
        }
        let claimed = self.nodes.read(|t| {
            let i = t.get(ino)?;
            let c = i.continues.as_ref()?;
            Some((i.io.clone(), t.get(c.x).map(|x| (c.x, x.io.clone()))))
        });
        let Some((mine, theirs)) = claimed else {
            return;
        };
        // Both files' `io` (as a rename takes them): no upload, rename or unlink of either
        // runs meanwhile.
        let _locked = super::lock_io_in_order((ino, mine), theirs).await;
        let Some(claim) = self.nodes.take_claim(ino) else {
            return;
        };
        if !self.take_back(ino, &claim).await {
            if let Some((at, base)) = &claim.removed_at {
                // The delete handed over is done after all: the new file stays a new file.
                self.delete_handed_over(at, base).await;
            }
        }
    }

    /// The stored file this mount deleted where `ino` was made moments after comes back (a
    /// store that keeps deleted files) and becomes `ino`'s stored file, whose next version the
    /// upload stores. Anything not as expected leaves `ino` a new file.
    async fn revive(self: &Arc<Self>, ino: Ino) {
        let Some(io) = self.nodes.io(ino) else {
            return;
        };
        let _io = io.lock().await;
        let revives = self.nodes.inode_mut(ino, |i| {
            let id = i.revives.take()?;
            let new = i.remote.is_none() && i.staged.is_some() && !i.unlinked;
            new.then(|| (i.path.clone(), id))
        });
        let Some((name, id)) = revives.flatten() else {
            return;
        };
        // Only to a free name: a file made there meanwhile (elsewhere) would make the restore
        // land beside it under another name.
        match self.backend.node(&name).await {
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => {}
            _ => return,
        }
        let _ours = Ours::sending(self, vec![ino]);
        let node = match self.backend.restore_deleted(&id).await {
            Ok(n) => n,
            Err(e) => {
                log::debug!("{name} is a new file: the one deleted there is not kept ({e})");
                return;
            }
        };
        if NodePath::parse_uri(&node.uri).ok().as_ref() != Some(&name) {
            // Came back under another name after all: deleted again, as it was.
            log::warn!(
                "{name}: the file deleted there came back as {}; deleted again",
                node.uri
            );
            if let Ok(at) = NodePath::parse_uri(&node.uri) {
                let _ = self.backend.delete(&at).await;
            }
            return;
        }
        // The new bytes replace the version it had.
        if self.continues_history(ino, (&name, &id), &node, None) {
            log::info!("{name} continues its history (deleted and made again)");
        }
    }

    /// Moves the renamed file back to the name `ino` took and makes it `ino`'s stored file;
    /// false (nothing changed) where anything is not as the claim says.
    async fn take_back(self: &Arc<Self>, ino: Ino, claim: &Continues) -> bool {
        // Where the renamed file is, and whether a name here still shows it (`kept`).
        let found = self.nodes.read(|t| {
            let i = t.get(ino)?;
            let unstored = i.remote.is_none() && i.staged.is_some() && !i.unlinked;
            if !unstored || i.path != claim.name {
                return None;
            }
            match &claim.removed_at {
                Some((at, _)) => Some((i.path.clone(), at.clone(), false)),
                None => {
                    let x = t.get(claim.x)?;
                    let same = x.remote.as_ref().is_some_and(|r| r.id == claim.id);
                    if !same || x.unlinked || x.staged.is_some() {
                        return None;
                    }
                    Some((i.path.clone(), x.path.clone(), true))
                }
            }
        });
        let Some((name, at, kept)) = found else {
            return false;
        };
        if !at.name().is_some_and(backup_name) {
            return false;
        }
        let _ours = Ours::sending(self, vec![ino, claim.x]);
        let node = match self.backend.rename(&at, &name, false).await {
            Ok(n) if n.file_id().as_deref() == Some(claim.id.as_str()) => n,
            Ok(n) => {
                // Another file came to be at the backup's name: put it back as it was.
                log::warn!("{at} is no longer the file renamed from {name}; left as it is");
                let _ = self.backend.rename(&name, &at, false).await;
                drop(n);
                return false;
            }
            Err(e) => {
                log::info!("{name} is a new file: {at} could not take its name back ({e})");
                return false;
            }
        };
        let copy = if kept {
            // The backup keeps its name and its bytes, as a file of its own.
            match self.backend.copy(&name, &at, false).await {
                Ok(c) => Some(c),
                Err(e) => {
                    log::warn!("{at} could not be copied again ({e}); {name} is a new file");
                    if let Err(e) = self.backend.rename(&name, &at, false).await {
                        log::warn!("{name} could not go back to {at}: {e}");
                    }
                    return false;
                }
            }
        } else {
            None
        };
        // The new bytes replace the version the renamed file has.
        let renamed = Some((claim.x, copy.as_ref()));
        if self.continues_history(ino, (&name, &claim.id), &node, renamed) {
            log::info!("{name} continues its history (saved by a rename from {at})");
        }
        true
    }

    /// `x` is being removed: where a new file claims to continue it, its delete is handed to
    /// that file (which moves it back under its own name) instead of being sent. True when
    /// handed over.
    pub(super) fn hand_over_delete(&self, x: Ino, at: &NodePath, base: &Base) -> bool {
        if !at.name().is_some_and(backup_name) {
            return false;
        }
        self.nodes.hand_over_delete(x, at, base)
    }

    /// A new file holding a handed-over delete is removed or renamed away unstored: the
    /// renamed file it would have taken back is deleted after all.
    pub(super) async fn drop_claim(self: &Arc<Self>, ino: Ino) {
        let claim = self.nodes.take_claim(ino);
        if let Some((at, base)) = claim.and_then(|c| c.removed_at) {
            self.delete_handed_over(&at, &base).await;
        }
    }

    /// The delete a removal handed over, as the removal would have sent it: only the version
    /// it knew (another writer's file or edit there since stays).
    async fn delete_handed_over(&self, at: &NodePath, base: &Base) {
        if let Err(e) = self.delete_unless_changed(at, base).await {
            log::warn!("{at} could not be deleted: {e}");
        }
    }
}

/// Whether `name` is what programs rename a file to while they save it: an editor's backup
/// (`f~`, emacs's `f.~1~`, `f.bak`) or Word's `~WRL0001.tmp`.
pub(super) fn backup_name(name: &str) -> bool {
    name.ends_with('~') || name.ends_with(".bak") || temporary_copy(name)
}

/// Whether `name` is a program's temporary copy, renamed into a document's name moments after
/// it is written: Office's `~WRD0001.tmp` (and the `~WRL0001.tmp` it renames the old one to).
pub(super) fn temporary_copy(name: &str) -> bool {
    name.starts_with('~') && name.ends_with(".tmp")
}

#[cfg(test)]
mod tests {
    #[test]
    fn backups_are_told_by_their_names() {
        for name in ["notes.txt~", "notes.txt.~1~", "notes.bak", "~WRL0001.tmp"] {
            assert!(super::backup_name(name), "{name}");
        }
        for name in [
            "notes.txt",
            "old-notes.txt",
            "draft.tmp",
            "~notes.txt",
            "notes~.txt",
        ] {
            assert!(!super::backup_name(name), "{name}");
        }
    }
}
