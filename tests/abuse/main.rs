//! Hostile clients against `vaultfs serve` (issue 19, items 5 to 13): connections held open for
//! nothing, raced and aimed lockouts, pins, other accounts' IDs, the authorization page, quotas.
//! Everything runs on loopback; sources are told apart by their address (127.0.0.1, .2, ...).
//! Stalls are measured by what still answers, not by wall time.
//!
//! One binary (see Cargo.toml's note on test binaries), its tests by concern in the modules
//! below: `connections` (held, bounded, exhausting), `login` (lockouts, pins, the authorization
//! page), `accounts` (other accounts' IDs, quotas), `deletes` (large deletes and their purge),
//! `control` (the control sockets against another local user), `input` (names and arbitrary
//! requests), `search` (searches that held the server, issue 47), `tree` (copies and moves
//! into or onto themselves, cycles and `vaultfs check`).
//! The helpers more than one of them uses are here.

#[path = "../common/mod.rs"]
mod common;

mod accounts;
mod connections;
mod control;
mod deletes;
mod input;
mod login;
mod search;
mod tree;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::TestServer;
use tokio::net::{TcpSocket, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

fn addr_of(base: &str) -> SocketAddr {
    base.trim_start_matches("http://").parse().unwrap()
}

/// A TCP connection to `server` from the loopback address `from` (127.0.0.x).
async fn connect_from(from: &str, server: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    sock.connect(server).await.unwrap()
}

/// An HTTP client whose connections come from `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some(from.parse().unwrap()))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The status of an answer and its error name ("ok" when it has none).
async fn status_and_code(r: reqwest::Response) -> (u16, String) {
    let st = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    let code = v["error"]["error_name"]
        .as_str()
        .unwrap_or("ok")
        .to_string();
    (st, code)
}

/// A JSON request as `who`; the status and the error code ("ok" on success).
async fn call(
    s: &TestServer,
    who: &common::Creds,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> (u16, String) {
    let r = client_from("127.0.0.1")
        .request(method, s.url(path))
        .basic_auth(&who.email, Some(&who.token))
        .json(&body)
        .send()
        .await
        .unwrap();
    status_and_code(r).await
}

/// A new folder at `path` (encoded) as `who`: the status and error code.
async fn mkdir(s: &TestServer, who: &common::Creds, path: &str) -> (u16, String) {
    call(s, who, reqwest::Method::PUT, path, serde_json::json!({})).await
}

/// Upload step 1 of `name` in the folder at `path` (encoded) as `who`: the new file's ID.
async fn new_file(s: &TestServer, who: &common::Creds, path: &str, name: &str) -> String {
    common::create_file(&client_from("127.0.0.1"), &s.base, who, path, name).await
}

/// A `vaultfs serve` over `dir` on `port`, its log in `dir/../serve-<n>.log`.
fn serve(dir: &std::path::Path, port: u16, n: usize) -> std::process::Child {
    serve_with(dir, port, n, &[])
}

/// [`serve`] with more options.
fn serve_with(dir: &std::path::Path, port: u16, n: usize, more: &[&str]) -> std::process::Child {
    let log = std::fs::File::create(dir.with_file_name(format!("serve-{n}.log"))).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir)
        .args(["--preview-workers", "1"])
        .args(more)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for_port(port);
    child
}
