//! Mount options and settings: `allow_other`, the config file against flags, the mount's source.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::errno_of;
use crate::common;
use crate::common::env::{Env, Via};
use crate::common::mount::wait_for;

both!(
    search_takes_a_folder_in_the_mount,
    an_edit_the_store_refuses_is_a_failure_sync_and_status_say
);

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

/// `vaultfs sync` and `vaultfs status` take any path inside a mount, as users type it (a
/// folder of the vault), not only the mount point; a path in no mount still says so.
#[test]
fn sync_and_status_take_a_path_inside_the_mount() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&[]);
    let inside = env.vault().join("docs");
    fs::create_dir(&inside).unwrap();
    fs::write(inside.join("a.txt"), b"stored by sync\n").unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::mount::BIN)
            .args(args)
            .output()
            .unwrap()
    };
    let sync = run(&["sync", "--quiet", inside.to_str().unwrap()]);
    assert!(sync.status.success(), "{sync:?}");
    assert_eq!(crate::common::env::pending_uploads(&env.cache), 0);
    let status = run(&["status", "--json", inside.to_str().unwrap()]);
    assert!(status.status.success(), "{status:?}");
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let own = m.status();
    assert_eq!(
        (&s["mountpoint"], &s["pid"]),
        (&own["mountpoint"], &own["pid"]),
        "the status of the mount itself"
    );
    let outside = env._tmp.path().join("elsewhere");
    fs::create_dir(&outside).unwrap();
    let none = run(&["sync", outside.to_str().unwrap()]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no running vaultfs mount"));
    m.unmount();
}

/// An edit that goes to `lost+found` is a failure the user sees (issue 47, item 4): a file the
/// store refuses (a name with a control character, which the mount takes and the store does
/// not) is set aside after its attempts; `vaultfs status` lists it, `vaultfs sync` exits 1
/// naming it and where its bytes are, until the kept file is moved away.
fn an_edit_the_store_refuses_is_a_failure_sync_and_status_say(via: Via) {
    let Some(env) = Env::new(via) else {
        return;
    };
    let m = env.mount(&[]);
    let name = "bell\u{7}.txt";
    fs::write(env.vault().join(name), b"an edit the store refuses\n").unwrap();
    fs::write(env.vault().join("fine.txt"), b"stored\n").unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::mount::BIN)
            .args(args)
            .output()
            .unwrap()
    };
    let mp = m.path("");
    let mp = mp.to_str().unwrap();
    wait_for(60, "the refused file set aside", || {
        m.status()["set_aside"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    let status = m.status();
    let noted = &status["set_aside"][0];
    assert!(noted["path"].as_str().unwrap().contains("bell"), "{status}");
    assert!(
        noted["why"].as_str().unwrap().contains("control character"),
        "{status}"
    );
    let kept = std::path::PathBuf::from(noted["kept"].as_str().unwrap());
    assert_eq!(fs::read(&kept).unwrap(), b"an edit the store refuses\n");
    let human = run(&["status", mp]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("NOT STORED") && human.contains(kept.to_str().unwrap()),
        "{human}"
    );
    let sync = run(&["sync", "--quiet", mp]);
    assert_eq!(sync.status.code(), Some(1), "{sync:?}");
    let said = String::from_utf8_lossy(&sync.stderr);
    assert!(said.contains("1 edit(s) could not be stored"), "{said}");
    assert!(said.contains(kept.to_str().unwrap()), "{said}");
    assert!(m.log_text().contains("ERROR"), "{}", m.log_text());
    // Dealt with: the kept file moved out of lost+found, sync succeeds again.
    fs::rename(&kept, env._tmp.path().join("rescued.txt")).unwrap();
    let sync = run(&["sync", "--quiet", mp]);
    assert!(sync.status.success(), "{sync:?}");
    assert_eq!(m.status()["set_aside"], serde_json::json!([]));
    m.unmount();
}

/// A new `vaultfs login` while mounted (issue 47, item 12): the old token revoked, the login
/// of the same user written again; the mount takes the new token when the server refuses the
/// old one, says so in its log, and stores what is written (before: refused until remounted).
#[test]
fn a_new_login_while_mounted_is_taken() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&[]);
    fs::write(
        env.vault().join("before.txt"),
        b"stored with the first token\n",
    )
    .unwrap();
    env.wait_uploaded();
    let server = env.server.as_ref().unwrap();
    let email = "tester@example.com";
    assert!(server.store.revoke_tokens(email).unwrap() >= 1);
    let token = env
        .rt
        .block_on(common::login(&server.base, email, &format!("pw-{email}")));
    common::save_login(
        &env.config.join("vaultfs/credentials.toml"),
        &server.base,
        common::Creds {
            email: email.into(),
            token,
        },
        std::time::Duration::from_secs(3600),
    );
    fs::write(env.vault().join("after.txt"), b"stored with the new one\n").unwrap();
    let sync = Command::new(common::mount::BIN)
        .args([
            "sync",
            "--quiet",
            "--timeout",
            "30",
            m.path("").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(sync.status.success(), "{sync:?}\n{}", m.log_text());
    assert_eq!(
        crate::common::env::stored(&env, "after.txt"),
        b"stored with the new one\n"
    );
    assert!(
        m.log_text().contains("took the newer login"),
        "{}",
        m.log_text()
    );
    m.unmount();
}

/// `vaultfs search ~/Vault/docs WORD`, a folder in a mount as users type it (issue 49: "not
/// found", and a stray built-in store made in the default data dir): the mount's own store is
/// searched under that folder, and hits are printed as paths in the mount. A data dir that holds
/// no store is an error, and no store is made there.
fn search_takes_a_folder_in_the_mount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let docs = env.vault().join("docs");
    fs::create_dir(&docs).unwrap();
    fs::write(docs.join("notes.txt"), b"the okapi grazes here\n").unwrap();
    fs::write(env.vault().join("outside.txt"), b"another okapi\n").unwrap();
    env.wait_uploaded();
    let run = |args: &[&str]| {
        Command::new(crate::common::mount::BIN)
            .arg("search")
            .args(args)
            .env("XDG_CONFIG_HOME", &env.config)
            .output()
            .unwrap()
    };
    let want = format!(
        "{}\n    the okapi grazes here\n",
        docs.join("notes.txt").display()
    );
    crate::common::mount::wait_for(60, "the file indexed and found through the mount", || {
        let out = run(&[docs.to_str().unwrap(), "okapi"]);
        out.status.success() && out.stdout == want.as_bytes()
    });
    // From inside the folder, as `.`.
    let here = Command::new(crate::common::mount::BIN)
        .args(["search", ".", "grazes"])
        .current_dir(&docs)
        .env("XDG_CONFIG_HOME", &env.config)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&here.stdout), want, "{here:?}");

    let empty = env._tmp.path().join("no store here");
    let out = Command::new(crate::common::mount::BIN)
        .args(["search", "--data-dir"])
        .arg(&empty)
        .arg("okapi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no built-in store in"),
        "{out:?}"
    );
    assert!(!empty.exists(), "a search made a store");
    m.unmount();
}

/// `--bwlimit 1M:2M` (rclone's spelling, upload:download): a 3 MiB file takes about 3 s to
/// store and 1.5 s to read cold, where loopback moves it in a fraction of a second. Bounds
/// are generous (the bucket's own timing is tested in `backend::bwlimit`).
#[test]
fn bwlimit_caps_a_servers_transfers() {
    use std::time::{Duration, Instant};
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let data = common::pattern(3 << 20, 7);
    let p = env.vault().join("limited");
    let m = env.mount(&["--bwlimit", "1M:2M"]);
    let t = Instant::now();
    fs::write(&p, &data).unwrap();
    env.wait_uploaded();
    let up = t.elapsed();
    m.unmount();
    let m = env.mount(&["--bwlimit", "1M:2M"]);
    let t = Instant::now();
    assert!(fs::read(&p).unwrap() == data);
    let down = t.elapsed();
    eprintln!("3 MiB up at 1M: {up:.2?}, down at 2M: {down:.2?}");
    // Less the bucket's burst (an eighth of a second's worth).
    assert!(
        up >= Duration::from_millis(2500) && up < Duration::from_secs(30),
        "{up:?}"
    );
    assert!(
        down >= Duration::from_millis(1200) && down < Duration::from_secs(30),
        "{down:?}"
    );
    m.unmount();
}

/// Desktop indexers are kept out by default (issue 35, item 3): the mount's root answers
/// `.trackerignore` and `.nomedia` by name, empty and read-only, never listed (so copies and
/// backups of the vault do not carry them); `--allow-indexing` takes them away; a real file of
/// that name at the root is shown instead.
#[test]
fn indexers_are_kept_out_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let listed = |d: &Path| -> Vec<String> {
        let mut n: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    let m = env.mount(&[]);
    for name in [".trackerignore", ".nomedia"] {
        let p = env.mnt.join(name);
        let meta = fs::metadata(&p).unwrap();
        assert!(meta.is_file(), "{name}");
        assert_eq!(meta.len(), 0, "{name}");
        assert_eq!(meta.permissions().mode() & 0o777, 0o444, "{name}");
        assert_eq!(fs::read(&p).unwrap(), b"", "{name}");
        assert_eq!(errno_of(fs::write(&p, "x")), libc::EROFS, "{name}");
        // Only at the root.
        assert!(!env.vault().join(name).exists(), "{name}");
    }
    assert_eq!(listed(&env.mnt), ["Local"]);
    m.unmount();

    let m = env.mount(&["--allow-indexing"]);
    assert!(env.vault().is_dir());
    assert!(!env.mnt.join(".trackerignore").exists());
    assert!(!env.mnt.join(".nomedia").exists());
    m.unmount();

    // A vault at the mount's root holding a real `.nomedia`: that file is shown, as stored.
    let m = env.mount(&[]);
    fs::write(env.vault().join(".nomedia"), b"mine").unwrap();
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&["--root", "Local/My First Vault"]);
    assert_eq!(fs::read(env.mnt.join(".nomedia")).unwrap(), b"mine");
    assert_eq!(fs::read(env.mnt.join(".trackerignore")).unwrap(), b"");
    assert_eq!(listed(&env.mnt), [".nomedia"]);
    m.unmount();
}

/// `updatedb` walks past the mount once `fuse.vaultfs` is in its PRUNEFS, as
/// `scripts/install.sh` sets it (plocate's updatedb, run over the mount's parent with the
/// system's configuration set aside; skipped where it is not installed).
#[test]
fn updatedb_skips_the_mount_type_install_sh_prunes() {
    if Command::new("updatedb").arg("--help").output().is_err() {
        eprintln!("skipped: no updatedb (plocate)");
        return;
    }
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&[]);
    fs::write(env.vault().join("findme.txt"), "x").unwrap();
    let top = env._tmp.path();
    let db = top.join("locate.db");
    let walk = |prunefs: &str| -> String {
        let out = Command::new("updatedb")
            .args(["-U", top.to_str().unwrap(), "-o", db.to_str().unwrap()])
            .args(["-l", "no", "--prune-bind-mounts", "no", "-v"])
            .args(["--prunepaths", "/proc", "--prunenames", ".git"])
            .args(["--prunefs", prunefs])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let walked = walk("nfs");
    assert!(walked.contains("My First Vault/findme.txt"), "{walked}");
    let pruned = walk("nfs fuse.vaultfs");
    assert!(!pruned.contains("findme.txt"), "{pruned}");
    assert!(!pruned.contains("My First Vault"), "{pruned}");
    // The rest of the tree is walked.
    assert!(pruned.contains(&*env.cache.to_string_lossy()), "{pruned}");
    m.unmount();
}

/// `df` of a mount: `df -B1 --output=size,used,avail` as numbers.
fn df(p: &Path) -> [u64; 3] {
    let out = Command::new("df")
        .args(["-B1", "--output=size,used,avail"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let row: Vec<u64> = text
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    [row[0], row[1], row[2]]
}

/// `df` on a mount of a server with a byte quota shows the quota as the size and the account's
/// bytes as used (issue 35, item 5), following what is stored; a mount of the built-in store,
/// which has no quota, shows the disk under its cache dir, where writes are staged.
#[test]
fn df_shows_the_accounts_quota_and_use() {
    let quota: u64 = 64 << 20;
    let store = vaultfs::store::StoreConfig {
        max_bytes_per_account: quota,
        ..Default::default()
    };
    let Some(env) = Env::new_with_store(Via::Remote, store, Default::default()) else {
        return;
    };
    let m = env.mount(&[]);
    common::mount::wait_for(10, "the quota", || df(&env.mnt)[0] == quota);
    assert_eq!(df(&env.mnt)[1], 0);
    let data = common::pattern(5 << 20, 35);
    fs::write(env.vault().join("five.bin"), &data).unwrap();
    env.wait_uploaded();
    common::mount::wait_for(15, "the bytes stored to count", || {
        df(&env.mnt)[1] == 5 << 20
    });
    let [size, used, avail] = df(&env.mnt);
    assert_eq!((size, used), (quota, 5 << 20));
    assert!(avail <= quota - used, "{avail}");
    m.unmount();

    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&[]);
    fs::create_dir_all(&env.cache).unwrap();
    assert_eq!(df(&env.mnt)[0], df(&env.cache)[0]);
    m.unmount();
}
