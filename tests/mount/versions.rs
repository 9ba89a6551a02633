//! The mount's virtual `.versions/` tree on both backends (issue 32, item 4): earlier versions
//! listed by time with their sizes, read and copied out, never written, and restored by copying
//! one back; a deleted file's versions under its name while the built-in store keeps it.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::common::env::{Env, Via};
use crate::common::mount::{BIN, names};

both!(
    earlier_versions_in_the_mount,
    a_deleted_files_versions_stay_in_dot_versions,
    a_save_by_rename_keeps_the_history,
    vims_own_saves_keep_the_history,
    libreoffice_saves_are_one_version_each,
    a_tree_removed_by_rm_rf_comes_back_whole,
    a_save_by_delete_and_create_keeps_the_history,
);

/// A program that saves by deleting the file and writing a new one under its name (issue 49:
/// "a file that takes the place of one deleted moments before"): after three saves the file
/// reads the third and `.versions/` holds the first two, on a store that keeps deleted files.
/// A folder removed and made again (`rm -rf d; mkdir d`) starts its files afresh.
fn a_save_by_delete_and_create_keeps_the_history(via: Via) {
    let retention = crate::common::served_retention();
    let Some(env) = Env::new_with_store(via, retention, Default::default()) else {
        return;
    };
    let m = env.mount(&[]);
    let v = env.vault();
    let saves: [&[u8]; 3] = [b"first\n", b"second save\n", b"third and last\n"];
    let f = v.join("notes.txt");
    for bytes in saves {
        if f.exists() {
            fs::remove_file(&f).unwrap();
        }
        fs::write(&f, bytes).unwrap();
        env.wait_uploaded();
    }
    assert_eq!(fs::read(&f).unwrap(), saves[2]);
    assert_eq!(
        versions_of(&v, "notes.txt"),
        [saves[0].to_vec(), saves[1].to_vec()],
        "{}",
        m.log_text()
    );
    let d = v.join("build");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("out.o"), b"old build").unwrap();
    env.wait_uploaded();
    crate::common::mount::sh(&v, "rm -rf build && mkdir build");
    fs::write(d.join("out.o"), b"new build").unwrap();
    env.wait_uploaded();
    assert_eq!(fs::read(d.join("out.o")).unwrap(), b"new build");
    assert!(!d.join(".versions/out.o").exists(), "{}", m.log_text());
    m.unmount();
}

/// `rm -rf` of a tree of 1,000 files, then `vaultfs restore` of its path (issue 49, item 3: a
/// removed folder could not be had back at all): every folder and file comes back whole, a
/// file's earlier versions with it; `--list` shows the folder among what can be brought back.
fn a_tree_removed_by_rm_rf_comes_back_whole(via: Via) {
    // The server keeps deleted files as `vaultfs serve` does by default.
    let retention = crate::common::served_retention();
    let Some(env) = Env::new_with_store(via, retention, Default::default()) else {
        return;
    };
    let m = env.mount(&[]);
    let v = env.vault();
    let top = v.join("project");
    let body = |d: usize, f: usize| format!("folder {d} file {f}\n").repeat(1 + f % 7);
    for d in 0..10 {
        let dir = top.join(format!("part {d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("f{f:03}.txt")), body(d, f)).unwrap();
        }
    }
    env.wait_uploaded();
    fs::write(top.join("part 0/f000.txt"), b"a second version").unwrap();
    env.wait_uploaded();
    crate::common::mount::sh(&v, "rm -rf project");
    assert!(!top.exists());
    let cli = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(BIN)
            .arg("restore")
            .args(args)
            .env("XDG_CONFIG_HOME", &env.config)
            .output()
            .unwrap()
    };
    let listed = cli(&["--list".as_ref(), v.as_os_str()]);
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.lines().any(|l| l.starts_with("project/\t")),
        "{listed}"
    );
    // A folder inside it cannot come back before it: said so.
    let inner = cli(&[top.join("part 3").as_os_str()]);
    assert_eq!(inner.status.code(), Some(1), "{inner:?}");
    assert!(
        String::from_utf8_lossy(&inner.stderr).contains("restore that folder first"),
        "{inner:?}"
    );
    let back = cli(&[top.as_os_str()]);
    assert!(back.status.success(), "{back:?}\n{}", m.log_text());
    assert!(
        String::from_utf8_lossy(&back.stdout).contains("restored"),
        "{back:?}"
    );
    // (Not there until the mount hears of the restore: read_dir fails meanwhile.)
    crate::common::mount::wait_for(30, "the tree back in the mount", || {
        fs::read_dir(&top).is_ok_and(|d| d.count() == 10)
    });
    for d in 0..10 {
        let dir = top.join(format!("part {d}"));
        assert_eq!(names(&dir).len(), 100, "{}", dir.display());
        for f in 0..100 {
            let want = match (d, f) {
                (0, 0) => b"a second version".to_vec(),
                _ => body(d, f).into_bytes(),
            };
            assert_eq!(fs::read(dir.join(format!("f{f:03}.txt"))).unwrap(), want);
        }
    }
    let kept = top.join("part 0/.versions/f000.txt");
    let versions = names(&kept);
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(
        fs::read(kept.join(&versions[0])).unwrap(),
        body(0, 0).into_bytes()
    );
    // Nothing named so was removed: a clear error, nothing made.
    let none = cli(&[v.join("never there").as_os_str()]);
    assert_eq!(none.status.code(), Some(1), "{none:?}");
    m.unmount();
}

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

/// The earlier versions `.versions/NAME/` lists, read whole, oldest first.
fn versions_of(folder: &Path, name: &str) -> Vec<Vec<u8>> {
    let dir = folder.join(".versions").join(name);
    names(&dir)
        .iter()
        .map(|n| fs::read(dir.join(n)).unwrap())
        .collect()
}

/// Writes `bytes` to a new file `path` as an editor does: created, written, maybe fsynced.
fn write_new(path: &Path, bytes: &[u8], fsync: bool) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    if fsync {
        f.sync_all().unwrap();
    }
}

/// Saves by rename keep the file's history (issue 49): the file is renamed to a backup name
/// and a new one written under its name. vim's way (fsynced, then the backup removed), the
/// same without an fsync (the backup removed before the new file is stored: its delete is
/// handed to the new file), and emacs's (the backup kept, with the old bytes, as a file of its
/// own), and Word's (its new copy renamed into the name). After three saves the file reads
/// the third, and `.versions/` holds the first two. A rename to another name is no save.
fn a_save_by_rename_keeps_the_history(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let saves: [&[u8]; 3] = [b"v1\n", b"v2, longer\n", b"v3, the longest of all\n"];
    for (name, fsync, keep_backup) in [
        ("vim.txt", true, false),
        ("quick.txt", false, false),
        ("emacs.txt", false, true),
    ] {
        let f = v.join(name);
        let backup = v.join(format!("{name}~"));
        fs::write(&f, saves[0]).unwrap();
        env.wait_uploaded();
        for (i, bytes) in saves.iter().enumerate().skip(1) {
            fs::rename(&f, &backup).unwrap();
            write_new(&f, bytes, fsync);
            if keep_backup {
                env.wait_uploaded();
                assert_eq!(fs::read(&backup).unwrap(), saves[i - 1], "{name}~");
            } else {
                fs::remove_file(&backup).unwrap();
            }
            env.wait_uploaded();
        }
        assert_eq!(fs::read(&f).unwrap(), saves[2], "{name}");
        assert_eq!(
            versions_of(&v, name),
            [saves[0].to_vec(), saves[1].to_vec()],
            "{name}: {}",
            m.log_text()
        );
        assert_eq!(backup.exists(), keep_backup, "{name}~");
    }
    // Word's way: the new copy written to a temporary file and closed, the original renamed
    // away, the copy renamed into its name, the original removed. The first save holds the
    // copy open until it has the name; the second closes it first, as Word does, and renames
    // after a pause in which an upload would have stored it (the copy waits: `held_back`).
    let f = v.join("word.docx");
    fs::write(&f, saves[0]).unwrap();
    env.wait_uploaded();
    for (i, bytes) in saves.iter().enumerate().skip(1) {
        let (tmp, old) = (
            v.join(format!("~WRD000{i}.tmp")),
            v.join(format!("~WRL000{i}.tmp")),
        );
        let mut copy = fs::File::create(&tmp).unwrap();
        copy.write_all(bytes).unwrap();
        if i == 2 {
            drop(copy);
            std::thread::sleep(std::time::Duration::from_millis(300));
            fs::rename(&f, &old).unwrap();
            fs::rename(&tmp, &f).unwrap();
        } else {
            fs::rename(&f, &old).unwrap();
            fs::rename(&tmp, &f).unwrap();
            drop(copy);
        }
        fs::remove_file(&old).unwrap();
        env.wait_uploaded();
    }
    assert_eq!(fs::read(&f).unwrap(), saves[2]);
    assert_eq!(
        versions_of(&v, "word.docx"),
        [saves[0].to_vec(), saves[1].to_vec()],
        "{}",
        m.log_text()
    );
    // The backup written to as the new file is written (both closed into one batch, on the
    // built-in store): the new file stays a new file, each keeps its bytes, nothing waits.
    let (f, b) = (v.join("both.txt"), v.join("both.txt~"));
    fs::write(&f, saves[0]).unwrap();
    env.wait_uploaded();
    fs::rename(&f, &b).unwrap();
    fs::write(&b, b"the backup, edited\n").unwrap();
    fs::write(&f, saves[1]).unwrap();
    env.wait_uploaded();
    assert_eq!(fs::read(&f).unwrap(), saves[1]);
    assert_eq!(fs::read(&b).unwrap(), b"the backup, edited\n");
    // A rename on purpose, to a name that is no backup's, is no save: the renamed file keeps
    // its history, and a new file under the old name starts with none.
    let r = v.join("report.txt");
    for bytes in &saves[..2] {
        fs::write(&r, bytes).unwrap();
        env.wait_uploaded();
    }
    fs::rename(&r, v.join("old report.txt")).unwrap();
    fs::write(&r, b"a new report\n").unwrap();
    env.wait_uploaded();
    assert_eq!(versions_of(&v, "old report.txt"), [saves[0].to_vec()]);
    assert!(!v.join(".versions").join("report.txt").exists());
    let all = [
        "both.txt",
        "both.txt~",
        "emacs.txt",
        "emacs.txt~",
        "old report.txt",
        "quick.txt",
        "report.txt",
        "vim.txt",
        "word.docx",
    ];
    assert_eq!(names(&v), all);
    m.unmount();
    // The store agrees after a remount.
    let m = env.mount(&[]);
    assert_eq!(names(&v), all);
    assert_eq!(fs::read(v.join("emacs.txt~")).unwrap(), saves[1]);
    assert_eq!(versions_of(&v, "vim.txt").len(), 2);
    m.unmount();
}

/// vim itself, saving by rename (`backupcopy=no`, as its default `auto` does where it judges
/// it safe), three times: the file's history is whole in `.versions/`.
fn vims_own_saves_keep_the_history(via: Via) {
    if std::process::Command::new("vim")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("vim is not installed: skipped");
        return;
    }
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let f = v.join("letter.txt");
    fs::write(&f, b"Dear reader,\n").unwrap();
    env.wait_uploaded();
    let lines = ["Dear reader, hello.", "Dear reader, hello again."];
    for line in lines {
        let out = std::process::Command::new("vim")
            .args(["-u", "NONE", "-i", "NONE", "-N", "-n", "-es"])
            .args(["-c", "set backupcopy=no writebackup nobackup backupskip="])
            .args(["-c", &format!("call setline(1, '{line}')"), "-c", "wq"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        env.wait_uploaded();
    }
    assert_eq!(fs::read(&f).unwrap(), format!("{}\n", lines[1]).as_bytes());
    assert_eq!(
        versions_of(&v, "letter.txt"),
        [
            b"Dear reader,\n".to_vec(),
            format!("{}\n", lines[0]).into_bytes()
        ],
        "{}",
        m.log_text()
    );
    assert_eq!(names(&v), ["letter.txt"]);
    m.unmount();
}

/// LibreOffice, headless through UNO, saving a spreadsheet 20 times: it writes each save to a
/// temporary file it first makes empty and closes, then renames it over the document. 20 saves
/// are 20 versions (the document as first made and 19 saves before the current one), none of
/// them empty (each save once added an empty one: the temporary file stored at its first close).
fn libreoffice_saves_are_one_version_each(via: Via) {
    let python = "/usr/bin/python3"; // Debian's, where python3-uno puts `uno`
    let uno = std::process::Command::new(python)
        .args(["-c", "import uno"])
        .output();
    let office = std::process::Command::new("soffice")
        .arg("--version")
        .output();
    if !(uno.is_ok_and(|o| o.status.success()) && office.is_ok_and(|o| o.status.success())) {
        eprintln!("LibreOffice with python3-uno is not installed: skipped");
        return;
    }
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let sheet = v.join("sheet.ods");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mount/libreoffice_save.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(&sheet)
        .arg("20")
        .arg(crate::common::free_port().to_string())
        .arg(env._tmp.path().join("office-profile"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    env.wait_uploaded();
    let dir = v.join(".versions").join("sheet.ods");
    let listed = names(&dir);
    let sizes: Vec<u64> = listed
        .iter()
        .map(|n| fs::metadata(dir.join(n)).unwrap().len())
        .collect();
    assert_eq!(listed.len(), 20, "{listed:?} {sizes:?}\n{}", m.log_text());
    assert!(sizes.iter().all(|&s| s > 0), "an empty version: {sizes:?}");
    // Sorted by name is sorted by time: the first is the document as first made.
    assert_eq!(listed.first().map(|n| n.ends_with(".ods")), Some(true));
    assert!(fs::metadata(&sheet).unwrap().len() > 0);
    assert_eq!(names(&v), ["sheet.ods"]);
    m.unmount();
}
