//! A headless Chromium driven over the W3C WebDriver protocol (chromedriver), spoken directly
//! with reqwest: the dozen commands these tests use need no client crate.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// The key W3C WebDriver names element references with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a wait for something on a page may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// `name` on PATH, if there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The browser and its driver from the Debian packages (`chromium`, `chromium-driver`), or the
/// reason they cannot be used.
pub fn installed() -> Result<(PathBuf, PathBuf), String> {
    let browser = on_path("chromium")
        .or_else(|| on_path("chromium-browser"))
        .ok_or("chromium is not installed")?;
    let driver = on_path("chromedriver").ok_or("chromedriver is not installed")?;
    Ok((browser, driver))
}

pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium whose downloads go to `downloads`.
    pub async fn start(browser: &Path, driver: &Path, downloads: &Path) -> Browser {
        let port = crate::common::free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        crate::common::wait_for_port(port);
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless=new",
                    // The tests may run as root in a container, where Chromium's sandbox cannot
                    // start; the pages are our own.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
                "prefs": {
                    "download.default_directory": downloads,
                    "download.prompt_for_download": false,
                },
            },
        }}});
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {resp}"))
            .to_string();
        Browser {
            http,
            session: format!("{base}/session/{id}"),
            driver: child,
            _profile: profile,
        }
    }

    /// One command; its `value`. A WebDriver error fails the test with its message.
    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        if v["value"]["error"].is_string() {
            panic!("WebDriver {method} {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.cmd(reqwest::Method::GET, path, None).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    pub async fn url(&self) -> String {
        self.get("/url").await.as_str().unwrap().to_string()
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        self.run("return document.body.innerText;", json!([]))
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The elements matching a CSS selector now.
    async fn all(&self, css: &str) -> Vec<String> {
        self.post(
            "/elements",
            json!({ "using": "css selector", "value": css }),
        )
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[ELEMENT].as_str().unwrap().to_string())
        .collect()
    }

    /// Waits until `check` holds, or fails saying what was awaited.
    pub async fn wait_until<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + PATIENCE;
        while !check().await {
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}; the page says: {}",
                self.text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element matching `css`, waited for.
    pub async fn find(&self, css: &str) -> String {
        let found = std::cell::RefCell::new(None);
        self.wait_until(&format!("`{css}`"), || async {
            let first = self.all(css).await.into_iter().next();
            let seen = first.is_some();
            *found.borrow_mut() = first;
            seen
        })
        .await;
        found.into_inner().unwrap()
    }

    /// Waits until the page's text contains `text`.
    pub async fn wait_text(&self, text: &str) {
        self.wait_until(&format!("the text {text:?}"), || async {
            self.text().await.contains(text)
        })
        .await;
    }

    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.post(&format!("/element/{e}/click"), json!({})).await;
    }

    /// Types `text` into the field `css` (after emptying it). For a file input, `text` is the
    /// paths of the files, one per line.
    pub async fn fill(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        let is_file = self
            .run(
                "return arguments[0].type === 'file';",
                json!([{ ELEMENT: e }]),
            )
            .await
            .as_bool()
            .unwrap_or(false);
        if !is_file {
            self.post(&format!("/element/{e}/clear"), json!({})).await;
        }
        self.post(&format!("/element/{e}/value"), json!({ "text": text }))
            .await;
    }

    pub async fn set_window(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({ "width": width, "height": height }))
            .await;
    }

    /// Saves a PNG of the window to `file`.
    pub async fn screenshot(&self, file: &Path) {
        let b64 = self.get("/screenshot").await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, png).unwrap();
    }
}

impl Drop for Browser {
    /// Ends the session (which closes the browser), then the driver: also when a test fails.
    /// Blocking and by hand, as a drop cannot wait for reqwest.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let rest = self.session.trim_start_matches("http://");
        if let Some((host, path)) = rest.split_once('/') {
            if let Ok(mut s) = std::net::TcpStream::connect(host) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    s,
                    "DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
