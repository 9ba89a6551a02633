//! The three-step upload and downloads: errors of each step, large and concurrent transfers, a
//! client gone mid-upload, and a restart keeping data and tokens.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::common::TestServer;
use crate::common::md5hex;
use crate::{Api, VAULT, assert_error, assert_errors, base64_basic, names, setup};

/// Step 1 for several names in one request (one transaction): each name's file in order, a
/// name given twice made once, an existing file returned as it is, the folder counting its
/// children; a folder among the names fails the request (the others are made); the quota is
/// checked for the request's new files together, none made when they do not all fit.
#[tokio::test(flavor = "multi_thread")]
async fn step_one_takes_many_names_in_one_request() {
    let s = TestServer::start_with(
        vaultfs::store::StoreConfig {
            max_nodes_per_account: 12,
            ..Default::default()
        },
        Default::default(),
    )
    .await;
    let api = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let old = api.upload(VAULT, "old.txt", b"kept").await;
    api.call(Method::PUT, &format!("{VAULT}/dir"), Some(json!({})))
        .await;
    let step1 = async |names: &[&str]| {
        let body: Vec<Value> = names.iter().map(|n| json!({ "name": n })).collect();
        api.call(Method::PUT, VAULT, Some(json!({ "create_file": body })))
            .await
    };
    let (st, v) = step1(&["b.txt", "old.txt", "a.txt", "b.txt"]).await;
    assert_eq!(st, 200, "{v}");
    let children = v["message"]["children"].as_array().unwrap();
    let got: Vec<(&str, &str)> = children
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["id"].as_str().unwrap()))
        .collect();
    assert_eq!(got.len(), 4, "{v}");
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        ["b.txt", "old.txt", "a.txt", "b.txt"]
    );
    assert_eq!(got[1].1, old);
    assert_eq!(got[0].1, got[3].1, "a name given twice is one file");
    assert_ne!(got[0].1, got[2].1);
    assert_eq!(children[1]["size"], 4, "an existing file comes as it is");
    assert_eq!(children[0]["size"], 0);
    // old.txt, dir, b.txt, a.txt.
    assert_eq!(v["message"]["total_children"], 4, "{v}");
    let (_, listing) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(names(&listing), ["a.txt", "b.txt", "dir", "old.txt"]);

    // A folder among the names: 409, the other names made.
    assert_error(&step1(&["c.txt", "dir"]).await, 409, "exists");
    let (_, listing) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(
        names(&listing),
        ["a.txt", "b.txt", "c.txt", "dir", "old.txt"]
    );

    // More new files than the quota leaves: none made; existing ones still answer.
    let many: Vec<String> = (0..20).map(|i| format!("n{i}.txt")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_error(&step1(&many).await, 507, "quota_exceeded");
    let (_, listing) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(listing["message"]["total_children"], 5, "{listing}");
    let (st, v) = step1(&["a.txt", "old.txt"]).await;
    assert_eq!(st, 200, "{v}");
    assert!(s.store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn three_step_upload_and_its_errors() {
    let (s, api) = setup().await;
    // Step 1: the folder object with the new file among its children.
    let (st, v) = api
        .call(
            Method::PUT,
            VAULT,
            Some(json!({"create_file": [{"name": "report.txt"}]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["nodeType"], "VaultNodeType");
    let child = &v["message"]["children"][0];
    assert_eq!(child["name"], "report.txt");
    let link = child["link_uri"].as_str().unwrap();
    let id = link.rsplit_once("&id=").unwrap().1.to_string();
    assert_eq!(child["id"], id.as_str());
    // Step 1 again returns the same file.
    let (_, v) = api
        .call(
            Method::PUT,
            VAULT,
            Some(json!({"create_file": [{"name": "report.txt"}]})),
        )
        .await;
    assert_eq!(v["message"]["children"][0]["id"], id.as_str());
    // Step 1 and step 2 errors.
    api.call(Method::PUT, &format!("{VAULT}/dir"), Some(json!({})))
        .await;
    let missing = format!("{VAULT}/missing");
    let step2 = format!("/nodes/upload/{id}");
    assert_errors(
        &api,
        Method::PUT,
        &[
            (
                VAULT,
                json!({"create_file": [{}]}),
                400,
                "missing_parameter",
            ),
            (VAULT, json!({"create_file": []}), 400, "missing_parameter"),
            (VAULT, json!({"create_file": "x"}), 400, "bad_json"),
            (
                VAULT,
                json!({"create_file": [{"name": "dir"}]}),
                409,
                "exists",
            ),
            (
                &missing,
                json!({"create_file": [{"name": "a"}]}),
                404,
                "not_found",
            ),
            (
                "/nodes/upload/999999",
                json!({"length": 1}),
                404,
                "not_found",
            ),
            ("/nodes/upload/abc", json!({"length": 1}), 404, "not_found"),
            (&step2, json!({}), 400, "missing_parameter"),
            (&step2, json!({"length": -1}), 400, "bad_json"),
            (
                &step2,
                json!({"length": 1, "md5_checksum": "xyz"}),
                400,
                "bad_checksum",
            ),
        ],
    )
    .await;

    // A first version.
    let v1 = b"first version\n".to_vec();
    api.put_version(&id, &v1).await;
    assert_eq!(api.download(&id).await, v1);

    // Step 3 errors, each leaving the first version in place.
    let data = b"second version, longer\n".to_vec();
    let begin = |md5: Option<String>, len: usize| {
        let api = &api;
        let id = id.clone();
        async move {
            let mut body = json!({"length": len});
            if let Some(m) = md5 {
                body["md5_checksum"] = json!(m);
            }
            let (st, v) = api
                .call(Method::PUT, &format!("/nodes/upload/{id}"), Some(body))
                .await;
            assert_eq!(st, 200, "{v}");
            assert!(
                v["message"]["fileExProperties"]["upload_uri"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("/nodes/upload/{id}/"))
            );
            v["message"]["fileExProperties"]["upload_uri"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let uri = begin(Some(md5hex(&data)), data.len()).await;
    let mut longer = data.clone();
    longer.extend_from_slice(b"extra");
    let mut corrupt = data.clone();
    corrupt[0] ^= 1;
    let unknown = format!("/nodes/upload/{id}/999999");
    let binary = "application/binary";
    for (uri, body, ctype, status, code) in [
        (&uri, &data[..], "text/plain", 415, "unsupported_media_type"),
        (&uri, &data[..5], binary, 400, "length_mismatch"),
        (&uri, &longer[..], binary, 400, "length_mismatch"),
        (&uri, &corrupt[..], binary, 400, "checksum_mismatch"),
        (&unknown, &data[..], binary, 404, "version_not_found"),
    ] {
        let got = api.step3(uri, body.to_vec(), ctype).await;
        assert_eq!(
            got.1["error"]["error_name"], code,
            "{uri} {ctype}: {}",
            got.1
        );
        assert_error(&got, status, code);
    }
    assert_eq!(
        api.download(&id).await,
        v1,
        "failed uploads keep the old content"
    );
    let (_, node) = api.get(&format!("{VAULT}/report.txt")).await;
    assert_eq!(node["message"]["size"], v1.len());

    // The same pending version then succeeds, with application/octet-stream too.
    let (st, v) = api
        .step3(&uri, data.clone(), "application/octet-stream")
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["size"], data.len());
    assert_eq!(v["message"]["md5_checksum"], md5hex(&data));
    assert_eq!(api.download(&id).await, data);
    // Repeating a successful step 3 with the same bytes is safe; with other bytes it is not.
    assert_eq!(
        api.step3(&uri, data.clone(), "application/binary").await.0,
        200
    );
    let mut other = data.clone();
    other[1] ^= 1;
    assert_error(
        &api.step3(&uri, other, "application/binary").await,
        409,
        "version_committed",
    );

    // Without md5 the server computes it.
    let uri = begin(None, 3).await;
    let (st, v) = api.step3(&uri, b"abc".to_vec(), "application/binary").await;
    assert_eq!(st, 200);
    assert_eq!(v["message"]["md5_checksum"], md5hex(b"abc"));

    // Earlier versions stay in the database.
    let history = s.store.version_history(&id).unwrap();
    assert_eq!(
        history.iter().filter(|v| v.committed).count(),
        3,
        "{history:?}"
    );
    assert!(s.store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn large_upload_streams_and_downloads_with_ranges() {
    let (s, api) = setup().await;
    let data: Vec<u8> = (0..24 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let id = api.upload(VAULT, "big.bin", &data).await;
    let resp = api
        .req(Method::GET, &format!("/files/id/Document/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-length"], data.len().to_string().as_str());
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(h["etag"], format!("\"{}\"", md5hex(&data)).as_str());
    assert_eq!(h["content-type"], "application/octet-stream");
    assert!(httpdate::parse_http_date(h["last-modified"].to_str().unwrap()).is_ok());
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &data[..]);

    let ranged = |range: &'static str| {
        let api = &api;
        let id = id.clone();
        async move {
            api.req(Method::GET, &format!("/files/id/Document/{id}"))
                .header("Range", range)
                .send()
                .await
                .unwrap()
        }
    };
    let n = data.len();
    for (range, a, b) in [
        ("bytes=0-0", 0, 0),
        ("bytes=1000-1999999", 1000, 1_999_999),
        ("bytes=-100", n - 100, n - 1),
        ("bytes=20000000-", 20_000_000, n - 1),
    ] {
        let resp = ranged(range).await;
        assert_eq!(resp.status(), 206, "{range}");
        assert_eq!(
            resp.headers()["content-range"],
            format!("bytes {a}-{b}/{n}").as_str()
        );
        assert_eq!(
            resp.bytes().await.unwrap().as_ref(),
            &data[a..=b],
            "{range}"
        );
    }
    for range in [
        "bytes=999999999-",
        "bytes=5-1",
        "bytes=0-1,5-6",
        "pages=1-2",
    ] {
        let resp = ranged(range).await;
        let st = resp.status();
        let v: Value = resp.json().await.unwrap();
        assert_error(&(st, v), 416, "bad_range");
    }
    assert_error(
        &api.get("/files/id/Document/424242").await,
        404,
        "not_found",
    );
    // A HEAD tells the size without the bytes.
    let head = api
        .req(Method::HEAD, &format!("/files/id/Document/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.headers()["content-length"], n.to_string().as_str());
    drop(s);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_that_disconnects_mid_upload_leaves_nothing_behind() {
    let (s, api) = setup().await;
    let id = api.upload(VAULT, "doc.bin", b"original").await;
    let blobs = s.store.blob_count().unwrap();
    let len = 4 * 1024 * 1024;
    let (_, v) = api
        .call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": len})),
        )
        .await;
    let uri = v["message"]["fileExProperties"]["upload_uri"]
        .as_str()
        .unwrap()
        .to_string();

    let creds = api.creds.clone().unwrap();
    let auth = base64_basic(&creds.email, &creds.token);
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PUT {uri} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\nContent-Type: application/binary\r\nContent-Length: {len}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&vec![7u8; len / 2]).await.unwrap();
    sock.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(sock);

    // The staging file goes away; the version never becomes current; no blob is added.
    let tmp = s.dir.join("tmp");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(&tmp).unwrap().count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "staging file left behind"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(api.download(&id).await, b"original");
    assert_eq!(s.store.blob_count().unwrap(), blobs);
    let history = s.store.version_history(&id).unwrap();
    assert_eq!(history.iter().filter(|v| v.committed).count(), 1);
    assert!(s.store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_data_and_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let s = TestServer::start_in(&dir, Default::default(), Default::default()).await;
    let alice = s.user("alice@example.com", "Acme").await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let id = Api::new(&s, &alice).upload(VAULT, "keep.bin", &data).await;
    s.stop().await;

    let s = TestServer::start_in(&dir, Default::default(), Default::default()).await;
    let api = Api::new(&s, &alice);
    assert_eq!(
        api.download(&id).await,
        data,
        "same token, same bytes after a restart"
    );
    let (_, v) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(names(&v), ["keep.bin"]);
    assert!(s.store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_uploads_and_reads() {
    let (s, api) = setup().await;
    let api = std::sync::Arc::new(api);
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let data: Vec<u8> = (0..500_000u32)
                .map(|j| (j.wrapping_mul(i + 3) % 256) as u8)
                .collect();
            let id = api.upload(VAULT, &format!("c{i}.bin"), &data).await;
            assert_eq!(api.download(&id).await, data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, v) = api.get(&format!("{VAULT}?children=1")).await;
    assert_eq!(v["message"]["total_children"], 8);
    assert!(s.store.check_integrity().unwrap().is_empty());
}
