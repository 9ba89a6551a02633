//! What a user brings back (issue 32, item 4): a kept version made current again, and a
//! deleted file kept restorable.
//!
//! A restore is a new version, not a step back: the version restored is copied into a new row
//! (the same blob: no byte is copied) that becomes current, so the bytes it replaces are an
//! earlier version like any other (nothing is lost), a client that read the file sees another
//! md5, and the change feed says `version`.
//!
//! A delete of a file, while the retention rule bounds versions by age, keeps the file: it is
//! detached with its versions (no parent and the name `/<id>`, as the trash's trees are, so no
//! path or ID reaches it) and listed in `deleted` with the folder and name it had. Restored, it
//! goes back with its ID and versions; older than the bound, it is pruned (`Store::expire`).
//!
//! A folder deleted is kept the same way, whole (issue 49: `rm -rf` lost a tree for good): one
//! row, whatever its size. `rm -rf` through a mount removes the files one by one and then each
//! folder, bottom-up, so the folder restored last is empty: its restore brings back what was
//! removed with it, the entries under it deleted in the same run of deletes (walking back from
//! the folder's delete, each within [`RUN_GAP`] of the next), with their versions; a file
//! deleted there long before stays in the folder's deleted list. Older than the bound, a deleted
//! folder goes to the purge (`store::purge`), which removes its tree in bounded steps.

use super::limits::check_quota;
use super::resolve::{attached, file_by_id, find_child, get_row, path_of, require_folder, resolve};
use super::retention::prune_versions;
use super::{EMPTY_MD5, NodeRow, touch};
use crate::api::path::tagged_name;
use crate::api::{ChangeKind, DeletedFile, Error, Node, NodePath, Result, format_time};
use crate::store::changes::NewChange;
use crate::store::db::{Conn as Connection, OptionalExtension, params};
use crate::store::{Scope, Store, now_ns, ns_to_time};

impl Store {
    /// Makes the committed version `version_id` of the file current again, as a new version
    /// with its bytes (the time of the restore as its modification time). The current version
    /// given: nothing changes.
    pub fn restore_version(&self, scope: Scope, file_id: &str, version_id: &str) -> Result<Node> {
        self.note_write_activity();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let file = file_by_id(&tx, scope, file_id)?;
        let not_found = || Error::not_found(format!("file {file_id} has no version {version_id}"));
        let vid: i64 = version_id.parse().map_err(|_| not_found())?;
        let (length, md5, blob, exec, current): (
            i64,
            Option<String>,
            Option<String>,
            Option<i64>,
            bool,
        ) = tx
            .query_row(
                "SELECT v.length, v.md5, v.blob, v.exec,
                     CASE WHEN n.current_version = v.id THEN 1 ELSE 0 END
                 FROM versions v JOIN nodes n ON n.id = v.file_id
                 WHERE v.id = ?1 AND v.file_id = ?2 AND v.committed = 1",
                params![vid, file.id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?
            .ok_or_else(not_found)?;
        let path = path_of(&tx, file.id)?;
        if current {
            return Ok(file.to_api(&path));
        }
        check_quota(&tx, &self.config, scope, 0, length.max(0) as u64)?;
        let now = now_ns();
        let new: i64 = tx.query_row(
            "INSERT INTO versions (file_id, length, md5, blob, committed, created_on, committed_on, exec)
             VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5, ?6) RETURNING id",
            params![file.id, length, md5, blob, now, exec],
            |r| r.get(0),
        )?;
        tx.execute(
            "UPDATE nodes SET current_version = ?2, modified_on = ?3,
             exec = coalesce(?4, exec) WHERE id = ?1",
            params![file.id, new, now, exec],
        )?;
        let render = match &blob {
            Some(h) => crate::store::previews::want(&tx, &self.blobs, h, &file.name)?,
            None => None,
        };
        let freed = prune_versions(&tx, file.id, &self.config.retention)?;
        let row = get_row(&tx, file.id)?.expect("the file exists");
        self.log_change(&tx, NewChange::new(&row, ChangeKind::Version, &path))?;
        tx.commit()?;
        self.changed(row.account_id);
        self.forget_blobs(&conn, &freed);
        drop(conn);
        if let (Some(kind), Some(h)) = (render, &blob) {
            self.previews.enqueue(h, kind, &row.name);
        }
        // Only current versions are indexed: this one's bytes may never have been.
        self.search.wake();
        log::info!("{path}: version {version_id} restored as version {new}");
        Ok(row.to_api(&path))
    }
}

/// Whether a delete keeps the file restorable: when the rule keeps earlier versions at all and
/// bounds them by age (the time a deleted file is kept; without one the store would keep every
/// deleted file for ever).
pub(super) fn keeps_deleted(keep: &crate::store::Retention) -> bool {
    keep.age.is_some() && keep.count != Some(0)
}

/// Inside a delete's transaction: the file or folder `row` detached and listed as deleted from
/// its folder (a folder with its tree under it), a file's versions pruned by the rule as at a
/// save. Returns the blobs that freed.
pub(super) fn keep_deleted(
    tx: &Connection,
    row: &NodeRow,
    now: i64,
    keep: &crate::store::Retention,
) -> Result<Vec<String>> {
    let folder = row
        .parent_id
        .ok_or_else(|| Error::internal("a file with no folder"))?;
    super::detach(tx, row.id)?;
    tx.prepare_cached(
        "INSERT INTO deleted (node_id, account_id, folder_id, name, deleted_on)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![row.id, row.account_id, folder, row.name, now])?;
    prune_versions(tx, row.id, keep)
}

/// Deletes this far apart (ns) or closer are one run: a folder restored brings back the entries
/// under it deleted in its run (`rm -rf` through a mount over a slow link spends seconds per
/// file at worst; a minute is a pause, not the same removal).
pub(super) const RUN_GAP: i64 = 60_000_000_000;

/// The entries deleted under the folder `top` (their own deleted folders' too), newest first:
/// (node, folder, name, deleted_on). A walk of the tree's folders, attached and deleted, one
/// indexed query each.
fn deleted_under(tx: &Connection, top: i64) -> Result<Vec<(i64, i64, String, i64)>> {
    let mut found = Vec::new();
    let mut folders = vec![top];
    let mut seen = 0usize;
    while let Some(f) = folders.pop() {
        seen += 1;
        if seen as i64 > super::MAX_WALK_DEPTH * 100 {
            return Err(super::resolve::damaged(top));
        }
        let sub: Vec<i64> = tx
            .prepare_cached("SELECT id FROM nodes WHERE parent_id = ?1 AND kind = ?2")?
            .query_map(params![f, super::NodeKind::Folder as i64], |r| r.get(0))?
            .collect::<crate::store::db::Result<_>>()?;
        folders.extend(sub);
        let gone: Vec<(i64, i64, String, i64, i64)> = tx
            .prepare_cached(
                "SELECT d.node_id, d.folder_id, d.name, d.deleted_on, n.kind
                 FROM deleted d JOIN nodes n ON n.id = d.node_id WHERE d.folder_id = ?1",
            )?
            .query_map([f], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect::<crate::store::db::Result<_>>()?;
        for (node, folder, name, on, kind) in gone {
            if kind == super::NodeKind::Folder as i64 {
                folders.push(node);
            }
            found.push((node, folder, name, on));
        }
    }
    found.sort_by_key(|r| std::cmp::Reverse((r.3, r.0)));
    Ok(found)
}

/// A name for `name` in the folder `folder` that nothing there has: itself, or
/// `NAME (restored YYYY-MM-DD HHMMSS).EXT`.
fn free_name(tx: &Connection, folder: i64, name: &str) -> Result<String> {
    let when = crate::api::path::name_time(std::time::SystemTime::now());
    let mut taken = 0u32;
    loop {
        let candidate = match taken {
            0 => name.to_string(),
            n => tagged_name(name, &format!("restored {when}"), n),
        };
        if find_child(tx, folder, &candidate)?.is_none() {
            return Ok(candidate);
        }
        taken += 1;
    }
}

/// Puts the deleted node `id` back into `folder` as `name`, or another name where that is
/// taken: the name it got.
fn put_back(tx: &Connection, id: i64, folder: i64, name: &str) -> Result<String> {
    let name = free_name(tx, folder, name)?;
    tx.prepare_cached("UPDATE nodes SET parent_id = ?2, name = ?3 WHERE id = ?1")?
        .execute(params![id, folder, name])?;
    tx.prepare_cached("DELETE FROM deleted WHERE node_id = ?1")?
        .execute([id])?;
    Ok(name)
}

/// After the folder `top`, deleted at `at`, is back: the entries under it removed in the same
/// run of deletes come back too (see the module). How many.
fn restore_removed_with(tx: &Connection, top: i64, at: i64) -> Result<u64> {
    let mut last = at;
    let mut n = 0;
    for (node, folder, name, on) in deleted_under(tx, top)? {
        if last.saturating_sub(on) > RUN_GAP {
            break;
        }
        last = last.min(on);
        put_back(tx, node, folder, &name)?;
        n += 1;
    }
    Ok(n)
}

/// The deleted file of that ID in the caller's scope: (its node, folder, name). Another
/// account's is not found, as for every ID.
fn deleted_row(tx: &Connection, scope: Scope, id: &str) -> Result<(i64, i64, String)> {
    let not_found = || Error::not_found(format!("no deleted file with ID {id}"));
    let n: i64 = id.parse().map_err(|_| not_found())?;
    let (node, account, folder, name): (i64, i64, i64, String) = tx
        .query_row(
            "SELECT node_id, account_id, folder_id, name FROM deleted WHERE node_id = ?1",
            [n],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?
        .ok_or_else(not_found)?;
    match scope {
        Scope::Account(a) if a != account => Err(not_found()),
        _ => Ok((node, folder, name)),
    }
}

/// The file of that ID with its path: an attached one, or a deleted one kept restorable (named
/// and placed as when it was deleted; its folder must still be there), whose versions stay
/// readable (the mount's `.versions/`).
pub(super) fn file_or_deleted(
    tx: &Connection,
    scope: Scope,
    id: &str,
) -> Result<(NodeRow, NodePath)> {
    match file_by_id(tx, scope, id) {
        Ok(row) => {
            let path = path_of(tx, row.id)?;
            Ok((row, path))
        }
        Err(e) if e.kind == crate::api::ErrorKind::NotFound => {
            let Ok((node, folder, name)) = deleted_row(tx, scope, id) else {
                return Err(e);
            };
            let in_place = attached(tx, folder)? && get_row(tx, folder)?.is_some();
            let mut row = get_row(tx, node)?.filter(|_| in_place).ok_or(e)?;
            let path = path_of(tx, folder)?.child(&name)?;
            row.name = name;
            Ok((row, path))
        }
        Err(e) => Err(e),
    }
}

impl Store {
    /// The files and folders deleted from the folder (or vault) at `path` and kept restorable,
    /// most recently deleted first.
    pub fn deleted_files(&self, scope: Scope, path: &NodePath) -> Result<Vec<DeletedFile>> {
        let conn = self.lock()?;
        let folder = resolve(&conn, scope, path)?;
        require_folder(&folder, path)?;
        let rows = conn
            .prepare_cached(
                "SELECT d.node_id, d.name, d.deleted_on, n.modified_on, v.length, v.md5,
                     (SELECT count(*) FROM versions w WHERE w.file_id = d.node_id AND w.committed = 1),
                     n.current_version, n.kind
                 FROM deleted d JOIN nodes n ON n.id = d.node_id
                 LEFT JOIN versions v ON v.id = n.current_version
                 WHERE d.folder_id = ?1 ORDER BY d.deleted_on DESC, d.node_id DESC",
            )?
            .query_map([folder.id], |r| {
                let folder = r.get::<_, i64>(8)? == super::NodeKind::Folder as i64;
                Ok(DeletedFile {
                    folder,
                    id: r.get::<_, i64>(0)?.to_string(),
                    name: r.get(1)?,
                    deleted_on: format_time(ns_to_time(r.get(2)?)),
                    modified_on: Some(format_time(ns_to_time(r.get(3)?))),
                    size: r.get::<_, Option<i64>>(4)?.unwrap_or(0).max(0) as u64,
                    md5_checksum: (!folder).then(|| {
                        r.get::<_, Option<String>>(5)
                            .ok()
                            .flatten()
                            .unwrap_or_else(|| EMPTY_MD5.to_string())
                    }),
                    versions: r.get::<_, i64>(6)?.max(0) as u64,
                    version_id: r
                        .get::<_, Option<i64>>(7)?
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                })
            })?
            .collect::<crate::store::db::Result<_>>()?;
        Ok(rows)
    }

    /// Brings a deleted file back into the folder it was deleted from, with its versions and
    /// ID, under its old name, or `NAME (restored YYYY-MM-DD HHMMSS).EXT` when that is taken; a
    /// deleted folder with its tree and what was removed with it (see the module). Their bytes
    /// never left the account's usage, so no quota is checked.
    pub fn restore_deleted(&self, scope: Scope, file_id: &str) -> Result<Node> {
        self.note_write_activity();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let (id, folder_id, name) = deleted_row(&tx, scope, file_id)?;
        let folder = get_row(&tx, folder_id)?
            .filter(|f| !f.is_file() && f.parent_id.is_some())
            .filter(|f| attached(&tx, f.id).unwrap_or(false))
            .ok_or_else(|| {
                Error::not_found(format!(
                    "the folder {name} was deleted from is gone (restore that folder first, \
                     or one above it)"
                ))
            })?;
        let at: i64 = tx.query_row(
            "SELECT deleted_on FROM deleted WHERE node_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        put_back(&tx, id, folder.id, &name)?;
        let row = get_row(&tx, id)?.expect("the node exists");
        let with = match row.is_file() {
            true => 0,
            false => restore_removed_with(&tx, id, at)?,
        };
        touch(&tx, Some(folder.id), now_ns())?;
        let path = path_of(&tx, id)?;
        // One change for the whole tree, as for its delete: a client lists it again.
        self.log_change(&tx, NewChange::new(&row, ChangeKind::Created, &path))?;
        tx.commit()?;
        self.changed(row.account_id);
        match row.is_file() {
            true => log::info!("{path}: deleted file {id} restored"),
            false => log::info!("{path}: deleted folder {id} restored, {with} entries with it"),
        }
        // What comes back is found by search again (only attached files are).
        self.search.wake();
        Ok(row.to_api(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::RUN_GAP;
    use crate::store::{Retention, Scope, Store, StoreConfig, test_path};

    /// A folder restored brings back the entries removed in its run of deletes, down its tree
    /// (a subfolder removed with it, its files), under names that are free; a file deleted there
    /// long before stays in the folder's deleted list.
    #[test]
    fn a_folder_comes_back_with_what_was_removed_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            retention: Retention {
                count: Some(10),
                age: Some(std::time::Duration::from_secs(3600)),
                bytes: None,
            },
            ..StoreConfig::default()
        };
        let store = Store::open_local_with(tmp.path(), config).unwrap();
        let s = Scope::All;
        store.create_folder(s, &test_path("docs")).unwrap();
        store.create_folder(s, &test_path("docs/sub")).unwrap();
        for f in ["docs/old.txt", "docs/a.txt", "docs/sub/b.txt"] {
            let (dir, name) = f.rsplit_once('/').unwrap();
            store.create_file(s, &test_path(dir), name).unwrap();
        }
        store.delete(s, &test_path("docs/old.txt")).unwrap();
        // Deleted well before the rest: another removal.
        store
            .lock()
            .unwrap()
            .execute(
                "UPDATE deleted SET deleted_on = deleted_on - ?1",
                [RUN_GAP * 3],
            )
            .unwrap();
        for p in ["docs/sub/b.txt", "docs/sub", "docs/a.txt", "docs"] {
            store.delete(s, &test_path(p)).unwrap();
        }
        // Something else took the name meanwhile.
        store.create_folder(s, &test_path("docs")).unwrap();
        let gone = store.deleted_files(s, &test_path("")).unwrap();
        assert_eq!(gone.len(), 1);
        let back = store.restore_deleted(s, &gone[0].id).unwrap();
        assert!(back.name.starts_with("docs (restored "), "{back:?}");
        let names = |p: &str| -> Vec<String> {
            let mut n: Vec<String> = store
                .list(s, &test_path(p), 0, 100)
                .unwrap()
                .children
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.name)
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&back.name), ["a.txt", "sub"]);
        assert_eq!(names(&format!("{}/sub", back.name)), ["b.txt"]);
        let left = store.deleted_files(s, &test_path(&back.name)).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].name, "old.txt");
        assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
    }
}
