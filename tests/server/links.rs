//! The web links of files are absolute (issue 47, item 6): `--public-url` when set, else the
//! request's own `Host` (a trusted proxy's `X-Forwarded-Proto`/`-Host`), else relative.

use reqwest::Method;
use vaultfs::server::ServerOptions;
use vaultfs::store::StoreConfig;

use crate::common::TestServer;
use crate::{Api, VAULT};

const LINKS: [(&str, &str); 3] = [
    ("link_uri", "/web/file/ID?view=info&id=ID"),
    ("preview_link_uri", "/web/preview/ID?view=preview&id=ID"),
    ("download_link_uri", "/web/download/ID?download=1&id=ID"),
];

/// The file `f.txt`'s node and its listing's entry, asked with `headers`: both with each link
/// `base` + its path (the API's download route stays a path).
async fn assert_links(api: &Api, id: &str, headers: &[(&str, &str)], base: &str) {
    for path in [format!("{VAULT}/f.txt"), format!("{VAULT}?children=1")] {
        let mut r = api.req(Method::GET, &path);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let v: serde_json::Value = r.send().await.unwrap().json().await.unwrap();
        let f = match v["message"]["children"].as_array() {
            Some(c) => &c[0],
            None => &v["message"],
        };
        for (link, want) in LINKS {
            assert_eq!(
                f[link].as_str().unwrap(),
                format!("{base}{}", want.replace("ID", id)),
                "{path} {headers:?}"
            );
        }
        assert_eq!(f["download_uri"], format!("/files/id/Document/{id}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn links_are_absolute_from_the_host_or_a_trusted_proxy() {
    let options = ServerOptions {
        trusted_proxies: vec!["10.9.9.0/24".parse().unwrap()],
        ..ServerOptions::default()
    };
    let s = TestServer::start_with(StoreConfig::default(), options).await;
    let api = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let id = api.upload(VAULT, "f.txt", b"x").await;
    // The address the client asked for.
    assert_links(&api, &id, &[], &s.base).await;
    assert_links(
        &api,
        &id,
        &[("host", "Vault.Example:8080")],
        "http://vault.example:8080",
    )
    .await;
    // A forwarding header from a client that is no trusted proxy says nothing.
    let forwarded = [
        ("host", "vault.example"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil.example"),
    ];
    assert_links(&api, &id, &forwarded, "http://vault.example").await;
    // A Host that is no host name: the links stay relative.
    for bad in ["a b", "x/y", "u@h", "h:port"] {
        assert_links(&api, &id, &[("host", bad)], "").await;
    }

    // Behind a trusted proxy (here: loopback), its scheme and host.
    let options = ServerOptions {
        trusted_proxies: vec!["127.0.0.0/8".parse().unwrap()],
        ..ServerOptions::default()
    };
    let p = TestServer::start_with(StoreConfig::default(), options).await;
    let api = Api::new(&p, &p.user("alice@example.com", "Acme").await);
    let id = api.upload(VAULT, "f.txt", b"x").await;
    assert_links(&api, &id, &forwarded, "https://evil.example").await;
    p.stop().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn links_use_the_public_url_whatever_the_request_says() {
    let options = ServerOptions {
        public_url: Some("https://files.example".into()),
        trusted_proxies: vec!["127.0.0.0/8".parse().unwrap()],
        ..ServerOptions::default()
    };
    // Signed in before (the sign-in page would send the browser to the public URL).
    let first = TestServer::start().await;
    let alice = first.user("alice@example.com", "Acme").await;
    let dir = first.dir.clone();
    let _tmp = first.stop().await;
    let s = TestServer::start_in(&dir, StoreConfig::default(), options).await;
    let api = Api::new(&s, &alice);
    let id = api.upload(VAULT, "f.txt", b"x").await;
    for headers in [
        vec![],
        vec![("host", "other.example")],
        vec![
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "http"),
        ],
    ] {
        assert_links(&api, &id, &headers, "https://files.example").await;
    }
    s.stop().await;
}
