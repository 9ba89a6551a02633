//! The mount's virtual `.versions/` tree on both backends (issue 32, item 4): earlier versions
//! listed by time with their sizes, read and copied out, never written, and restored by copying
//! one back; a deleted file's versions under its name while the built-in store keeps it.

use std::fs;

use crate::common::env::{Env, Via};
use crate::common::mount::{BIN, names};

both!(
    earlier_versions_in_the_mount,
    a_deleted_files_versions_stay_in_dot_versions
);

fn earlier_versions_in_the_mount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let saves: [&[u8]; 3] = [
        b"first\n",
        b"second, longer\n",
        b"third and longest of all\n",
    ];
    for bytes in saves {
        fs::write(v.join("report.txt"), bytes).unwrap();
        env.wait_uploaded();
    }
    fs::write(v.join("once.txt"), b"only one version").unwrap();
    env.wait_uploaded();

    // Reached by name, not listed; only files with earlier versions have an entry.
    assert_eq!(names(&v), ["once.txt", "report.txt"]);
    let versions = v.join(".versions");
    assert!(versions.is_dir());
    assert_eq!(names(&versions), ["report.txt"]);
    assert!(!versions.join("once.txt").exists());

    let dir = versions.join("report.txt");
    let listed = names(&dir);
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (name, bytes) in listed.iter().zip(saves) {
        // `2026-11-27 01.02.03.txt`, oldest first: sortable, no colon, the extension kept.
        assert!(name.ends_with(".txt") && !name.contains(':'), "{name}");
        let p = dir.join(name);
        assert_eq!(
            fs::metadata(&p).unwrap().len(),
            bytes.len() as u64,
            "{name}"
        );
        assert_eq!(fs::read(&p).unwrap(), bytes, "{name}");
    }

    // Copied out with cp; nothing in the tree can be written, made or removed.
    let out = env._tmp.path().join("out.txt");
    let cp = std::process::Command::new("cp")
        .arg(dir.join(&listed[0]))
        .arg(&out)
        .status()
        .unwrap();
    assert!(cp.success());
    assert_eq!(fs::read(&out).unwrap(), saves[0]);
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(fs::write(dir.join(&listed[0]), b"x"), "overwrite a version");
    erofs(fs::write(dir.join("new.txt"), b"x"), "create in .versions");
    erofs(fs::remove_file(dir.join(&listed[0])), "remove a version");
    erofs(fs::create_dir(versions.join("d")), "mkdir in .versions");
    erofs(
        fs::rename(v.join("once.txt"), dir.join("once.txt")),
        "rename into .versions",
    );

    // Restoring is copying back: the old bytes become the current version, the one they
    // replace an earlier one.
    fs::copy(dir.join(&listed[0]), v.join("report.txt")).unwrap();
    env.wait_uploaded();
    assert_eq!(fs::read(v.join("report.txt")).unwrap(), saves[0]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let after = names(&dir);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(fs::read(dir.join(&after[2])).unwrap(), saves[2]);

    // `vaultfs restore` lists them and brings one back; a name it does not list is exit 1, a
    // file outside a mount exit 2.
    let restore = |file: &std::path::Path, args: &[&str]| {
        std::process::Command::new(BIN)
            .arg("restore")
            .arg(file)
            .args(args)
            .output()
            .unwrap()
    };
    let report = v.join("report.txt");
    let list = restore(&report, &["--list"]);
    assert!(list.status.success());
    let lines: Vec<String> = String::from_utf8(list.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = after
        .iter()
        .zip([saves[0], saves[1], saves[2]])
        .map(|(n, b)| format!("{n}\t{}", b.len()))
        .collect();
    assert_eq!(lines, want);
    let out = restore(&report, &["--version", &after[1]]);
    assert!(out.status.success(), "{out:?}");
    env.wait_uploaded();
    assert_eq!(fs::read(&report).unwrap(), saves[1]);
    let out = restore(&report, &["--version", "1999-01-01 00.00.00.txt"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&after[0]));
    let out = restore(&env._tmp.path().join("out.txt"), &["--list"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(fs::read(&report).unwrap(), saves[1]);
    m.unmount();
}

/// A file removed through a mount of the built-in store is kept restorable with its versions
/// (the retention rule's age): `DIR/.versions/FILE/` still lists them all, its last version
/// included, and copying one back restores it. A mount of `vaultfs serve` does not reach the
/// server's deleted files (its web page and API do): there the name is gone.
fn a_deleted_files_versions_stay_in_dot_versions(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let saves: [&[u8]; 2] = [b"draft\n", b"the final text\n"];
    for bytes in saves {
        fs::write(v.join("gone.txt"), bytes).unwrap();
        env.wait_uploaded();
    }
    fs::remove_file(v.join("gone.txt")).unwrap();
    env.wait_uploaded();
    assert!(!v.join("gone.txt").exists());
    assert_eq!(names(&v), Vec::<String>::new());
    let dir = v.join(".versions").join("gone.txt");
    if via == Via::Remote {
        assert!(!dir.exists());
        m.unmount();
        return;
    }
    let listed = names(&dir);
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (name, bytes) in listed.iter().zip(saves) {
        assert_eq!(fs::read(dir.join(name)).unwrap(), bytes, "{name}");
    }
    fs::copy(dir.join(&listed[1]), v.join("gone.txt")).unwrap();
    env.wait_uploaded();
    assert_eq!(fs::read(v.join("gone.txt")).unwrap(), saves[1]);
    m.unmount();
}
