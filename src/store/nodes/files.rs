//! Files by ID, for reading: the node, its current bytes opened, its versions.

use super::resolve::{file_by_id, path_of};
use crate::api::{Node, Result};
use crate::store::blobs::BlobFile;
use crate::store::db::OptionalExtension;
use crate::store::{Scope, Store};

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
        let row = file_by_id(&conn, scope, file_id)?;
        let path = path_of(&conn, row.id)?;
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
        let row = file_by_id(&conn, scope, file_id)?;
        let blob: Option<String> = conn.query_row(
            "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
            [row.id],
            |r| r.get(0),
        ).optional()?.flatten();
        let Some(hash) = blob else { return Ok(None) };
        let path = dir.path(&hash);
        // Opened under the lock, like `open_file`: a concurrent delete cannot remove it first.
        let file = std::fs::File::open(&path)?;
        Ok(Some((row.to_api(&path_of(&conn, row.id)?), path, file)))
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

    /// The file of that ID (for routes addressed by document ID).
    pub fn file(&self, scope: Scope, file_id: &str) -> Result<Node> {
        let conn = self.lock()?;
        let row = file_by_id(&conn, scope, file_id)?;
        Ok(row.to_api(&path_of(&conn, row.id)?))
    }
}
