//! The mount's virtual `.search/` tree on both backends (issue 35, item 1): the files found,
//! as `vaultfs search` finds them, opened read-only as the documents' bytes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common::env::{Env, Via};
use crate::common::fixtures::pdf;
use crate::common::mount::{BIN, names, wait_for};

both!(search_in_the_mount);

#[track_caller]
fn assert_erofs<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
}

/// The entries of `dir` in the order the mount lists them (best match first).
fn listed(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// The paths under the vault `vaultfs search --json` finds for `words`, in its order.
fn cli_search(env: &Env, words: &str) -> Vec<String> {
    let mut cmd = Command::new(BIN);
    cmd.args(["search", "--json", "/Local/My First Vault", words]);
    match &env.server {
        Some(s) => cmd
            .args(["--server", &s.base])
            .env("XDG_CONFIG_HOME", &env.config),
        None => cmd.args(["--data-dir", env.data.to_str().unwrap()]),
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let found: vaultfs::api::SearchResults = serde_json::from_slice(&out.stdout).unwrap();
    let vault = "/nodes/pth/Local/My First Vault/";
    let rel = |h: &vaultfs::api::SearchHit| h.uri.strip_prefix(vault).unwrap().to_string();
    found.hits.iter().map(rel).collect()
}

fn search_in_the_mount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let report = pdf(&["BT /F1 12 Tf 72 700 Td (Quarterly zebrafish figures) Tj ET".into()]);
    fs::create_dir_all(v.join("sub/deep")).unwrap();
    let files: [(&str, &[u8]); 5] = [
        ("notes.txt", b"The quick zebrafish swims.\n"),
        ("sub/notes.txt", b"zebrafish zebrafish in a folder\n"),
        ("sub/deep/plan.md", b"# Plan\n\nfeed the zebrafish\n"),
        ("report.pdf", &report),
        ("other.txt", b"nothing to see here\n"),
    ];
    for (name, data) in files {
        fs::write(v.join(name), data).unwrap();
    }
    env.wait_uploaded();

    // Reached by name, never listed (find, du, cp -r and indexers do not walk into it).
    assert!(!names(&v).contains(&".search".to_string()));
    let s = v.join(".search");
    assert!(s.is_dir());
    assert!(names(&s).is_empty());
    // The index is made in idle time: found once it is.
    let q = s.join("zebrafish");
    wait_for(60, "the files to be indexed", || listed(&q).len() == 4);
    let mut shown = listed(&q);
    shown.sort();
    // Two files named notes.txt: the one in a folder is named by its path under the vault.
    assert_eq!(
        shown,
        ["notes.txt", "plan.md", "report.pdf", "sub／notes.txt"]
    );

    // The same files in the same order as `vaultfs search`, each entry the file's bytes.
    let cli = cli_search(&env, "zebrafish");
    let entry_of = |rel: &str| match rel {
        "sub/notes.txt" => "sub／notes.txt".to_string(),
        _ => rel.rsplit('/').next().unwrap().to_string(),
    };
    assert_eq!(
        listed(&q),
        cli.iter().map(|r| entry_of(r)).collect::<Vec<_>>()
    );
    for rel in &cli {
        let entry = q.join(entry_of(rel));
        let want = fs::read(v.join(rel)).unwrap();
        assert_eq!(fs::read(&entry).unwrap(), want, "{rel}");
        let meta = fs::metadata(&entry).unwrap();
        assert_eq!(meta.len(), want.len() as u64, "{rel}");
        assert_eq!(meta.permissions().mode() & 0o777, 0o444, "{rel}");
    }
    // Two words: all of them; a word nothing holds: an empty folder.
    assert_eq!(listed(&s.join("quick zebrafish")), ["notes.txt"]);
    assert!(listed(&s.join("okapi")).is_empty());

    // In a folder: the files under it only (no name shared there, so plain names).
    let mut under = listed(&v.join("sub/.search/zebrafish"));
    under.sort();
    assert_eq!(under, ["notes.txt", "plan.md"]);
    assert_eq!(
        fs::read(v.join("sub/.search/zebrafish/plan.md")).unwrap(),
        files[2].1
    );

    // Read-only, all of it.
    let entry = q.join("notes.txt");
    assert_erofs(fs::write(&entry, "x"), "write an entry");
    assert_erofs(
        fs::OpenOptions::new().append(true).open(&entry),
        "open an entry to append",
    );
    assert_erofs(fs::write(q.join("new.txt"), "x"), "create in a query");
    assert_erofs(fs::remove_file(&entry), "unlink an entry");
    assert_erofs(fs::create_dir(q.join("new")), "mkdir in a query");
    // Every name in `.search` is a query, so it exists already.
    let e = fs::create_dir(s.join("new")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    assert_erofs(fs::rename(&entry, v.join("n")), "move an entry out");
    assert_erofs(fs::rename(v.join("other.txt"), q.join("o")), "move in");
    assert_erofs(fs::remove_dir(&q), "rmdir a query");
    assert!(fs::create_dir(v.join(".search")).is_err());
    assert_eq!(fs::read(v.join("notes.txt")).unwrap(), files[0].1);

    // A new version: found by its new words (once indexed), no longer by the old ones (once
    // the answer kept for the query is asked again).
    fs::write(v.join("notes.txt"), b"now about narwhals\n").unwrap();
    env.wait_uploaded();
    wait_for(60, "the new version to be indexed", || {
        listed(&s.join("narwhals")) == ["notes.txt"]
    });
    assert_eq!(
        fs::read(s.join("narwhals/notes.txt")).unwrap(),
        b"now about narwhals\n"
    );
    wait_for(30, "the old words to be gone", || listed(&q).len() == 3);
    // One notes.txt is left among the files found: its plain name again.
    let mut shown = listed(&q);
    shown.sort();
    assert_eq!(shown, ["notes.txt", "plan.md", "report.pdf"]);
    assert_eq!(
        fs::read(q.join("notes.txt")).unwrap(),
        b"zebrafish zebrafish in a folder\n"
    );
    m.unmount();
}
