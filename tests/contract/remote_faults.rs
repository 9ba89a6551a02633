//! The remote backend alone against a hand-written HTTP server on 127.0.0.1 that misbehaves
//! (5xx, garbage, silence, broken bodies, no range support, no TLS).

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vaultfs::api::{Error, ErrorKind, NodeType, RangeRequest};
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};

use crate::common::md5hex;
use crate::common::pattern;
use crate::{assert_err, at, err, put, read_all, remote_world, stream, vault};

/// What the hand-written server does with one request, given its number (from 0) and head.
enum Reply {
    /// Writes these bytes and closes the connection.
    Send(Vec<u8>),
    /// Writes these bytes and then keeps the connection open without a word.
    SendThenStall(Vec<u8>),
}

struct Mock {
    base: String,
    /// The head of every request received.
    heads: Arc<Mutex<Vec<String>>>,
}

impl Mock {
    fn count(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
    fn head(&self, i: usize) -> String {
        self.heads.lock().unwrap()[i].to_ascii_lowercase()
    }
}

/// A raw HTTP/1.1 server on 127.0.0.1 answering each request with `reply`.
async fn mock(reply: impl Fn(usize, &str) -> Reply + Send + Sync + 'static) -> Mock {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let reply = Arc::new(reply);
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (reply, seen) = (reply.clone(), seen.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.push(head.clone());
                    s.len() - 1
                };
                match reply(n, &head) {
                    Reply::Send(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        let _ = sock.shutdown().await;
                    }
                    Reply::SendThenStall(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                }
            });
        }
    });
    Mock { base, heads }
}

fn http(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn json(status: &str, body: &str) -> Vec<u8> {
    http(
        status,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

const NODE_OK: &str = r#"{"error":{"success":true},"message":{"name":"My First Vault","uri":"/nodes/pth/Acme/My First Vault","nodeType":"VaultNodeType","unknown":[1,2]}}"#;

/// Small bounds, so that the tests of failures are quick.
fn quick(base: &str) -> RemoteConfig {
    let mut c = RemoteConfig::new(base, "a@acme.test", "tok");
    c.connect_timeout = Duration::from_millis(500);
    c.idle_timeout = Duration::from_millis(400);
    c.total_timeout = Duration::from_millis(1500);
    c.retries = 3;
    c.backoff_base = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(40);
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_retries_5xx_of_idempotent_calls_up_to_the_limit() {
    let m = mock(|n, _| {
        Reply::Send(if n < 2 {
            json(
                "503 Service Unavailable",
                r#"{"error":{"success":false,"error_code":"busy"}}"#,
            )
        } else {
            json("200 OK", NODE_OK)
        })
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    let node = b.node(&vault()).await.unwrap();
    assert_eq!(
        (node.name.as_str(), node.node_type),
        ("My First Vault", NodeType::VaultNodeType)
    );
    assert_eq!(m.count(), 3);
    // What was sent: the encoded path, Basic auth, JSON accepted.
    let head = m.head(0);
    assert!(
        head.starts_with("get /nodes/pth/acme/my%20first%20vault http/1.1"),
        "{head}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode("a@acme.test:tok");
    assert!(
        head.contains(&format!(
            "authorization: basic {}",
            basic.to_ascii_lowercase()
        )),
        "{head}"
    );
    assert!(head.contains("accept: application/json"), "{head}");

    // Always 503: 1 + 3 retries, then the error.
    let m = mock(|_, _| {
        Reply::Send(json(
            "503 Service Unavailable",
            r#"{"error":{"success":false}}"#,
        ))
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert_eq!(m.count(), 4);
    let mut c = quick(&m.base);
    c.retries = 0;
    let e = err(RemoteBackend::new(c).unwrap().node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert_eq!(m.count(), 5);

    // A DELETE or a move that reached the server is not repeated.
    let before = m.count();
    assert_eq!(
        err(b.delete(&at(&vault(), "x")).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(
        err(b.rename(&at(&vault(), "x"), &at(&vault(), "y"), true).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(
        err(b.begin_version("1", 1, None).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(m.count(), before + 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_garbage_answers_are_typed_errors() {
    let answers: Vec<(Vec<u8>, ErrorKind, &str)> = vec![
        (
            http(
                "200 OK",
                &[("Content-Type", "text/html")],
                b"<html><body>Welcome</body></html>",
            ),
            ErrorKind::Server,
            "HTML",
        ),
        (
            json(
                "200 OK",
                r#"{"error":{"success":true},"message":{"name":"tru"#,
            ),
            ErrorKind::Server,
            "EOF",
        ),
        (
            json(
                "200 OK",
                r#"{"error":{"success":true},"message":{"name":42,"size":"big"}}"#,
            ),
            ErrorKind::Server,
            "expected",
        ),
        (
            json("200 OK", r#"{"message":{"name":"x"}}"#),
            ErrorKind::Server,
            "error",
        ),
        (json("200 OK", "[]"), ErrorKind::Server, ""),
        (http("200 OK", &[], b""), ErrorKind::Server, "empty"),
        (
            http(
                "502 Bad Gateway",
                &[("Content-Type", "text/html")],
                b"<h1>502</h1>",
            ),
            ErrorKind::Network,
            "502",
        ),
        (
            http("404 Not Found", &[("Content-Type", "text/plain")], b"no"),
            ErrorKind::NotFound,
            "404",
        ),
        // The public service says an invalid token with a 400.
        (
            json(
                "400 Bad Request",
                r#"{"error":{"success":false,"error_code":"invalid_token","error_text":"Token is invalid"}}"#,
            ),
            ErrorKind::Auth,
            "vaultfs login",
        ),
        (
            json(
                "401 Unauthorized",
                r#"{"error":{"success":false,"error_code":"invalid_token","error_text":"expired"}}"#,
            ),
            ErrorKind::Auth,
            "vaultfs login --server",
        ),
        // success decides, whatever the status says.
        (
            json(
                "200 OK",
                r#"{"error":{"success":false,"error_code":"not_found","status_code":404}}"#,
            ),
            ErrorKind::NotFound,
            "",
        ),
    ];
    for (i, (raw, kind, says)) in answers.into_iter().enumerate() {
        let m = mock(move |_, _| Reply::Send(raw.clone())).await;
        let mut c = quick(&m.base);
        c.retries = 0;
        let e = err(RemoteBackend::new(c).unwrap().node(&vault()).await);
        assert_eq!(e.kind, kind, "answer {i}: {e:?}");
        assert!(e.message.contains(says), "answer {i}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_silent_or_dead_server_fails_within_the_bound() {
    // Accepts, reads the request, never answers.
    let m = mock(|_, _| Reply::SendThenStall(Vec::new())).await;
    let c = quick(&m.base);
    let bound = c.total_timeout + Duration::from_millis(700);
    let b = RemoteBackend::new(c).unwrap();
    for call in 0..3 {
        let t = Instant::now();
        let e = match call {
            0 => err(b.node(&vault()).await),
            1 => err(b.download("1", None).await.map(|d| d.total_size)),
            _ => err(b.create_folder(&at(&vault(), "x")).await),
        };
        assert_eq!(e.kind, ErrorKind::Network, "{e:?}");
        assert!(t.elapsed() < bound, "call {call} took {:?}", t.elapsed());
    }
    // An upload to a server that takes nothing: no progress is an error too.
    let t = Instant::now();
    let e = err(b.upload("1", "2", 3, stream(b"abc")).await);
    assert_eq!(e.kind, ErrorKind::Network, "{e:?}");
    assert!(t.elapsed() < bound, "upload took {:?}", t.elapsed());

    // Nothing listens at all.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let b = RemoteBackend::new(quick(&format!("http://127.0.0.1:{port}"))).unwrap();
    let t = Instant::now();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Network);
    assert!(e.message.contains("after 4 attempt(s)"), "{e:?}");
    assert!(t.elapsed() < bound);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_broken_downloads_end_with_an_error() {
    let data = pattern(1000, 0);
    let good_md5 = md5hex(&data);
    let d2 = data.clone();
    let m = mock(move |n, _| {
        let etag = format!("\"{good_md5}\"");
        match n {
            // Headers promise 1000 bytes, 500 come, then the connection closes.
            0 => Reply::Send(http("200 OK", &[("Content-Length", "1000")], &d2[..500])),
            // 500 come, then silence.
            1 => Reply::SendThenStall(http("200 OK", &[("Content-Length", "1000")], &d2[..500])),
            // All bytes, but not the ones the ETag (md5) describes.
            2 => Reply::Send(http(
                "200 OK",
                &[("ETag", "\"0123456789abcdef0123456789abcdef\"")],
                &d2,
            )),
            // A range that is shorter than its Content-Range says.
            3 => Reply::Send(http(
                "206 Partial Content",
                &[
                    ("Content-Range", "bytes 0-99/1000"),
                    ("Content-Length", "100"),
                    ("Accept-Ranges", "bytes"),
                ],
                &d2[..50],
            )),
            _ => Reply::Send(http("200 OK", &[("ETag", etag.as_str())], &d2)),
        }
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    for (i, kind) in [
        io::ErrorKind::UnexpectedEof,
        io::ErrorKind::TimedOut,
        io::ErrorKind::InvalidData,
    ]
    .into_iter()
    .enumerate()
    {
        let d = b.download("1", None).await.unwrap();
        assert_eq!(d.total_size, 1000);
        let e = read_all(d).await.unwrap_err();
        assert_eq!(e.kind(), kind, "download {i}: {e}");
        let inner = e
            .get_ref()
            .and_then(|e| e.downcast_ref::<Error>())
            .expect("an api::Error inside");
        assert!(!inner.message.is_empty());
    }
    let d = b
        .download("1", Some(RangeRequest::span(0, 100)))
        .await
        .unwrap();
    assert_eq!(d.range, Some((0, 99)));
    assert_eq!(
        read_all(d).await.unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    // And a good one, checked.
    let d = b.download("1", None).await.unwrap();
    assert!(read_all(d).await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_falls_back_to_whole_reads_without_range_support() {
    let data = pattern(1000, 0);
    let d2 = data.clone();
    // A server that ignores Range and does not advertise it.
    let m = mock(move |_, _| Reply::Send(http("200 OK", &[], &d2))).await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    assert_eq!(b.supports_ranges(), None);
    let d = b
        .download(
            "7",
            Some(RangeRequest::From {
                start: 100,
                end: Some(199),
            }),
        )
        .await
        .unwrap();
    assert_eq!((d.range, d.total_size), (Some((100, 199)), 1000));
    assert!(read_all(d).await.unwrap() == data[100..200]);
    assert_eq!(b.supports_ranges(), Some(false));
    assert!(m.head(0).contains("range: bytes=100-199"));
    assert!(m.head(0).contains("accept: */*"), "{}", m.head(0));
    // Learned: no Range header any more, the cut is made here.
    let d = b
        .download("7", Some(RangeRequest::Suffix(10)))
        .await
        .unwrap();
    assert_eq!(d.range, Some((990, 999)));
    assert!(read_all(d).await.unwrap() == data[990..]);
    assert!(!m.head(1).contains("range:"), "{}", m.head(1));
    assert_err(
        b.download(
            "7",
            Some(RangeRequest::From {
                start: 1000,
                end: None,
            }),
        )
        .await,
        ErrorKind::RangeNotSatisfiable,
        None,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_learns_range_support_from_our_server() {
    let w = remote_world().await;
    let id = put(&w.a, &w.vault, "r.bin", &pattern(100, 0))
        .await
        .file_id()
        .unwrap();
    assert_eq!(w.a.supports_ranges(), None);
    let d = w.a.download(&id, None).await.unwrap();
    drop(d);
    assert_eq!(w.a.supports_ranges(), Some(true));
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_speaks_tls_to_https_urls() {
    // Something that is not TLS behind an https:// URL: the handshake is tried and fails as a
    // connection error (retried, since nothing was sent), not as an unsupported scheme.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let _ = sock.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let b = RemoteBackend::new(quick(&format!("https://127.0.0.1:{port}"))).unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Network);
    assert!(e.message.contains("after 4 attempt(s)"), "{e:?}");
    // rustls's own words for a ServerHello that is not one.
    assert!(e.message.contains("corrupt message"), "{e:?}");
}
