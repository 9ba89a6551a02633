//! Hostile clients against `vaultfs serve` (issue 19, items 5 to 13): connections held open for
//! nothing, raced and aimed lockouts, pins, other accounts' IDs, the authorization page, quotas.
//! Everything runs on loopback; sources are told apart by their address (127.0.0.1, .2, ...).
//! Stalls are measured by what still answers, not by wall time.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use vaultfs::server::ServerOptions;

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

fn addr_of(base: &str) -> SocketAddr {
    base.trim_start_matches("http://").parse().unwrap()
}

/// A TCP connection to `server` from the loopback address `from` (127.0.0.x).
async fn connect_from(from: &str, server: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    sock.connect(server).await.unwrap()
}

/// An HTTP client whose connections come from `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some(from.parse().unwrap()))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Whether the server has closed `conn` (EOF or reset), reading away whatever it answered
/// first; waits at most `wait`.
async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Idle connections, heads that never end (sent at once or a byte at a time) and bodies that
/// stop: the server closes each of them (before: none, ever), and answers others meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn connections_held_for_nothing_are_closed() {
    let s = TestServer::start_with(
        Default::default(),
        ServerOptions {
            header_timeout: Duration::from_secs(1),
            transfer_idle_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await;
    let a = s.user("a@example.com", "A").await;
    let addr = addr_of(&s.base);
    let auth = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", a.email, a.token))
    };
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(("idle", connect_from("127.0.0.1", addr).await));
    }
    for _ in 0..6 {
        let mut c = connect_from("127.0.0.1", addr).await;
        c.write_all(b"GET /nodes/pth/A HTTP/1.1\r\nHost: x\r\nX-Pad: ")
            .await
            .unwrap();
        held.push(("partial head", c));
    }
    for _ in 0..4 {
        let mut c = connect_from("127.0.0.1", addr).await;
        let head = format!(
            "PUT /nodes/pth/A/My%20First%20Vault/d HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"a\":"
        );
        c.write_all(head.as_bytes()).await.unwrap();
        held.push(("stalled body", c));
    }
    // A head sent a byte every 200 ms: progress, but never a whole head.
    let slow = tokio::spawn(async move {
        let mut c = connect_from("127.0.0.1", addr).await;
        for b in b"GET /nodes/pth/A HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if c.write_all(&[*b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        closed_within(&mut c, Duration::from_secs(1)).await
    });
    // Someone else is answered meanwhile.
    let other = client_from("127.0.0.2");
    let status_of = async |path: &str| {
        let r = other.get(s.url(path)).basic_auth(&a.email, Some(&a.token));
        r.send().await.unwrap().status().as_u16()
    };
    assert_eq!(status_of("/nodes/pth/A").await, 200);
    for (what, c) in &mut held {
        assert!(
            closed_within(c, Duration::from_secs(15)).await,
            "a connection with {what} stays open"
        );
    }
    assert!(slow.await.unwrap(), "a head sent byte by byte stays open");
    // The stalled bodies created nothing, and the server still answers.
    assert_eq!(status_of("/nodes/pth/A/My%20First%20Vault/d").await, 404);
}

/// One source holds at most its share of connections: more are closed at once, while other
/// sources are served; beyond the bound in all, new connections wait until one ends.
#[tokio::test(flavor = "multi_thread")]
async fn connections_are_bounded_in_all_and_per_source() {
    let s = TestServer::start_with(
        Default::default(),
        ServerOptions {
            max_connections: 30,
            max_connections_per_source: 10,
            ..Default::default()
        },
    )
    .await;
    let addr = addr_of(&s.base);
    let mut first = Vec::new();
    for _ in 0..10 {
        first.push(connect_from("127.0.0.1", addr).await);
    }
    // Let the server accept them all before the next one comes.
    let probe = client_from("127.0.0.9");
    assert_eq!(
        probe
            .get(s.url("/nodes/pth"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    drop(probe);
    let mut over = connect_from("127.0.0.1", addr).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(10)).await,
        "an 11th connection of one source is served"
    );
    assert!(
        !closed_within(&mut first[0], Duration::from_millis(200)).await,
        "the first connections were closed too"
    );
    let mut others = Vec::new();
    for from in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..10 {
            others.push(connect_from(from, addr).await);
        }
    }
    // 30 open: the next request waits for one of them to end.
    let waiting = tokio::spawn({
        let url = s.url("/nodes/pth");
        async move {
            client_from("127.0.0.4")
                .get(url)
                .send()
                .await
                .map(|r| r.status())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "served beyond the bound in all");
    drop(first);
    assert_eq!(waiting.await.unwrap().unwrap(), 401);
}

/// The issue's case: `vaultfs serve` under `ulimit -n 256`, 300 connections that say nothing.
/// Another client is still answered (before: the server answered nobody), and the server keeps
/// its descriptors within the limit.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_cannot_exhaust_the_descriptors() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args([
            "--preview-workers",
            "1",
            "--header-timeout",
            "2",
            "--max-connections-per-source",
            "100000",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setrlimit in the child before exec; nothing else runs there.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    common::wait_for_port(port);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut idle = Vec::new();
    for _ in 0..300 {
        match tokio::time::timeout(Duration::from_secs(2), connect_from("127.0.0.1", addr)).await {
            Ok(c) => idle.push(c),
            Err(_) => break, // the backlog is full: enough held
        }
    }
    let r = client_from("127.0.0.2")
        .get(format!("http://{addr}/nodes/pth"))
        .send()
        .await;
    let fds = std::fs::read_dir(format!("/proc/{}/fd", child.id()))
        .map(|d| d.count())
        .unwrap_or(0);
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "{} idle connections held; server had {fds} descriptors",
        idle.len()
    );
    assert_eq!(r.expect("no answer").status(), 401);
    assert!(fds < 256, "{fds} descriptors open");
    drop(idle);
}

// ----- sign-ins and pins (items 6, 7, 10, 11) -----

/// The authorization page's form posted from `from` (127.0.0.x) with extra headers.
async fn sign_in_from(
    s: &TestServer,
    from: &str,
    email: &str,
    password: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut req = client_from(from).post(s.url("/pin/authorize")).form(&[
        ("client_id", "vaultfs"),
        ("email", email),
        ("password", password),
    ]);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The status of an answer and its error name ("ok" when it has none).
async fn status_and_code(r: reqwest::Response) -> (u16, String) {
    let st = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    let code = v["error"]["error_name"]
        .as_str()
        .unwrap_or("ok")
        .to_string();
    (st, code)
}

/// `POST /pin/end` from `from` (with extra headers): the whole answer.
async fn pin_end(s: &TestServer, from: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    let mut req = client_from(from)
        .post(s.url("/pin/end"))
        .json(&serde_json::json!({"client_id": "vaultfs"}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().json().await.unwrap()
}

/// `/pin/auth` from `from`: the status and error code (or "ok").
async fn exchange_from(s: &TestServer, from: &str, email: &str, pin: &str) -> (u16, String) {
    let r = client_from(from)
        .post(s.url("/pin/auth"))
        .json(&serde_json::json!({"user_email": email, "pin_info": {"client_id": "vaultfs", "pin": pin.parse::<u64>().unwrap()}}))
        .send()
        .await
        .unwrap();
    status_and_code(r).await
}

/// 100 wrong passwords for one user at once: five are checked, the rest are 429 (before: 41
/// were checked before the first 429, as check, hash and record were separate steps).
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_wrong_passwords_cannot_race_the_lockout() {
    let s = TestServer::start_with(
        Default::default(),
        ServerOptions {
            password_queue: 1000,
            ..Default::default()
        },
    )
    .await;
    s.store
        .add_user("real@example.com", "Real", "right")
        .unwrap();
    let answers = futures_util::future::join_all(
        (0..100).map(|_| sign_in_from(&s, "127.0.0.1", "real@example.com", "wrong", &[])),
    )
    .await;
    let checked = answers.iter().filter(|a| a.0 == 401).count();
    let locked = answers.iter().filter(|a| a.0 == 429).count();
    println!("100 concurrent wrong passwords: {checked} checked, {locked} locked out");
    assert_eq!((checked, locked), (5, 95));
}

/// A known and an unknown e-mail get the same answers, failure after failure, on the page and
/// at `/pin/auth`; and failures from one address do not lock the user out elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn lockouts_reveal_no_e_mail_and_cannot_be_aimed() {
    let s = TestServer::start().await;
    s.store
        .add_user("victim@example.com", "Victim", "right")
        .unwrap();
    let statuses = async |email: &str| {
        let mut page = Vec::new();
        for _ in 0..7 {
            let (st, html) = sign_in_from(&s, "127.0.0.2", email, "guess", &[]).await;
            page.push((st, html.replace(email, "E-MAIL")));
        }
        let mut pin = Vec::new();
        for _ in 0..7 {
            pin.push(exchange_from(&s, "127.0.0.2", email, "12345678").await);
        }
        (page, pin)
    };
    let (known_page, known_pin) = statuses("victim@example.com").await;
    let (unknown_page, unknown_pin) = statuses("nobody@example.com").await;
    assert_eq!(
        known_page.iter().map(|p| p.0).collect::<Vec<_>>(),
        [401, 401, 401, 401, 401, 429, 429]
    );
    assert_eq!(
        known_page, unknown_page,
        "the page tells which e-mail exists"
    );
    assert_eq!(
        known_pin, unknown_pin,
        "/pin/auth tells which e-mail exists"
    );
    assert_eq!(known_pin[5], (429, "too_many_attempts".to_string()));
    // The attacker at .2 is locked out; the victim, elsewhere, signs in and logs in.
    let (st, html) = sign_in_from(&s, "127.0.0.3", "victim@example.com", "right", &[]).await;
    assert_eq!(st, 200, "{html}");
    let pin = common::pin_in(&html).unwrap();
    assert_eq!(
        exchange_from(&s, "127.0.0.3", "victim@example.com", &pin).await,
        (200, "ok".to_string())
    );
    assert_eq!(
        sign_in_from(&s, "127.0.0.2", "victim@example.com", "right", &[])
            .await
            .0,
        429
    );
}

/// Pins: revoking a user's access revokes the pin they have not used yet (before: it gave a
/// new token); an unused pin expires; the database holds only a keyed hash of a pin (not the
/// pin, not its plain sha256), under a key kept in a private file beside it.
#[tokio::test(flavor = "multi_thread")]
async fn pins_are_revoked_expire_and_are_stored_keyed() {
    use std::os::unix::fs::PermissionsExt;
    let s = TestServer::start_with(
        vaultfs::store::StoreConfig {
            pin_ttl: Duration::from_secs(1),
            ..Default::default()
        },
        Default::default(),
    )
    .await;
    s.store.add_user("p@example.com", "P", "right").unwrap();
    let pin_of = async || {
        let (st, html) = sign_in_from(&s, "127.0.0.1", "p@example.com", "right", &[]).await;
        assert_eq!(st, 200, "{html}");
        common::pin_in(&html).unwrap()
    };
    // Revoked with the CLI, as an operator does, while the server runs.
    let pin = pin_of().await;
    let out = Command::new(BIN)
        .args(["user", "revoke", "p@example.com", "--data-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        exchange_from(&s, "127.0.0.1", "p@example.com", &pin).await,
        (401, "invalid_pin".to_string())
    );
    // Stored keyed.
    let pin = pin_of().await;
    let db = rusqlite::Connection::open(s.dir.join("vault.db")).unwrap();
    let stored: Vec<u8> = db
        .query_row("SELECT hash FROM pins", [], |r| r.get(0))
        .unwrap();
    use sha2::Digest;
    assert_ne!(stored, sha2::Sha256::digest(pin.as_bytes()).to_vec());
    let dump: String = db
        .query_row(
            "SELECT group_concat(quote(hash) || created_on || expires_on) FROM pins",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!dump.contains(&pin));
    let key = s.dir.join("pin.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Unused for longer than its lifetime: expired.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        exchange_from(&s, "127.0.0.1", "p@example.com", &pin).await,
        (401, "invalid_pin".to_string())
    );
    // A fresh one works.
    let pin = pin_of().await;
    assert_eq!(
        exchange_from(&s, "127.0.0.1", "p@example.com", &pin).await,
        (200, "ok".to_string())
    );
}

/// `vaultfs login` takes no pin on its command line (other users see it in `ps`).
#[test]
fn login_takes_no_pin_from_argv() {
    let out = Command::new(BIN)
        .args([
            "login",
            "--server",
            "http://127.0.0.1:9",
            "--email",
            "a@b.c",
            "--pin",
            "12345678",
        ])
        .env_remove("VAULTFS_PIN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected argument"),
        "{out:?}"
    );
}

/// The authorization page cannot be framed, cached or posted from another site, and its
/// address comes from the server's configuration or connection, never from a Host header.
#[tokio::test(flavor = "multi_thread")]
async fn the_authorization_page_is_guarded() {
    let s = TestServer::start().await;
    s.store.add_user("g@example.com", "G", "right").unwrap();
    let r = client_from("127.0.0.1")
        .get(s.url("/pin/authorize?client_id=vaultfs"))
        .send()
        .await
        .unwrap();
    let h = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert!(h(&r, "content-security-policy").contains("frame-ancestors 'none'"));
    assert_eq!(h(&r, "x-frame-options"), "DENY");
    assert_eq!(h(&r, "cache-control"), "no-store");
    // Posted from another site: refused, no pin.
    for headers in [
        [("Origin", "https://evil.example")],
        [("Referer", "https://evil.example/page")],
        [("Sec-Fetch-Site", "cross-site")],
    ] {
        let (st, html) = sign_in_from(&s, "127.0.0.1", "g@example.com", "right", &headers).await;
        assert_eq!(st, 403, "{headers:?}");
        assert!(common::pin_in(&html).is_none());
    }
    // From its own page: the pin, on a page not to be cached.
    let own = s.base.clone();
    let r = client_from("127.0.0.1")
        .post(s.url("/pin/authorize"))
        .header("Origin", &own)
        .form(&[
            ("client_id", "vaultfs"),
            ("email", "g@example.com"),
            ("password", "right"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(h(&r, "cache-control"), "no-store");
    assert!(common::pin_in(&r.text().await.unwrap()).is_some());
    // A forged Host does not make the link point elsewhere.
    let v = pin_end(&s, "127.0.0.1", &[("Host", "evil.example")]).await;
    let uri = v["message"]["authorization_uri"].as_str().unwrap();
    assert!(
        uri.starts_with(&format!("{}/pin/authorize", s.base)),
        "{uri}"
    );
}

/// With `--public-url`, the link is built from it; without, a client on another machine is
/// told to ask the operator (checked when this machine has an address besides loopback).
#[tokio::test(flavor = "multi_thread")]
async fn the_authorization_link_comes_from_the_public_url() {
    let s = TestServer::start_with(
        Default::default(),
        ServerOptions {
            public_url: Some("https://vault.example.com/".into()),
            ..Default::default()
        },
    )
    .await;
    let v = pin_end(&s, "127.0.0.1", &[("Host", "evil.example")]).await;
    assert_eq!(
        v["message"]["authorization_uri"],
        "https://vault.example.com/pin/authorize?client_id=vaultfs"
    );
    // The address this machine uses towards the outside, if it has one.
    let Some(ip) = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").map(|_| u))
        .and_then(|u| u.local_addr())
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
    else {
        println!("no address besides loopback: the remote case is skipped");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = std::sync::Arc::new(
        vaultfs::store::Store::open(&tmp.path().join("data"), Default::default()).unwrap(),
    );
    tokio::spawn(vaultfs::server::serve(
        listener,
        store,
        Default::default(),
        std::future::pending(),
    ));
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/pin/end"))
        .json(&serde_json::json!({"client_id": "vaultfs"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["error_name"], "no_public_url", "{v}");
}

// ----- other accounts' IDs (item 9) -----

/// Another account's file ID and an ID nobody uses get the same answer on every route that
/// takes an ID (before: 403 for the first, 404 for the second, which let anyone count them).
#[tokio::test(flavor = "multi_thread")]
async fn other_accounts_ids_cannot_be_told_from_unused_ones() {
    let s = TestServer::start().await;
    let alice = s.user("alice@example.com", "Acme").await;
    let bob = s.user("bob@example.com", "Bobco").await;
    let http = client_from("127.0.0.1");
    // Alice's file (upload step 1).
    let taken: u64 = new_file(
        &s,
        &alice,
        "/nodes/pth/Acme/My%20First%20Vault",
        "secret.txt",
    )
    .await
    .parse()
    .unwrap();
    let unused = taken + 1000;
    let answer = async |id: u64, method: reqwest::Method, path: String| {
        let mut req = http
            .request(method.clone(), s.url(&path.replace("ID", &id.to_string())))
            .basic_auth(&bob.email, Some(&bob.token));
        if method == reqwest::Method::PUT {
            req = req
                .header("Content-Type", "application/json")
                .body(r#"{"length": 1}"#);
        }
        let r = req.send().await.unwrap();
        let st = r.status().as_u16();
        let v: serde_json::Value = r.json().await.unwrap();
        let text = v["error"]["error_text"]
            .as_str()
            .unwrap_or("")
            .replace(&id.to_string(), "ID");
        (st, v["error"]["error_name"].clone(), text)
    };
    use reqwest::Method;
    for (method, path) in [
        (Method::GET, "/files/id/Document/ID"),
        (Method::GET, "/preview/id/Document/ID"),
        (Method::GET, "/preview/id/Document/ID/1"),
        (Method::PUT, "/nodes/upload/ID"),
    ] {
        let a = answer(taken, method.clone(), path.into()).await;
        let b = answer(unused, method, path.into()).await;
        assert_eq!(a.0, 404, "{path}: {a:?}");
        assert_eq!(a, b, "{path} tells a taken ID from an unused one");
    }
}

// ----- quotas (item 12) -----

/// A JSON request as `who`; the status and the error code ("ok" on success).
async fn call(
    s: &TestServer,
    who: &common::Creds,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> (u16, String) {
    let r = client_from("127.0.0.1")
        .request(method, s.url(path))
        .basic_auth(&who.email, Some(&who.token))
        .json(&body)
        .send()
        .await
        .unwrap();
    status_and_code(r).await
}

/// A new folder at `path` (encoded) as `who`: the status and error code.
async fn mkdir(s: &TestServer, who: &common::Creds, path: &str) -> (u16, String) {
    call(s, who, reqwest::Method::PUT, path, serde_json::json!({})).await
}

/// Upload step 1 of `name` in the folder at `path` (encoded) as `who`: the new file's ID.
async fn new_file(s: &TestServer, who: &common::Creds, path: &str, name: &str) -> String {
    common::create_file(&client_from("127.0.0.1"), &s.base, who, path, name).await
}

/// The issue's doubling (copy a tree beside itself, move the copy into it, again and again:
/// 38 requests made 1.5 million nodes) stops at the bound of one request; an account stops at
/// its quotas of nodes and bytes with 507, and another account is not affected.
#[tokio::test(flavor = "multi_thread")]
async fn copies_and_accounts_are_bounded() {
    use reqwest::Method;
    let s = TestServer::start_with(
        vaultfs::store::StoreConfig {
            max_nodes_per_account: 300,
            max_bytes_per_account: 10_000,
            max_nodes_per_request: 100,
            ..Default::default()
        },
        Default::default(),
    )
    .await;
    let alice = s.user("alice@example.com", "Acme").await;
    let bob = s.user("bob@example.com", "Bobco").await;
    let v = "/nodes/pth/Acme/My%20First%20Vault";
    assert_eq!(
        mkdir(&s, &alice, &format!("{v}/t")).await,
        (200, "ok".into())
    );
    let mut last = (200, "ok".to_string());
    let mut doubled = 0;
    // Copy or move the node `from` of the vault to `to`.
    let transfer = async |how: &str, from: &str, to: String| {
        let body = serde_json::json!({how: {"dst_uri": to, "replace": "fail"}});
        call(&s, &alice, Method::POST, &format!("{v}/{from}"), body).await
    };
    for i in 0..38 {
        let dst = format!("/nodes/pth/Acme/My First Vault/t/c{i}");
        last = transfer("copy", "t", "/nodes/pth/Acme/My First Vault/c".into()).await;
        if last.0 != 200 {
            break;
        }
        let moved = transfer("move", "c", dst).await;
        assert_eq!(moved, (200, "ok".into()));
        doubled += 1;
    }
    println!("the tree doubled {doubled} times, then: {last:?}");
    assert_eq!(last, (413, "too_many_nodes".into()));
    assert!(doubled <= 7, "doubled {doubled} times");
    // Folders until the account's quota of nodes.
    let mut i = 0;
    let refused = loop {
        let r = mkdir(&s, &alice, &format!("{v}/f{i}")).await;
        if r.0 != 200 {
            break r;
        }
        i += 1;
        assert!(i < 400, "no quota of nodes");
    };
    assert_eq!(refused, (507, "quota_exceeded".into()));
    // Bob is not affected; his quota of bytes is his own.
    let bv = "/nodes/pth/Bobco/My%20First%20Vault";
    assert_eq!(
        mkdir(&s, &bob, &format!("{bv}/d")).await,
        (200, "ok".into())
    );
    let id = new_file(&s, &bob, bv, "big.bin").await;
    let announce = async |len: u64| {
        call(
            &s,
            &bob,
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            serde_json::json!({"length": len}),
        )
        .await
    };
    assert_eq!(announce(20_000).await, (507, "quota_exceeded".into()));
    assert_eq!(announce(5_000).await, (200, "ok".into()));
    assert!(s.store.check_integrity().unwrap().is_empty());
}

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

/// A `vaultfs serve` over `dir` on `port`, its log in `dir/../serve-<n>.log`.
fn serve(dir: &std::path::Path, port: u16, n: usize) -> std::process::Child {
    let log = std::fs::File::create(dir.with_file_name(format!("serve-{n}.log"))).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir)
        .args(["--preview-workers", "1"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for_port(port);
    child
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

    // A real server deletes it, and is killed while it purges.
    let port = common::free_port();
    let mut server = serve(&dir, port, 1);
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

// ----- the control socket's folder (item 13) -----

/// `vaultfs ARGS` run as the user `uid` (the test runs as root), with `tmp` as its temporary
/// folder and no XDG_RUNTIME_DIR: its control sockets are in `<tmp>/vaultfs-<uid>`.
fn vaultfs_as(uid: u32, tmp: &std::path::Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(BIN)
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp)
        .env("HOME", tmp)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Another local user makes `/tmp/vaultfs-<uid>` first (the fallback without XDG_RUNTIME_DIR)
/// and answers on the socket of a mount point: `vaultfs status` does not show their answer and
/// `vaultfs unmount` does not report their success (before: both did). A socket of another user
/// in a folder that is ours is refused too (SO_PEERCRED).
#[test]
fn a_squatted_control_folder_is_refused() {
    use std::os::unix::fs::{PermissionsExt, chown};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("not root: skipped (the test runs commands as another user)");
        return;
    }
    let (victim, squatter) = (65534u32, 65533u32);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mp = tmp.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let sock_name = {
        use md5::{Digest, Md5};
        let canon = std::fs::canonicalize(&mp).unwrap();
        let h: String = Md5::digest(canon.as_os_str().as_encoded_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{}.sock", &h[..16])
    };
    let dir = tmp.path().join(format!("vaultfs-{victim}"));
    // The squatter's folder, open to all, and a socket that answers everything with success.
    let answer_forever = |sock: std::path::PathBuf| {
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for conn in listener.incoming().flatten() {
                let mut line = String::new();
                let mut r = std::io::BufReader::new(&conn);
                let _ = r.read_line(&mut line);
                let mut w = &conn;
                let _ = writeln!(w, r#"{{"unmounting":true}}"#);
                let _ = writeln!(w, r#"{{"left_in_journal":0,"mountpoint":"/squatted"}}"#);
            }
        });
    };
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    chown(&dir, Some(squatter), Some(squatter)).unwrap();
    answer_forever(dir.join(&sock_name));
    let args =
        |cmd: &str| -> Vec<std::ffi::OsString> { vec![cmd.into(), mp.clone().into_os_string()] };
    let run = |cmd: &str| {
        let a = args(cmd);
        let refs: Vec<&std::ffi::OsStr> = a.iter().map(|s| s.as_os_str()).collect();
        vaultfs_as(victim, tmp.path(), &refs)
    };
    for cmd in ["status", "unmount"] {
        let out = run(cmd);
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "{cmd} trusted a squatted folder: {text}"
        );
        assert!(text.contains("not a private folder"), "{cmd}: {text}");
    }
    // The folder is the victim's, but the socket in it is someone else's (root's, here).
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    answer_forever(dir.join(&sock_name));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&dir, Some(victim), Some(victim)).unwrap();
    let out = run("status");
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "status trusted another user's socket"
    );
    assert!(text.contains("another user"), "{text}");
}

// ----- names (item 15) -----

/// Names of new nodes are stored in NFC (the two spellings of `é` are one name, reached by
/// either), and names with control or bidirectional-formatting characters are refused (before:
/// both spellings made two files, and `evil\u{202e}fdp.exe` was accepted).
#[tokio::test(flavor = "multi_thread")]
async fn names_are_nfc_without_control_characters() {
    use reqwest::Method;
    let s = TestServer::start().await;
    let a = s.user("n@example.com", "N").await;
    let v = "/nodes/pth/N/My%20First%20Vault";
    let enc = |name: &str| {
        percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let create = async |name: &str| {
        call(
            &s,
            &a,
            Method::PUT,
            v,
            serde_json::json!({"create_file": [{"name": name}]}),
        )
        .await
    };
    // A request on the node `name` of the vault.
    let at = async |method: Method, name: &str, body: serde_json::Value| {
        call(&s, &a, method, &format!("{v}/{}", enc(name)), body).await
    };
    assert_eq!(create("e\u{301}te\u{301}.txt").await, (200, "ok".into()));
    assert_eq!(create("\u{e9}t\u{e9}.txt").await, (200, "ok".into()));
    assert_eq!(
        at(Method::PUT, "cafe\u{301}", serde_json::json!({})).await,
        (200, "ok".into())
    );
    let list: serde_json::Value = client_from("127.0.0.1")
        .get(s.url(&format!("{v}?children=1")))
        .basic_auth(&a.email, Some(&a.token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut names: Vec<String> = list["message"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["caf\u{e9}", "\u{e9}t\u{e9}.txt"]);
    // Either spelling reaches it.
    for spelling in ["e\u{301}te\u{301}.txt", "\u{e9}t\u{e9}.txt"] {
        assert_eq!(
            at(Method::GET, spelling, serde_json::json!({})).await,
            (200, "ok".into()),
            "{spelling:?}"
        );
    }
    for bad in [
        "a\nb.txt",
        "\u{1b}[2J.txt",
        "evil\u{202e}fdp.exe",
        "del\u{7f}",
        "c1\u{85}x",
    ] {
        assert_eq!(create(bad).await, (400, "bad_path".into()), "{bad:?}");
        assert_eq!(
            at(Method::PUT, bad, serde_json::json!({})).await,
            (400, "bad_path".into()),
            "{bad:?}"
        );
        let dst = format!("/nodes/pth/N/My First Vault/{bad}");
        assert_eq!(
            at(
                Method::POST,
                "\u{e9}t\u{e9}.txt",
                serde_json::json!({"move": {"dst_uri": dst, "replace": "fail"}}),
            )
            .await,
            (400, "bad_path".into()),
            "{bad:?}"
        );
    }
}

// ----- fuzzing the request parsers over a real server -----

/// Raw requests as a hostile client writes them: any method, paths of every spelling under
/// each route, Authorization headers valid or garbage, any Content-Type, Range and Origin, and
/// bodies of bytes, forms or JSON. Whatever comes, the answer is below 500 (503 for a limit
/// reached) and, when JSON, the error envelope agrees with the status; the store stays whole and
/// the server goes on answering. Bounded by its number of cases (`PROPTEST_CASES` overrides it).
#[test]
fn arbitrary_requests_are_answered_below_500() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, valid_auth) = rt.block_on(async {
        let s = TestServer::start_with(
            Default::default(),
            ServerOptions {
                header_timeout: Duration::from_secs(2),
                transfer_idle_timeout: Duration::from_secs(2),
                max_connections_per_source: 100_000,
                ..Default::default()
            },
        )
        .await;
        let a = s.user("f@example.com", "Fuzz").await;
        use base64::Engine;
        let auth =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", a.email, a.token));
        (s, format!("Basic {auth}"))
    });
    let addr = addr_of(&s.base);
    let method = prop_oneof![
        4 => prop::sample::select(vec!["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "PATCH"]).prop_map(String::from),
        1 => "[A-Z]{1,7}",
    ];
    let prefix = prop::sample::select(vec![
        "/nodes/pth",
        "/nodes/pth/Fuzz/My%20First%20Vault",
        "/nodes/upload",
        "/files/id/Document",
        "/preview/id/Document",
        "/pin/end",
        "/pin/auth",
        "/pin/authorize",
        "/openapi.json",
        "",
    ]);
    let segment = prop_oneof![
        "[a-zA-Z0-9._~-]{0,12}",
        "(%2[eEfF]|%00|%[0-9a-fA-F]{2}|\\.\\.|%C3%A9|e%CC%81|%E2%80%AE|%0A|%1B)",
        "[0-9]{1,20}",
    ];
    let path = (
        prefix,
        prop::collection::vec(segment, 0..4),
        "(\\?[a-z_=&0-9%]{0,24})?",
    )
        .prop_map(|(p, segs, q)| {
            let mut s = p.to_string();
            for seg in segs {
                s.push('/');
                s.push_str(&seg);
            }
            if s.is_empty() {
                s.push('/');
            }
            s + &q
        });
    let auth = prop_oneof![
        2 => Just(Some(valid_auth.clone())),
        1 => "Basic [A-Za-z0-9+/=]{0,40}".prop_map(Some),
        1 => "[ -~]{0,40}".prop_map(Some),
        1 => Just(None),
    ];
    let ctype = prop::option::of(prop::sample::select(vec![
        "application/json",
        "application/x-www-form-urlencoded",
        "application/binary",
        "text/plain",
        "multipart/form-data; boundary=x",
    ]));
    let extra = prop::collection::vec(
        prop_oneof![
            "bytes=[0-9]{0,6}-[0-9]{0,6}(,[0-9]-[0-9])?".prop_map(|v| format!("Range: {v}")),
            "(https?://[a-z.]{1,12}|null)".prop_map(|v| format!("Origin: {v}")),
            Just("Sec-Fetch-Site: cross-site".to_string()),
            "[ -~]{0,30}".prop_map(|v| format!("X-Junk: {v}")),
        ],
        0..3,
    );
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "client_id=(vaultfs|x)&email=[a-z@.%]{0,12}&password=[a-z]{0,8}".prop_map(String::into_bytes),
        "\\{\"(create_file|copy|move|length|client_id|user_email|pin_info)\": ?(\\[\\{\"name\": ?\"[a-z%\\\\u0-9]{0,8}\"\\}\\]|[0-9]{1,12}|\"[ -~]{0,12}\"|\\{\\}|null)\\}".prop_map(String::into_bytes),
    ];
    let mut runner = TestRunner::new(Config::with_cases(
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(1000),
    ));
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, usize>::new());
    runner
        .run(
            &(method, path, auth, ctype, extra, body),
            |(method, path, auth, ctype, extra, body)| {
                let mut head =
                    format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
                if let Some(a) = auth {
                    head += &format!("Authorization: {a}\r\n");
                }
                if let Some(c) = ctype {
                    head += &format!("Content-Type: {c}\r\n");
                }
                for h in extra {
                    head += &format!("{h}\r\n");
                }
                head += &format!("Content-Length: {}\r\n\r\n", body.len());
                let answer = rt.block_on(async {
                    let mut c = connect_from("127.0.0.1", addr).await;
                    c.write_all(head.as_bytes()).await.unwrap();
                    c.write_all(&body).await.unwrap();
                    let mut out = Vec::new();
                    tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut out))
                        .await
                        .expect("no answer within 20 s")
                        .ok();
                    out
                });
                let text = String::from_utf8_lossy(&answer);
                let status: u16 = text
                    .strip_prefix("HTTP/1.1 ")
                    .and_then(|t| t.get(..3))
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("{head}: no status line: {text:?}"));
                *statuses.lock().unwrap().entry(status).or_default() += 1;
                prop_assert!(status < 500 || status == 503, "{head}\n=> {text}");
                let body_at = text.find("\r\n\r\n").map_or(text.len(), |i| i + 4);
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text[body_at..]) {
                    if status >= 400 {
                        prop_assert_eq!(
                            &v["error"]["status_code"],
                            status,
                            "{}\n=> {}",
                            head,
                            text
                        );
                        prop_assert_eq!(&v["error"]["success"], false);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    let statuses = statuses.into_inner().unwrap();
    println!("statuses: {statuses:?}");
    assert!(
        statuses.keys().any(|s| *s < 300),
        "nothing succeeded: {statuses:?}"
    );
    assert!(s.store.check_integrity().unwrap().is_empty());
    let ok = rt.block_on(async {
        client_from("127.0.0.2")
            .get(s.url("/nodes/pth/Fuzz"))
            .header("Authorization", &valid_auth)
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(ok, 200);
}
