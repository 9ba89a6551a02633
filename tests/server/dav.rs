//! WebDAV at `/dav/` (issue 50), driven by real clients against a real server on loopback:
//! litmus (the WebDAV protocol suites), rclone's webdav backend (a tree copied in and out,
//! `rclone check --download` clean), and plain requests for what a user relies on (a PUT is a
//! new version, a stale `If-Match` is 412 and changes nothing, a DELETE goes to the deleted
//! files, no password over plain HTTP from elsewhere).
//!
//! The clients are Debian's packages, which `.ci/run` installs; a test whose client is missing
//! says so and passes without running (only where the binary is absent).

use std::path::Path;
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::common::dav_clients::{Davfs, cadaver_netrc, davfs_can_mount, output};
pub(super) use super::common::dav_clients::{installed, rclone_remote};
use super::common::{Creds, TestServer, md5hex, pattern, served_retention};
use super::{Api, setup};

/// The vault every test works in, as WebDAV names it.
pub(super) const DAV_VAULT: &str = "/dav/Acme/My%20First%20Vault";

/// A LOCK's body: an exclusive write lock, no owner.
const EXCLUSIVE_LOCK: &str = r#"<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope>
<D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>"#;

/// A WebDAV request with Basic credentials (a token or an app password).
pub(super) fn dav(
    s: &TestServer,
    creds: &Creds,
    method: &str,
    path: &str,
) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(Method::from_bytes(method.as_bytes()).unwrap(), s.url(path))
        .basic_auth(&creds.email, Some(&creds.token))
}

/// Runs a command on a blocking thread (the server runs on this runtime); its status and output.
pub(super) async fn run(cmd: Command) -> (bool, String) {
    tokio::task::spawn_blocking(move || output(cmd))
        .await
        .unwrap()
}

/// The API's listing of a folder under the vault: name -> node.
pub(super) async fn listed(
    s: &TestServer,
    creds: &Creds,
    folder: &str,
) -> serde_json::Map<String, Value> {
    let v: Value = reqwest::Client::new()
        .get(s.url(&format!(
            "/nodes/pth/Acme/My%20First%20Vault{folder}?children=1"
        )))
        .basic_auth(&creds.email, Some(&creds.token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["message"]["children"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c.clone()))
        .collect()
}

/// The tree rclone copies: nested folders, an empty file, names with spaces and accents, and a
/// file of several MiB (more than one write batch of the server).
fn make_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("a.txt".to_string(), b"hello\n".to_vec()),
        ("empty".to_string(), Vec::new()),
        ("sub dir/été.md".to_string(), pattern(10_000, 1)),
        ("sub dir/deeper/big.bin".to_string(), pattern(5 << 20, 2)),
        ("sub dir/deeper/x y z".to_string(), pattern(1, 3)),
    ];
    for (name, data) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn rclone_copies_a_tree_in_and_out() {
    if !installed("rclone") {
        return;
    }
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let back = tmp.path().join("back");
    let files = make_tree(&src);
    let url = s.url(&format!("{DAV_VAULT}/"));
    let signed_in = (creds.email.as_str(), creds.token.as_str());
    let rclone = rclone_remote(tmp.path(), url, signed_in, Vec::new());
    let src_s = src.to_str().unwrap();
    let back_s = back.to_str().unwrap();
    let (ok, out) = run(rclone(&["copy", src_s, "vault:tree"])).await;
    assert!(ok, "rclone copy in: {out}");
    // Every byte compared, not only sizes (the webdav backend has no hashes from us).
    let (ok, out) = run(rclone(&["check", "--download", src_s, "vault:tree"])).await;
    assert!(ok, "rclone check: {out}");
    let (ok, out) = run(rclone(&["copy", "vault:tree", back_s])).await;
    assert!(ok, "rclone copy out: {out}");
    for (name, data) in &files {
        let got = std::fs::read(back.join(name)).unwrap();
        assert!(got == *data, "{name} came back changed");
    }
    // Stored as any upload: the API lists the files with their md5s.
    let deeper = listed(&s, &creds, "/tree/sub%20dir/deeper").await;
    assert_eq!(
        deeper["big.bin"]["md5_checksum"],
        md5hex(&pattern(5 << 20, 2))
    );
    assert_eq!(deeper["big.bin"]["size"], 5 << 20);
    // A second copy of an unchanged tree sends nothing and changes nothing.
    let (ok, out) = run(rclone(&["check", "--download", src_s, "vault:tree"])).await;
    assert!(ok, "rclone check after: {out}");
    // Into a folder two levels below what exists: rclone makes the missing ones when the
    // server answers MKCOL and PUT there with 409 (it took a 405 for "there already", and every
    // file failed).
    let (ok, out) = run(rclone(&["copy", src_s, "vault:new/deeper/tree"])).await;
    assert!(ok, "rclone copy into missing folders: {out}");
    let (ok, out) = run(rclone(&[
        "check",
        "--download",
        src_s,
        "vault:new/deeper/tree",
    ]))
    .await;
    assert!(ok, "rclone check of the new folders: {out}");
    // rclone's listing of the account's collection shows the vault.
    let mut c = rclone(&["lsf", "vault:"]);
    c.env("RCLONE_CONFIG_VAULT_URL", s.url("/dav/Acme/"));
    let (ok, out) = run(c).await;
    assert!(ok && out.lines().any(|l| l == "My First Vault/"), "{out}");
}

/// MKCOL and PUT below a folder that is not there are 409 (RFC 4918 9.3.1 and 9.7.1), and make
/// nothing; once the folder is made, both work.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_parent_is_a_conflict() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let status = |r: reqwest::Response| r.status().as_u16();
    let mkcol = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/x/y/"));
    assert_eq!(status(mkcol.send().await.unwrap()), 409);
    let put = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/q/z.txt")).body("z");
    assert_eq!(status(put.send().await.unwrap()), 409);
    let names = listed(&s, &creds, "").await;
    assert!(
        !names.contains_key("x") && !names.contains_key("q"),
        "{names:?}"
    );
    let mkcol = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/q/"));
    assert_eq!(status(mkcol.send().await.unwrap()), 201);
    let put = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/q/z.txt")).body("z");
    assert_eq!(status(put.send().await.unwrap()), 201);
    // A MKCOL of what is there is 405, as before.
    let mkcol = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/q/"));
    assert_eq!(status(mkcol.send().await.unwrap()), 405);
}

/// litmus's summary line of a suite: (run, passed, failed).
fn summary(out: &str, suite: &str) -> Option<(u32, u32, u32)> {
    let line = out
        .lines()
        .find(|l| l.contains(&format!("summary for `{suite}'")))?;
    let nums: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    // "of 16 tests run: 16 passed, 0 failed. 100.0%"
    Some((nums[0], nums[1], nums[2]))
}

#[tokio::test(flavor = "multi_thread")]
async fn litmus_suites_pass() {
    if !installed("litmus") {
        return;
    }
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let url = s.url(&format!("{DAV_VAULT}/"));
    // An app password (a token may begin with `-`, which litmus would take for an option).
    let password = s.store.add_app_password(&creds.email, "litmus").unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut results = Vec::new();
    for suite in ["basic", "copymove", "props", "locks", "http"] {
        let mut c = Command::new(format!("/usr/libexec/litmus/{suite}"));
        // Its logs (debug.log, child.log) go to the working directory: a temporary one.
        c.args(["--htdocs", "/usr/share/litmus/htdocs"])
            .args([&url, &creds.email, &password])
            .current_dir(logs.path());
        let (_, out) = run(c).await;
        let got = summary(&out, suite).unwrap_or_else(|| panic!("{suite}: no summary:\n{out}"));
        eprintln!("litmus {suite}: {got:?}");
        results.push((suite, got, out));
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, (run, passed, failed), _)| *run == 0 || passed != run || *failed > 0)
        .map(|(suite, (run, passed, _), out)| {
            format!("litmus {suite}: {passed} of {run} passed:\n{out}")
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_put_is_a_new_version_and_a_stale_if_match_is_412() {
    // As `vaultfs serve` keeps versions and deleted files by default.
    let s = TestServer::start_with(served_retention(), Default::default()).await;
    let creds = s.user("alice@example.com", "Acme").await;
    let api = super::Api::new(&s, &creds);
    let path = format!("{DAV_VAULT}/doc.txt");
    let put = |body: &'static str| dav(&s, &creds, "PUT", &path).body(body);
    let r = put("one").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let etag1 = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(etag1, format!("\"{}\"", md5hex(b"one")));
    let r = put("two").header("If-Match", &etag1).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let etag2 = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(etag2, format!("\"{}\"", md5hex(b"two")));
    // Another writer's edit began from "one": refused, nothing changed.
    let r = put("three")
        .header("If-Match", &etag1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    let r = dav(&s, &creds, "GET", &path).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag2);
    // Never a page of the site, as the API's downloads.
    assert!(
        r.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("sandbox")
    );
    assert_eq!(r.text().await.unwrap(), "two");
    // The versions are the store's: both kept, newest first.
    let (st, v) = api
        .get("/nodes/pth/Acme/My%20First%20Vault/doc.txt?vprop=1")
        .await;
    assert_eq!(st, 200, "{v}");
    let md5s: Vec<&str> = v["message"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["md5_checksum"].as_str().unwrap())
        .collect();
    assert_eq!(md5s, [md5hex(b"two"), md5hex(b"one")]);
    // If-None-Match: * on a name that exists: 412.
    let r = put("four")
        .header("If-None-Match", "*")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    // A DELETE with a stale If-Match deletes nothing; with the current one, the file goes to
    // the deleted files, restorable.
    let r = dav(&s, &creds, "DELETE", &path)
        .header("If-Match", &etag1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    let r = dav(&s, &creds, "DELETE", &path)
        .header("If-Match", &etag2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (_, v) = api
        .get("/nodes/pth/Acme/My%20First%20Vault?deleted=1")
        .await;
    let deleted: Vec<&str> = v["message"]["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, ["doc.txt"], "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_over_a_file_keeps_its_history() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let doc = format!("{DAV_VAULT}/doc.txt");
    let tmp = format!("{DAV_VAULT}/doc.txt.tmp");
    for (path, body) in [(&doc, "v1"), (&tmp, "v2")] {
        let r = dav(&s, &creds, "PUT", path)
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    let id_before = listed(&s, &creds, "").await["doc.txt"]["id"].clone();
    // An editor's save: the new bytes written aside, then moved over the document.
    let r = dav(&s, &creds, "MOVE", &tmp)
        .header("Destination", s.url(&doc))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let after = listed(&s, &creds, "").await;
    assert!(!after.contains_key("doc.txt.tmp"));
    assert_eq!(
        after["doc.txt"]["id"], id_before,
        "the document keeps its ID"
    );
    let (_, v) = api
        .get("/nodes/pth/Acme/My%20First%20Vault/doc.txt?vprop=1")
        .await;
    assert_eq!(v["message"]["versions"].as_array().unwrap().len(), 2, "{v}");
    let r = dav(&s, &creds, "GET", &doc).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "v2");
    // COPY of a folder: one copy by the store, every file there.
    let r = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/f"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/f/in.txt"))
        .body("inside")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "COPY", &format!("{DAV_VAULT}/f/"))
        .header("Destination", s.url(&format!("{DAV_VAULT}/g/")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let g = listed(&s, &creds, "/g").await;
    assert_eq!(g["in.txt"]["md5_checksum"], md5hex(b"inside"));
    // A file's dead properties go with its copy and its move.
    let r = dav(&s, &creds, "PROPPATCH", &doc)
        .body(
            r#"<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:Z="urn:x-test">
            <D:set><D:prop><Z:colour>blue</Z:colour></D:prop></D:set></D:propertyupdate>"#,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
    let r = dav(&s, &creds, "COPY", &doc)
        .header("Destination", s.url(&format!("{DAV_VAULT}/copy.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "MOVE", &format!("{DAV_VAULT}/copy.txt"))
        .header("Destination", s.url(&format!("{DAV_VAULT}/g/moved.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // The file's `colour` property, as a PROPFIND answers it.
    let colour = |file: &str| {
        dav(&s, &creds, "PROPFIND", &format!("{DAV_VAULT}/{file}"))
            .header("Depth", "0")
            .body(
                r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:Z="urn:x-test">
                <D:prop><Z:colour/></D:prop></D:propfind>"#,
            )
            .send()
    };
    let xml = colour("g/moved.txt").await.unwrap().text().await.unwrap();
    assert!(xml.contains(">blue<"), "{xml}");
    // And with a copy of the folder they are in.
    let r = dav(&s, &creds, "COPY", &format!("{DAV_VAULT}/g/"))
        .header("Destination", s.url(&format!("{DAV_VAULT}/h/")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let xml = colour("h/moved.txt").await.unwrap().text().await.unwrap();
    assert!(xml.contains(">blue<"), "{xml}");
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_is_asked_for_and_only_over_a_safe_transport() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    // No credentials: asked for them, as every WebDAV client expects.
    let r = reqwest::Client::new()
        .request(Method::from_bytes(b"PROPFIND").unwrap(), s.url("/dav/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic realm=\"vaultfs\"")
    );
    let r = reqwest::Client::new()
        .request(Method::from_bytes(b"PROPFIND").unwrap(), s.url("/dav/"))
        .basic_auth(&creds.email, Some("not-the-token"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The root lists the caller's account.
    let r = dav(&s, &creds, "PROPFIND", "/dav/")
        .header("Depth", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
    let xml = r.text().await.unwrap();
    assert!(xml.contains("/dav/Acme/"), "{xml}");

    // Behind a trusted proxy: only what came to it over HTTPS.
    let options = vaultfs::server::ServerOptions {
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..Default::default()
    };
    let s2 = TestServer::start_with(vaultfs::store::StoreConfig::default(), options).await;
    let bob = s2.user("bob@example.com", "Bobs").await;
    let propfind = |proto: Option<&str>| {
        let r = reqwest::Client::new()
            .request(Method::from_bytes(b"PROPFIND").unwrap(), s2.url("/dav/"))
            .basic_auth(&bob.email, Some(&bob.token))
            .header("Depth", "0")
            .header("X-Forwarded-For", "203.0.113.7");
        match proto {
            Some(p) => r.header("X-Forwarded-Proto", p),
            None => r,
        }
    };
    let r = propfind(None).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = propfind(Some("http")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = propfind(Some("https")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_webdav_turns_it_off() {
    let options = vaultfs::server::ServerOptions {
        webdav: false,
        ..Default::default()
    };
    let s = TestServer::start_with(vaultfs::store::StoreConfig::default(), options).await;
    let alice = s.user("alice@example.com", "Acme").await;
    let r = dav(&s, &alice, "PROPFIND", "/dav/").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// `vaultfs user app-password ...` on the server's data directory while it runs.
async fn cli(s: &TestServer, args: &[&str]) -> (bool, String) {
    let mut c = Command::new(super::common::mount::BIN);
    c.args(["user", "app-password"])
        .args(args)
        .arg("--data-dir")
        .arg(&s.dir);
    run(c).await
}

#[tokio::test(flavor = "multi_thread")]
async fn app_passwords_sign_in_until_revoked() {
    let s = TestServer::start().await;
    let alice = s.user("alice@example.com", "Acme").await;
    let (ok, out) = cli(&s, &["add", "alice@example.com", "Anna's Mac"]).await;
    assert!(ok, "{out}");
    // The password is the line of 4 groups of 6.
    let password = out
        .lines()
        .find(|l| l.len() == 27 && l.split('-').count() == 4)
        .unwrap_or_else(|| panic!("no password in {out}"))
        .to_string();
    let (ok, out) = cli(&s, &["add", "alice@example.com", "Anna's Mac"]).await;
    assert!(!ok && out.contains("already"), "{out}");
    let with = |secret: &str| {
        reqwest::Client::new()
            .request(
                Method::from_bytes(b"PROPFIND").unwrap(),
                s.url("/dav/Acme/"),
            )
            .basic_auth("alice@example.com", Some(secret))
            .header("Depth", "1")
    };
    let r = with(&password).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
    assert!(r.text().await.unwrap().contains("My%20First%20Vault"));
    // Not a token of the API: the API refuses it.
    let r = reqwest::Client::new()
        .get(s.url("/nodes/pth?children=1"))
        .basic_auth("alice@example.com", Some(&password))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // Nor another user's.
    let _bob = s.user("bob@example.com", "Bobs").await;
    let r = reqwest::Client::new()
        .request(Method::from_bytes(b"PROPFIND").unwrap(), s.url("/dav/"))
        .basic_auth("bob@example.com", Some(&password))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let (ok, out) = cli(&s, &["list", "alice@example.com"]).await;
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with("Anna's Mac")).unwrap();
    assert!(!line.ends_with("never"), "its use is recorded: {out}");
    assert!(!out.contains(&password));
    let (ok, out) = cli(&s, &["revoke", "alice@example.com", "Anna's Mac"]).await;
    assert!(ok, "{out}");
    let r = with(&password).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The token still works.
    let r = with(&alice.token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_webdav_sign_ins_lock_the_source_out() {
    let s = TestServer::start().await;
    let carol = s.user("carol@example.com", "Carols").await;
    let propfind = |secret: &str| {
        reqwest::Client::new()
            .request(Method::from_bytes(b"PROPFIND").unwrap(), s.url("/dav/"))
            .basic_auth("carol@example.com", Some(secret))
            .header("Depth", "0")
    };
    for _ in 0..5 {
        let r = propfind("wrong-guess").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    // As for sign-ins: the pair waits now, the right secret too.
    let r = propfind(&carol.token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another user from the same address is not held back.
    let dave = s.user("dave@example.com", "Daves").await;
    let r = reqwest::Client::new()
        .request(Method::from_bytes(b"PROPFIND").unwrap(), s.url("/dav/"))
        .basic_auth(&dave.email, Some(&dave.token))
        .header("Depth", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
}

/// The store's own check, inside the commit: a version stored by someone else while a PUT's
/// body was on its way (after dav-server's check of `If-Match` had passed) makes the PUT 412,
/// and the other version stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_stored_during_a_put_makes_it_412() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let path = format!("{DAV_VAULT}/doc.txt");
    let r = dav(&s, &creds, "PUT", &path)
        .body("one")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let etag1 = r.headers()["etag"].to_str().unwrap().to_string();
    // A PUT whose body comes in two parts, the second only when told.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(1);
    let body = reqwest::Body::wrap_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let slow = tokio::spawn(
        dav(&s, &creds, "PUT", &path)
            .header("If-Match", &etag1)
            .header("Content-Length", "6")
            .body(body)
            .send(),
    );
    tx.send(Ok(b"sl".to_vec())).await.unwrap();
    // The server has opened the upload's staging file (in the store's tmp/): dav-server's
    // check of If-Match passed.
    let tmp = s.dir.join("tmp");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("up-"))
    {
        assert!(std::time::Instant::now() < deadline, "the PUT never began");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let r = dav(&s, &creds, "PUT", &path)
        .body("two")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    tx.send(Ok(b"owed".to_vec())).await.unwrap();
    drop(tx);
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    let r = dav(&s, &creds, "GET", &path).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "two");
}

/// davfs2 (`mount -t davfs`, as root) with an app password: files written, read back, renamed
/// and removed through the mount are what the API then lists. (Listing a davfs2 mount fails
/// with EINVAL on this machine's kernel, against any server: rclone's `serve webdav` too; so
/// the files are reached by name.)
#[tokio::test(flavor = "multi_thread")]
async fn davfs2_mounts_the_vault() {
    if !davfs_can_mount() {
        return;
    }
    let (s, api) = setup().await;
    let email = api.creds().email.clone();
    let password = s.store.add_app_password(&email, "davfs2").unwrap();
    let url = s.url("/dav/Acme/My First Vault/");
    // Through the mount (each call answered by this process's server: not on its threads).
    let read = tokio::task::spawn_blocking(move || {
        let davfs = Davfs::mount(&url, (&email, &password)).unwrap();
        let m = &davfs.mnt;
        std::fs::write(m.join("a.txt"), "hello\n").unwrap();
        std::fs::create_dir(m.join("sub")).unwrap();
        std::fs::write(m.join("sub/b.bin"), pattern(300_000, 9)).unwrap();
        std::fs::write(m.join("sub/gone.txt"), "x").unwrap();
        std::fs::rename(m.join("a.txt"), m.join("c.txt")).unwrap();
        std::fs::remove_file(m.join("sub/gone.txt")).unwrap();
        let read = (
            std::fs::read(m.join("c.txt")).unwrap(),
            std::fs::read(m.join("sub/b.bin")).unwrap(),
            m.join("a.txt").exists(),
        );
        // Unmounted: davfs2 has stored everything (umount waits for it).
        davfs.unmount().unwrap();
        read
    })
    .await
    .unwrap();
    assert_eq!(read.0, b"hello\n");
    assert!(read.1 == pattern(300_000, 9));
    assert!(!read.2, "a.txt was renamed");
    let top = listed(&s, api.creds(), "").await;
    assert!(!top.contains_key("a.txt"));
    assert_eq!(top["c.txt"]["md5_checksum"], md5hex(b"hello\n"));
    let sub = listed(&s, api.creds(), "/sub").await;
    assert_eq!(sub["b.bin"]["md5_checksum"], md5hex(&pattern(300_000, 9)));
    assert!(!sub.contains_key("gone.txt"));
}

/// Limits as for the API: a file over the quota is refused (507) before its body is stored,
/// and nothing of it is kept; a PROPFIND of infinite depth (a walk of the whole tree in one
/// answer) is not served, whatever the request says of itself.
#[tokio::test(flavor = "multi_thread")]
async fn the_quota_holds_and_a_propfind_is_of_finite_depth() {
    let config = vaultfs::store::StoreConfig {
        max_bytes_per_account: 100_000,
        ..Default::default()
    };
    let s = TestServer::start_with(config, Default::default()).await;
    let creds = s.user("alice@example.com", "Acme").await;
    let r = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/small"))
        .body(pattern(60_000, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/big"))
        .body(pattern(60_000, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INSUFFICIENT_STORAGE);
    // Without a length (chunked): refused once it outgrows the room, while the client is
    // still sending (a body that never ends is refused too), and the name it made goes again.
    use futures_util::StreamExt;
    let chunks = futures_util::stream::iter(
        (0..6).map(|i| Ok::<_, std::io::Error>(pattern(10_000, 10 + i))),
    )
    .chain(futures_util::stream::pending());
    let put = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/big2"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send();
    let r = tokio::time::timeout(std::time::Duration::from_secs(30), put)
        .await
        .expect("refused before the body ends")
        .unwrap();
    assert_eq!(r.status(), StatusCode::INSUFFICIENT_STORAGE);
    let top = listed(&s, &creds, "").await;
    assert!(
        top.contains_key("small") && !top.contains_key("big") && !top.contains_key("big2"),
        "{top:?}"
    );
    for litmus in [false, true] {
        let mut r = dav(&s, &creds, "PROPFIND", "/dav/").header("Depth", "infinity");
        if litmus {
            r = r.header("X-Litmus", "props: 1 (begin)");
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        assert!(r.text().await.unwrap().contains("propfind-finite-depth"));
    }
}

/// Another account's files are neither seen nor locked: a PROPFIND of them is not found, a
/// LOCK of them keeps no lock, and their owner writes on.
#[tokio::test(flavor = "multi_thread")]
async fn another_accounts_files_are_out_of_reach() {
    let (s, api) = setup().await;
    let alice = api.creds().clone();
    let bob = s.user("bob@example.com", "Bobs").await;
    let bobs = "/dav/Bobs/My%20First%20Vault/b.txt";
    let r = dav(&s, &bob, "PUT", bobs)
        .body("mine")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &alice, "PROPFIND", bobs)
        .header("Depth", "0")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    let r = dav(&s, &alice, "GET", bobs).send().await.unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
    let r = dav(&s, &alice, "LOCK", bobs)
        .body(EXCLUSIVE_LOCK)
        .send()
        .await
        .unwrap();
    assert!(!r.status().is_success(), "{}", r.status());
    assert!(s.store.dav_locks("Bobs").unwrap().is_empty());
    let r = dav(&s, &bob, "PUT", bobs)
        .body("still mine")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // And the root lists one's own account only.
    let r = dav(&s, &alice, "PROPFIND", "/dav/")
        .header("Depth", "1")
        .send()
        .await
        .unwrap();
    let xml = r.text().await.unwrap();
    assert!(xml.contains("/dav/Acme/") && !xml.contains("Bobs"), "{xml}");
}

/// nginx's master process, stopped with its workers however the test ends.
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, which is not reaped before the wait below.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Behind nginx as docs/deploy.md sets it up (TLS, `X-Forwarded-Proto $scheme`, the server
/// trusting the proxy): WebDAV over HTTPS works, rclone copying a tree in and checking every
/// byte; the same proxy's plain-HTTP port is refused, the password never asked for.
#[tokio::test(flavor = "multi_thread")]
async fn through_a_tls_proxy_only() {
    let nginx = Path::new("/usr/sbin/nginx");
    if !nginx.exists() || !installed("rclone") {
        eprintln!("SKIPPED: nginx is not installed (.ci/run installs nginx-light)");
        return;
    }
    let options = vaultfs::server::ServerOptions {
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..Default::default()
    };
    let s = TestServer::start_with(vaultfs::store::StoreConfig::default(), options).await;
    let creds = s.user("alice@example.com", "Acme").await;
    let password = s.store.add_app_password(&creds.email, "laptop").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    std::fs::create_dir(&dir).unwrap();
    super::common::tls::make_certificates(&dir);
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (tls_port, plain_port) = (free(), free());
    let d = dir.display();
    let upstream = &s.base;
    // As deploy.md's, but the client named is one elsewhere (this test's requests come from
    // loopback, which would be allowed plain HTTP as on the server's own machine).
    let location = format!(
        "location / {{ proxy_pass {upstream}; proxy_http_version 1.1; \
         proxy_set_header Host $host; proxy_set_header X-Forwarded-Proto $scheme; \
         proxy_set_header X-Forwarded-For 203.0.113.9; }}"
    );
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "pid {d}/nginx.pid;\nerror_log {d}/error.log;\ndaemon off;\nworker_processes 1;\n\
             events {{}}\nhttp {{\n  access_log {d}/access.log;\n  \
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             client_max_body_size 0;\n  proxy_request_buffering off;\n  proxy_buffering off;\n  \
             server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {d}/server.crt; \
             ssl_certificate_key {d}/server.key; {location} }}\n  \
             server {{ listen 127.0.0.1:{plain_port}; {location} }}\n}}\n"
        ),
    )
    .unwrap();
    let _proxy = Nginx(
        Command::new(nginx)
            .args(["-c", &format!("{d}/nginx.conf"), "-p", &d.to_string()])
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while [tls_port, plain_port]
        .iter()
        .any(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_err())
    {
        assert!(std::time::Instant::now() < deadline, "nginx never listened");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Plain HTTP through the proxy: refused before any password is asked for.
    let r = reqwest::Client::new()
        .request(
            Method::from_bytes(b"PROPFIND").unwrap(),
            format!("http://127.0.0.1:{plain_port}/dav/"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("www-authenticate").is_none());
    // HTTPS: rclone copies a tree in, every byte checked.
    let src = tmp.path().join("src");
    let files = make_tree(&src);
    let url = format!("https://localhost:{tls_port}{DAV_VAULT}/");
    let ca = vec!["--ca-cert".into(), dir.join("ca.crt").into()];
    let signed_in = (creds.email.as_str(), password.as_str());
    let rclone = rclone_remote(tmp.path(), url, signed_in, ca);
    let src_s = src.to_str().unwrap();
    let (ok, out) = run(rclone(&["copy", src_s, "vault:tree"])).await;
    assert!(ok, "rclone copy through the proxy: {out}");
    let (ok, out) = run(rclone(&["check", "--download", src_s, "vault:tree"])).await;
    assert!(ok, "rclone check through the proxy: {out}");
    let top = listed(&s, &creds, "/tree").await;
    assert_eq!(top["a.txt"]["md5_checksum"], md5hex(&files[0].1));
}

/// A folder of more names than one page of the store's listing is listed whole (its pages
/// fetched as the answer is written).
#[tokio::test(flavor = "multi_thread")]
async fn a_large_folder_is_listed_whole() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let r = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/many"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let n = 2 * vaultfs::backend::LIST_PAGE as usize + 7;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
    let folder = vaultfs::api::NodePath::parse_encoded("/Acme/My%20First%20Vault/many").unwrap();
    let (_, made) = s
        .store
        .create_files(vaultfs::store::Scope::All, &folder, &names)
        .unwrap();
    assert!(made.iter().all(Result::is_ok));
    let r = dav(&s, &creds, "PROPFIND", &format!("{DAV_VAULT}/many/"))
        .header("Depth", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
    let xml = r.text().await.unwrap();
    // The folder itself and every name, each once.
    assert_eq!(xml.matches("<D:response>").count(), n + 1);
    for name in [&names[0], &names[1000], &names[n - 1]] {
        assert_eq!(xml.matches(&format!("/many/{name}<")).count(), 1, "{name}");
    }
}

/// What WebDAV clients do reaches the change feed like any other client's changes, so mounts
/// and web pages following it see them: a new file, its new version, a move, a delete.
#[tokio::test(flavor = "multi_thread")]
async fn webdav_changes_reach_the_change_feed() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let (st, v) = api.get("/changes").await;
    assert_eq!(st, 200, "{v}");
    let cursor = v["message"]["cursor"].as_u64().unwrap();
    let a = format!("{DAV_VAULT}/a.txt");
    for body in ["one", "two"] {
        let r = dav(&s, &creds, "PUT", &a).body(body).send().await.unwrap();
        assert!(r.status().is_success());
    }
    let r = dav(&s, &creds, "MOVE", &a)
        .header("Destination", s.url(&format!("{DAV_VAULT}/b.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "DELETE", &format!("{DAV_VAULT}/b.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (st, v) = api.get(&format!("/changes?cursor={cursor}")).await;
    assert_eq!(st, 200, "{v}");
    let kinds: Vec<(String, String)> = v["message"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let uri = c["uri"].as_str().unwrap();
            let name = uri.rsplit('/').next().unwrap().to_string();
            (c["kind"].as_str().unwrap().to_string(), name)
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("created", "a.txt"),
        ("version", "a.txt"),
        ("version", "a.txt"),
        ("moved", "b.txt"),
        ("deleted", "b.txt"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(kinds, want, "{v}");
}

/// A LOCK shows in the API (`locks=1`, our extension): on the file locked, on every file below
/// a folder locked with depth infinity, not on a folder's file for a lock of depth 0; who took
/// it, the text of its owner, when it ends. Gone once let go of; another account sees none.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_shows_in_the_api_until_let_go_of() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    for name in ["a.txt", "d/b.txt"] {
        if name.starts_with("d/") {
            let r = dav(&s, &creds, "MKCOL", &format!("{DAV_VAULT}/d"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
        }
        let r = dav(&s, &creds, "PUT", &format!("{DAV_VAULT}/{name}"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let lock = |path: &str, depth: &'static str| {
        dav(&s, &creds, "LOCK", path)
            .header("Depth", depth)
            .header("Timeout", "Second-300")
            .body(
                r#"<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/>
                </D:lockscope><D:locktype><D:write/></D:locktype>
                <D:owner>Word on <D:href>PC-17</D:href></D:owner></D:lockinfo>"#,
            )
            .send()
    };
    let locks_of = |name: &'static str| {
        let api = &api;
        async move {
            let (st, v) = api
                .get(&format!(
                    "/nodes/pth/Acme/My%20First%20Vault/{name}?locks=1"
                ))
                .await;
            assert_eq!(st, 200, "{v}");
            v["message"]["locks"].as_array().cloned().unwrap()
        }
    };
    assert!(locks_of("a.txt").await.is_empty());
    let r = lock(&format!("{DAV_VAULT}/a.txt"), "0").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let token = r.headers()["lock-token"].to_str().unwrap().to_string();
    let got = locks_of("a.txt").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["on"], "/nodes/pth/Acme/My First Vault/a.txt");
    assert_eq!(got[0]["by"], "alice@example.com");
    assert_eq!(got[0]["owner"], "Word on PC-17");
    assert_eq!(got[0]["shared"], false);
    let ends = vaultfs::api::parse_time(got[0]["expiresOn"].as_str().unwrap()).unwrap();
    let left = ends.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(left.as_secs() > 200 && left.as_secs() <= 300, "{left:?}");
    // A folder locked alone holds none of its files; locked with its tree, each.
    let r = lock(&format!("{DAV_VAULT}/d"), "0").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let shallow = r.headers()["lock-token"].to_str().unwrap().to_string();
    assert!(locks_of("d/b.txt").await.is_empty());
    assert_eq!(locks_of("d").await.len(), 1);
    let r = dav(&s, &creds, "UNLOCK", &format!("{DAV_VAULT}/d"))
        .header("Lock-Token", shallow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = lock(&format!("{DAV_VAULT}/d"), "infinity").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let got = locks_of("d/b.txt").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["on"], "/nodes/pth/Acme/My First Vault/d");
    // Another account's client sees none of it (its own paths only), nor asks of Acme's.
    let bob = s.user("bob@example.com", "Bobs").await;
    let (st, _) = Api::new(&s, &bob)
        .get("/nodes/pth/Acme/My%20First%20Vault/a.txt?locks=1")
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let r = dav(&s, &creds, "UNLOCK", &format!("{DAV_VAULT}/a.txt"))
        .header("Lock-Token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(locks_of("a.txt").await.is_empty());
}

/// A cadaver session with `commands` on its input, signed in through `home`'s `.netrc`, on a
/// blocking thread: what it printed.
async fn cadaver(home: &Path, url: String, commands: &str) -> String {
    let (home, commands) = (home.to_path_buf(), commands.to_string());
    tokio::task::spawn_blocking(move || super::common::dav_clients::cadaver(&home, url, &commands))
        .await
        .unwrap()
}

/// cadaver, as a user types it: a folder made, a file put, locked and saved again under the
/// lock; from another session the save is refused (423) while the file reads, the lock is
/// found, taken over and let go of, and the file moved, read back and deleted. Each step as
/// the API sees it.
#[tokio::test(flavor = "multi_thread")]
async fn cadaver_works_through_a_session() {
    if !installed("cadaver") {
        return;
    }
    // As `vaultfs serve` keeps versions and deleted files by default.
    let s = TestServer::start_with(served_retention(), Default::default()).await;
    let creds = s.user("alice@example.com", "Acme").await;
    let api = Api::new(&s, &creds);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    cadaver_netrc(h, &s.base, (&creds.email, &creds.token));
    for (name, text) in [
        ("first.txt", "first draft\n"),
        ("second.txt", "second draft\n"),
        ("third.txt", "third\n"),
    ] {
        std::fs::write(h.join(name), text).unwrap();
    }
    let url = s.url(&format!("{DAV_VAULT}/"));
    let out = cadaver(
        h,
        url.clone(),
        &format!(
            "lcd {}\nmkcol docs\ncd docs\nput first.txt report.txt\nlock report.txt\n\
             put second.txt report.txt\nls\nquit\n",
            h.display()
        ),
    )
    .await;
    assert!(
        out.matches("succeeded").count() >= 5 && !out.contains("failed"),
        "{out}"
    );
    let (st, v) = api
        .get("/nodes/pth/Acme/My%20First%20Vault/docs/report.txt?locks=1")
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["locks"][0]["by"], creds.email.as_str(), "{v}");
    assert_eq!(v["message"]["md5_checksum"], md5hex(b"second draft\n"));

    let out = cadaver(
        h,
        url,
        &format!(
            "lcd {}\ncd docs\nput third.txt report.txt\nget report.txt back.txt\n\
             steal report.txt\nunlock report.txt\nmove report.txt final.txt\n\
             get final.txt final-back.txt\ndelete final.txt\nls\nquit\n",
            h.display()
        ),
    )
    .await;
    assert!(
        out.contains("423 Locked"),
        "the save under another's lock: {out}"
    );
    assert_eq!(
        std::fs::read(h.join("back.txt")).unwrap(),
        b"second draft\n",
        "{out}"
    );
    assert_eq!(
        std::fs::read(h.join("final-back.txt")).unwrap(),
        b"second draft\n",
        "{out}"
    );
    assert!(s.store.dav_locks("Acme").unwrap().is_empty(), "{out}");
    let docs = listed(&s, &creds, "/docs").await;
    assert!(docs.is_empty(), "{docs:?}: {out}");
    // Deleted through WebDAV is deleted as any delete: among the folder's deleted files.
    let (st, v) = api
        .get("/nodes/pth/Acme/My%20First%20Vault/docs?deleted=1")
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["deleted"][0]["name"], "final.txt", "{v}");
}

/// A lock taken on a Mac's spelling of a name (NFD: `e` and a combining accent) holds the PC's
/// (NFC: `é`), which is the same file of the store: the PC's save is refused (423) until the
/// lock is let go of, by either spelling.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_holds_the_name_in_either_unicode_spelling() {
    let (s, api) = setup().await;
    let creds = api.creds().clone();
    let nfd = format!("{DAV_VAULT}/caf%65%CC%81.txt");
    let nfc = format!("{DAV_VAULT}/caf%C3%A9.txt");
    let r = dav(&s, &creds, "PUT", &nfc)
        .body("v1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = dav(&s, &creds, "LOCK", &nfd)
        .body(EXCLUSIVE_LOCK)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let token = r.headers()["lock-token"].to_str().unwrap().to_string();
    let r = dav(&s, &creds, "PUT", &nfc)
        .body("v2")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 423, "a save under another's lock");
    let r = dav(&s, &creds, "GET", &nfc).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "v1");
    let r = dav(&s, &creds, "UNLOCK", &nfc)
        .header("Lock-Token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = dav(&s, &creds, "PUT", &nfc)
        .body("v2")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}
