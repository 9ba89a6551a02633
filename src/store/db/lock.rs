//! The store's lock ([`Db::lock`]): the one connection behind an in-process mutex, and on
//! PostgreSQL a session-level advisory lock that spans every process of the store.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::{Conn, DbError, Engine, Result};
use crate::sync::{relock, try_relock};

/// How long [`Db::lock`] waits for a database that does not answer.
const LOCK_RETRY: Duration = Duration::from_secs(5);

/// The store's connection behind its lock (see the module's comment: on PostgreSQL the lock
/// spans every process of the store).
pub struct Db {
    conn: Mutex<Conn>,
    engine: Engine,
    /// When [`Db::lock`] last gave up (the database down): the callers queued behind it try
    /// once each instead of waiting [`LOCK_RETRY`] one after another.
    gave_up: Mutex<Option<std::time::Instant>>,
}

/// The connection, locked.
pub struct Guard<'a> {
    conn: MutexGuard<'a, Conn>,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.conn.session_lock(false) {
            log::warn!("could not release the store's lock: {e}");
        }
    }
}

impl Db {
    pub fn new(conn: Conn, engine: Engine) -> Db {
        Db {
            conn: Mutex::new(conn),
            engine,
            gave_up: Mutex::new(None),
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
                    return Ok(Guard { conn });
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

    /// The connection if nobody holds it (SQLite only: a cheap look that must never wait).
    pub fn try_lock_sqlite(&self) -> Option<MutexGuard<'_, Conn>> {
        if self.is_pg() {
            return None;
        }
        try_relock(&self.conn)
    }
}
