//! `vaultfs migrate`: a built-in store (SQLite and its blob folder) copied into PostgreSQL and a
//! blob store (a folder or a bucket), then verified.
//!
//! The source is first opened as a store once (its schema brought up to date, a crash's leftovers
//! cleaned, detached trees purged), then held exclusively (its `lock` file: no server, mount or
//! CLI may have it open meanwhile) and read through its own SQLite connection. Every row goes
//! into the destination inside **one** transaction, which commits only once every blob has been
//! copied, read back and hashed from the destination and every table's count matches: a
//! migration that fails leaves no rows behind (copied blobs may stay; they are content-addressed
//! and a later migration reuses them). A destination that holds anything is refused.
//!
//! Identity values (node, version and user IDs) are kept as they are, since file IDs travel in
//! clients' paths and caches, and the sequences are moved past them. Previews are not copied:
//! their files live beside each server, which renders them again on demand. The pin key is
//! copied, so the tokens and pins already issued stay valid.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::blobs::{BlobLocation, Blobs};
use super::db::{Conn, Engine, Param, Value};
use super::{Store, StoreConfig};
use crate::api::{Error, Result};

/// The tables copied, parents before children (foreign keys are checked as rows go in).
/// `usage` comes after the tree: the triggers count as nodes and versions go in, and the
/// source's counts then replace theirs. The change log is copied as it is, its IDs kept, so the
/// cursors of the clients that followed the source go on.
const TABLES: [&str; 16] = [
    "nodes",
    "versions",
    "blobs",
    "users",
    "clients",
    "pins",
    "tokens",
    "app_passwords",
    "trash",
    "deleted",
    "dav_props",
    "dav_locks",
    "dav_seen",
    "usage",
    "changes",
    "change_floors",
];

/// What was copied.
#[derive(Debug, Default)]
pub struct Summary {
    /// Rows per table, as counted in both databases.
    pub rows: Vec<(String, u64)>,
    pub accounts: u64,
    pub blobs: u64,
    pub blob_bytes: u64,
}

/// Where to copy from and to.
pub struct Migration<'a> {
    /// The source store's data directory.
    pub source: &'a Path,
    /// Its blobs (`BlobLocation::DataDir` unless it was served with `--blobs DIR`).
    pub source_blobs: BlobLocation,
    /// The destination's `postgres://` address.
    pub database: &'a str,
    /// The destination's blobs (a folder or a bucket).
    pub blobs: BlobLocation,
}

fn fail(msg: impl Into<String>) -> Error {
    Error::internal(msg.into())
}

impl Migration<'_> {
    /// Copies and verifies; `say` gets the progress lines.
    pub fn run(&self, say: &mut dyn FnMut(&str)) -> Result<Summary> {
        if matches!(self.blobs, BlobLocation::DataDir) {
            return Err(fail(
                "the destination needs --blobs (a folder shared by the servers, or s3://...)",
            ));
        }
        // Up to date and clean: opened once as a store, its purge let finish.
        say(&format!("opening the store in {}", self.source.display()));
        {
            let store = Store::open(
                self.source,
                StoreConfig {
                    blobs: self.source_blobs.clone(),
                    ..StoreConfig::default()
                },
            )?;
            if !store.wait_purged(Duration::from_secs(600)) {
                return Err(fail("deleted trees are still being purged; try again"));
            }
        }
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(self.source.join("lock"))?;
        if !super::flock(&lock, libc::LOCK_EX | libc::LOCK_NB) {
            return Err(fail(format!(
                "the store in {} is in use (a server, mount or command has it open): stop it first",
                self.source.display()
            )));
        }
        let src = Conn::Sqlite {
            conn: rusqlite::Connection::open_with_flags(
                self.source.join("vault.db"),
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?,
            immediate: false,
        };
        let src_blobs = Blobs::at(self.source, &self.source_blobs)?;

        say(&format!("connecting to {}", redact(self.database)));
        let engine = Engine::Postgres(self.database.to_string());
        let dst = engine.connect()?;
        let settings = super::schema_pg::prepare(&dst)?;
        // Staging files of the copies, beside the source (removed at the end).
        let staging = self.source.join("migrate.tmp");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        let result = (|| {
            let dst_blobs =
                Blobs::owned_by(&staging, &self.blobs, Some(settings.store_id.clone()))?;
            self.copy(&src, &dst, &src_blobs, &dst_blobs, &settings, say)
        })();
        let _ = std::fs::remove_dir_all(&staging);
        drop(lock);
        result
    }

    fn copy(
        &self,
        src: &Conn,
        dst: &Conn,
        src_blobs: &Blobs,
        dst_blobs: &Blobs,
        settings: &super::schema_pg::Settings,
        say: &mut dyn FnMut(&str),
    ) -> Result<Summary> {
        let tx = dst.transaction()?;
        for table in TABLES {
            let n: i64 =
                tx.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
            if n > 0 {
                return Err(fail(format!(
                    "the destination database is not empty ({n} row(s) in {table}): \
                     migrate into a new, empty database"
                )));
            }
        }
        let mut summary = Summary::default();
        for table in TABLES {
            let copied = copy_table(src, &tx, table)?;
            say(&format!("  {table}: {copied} row(s)"));
        }
        // Past the IDs copied, so that new rows get new ones.
        for table in ["nodes", "versions", "users", "changes"] {
            tx.query_row(
                &format!(
                    "SELECT CAST(setval(pg_get_serial_sequence('{table}', 'id'),
                         coalesce(max(id), 0) + 1, false) AS BIGINT) FROM {table}"
                ),
                [],
                |r| r.get::<_, i64>(0),
            )?;
        }
        // The source's pin key: tokens and pins already handed out stay valid.
        let key = std::fs::read(self.source.join("pin.key"))?;
        if key.len() == settings.pin_key.len() {
            tx.execute(
                "UPDATE settings SET value = ?1 WHERE name = 'pin_key'",
                [key],
            )?;
        }

        // The bytes: copied, then read back from the destination and hashed.
        let mut hashes = src.prepare("SELECT hash, size FROM blobs ORDER BY hash")?;
        let blobs: Vec<(String, i64)> = hashes
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<std::result::Result<_, _>>()?;
        say(&format!(
            "copying {} blob(s) to {}",
            blobs.len(),
            dst_blobs.describe()
        ));
        for (i, (hash, size)) in blobs.iter().enumerate() {
            copy_blob(src_blobs, dst_blobs, hash, *size as u64)?;
            summary.blob_bytes += *size as u64;
            if (i + 1) % 100 == 0 {
                say(&format!("  {} of {} blob(s)", i + 1, blobs.len()));
            }
        }
        say("verifying");
        for (hash, size) in &blobs {
            let mut f = dst_blobs
                .open(hash)
                .map_err(|e| fail(format!("blob {hash} in the destination: {e}")))?;
            let (got, len) = sha256_of(&mut f)?;
            if got != *hash || len != *size as u64 {
                return Err(fail(format!(
                    "blob {hash} reads back from the destination as {got} ({len} bytes, \
                     {size} recorded)"
                )));
            }
        }
        summary.blobs = blobs.len() as u64;
        for table in TABLES {
            let count = |c: &Conn| -> Result<i64> {
                Ok(c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?)
            };
            let (a, b) = (count(src)?, count(&tx)?);
            if a != b {
                // Nodes are copied down from the roots: a cycle or an orphan is left behind.
                let hint = if table == "nodes" {
                    " (nodes no root reaches: `vaultfs check --repair` the source first)"
                } else {
                    ""
                };
                return Err(fail(format!(
                    "{table}: {a} row(s) in the source, {b} in the destination{hint}"
                )));
            }
            summary.rows.push((table.to_string(), a as u64));
        }
        let accounts = "SELECT count(*) FROM nodes WHERE parent_id IS NULL AND kind = 0";
        let (a, b): (i64, i64) = (
            src.query_row(accounts, [], |r| r.get(0))?,
            tx.query_row(accounts, [], |r| r.get(0))?,
        );
        if a != b {
            return Err(fail(format!(
                "accounts: {a} in the source, {b} in the destination"
            )));
        }
        summary.accounts = a as u64;
        tx.commit()?;
        Ok(summary)
    }
}

/// Copies every row of `table`; how many.
fn copy_table(src: &Conn, dst: &Conn, table: &str) -> Result<u64> {
    let columns: Vec<String> = dst
        .prepare(
            "SELECT CAST(column_name AS TEXT) FROM information_schema.columns
             WHERE table_name = ?1 AND table_schema = current_schema()
             ORDER BY ordinal_position",
        )?
        .query_map([table], |r| r.get(0))?
        .collect::<std::result::Result<_, _>>()?;
    let list = columns.join(", ");
    if table == "usage" {
        // The triggers' counts give way to the source's.
        dst.execute("DELETE FROM usage", [])?;
    }
    // Parents before children: by depth (a folder moved under a newer one has the larger ID).
    let select = if table == "nodes" {
        let n: Vec<String> = columns.iter().map(|c| format!("n.{c}")).collect();
        format!(
            "WITH RECURSIVE tree(id, depth) AS (
                 SELECT id, 0 FROM nodes WHERE parent_id IS NULL
                 UNION ALL SELECT m.id, tree.depth + 1 FROM nodes m JOIN tree ON m.parent_id = tree.id
                     WHERE tree.depth < {})
             SELECT {} FROM nodes n JOIN tree ON tree.id = n.id ORDER BY tree.depth, n.id",
            super::nodes::MAX_WALK_DEPTH,
            n.join(", ")
        )
    } else {
        format!("SELECT {list} FROM {table}")
    };
    let rows: Vec<Vec<Value>> = src
        .prepare(&select)?
        .query_map([], |r| {
            (0..columns.len())
                .map(|i| r.get::<_, Value>(i))
                .collect::<std::result::Result<Vec<_>, _>>()
        })?
        .collect::<std::result::Result<_, _>>()?;
    // Many rows a statement (PostgreSQL takes up to 65,535 parameters).
    let per = (30_000 / columns.len()).clamp(1, 500);
    for chunk in rows.chunks(per) {
        let mut sql = format!("INSERT INTO {table} ({list}) VALUES ");
        let mut n = 0;
        for (i, _) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 0..columns.len() {
                if c > 0 {
                    sql.push_str(", ");
                }
                n += 1;
                sql.push_str(&format!("?{n}"));
            }
            sql.push(')');
        }
        let params: Vec<&dyn Param> = chunk.iter().flatten().map(|v| v as &dyn Param).collect();
        dst.execute(&sql, params.as_slice())?;
    }
    Ok(rows.len() as u64)
}

/// The blob `hash` from `src` into `dst`, checked as it is staged.
fn copy_blob(src: &Blobs, dst: &Blobs, hash: &str, size: u64) -> Result<()> {
    if dst.size(hash)? == Some(size) {
        return Ok(()); // there already (a migration tried before); verified below
    }
    let mut from = src
        .open(hash)
        .map_err(|e| fail(format!("blob {hash} in the source: {e}")))?;
    let mut w = dst.writer()?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        w.write(Bytes::copy_from_slice(&buf[..n]))?;
    }
    let mut staged = w.finish()?;
    if staged.sha256 != hash || staged.len != size {
        return Err(fail(format!(
            "blob {hash} in the source holds {} bytes hashing to {}",
            staged.len, staged.sha256
        )));
    }
    match dst.local() {
        Some(_) => dst.commit(&mut staged)?,
        None => {
            let f = Arc::new(std::fs::File::open(&staged.path)?);
            dst.put_file(&f, staged.len, hash)?;
        }
    }
    Ok(())
}

pub(super) fn sha256_of(r: &mut impl Read) -> Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((crate::api::checksum::hex(&h.finalize()), len))
}

/// The address without its password, for output.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(super::redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
