//! A connection to either engine ([`Engine`], [`Conn`]) with rusqlite's shape: statements
//! ([`Stmt`]) and transactions and savepoints ([`Tx`]), which take the write lock when they begin.

use super::pg::PgConn;
use super::sqlite::lite_row;
use super::{DbError, Params, Result, Row};

/// Where the metadata lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// `vault.db` at this path.
    Sqlite(std::path::PathBuf),
    /// A `postgres://` address.
    Postgres(String),
}

impl Engine {
    /// A new connection (the preview threads have their own).
    pub fn connect(&self) -> Result<Conn> {
        match self {
            Engine::Sqlite(path) => {
                let c = rusqlite::Connection::open(path)?;
                c.busy_timeout(std::time::Duration::from_secs(30))?;
                Ok(Conn::Sqlite {
                    conn: c,
                    immediate: false,
                })
            }
            Engine::Postgres(url) => Ok(Conn::Pg(PgConn::open(url)?)),
        }
    }

    /// A new connection that only reads ([`super::Db::reader`]'s): on SQLite one that may
    /// not write (`query_only`) and sorts in memory, as the store's own; on PostgreSQL its
    /// transactions say `READ ONLY` ([`Conn::read_snapshot`]).
    pub fn connect_reader(&self) -> Result<Conn> {
        let conn = self.connect()?;
        if let Conn::Sqlite { conn, .. } = &conn {
            conn.execute_batch("PRAGMA query_only = ON; PRAGMA temp_store = MEMORY")?;
        }
        Ok(conn)
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Engine::Postgres(_))
    }
}

/// The first key of the advisory locks of single blobs ([`Conn::lock_blob`]; the second is a
/// hash of the blob's name). Two-key locks never meet the one-key [`super::LOCK_KEY`].
const BLOB_LOCK_CLASS: i32 = 0x7666_6231; // "vfb1"

/// The first key of the advisory locks of single accounts' writers ([`Writers::Account`]; the
/// second is the account's ID folded to 32 bits: two accounts that share a key only wait for
/// each other, as all did before).
const ACCOUNT_LOCK_CLASS: i32 = 0x7666_6131; // "vfa1"

/// The first key of the advisory locks of one account's WebDAV locks ([`Writers::DavLocks`];
/// the second is a hash of the account's name, which is what `dav_locks` rows are keyed by).
const DAV_LOCK_CLASS: i32 = 0x7666_6431; // "vfd1"

/// Whose writes a transaction makes: what it waits for on PostgreSQL ([`Conn::transaction_for`]).
/// SQLite has one write lock whatever the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Writers {
    /// Anything of the store (several accounts, blobs as such, users, the schema): the
    /// writers' lock [`super::LOCK_KEY`], exclusive, so it runs alone, as every writer did.
    Store,
    /// One account's tree, change log and usage only: [`super::LOCK_KEY`] shared (so that
    /// [`Writers::Store`] and the store's lock still exclude it) and the account's own lock,
    /// so that its writers run one at a time, in commit order, but beside other accounts'.
    Account(i64),
    /// One account's WebDAV locks (`dav_locks` rows of that account's name, a hash of it).
    DavLocks(i32),
}

impl Writers {
    /// [`Writers::DavLocks`] of the account named `account` (FNV-1a: stable across servers).
    pub fn dav_locks(account: &str) -> Writers {
        let h = account.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ b as u32).wrapping_mul(0x0100_0193)
        });
        Writers::DavLocks(h as i32)
    }

    /// The statements after PostgreSQL's `BEGIN` that take the lock (one round trip with it).
    fn pg_lock(self) -> String {
        // The account's lock first, then the key shared. So an account's writers queued for
        // their turn hold nothing of the store's: a writer of the store (the search index's,
        // say) waits for one writer per account at most, not for each account's whole queue to
        // go through its lock one by one while every other writer queues behind it (the key
        // taken first, measured: one account's 16 clients ran at 150 to 330 uploads/s from run
        // to run, with hundreds of waits of the store's writers sampled; now a steady 210 to
        // 255). No deadlock: nobody holding the key waits for an account's lock (the store's
        // writers take none; an account's writer takes its one lock first). PostgreSQL queues
        // a new shared request behind a waiting exclusive one: the store's writers are not
        // starved.
        let (class, key) = match self {
            Writers::Store => return format!("SELECT pg_advisory_xact_lock({})", super::LOCK_KEY),
            Writers::Account(id) => (ACCOUNT_LOCK_CLASS, (id ^ (id >> 32)) as i32),
            Writers::DavLocks(h) => (DAV_LOCK_CLASS, h),
        };
        format!(
            "SELECT pg_advisory_xact_lock({class}, {key}); SELECT pg_advisory_xact_lock_shared({})",
            super::LOCK_KEY
        )
    }
}

/// PostgreSQL's expression that takes [`Conn::lock_blob`]'s lock of the blob named by the
/// statement's parameter `?param`, until the transaction ends (a statement's own, outside one).
pub fn blob_lock(param: usize) -> String {
    format!("pg_advisory_xact_lock({BLOB_LOCK_CLASS}, hashtext(?{param}))")
}

/// One connection to the metadata database.
pub enum Conn {
    Sqlite {
        conn: rusqlite::Connection,
        /// Transactions begin `IMMEDIATE` (take the write lock at once).
        immediate: bool,
    },
    Pg(PgConn),
}

/// rusqlite's `TransactionBehavior`, for [`Conn::transaction_with_behavior`].
#[derive(Debug, Clone, Copy)]
pub enum TransactionBehavior {
    Immediate,
}

impl Conn {
    /// The SQLite connection, prepared by `schema::prepare` (its transactions immediate).
    pub fn sqlite(conn: rusqlite::Connection) -> Conn {
        Conn::Sqlite {
            conn,
            immediate: true,
        }
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Conn::Pg(_))
    }

    /// The scalar maximum of two values (`MAX(a, b)` in SQLite, `GREATEST` in PostgreSQL).
    pub fn greatest(&self) -> &'static str {
        if self.is_pg() { "GREATEST" } else { "MAX" }
    }

    /// The SQLite connection itself (pragmas, the schema's migrations).
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Conn::Sqlite { conn, .. } => Some(conn),
            Conn::Pg(_) => None,
        }
    }

    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        match self {
            Conn::Sqlite { conn, .. } => {
                let v = params.values();
                Ok(conn.execute(sql, rusqlite::params_from_iter(v.iter()))?)
            }
            Conn::Pg(pg) => pg.execute(sql, params.values()),
        }
    }

    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match self {
            Conn::Sqlite { conn, .. } => Ok(conn.execute_batch(sql)?),
            Conn::Pg(pg) => pg.batch(sql),
        }
    }

    /// One row, by a statement kept prepared (the connection's cache): the lookups of a read
    /// or a stat run for every file, and parsing their SQL each time was a tenth of a cold
    /// `tar`'s cost on the built-in store.
    pub fn query_row<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    pub fn prepare(&self, sql: &str) -> Result<Stmt<'_>> {
        Ok(match self {
            Conn::Sqlite { conn, .. } => Stmt::Sqlite(Lite::Plain(conn.prepare(sql)?)),
            Conn::Pg(pg) => Stmt::Pg(pg, sql.to_string()),
        })
    }

    pub fn prepare_cached(&self, sql: &str) -> Result<Stmt<'_>> {
        Ok(match self {
            Conn::Sqlite { conn, .. } => Stmt::Sqlite(Lite::Cached(conn.prepare_cached(sql)?)),
            Conn::Pg(pg) => Stmt::Pg(pg, sql.to_string()),
        })
    }

    /// The ID the last insert gave its row.
    pub fn last_insert_rowid(&self) -> Result<i64> {
        match self {
            Conn::Sqlite { conn, .. } => Ok(conn.last_insert_rowid()),
            Conn::Pg(pg) => pg
                .query("SELECT lastval()", Vec::new())?
                .first()
                .ok_or(DbError::NoRows)?
                .get(0),
        }
    }

    /// Begins a transaction, which holds the write lock (see the module's comment): on
    /// PostgreSQL the whole store's ([`Writers::Store`]).
    pub fn transaction(&self) -> Result<Tx<'_>> {
        self.transaction_for(Writers::Store)
    }

    /// Begins a transaction of `writers`' writes, which holds their lock (SQLite: the one
    /// write lock; PostgreSQL: see [`Writers`]).
    pub fn transaction_for(&self, writers: Writers) -> Result<Tx<'_>> {
        match self {
            Conn::Sqlite {
                immediate: true, ..
            } => self.execute_batch("BEGIN IMMEDIATE")?,
            Conn::Sqlite { .. } => self.execute_batch("BEGIN DEFERRED")?,
            Conn::Pg(_) => self.execute_batch(&format!("BEGIN; {}", writers.pg_lock()))?,
        }
        Ok(Tx {
            conn: self,
            savepoint: None,
            done: false,
        })
    }

    /// A transaction that does not take the writers' lock on PostgreSQL (on SQLite it takes
    /// the one write lock, as every write does): only for writes whose consistency rests on the
    /// rows they touch, which PostgreSQL's row locks and constraints keep: none may log a
    /// change (the log's order is the commit order, which the writers' lock makes), check a
    /// name before taking it, or place or remove bytes (see [`Conn::lock_blob`]).
    pub fn unordered_transaction(&self) -> Result<Tx<'_>> {
        self.execute_batch(match self {
            Conn::Sqlite {
                immediate: true, ..
            } => "BEGIN IMMEDIATE",
            Conn::Sqlite { .. } => "BEGIN DEFERRED",
            Conn::Pg(_) => "BEGIN",
        })?;
        Ok(Tx {
            conn: self,
            savepoint: None,
            done: false,
        })
    }

    /// Inside a transaction, on PostgreSQL: takes the lock of one blob's bytes until the
    /// transaction ends, which a hold on them (an upload storing them again) and their
    /// removal both take, so that one of the two comes first and the other sees it. SQLite's
    /// write lock already orders them.
    pub fn lock_blob(&self, hash: &str) -> Result<()> {
        if let Conn::Pg(pg) = self {
            pg.execute(
                &format!("SELECT {}", blob_lock(1)),
                vec![super::Value::Text(hash.into())],
            )?;
        }
        Ok(())
    }

    /// Reads of one state of the database, without waiting for any lock. PostgreSQL: a
    /// repeatable-read, read-only transaction, for a reader of the pool that reads more than
    /// one statement's worth; dropped, it ends. SQLite: nothing begun (its connection is the
    /// store's, locked, as before the pool: two statements more on every listing of a mount
    /// would buy nothing).
    pub fn snapshot(&self) -> Result<Tx<'_>> {
        let pg = self.is_pg();
        if pg {
            self.execute_batch("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
        }
        Ok(Tx {
            conn: self,
            savepoint: None,
            done: !pg,
        })
    }

    /// Reads of one state of the database that end at `deadline`: a read-only transaction
    /// that takes no lock (SQLite: `BEGIN DEFERRED` on a connection of its own, whose WAL
    /// snapshot is taken at the first read; PostgreSQL: repeatable read, read only, without
    /// the writers' advisory lock), and whose statements fail (interrupted) once `deadline`
    /// has passed (SQLite: a progress handler, which also stops a statement that runs past it;
    /// PostgreSQL: `statement_timeout`, each statement bounded by the time left when it
    /// began). For [`super::Db::reader`]'s connections.
    pub fn read_snapshot(&self, deadline: std::time::Instant) -> Result<Snapshot<'_>> {
        match self {
            Conn::Sqlite { conn, .. } => {
                conn.execute_batch("BEGIN DEFERRED")?;
                // Every thousand steps of the virtual machine: a few microseconds.
                conn.progress_handler(1000, Some(move || std::time::Instant::now() >= deadline));
            }
            Conn::Pg(_) => self.execute_batch(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY;
                 SET LOCAL statement_timeout = {}",
                timeout_ms(deadline)
            ))?,
        }
        Ok(Snapshot {
            tx: Tx {
                conn: self,
                savepoint: None,
                done: false,
            },
            deadline,
        })
    }

    /// rusqlite's name for a transaction begun through a shared reference.
    pub fn unchecked_transaction(&self) -> Result<Tx<'_>> {
        self.transaction()
    }

    pub fn transaction_with_behavior(&self, _: TransactionBehavior) -> Result<Tx<'_>> {
        match self {
            Conn::Sqlite { conn, .. } => {
                conn.execute_batch("BEGIN IMMEDIATE")?;
                Ok(Tx {
                    conn: self,
                    savepoint: None,
                    done: false,
                })
            }
            Conn::Pg(_) => self.transaction(),
        }
    }

    /// Takes (true) or releases (false) the store's lock across processes (PostgreSQL only).
    pub(super) fn session_lock(&self, take: bool) -> Result<()> {
        if let Conn::Pg(pg) = self {
            let sql = if take {
                "SELECT pg_advisory_lock(8530228277886219057)"
            } else {
                "SELECT pg_advisory_unlock(8530228277886219057)"
            };
            pg.batch(sql)?;
        }
        Ok(())
    }
}

enum Lite<'c> {
    Plain(rusqlite::Statement<'c>),
    Cached(rusqlite::CachedStatement<'c>),
}

impl<'c> std::ops::Deref for Lite<'c> {
    type Target = rusqlite::Statement<'c>;
    fn deref(&self) -> &Self::Target {
        match self {
            Lite::Plain(s) => s,
            Lite::Cached(s) => s,
        }
    }
}

impl std::ops::DerefMut for Lite<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Lite::Plain(s) => s,
            Lite::Cached(s) => s,
        }
    }
}

/// A statement (prepared once per connection on both engines).
pub enum Stmt<'c> {
    #[allow(private_interfaces)]
    Sqlite(Lite<'c>),
    Pg(&'c PgConn, String),
}

impl Stmt<'_> {
    fn rows<P: Params>(&mut self, params: P) -> Result<Vec<Row>> {
        let v = params.values();
        match self {
            Stmt::Sqlite(s) => {
                let mut rows = s.query(rusqlite::params_from_iter(v.iter()))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(lite_row(r)?);
                }
                Ok(out)
            }
            Stmt::Pg(pg, sql) => pg.query(sql, v),
        }
    }

    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let v = params.values();
        match self {
            Stmt::Sqlite(s) => Ok(s.execute(rusqlite::params_from_iter(v.iter()))?),
            Stmt::Pg(pg, sql) => pg.execute(sql, v),
        }
    }

    pub fn query_row<T, P: Params>(
        &mut self,
        params: P,
        f: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        match self {
            Stmt::Sqlite(s) => {
                let v = params.values();
                let mut rows = s.query(rusqlite::params_from_iter(v.iter()))?;
                match rows.next()? {
                    Some(r) => f(&lite_row(r)?),
                    None => Err(DbError::NoRows),
                }
            }
            Stmt::Pg(..) => f(self.rows(params)?.first().ok_or(DbError::NoRows)?),
        }
    }

    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        match self {
            Stmt::Sqlite(s) => {
                let v = params.values();
                Ok(s.exists(rusqlite::params_from_iter(v.iter()))?)
            }
            Stmt::Pg(..) => Ok(!self.rows(params)?.is_empty()),
        }
    }

    /// Every row mapped (collected: results are pages, lists of hashes and the like).
    pub fn query_map<T, P: Params>(
        &mut self,
        params: P,
        mut f: impl FnMut(&Row) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let rows = self.rows(params)?;
        Ok(rows.iter().map(&mut f).collect::<Vec<_>>().into_iter())
    }
}

/// [`Conn::read_snapshot`]'s transaction: ended (rolled back) when dropped, its deadline with it.
pub struct Snapshot<'c> {
    tx: Tx<'c>,
    deadline: std::time::Instant,
}

impl Snapshot<'_> {
    /// Before a statement that may take long, on PostgreSQL: its bound made the time left
    /// (`statement_timeout` bounds each statement, not the transaction). SQLite's deadline is
    /// the deadline already.
    pub fn tighten(&self) -> Result<()> {
        if self.is_pg() {
            self.execute_batch(&format!(
                "SET LOCAL statement_timeout = {}",
                timeout_ms(self.deadline)
            ))?;
        }
        Ok(())
    }
}

/// PostgreSQL's `statement_timeout` (ms) of a statement that begins now and must stop at
/// `deadline`: never before it (rounded up, and a millisecond more), so that a statement it
/// cancels has failed past the deadline, which is how the caller tells a deadline met from an
/// error; at least 1 (0 is no timeout).
fn timeout_ms(deadline: std::time::Instant) -> u128 {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    left.as_micros().div_ceil(1000) + 1
}

impl std::ops::Deref for Snapshot<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.tx.conn
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        // Before the rollback (the transaction's field, dropped after this), which a deadline
        // past could interrupt; the connection goes back to its pool without one.
        if let Conn::Sqlite { conn, .. } = self.tx.conn {
            conn.progress_handler(0, None::<fn() -> bool>);
        }
    }
}

/// A transaction or a savepoint in one; rolled back when dropped uncommitted.
pub struct Tx<'c> {
    conn: &'c Conn,
    savepoint: Option<String>,
    done: bool,
}

impl std::ops::Deref for Tx<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn
    }
}

impl<'c> Tx<'c> {
    /// A savepoint inside this transaction.
    pub fn savepoint(&mut self) -> Result<Tx<'c>> {
        let name = format!(
            "sp{}",
            self.savepoint.as_ref().map_or(0, |s| s.len()) // nested ones get longer names
        );
        self.conn.execute_batch(&format!("SAVEPOINT {name}"))?;
        Ok(Tx {
            conn: self.conn,
            savepoint: Some(name),
            done: false,
        })
    }

    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        match &self.savepoint {
            None => self.conn.execute_batch("COMMIT"),
            Some(sp) => self.conn.execute_batch(&format!("RELEASE {sp}")),
        }
    }

    pub fn rollback(mut self) -> Result<()> {
        self.done = true;
        self.undo()
    }

    fn undo(&self) -> Result<()> {
        match &self.savepoint {
            None => self.conn.execute_batch("ROLLBACK"),
            Some(sp) => self
                .conn
                .execute_batch(&format!("ROLLBACK TO {sp}; RELEASE {sp}")),
        }
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.undo() {
                log::warn!("rollback failed: {e}");
            }
        }
    }
}
