//! One vault reached both ways (issue 50): what a WebDAV client stores in `vaultfs serve` is read
//! through a mount of the same server, and what is written through the mount is read, and
//! edited, over WebDAV; the mount sees the edit. A WebDAV client's lock shows through the
//! mount (`user.vaultfs.lock`).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::TestServer;
use crate::common::env::{Env, Via};
use crate::common::mount::wait_for;

both!(a_webdav_lock_shows_through_the_mount_until_let_go_of);

#[test]
fn a_file_written_over_webdav_reads_through_the_mount_and_back() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let s = env.server.as_ref().unwrap();
    let dav = env.rt.block_on(s.user("dav@example.com", "Local"));
    let m = env.mount(&[]);
    let url = |name: &str| format!("{}/dav/Local/My%20First%20Vault/{name}", s.base);
    let client = reqwest::blocking::Client::new();
    let send = |req: reqwest::blocking::RequestBuilder| {
        req.basic_auth(&dav.email, Some(&dav.token)).send().unwrap()
    };

    let put = send(
        client
            .put(url("from-dav.txt"))
            .body("written over WebDAV\n"),
    );
    assert_eq!(put.status().as_u16(), 201);
    let p = env.vault().join("from-dav.txt");
    wait_for(10, "the WebDAV file in the mount", || {
        fs::read(&p).is_ok_and(|b| b == b"written over WebDAV\n")
    });

    let q = env.vault().join("from-mount.txt");
    fs::write(&q, b"written through the mount\n").unwrap();
    env.wait_uploaded();
    let got = send(client.get(url("from-mount.txt")));
    assert_eq!(got.status().as_u16(), 200);
    assert_eq!(
        got.bytes().unwrap().as_ref(),
        b"written through the mount\n"
    );

    let put = send(
        client
            .put(url("from-mount.txt"))
            .body("edited over WebDAV\n"),
    );
    assert_eq!(put.status().as_u16(), 204);
    wait_for(10, "the WebDAV edit in the mount", || {
        fs::read(&q).is_ok_and(|b| b == b"edited over WebDAV\n")
    });
    m.unmount();
}

/// `getfattr -n user.vaultfs.lock`: its value, or None when the file has no such attribute.
fn lock_of(p: &Path) -> Option<String> {
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", "user.vaultfs.lock"])
        .arg(p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert!(err.contains("No such attribute"), "getfattr: {err}");
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A file locked by a WebDAV client (Finder, Word) says so through the mount: who, from what,
/// until when; a folder locked for its whole tree holds the files in it; once the client lets
/// go, the attribute is gone. Over a server and on the built-in store (a `vaultfs serve` of
/// the same store beside the mount).
fn a_webdav_lock_shows_through_the_mount_until_let_go_of(via: Via) {
    let Some(env) = Env::new(via) else {
        return;
    };
    let beside;
    let s = match &env.server {
        Some(s) => s,
        None => {
            beside = env.rt.block_on(TestServer::start_in(
                &env.data,
                Default::default(),
                Default::default(),
            ));
            &beside
        }
    };
    let dav = env.rt.block_on(s.user("anna@example.com", "Local"));
    let m = env.mount(&[]);
    let v = env.vault();
    fs::write(v.join("report.txt"), "draft\n").unwrap();
    fs::create_dir(v.join("shared")).unwrap();
    fs::write(v.join("shared/plan.txt"), "plan\n").unwrap();
    env.wait_uploaded();
    assert_eq!(lock_of(&v.join("report.txt")), None);

    let url = |name: &str| format!("{}/dav/Local/My%20First%20Vault/{name}", s.base);
    let client = reqwest::blocking::Client::new();
    let lock = |name: &str, depth: &str| {
        let r = client
            .request(reqwest::Method::from_bytes(b"LOCK").unwrap(), url(name))
            .basic_auth(&dav.email, Some(&dav.token))
            .header("Timeout", "Second-600")
            .header("Depth", depth)
            .body(
                r#"<?xml version="1.0" encoding="utf-8"?><D:lockinfo xmlns:D="DAV:">
                <D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype>
                <D:owner><D:href>Anna's Mac</D:href></D:owner></D:lockinfo>"#,
            )
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "LOCK {name}");
        r.headers()["lock-token"].to_str().unwrap().to_string()
    };
    let token = lock("report.txt", "0");
    let got = lock_of(&v.join("report.txt")).expect("the lock shows");
    assert!(
        got.starts_with("exclusive lock by anna@example.com (Anna's Mac) on /nodes/pth/")
            && got.contains("/report.txt until 20"),
        "{got}: {}",
        m.log_text()
    );
    assert_eq!(lock_of(&v.join("shared/plan.txt")), None);

    let deep = lock("shared", "infinity");
    let got = lock_of(&v.join("shared/plan.txt")).expect("the folder's lock shows");
    assert!(got.contains("/shared until "), "{got}");

    for (name, token) in [("report.txt", token), ("shared", deep)] {
        let r = client
            .request(reqwest::Method::from_bytes(b"UNLOCK").unwrap(), url(name))
            .basic_auth(&dav.email, Some(&dav.token))
            .header("Lock-Token", token)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 204, "UNLOCK {name}");
    }
    assert_eq!(lock_of(&v.join("report.txt")), None);
    assert_eq!(lock_of(&v.join("shared/plan.txt")), None);
    // Read by name, never listed: `cp -a` and `rsync -X` copy no lock.
    let listed = Command::new("getfattr")
        .args(["-d", "-m", "-"])
        .arg(v.join("report.txt"))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("vaultfs.lock"));
    m.unmount();
}
