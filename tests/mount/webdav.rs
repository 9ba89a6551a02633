//! One vault reached both ways (issue 50): what a WebDAV client stores in `vaultfs serve` is read
//! through a mount of the same server, and what is written through the mount is read, and
//! edited, over WebDAV; the mount sees the edit. A WebDAV client's lock shows through the
//! mount (`user.vaultfs.lock`). The real clients too: a file written by rclone, davfs2 and
//! cadaver reads through the mount, and one written through the mount reads in each.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::dav_clients::{
    Davfs, cadaver, cadaver_netrc, davfs_can_mount, installed, output, rclone_remote,
};
use crate::common::env::{Env, Via};
use crate::common::mount::wait_for;
use crate::common::{TestServer, pattern};

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

/// rclone's webdav backend, cadaver and davfs2 against the server a vaultfs mount uses: what
/// each writes reads through the mount byte for byte, and what the mount wrote (a text and a
/// binary of several write batches) reads in each. A client that is not installed is skipped
/// and says so.
#[test]
fn real_webdav_clients_and_a_mount_read_each_others_files() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let s = env.server.as_ref().unwrap();
    let dav = env.rt.block_on(s.user("dav@example.com", "Local"));
    let signed_in = (dav.email.as_str(), dav.token.as_str());
    let m = env.mount(&[]);
    let v = env.vault();
    let text = b"written through the mount\n".to_vec();
    let binary = pattern(3 << 20, 5);
    fs::write(v.join("from-mount.txt"), &text).unwrap();
    fs::write(v.join("from-mount.bin"), &binary).unwrap();
    env.wait_uploaded();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let folder = format!("{}/dav/Local/My%20First%20Vault/", s.base);
    // What a client wrote, as the mount reads it once the mount looks again.
    let through_mount = |name: &str, data: &[u8]| {
        let p = v.join(name);
        wait_for(10, &format!("{name} in the mount"), || {
            fs::read(&p).is_ok_and(|b| b == data)
        });
    };

    if installed("rclone") {
        let rclone = rclone_remote(t, folder.clone(), signed_in, Vec::new());
        let by_rclone = pattern(200_000, 6);
        fs::write(t.join("by-rclone.bin"), &by_rclone).unwrap();
        let local = |name: &str| t.join(name).to_str().unwrap().to_string();
        let (ok, out) = output(rclone(&[
            "copyto",
            &local("by-rclone.bin"),
            "vault:by-rclone.bin",
        ]));
        assert!(ok, "rclone copyto in: {out}");
        through_mount("by-rclone.bin", &by_rclone);
        for name in ["from-mount.txt", "from-mount.bin"] {
            let back = local(&format!("rclone-{name}"));
            let (ok, out) = output(rclone(&["copyto", &format!("vault:{name}"), &back]));
            assert!(ok, "rclone copyto out: {out}");
        }
        assert_eq!(fs::read(t.join("rclone-from-mount.txt")).unwrap(), text);
        assert!(fs::read(t.join("rclone-from-mount.bin")).unwrap() == binary);
    }

    if installed("cadaver") {
        cadaver_netrc(t, &s.base, signed_in);
        fs::write(t.join("by-cadaver.txt"), "put by cadaver\n").unwrap();
        let out = cadaver(
            t,
            folder.clone(),
            &format!(
                "lcd {}\nput by-cadaver.txt\nget from-mount.txt cadaver-from-mount.txt\n\
                 get from-mount.bin cadaver-from-mount.bin\nquit\n",
                t.display()
            ),
        );
        assert!(!out.contains("failed"), "{out}");
        through_mount("by-cadaver.txt", b"put by cadaver\n");
        assert_eq!(
            fs::read(t.join("cadaver-from-mount.txt")).unwrap(),
            text,
            "{out}"
        );
        assert!(
            fs::read(t.join("cadaver-from-mount.bin")).unwrap() == binary,
            "{out}"
        );
    }

    if davfs_can_mount() {
        let password = s.store.add_app_password(&dav.email, "davfs2").unwrap();
        let url = format!("{}/dav/Local/My First Vault/", s.base);
        let davfs = Davfs::mount(&url, (&dav.email, &password)).unwrap();
        assert_eq!(fs::read(davfs.mnt.join("from-mount.txt")).unwrap(), text);
        assert!(fs::read(davfs.mnt.join("from-mount.bin")).unwrap() == binary);
        let by_davfs = pattern(1 << 20, 7);
        fs::write(davfs.mnt.join("by-davfs2.bin"), &by_davfs).unwrap();
        // davfs2 has stored it once `umount` returns.
        davfs.unmount().unwrap();
        through_mount("by-davfs2.bin", &by_davfs);
    }
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
