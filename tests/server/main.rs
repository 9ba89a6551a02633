//! `vaultfs serve` over real loopback HTTP: every route, its success and its errors, asserting the
//! status, the envelope and what is stored afterwards. One binary (see Cargo.toml's note on test
//! binaries), its routes by concern in the modules below; the client and the checks they share
//! are here.

#[path = "../common/mod.rs"]
mod common;

mod auth_pin;
mod batch;
mod changes;
mod dav;
mod dav_seen;
mod limits;
mod links;
mod nodes;
mod upload;
mod versions;
mod whole;

use common::{Creds, TestServer};
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

    fn creds(&self) -> &Creds {
        self.creds.as_ref().expect("a logged-in client")
    }

    /// Upload step 1 of `name` in the folder at encoded `folder`; returns the file ID.
    async fn create_file(&self, folder: &str, name: &str) -> String {
        common::create_file(&self.http, &self.base, self.creds(), folder, name).await
    }

    /// Upload steps 1-3 of `data` as `name` in the folder at encoded `folder`; returns the file ID.
    async fn upload(&self, folder: &str, name: &str, data: &[u8]) -> String {
        common::upload(&self.http, &self.base, self.creds(), folder, name, data).await
    }

    /// Steps 2 and 3 for an existing file.
    async fn put_version(&self, id: &str, data: &[u8]) -> Value {
        common::upload_version(&self.http, &self.base, self.creds(), id, data).await
    }

    async fn step3(&self, uri: &str, data: Vec<u8>, ctype: &str) -> (StatusCode, Value) {
        common::upload_bytes(&self.http, &self.base, self.creds(), uri, data, ctype).await
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

/// A table of error cases of one method: each row a path, its JSON body, and the status and
/// code of the failure envelope it must get (checked as [`assert_error`] does).
async fn assert_errors(api: &Api, method: Method, rows: &[(&str, Value, u16, &str)]) {
    for (path, body, status, code) in rows {
        let got = api.call(method.clone(), path, Some(body.clone())).await;
        let what = format!("{method} {path} {body}");
        assert_eq!(
            (got.0.as_u16(), &got.1["error"]["error_name"]),
            (*status, &json!(code)),
            "{what}: {}",
            got.1
        );
        assert_error(&got, *status, code);
    }
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
