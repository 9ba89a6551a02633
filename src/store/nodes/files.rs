//! Files by ID, for reading: the node, its current bytes opened, its versions.

use super::resolve::{file_and_path, file_by_id};
use super::restore::file_or_deleted;
use crate::api::{Error, Node, Result, Version, format_time};
use crate::store::blobs::BlobFile;
use crate::store::db::{OptionalExtension, params};
use crate::store::{Scope, Store, ns_to_time};

/// One version of a file, as kept in the database.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    pub id: i64,
    pub length: u64,
    pub md5: Option<String>,
    pub committed: bool,
}

impl Store {
    /// The file of that ID with its current bytes opened (`None` for a file never uploaded).
    /// The blob is opened under the lock, so a concurrent delete cannot remove it first.
    pub fn open_file(&self, scope: Scope, file_id: &str) -> Result<(Node, Option<BlobFile>)> {
        let conn = self.lock()?;
        let (row, path) = file_and_path(&conn, scope, file_id)?;
        let blob: Option<String> = conn.query_row(
            "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
            [row.id],
            |r| r.get(0),
        ).optional()?.flatten();
        let file = blob.map(|h| self.blobs.open(&h)).transpose()?;
        Ok((row.to_api(&path), file))
    }

    /// The file of that ID with the blob of its current bytes opened, and the blob's path, when
    /// blobs are kept in a folder (`None`: in a bucket, or a file never uploaded). The mount
    /// hands such a file to the kernel to read from (FUSE passthrough); a blob is immutable.
    pub fn open_local_blob(
        &self,
        scope: Scope,
        file_id: &str,
    ) -> Result<Option<(Node, std::path::PathBuf, std::fs::File)>> {
        let Some(dir) = self.blobs.local() else {
            return Ok(None);
        };
        let conn = self.lock()?;
        let (row, at) = file_and_path(&conn, scope, file_id)?;
        let blob: Option<String> = conn.query_row(
            "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
            [row.id],
            |r| r.get(0),
        ).optional()?.flatten();
        let Some(hash) = blob else { return Ok(None) };
        let path = dir.path(&hash);
        // Opened under the lock, like `open_file`: a concurrent delete cannot remove it first.
        let file = std::fs::File::open(&path)?;
        Ok(Some((row.to_api(&at), path, file)))
    }

    /// Every version of a file, oldest first (earlier versions are kept).
    pub fn version_history(&self, file_id: &str) -> Result<Vec<VersionInfo>> {
        let conn = self.lock()?;
        let file = file_by_id(&conn, Scope::All, file_id)?;
        let rows = conn
            .prepare(
                "SELECT id, length, md5, committed FROM versions WHERE file_id = ?1 ORDER BY id",
            )?
            .query_map([file.id], |r| {
                Ok(VersionInfo {
                    id: r.get(0)?,
                    length: r.get::<_, i64>(1)? as u64,
                    md5: r.get(2)?,
                    committed: r.get::<_, i64>(3)? != 0,
                })
            })?
            .collect::<crate::store::db::Result<_>>()?;
        Ok(rows)
    }

    /// The committed versions of a file (or of a deleted file kept restorable), newest first:
    /// what `vprop=1` shows.
    pub fn versions(&self, scope: Scope, file_id: &str) -> Result<Vec<Version>> {
        let conn = self.lock()?;
        let (file, _) = file_or_deleted(&conn, scope, file_id)?;
        let current: Option<i64> = conn.query_row(
            "SELECT current_version FROM nodes WHERE id = ?1",
            [file.id],
            |r| r.get(0),
        )?;
        let rows = conn
            .prepare(
                "SELECT id, length, md5, committed_on, modified_on FROM versions
                 WHERE file_id = ?1 AND committed = 1 ORDER BY id DESC",
            )?
            .query_map([file.id], |r| {
                let id: i64 = r.get(0)?;
                let stored: Option<i64> = r.get(3)?;
                let modified: Option<i64> = r.get(4)?;
                Ok(Version {
                    version_id: id.to_string(),
                    size: r.get::<_, i64>(1)? as u64,
                    md5_checksum: r.get(2)?,
                    created_on: stored.map(|t| format_time(ns_to_time(t))),
                    // A version without its own time took its commit's.
                    modified_on: modified.or(stored).map(|t| format_time(ns_to_time(t))),
                    current: Some(id) == current,
                })
            })?
            .collect::<crate::store::db::Result<_>>()?;
        Ok(rows)
    }

    /// The file of that ID as it was at one of its committed versions (its size and md5), with
    /// that version's bytes opened under the lock, as `open_file` does.
    pub fn open_version(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
    ) -> Result<(Node, Option<BlobFile>)> {
        let conn = self.lock()?;
        let (row, path) = file_or_deleted(&conn, scope, file_id)?;
        let not_found = || Error::not_found(format!("file {file_id} has no version {version_id}"));
        let vid: i64 = version_id.parse().map_err(|_| not_found())?;
        let (length, md5, blob): (i64, Option<String>, Option<String>) = conn
            .query_row(
                "SELECT length, md5, blob FROM versions WHERE id = ?1 AND file_id = ?2 AND committed = 1",
                params![vid, row.id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?
            .ok_or_else(not_found)?;
        let mut node = row.to_api(&path);
        node.size = Some(length as u64);
        node.md5_checksum = md5;
        let file = blob.map(|h| self.blobs.open(&h)).transpose()?;
        Ok((node, file))
    }

    /// The file of that ID (for routes addressed by document ID).
    pub fn file(&self, scope: Scope, file_id: &str) -> Result<Node> {
        let conn = self.lock()?;
        let (row, path) = file_and_path(&conn, scope, file_id)?;
        Ok(row.to_api(&path))
    }
}
