//! No account waits on another's writers (issue 46, item 4): on PostgreSQL a write transaction
//! of one account takes that account's lock (and the store's shared), so one account's upload
//! stuck mid-way holds up that account's next writes only; what spans accounts (a writer of the
//! whole store) still holds up everyone; and the bytes accounts share stay whole when one lets
//! go of them while another stores them again, each under its own account's lock.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use vaultfs::store::db::{Conn, Engine, Writers};

use super::{Cluster, client, common, md5hex, pattern, put, upload, vault};
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

/// `db::Writers::Account`'s first key ("vfa1").
const ACCOUNT_LOCK_CLASS: i64 = 0x7666_6131;

fn beta() -> NodePath {
    NodePath::parse_uri("/nodes/pth/Beta/My First Vault").unwrap()
}

/// The three upload steps in `folder`; the file's ID.
async fn put_in<B: Backend>(b: &B, folder: &NodePath, name: &str, data: bytes::Bytes) -> String {
    let id = b
        .create_file(folder, name)
        .await
        .unwrap()
        .file_id()
        .unwrap();
    assert_eq!(upload(b, &id, data.clone()).await, md5hex(&data));
    id
}

fn account_id(conn: &Conn, name: &str) -> i64 {
    conn.query_row(
        "SELECT id FROM nodes WHERE parent_id IS NULL AND name = ?1",
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

/// A write transaction of `writers` held open on a connection of its own (what a writer of the
/// whole store, a delete say, holds while it runs), until the returned sender is sent to or
/// dropped; then it commits.
fn hold(database: &str, writers: Writers) -> mpsc::Sender<()> {
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let database = database.to_string();
    std::thread::spawn(move || {
        let conn = Engine::Postgres(database).connect().unwrap();
        let tx = conn.transaction_for(writers).unwrap();
        held_tx.send(()).unwrap();
        let _ = release_rx.recv();
        tx.commit().unwrap();
    });
    held_rx.recv().unwrap();
    release_tx
}

/// The key of [`Gate`]'s advisory lock.
const GATE: i64 = 0x6761_7465; // "gate"

/// A test hook in the database: while the gate is held (`GATE`'s advisory lock, by this value's
/// connection), a change row of `account` of `kind` (1: a new version, 0: created) waits for it
/// (a trigger), inside the transaction that logs it: an upload stuck mid-way, after its writes
/// and before its commit, holding what the store's own code took. Dropped, the gate opens.
struct Gate {
    conn: Conn,
}

impl Gate {
    fn new(database: &str, account: i64, kind: i64) -> Gate {
        let conn = Engine::Postgres(database.to_string()).connect().unwrap();
        conn.execute_batch(&format!(
            "CREATE OR REPLACE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                 IF NEW.account_id = {account} AND NEW.kind = {kind} THEN
                     PERFORM pg_advisory_xact_lock_shared({GATE});
                 END IF;
                 RETURN NEW;
             END $$;
             DROP TRIGGER IF EXISTS test_gate ON changes;
             CREATE TRIGGER test_gate BEFORE INSERT ON changes
                 FOR EACH ROW EXECUTE FUNCTION test_gate();
             SELECT pg_advisory_lock({GATE})"
        ))
        .unwrap();
        Gate { conn }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.conn
            .execute_batch(&format!(
                "SELECT pg_advisory_unlock({GATE}); DROP TRIGGER test_gate ON changes"
            ))
            .unwrap();
    }
}

/// The advisory locks waited for now: (first key, second key) of two-key ones (an account's
/// writers', a blob's), (high, low 32 bits) of one-key ones (the store's writers', the gate's).
fn waits(conn: &Conn) -> Vec<(i64, i64)> {
    conn.prepare(
        "SELECT CAST(classid AS BIGINT), CAST(objid AS BIGINT)
         FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
         ORDER BY 1, 2",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Until `n` wait for advisory locks (at most 20 s): what they wait for.
fn until_waiting(conn: &Conn, n: usize) -> Vec<(i64, i64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = waits(conn);
        if w.len() >= n || Instant::now() > deadline {
            return w;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Committed versions whose bytes have no row (their blob freed under them).
fn unrecorded_versions(conn: &Conn) -> i64 {
    conn.query_row(
        "SELECT count(*) FROM versions v WHERE v.committed = 1 AND v.blob IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.hash = v.blob)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// Account Acme's upload stuck mid-way (its step 3's transaction open after its writes, at its
/// change row): Acme's next write, a step 1, waits for Acme's writers' lock (and nothing else
/// waits, says `pg_locks`) while Beta's uploads, on the same server, complete; let go, Acme's
/// complete too. A transaction of the whole store held open holds up Beta as well.
#[tokio::test(flavor = "multi_thread")]
async fn an_accounts_stuck_upload_holds_up_that_account_only() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    cluster.add_user("a@acme.test", "Acme", "pw-a");
    cluster.add_user("b@beta.test", "Beta", "pw-b");
    let server = cluster.serve("one");
    let ta = common::login(&server.base(), "a@acme.test", "pw-a").await;
    let tb = common::login(&server.base(), "b@beta.test", "pw-b").await;
    let (a, b) = (
        client(&server, "a@acme.test", &ta),
        client(&server, "b@beta.test", &tb),
    );
    put(&a, "warm.bin", pattern(1000, 1)).await;
    put_in(&b, &beta(), "warm.bin", pattern(1000, 2)).await;
    let watch = Engine::Postgres(cluster.database.clone())
        .connect()
        .unwrap();
    let acme = account_id(&watch, "Acme");
    let acme_lock = (ACCOUNT_LOCK_CLASS, acme ^ (acme >> 32));
    let gate_lock = (GATE >> 32, GATE & 0xffff_ffff);

    // Acme's step 1 and 2 done; its step 3 stuck at its change row.
    let id = a
        .create_file(&vault(), "stuck.bin")
        .await
        .unwrap()
        .file_id()
        .unwrap();
    let gate = Gate::new(&cluster.database, acme, 1);
    let stuck = pattern(50_000, 3);
    let a3 = tokio::spawn({
        let (a, stuck) = (a.clone(), stuck.clone());
        async move { upload(&a, &id, stuck).await }
    });
    let w = tokio::task::block_in_place(|| until_waiting(&watch, 1));
    assert_eq!(w, [gate_lock], "Acme's step 3 is stuck at the gate");
    let a1 = tokio::spawn({
        let a = a.clone();
        async move { a.create_file(&vault(), "later.bin").await }
    });
    let w = tokio::task::block_in_place(|| until_waiting(&watch, 2));
    assert_eq!(
        w,
        [gate_lock, acme_lock],
        "Acme's step 1 waits for Acme's lock"
    );

    // Beta's uploads meanwhile: every step, on the same server (its own queue of step 3s).
    for i in 0..3u8 {
        let data = pattern(40_000, 10 + i);
        let done = tokio::time::timeout(
            Duration::from_secs(20),
            put_in(&b, &beta(), &format!("beside{i}.bin"), data),
        )
        .await;
        assert!(done.is_ok(), "Beta's upload {i} waited for Acme's writers");
    }
    let w = tokio::task::block_in_place(|| waits(&watch));
    assert_eq!(w, [gate_lock, acme_lock], "nobody else waits");
    assert!(!a3.is_finished() && !a1.is_finished(), "Acme's writes wait");

    tokio::task::block_in_place(|| drop(gate));
    let md5 = tokio::time::timeout(Duration::from_secs(20), a3)
        .await
        .expect("Acme's step 3 once the gate opens")
        .unwrap();
    assert_eq!(md5, md5hex(&stuck));
    tokio::time::timeout(Duration::from_secs(20), a1)
        .await
        .expect("Acme's step 1 once Acme's step 3 committed")
        .unwrap()
        .unwrap();

    // A writer of the whole store still excludes every account's.
    let release = hold(&cluster.database, Writers::Store);
    let b1 = tokio::spawn({
        let b = b.clone();
        async move { put_in(&b, &beta(), "after.bin", pattern(1000, 4)).await }
    });
    let w = tokio::task::block_in_place(|| until_waiting(&watch, 1));
    assert!(
        !w.is_empty() && w.iter().all(|&(k, _)| k != ACCOUNT_LOCK_CLASS),
        "Beta waits for the store's writer: {w:?}"
    );
    assert!(!b1.is_finished());
    release.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), b1)
        .await
        .expect("Beta's upload once the store's writer is done")
        .unwrap();
    let problems = cluster.store().check_integrity().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// Accounts share bytes (blobs by sha256), and their writers run side by side: Beta's step 3
/// stores bytes Acme has, and is stuck mid-way (its version written, not committed) while
/// Acme's next version lets go of those bytes (no earlier version kept). The blob's own lock
/// orders the two: Acme's let-go waits for Beta's commit, sees Beta's version and keeps the
/// bytes. Beta's file reads back whole, every committed version's bytes are recorded, and the
/// store's check finds every blob in place.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_one_account_lets_go_while_another_stores_them_are_kept() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    cluster.add_user("a@acme.test", "Acme", "pw-a");
    cluster.add_user("b@beta.test", "Beta", "pw-b");
    let final_versions = ["--keep-versions", "0", "--keep-versions-days", "0"];
    let one = cluster.serve_with("one", common::free_port(), &final_versions);
    let two = cluster.serve_with("two", common::free_port(), &final_versions);
    let ta = common::login(&one.base(), "a@acme.test", "pw-a").await;
    let tb = common::login(&two.base(), "b@beta.test", "pw-b").await;
    let (a, b) = (
        client(&one, "a@acme.test", &ta),
        client(&two, "b@beta.test", &tb),
    );
    let watch = Engine::Postgres(cluster.database.clone())
        .connect()
        .unwrap();
    let beta_id = account_id(&watch, "Beta");
    let shared = pattern(60_000, 5);
    let file = put(&a, "churn.bin", shared.clone()).await;
    let new = b
        .create_file(&beta(), "same.bin")
        .await
        .unwrap()
        .file_id()
        .unwrap();

    let gate = Gate::new(&cluster.database, beta_id, 1);
    let b3 = tokio::spawn({
        let (b, shared) = (b.clone(), shared.clone());
        async move { upload(&b, &new, shared).await }
    });
    tokio::task::block_in_place(|| until_waiting(&watch, 1));
    // Acme's next version, which lets go of `shared`, beside Beta's stuck commit.
    let a3 = tokio::spawn({
        let a = a.clone();
        async move { upload(&a, &file, pattern(1000, 6)).await }
    });
    // Its commit meets Beta's (it waits for the blob's lock; without it, it would be done).
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| drop(gate));
    let stored = tokio::time::timeout(Duration::from_secs(20), b3)
        .await
        .expect("Beta's step 3 once the gate opens")
        .unwrap();
    assert_eq!(stored, md5hex(&shared));
    tokio::time::timeout(Duration::from_secs(20), a3)
        .await
        .expect("Acme's next version")
        .unwrap();
    let id = b
        .create_file(&beta(), "same.bin")
        .await
        .unwrap()
        .file_id()
        .unwrap();
    assert_eq!(common::content(&b, &id).await, shared);
    assert_eq!(
        unrecorded_versions(&watch),
        0,
        "a version's bytes unrecorded"
    );
    let problems = cluster.store().check_integrity().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
