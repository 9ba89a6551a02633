//! Connections held open for nothing, bounded in all and per source, and a server under a low
//! descriptor limit.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{BIN, addr_of, client_from, connect_from};
use crate::common;
use crate::common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vaultfs::server::ServerOptions;

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

/// The case: `vaultfs serve` under `ulimit -n 256`, 300 connections that say nothing.
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
