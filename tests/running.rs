//! Running the mount for real: `--daemon`, `vaultfs unmount`, SIGTERM with uploads pending,
//! stale mounts, `vaultfs status --json`, `mount -t fuse.vaultfs`, options from config.toml and
//! `-o`, the systemd units.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::env::{Env, Via};
use common::mount::{BIN, Mount, wait_for};
use common::pattern;
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

fn st_dev(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).ok().map(|m| m.dev())
}

fn is_mounted(p: &Path) -> bool {
    st_dev(p).is_some() && st_dev(p) != p.parent().and_then(st_dev)
}

/// `vaultfs ARGS` with the test's config and runtime folders.
fn vaultfs(env: &Env, args: &[&str]) -> Output {
    let rt = env._tmp.path().join("run");
    fs::create_dir_all(&rt).unwrap();
    Command::new(BIN)
        .args(args)
        .env("XDG_CONFIG_HOME", &env.config)
        .env("XDG_RUNTIME_DIR", &rt)
        .env("RUST_LOG", "info,fuser=warn")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stored_size(env: &Env, rel: &str) -> Option<u64> {
    let p = NodePath::parse_uri(&format!("/nodes/pth/Local/My First Vault/{rel}")).unwrap();
    env.rt
        .block_on(env.backend().node(&p))
        .ok()
        .and_then(|n| n.size)
}

fn log_path(env: &Env) -> PathBuf {
    env._tmp.path().join("daemon.log")
}

/// `vaultfs mount MNT --daemon` on the built-in store, with `extra` flags.
fn daemon_mount(env: &Env, extra: &[&str]) -> Output {
    let log = log_path(env);
    let mut args = vec![
        "mount",
        env.mnt.to_str().unwrap(),
        "--daemon",
        "--data-dir",
        env.data.to_str().unwrap(),
        "--cache-dir",
        env.cache.to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    vaultfs(env, &args)
}

#[test]
fn daemon_returns_once_the_mount_is_usable_and_unmount_flushes() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    fs::create_dir_all(&env.mnt).unwrap();
    let log = log_path(&env);
    let out = daemon_mount(&env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    // Usable the moment the command returned.
    assert!(is_mounted(&env.mnt));
    fs::write(env.vault().join("hello.txt"), pattern(300_000, 1)).unwrap();

    let st = vaultfs(&env, &["status", env.mnt.to_str().unwrap(), "--json"]);
    assert!(st.status.success(), "{}", text(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(
        v["backend"].as_str().unwrap().contains("built-in store"),
        "{v}"
    );
    assert!(v["cache"]["max_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["uploads"].is_array() && v["errors"].is_array(), "{v}");
    let human = vaultfs(&env, &["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains(env.mnt.to_str().unwrap()),
        "{}",
        text(&human)
    );

    let un = vaultfs(&env, &["unmount", env.mnt.to_str().unwrap()]);
    assert!(un.status.success(), "{}", text(&un));
    assert!(!is_mounted(&env.mnt), "still mounted after vaultfs unmount");
    assert_eq!(stored_size(&env, "hello.txt"), Some(300_000));
    let logged = fs::read_to_string(&log).unwrap();
    assert!(logged.contains("is ready"), "{logged}");
    assert!(logged.contains("unmount asked for"), "{logged}");
}

/// The read-ahead (KiB) the kernel holds for the mount at `mnt`, once it is `kb`.
fn wait_read_ahead(mnt: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(mnt).unwrap().dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    wait_for(10, "the read-ahead of the options", || {
        fs::read_to_string(&knob).is_ok_and(|t| t.trim() == kb.to_string())
    });
}

/// `vaultfs status MNT --json` of the daemon's socket: the test's, or (as mount(8) starts
/// the helper, with no XDG_RUNTIME_DIR) the default one.
fn status_json(env: &Env, default_socket: bool) -> serde_json::Value {
    let mut cmd = Command::new(BIN);
    cmd.args(["status", env.mnt.to_str().unwrap(), "--json"]);
    if default_socket {
        cmd.env_remove("XDG_RUNTIME_DIR");
    } else {
        cmd.env("XDG_RUNTIME_DIR", env._tmp.path().join("run"));
    }
    let st = cmd.output().unwrap();
    assert!(st.status.success(), "{}", text(&st));
    serde_json::from_slice(&st.stdout).unwrap()
}

/// Options in config.toml reach the mount, the issue's `read_ahead = 512` among them.
#[test]
fn options_in_config_toml_reach_the_mount() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    fs::create_dir_all(env.config.join("vaultfs")).unwrap();
    fs::write(
        env.config.join("vaultfs/config.toml"),
        "[mount]\nread_ahead = 512\nno_kernel_writes = true\n",
    )
    .unwrap();
    fs::create_dir_all(&env.mnt).unwrap();
    let out = daemon_mount(&env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    wait_read_ahead(&env.mnt, 512);
    let v = status_json(&env, false);
    assert_eq!(v["writes"], "through the daemon", "{v}");
    assert_eq!(v["read_ahead_kb"], 512, "{v}");
    let un = vaultfs(&env, &["unmount", env.mnt.to_str().unwrap()]);
    assert!(un.status.success(), "{}", text(&un));
}

/// Options given with `-o` reach the mount, `no_kernel_writes` among them. The helper is run
/// as mount(8) runs it (by the name mount.fuse.vaultfs, with an empty environment) rather than
/// through /sbin, which tests of other builds on this machine may hold at once.
#[test]
fn options_given_with_dash_o_reach_the_mount() {
    use std::os::unix::process::CommandExt;
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    fs::create_dir_all(&env.mnt).unwrap();
    let opts = format!(
        "rw,_netdev,read_ahead=384,no_kernel_writes,cache_dir={},log_file={}",
        env.cache.display(),
        log_path(&env).display()
    );
    let out = Command::new(BIN)
        .arg0("mount.fuse.vaultfs")
        .arg(format!("local:{}", env.data.display()))
        .arg(&env.mnt)
        .args(["-o", &opts])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    wait_read_ahead(&env.mnt, 384);
    let v = status_json(&env, true);
    assert_eq!(v["writes"], "through the daemon", "{v}");
    let un = Command::new(BIN)
        .arg("unmount")
        .arg(&env.mnt)
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    assert!(un.status.success(), "{}", text(&un));
}

#[test]
fn a_failed_daemon_mount_returns_non_zero_with_the_reason() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    fs::create_dir_all(&env.mnt).unwrap();
    let out = daemon_mount(&env, &["--root", "Local/No Such Vault"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach") && err.contains("No Such Vault"),
        "{}",
        text(&out)
    );
    assert!(!is_mounted(&env.mnt));
}

/// Pids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().nth(1))
                    .and_then(|pp| pp.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

#[test]
fn a_stale_mount_is_recovered() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let mut m = env.mount(&[]);
    fs::write(env.vault().join("before.txt"), "before crash").unwrap();
    // A crash that takes the auto-unmount helper with it leaves the mount stale.
    let child = m.child.take().unwrap();
    for c in children(child.id()) {
        unsafe { libc::kill(c as i32, libc::SIGKILL) };
    }
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(10, "the mount to go stale", || {
        fs::metadata(&env.mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    });
    drop(m);

    // Mounting again notices, unmounts it with a log line, and mounts.
    let out = daemon_mount(&env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stale mount"),
        "no log line about the stale mount: {}",
        text(&out)
    );
    assert_eq!(
        fs::read_to_string(env.vault().join("before.txt")).unwrap(),
        "before crash"
    );
    let un = vaultfs(&env, &["unmount", env.mnt.to_str().unwrap()]);
    assert!(un.status.success(), "{}", text(&un));
}

/// A TCP proxy to `upstream` that lets client bytes through at about `rate` bytes per second.
fn slow_proxy(env: &Env, upstream: String, rate: u64) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = env
        .rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    env.rt.spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    let _ = cw.shutdown().await;
                });
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
                }
                let _ = sw.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A remote mount through a proxy that sends uploads at 1 MiB/s.
fn slow_remote_mount(env: &Env) -> Mount {
    let server = env.server.as_ref().unwrap();
    let upstream = server.base.trim_start_matches("http://").to_string();
    let base = slow_proxy(env, upstream, 1 << 20);
    let creds = env.rt.block_on(server.user("slow@example.com", "Local"));
    common::save_login(
        &env.config.join("vaultfs/credentials.toml"),
        &base,
        creds,
        Duration::from_secs(3600),
    );
    let rt = env._tmp.path().join("run");
    fs::create_dir_all(&rt).unwrap();
    Mount::start_with_env(
        &env.mnt,
        &[
            "--server",
            &base,
            "--cache-dir",
            env.cache.to_str().unwrap(),
            "--timeout",
            "60",
        ],
        &[("XDG_CONFIG_HOME", &env.config), ("XDG_RUNTIME_DIR", &rt)],
    )
}

#[test]
fn status_shows_a_running_upload_and_sigterm_finishes_it_before_exit() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let mut m = slow_remote_mount(&env);
    let size = 5 << 20;
    fs::write(env.vault().join("big.bin"), pattern(size, 7)).unwrap();

    // status --json shows the upload going.
    let mut progress = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while progress.is_none() && Instant::now() < deadline {
        let st = vaultfs(&env, &["status", env.mnt.to_str().unwrap(), "--json"]);
        assert!(st.status.success(), "{}", text(&st));
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        progress = v["uploads"].as_array().unwrap().iter().find_map(|u| {
            let sent = u["sent"].as_u64()?;
            (u["running"] == true && sent > 0 && sent < size as u64).then(|| u.clone())
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let u = progress.unwrap_or_else(|| panic!("no upload in progress seen: {}", m.log_text()));
    assert!(u["path"].as_str().unwrap().ends_with("big.bin"), "{u}");
    assert_eq!(u["size"].as_u64(), Some(size as u64), "{u}");
    assert!(u["rate"].as_f64().unwrap() > 0.0, "{u}");

    // SIGTERM mid-upload: the daemon unmounts, finishes the upload, then exits.
    let mut child = m.child.take().unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}: {}", m.log_text());
    assert!(!is_mounted(&env.mnt));
    let log = m.log_text();
    assert!(log.contains("all uploads finished"), "{log}");
    assert_eq!(stored_size(&env, "big.bin"), Some(size as u64), "{log}");
    assert_eq!(common::env::pending_uploads(&env.cache), 0);
}

#[test]
fn the_mount_helper_works_through_mount_t_fuse_vaultfs() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let helper = Path::new("/sbin/mount.fuse.vaultfs");
    let ours = fs::symlink_metadata(helper).is_err();
    if ours {
        std::os::unix::fs::symlink(BIN, helper).unwrap();
    }
    fs::create_dir_all(&env.mnt).unwrap();
    let opts = format!(
        "rw,_netdev,cache_size=64M,dir_ttl=1,cache_dir={},log_file={}",
        env.cache.display(),
        log_path(&env).display()
    );
    let source = format!("local:{}", env.data.display());
    let out = Command::new("mount")
        .args(["-t", "fuse.vaultfs", &source])
        .arg(&env.mnt)
        .args(["-o", &opts])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(is_mounted(&env.mnt));
    fs::write(env.vault().join("via-fstab.txt"), "hi").unwrap();
    // `mount -o remount`: read-only and back, what the kernel changes by itself; options the
    // daemon would have to reopen are refused with the way to change them.
    let remount = |o: &str| {
        Command::new("mount")
            .args(["-o", &format!("remount,{o}")])
            .arg(&env.mnt)
            .output()
            .unwrap()
    };
    let out = remount("ro");
    assert!(out.status.success(), "{}", text(&out));
    let err = fs::write(env.vault().join("ro.txt"), "no").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(fs::read(env.vault().join("via-fstab.txt")).unwrap(), b"hi");
    let out = remount("rw");
    assert!(out.status.success(), "{}", text(&out));
    fs::write(env.vault().join("rw.txt"), "yes").unwrap();
    let out = remount("cache_size=1G");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cannot change while vaultfs runs"),
        "{}",
        text(&out)
    );
    if ours {
        let _ = fs::remove_file(helper);
    }
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(env.mnt.to_str().unwrap()) && l.contains("fuse.vaultfs")),
        "{mounts}"
    );
    // mount(8) gives helpers an empty environment: the daemon's socket is in the default place.
    let un = Command::new(BIN)
        .arg("unmount")
        .arg(&env.mnt)
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    assert!(un.status.success(), "{}", text(&un));
    assert!(!is_mounted(&env.mnt));
    assert_eq!(stored_size(&env, "via-fstab.txt"), Some(2));
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let have = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("skipped: no systemd-analyze (.ci/run installs systemd)");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/systemd");
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("run");
    fs::create_dir_all(&rt).unwrap();
    // The units name the installed binary; verify checks that it exists, so point at ours.
    for e in fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let unit = fs::read_to_string(&p)
            .unwrap()
            .replace("/usr/local/bin/vaultfs", BIN);
        fs::write(tmp.path().join(p.file_name().unwrap()), unit).unwrap();
    }
    for (user, unit) in [
        (true, "vaultfs@home-alice-Vault.service"),
        (false, "vaultfs@srv-vault.service"),
        (false, "vaultfs-srv-vault.service"),
    ] {
        let mut cmd = Command::new("systemd-analyze");
        if user {
            cmd.arg("--user");
        }
        let out = cmd
            .args(["verify", "--man=no"])
            .arg(tmp.path().join(unit))
            .env("XDG_RUNTIME_DIR", &rt)
            .output()
            .unwrap();
        let complaints: Vec<String> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .chain(String::from_utf8_lossy(&out.stdout).lines())
            .filter(|l| l.contains("vaultfs"))
            .map(str::to_string)
            .collect();
        assert!(
            out.status.success() && complaints.is_empty(),
            "{unit}: {}",
            text(&out)
        );
    }
    let u = fs::read_to_string(src.join("vaultfs@.service")).unwrap();
    for needed in ["Type=notify", "ExecStop=", "Restart=on-failure", "%f"] {
        assert!(u.contains(needed), "vaultfs@.service lacks {needed}");
    }
}

#[test]
fn install_sh_is_idempotent_and_uninstalls() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let root = tempfile::tempdir().unwrap();
    // updatedb's own file: `fuse.vaultfs` added to PRUNEFS once, the rest left as it was.
    let updatedb = root.path().join("etc/updatedb.conf");
    fs::create_dir_all(updatedb.parent().unwrap()).unwrap();
    let conf = "# mine\nPRUNEFS = \"nfs fuse.sshfs\"\nPRUNEPATHS=\"/tmp\"\n";
    fs::write(&updatedb, conf).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new("bash")
            .arg(&script)
            .args(["--binary", BIN])
            .args(extra)
            .env("DESTDIR", root.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
    };
    run(&[]);
    run(&[]);
    let r = root.path();
    assert!(r.join("usr/local/bin/vaultfs").is_file());
    assert_eq!(
        fs::read_link(r.join("sbin/mount.fuse.vaultfs")).unwrap(),
        Path::new("/usr/local/bin/vaultfs")
    );
    assert!(r.join("usr/lib/systemd/user/vaultfs@.service").is_file());
    assert_eq!(
        fs::read_to_string(&updatedb).unwrap(),
        conf.replace("fuse.sshfs", "fuse.sshfs fuse.vaultfs")
    );
    let man = fs::read_to_string(r.join("usr/local/share/man/man1/vaultfs.1")).unwrap();
    assert!(man.contains(".TH vaultfs 1"));
    assert!(
        fs::read_to_string(r.join("usr/share/bash-completion/completions/vaultfs"))
            .unwrap()
            .contains("_vaultfs")
    );
    run(&["--uninstall"]);
    assert!(!r.join("usr/local/bin/vaultfs").exists());
    assert!(fs::symlink_metadata(r.join("sbin/mount.fuse.vaultfs")).is_err());
    assert!(!r.join("usr/lib/systemd/user/vaultfs@.service").exists());
    assert!(!r.join("usr/local/share/man/man1/vaultfs.1").exists());
    assert_eq!(fs::read_to_string(&updatedb).unwrap(), conf);
}

/// `vaultfs sync`: says what is left and why when it gives up (an upload still crawling, the
/// server away), and exits 0 once everything written is stored.
#[test]
fn sync_waits_until_stored_and_says_what_is_left() {
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let _m = slow_remote_mount(&env);
    let mp = env.mnt.to_str().unwrap().to_string();
    let size = 3 << 20;
    fs::write(env.vault().join("big.bin"), pattern(size, 3)).unwrap();

    let o = vaultfs(&env, &["sync", &mp, "--timeout", "0.5"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 file(s) not stored yet"), "{err}");
    assert!(err.contains("big.bin"), "{err}");

    let o = vaultfs(&env, &["sync", &mp]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(stored_size(&env, "big.bin"), Some(size as u64));

    // The server goes away: the files written meanwhile are counted, the oldest named, and
    // the reason given. A status names at most 50 waiting files however many wait (`vaultfs
    // sync` asks ten times a second).
    let server = env.server.take().unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    env.rt.block_on(server.stop());
    fs::write(env.vault().join("later.txt"), b"offline").unwrap();
    for i in 0..60 {
        fs::write(env.vault().join(format!("more{i:02}.txt")), b"more").unwrap();
    }
    let o = vaultfs(&env, &["sync", &mp, "--timeout", "5"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("61 file(s) not stored yet")
            && err.contains("later.txt")
            && err.contains("unreachable")
            && err.contains("more waiting"),
        "{err}"
    );
    let st = vaultfs(&env, &["status", &mp, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    let listed = v["uploads"].as_array().unwrap();
    let running = listed.iter().filter(|u| u["running"] == true).count();
    assert!(listed.len() - running <= 50, "{v}");
    assert_eq!(v["waiting"].as_u64().unwrap() as usize + running, 61, "{v}");
    let running_bytes: u64 = listed
        .iter()
        .filter(|u| u["running"] == true)
        .map(|u| u["size"].as_u64().unwrap())
        .sum();
    assert_eq!(
        v["waiting_bytes"].as_u64().unwrap() + running_bytes,
        7 + 60 * 4,
        "{v}"
    );
    let human = text(&vaultfs(&env, &["status", &mp]));
    assert!(human.contains("more waiting"), "{human}");

    env.serve_again(&addr);
    let o = vaultfs(&env, &["sync", &mp]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(stored_size(&env, "later.txt"), Some(7));
    assert_eq!(stored_size(&env, "more59.txt"), Some(4));
}
