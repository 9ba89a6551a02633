//! Names stored files were renamed away from, or deleted from, lately (`history`): vim, emacs
//! and Word save by renaming the file away and writing a new one under its name, other programs
//! by deleting it first, and that new file continues the document. Remembered for a few
//! seconds, pruned at most once a second.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Continues, Ino, Table};
use crate::api::{Base, NodePath};

/// How long a name left by a rename may be taken by a new file that continues the document
/// (editors write the new file within a second; Word within a few).
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Vacated {
    /// By the name left: the file renamed away, its file ID, and when.
    names: HashMap<NodePath, (Ino, String, Instant)>,
    /// When `names` was last pruned (`None`: never).
    pruned: Option<Instant>,
    /// The new files continuing a renamed file, by the renamed file's inode.
    claims: HashMap<Ino, Ino>,
    /// By the name: the stored file this mount deleted there, its file ID, its folder's
    /// inode, and when.
    deleted: HashMap<NodePath, (String, Option<Ino>, Instant)>,
}

impl Table {
    /// `x`, stored as `id`, was renamed away from `name` by this mount.
    pub fn vacate(&mut self, name: NodePath, x: Ino, id: String) {
        let now = self.prune_vacated();
        self.vacated.names.insert(name, (x, id, now));
    }

    /// The stored file `id` at `name` was deleted by this mount.
    pub fn vacate_deleted(&mut self, name: NodePath, id: String) {
        let now = self.prune_vacated();
        let dir = name.parent().and_then(|p| self.ino_of(&p));
        self.vacated.deleted.insert(name, (id, dir, now));
    }

    /// The delete of `id` at `name` did not happen after all (`deletes`): forgotten.
    pub fn unvacate_deleted(&mut self, name: &NodePath, id: &str) {
        if self
            .vacated
            .deleted
            .get(name)
            .is_some_and(|(i, _, _)| i == id)
        {
            self.vacated.deleted.remove(name);
        }
    }

    /// Forgets what is older than the window (at most once a second); now.
    fn prune_vacated(&mut self) -> Instant {
        let now = Instant::now();
        let v = &mut self.vacated;
        if v.pruned
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            v.names
                .retain(|_, (_, _, at)| now.duration_since(*at) < WINDOW);
            v.deleted
                .retain(|_, (_, _, at)| now.duration_since(*at) < WINDOW);
            v.pruned = Some(now);
        }
        now
    }

    /// New file `ino` takes its name: where a stored file left that name within the window,
    /// it continues that file's document (taken once).
    pub fn claim_vacated(&mut self, ino: Ino) {
        let Some(name) = (self.inodes.get(&ino))
            .filter(|i| i.continues.is_none())
            .map(|i| i.path.clone())
        else {
            return;
        };
        let Some((x, id, at)) = self.vacated.names.remove(&name) else {
            // A name whose stored file this mount deleted moments before: brought back
            // before this file's first upload (`history`).
            // Not when the folder is another by now (`rm -rf d; mkdir d`): the file's own
            // folder is gone with it.
            if let Some((id, dir, at)) = self.vacated.deleted.remove(&name) {
                let same_dir = name.parent().and_then(|p| self.ino_of(&p)) == dir;
                if let Some(i) =
                    (self.inodes.get_mut(&ino)).filter(|_| same_dir && at.elapsed() < WINDOW)
                {
                    i.revives = Some(id);
                }
            }
            return;
        };
        if x == ino || at.elapsed() >= WINDOW {
            return;
        }
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.continues = Some(Box::new(Continues {
                x,
                id,
                name,
                removed_at: None,
            }));
            self.vacated.claims.insert(x, ino);
        }
    }

    /// The new file that claims to continue `x`, while its claim stands.
    pub fn claimant(&self, x: Ino) -> Option<Ino> {
        let s = *self.vacated.claims.get(&x)?;
        let claim = self.inodes.get(&s)?.continues.as_ref()?;
        (claim.x == x).then_some(s)
    }

    /// `x` is being removed from `at` (`base`: what it held): where a new file claims to
    /// continue it, the delete is handed to that file. True when handed over.
    pub fn hand_over_delete(&mut self, x: Ino, at: &NodePath, base: &Base) -> bool {
        let Some(s) = self.claimant(x) else {
            return false;
        };
        let Some(i) = self.inodes.get_mut(&s) else {
            return false;
        };
        if i.remote.is_some() || i.unlinked {
            return false;
        }
        match i.continues.as_mut() {
            Some(c) => {
                c.removed_at = Some((at.clone(), base.clone()));
                true
            }
            None => false,
        }
    }

    /// `ino`'s claim, taken (it is settled once).
    pub fn take_claim(&mut self, ino: Ino) -> Option<Continues> {
        let c = self.inodes.get_mut(&ino)?.continues.take()?;
        if self.vacated.claims.get(&c.x) == Some(&ino) {
            self.vacated.claims.remove(&c.x);
        }
        Some(*c)
    }
}
