//! Two writers on one file (docs/design.md §5). Every upload names the version it
//! replaces (`Staged::base`); a store refuses one whose base is no longer current
//! (`ErrorKind::Precondition`). Then nothing is lost: the version already stored keeps the
//! name, and the local bytes become a conflict copy beside it,
//! `NAME (conflict YYYY-MM-DD HHMMSS HOST).EXT`, which the uploader stores as a new file. An
//! edit to a file deleted elsewhere (`NotFound`) is stored again under its name: an edit beats
//! a delete. Bytes that are already the version stored (the same edit made twice, or an
//! upload that finished before a kill and is sent again at the restart) make no copy: the
//! file takes that version as its own. The copies made are kept in the cache dir's `conflicts` log, for `vaultfs status`
//! and the `user.vaultfs.conflict` attribute of each copy.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::INodeNo;

use super::Fs;
use super::status::Conflict;
use super::table::Ino;
use crate::api::path::conflict_name as copy_name;
use crate::api::{Base, Error, ErrorKind, Node, NodePath};
use crate::backend::Backend;
use crate::sync::relock;

/// At most this many refusals are resolved in a row for one file before the retry policy
/// takes over (a store that refuses every name would otherwise keep the uploader busy).
pub(super) const RESOLVE_AT_MOST: u32 = 4;

/// The conflict copies made by this mount (and earlier runs on the same cache dir).
pub(super) struct Conflicts {
    log: PathBuf,
    list: Mutex<Vec<Conflict>>,
}

impl Conflicts {
    /// The log in `cache_dir`, read (a torn last line is skipped).
    pub(super) fn open(cache_dir: &Path) -> std::io::Result<Conflicts> {
        let log = cache_dir.join("conflicts");
        let list = match File::open(&log) {
            Ok(f) => std::io::BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| serde_json::from_str(&l).ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(Conflicts {
            log,
            list: Mutex::new(list),
        })
    }

    fn add(&self, c: Conflict) {
        let line = serde_json::to_string(&c).expect("a conflict serializes") + "\n";
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            log::warn!("could not note the conflict copy {}: {e}", c.copy);
        }
        relock(&self.list).push(c);
    }

    /// Every copy made, oldest first.
    pub(super) fn list(&self) -> Vec<Conflict> {
        relock(&self.list).clone()
    }

    /// What the copy at `path` conflicts with, as the `user.vaultfs.conflict` attribute says it.
    pub(super) fn of_copy(&self, path: &NodePath) -> Option<String> {
        let uri = path.to_string();
        let list = relock(&self.list);
        let c = list.iter().rev().find(|c| c.copy == uri)?;
        Some(format!(
            "{} md5={} modified={}",
            c.original,
            c.server_md5.as_deref().unwrap_or("-"),
            c.server_modified.as_deref().unwrap_or("-")
        ))
    }
}

/// This machine's name, for conflict copies.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "vaultfs".into())
}

impl<B: Backend> Fs<B> {
    /// An upload of `ino` was refused with `e`. True when that was resolved and the upload is
    /// to run again at once: a conflict (the file is now its conflict copy), or the file or its
    /// folder deleted elsewhere (it is stored again). Else the retry policy decides.
    pub(super) async fn resolve_refusal(self: &Arc<Self>, ino: Ino, e: &Error) -> bool {
        match e.kind {
            ErrorKind::Precondition => self.make_conflict_copy(ino).await,
            ErrorKind::NotFound => self.store_again(ino).await,
            _ => false,
        }
    }

    /// The staged bytes of `ino` move to a conflict copy beside it (here: the inode takes the
    /// copy's name; on the store once the uploader sends it, as a new file); the name shows
    /// the store's version again.
    async fn make_conflict_copy(self: &Arc<Self>, ino: Ino) -> bool {
        let Some(io) = self.nodes.io(ino) else {
            return false;
        };
        let _io = io.lock().await;
        let Some((path, staged)) = self
            .nodes
            .inode(ino, |i| Some((i.path.clone(), i.staged.clone()?)))
            .flatten()
        else {
            return false;
        };
        let (Some(dir), Some(name)) = (path.parent(), path.name().map(str::to_string)) else {
            return false;
        };
        // What keeps the name, for the copy's attribute (a failure here changes nothing).
        let server = self.backend.node(&path).await.ok();
        if let Some(node) = &server {
            if same_bytes(&staged, node).await {
                return self.adopt(ino, &staged, node, &path);
            }
        }
        let now = SystemTime::now();
        let Some(copy) = self.free_copy_path(&path, now).await else {
            return false;
        };
        let Some(dir_ino) = self.to_conflict_copy(ino, &staged, &path, &copy, &dir) else {
            return false;
        };
        self.note_conflict(&path, &copy, server.as_ref(), now);
        // The kernel drops its entries of both names: the name now leads to the store's
        // version, the copy to this inode.
        if let (Some(n), Some(d)) = (self.notifier.get().cloned(), dir_ino) {
            let names = [name, copy.name().unwrap_or_default().to_string()];
            tokio::task::spawn_blocking(move || {
                for nm in names {
                    let _ = n.inval_entry(INodeNo(d), OsStr::new(&nm));
                }
            });
        }
        true
    }

    /// The staged bytes of `ino` are the version `node` the store has at its name: that
    /// version is the one they replace now, and the next round finds nothing to send (only
    /// their attributes). True when still the same staged file.
    fn adopt(
        &self,
        ino: Ino,
        staged: &Arc<super::staging::Staged>,
        node: &Node,
        path: &NodePath,
    ) -> bool {
        if !self.adopts_stored(ino, staged, node) {
            return false;
        }
        staged.same_as_stored();
        log::info!(
            "{path}: the bytes refused as a conflict are the version stored there; no copy made"
        );
        true
    }

    /// A name for the conflict copy of `path` that neither this mount nor the store has.
    async fn free_copy_path(&self, path: &NodePath, now: SystemTime) -> Option<NodePath> {
        let (dir, name) = (path.parent()?, path.name()?);
        let host = host_name();
        for n in 1..=20 {
            let candidate = dir.child(&copy_name(name, now, &host, n)).ok()?;
            if self.nodes.ino_of(&candidate).is_some() {
                continue;
            }
            match self.backend.node(&candidate).await {
                Err(e) if e.kind == ErrorKind::NotFound => return Some(candidate),
                Ok(_) => continue,
                Err(e) => {
                    log::warn!("conflict on {path}: cannot check {candidate}: {e}");
                    return None;
                }
            }
        }
        None
    }

    /// Logs and records the conflict copy `copy` of `path`, whose version `server` kept the name.
    fn note_conflict(
        &self,
        path: &NodePath,
        copy: &NodePath,
        server: Option<&crate::api::Node>,
        now: SystemTime,
    ) {
        log::warn!(
            "conflict: {path} was changed elsewhere since this mount knew it; the store's \
             version keeps the name, this mount's edit is stored as {copy}"
        );
        self.conflicts.add(Conflict {
            copy: copy.to_string(),
            original: path.to_string(),
            server_md5: server.and_then(|n| n.md5_checksum.clone()),
            server_modified: server.and_then(|n| n.modified_on.clone()),
            at: crate::api::time::format_time(now),
        });
    }

    /// A rename of a stored file over `dst`, which this mount knew as `known` (`Absent`: no
    /// file there): where the store has another version there now, the renamed file goes to a
    /// conflict copy instead (the path returned, already noted) and `dst` keeps the store's
    /// version. A check, then the move: a version stored in between is replaced, and goes
    /// with the file it replaced.
    pub(super) async fn rename_over_changed(
        &self,
        dst: &NodePath,
        known: &Base,
    ) -> Option<NodePath> {
        if *known == Base::Any {
            return None;
        }
        let now = self.backend.node(dst).await.ok()?;
        if known.holds(now.md5_checksum.as_deref()) {
            return None;
        }
        let when = SystemTime::now();
        let copy = self.free_copy_path(dst, when).await?;
        self.note_conflict(dst, &copy, Some(&now), when);
        Some(copy)
    }

    /// The stored file `ino` (its ID) and the version this mount's user had of it: the version
    /// last read or stored here, else the one the mount lists (what a rewrite would replace).
    pub(super) fn known_of(&self, ino: Ino) -> Option<(String, Base)> {
        (self.nodes)
            .inode(ino, |i| {
                Some((i.remote.as_ref()?.id.clone(), i.known_base_here()))
            })
            .flatten()
    }

    /// An unlink of the stored file `ino` at `path`: whether the store's file there is no
    /// longer what this mount's user had (the version last read or stored here, else the one
    /// the mount lists: what a rewrite would replace) but another writer's edit, or another
    /// file. The delete would lose that edit, so the store keeps it: an edit beats a delete,
    /// either way round. A check, then the delete, which our server checks again atomically
    /// (`Backend::delete_if`); on a server without that, what is stored in between is lost
    /// (docs/design.md §5). A mount that knows no md5 (a server without them) cannot tell.
    pub(super) async fn changed_since_known(
        &self,
        known: &(String, Base),
        path: &NodePath,
    ) -> bool {
        let (id, known) = known;
        // Where the store checks the delete's base itself (`checks_deletes`), the delete is the
        // look: one round trip a file instead of two for an `rm -rf` over a server. (It
        // compares the bytes, not the ID: another file with the very same bytes may go.)
        if *known == Base::Any || self.backend.checks_deletes() {
            return false;
        }
        let Ok(now) = self.backend.node(path).await else {
            return false;
        };
        let changed = now.file_id().as_deref() != Some(id.as_str())
            || !known.holds(now.md5_checksum.as_deref());
        if changed {
            log::warn!(
                "{path} was changed elsewhere since this mount knew it; not deleted from the \
                 store (an edit beats a delete)"
            );
        }
        changed
    }

    /// After step 3 on a server without the atomic check (`conflict_check` absent from the
    /// node of step 2): whether the file now holds another version than the `md5` just stored,
    /// i.e. another writer committed right after this one. What commits between step 2's
    /// comparison and this look is the window left (docs/design.md §5). A failed look says
    /// nothing.
    pub(super) async fn committed_after(
        &self,
        step2: &crate::api::Node,
        path: &NodePath,
        md5: &str,
    ) -> bool {
        let atomic =
            (step2.file_ex_properties.as_ref()).is_some_and(|x| x.conflict_check == Some(true));
        if atomic {
            return false;
        }
        match self.backend.node(path).await {
            Ok(n) => n
                .md5_checksum
                .as_deref()
                .is_some_and(|m| !m.eq_ignore_ascii_case(md5)),
            Err(_) => false,
        }
    }

    /// `NotFound` for an upload: the file was deleted elsewhere (it is stored again as a new
    /// file: an edit beats a delete), or its folder was (made again, then the file stored).
    async fn store_again(self: &Arc<Self>, ino: Ino) -> bool {
        let Some((path, staged, known)) = self
            .nodes
            .inode(ino, |i| {
                Some((i.path.clone(), i.staged.clone()?, i.remote.clone()))
            })
            .flatten()
        else {
            return false;
        };
        if let Some(known) = known {
            // Still there as the same file: something else was not found (a pending version
            // the server dropped); the retry policy repeats the steps.
            match self.backend.node(&path).await {
                Ok(n) if n.file_id().as_deref() == Some(known.id.as_str()) => return false,
                Err(e) if e.kind != ErrorKind::NotFound => return false,
                _ => {}
            }
            if !self.stored_anew(ino, &staged) {
                return false;
            }
            log::warn!("{path} was deleted elsewhere while edited here; it is stored again");
            return true;
        }
        let Some(dir) = path.parent() else {
            return false;
        };
        match self.backend.node(&dir).await {
            Err(e) if e.kind == ErrorKind::NotFound => {}
            // The folder is there: the refusal is something else.
            _ => return false,
        }
        let mut missing = vec![dir.clone()];
        while let Some(up) = missing.last().and_then(|d| d.parent()) {
            if !up.holds_entries() || self.backend.node(&up).await.is_ok() {
                break;
            }
            missing.push(up);
        }
        for d in missing.iter().rev() {
            if let Err(e) = self.backend.create_folder(d).await {
                if e.kind != ErrorKind::Conflict {
                    log::warn!("cannot make {d} again for {path}: {e}");
                    return false;
                }
            }
        }
        log::warn!(
            "the folder of {path} was deleted elsewhere while it was edited here; made again"
        );
        true
    }
}

/// Whether `staged` holds the bytes of the version `node` (same size, same md5).
async fn same_bytes(staged: &Arc<super::staging::Staged>, node: &Node) -> bool {
    let (Some(md5), Some(size)) = (node.md5_checksum.clone(), node.size) else {
        return false;
    };
    let s = staged.clone();
    tokio::task::spawn_blocking(move || s.is_version(&md5, size))
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::copy_name;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn conflict_copies_keep_the_extension_last_and_fit_a_name() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(
            copy_name("report.txt", t, "laptop", 1),
            "report (conflict 2026-11-18 110640 laptop).txt"
        );
        assert_eq!(
            copy_name("archive.tar.gz", t, "h", 2),
            "archive.tar (conflict 2026-11-18 110640 h 2).gz"
        );
        assert_eq!(
            copy_name(".bashrc", t, "h", 1),
            ".bashrc (conflict 2026-11-18 110640 h)"
        );
        let long = "é".repeat(200) + ".pdf";
        let c = copy_name(&long, t, "h", 1);
        assert!(c.len() <= 255 && c.ends_with(" h).pdf"), "{c}");
    }

    /// Issue 47, items 3 and 4: a name whose extension is most of its 255 bytes, a host name
    /// with a bidi override or a control character: the copy's name is always one the store
    /// takes, its tag readable, the stem kept.
    #[test]
    fn a_conflict_copys_name_is_always_one_the_store_takes() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let cases = [
            format!("Minutes v1.{}", "x".repeat(240)),
            format!("Minutes v1.{}", "x".repeat(243)),
            format!("a.{}", "é".repeat(126)),
            "x".repeat(255),
        ];
        for name in &cases {
            for host in ["laptop", "lap\u{202e}top", "a\u{7}b/c\u{2066}d"] {
                for n in [1, 2, 20] {
                    let c = copy_name(name, t, host, n);
                    let stored = crate::api::path::new_name(&c);
                    assert!(stored.is_ok_and(|s| s == c), "{c:?}");
                    assert!(c.contains(" (conflict 2026-11-18 110640 "), "{c}");
                    assert!(!c.chars().any(|ch| ch.is_control()), "{c:?}");
                    let stem = name.split('.').next().unwrap();
                    assert!(c.starts_with(&stem[..stem.len().min(32)]), "{c}");
                }
            }
        }
        let c = copy_name("notes.txt", t, "lap\u{202e}top", 1);
        assert_eq!(c, "notes (conflict 2026-11-18 110640 laptop).txt");
    }
}
