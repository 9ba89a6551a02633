//! vaultfs as a user runs it against a server that answers in the public service's documented
//! shapes (`common::dialect`): `vaultfs login --client-id` with the service's own client ID and
//! a pin read from its page, then a real mount that writes, overwrites, renames, copies,
//! deletes, makes folders, reads and shows `.preview/` (and `.search/` refusing: the service has
//! no search). Every byte written must be in the store afterwards: a lost write is a failure.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use common::dialect::{DIALECT_CLIENT, DialectOptions, DialectServer, pin_from_page};
use common::env::pending_uploads;
use common::mount::{BIN, Mount, fuse_available, wait_for};
use common::pattern;
use vaultfs::api::NodePath;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::{Backend, list_all};

const EMAIL: &str = "tester@example.com";

/// `vaultfs login` with `args`, answering the pin prompt with what `pin` makes of the printed
/// address (None: no pin is given). Returns whether it succeeded, and its stderr.
fn login(config: &Path, args: &[&str], pin: Option<&dyn Fn(&str) -> String>) -> (bool, String) {
    let mut child = Command::new(BIN)
        .arg("login")
        .args(args)
        .arg("--no-browser")
        .env("XDG_CONFIG_HOME", config)
        .env_remove("VAULTFS_PIN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(pin) = pin {
        // Given outright on standard input, or read from the page whose address is printed.
        let mut url = String::new();
        if !args.contains(&"--pin-stdin") {
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut url)
                .unwrap();
        }
        writeln!(stdin, "{}", pin(url.trim())).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until the mount with this cache dir has nothing left to upload.
fn uploaded(cache: &Path, m: &Mount) {
    wait_for(120, "the uploads", || pending_uploads(cache) == 0);
    assert!(!m.log_text().contains("lost+found"), "{}", m.log_text());
}

#[test]
fn login_with_the_service_client_id_and_mount() {
    if !fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A cap below the folder's size: listings take several pages.
    let server = rt.block_on(DialectServer::start(DialectOptions {
        per_page_cap: 7,
        ..Default::default()
    }));
    let base = server.base.clone();
    let shown_pin = server.add_user(EMAIL, "Local");
    assert!(shown_pin.starts_with('0'), "{shown_pin}");
    let config = tmp.path().join("config");

    // The default client ID is not registered there: the login says so.
    let (ok, err) = login(&config, &["--server", &base, "--email", EMAIL], None);
    assert!(!ok, "{err}");
    assert!(err.contains("not registered"), "{err}");

    // With the service's client ID: the address printed, the pin read from its page.
    let args = [
        "--server",
        &base,
        "--email",
        EMAIL,
        "--client-id",
        DIALECT_CLIENT,
    ];
    let read_pin = |url: &str| rt.block_on(pin_from_page(url, EMAIL));
    let (ok, err) = login(&config, &args, Some(&read_pin));
    assert!(ok, "{err}");
    let creds = fs::read_to_string(config.join("vaultfs/credentials.toml")).unwrap();
    assert!(
        creds.contains(&format!("client_id = \"{DIALECT_CLIENT}\"")),
        "{creds}"
    );
    // The next login at this server remembers the client ID (the pin given outright).
    let (ok, err) = login(
        &config,
        &["--server", &base, "--email", EMAIL, "--pin-stdin"],
        Some(&|_: &str| shown_pin.clone()),
    );
    assert!(ok, "{err}");

    let cache = tmp.path().join("cache");
    let mnt = tmp.path().join("mnt");
    let mount = |cache: &Path| {
        Mount::start_with_env(
            &mnt,
            &[
                "--server",
                &base,
                "--cache-dir",
                cache.to_str().unwrap(),
                "--timeout",
                "10",
                "--dir-ttl",
                "0.2",
            ],
            &[("XDG_CONFIG_HOME", &config)],
        )
    };
    let m = mount(&cache);
    let vault = mnt.join("Local/My First Vault");

    // Write: more files than a listing page holds, and one of several megabytes.
    let mut want: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("f{i:02}.txt"),
                format!("file {i}\n").repeat(i + 1).into_bytes(),
            )
        })
        .collect();
    for (name, data) in &want {
        fs::write(vault.join(name), data).unwrap();
    }
    let big = pattern(3 << 20, 14);
    fs::write(vault.join("big.bin"), &big).unwrap();
    // Overwrite, shorter than before.
    fs::write(vault.join("f01.txt"), b"overwritten").unwrap();
    want[1].1 = b"overwritten".to_vec();
    // Folders, rename into one, copy, delete.
    fs::create_dir(vault.join("sub")).unwrap();
    fs::write(vault.join("sub/inner.txt"), b"inner").unwrap();
    uploaded(&cache, &m);
    fs::rename(vault.join("f02.txt"), vault.join("sub/moved.txt")).unwrap();
    let moved = want.remove(2).1;
    fs::copy(vault.join("f03.txt"), vault.join("f03-copy.txt")).unwrap();
    want.push(("f03-copy.txt".into(), want[2].1.clone()));
    fs::remove_file(vault.join("f04.txt")).unwrap();
    want.retain(|(n, _)| n != "f04.txt");
    // A text file, for .preview/.
    let text = "A line of notes to render.\n".repeat(40);
    fs::write(vault.join("notes.txt"), &text).unwrap();
    uploaded(&cache, &m);

    // What the mount lists and reads, through capped pages and chunked downloads.
    let mut listed: Vec<String> = fs::read_dir(&vault)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    let mut names: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
    names.extend(["big.bin", "notes.txt", "sub"].map(String::from));
    names.sort();
    assert_eq!(listed, names);
    for (name, data) in &want {
        assert_eq!(&fs::read(vault.join(name)).unwrap(), data, "{name}");
    }
    assert_eq!(fs::read(vault.join("sub/moved.txt")).unwrap(), moved);

    // .preview/: the status, a page and the PDF.
    let pv = vault.join(".preview/notes.txt");
    wait_for(60, "the preview", || {
        fs::read_to_string(pv.join("status")).is_ok_and(|s| s.trim() == "Ready")
    });
    assert!(
        fs::read(pv.join("page-0001.png"))
            .unwrap()
            .starts_with(b"\x89PNG")
    );
    assert!(
        fs::read(pv.join("document.pdf"))
            .unwrap()
            .starts_with(b"%PDF-")
    );

    // .search/: the service has no full-text search; a query says so (ENOTSUP), cleanly.
    assert!(vault.join(".search").is_dir());
    let e = fs::read_dir(vault.join(".search/notes")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTSUP), "{e}");

    // Nothing lost: the store has every byte, and a fresh mount (empty cache) reads them all.
    let b = LocalBackend::new(server.store.clone());
    let at =
        |rel: &str| NodePath::parse_uri(&format!("/nodes/pth/Local/My First Vault/{rel}")).unwrap();
    let stored = |rel: &str| {
        rt.block_on(async {
            let id = b.node(&at(rel)).await.unwrap().file_id().unwrap();
            common::content(&b, &id).await
        })
    };
    for (name, data) in &want {
        assert_eq!(&stored(name), data, "{name}");
    }
    assert!(stored("big.bin") == big);
    assert_eq!(stored("sub/moved.txt"), moved);
    assert_eq!(stored("sub/inner.txt"), b"inner");
    let in_store = rt.block_on(list_all(&b, &at(""), 1000)).unwrap();
    assert_eq!(in_store.children.unwrap().len(), names.len());

    // Times and execute bits: this server keeps none, so the cache dir keeps them, past the
    // listing's TTL and across a remount with that cache dir.
    let in_2001 = UNIX_EPOCH + Duration::new(1_000_000_000, 500_000_000);
    let in_1960 = UNIX_EPOCH - Duration::new(315_619_200, 0) + Duration::from_nanos(123_456_789);
    fs::write(vault.join("timed.txt"), b"timed").unwrap();
    let sh = |script: &str| {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&vault)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{script}");
    };
    sh("touch -m -d @1000000000.5 f00.txt && touch -m -d @-315619199.876543211 timed.txt");
    sh("chmod +x f05.txt");
    uploaded(&cache, &m);
    let times_kept = |m: &Mount| {
        std::thread::sleep(Duration::from_millis(500));
        let _ = fs::read_dir(&vault).unwrap().count();
        let meta = |n: &str| fs::metadata(vault.join(n)).unwrap();
        assert_eq!(
            meta("f00.txt").modified().unwrap(),
            in_2001,
            "{}",
            m.log_text()
        );
        assert_eq!(meta("timed.txt").modified().unwrap(), in_1960);
        assert_eq!(meta("f05.txt").permissions().mode() & 0o777, 0o755);
        assert_eq!(meta("f06.txt").permissions().mode() & 0o777, 0o644);
    };
    times_kept(&m);
    m.unmount();
    let m = mount(&cache);
    times_kept(&m);
    m.unmount();

    let m = mount(&tmp.path().join("cache2"));
    assert!(fs::read(vault.join("big.bin")).unwrap() == big);
    assert_eq!(fs::read(vault.join("f01.txt")).unwrap(), b"overwritten");
    assert_eq!(fs::read_to_string(vault.join("notes.txt")).unwrap(), text);

    // A save by rename (vim's: the file renamed to a backup, a new one written, the backup
    // removed) keeps the file's ID on this server too, its earlier bytes a version of it: the
    // history follows the name through the interface's own calls.
    let id_of = |rel: &str| rt.block_on(b.node(&at(rel))).unwrap().file_id().unwrap();
    let before = id_of("notes.txt");
    fs::rename(vault.join("notes.txt"), vault.join("notes.txt~")).unwrap();
    fs::write(vault.join("notes.txt"), b"saved by rename").unwrap();
    fs::remove_file(vault.join("notes.txt~")).unwrap();
    uploaded(&tmp.path().join("cache2"), &m);
    assert_eq!(id_of("notes.txt"), before, "{}", m.log_text());
    assert_eq!(stored("notes.txt"), b"saved by rename");
    let history = server.store.version_history(&before).unwrap();
    assert!(history.len() >= 2, "{history:?}");
    assert!(!vault.join("notes.txt~").exists());
    assert!(
        rt.block_on(b.node(&at("notes.txt~"))).is_err(),
        "the backup left on the store"
    );
    m.unmount();
}

/// Against a server without a change feed, a mount polls the folders it used lately every
/// `--poll-interval`: a file another mount adds, changes or removes shows within it, though the
/// listing TTL is far longer.
#[test]
fn without_a_feed_a_mount_polls_what_it_uses() {
    if !fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(DialectServer::start(DialectOptions::default()));
    let pin = server.add_user(EMAIL, "Local");
    let config = tmp.path().join("config");
    let args = [
        "--server",
        &server.base,
        "--email",
        EMAIL,
        "--client-id",
        DIALECT_CLIENT,
        "--pin-stdin",
    ];
    let (ok, err) = login(&config, &args, Some(&|_: &str| pin.clone()));
    assert!(ok, "{err}");
    let mount = |name: &str, extra: &[&str]| {
        let cache = tmp.path().join(format!("{name}-cache"));
        let mut a = vec![
            "--server",
            &server.base,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--timeout",
            "10",
        ];
        a.extend_from_slice(extra);
        Mount::start_with_env(&tmp.path().join(name), &a, &[("XDG_CONFIG_HOME", &config)])
    };
    let a = mount("a", &[]);
    let b = mount("b", &["--poll-interval", "1", "--dir-ttl", "60"]);
    let (va, vb) = (
        a.path("Local/My First Vault"),
        b.path("Local/My First Vault"),
    );
    assert!(!vb.join("new.txt").exists());
    assert!(fs::read_dir(&vb).unwrap().next().is_none());
    let write = |data: &[u8]| {
        let mut f = fs::File::create(va.join("new.txt")).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    };
    write(b"one\n");
    wait_for(3, "the new file on B", || {
        fs::read(vb.join("new.txt")).is_ok_and(|d| d == b"one\n")
    });
    write(b"two, longer\n");
    wait_for(3, "the change on B", || {
        fs::read(vb.join("new.txt")).is_ok_and(|d| d == b"two, longer\n")
    });
    fs::remove_file(va.join("new.txt")).unwrap();
    wait_for(3, "the delete on B", || !vb.join("new.txt").exists());
    b.unmount();
    a.unmount();
}
