//! WebDAV's keep-both rule (issue 50): a PUT without preconditions over a version its device
//! was never shown keeps both, the other version at the name and the device's bytes as a
//! conflict copy beside it; a PUT over a version the device was shown (listed, read) or stored
//! itself is a new version, and a retry of a PUT stores nothing more. Each device signs in with
//! an app password of its own, as `vaultfs user app-password add` makes them; rclone, copying a
//! tree in twice, makes no copy.

use reqwest::StatusCode;

use super::Api;
use super::common::{Creds, TestServer, md5hex, served_retention};
use super::dav::{DAV_VAULT, dav, installed, listed, rclone_remote, run};

/// A server as `vaultfs serve` runs by default (versions kept), Alice's account, and two devices
/// of hers: her laptop and her phone, each with an app password.
async fn two_devices() -> (TestServer, Api, Creds, Creds) {
    let s = TestServer::start_with(served_retention(), Default::default()).await;
    let alice = s.user("alice@example.com", "Acme").await;
    let device = |name: &str| Creds {
        email: alice.email.clone(),
        token: s.store.add_app_password(&alice.email, name).unwrap(),
    };
    let (laptop, phone) = (device("Anna's laptop"), device("Anna's phone"));
    let api = Api::new(&s, &alice);
    (s, api, laptop, phone)
}

async fn put(s: &TestServer, device: &Creds, name: &str, body: &'static str) -> reqwest::Response {
    let r = dav(s, device, "PUT", &format!("{DAV_VAULT}/{name}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "PUT {name}: {}", r.status());
    r
}

async fn get(s: &TestServer, device: &Creds, path: &str) -> String {
    let r = dav(s, device, "GET", path).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "GET {path}");
    r.text().await.unwrap()
}

/// The device's listing of the vault (a PROPFIND of depth 1), as Finder or rclone asks.
async fn list(s: &TestServer, device: &Creds) -> String {
    let r = dav(s, device, "PROPFIND", &format!("{DAV_VAULT}/"))
        .header("Depth", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MULTI_STATUS);
    r.text().await.unwrap()
}

/// The md5s of the file's versions, newest first.
async fn versions(api: &Api, name: &str) -> Vec<String> {
    let (st, v) = api
        .get(&format!(
            "/nodes/pth/Acme/My%20First%20Vault/{name}?vprop=1"
        ))
        .await;
    assert_eq!(st, 200, "{v}");
    v["message"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["md5_checksum"].as_str().unwrap().to_string())
        .collect()
}

/// The names in the vault, as the API lists them.
async fn names(s: &TestServer, api: &Api) -> Vec<String> {
    let mut names: Vec<String> = listed(s, api.creds(), "").await.keys().cloned().collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_put_over_a_version_never_shown_keeps_both() {
    let (s, api, laptop, phone) = two_devices().await;
    let path = format!("{DAV_VAULT}/a.txt");
    assert_eq!(
        put(&s, &laptop, "a.txt", "laptop 1").await.status(),
        StatusCode::CREATED
    );
    // The phone lists the folder: the laptop's first version is what it was shown.
    list(&s, &phone).await;
    put(&s, &laptop, "a.txt", "laptop 2").await;
    // The phone saves its edit of the first version, without a precondition.
    let r = put(&s, &phone, "a.txt", "phone's edit").await;
    assert_eq!(r.status(), StatusCode::CREATED, "a new file was made");
    assert!(r.headers().get("etag").is_none(), "not the ETag of a.txt");
    let location = r.headers()["location"].to_str().unwrap().to_string();
    // The name keeps the laptop's version, with its history alone; the phone's bytes are a
    // conflict copy beside it, named as the mount names them, which every client sees.
    assert_eq!(get(&s, &phone, &path).await, "laptop 2");
    assert_eq!(
        versions(&api, "a.txt").await,
        [md5hex(b"laptop 2"), md5hex(b"laptop 1")]
    );
    let names = names(&s, &api).await;
    assert_eq!(names.len(), 2, "{names:?}");
    let copy = &names[0];
    assert!(
        copy.starts_with("a (conflict ") && copy.ends_with(" Anna's phone).txt"),
        "{names:?}"
    );
    assert_eq!(names[1], "a.txt");
    assert_eq!(get(&s, &laptop, &location).await, "phone's edit");
    assert!(location.starts_with(&format!("{DAV_VAULT}/a%20%28conflict%20")));
    assert!(list(&s, &laptop).await.contains("conflict"));
    assert_eq!(versions(&api, copy).await.len(), 1);
}

/// The API's writes (and a mount's, through it) are versions a device never saw either; a
/// token of the API signed in to WebDAV is a device of its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_stored_through_the_api_is_kept_too() {
    let (s, api, laptop, _) = two_devices().await;
    put(&s, &laptop, "b.txt", "laptop").await;
    let listed = listed(&s, api.creds(), "").await;
    let id = listed["b.txt"]["id"].as_str().unwrap().to_string();
    api.put_version(&id, b"from the API").await;
    let r = put(&s, &laptop, "b.txt", "laptop again").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        get(&s, &laptop, &format!("{DAV_VAULT}/b.txt")).await,
        "from the API"
    );
    // The token, as a WebDAV device, never saw the laptop's copy: its save of the same name
    // is kept beside it too, named after the token's client.
    let token = api.creds().clone();
    let r = put(&s, &token, "b.txt", "token").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let names = names(&s, &api).await;
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with(" vaultfs).txt")),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_put_over_a_version_shown_is_a_new_version() {
    let (s, api, laptop, phone) = two_devices().await;
    let path = format!("{DAV_VAULT}/a.txt");
    put(&s, &laptop, "a.txt", "laptop 1").await;
    // Listed after the laptop's version: the phone's save goes over it.
    list(&s, &phone).await;
    assert_eq!(
        put(&s, &phone, "a.txt", "phone 1").await.status(),
        StatusCode::NO_CONTENT
    );
    // Read after the laptop's next version (made over the phone's, which it listed): over
    // it too.
    list(&s, &laptop).await;
    put(&s, &laptop, "a.txt", "laptop 2").await;
    assert_eq!(get(&s, &phone, &path).await, "laptop 2");
    assert_eq!(
        put(&s, &phone, "a.txt", "phone 2").await.status(),
        StatusCode::NO_CONTENT
    );
    // Its own version, saved again with new bytes without a look: over it.
    assert_eq!(
        put(&s, &phone, "a.txt", "phone 3").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(names(&s, &api).await, ["a.txt"]);
    let all = ["phone 3", "phone 2", "laptop 2", "phone 1", "laptop 1"];
    let md5s: Vec<String> = all.iter().map(|b| md5hex(b.as_bytes())).collect();
    assert_eq!(versions(&api, "a.txt").await, md5s);
}

/// A PUT sent again (a client that lost the answer) finds its bytes stored: one version, no
/// copy.
#[tokio::test(flavor = "multi_thread")]
async fn a_retried_put_stores_one_version() {
    let (s, api, _, phone) = two_devices().await;
    assert_eq!(
        put(&s, &phone, "c.txt", "once").await.status(),
        StatusCode::CREATED
    );
    let r = put(&s, &phone, "c.txt", "once").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers()["etag"].to_str().unwrap(),
        format!("\"{}\"", md5hex(b"once"))
    );
    assert_eq!(names(&s, &api).await, ["c.txt"]);
    assert_eq!(versions(&api, "c.txt").await, [md5hex(b"once")]);
}

/// rclone lists each folder before it writes into it: copying a tree in, then again after the
/// laptop changed a file there and a file changed here, overwrites both (what `rclone copy`
/// means) and makes no conflict copy; `rclone check --download` is clean.
#[tokio::test(flavor = "multi_thread")]
async fn rclone_copies_twice_without_conflict_copies() {
    if !installed("rclone") {
        return;
    }
    let (s, api, laptop, phone) = two_devices().await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for (name, data) in [
        ("a.txt", "one\n"),
        ("b.txt", "two\n"),
        ("sub/c.txt", "three\n"),
    ] {
        std::fs::create_dir_all(src.join(name).parent().unwrap()).unwrap();
        std::fs::write(src.join(name), data).unwrap();
    }
    let url = s.url(&format!("{DAV_VAULT}/"));
    let signed_in = (phone.email.as_str(), phone.token.as_str());
    let rclone = rclone_remote(tmp.path(), url, signed_in, Vec::new());
    let src_s = src.to_str().unwrap();
    let (ok, out) = run(rclone(&["copy", src_s, "vault:tree"])).await;
    assert!(ok, "rclone copy: {out}");
    // The laptop changes one file (having read it), this machine another (each a new size,
    // which is what rclone compares).
    let a = format!("{DAV_VAULT}/tree/a.txt");
    assert_eq!(get(&s, &laptop, &a).await, "one\n");
    let r = dav(&s, &laptop, "PUT", &a)
        .body("the laptop's\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    std::fs::write(src.join("sub/c.txt"), "three, changed\n").unwrap();
    let (ok, out) = run(rclone(&["copy", src_s, "vault:tree"])).await;
    assert!(ok, "rclone copy again: {out}");
    let (ok, out) = run(rclone(&["check", "--download", src_s, "vault:tree"])).await;
    assert!(ok, "rclone check: {out}");
    let (ok, out) = run(rclone(&["lsf", "-R", "vault:tree"])).await;
    assert!(ok, "{out}");
    assert!(!out.contains("conflict"), "{out}");
    let sub: Vec<String> = listed(&s, api.creds(), "/tree/sub")
        .await
        .keys()
        .cloned()
        .collect();
    assert_eq!(sub, ["c.txt"]);
}
