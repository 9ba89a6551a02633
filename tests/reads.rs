//! The read path on a real mount: files passed through to the kernel (the built-in store's
//! blob, a complete read-cache file) read right whole, by ranges and mapped, with no READ
//! reaching the daemon; a reader keeps the version it opened while another is written through
//! the mount or arrives from elsewhere, and a new open gets the new one; eviction from the read
//! cache under an open passed-through file; `--no-passthrough`; the read-ahead granted.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use common::env::{Env, Via, put_elsewhere};
use common::mount::{BIN, Mount, wait_for};
use common::pattern;

both!(
    whole_ranges_and_mmap_come_from_the_kernel,
    a_reader_keeps_its_version_while_the_mount_writes_another,
    a_reader_keeps_its_version_while_another_arrives_from_elsewhere,
    no_passthrough_serves_reads_from_the_daemon,
);

/// READ requests the daemon answered so far.
fn daemon_reads(m: &Mount) -> u64 {
    m.status()["daemon_reads"].as_u64().unwrap()
}

/// Reads every byte of `p` through the mount (once for a remote mount, so that the read
/// cache holds the whole file and the next open is passed through).
fn read_all(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap()
}

fn whole_ranges_and_mmap_come_from_the_kernel(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let data = pattern(5 << 20, 7);
    let p = env.vault().join("big.bin");
    fs::write(&p, &data).unwrap();
    env.wait_uploaded();
    drop(m);
    // A fresh mount: no staged copy, no page cache of the daemon's.
    let m = env.mount(&[]);
    let st = m.status();
    assert!(
        st["reads"].as_str().unwrap().starts_with("passthrough"),
        "{st}"
    );
    if via == Via::Remote {
        // Read through the daemon into the read cache first.
        assert_eq!(read_all(&p), data);
    }
    let before = daemon_reads(&m);
    assert_eq!(read_all(&p), data);
    let f = File::open(&p).unwrap();
    for (off, len) in [(0, 1), (4095, 2), (1 << 20, 300_000), ((5 << 20) - 10, 10)] {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert_eq!(buf, data[off..off + len], "range at {off}");
    }
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, data.len() as u64).unwrap(), 0, "EOF");
    // SAFETY: a private read-only mapping of a file of that length, unmapped below.
    let mapped = unsafe {
        let len = data.len();
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        v
    };
    assert!(mapped == data, "the mapped bytes differ");
    drop(f);
    // The page cache dropped: read again from the backing file, still without the daemon.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert_eq!(read_all(&p), data);
    assert_eq!(
        daemon_reads(&m),
        before,
        "passthrough reads reached the daemon"
    );
    // O_DIRECT reads at any offset, as FUSE takes them: not passed through.
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    let mut odd = vec![0u8; 1000];
    direct.read_exact_at(&mut odd, 12345).unwrap();
    assert_eq!(odd, data[12345..13345]);
    drop(direct);
}

fn a_reader_keeps_its_version_while_the_mount_writes_another(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let old = pattern(3 << 20, 1);
    let new = pattern(2 << 20, 2);
    let p = env.vault().join("doc.bin");
    fs::write(&p, &old).unwrap();
    env.wait_uploaded();
    assert_eq!(read_all(&p), old);
    let mut reader = File::open(&p).unwrap();
    let mut head = vec![0u8; 1 << 20];
    reader.read_exact(&mut head).unwrap();
    let ino = reader.metadata().unwrap().ino();

    // A writer opens the same name for writing while the reader is open, and stores anew.
    let mut w = OpenOptions::new().write(true).open(&p).unwrap();
    w.set_len(0).unwrap();
    w.write_all(&new).unwrap();
    drop(w);
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    head.extend(rest);
    assert!(head == old, "the reader saw another version than it opened");

    // Close-to-open: a new open gets what the writer closed.
    assert_eq!(read_all(&p), new);
    env.wait_uploaded();
    assert_eq!(read_all(&p), new);
    let second = File::open(&p).unwrap();
    assert_ne!(second.metadata().unwrap().ino(), ino);
    // Appending by name (another open for writing) with both readers open.
    OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"tail")
        .unwrap();
    let mut both = new.clone();
    both.extend_from_slice(b"tail");
    assert_eq!(read_all(&p), both);
    let mut again = Vec::new();
    reader.seek(SeekFrom::Start(0)).unwrap();
    reader.read_to_end(&mut again).unwrap();
    assert!(again == old, "the first reader's version changed");
    // A truncate by name, with the first reader still open.
    let st = Command::new("truncate")
        .args(["-s", "5"])
        .arg(&p)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(read_all(&p), &both[..5]);
    env.wait_uploaded();
    drop((reader, second));
    let m2 = {
        drop(m);
        env.mount(&[])
    };
    assert_eq!(read_all(&p), &both[..5], "{}", m2.log_text());
}

fn a_reader_keeps_its_version_while_another_arrives_from_elsewhere(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--dir-ttl", "1"]);
    let old = pattern(2 << 20, 3);
    let new = pattern(1 << 20, 4);
    let p = env.vault().join("shared.bin");
    fs::write(&p, &old).unwrap();
    env.wait_uploaded();
    assert_eq!(read_all(&p), old);
    let reader = File::open(&p).unwrap();
    let mut first = vec![0u8; 4096];
    reader.read_exact_at(&mut first, 0).unwrap();
    put_elsewhere(&env, "shared.bin", &new);
    // Seen within the listing TTL (and the kernel's attribute TTL).
    wait_for(10, "the new version to show", || {
        fs::read(&p).is_ok_and(|d| d == new)
    });
    let mut all = vec![0u8; old.len()];
    reader.read_exact_at(&mut all, 0).unwrap();
    assert!(all == old, "the reader saw another version than it opened");
    drop(reader);
    assert_eq!(read_all(&p), new);
    assert!(!m.log_text().contains("ERROR"), "{}", m.log_text());
}

fn no_passthrough_serves_reads_from_the_daemon(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--no-passthrough"]);
    let data = pattern(3 << 20, 9);
    let p = env.vault().join("plain.bin");
    fs::write(&p, &data).unwrap();
    env.wait_uploaded();
    drop(m);
    let m = env.mount(&["--no-passthrough"]);
    let st = m.status();
    assert_eq!(
        st["reads"].as_str().unwrap(),
        "through the daemon (switched off: --no-passthrough)"
    );
    assert!(m.log_text().contains("reads: through the daemon"));
    let before = daemon_reads(&m);
    assert_eq!(read_all(&p), data);
    assert_eq!(read_all(&p), data);
    assert!(daemon_reads(&m) > before);
    let text = Command::new(BIN)
        .arg("status")
        .arg(&m.dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("reads     through the daemon"), "{text}");
}

/// A complete read-cache file passed through, evicted while open: the reader keeps reading it
/// whole, and the next open reads it right again.
#[test]
fn eviction_from_the_read_cache_under_an_open_passthrough_file() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&["--cache-size", "6M"]);
    let files: Vec<Vec<u8>> = (0..4).map(|i| pattern(3 << 20, 20 + i)).collect();
    for (i, d) in files.iter().enumerate() {
        fs::write(env.vault().join(format!("e{i}.bin")), d).unwrap();
    }
    env.wait_uploaded();
    drop(m);
    let m = env.mount(&["--cache-size", "6M"]);
    let p0 = env.vault().join("e0.bin");
    assert_eq!(read_all(&p0), files[0]);
    let reader = File::open(&p0).unwrap();
    let reads = daemon_reads(&m);
    // The other files fill the cache past its bound.
    for round in 0..2 {
        for (i, d) in files.iter().enumerate().skip(1) {
            assert_eq!(
                &read_all(&env.vault().join(format!("e{i}.bin"))),
                d,
                "round {round}"
            );
        }
    }
    let mut all = vec![0u8; files[0].len()];
    reader.read_exact_at(&mut all, 0).unwrap();
    assert!(all == files[0], "the open file changed under eviction");
    // Removed through the mount: the cache forgets it at once, the open file stays whole.
    fs::remove_file(&p0).unwrap();
    let mut all = vec![0u8; files[0].len()];
    reader.read_exact_at(&mut all, 0).unwrap();
    assert!(all == files[0], "the open file changed once removed");
    drop(reader);
    fs::write(&p0, &files[0]).unwrap();
    env.wait_uploaded();
    assert!(
        daemon_reads(&m) > reads,
        "the other files came through the daemon"
    );
    for (i, d) in files.iter().enumerate() {
        assert_eq!(&read_all(&env.vault().join(format!("e{i}.bin"))), d);
    }
}

/// The read-ahead asked for is what the kernel holds for the mount, and status says so.
#[test]
fn read_ahead_granted_is_visible() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let cases = [
        (&[][..], 1024),
        (&["--read-ahead", "512"][..], 512),
        // Without passthrough the daemon serves cached files: the kernel's 128 KiB.
        (&["--no-passthrough"][..], 128),
    ];
    for (args, kb) in cases {
        let m = env.mount(args);
        let dev = fs::metadata(&env.mnt).unwrap().dev();
        let knob = format!(
            "/sys/class/bdi/{}:{}/read_ahead_kb",
            libc::major(dev),
            libc::minor(dev)
        );
        wait_for(10, "the read-ahead to be set", || {
            m.status()["read_ahead_kb"].as_u64() == Some(kb)
        });
        assert_eq!(fs::read_to_string(&knob).unwrap().trim(), kb.to_string());
        assert!(
            m.log_text().contains(&format!("read-ahead: {kb} KiB")),
            "{}",
            m.log_text()
        );
        drop(m);
    }
}

/// A mount without CAP_SYS_ADMIN (a user's, through fusermount3) reads through the daemon, and
/// says so once at mount and in its status.
#[test]
fn an_unprivileged_mount_reads_through_the_daemon() {
    use std::os::unix::fs::PermissionsExt;
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let home = env._tmp.path().join("nobody");
    let mnt = home.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    for d in [env._tmp.path(), home.as_path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let st = Command::new("chown")
        .args(["-R", "nobody"])
        .arg(&home)
        .status()
        .unwrap();
    assert!(st.success());
    let log = home.join("log");
    let before = fs::metadata(&mnt).unwrap().dev();
    let child = Command::new("runuser")
        .args(["-u", "nobody", "--", "env"])
        .arg(format!("HOME={}", home.display()))
        .arg("RUST_LOG=info,fuser=warn")
        .arg(BIN)
        .arg("mount")
        .arg(&mnt)
        .arg("--data-dir")
        .arg(home.join("data"))
        .arg("--cache-dir")
        .arg(home.join("cache"))
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let m = Mount {
        dir: mnt.clone(),
        child: Some(child),
        log,
    };
    // Mounted: another device, or (without allow_other, root being another user) EACCES.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fs::metadata(&mnt).is_ok_and(|md| md.dev() == before) {
        assert!(
            std::time::Instant::now() < deadline,
            "the mount did not come up: {}",
            m.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let as_nobody = |script: &str| {
        let out = Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", script])
            .env("HOME", &home)
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}\n{}", m.log_text());
        String::from_utf8(out.stdout).unwrap()
    };
    let file = mnt.join("Local/My First Vault/u.txt");
    as_nobody(&format!("echo hello > '{}'", file.display()));
    wait_for(30, "the upload", || {
        common::env::pending_uploads(&home.join("cache")) == 0
    });
    assert_eq!(as_nobody(&format!("cat '{}'", file.display())), "hello\n");
    let st = as_nobody(&format!("{BIN} status '{}' --json", mnt.display()));
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(
        st["reads"].as_str().unwrap(),
        "through the daemon (not privileged: passthrough needs CAP_SYS_ADMIN)"
    );
    assert!(st["daemon_reads"].as_u64().unwrap() > 0);
    let log = m.log_text();
    assert_eq!(log.matches("reads: through the daemon").count(), 1, "{log}");
    assert!(!log.contains("WARN"), "{log}");
}
