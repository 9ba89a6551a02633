//! The mount on the built-in store, used the way people use folders: std::fs, cp, diff, mv, rm,
//! shell appends, git, editors' atomic saves; remounts and a SIGKILLed daemon.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env::{Env, VAULT, Via, within};
use common::mount::{md5_of, names, sh, wait_for};
use common::{md5hex, pattern};
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;
use vaultfs::store::Store;

both!(
    tree_cp_diff_mv_rm_and_remount,
    appends_random_writes_and_truncates_match_a_model,
    large_file_checksum_survives_remount,
    ten_thousand_files_in_one_folder,
    editor_atomic_save_and_git,
    concurrent_readers_and_writers,
    killed_daemon_loses_no_byte,
    errors_are_the_posix_ones,
    folder_link_counts_follow_subfolders,
    rewinddir_shows_names_added_since_opendir,
    listed_attributes_survive_the_kernel_forgetting,
    read_only_mount_and_changes_made_elsewhere,
    read_cache_stays_within_its_bound,
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
    let m = env.mount(&["--dir-ttl", "1", "--timeout", "20"]);
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
    // Each save may wait a moment for the listing's refresh, never the server's timeout.
    assert!(took < Duration::from_secs(5), "3 saves took {took:?}");
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

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// A source tree with nested folders and files of assorted sizes.
fn make_tree(root: &Path) {
    for (i, rel) in [
        "a.txt",
        "sub/b.bin",
        "sub/deeper/c.dat",
        "sub/deeper/empty",
        "other/d.txt",
        "other/e f (copy).txt",
        "résumé.md",
    ]
    .iter()
    .enumerate()
    {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let len = [5, 300_000, 3 * 1024 * 1024 + 17, 0, 4096, 1, 77][i];
        fs::write(&p, pattern(len, i as u64)).unwrap();
    }
    fs::create_dir_all(root.join("emptydir")).unwrap();
}

fn tree_cp_diff_mv_rm_and_remount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let src = env._tmp.path().join("src");
    make_tree(&src);
    let m = env.mount(&[]);
    let v = env.vault();
    assert!(v.is_dir(), "{}", m.log_text());
    sh(
        &v,
        &format!(
            "cp -r {} tree && diff -r {} tree",
            src.display(),
            src.display()
        ),
    );
    sh(
        &v,
        "mv tree/sub tree/moved && mv tree/a.txt tree/moved/a-renamed.txt && test ! -e tree/sub && test -f tree/moved/deeper/c.dat",
    );
    assert_eq!(
        fs::read(v.join("tree/moved/a-renamed.txt")).unwrap(),
        pattern(5, 0)
    );
    sh(&v, "rm -r tree/other && test ! -e tree/other");
    let listing = sh(&v, "ls tree");
    assert_eq!(
        listing.split_whitespace().collect::<Vec<_>>(),
        ["emptydir", "moved", "résumé.md"]
    );
    m.unmount();

    // Everything is still there after a remount, read from the store.
    let m = env.mount(&[]);
    let v = env.vault();
    assert_eq!(
        md5_of(&v.join("tree/moved/deeper/c.dat")),
        md5_of(&src.join("sub/deeper/c.dat")),
        "{}",
        m.log_text()
    );
    assert_eq!(
        fs::read(v.join("tree/moved/b.bin")).unwrap(),
        fs::read(src.join("sub/b.bin")).unwrap()
    );
    assert_eq!(
        fs::metadata(v.join("tree/moved/deeper/empty"))
            .unwrap()
            .len(),
        0
    );
    assert!(v.join("tree/emptydir").is_dir());
    env.wait_uploaded();
    m.unmount();
}

fn appends_random_writes_and_truncates_match_a_model(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("model.bin");
    let mut model: Vec<u8> = Vec::new();
    // Shell appends.
    sh(
        &env.vault(),
        "echo one >> model.bin && echo two >> model.bin",
    );
    model.extend_from_slice(b"one\ntwo\n");
    assert_eq!(fs::read(&p).unwrap(), model);
    // Random writes, some past the end (a hole reads as zeros).
    let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for (i, off) in [3u64, 100_000, 50, 7, 250_000, 0].iter().enumerate() {
        let data = pattern(1000 + i * 333, i as u64 + 10);
        f.write_all_at(&data, *off).unwrap();
        let end = *off as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[*off as usize..end].copy_from_slice(&data);
    }
    // Reading through the same handle sees the writes.
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, model);
    // Truncate down and up.
    f.set_len(60_000).unwrap();
    model.truncate(60_000);
    f.set_len(70_000).unwrap();
    model.resize(70_000, 0);
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), 70_000);
    assert_eq!(fs::read(&p).unwrap(), model);
    // truncate(2) by path, without an open handle.
    Command::new("truncate")
        .arg("-s")
        .arg("1234")
        .arg(&p)
        .status()
        .unwrap();
    model.truncate(1234);
    assert_eq!(fs::read(&p).unwrap(), model);
    // Two writers on one file at once.
    let mut a = OpenOptions::new().write(true).open(&p).unwrap();
    let mut b = OpenOptions::new().write(true).open(&p).unwrap();
    a.write_all(b"AAAA").unwrap();
    b.seek(SeekFrom::Start(2000)).unwrap();
    b.write_all(b"BBBB").unwrap();
    drop(a);
    drop(b);
    model[..4].copy_from_slice(b"AAAA");
    model.resize(2004, 0);
    model[2000..2004].copy_from_slice(b"BBBB");
    assert_eq!(fs::read(&p).unwrap(), model);
    m.unmount();
    let m = env.mount(&[]);
    assert_eq!(
        fs::read(env.vault().join("model.bin")).unwrap(),
        model,
        "{}",
        m.log_text()
    );
}

fn large_file_checksum_survives_remount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let src = env._tmp.path().join("big.bin");
    {
        let mut f = File::create(&src).unwrap();
        for i in 0..200 {
            f.write_all(&pattern(1 << 20, i)).unwrap();
        }
    }
    let sum = md5_of(&src);
    let m = env.mount(&[]);
    fs::copy(&src, env.vault().join("big.bin")).unwrap();
    assert_eq!(md5_of(&env.vault().join("big.bin")), sum);
    env.wait_uploaded();
    m.unmount();
    // A fresh cache: the bytes come from the store.
    let _ = fs::remove_dir_all(env.cache.join("cache"));
    let m = env.mount(&[]);
    assert_eq!(
        fs::metadata(env.vault().join("big.bin")).unwrap().len(),
        200 << 20
    );
    assert_eq!(
        md5_of(&env.vault().join("big.bin")),
        sum,
        "{}",
        m.log_text()
    );
    // Ranged reads in the middle, cold.
    let f = File::open(env.vault().join("big.bin")).unwrap();
    let mut buf = vec![0u8; 10_000];
    f.read_exact_at(&mut buf, (150 << 20) + 12_345).unwrap();
    assert_eq!(buf, pattern(1 << 20, 150)[12_345..22_345]);
}

fn ten_thousand_files_in_one_folder(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let dir = env.vault().join("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..10_000 {
        fs::write(dir.join(format!("f{i:05}.txt")), format!("file {i}\n")).unwrap();
    }
    let out = sh(&dir, "ls -l | tail -n +2 | wc -l");
    assert_eq!(out.trim(), "10000");
    m.unmount();
    let m = env.mount(&[]);
    let names = fs::read_dir(env.vault().join("many")).unwrap().count();
    assert_eq!(names, 10_000, "{}", m.log_text());
    assert_eq!(
        fs::read_to_string(env.vault().join("many/f09999.txt")).unwrap(),
        "file 9999\n"
    );
    env.wait_uploaded();
    m.unmount();
    // And the store itself has them all.
    let store = Arc::new(Store::open_local(&env.data).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let b = LocalBackend::new(store);
    let n = rt
        .block_on(b.list(
            &NodePath::parse_uri("/nodes/pth/Local/My First Vault/many").unwrap(),
            0,
            10,
        ))
        .unwrap();
    assert_eq!(n.total_children, Some(10_000));
}

fn editor_atomic_save_and_git(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    fs::write(v.join("notes.txt"), "version 1\n").unwrap();
    // An editor's save: temp file, fsync, rename over the original.
    {
        let mut f = File::create(v.join(".notes.txt.swp")).unwrap();
        f.write_all(b"version 2, saved atomically\n").unwrap();
        f.sync_all().unwrap();
    }
    fs::rename(v.join(".notes.txt.swp"), v.join("notes.txt")).unwrap();
    assert_eq!(
        fs::read_to_string(v.join("notes.txt")).unwrap(),
        "version 2, saved atomically\n"
    );
    assert!(!v.join(".notes.txt.swp").exists());

    let git = "git -c user.email=t@example.com -c user.name=T -c init.defaultBranch=main";
    sh(
        &v,
        &format!(
            "{git} init -q repo && cd repo && printf 'a\\n' > a && mkdir d && printf 'b\\n' > d/b && {git} add . && {git} commit -qm first"
        ),
    );
    sh(
        &v.join("repo"),
        &format!(
            "printf 'more\\n' >> a && {git} commit -qam second && {git} status --porcelain > ../status.txt"
        ),
    );
    assert_eq!(fs::read_to_string(v.join("status.txt")).unwrap(), "");
    let log = sh(&v.join("repo"), &format!("{git} log --format=%s"));
    assert_eq!(log, "second\nfirst\n");
    m.unmount();
    let m = env.mount(&[]);
    let v = env.vault();
    assert_eq!(
        fs::read_to_string(v.join("notes.txt")).unwrap(),
        "version 2, saved atomically\n",
        "{}",
        m.log_text()
    );
    let log = sh(
        &v.join("repo"),
        &format!("{git} log --format=%s && {git} fsck --no-progress && {git} status --porcelain"),
    );
    assert_eq!(log, "second\nfirst\n");
}

fn concurrent_readers_and_writers(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    fs::write(v.join("shared.bin"), pattern(2 << 20, 99)).unwrap();
    let mut threads = Vec::new();
    for t in 0..8u64 {
        let v = v.clone();
        threads.push(std::thread::spawn(move || {
            for round in 0..5u64 {
                let data = pattern(100_000 + (t * 1000) as usize, t * 100 + round);
                let p = v.join(format!("w{t}.bin"));
                fs::write(&p, &data).unwrap();
                assert_eq!(fs::read(&p).unwrap(), data);
                assert_eq!(
                    fs::read(v.join("shared.bin")).unwrap(),
                    pattern(2 << 20, 99)
                );
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&[]);
    for t in 0..8u64 {
        let data = pattern(100_000 + (t * 1000) as usize, t * 100 + 4);
        assert_eq!(
            fs::read(env.vault().join(format!("w{t}.bin"))).unwrap(),
            data,
            "{}",
            m.log_text()
        );
    }
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

/// A folder's link count is 2 plus its subfolders (what `find` relies on), through mkdir,
/// rmdir, renames in and out, files that do not count, and a remount (once listed: until then
/// a folder shows 2).
/// The names `readdir` gives from where the stream is, to its end.
fn read_names(d: *mut libc::DIR) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        // SAFETY: `d` is an open directory stream; the entry is read before the next call.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let name = name.to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    names
}

/// POSIX: after `rewinddir`, the stream shows the folder as it is now (generic/471).
fn rewinddir_shows_names_added_since_opendir(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let _m = env.mount(&[]);
    let dir = env.vault().join("rewind");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("a"), "a").unwrap();
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the stream is closed below.
    let d = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!d.is_null());
    assert_eq!(read_names(d), ["a"]);
    fs::write(dir.join("b"), "b").unwrap();
    fs::remove_file(dir.join("a")).unwrap();
    unsafe { libc::rewinddir(d) };
    assert_eq!(read_names(d), ["b"]);
    fs::create_dir(dir.join("c")).unwrap();
    unsafe { libc::rewinddir(d) };
    assert_eq!(read_names(d), ["b", "c"]);
    unsafe { libc::closedir(d) };
    // Opened, names added, rewound before any read (fstests generic/471).
    let d = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!d.is_null());
    fs::write(dir.join("d"), "d").unwrap();
    unsafe { libc::rewinddir(d) };
    assert_eq!(read_names(d), ["b", "c", "d"]);
    unsafe { libc::closedir(d) };
}

fn folder_link_counts_follow_subfolders(via: Via) {
    use std::os::unix::fs::MetadataExt;
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let nlink = |p: &Path| fs::metadata(p).unwrap().nlink();
    let (a, b) = (v.join("a"), v.join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    assert_eq!(nlink(&a), 2);
    for i in 0..3 {
        fs::create_dir(a.join(format!("sub{i}"))).unwrap();
    }
    fs::write(a.join("file"), "not a folder").unwrap();
    assert_eq!(nlink(&a), 5);
    fs::rename(a.join("sub0"), b.join("moved")).unwrap();
    assert_eq!((nlink(&a), nlink(&b)), (4, 3));
    fs::remove_dir(a.join("sub1")).unwrap();
    fs::rename(a.join("file"), b.join("file")).unwrap();
    assert_eq!((nlink(&a), nlink(&b)), (3, 3));
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&[]);
    // Counted again once listed afresh from the store.
    assert_eq!(fs::read_dir(&a).unwrap().count(), 1);
    assert_eq!(fs::read_dir(&b).unwrap().count(), 2);
    assert_eq!((nlink(&a), nlink(&b)), (3, 3));
    m.unmount();
}

/// Listings carry each entry's attributes (READDIRPLUS): sizes are right straight from a
/// listing, and after the kernel drops its dentries and inodes (FORGETs of the references the
/// listing gave it) every entry still resolves, lists and reads the same.
fn listed_attributes_survive_the_kernel_forgetting(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let dir = env.vault().join("sized");
    fs::create_dir(&dir).unwrap();
    for i in 0..300usize {
        fs::write(dir.join(format!("f{i:03}")), pattern(i * 7, i as u64)).unwrap();
    }
    for i in 0..5 {
        fs::create_dir(dir.join(format!("d{i}"))).unwrap();
    }
    env.wait_uploaded();
    let check = |when: &str| {
        let mut files = 0;
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let md = e.metadata().unwrap();
            if let Some(i) = name.strip_prefix('f') {
                let i: usize = i.parse().unwrap();
                assert_eq!(md.len(), (i * 7) as u64, "{when}: size of {name}");
                assert!(md.is_file(), "{when}: {name}");
                files += 1;
            } else {
                assert!(md.is_dir(), "{when}: {name}");
            }
        }
        assert_eq!(files, 300, "{when}");
        assert_eq!(
            fs::read(dir.join("f299")).unwrap(),
            pattern(299 * 7, 299),
            "{when}"
        );
    };
    check("first listing");
    let drop_caches = || fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    drop_caches();
    check("after the kernel forgot");
    check("listed again");
    m.unmount();
    let m = env.mount(&[]);
    check("after a remount");
    drop_caches();
    check("after a remount and a forget");
    m.unmount();
}

fn errors_are_the_posix_ones(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    fs::create_dir(v.join("d")).unwrap();
    fs::write(v.join("d/f"), "x").unwrap();
    assert_eq!(errno_of(fs::create_dir(v.join("d"))), libc::EEXIST);
    assert_eq!(errno_of(fs::remove_dir(v.join("d"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::remove_file(v.join("d"))), libc::EISDIR);
    assert_eq!(errno_of(fs::remove_dir(v.join("d/f"))), libc::ENOTDIR);
    assert_eq!(errno_of(fs::read(v.join("missing"))), libc::ENOENT);
    assert_eq!(
        errno_of(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(v.join("d/f"))
        ),
        libc::EEXIST
    );
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("d/f", v.join("ln"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(fs::hard_link(v.join("d/f"), v.join("hl"))),
        libc::EPERM
    );
    fs::create_dir(v.join("e")).unwrap();
    assert_eq!(
        errno_of(fs::rename(v.join("d/f"), v.join("e"))),
        libc::EISDIR
    );
    fs::write(v.join("plain"), "p").unwrap();
    assert_eq!(
        errno_of(fs::rename(v.join("e"), v.join("plain"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(fs::rename(v.join("e"), v.join("e/inside"))),
        libc::EINVAL
    );
    // renameat2(RENAME_NOREPLACE) onto an existing name.
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (a, b) = (c(&v.join("plain")), c(&v.join("d/f")));
    // SAFETY: renameat2 with valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(fs::read_to_string(v.join("d/f")).unwrap(), "x");
    // Replacing rename, and an empty folder replaced by a folder.
    fs::rename(v.join("plain"), v.join("d/f")).unwrap();
    assert_eq!(fs::read_to_string(v.join("d/f")).unwrap(), "p");
    fs::create_dir(v.join("empty")).unwrap();
    fs::rename(v.join("e"), v.join("empty")).unwrap();
    assert!(!v.join("e").exists() && v.join("empty").is_dir());
    // A name that is too long.
    assert_eq!(
        errno_of(fs::write(v.join("n".repeat(256)), "x")),
        libc::ENAMETOOLONG
    );
    // Above the vaults (the root lists accounts, an account its vaults) nothing can be made:
    // refused at once, not accepted and then never stored.
    let account = v.parent().unwrap();
    for dir in [account, account.parent().unwrap()] {
        assert_eq!(errno_of(fs::write(dir.join("f.txt"), "x")), libc::EACCES);
        assert_eq!(errno_of(fs::create_dir(dir.join("new"))), libc::EACCES);
        assert_eq!(
            errno_of(fs::rename(v.join("d/f"), dir.join("f"))),
            libc::EACCES
        );
    }
    assert_eq!(errno_of(fs::create_dir(account)), libc::EEXIST);
    // Mode changes are accepted without effect; owners other than ours are refused.
    let mut perm = fs::metadata(v.join("d/f")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    fs::set_permissions(v.join("d/f"), perm).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(
            &fs::metadata(v.join("d/f")).unwrap().permissions()
        ) & 0o777,
        0o644
    );
    assert_eq!(
        errno_of(std::os::unix::fs::chown(v.join("d/f"), Some(12345), None)),
        libc::EPERM
    );
    // Extended attributes of a stored file.
    env.wait_uploaded();
    let out = Command::new("getfattr")
        .arg("-n")
        .arg("user.vaultfs.id")
        .arg("--only-values")
        .arg(v.join("d/f"))
        .output();
    if let Ok(out) = out {
        if out.status.success() {
            assert!(
                String::from_utf8_lossy(&out.stdout)
                    .chars()
                    .all(|c| c.is_ascii_digit())
            );
        }
    }
    let id = xattr(&v.join("d/f"), "user.vaultfs.id").expect("id xattr");
    assert!(
        !id.is_empty() && id.bytes().all(|c| c.is_ascii_digit()),
        "{id}"
    );
    assert!(
        xattr(&v.join("d/f"), "user.vaultfs.download_link_uri")
            .unwrap()
            .ends_with(&format!("&id={id}"))
    );
    assert!(xattr(&v.join("d/f"), "user.other").is_none());
    // statfs answers, and df names the store.
    let out = sh(&v, "df -P . | tail -1");
    assert!(
        out.starts_with("local:/") || out.starts_with("http://127.0.0.1:"),
        "{out}"
    );
    drop(m);
}

fn xattr(p: &Path, name: &str) -> Option<String> {
    let cp = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let cn = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 1024];
    // SAFETY: getxattr into a buffer of the given size.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(String::from_utf8(buf).unwrap())
}

fn read_only_mount_and_changes_made_elsewhere(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--dir-ttl", "1"]);
    fs::write(env.vault().join("seen.txt"), "before").unwrap();
    env.wait_uploaded();
    // Another client changes the store directly.
    let b = env.backend();
    let vault = NodePath::parse_uri("/nodes/pth/Local/My First Vault").unwrap();
    env.rt.block_on(async {
        let f = b.create_file(&vault, "elsewhere.txt").await.unwrap();
        let id = f.id.unwrap();
        let data = b"made elsewhere".to_vec();
        let t = b.begin_version(&id, data.len() as u64, None).await.unwrap();
        let vid = t.file_ex_properties.unwrap().version_id.unwrap();
        let body = Box::pin(futures_util::stream::once(async move {
            Ok(bytes::Bytes::from(data))
        }));
        b.upload(&id, &vid, 14, body).await.unwrap();
        b.delete(&vault.child("seen.txt").unwrap()).await.unwrap();
    });
    wait_for(10, "the change to show", || {
        env.vault().join("elsewhere.txt").exists() && !env.vault().join("seen.txt").exists()
    });
    assert_eq!(
        fs::read_to_string(env.vault().join("elsewhere.txt")).unwrap(),
        "made elsewhere"
    );
    m.unmount();

    let m = env.mount(&["--read-only"]);
    let v = env.vault();
    assert_eq!(
        fs::read_to_string(v.join("elsewhere.txt")).unwrap(),
        "made elsewhere"
    );
    assert_eq!(errno_of(fs::write(v.join("new.txt"), "x")), libc::EROFS);
    assert_eq!(
        errno_of(
            OpenOptions::new()
                .append(true)
                .open(v.join("elsewhere.txt"))
        ),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::create_dir(v.join("nd"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::remove_file(v.join("elsewhere.txt"))),
        libc::EROFS
    );
    drop(m);
}

/// Bytes of the files in a directory (what the read cache holds on disk).
/// Disk used by the files under `dir` (allocated blocks, so holes count for nothing); 0 for
/// a folder not made yet.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(p, m)| {
            if m.is_dir() {
                allocated(&p)
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}

fn read_cache_stays_within_its_bound(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--cache-size", "8M"]);
    let files: Vec<Vec<u8>> = (0..6).map(|i| pattern(3 << 20, 40 + i)).collect();
    for (i, data) in files.iter().enumerate() {
        fs::write(env.vault().join(format!("c{i}.bin")), data).unwrap();
    }
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&["--cache-size", "8M"]);
    for _ in 0..2 {
        for (i, data) in files.iter().enumerate() {
            assert_eq!(
                &fs::read(env.vault().join(format!("c{i}.bin"))).unwrap(),
                data,
                "{}",
                m.log_text()
            );
            let held = allocated(&env.cache.join("cache"));
            assert!(
                held <= 8 << 20,
                "cache holds {held} bytes, over its 8 MiB bound"
            );
        }
    }
}

/// Other users are kept out of a mount unless `--allow-other` lets them in.
#[test]
fn other_users_need_allow_other() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    // The mount point's temporary parent must be traversable by the other user.
    let mut perm = fs::metadata(env._tmp.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    fs::set_permissions(env._tmp.path(), perm).unwrap();
    let as_nobody = |p: &Path| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "ls"])
            .arg(p)
            .output()
            .unwrap()
    };
    let m = env.mount(&[]);
    let out = as_nobody(&env.mnt);
    assert!(!out.status.success(), "another user could list the mount");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    assert!(env.vault().is_dir(), "the owner still can");
    m.unmount();
    let m = env.mount(&["--allow-other"]);
    let out = as_nobody(&env.mnt);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Local");
    drop(m);
}

/// `config.toml` gives mounts their defaults, per mount point too; flags override it.
#[test]
fn config_file_values_apply_and_flags_override_them() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let from_config = env._tmp.path().join("cache-from-config");
    let from_flag = env._tmp.path().join("cache-from-flag");
    fs::create_dir_all(env.config.join("vaultfs")).unwrap();
    fs::create_dir_all(&env.mnt).unwrap();
    fs::write(
        env.config.join("vaultfs/config.toml"),
        format!(
            "[mount]\ndir_ttl = 1\n\n[mount.\"{}\"]\nread_only = true\ncache_dir = \"{}\"\ndata_dir = \"{}\"\n\n[mount.\"/somewhere/else\"]\nallow_other = true\n",
            env.mnt.display(),
            from_config.display(),
            env.data.display()
        ),
    )
    .unwrap();
    let cfg = [("XDG_CONFIG_HOME", env.config.as_path())];
    let m = common::mount::Mount::start_with_env(&env.mnt, &[], &cfg);
    assert!(
        from_config.join("journal").is_dir(),
        "config's cache_dir unused: {}",
        m.log_text()
    );
    assert_eq!(errno_of(fs::write(env.vault().join("x"), "x")), libc::EROFS);
    m.unmount();
    let m = common::mount::Mount::start_with_env(
        &env.mnt,
        &["--cache-dir", from_flag.to_str().unwrap()],
        &cfg,
    );
    assert!(
        from_flag.join("journal").is_dir(),
        "the flag did not win: {}",
        m.log_text()
    );
    drop(m);
    // A config the mount cannot use is a clear error, not a silent default.
    fs::write(
        env.config.join("vaultfs/config.toml"),
        "[mount]\ncache_sise = \"1G\"\n",
    )
    .unwrap();
    let out = Command::new(common::mount::BIN)
        .args(["mount", env.mnt.to_str().unwrap()])
        .env("XDG_CONFIG_HOME", &env.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown option `cache_sise`"));
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

/// `findmnt -S`, `df` and `umount SOURCE` find a mount by its source: it names the store
/// (`local:DIR`, the server's URL), with the type `fuse.vaultfs`; `noatime` is shown.
#[test]
fn the_mount_source_names_the_store() {
    for via in [Via::Local, Via::Remote] {
        let Some(env) = Env::new(via) else {
            return;
        };
        let m = env.mount(&[]);
        let want = match via {
            Via::Local => format!("local:{}", fs::canonicalize(&env.data).unwrap().display()),
            Via::Remote => env.server.as_ref().unwrap().base.clone(),
        };
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let mnt = env.mnt.display().to_string();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(&*mnt))
            .unwrap_or_else(|| panic!("{mnt} not in {mounts}"));
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!((fields[0], fields[2]), (&*want, "fuse.vaultfs"), "{line}");
        // Access times are not kept, and the options say so.
        assert!(fields[3].split(',').any(|o| o == "noatime"), "{line}");
        m.unmount();
    }
}

/// A folder removed, or renamed over by another, while open: `fstat` on it says no links are
/// left (0), as for a file (fstests generic/035).
#[test]
fn a_folder_replaced_by_rename_has_no_links_left() {
    use std::os::unix::fs::MetadataExt;
    for via in [Via::Local, Via::Remote] {
        let Some(env) = Env::new(via) else {
            return;
        };
        let m = env.mount(&[]);
        let v = env.vault();
        fs::create_dir(v.join("a")).unwrap();
        fs::create_dir(v.join("b")).unwrap();
        fs::create_dir(v.join("c")).unwrap();
        let b = File::open(v.join("b")).unwrap();
        let c = File::open(v.join("c")).unwrap();
        assert_eq!(b.metadata().unwrap().nlink(), 2);
        fs::rename(v.join("a"), v.join("b")).unwrap();
        assert_eq!(b.metadata().unwrap().nlink(), 0, "{via:?}: renamed over");
        fs::remove_dir(v.join("c")).unwrap();
        assert_eq!(c.metadata().unwrap().nlink(), 0, "{via:?}: removed");
        assert_eq!(fs::metadata(v.join("b")).unwrap().nlink(), 2);
        drop((b, c));
        m.unmount();
    }
}

/// A write, a cut or a reservation past the largest file the store takes fails at once with
/// EFBIG (fstests generic/308: a 4 KiB write at 16 TiB used to tie the remote mount up hashing
/// a sparse file the server would refuse); what fits is written and stored.
#[test]
fn a_file_past_the_store_limit_is_efbig_at_once() {
    for via in [Via::Local, Via::Remote] {
        let Some(env) = Env::new(via) else {
            return;
        };
        let m = env.mount(&["--max-file-size", "1M"]);
        let v = env.vault();
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(v.join("sparse.bin"))
            .unwrap();
        let efbig = |r: std::io::Result<()>| {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EFBIG), "{via:?}")
        };
        efbig(f.write_all_at(b"x", 16 << 40));
        efbig(f.write_all_at(&[7u8; 4096], (1 << 20) - 100));
        efbig(f.set_len((1 << 20) + 1));
        f.write_all_at(b"fits", (1 << 20) - 4).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::metadata(v.join("sparse.bin")).unwrap().len(), 1 << 20);
        env.wait_uploaded();
        m.unmount();
    }
}

/// Two mounts of one built-in store see each other's changes at once, listings cached or not
/// (fstests generic/732: a file renamed back and forth through the two).
#[test]
fn two_mounts_of_one_store_see_each_others_changes_at_once() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m1 = env.mount(&[]);
    let mnt2 = env._tmp.path().join("mnt2");
    let cache2 = env._tmp.path().join("cache2");
    let m2 = common::mount::Mount::start(
        &mnt2,
        &[
            "--cache-dir",
            cache2.to_str().unwrap(),
            "--data-dir",
            env.data.to_str().unwrap(),
        ],
    );
    let (v1, v2) = (env.vault(), mnt2.join(VAULT));
    fs::create_dir(v1.join("A")).unwrap();
    fs::create_dir(v1.join("B")).unwrap();
    fs::write(v1.join("A/f"), b"one").unwrap();
    File::open(v1.join("A/f")).unwrap().sync_all().unwrap();
    // Both mounts list both folders, so each has them cached.
    for v in [&v1, &v2] {
        assert_eq!(names(&v.join("A")), ["f"]);
        assert!(names(&v.join("B")).is_empty());
    }
    fs::rename(v1.join("A/f"), v1.join("B/f")).unwrap();
    assert_eq!(fs::read(v2.join("B/f")).unwrap(), b"one");
    assert!(names(&v2.join("A")).is_empty());
    fs::rename(v2.join("B/f"), v2.join("A/f")).unwrap();
    assert_eq!(fs::read(v1.join("A/f")).unwrap(), b"one");
    assert!(names(&v1.join("B")).is_empty());
    fs::rename(v1.join("A/f"), v1.join("B/f")).unwrap();

    // New names, new bytes and removals, each way.
    fs::create_dir(v2.join("C")).unwrap();
    assert!(v1.join("C").is_dir());
    let mut g = File::create(v1.join("B/g")).unwrap();
    g.write_all(b"from one").unwrap();
    g.sync_all().unwrap();
    drop(g);
    assert_eq!(fs::read(v2.join("B/g")).unwrap(), b"from one");
    fs::write(v2.join("B/g"), b"changed by two").unwrap();
    File::open(v2.join("B/g")).unwrap().sync_all().unwrap();
    assert_eq!(fs::read(v1.join("B/g")).unwrap(), b"changed by two");
    fs::remove_file(v1.join("B/f")).unwrap();
    assert_eq!(names(&v2.join("B")), ["g"]);
    assert!(!v2.join("B/f").exists());

    m2.unmount();
    m1.unmount();
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

/// The built-in store of a mount takes the room of what its files hold now: a file saved ten
/// times keeps one version's bytes, and a sparse file's holes cost no disk, through rewrites
/// and appends (fstests generic/013 filled 31 GB with fsstress's truncated files).
#[test]
fn saved_and_sparse_files_take_the_room_of_their_data() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&[]);
    let v = env.vault();
    for i in 0..10u64 {
        let mut f = File::create(v.join("saved.bin")).unwrap();
        f.write_all(&pattern(1 << 20, i)).unwrap();
        f.sync_all().unwrap();
    }
    let sparse = v.join("sparse.img");
    File::create(&sparse).unwrap().set_len(256 << 20).unwrap();
    for tail in [&b"one"[..], b"two"] {
        let mut f = OpenOptions::new().append(true).open(&sparse).unwrap();
        f.write_all(tail).unwrap();
        f.sync_all().unwrap();
    }
    env.wait_uploaded();
    assert_eq!(fs::read(v.join("saved.bin")).unwrap(), pattern(1 << 20, 9));
    let mut f = File::open(&sparse).unwrap();
    let mut end = [0u8; 6];
    f.seek(SeekFrom::End(-6)).unwrap();
    f.read_exact(&mut end).unwrap();
    assert_eq!(&end, b"onetwo");
    assert_eq!(f.metadata().unwrap().len(), (256 << 20) + 6);
    drop(f);
    let blobs = allocated(&env.data.join("blobs"));
    assert!(
        blobs < 3 << 20,
        "the store's blobs take {blobs} bytes for 1 MiB of data"
    );
    let b = env.backend();
    let id = env
        .rt
        .block_on(b.node(&NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/saved.bin")).unwrap()))
        .unwrap()
        .file_id()
        .unwrap();
    assert_eq!(b.store().version_history(&id).unwrap().len(), 1);
    assert!(b.store().check_integrity().unwrap().is_empty());
    m.unmount();
}
