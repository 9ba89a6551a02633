//! The store's one way to its metadata database, SQLite or PostgreSQL.
//!
//! **Why a thin layer with rusqlite's shape, not a second store.** The store's logic (some 4,000
//! lines of tree, upload, preview, purge and auth code) is written as SQL run in transactions
//! under one lock. It is kept once: the store calls this module's `Conn`, `Tx` and `Stmt`, whose
//! methods are the subset of rusqlite's API it used (`query_row`, `prepare_cached`, `exists`,
//! `optional`, savepoints), and each engine implements them. SQL is written once, in the
//! common subset of both dialects (`ON CONFLICT`, `IS DISTINCT FROM`, `CAST(.. AS BIGINT)`,
//! recursive CTEs); the few real differences are either translated here (`?N` parameters,
//! `LIMIT -1`, `temp.`) or asked for by name (`Conn::greatest`, `Conn::is_pg`). Values cross
//! as [`Value`]s, so the store never sees an engine's types.
//!
//! **Concurrency is SQLite's model on both engines, per account on PostgreSQL**, so the store's
//! reasoning holds unchanged: a transaction takes a write lock when it begins (SQLite: `BEGIN
//! IMMEDIATE`, the database's one; PostgreSQL: advisory locks after `BEGIN`, [`Writers`]), and
//! the store's own lock ([`Db::lock`]), which keeps the blob namespace consistent with the rows
//! (a blob is placed and recorded, or unrecorded and removed, under it), spans every process
//! on PostgreSQL (a session-level advisory lock on [`LOCK_KEY`], held while the guard lives),
//! as the in-process mutex alone does on SQLite, where one process serves. Several `vaultfs
//! serve` processes on one database are therefore one store: names cannot race (each
//! check-then-insert runs alone), pins and tokens are rows, and no process removes bytes
//! another has just recorded. On PostgreSQL the writers of one account (its tree, its change
//! log, its usage: what a request of `vaultfs serve` writes) take [`LOCK_KEY`] shared and that
//! account's own lock, so they run one at a time, in commit order, but beside other accounts';
//! everything else (a writer of the whole store: the mount's scope, users, the purge, blobs
//! removed, previews, the schema) takes [`LOCK_KEY`] exclusive, and runs alone as before. What
//! accounts share inside their own transactions (blobs, by sha256) is ordered by each blob's
//! own lock ([`blob_lock`]).
//!
//! **PostgreSQL client.** sfackler's synchronous `postgres` crate (the store is synchronous;
//! no async stack or pool framework to build). A statement runs on the calling thread: the
//! client blocks on a runtime of its own, which a thread of another runtime may only do where
//! that runtime allows it (`pg::on_blocking_thread`). A thread of its own per connection,
//! called over a channel, cost two thread wake-ups a statement: a fifth of a server's CPU in
//! small uploads.
//! Statements are prepared once per connection (keyed by their SQL), as `prepare_cached` does.
//! TLS as libpq's `sslmode` asks, over rustls ([`tls`]).
//!
//! The parts: [`value`] the types that cross between the store and an engine (values,
//! parameters, rows, errors); [`conn`] a connection and its statements and transactions, over
//! either engine; [`sqlite`] and [`pg`] each engine's side of them (PostgreSQL's with the
//! dialect translation and the thread that owns the client); [`lock`] the store's one lock.

mod conn;
mod lock;
mod pg;
mod sqlite;
mod tls;
mod value;
mod wal_index;

pub use conn::{Conn, Engine, Snapshot, Stmt, TransactionBehavior, Tx, Writers, blob_lock};
pub use lock::{DEFAULT_POOL, Db, Guard};
pub use pg::{PgConn, PgListener, pg_sql};
pub(crate) use value::params;
pub use value::{Column, DbError, OptionalExtension, Param, Params, Result, Row, RowIndex, Value};
pub use wal_index::WalIndex;

/// The key of the advisory lock that stands for SQLite's write lock (taken shared by one
/// account's writers, exclusive by the store's: [`Writers`]) and the store's lock.
pub const LOCK_KEY: i64 = 0x7661_756c_7466_7331; // "vaultfs1"

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_phrases_are_spelled_for_postgres() {
        assert_eq!(
            pg_sql("SELECT '?' FROM temp.doomed WHERE a = ?1 AND b = ?12 LIMIT -1 OFFSET ?2"),
            "SELECT '?' FROM pg_temp.doomed WHERE a = $1 AND b = $12 LIMIT ALL OFFSET $2"
        );
        assert_eq!(pg_sql("pg_temp.x attempt.y"), "pg_temp.x attempt.y");
        // The advisory lock's key as the SQL spells it.
        assert_eq!(LOCK_KEY, 8530228277886219057);
    }

    #[test]
    fn values_read_back_as_their_types() {
        let c = Conn::sqlite(rusqlite::Connection::open_in_memory().unwrap());
        let (i, s, n, b): (i64, String, Option<i64>, Vec<u8>) = c
            .query_row(
                "SELECT ?1, ?2, ?3, ?4",
                params![7i64, "x", None::<i64>, vec![1u8, 2]],
                |r| Ok((r.get(0)?, r.get(1usize)?, r.get(2usize)?, r.get(3usize)?)),
            )
            .unwrap();
        assert_eq!((i, s.as_str(), n, b), (7, "x", None, vec![1, 2]));
        assert!(matches!(
            c.query_row("SELECT 1 WHERE 0", [], |r| r.get::<_, i64>(0)),
            Err(DbError::NoRows)
        ));
    }
}
