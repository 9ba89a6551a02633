//! The store's PostgreSQL connection as the store uses it: statements on the calling thread,
//! whatever runtime that thread belongs to, and transactions that cannot pass for committed when
//! they were not.

use vaultfs::store::db::{Conn, Engine};

/// A connection to a new database with an empty table `t` (`None` without PostgreSQL).
fn with_table() -> Option<Conn> {
    let conn = Engine::Postgres(crate::common::pg::pg()?.database())
        .connect()
        .unwrap();
    conn.execute_batch("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        .unwrap();
    Some(conn)
}

fn count(conn: &Conn) -> i64 {
    conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

/// A statement failed inside a transaction: PostgreSQL answers the COMMIT with a rollback, not
/// an error. It must come back as an error (a group commit of uploads takes a commit to mean
/// they are stored), and the connection must serve the next transaction.
#[test]
fn a_commit_after_a_failed_statement_is_an_error_and_writes_nothing() {
    let Some(conn) = with_table() else {
        return;
    };
    let tx = conn.unordered_transaction().unwrap();
    tx.execute("INSERT INTO t (id) VALUES (1)", []).unwrap();
    let dup = tx.execute("INSERT INTO t (id) VALUES (1)", []);
    assert!(dup.is_err(), "a duplicate key: {dup:?}");
    let committed = tx.commit();
    assert!(committed.is_err(), "the COMMIT: {committed:?}");
    assert_eq!(count(&conn), 0, "nothing of the failed transaction");

    let tx = conn.unordered_transaction().unwrap();
    tx.execute("INSERT INTO t (id) VALUES (2)", []).unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&conn), 1, "the next transaction committed");
}

/// A connection used, and dropped, on the thread of a current-thread runtime (a test's, or
/// anything of the store called from async code): the client's own runtime may not be entered
/// there, so the statements go through another thread, and nothing panics.
#[tokio::test]
async fn statements_run_from_a_runtime_thread_and_the_connection_drops_there() {
    let Some(conn) = with_table() else {
        return;
    };
    conn.execute("INSERT INTO t (id) VALUES (1), (2)", [])
        .unwrap();
    assert_eq!(count(&conn), 2);
    drop(conn);
}

/// The same on a worker of a multi-thread runtime (the server's, the mount's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_run_from_a_worker_of_a_multi_thread_runtime() {
    let Some(conn) = with_table() else {
        return;
    };
    conn.execute("INSERT INTO t (id) VALUES (1)", []).unwrap();
    let conn = tokio::task::spawn_blocking(move || {
        assert_eq!(count(&conn), 1, "from a blocking thread");
        conn
    })
    .await
    .unwrap();
    assert_eq!(count(&conn), 1);
    drop(conn);
}
