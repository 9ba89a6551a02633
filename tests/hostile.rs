//! Hostile JSON both ways, as property tests over loopback.
//!
//! - The client: whatever a server answers (arbitrary JSON of bounded depth, shaped like nodes,
//!   listings, preview metadata and envelopes, or not JSON at all, with any status), the remote
//!   backend's decoders return a value or an error, never panic or hang, and what they accept
//!   is usable (IDs, version IDs and times read without panicking; times read back exactly).
//! - The server: arbitrary JSON bodies and bytes to every route that reads a JSON body get an
//!   answer below 500, and every failure is the error envelope; deeply nested JSON is refused
//!   (400) without a stack overflow, also 100,000 levels deep when the body limit lets it reach
//!   the parser; a body over the limit is 413 on every JSON route.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::{Creds, TestServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::Method;
use serde_json::{Map, Value, json};
use vaultfs::api::{
    Envelope, Node, NodePath, PinAuthResponse, PinEndResponse, PreviewMeta, format_time, parse_time,
};
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};

const VAULT: &str = "/nodes/pth/Acme/My%20First%20Vault";

/// Field names of the interface's objects: generated objects use them most of the time.
const KEYS: &[&str] = &[
    "error",
    "success",
    "error_code",
    "error_text",
    "status_code",
    "message",
    "name",
    "uri",
    "id",
    "nodeType",
    "createdOn",
    "modifiedOn",
    "size",
    "md5_checksum",
    "total_children",
    "children",
    "link_uri",
    "preview_link_uri",
    "download_link_uri",
    "download_uri",
    "fileExProperties",
    "upload_uri",
    "version_id",
    "status",
    "pdf_uri",
    "pages",
    "page_number",
    "page_uri",
    "width",
    "height",
    "token",
    "expires_in",
    "authorization_uri",
    "create_file",
    "length",
    "copy",
    "move",
    "dst_uri",
    "replace",
    "client_id",
    "user_email",
    "pin_info",
    "pin",
];

/// Strings a hostile peer would pick: edge times, links with and without `&id=`, paths.
fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "FileNodeType",
            "FolderNodeType",
            "VaultNodeType",
            "AccountNodeType",
            "Ready",
            "InProgress",
            "TypeNotSupported",
            "0000-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999999Z",
            "9999-12-31T23:59:59.999999999Z",
            "2026-11-21T10:00:00+14:00",
            "/files/id/Document/1?view=info&id=",
            "&id=&id=&id=",
            "/nodes/upload/1/",
            "/nodes/upload//",
            "/nodes/pth/../..",
            "/nodes/pth/Acme/My First Vault/a.txt",
            "fail",
            "REPLACE",
            "\u{0}",
        ])
        .prop_map(String::from),
        "[0-9]{1,30}",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
        ".*&id=.{0,12}",
        any::<String>(),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(String::from),
        1 => any::<String>(),
    ]
}

/// Arbitrary JSON, at most `depth` levels of arrays and objects.
fn json_value(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..10)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// What a server might send back: mostly envelopes around node-like values, also any JSON,
/// deeply nested JSON, and bytes that are not JSON.
fn answer() -> impl Strategy<Value = Vec<u8>> {
    let envelope = (
        prop_oneof![3 => Just(json!(true)), 1 => Just(json!(false)), 1 => json_value(1)],
        json_value(6),
        json_value(2),
    )
        .prop_map(|(success, message, extra)| {
            serde_json::to_vec(&json!({
                "error": {"success": success, "error_code": "x", "extra": extra},
                "message": message,
            }))
            .unwrap()
        });
    prop_oneof![
        6 => envelope,
        2 => json_value(8).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => (1usize..200_000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes()),
        1 => (1usize..5_000).prop_map(|n| {
            let mut s = r#"{"error":{"success":true},"message":"#.to_string();
            s.push_str(&r#"{"name":"n","children":["#.repeat(n));
            s.push_str(&"]}".repeat(n));
            s.push('}');
            s.into_bytes()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..300),
    ]
}

type Canned = Arc<Mutex<(u16, Vec<u8>)>>;

/// A server that answers every request with the canned status and body, as JSON.
async fn fake_server(canned: Canned) -> String {
    let app = axum::Router::new().fallback(move || {
        let canned = canned.clone();
        async move {
            let (status, body) = canned.lock().unwrap().clone();
            let mut resp: Response = (StatusCode::from_u16(status).unwrap(), body).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// What the client reads from a node must be usable without panicking.
fn use_node(n: &Node) {
    let _ = (n.file_id(), n.version_id(), n.is_file());
    for t in [n.modified_time(), n.created_time()].into_iter().flatten() {
        assert!(t >= UNIX_EPOCH);
        let _ = format_time(t);
    }
    for c in n.children.iter().flatten() {
        use_node(c);
    }
}

#[test]
fn client_decoders_never_panic_whatever_the_server_answers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let canned: Canned = Arc::new(Mutex::new((200, Vec::new())));
    let base = rt.block_on(fake_server(canned.clone()));
    let mut config = RemoteConfig::new(&base, "alice@example.com", "token");
    config.retries = 0;
    config.total_timeout = Duration::from_secs(10);
    let remote = RemoteBackend::new(config).unwrap();
    let folder = NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap();
    let statuses = prop_oneof![
        3 => Just(200u16),
        1 => prop::sample::select(vec![201u16, 400, 401, 403, 404, 409, 413, 429, 500]),
    ];
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config::with_cases(1000));
    runner
        .run(&(answer(), statuses), |(body, status)| {
            // The decoders the client uses, directly.
            if let Ok(env) = serde_json::from_slice::<Envelope<Node>>(&body) {
                if let Ok(Some(n)) = env.into_result(status) {
                    use_node(&n);
                }
            }
            let _ = serde_json::from_slice::<Envelope<PreviewMeta>>(&body);
            let _ = serde_json::from_slice::<Envelope<PinAuthResponse>>(&body);
            let _ = serde_json::from_slice::<Envelope<PinEndResponse>>(&body);
            // And the remote backend over loopback, from the answer's bytes to its results.
            *canned.lock().unwrap() = (status, body);
            rt.block_on(async {
                let calls = async {
                    if let Ok(n) = remote.node(&folder).await {
                        use_node(&n);
                        accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if let Ok(n) = remote.list(&folder, 0, 100).await {
                        use_node(&n);
                    }
                    if let Ok(n) = remote.create_file(&folder, "a.txt").await {
                        use_node(&n);
                        assert!(n.id.is_some(), "a created file without an ID was accepted");
                    }
                    if let Ok(n) = remote.begin_version("1", 3, None).await {
                        use_node(&n);
                    }
                    let _ = remote.preview("1").await;
                };
                tokio::time::timeout(Duration::from_secs(30), calls)
                    .await
                    .expect("the client hung on an answer");
            });
            Ok(())
        })
        .unwrap();
    // The generator is not all garbage: some answers were nodes the client took.
    let accepted = accepted.into_inner();
    println!("{accepted} answers decoded as nodes");
    assert!(accepted > 30, "only {accepted} answers decoded as nodes");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any RFC 3339 time of years 0000-9999 reads back as the same instant, and is written
    /// back as it was read (before 1970 too: a client may set such a time, issue 22).
    #[test]
    fn times_read_back_exactly(secs in -62_167_219_200i64..253_402_300_800, nanos in 0u32..1_000_000_000) {
        let dt = time::OffsetDateTime::from_unix_timestamp(secs).unwrap()
            + time::Duration::nanoseconds(nanos as i64);
        let text = dt.format(&time::format_description::well_known::Rfc3339).unwrap();
        let t = parse_time(&text).unwrap();
        let whole = match u64::try_from(secs) {
            Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
            Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()),
        };
        prop_assert_eq!(t, whole + Duration::from_nanos(nanos.into()));
        prop_assert_eq!(parse_time(&format_time(t)), Some(t));
    }
}

// ----- the server -----

/// Asserts an answer below 500, in the envelope: `error.success` true for 2xx, else a failure
/// with the status as `status_code`.
#[track_caller]
fn assert_answer(what: &str, status: u16, body: &[u8]) {
    assert!(
        status < 500,
        "{what}: {status} {}",
        String::from_utf8_lossy(body)
    );
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|_| {
        panic!(
            "{what}: {status} not JSON: {}",
            String::from_utf8_lossy(body)
        )
    });
    if (200..300).contains(&status) {
        assert_eq!(v["error"]["success"], true, "{what}: {v}");
    } else {
        assert_eq!(v["error"]["success"], false, "{what}: {v}");
        assert_eq!(v["error"]["status_code"], status, "{what}: {v}");
        assert!(v["error"]["error_code"].is_i64(), "{what}: {v}");
        assert!(v["error"]["error_name"].is_string(), "{what}: {v}");
        assert!(v.get("message").is_none(), "{what}: {v}");
    }
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    creds: &Creds,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let resp = http
        .request(method, format!("{base}{path}"))
        .basic_auth(&creds.email, Some(&creds.token))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

/// A file in Alice's vault; returns its ID.
async fn a_file(http: &reqwest::Client, base: &str, creds: &Creds, name: &str) -> String {
    common::create_file(http, base, creds, VAULT, name).await
}

/// The routes that read a JSON body, for a file `id` named `a.txt`.
fn json_routes(id: &str) -> Vec<(Method, String)> {
    vec![
        (Method::PUT, VAULT.to_string()),
        (Method::PUT, format!("{VAULT}/new%20folder")),
        (Method::PUT, "/nodes/pth".to_string()),
        (Method::POST, format!("{VAULT}/a.txt")),
        (Method::PUT, format!("/nodes/upload/{id}")),
        (Method::POST, "/pin/end".to_string()),
        (Method::POST, "/pin/auth".to_string()),
    ]
}

/// Request bodies: arbitrary JSON (mostly objects with the interface's keys), or bytes.
fn request_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => json_value(6).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => any::<String>().prop_map(String::into_bytes),
    ]
}

#[test]
fn server_answers_arbitrary_bodies_below_500_in_the_envelope() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, creds, id) = rt.block_on(async {
        let s = TestServer::start().await;
        let creds = s.user("alice@example.com", "Acme").await;
        let id = a_file(&reqwest::Client::new(), &s.base, &creds, "a.txt").await;
        (s, creds, id)
    });
    let http = reqwest::Client::new();
    let routes = json_routes(&id);
    let mut runner = TestRunner::new(Config::with_cases(300));
    runner
        .run(&(request_body(), 0..routes.len()), |(body, route)| {
            let (method, path) = routes[route].clone();
            let (status, answer) =
                rt.block_on(send(&http, &s.base, &creds, method.clone(), &path, body));
            assert_answer(&format!("{method} {path}"), status, &answer);
            Ok(())
        })
        .unwrap();
    assert!(s.store.check_integrity().unwrap().is_empty());
}

/// Nesting that would overflow a recursive parser's stack: refused with 400 `bad_json`, and the
/// server goes on serving. 100,000 levels are 200 KB, over the default 64 KiB limit (413): a
/// server with a 1 MiB limit lets them reach the parser.
#[tokio::test(flavor = "multi_thread")]
async fn deeply_nested_json_is_refused_without_a_stack_overflow() {
    let options = vaultfs::server::ServerOptions {
        max_json_body: 1 << 20,
        ..Default::default()
    };
    for (s, depths) in [
        (TestServer::start().await, &[129usize, 1_000, 10_000][..]),
        (
            TestServer::start_with(Default::default(), options).await,
            &[30_000usize, 100_000][..],
        ),
    ] {
        let creds = s.user("alice@example.com", "Acme").await;
        let http = reqwest::Client::new();
        let id = a_file(&http, &s.base, &creds, "a.txt").await;
        for &depth in depths {
            let bodies = [
                format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
                format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)),
                format!(
                    "{{\"create_file\": {}{}}}",
                    "[".repeat(depth),
                    "]".repeat(depth)
                ),
            ];
            for body in bodies {
                for (method, path) in json_routes(&id) {
                    let (status, answer) = send(
                        &http,
                        &s.base,
                        &creds,
                        method.clone(),
                        &path,
                        body.clone().into_bytes(),
                    )
                    .await;
                    let what = format!("{method} {path} with {depth} levels");
                    assert_answer(&what, status, &answer);
                    assert_eq!(status, 400, "{what}");
                    // Nesting under a key the route ignores may be skipped whole (then a
                    // required field is missing); a top-level array that deep is bad JSON.
                    let v: Value = serde_json::from_slice(&answer).unwrap();
                    let code = v["error"]["error_name"].as_str().unwrap();
                    if body.starts_with('[') {
                        assert_eq!(code, "bad_json", "{what}");
                    } else {
                        assert!(
                            ["bad_json", "missing_parameter", "bad_request"].contains(&code),
                            "{what}: {code}"
                        );
                    }
                }
            }
        }
        // Still serving.
        let (status, _) = send(&http, &s.base, &creds, Method::GET, VAULT, vec![]).await;
        assert_eq!(status, 200);
    }
}

/// A JSON body over the limit is 413 `body_too_large` on every route that reads one, also when
/// it is sent without a Content-Length (chunked), and the server goes on serving.
#[tokio::test(flavor = "multi_thread")]
async fn json_bodies_over_the_limit_are_413() {
    let s = TestServer::start().await;
    let creds = s.user("alice@example.com", "Acme").await;
    let http = reqwest::Client::new();
    let id = a_file(&http, &s.base, &creds, "a.txt").await;
    let limit = vaultfs::server::ServerOptions::default().max_json_body;
    let big = format!("{{\"client_id\": \"{}\"}}", "x".repeat(limit));
    for (method, path) in json_routes(&id) {
        let (status, answer) = send(
            &http,
            &s.base,
            &creds,
            method.clone(),
            &path,
            big.clone().into_bytes(),
        )
        .await;
        let what = format!("{method} {path}");
        assert_answer(&what, status, &answer);
        assert_eq!(status, 413, "{what}");
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
            .as_bytes()
            .chunks(4096)
            .map(|c| Ok(c.to_vec()))
            .collect();
        let resp = http
            .request(method.clone(), format!("{}{path}", s.base))
            .basic_auth(&creds.email, Some(&creds.token))
            .header("Content-Type", "application/json")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let answer = resp.bytes().await.unwrap();
        assert_answer(&format!("{what} (chunked)"), status, &answer);
        assert_eq!(status, 413, "{what} (chunked)");
    }
    let (status, _) = send(&http, &s.base, &creds, Method::GET, VAULT, vec![]).await;
    assert_eq!(status, 200);
}

/// A `Range` header that is not text is a bad range like any other: 416, in the envelope.
#[tokio::test(flavor = "multi_thread")]
async fn unreadable_range_header_is_416() {
    let s = TestServer::start().await;
    let creds = s.user("alice@example.com", "Acme").await;
    let http = reqwest::Client::new();
    let id = a_file(&http, &s.base, &creds, "a.txt").await;
    let resp = http
        .get(format!("{}/files/id/Document/{id}", s.base))
        .basic_auth(&creds.email, Some(&creds.token))
        .header(
            "Range",
            HeaderValue::from_bytes(b"bytes=\xff-\xfe").unwrap(),
        )
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let answer = resp.bytes().await.unwrap();
    assert_answer("GET with a non-ASCII Range", status, &answer);
    assert_eq!(status, 416);
}

// ----- a hostile server against a real mount -----

/// A server that lies about IDs: a tree of nodes by decoded path (below `/nodes/pth`) and the
/// bytes of every file, whatever ID the client asks for.
struct LyingServer {
    nodes: std::collections::BTreeMap<String, Value>,
    bytes: Vec<u8>,
    /// A folder whose listing never ends: `total_children` 10^15 and 1,000 new names on every
    /// page, however far the client reads.
    endless: Option<String>,
    /// Pages of `endless` sent.
    endless_pages: AtomicU64,
}

/// A page of the endless folder at `path`: 1,000 files never sent before.
fn endless_page(path: &str, page: u64) -> Vec<Value> {
    (0..1000)
        .map(|i| {
            let name = format!("f{page}-{i}");
            json!({"name": name, "uri": format!("/nodes/pth{path}/{name}"), "id": format!("{page}{i:03}"),
                "nodeType": "FileNodeType", "size": 1, "modifiedOn": "2026-01-01T00:00:00Z"})
        })
        .collect()
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl LyingServer {
    fn answer(&self, req: axum::extract::Request) -> Response {
        let uri = req.uri().clone();
        let path = percent_encoding::percent_decode_str(uri.path())
            .decode_utf8_lossy()
            .into_owned();
        let query = uri.query().unwrap_or("");
        let envelope = |v: Value| {
            let body = serde_json::to_vec(&json!({"error": {"success": true}, "message": v}));
            let mut r = (StatusCode::OK, body.unwrap()).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        };
        if let Some(rest) = path.strip_prefix("/nodes/pth") {
            let rest = rest.trim_end_matches('/');
            let Some(node) = self.nodes.get(rest) else {
                let body = json!({"error": {"success": false, "error_code": "not_found",
                    "error_text": "no such node", "status_code": 404}});
                return (StatusCode::NOT_FOUND, body.to_string()).into_response();
            };
            let mut node = node.clone();
            if query.contains("children=1") && self.endless.as_deref() == Some(rest) {
                let page = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("page="))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                self.endless_pages.fetch_add(1, Ordering::Relaxed);
                node["total_children"] = json!(1_000_000_000_000_000u64);
                node["children"] = json!(endless_page(rest, page));
                return envelope(node);
            }
            if query.contains("children=1") {
                let first_page = !query.contains("page=") || query.contains("page=0");
                let children: Vec<Value> = self
                    .nodes
                    .iter()
                    .filter(|(p, _)| !p.is_empty() && parent_of(p) == rest)
                    .map(|(_, n)| n.clone())
                    .collect();
                node["total_children"] = json!(children.len());
                node["children"] = json!(if first_page { children } else { vec![] });
            }
            return envelope(node);
        }
        if path.starts_with("/files/id/Document/") {
            let total = self.bytes.len();
            let range = req
                .headers()
                .get(header::RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes="))
                .and_then(|v| v.split_once('-'))
                .and_then(|(a, b)| {
                    let a: usize = a.parse().ok()?;
                    let b: usize = b.parse::<usize>().unwrap_or(total - 1).min(total - 1);
                    (a <= b).then_some((a, b))
                });
            let (status, body, content_range) = match range {
                Some((a, b)) => (
                    StatusCode::PARTIAL_CONTENT,
                    self.bytes[a..=b].to_vec(),
                    Some(format!("bytes {a}-{b}/{total}")),
                ),
                None => (StatusCode::OK, self.bytes.clone(), None),
            };
            let mut r = (status, body).into_response();
            let h = r.headers_mut();
            h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
            if let Some(cr) = content_range {
                h.insert(header::CONTENT_RANGE, HeaderValue::from_str(&cr).unwrap());
            }
            return r;
        }
        (StatusCode::NOT_FOUND, "{}").into_response()
    }
}

/// A real mount (`root/mnt`, cache in `root/cache`) of a [`LyingServer`] on loopback, with
/// `--timeout` seconds; unmounted when dropped, before the server's runtime goes.
struct LyingMount {
    mount: common::mount::Mount,
    server: Arc<LyingServer>,
    _rt: tokio::runtime::Runtime,
}

/// `server` on loopback: its base URL.
async fn serve_lying(server: Arc<LyingServer>) -> String {
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let server = server.clone();
        async move { server.answer(req) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

fn mount_lying(server: LyingServer, root: &std::path::Path, timeout: f64) -> LyingMount {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = Arc::new(server);
    let base = rt.block_on(serve_lying(server.clone()));
    let config = root.join("config");
    common::save_login(
        &config.join("vaultfs/credentials.toml"),
        &base,
        common::Creds {
            email: "victim@example.com".into(),
            token: "token".into(),
        },
        Duration::from_secs(3600),
    );
    let cache = root.join("cache");
    let mount = common::mount::Mount::start_with_env(
        &root.join("mnt"),
        &[
            "--server",
            &base,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--timeout",
            &timeout.to_string(),
        ],
        &[("XDG_CONFIG_HOME", &config)],
    );
    LyingMount {
        mount,
        server,
        _rt: rt,
    }
}

/// A server that sends IDs (and md5s) meant to escape the mount's cache dir (`../../..`), too
/// long, with control characters, or hidden in a link's `&id=`: the mount writes nothing outside
/// its cache dir, names its cache files by a hash, shows EIO for the entries it cannot trust,
/// and keeps serving the others. (Before the fix, the first read created `<tmp>/escaped-none.0`
/// with the server's bytes.)
#[test]
fn hostile_ids_cannot_make_the_mount_write_outside_its_cache() {
    if !common::mount::fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let up = "../".repeat(40);
    let escape = |name: &str| {
        format!(
            "{up}{}/{name}",
            root.display().to_string().trim_start_matches('/')
        )
    };
    let content = b"the server's bytes\n".to_vec();
    let md5 = vaultfs::api::checksum::hex(&<md5::Md5 as md5::Digest>::digest(&content));
    let file = |path: &str, id: Option<String>, md5: &str| {
        let mut n = json!({
            "name": path.rsplit('/').next().unwrap(),
            "uri": format!("/nodes/pth{path}"),
            "nodeType": "FileNodeType",
            "size": content.len(),
            "md5_checksum": md5,
            "modifiedOn": "2026-01-01T00:00:00Z",
        });
        match id {
            Some(id) => n["id"] = json!(id),
            None => {
                n["link_uri"] = json!(format!("/files?view=info&id={}", escape("link-escaped")))
            }
        }
        (path.to_string(), n)
    };
    let folder = |path: &str, kind: &str| {
        let n = json!({"name": path.rsplit('/').next().unwrap(), "uri": format!("/nodes/pth{path}"),
            "nodeType": kind, "modifiedOn": "2026-01-01T00:00:00Z"});
        (path.to_string(), n)
    };
    let nodes = [
        folder("", "FolderNodeType"),
        folder("/Local", "AccountNodeType"),
        folder("/Local/V", "VaultNodeType"),
        file("/Local/V/good.txt", Some("1".into()), &md5),
        // A fine ID with an md5 that would climb out of the cache dir if it named a file.
        file("/Local/V/md5.txt", Some("2".into()), &escape("md5-escaped")),
        folder("/Local/V/evil", "FolderNodeType"),
        file("/Local/V/evil/x.txt", Some(escape("escaped")), &md5),
        folder("/Local/V/long", "FolderNodeType"),
        file("/Local/V/long/y.txt", Some("9".repeat(300)), &md5),
        folder("/Local/V/ctrl", "FolderNodeType"),
        file("/Local/V/ctrl/z.txt", Some("1\n\u{1b}[2J".into()), &md5),
        folder("/Local/V/link", "FolderNodeType"),
        file("/Local/V/link/w.txt", None, &md5),
    ];
    let server = LyingServer {
        nodes: nodes.into_iter().collect(),
        bytes: content.clone(),
        endless: None,
        endless_pages: Default::default(),
    };
    let lying = mount_lying(server, &root, 5.0);
    let (m, cache) = (&lying.mount, root.join("cache"));
    let mnt = m.dir.clone();
    let v = mnt.join("Local/V");
    assert_eq!(std::fs::read(v.join("good.txt")).unwrap(), content);
    assert_eq!(std::fs::read(v.join("md5.txt")).unwrap(), content);
    for entry in ["evil/x.txt", "long/y.txt", "ctrl/z.txt", "link/w.txt"] {
        let folder = v.join(entry).parent().unwrap().to_path_buf();
        let e = std::fs::read_dir(&folder).map(|d| d.count()).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "listing {entry}'s folder: {e}"
        );
        let e = std::fs::read(v.join(entry)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "reading {entry}: {e}");
    }
    // The mount goes on serving what it can trust.
    assert_eq!(std::fs::read(v.join("good.txt")).unwrap(), content);
    // Nothing was written outside the cache dir (the mount point is not walked: it is FUSE)...
    let mut outside = Vec::new();
    let mut todo = vec![root.clone()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p == mnt || p.starts_with(&cache) {
                continue;
            }
            if p.to_string_lossy().contains("escaped") {
                outside.push(p.clone());
            }
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    assert!(
        outside.is_empty(),
        "the mount wrote outside its cache: {outside:?}"
    );
    // ...and the cache's own files are named by a hash.
    for e in std::fs::read_dir(cache.join("cache")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (hash, n) = name.split_once('.').unwrap_or((&name, ""));
        assert!(
            hash.len() == 64
                && hash.bytes().all(|c| c.is_ascii_hexdigit())
                && n.parse::<u64>().is_ok(),
            "cache file {name:?}"
        );
    }
}

/// The tree of a lying server with one good file and the endless folder `/Local/V/endless`.
fn endless_server(content: &[u8]) -> LyingServer {
    let node = |path: &str, kind: &str| {
        let mut n = json!({"name": path.rsplit('/').next().unwrap(), "uri": format!("/nodes/pth{path}"),
            "nodeType": kind, "modifiedOn": "2026-01-01T00:00:00Z"});
        if kind == "FileNodeType" {
            n["id"] = json!("1");
            n["size"] = json!(content.len());
        }
        (path.to_string(), n)
    };
    LyingServer {
        nodes: [
            node("", "FolderNodeType"),
            node("/Local", "AccountNodeType"),
            node("/Local/V", "VaultNodeType"),
            node("/Local/V/good.txt", "FileNodeType"),
            node("/Local/V/endless", "FolderNodeType"),
        ]
        .into_iter()
        .collect(),
        bytes: content.to_vec(),
        endless: Some("/Local/V/endless".into()),
        endless_pages: Default::default(),
    }
}

/// A server claiming an endless folder: its listing is EIO after 4 x `--timeout` (before: `ls`
/// in state D for good, the mount growing by gigabytes); the mount stays small and answers on.
/// The listing runs on a thread of its own, so a listing that never ends fails the test.
#[test]
fn a_listing_that_never_ends_is_eio_within_its_bound() {
    endless_listing_through_a_mount(1.0, "did not end within");
}

/// The same with time to spare (`--timeout 30`): the bound of memory ends it first, at 256 MiB
/// of children (issue 47, item 14: the mount reached 704 MiB before the time bound).
#[test]
fn a_listing_that_never_ends_is_eio_within_its_memory() {
    endless_listing_through_a_mount(30.0, "children of more than 256 MiB");
}

fn endless_listing_through_a_mount(timeout: f64, why: &str) {
    if !common::mount::fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let content = b"a file beside the endless folder\n".to_vec();
    let lying = mount_lying(endless_server(&content), tmp.path(), timeout);
    let v = lying.mount.dir.join("Local/V");
    let list = |dir: std::path::PathBuf| {
        std::fs::read_dir(dir).and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect())
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    let dir = v.join("endless");
    std::thread::spawn(move || {
        let _ = tx.send(list(dir));
    });
    let r: std::io::Result<Vec<_>> = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the listing of the endless folder did not end within 90 s");
    let took = started.elapsed();
    let e = r.expect_err("an endless folder was listed");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // The bounds are 4 x --timeout and 256 MiB of children, whichever comes first; a page in
    // flight and a loaded machine add a little.
    assert!(
        took < Duration::from_secs_f64(4.0 * timeout + 10.0).min(Duration::from_secs(60)),
        "the listing failed after {took:?}"
    );
    let log = lying.mount.log_text();
    assert!(log.contains(why), "{log}");
    let pid = lying.mount.child.as_ref().unwrap().id();
    let (peak_kib, _) = common::memory_kib(pid);
    let (pages, mib) = (
        lying.server.endless_pages.load(Ordering::Relaxed),
        peak_kib / 1024,
    );
    println!("EIO after {took:?}, {pages} pages read, mount's peak memory {mib} MiB");
    // 256 MiB of children at most, and the mount's own (issue 47, item 14: 704 MiB before).
    assert!(mib < 320, "the mount grew to {mib} MiB");
    // The mount goes on answering, the folder beside included.
    assert_eq!(std::fs::read(v.join("good.txt")).unwrap(), content);
    let mut names = list(v.clone()).unwrap();
    names.sort();
    assert_eq!(names, ["endless", "good.txt"]);
}

/// The endless folder through the remote backend's `list_all`, its bound of entries lowered to
/// 20,000 (a million by default): `listing_too_large` after the pages that takes, not one more.
#[tokio::test(flavor = "multi_thread")]
async fn a_listing_stops_at_its_bound_of_entries() {
    let server = Arc::new(endless_server(b"x"));
    let base = serve_lying(server.clone()).await;
    let mut config = RemoteConfig::new(&base, "victim@example.com", "token");
    config.max_listing_entries = 20_000;
    let remote = RemoteBackend::new(config).unwrap();
    let folder = NodePath::parse_uri("/nodes/pth/Local/V/endless").unwrap();
    let started = std::time::Instant::now();
    let e = vaultfs::backend::list_all(&remote, &folder, 1000)
        .await
        .expect_err("an endless folder was listed");
    assert_eq!(e.code, "listing_too_large", "{e}");
    let pages = server.endless_pages.load(Ordering::Relaxed);
    assert_eq!(pages, 21, "pages asked for");
    assert!(started.elapsed() < Duration::from_secs(30));
    // The bound of memory: children of more than 4 MiB (the endless folder's hold about
    // 0.5 KiB each: a few pages).
    let mut config = RemoteConfig::new(&base, "victim@example.com", "token");
    config.max_listing_bytes = 4 << 20;
    let small = RemoteBackend::new(config).unwrap();
    let before = server.endless_pages.load(Ordering::Relaxed);
    let e = vaultfs::backend::list_all(&small, &folder, 1000)
        .await
        .expect_err("an endless folder was listed");
    assert_eq!(e.code, "listing_too_large", "{e}");
    assert!(e.message.contains("MiB"), "{e}");
    let pages = server.endless_pages.load(Ordering::Relaxed) - before;
    assert!((2..=20).contains(&pages), "{pages} pages asked for");
    // A folder within the bound is listed whole (the vault: two children).
    let vault = NodePath::parse_uri("/nodes/pth/Local/V").unwrap();
    let node = vaultfs::backend::list_all(&remote, &vault, 1000)
        .await
        .unwrap();
    assert_eq!(node.children.unwrap().len(), 2);
}
