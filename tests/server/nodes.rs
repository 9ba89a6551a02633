//! Nodes: reading and paging, folders, copy, move and delete, paths (traversal, depth) and deep
//! trees.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::common::md5hex;
use crate::{VAULT, assert_error, assert_errors, names, raw_request, setup};

#[tokio::test(flavor = "multi_thread")]
async fn get_node_and_list_children_with_paging() {
    let (s, api) = setup().await;
    // The root lists only the caller's account, and a new account has its first vault.
    let (st, v) = api.get("/nodes/pth?children=1").await;
    assert_eq!(st, 200);
    assert_eq!(names(&v), ["Acme"]);
    let (_, v) = api.get("/nodes/pth/Acme?children=1").await;
    assert_eq!(names(&v), ["My First Vault"]);
    assert_eq!(v["message"]["children"][0]["nodeType"], "VaultNodeType");

    let mut expected = Vec::new();
    for i in 0..25 {
        let name = format!("f{i:02}.txt");
        api.upload(VAULT, &name, format!("content {i}").as_bytes())
            .await;
        expected.push(name);
    }
    let (_, v) = api
        .call(Method::PUT, &format!("{VAULT}/sub"), Some(json!({})))
        .await;
    assert_eq!(v["message"]["nodeType"], "FolderNodeType");
    expected.push("sub".into());
    expected.sort();

    let mut seen = Vec::new();
    for page in 0..4 {
        let (st, v) = api
            .get(&format!("{VAULT}?children=1&page={page}&per_page=7"))
            .await;
        assert_eq!(st, 200);
        assert_eq!(v["message"]["total_children"], 26);
        seen.extend(names(&v));
    }
    assert_eq!(seen, expected);

    // A file node carries everything docs/design.md lists.
    let (st, v) = api.get(&format!("{VAULT}/f03.txt")).await;
    assert_eq!(st, 200);
    let f = &v["message"];
    let id = f["id"].as_str().unwrap();
    assert!(id.bytes().all(|c| c.is_ascii_digit()));
    assert_eq!(f["name"], "f03.txt");
    assert_eq!(f["uri"], "/nodes/pth/Acme/My First Vault/f03.txt");
    assert_eq!(f["nodeType"], "FileNodeType");
    assert_eq!(f["size"], 9);
    assert_eq!(f["md5_checksum"], md5hex(b"content 3"));
    for link in ["link_uri", "preview_link_uri", "download_link_uri"] {
        assert!(
            f[link].as_str().unwrap().ends_with(&format!("&id={id}")),
            "{link}"
        );
    }
    assert_eq!(f["download_uri"], format!("/files/id/Document/{id}"));
    assert!(f["createdOn"].as_str().unwrap().ends_with('Z'));
    assert!(f["modifiedOn"].as_str().unwrap().ends_with('Z'));

    assert_error(
        &api.get(&format!("{VAULT}/missing.txt")).await,
        404,
        "not_found",
    );
    assert_error(
        &api.get(&format!("{VAULT}?children=1&per_page=0")).await,
        400,
        "bad_parameter",
    );
    assert_error(
        &api.get(&format!("{VAULT}?children=1&page=x")).await,
        400,
        "bad_parameter",
    );
    drop(s);
}

#[tokio::test(flavor = "multi_thread")]
async fn path_traversal_in_every_spelling_is_bad_path() {
    let (_s, api) = setup().await;
    api.upload(VAULT, "a.txt", b"a").await;
    for bad in [
        "/nodes/pth/Acme/My%20First%20Vault/../a.txt",
        "/nodes/pth/Acme/My%20First%20Vault/%2e%2e/a.txt",
        "/nodes/pth/Acme/My%20First%20Vault/%2E%2E",
        "/nodes/pth/Acme/My%20First%20Vault/.%2E/x",
        "/nodes/pth/Acme/My%20First%20Vault/./a.txt",
        "/nodes/pth/Acme/My%20First%20Vault/a%2Fb",
        "/nodes/pth/Acme/My%20First%20Vault/a%2fb",
        "/nodes/pth/Acme//My%20First%20Vault",
        "/nodes/pth/Acme/My%20First%20Vault/a%00b",
        "/nodes/pth/Acme/My%20First%20Vault/%ff%fe",
    ] {
        // Sent raw: an HTTP client library would normalize dot segments before sending.
        for method in ["GET", "DELETE", "PUT"] {
            assert_error(&raw_request(&api, method, bad).await, 400, "bad_path");
        }
    }
    // Names with `/` or `..` in upload step 1.
    for name in ["a/b", "..", ".", "", "x\u{0}y"] {
        let got = api
            .call(
                Method::PUT,
                VAULT,
                Some(json!({"create_file": [{"name": name}]})),
            )
            .await;
        assert_eq!(got.0, 400, "{name:?}: {}", got.1);
    }
    // dst_uri outside /nodes/pth or with traversal.
    for dst in [
        "/files/id/Document/1",
        "/nodes/pth/Acme/My First Vault/../x",
        "nodes/pth/Acme/x",
        "/nodes/pthx",
    ] {
        let got = api
            .call(
                Method::POST,
                &format!("{VAULT}/a.txt"),
                Some(json!({"copy": {"dst_uri": dst, "replace": "fail"}})),
            )
            .await;
        assert_error(&got, 400, "bad_path");
    }
    // Nothing was created or changed by any of it.
    let (_, v) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(names(&v), ["a.txt"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn folders_create_conflict_and_missing_parent() {
    let (_s, api) = setup().await;
    let (st, v) = api
        .call(Method::PUT, &format!("{VAULT}/docs"), Some(json!({})))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["uri"], "/nodes/pth/Acme/My First Vault/docs");
    // An empty body is `{}` too.
    let resp = api
        .req(Method::PUT, &format!("{VAULT}/docs/inner"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    api.upload(VAULT, "f.txt", b"x").await;
    let (docs, nope) = (format!("{VAULT}/docs"), format!("{VAULT}/nope/x"));
    let (file, in_file) = (format!("{VAULT}/f.txt"), format!("{VAULT}/f.txt/x"));
    assert_errors(
        &api,
        Method::PUT,
        &[
            (&docs, json!({}), 409, "exists"),
            (&nope, json!({}), 404, "not_found"),
            ("/nodes/pth/Acme/NewVault", json!({}), 403, "forbidden"),
            (&docs, json!({"bogus": 1}), 400, "bad_request"),
            // A folder of a file's name, and a folder inside a file.
            (&file, json!({}), 409, "exists"),
            (&in_file, json!({}), 409, "not_a_folder"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_and_move_files_and_folders() {
    let (s, api) = setup().await;
    let id = api.upload(VAULT, "a.txt", b"alpha").await;
    api.call(Method::PUT, &format!("{VAULT}/d1"), Some(json!({})))
        .await;
    api.upload(&format!("{VAULT}/d1"), "inner.txt", b"inner")
        .await;
    let blobs = s.store.blob_count().unwrap();
    let xfer = |op: &str, src: &str, dst: &str, replace: &str| {
        (
            format!("{VAULT}/{src}"),
            json!({op: {"dst_uri": format!("/nodes/pth/Acme/My First Vault/{dst}"), "replace": replace}}),
        )
    };

    // Copy shares the bytes: no new blob.
    let (p, b) = xfer("copy", "a.txt", "b.txt", "fail");
    let (st, v) = api.call(Method::POST, &p, Some(b)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["name"], "b.txt");
    let bid = v["message"]["id"].as_str().unwrap().to_string();
    assert_ne!(bid, id);
    assert_eq!(api.download(&bid).await, b"alpha");
    assert_eq!(s.store.blob_count().unwrap(), blobs);
    // Existing destination: fail -> 409; Replace (any case) -> overwritten.
    api.upload(VAULT, "c.txt", b"gamma").await;
    let (p, b) = xfer("copy", "a.txt", "c.txt", "fail");
    assert_error(&api.call(Method::POST, &p, Some(b)).await, 409, "exists");
    let (p, b) = xfer("copy", "c.txt", "b.txt", "Replace");
    assert_eq!(api.call(Method::POST, &p, Some(b)).await.0, 200);
    let (_, v) = api.get(&format!("{VAULT}/b.txt")).await;
    assert_eq!(
        api.download(v["message"]["id"].as_str().unwrap()).await,
        b"gamma"
    );
    // Folder copy is recursive.
    let (p, b) = xfer("copy", "d1", "d2", "fail");
    assert_eq!(api.call(Method::POST, &p, Some(b)).await.0, 200);
    let (_, v) = api.get(&format!("{VAULT}/d2/inner.txt")).await;
    assert_eq!(
        api.download(v["message"]["id"].as_str().unwrap()).await,
        b"inner"
    );

    // Move keeps the ID; across folders; the source is gone.
    let (p, b) = xfer("move", "a.txt", "d2/moved.txt", "fail");
    let (st, v) = api.call(Method::POST, &p, Some(b)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["id"], id.as_str());
    assert_eq!(
        v["message"]["uri"],
        "/nodes/pth/Acme/My First Vault/d2/moved.txt"
    );
    assert_error(&api.get(&format!("{VAULT}/a.txt")).await, 404, "not_found");
    // Into itself, onto the other kind, onto a non-empty folder; missing source, missing
    // destination folder.
    for (op, src, dst, replace, status, code) in [
        ("move", "d1", "d1/sub", "fail", 400, "move_into_self"),
        ("copy", "d1", "d1/sub", "fail", 400, "move_into_self"),
        ("move", "c.txt", "d1", "replace", 409, "type_mismatch"),
        ("move", "d1", "d2", "replace", 409, "not_empty"),
        ("move", "nope.txt", "x.txt", "fail", 404, "not_found"),
        ("move", "c.txt", "nowhere/x.txt", "fail", 404, "not_found"),
    ] {
        let (p, b) = xfer(op, src, dst, replace);
        assert_errors(&api, Method::POST, &[(&p, b, status, code)]).await;
    }
    // Malformed bodies.
    let src = format!("{VAULT}/c.txt");
    let dst = "/nodes/pth/Acme/My First Vault/z.txt";
    let two = json!({"copy": {"dst_uri": dst, "replace": "fail"}, "move": {"dst_uri": dst, "replace": "fail"}});
    assert_errors(
        &api,
        Method::POST,
        &[
            (
                &src,
                json!({"copy": {"dst_uri": dst, "replace": "maybe"}}),
                400,
                "bad_parameter",
            ),
            (
                &src,
                json!({"copy": {"dst_uri": dst}}),
                400,
                "missing_parameter",
            ),
            (
                &src,
                json!({"copy": {"replace": "fail"}}),
                400,
                "missing_parameter",
            ),
            (&src, two, 400, "bad_request"),
            (&src, json!({"rename": {}}), 400, "bad_request"),
        ],
    )
    .await;
    // Vaults and accounts do not move.
    let vault_move =
        json!({"move": {"dst_uri": "/nodes/pth/Acme/My First Vault/v", "replace": "fail"}});
    assert_error(
        &api.call(Method::POST, VAULT, Some(vault_move)).await,
        403,
        "forbidden",
    );
    assert!(s.store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_files_and_folders_frees_unshared_bytes() {
    let (s, api) = setup().await;
    let id = api.upload(VAULT, "a.txt", b"unique bytes").await;
    api.call(Method::PUT, &format!("{VAULT}/d"), Some(json!({})))
        .await;
    api.upload(&format!("{VAULT}/d"), "x.txt", b"x content")
        .await;
    api.upload(&format!("{VAULT}/d"), "shared.txt", b"unique bytes")
        .await;
    let blobs = s.store.blob_count().unwrap();
    assert_eq!(blobs, 2);

    let (st, v) = api
        .call(Method::DELETE, &format!("{VAULT}/a.txt"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(v, json!({"error": {"success": true}}));
    assert_error(&api.get(&format!("{VAULT}/a.txt")).await, 404, "not_found");
    assert_error(
        &api.get(&format!("/files/id/Document/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &api.call(Method::DELETE, &format!("{VAULT}/a.txt"), None)
            .await,
        404,
        "not_found",
    );
    assert_eq!(
        s.store.blob_count().unwrap(),
        2,
        "still used by d/shared.txt"
    );

    assert_eq!(
        api.call(Method::DELETE, &format!("{VAULT}/d"), None)
            .await
            .0,
        200
    );
    assert_error(
        &api.get(&format!("{VAULT}/d/x.txt")).await,
        404,
        "not_found",
    );
    assert_eq!(s.store.blob_count().unwrap(), 0);
    assert_error(
        &api.call(Method::DELETE, VAULT, None).await,
        403,
        "forbidden",
    );
    assert_error(
        &api.call(Method::DELETE, "/nodes/pth/Acme", None).await,
        403,
        "forbidden",
    );
    assert!(s.store.check_integrity().unwrap().is_empty());
}

// ----- deep trees (issue 19, item 2) -----

/// The encoded path of a chain of `n` folders named `c` under `base`.
fn chain(base: &str, n: usize) -> String {
    let mut p = base.to_string();
    for _ in 0..n {
        p.push_str("/c");
    }
    p
}

/// Paths are at most 256 segments on every route (400 `path_too_deep`), and a copy or move that
/// would put a node deeper is refused the same way. The sequence (a chain of 64 folders
/// doubled by copy + move, 76 requests) overflowed the stack of `copy_tree` and aborted the
/// server; now the doubling stops at the bound, and a copy of a tree as deep as allowed works.
#[tokio::test(flavor = "multi_thread")]
async fn deep_trees_are_bounded_and_copied_without_recursion() {
    let (s, api) = setup().await;
    let max = vaultfs::api::path::MAX_PATH_DEPTH;
    // The vault is 2 segments deep: 254 folders reach the bound.
    for i in 1..=max - 2 {
        let (st, v) = api
            .call(Method::PUT, &chain(VAULT, i), Some(json!({})))
            .await;
        assert_eq!(st, 200, "folder {i}: {v}");
    }
    let deepest = chain(VAULT, max - 2);
    let over = format!("{deepest}/x");
    assert_error(
        &api.call(Method::PUT, &over, Some(json!({}))).await,
        400,
        "path_too_deep",
    );
    assert_error(
        &api.call(
            Method::PUT,
            &deepest,
            Some(json!({"create_file": [{"name": "f"}]})),
        )
        .await,
        400,
        "path_too_deep",
    );
    for method in [Method::GET, Method::DELETE] {
        assert_error(
            &api.call(method.clone(), &over, None).await,
            400,
            "path_too_deep",
        );
    }
    let deep_uri = format!("/nodes/pth/Acme/My First Vault{}/x", "/c".repeat(max - 2));
    assert_error(
        &api.call(
            Method::POST,
            &format!("{VAULT}/c"),
            Some(json!({"copy": {"dst_uri": deep_uri, "replace": "fail"}})),
        )
        .await,
        400,
        "path_too_deep",
    );
    assert_error(
        &api.call(
            Method::POST,
            &over,
            Some(
                json!({"move": {"dst_uri": "/nodes/pth/Acme/My First Vault/y", "replace": "fail"}}),
            ),
        )
        .await,
        400,
        "path_too_deep",
    );
    // A copy of the whole chain beside it: as deep as allowed, copied node by node.
    let (st, v) = api
        .call(
            Method::POST,
            &format!("{VAULT}/c"),
            Some(
                json!({"copy": {"dst_uri": "/nodes/pth/Acme/My First Vault/k", "replace": "fail"}}),
            ),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let copy_deepest = format!("{VAULT}/k{}", "/c".repeat(max - 3));
    assert_eq!(api.get(&copy_deepest).await.0, 200);
    // Moved one level down, its deepest folder would be 257 deep.
    assert_error(
        &api.call(
            Method::POST,
            &format!("{VAULT}/k"),
            Some(json!({"move": {"dst_uri": "/nodes/pth/Acme/My First Vault/c/k", "replace": "fail"}})),
        )
        .await,
        400,
        "path_too_deep",
    );
    assert_eq!(
        api.call(Method::DELETE, &format!("{VAULT}/k"), None)
            .await
            .0,
        200
    );
    assert_eq!(
        api.call(Method::DELETE, &format!("{VAULT}/c"), None)
            .await
            .0,
        200
    );

    // The sequence: 64 folders, then copy the chain beside itself and move the copy to
    // the bottom of the original, 6 times.
    let base = format!("{VAULT}/chain");
    let base_uri = "/nodes/pth/Acme/My First Vault/chain";
    api.call(Method::PUT, &base, Some(json!({}))).await;
    for i in 1..=64 {
        assert_eq!(
            api.call(Method::PUT, &chain(&base, i), Some(json!({})))
                .await
                .0,
            200
        );
    }
    // The names along the chain below `chain`.
    let mut segs: Vec<String> = vec!["c".to_string(); 64];
    let mut refused = 0;
    for _ in 0..6 {
        let (st, v) = api
            .call(
                Method::POST,
                &format!("{base}/c"),
                Some(json!({"copy": {"dst_uri": format!("{base_uri}/copy"), "replace": "fail"}})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let bottom = format!("{base_uri}/{}/copy", segs.join("/"));
        let moved = api
            .call(
                Method::POST,
                &format!("{base}/copy"),
                Some(json!({"move": {"dst_uri": bottom, "replace": "fail"}})),
            )
            .await;
        if moved.0 == 200 {
            let copied: Vec<String> = std::iter::once("copy".to_string())
                .chain(segs[1..].iter().cloned())
                .collect();
            segs.extend(copied);
        } else {
            assert_error(&moved, 400, "path_too_deep");
            refused += 1;
            assert_eq!(
                api.call(Method::DELETE, &format!("{base}/copy"), None)
                    .await
                    .0,
                200
            );
        }
    }
    assert_eq!(segs.len(), 128, "only doublings within the bound happen");
    assert_eq!(refused, 5);
    // The server is still there, and the tree is whole.
    assert_eq!(api.get(&format!("{base}/{}", segs.join("/"))).await.0, 200);
    assert_eq!(api.call(Method::DELETE, &base, None).await.0, 200);
    assert!(s.store.check_integrity().unwrap().is_empty());
}

/// A tree deeper than SQLite's cascade limit (1000 nested triggers), as a database from before
/// the depth bound may hold: deleting it works (before the fix: 500 with "too many levels of
/// trigger recursion", the database's own words, in the response).
#[tokio::test(flavor = "multi_thread")]
async fn a_tree_deeper_than_the_cascade_limit_is_deleted() {
    let (s, api) = setup().await;
    let id = api.upload(VAULT, "keep.txt", b"kept").await;
    {
        let conn = rusqlite::Connection::open(s.dir.join("vault.db")).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        let (vault, account): (i64, i64) = conn
            .query_row(
                "SELECT v.id, v.account_id FROM nodes v JOIN nodes a ON a.id = v.parent_id
                 WHERE a.name = 'Acme' AND a.parent_id IS NULL AND v.name = 'My First Vault'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let tx = conn.unchecked_transaction().unwrap();
        let mut parent = vault;
        for i in 0..1100 {
            let name = if i == 0 { "deep" } else { "d" };
            tx.execute(
                "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on)
                 VALUES (?1, ?2, 2, ?3, 0, 0)",
                rusqlite::params![parent, account, name],
            )
            .unwrap();
            parent = tx.last_insert_rowid();
        }
        tx.execute(
            "INSERT INTO nodes (parent_id, account_id, kind, name, created_on, modified_on)
             VALUES (?1, ?2, 3, 'bottom.txt', 0, 0)",
            rusqlite::params![parent, account],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    let (st, v) = api
        .call(Method::DELETE, &format!("{VAULT}/deep"), None)
        .await;
    let text = v.to_string();
    assert!(
        !text.contains("trigger") && !text.contains("database"),
        "database text in the answer: {text}"
    );
    assert_eq!(st, 200, "{v}");
    assert_error(&api.get(&format!("{VAULT}/deep")).await, 404, "not_found");
    assert_eq!(api.download(&id).await, b"kept");
    // More than a request deletes at once: detached, then purged in bounded steps.
    assert!(s.store.wait_purged(Duration::from_secs(20)), "not purged");
    let left: i64 = rusqlite::Connection::open(s.dir.join("vault.db"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM nodes WHERE name IN ('d', 'deep', 'bottom.txt')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    assert!(s.store.check_integrity().unwrap().is_empty());
}
