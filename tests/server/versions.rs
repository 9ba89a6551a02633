//! Our extensions for earlier versions (issue 32, item 4): a kept version made current again
//! (`POST /files/id/Document/{id}/version/{version}/restore`), authorized like every route.

use super::{Api, VAULT, assert_error};
use crate::common::{TestServer, served_retention};
use reqwest::Method;
use serde_json::Value;
use vaultfs::server::ServerOptions;

/// The version IDs of `vprop=1`, newest first, and which is current.
async fn versions(api: &Api, path: &str) -> Vec<(String, bool, u64)> {
    let (st, v) = api.get(&format!("{path}?vprop=1")).await;
    assert_eq!(st, 200, "{v}");
    v["message"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["version_id"].as_str().unwrap().to_string(),
                v["current"].as_bool().unwrap(),
                v["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn download_version(api: &Api, id: &str, version: &str) -> Vec<u8> {
    let resp = api
        .req(
            Method::GET,
            &format!("/files/id/Document/{id}/version/{version}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_version_is_restored_as_a_new_version() {
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Other").await);
    let id = alice.upload(VAULT, "plan.txt", b"plan A").await;
    alice.put_version(&id, b"plan B, longer").await;
    let path = format!("{VAULT}/plan.txt");
    let before = versions(&alice, &path).await;
    assert_eq!(before.len(), 2);
    let (old, _, _) = &before[1];
    let restore = format!("/files/id/Document/{id}/version/{old}/restore");

    // Authorized like every route: no token, another account (not found, as an unused ID).
    let anon = Api::anonymous(&s);
    assert_error(
        &anon.call(Method::POST, &restore, None).await,
        401,
        "invalid_token",
    );
    assert_error(
        &bob.call(Method::POST, &restore, None).await,
        404,
        "not_found",
    );
    assert_eq!(alice.download(&id).await, b"plan B, longer");
    // No such version, a pending one, a version of another file.
    alice.upload(VAULT, "other.txt", b"x").await;
    let other_v = &versions(&alice, &format!("{VAULT}/other.txt")).await[0].0;
    for bad in ["999999", "abc", other_v.as_str()] {
        let p = format!("/files/id/Document/{id}/version/{bad}/restore");
        assert_error(&alice.call(Method::POST, &p, None).await, 404, "not_found");
    }

    let (st, v) = alice.call(Method::POST, &restore, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["id"], Value::from(id.clone()));
    assert_eq!(v["message"]["size"], 6);
    assert_eq!(
        v["message"]["md5_checksum"],
        crate::common::md5hex(b"plan A")
    );
    assert_eq!(alice.download(&id).await, b"plan A");
    let after = versions(&alice, &path).await;
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(after[0].1 && after[0].2 == 6, "{after:?}");
    assert!(
        !before.iter().any(|(v, _, _)| *v == after[0].0),
        "a new version"
    );
    assert_eq!(&after[1].0, &before[0].0);
    assert_eq!(
        download_version(&alice, &id, &before[0].0).await,
        b"plan B, longer",
        "the replaced bytes are kept"
    );
    // The current one again: nothing changes.
    let p = format!("/files/id/Document/{id}/version/{}/restore", after[0].0);
    assert_eq!(alice.call(Method::POST, &p, None).await.0, 200);
    assert_eq!(versions(&alice, &path).await.len(), 3);
    // The change feed tells followers: the restore was the last change.
    let log = s
        .store
        .changes(vaultfs::store::Scope::All, Some(0), 1000)
        .unwrap();
    let last = log.changes.last().unwrap();
    assert_eq!(
        (last.kind, last.id.as_deref()),
        (vaultfs::api::ChangeKind::Version, Some(id.as_str())),
        "{last:?}"
    );
}

/// The names and IDs of `deleted=1` on the folder at `path`.
async fn deleted(api: &Api, path: &str) -> Vec<(String, String, u64)> {
    let (st, v) = api.get(&format!("{path}?deleted=1")).await;
    assert_eq!(st, 200, "{v}");
    v["message"]["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(
                d["deletedOn"].as_str().is_some_and(|t| t.ends_with('Z')),
                "{d}"
            );
            assert!(
                d["version_id"].as_str().is_some_and(|v| !v.is_empty()),
                "{d}"
            );
            (
                d["name"].as_str().unwrap().to_string(),
                d["id"].as_str().unwrap().to_string(),
                d["versions"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A deleted file stays restorable under the retention rule: listed with `deleted=1` on its
/// folder (and nowhere else), restored by ID with its versions, to its old name or, when that
/// is taken, to `NAME (restored ...)`; another account cannot; a folder deleted takes its
/// deleted files with it. Clients that do not ask see the interface as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_file_is_listed_and_restored_with_its_versions() {
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Other").await);
    let id = alice.upload(VAULT, "notes.txt", b"monday").await;
    alice.put_version(&id, b"monday and tuesday").await;
    let path = format!("{VAULT}/notes.txt");
    let before = versions(&alice, &path).await;
    let (st, _) = alice.call(Method::DELETE, &path, None).await;
    assert_eq!(st, 200);
    // Its kept versions stay readable by ID (the mount's `.versions/` reads them so), by its
    // owner only.
    assert_eq!(download_version(&alice, &id, &before[1].0).await, b"monday");
    let p = format!("/files/id/Document/{id}/version/{}", before[1].0);
    assert_error(&bob.get(&p).await, 404, "not_found");

    // Gone by path, by ID and from the listing; listed as deleted with both versions.
    assert_error(&alice.get(&path).await, 404, "not_found");
    let resp = alice
        .req(Method::GET, &format!("/files/id/Document/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let (_, listing) = alice.get(&format!("{VAULT}?children=1")).await;
    assert!(!listing.to_string().contains("notes.txt"), "{listing}");
    assert!(listing["message"].get("deleted").is_none(), "{listing}");
    // Beside a page of children too; on an account, nothing (it holds vaults only).
    let (_, both) = alice.get(&format!("{VAULT}?children=1&deleted=1")).await;
    assert_eq!(both["message"]["deleted"][0]["name"], "notes.txt", "{both}");
    assert!(both["message"]["children"].is_array(), "{both}");
    let (st, account) = alice.get("/nodes/pth/Acme?deleted=1").await;
    assert_eq!(st, 200);
    assert!(account["message"].get("deleted").is_none(), "{account}");
    assert_eq!(
        deleted(&alice, VAULT).await,
        vec![("notes.txt".to_string(), id.clone(), 2)]
    );
    assert_eq!(s.store.check_integrity().unwrap(), Vec::<String>::new());

    // Not another account's to list or restore.
    let (st, _) = bob.get(&format!("{VAULT}?deleted=1")).await;
    assert_eq!(st, 403);
    let restore = format!("/files/id/Document/{id}/restore");
    assert_error(
        &bob.call(Method::POST, &restore, None).await,
        404,
        "not_found",
    );

    // Its name taken meanwhile: restored beside it, with its ID and versions.
    let newer = alice.upload(VAULT, "notes.txt", b"a new file").await;
    let (st, v) = alice.call(Method::POST, &restore, None).await;
    assert_eq!(st, 200, "{v}");
    let name = v["message"]["name"].as_str().unwrap().to_string();
    assert!(
        name.starts_with("notes (restored 20") && name.ends_with(").txt"),
        "{name}"
    );
    assert_eq!(v["message"]["id"], Value::from(id.clone()));
    assert_eq!(alice.download(&id).await, b"monday and tuesday");
    assert_eq!(alice.download(&newer).await, b"a new file");
    let restored = format!("{VAULT}/{}", vaultfs::api::path::encode_segment(&name));
    let kept = versions(&alice, &restored).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(download_version(&alice, &id, &kept[1].0).await, b"monday");
    assert!(deleted(&alice, VAULT).await.is_empty());
    assert_error(
        &alice.call(Method::POST, &restore, None).await,
        404,
        "not_found",
    );
    // The feed says it is there again.
    let log = s
        .store
        .changes(vaultfs::store::Scope::All, Some(0), 1000)
        .unwrap();
    let last = log.changes.last().unwrap();
    assert_eq!(last.kind, vaultfs::api::ChangeKind::Created, "{last:?}");
    assert!(last.uri.ends_with(&name), "{last:?}");

    // Their names free: restored under them (the name each had when deleted).
    let (st, _) = alice.call(Method::DELETE, &restored, None).await;
    assert_eq!(st, 200);
    alice.call(Method::DELETE, &path, None).await;
    let both = deleted(&alice, VAULT).await;
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[0].1, newer, "most recently deleted first");
    for (file, was) in [(&newer, "notes.txt"), (&id, name.as_str())] {
        let p = format!("/files/id/Document/{file}/restore");
        let (st, v) = alice.call(Method::POST, &p, None).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["message"]["name"], was);
    }

    // A folder deleted takes the files deleted from it along: nothing left behind.
    let (st, _) = alice
        .call(
            Method::PUT,
            &format!("{VAULT}/old"),
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(st, 200);
    let inner = alice
        .upload(&format!("{VAULT}/old"), "inner.txt", b"inner")
        .await;
    alice
        .call(Method::DELETE, &format!("{VAULT}/old/inner.txt"), None)
        .await;
    assert_eq!(deleted(&alice, &format!("{VAULT}/old")).await.len(), 1);
    alice
        .call(Method::DELETE, &format!("{VAULT}/old"), None)
        .await;
    let p = format!("/files/id/Document/{inner}/restore");
    assert_error(&alice.call(Method::POST, &p, None).await, 404, "not_found");
    assert_eq!(s.store.check_integrity().unwrap(), Vec::<String>::new());
}

/// The age bound holds for files no write touches (item 4): the store's idle-time pass drops a
/// file's earlier versions older than the bound (the current one stays) and deleted files
/// deleted longer ago, with their bytes.
#[tokio::test(flavor = "multi_thread")]
async fn the_age_bound_holds_for_untouched_and_deleted_files() {
    let mut config = served_retention();
    config.retention.age = Some(std::time::Duration::from_secs(3));
    let s = TestServer::start_with(config, ServerOptions::default()).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let first = std::time::Instant::now();
    let id = alice.upload(VAULT, "kept.txt", b"old bytes").await;
    alice.put_version(&id, b"current bytes").await;
    alice.upload(VAULT, "gone.txt", b"deleted bytes").await;
    alice
        .call(Method::DELETE, &format!("{VAULT}/gone.txt"), None)
        .await;
    let path = format!("{VAULT}/kept.txt");
    assert_eq!(versions(&alice, &path).await.len(), 2);
    assert_eq!(deleted(&alice, VAULT).await.len(), 1);
    let blobs = s.store.blob_count().unwrap();
    assert_eq!(blobs, 3);
    // The pass runs every 300 ms here (hourly in `vaultfs serve` and a mount), in idle time.
    let started = std::time::Instant::now();
    s.store
        .start_expiry(std::time::Duration::from_millis(300))
        .unwrap();
    // Nothing within the bound (looked at 1.5 s after the first upload, at least one pass
    // after the start).
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    if let Some(rest) = std::time::Duration::from_millis(1500).checked_sub(first.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    assert_eq!(versions(&alice, &path).await.len(), 2);
    assert_eq!(deleted(&alice, VAULT).await.len(), 1);
    loop {
        let left = (
            versions(&alice, &path).await.len(),
            deleted(&alice, VAULT).await.len(),
        );
        if left == (1, 0) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "still {left:?} after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!("pruned by age {:?} after the start", started.elapsed());
    assert_eq!(alice.download(&id).await, b"current bytes");
    assert_eq!(s.store.blob_count().unwrap(), 1, "the bytes went with them");
    assert_eq!(s.store.check_integrity().unwrap(), Vec::<String>::new());
}

/// A deleted file or folder whose name is taken meanwhile comes back beside it under a free
/// name of at most 255 bytes, also when its name is long or all extension (issue 47, item 10:
/// before, `NAME (restored ...)` grew past 255 bytes and the restore answered 400 `bad_path`),
/// and the answer is the restored node with its new name.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_onto_a_taken_long_name_comes_back_beside_it() {
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let names = [
        format!("a.{}", "x".repeat(250)),
        format!("{}.txt", "é".repeat(125)),
        format!(".{}", "y".repeat(254)),
    ];
    for name in &names {
        let id = alice.upload(VAULT, name, b"kept").await;
        let path = format!("{VAULT}/{}", vaultfs::api::path::encode_segment(name));
        let (st, _) = alice.call(Method::DELETE, &path, None).await;
        assert_eq!(st, 200);
        let newer = alice.upload(VAULT, name, b"newer").await;
        let (st, v) = alice
            .call(
                Method::POST,
                &format!("/files/id/Document/{id}/restore"),
                None,
            )
            .await;
        assert_eq!(st, 200, "{name}: {v}");
        let back = v["message"]["name"].as_str().unwrap();
        assert!(back.len() <= 255, "{} bytes: {back}", back.len());
        assert!(back.contains("(restored "), "{back}");
        assert_eq!(v["message"]["id"], Value::from(id.clone()));
        assert_eq!(alice.download(&id).await, b"kept");
        assert_eq!(alice.download(&newer).await, b"newer");
        let (st, _) = alice
            .get(&format!(
                "{VAULT}/{}",
                vaultfs::api::path::encode_segment(back)
            ))
            .await;
        assert_eq!(st, 200, "{back}");
    }
    // A folder the same way.
    let dir = format!("d.{}", "z".repeat(250));
    let dir_path = format!("{VAULT}/{dir}");
    let (st, _) = alice
        .call(Method::PUT, &dir_path, Some(serde_json::json!({})))
        .await;
    assert_eq!(st, 200);
    let (st, _) = alice.call(Method::DELETE, &dir_path, None).await;
    assert_eq!(st, 200);
    let (st, _) = alice
        .call(Method::PUT, &dir_path, Some(serde_json::json!({})))
        .await;
    assert_eq!(st, 200);
    let (_, listing) = alice.get(&format!("{VAULT}?deleted=1")).await;
    let gone = listing["message"]["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == dir.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = alice
        .call(
            Method::POST,
            &format!("/files/id/Document/{gone}/restore"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let back = v["message"]["name"].as_str().unwrap();
    assert!(back.len() <= 255 && back.contains("(restored "), "{back}");
    assert_eq!(s.store.check_integrity().unwrap(), Vec::<String>::new());
}
