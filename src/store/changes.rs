//! The change log of each account (the feed `GET /changes` serves): every change to the tree
//! is a row of `changes`, written by the store call that makes it inside its own transaction,
//! so a change is logged exactly when it is committed.
//!
//! **Explicit calls, not triggers.** A change row holds the path(s) the node had at the time
//! (a delete's node is gone and a move's old path is nowhere afterwards, so they cannot be
//! looked up later). SQLite's triggers cannot walk up the tree to a path (no `WITH` inside a
//! trigger; through a view every trigger would walk all nodes), and row triggers would log
//! every descendant of a deleted, moved or copied folder, which makes large deletes slow. So
//! the few store calls that change the tree (a folder made, upload step 1 and 3 and the batched
//! puts, attributes, delete, copy and move) each call [`record`] once per change, where the
//! paths are known; a folder's delete, move or copy is one row for the whole tree.
//!
//! **The cursor** is the row's ID. IDs are global: each account's changes are a rising, gapped
//! subsequence (node IDs already count every account's creations alike). A reader that saw ID
//! N must never later see a new row below N, so IDs must commit in the order they are handed
//! out, to whoever may read them. Every write transaction holds a write lock from its start to
//! its commit, taking its IDs in between: on SQLite the one write lock, so all IDs commit in
//! order; on PostgreSQL (across all the servers of a store, see `db::Writers`) the lock of the
//! account it writes (and the store's lock shared), or the store's alone for anything else, so
//! that one account's IDs commit in order while two accounts' may interleave (A takes 10, B
//! takes 11 and commits first). Hence the readers: an account's feed reads that account's rows
//! only, in one snapshot, without waiting for any lock (every row of its account was committed
//! by a writer that excluded its other writers); the feed of every account (`Scope::All`, a
//! mount of the whole store) reads under the store's lock, which waits for every account's
//! writers to commit and lets none begin, so that what it sees has no number still to come.
//!
//! **Bounded.** Each account keeps its newest `change_log_entries` rows and none older than
//! `change_log_age` (pruned as its changes come, every [`PRUNE_EVERY`]th row); the highest ID
//! dropped is its floor (`change_floors`). A cursor below the floor, or above the newest row
//! (not of this store), is answered with `reset`: never a silent gap.
//!
//! **Waking the waiters.** [`Feed`] holds a generation per account that the store bumps after
//! each committing call; a long poll sleeps on it (a tokio `watch`, nothing runs while idle)
//! and reads the log again only when its account's generation moved. Commits of other
//! processes are heard by one thread per store, started with the first waiter: on PostgreSQL a
//! `LISTEN` on the notifications each change's transaction sends (`pg_notify` at commit); on
//! SQLite a look every 250 ms at the database's commit counter (shared memory, no I/O).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::db::{Conn, OptionalExtension, params};
use super::{Scope, Store, now_ns, ns_to_time};
use crate::api::{Change, ChangeKind, ChangesPage, NodePath, NodeType, Result, format_time};
use crate::sync::relock;

/// The rows an account keeps by default.
pub const DEFAULT_CHANGE_LOG_ENTRIES: u64 = 10_000;
/// How long a row is kept by default.
pub const DEFAULT_CHANGE_LOG_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// An account's log is pruned when a new row's ID is a multiple of this.
const PRUNE_EVERY: i64 = 64;
/// The channel of PostgreSQL's notifications (payload: the account's ID).
macro_rules! channel {
    () => {
        "vaultfs_changes"
    };
}
const CHANNEL: &str = channel!();

macro_rules! insert_change {
    () => {
        "INSERT INTO changes (account_id, at, kind, node_id, folder, path, from_path)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    };
}

/// [`record`]'s insert on PostgreSQL, with the notification of [`CHANNEL`].
const NOTIFYING_INSERT: &str = concat!(
    "WITH c AS (",
    insert_change!(),
    " RETURNING id, account_id)
     SELECT id, CAST(pg_notify('",
    channel!(),
    "', CAST(account_id AS TEXT)) AS TEXT) FROM c"
);

/// The feed's rows, with a version's current md5 (`Change::md5`): the file's node by its
/// primary key, for version rows only.
macro_rules! changes_select {
    () => {
        "SELECT c.id, c.kind, c.node_id, c.folder, c.path, c.from_path, c.at, v.md5
         FROM changes c
         LEFT JOIN nodes n ON c.kind = 1 AND n.id = c.node_id -- 1: kind_code(Version)
         LEFT JOIN versions v ON v.id = n.current_version"
    };
}

/// How often the SQLite watcher looks for other processes' commits.
const FOREIGN_POLL: Duration = Duration::from_millis(250);

/// A change to log, for [`record`].
pub(in crate::store) struct NewChange<'a> {
    pub account_id: i64,
    pub kind: ChangeKind,
    pub node_id: i64,
    pub folder: bool,
    pub path: &'a NodePath,
    pub from: Option<&'a NodePath>,
}

impl<'a> NewChange<'a> {
    /// A change of `row` at `path`.
    pub fn new(row: &super::NodeRow, kind: ChangeKind, path: &'a NodePath) -> NewChange<'a> {
        NewChange {
            account_id: row.account_id,
            kind,
            node_id: row.id,
            folder: !row.is_file(),
            path,
            from: None,
        }
    }

    /// ... that came from `from` (a move's old path, a copy's source).
    pub fn from(self, from: &'a NodePath) -> NewChange<'a> {
        NewChange {
            from: Some(from),
            ..self
        }
    }
}

pub(in crate::store) fn kind_code(k: ChangeKind) -> i64 {
    match k {
        ChangeKind::Created => 0,
        ChangeKind::Version => 1,
        ChangeKind::Attributes => 2,
        ChangeKind::Deleted => 3,
        ChangeKind::Moved => 4,
        ChangeKind::Copied => 5,
        ChangeKind::Other => 9,
    }
}

fn kind_of(code: i64) -> ChangeKind {
    match code {
        0 => ChangeKind::Created,
        1 => ChangeKind::Version,
        2 => ChangeKind::Attributes,
        3 => ChangeKind::Deleted,
        4 => ChangeKind::Moved,
        5 => ChangeKind::Copied,
        _ => ChangeKind::Other,
    }
}

/// A path as a row keeps it: its segments joined by `/` (no name holds one).
fn stored(path: &NodePath) -> String {
    path.segments().join("/")
}

fn uri_of(stored: &str) -> String {
    NodePath::from_segments(stored.split('/'))
        .map(|p| p.uri())
        .unwrap_or_else(|_| format!("{}/{stored}", crate::api::path::NODES_PREFIX))
}

/// The log's bounds: (rows each account keeps, age), from the store's configuration.
pub(in crate::store) type Limits = (u64, Duration);

/// Logs one change inside the caller's transaction (see the module's comment), and prunes the
/// account's log now and then.
pub(in crate::store) fn record(tx: &Conn, c: NewChange<'_>, limits: Limits) -> Result<()> {
    let now = now_ns();
    // On PostgreSQL the notification goes in the same statement (a statement is a round trip,
    // under the writers' lock): sent to every server's listener when (and only if) this
    // transaction commits; one per account and transaction (PostgreSQL folds equal ones).
    let insert = if tx.is_pg() {
        NOTIFYING_INSERT
    } else {
        concat!(insert_change!(), " RETURNING id")
    };
    let id: i64 = tx.prepare_cached(insert)?.query_row(
        params![
            c.account_id,
            now,
            kind_code(c.kind),
            c.node_id,
            c.folder as i64,
            stored(c.path),
            c.from.map(stored)
        ],
        |r| r.get(0),
    )?;
    LOGGED.with(|l| {
        let run = match l.get() {
            Some((first, last)) if last + 1 == id => (first, id),
            _ => (id, id),
        };
        l.set(Some(run));
    });
    if id % PRUNE_EVERY == 0 {
        prune(tx, c.account_id, limits, now)?;
    }
    Ok(())
}

thread_local! {
    /// The run of change IDs this thread logged last (first, last): `Store::changed`, after
    /// the commit on the same thread, takes them as this store's own (`Store::foreign_commits`).
    static LOGGED: std::cell::Cell<Option<(i64, i64)>> = const { std::cell::Cell::new(None) };
}

/// The run of change IDs this thread logged since last asked (see `LOGGED`).
pub(in crate::store) fn take_logged() -> Option<(i64, i64)> {
    LOGGED.with(|l| l.take())
}

/// Drops the account's rows past its newest `entries` or older than `age`; raises its floor.
fn prune(tx: &Conn, account: i64, (entries, age): Limits, now: i64) -> Result<()> {
    let by_count: Option<i64> = tx
        .prepare_cached(
            "SELECT id FROM changes WHERE account_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2",
        )?
        .query_row(params![account, entries.min(i64::MAX as u64) as i64], |r| {
            r.get(0)
        })
        .optional()?;
    let cutoff = now.saturating_sub(age.as_nanos().min(i64::MAX as u128) as i64);
    let by_age: Option<i64> = tx
        .prepare_cached("SELECT max(id) FROM changes WHERE account_id = ?1 AND at < ?2")?
        .query_row(params![account, cutoff], |r| r.get(0))?;
    let Some(upto) = by_count.max(by_age) else {
        return Ok(());
    };
    tx.prepare_cached("DELETE FROM changes WHERE account_id = ?1 AND id <= ?2")?
        .execute(params![account, upto])?;
    tx.prepare_cached(
        "INSERT INTO change_floors (account_id, floor) VALUES (?1, ?2)
         ON CONFLICT (account_id) DO UPDATE SET floor = excluded.floor
         WHERE excluded.floor > change_floors.floor",
    )?
    .execute(params![account, upto])?;
    Ok(())
}

/// (floor, newest ID) of the accounts in `scope`.
fn bounds(conn: &Conn, scope: Scope) -> Result<(i64, i64)> {
    let (floor, head): (Option<i64>, Option<i64>) = match scope {
        Scope::Account(a) => (
            conn.prepare_cached("SELECT floor FROM change_floors WHERE account_id = ?1")?
                .query_row([a], |r| r.get(0))
                .optional()?,
            conn.prepare_cached("SELECT max(id) FROM changes WHERE account_id = ?1")?
                .query_row([a], |r| r.get(0))?,
        ),
        Scope::All => (
            conn.query_row("SELECT max(floor) FROM change_floors", [], |r| r.get(0))?,
            conn.query_row("SELECT max(id) FROM changes", [], |r| r.get(0))?,
        ),
    };
    let floor = floor.unwrap_or(0);
    Ok((floor, head.unwrap_or(0).max(floor)))
}

impl Store {
    /// The changes in `scope` after `cursor`, at most `limit` (see [`ChangesPage`]); without a
    /// cursor, none and the cursor to follow from.
    pub fn changes(&self, scope: Scope, cursor: Option<u64>, limit: u64) -> Result<ChangesPage> {
        // See the module's comment: the rows of every account only under the store's lock.
        let guard = match scope {
            Scope::All => self.lock()?,
            Scope::Account(_) => self.conn()?,
        };
        let conn = guard.snapshot()?;
        let (floor, head) = bounds(&conn, scope)?;
        let head = head as u64;
        let Some(cursor) = cursor else {
            return Ok(ChangesPage {
                cursor: head,
                ..Default::default()
            });
        };
        if cursor < floor as u64 || cursor > head {
            return Ok(ChangesPage {
                cursor: head,
                reset: true,
                ..Default::default()
            });
        }
        let limit = limit.clamp(1, 10_000) as i64;
        let after = cursor.min(i64::MAX as u64) as i64;
        let sql = match scope {
            Scope::Account(_) => {
                concat!(
                    changes_select!(),
                    " WHERE c.account_id = ?1 AND c.id > ?2 ORDER BY c.id LIMIT ?3"
                )
            }
            Scope::All => {
                concat!(
                    changes_select!(),
                    " WHERE ?1 = ?1 AND c.id > ?2 ORDER BY c.id LIMIT ?3"
                )
            }
        };
        let account = match scope {
            Scope::Account(a) => a,
            Scope::All => 0,
        };
        let mut changes: Vec<Change> = conn
            .prepare_cached(sql)?
            .query_map(params![account, after, limit + 1], |r| {
                let folder = r.get::<_, i64>(3)? != 0;
                let node: i64 = r.get(2)?;
                Ok(Change {
                    cursor: r.get::<_, i64>(0)? as u64,
                    kind: kind_of(r.get(1)?),
                    node_type: if folder {
                        NodeType::FolderNodeType
                    } else {
                        NodeType::FileNodeType
                    },
                    id: (!folder).then(|| node.to_string()),
                    uri: uri_of(&r.get::<_, String>(4)?),
                    from_uri: r.get::<_, Option<String>>(5)?.map(|p| uri_of(&p)),
                    at: format_time(ns_to_time(r.get(6)?)),
                    md5: r.get(7)?,
                })
            })?
            .collect::<super::db::Result<_>>()?;
        let more = changes.len() as i64 > limit;
        changes.truncate(limit as usize);
        Ok(ChangesPage {
            cursor: changes.last().map_or(cursor, |c| c.cursor),
            reset: false,
            more,
            changes,
        })
    }

    /// Rows of the change log, of every account (tests of its bound).
    pub fn change_log_rows(&self) -> Result<u64> {
        let n: i64 = self
            .lock()?
            .query_row("SELECT count(*) FROM changes", [], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// The wake-ups of the change log (see [`Feed`]); the first call starts the thread that
    /// hears other processes' commits.
    pub fn feed(&self) -> &Arc<Feed> {
        self.feed.start(&self.db);
        &self.feed
    }

    /// Log limits: (entries per account, age).
    pub(in crate::store) fn change_limits(&self) -> Limits {
        (self.config.change_log_entries, self.config.change_log_age)
    }

    /// Logs a change inside `tx` (see [`record`]).
    pub(in crate::store) fn log_change(&self, tx: &Conn, c: NewChange<'_>) -> Result<()> {
        record(tx, c, self.change_limits())
    }

    /// After a commit that logged changes of `account`: wakes its waiters, and counts the
    /// changes as this store's own (`foreign_commits`).
    pub(in crate::store) fn changed(&self, account: i64) {
        if let Some((first, last)) = take_logged() {
            self.own_changes(first, last);
        }
        self.feed.wake(Scope::Account(account));
    }
}

/// Generations of the accounts' logs, bumped after each committed change; waiters sleep on
/// [`Feed::subscribe`] and compare [`Feed::generation`] of their scope.
pub struct Feed {
    tx: watch::Sender<u64>,
    /// By account; `ANY` for changes whose account is not known (another process's commit).
    gens: Mutex<HashMap<i64, u64>>,
    started: std::sync::Once,
}

/// The key of changes of any account.
const ANY: i64 = -1;

impl Feed {
    pub(super) fn new() -> Arc<Feed> {
        Arc::new(Feed {
            tx: watch::channel(0).0,
            gens: Mutex::new(HashMap::new()),
            started: std::sync::Once::new(),
        })
    }

    /// After a commit that changed `scope`'s tree.
    pub fn wake(&self, scope: Scope) {
        let key = match scope {
            Scope::Account(a) => a,
            Scope::All => ANY,
        };
        *relock(&self.gens).entry(key).or_insert(0) += 1;
        self.tx.send_modify(|n| *n += 1);
    }

    /// A number that moves when `scope`'s log may have grown.
    pub fn generation(&self, scope: Scope) -> u64 {
        match scope {
            Scope::Account(a) => {
                let g = relock(&self.gens);
                g.get(&a).copied().unwrap_or(0) + g.get(&ANY).copied().unwrap_or(0)
            }
            Scope::All => *self.tx.borrow(),
        }
    }

    /// Wakes on every [`Feed::wake`] after the call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    fn start(self: &Arc<Self>, db: &Arc<super::db::Db>) {
        self.started.call_once(|| {
            let feed = Arc::downgrade(self);
            let spawned = match db.engine() {
                super::db::Engine::Postgres(url) => {
                    let url = url.clone();
                    std::thread::Builder::new()
                        .name("changes-listen".into())
                        .spawn(move || listen(&url, feed))
                }
                super::db::Engine::Sqlite(_) => {
                    let db = Arc::downgrade(db);
                    std::thread::Builder::new()
                        .name("changes-watch".into())
                        .spawn(move || watch_sqlite(db, feed))
                }
            };
            if let Err(e) = spawned {
                log::warn!("cannot start the change feed's thread: {e}");
            }
        });
    }
}

/// PostgreSQL: wakes the feed on every change notification of any server (this one's too),
/// reconnecting after a lost connection (and waking every waiter then: some may be missed).
fn listen(url: &str, feed: Weak<Feed>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut client = match super::db::PgListener::open(url, CHANNEL) {
            Ok(c) => {
                backoff = Duration::from_millis(100);
                c
            }
            Err(e) => {
                log::warn!("change feed: cannot listen on PostgreSQL: {e}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                match feed.upgrade() {
                    Some(_) => continue,
                    None => return,
                }
            }
        };
        match feed.upgrade() {
            Some(f) => f.wake(Scope::All),
            None => return,
        }
        loop {
            // Wakes at least every 10 s to see whether the store is still open.
            let got = client.wait(Duration::from_secs(10));
            let Some(f) = feed.upgrade() else { return };
            match got {
                Ok(accounts) => {
                    for a in accounts {
                        match a.parse::<i64>() {
                            Ok(a) => f.wake(Scope::Account(a)),
                            Err(_) => f.wake(Scope::All),
                        }
                    }
                }
                Err(e) => {
                    log::warn!("change feed: the PostgreSQL listener's connection broke: {e}");
                    break;
                }
            }
        }
    }
}

/// SQLite: another process's commit (a mount beside the server, the preview threads) wakes
/// every waiter; looked for only while someone waits, on the store's own connection, whose
/// `data_version` does not count its own commits (they woke the waiters already).
fn watch_sqlite(db: Weak<super::db::Db>, feed: Weak<Feed>) {
    let mut last: Option<i64> = None;
    loop {
        std::thread::sleep(FOREIGN_POLL);
        let (Some(f), Some(db)) = (feed.upgrade(), db.upgrade()) else {
            return;
        };
        if f.tx.receiver_count() == 0 {
            continue;
        }
        // Busy with the store's own work: looked at next time.
        let Some(conn) = db.try_lock_sqlite() else {
            continue;
        };
        match conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)) {
            Ok(v) => {
                if last.is_some_and(|l| l != v) {
                    f.wake(Scope::All);
                }
                last = Some(v);
            }
            Err(e) => log::debug!("change feed: PRAGMA data_version: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    fn vault() -> NodePath {
        NodePath::from_segments(["Local", "My First Vault"]).unwrap()
    }

    /// A tree is one change whatever it holds: a delete large enough to be purged in the
    /// background as much as a small one, and its move; the log's rows stay few.
    #[test]
    fn a_large_tree_is_one_change() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_local_with(tmp.path(), StoreConfig::default()).unwrap();
        let top = vault().child("big").unwrap();
        store.create_folder(Scope::All, &top).unwrap();
        let n = crate::store::purge::INLINE_NODES as usize + 10;
        for i in 0..n {
            let path = top.child(&format!("f{i}")).unwrap();
            store.create_folder(Scope::All, &path).unwrap();
        }
        let head = store.changes(Scope::All, None, 1).unwrap().cursor;
        let moved = vault().child("moved").unwrap();
        store
            .transfer(
                Scope::All,
                &top,
                &moved,
                false,
                crate::store::TransferMode::Move,
            )
            .unwrap();
        let rows = store.change_log_rows().unwrap();
        store.delete(Scope::All, &moved).unwrap();
        assert_eq!(store.change_log_rows().unwrap(), rows + 1);
        let page = store.changes(Scope::All, Some(head), 100).unwrap();
        let got: Vec<(ChangeKind, String, Option<String>)> = page
            .changes
            .iter()
            .map(|c| (c.kind, c.uri.clone(), c.from_uri.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (ChangeKind::Moved, moved.uri(), Some(top.uri())),
                (ChangeKind::Deleted, moved.uri(), None),
            ]
        );
        assert!(store.wait_purged(Duration::from_secs(60)));
        // The purge of the detached tree logs nothing more.
        assert_eq!(store.change_log_rows().unwrap(), rows + 1);
    }
}
