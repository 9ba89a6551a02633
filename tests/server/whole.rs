//! Our extension for a client far away: a file's bytes in one request (a binary PUT on the
//! file's path, or on `/nodes/upload/{id}`), on step 2's terms given as headers, refused as the
//! three steps refuse; and every answer naming the extensions a client may count on.

use reqwest::Method;
use serde_json::Value;

use crate::common::md5hex;
use crate::{Api, VAULT, assert_error, setup};

/// A binary PUT with its terms as headers: (status, envelope).
async fn put(api: &Api, path: &str, data: &[u8], terms: &[(&str, String)]) -> (u16, Value) {
    let mut r = api
        .req(Method::PUT, path)
        .header("Content-Type", "application/octet-stream")
        .body(data.to_vec());
    for (name, value) in terms {
        r = r.header(*name, value);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn base64_md5(data: &[u8]) -> String {
    vaultfs::api::checksum::md5_base64(&md5hex(data)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_in_one_request_on_the_terms_of_step_two() {
    let (_s, api) = setup().await;
    // Every answer says what the server offers beyond the interface.
    let resp = api.req(Method::GET, VAULT).send().await.unwrap();
    let ext = resp.headers()[vaultfs::api::EXTENSIONS].to_str().unwrap();
    assert!(
        ext.contains("whole-put") && ext.contains("delete-if"),
        "{ext}"
    );

    // A new file: made, with its bytes current, its time and mode as asked.
    let path = format!("{VAULT}/report.txt");
    let v1 = b"the first words of a report\n";
    let terms = [
        ("Content-MD5", base64_md5(v1)),
        ("vaultfs-if-none-match", "*".to_string()),
        ("vaultfs-modified-on", "2026-01-02T03:04:05Z".to_string()),
        ("vaultfs-mode", "493".to_string()),
    ];
    let (st, v) = put(&api, &path, v1, &terms).await;
    assert_eq!(st, 200, "{v}");
    let node = &v["message"];
    assert_eq!(node["md5_checksum"], md5hex(v1), "{v}");
    assert_eq!(node["size"].as_u64(), Some(v1.len() as u64), "{v}");
    assert_eq!(node["modifiedOn"], "2026-01-02T03:04:05Z", "{v}");
    let id = node["id"].as_str().unwrap().to_string();
    assert_eq!(api.download(&id).await, v1);

    // Made already, with bytes: a new name's condition is refused, the bytes stay.
    let other = b"another writer's new file\n";
    let absent = [("vaultfs-if-none-match", "*".to_string())];
    assert_error_of(
        put(&api, &path, other, &absent).await,
        412,
        "version_conflict",
    );
    // Bytes that are not what the md5 says: refused, the bytes stay.
    let bad = [("Content-MD5", base64_md5(b"something else"))];
    assert_error_of(
        put(&api, &path, other, &bad).await,
        400,
        "checksum_mismatch",
    );
    assert_eq!(api.download(&id).await, v1);

    // A second version by ID (steps 2 and 3), on the condition of the first's md5 (hex here).
    let v2 = b"the report, rewritten\n";
    let on_v1 = [
        ("Content-MD5", md5hex(v2)),
        ("vaultfs-if-match", md5hex(v1)),
    ];
    let (st, v) = put(&api, &format!("/nodes/upload/{id}"), v2, &on_v1).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["id"], id.as_str());
    assert_eq!(api.download(&id).await, v2);
    // The same condition again is stale now: refused, by path and by ID.
    let v3 = b"a third, on a stale base\n";
    let stale = [("vaultfs-if-match", md5hex(v1))];
    assert_error_of(put(&api, &path, v3, &stale).await, 412, "version_conflict");
    let by_id = format!("/nodes/upload/{id}");
    assert_error_of(put(&api, &by_id, v3, &stale).await, 412, "version_conflict");
    assert_eq!(api.download(&id).await, v2);
    // Both versions kept, the first among the earlier ones.
    let (_, v) = api.get(&format!("{path}?vprop=1")).await;
    assert_eq!(
        v["message"]["versions"].as_array().map(Vec::len),
        Some(2),
        "{v}"
    );

    // A condition on bytes of a file that is not there makes no file.
    let missing = format!("{VAULT}/missing.txt");
    let cond = [("vaultfs-if-match", md5hex(v1))];
    assert_error_of(put(&api, &missing, v1, &cond).await, 404, "not_found");
    let (st, _) = api.get(&missing).await;
    assert_eq!(st, 404);
    // A folder's name is not a file's; bad terms are named.
    api.call(
        Method::PUT,
        &format!("{VAULT}/dir"),
        Some(serde_json::json!({})),
    )
    .await;
    assert_error_of(
        put(&api, &format!("{VAULT}/dir"), v1, &[]).await,
        409,
        "exists",
    );
    let bad_md5 = [("Content-MD5", "not an md5".to_string())];
    assert_error_of(put(&api, &missing, v1, &bad_md5).await, 400, "bad_checksum");
    let bad_mode = [("vaultfs-mode", "rwx".to_string())];
    assert_error_of(
        put(&api, &missing, v1, &bad_mode).await,
        400,
        "bad_parameter",
    );
    let bad_time = [("vaultfs-modified-on", "yesterday".to_string())];
    assert_error_of(
        put(&api, &missing, v1, &bad_time).await,
        400,
        "bad_parameter",
    );
    // JSON on the same routes is what it was: a folder, step 1, step 2.
    let (st, v) = api
        .call(
            Method::PUT,
            &format!("{VAULT}/dir2"),
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

#[track_caller]
fn assert_error_of((status, v): (u16, Value), want: u16, code: &str) {
    let st = reqwest::StatusCode::from_u16(status).unwrap();
    assert_error(&(st, v), want, code);
}
