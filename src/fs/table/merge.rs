//! A listing fetched from the backend, merged into the table with what exists only here: names
//! removed, renamed or made here while it was on its way win over what it says.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{Ino, InodeKind, ROOT, Table};
use crate::api::{Node, NodePath};
use crate::fs::virtual_names::{PREVIEW, is_virtual_name};

/// What a merged listing changed.
#[derive(Default)]
pub struct Merged {
    /// Nodes whose content the listing says changed (the kernel drops its pages of them).
    pub changed: Vec<Ino>,
    /// Names gone from the folder, their nodes, and whether each was a folder: detached from
    /// the table already.
    pub gone: Vec<(String, Ino, bool)>,
    /// Whether the listing shows a name the last one did not.
    pub added: bool,
}

impl Table {
    /// Merges the listing of `dir` at `path` (the folder's `node`, its `children`), asked for
    /// at `started`; `expired`: the time before which a listing counts as expired by a change
    /// made elsewhere (`Freshness::expired`).
    pub fn merge_listing(
        &mut self,
        dir: Ino,
        path: &NodePath,
        node: &Node,
        children: &[Node],
        started: Instant,
        expired: Option<Instant>,
    ) -> Merged {
        let mut merged = Merged::default();
        let mut names = BTreeMap::new();
        let mut hidden_preview = false;
        for child in children {
            // A real `.preview` or `.versions` is hidden by the virtual one and never touched.
            if is_virtual_name(&child.name) {
                hidden_preview = true;
                continue;
            }
            let Ok(cpath) = path.child(&child.name) else {
                continue;
            };
            if self.removed_since(&cpath, started) {
                continue; // removed here while the listing was on its way
            }
            // Changed here (created, renamed, uploaded) or told by the backend since the
            // listing was asked for: what the listing says of it is older.
            let newer = self.ino_of(&cpath).filter(|i| {
                self.sending(*i) || self.get(*i).is_some_and(|i| i.newer_than(started))
            });
            let (ino, content_changed) = match newer {
                Some(ino) => (ino, false),
                None => self.upsert(&cpath, child),
            };
            if content_changed {
                merged.changed.push(ino);
            }
            names.insert(child.name.clone(), ino);
        }
        for (name, ino) in self.local_children(path, started) {
            log::debug!("listing {path}: {name} kept (changed here, or staged)");
            names.insert(name, ino);
        }
        let old = self
            .get(dir)
            .and_then(|i| i.listing())
            .map(|(_, n)| n.clone());
        let listed_before = old.is_some();
        let old = old.unwrap_or_default();
        // Pages fetched while the folder changed here can skip names that did not change
        // (a name taken out before the offset of the next page moves one past it): then no
        // name goes for being absent (fstests generic/736 over a server: 1 of 5,000 files
        // gone from the listing while it was still there). A later listing settles them.
        let unsettled = self.names_changed_since(path, started);
        merged.added = names.keys().any(|n| !old.contains_key(n));
        for (name, ino) in old {
            if names.contains_key(&name) {
                continue;
            }
            // Created, renamed here or uploaded after the listing was asked for: keep.
            let recent = self.get(ino).is_some_and(|i| {
                !i.unlinked && (unsettled || i.touched >= started) && i.path.name() == Some(&name)
            });
            if recent {
                log::debug!("listing {path}: {name} kept (changed here since asked)");
                names.insert(name, ino);
            } else {
                let dir_kind = self.get(ino).is_some_and(|i| i.kind == InodeKind::Dir);
                merged.gone.push((name, ino, dir_kind));
            }
        }
        if listed_before && (merged.added || !merged.gone.is_empty()) {
            // Entries came or went elsewhere: the folder's time is the store's again.
            self.entries_changed_elsewhere(dir);
        }
        if dir != ROOT {
            self.update_from(dir, node);
        }
        if let Some(i) = self.get_mut(dir) {
            i.set_fetched_listing(names, started, expired);
            i.hidden_preview = hidden_preview;
        }
        for (_, ino, _) in &merged.gone {
            self.detach_gone(*ino);
        }
        merged
    }

    /// Loads the listings `load` gives (the offline snapshot's) from `root` down, through the
    /// folders each names (parents before children; a folder never listed has no file), as
    /// fetched now: they are fetched again once they age. How many folders were loaded.
    pub fn restore(
        &mut self,
        root: &NodePath,
        mut load: impl FnMut(&NodePath) -> Option<Node>,
    ) -> usize {
        let mut dirs = 0;
        let mut next = vec![(root.clone(), ROOT)];
        while let Some((path, dir)) = next.pop() {
            let Some(node) = load(&path) else {
                continue;
            };
            if dir != ROOT {
                self.update_from(dir, &node);
            }
            let mut names = BTreeMap::new();
            for child in node.children.iter().flatten() {
                if child.name == PREVIEW {
                    continue;
                }
                if let Ok(cpath) = path.child(&child.name) {
                    let ino = self.upsert(&cpath, child).0;
                    if !child.node_type.is_file() {
                        next.push((cpath, ino));
                    }
                    names.insert(child.name.clone(), ino);
                }
            }
            if let Some(i) = self.get_mut(dir).filter(|i| i.kind == InodeKind::Dir) {
                i.set_listing(names);
                dirs += 1;
            }
        }
        dirs
    }
}
