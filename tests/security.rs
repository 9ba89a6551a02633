//! Security rows that are about files and logs rather than routes: the credentials file stays
//! 0600 (its folder 0700) through logins, re-logins and logouts; `vaultfs login` prints no token;
//! a remote mount's log (at debug level) and `vaultfs status` show no token, no Authorization
//! value and no password, also when the token is revoked; the server's data dir is private to
//! its owner wherever it is and whatever mode it had. (The route-level rows are in
//! tests/server.rs, tests/hostile.rs and tests/mount.rs; docs/reliability.md lists them all.)

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::TestServer;
use common::env::{Env, Via};

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `vaultfs ARGS` with its config under `home` (never the real one).
fn vaultfs(home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_stay_0600_through_login_relogin_and_logout() {
    let s = TestServer::start().await;
    s.store
        .add_user("sec@example.com", "Sec", "a password")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().to_path_buf();
    let file = home.join("config/vaultfs/credentials.toml");
    let login = |home: std::path::PathBuf, base: String, pin: String| {
        tokio::task::spawn_blocking(move || {
            vaultfs(
                &home,
                &[
                    "login",
                    "--server",
                    &base,
                    "--email",
                    "sec@example.com",
                    "--pin",
                    &pin,
                    "--no-browser",
                ],
            )
        })
    };
    let pin = s
        .store
        .sign_in_for_pin("sec@example.com", "a password", "vaultfs")
        .unwrap();

    let out = login(home.clone(), s.base.clone(), pin.clone())
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let first = vaultfs::cli::login::credentials_in(&file, &s.base)
        .unwrap()
        .token;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    assert!(!text(&out).contains(&first), "login printed the token");

    // Someone loosened the file and its folder; the next login makes them private again.
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(file.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = login(home.clone(), s.base.clone(), pin).await.unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let second = vaultfs::cli::login::credentials_in(&file, &s.base)
        .unwrap()
        .token;
    assert_ne!(first, second, "a re-login stores a new token");
    assert!(!fs::read_to_string(&file).unwrap().contains(&first));
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    assert!(!text(&out).contains(&second), "login printed the token");
    // No temporary copy of the credentials is left beside them.
    let names: Vec<String> = fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["credentials.toml"]);

    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || vaultfs(&home, &["logout", "--server", &base]))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(&second));
    if file.exists() {
        assert_eq!(mode(&file), 0o600);
        assert!(!fs::read_to_string(&file).unwrap().contains(&second));
    }
}

/// A remote mount used for a while at debug level, then its token revoked: neither its log nor
/// `vaultfs status` show the token, the Authorization header's value or the password; its
/// staged and cached files are private.
#[test]
fn the_mount_log_and_status_show_no_secret() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let server = env.server.as_ref().unwrap();
    let creds = vaultfs::cli::login::credentials_in(
        &env.config.join("vaultfs/credentials.toml"),
        &server.base,
    )
    .unwrap();
    let token = creds.token.clone();
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", creds.email, creds.token));
    let password = format!("pw-{}", creds.email);
    let m = common::mount::Mount::start_with_env(
        &env.mnt,
        &[
            "--server",
            &server.base,
            "--cache-dir",
            env.cache.to_str().unwrap(),
            "--timeout",
            "5",
        ],
        &[
            ("XDG_CONFIG_HOME", &env.config),
            ("RUST_LOG", Path::new("debug")),
        ],
    );
    let v = env.vault();
    fs::write(v.join("a.txt"), "some text").unwrap();
    fs::write(v.join("big.bin"), common::mount::pattern(3 << 20, 9)).unwrap();
    // While an upload is staged, the staged bytes are private.
    for e in walk(&env.cache.join("staging")) {
        if e.is_file() {
            assert_eq!(mode(&e) & 0o077, 0, "{} is readable by others", e.display());
        }
    }
    env.wait_uploaded();
    assert_eq!(fs::read_to_string(v.join("a.txt")).unwrap(), "some text");
    fs::rename(v.join("a.txt"), v.join("b.txt")).unwrap();
    let _ = fs::read_dir(&v).unwrap().count();
    let status = Command::new(BIN)
        .args(["status", "--json"])
        .arg(&env.mnt)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status));
    let status = text(&status);
    for (what, secret) in [("token", &token), ("Authorization value", &basic)] {
        assert!(!status.contains(secret.as_str()), "status shows the {what}");
    }
    for e in walk(&env.cache.join("cache")) {
        if e.is_file() {
            assert_eq!(mode(&e) & 0o077, 0, "{} is readable by others", e.display());
        }
    }
    // The token is revoked: the mount says to log in again, still without showing it.
    server.store.revoke_tokens(&creds.email).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !m.log_text().contains("vaultfs login") {
        assert!(
            Instant::now() < deadline,
            "no log line about logging in again"
        );
        let e = fs::create_dir(v.join(format!("d{}", rand_suffix()))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        std::thread::sleep(Duration::from_millis(200));
    }
    m.unmount();
    let log = fs::read_to_string(env.mnt.with_extension("log")).unwrap();
    assert!(
        log.contains("DEBUG"),
        "the mount did not log at debug level"
    );
    for (what, secret) in [
        ("token", token.as_str()),
        ("Authorization value", basic.as_str()),
        ("password", password.as_str()),
    ] {
        assert!(!log.contains(secret), "the mount's log shows the {what}");
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

/// `vaultfs serve` makes its data dir private: the default one under `$XDG_DATA_HOME`, a new
/// one given with `--data-dir`, and an existing one that was readable by others.
#[test]
fn the_server_data_dir_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let loose = tmp.path().join("loose");
    fs::create_dir_all(&loose).unwrap();
    fs::set_permissions(&loose, fs::Permissions::from_mode(0o755)).unwrap();
    let cases: [(Option<&Path>, std::path::PathBuf); 3] = [
        (None, tmp.path().join("xdg/vaultfs")),
        (
            Some(&tmp.path().join("new/data")),
            tmp.path().join("new/data"),
        ),
        (Some(&loose), loose.clone()),
    ];
    for (flag, dir) in cases {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("XDG_DATA_HOME", tmp.path().join("xdg"))
            .env("HOME", tmp.path())
            .env_remove("VAULTFS_DATA_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(d) = flag {
            cmd.arg("--data-dir").arg(d);
        }
        let mut server = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "vaultfs serve did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            mode(&dir) & 0o077,
            0,
            "{} is open to others: {:o}",
            dir.display(),
            mode(&dir)
        );
        unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
        assert!(server.wait().unwrap().success());
    }
}

/// The cache dir (0700) and everything in it (journal entries 0600) keep the names of files
/// waiting for upload from other users, not just their bytes (a finding of this suite, fixed).
#[test]
fn names_of_staged_files_are_private() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&[]);
    fs::write(env.vault().join("secret plans.txt"), "x").unwrap();
    env.wait_uploaded();
    let f = fs::File::create(env.vault().join("staged.txt")).unwrap();
    let cache = env.cache.clone();
    assert_eq!(mode(&cache) & 0o077, 0, "the cache dir is open to others");
    for e in walk(&cache) {
        assert_eq!(mode(&e) & 0o077, 0, "{} is open to others", e.display());
    }
    drop(f);
    drop(m);
}

// ----- issue 19: deep paths through the mount, and password checks under load -----

/// mkdir through the mount down to the bound of a path: the folder that would be 257 segments
/// deep is ENAMETOOLONG (the server's or store's 400 `path_too_deep`), on both backends, and the
/// mount goes on working.
fn mkdir_past_the_depth_bound_is_enametoolong(via: Via) {
    let Some(env) = Env::new(via) else {
        return;
    };
    let m = env.mount(&[]);
    // The vault is `Local/My First Vault`: 2 segments; 254 folders reach the bound.
    let max = vaultfs::api::path::MAX_PATH_DEPTH;
    let mut p = env.vault();
    for _ in 0..max - 2 {
        p.push("d");
        fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    }
    let e = fs::create_dir(p.join("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    fs::write(env.vault().join("after.txt"), "still working").unwrap();
    assert_eq!(
        fs::read_to_string(env.vault().join("after.txt")).unwrap(),
        "still working"
    );
    drop(m);
}

mod depth {
    use super::*;
    #[test]
    fn local() {
        mkdir_past_the_depth_bound_is_enametoolong(Via::Local)
    }
    #[test]
    fn remote() {
        mkdir_past_the_depth_bound_is_enametoolong(Via::Remote)
    }
}
