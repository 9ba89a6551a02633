//! What a user brings back (issue 32, item 4): a kept version made current again.
//!
//! A restore is a new version, not a step back: the version restored is copied into a new row
//! (the same blob: no byte is copied) that becomes current, so the bytes it replaces are an
//! earlier version like any other (nothing is lost), a client that read the file sees another
//! md5, and the change feed says `version`.

use super::delete::prune_versions;
use super::limits::check_quota;
use super::resolve::{file_by_id, get_row, path_of};
use crate::api::{ChangeKind, Error, Node, Result};
use crate::store::changes::NewChange;
use crate::store::db::{OptionalExtension, params};
use crate::store::{Scope, Store, now_ns};

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
                "SELECT v.length, v.md5, v.blob, v.exec, n.current_version = v.id
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
        log::info!("{path}: version {version_id} restored as version {new}");
        Ok(row.to_api(&path))
    }
}
