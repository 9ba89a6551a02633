//! `GET /changes`, the change feed: a long poll answers as soon as a change is committed
//! through another connection, each kind with its paths; the cursor goes on without loss or
//! repeat; a cursor too old (or not of this server) is told to reset; another account's
//! changes never show; waiters cost nothing while idle; a user's waits are bounded.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use vaultfs::server::ServerOptions;
use vaultfs::store::StoreConfig;

use crate::common::{self, TestServer};
use crate::{Api, VAULT, assert_error};

const VAULT_URI: &str = "/nodes/pth/Acme/My First Vault";

/// The cursor to follow from.
async fn head(api: &Api) -> u64 {
    let (st, v) = api.get("/changes").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["changes"], json!([]), "{v}");
    v["message"]["cursor"].as_u64().unwrap()
}

async fn poll(api: &Api, cursor: u64, wait: u64) -> Value {
    let (st, v) = api
        .get(&format!("/changes?cursor={cursor}&wait={wait}"))
        .await;
    assert_eq!(st, 200, "{v}");
    v["message"].clone()
}

/// (kind, nodeType, uri, from_uri) of each change of a page.
fn summary(page: &Value) -> Vec<(String, String, String, Option<String>)> {
    page["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_string(),
                c["nodeType"].as_str().unwrap().to_string(),
                c["uri"].as_str().unwrap().to_string(),
                c["from_uri"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn change(
    kind: &str,
    folder: bool,
    rel: &str,
    from: Option<&str>,
) -> (String, String, String, Option<String>) {
    let node_type = if folder {
        "FolderNodeType"
    } else {
        "FileNodeType"
    };
    (
        kind.to_string(),
        node_type.to_string(),
        format!("{VAULT_URI}/{rel}"),
        from.map(|f| format!("{VAULT_URI}/{f}")),
    )
}

/// A long poll from `cursor` is waiting when `act` runs on another connection; it answers
/// within 100 ms of `act` returning, with exactly `want`. The next cursor.
async fn wakes_with(
    s: &TestServer,
    api: &Api,
    cursor: u64,
    want: Vec<(String, String, String, Option<String>)>,
    act: impl std::future::Future<Output = ()>,
) -> u64 {
    let poller = Api {
        http: reqwest::Client::new(),
        base: s.base.clone(),
        creds: api.creds.clone(),
    };
    let waiting = tokio::spawn(async move {
        let page = poll(&poller, cursor, 30).await;
        (page, Instant::now())
    });
    // The poll is asleep by then (it reads the log once, in a millisecond).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the poll answered before any change"
    );
    act.await;
    let done = Instant::now();
    let (page, answered) = waiting.await.unwrap();
    let late = answered.saturating_duration_since(done);
    eprintln!("{:?} answered {late:?} after the change", want[0].0);
    assert!(
        late < Duration::from_millis(100),
        "answered {late:?} after the change"
    );
    assert_eq!(summary(&page), want, "{page}");
    assert_eq!(page["reset"], false);
    let next = page["cursor"].as_u64().unwrap();
    assert!(next > cursor);
    // Nothing else is waiting past it.
    assert_eq!(poll(api, next, 0).await["changes"], json!([]));
    next
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_change_wakes_a_long_poll_at_once_with_its_paths() {
    let s = TestServer::start().await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    let mut c = head(&api).await;
    assert_eq!(poll(&api, c, 0).await["changes"], json!([]));

    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("created", true, "docs", None)],
        async {
            assert_eq!(
                api.call(Method::PUT, &format!("{VAULT}/docs"), Some(json!({})))
                    .await
                    .0,
                200
            );
        },
    )
    .await;
    let mut id = String::new();
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("created", false, "docs/a.txt", None)],
        async {
            id = api.create_file(&format!("{VAULT}/docs"), "a.txt").await;
        },
    )
    .await;
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("version", false, "docs/a.txt", None)],
        async {
            api.put_version(&id, b"first").await;
        },
    )
    .await;
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("attributes", false, "docs/a.txt", None)],
        async {
            let (st, v) = api
                .call(
                    Method::PUT,
                    &format!("/nodes/upload/{id}"),
                    Some(json!({"modifiedOn": "2001-02-03T04:05:06Z"})),
                )
                .await;
            assert_eq!(st, 200, "{v}");
        },
    )
    .await;
    let transfer = |src: &str, key: &str, dst: &str| {
        let (api, src, dst, key) = (&api, src.to_string(), dst.to_string(), key.to_string());
        async move {
            let body = json!({ key: {"dst_uri": format!("{VAULT_URI}/{dst}"), "replace": "fail"} });
            let (st, v) = api
                .call(Method::POST, &format!("{VAULT}/{src}"), Some(body))
                .await;
            assert_eq!(st, 200, "{v}");
        }
    };
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("copied", true, "copy", Some("docs"))],
        transfer("docs", "copy", "copy"),
    )
    .await;
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("moved", false, "b.txt", Some("docs/a.txt"))],
        transfer("docs/a.txt", "move", "b.txt"),
    )
    .await;
    // A folder's delete is one change, whatever it holds.
    c = wakes_with(
        &s,
        &api,
        c,
        vec![change("deleted", true, "copy", None)],
        async {
            assert_eq!(
                api.call(Method::DELETE, &format!("{VAULT}/copy"), None)
                    .await
                    .0,
                200
            );
        },
    )
    .await;
    // A whole upload: its two changes, read on from the cursor, neither lost nor repeated.
    common::upload(&api.http, &s.base, &alice, VAULT, "c.txt", b"bytes").await;
    let page = poll(&api, c, 0).await;
    assert_eq!(
        summary(&page),
        vec![
            change("created", false, "c.txt", None),
            change("version", false, "c.txt", None)
        ]
    );
    let ids: Vec<&Value> = page["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert!(ids[0].is_string() && ids[0] == ids[1], "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cursor_goes_on_in_pages_without_loss_or_repeat() {
    let s = TestServer::start().await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    let start = head(&api).await;
    for i in 0..25 {
        let (st, _) = api
            .call(Method::PUT, &format!("{VAULT}/f{i:02}"), Some(json!({})))
            .await;
        assert_eq!(st, 200);
    }
    let mut seen = Vec::new();
    let mut cursor = start;
    loop {
        let (st, v) = api.get(&format!("/changes?cursor={cursor}&limit=7")).await;
        assert_eq!(st, 200);
        let page = &v["message"];
        let got = summary(page);
        assert!(got.len() <= 7);
        seen.extend(got.into_iter().map(|c| c.2));
        cursor = page["cursor"].as_u64().unwrap();
        if page["more"] == false {
            break;
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("{VAULT_URI}/f{i:02}")).collect();
    assert_eq!(seen, want);
    assert_eq!(cursor, head(&api).await);
    // Bad parameters.
    for q in [
        "cursor=x",
        "cursor=1&wait=56",
        "cursor=1&limit=0",
        "cursor=1&limit=1001",
    ] {
        assert_error(
            &api.get(&format!("/changes?{q}")).await,
            400,
            "bad_parameter",
        );
    }
    assert_error(
        &crate::Api::anonymous(&s).get("/changes").await,
        401,
        "invalid_token",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cursor_past_the_kept_log_or_not_of_this_server_is_told_to_reset() {
    let s = TestServer::start_with(
        StoreConfig {
            change_log_entries: 10,
            ..StoreConfig::default()
        },
        ServerOptions::default(),
    )
    .await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    let old = head(&api).await;
    for i in 0..200 {
        let (st, _) = api
            .call(Method::PUT, &format!("{VAULT}/f{i:03}"), Some(json!({})))
            .await;
        assert_eq!(st, 200);
    }
    let now = head(&api).await;
    let page = poll(&api, old, 30).await;
    assert_eq!(page["reset"], true, "{page}");
    assert_eq!(page["changes"], json!([]));
    assert_eq!(page["cursor"].as_u64().unwrap(), now);
    // From the cursor it gave: only what comes next.
    assert_eq!(poll(&api, now, 0).await["changes"], json!([]));
    // The last changes kept are still read from a cursor among them.
    let recent = poll(&api, now - 5, 0).await;
    assert_eq!(recent["reset"], false, "{recent}");
    assert_eq!(recent["changes"].as_array().unwrap().len(), 5);
    // A cursor this server never gave (another server's, a database restored from a backup).
    let future = poll(&api, now + 1000, 30).await;
    assert_eq!(
        (future["reset"].clone(), future["cursor"].as_u64()),
        (json!(true), Some(now))
    );
    // The log stays bounded: the last 10 entries and at most a pruning round more.
    let rows = s.store.change_log_rows().unwrap();
    assert!((10..10 + 64).contains(&rows), "{rows} rows kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_accounts_changes_never_show() {
    let s = TestServer::start().await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Bobco").await);
    let (a0, b0) = (head(&alice).await, head(&bob).await);
    let waiting = {
        let alice = Api {
            http: reqwest::Client::new(),
            base: s.base.clone(),
            creds: alice.creds.clone(),
        };
        tokio::spawn(async move { poll(&alice, a0, 2).await })
    };
    for i in 0..5 {
        let (st, _) = bob
            .call(
                Method::PUT,
                &format!("/nodes/pth/Bobco/My%20First%20Vault/b{i}"),
                Some(json!({})),
            )
            .await;
        assert_eq!(st, 200);
    }
    // Alice's poll sleeps through Bob's changes and ends empty, on her cursor.
    let page = waiting.await.unwrap();
    assert_eq!(
        (page["changes"].clone(), page["cursor"].as_u64()),
        (json!([]), Some(a0))
    );
    let theirs = poll(&bob, b0, 0).await;
    assert_eq!(theirs["changes"].as_array().unwrap().len(), 5);
    assert!(
        summary(&theirs)
            .iter()
            .all(|c| c.2.starts_with("/nodes/pth/Bobco/"))
    );
    // Bob's cursors read nothing of Alice's account either.
    let (st, _) = alice
        .call(Method::PUT, &format!("{VAULT}/mine"), Some(json!({})))
        .await;
    assert_eq!(st, 200);
    let after = theirs["cursor"].as_u64().unwrap();
    assert_eq!(poll(&bob, after, 0).await["changes"], json!([]));
    let mine = poll(&alice, a0, 0).await;
    assert_eq!(summary(&mine), vec![change("created", true, "mine", None)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_holds_a_bounded_number_of_long_polls() {
    let s = TestServer::start_with(
        StoreConfig::default(),
        ServerOptions {
            max_waits_per_user: 2,
            ..ServerOptions::default()
        },
    )
    .await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Bobco").await);
    let c = head(&alice).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let a = Api {
            http: reqwest::Client::new(),
            base: s.base.clone(),
            creds: alice.creds.clone(),
        };
        held.push(tokio::spawn(async move { poll(&a, c, 20).await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = alice
        .req(Method::GET, &format!("/changes?cursor={c}&wait=20"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["retry-after"], "2");
    let st = resp.status();
    assert_error(&(st, resp.json().await.unwrap()), 503, "too_many_waits");
    // A page read at once needs no slot; another user has slots of their own.
    assert_eq!(poll(&alice, c, 0).await["changes"], json!([]));
    let b = head(&bob).await;
    let (st, _) = bob.get(&format!("/changes?cursor={b}&wait=1")).await;
    assert_eq!(st, 200);
    // A change ends the waits, and their slots come back.
    let (st, _) = alice
        .call(Method::PUT, &format!("{VAULT}/x"), Some(json!({})))
        .await;
    assert_eq!(st, 200);
    for h in held {
        assert_eq!(h.await.unwrap()["changes"].as_array().unwrap().len(), 1);
    }
    assert_eq!(
        poll(&alice, c, 1).await["changes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A real `vaultfs serve` holding 20 long polls for 10 s uses next to no CPU: the waits sleep
/// on the store's wake-ups, nothing polls.
#[tokio::test(flavor = "multi_thread")]
async fn idle_long_polls_cost_nothing() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut add = Command::new(BIN)
        .args(["user", "add", "alice@example.com", "--account", "Acme"])
        .env("VAULTFS_DATA_DIR", &data)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    add.stdin.take().unwrap().write_all(b"pw-alice\n").unwrap();
    assert!(add.wait().unwrap().success());
    let port = common::free_port();
    let mut server = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--preview-workers", "1", "--max-waits-per-user", "32"])
        .env("VAULTFS_DATA_DIR", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_port(port);
    let base = format!("http://127.0.0.1:{port}");
    let creds = common::Creds {
        email: "alice@example.com".into(),
        token: common::login(&base, "alice@example.com", "pw-alice").await,
    };
    let polls = common::long_polls(&base, &creds, 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = common::cpu_time(server.id());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let used = common::cpu_time(server.id()) - before;
    eprintln!("20 long polls held 10 s: {used:?} of the server's CPU");
    assert!(
        polls.iter().all(|p| !p.is_finished()),
        "a poll answered with nothing changed"
    );
    assert!(
        used <= Duration::from_millis(50),
        "{used:?} of CPU in 10 s idle"
    );
    // And they all wake on one change.
    let api = Api {
        http: reqwest::Client::new(),
        base: base.clone(),
        creds: Some(creds),
    };
    let (st, _) = api
        .call(Method::PUT, &format!("{VAULT}/x"), Some(json!({})))
        .await;
    assert_eq!(st, 200);
    for p in polls {
        let page = tokio::time::timeout(Duration::from_secs(2), p)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page["message"]["changes"].as_array().unwrap().len(), 1);
    }
    let _ = server.kill();
    let _ = server.wait();
}
