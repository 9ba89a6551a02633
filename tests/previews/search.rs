//! Full-text search (issue 35, item 1) through `GET /search` of a real server on loopback, two
//! accounts: text and PDF found, the index following new versions, restores, moves (one over a
//! file too) and deletes (a deleted file kept restorable is not found until restored), and
//! another account's files never found.

use std::time::{Duration, Instant};

use super::put;
use crate::common;
use crate::common::fixtures::pdf;
use vaultfs::api::{ErrorKind, NodePath, SearchResults};
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::server::ServerOptions;
use vaultfs::store::Scope;

fn p(s: &str) -> NodePath {
    NodePath::parse_uri(s).unwrap()
}

async fn find(b: &RemoteBackend, q: &str) -> SearchResults {
    b.search(&NodePath::root(), q, 50).await.unwrap()
}

async fn find_uris(b: &RemoteBackend, q: &str) -> Vec<String> {
    find(b, q).await.hits.into_iter().map(|h| h.uri).collect()
}

/// The URIs found for `q` once there are `n` (within 60 s: the index is made in idle time).
async fn found(b: &RemoteBackend, q: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = find(b, q).await;
        if r.hits.len() == n {
            return r.hits.into_iter().map(|h| h.uri).collect();
        }
        assert!(Instant::now() < deadline, "{q}: {r:?} after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Alice (account Acme) and Bob (account Bobco), users of `s`, each through the remote backend.
pub(crate) async fn alice_and_bob(s: &common::TestServer) -> (RemoteBackend, RemoteBackend) {
    let remote_of = |c: &common::Creds| {
        RemoteBackend::new(RemoteConfig::new(&s.base, &c.email, &c.token)).unwrap()
    };
    let alice = remote_of(&s.user("alice@example.com", "Acme").await);
    let bob = remote_of(&s.user("bob@example.com", "Bobco").await);
    (alice, bob)
}

#[tokio::test(flavor = "multi_thread")]
async fn search_finds_text_and_pdfs_of_ones_own_account_as_the_tree_is() {
    // As `vaultfs serve` runs: earlier versions and deleted files kept.
    let s =
        common::TestServer::start_with(common::served_retention(), ServerOptions::default()).await;
    let (alice, bob) = alice_and_bob(&s).await;
    let acme = p("/nodes/pth/Acme/My First Vault");
    let bobco = p("/nodes/pth/Bobco/My First Vault");
    put(
        &alice,
        &acme,
        "notes.md",
        b"# Notes\n\nThe quick zebrafish swims.\nOther line.\n",
    )
    .await;
    let report = pdf(&["BT /F1 12 Tf 72 700 Td (Quarterly okapi figures) Tj ET".into()]);
    put(&alice, &acme, "report.pdf", &report).await;
    put(&bob, &bobco, "mine.txt", b"bob keeps zebrafish too").await;

    assert_eq!(
        found(&alice, "zebrafish", 1).await,
        ["/nodes/pth/Acme/My First Vault/notes.md"]
    );
    let hit = &find(&alice, "ZEBRAFISH quick").await.hits[0];
    assert!(hit.context.contains("quick zebrafish swims"), "{hit:?}");
    assert_eq!(
        found(&bob, "zebrafish", 1).await,
        ["/nodes/pth/Bobco/My First Vault/mine.txt"],
        "another account's file was found"
    );
    assert_eq!(
        found(&alice, "okapi", 1).await,
        ["/nodes/pth/Acme/My First Vault/report.pdf"],
        "a PDF's text"
    );
    assert!(find(&bob, "okapi").await.hits.is_empty());
    // A folder of another account is refused, as a listing of it is.
    let e = bob.search(&acme, "okapi", 10).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Forbidden, "{e}");

    // A new version: its words are found, the old ones are not.
    put_version(
        &alice,
        "/nodes/pth/Acme/My First Vault/notes.md",
        b"now about narwhals",
    )
    .await;
    found(&alice, "narwhals", 1).await;
    assert!(find(&alice, "zebrafish").await.hits.is_empty());
    // The earlier version restored: its words again, at once (its text was kept with its
    // bytes), and back to the newer one.
    let notes = alice
        .node(&p("/nodes/pth/Acme/My First Vault/notes.md"))
        .await
        .unwrap()
        .file_id()
        .unwrap();
    let kept = s.store.versions(Scope::All, &notes).unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    s.store
        .restore_version(Scope::All, &notes, &kept[1].version_id)
        .unwrap();
    assert_eq!(find(&alice, "zebrafish").await.hits.len(), 1);
    assert!(find(&alice, "narwhals").await.hits.is_empty());
    s.store
        .restore_version(Scope::All, &notes, &kept[0].version_id)
        .unwrap();
    assert_eq!(find(&alice, "narwhals").await.hits.len(), 1);
    // A move: found where it is now, at once.
    alice
        .create_folder(&p("/nodes/pth/Acme/My First Vault/sea"))
        .await
        .unwrap();
    let moved = "/nodes/pth/Acme/My First Vault/sea/narwhals.md";
    alice
        .rename(
            &p("/nodes/pth/Acme/My First Vault/notes.md"),
            &p(moved),
            false,
        )
        .await
        .unwrap();
    assert_eq!(found(&alice, "narwhals", 1).await, [moved]);
    let under = alice
        .search(&p("/nodes/pth/Acme/My First Vault/sea"), "narwhals", 10)
        .await
        .unwrap();
    assert_eq!(under.hits.len(), 1);
    let elsewhere = alice
        .search(&p("/nodes/pth/Acme/My First Vault/sea"), "okapi", 10)
        .await
        .unwrap();
    assert!(elsewhere.hits.is_empty(), "{elsewhere:?}");
    // A file moved over it (an editor's save by rename): the file under the name is found by
    // the bytes moved in, at once; the words they replaced (an earlier version now) are not.
    let sea = p("/nodes/pth/Acme/My First Vault/sea");
    put(&alice, &sea, "draft.md", b"a walrus draft").await;
    assert_eq!(
        found(&alice, "walrus", 1).await,
        ["/nodes/pth/Acme/My First Vault/sea/draft.md"]
    );
    alice
        .rename(
            &p("/nodes/pth/Acme/My First Vault/sea/draft.md"),
            &p(moved),
            true,
        )
        .await
        .unwrap();
    assert_eq!(find_uris(&alice, "walrus").await, [moved]);
    assert!(find(&alice, "narwhals").await.hits.is_empty());
    // A delete: gone at once, though the file is kept restorable; restored, found again.
    alice.delete(&p(moved)).await.unwrap();
    assert!(find(&alice, "walrus").await.hits.is_empty());
    let gone = s.store.deleted_files(Scope::All, &sea).unwrap();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(
        alice
            .search(&sea, "walrus", 10)
            .await
            .unwrap()
            .hits
            .is_empty()
    );
    s.store.restore_deleted(Scope::All, &gone[0].id).unwrap();
    assert_eq!(find_uris(&alice, "walrus").await, [moved]);
    alice.delete(&p(moved)).await.unwrap();
    assert!(find(&alice, "walrus").await.hits.is_empty());
    assert!(s.store.check_integrity().unwrap().is_empty());
}

async fn put_version(b: &RemoteBackend, path: &str, data: &[u8]) {
    let id = b.node(&p(path)).await.unwrap().file_id().unwrap();
    let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    b.upload(&id, &vid, data.len() as u64, super::once(data.to_vec()))
        .await
        .unwrap();
}

/// The target of issue 35: a word query over 10,000 documents (text and PDF) of the built-in
/// store answers in under 100 ms. Measured, not part of the usual run (it stores 10,000 files
/// and indexes them): `cargo test --release --test previews search_of_10000 -- --ignored
/// --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn search_of_10000_documents_answers_in_under_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(vaultfs::store::Store::open_local(dir.path()).unwrap());
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
    let b = vaultfs::backend::local::LocalBackend::new(store.clone());
    let vault = super::vault();
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let started = Instant::now();
    for i in 0..10_000usize {
        let w = words[i % words.len()];
        if i % 50 == 0 {
            let page = format!("BT /F1 12 Tf 72 700 Td (report {i} about {w} and okapi) Tj ET");
            put(&b, &vault, &format!("doc{i}.pdf"), &pdf(&[page])).await;
        } else {
            let text = format!("document {i}\n{w} notes on line two\nkeyword{i} {w} okapi\n");
            put(&b, &vault, &format!("doc{i}.txt"), text.as_bytes()).await;
        }
    }
    eprintln!("stored 10,000 files in {:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(1800);
    while store.search_backlog().unwrap() > 0 {
        assert!(Instant::now() < deadline, "not indexed after 30 min");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("indexed after {:?}", started.elapsed());
    let root = NodePath::root();
    let mut times = Vec::new();
    for q in ["okapi", "delta", "keyword4242", "report", "delta okapi"] {
        for _ in 0..5 {
            let t = Instant::now();
            let r = b.search(&root, q, 50).await.unwrap();
            times.push(t.elapsed());
            assert!(!r.hits.is_empty(), "{q}");
        }
    }
    times.sort();
    let (median, worst) = (times[times.len() / 2], times[times.len() - 1]);
    eprintln!("word query over 10,000 documents: median {median:?}, slowest {worst:?}");
    // The median is held to the target: the slowest of 25 (a query matching every document,
    // ranked whole) came within 10% of it in a debug build on a machine loaded eight-fold.
    assert!(median < Duration::from_millis(100), "median {median:?}");
}

/// The built-in store in `dir`, its previews (and indexer) running, and a backend on it.
fn built_in_store(
    dir: &std::path::Path,
) -> (
    std::sync::Arc<vaultfs::store::Store>,
    vaultfs::backend::local::LocalBackend,
) {
    let store = std::sync::Arc::new(vaultfs::store::Store::open_local(dir).unwrap());
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
    let b = vaultfs::backend::local::LocalBackend::new(store.clone());
    (store, b)
}

/// Waits until `store` has indexed everything stored.
async fn indexed(store: &vaultfs::store::Store) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.search_backlog().unwrap() > 0 {
        assert!(Instant::now() < deadline, "not indexed after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `vaultfs search --data-dir DIR ARGS...`: what it prints (it must succeed).
fn search_cli(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(common::mount::BIN)
        .arg("search")
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `vaultfs search` on the built-in store: paths with a line of context, `--json`, a folder.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_prints_paths_with_context_and_json() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, b) = built_in_store(dir.path());
        put(
            &b,
            &super::vault(),
            "a.txt",
            b"first line\nthe okapi grazes here\n",
        )
        .await;
        put(&b, &super::vault(), "b.txt", b"nothing to see").await;
        indexed(&store).await;
    }
    let run = |args: &[&str]| search_cli(dir.path(), args);
    assert_eq!(
        run(&["okapi"]),
        "/Local/My First Vault/a.txt\n    first line the okapi grazes here\n"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["--json", "okapi"])).unwrap();
    assert_eq!(
        json["hits"][0]["uri"],
        "/nodes/pth/Local/My First Vault/a.txt"
    );
    assert_eq!(json["more"], false);
    assert_eq!(
        run(&["/Local/My First Vault", "okapi", "grazes"])
            .lines()
            .count(),
        2
    );
    assert_eq!(run(&["nothing", "okapi"]), "");
    // Stored with no mount or server to index it: not found yet, and the CLI says why.
    {
        let store = std::sync::Arc::new(vaultfs::store::Store::open_local(dir.path()).unwrap());
        let b = vaultfs::backend::local::LocalBackend::new(store);
        put(&b, &super::vault(), "c.txt", b"a late okapi").await;
    }
    let out = std::process::Command::new(common::mount::BIN)
        .args(["search", "--data-dir"])
        .arg(dir.path())
        .arg("okapi")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, run(&["okapi"]).as_bytes());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "(1 file(s) not indexed yet: a mount or `vaultfs serve` of this store indexes them \
         while it is idle)\n"
    );
}

/// `vaultfs search` prints a document's words with the escape sequences and bidi controls in
/// them made visible, never raw (issue 47, item 13: before, a document holding `ESC ] 52` set
/// the terminal's clipboard and `ESC [ 2 J` cleared the screen when its line of context was
/// printed); other text, any script, is printed as it is. `--json` holds none raw either.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_prints_escape_sequences_in_documents_visibly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, b) = built_in_store(dir.path());
        let text = "Grüße okapi \u{1b}]52;c;b3duZWQ=\u{7}\u{1b}[2J \u{9b}31m \u{202e}gnp.exe\n";
        put(&b, &super::vault(), "hostile.txt", text.as_bytes()).await;
        indexed(&store).await;
    }
    let run = |args: &[&str]| search_cli(dir.path(), args);
    let raw = |s: &str| {
        s.chars()
            .any(|c| matches!(c, '\u{1b}' | '\u{7}' | '\u{9b}' | '\u{202e}'))
    };
    let lines = run(&["okapi"]);
    assert!(!raw(&lines), "{lines:?}");
    assert!(
        lines.starts_with("/Local/My First Vault/hostile.txt\n    "),
        "{lines:?}"
    );
    assert!(lines.contains("Grüße okapi"), "{lines:?}");
    assert!(
        lines.contains("\\x1b]52;c;b3duZWQ=\\x07\\x1b[2J"),
        "{lines:?}"
    );
    assert!(lines.contains("\\u{202e}gnp.exe"), "{lines:?}");
    let json = run(&["--json", "okapi"]);
    assert!(!raw(&json), "{json:?}");
    // The same words, read back from the JSON.
    let found: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        found["hits"][0]["context"]
            .as_str()
            .unwrap()
            .contains("\u{202e}gnp.exe"),
        "{found}"
    );
}
