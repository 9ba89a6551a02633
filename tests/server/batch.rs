//! Our extension for many small files: `POST /nodes/batch` stores each file of the batch as a
//! whole PUT would (made when absent, on step 2's terms), refuses each file alone for what
//! concerns it alone (its md5, a condition, a missing folder), and refuses a body that does
//! not match its terms whole, storing nothing.

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::md5hex;
use crate::{Api, VAULT, assert_error, setup};

/// The segments of a path in the vault.
fn at(name: &str) -> Vec<String> {
    ["Acme", "My First Vault", name]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A batch of `files` (terms, bytes) with `tail` appended to the body: (status, envelope).
async fn batch(api: &Api, files: &[(Value, &[u8])], tail: &[u8]) -> (reqwest::StatusCode, Value) {
    let terms: Vec<&Value> = files.iter().map(|(t, _)| t).collect();
    let mut body = serde_json::to_vec(&terms).unwrap();
    body.push(b'\n');
    for (_, bytes) in files {
        body.extend_from_slice(bytes);
    }
    body.extend_from_slice(tail);
    let resp = api
        .req(Method::POST, "/nodes/batch")
        .header("Content-Type", vaultfs::api::BATCH_TYPE)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap())
}

fn terms(name: &str, data: &[u8]) -> Value {
    json!({"path": at(name), "length": data.len(), "md5_checksum": md5hex(data)})
}

#[tokio::test(flavor = "multi_thread")]
async fn many_files_in_one_request_each_refused_alone() {
    let (_s, api) = setup().await;
    let resp = api.req(Method::GET, VAULT).send().await.unwrap();
    let ext = resp.headers()[vaultfs::api::EXTENSIONS].to_str().unwrap();
    assert!(ext.contains("batch-put"), "{ext}");

    let old = b"the old words\n";
    let id = api.upload(VAULT, "kept.txt", old).await;
    let (a, b, c) = (
        &b"first file\n"[..],
        &b"second file\n"[..],
        &b"kept, new words\n"[..],
    );
    let mut on_old = terms("kept.txt", c);
    on_old["if_match"] = json!(md5hex(old));
    on_old["modifiedOn"] = json!("2026-01-02T03:04:05Z");
    let mut lied = terms("lied.txt", b"what was announced");
    lied["length"] = json!(b.len());
    let mut taken = terms("kept.txt", b);
    taken["if_none_match"] = json!("*");
    let mut elsewhere = terms("x.txt", a);
    elsewhere["path"] = json!(["Acme", "My First Vault", "no such folder", "x.txt"]);
    let files = [
        (terms("a.txt", a), a),
        (lied, b),
        (on_old, c),
        (taken, b),
        (elsewhere, a),
        (terms("empty", b""), &b""[..]),
    ];
    let (st, v) = batch(&api, &files, b"").await;
    assert_eq!(st, 200, "{v}");
    let results = v["message"]["results"].as_array().unwrap();
    assert_eq!(results.len(), files.len(), "{v}");

    // Stored: a new file, a new version on its condition, an empty file.
    let new = &results[0]["message"];
    assert_eq!(new["md5_checksum"], md5hex(a), "{v}");
    assert_eq!(api.download(new["id"].as_str().unwrap()).await, a);
    assert_eq!(results[2]["message"]["id"], id.as_str(), "{v}");
    assert_eq!(results[2]["message"]["modifiedOn"], "2026-01-02T03:04:05Z");
    assert_eq!(api.download(&id).await, c);
    assert_eq!(results[5]["message"]["size"], 0, "{v}");

    // Refused alone: bytes other than announced (nothing made), a condition that fails (the
    // file keeps what it has), a folder that is not there.
    let refused = |i: usize, status: u16, code: &str| {
        assert_error(
            &(
                reqwest::StatusCode::from_u16(status).unwrap(),
                results[i].clone(),
            ),
            status,
            code,
        );
    };
    refused(1, 400, "checksum_mismatch");
    refused(3, 412, "version_conflict");
    refused(4, 404, "not_found");
    let (st, _) = api.get(&format!("{VAULT}/lied.txt")).await;
    assert_eq!(st, 404);
    assert_eq!(api.download(&id).await, c);

    // The bytes the file has, sent again with another time: the time changes, no version is
    // added (as a file sent alone with its md5 unchanged).
    let versions = |v: &Value| v["message"]["versions"].as_array().map(Vec::len);
    let (_, before) = api.get(&format!("{VAULT}/kept.txt?vprop=1")).await;
    let mut again = terms("kept.txt", c);
    again["modifiedOn"] = json!("2026-03-04T05:06:07Z");
    let (st, v) = batch(&api, &[(again, c)], b"").await;
    assert_eq!(st, 200, "{v}");
    let node = &v["message"]["results"][0]["message"];
    assert_eq!(node["id"], id.as_str(), "{v}");
    assert_eq!(node["modifiedOn"], "2026-03-04T05:06:07Z", "{v}");
    let (_, after) = api.get(&format!("{VAULT}/kept.txt?vprop=1")).await;
    assert_eq!(versions(&after), versions(&before), "{after}");
    assert_eq!(api.download(&id).await, c);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_does_not_match_its_terms_stores_nothing() {
    let (_s, api) = setup().await;
    let (a, b) = (&b"first file\n"[..], &b"second file\n"[..]);
    // Short: the second file's bytes end early.
    let files = [(terms("a.txt", a), a), (terms("b.txt", b), &b[..4])];
    let got = batch(&api, &files, b"").await;
    assert_error(&got, 400, "bad_batch");
    // Long: bytes past the last file.
    let files = [(terms("a.txt", a), a), (terms("b.txt", b), b)];
    let got = batch(&api, &files, b"more").await;
    assert_error(&got, 400, "bad_batch");
    // Terms that are not a list of files, a path that is not a file's, no md5.
    let resp = api
        .req(Method::POST, "/nodes/batch")
        .header("Content-Type", vaultfs::api::BATCH_TYPE)
        .body("{\"not\": \"a list\"}\n")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert_error(&(status, resp.json().await.unwrap()), 400, "bad_batch");
    let mut no_md5 = terms("c.txt", a);
    no_md5.as_object_mut().unwrap().remove("md5_checksum");
    assert_error(&batch(&api, &[(no_md5, a)], b"").await, 400, "bad_batch");
    let mut vault = terms("c.txt", a);
    vault["path"] = json!([]);
    assert_error(&batch(&api, &[(vault, a)], b"").await, 400, "bad_batch");
    // Lengths past what a batch takes, also ones whose sum would wrap around: nothing read.
    let mut huge = terms("c.txt", a);
    huge["length"] = json!(u64::MAX / 2 + 1);
    let got = batch(&api, &[(huge.clone(), a), (huge, a)], b"").await;
    assert_error(&got, 413, "too_large");
    // Another media type.
    let resp = api
        .req(Method::POST, "/nodes/batch")
        .header("Content-Type", "application/json")
        .body("[]\n")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert_error(
        &(status, resp.json().await.unwrap()),
        415,
        "unsupported_media_type",
    );
    // Nothing of it was stored.
    let (st, v) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["message"]["children"].as_array().map(Vec::len),
        Some(0),
        "{v}"
    );
}
