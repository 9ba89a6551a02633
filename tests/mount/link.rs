//! `vaultfs link FILE` against a server that lies (issue 47, item 5): what it prints is a web
//! address or nothing. The links a server sends are taken only as `http`/`https` addresses
//! without control or bidi characters (a relative one joined to the server the mount uses), and
//! only from files in a vaultfs mount (an attribute anyone can plant on a file elsewhere is
//! not a link).

use std::process::Command;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::common::mount::{BIN, Mount, fuse_available};

/// A server of a few nodes by path (below `/nodes/pth`); whatever else is asked is 404.
async fn serve_nodes(nodes: Vec<(&'static str, Value)>) -> String {
    let nodes: std::collections::BTreeMap<&str, Value> = nodes.into_iter().collect();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let nodes = nodes.clone();
        async move {
            let path = percent_encoding::percent_decode_str(req.uri().path())
                .decode_utf8_lossy()
                .into_owned();
            let rest = path.strip_prefix("/nodes/pth").unwrap_or("?");
            let rest = rest.trim_end_matches('/');
            let Some(node) = nodes.get(rest) else {
                return (StatusCode::NOT_FOUND, "{}").into_response();
            };
            let mut node = node.clone();
            if req.uri().query().unwrap_or("").contains("children=1") {
                let children: Vec<Value> = nodes
                    .iter()
                    .filter(|(p, _)| {
                        !p.is_empty() && p.rsplit_once('/').map_or("", |(d, _)| d) == rest
                    })
                    .map(|(_, n)| n.clone())
                    .collect();
                node["total_children"] = json!(children.len());
                node["children"] = json!(children);
            }
            let body = json!({"error": {"success": true}, "message": node}).to_string();
            let mut r = (StatusCode::OK, body).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

fn link(file: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(BIN).arg("link").arg(file).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn link_prints_only_web_addresses_of_files_in_a_mount() {
    if !fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let folder = |path: &str, kind: &str| {
        json!({"name": path.rsplit('/').next().unwrap(), "uri": format!("/nodes/pth{path}"),
            "nodeType": kind, "modifiedOn": "2026-01-01T00:00:00Z"})
    };
    let file = |path: &str, id: u32, link: &str| {
        json!({"name": path.rsplit('/').next().unwrap(), "uri": format!("/nodes/pth{path}"),
            "id": id.to_string(), "nodeType": "FileNodeType", "size": 0,
            "md5_checksum": "d41d8cd98f00b204e9800998ecf8427e",
            "modifiedOn": "2026-01-01T00:00:00Z", "link_uri": link})
    };
    let clipboard = "https://vault.example/\u{1b}]52;c;b3duZWQ=\u{7}\u{1b}[2J";
    let nodes = vec![
        ("", folder("", "FolderNodeType")),
        ("/Local", folder("/Local", "AccountNodeType")),
        ("/Local/V", folder("/Local/V", "VaultNodeType")),
        (
            "/Local/V/clipboard.txt",
            file("/Local/V/clipboard.txt", 1, clipboard),
        ),
        (
            "/Local/V/bidi.txt",
            file("/Local/V/bidi.txt", 2, "https://x.example/\u{202e}fdp.exe"),
        ),
        (
            "/Local/V/script.txt",
            file("/Local/V/script.txt", 3, "javascript:alert(1)"),
        ),
        (
            "/Local/V/ours.txt",
            file("/Local/V/ours.txt", 4, "/web/file/4?view=info&id=4"),
        ),
        (
            "/Local/V/abs.txt",
            file("/Local/V/abs.txt", 5, "https://vault.example/web/file/5"),
        ),
    ];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = rt.block_on(serve_nodes(nodes));
    let config = tmp.path().join("config");
    crate::common::save_login(
        &config.join("vaultfs/credentials.toml"),
        &base,
        crate::common::Creds {
            email: "victim@example.com".into(),
            token: "token".into(),
        },
        Duration::from_secs(3600),
    );
    let cache = tmp.path().join("cache");
    let m = Mount::start_with_env(
        &tmp.path().join("mnt"),
        &["--server", &base, "--cache-dir", cache.to_str().unwrap()],
        &[("XDG_CONFIG_HOME", &config)],
    );
    let v = m.dir.join("Local/V");
    let raw = |s: &str| {
        s.chars()
            .any(|c| c.is_control() && c != '\n' || c == '\u{202e}')
    };
    // Escape sequences (the clipboard, the screen), a right-to-left override, another scheme:
    // refused, with what was sent made visible.
    for name in ["clipboard.txt", "bidi.txt", "script.txt"] {
        let (ok, out, err) = link(&v.join(name));
        assert!(!ok, "{name}: {out:?}");
        assert_eq!(out, "", "{name}");
        assert!(!raw(&err), "{name}: {err:?}");
        assert!(err.contains("not a web address"), "{name}: {err}");
    }
    let (_, _, err) = link(&v.join("clipboard.txt"));
    assert!(err.contains("\\x1b]52;c;b3duZWQ=\\x07\\x1b[2J"), "{err}");
    // A link relative to the server (ours sends them so) is made absolute against it; an
    // absolute one is printed as sent.
    assert_eq!(
        link(&v.join("ours.txt")),
        (
            true,
            format!("{base}/web/file/4?view=info&id=4\n"),
            String::new()
        )
    );
    assert_eq!(
        link(&v.join("abs.txt")),
        (
            true,
            "https://vault.example/web/file/5\n".into(),
            String::new()
        )
    );
    // A file outside any mount with the attribute planted: not a link.
    let planted = tmp.path().join("planted.txt");
    std::fs::write(&planted, b"x").unwrap();
    let set = Command::new("setfattr")
        .args(["-n", "user.vaultfs.link_uri", "-v", "https://evil.example/"])
        .arg(&planted)
        .status();
    if !set.is_ok_and(|s| s.success()) {
        eprintln!("(no user xattrs here: the planted attribute is not set)");
    }
    let (ok, out, err) = link(&planted);
    assert!(!ok, "{out:?}");
    assert_eq!(out, "");
    assert!(err.contains("not in a vaultfs mount"), "{err}");
    m.unmount();
}

/// A real `vaultfs serve`'s links (item 6): absolute from `--public-url`, so `vaultfs link`
/// through a mount prints the address users reach, not the one the mount uses.
#[test]
fn link_prints_the_servers_public_url() {
    if !fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    use crate::common::TestServer;
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Signed in before (the sign-in page would send the browser to the public URL).
    let (alice, dir, _data) = rt.block_on(async {
        let first = TestServer::start().await;
        let alice = first.user("alice@example.com", "Acme").await;
        let dir = first.dir.clone();
        (alice, dir, first.stop().await)
    });
    let options = vaultfs::server::ServerOptions {
        public_url: Some("https://files.example".into()),
        ..Default::default()
    };
    let s = rt.block_on(TestServer::start_in(&dir, Default::default(), options));
    let id = rt.block_on(crate::common::upload(
        &reqwest::Client::new(),
        &s.base,
        &alice,
        "/nodes/pth/Acme/My%20First%20Vault",
        "report.txt",
        b"numbers",
    ));
    let config = tmp.path().join("config");
    let login = vaultfs::cli::login::Credentials {
        server: s.base.clone(),
        email: alice.email.clone(),
        token: alice.token.clone().into(),
        expires_at: std::time::SystemTime::now() + Duration::from_secs(3600),
    };
    vaultfs::cli::login::save_credentials(&config.join("vaultfs/credentials.toml"), &login)
        .unwrap();
    let cache = tmp.path().join("cache");
    let m = Mount::start_with_env(
        &tmp.path().join("mnt"),
        &["--server", &s.base, "--cache-dir", cache.to_str().unwrap()],
        &[("XDG_CONFIG_HOME", &config)],
    );
    let got = link(&m.dir.join("Acme/My First Vault/report.txt"));
    m.unmount();
    rt.block_on(s.stop());
    assert_eq!(
        got,
        (
            true,
            format!("https://files.example/web/file/{id}?view=info&id={id}\n"),
            String::new()
        )
    );
}
