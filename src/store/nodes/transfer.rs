//! Copy and move: a file or a subtree to another place, a copy sharing the source's bytes.

use super::delete::delete_subtree;
use super::limits::{check_quota, subtree_size};
use super::resolve::{
    damaged, find_child, get_row, has_children, is_within, path_of, require_folder, resolve, split,
};
use super::retention::prune_versions;
use super::{MAX_WALK_DEPTH, NodeRow, SELECT, insert_node, read_row, touch};
use crate::api::{ChangeKind, Error, Node, NodePath, Result};
use crate::store::changes::NewChange;
use crate::store::db::{Conn as Connection, OptionalExtension, Tx as Transaction, params};
use crate::store::{Scope, Store, now_ns};

/// Copy or move, for [`Store::transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    Copy,
    Move,
}

/// Levels of the subtree at `id`: 1 for a file or an empty folder (counted up to
/// [`MAX_WALK_DEPTH`]).
fn subtree_height(conn: &Connection, id: i64) -> Result<usize> {
    let h: i64 = conn.query_row(
        "WITH RECURSIVE sub(id, depth) AS (SELECT CAST(?1 AS BIGINT), CAST(1 AS BIGINT) UNION ALL
             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id
             WHERE sub.depth <= ?2)
         SELECT max(depth) FROM sub",
        params![id, MAX_WALK_DEPTH],
        |r| r.get(0),
    )?;
    if h > MAX_WALK_DEPTH {
        return Err(damaged(id));
    }
    Ok(h as usize)
}

/// Copies the subtree `src` as `name` into `dst_parent`; returns the new top node's ID. A
/// work list, not a recursion: the depth of the tree costs no stack. It makes at most `nodes`
/// nodes (the subtree as counted before): a copy that finds more is finding its own copies
/// (a destination inside the source, which the caller refuses) and stops.
fn copy_tree(
    tx: &Transaction,
    src: &NodeRow,
    dst_parent: &NodeRow,
    name: &str,
    now: i64,
    nodes: u64,
) -> Result<i64> {
    let mut made = 1u64;
    let top = copy_node(tx, src, dst_parent, name, now)?;
    // (source folder, its copy) pairs whose children are still to copy.
    let mut todo: Vec<(i64, NodeRow)> = Vec::new();
    if !src.is_file() {
        todo.push((src.id, get_row(tx, top)?.expect("node just inserted")));
    }
    let mut children_of = tx.prepare(&format!("{SELECT} WHERE n.parent_id = ?1"))?;
    while let Some((from, to)) = todo.pop() {
        let children: Vec<NodeRow> = children_of
            .query_map([from], read_row)?
            .collect::<crate::store::db::Result<_>>()?;
        for child in &children {
            made += 1;
            if made > nodes {
                return Err(Error::internal(format!(
                    "copying node {} found more nodes than it holds",
                    src.id
                )));
            }
            let new_id = copy_node(tx, child, &to, &child.name, now)?;
            if !child.is_file() {
                todo.push((child.id, get_row(tx, new_id)?.expect("node just inserted")));
            }
        }
    }
    Ok(top)
}

/// Copies one node (a file with its current version, or a folder without its children).
fn copy_node(
    tx: &Transaction,
    src: &NodeRow,
    dst_parent: &NodeRow,
    name: &str,
    now: i64,
) -> Result<i64> {
    let new_id = insert_node(tx, dst_parent, src.kind, name, now)?;
    // WebDAV's dead properties go with a copy (RFC 4918 9.8.2), of every node of a tree.
    tx.execute(
        "INSERT INTO dav_props (node_id, namespace, name, prefix, xml)
         SELECT ?1, namespace, name, prefix, xml FROM dav_props WHERE node_id = ?2",
        params![new_id, src.id],
    )?;
    if src.is_file() {
        // The copy is a new file whose one version shares the source's blob: no byte is copied.
        let copied = tx.execute(
            "INSERT INTO versions (file_id, length, md5, blob, committed, created_on, committed_on)
             SELECT ?1, v.length, v.md5, v.blob, 1, ?2, ?2 FROM versions v
             WHERE v.id = (SELECT current_version FROM nodes WHERE id = ?3)",
            params![new_id, now, src.id],
        )?;
        if copied == 1 {
            let vid = tx.last_insert_rowid()?;
            tx.execute(
                "UPDATE nodes SET current_version = ?2, exec = ?3 WHERE id = ?1",
                params![new_id, vid, src.exec],
            )?;
        }
    }
    Ok(new_id)
}

impl Store {
    /// Copy or move `src` to `dst` (the full destination path, name included).
    pub fn transfer(
        &self,
        scope: Scope,
        src: &NodePath,
        dst: &NodePath,
        replace: bool,
        mode: TransferMode,
    ) -> Result<Node> {
        if src.depth() < 3 {
            return Err(Error::forbidden(
                "accounts and vaults cannot be copied or moved",
            ));
        }
        let (dst_parent_path, name) = split(dst)?;
        let name = &crate::api::path::new_name(name)?;
        let dst = &dst_parent_path.child(name)?;
        if dst.depth() < 3 {
            return Err(Error::forbidden("the destination must be inside a vault"));
        }
        dst.check_depth()?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let s = resolve(&tx, scope, src)?;
        let dp = match resolve(&tx, scope, &dst_parent_path) {
            Err(e) if e.is(crate::api::ErrorKind::NotFound) => {
                return Err(Error::not_found(format!(
                    "destination folder {dst_parent_path} not found"
                )));
            }
            other => other?,
        };
        require_folder(&dp, &dst_parent_path)?;
        // "Onto itself" and "inside itself" are decided by node IDs: a path may spell a name
        // in either normalization, and both find the same node (issue 31: text comparisons let
        // a copy into itself run forever and a move make a cycle of parents).
        let existing = find_child(&tx, dp.id, name)?;
        let onto_itself = existing.as_ref().is_some_and(|e| e.id == s.id);
        if onto_itself && (mode == TransferMode::Copy || s.name == *name) {
            if mode == TransferMode::Copy && !replace {
                return Err(Error::conflict("exists", format!("{dst} already exists")));
            }
            return Ok(s.to_api(dst));
        }
        if !s.is_file() && is_within(&tx, dp.id, s.id)? {
            return Err(Error::bad_request(
                "move_into_self",
                format!("cannot put {src} inside itself"),
            ));
        }
        // Deeper than it was: its deepest node must stay within the bound of a path.
        if !s.is_file() && dst.depth() > src.depth() {
            let deepest = dst.depth() - 1 + subtree_height(&tx, s.id)?;
            if deepest > crate::api::path::MAX_PATH_DEPTH {
                return Err(crate::api::path::path_too_deep(deepest));
            }
        }
        // A file put over a file keeps the one it replaces: the bytes become its new version.
        let over_file = existing
            .as_ref()
            .filter(|e| replace && !onto_itself && e.is_file() && s.is_file());
        if let Some(e) = over_file {
            let version = current_version(&tx, s.id)?;
            let to = path_of(&tx, dp.id)?.child(name)?;
            return self.onto_file(&conn, tx, scope, (&s, version), e, &to, mode);
        }
        let mut freed = Vec::new();
        let mut replaced = None;
        // A move onto itself only takes the name as given (a spelling stored by an older build
        // becomes NFC); nothing is replaced.
        if let Some(existing) = existing.filter(|_| !onto_itself) {
            if !replace {
                return Err(Error::conflict("exists", format!("{dst} already exists")));
            }
            if existing.is_file() != s.is_file() {
                return Err(Error::conflict(
                    "type_mismatch",
                    format!("{dst} exists and is not of the same kind"),
                ));
            }
            if !existing.is_file() && has_children(&tx, existing.id)? {
                return Err(Error::conflict(
                    "not_empty",
                    format!("{dst} is a folder that is not empty"),
                ));
            }
            freed = delete_subtree(&tx, existing.id)?;
            replaced = Some(existing);
        }
        // Where the node was and goes, as stored (for the change log).
        let (from, to) = (path_of(&tx, s.id)?, path_of(&tx, dp.id)?.child(name)?);
        if let Some(existing) = &replaced {
            self.log_change(&tx, NewChange::new(existing, ChangeKind::Deleted, &to))?;
        }
        let now = now_ns();
        let id = match mode {
            TransferMode::Move => {
                tx.execute(
                    "UPDATE nodes SET parent_id = ?2, name = ?3 WHERE id = ?1",
                    params![s.id, dp.id, name],
                )?;
                if dp.account_id != s.account_id {
                    // (Not a cycle: `s` is not above `dp`, which is under an account.)
                    tx.execute(
                        "WITH RECURSIVE sub(id, depth) AS (
                             SELECT CAST(?1 AS BIGINT), CAST(0 AS BIGINT) UNION ALL
                             SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parent_id = sub.id
                             WHERE sub.depth < ?3)
                         UPDATE nodes SET account_id = ?2 WHERE id IN (SELECT id FROM sub)",
                        params![s.id, dp.account_id, MAX_WALK_DEPTH],
                    )?;
                }
                touch(&tx, s.parent_id, now)?;
                s.id
            }
            TransferMode::Copy => {
                let limit = self.config.max_nodes_per_request;
                let (nodes, bytes) = subtree_size(&tx, s.id, limit)?;
                if nodes > limit {
                    return Err(Error::new(
                        crate::api::ErrorKind::TooLarge,
                        "too_many_nodes",
                        format!(
                            "{src} holds more than {limit} files and folders, the most one copy \
                             may create on this server; copy its parts one by one"
                        ),
                    ));
                }
                check_quota(&tx, &self.config, scope, nodes, bytes)?;
                copy_tree(&tx, &s, &dp, name, now, nodes)?
            }
        };
        touch(&tx, Some(dp.id), now)?;
        let row = get_row(&tx, id)?.expect("node exists");
        let kind = match mode {
            TransferMode::Move => ChangeKind::Moved,
            TransferMode::Copy => ChangeKind::Copied,
        };
        if mode == TransferMode::Move && row.account_id != s.account_id {
            // Between accounts (a caller of every account): gone from one, new in the other.
            self.log_change(&tx, NewChange::new(&s, ChangeKind::Deleted, &from))?;
            self.log_change(&tx, NewChange::new(&row, ChangeKind::Created, &to))?;
        } else {
            self.log_change(&tx, NewChange::new(&row, kind, &to).from(&from))?;
        }
        tx.commit()?;
        self.changed(row.account_id);
        self.changed(s.account_id);
        self.forget_blobs(&conn, &freed);
        Ok(row.to_api(dst))
    }
}

/// The committed version `file` serves, if it has one.
fn current_version(tx: &Connection, file: i64) -> Result<Option<i64>> {
    Ok(tx
        .query_row(
            "SELECT v.id FROM nodes n JOIN versions v ON v.id = n.current_version
             WHERE n.id = ?1 AND v.committed = 1",
            [file],
            |r| r.get(0),
        )
        .optional()?)
}

impl Store {
    /// A file moved or copied over the file `target`: `target` stays (its ID, its earlier
    /// versions, its links) and takes the source's `version` as its new current one (the same
    /// blob: no byte is copied), with the source's modification time, as a save would. A move
    /// then gives the source's earlier versions to `target` too and removes the source. So an
    /// editor's save by rename, or `mv` over a file, loses no version of either file (issue
    /// 32), and another writer sees a new version of the name, not a delete.
    #[allow(clippy::too_many_arguments)]
    fn onto_file(
        &self,
        conn: &Connection,
        tx: Transaction<'_>,
        scope: Scope,
        (s, version): (&NodeRow, Option<i64>),
        target: &NodeRow,
        to: &NodePath,
        mode: TransferMode,
    ) -> Result<Node> {
        let now = now_ns();
        let before = current_version(&tx, target.id)?;
        // The source's bytes as the new current version. A source with none yet (made, its
        // bytes not uploaded: a mount's new file, whose upload follows) leaves the file as it
        // is: others see its bytes until the new ones come, never an empty file meanwhile.
        let (new, blob) = match version {
            Some(version) => {
                let (length, blob): (i64, Option<String>) = tx.query_row(
                    "SELECT length, blob FROM versions WHERE id = ?1",
                    [version],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                if mode == TransferMode::Copy {
                    check_quota(&tx, &self.config, scope, 0, length.max(0) as u64)?;
                }
                let new: i64 = tx.query_row(
                    "INSERT INTO versions (file_id, length, md5, blob, committed, created_on,
                         committed_on, modified_on, exec)
                     SELECT ?1, length, md5, blob, 1, ?2, ?2, ?3, exec FROM versions
                     WHERE id = ?4 RETURNING id",
                    params![target.id, now, s.modified_on, version],
                    |r| r.get(0),
                )?;
                tx.execute(
                    "UPDATE nodes SET current_version = ?2, modified_on = ?3, exec = ?4
                     WHERE id = ?1",
                    params![target.id, new, s.modified_on, s.exec],
                )?;
                (Some(new), blob)
            }
            None => (None, None),
        };
        let mut freed = Vec::new();
        if mode == TransferMode::Move {
            // The source's earlier versions join the history under the name; its node goes.
            let from = path_of(&tx, s.id)?;
            tx.execute(
                "UPDATE versions SET file_id = ?1 WHERE file_id = ?2 AND committed = 1
                 AND (CAST(?3 AS BIGINT) IS NULL OR id <> ?3)",
                params![target.id, s.id, version],
            )?;
            if let (Some(before), Some(new)) = (before, new) {
                // The target's bytes before, where the history it takes holds them already: a
                // backup made as a copy of the file (a save by rename keeping its backup, `f`
                // to `f~` and back: `fs::history`), renamed over again, is kept once.
                tx.execute(
                    "DELETE FROM versions WHERE id = ?1 AND blob IS NOT NULL AND EXISTS (
                         SELECT 1 FROM versions w WHERE w.file_id = ?2 AND w.id <> ?1
                         AND w.id <> ?3 AND w.committed = 1
                         AND w.blob = (SELECT blob FROM versions WHERE id = ?1))",
                    params![before, target.id, new],
                )?;
            }
            freed = delete_subtree(&tx, s.id)?;
            touch(&tx, s.parent_id, now)?;
            self.log_change(&tx, NewChange::new(s, ChangeKind::Deleted, &from))?;
        }
        freed.extend(prune_versions(&tx, target.id, &self.config.retention)?);
        touch(&tx, target.parent_id, now)?;
        let render = match &blob {
            Some(h) => crate::store::previews::want(&tx, &self.blobs, h, &target.name)?,
            None => None,
        };
        let row = get_row(&tx, target.id)?.expect("the file exists");
        if new.is_some() {
            self.log_change(&tx, NewChange::new(&row, ChangeKind::Version, to))?;
        }
        tx.commit()?;
        self.changed(row.account_id);
        self.changed(s.account_id);
        self.forget_blobs(conn, &freed);
        if let (Some(kind), Some(h)) = (render, &blob) {
            self.previews.enqueue(h, kind, &row.name);
        }
        Ok(row.to_api(to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ErrorKind;
    use crate::store::test_path as at;

    /// A file moved or copied over a file: the file under the name keeps its ID and versions
    /// and takes the bytes as its new version; a moved source's earlier versions join that
    /// history; a source never uploaded leaves it as it is.
    #[test]
    fn a_file_put_over_a_file_becomes_its_new_version() {
        use crate::store::{Retention, StoreConfig};
        let tmp = tempfile::tempdir().unwrap();
        let keep = Retention {
            count: Some(50),
            age: Some(std::time::Duration::from_secs(30 * 24 * 3600)),
            bytes: None,
        };
        let config = StoreConfig {
            retention: keep,
            ..StoreConfig::default()
        };
        let store = Store::open_local_with(&tmp.path().join("store"), config).unwrap();
        let put = |name: &str, data: &[u8]| -> String {
            let p = tmp.path().join("bytes");
            std::fs::write(&p, data).unwrap();
            let f = crate::store::PutFile {
                base: crate::api::Base::Any,
                expect_md5: None,
                path: at(name),
                file_id: None,
                source: std::sync::Arc::new(std::fs::File::open(&p).unwrap()),
                len: data.len() as u64,
                sealed: false,
                digests: None,
                attrs: Default::default(),
                cancel: Default::default(),
            };
            let node = store.put_files(Scope::All, &[f]).remove(0).unwrap();
            node.id.unwrap()
        };
        let md5s = |id: &str| -> Vec<String> {
            let v = store.versions(Scope::All, id).unwrap();
            v.into_iter().map(|v| v.md5_checksum.unwrap()).collect()
        };
        use crate::api::checksum::{Md5, hex};
        let md5 = |b: &[u8]| hex(&Md5::digest(b));
        let report = put("report.txt", b"first");
        put("report.txt", b"second");
        let saved = put(".tmp", b"saved");
        let moved = store.transfer(
            Scope::All,
            &at(".tmp"),
            &at("report.txt"),
            true,
            TransferMode::Move,
        );
        assert_eq!(moved.unwrap().id.as_deref(), Some(report.as_str()));
        let mut had = md5s(&report);
        had.sort();
        let mut want = vec![md5(b"first"), md5(b"second"), md5(b"saved")];
        want.sort();
        assert_eq!(had, want);
        assert!(store.file(Scope::All, &saved).is_err());
        // A source with versions of its own: they join the history under the name.
        let other = put("other.txt", b"o1");
        put("other.txt", b"o2");
        let o = store.transfer(
            Scope::All,
            &at("other.txt"),
            &at("report.txt"),
            true,
            TransferMode::Move,
        );
        assert_eq!(o.unwrap().md5_checksum, Some(md5(b"o2")));
        assert!(md5s(&report).contains(&md5(b"o1")));
        assert_eq!(md5s(&report).len(), 5);
        assert!(store.file(Scope::All, &other).is_err());
        // A copy: the same, and the source stays.
        let copied = put("c.txt", b"copied");
        let c = store.transfer(
            Scope::All,
            &at("c.txt"),
            &at("report.txt"),
            true,
            TransferMode::Copy,
        );
        assert_eq!(c.unwrap().md5_checksum, Some(md5(b"copied")));
        assert_eq!((md5s(&report).len(), md5s(&copied).len()), (6, 1));
        // Not over a file without `replace`; a source never uploaded replaces the file.
        let e = store.transfer(
            Scope::All,
            &at("c.txt"),
            &at("report.txt"),
            false,
            TransferMode::Move,
        );
        assert_eq!(e.unwrap_err().code, "exists");
        let before = md5s(&report);
        store.create_file(Scope::All, &at(""), "empty.txt").unwrap();
        let m = store.transfer(
            Scope::All,
            &at("empty.txt"),
            &at("report.txt"),
            true,
            TransferMode::Move,
        );
        let m = m.unwrap();
        assert_eq!(
            (m.id, m.md5_checksum),
            (Some(report.clone()), Some(md5(b"copied")))
        );
        assert_eq!(md5s(&report), before);
        // A backup made as a copy of the file (`f~`), the file saved, then renamed over its
        // backup (vim's `backup`, emacs): the backup's bytes, which the file's history holds
        // already, are kept once.
        let doc = put("doc.txt", b"d1");
        store
            .transfer(
                Scope::All,
                &at("doc.txt"),
                &at("doc.txt~"),
                false,
                TransferMode::Copy,
            )
            .unwrap();
        put("doc.txt", b"d2");
        let kept = store.transfer(
            Scope::All,
            &at("doc.txt"),
            &at("doc.txt~"),
            true,
            TransferMode::Move,
        );
        let kept = kept.unwrap().id.unwrap();
        assert_ne!(kept, doc);
        let mut had = md5s(&kept);
        had.sort();
        let mut want = vec![md5(b"d1"), md5(b"d2")];
        want.sort();
        assert_eq!(had, want, "the backup's bytes twice in the history");
        // An empty earlier version is not kept, the file's own or one a rename brings
        // (LibreOffice's temporary file, made empty, then written, then renamed over).
        let blank = put("blank.txt", b"");
        put("blank.txt", b"written");
        assert_eq!(md5s(&blank), [md5(b"written")]);
        put("lu1.tmp", b"");
        put("lu1.tmp", b"a save");
        let before = md5s(&kept).len();
        store
            .transfer(
                Scope::All,
                &at("lu1.tmp"),
                &at("doc.txt~"),
                true,
                TransferMode::Move,
            )
            .unwrap();
        assert_eq!(md5s(&kept).len(), before + 1);
        assert!(!md5s(&kept).contains(&md5(b"")));
        assert!(store.check_integrity().unwrap().is_empty());
    }

    /// Paths as the mount gives them (its names as the kernel has them, in any spelling): into
    /// itself and onto itself are told by nodes, so a decomposed name changes nothing.
    #[test]
    fn into_and_onto_itself_are_told_by_nodes_in_any_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        store.create_folder(Scope::All, &at("\u{e8}")).unwrap();
        store.create_folder(Scope::All, &at("\u{e8}/sub")).unwrap();
        let f = store.create_file(Scope::All, &at(""), "\u{fc}.txt");
        let f = f.unwrap().id.unwrap();
        for mode in [TransferMode::Copy, TransferMode::Move] {
            let e = store
                .transfer(
                    Scope::All,
                    &at("\u{e8}"),
                    &at("e\u{300}/sub/c"),
                    false,
                    mode,
                )
                .unwrap_err();
            assert_eq!(
                (e.kind, e.code.as_ref()),
                (ErrorKind::BadRequest, "move_into_self")
            );
            for replace in [false, true] {
                let r = store.transfer(
                    Scope::All,
                    &at("u\u{308}.txt"),
                    &at("\u{fc}.txt"),
                    replace,
                    mode,
                );
                match (mode, replace) {
                    (TransferMode::Copy, false) => assert_eq!(r.unwrap_err().code, "exists"),
                    _ => assert_eq!(r.unwrap().id.as_deref(), Some(f.as_str())),
                }
                assert_eq!(store.file(Scope::All, &f).unwrap().name, "\u{fc}.txt");
            }
        }
        assert!(store.check_integrity().unwrap().is_empty());
    }

    /// A name an older build stored decomposed (as a macOS client sent it) is still found now
    /// that the server takes paths in NFC, and a move onto itself takes the NFC name.
    #[test]
    fn names_stored_decomposed_by_older_builds_are_found_in_either_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        let f = store.create_file(Scope::All, &at(""), "old.txt").unwrap();
        let f = f.id.unwrap();
        store
            .lock()
            .unwrap()
            .execute(
                "UPDATE nodes SET name = ?1 WHERE id = ?2",
                params!["re\u{301}sume\u{301}.txt", f.parse::<i64>().unwrap()],
            )
            .unwrap();
        for spelling in ["r\u{e9}sum\u{e9}.txt", "re\u{301}sume\u{301}.txt"] {
            let node = store.node(Scope::All, &at(spelling)).unwrap();
            assert_eq!(node.id.as_deref(), Some(f.as_str()), "{spelling:?}");
        }
        let moved = store
            .transfer(
                Scope::All,
                &at("r\u{e9}sum\u{e9}.txt"),
                &at("r\u{e9}sum\u{e9}.txt"),
                false,
                TransferMode::Move,
            )
            .unwrap();
        assert_eq!(moved.id.as_deref(), Some(f.as_str()));
        assert_eq!(
            store.file(Scope::All, &f).unwrap().name,
            "r\u{e9}sum\u{e9}.txt"
        );
    }
}
