//! Between accounts: another account's IDs told from none (item 9), and copies and accounts
//! bounded by the request's bound and the quotas (item 12).

use super::{call, client_from, mkdir, new_file};
use crate::common::TestServer;

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
