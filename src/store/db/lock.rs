//! The store's connections: the one behind the store's lock ([`Db::lock`]: an in-process mutex,
//! and on PostgreSQL a session-level advisory lock that spans every process of the store), and
//! on PostgreSQL a pool of others for the calls that need no more than a transaction's own
//! isolation ([`Db::conn`]); and on both engines a few readers of their own for long reads
//! of one snapshot that must hold up nobody ([`Db::reader`]: a search).
//!
//! **Why two ways in.** The lock serializes everything it covers across the cluster, which is
//! what a few multi-step jobs need (the purge, recovery, a preview read that must outlive no
//! delete). The hot paths of a server (a token checked, upload steps 1 to 3, a listing) need
//! less: each is either reads of committed rows or one transaction, and every transaction
//! takes a writers' lock (`Conn::transaction_for`: the same key exclusive for the store's
//! writers, shared with the account's own lock for an account's), so each account's writers
//! still run one at a time, in commit order, as on SQLite; but for a transaction's few
//! statements only, not for a whole request, beside other accounts', and readers never wait.
//! The store's lock, exclusive on the key, waits for every account's writers and holds them
//! all off. A server with one
//! connection would also run its requests' statements one after another: the pool lets them
//! overlap. On SQLite both ways are the one connection behind the mutex (one process serves).
//!
//! **Readers.** A search reads for as long as its budget allows (`store::search`): under the
//! store's lock it held every other account's request up for a minute (issue 47). It reads
//! on a connection of [`Db::reader`]'s, in a read-only snapshot that takes no lock: on SQLite
//! a connection of its own (WAL: readers never wait for the writer, nor it for them), on
//! PostgreSQL a connection outside the requests' pool, so that searches at once cannot take
//! the connections the other requests need either.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{Conn, DbError, Engine, Result};
use crate::sync::{relock, try_relock, unpoisoned};

/// How long [`Db::lock`] waits for a database that does not answer.
const LOCK_RETRY: Duration = Duration::from_secs(5);

/// Connections of the pool when the store is not told (`--db-connections`).
pub const DEFAULT_POOL: usize = 8;

/// Connections of [`Db::reader`] (searches at once; more wait for one).
pub const READERS: usize = 4;

/// The store's connection behind its lock (see the module's comment), and the pool.
pub struct Db {
    conn: Mutex<Conn>,
    engine: Engine,
    /// When [`Db::lock`] last gave up (the database down): the callers queued behind it try
    /// once each instead of waiting [`LOCK_RETRY`] one after another.
    gave_up: Mutex<Option<std::time::Instant>>,
    pool: Pool,
    readers: Pool,
}

/// Connections made when first needed, at most `size`: PostgreSQL's for [`Db::conn`], or
/// either engine's read-only ones for [`Db::reader`].
struct Pool {
    size: usize,
    /// Its connections only read ([`Engine::connect_reader`]).
    read_only: bool,
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Conn>,
    /// Made and not yet dropped (idle or lent).
    open: usize,
}

/// A connection: the store's, locked, or one of the pool's, lent.
pub struct Guard<'a> {
    held: Held<'a>,
}

enum Held<'a> {
    Locked(MutexGuard<'a, Conn>),
    Lent(Option<Conn>, &'a Pool),
}

impl std::ops::Deref for Guard<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        match &self.held {
            Held::Locked(c) => c,
            Held::Lent(c, _) => c.as_ref().expect("lent until dropped"),
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        match &mut self.held {
            Held::Locked(conn) => {
                if let Err(e) = conn.session_lock(false) {
                    log::warn!("could not release the store's lock: {e}");
                }
            }
            Held::Lent(conn, pool) => {
                if let Some(c) = conn.take() {
                    pool.give_back(c);
                }
            }
        }
    }
}

impl Db {
    /// `pool`: connections [`Db::conn`] may have open at once (PostgreSQL; at least one).
    pub fn new(conn: Conn, engine: Engine, pool: usize) -> Db {
        Db {
            conn: Mutex::new(conn),
            engine,
            gave_up: Mutex::new(None),
            pool: Pool::new(pool, false),
            readers: Pool::new(READERS, true),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn is_pg(&self) -> bool {
        self.engine.is_pg()
    }

    /// Locks the store (see the module's comment). Fails only on PostgreSQL, when the lock
    /// cannot be taken within [`LOCK_RETRY`] (the database down): [`DbError::Unavailable`].
    pub fn lock(&self) -> Result<Guard<'_>> {
        // A panic while holding the lock cannot leave a transaction half-applied (it rolls back
        // on drop), so the connection is still good.
        let conn = relock(&self.conn);
        let gave_up = || relock(&self.gave_up);
        let last = *gave_up();
        let down = last.is_some_and(|t| t.elapsed() < LOCK_RETRY);
        let deadline = std::time::Instant::now() + if down { Duration::ZERO } else { LOCK_RETRY };
        loop {
            match conn.session_lock(true) {
                Ok(()) => {
                    if last.is_some() {
                        log::info!("the database answers again");
                    }
                    *gave_up() = None;
                    return Ok(Guard {
                        held: Held::Locked(conn),
                    });
                }
                // The database gone for a moment (the connection is made again on the next
                // call): wait a little, but never go on without the lock, which keeps other
                // servers from removing bytes this one records. Then the caller fails (a
                // request with 503; a background thread tries again later).
                Err(e) if std::time::Instant::now() < deadline => {
                    log::debug!("could not take the store's lock: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    *gave_up() = Some(std::time::Instant::now());
                    return Err(DbError::Unavailable(format!(
                        "the store's lock not taken in {LOCK_RETRY:?}: {e}"
                    )));
                }
            }
        }
    }

    /// A connection for reads of committed rows and for transactions, which isolate
    /// themselves (see the module's comment): on PostgreSQL one of the pool's, without the
    /// store's lock; on SQLite the store's, locked. Never to be asked for while the same thread
    /// holds one already (the pool may be empty, and [`Db::lock`] excludes the pool's writers).
    pub fn conn(&self) -> Result<Guard<'_>> {
        if !self.is_pg() {
            return Ok(Guard {
                held: Held::Locked(relock(&self.conn)),
            });
        }
        let conn = self.pool.take(&self.engine)?;
        Ok(Guard {
            held: Held::Lent(Some(conn), &self.pool),
        })
    }

    /// A read-only connection for long reads of one snapshot ([`Conn::read_snapshot`]), which
    /// hold up no writer and no other request (see the module's comment): never the store's,
    /// never one of [`Db::conn`]'s. At most [`READERS`] are lent at once; a caller waits for
    /// one returned beyond that.
    pub fn reader(&self) -> Result<Guard<'_>> {
        let conn = self.readers.take(&self.engine)?;
        Ok(Guard {
            held: Held::Lent(Some(conn), &self.readers),
        })
    }

    /// The connection if nobody holds it (SQLite only: a cheap look that must never wait).
    pub fn try_lock_sqlite(&self) -> Option<MutexGuard<'_, Conn>> {
        if self.is_pg() {
            return None;
        }
        try_relock(&self.conn)
    }
}

impl Pool {
    fn new(size: usize, read_only: bool) -> Pool {
        Pool {
            size: size.max(1),
            read_only,
            state: Mutex::new(PoolState::default()),
            returned: Condvar::new(),
        }
    }

    /// An idle connection, a new one while fewer than `size` are open, or the first returned.
    fn take(&self, engine: &Engine) -> Result<Conn> {
        let mut st = relock(&self.state);
        loop {
            if let Some(c) = st.idle.pop() {
                return Ok(c);
            }
            if st.open < self.size {
                st.open += 1;
                drop(st);
                // Made outside the pool's mutex: connecting takes a round trip or more. On
                // failure the slot is free again, and a caller waiting for one may take it.
                let made = if self.read_only {
                    engine.connect_reader()
                } else {
                    engine.connect()
                };
                return made.inspect_err(|_| {
                    relock(&self.state).open -= 1;
                    self.returned.notify_one();
                });
            }
            st = unpoisoned(self.returned.wait(st));
        }
    }

    fn give_back(&self, conn: Conn) {
        // Never mid-transaction: a `Tx` rolls back when dropped, a panic's unwinding included.
        relock(&self.state).idle.push(conn);
        self.returned.notify_one();
    }
}
