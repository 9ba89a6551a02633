//! The `vaultfs` binary as an operator uses it: user management on a data directory, `serve` as
//! a process that answers over loopback, and a clean stop on SIGTERM.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

fn vaultfs(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_commands_and_serve_process() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = data.to_str().unwrap();

    let (ok, out, err) = vaultfs(
        &[
            "user",
            "add",
            "ops@example.com",
            "--account",
            "Ops",
            "--data-dir",
            d,
        ],
        Some("s3cret pass\n"),
    );
    assert!(ok, "{err}");
    assert!(out.contains("added ops@example.com"));
    // The same e-mail twice, an empty password, a bad address: clear errors.
    let (ok, _, err) = vaultfs(
        &[
            "user",
            "add",
            "ops@example.com",
            "--account",
            "Ops",
            "--data-dir",
            d,
        ],
        Some("x\n"),
    );
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = vaultfs(
        &[
            "user",
            "add",
            "new@example.com",
            "--account",
            "Ops",
            "--data-dir",
            d,
        ],
        Some(""),
    );
    assert!(!ok && err.contains("no password"), "{err}");
    let (ok, _, err) = vaultfs(
        &[
            "user",
            "add",
            "not-an-email",
            "--account",
            "Ops",
            "--data-dir",
            d,
        ],
        Some("pw\n"),
    );
    assert!(!ok && err.contains("not an e-mail address"), "{err}");
    let (ok, out, _) = vaultfs(&["user", "list", "--data-dir", d], None);
    assert!(
        ok && out.contains("ops@example.com") && out.contains("Ops"),
        "{out}"
    );
    let (ok, out, _) = vaultfs(&["client", "add", "my-app", "--data-dir", d], None);
    assert!(ok && out.contains("my-app"));
    // The data directory is private to its owner.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&data).unwrap().permissions().mode() & 0o077,
        0
    );

    let port = free_port();
    let mut server = Command::new(BIN)
        .args([
            "serve",
            "--data-dir",
            d,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    common::wait_for_port(port);
    let token = common::login(&base, "ops@example.com", "s3cret pass").await;
    let resp = reqwest::Client::new()
        .get(format!("{base}/nodes/pth/Ops?children=1"))
        .basic_auth("ops@example.com", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["message"]["children"][0]["name"], "My First Vault");

    // Removing the user while the server runs takes effect at once.
    let (ok, _, _) = vaultfs(
        &["user", "remove", "ops@example.com", "--data-dir", d],
        None,
    );
    assert!(ok);
    let resp = reqwest::Client::new()
        .get(format!("{base}/nodes/pth"))
        .basic_auth("ops@example.com", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (ok, _, err) = vaultfs(
        &["user", "remove", "ops@example.com", "--data-dir", d],
        None,
    );
    assert!(!ok && err.contains("no user"), "{err}");

    // SIGTERM stops it cleanly, and the log never shows the token.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("GET /nodes/pth/Ops 200"), "{log}");
    // A server without a byte quota says so at start (issue 31: it was silent).
    assert!(log.contains("no byte quota"), "{log}");
    assert!(
        !log.contains(&token) && !log.contains("s3cret"),
        "secrets in the log"
    );
}

#[test]
fn completions_and_man_page_come_from_the_flags() {
    let (ok, out, _) = vaultfs(&["completions", "bash"], None);
    assert!(
        ok && out.contains("_vaultfs") && out.contains("--cache-size") && out.contains("serve"),
        "{out}"
    );
    let (ok, out, _) = vaultfs(&["completions", "zsh"], None);
    assert!(ok && out.contains("#compdef vaultfs"));
    let (ok, _, err) = vaultfs(&["completions", "tcsh"], None);
    assert!(!ok && err.contains("invalid value"), "{err}");
    // Defaults shown as written (from MountOptions), and how the options spell in config.toml and -o.
    let (ok, out, _) = vaultfs(&["mount", "--help"], None);
    assert!(
        ok && out.contains("[default: 2G]")
            && out.contains("1T for a server")
            && out.contains("-o cache_size=4G"),
        "{out}"
    );
    let (ok, out, _) = vaultfs(&["manpage"], None);
    assert!(
        ok && out.contains(".TH vaultfs 1") && out.contains("mount"),
        "{out}"
    );
}

#[test]
fn bad_arguments_get_clear_errors() {
    let (ok, _, err) = vaultfs(&["serve", "--listen", "not-an-address"], None);
    assert!(!ok && err.contains("invalid value"), "{err}");
    let (ok, out, _) = vaultfs(&["--help"], None);
    assert!(ok && out.contains("serve") && out.contains("user"));
    let (ok, out, _) = vaultfs(&["serve", "--help"], None);
    assert!(ok && out.contains("--data-dir") && out.contains("--listen"));
    // A data directory that cannot be created.
    let (ok, _, err) = vaultfs(&["user", "list", "--data-dir", "/proc/nope/data"], None);
    assert!(!ok && err.contains("cannot open the store"), "{err}");
}
