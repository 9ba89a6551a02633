//! `vaultfs serve` over real loopback HTTP: every route, its success and its errors, asserting the
//! status, the envelope and what is stored afterwards. One binary (see Cargo.toml's note on test
//! binaries), its routes by concern in the modules below; the client and the checks they share
//! are here.

#[path = "../common/mod.rs"]
mod common;

mod auth_pin;
mod limits;
mod nodes;
mod upload;

use common::{Creds, TestServer};
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
