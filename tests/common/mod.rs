//! Test support: a real `vaultfs serve` application on a loopback port over a store in a
//! temporary directory, and the pin login done the way a person does it (the HTML page).
#![allow(dead_code)]

pub mod dialect;
#[macro_use]
pub mod env;
pub mod fixtures;
pub mod mount;
pub mod pg;
pub mod s3;
pub mod suite;

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        store.start_previews(1).unwrap();
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

    pub fn url(&self, path: &str) -> String {
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
        token: creds.token,
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

/// A loopback port free right now, for a `vaultfs serve` a test starts.
#[allow(dead_code)] // not every test binary starts a server process
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// The pin flow of spec §5 as a person goes through it: `/pin/end`, open the authorization page,
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
