//! Outages and crashes: the server away or killed, the daemon killed, a full cache disk, and
//! remounts, with the journal finishing what was written.

use std::fs::{self, File};
use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::env::{Env, VAULT, Via, within};
use crate::common::mount::wait_for;
use crate::common::{md5hex, pattern};
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;
use vaultfs::store::Store;

both!(
    killed_daemon_loses_no_byte,
    bytes_written_after_an_fsync_of_an_open_file_survive_a_crash,
);

/// The server is away while files are written, the daemon is killed (a reboot), the server
/// comes back: the next mount uploads the journal, and every listing taken meanwhile shows each
/// file exactly once (a listing fetched before an upload landed and merged after it must not
/// lose the file).
#[test]
fn journaled_files_stay_listed_while_the_next_mount_uploads_them() {
    const N: usize = 1000;
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&["--timeout", "2"]);
    let dir = env.vault().join("left");
    fs::create_dir(&dir).unwrap();
    env.wait_uploaded();
    let server = env.server.take().unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    env.rt.block_on(server.stop());
    for i in 0..N {
        fs::write(dir.join(format!("j{i:04}")), pattern(4096, i as u64)).unwrap();
    }
    m.kill();
    assert_eq!(common::env::pending_uploads(&env.cache), N);

    env.serve_again(&addr);
    let m = env.mount(&["--dir-ttl", "0"]);
    let mut listings = 0;
    loop {
        let uploading = common::env::pending_uploads(&env.cache) > 0;
        let n = fs::read_dir(&dir).unwrap().count();
        assert_eq!(n, N, "listing {listings} while uploading\n{}", m.log_text());
        listings += 1;
        if !uploading {
            break;
        }
    }
    env.wait_uploaded();
    assert_eq!(fs::read_dir(&dir).unwrap().count(), N);
    assert_eq!(fs::read(dir.join("j0999")).unwrap(), pattern(4096, 999));
    m.unmount();
}

/// The daemon is SIGKILLed at several points of a burst of 2,000 small files (the built-in
/// store, whose write-back stores them in batches): every file whose `close` returned is
/// stored or journaled, the store is whole (no version without its bytes, no half batch), and
/// the next mount stores the rest with the right bytes.
#[test]
fn daemon_killed_during_a_burst_loses_no_closed_file() {
    const N: usize = 2000;
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    // Kill points spread over the burst (deterministic: a test must not depend on luck).
    for (round, kill_after) in [40u64, 150, 400].into_iter().enumerate() {
        let m = env.mount(&[]);
        let dir = env.vault().join(format!("burst{round}"));
        fs::create_dir(&dir).unwrap();
        let closed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = {
            let (dir, closed) = (dir.clone(), closed.clone());
            std::thread::spawn(move || {
                for i in 0..N {
                    let p = dir.join(format!("f{i:04}"));
                    let ok = File::create(&p)
                        .and_then(|mut f| f.write_all(&pattern(1000 + i % 3000, i as u64)));
                    if ok.is_err() {
                        break; // the mount is gone
                    }
                    closed.lock().unwrap().push(i);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(kill_after));
        m.kill();
        writer.join().unwrap();
        let closed = closed.lock().unwrap().clone();
        assert!(
            !closed.is_empty(),
            "round {round}: nothing was written before the kill"
        );
        // The store as the crash left it: consistent on its own.
        {
            let store = vaultfs::store::Store::open_local(&env.data).unwrap();
            let problems = store.check_integrity().unwrap();
            assert!(problems.is_empty(), "round {round}: {problems:?}");
        }
        let m = env.mount(&[]);
        env.wait_uploaded();
        for &i in &closed {
            let p = dir.join(format!("f{i:04}"));
            assert_eq!(
                fs::read(&p).unwrap_or_default(),
                pattern(1000 + i % 3000, i as u64),
                "round {round}: f{i:04} ({} closed before the kill)",
                closed.len()
            );
        }
        m.unmount();
    }
    let store = vaultfs::store::Store::open_local(&env.data).unwrap();
    assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
}

/// A server that accepts connections and never answers (a black-holed network, a stopped
/// process): saving a new file into a folder listed before must not wait for it. The listing,
/// older than its TTL, is used while its refresh hangs; the file is stored once the server
/// answers again.
#[test]
fn a_create_does_not_wait_on_a_silent_server() {
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&["--dir-ttl", "1", "--timeout", "60"]);
    let dir = env.vault().join("docs");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("before.txt"), "before").unwrap();
    env.wait_uploaded();
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    let server = env.server.take().unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    env.rt.block_on(server.stop());
    // Accepts and never answers, until told to stop (then its port is free again).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let silent = {
        let listener = std::net::TcpListener::bind(&addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((c, _)) => held.push(c),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500)); // the listing is older than its TTL
    let started = Instant::now();
    for i in 0..3 {
        fs::write(dir.join(format!("new{i}.txt")), format!("saved {i}")).unwrap();
    }
    let took = started.elapsed();
    // Each save may wait a moment for the listing's refresh, never the server's timeout (60 s:
    // a third of it tells the two apart on a loaded machine too; 5 s against 20 failed once
    // at load 12).
    assert!(took < Duration::from_secs(20), "3 saves took {took:?}");
    assert_eq!(fs::read_to_string(dir.join("new2.txt")).unwrap(), "saved 2");
    // The server answers again: everything is stored.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    silent.join().unwrap();
    env.serve_again(&addr);
    env.wait_uploaded();
    m.unmount();
    let b = env.backend();
    for i in 0..3 {
        let p = NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/docs/new{i}.txt")).unwrap();
        let node = env.rt.block_on(b.node(&p)).unwrap();
        assert_eq!(node.size, Some(7));
    }
}

#[test]
fn server_outage_stages_writes_and_uploads_them_later() {
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&["--dir-ttl", "1", "--timeout", "2"]);
    let v = env.vault();
    fs::create_dir(v.join("cached")).unwrap();
    fs::write(v.join("cached/seen.txt"), "seen").unwrap();
    env.wait_uploaded();
    let b = env.backend();
    let vault = NodePath::parse_uri("/nodes/pth/Local/My First Vault").unwrap();
    env.rt.block_on(async {
        let f = b.create_file(&vault, "cold.bin").await.unwrap();
        let id = f.id.unwrap();
        let t = b.begin_version(&id, 5, None).await.unwrap();
        let vid = t.file_ex_properties.unwrap().version_id.unwrap();
        let body = Box::pin(futures_util::stream::once(async {
            Ok(bytes::Bytes::from_static(b"cold!"))
        }));
        b.upload(&id, &vid, 5, body).await.unwrap();
    });
    wait_for(10, "cold.bin to show", || v.join("cold.bin").exists());
    assert_eq!(fs::read_dir(v.join("cached")).unwrap().count(), 1);

    // The server goes away.
    let server = env.server.take().unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    env.rt.block_on(server.stop());
    std::thread::sleep(std::time::Duration::from_millis(1500)); // listings are now stale

    // Writes are staged at once; the folder we know still lists; an uncached read fails fast.
    let v2 = v.clone();
    within(20, "writing while the server is down", move || {
        fs::write(v2.join("cached/during-1.txt"), "written while down 1").unwrap();
        fs::write(v2.join("during-2.txt"), pattern(300_000, 5)).unwrap();
    });
    let v2 = v.clone();
    let names = within(20, "ls of a cached folder", move || {
        let mut n: Vec<String> = fs::read_dir(v2.join("cached"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    });
    assert_eq!(names, ["during-1.txt", "seen.txt"]);
    let v2 = v.clone();
    let start = std::time::Instant::now();
    let err = within(30, "reading an uncached file", move || {
        fs::read(v2.join("cold.bin")).unwrap_err()
    });
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "EIO took {:?}",
        start.elapsed()
    );
    assert_eq!(
        fs::read_to_string(v.join("cached/during-1.txt")).unwrap(),
        "written while down 1"
    );
    // fsync promises the store has the bytes: with the server away it must say it cannot.
    let v2 = v.clone();
    let start = std::time::Instant::now();
    let fsync = within(30, "fsync while the server is down", move || {
        let mut f = File::create(v2.join("synced.txt")).unwrap();
        f.write_all(b"must reach the store").unwrap();
        f.sync_all()
    });
    assert_eq!(fsync.unwrap_err().raw_os_error(), Some(libc::EIO));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "fsync took {:?}",
        start.elapsed()
    );

    // The server comes back where it was: the staged files are uploaded.
    let data = env.data.clone();
    let server = env.rt.block_on(common::TestServer::start_at(
        &data,
        &addr,
        Default::default(),
        Default::default(),
    ));
    let b = LocalBackend::new(server.store.clone());
    env.server = Some(server);
    env.wait_uploaded();
    let got = env.rt.block_on(async {
        let n1 = b
            .node(
                &vault
                    .child("cached")
                    .unwrap()
                    .child("during-1.txt")
                    .unwrap(),
            )
            .await
            .unwrap();
        let n2 = b.node(&vault.child("during-2.txt").unwrap()).await.unwrap();
        (n1.md5_checksum.unwrap(), n2.md5_checksum.unwrap())
    });
    assert_eq!(got.0, md5hex(b"written while down 1"));
    assert_eq!(got.1, md5hex(&pattern(300_000, 5)));
    let synced = env
        .rt
        .block_on(b.node(&vault.child("synced.txt").unwrap()))
        .unwrap();
    assert_eq!(
        synced.md5_checksum.unwrap(),
        md5hex(b"must reach the store")
    );
    assert_eq!(
        fs::read(v.join("cold.bin")).unwrap(),
        b"cold!",
        "{}",
        m.log_text()
    );
}

fn killed_daemon_loses_no_byte(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let mut sums = Vec::new();
    for i in 0..20u64 {
        let data = pattern(((i as usize) + 1) * 200_000, i);
        fs::write(v.join(format!("k{i}.bin")), &data).unwrap();
        sums.push(data);
    }
    // SIGKILL right after the last close: uploads are still running or queued.
    m.kill();
    let m = env.mount(&[]);
    for (i, data) in sums.iter().enumerate() {
        assert_eq!(
            &fs::read(env.vault().join(format!("k{i}.bin"))).unwrap(),
            data,
            "{}",
            m.log_text()
        );
    }
    env.wait_uploaded();
    m.unmount();
    // The store has every byte.
    let store = Arc::new(Store::open_local(&env.data).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let b = LocalBackend::new(store.clone());
    for (i, data) in sums.iter().enumerate() {
        let n = rt
            .block_on(b.node(
                &NodePath::parse_uri(&format!("/nodes/pth/Local/My First Vault/k{i}.bin")).unwrap(),
            ))
            .unwrap();
        assert_eq!(n.md5_checksum.unwrap(), md5hex(data));
    }
    assert!(b.store().check_integrity().unwrap().is_empty());
}

/// A full cache disk: writers get ENOSPC, earlier files stay intact, the daemon keeps serving.
#[test]
fn full_cache_disk_gives_enospc_and_loses_nothing() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let _cache = common::mount::Tmpfs::new(&env.cache, 24);
    let m = env.mount(&[]);
    let v = env.vault();
    let early = pattern(2 << 20, 7);
    fs::write(v.join("early.bin"), &early).unwrap();
    env.wait_uploaded();
    // 40 MiB into a 24 MiB staging disk.
    let mut f = File::create(v.join("too-big.bin")).unwrap();
    let chunk = pattern(1 << 20, 8);
    let mut err = None;
    for _ in 0..40 {
        if let Err(e) = f.write_all(&chunk) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("writing past the cache disk must fail");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);
    fs::remove_file(v.join("too-big.bin")).unwrap();
    // The kernel releases the closed file after close(2) returns, and the staged bytes go with
    // that release: space comes back then, not at the unlink (under load, later).
    common::mount::wait_for(30, "the staged bytes freed", || {
        let dir = std::ffi::CString::new(env.cache.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs fills the zeroed struct given, for a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::statvfs(dir.as_ptr(), &mut st) } == 0;
        ok && st.f_bavail * st.f_frsize > 16 << 20
    });
    // The daemon still serves, earlier files are intact, and new writes work once space is back.
    assert_eq!(
        fs::read(v.join("early.bin")).unwrap(),
        early,
        "{}",
        m.log_text()
    );
    fs::write(v.join("after.txt"), "space is back").unwrap();
    env.wait_uploaded();
    m.unmount();
    let b = env.backend();
    let n = env
        .rt
        .block_on(
            b.node(&NodePath::parse_uri("/nodes/pth/Local/My First Vault/after.txt").unwrap()),
        )
        .unwrap();
    assert_eq!(n.size, Some(13));
    assert!(b.store().check_integrity().unwrap().is_empty());
}

/// The server is SIGKILLed in the middle of upload step 3: after its restart the mount's journal
/// finishes the upload, the file is whole, and no partial version ever became current.
#[test]
fn server_killed_mid_upload_then_the_journal_finishes_it() {
    use std::process::Stdio;
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let bin = common::mount::BIN;
    let data = env._tmp.path().join("server-data");
    let add = Command::new(bin)
        .args([
            "user",
            "add",
            "k@example.com",
            "--account",
            "Local",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b"pw for k\n")?;
            c.wait()
        })
        .unwrap();
    assert!(add.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    /// The server process, killed however the test ends.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let serve = || {
        let c = Command::new(bin)
            .args([
                "serve",
                "--data-dir",
                data.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let c = Server(c);
        wait_for(20, "the server", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        c
    };
    let server = serve();
    let token = env
        .rt
        .block_on(common::login(&base, "k@example.com", "pw for k"));
    let login = vaultfs::cli::login::Credentials {
        server: base.clone(),
        email: "k@example.com".into(),
        token: token.into(),
        expires_at: std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
    };
    vaultfs::cli::login::save_credentials(&env.config.join("vaultfs/credentials.toml"), &login)
        .unwrap();
    let cache = env.cache.to_str().unwrap().to_string();
    let m = common::mount::Mount::start_with_env(
        &env.mnt,
        &["--server", &base, "--cache-dir", &cache, "--timeout", "5"],
        &[("XDG_CONFIG_HOME", &env.config)],
    );
    let data_bytes = pattern(256 << 20, 77);
    fs::write(env.vault().join("big.bin"), &data_bytes).unwrap();
    // Kill the server as soon as step 3 is streaming into its staging file.
    let tmp = data.join("tmp");
    wait_for(60, "step 3 to start", || {
        fs::read_dir(&tmp).map(|d| d.count() > 0).unwrap_or(false)
    });
    drop(server);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let _server = serve();
    env.wait_uploaded();
    m.unmount();
    assert_eq!(
        fs::read_dir(&tmp).unwrap().count(),
        0,
        "the restart swept the dead upload's staging file"
    );
    let store = Arc::new(Store::open(&data, Default::default()).unwrap());
    let b = LocalBackend::new(store.clone());
    let node = env
        .rt
        .block_on(b.node(&NodePath::parse_uri("/nodes/pth/Local/My First Vault/big.bin").unwrap()))
        .unwrap();
    let want = md5hex(&data_bytes);
    assert_eq!(node.md5_checksum.as_deref(), Some(want.as_str()));
    let id = node.id.unwrap();
    for v in store
        .version_history(&id)
        .unwrap()
        .iter()
        .filter(|v| v.committed)
    {
        assert_eq!(
            v.md5.as_deref(),
            Some(want.as_str()),
            "a committed version with other bytes: {v:?}"
        );
        assert_eq!(v.length, data_bytes.len() as u64);
    }
    assert!(store.check_integrity().unwrap().is_empty());
}

/// `umount` and at once `mount` of the same point, 20 times, with files not yet stored each
/// time (the remote backend stores a few hundred a second): every mount comes up, the new
/// daemon takes the journal over from the old one still storing, and in the end every file is
/// stored with its bytes, exactly once (one version each: no entry uploaded by two daemons).
#[test]
fn remounting_right_after_umount_works_and_loses_nothing() {
    remount_cycles(Via::Remote);
}

/// The same on the built-in store, whose batches the hand-over lets finish.
#[test]
fn remounting_the_built_in_store_right_after_umount_loses_nothing() {
    remount_cycles(Via::Local);
}

fn remount_cycles(via: Via) {
    let Some(env) = Env::new(via) else {
        return;
    };
    let mut old = Vec::new();
    let mut m = env.mount(&[]);
    let mut want = Vec::new();
    for cycle in 0..20 {
        let dir = env.vault().join(format!("c{cycle}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..150 {
            let data = format!("cycle {cycle} file {i}\n").repeat(i % 7 + 1);
            fs::write(dir.join(format!("f{i}.txt")), &data).unwrap();
            want.push((format!("c{cycle}/f{i}.txt"), data));
        }
        m.umount_only();
        old.push(m);
        m = env.mount(&[]);
    }
    env.wait_uploaded();
    let log = m.log_text();
    m.unmount();
    drop(old);
    assert!(!log.contains("lost+found"), "{log}");
    let b = env.backend();
    for (rel, data) in &want {
        let uri = format!("/nodes/pth/Local/My First Vault/{rel}");
        let node = env
            .rt
            .block_on(b.node(&NodePath::parse_uri(&uri).unwrap()))
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(node.size, Some(data.len() as u64), "{rel}");
        let id = node.file_id().unwrap();
        let (_, file) = b
            .store()
            .open_file(vaultfs::store::Scope::All, &id)
            .unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut file.unwrap(), &mut got).unwrap();
        assert_eq!(&got, data, "{rel}");
        // A version cut off by the hand-over may be left uncommitted (the store drops it
        // later); committed, there is one.
        let versions = b.store().version_history(&id).unwrap();
        assert_eq!(versions.iter().filter(|v| v.committed).count(), 1, "{rel}");
    }
    assert!(b.store().check_integrity().unwrap().is_empty());
}

/// A time set on a file whose upload is still waiting (the server down) outlives a SIGKILL of
/// the daemon: the next mount stores the file with that time, not the time of its recovery.
#[test]
fn a_time_set_before_the_upload_survives_a_crash() {
    use std::os::unix::fs::MetadataExt;
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let server = env.server.take().unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    let m = env.mount(&["--timeout", "2"]);
    let v = env.vault();
    fs::write(v.join("warmup.txt"), "listed").unwrap();
    env.wait_uploaded();
    env.rt.block_on(server.stop());

    let v2 = v.clone();
    within(
        20,
        "a write and a touch while the server is down",
        move || {
            fs::write(v2.join("old.txt"), "from 2001").unwrap();
            let st = Command::new("touch")
                .args(["-m", "-d", "2001-02-03 04:05:06 UTC"])
                .arg(v2.join("old.txt"))
                .status()
                .unwrap();
            assert!(st.success());
        },
    );
    assert_eq!(
        fs::metadata(v.join("old.txt")).unwrap().mtime(),
        981_173_106
    );
    m.kill();

    env.serve_again(&addr);
    let m = env.mount(&[]);
    env.wait_uploaded();
    let b = env.backend();
    let node = env.rt.block_on(async {
        b.node(&NodePath::parse_uri("/nodes/pth/Local/My First Vault/old.txt").unwrap())
            .await
            .unwrap()
    });
    let stored = node.modified_time().unwrap();
    assert_eq!(
        stored
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        981_173_106
    );
    assert_eq!(fs::read(v.join("old.txt")).unwrap(), b"from 2001");
    assert_eq!(
        fs::metadata(v.join("old.txt")).unwrap().mtime(),
        981_173_106
    );
    m.unmount();
}

/// A file stored while it was still open (an fsync), written again, and the daemon killed
/// before the next close: the next mount stores the new bytes under the name. (fstests
/// generic/412 on the built-in store: the journal kept the base from before the batch, the
/// next daemon sent the newest bytes on it, and the batch's own version counted as a change
/// made elsewhere: the name kept the old bytes, the new went to a conflict copy.)
fn bytes_written_after_an_fsync_of_an_open_file_survive_a_crash(via: Via) {
    let Some(env) = Env::new(via) else {
        return;
    };
    let m = env.mount(&[]);
    let v = env.vault();
    let mut f = File::create(v.join("open.txt")).unwrap();
    f.write_all(b"first, fsynced\n").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"second, written after\n").unwrap();
    m.kill();
    drop(f);

    let m = env.mount(&[]);
    env.wait_uploaded();
    let mut names: Vec<String> = fs::read_dir(&v)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["open.txt"], "{}", m.log_text());
    assert_eq!(
        fs::read_to_string(v.join("open.txt")).unwrap(),
        "first, fsynced\nsecond, written after\n",
        "{}",
        m.log_text()
    );
    m.unmount();
}
