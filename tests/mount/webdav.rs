//! One vault reached both ways (issue 50): what a WebDAV client stores in `vaultfs serve` is read
//! through a mount of the same server, and what is written through the mount is read, and
//! edited, over WebDAV; the mount sees the edit.

use std::fs;

use crate::common::env::{Env, Via};
use crate::common::mount::wait_for;

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
