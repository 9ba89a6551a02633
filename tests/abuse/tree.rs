//! The tree against names in another Unicode spelling (issue 31): a copy or move "into itself"
//! or "onto itself" is decided by nodes, not by path text; and a cycle of parents that an older
//! build left is survived by a real `vaultfs serve` and found and mended by `vaultfs check`.
//! Every request is bounded by a timeout, so a regression fails instead of hanging.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};

use super::{BIN, serve};
use crate::common::{self, Creds};

const VAULT: &str = "/nodes/pth/Acme/My%20First%20Vault";
const VAULT_URI: &str = "/nodes/pth/Acme/My First Vault";

/// A `vaultfs serve` process, killed when dropped (a test that fails leaves none behind).
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real server over `dir` (whose store has alice in account Acme), and her login.
async fn start(dir: &Path, n: usize) -> (Served, String, Creds) {
    let port = common::free_port();
    let server = Served(serve(dir, port, n));
    let base = format!("http://127.0.0.1:{port}");
    let token = common::login(&base, "alice@example.com", "pw-alice@example.com").await;
    let who = Creds {
        email: "alice@example.com".into(),
        token,
    };
    (server, base, who)
}

/// A store in `dir` with alice in Acme, and bob in another account.
fn new_store(dir: &Path) {
    let store = vaultfs::store::Store::open(dir, Default::default()).unwrap();
    store
        .add_user("alice@example.com", "Acme", "pw-alice@example.com")
        .unwrap();
    store
        .add_user("bob@example.com", "Bobs", "pw-bob@example.com")
        .unwrap();
}

/// Every request here gives up after this long: what the defects made hang fails instead.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A JSON request as `who`: the status and the body (`"timed out"` when none came in time).
async fn call(
    base: &str,
    who: &Creds,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    match http()
        .request(method, format!("{base}{path}"))
        .basic_auth(&who.email, Some(&who.token))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => {
            let st = r.status().as_u16();
            (st, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) if e.is_timeout() => (0, json!("timed out")),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// The bytes of file `id` (or the status and what came instead).
async fn download(base: &str, who: &Creds, id: &str) -> Result<Vec<u8>, String> {
    match http()
        .get(format!("{base}/files/id/Document/{id}"))
        .basic_auth(&who.email, Some(&who.token))
        .send()
        .await
    {
        Ok(r) if r.status() == 200 => Ok(r.bytes().await.unwrap().to_vec()),
        Ok(r) => Err(format!(
            "{}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        )),
        Err(e) if e.is_timeout() => Err("timed out".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The names in the folder at `path` (encoded).
async fn names(base: &str, who: &Creds, path: &str) -> Vec<String> {
    let (st, v) = call(
        base,
        who,
        reqwest::Method::GET,
        &format!("{path}?children=1"),
        json!({}),
    )
    .await;
    assert_eq!(st, 200, "{path}: {v}");
    let mut names: Vec<String> = v["message"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// `GET /healthz` answers 200 within the timeout.
async fn healthy(base: &str) -> bool {
    matches!(http().get(format!("{base}/healthz")).send().await, Ok(r) if r.status() == 200)
}

/// Folders `è` and `è/sub` (made in NFC) and a file `è/f.txt`; its ID.
async fn folders(base: &str, who: &Creds) -> String {
    for f in ["%C3%A8", "%C3%A8/sub"] {
        let (st, v) = call(
            base,
            who,
            reqwest::Method::PUT,
            &format!("{VAULT}/{f}"),
            json!({}),
        )
        .await;
        assert_eq!(st, 200, "{f}: {v}");
    }
    common::upload(
        &http(),
        base,
        who,
        &format!("{VAULT}/%C3%A8"),
        "f.txt",
        b"inside",
    )
    .await
}

/// The first case: a copy of `è` into `e\u{300}/sub` (the same folder, decomposed)
/// ran forever under the store's lock (other accounts and `/healthz` timed out, the WAL grew
/// without bound). Now it is 400 `move_into_self` at once, and nothing was made.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_into_itself_under_another_spelling_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    new_store(&dir);
    let (_server, base, who) = start(&dir, 1).await;
    folders(&base, &who).await;
    for dst in ["e\u{300}/sub/c", "\u{e8}/sub/c", "e\u{300}/c"] {
        let (st, v) = call(
            &base,
            &who,
            reqwest::Method::POST,
            &format!("{VAULT}/%C3%A8"),
            json!({"copy": {"dst_uri": format!("{VAULT_URI}/{dst}"), "replace": "fail"}}),
        )
        .await;
        assert_eq!(
            (st, v["error"]["error_name"].as_str()),
            (400, Some("move_into_self")),
            "copy into {dst:?}: {v}"
        );
    }
    assert!(healthy(&base).await, "/healthz did not answer");
    let bob = Creds {
        email: "bob@example.com".into(),
        token: common::login(&base, "bob@example.com", "pw-bob@example.com").await,
    };
    assert_eq!(
        names(&base, &bob, "/nodes/pth/Bobs/My%20First%20Vault").await,
        Vec::<String>::new()
    );
    assert_eq!(
        names(&base, &who, &format!("{VAULT}/%C3%A8/sub")).await,
        Vec::<String>::new()
    );
    assert_eq!(
        names(&base, &who, &format!("{VAULT}/%C3%A8")).await,
        ["f.txt", "sub"]
    );
}

/// The second case: the same as a move answered 200 and made a cycle of parents: the
/// folder and its files left the vault for good, and a download by ID of a file inside hung
/// the server. Now 400 `move_into_self`, and everything stays where it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_move_into_itself_under_another_spelling_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    new_store(&dir);
    let (server, base, who) = start(&dir, 1).await;
    let id = folders(&base, &who).await;
    let (st, v) = call(
        &base,
        &who,
        reqwest::Method::POST,
        &format!("{VAULT}/%C3%A8"),
        json!({"move": {"dst_uri": format!("{VAULT_URI}/e\u{300}/sub/c"), "replace": "fail"}}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["error_name"].as_str()),
        (400, Some("move_into_self")),
        "{v}"
    );
    assert_eq!(names(&base, &who, VAULT).await, ["\u{e8}"]);
    assert_eq!(download(&base, &who, &id).await, Ok(b"inside".to_vec()));
    assert!(healthy(&base).await, "/healthz did not answer");
    drop(server);
    let out = check(&dir, &[]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The third case: a copy of `u\u{308}-copy.txt` onto `ü-copy.txt` (one file) with
/// `replace` deleted the source as the destination and answered 200 with an empty file; as a
/// move it was a 500. Onto itself, a copy is now a no-op (409 `exists` without `replace`) and a
/// move changes nothing; the bytes stay.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_or_move_onto_itself_under_another_spelling_keeps_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    new_store(&dir);
    let (server, base, who) = start(&dir, 1).await;
    let data = b"the file itself".to_vec();
    let id = common::upload(&http(), &base, &who, VAULT, "\u{fc}-copy.txt", &data).await;
    let dst = format!("{VAULT_URI}/\u{fc}-copy.txt");
    for (op, replace, want) in [
        ("copy", "replace", (200, None)),
        ("copy", "fail", (409, Some("exists"))),
        ("move", "replace", (200, None)),
        ("move", "fail", (200, None)),
    ] {
        let (st, v) = call(
            &base,
            &who,
            reqwest::Method::POST,
            &format!("{VAULT}/u%CC%88-copy.txt"),
            json!({op: {"dst_uri": dst, "replace": replace}}),
        )
        .await;
        assert_eq!(
            (st, v["error"]["error_name"].as_str()),
            want,
            "{op} {replace}: {v}"
        );
        assert_eq!(
            download(&base, &who, &id).await,
            Ok(data.clone()),
            "after {op} {replace}"
        );
        assert_eq!(names(&base, &who, VAULT).await, ["\u{fc}-copy.txt"]);
    }
    drop(server);
    let out = check(&dir, &[]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `vaultfs check --data-dir DIR` with `extra` arguments, bounded in time.
fn check(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("check").arg("--data-dir").arg(dir).args(extra);
    common::env::within(120, "vaultfs check", move || cmd.output().unwrap())
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A cycle of parents as older builds left it (planted in the database, the server killed),
/// and an orphan (a file whose parent row is gone, written with foreign keys off): a restarted
/// server answers (a download by ID of a file in the cycle is 404 at once, not a hang);
/// `vaultfs check` finds both and exits non-zero; `--repair` moves them into `lost+found` of
/// the account's vault, and the server then serves the files again, by ID and by path.
#[tokio::test(flavor = "multi_thread")]
async fn check_finds_and_repairs_a_cycle_an_older_build_left() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    new_store(&dir);
    let (server, base, who) = start(&dir, 1).await;
    let id = folders(&base, &who).await;
    let deep = common::upload(
        &http(),
        &base,
        &who,
        &format!("{VAULT}/%C3%A8/sub"),
        "g.txt",
        b"deeper",
    )
    .await;
    let stray = common::upload(&http(), &base, &who, VAULT, "stray.txt", b"astray").await;
    drop(server);

    // What the move into itself did before: `è` under its own `sub` as `c`; and `stray.txt` under a
    // folder that is no more.
    {
        let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
        conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
        let folder = |name: &str| -> i64 {
            conn.query_row("SELECT id FROM nodes WHERE name = ?1", [name], |r| r.get(0))
                .unwrap()
        };
        let (top, sub) = (folder("\u{e8}"), folder("sub"));
        conn.execute(
            "UPDATE nodes SET parent_id = ?1, name = 'c' WHERE id = ?2",
            [sub, top],
        )
        .unwrap();
        conn.execute(
            "UPDATE nodes SET parent_id = 999999 WHERE id = ?1",
            [stray.parse::<i64>().unwrap()],
        )
        .unwrap();
    }

    // A server on it answers, and what no root reaches is simply not found.
    let (server, base, who) = start(&dir, 2).await;
    for f in [&id, &deep, &stray] {
        let got = download(&base, &who, f).await;
        assert!(
            got.as_ref().is_err_and(|e| e.starts_with("404")),
            "file {f}: {got:?}"
        );
    }
    assert!(healthy(&base).await, "/healthz did not answer");
    assert_eq!(names(&base, &who, VAULT).await, Vec::<String>::new());
    drop(server);

    // fsck(8)'s exit codes: 4 a problem remains, 1 all repaired, 0 nothing found.
    let out = check(&dir, &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains("a cycle of parents"), "{said}");
    assert!(
        said.contains("has parent 999999, which does not exist"),
        "{said}"
    );
    let out = check(&dir, &["--repair"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("lost+found"), "{said}");
    let out = check(&dir, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let (_server, base, who) = start(&dir, 3).await;
    assert_eq!(names(&base, &who, VAULT).await, ["lost+found"]);
    assert_eq!(
        names(&base, &who, &format!("{VAULT}/lost+found")).await,
        ["c", "stray.txt"]
    );
    assert_eq!(download(&base, &who, &id).await, Ok(b"inside".to_vec()));
    assert_eq!(download(&base, &who, &deep).await, Ok(b"deeper".to_vec()));
    assert_eq!(download(&base, &who, &stray).await, Ok(b"astray".to_vec()));
    assert_eq!(
        names(&base, &who, &format!("{VAULT}/lost+found/c/sub")).await,
        ["g.txt"]
    );
    // Reachable, it can be deleted again.
    let (st, v) = call(
        &base,
        &who,
        reqwest::Method::DELETE,
        &format!("{VAULT}/lost+found/c"),
        json!({}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// Bytes that no longer match their hash (the disk changed them) are named by `vaultfs check`,
/// which exits non-zero; put back, the check passes.
#[tokio::test(flavor = "multi_thread")]
async fn check_finds_bytes_that_do_not_match_their_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    new_store(&dir);
    let (server, base, who) = start(&dir, 1).await;
    common::upload(&http(), &base, &who, VAULT, "a.txt", b"the right bytes").await;
    drop(server);
    let hash: String = rusqlite::Connection::open(dir.join("vault.db"))
        .unwrap()
        .query_row("SELECT hash FROM blobs", [], |r| r.get(0))
        .unwrap();
    let blob = dir.join("blobs").join(&hash[..2]).join(&hash);
    assert_eq!(std::fs::read(&blob).unwrap(), b"the right bytes");
    std::fs::write(&blob, b"the wrong bytes").unwrap();
    let out = check(&dir, &["--repair"]);
    let said = text(&out);
    assert_eq!(
        out.status.code(),
        Some(4),
        "bad bytes are not repaired: {said}"
    );
    assert!(
        said.contains(&format!("blob {hash}: its bytes hash to")),
        "{said}"
    );
    std::fs::write(&blob, b"the right bytes").unwrap();
    let out = check(&dir, &[]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The same cycle of parents with the metadata in PostgreSQL: its walks are bounded the same
/// (a file in the cycle is not found, at once), and the store's check names the cycle.
#[test]
fn walks_of_a_cycle_end_on_postgresql_too() {
    use vaultfs::api::{ErrorKind, NodePath};
    use vaultfs::store::{Scope, Store, StoreConfig, TransferMode};
    let Some(pg) = common::pg::pg() else {
        return;
    };
    let url = pg.database();
    let tmp = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(
        Store::open(
            &tmp.path().join("data"),
            StoreConfig {
                database: Some(url.clone()),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    store.ensure_account("Acme").unwrap();
    let at = |rel: &str| NodePath::parse_uri(&format!("{VAULT_URI}/{rel}")).unwrap();
    store.create_folder(Scope::All, &at("a")).unwrap();
    store.create_folder(Scope::All, &at("a/b")).unwrap();
    let f = store.create_file(Scope::All, &at("a/b"), "f.txt").unwrap();
    let f = f.id.unwrap();
    // Planted as an older build's move into itself left it.
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.execute(
            "UPDATE nodes SET parent_id = (SELECT id FROM nodes WHERE name = 'b')
             WHERE name = 'a'",
            &[],
        )
        .unwrap();
    })
    .join()
    .unwrap();
    let s = store.clone();
    let found = common::env::within(30, "a file in a cycle, by ID", move || {
        s.file(Scope::All, &f).map_err(|e| e.kind)
    });
    assert_eq!(found.unwrap_err(), ErrorKind::NotFound);
    let problems = store.check_integrity().unwrap();
    assert!(
        problems.iter().any(|p| p.contains("a cycle of parents")),
        "{problems:?}"
    );
    store.create_folder(Scope::All, &at("c")).unwrap();
    store
        .transfer(Scope::All, &at("c"), &at("d"), false, TransferMode::Move)
        .unwrap();
}
