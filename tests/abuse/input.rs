//! Hostile input: names (item 15: NFC, no control or bidirectional characters), and the request
//! parsers fuzzed over a real server.

use std::time::Duration;

use super::{addr_of, call, client_from, connect_from};
use crate::common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vaultfs::server::ServerOptions;

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
