//! `vaultfs serve` over real loopback HTTP: every route, its success and its errors, asserting the
//! status, the envelope and what is stored afterwards.

mod common;

use std::time::Duration;

use common::{Creds, TestServer, login, pin_in};
use md5::{Digest, Md5};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const VAULT: &str = "/nodes/pth/Acme/My%20First%20Vault";

/// A logged-in HTTP client of one server.
struct Api {
    http: reqwest::Client,
    base: String,
    creds: Option<Creds>,
}

impl Api {
    fn new(s: &TestServer, creds: &Creds) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: s.base.clone(),
            creds: Some(creds.clone()),
        }
    }

    fn anonymous(s: &TestServer) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: s.base.clone(),
            creds: None,
        }
    }

    fn req(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{}", self.base, path));
        match &self.creds {
            Some(c) => r.basic_auth(&c.email, Some(&c.token)),
            None => r,
        }
    }

    /// Sends and returns (status, envelope).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.req(method, path).header("Accept", "application/json");
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
        (status, v)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    /// Upload steps 1-3 of `data` as `name` in the folder at encoded `folder`; returns the file ID.
    async fn upload(&self, folder: &str, name: &str, data: &[u8]) -> String {
        let (st, v) = self
            .call(
                Method::PUT,
                folder,
                Some(json!({"create_file": [{"name": name}]})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let id = v["message"]["children"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        self.put_version(&id, data).await;
        id
    }

    /// Steps 2 and 3 for an existing file.
    async fn put_version(&self, id: &str, data: &[u8]) -> Value {
        let (st, v) = self
            .call(
                Method::PUT,
                &format!("/nodes/upload/{id}"),
                Some(json!({"length": data.len(), "md5_checksum": md5hex(data)})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let uri = v["message"]["fileExProperties"]["upload_uri"]
            .as_str()
            .unwrap()
            .to_string();
        let (st, v) = self.step3(&uri, data.to_vec(), "application/binary").await;
        assert_eq!(st, 200, "{v}");
        v
    }

    async fn step3(&self, uri: &str, data: Vec<u8>, ctype: &str) -> (StatusCode, Value) {
        let resp = self
            .req(Method::PUT, uri)
            .header("Content-Type", ctype)
            .body(data)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        if status.is_success() {
            // A body read to the end leaves the connection reusable.
            assert!(resp.headers().get("connection").is_none(), "{resp:?}");
        }
        (status, resp.json().await.unwrap())
    }

    async fn download(&self, id: &str) -> Vec<u8> {
        let resp = self
            .req(Method::GET, &format!("/files/id/Document/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap().to_vec()
    }
}

fn md5hex(data: &[u8]) -> String {
    format!("{:x}", Md5::digest(data))
}

/// Asserts a failure envelope with this status and code, and a request id.
#[track_caller]
fn assert_error(got: &(StatusCode, Value), status: u16, code: &str) {
    let (st, v) = got;
    assert_eq!(st.as_u16(), status, "{v}");
    assert_eq!(v["error"]["success"], false, "{v}");
    assert_eq!(v["error"]["error_name"], code, "{v}");
    assert!(v["error"]["error_code"].is_i64(), "{v}");
    assert_eq!(v["error"]["status_code"], status, "{v}");
    assert!(
        v["error"]["error_text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    assert!(
        v["error"]["instance_guid"]
            .as_str()
            .is_some_and(|t| t.len() >= 8),
        "{v}"
    );
    assert!(v.get("message").is_none(), "{v}");
}

async fn setup() -> (TestServer, Api) {
    let s = TestServer::start().await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    (s, api)
}

fn names(v: &Value) -> Vec<String> {
    v["message"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

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

    // A file node carries everything DESIGN.md lists.
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
    assert_error(
        &api.call(Method::PUT, &format!("{VAULT}/docs"), Some(json!({})))
            .await,
        409,
        "exists",
    );
    assert_error(
        &api.call(Method::PUT, &format!("{VAULT}/nope/x"), Some(json!({})))
            .await,
        404,
        "not_found",
    );
    assert_error(
        &api.call(Method::PUT, "/nodes/pth/Acme/NewVault", Some(json!({})))
            .await,
        403,
        "forbidden",
    );
    assert_error(
        &api.call(
            Method::PUT,
            &format!("{VAULT}/docs"),
            Some(json!({"bogus": 1})),
        )
        .await,
        400,
        "bad_request",
    );
    api.upload(VAULT, "f.txt", b"x").await;
    // A folder of a file's name, and a folder inside a file.
    assert_error(
        &api.call(Method::PUT, &format!("{VAULT}/f.txt"), Some(json!({})))
            .await,
        409,
        "exists",
    );
    assert_error(
        &api.call(Method::PUT, &format!("{VAULT}/f.txt/x"), Some(json!({})))
            .await,
        409,
        "not_a_folder",
    );
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
    // Step 1 errors.
    assert_error(
        &api.call(Method::PUT, VAULT, Some(json!({"create_file": [{}]})))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &api.call(Method::PUT, VAULT, Some(json!({"create_file": []})))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &api.call(Method::PUT, VAULT, Some(json!({"create_file": "x"})))
            .await,
        400,
        "bad_json",
    );
    api.call(Method::PUT, &format!("{VAULT}/dir"), Some(json!({})))
        .await;
    assert_error(
        &api.call(
            Method::PUT,
            VAULT,
            Some(json!({"create_file": [{"name": "dir"}]})),
        )
        .await,
        409,
        "exists",
    );
    assert_error(
        &api.call(
            Method::PUT,
            &format!("{VAULT}/missing"),
            Some(json!({"create_file": [{"name": "a"}]})),
        )
        .await,
        404,
        "not_found",
    );

    // Step 2 errors.
    assert_error(
        &api.call(
            Method::PUT,
            "/nodes/upload/999999",
            Some(json!({"length": 1})),
        )
        .await,
        404,
        "not_found",
    );
    assert_error(
        &api.call(Method::PUT, "/nodes/upload/abc", Some(json!({"length": 1})))
            .await,
        404,
        "not_found",
    );
    assert_error(
        &api.call(Method::PUT, &format!("/nodes/upload/{id}"), Some(json!({})))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &api.call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": -1})),
        )
        .await,
        400,
        "bad_json",
    );
    assert_error(
        &api.call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": 1, "md5_checksum": "xyz"})),
        )
        .await,
        400,
        "bad_checksum",
    );

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
    assert_error(
        &api.step3(&uri, data.clone(), "text/plain").await,
        415,
        "unsupported_media_type",
    );
    assert_error(
        &api.step3(&uri, data[..5].to_vec(), "application/binary")
            .await,
        400,
        "length_mismatch",
    );
    let mut longer = data.clone();
    longer.extend_from_slice(b"extra");
    assert_error(
        &api.step3(&uri, longer, "application/binary").await,
        400,
        "length_mismatch",
    );
    let mut corrupt = data.clone();
    corrupt[0] ^= 1;
    assert_error(
        &api.step3(&uri, corrupt, "application/binary").await,
        400,
        "checksum_mismatch",
    );
    assert_error(
        &api.step3(
            &format!("/nodes/upload/{id}/999999"),
            data.clone(),
            "application/binary",
        )
        .await,
        404,
        "version_not_found",
    );
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
    // Into itself, onto the other kind, onto a non-empty folder.
    let (p, b) = xfer("move", "d1", "d1/sub", "fail");
    assert_error(
        &api.call(Method::POST, &p, Some(b)).await,
        400,
        "move_into_self",
    );
    let (p, b) = xfer("copy", "d1", "d1/sub", "fail");
    assert_error(
        &api.call(Method::POST, &p, Some(b)).await,
        400,
        "move_into_self",
    );
    let (p, b) = xfer("move", "c.txt", "d1", "replace");
    assert_error(
        &api.call(Method::POST, &p, Some(b)).await,
        409,
        "type_mismatch",
    );
    let (p, b) = xfer("move", "d1", "d2", "replace");
    assert_error(&api.call(Method::POST, &p, Some(b)).await, 409, "not_empty");
    // Missing source, missing destination folder.
    let (p, b) = xfer("move", "nope.txt", "x.txt", "fail");
    assert_error(&api.call(Method::POST, &p, Some(b)).await, 404, "not_found");
    let (p, b) = xfer("move", "c.txt", "nowhere/x.txt", "fail");
    assert_error(&api.call(Method::POST, &p, Some(b)).await, 404, "not_found");
    // Malformed bodies.
    let src = format!("{VAULT}/c.txt");
    let dst = "/nodes/pth/Acme/My First Vault/z.txt";
    assert_error(
        &api.call(
            Method::POST,
            &src,
            Some(json!({"copy": {"dst_uri": dst, "replace": "maybe"}})),
        )
        .await,
        400,
        "bad_parameter",
    );
    assert_error(
        &api.call(Method::POST, &src, Some(json!({"copy": {"dst_uri": dst}})))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &api.call(
            Method::POST,
            &src,
            Some(json!({"copy": {"replace": "fail"}})),
        )
        .await,
        400,
        "missing_parameter",
    );
    let two = json!({"copy": {"dst_uri": dst, "replace": "fail"}, "move": {"dst_uri": dst, "replace": "fail"}});
    assert_error(
        &api.call(Method::POST, &src, Some(two)).await,
        400,
        "bad_request",
    );
    assert_error(
        &api.call(Method::POST, &src, Some(json!({"rename": {}})))
            .await,
        400,
        "bad_request",
    );
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

#[tokio::test(flavor = "multi_thread")]
async fn authentication_and_account_isolation() {
    let (s, alice) = setup().await;
    let bob_creds = s.user("bob@example.org", "Bobco").await;
    let bob = Api::new(&s, &bob_creds);
    let id = alice.upload(VAULT, "secret.txt", b"alice only").await;
    let bob_id = bob
        .upload("/nodes/pth/Bobco/My%20First%20Vault", "b.txt", b"bob")
        .await;

    // No, malformed, wrong, or someone else's token.
    assert_error(&Api::anonymous(&s).get(VAULT).await, 401, "invalid_token");
    for header in ["Bearer abc", "Basic !!!", "Basic YWxpY2U="] {
        let resp = alice
            .http
            .get(format!("{}{VAULT}", s.base))
            .header("Authorization", header)
            .send()
            .await
            .unwrap();
        let st = resp.status();
        assert_error(&(st, resp.json().await.unwrap()), 401, "invalid_token");
    }
    let wrong = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token: "not-a-token".into(),
        },
    );
    assert_error(&wrong.get(VAULT).await, 401, "invalid_token");
    let mixed = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token: bob_creds.token.clone(),
        },
    );
    assert_error(&mixed.get(VAULT).await, 401, "invalid_token");

    // Bob cannot reach Alice's account by path, by ID, or as a copy/move destination.
    assert_error(&bob.get(VAULT).await, 403, "forbidden");
    assert_error(
        &bob.get("/nodes/pth/Acme?children=1").await,
        403,
        "forbidden",
    );
    assert_error(&bob.get("/nodes/pth/NoSuchAccount").await, 403, "forbidden");
    // By ID: not found, as an unused ID (tests/abuse.rs compares the two).
    assert_error(
        &bob.get(&format!("/files/id/Document/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &bob.get(&format!("/preview/id/Document/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &bob.call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": 1})),
        )
        .await,
        404,
        "not_found",
    );
    assert_error(
        &bob.call(Method::DELETE, &format!("{VAULT}/secret.txt"), None)
            .await,
        403,
        "forbidden",
    );
    let steal = json!({"copy": {"dst_uri": "/nodes/pth/Bobco/My First Vault/stolen.txt", "replace": "fail"}});
    assert_error(
        &bob.call(Method::POST, &format!("{VAULT}/secret.txt"), Some(steal))
            .await,
        403,
        "forbidden",
    );
    let plant = json!({"move": {"dst_uri": "/nodes/pth/Acme/My First Vault/planted.txt", "replace": "replace"}});
    assert_error(
        &bob.call(
            Method::POST,
            "/nodes/pth/Bobco/My%20First%20Vault/b.txt",
            Some(plant),
        )
        .await,
        403,
        "forbidden",
    );
    let (_, v) = bob.get("/nodes/pth?children=1").await;
    assert_eq!(names(&v), ["Bobco"]);
    assert_eq!(alice.download(&id).await, b"alice only");
    assert_eq!(bob.download(&bob_id).await, b"bob");

    // Expired and revoked tokens.
    s.store.expire_tokens("bob@example.org").unwrap();
    assert_error(&bob.get("/nodes/pth").await, 401, "token_expired");
    s.store.revoke_tokens("alice@example.com").unwrap();
    assert_error(&alice.get("/nodes/pth").await, 401, "invalid_token");
    // A new login works again.
    let token = login(&s.base, "alice@example.com", "pw-alice@example.com").await;
    let alice = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token,
        },
    );
    assert_eq!(alice.get("/nodes/pth").await.0, 200);
    // Removing a user removes their tokens.
    s.store.remove_user("alice@example.com").unwrap();
    assert_error(&alice.get("/nodes/pth").await, 401, "invalid_token");
}

#[tokio::test(flavor = "multi_thread")]
async fn pin_exchange_errors_page_and_lockout() {
    let s = TestServer::start().await;
    s.store
        .add_user("carol@example.com", "Carol", "right password")
        .unwrap();
    let anon = Api::anonymous(&s);
    assert_error(
        &anon.call(Method::POST, "/pin/end", Some(json!({}))).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &anon
            .call(Method::POST, "/pin/end", Some(json!({"client_id": "nope"})))
            .await,
        400,
        "unknown_client",
    );
    let (st, v) = anon
        .call(
            Method::POST,
            "/pin/end",
            Some(json!({"client_id": "vaultfs"})),
        )
        .await;
    assert_eq!(st, 200);
    assert!(
        v["message"]["authorization_uri"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/pin/authorize", s.base))
    );

    // A bad password shows the form again with an error, never a pin.
    let page = anon
        .http
        .post(s.url("/pin/authorize"))
        .form(&[
            ("client_id", "vaultfs"),
            ("email", "carol@example.com"),
            ("password", "wrong"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 401);
    let html = page.text().await.unwrap();
    assert!(pin_in(&html).is_none());
    assert!(html.contains("<form") && html.contains("wrong e-mail address or password"));
    let unknown = anon
        .http
        .get(s.url("/pin/authorize?client_id=evil"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);

    // Each sign-in shows a new pin, which replaces the one before.
    let pin0 = pin_in(&sign_in(&s, "right password").await).unwrap();
    let pin1 = pin_in(&sign_in(&s, "right password").await).unwrap();
    assert_ne!(pin0, pin1);
    assert_eq!(pin1.len(), 8);

    let auth = |body: Value| {
        let anon = &anon;
        async move { anon.call(Method::POST, "/pin/auth", Some(body)).await }
    };
    assert_error(
        &auth(json!({"pin_info": {"client_id": "vaultfs", "pin": 1}})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com"})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com", "pin_info": {"pin": 1}})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs"}}))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(
            json!({"user_email": "carol@example.com", "pin_info": {"client_id": "zzz", "pin": 1}}),
        )
        .await,
        400,
        "unknown_client",
    );
    assert_error(&auth(json!({"user_email": "nobody@example.com", "pin_info": {"client_id": "vaultfs", "pin": 1}})).await, 401, "invalid_pin");

    let replaced = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": pin0.parse::<u64>().unwrap()}});
    assert_error(&auth(replaced).await, 401, "invalid_pin");
    let good = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": pin1.parse::<u64>().unwrap()}});
    let (st, v) = auth(good.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["id"], "carol@example.com");
    assert_eq!(v["message"]["expires_in"], 14 * 24 * 3600);
    assert!(v["message"]["token"].as_str().unwrap().len() >= 40);

    // A pin works once.
    assert_error(&auth(good.clone()).await, 401, "invalid_pin");
    // Five wrong pins lock the exchange, even for the right pin.
    let wrong_pin: u64 = if pin1 == "12345678" {
        87654321
    } else {
        12345678
    };
    for _ in 0..4 {
        let bad = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": wrong_pin}});
        assert_error(&auth(bad).await, 401, "invalid_pin");
    }
    assert_error(&auth(good).await, 429, "too_many_attempts");
    // Five wrong passwords lock the page the same way.
    for _ in 0..5 {
        sign_in(&s, "bad").await;
    }
    let html = sign_in(&s, "right password").await;
    assert!(pin_in(&html).is_none() && html.contains("too many failed attempts"));
}

async fn sign_in(s: &TestServer, password: &str) -> String {
    reqwest::Client::new()
        .post(s.url("/pin/authorize"))
        .form(&[
            ("client_id", "vaultfs"),
            ("email", "carol@example.com"),
            ("password", password),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn framework_rejections_come_in_the_envelope() {
    let (s, api) = setup().await;
    assert_error(
        &api.call(Method::PATCH, VAULT, None).await,
        405,
        "method_not_allowed",
    );
    assert_error(&api.get("/no/such/route").await, 404, "unknown_route");
    assert_error(
        &api.call(Method::GET, "/pin/end", None).await,
        405,
        "method_not_allowed",
    );
    let resp = api
        .req(Method::PUT, VAULT)
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let st = resp.status();
    assert_error(&(st, resp.json().await.unwrap()), 400, "bad_json");
    let big = format!(
        "{{\"create_file\": [{{\"name\": \"{}\"}}]}}",
        "x".repeat(200_000)
    );
    let resp = api
        .req(Method::PUT, VAULT)
        .header("Content-Type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    let st = resp.status();
    assert_error(&(st, resp.json().await.unwrap()), 413, "body_too_large");
    // Deeply nested JSON is refused, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let resp = api
        .req(Method::POST, "/pin/end")
        .body(deep)
        .send()
        .await
        .unwrap();
    let st = resp.status();
    assert_error(&(st, resp.json().await.unwrap()), 400, "bad_json");
    // Bytes of no known type: TypeNotSupported, and no pages or PDF.
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let id = api.upload(VAULT, "a.bin", &junk).await;
    let meta = loop {
        let (st, v) = api.get(&format!("/preview/id/Document/{id}")).await;
        assert_eq!(st, 200);
        if v["message"]["status"] != "InProgress" {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(meta["message"]["status"], "TypeNotSupported");
    assert_error(
        &api.get(&format!("/preview/id/Document/{id}/1")).await,
        404,
        "preview_not_supported",
    );
    assert_error(
        &api.get(&format!("/preview/id/Document/{id}/pdf")).await,
        404,
        "preview_not_supported",
    );
    // A text file: Ready, PNG pages, the parameters checked, a PDF.
    let id = api.upload(VAULT, "a.txt", b"some text\n").await;
    let meta = loop {
        let (_, v) = api.get(&format!("/preview/id/Document/{id}")).await;
        if v["message"]["status"] == "Ready" {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(meta["message"]["pages"][0]["page_number"], 1);
    let page = api
        .req(
            Method::GET,
            &format!("/preview/id/Document/{id}/1?scale=25"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "image/png");
    assert!(page.bytes().await.unwrap().starts_with(b"\x89PNG"));
    let pdf = api
        .req(Method::GET, &format!("/preview/id/Document/{id}/pdf"))
        .send()
        .await
        .unwrap();
    assert_eq!(pdf.status(), 200);
    assert_eq!(pdf.headers()["content-type"], "application/pdf");
    assert!(pdf.bytes().await.unwrap().starts_with(b"%PDF-"));
    for bad in [
        "0",
        "x",
        "1?scale=0",
        "1?scale=101",
        "1?scale=abc",
        "1?max_width=0",
        "1?max_height=-3",
    ] {
        assert_error(
            &api.get(&format!("/preview/id/Document/{id}/{bad}")).await,
            400,
            "bad_parameter",
        );
    }
    assert_error(
        &api.get(&format!("/preview/id/Document/{id}/2")).await,
        404,
        "not_found",
    );
    assert_error(
        &api.get("/preview/id/Document/987654").await,
        404,
        "not_found",
    );
    drop(s);
}

#[tokio::test(flavor = "multi_thread")]
async fn body_limit_is_configurable_and_file_size_limit_is_413() {
    let config = vaultfs::store::StoreConfig {
        max_file_size: 1000,
        ..Default::default()
    };
    let options = vaultfs::server::ServerOptions {
        max_json_body: 100,
        ..Default::default()
    };
    let s = TestServer::start_with(config, options).await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    let (st, v) = api
        .call(
            Method::PUT,
            VAULT,
            Some(json!({"create_file": [{"name": "a"}]})),
        )
        .await;
    assert_eq!(st, 200);
    let id = v["message"]["children"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_error(
        &api.call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": 1001})),
        )
        .await,
        413,
        "file_too_large",
    );
    let long = json!({"create_file": [{"name": "y".repeat(150)}]});
    assert_error(
        &api.call(Method::PUT, VAULT, Some(long)).await,
        413,
        "body_too_large",
    );
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

/// One request exactly as written (no client-side path normalization), with Alice's token.
async fn raw_request(api: &Api, method: &str, path: &str) -> (StatusCode, Value) {
    use tokio::io::AsyncReadExt;
    let creds = api.creds.clone().unwrap();
    let addr = api.base.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
        base64_basic(&creds.email, &creds.token)
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    sock.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    (
        StatusCode::from_u16(status).unwrap(),
        serde_json::from_str(body).unwrap_or_else(|_| panic!("{text}")),
    )
}

fn base64_basic(email: &str, token: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{email}:{token}"))
    )
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

/// The store's disk fills up: the upload fails with 507 and leaves nothing half-written, the
/// database stays consistent, earlier files stay readable, and uploads work once space is back.
#[tokio::test(flavor = "multi_thread")]
async fn full_store_disk_is_507_and_recovers() {
    if !common::mount::fuse_available() {
        eprintln!("skipped: needs root (tmpfs)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let _disk = common::mount::Tmpfs::new(&data, 12);
    let s = TestServer::start_in(&data, Default::default(), Default::default()).await;
    let alice = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &alice);
    let first = common::mount::pattern(5 << 20, 1);
    let id = api.upload(VAULT, "first.bin", &first).await;

    let big = common::mount::pattern(10 << 20, 2);
    let (st, v) = api
        .call(
            Method::PUT,
            VAULT,
            Some(json!({"create_file": [{"name": "big.bin"}]})),
        )
        .await;
    assert_eq!(st, 200);
    let big_id = v["message"]["children"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, v) = api
        .call(
            Method::PUT,
            &format!("/nodes/upload/{big_id}"),
            Some(json!({"length": big.len()})),
        )
        .await;
    let uri = v["message"]["fileExProperties"]["upload_uri"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = api
        .req(Method::PUT, &uri)
        .header("Content-Type", "application/binary")
        .body(big)
        .send()
        .await
        .unwrap();
    // Answered before the body was read: the connection cannot carry another request, and
    // says so, so that a pooling client does not reuse it.
    assert_eq!(resp.headers()["connection"], "close");
    let status = resp.status();
    assert_error(
        &(status, resp.json().await.unwrap()),
        507,
        "insufficient_storage",
    );

    assert!(s.store.check_integrity().unwrap().is_empty());
    assert_eq!(api.download(&id).await, first);
    let (_, v) = api.get(&format!("{VAULT}/big.bin")).await;
    assert_eq!(v["message"]["size"], 0, "no partial version became current");
    // Space comes back: the same pending version can now be uploaded.
    assert_eq!(
        api.call(Method::DELETE, &format!("{VAULT}/first.bin"), None)
            .await
            .0,
        200
    );
    let smaller = common::mount::pattern(3 << 20, 3);
    api.put_version(&big_id, &smaller).await;
    assert_eq!(api.download(&big_id).await, smaller);
    assert!(s.store.check_integrity().unwrap().is_empty());
    s.stop().await;
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

// ----- stalled transfers (issue 19, item 3) -----

/// Opens a raw connection and sends `head` and `body`, then nothing more (a stalled client).
async fn stalled(addr: &str, head: &str, body: &[u8]) -> tokio::net::TcpStream {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body).await.unwrap();
    sock.flush().await.unwrap();
    sock
}

/// Upload step 2 for `len` bytes; returns step 3's path.
async fn pending_version(api: &Api, id: &str, len: usize) -> String {
    let (st, v) = api
        .call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": len})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["message"]["fileExProperties"]["upload_uri"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A step 3 that sends one byte of `len` and then nothing.
fn stalled_upload(api: &Api, uri: &str, len: usize) -> String {
    let c = api.creds.clone().unwrap();
    let addr = api.base.trim_start_matches("http://");
    format!(
        "PUT {uri} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {}\r\nContent-Type: application/binary\r\nContent-Length: {len}\r\n\r\n",
        base64_basic(&c.email, &c.token)
    )
}

/// A download whose answer is never read.
fn unread_download(api: &Api, id: &str) -> String {
    let c = api.creds.clone().unwrap();
    let addr = api.base.trim_start_matches("http://");
    format!(
        "GET /files/id/Document/{id} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {}\r\n\r\n",
        base64_basic(&c.email, &c.token)
    )
}

/// How many of a second user's everyday requests (list, create a folder, upload, download)
/// answer within `secs`, out of `rounds` rounds of 4.
async fn still_answering(api: &Api, rounds: usize, secs: u64) -> usize {
    let mut answered = 0;
    for i in 0..rounds {
        let work = async {
            let (st, _) = api.get(&format!("{BOB_VAULT}?children=1")).await;
            let mut n = usize::from(st == 200);
            let (st, _) = api
                .call(Method::PUT, &format!("{BOB_VAULT}/f{i}"), Some(json!({})))
                .await;
            n += usize::from(st == 200);
            let id = api
                .upload(BOB_VAULT, &format!("n{i}.txt"), b"still here")
                .await;
            n += 1;
            n += usize::from(api.download(&id).await == b"still here");
            n
        };
        match tokio::time::timeout(Duration::from_secs(secs), work).await {
            Ok(n) => answered += n,
            Err(_) => break,
        }
    }
    answered
}

const BOB_VAULT: &str = "/nodes/pth/Bobco/My%20First%20Vault";

/// 520 uploads that send one byte and then nothing, and 520 downloads nobody reads (more than
/// tokio's 512 blocking threads, which each used to pin), all by one user: every request of
/// another user still answers. (Before the fix none did.) Limits (transfers and connections)
/// are raised here so that only the way transfers wait is tested; the next test and
/// tests/abuse.rs cover the limits.
#[tokio::test(flavor = "multi_thread")]
async fn stalled_transfers_do_not_stop_the_server() {
    let options = vaultfs::server::ServerOptions {
        max_transfers_per_user: 100_000,
        transfer_idle_timeout: Duration::from_secs(600),
        header_timeout: Duration::from_secs(600),
        max_connections: 100_000,
        max_connections_per_source: 100_000,
        ..Default::default()
    };
    let s = TestServer::start_with(Default::default(), options).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Bobco").await);
    // Larger than what the sockets' buffers take in, so an unread download really waits.
    let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
    let big_id = alice.upload(VAULT, "big.bin", &big).await;
    let id = alice.upload(VAULT, "up.bin", b"x").await;
    let uri = pending_version(&alice, &id, 1000).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let (up, down) = (
        stalled_upload(&alice, &uri, 1000),
        unread_download(&alice, &big_id),
    );
    let mut socks = Vec::new();
    for _ in 0..520 {
        socks.push(stalled(&addr, &up, b"x").await);
        socks.push(stalled(&addr, &down, b"").await);
    }
    // Give the server time to take them all in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answered = still_answering(&bob, 5, 20).await;
    println!("{answered} of 20 requests answered under 1040 stalled transfers");
    assert_eq!(
        answered, 20,
        "requests went unanswered under stalled transfers"
    );
    drop(socks);
    assert!(s.store.check_integrity().unwrap().is_empty());
}

/// One user runs at most `max_transfers_per_user` transfers: the next one is 503
/// `too_many_transfers` with `Retry-After`, other users are not affected; an upload that sends
/// nothing for `transfer_idle_timeout` is aborted and a download nobody reads is dropped, which
/// frees their slots.
#[tokio::test(flavor = "multi_thread")]
async fn transfers_per_user_are_limited_and_stalls_are_cut_off() {
    let options = vaultfs::server::ServerOptions {
        max_transfers_per_user: 3,
        transfer_idle_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let s = TestServer::start_with(Default::default(), options).await;
    let alice = Api::new(&s, &s.user("alice@example.com", "Acme").await);
    let bob = Api::new(&s, &s.user("bob@example.com", "Bobco").await);
    let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
    let big_id = alice.upload(VAULT, "big.bin", &big).await;
    let small_id = alice.upload(VAULT, "small.txt", b"small").await;
    let bob_id = bob.upload(BOB_VAULT, "b.txt", b"bob's").await;
    let id = alice.upload(VAULT, "up.bin", b"x").await;
    let uri = pending_version(&alice, &id, 1000).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let busy = |api: &Api, id: String| {
        let r = api.req(Method::GET, &format!("/files/id/Document/{id}"));
        async move { r.send().await.unwrap() }
    };

    // Three stalled uploads take Alice's three slots.
    let mut ups = Vec::new();
    for _ in 0..3 {
        ups.push(stalled(&addr, &stalled_upload(&alice, &uri, 1000), b"x").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = busy(&alice, small_id.clone()).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["error_name"], "too_many_transfers", "{v}");
    assert_eq!(bob.download(&bob_id).await, b"bob's");
    // The idle timeout aborts them: each gets its answer, and the slots come back.
    for mut sock in ups {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut answer))
            .await
            .expect("a stalled upload was not cut off")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("upload_interrupted"), "{answer}");
    }
    assert_eq!(alice.download(&small_id).await, b"small");

    // Three unread downloads take the slots again; once their clients have read nothing for a
    // second, their connections are dropped and the slots come back.
    let mut downs = Vec::new();
    for _ in 0..3 {
        downs.push(stalled(&addr, &unread_download(&alice, &big_id), b"").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(busy(&alice, small_id.clone()).await.status(), 503);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let st = busy(&alice, small_id.clone()).await.status();
        if st == 200 {
            break;
        }
        assert_eq!(st, 503);
        assert!(
            std::time::Instant::now() < deadline,
            "unread downloads kept their slots"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(downs);
    // The file was never changed by the aborted uploads.
    assert_eq!(alice.download(&id).await, b"x");
    assert!(s.store.check_integrity().unwrap().is_empty());
}
