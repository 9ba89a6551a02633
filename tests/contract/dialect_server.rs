//! The remote backend against `common::dialect`: what only the public service's dialect shows.

use vaultfs::api::ErrorKind;
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::cli::login;

use crate::common::dialect::{DialectOptions, DialectServer};
use crate::common::md5hex;
use crate::common::pattern;
use crate::{Keep, assert_err, at, content, dialect_world, err, names, path, put, stream};

/// Its own words reach the caller: the integer, the text, and what to do about a login.
#[tokio::test(flavor = "multi_thread")]
async fn dialect_errors_keep_the_service_code_and_text() {
    let w = dialect_world().await;
    let e = err(w.a.node(&at(&w.vault, "nope")).await);
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.number, Some(-520093684));
    assert_eq!(e.message, "Object not found.");

    let Keep::Dialect(server) = &w._keep else {
        unreachable!()
    };
    let stale =
        RemoteBackend::new(RemoteConfig::new(&server.base, "a@acme.test", "stale")).unwrap();
    let e = err(stale.node(&w.vault).await);
    assert_eq!((e.kind, e.number), (ErrorKind::Auth, Some(-1593835519)));
    assert!(
        e.message.starts_with("Authorization failed.") && e.message.contains("vaultfs login"),
        "{}",
        e.message
    );

    // "Already exists" comes with 500 and is a conflict at once, not a server failure retried.
    let dir = at(&w.vault, "d");
    w.a.create_folder(&dir).await.unwrap();
    let uri = "PUT /nodes/pth/Acme/My%20First%20Vault/d";
    assert_eq!(server.requests(uri), 1);
    assert_err(
        w.a.create_folder(&dir).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_eq!(server.requests(uri), 2);
    put(&w.a, &w.vault, "f.txt", b"one").await;
    let again = w.a.create_file(&w.vault, "f.txt").await.unwrap();
    assert_eq!(content(&w.a, &again.file_id().unwrap()).await, b"one");

    // Only its registered client ID gets a pin page.
    let anon = RemoteBackend::new(RemoteConfig::new(&server.base, "", "")).unwrap();
    assert_err(
        anon.pin_end(login::CLIENT_ID).await,
        ErrorKind::BadRequest,
        None,
    );
}

/// A server that refuses the md5's form still gets every write: step 2 goes again without it,
/// and the md5 step 3 reports is checked instead.
#[tokio::test(flavor = "multi_thread")]
async fn dialect_refused_checksum_form_loses_no_write() {
    let server = DialectServer::start(DialectOptions {
        refuse_checksums: true,
        ..Default::default()
    })
    .await;
    let b = server.user("a@acme.test", "Acme").await;
    let vault = path("/Acme/My First Vault");
    let data = pattern(300_000, 0);
    let node = put(&b, &vault, "w.bin", &data).await;
    assert!(content(&b, &node.file_id().unwrap()).await == data);
    assert_eq!(
        server.requests(&format!("PUT /nodes/upload/{}", node.file_id().unwrap())),
        2
    );

    // Other bytes than announced: stored by a server that could not check, caught here.
    let id = node.file_id().unwrap();
    let v = b
        .begin_version(&id, 5, Some(&md5hex(b"other")))
        .await
        .unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    assert_err(
        b.upload(&id, &vid, 5, stream(b"hello")).await,
        ErrorKind::Server,
        Some("checksum_mismatch"),
    );
}

/// Pages capped below `per_page`, with and without `total_children`: every child listed once.
#[tokio::test(flavor = "multi_thread")]
async fn dialect_capped_pages_list_every_child_once() {
    for counts in [true, false] {
        let server = DialectServer::start(DialectOptions {
            per_page_cap: 3,
            counts,
            ..Default::default()
        })
        .await;
        let b = server.user("a@acme.test", "Acme").await;
        let vault = path("/Acme/My First Vault");
        let mut all: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
        for n in &all {
            put(&b, &vault, n, n.as_bytes()).await;
        }
        all.sort();
        assert_eq!(names(&b, &vault).await, all, "counts: {counts}");
    }
}
