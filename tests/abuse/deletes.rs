//! Deletes of large trees (item 12): detached at once and purged in chunks while other accounts
//! are served, and a purge cut short resumed after a restart.

use std::time::Duration;

use super::{call, client_from, mkdir, new_file, serve};
use crate::common;
use crate::common::TestServer;

/// Upload steps 2 and 3 of `data` to the file `id` as `who`.
async fn upload_to(s: &TestServer, who: &common::Creds, id: &str, data: &[u8]) {
    common::upload_version(&client_from("127.0.0.1"), &s.base, who, id, data).await;
}

/// A tree of 6 x 2^`doublings` nodes at `<vault>/<name>` of `who`'s vault `v` (encoded) and
/// `plain` (decoded): a folder with two folders and three files of their own bytes, doubled by
/// copy beside and move in (as the quota test does).
async fn big_tree(
    s: &TestServer,
    who: &common::Creds,
    (v, plain): (&str, &str),
    name: &str,
    doublings: u32,
) {
    use reqwest::Method;
    for folder in [name.to_string(), format!("{name}/a"), format!("{name}/b")] {
        assert_eq!(
            mkdir(s, who, &format!("{v}/{folder}")).await,
            (200, "ok".into())
        );
    }
    for i in 0..3 {
        let id = new_file(s, who, &format!("{v}/{name}"), &format!("f{i}.txt")).await;
        upload_to(s, who, &id, format!("{name} {i}").as_bytes()).await;
    }
    for i in 0..doublings {
        let body =
            |how: &str, to: String| serde_json::json!({how: {"dst_uri": to, "replace": "fail"}});
        let copy = body("copy", format!("{plain}/{name}-c"));
        let r = call(s, who, Method::POST, &format!("{v}/{name}"), copy).await;
        assert_eq!(r, (200, "ok".into()));
        let moved = body("move", format!("{plain}/{name}/c{i}"));
        let r = call(s, who, Method::POST, &format!("{v}/{name}-c"), moved).await;
        assert_eq!(r, (200, "ok".into()));
    }
}

/// Requests of another account in a loop until `done`: a listing, a new folder, and an upload
/// (step 1, then steps 2 and 3). The slowest one's latency, and how many were made.
async fn probe_until(
    s: &TestServer,
    who: &common::Creds,
    v: &str,
    tag: &str,
    done: impl Fn() -> bool,
) -> (Duration, usize) {
    use std::time::Instant;
    let mut worst = Duration::ZERO;
    let mut n = 0;
    let mut timed = |what: &str, started: Instant| {
        let took = started.elapsed();
        if took > worst {
            eprintln!("{tag}: {what} took {took:?}");
            worst = took;
        }
    };
    let mut i = 0;
    while !done() {
        let t = Instant::now();
        let r = client_from("127.0.0.1")
            .get(s.url(&format!("{v}?children=1")))
            .basic_auth(&who.email, Some(&who.token))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        timed("a listing", t);
        let t = Instant::now();
        assert_eq!(
            mkdir(s, who, &format!("{v}/{tag}{i}")).await,
            (200, "ok".into())
        );
        timed("a new folder", t);
        let t = Instant::now();
        let id = new_file(s, who, v, &format!("{tag}{i}.txt")).await;
        timed("upload step 1", t);
        let t = Instant::now();
        upload_to(s, who, &id, format!("{tag} {i}").as_bytes()).await;
        timed("upload steps 2 and 3", t);
        i += 1;
        n += 5;
    }
    (worst, n)
}

/// Deleting a tree of 98,304 nodes (item 12): the request only detaches it (its name is gone
/// when it returns) and the store purges it in chunks of a bounded size, releasing its lock
/// between them, so another account's listings, folders and uploads answer throughout. The
/// baseline, measured first: the same delete in one transaction (as every delete was before),
/// rolled back. At the end nothing of the tree is left: no node, no version, no blob of its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_delete_does_not_stop_other_accounts() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let s = TestServer::start_with(
        vaultfs::store::StoreConfig {
            max_nodes_per_request: 100_000,
            ..Default::default()
        },
        Default::default(),
    )
    .await;
    let alice = s.user("alice@example.com", "Acme").await;
    let bob = s.user("bob@example.com", "Bobco").await;
    let (v, plain) = (
        "/nodes/pth/Acme/My%20First%20Vault",
        "/nodes/pth/Acme/My First Vault",
    );
    let bv = "/nodes/pth/Bobco/My%20First%20Vault";
    let started = Instant::now();
    big_tree(&s, &alice, (v, plain), "t", 14).await;
    eprintln!("98,304 nodes made in {:?}", started.elapsed());
    let conn = rusqlite::Connection::open(s.dir.join("vault.db")).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let acme = "(SELECT id FROM nodes WHERE name = 'Acme' AND parent_id IS NULL)";
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM nodes WHERE account_id = {acme}"
        )),
        2 + (6 << 14)
    );

    // The baseline: the tree deleted in one transaction (then rolled back), as before.
    let account = s
        .store
        .authenticate(&alice.email, &alice.token)
        .unwrap()
        .account_id;
    let done = Arc::new(AtomicBool::new(false));
    let deleting = {
        let (store, done) = (s.store.clone(), done.clone());
        let path = vaultfs::api::NodePath::parse_uri(&format!("{plain}/t")).unwrap();
        tokio::task::spawn_blocking(move || {
            // Another account's requests are under way when it starts.
            std::thread::sleep(Duration::from_millis(100));
            let held = store
                .delete_in_one_transaction_rolled_back(
                    vaultfs::store::Scope::Account(account),
                    &path,
                )
                .unwrap();
            done.store(true, Ordering::SeqCst);
            held
        })
    };
    let (baseline, n) = probe_until(&s, &bob, bv, "a", || done.load(Ordering::SeqCst)).await;
    let held = deleting.await.unwrap();
    eprintln!(
        "in one transaction: the lock held {held:?}; {n} requests of another account, the \
         slowest {baseline:?}"
    );

    // Bounded: the request returns at once; the purge runs while the other account works.
    let t = Instant::now();
    let r = call(
        &s,
        &alice,
        reqwest::Method::DELETE,
        &format!("{v}/t"),
        serde_json::json!({}),
    )
    .await;
    let request = t.elapsed();
    assert_eq!(r, (200, "ok".into()));
    let gone = client_from("127.0.0.1")
        .get(s.url(&format!("{v}/t")))
        .basic_auth(&alice.email, Some(&alice.token))
        .send()
        .await
        .unwrap();
    assert_eq!(
        gone.status(),
        404,
        "the name is gone when the delete returns"
    );
    let purging = {
        let store = s.store.clone();
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            assert!(store.wait_purged(Duration::from_secs(120)), "not purged");
            t.elapsed()
        })
    };
    let (worst, n) = probe_until(&s, &bob, bv, "b", || purging.is_finished()).await;
    let purge = purging.await.unwrap();
    let stats = s.store.purge_stats().unwrap();
    eprintln!(
        "bounded: the request took {request:?}, the purge {purge:?} in {} chunks (the longest \
         {:?}); {n} requests of another account, the slowest {worst:?}",
        stats.chunks, stats.longest_chunk
    );
    assert!(stats.chunks >= 90, "{stats:?}");
    assert_eq!(stats.trees, 0);
    assert!(n >= 20, "too few requests to tell");
    assert!(
        worst < Duration::from_secs(1),
        "a request waited {worst:?} during the purge"
    );
    assert!(
        worst * 2 < held,
        "the slowest request during the purge ({worst:?}) against a lock held {held:?} in one \
         transaction"
    );
    // Nothing of the tree is left; its own bytes went with it.
    assert_eq!(count("SELECT count(*) FROM trash"), 0);
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM nodes WHERE account_id = {acme}"
        )),
        2,
        "the account and its vault"
    );
    assert_eq!(
        count("SELECT count(*) FROM nodes WHERE parent_id IS NULL AND kind <> 0"),
        0
    );
    // Bob's files are the only ones left, each with bytes of its own.
    let files = count("SELECT count(*) FROM nodes WHERE kind = 3");
    assert_eq!(count("SELECT count(*) FROM blobs"), files);
    assert_eq!(s.store.blob_count().unwrap() as i64, files);
    assert!(s.store.check_integrity().unwrap().is_empty());
}

/// A purge cut short by killing the server (SIGKILL, mid-purge) resumes when the server starts
/// again, and ends with nothing of the tree left: no node, no version, no blob row or file of
/// its own, every count right; what was not deleted is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_purge_resumes_after_a_restart() {
    use std::time::Instant;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let (v, plain) = (
        "/nodes/pth/Acme/My%20First%20Vault",
        "/nodes/pth/Acme/My First Vault",
    );
    // A tree of 49,152 nodes, and a file beside it.
    {
        let config = vaultfs::store::StoreConfig {
            max_nodes_per_request: 100_000,
            ..Default::default()
        };
        let s = TestServer::start_in(&dir, config, Default::default()).await;
        let alice = s.user("alice@example.com", "Acme").await;
        big_tree(&s, &alice, (v, plain), "t", 13).await;
        let id = new_file(&s, &alice, v, "kept.txt").await;
        upload_to(&s, &alice, &id, b"kept").await;
        let store = s.store.clone();
        s.stop().await;
        // The last reference: the store closes.
        drop(store);
    }
    let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let nodes = "SELECT count(*) FROM nodes";
    let before = count(nodes);

    // A real server deletes it, and is killed while it purges (one that keeps no deleted
    // files: else the tree is kept whole, restorable, and nothing is purged).
    let port = common::free_port();
    let mut server = super::serve_with(&dir, port, 1, &["--keep-versions-days", "0"]);
    let base = format!("http://127.0.0.1:{port}");
    let token = common::login(&base, "alice@example.com", "pw-alice@example.com").await;
    let r = client_from("127.0.0.1")
        .delete(format!("{base}{v}/t"))
        .basic_auth("alice@example.com", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(nodes) > before - 5000 {
        assert!(Instant::now() < deadline, "the purge made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    server.kill().unwrap();
    server.wait().unwrap();
    let left = count(nodes);
    println!("killed with {left} of {before} nodes left");
    assert_eq!(
        count("SELECT count(*) FROM trash"),
        1,
        "killed after the purge"
    );
    assert!(left > 2000, "killed too late to tell: {left} nodes left");

    // Started again, it resumes where it was.
    let mut server = serve(&dir, port, 2);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("SELECT count(*) FROM trash") > 0 {
        assert!(Instant::now() < deadline, "the purge did not resume");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = client_from("127.0.0.1")
        .get(format!("{base}{v}?children=1"))
        .basic_auth("alice@example.com", Some(&token))
        .send()
        .await
        .unwrap();
    let listing: serde_json::Value = r.json().await.unwrap();
    assert_eq!(listing["message"]["total_children"], 1, "{listing}");
    // The purge says so once it finds nothing more to do, a pause after its last step.
    let log_path = tmp.path().join("serve-2.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut log = String::new();
    while !log.contains("deleted trees purged") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        log = std::fs::read_to_string(&log_path).unwrap();
    }
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(log.contains("deleted trees purged"), "{log}");

    // Nothing of the tree is left; the file beside it is whole.
    assert_eq!(
        count(nodes),
        3,
        "the account, its vault, kept.txt, and nothing else"
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM versions v WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = v.file_id)"
        ),
        0
    );
    assert_eq!(count("SELECT count(*) FROM blobs"), 1);
    drop(conn);
    let store = vaultfs::store::Store::open(&dir, Default::default()).unwrap();
    assert_eq!(
        store.blob_count().unwrap(),
        1,
        "blob files of the tree left"
    );
    assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
    let (_, file) = store
        .open_file(vaultfs::store::Scope::All, &{
            let c = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
            c.query_row("SELECT id FROM nodes WHERE name = 'kept.txt'", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
            .to_string()
        })
        .unwrap();
    let mut kept = String::new();
    std::io::Read::read_to_string(&mut file.unwrap(), &mut kept).unwrap();
    assert_eq!(kept, "kept");
}
