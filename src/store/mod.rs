//! The built-in store: a tree of accounts, vaults, folders and files with versions, in a data
//! directory (`vault.db` for metadata, `blobs/` for bytes, `tmp/` for uploads in flight), plus the
//! users, clients, pins and tokens of `vaultfs serve`.
//!
//! The store is synchronous; the local backend calls it from blocking tasks. One lock guards
//! the connection and, with it, the blob namespace: a blob is renamed into place and recorded,
//! or forgotten and removed, under that lock, so a delete never removes bytes that a concurrent
//! upload is about to share.
//!
//! The metadata is in SQLite (`vault.db`, the default) or in PostgreSQL (`--database`), behind
//! one connection layer (`db`): the logic below is written once for both, and on PostgreSQL
//! the lock spans every server of the store (see `db`'s comment for why and how).

pub mod auth;
pub mod blobs;
pub mod bucket;
mod changes;
pub mod check;
pub mod dav;
pub mod db;
mod expire;
pub mod migrate;
mod nodes;
mod previews;
mod purge;
mod put;
mod schema;
mod schema_pg;
mod search;
pub mod seen;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::api::{Error, Result};
use crate::sync::relock;
pub use blobs::BlobLocation;
use blobs::Blobs;
use db::{Conn, Db, Engine, Guard, OptionalExtension};

pub use changes::{DEFAULT_CHANGE_LOG_AGE, DEFAULT_CHANGE_LOG_ENTRIES, Feed};
pub use expire::{EXPIRE_EVERY, Expired};
pub use nodes::{NodeKind, NodeRow, PendingUpload, TransferMode, VersionInfo, length_mismatch};
pub use previews::{
    DEFAULT_PREVIEW_CACHE_SIZE, MAX_INPUT as MAX_PREVIEW_INPUT, PreviewMode, PreviewState,
    PreviewStats, default_preview_workers, render_preview_main, this_program,
};
pub use put::PutFile;
pub use search::{INDEX_MAX_CHARS, MAX_LIMIT as MAX_SEARCH_LIMIT};
// Kept where the store's modules and its callers have always found them.
pub use crate::api::time::{ns_to_time, time_to_ns};

/// The vault every new account starts with.
pub const FIRST_VAULT: &str = "My First Vault";
/// The account of the built-in store that `vaultfs mount` uses.
pub const LOCAL_ACCOUNT: &str = "Local";
/// How long a pin may wait to be exchanged, by default.
pub const DEFAULT_PIN_TTL: Duration = Duration::from_secs(15 * 60);
/// Files and folders an account of `vaultfs serve` may hold, by default.
pub const DEFAULT_MAX_NODES_PER_ACCOUNT: u64 = 1_000_000;
/// Nodes one request may create, by default: a copy at this bound holds the store's lock for a
/// fraction of a second.
pub const DEFAULT_MAX_NODES_PER_REQUEST: u64 = 10_000;
/// Pending versions never uploaded are dropped after this long.
const PENDING_VERSION_TTL: Duration = Duration::from_secs(24 * 3600);

/// Trees detached by large deletes and their purge (`Store::purge_stats`).
#[derive(Debug, Clone, Default)]
pub struct PurgeStats {
    /// Detached trees not yet purged.
    pub trees: u64,
    /// Chunks (transactions) this process purged, and the longest one's time under the lock.
    pub chunks: u64,
    pub longest_chunk: Duration,
}

/// Whose nodes a caller may reach: everything (the local mount, the operator) or one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    All,
    Account(i64),
}

impl Scope {
    /// Whose writers' lock a transaction in this scope takes (see `db::Writers`): an account's
    /// own, so that accounts do not wait for each other on PostgreSQL; everything may hold any
    /// account's nodes, so it takes the store's.
    pub(crate) fn writers(self) -> db::Writers {
        match self {
            Scope::All => db::Writers::Store,
            Scope::Account(a) => db::Writers::Account(a),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Largest file a version may announce (bytes).
    pub max_file_size: u64,
    /// Lifetime of delegation tokens.
    pub token_ttl: Duration,
    /// What is rendered without being asked for (`--previews`).
    pub previews: PreviewMode,
    /// Bound of the previews on disk, in bytes (`--preview-cache-size`).
    pub preview_cache_size: u64,
    /// How long a pin may wait to be exchanged (`--pin-ttl`).
    pub pin_ttl: Duration,
    /// Quotas of each account of `vaultfs serve` (files and folders; bytes of every version
    /// kept); the built-in store of a mount has none (`Scope::All`).
    pub max_nodes_per_account: u64,
    pub max_bytes_per_account: u64,
    /// Nodes one request (a copy) may create.
    pub max_nodes_per_request: u64,
    /// Which earlier versions of each file are kept besides the current one.
    pub retention: Retention,
    /// Where the blobs are kept (`--blobs`).
    pub blobs: BlobLocation,
    /// The metadata in PostgreSQL at this `postgres://` address (`--database`) instead of
    /// `vault.db` in the data directory.
    pub database: Option<String>,
    /// The change log (`GET /changes`): rows each account keeps at most, and for how long.
    pub change_log_entries: u64,
    pub change_log_age: Duration,
    /// PostgreSQL's connections for requests (`--db-connections`; see `db::Db`).
    pub db_connections: usize,
}

/// What [`Store::foreign_commits`] read last.
#[derive(Default)]
struct ForeignRead {
    /// `PRAGMA data_version` as read last; `None` before the first read.
    data_version: Option<i64>,
    /// The change log's newest ID as read last.
    newest_change: i64,
}

/// Which earlier versions of a file the store keeps (each bound `None`: no bound): at most
/// `count`, none older than `age`, and, newest first, as many as fit in `bytes` (the newest
/// earlier version is kept whatever its size). The rule is applied when a file gets a new
/// version (a file not written since keeps what it had; a deleted file's versions go with it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    pub count: Option<u64>,
    pub age: Option<Duration>,
    pub bytes: Option<u64>,
}

impl Retention {
    /// Only the current version.
    pub const NONE: Retention = Retention {
        count: Some(0),
        age: None,
        bytes: None,
    };

    pub fn is_unbounded(&self) -> bool {
        *self == Retention::default()
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_file_size: 1 << 40,
            token_ttl: Duration::from_secs(14 * 24 * 3600),
            previews: PreviewMode::default(),
            preview_cache_size: DEFAULT_PREVIEW_CACHE_SIZE,
            pin_ttl: DEFAULT_PIN_TTL,
            max_nodes_per_account: DEFAULT_MAX_NODES_PER_ACCOUNT,
            max_bytes_per_account: u64::MAX,
            max_nodes_per_request: DEFAULT_MAX_NODES_PER_REQUEST,
            retention: Retention::default(),
            blobs: BlobLocation::DataDir,
            database: None,
            change_log_entries: changes::DEFAULT_CHANGE_LOG_ENTRIES,
            change_log_age: changes::DEFAULT_CHANGE_LOG_AGE,
            db_connections: db::DEFAULT_POOL,
        }
    }
}

pub struct Store {
    dir: PathBuf,
    db: Arc<Db>,
    /// Upload commits waiting for their turn (committed together, see `commit_upload`), by
    /// the writers' lock their transaction takes: one queue on SQLite, one per account on
    /// PostgreSQL, so that one account's batch does not wait for another's commit.
    commits: Mutex<std::collections::HashMap<db::Writers, Vec<Arc<nodes::PendingCommit>>>>,
    /// Held by the upload commit whose batch of that queue is being committed (an entry while
    /// anyone holds or waits for it).
    commit_turns: Mutex<std::collections::HashMap<db::Writers, Arc<Mutex<()>>>>,
    blobs: Blobs,
    /// How batches of whole files are made durable on the blobs' file system.
    sync_mode: put::SyncMode,
    previews: previews::Previews,
    /// The search indexer's thread (`search`).
    search: search::Indexer,
    config: StoreConfig,
    /// The key of the pins' hashes (`pin.key`, beside the database but not in it).
    pin_key: [u8; 32],
    /// Purges the trees large deletes detached; set once the store is open.
    purger: std::sync::OnceLock<purge::Purger>,
    /// A shared lock on `lock` for as long as the store is open (`flock`, and a read lock on
    /// its first byte that [`Store::shared`] asks about).
    _lock: fs::File,
    /// What [`Store::foreign_commits`] answers ...
    foreign: AtomicU64,
    /// ... and what it read last (see there).
    foreign_read: Mutex<ForeignRead>,
    /// SQLite's wal-index header, through the connection's own mapping (see `db::WalIndex`).
    wal_index: std::sync::OnceLock<Option<db::WalIndex>>,
    /// Wakes the change feed's waiters (`changes`).
    feed: Arc<changes::Feed>,
    /// Tokens found valid lately (`auth`).
    tokens: auth::TokenCache,
}

/// A lock on the first byte of `f` owned by this open file description (`F_OFD_SETLK`), or
/// with `ask`, whether another's lock stands in the way of one (`F_OFD_GETLK`). Unlike
/// `flock`'s shared lock, another holder can be asked about without taking a lock: a second
/// description of the same file, even in this process, holds a lock of its own.
#[cfg(target_os = "linux")]
fn first_byte_lock(f: &fs::File, kind: i32, ask: bool) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero `flock` is a valid value of the C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_len = 1;
    let cmd = if ask {
        libc::F_OFD_GETLK
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: fcntl on a descriptor we own with a pointer to a live struct.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(!ask || l.l_type != libc::F_UNLCK as libc::c_short)
}

fn flock(f: &fs::File, op: i32) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The 32 random bytes in `path`, written (mode 0600) on first use.
fn secret_key(path: &Path) -> Result<[u8; 32]> {
    use std::io::{Read, Write};
    let mut key = [0u8; 32];
    let read = |f: fs::File, key: &mut [u8; 32]| -> Result<()> {
        let mut f = f;
        f.read_exact(key)
            .map_err(|e| Error::internal(format!("{} is not a key: {e}", path.display())))
    };
    // Whether there is one is the open's answer: asked again after a failed read (`exists`),
    // another thread's key linked in between made the read's "not found" an error (1 run in 30
    // of eight threads at once, under load).
    match fs::File::open(path) {
        Ok(f) => return read(f, &mut key).map(|()| key),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            log::debug!("no key yet: making {}", path.display());
        }
        Err(e) => return Err(e.into()),
    }
    // Written whole under a name of its own, then linked into place: a second process opening
    // a new store at the same moment reads either no key (and races to link its own) or a
    // whole one, never a file still being written.
    let tmp = path.with_extension(format!("{}.{}", std::process::id(), rand::random::<u32>()));
    let mut f = crate::api::files::new_private(&tmp)?;
    rand::Rng::fill(&mut rand::rng(), &mut key);
    let placed = f
        .write_all(&key)
        .and_then(|()| f.sync_all())
        .and_then(|()| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    match placed {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read(fs::File::open(path)?, &mut key).map(|()| key)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the bytes of `hashes` whose rows a committed transaction dropped. Between that
/// commit and now, another upload (this process's, or on SQLite another process's on the same
/// folder, on PostgreSQL another server's) may have recorded the same bytes again, or be
/// storing them (a hold, `Store::hold_blob`). A blob is placed and recorded inside a write
/// transaction, so the bytes are removed inside one too (which waits for the writers' lock),
/// only while no row records them; and under the blob's own lock, which a hold is taken under,
/// only while nobody holds them.
pub(crate) fn remove_unrecorded(conn: &Conn, blobs: &Blobs, hashes: &[&String]) -> Result<()> {
    let tx = conn.transaction_with_behavior(db::TransactionBehavior::Immediate)?;
    let mut recorded = tx.prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?;
    for hash in hashes {
        tx.lock_blob(hash)?;
        if recorded.exists([hash])? {
            log::debug!("blob {hash} kept: stored again meanwhile");
        } else if held_elsewhere(&tx, hash)? {
            log::debug!("blob {hash} kept: another upload is storing it again");
        } else {
            blobs.remove(hash);
        }
    }
    drop(recorded);
    tx.commit()?;
    Ok(())
}

/// Whether another server holds `hash` (see `Store::hold_blob`; never on SQLite).
fn held_elsewhere(conn: &Conn, hash: &str) -> db::Result<bool> {
    if !conn.is_pg() {
        return Ok(false);
    }
    let cutoff = now_ns() - PENDING_VERSION_TTL.as_nanos() as i64;
    conn.prepare_cached("SELECT 1 FROM blob_holds WHERE hash = ?1 AND since > ?2")?
        .exists(db::params![hash, cutoff])
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
                Error::from(std::io::Error::from_raw_os_error(libc::ENOSPC))
            }
            other => Error::internal(format!("database error: {other}")),
        }
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, which is made private to its owner.
    pub fn open(dir: &Path, config: StoreConfig) -> Result<Store> {
        fs::create_dir_all(dir)?;
        // Other users of the machine have no business reading the store.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let (engine, conn, pin_key, owner) = match &config.database {
            None => {
                let mut conn = rusqlite::Connection::open(dir.join("vault.db"))?;
                schema::prepare(&mut conn)?;
                schema::preview_cache_columns(&conn)?;
                let key = secret_key(&dir.join("pin.key"))?;
                (
                    Engine::Sqlite(dir.join("vault.db")),
                    Conn::sqlite(conn),
                    key,
                    None,
                )
            }
            Some(url) => {
                let engine = Engine::Postgres(url.clone());
                let conn = engine.connect()?;
                let settings = schema_pg::prepare(&conn)?;
                (engine, conn, settings.pin_key, Some(settings.store_id))
            }
        };
        let blobs = Blobs::owned_by(dir, &config.blobs, owner)?;
        let previews =
            previews::Previews::new(engine.clone(), config.previews, config.preview_cache_size);
        let feed = changes::Feed::new();
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join("lock"))?;
        // Alone with the store (no server, mount or CLI has it open): clean up after crashes.
        // Otherwise another process may be mid-upload, and its staging files are not garbage.
        let alone = flock(&lock, libc::LOCK_EX | libc::LOCK_NB);
        let store = Store {
            dir: dir.to_path_buf(),
            db: Arc::new(Db::new(conn, engine, config.db_connections)),
            commits: Mutex::default(),
            commit_turns: Mutex::default(),
            sync_mode: {
                let mode = put::SyncMode::of(dir);
                log::debug!(
                    "store in {}: batches made durable by {mode:?}",
                    dir.display()
                );
                mode
            },
            blobs,
            previews,
            search: search::Indexer::default(),
            config,
            pin_key,
            purger: std::sync::OnceLock::new(),
            _lock: lock,
            foreign: AtomicU64::new(0),
            foreign_read: Mutex::new(ForeignRead::default()),
            tokens: auth::TokenCache::default(),
            wal_index: std::sync::OnceLock::new(),
            feed,
        };
        store.migrate_preview_kinds()?;
        if alone {
            store.recover()?;
        }
        // Held while the store is open, so others know it is in use.
        flock(&store._lock, libc::LOCK_SH);
        #[cfg(target_os = "linux")]
        if let Err(e) = first_byte_lock(&store._lock, libc::F_RDLCK, false) {
            log::debug!("store lock: {e}");
        }
        // Trees a stopped process left detached are purged again from where it was.
        let purger = purge::Purger::start(store.db.clone(), store.blobs.clone())?;
        let _ = store.purger.set(purger);
        store.add_client(auth::DEFAULT_CLIENT)?;
        Ok(store)
    }

    /// Opens the store of `vaultfs mount` with its `Local` account.
    /// Whether `dir` holds a built-in store (SQLite), without making one.
    pub fn is_in(dir: &Path) -> bool {
        dir.join("vault.db").is_file()
    }

    pub fn open_local(dir: &Path) -> Result<Store> {
        Store::open_local_with(dir, StoreConfig::default())
    }

    /// The same with a configuration (the mount's preview flags).
    pub fn open_local_with(dir: &Path, config: StoreConfig) -> Result<Store> {
        let store = Store::open(dir, config)?;
        store.ensure_account(LOCAL_ACCOUNT)?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// A count of the changes to the tree others made (another mount of this store, `vaultfs
    /// serve`, the CLI) that this connection has noticed. A mount compares it to tell its
    /// cached listings are stale. Two reads tell it: SQLite's `data_version` of our one
    /// connection moves when any other connection commits (our own commits leave it alone),
    /// and then the change log's newest ID (`changes`: every change to the tree is a row) says
    /// whether that commit touched the tree. Commits that do not (the search indexer's and the
    /// background previews' own connections, in this process or another) count for nothing:
    /// they came every few milliseconds while the store was idle, and each made every listing
    /// stale. (The log also moves with our own changes; the first foreign commit after one of
    /// them counts once more than needed: a listing asked again, never one kept too long.)
    /// Never waits: while the connection is busy with our own work, the value read last (the
    /// next call sees what that missed).
    pub fn foreign_commits(&self) -> u64 {
        // Nobody committed since the last ask: its answer holds (see `db::WalIndex`).
        if let Some(Some(w)) = self.wal_index.get() {
            if w.unchanged() {
                return self.foreign.load(Ordering::Relaxed);
            }
        }
        // (PostgreSQL: no mount reads it; the value stays.)
        let Some(conn) = self.db.try_lock_sqlite() else {
            return self.foreign.load(Ordering::Relaxed);
        };
        let wal = self
            .wal_index
            .get_or_init(|| conn.as_sqlite().and_then(db::WalIndex::of));
        let asked = wal.as_ref().map(|w| w.before_asking());
        // Starting the read transaction this needs is what notices other commits (no I/O
        // while nothing changed: SQLite compares the WAL index header in shared memory).
        let read = |sql: &str| {
            conn.prepare_cached(sql)
                .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)).optional())
                .map(|v| v.unwrap_or(0))
        };
        let mut f = relock(&self.foreign_read);
        let answer = read("PRAGMA data_version").and_then(|version| {
            if f.data_version == Some(version) {
                return Ok(());
            }
            let newest = read("SELECT seq FROM sqlite_sequence WHERE name = 'changes'")?;
            if f.data_version.is_some() && f.newest_change != newest {
                self.foreign.fetch_add(1, Ordering::Relaxed);
            }
            f.data_version = Some(version);
            f.newest_change = newest;
            Ok(())
        });
        match answer {
            Ok(()) => {
                if let Some(asked) = asked {
                    asked();
                }
            }
            Err(e) => log::debug!("reading the commits of others: {e}"),
        }
        self.foreign.load(Ordering::Relaxed)
    }

    /// Whether another process has the store open now (a mount of the same folder, `vaultfs
    /// serve`, the CLI): what it can see of ours then counts (a file a mount has not stored
    /// yet is one only it knows). One `fcntl`; `false` where it cannot be told (not Linux).
    pub fn shared(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            first_byte_lock(&self._lock, libc::F_WRLCK, true).unwrap_or(false)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// This store committed the change log's IDs `first..=last`: when the log held nothing
    /// newer than what `foreign_commits` read last, they are no one else's. Without this, a
    /// commit of the previews' or the search indexer's connections after ours counted as
    /// another's change, and every listing was fetched again: at each delete of an `rm -rf`
    /// while previews were made, the folder's whole listing (the square of its size). (A
    /// transaction rolled back after logging, whose IDs another writer then took, could be
    /// counted ours: the change feed, which the mount follows, still tells it.)
    fn own_changes(&self, first: i64, last: i64) {
        let mut f = relock(&self.foreign_read);
        if f.newest_change == first - 1 {
            f.newest_change = last;
        }
    }

    /// The store's connection, locked; `ErrorKind::Unavailable` when the database does not
    /// answer (PostgreSQL only).
    fn lock(&self) -> Result<Guard<'_>> {
        Ok(self.db.lock()?)
    }

    /// A connection for reads of committed rows and for transactions, without the store's
    /// lock on PostgreSQL (`db::Db::conn`); never while holding one.
    fn conn(&self) -> Result<Guard<'_>> {
        Ok(self.db.conn()?)
    }

    /// Cleans up after a crash: staging files of dead uploads, blobs renamed into place whose
    /// transaction never committed, and pending versions too old to be finished.
    fn recover(&self) -> Result<()> {
        let conn = self.lock()?;
        // A blob folder shared by the servers of a database stages in its own `.tmp`, which
        // holds the uploads in flight of the others.
        let shared_tmp = conn.is_pg() && matches!(self.config.blobs, BlobLocation::Dir(_));
        let stale = if shared_tmp {
            0
        } else {
            self.blobs.clear_tmp()?
        };
        if stale > 0 {
            log::info!("removed {stale} staging file(s) of interrupted uploads");
        }
        self.previews.recover(&conn, &self.blobs)?;
        let mut orphans = 0;
        // On PostgreSQL other servers share the blobs and place bytes ahead of their rows
        // (`Blobs::store_ahead`): what looks unrecorded may be an upload in flight there. Their
        // holds of crashed servers are dropped once too old to be an upload's.
        if conn.is_pg() {
            let cutoff = now_ns() - PENDING_VERSION_TTL.as_nanos() as i64;
            conn.execute("DELETE FROM blob_holds WHERE since < ?1", [cutoff])?;
        } else {
            let mut known = conn.prepare("SELECT 1 FROM blobs WHERE hash = ?1")?;
            let mut unknown = Vec::new();
            for hash in self.blobs.list()? {
                if !known.exists([&hash])? {
                    unknown.push(hash);
                }
            }
            drop(known);
            orphans += unknown.len();
            self.forget_blobs(&conn, &unknown);
        }
        if orphans > 0 {
            log::info!("removed {orphans} unrecorded blob(s) left by an interrupted upload");
        }
        let cutoff = now_ns() - PENDING_VERSION_TTL.as_nanos() as i64;
        conn.execute(
            "DELETE FROM versions WHERE committed = 0 AND created_on < ?1",
            [cutoff],
        )?;
        Ok(())
    }

    /// The account node of that name, created (with its first vault) if missing.
    pub fn ensure_account(&self, name: &str) -> Result<i64> {
        crate::api::path::validate_name(name)?;
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let id = nodes::ensure_account(&tx, name)?;
        tx.commit()?;
        Ok(id)
    }

    /// Checks the database, the tree (no cycle, no orphan) and that every recorded blob is on
    /// disk with its size (for tests; `vaultfs check` also hashes the bytes, see `check`).
    pub fn check_integrity(&self) -> Result<Vec<String>> {
        let conn = self.lock()?;
        let mut problems = check::rows(&conn)?;
        problems.extend(check::tree(&conn)?);
        problems.extend(check::blobs(&conn, &self.blobs, false)?.1);
        Ok(problems)
    }

    /// Whether the database answers and the blobs are reachable (`GET /healthz`).
    pub fn health(&self) -> Result<()> {
        self.lock()?
            .query_row("SELECT CAST(1 AS BIGINT)", [], |r| r.get::<_, i64>(0))?;
        self.blobs
            .check()
            .map_err(|e| Error::internal(format!("blobs in {}: {e}", self.blobs.describe())))
    }

    /// Where the blobs are kept, for logs.
    pub fn blobs_location(&self) -> String {
        self.blobs.describe()
    }

    /// Removes the bytes of blobs no version uses any more, and their previews (after the
    /// transaction that dropped their rows committed). Kept when in doubt: an unreferenced blob
    /// costs room, a removed one a file.
    fn forget_blobs<'h>(&self, conn: &Conn, hashes: impl IntoIterator<Item = &'h String>) {
        let hashes: Vec<&String> = hashes.into_iter().collect();
        if hashes.is_empty() {
            return;
        }
        if let Err(e) = self.forget_unrecorded(conn, &hashes) {
            log::warn!("{} blob(s) kept: {e}", hashes.len());
        }
        for hash in hashes {
            self.blobs.remove_preview(hash, None);
        }
    }

    fn forget_unrecorded(&self, conn: &Conn, hashes: &[&String]) -> Result<()> {
        remove_unrecorded(conn, &self.blobs, hashes)
    }

    /// Marks `hash` as being stored by this server (PostgreSQL with a bucket: other servers'
    /// deletes leave its bytes until [`Store::release_blobs`]).
    fn hold_blob(&self, hash: &str) -> Result<Option<String>> {
        if !(self.db.is_pg() && self.blobs.is_remote()) {
            return Ok(None);
        }
        let holder = format!("{:016x}", rand::random::<u64>());
        // Under the blob's lock, which their removal (`forget_unrecorded`) takes too: either
        // the removal comes first and is over, or it comes after and sees the hold.
        // One statement, so its own transaction (one round trip where a transaction of its
        // own took four): the lock first, the hold inserted, both let go at its commit.
        self.conn()?.execute(
            &format!(
                "WITH locked AS (SELECT {} AS l)
                 INSERT INTO blob_holds (hash, holder, since) SELECT ?1, ?2, ?3 FROM locked",
                db::blob_lock(1)
            ),
            db::params![hash, holder, now_ns()],
        )?;
        Ok(Some(holder))
    }

    /// Lets go of holds [`Store::hold_blob`] took (a group commit's, in one statement).
    fn release_blobs<'h>(&self, holders: impl IntoIterator<Item = &'h str>) {
        let holders: Vec<&str> = holders.into_iter().collect();
        if holders.is_empty() {
            return;
        }
        let marks: Vec<String> = (1..=holders.len()).map(|i| format!("?{i}")).collect();
        let sql = format!(
            "DELETE FROM blob_holds WHERE holder IN ({})",
            marks.join(", ")
        );
        let params: Vec<&dyn db::Param> = holders.iter().map(|h| h as &dyn db::Param).collect();
        // Left behind on failure, they are dropped once too old (see `recover`).
        if let Err(e) = self.conn().and_then(|c| {
            c.execute(&sql, &params[..])?;
            Ok(())
        }) {
            log::warn!("could not release blob holds: {e}");
        }
    }

    fn purger(&self) -> &purge::Purger {
        self.purger
            .get()
            .expect("the purge thread starts with the store")
    }

    /// Waits until the trees large deletes detached are purged (at most `timeout`); true when
    /// none is left (tests, and a CLI command that wants a store without garbage).
    pub fn wait_purged(&self, timeout: Duration) -> bool {
        self.purger().wait_idle(timeout)
    }

    /// Trees detached by deletes and not yet purged, and what this process purged.
    pub fn purge_stats(&self) -> Result<PurgeStats> {
        let trees: i64 = self
            .lock()?
            .query_row("SELECT count(*) FROM trash", [], |r| r.get(0))?;
        let (chunks, longest_chunk) = self.purger().chunks();
        Ok(PurgeStats {
            trees: trees as u64,
            chunks,
            longest_chunk,
        })
    }

    /// Whether the metadata is in PostgreSQL (several servers may share the store).
    pub fn is_shared(&self) -> bool {
        self.db.is_pg()
    }

    /// Number of blobs kept (tests use it to see that deletes free bytes).
    pub fn blob_count(&self) -> Result<usize> {
        Ok(self.blobs.list()?.len())
    }
}

/// `rel` under the local store's default vault, for the store's unit tests.
#[cfg(test)]
pub(crate) fn test_path(rel: &str) -> crate::api::NodePath {
    let mut p = crate::api::NodePath::from_segments(["Local", "My First Vault"]).unwrap();
    for seg in rel.split('/').filter(|s| !s.is_empty()) {
        p = p.child(seg).unwrap();
    }
    p
}

#[cfg(test)]
mod tests;
