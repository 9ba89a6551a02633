//! `vaultfs check`: a store verified in the manner of `git fsck` (issue 31), and mended with
//! `--repair`.
//!
//! What is checked: the database itself (SQLite's `integrity_check`), the **tree** (every node
//! reached from a root: an account, or a tree a delete detached and the purge has yet to
//! remove), the rows that must agree with others (trash entries, unused blobs, the usage counts
//! the quotas read) and the **bytes** (each blob read whole and hashed: its SHA-256 is its name).
//!
//! The tree is checked exactly, not by a bounded walk: every node's parent is read into memory
//! and each node is followed up once (memoized), so a tree of any depth is told from a cycle.
//! A node no root reaches is below a **cycle** of parents (which older builds could make: a
//! folder moved into itself under another spelling of its name), below a **missing parent**
//! (rows written with foreign keys off), or **detached** without being in the trash. Each such
//! part of the tree has one top (the cycle's lowest ID, the node whose parent is missing, the
//! detached node); `--repair` moves each top, with all it holds, into `lost+found` in the first
//! vault of the top's account (nothing is deleted: the files come back, reachable by path and
//! ID, and the owner decides). Bad bytes are reported only: there is nothing right to put back.
//!
//! The store is checked alone, as `vaultfs migrate` copies it: opened once as a store (schema
//! brought up to date, a crash's leftovers cleaned), then held exclusively (its `lock` file) and
//! read through a connection of its own, so no server changes it meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::blobs::{BlobLocation, Blobs};
use super::db::{Conn, OptionalExtension, params};
use super::{Store, StoreConfig, now_ns};
use crate::api::{Error, Result};

/// The folder, in the first vault of an account, that repaired parts of its tree go to.
pub const LOST_AND_FOUND: &str = "lost+found";

/// What a check found and did.
#[derive(Debug, Default)]
pub struct Report {
    /// Problems found (each one line), repaired or not.
    pub problems: Vec<String>,
    /// What `--repair` did (each one line).
    pub repaired: Vec<String>,
    /// Problems that remain (found and not repaired).
    pub remaining: usize,
    /// Nodes and blobs looked at.
    pub nodes: u64,
    pub blobs: u64,
}

/// Why a part of the tree is not reached from a root.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Why {
    /// The nodes of the cycle, in order up the parents.
    Cycle(Vec<i64>),
    /// The top's parent, which does not exist.
    MissingParent(i64),
    /// The top has no parent and is neither an account nor in the trash.
    Detached,
}

/// A part of the tree no root reaches: its top and why, and every node in it.
#[derive(Debug)]
struct Lost {
    top: i64,
    why: Why,
    nodes: Vec<i64>,
}

#[derive(Clone, Copy)]
struct Node {
    parent: Option<i64>,
    kind: i64,
}

#[derive(Clone, Copy)]
enum Status {
    Reached,
    Lost(i64),
}

/// The parts of the tree no root reaches, by top (exact, whatever the depth).
fn lost_parts(conn: &Conn) -> Result<(u64, Vec<Lost>)> {
    let mut nodes: HashMap<i64, Node> = HashMap::new();
    for row in conn
        .prepare("SELECT id, parent_id, kind FROM nodes")?
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Node {
                    parent: r.get(1)?,
                    kind: r.get(2)?,
                },
            ))
        })?
    {
        let (id, node) = row?;
        nodes.insert(id, node);
    }
    // Detached on purpose: trees being purged, deleted files kept restorable.
    let trash: HashSet<i64> = conn
        .prepare("SELECT node_id FROM trash UNION SELECT node_id FROM deleted")?
        .query_map([], |r| r.get(0))?
        .collect::<super::db::Result<_>>()?;
    let mut ids: Vec<i64> = nodes.keys().copied().collect();
    ids.sort_unstable();
    let mut status: HashMap<i64, Status> = HashMap::with_capacity(ids.len());
    let mut tops: BTreeMap<i64, Why> = BTreeMap::new();
    for &id in &ids {
        // Up the parents until a node already judged, a root, a missing parent or a node of
        // this same walk (a cycle); everything walked gets that answer.
        let mut path: Vec<i64> = Vec::new();
        let mut on_path: HashMap<i64, usize> = HashMap::new();
        let mut at = id;
        let answer = loop {
            if let Some(&st) = status.get(&at) {
                break st;
            }
            if let Some(&i) = on_path.get(&at) {
                let cycle = path[i..].to_vec();
                let top = *cycle.iter().min().expect("a cycle has nodes");
                tops.insert(top, Why::Cycle(cycle));
                break Status::Lost(top);
            }
            on_path.insert(at, path.len());
            path.push(at);
            let node = nodes[&at];
            match node.parent {
                None if node.kind == super::NodeKind::Account as i64 || trash.contains(&at) => {
                    break Status::Reached;
                }
                None => {
                    tops.insert(at, Why::Detached);
                    break Status::Lost(at);
                }
                Some(p) if !nodes.contains_key(&p) => {
                    tops.insert(at, Why::MissingParent(p));
                    break Status::Lost(at);
                }
                Some(p) => at = p,
            }
        };
        for n in path {
            status.insert(n, answer);
        }
    }
    let mut parts: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for &id in &ids {
        if let Some(Status::Lost(top)) = status.get(&id) {
            parts.entry(*top).or_default().push(id);
        }
    }
    let lost = tops
        .into_iter()
        .map(|(top, why)| Lost {
            top,
            why,
            nodes: parts.remove(&top).unwrap_or_default(),
        })
        .collect();
    Ok((ids.len() as u64, lost))
}

fn name_of(conn: &Conn, id: i64) -> Result<String> {
    Ok(conn
        .prepare_cached("SELECT name FROM nodes WHERE id = ?1")?
        .query_row([id], |r| r.get::<_, String>(0))
        .optional()?
        .unwrap_or_default())
}

/// One line for a lost part of the tree.
fn describe(conn: &Conn, part: &Lost) -> Result<String> {
    let top = format!("node {} `{}`", part.top, name_of(conn, part.top)?);
    let why = match &part.why {
        Why::Cycle(cycle) => {
            let mut names = Vec::new();
            for id in cycle {
                names.push(format!("{id} `{}`", name_of(conn, *id)?));
            }
            format!("a cycle of parents: {} and back", names.join(" → "))
        }
        Why::MissingParent(p) => format!("{top} has parent {p}, which does not exist"),
        Why::Detached => format!("{top} has no parent and is neither an account nor being purged"),
    };
    Ok(format!(
        "tree: {why}: {} node(s) no root reaches, top {top}",
        part.nodes.len()
    ))
}

/// Problems of the database and its rows that are not the tree's or the bytes': SQLite's own
/// check, trash entries of no node, blobs no version uses, usage counts against the tree.
pub(super) fn rows(conn: &Conn) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if !conn.is_pg() {
        let result: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if result != "ok" {
            problems.push(format!("sqlite: {result}"));
        }
    }
    let unused: i64 = conn.query_row(
        "SELECT count(*) FROM blobs b WHERE NOT EXISTS (SELECT 1 FROM versions v WHERE v.blob = b.hash)",
        [],
        |r| r.get(0),
    )?;
    if unused > 0 {
        problems.push(format!("{unused} blob(s) recorded but used by no version"));
    }
    let lost: i64 = conn.query_row(
        "SELECT count(*) FROM trash t WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = t.node_id)",
        [],
        |r| r.get(0),
    )?;
    if lost > 0 {
        problems.push(format!("{lost} trash entr(ies) of no node"));
    }
    // The counts the quotas read, against the tree they count.
    let mut wrong = conn.prepare(
        "WITH real AS (SELECT n.account_id AS a, count(*) AS nodes,
             (SELECT CAST(coalesce(sum(v.length), 0) AS BIGINT) FROM versions v
              JOIN nodes m ON m.id = v.file_id
              WHERE v.committed = 1 AND m.account_id = n.account_id) AS bytes
             FROM nodes n GROUP BY n.account_id)
         SELECT real.a, real.nodes, real.bytes, u.nodes, u.bytes FROM real
         LEFT JOIN usage u ON u.account_id = real.a
         WHERE u.nodes IS DISTINCT FROM real.nodes OR u.bytes IS DISTINCT FROM real.bytes",
    )?;
    let rows = wrong.query_map([], |r| {
        Ok(format!(
            "account {}: {} nodes and {} bytes, usage says {:?} and {:?}",
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<i64>>(4)?
        ))
    })?;
    for row in rows {
        problems.push(row?);
    }
    Ok(problems)
}

/// The parts of the tree no root reaches, one line each.
pub(super) fn tree(conn: &Conn) -> Result<Vec<String>> {
    let (_, lost) = lost_parts(conn)?;
    lost.iter().map(|part| describe(conn, part)).collect()
}

/// Every recorded blob is stored with its recorded size (`hash`: read whole and hashed too).
pub(super) fn blobs(conn: &Conn, blobs: &Blobs, hash: bool) -> Result<(u64, Vec<String>)> {
    let mut problems = Vec::new();
    let recorded: Vec<(String, i64)> = conn
        .prepare("SELECT hash, size FROM blobs ORDER BY hash")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    for (h, size) in &recorded {
        let size = *size as u64;
        let problem = match blobs.size(h) {
            Ok(Some(n)) if n != size => Some(format!("{n} bytes stored, {size} recorded")),
            Ok(Some(_)) if hash => match blobs
                .open(h)
                .map_err(Error::from)
                .and_then(|mut f| super::migrate::sha256_of(&mut f))
            {
                Ok((got, _)) if got != *h => Some(format!("its bytes hash to {got}")),
                Ok(_) => None,
                Err(e) => Some(format!("unreadable: {e}")),
            },
            Ok(Some(_)) => None,
            Ok(None) => Some("missing".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(p) = problem {
            problems.push(format!("blob {h}: {p}"));
        }
    }
    Ok((recorded.len() as u64, problems))
}

/// A name for `id` in `lost+found` (whose ID is `folder`) that no entry there has: its own
/// name when free and valid, else with ` (ID)` after it.
fn free_name(conn: &Conn, folder: i64, id: i64) -> Result<String> {
    let name = name_of(conn, id)?;
    let taken = |n: &str| -> Result<bool> {
        Ok(conn
            .prepare_cached("SELECT 1 FROM nodes WHERE parent_id = ?1 AND name = ?2")?
            .exists(params![folder, n])?)
    };
    if crate::api::path::validate_name(&name).is_ok() && !taken(&name)? {
        return Ok(name);
    }
    let suffix = format!(" ({id})");
    let mut base: String = name.replace(['/', '\0'], "_");
    while base.len() + suffix.len() > crate::api::path::MAX_NAME_BYTES {
        base.pop();
    }
    let candidate = format!("{base}{suffix}");
    if crate::api::path::validate_name(&candidate).is_ok() && !taken(&candidate)? {
        return Ok(candidate);
    }
    Ok(format!("node {id}"))
}

/// Moves one lost part under `lost+found` of its top's account; the line saying so, or why not.
fn repair(conn: &Conn, part: &Lost) -> Result<std::result::Result<String, String>> {
    let account: i64 = conn.query_row(
        "SELECT account_id FROM nodes WHERE id = ?1",
        [part.top],
        |r| r.get(0),
    )?;
    let vault: Option<(i64, String)> = conn
        .query_row(
            "SELECT v.id, a.name FROM nodes v JOIN nodes a ON a.id = v.parent_id
             WHERE a.id = ?1 AND a.kind = 0 AND a.parent_id IS NULL AND v.kind = 1
             ORDER BY v.id LIMIT 1",
            [account],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((vault, account_name)) = vault else {
        return Ok(Err(format!(
            "node {}: its account {account} has no vault to put it in",
            part.top
        )));
    };
    // The vault is reached from its account (checked before any repair, and repairs only add
    // to what is reached), so what goes under it is reached too.
    let now = now_ns();
    let found: Option<(i64, i64)> = conn
        .query_row(
            "SELECT id, kind FROM nodes WHERE parent_id = ?1 AND name = ?2",
            params![vault, LOST_AND_FOUND],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let folder = match found {
        Some((id, kind)) if kind == super::NodeKind::Folder as i64 => id,
        Some(_) => {
            return Ok(Err(format!(
                "node {}: `{LOST_AND_FOUND}` in the first vault of account `{account_name}` is \
                 not a folder",
                part.top
            )));
        }
        None => {
            conn.execute(
                "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                params![
                    vault,
                    account,
                    super::NodeKind::Folder as i64,
                    LOST_AND_FOUND,
                    now
                ],
            )?;
            conn.last_insert_rowid()?
        }
    };
    let name = free_name(conn, folder, part.top)?;
    conn.execute(
        "UPDATE nodes SET parent_id = ?2, name = ?3, modified_on = ?4 WHERE id = ?1",
        params![part.top, folder, name, now],
    )?;
    // Everything in it is the account's now (the usage counts follow, by trigger).
    let mut own =
        conn.prepare_cached("UPDATE nodes SET account_id = ?2 WHERE id = ?1 AND account_id <> ?2")?;
    for id in &part.nodes {
        own.execute(params![id, account])?;
    }
    conn.execute(
        "UPDATE nodes SET modified_on = ?2 WHERE id = ?1",
        params![folder, now],
    )?;
    let path = super::nodes::path_of(conn, part.top)?;
    Ok(Ok(format!(
        "moved node {} and the {} node(s) under it to {path}",
        part.top,
        part.nodes.len().saturating_sub(1)
    )))
}

/// Checks (and with `repair`, mends) the tree of `conn`, with the rows and the bytes.
pub fn check_conn(conn: &Conn, blob_store: &Blobs, repair_tree: bool) -> Result<Report> {
    let mut report = Report::default();
    report.problems.extend(rows(conn)?);
    report.remaining = report.problems.len();
    let (nodes, lost) = lost_parts(conn)?;
    report.nodes = nodes;
    for part in &lost {
        report.problems.push(describe(conn, part)?);
    }
    if repair_tree && !lost.is_empty() {
        let tx = conn.transaction()?;
        let mut left = 0;
        for part in &lost {
            match repair(&tx, part)? {
                Ok(line) => report.repaired.push(line),
                Err(why) => {
                    report.repaired.push(format!("not repaired: {why}"));
                    left += 1;
                }
            }
        }
        tx.commit()?;
        report.remaining += left;
    } else {
        report.remaining += lost.len();
    }
    let (n, bad) = blobs(conn, blob_store, true)?;
    report.blobs = n;
    report.remaining += bad.len();
    report.problems.extend(bad);
    Ok(report)
}

/// `vaultfs check`: the store in `dir` (its blobs at `location`) checked alone.
pub fn run(
    dir: &Path,
    location: &BlobLocation,
    repair_tree: bool,
    say: &mut dyn FnMut(&str),
) -> Result<Report> {
    if !dir.join("vault.db").exists() {
        return Err(Error::internal(format!(
            "no store in {} (no vault.db)",
            dir.display()
        )));
    }
    // Up to date and clean: opened once as a store.
    drop(Store::open(
        dir,
        StoreConfig {
            blobs: location.clone(),
            ..StoreConfig::default()
        },
    )?);
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("lock"))?;
    if !super::flock(&lock, libc::LOCK_EX | libc::LOCK_NB) {
        return Err(Error::internal(format!(
            "the store in {} is in use (a server, mount or command has it open): stop it first",
            dir.display()
        )));
    }
    let mut sqlite = rusqlite::Connection::open(dir.join("vault.db"))?;
    super::schema::prepare(&mut sqlite)?;
    let conn = Conn::sqlite(sqlite);
    let blob_store = Blobs::at(dir, location)?;
    say(&format!(
        "checking {} (bytes in {})",
        dir.display(),
        blob_store.describe()
    ));
    let report = check_conn(&conn, &blob_store, repair_tree)?;
    drop(lock);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_path as at;
    use crate::store::{Scope, TransferMode};

    /// A cycle of parents planted in the database: every walk of the tree ends (a file in it is
    /// not found, its path is an error, a move or copy near it answers), `check` finds it, and
    /// the repair puts it under `lost+found` where every walk works again.
    #[test]
    fn walks_of_a_cycle_end_and_the_repair_brings_it_back() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        store.create_folder(Scope::All, &at("a")).unwrap();
        store.create_folder(Scope::All, &at("a/b")).unwrap();
        let f = store.create_file(Scope::All, &at("a/b"), "f.txt").unwrap();
        let f = f.id.unwrap();
        let node = |rel: &str| -> i64 {
            let conn = store.lock().unwrap();
            super::super::nodes::Folders::default()
                .resolve(&conn, Scope::All, &at(rel))
                .unwrap()
                .0
                .id
        };
        let (a, b) = (node("a"), node("a/b"));
        store
            .lock()
            .unwrap()
            .execute("UPDATE nodes SET parent_id = ?1 WHERE id = ?2", [b, a])
            .unwrap();

        let started = std::time::Instant::now();
        assert_eq!(
            store.file(Scope::All, &f).unwrap_err().kind,
            crate::api::ErrorKind::NotFound
        );
        let e = super::super::nodes::path_of(&store.lock().unwrap(), a).unwrap_err();
        assert!(e.message.contains("vaultfs check"), "{e:?}");
        store.create_folder(Scope::All, &at("c")).unwrap();
        store
            .transfer(Scope::All, &at("c"), &at("d"), false, TransferMode::Move)
            .unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));

        let problems = store.check_integrity().unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("a cycle of parents"), "{problems:?}");
        let report = {
            let conn = store.lock().unwrap();
            check_conn(&conn, &store.blobs, true).unwrap()
        };
        assert_eq!(report.remaining, 0, "{report:?}");
        assert!(store.check_integrity().unwrap().is_empty());
        // `a` is the cycle's lowest ID: it comes back on top, `b` and the file under it.
        assert_eq!(
            store.file(Scope::All, &f).unwrap().uri,
            "/nodes/pth/Local/My First Vault/lost+found/a/b/f.txt"
        );
    }

    /// A node whose parent row is gone (written with foreign keys off), and a detached one not
    /// in the trash: both found, both moved to `lost+found` under names that do not collide.
    #[test]
    fn orphans_are_found_and_put_in_lost_and_found() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local(&tmp.path().join("store")).unwrap();
        store.create_folder(Scope::All, &at("lost+found")).unwrap();
        store
            .create_file(Scope::All, &at("lost+found"), "x.txt")
            .unwrap();
        let y = store
            .create_file(Scope::All, &at(""), "y.txt")
            .unwrap()
            .id
            .unwrap();
        let z = store
            .create_file(Scope::All, &at(""), "z.txt")
            .unwrap()
            .id
            .unwrap();
        {
            let conn = store.lock().unwrap();
            conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
            conn.execute(
                "UPDATE nodes SET parent_id = 424242, name = 'x.txt' WHERE id = ?1",
                [y.parse::<i64>().unwrap()],
            )
            .unwrap();
            conn.execute(
                "UPDATE nodes SET parent_id = NULL, name = '/' || id WHERE id = ?1",
                [z.parse::<i64>().unwrap()],
            )
            .unwrap();
            conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
        }
        let problems = store.check_integrity().unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
        let report = {
            let conn = store.lock().unwrap();
            check_conn(&conn, &store.blobs, true).unwrap()
        };
        assert_eq!(report.remaining, 0, "{report:?}");
        assert!(store.check_integrity().unwrap().is_empty());
        assert_eq!(
            store.file(Scope::All, &y).unwrap().uri,
            format!("/nodes/pth/Local/My First Vault/lost+found/x.txt ({y})")
        );
        assert_eq!(
            store.file(Scope::All, &z).unwrap().uri,
            format!("/nodes/pth/Local/My First Vault/lost+found/_{z} ({z})")
        );
    }
}
