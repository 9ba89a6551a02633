//! Test support: a real `vaultfs serve` application on a loopback port over a store in a
//! temporary directory, the pin login done the way a person does it (the HTML page), the
//! three-step upload over raw HTTP, and the bytes and checksums the tests write and compare.
#![allow(dead_code)]

pub mod dav_clients;
pub mod dialect;
#[macro_use]
pub mod env;
pub mod fixtures;
pub mod mount;
pub mod pg;
pub mod s3;
pub mod served;
pub mod suite;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use md5::{Digest, Md5};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use vaultfs::server::{self, ServerOptions};
use vaultfs::store::{Store, StoreConfig};

pub struct TestServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub store: Arc<Store>,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// E-mail and delegation token of a logged-in user.
#[derive(Clone, Debug)]
pub struct Creds {
    pub email: String,
    pub token: String,
}

/// The store's settings under the retention rule `vaultfs serve` runs with by default (50
/// earlier versions, 30 days, 1 GiB per file; `StoreConfig::default()` keeps every version
/// and no deleted file).
#[allow(dead_code)] // not every test binary keeps versions
pub fn served_retention() -> StoreConfig {
    StoreConfig {
        retention: vaultfs::store::Retention {
            count: Some(50),
            age: Some(std::time::Duration::from_secs(30 * 24 * 3600)),
            bytes: Some(1 << 30),
        },
        ..StoreConfig::default()
    }
}

impl TestServer {
    /// A server over a new, empty store.
    pub async fn start() -> TestServer {
        Self::start_with(StoreConfig::default(), ServerOptions::default()).await
    }

    pub async fn start_with(config: StoreConfig, options: ServerOptions) -> TestServer {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let mut s = Self::start_in(&dir, config, options).await;
        s._tmp = Some(tmp);
        s
    }

    /// A server over the store in `dir` (kept when the server stops).
    pub async fn start_in(dir: &Path, config: StoreConfig, options: ServerOptions) -> TestServer {
        Self::start_at(dir, "127.0.0.1:0", config, options).await
    }

    /// The same on a given address (to restart a server where its clients expect it).
    pub async fn start_at(
        dir: &Path,
        addr: &str,
        config: StoreConfig,
        options: ServerOptions,
    ) -> TestServer {
        let store = Arc::new(Store::open(dir, config).unwrap());
        // As `vaultfs serve` does.
        store
            .start_previews(1, std::path::Path::new(mount::BIN))
            .unwrap();
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // As `vaultfs serve` does (its connections bounded and timed).
        let (tx, task) = serve(
            listener,
            server::router(store.clone(), options.clone()),
            options,
        );
        TestServer {
            base,
            store,
            dir: dir.to_path_buf(),
            _tmp: None,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Stops the server and waits for it (the store's data stays in `dir`).
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), t).await;
        }
        self._tmp.take()
    }

    /// `path` on this server; an absolute address (a link the server sent) as it is.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            return path.to_string();
        }
        format!("{}{}", self.base, path)
    }

    /// Adds a user (account created with its vault if new) and logs them in through the page.
    pub async fn user(&self, email: &str, account: &str) -> Creds {
        let password = format!("pw-{email}");
        self.store.add_user(email, account, &password).unwrap();
        let token = login(&self.base, email, &password).await;
        Creds {
            email: email.to_string(),
            token,
        }
    }
}

/// Writes a login to `server` (its base URL) into a `credentials.toml`, as `vaultfs login`
/// does, valid for `valid`.
pub fn save_login(file: &Path, server: &str, creds: Creds, valid: std::time::Duration) {
    let login = vaultfs::cli::login::Credentials {
        server: server.to_string(),
        email: creds.email,
        token: creds.token.into(),
        expires_at: std::time::SystemTime::now() + valid,
    };
    vaultfs::cli::login::save_credentials(file, &login).unwrap();
}

/// Serves `app` in a task until the sender is used or dropped.
pub fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    options: ServerOptions,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server::conn::serve(listener, app, &options, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (tx, task)
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The value of attribute `attr` in the first tag of `html` that contains `marker`.
pub fn attr_after(html: &str, marker: &str, attr: &str) -> Option<String> {
    let start = html.find(marker)?;
    let tag_start = html[..start].rfind('<')?;
    let tag_end = start + html[start..].find('>')?;
    let tag = &html[tag_start..tag_end];
    let key = format!("{attr}=\"");
    let v = tag.find(&key)? + key.len();
    Some(tag[v..v + tag[v..].find('"')?].to_string())
}

/// A loopback port free right now, for a `vaultfs serve` a test starts; never one given before
/// in this process. The kernel may hand a port it just gave (and got back) to the next bind:
/// two tests running side by side would then start their servers on one port, and a client of
/// one test talk to the other's server (a valid token refused, a file not found).
#[allow(dead_code)] // not every test binary starts a server process
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// Waits (at most 20 s) until a `vaultfs serve` started by a test accepts connections on `port`.
#[allow(dead_code)] // not every test binary starts a server process
pub fn wait_for_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "vaultfs serve did not start on port {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The pin shown on a page: the text of the element with `id="pin"`.
pub fn pin_in(html: &str) -> Option<String> {
    let at = html.find("id=\"pin\"")?;
    let text_start = at + html[at..].find('>')? + 1;
    let text_end = text_start + html[text_start..].find('<')?;
    Some(html[text_start..text_end].trim().to_string())
}

/// The pin flow of docs/design.md §2 as a person goes through it: `/pin/end`, open the authorization page,
/// fill in its form (read from the page), read the pin, `/pin/auth`.
pub async fn login(base: &str, email: &str, password: &str) -> String {
    let http = reqwest::Client::new();
    let end: serde_json::Value = http
        .post(format!("{base}/pin/end"))
        .json(&serde_json::json!({"client_id": "vaultfs"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let auth_uri = end["message"]["authorization_uri"]
        .as_str()
        .expect("authorization_uri")
        .to_string();
    let page = http
        .get(&auth_uri)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let action = attr_after(&page, "<form", "action").expect("form action");
    let method = attr_after(&page, "<form", "method").expect("form method");
    assert_eq!(method.to_lowercase(), "post");
    let client_id = attr_after(&page, "name=\"client_id\"", "value").expect("hidden client_id");
    assert!(page.contains("name=\"email\"") && page.contains("name=\"password\""));
    let pinpage = http
        .post(format!("{base}{action}"))
        .form(&[
            ("client_id", client_id.as_str()),
            ("email", email),
            ("password", password),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let pin = pin_in(&pinpage).unwrap_or_else(|| panic!("no pin on the page: {pinpage}"));
    let pin: u64 = pin.parse().expect("numeric pin");
    let auth: serde_json::Value = http
        .post(format!("{base}/pin/auth"))
        .json(&serde_json::json!({"user_email": email, "pin_info": {"client_id": "vaultfs", "pin": pin}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    auth["message"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {auth}"))
        .to_string()
}

/// Asks `b` for the preview of file `id` until it is ready (each ask is a request: it goes
/// first), for at most `secs` seconds; its number of pages.
pub async fn preview_pages_when_ready<B: vaultfs::backend::Backend>(
    b: &B,
    id: &str,
    secs: u64,
) -> usize {
    use vaultfs::api::PreviewStatus;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let m = b.preview(id).await.unwrap();
        match m.status {
            PreviewStatus::Ready => return m.pages.len(),
            PreviewStatus::InProgress => {}
            s => panic!("{id}: {s:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id}: not ready after {secs}s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The whole current content of file `id`, downloaded through `b`.
pub async fn content<B: vaultfs::backend::Backend>(b: &B, id: &str) -> Vec<u8> {
    use futures_util::StreamExt;
    let mut body = b.download(id, None).await.unwrap().body;
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// md5 of `data` as lowercase hex, as `md5_checksum` spells it.
pub fn md5hex(data: &[u8]) -> String {
    vaultfs::api::checksum::hex(&Md5::digest(data))
}

/// Deterministic pseudo-random bytes (a shifted range or a swapped block shows).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends `req` as `who` and reads the answer as JSON: (status, envelope).
async fn send_json(req: reqwest::RequestBuilder, who: &Creds) -> (StatusCode, Value) {
    let resp = req
        .basic_auth(&who.email, Some(&who.token))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
    (status, v)
}

/// Upload steps 1-3 over raw HTTP as `who`: step 1 creates `name` in the folder at `folder` (its
/// encoded path, `/nodes/pth/...`), steps 2 and 3 send `data`; returns the file ID.
pub async fn upload(
    http: &reqwest::Client,
    base: &str,
    who: &Creds,
    folder: &str,
    name: &str,
    data: &[u8],
) -> String {
    let id = create_file(http, base, who, folder, name).await;
    upload_version(http, base, who, &id, data).await;
    id
}

/// Upload step 1 alone: `name` created in the folder at `folder` (encoded); returns its ID.
pub async fn create_file(
    http: &reqwest::Client,
    base: &str,
    who: &Creds,
    folder: &str,
    name: &str,
) -> String {
    let step1 = http
        .put(format!("{base}{folder}"))
        .json(&json!({"create_file": [{"name": name}]}));
    let (st, v) = send_json(step1, who).await;
    assert_eq!(st, 200, "{v}");
    v["message"]["children"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

/// Upload steps 2 (with the md5) and 3 of `data` as a new version of the file `id`; returns
/// step 3's envelope.
pub async fn upload_version(
    http: &reqwest::Client,
    base: &str,
    who: &Creds,
    id: &str,
    data: &[u8],
) -> Value {
    let step2 = http
        .put(format!("{base}/nodes/upload/{id}"))
        .json(&json!({"length": data.len(), "md5_checksum": md5hex(data)}));
    let (st, v) = send_json(step2, who).await;
    assert_eq!(st, 200, "{v}");
    let uri = v["message"]["fileExProperties"]["upload_uri"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let (st, v) = upload_bytes(http, base, who, &uri, data.to_vec(), "application/binary").await;
    assert_eq!(st, 200, "{v}");
    v
}

/// Upload step 3: `data` sent to the `upload_uri` of step 2 with this content type.
pub async fn upload_bytes(
    http: &reqwest::Client,
    base: &str,
    who: &Creds,
    uri: &str,
    data: Vec<u8>,
    ctype: &str,
) -> (StatusCode, Value) {
    let resp = http
        .put(format!("{base}{uri}"))
        .basic_auth(&who.email, Some(&who.token))
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

/// The peak resident memory (VmHWM) and the current one (VmRSS) of a process, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// CPU time (user and system) process `pid` has used so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's `(name)`: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    std::time::Duration::from_millis(ticks * 1000 / per_sec)
}

/// `n` long polls of the change feed (`GET /changes?cursor=&wait=55`) by `creds` at `base`,
/// held open until the returned tasks are dropped or a change comes.
pub async fn long_polls(base: &str, creds: &Creds, n: usize) -> Vec<JoinHandle<Value>> {
    let http = reqwest::Client::new();
    let head: Value = http
        .get(format!("{base}/changes"))
        .basic_auth(&creds.email, Some(&creds.token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cursor = head["message"]["cursor"].as_u64().unwrap();
    (0..n)
        .map(|_| {
            let req = http
                .get(format!("{base}/changes?cursor={cursor}&wait=55"))
                .basic_auth(&creds.email, Some(&creds.token));
            tokio::spawn(async move { req.send().await.unwrap().json().await.unwrap() })
        })
        .collect()
}
