//! The store's own tests: changes seen across processes on one folder.

use super::*;

/// Two stores of one folder (ours, another process's), and the vault both see.
fn two_stores(tmp: &tempfile::TempDir) -> (PathBuf, Store, Store, crate::api::NodePath) {
    let dir = tmp.path().join("store");
    let (ours, theirs) = (
        Store::open_local(&dir).unwrap(),
        Store::open_local(&dir).unwrap(),
    );
    let vault = crate::api::NodePath::from_segments(["Local", "My First Vault"]).unwrap();
    (dir, ours, theirs, vault)
}

/// A commit on a connection of its own that changes no file (as the search indexer's).
fn commit_of_no_change(dir: &Path, i: u64) {
    let raw = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
    raw.execute(
        "INSERT INTO search_docs (blob, status) VALUES (?1, 2)",
        [format!("not-a-blob-{i}")],
    )
    .unwrap();
}

/// Another process's commit counts at once, also when the answer comes from the
/// wal-index's header (no transaction); our own commits never count, nor others' that
/// change no file (the search indexer's). (An ask that finds
/// the connection busy answers what it read last: asked until the connection was free,
/// well within the header's 500 ms of trust.)
#[test]
fn foreign_commits_count_others_at_once_and_never_ours() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ours, theirs, vault) = two_stores(&tmp);
    let settled = |want: u64| {
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        loop {
            let got = ours.foreign_commits();
            if got == want || std::time::Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // The first ask that finds the connection free maps the wal-index.
    for _ in 0..100 {
        ours.foreign_commits();
        if ours.wal_index.get().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = ours.foreign_commits();
    assert!(
        matches!(ours.wal_index.get(), Some(Some(_))),
        "the wal-index is read"
    );
    for i in 0..3 {
        // Asked again with nothing committed: the header's answer.
        assert_eq!(ours.foreign_commits(), first + i);
        ours.create_folder(Scope::All, &vault.child(&format!("ours{i}")).unwrap())
            .unwrap();
        assert_eq!(ours.foreign_commits(), first + i, "our own commit");
        theirs
            .create_folder(Scope::All, &vault.child(&format!("theirs{i}")).unwrap())
            .unwrap();
        assert_eq!(
            settled(first + i + 1),
            first + i + 1,
            "their commit, at once"
        );
        let read_before = relock(&ours.foreign_read).data_version;
        commit_of_no_change(&dir, i);
        // Asked until an ask found the connection free and read the commit.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while relock(&ours.foreign_read).data_version == read_before {
            assert!(
                std::time::Instant::now() < deadline,
                "the commit is never read"
            );
            ours.foreign_commits();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            ours.foreign_commits(),
            first + i + 1,
            "a commit that changes no file"
        );
    }
}

/// Our own change followed by another connection's commit that changes no file (the
/// previews', the search indexer's): nobody else's change. It counted as one, so each
/// delete of an `rm -rf` while previews were made fetched the folder's listing again.
#[test]
fn our_change_then_a_commit_that_changes_no_file_is_no_foreign_change() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ours, theirs, vault) = two_stores(&tmp);
    // Asked until an ask found the connection free and read what was committed.
    let read_all = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let before = relock(&ours.foreign_read).data_version;
        loop {
            let n = ours.foreign_commits();
            if relock(&ours.foreign_read).data_version != before {
                return n;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the commit is never read"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while relock(&ours.foreign_read).data_version.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the log is never read"
        );
        ours.foreign_commits();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut count = ours.foreign_commits();
    for i in 0..3 {
        ours.create_folder(Scope::All, &vault.child(&format!("ours{i}")).unwrap())
            .unwrap();
        commit_of_no_change(&dir, i);
        assert_eq!(read_all(), count, "our change, then a commit of no change");
        // Theirs still counts, also right after ours.
        ours.create_folder(Scope::All, &vault.child(&format!("again{i}")).unwrap())
            .unwrap();
        theirs
            .create_folder(Scope::All, &vault.child(&format!("theirs{i}")).unwrap())
            .unwrap();
        count += 1;
        assert_eq!(read_all(), count, "their change after ours");
    }
}

#[test]
fn a_new_key_made_by_several_at_once_is_one_whole_key() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("pin.key");
    let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| secret_key(&path).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(keys.iter().all(|k| *k == keys[0]));
    assert_eq!(std::fs::read(&path).unwrap(), keys[0]);
    // Nothing but the key is left beside it.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}
