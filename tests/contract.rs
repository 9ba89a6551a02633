//! The contract of the interface, written once against [`Backend`] and run twice: on the local
//! backend in process, and on the remote backend talking to `vaultfs serve` over loopback
//! (remote -> HTTP -> server -> store). Both must answer every case the same way.
//!
//! A third run puts the remote backend against `common::dialect`, a server that answers strictly
//! in the public service's documented shapes (integer codes, base64 md5, `Replace`, chunked
//! downloads, strings for numbers, capped pages, its own client ID).
//!
//! Below the contract: the remote backend alone against a hand-written HTTP server on 127.0.0.1
//! that misbehaves (5xx, garbage, silence, broken bodies), and the login flow.

mod common;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::TestServer;
use common::dialect::{DialectOptions, DialectServer};
use common::fixtures::{png_size, sample_text};
use vaultfs::api::{Error, ErrorKind, Node, NodePath, NodeType, PreviewStatus, RangeRequest};
use vaultfs::backend::list_all;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream, Download};
use vaultfs::cli::login;
use vaultfs::store::{Store, StoreConfig};

// ----- the two worlds -----

/// Two users in two accounts (`Acme`, `Other`), each with its `My First Vault`.
struct World<B: Backend> {
    a: B,
    other: B,
    vault: NodePath,
    other_vault: NodePath,
    store: Arc<Store>,
    /// The server keeps the times and modes clients set (ours; not the public service).
    keeps_attrs: bool,
    _keep: Keep,
}

#[allow(dead_code)]
enum Keep {
    Dir(tempfile::TempDir),
    Server(TestServer),
    Dialect(DialectServer),
}

async fn local_world() -> World<LocalBackend> {
    local_world_with(StoreConfig::default()).await
}

async fn local_world_with(config: StoreConfig) -> World<LocalBackend> {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&tmp.path().join("data"), config).unwrap());
    store.add_user("a@acme.test", "Acme", "pw-a").unwrap();
    store.add_user("b@other.test", "Other", "pw-b").unwrap();
    store.start_previews(1).unwrap();
    let (acme, other) = (
        store.ensure_account("Acme").unwrap(),
        store.ensure_account("Other").unwrap(),
    );
    World {
        a: LocalBackend::for_account(store.clone(), acme),
        other: LocalBackend::for_account(store.clone(), other),
        vault: path("/Acme/My First Vault"),
        other_vault: path("/Other/My First Vault"),
        store,
        keeps_attrs: true,
        _keep: Keep::Dir(tmp),
    }
}

async fn remote_world() -> World<RemoteBackend> {
    remote_world_with(StoreConfig::default()).await
}

/// The store's blobs in a bucket of a real S3-compatible server (`None`: none installed).
fn s3_config() -> Option<StoreConfig> {
    Some(StoreConfig {
        blobs: common::s3::s3()?.location(),
        ..StoreConfig::default()
    })
}

/// The store's metadata in a database of a real PostgreSQL (`None`: none installed).
fn pg_config() -> Option<StoreConfig> {
    Some(StoreConfig {
        database: Some(common::pg::pg()?.database()),
        ..StoreConfig::default()
    })
}

async fn remote_world_with(config: StoreConfig) -> World<RemoteBackend> {
    let server = TestServer::start_with(config, Default::default()).await;
    let a = server.user("a@acme.test", "Acme").await;
    let b = server.user("b@other.test", "Other").await;
    let backend = |email: &str, token: &str| {
        RemoteBackend::new(RemoteConfig::new(&server.base, email, token)).unwrap()
    };
    World {
        a: backend(&a.email, &a.token),
        other: backend(&b.email, &b.token),
        vault: path("/Acme/My First Vault"),
        other_vault: path("/Other/My First Vault"),
        store: server.store.clone(),
        keeps_attrs: true,
        _keep: Keep::Server(server),
    }
}

async fn dialect_world() -> World<RemoteBackend> {
    let server = DialectServer::start(DialectOptions::default()).await;
    World {
        a: server.user("a@acme.test", "Acme").await,
        other: server.user("b@other.test", "Other").await,
        vault: path("/Acme/My First Vault"),
        other_vault: path("/Other/My First Vault"),
        store: server.store.clone(),
        keeps_attrs: false,
        _keep: Keep::Dialect(server),
    }
}

/// Each contract case becomes `local::case`, `remote::case` and `dialect::case`,
/// `local_pg::case` and `remote_pg::case` with the metadata in PostgreSQL, and
/// `local_s3::case` and `remote_s3::case` with the blobs in a bucket of a real S3-compatible server.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    super::$case(&super::local_world().await).await;
                }
            )*
        }
        mod remote {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    super::$case(&super::remote_world().await).await;
                }
            )*
        }
        mod dialect {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    super::$case(&super::dialect_world().await).await;
                }
            )*
        }
        /// The local backend over a store whose metadata is in PostgreSQL.
        mod local_pg {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    if let Some(c) = super::pg_config() {
                        super::$case(&super::local_world_with(c).await).await;
                    }
                }
            )*
        }
        /// The remote backend against `vaultfs serve --database postgres://...`.
        mod remote_pg {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    if let Some(c) = super::pg_config() {
                        super::$case(&super::remote_world_with(c).await).await;
                    }
                }
            )*
        }
        /// `vaultfs serve` on PostgreSQL and S3, as several servers of one store run.
        mod remote_pg_s3 {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    if let (Some(pg), Some(s3)) = (super::pg_config(), super::s3_config()) {
                        let c = vaultfs::store::StoreConfig { blobs: s3.blobs, ..pg };
                        super::$case(&super::remote_world_with(c).await).await;
                    }
                }
            )*
        }
        /// The local backend over a store whose blobs are in S3.
        mod local_s3 {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    if let Some(c) = super::s3_config() {
                        super::$case(&super::local_world_with(c).await).await;
                    }
                }
            )*
        }
        /// The remote backend against `vaultfs serve` over a store whose blobs are in S3.
        mod remote_s3 {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    if let Some(c) = super::s3_config() {
                        super::$case(&super::remote_world_with(c).await).await;
                    }
                }
            )*
        }
    };
}

contract!(
    nodes_and_paging,
    folders,
    create_file_cases,
    begin_version_cases,
    attribute_cases,
    upload_cases,
    concurrent_uploads_get_their_own_answers,
    download_cases,
    copy_cases,
    move_cases,
    delete_cases,
    other_accounts_are_forbidden,
    preview_cases,
);

// ----- helpers -----

fn path(uri: &str) -> NodePath {
    NodePath::parse_uri(&format!("/nodes/pth{uri}")).unwrap()
}

fn at(base: &NodePath, rel: &str) -> NodePath {
    rel.split('/')
        .fold(base.clone(), |p, s| p.child(s).unwrap())
}

fn md5hex(data: &[u8]) -> String {
    format!("{:x}", Md5::digest(data))
}

/// Bytes that differ at every offset, so a shifted range shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// `data` as a stream of small chunks, as a file would be read.
fn stream(data: &[u8]) -> ByteStream {
    let chunks: Vec<io::Result<Bytes>> = data
        .chunks(64 * 1024 + 3)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Box::pin(futures_util::stream::iter(chunks))
}

#[track_caller]
fn err<T>(r: vaultfs::api::Result<T>) -> Error {
    match r {
        Ok(_) => panic!("expected an error, got a {}", std::any::type_name::<T>()),
        Err(e) => e,
    }
}

/// Asserts the kind (and code, when given) of an error. A server that names no error (the
/// public service sends only its integer) is held to what its documented code means.
#[track_caller]
fn assert_err<T>(r: vaultfs::api::Result<T>, kind: ErrorKind, code: Option<&str>) {
    let e = err(r);
    assert_eq!(e.kind, kind, "{e:?}");
    let unnamed = e.number.is_some_and(|n| n < 0) && e.code == kind.default_code();
    if let Some(code) = code {
        assert!(e.code == code || unnamed, "{e:?}");
    }
    assert!(!e.message.is_empty());
}

/// The three upload steps; returns the file as step 3 answered.
async fn put<B: Backend>(b: &B, folder: &NodePath, name: &str, data: &[u8]) -> Node {
    let file = b.create_file(folder, name).await.unwrap();
    let id = file.file_id().unwrap();
    let v = b
        .begin_version(&id, data.len() as u64, Some(&md5hex(data)))
        .await
        .unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let node = b
        .upload(&id, &vid, data.len() as u64, stream(data))
        .await
        .unwrap();
    assert_eq!(node.size, Some(data.len() as u64));
    assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(data).as_str()));
    node
}

async fn read_all(d: Download) -> io::Result<Vec<u8>> {
    let mut body = d.body;
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

async fn content<B: Backend>(b: &B, id: &str) -> Vec<u8> {
    read_all(b.download(id, None).await.unwrap()).await.unwrap()
}

async fn names<B: Backend>(b: &B, p: &NodePath) -> Vec<String> {
    let n = list_all(b, p, 1000).await.unwrap();
    n.children.unwrap().into_iter().map(|c| c.name).collect()
}

// ----- the contract -----

async fn nodes_and_paging<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let vault = b.node(&w.vault).await.unwrap();
    assert_eq!(vault.node_type, NodeType::VaultNodeType);
    assert_eq!(vault.name, "My First Vault");
    assert_eq!(vault.uri, "/nodes/pth/Acme/My First Vault");
    // The root shows the caller's account only.
    assert_eq!(names(b, &NodePath::root()).await, ["Acme"]);

    let dir = at(&w.vault, "paging");
    b.create_folder(&dir).await.unwrap();
    let mut all: Vec<String> = ["g", "c", "a", "f", "b", "e", "d"].map(String::from).into();
    for n in &all {
        put(b, &dir, n, n.as_bytes()).await;
    }
    all.sort();
    let mut pages = Vec::new();
    for page in 0..4 {
        let n = b.list(&dir, page, 3).await.unwrap();
        assert_eq!(n.total_children, Some(7));
        assert_eq!(n.name, "paging");
        let got: Vec<String> = n.children.unwrap().into_iter().map(|c| c.name).collect();
        assert_eq!(got.len(), [3, 3, 1, 0][page as usize], "page {page}");
        pages.extend(got);
    }
    assert_eq!(pages, all);
    let whole = list_all(b, &dir, 2).await.unwrap();
    assert_eq!(whole.total_children, Some(7));
    let kids = whole.children.unwrap();
    assert_eq!(kids.iter().map(|c| c.name.clone()).collect::<Vec<_>>(), all);
    assert!(kids.iter().all(|c| c.is_file() && c.size == Some(1)));

    let f = b.node(&at(&dir, "c")).await.unwrap();
    let id = f.file_id().unwrap();
    assert!(f.is_file());
    assert_eq!((f.name.as_str(), f.size), ("c", Some(1)));
    assert_eq!(f.uri, "/nodes/pth/Acme/My First Vault/paging/c");
    assert_eq!(f.md5_checksum.as_deref(), Some(md5hex(b"c").as_str()));
    for link in [&f.link_uri, &f.preview_link_uri, &f.download_link_uri] {
        assert!(link.as_deref().unwrap().ends_with(&format!("&id={id}")));
    }
    assert!(f.download_uri.as_deref().unwrap().ends_with(&id));
    assert!(f.created_time().is_some() && f.modified_time().is_some());

    // Names that need encoding on the request line come back as they were.
    let odd = at(&w.vault, "Résumé & notes #1 %20?+");
    b.create_folder(&odd).await.unwrap();
    put(b, &odd, "a b;c=d.txt", b"x").await;
    assert_eq!(b.node(&odd).await.unwrap().name, "Résumé & notes #1 %20?+");
    assert_eq!(names(b, &odd).await, ["a b;c=d.txt"]);

    assert_err(
        b.node(&at(&w.vault, "nope")).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.list(&at(&w.vault, "nope"), 0, 10).await,
        ErrorKind::NotFound,
        None,
    );
}

async fn folders<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let docs = at(&w.vault, "docs");
    let made = b.create_folder(&docs).await.unwrap();
    assert_eq!(made.node_type, NodeType::FolderNodeType);
    assert_eq!(
        (made.name.as_str(), made.uri.as_str()),
        ("docs", "/nodes/pth/Acme/My First Vault/docs")
    );
    let sub = b.create_folder(&at(&docs, "sub")).await.unwrap();
    assert_eq!(sub.name, "sub");
    assert_eq!(names(b, &docs).await, ["sub"]);

    assert_err(
        b.create_folder(&docs).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_err(
        b.create_folder(&at(&w.vault, "missing/x")).await,
        ErrorKind::NotFound,
        None,
    );
    put(b, &docs, "f.txt", b"f").await;
    // A file already has the name; a file cannot hold a folder.
    assert_err(
        b.create_folder(&at(&docs, "f.txt")).await,
        ErrorKind::Conflict,
        None,
    );
    assert_err(
        b.create_folder(&at(&docs, "f.txt/x")).await,
        ErrorKind::Conflict,
        None,
    );
    // Vaults come with accounts.
    assert_err(
        b.create_folder(&path("/Acme/Second Vault")).await,
        ErrorKind::Forbidden,
        None,
    );
}

async fn create_file_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let f = b.create_file(&w.vault, "new.txt").await.unwrap();
    let id = f.file_id().unwrap();
    assert!(f.is_file());
    assert_eq!(f.name, "new.txt");
    assert!(f.size.unwrap_or(0) == 0);
    // A never uploaded file reads as empty.
    assert_eq!(content(b, &id).await, b"");

    // An existing file is returned as it is: same ID, content kept.
    put(b, &w.vault, "new.txt", b"kept").await;
    let again = b.create_file(&w.vault, "new.txt").await.unwrap();
    assert_eq!(again.file_id().unwrap(), id);
    assert_eq!(again.size, Some(4));
    assert_eq!(content(b, &id).await, b"kept");

    b.create_folder(&at(&w.vault, "dir")).await.unwrap();
    assert_err(
        b.create_file(&w.vault, "dir").await,
        ErrorKind::Conflict,
        None,
    );
    assert_err(
        b.create_file(&at(&w.vault, "missing"), "x").await,
        ErrorKind::NotFound,
        None,
    );
    for bad in ["..", ".", "a/b", "a\0b"] {
        assert_err(
            b.create_file(&w.vault, bad).await,
            ErrorKind::BadRequest,
            Some("bad_path"),
        );
    }
    assert_err(
        b.create_file(&w.vault, "").await,
        ErrorKind::BadRequest,
        None,
    );
    assert_eq!(names(b, &w.vault).await, ["dir", "new.txt"]);
}

async fn begin_version_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let f = b.create_file(&w.vault, "v.txt").await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, 3, None).await.unwrap();
    assert_eq!(v.file_id().unwrap(), id);
    let ex = v.file_ex_properties.unwrap();
    let vid = ex.version_id.unwrap();
    assert_eq!(ex.upload_uri, format!("/nodes/upload/{id}/{vid}"));
    assert_err(
        b.begin_version("999999999", 3, None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.begin_version("not-an-id", 3, None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.begin_version(&id, 3, Some("xyz")).await,
        ErrorKind::BadRequest,
        None,
    );
    // Without an md5 the server computes it.
    let node = b.upload(&id, &vid, 3, stream(b"abc")).await.unwrap();
    assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(b"abc").as_str()));
}

/// Times and modes a client sets (issue 22): with a new version (step 2) or alone, before 1970
/// and after 2038 to the nanosecond. A server that keeps none (the public service) refuses the
/// update alone and stores a version as if no attributes had been given.
async fn attribute_cases<B: Backend>(w: &World<B>) {
    use vaultfs::api::FileAttrs;
    let b = &w.a;
    let epoch = SystemTime::UNIX_EPOCH;
    let before_1970 = epoch - Duration::new(315_619_200, 0) + Duration::from_nanos(123_456_789);
    let after_2038 = epoch + Duration::new(4_102_444_800, 987_654_321);
    let in_2001 = epoch + Duration::from_secs(1_000_000_000);
    let started = SystemTime::now() - Duration::from_secs(2);
    let file = put(b, &w.vault, "times.sh", b"#!/bin/sh\n").await;
    let id = file.file_id().unwrap();
    let p = at(&w.vault, "times.sh");
    let set = |modified, mode| FileAttrs { modified, mode };

    if !w.keeps_attrs {
        assert_err(
            b.set_attrs(&id, set(Some(in_2001), None)).await,
            ErrorKind::BadRequest,
            None,
        );
        let v = b
            .begin_version_with(&id, 2, None, set(Some(in_2001), Some(0o755)))
            .await
            .unwrap();
        let vid = v.version_id().unwrap();
        let node = b.upload(&id, &vid, 2, stream(b"ok")).await.unwrap();
        assert!(node.modified_time().unwrap() >= started, "{node:?}");
        assert_ne!(node.mode, Some(0o755));
        return;
    }

    assert_eq!(file.mode, Some(0o644));
    let node = b
        .set_attrs(&id, set(Some(before_1970), Some(0o755)))
        .await
        .unwrap();
    assert_eq!(node.modified_time(), Some(before_1970), "{node:?}");
    assert_eq!(node.mode, Some(0o755));
    let node = b.node(&p).await.unwrap();
    assert_eq!(node.modified_time(), Some(before_1970));
    assert_eq!(node.mode, Some(0o755));
    // One attribute alone leaves the other as it is; only the execute bits are kept.
    let node = b.set_attrs(&id, set(Some(after_2038), None)).await.unwrap();
    assert_eq!(node.modified_time(), Some(after_2038));
    assert_eq!(node.mode, Some(0o755));
    let node = b.set_attrs(&id, set(None, Some(0o700))).await.unwrap();
    assert_eq!(
        (node.modified_time(), node.mode),
        (Some(after_2038), Some(0o744))
    );
    let listed = b.list(&w.vault, 0, 100).await.unwrap().children.unwrap();
    let listed = listed.iter().find(|c| c.name == "times.sh").unwrap();
    assert_eq!(
        (listed.modified_time(), listed.mode),
        (Some(after_2038), Some(0o744))
    );

    // With a version: taken when it is committed, not before.
    let v = b
        .begin_version_with(&id, 2, None, set(Some(in_2001), Some(0o644)))
        .await
        .unwrap();
    assert_eq!(v.modified_time(), Some(after_2038));
    let vid = v.version_id().unwrap();
    let node = b.upload(&id, &vid, 2, stream(b"ok")).await.unwrap();
    assert_eq!(
        (node.modified_time(), node.mode),
        (Some(in_2001), Some(0o644))
    );
    // A version without a time is modified at its commit; the bits stay.
    b.set_attrs(&id, set(None, Some(0o755))).await.unwrap();
    let node = put(b, &w.vault, "times.sh", b"again").await;
    assert!(node.modified_time().unwrap() >= started, "{node:?}");
    assert_eq!(node.mode, Some(0o755));

    assert_err(
        b.set_attrs("999999999", set(Some(in_2001), None)).await,
        ErrorKind::NotFound,
        None,
    );
    // Another account's file is not found either, and keeps its time.
    assert_err(
        w.other.set_attrs(&id, set(Some(in_2001), None)).await,
        ErrorKind::NotFound,
        None,
    );
    assert_ne!(b.node(&p).await.unwrap().modified_time(), Some(in_2001));
}

/// Step 3s that arrive together are committed together (one durable transaction); each still
/// gets its own answer: bytes shared by several files stored once, a wrong checksum failing
/// alone, every other file whole.
async fn concurrent_uploads_get_their_own_answers<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let folder = at(&w.vault, "many");
    b.create_folder(&folder).await.unwrap();
    // 0..40 distinct, 40..52 the same bytes, 52..60 announced with another md5.
    let body = |i: usize| -> Vec<u8> {
        if (40..52).contains(&i) {
            b"the same bytes in twelve files".to_vec()
        } else {
            format!("file {i} ").repeat(i + 1).into_bytes()
        }
    };
    let mut tickets = Vec::new();
    for i in 0..60 {
        let id = b
            .create_file(&folder, &format!("f{i:02}"))
            .await
            .unwrap()
            .file_id()
            .unwrap();
        let data = body(i);
        let md5 = if i >= 52 {
            md5hex(b"not these bytes")
        } else {
            md5hex(&data)
        };
        let v = b
            .begin_version(&id, data.len() as u64, Some(&md5))
            .await
            .unwrap();
        tickets.push((id, v.file_ex_properties.unwrap().version_id.unwrap(), data));
    }
    let answers = futures_util::future::join_all(
        tickets
            .iter()
            .map(|(id, vid, data)| b.upload(id, vid, data.len() as u64, stream(data))),
    )
    .await;
    for (i, (answer, (id, _, data))) in answers.into_iter().zip(&tickets).enumerate() {
        if i >= 52 {
            assert_err(answer, ErrorKind::BadRequest, Some("checksum_mismatch"));
            assert_eq!(
                b.node(&at(&folder, &format!("f{i:02}")))
                    .await
                    .unwrap()
                    .size,
                Some(0)
            );
        } else {
            let node = answer.unwrap_or_else(|e| panic!("upload {i}: {e:?}"));
            assert_eq!(node.name, format!("f{i:02}"));
            assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(data).as_str()));
            assert_eq!(&content(b, id).await, data, "file {i}");
        }
    }
    assert!(w.store.check_integrity().unwrap().is_empty());
}

async fn upload_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let id = put(b, &w.vault, "u.txt", b"old content")
        .await
        .file_id()
        .unwrap();
    let version = |len: u64, md5: Option<String>| {
        let id = id.clone();
        async move {
            let v = b.begin_version(&id, len, md5.as_deref()).await.unwrap();
            v.file_ex_properties.unwrap().version_id.unwrap()
        }
    };

    // The bytes sent differ from step 2's length, shorter and longer: 400, old content kept.
    let vid = version(20, None).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"short")).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    let vid = version(3, None).await;
    let long = b"much longer";
    assert_err(
        b.upload(&id, &vid, long.len() as u64, stream(long)).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    // The body ends before the length it was announced with.
    let vid = version(5, None).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"abc")).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    // Another md5 than announced.
    let vid = version(5, Some(md5hex(b"other"))).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"hello")).await,
        ErrorKind::BadRequest,
        Some("checksum_mismatch"),
    );
    assert_eq!(content(b, &id).await, b"old content");
    assert_eq!(b.node(&at(&w.vault, "u.txt")).await.unwrap().size, Some(11));

    // Success, then the same step 3 again succeeds; other bytes for it do not.
    let data = pattern(3 << 20);
    let vid = version(data.len() as u64, Some(md5hex(&data))).await;
    let node = b
        .upload(&id, &vid, data.len() as u64, stream(&data))
        .await
        .unwrap();
    assert_eq!(node.size, Some(data.len() as u64));
    assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(&data).as_str()));
    let again = b
        .upload(&id, &vid, data.len() as u64, stream(&data))
        .await
        .unwrap();
    assert_eq!(again.md5_checksum, node.md5_checksum);
    let mut other = data.clone();
    other[0] ^= 1;
    assert_err(
        b.upload(&id, &vid, other.len() as u64, stream(&other))
            .await,
        ErrorKind::Conflict,
        None,
    );
    assert!(content(b, &id).await == data);

    assert_err(
        b.upload(&id, "424242", 1, stream(b"x")).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.upload("999999999", &vid, 1, stream(b"x")).await,
        ErrorKind::NotFound,
        None,
    );

    // An empty file.
    let e = put(b, &w.vault, "empty", b"").await;
    assert_eq!(content(b, &e.file_id().unwrap()).await, b"");
}

async fn download_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let data = pattern(1000);
    let id = put(b, &w.vault, "d.bin", &data).await.file_id().unwrap();

    let d = b.download(&id, None).await.unwrap();
    assert_eq!((d.total_size, d.range, d.len()), (1000, None, 1000));
    assert_eq!(d.node.size, Some(1000));
    assert_eq!(d.node.md5_checksum.as_deref(), Some(md5hex(&data).as_str()));
    assert!(read_all(d).await.unwrap() == data);

    let cases = [
        (RangeRequest::span(0, 1), (0, 0)),
        (
            RangeRequest::From {
                start: 100,
                end: Some(199),
            },
            (100, 199),
        ),
        (RangeRequest::Suffix(10), (990, 999)),
        (RangeRequest::Suffix(5000), (0, 999)),
        (
            RangeRequest::From {
                start: 995,
                end: None,
            },
            (995, 999),
        ),
        (
            RangeRequest::From {
                start: 990,
                end: Some(5000),
            },
            (990, 999),
        ),
        (
            RangeRequest::From {
                start: 999,
                end: Some(999),
            },
            (999, 999),
        ),
    ];
    for (r, (a, z)) in cases {
        let d = b.download(&id, Some(r)).await.unwrap();
        assert_eq!(
            (d.range, d.total_size, d.len()),
            (Some((a, z)), 1000, z - a + 1),
            "{r}"
        );
        let got = read_all(d).await.unwrap();
        assert!(got == data[a as usize..=z as usize], "{r}");
    }
    for r in [
        RangeRequest::From {
            start: 1000,
            end: None,
        },
        RangeRequest::From {
            start: 5000,
            end: Some(6000),
        },
    ] {
        assert_err(
            b.download(&id, Some(r)).await,
            ErrorKind::RangeNotSatisfiable,
            None,
        );
    }
    let empty = put(b, &w.vault, "empty", b"").await.file_id().unwrap();
    assert_err(
        b.download(&empty, Some(RangeRequest::span(0, 1))).await,
        ErrorKind::RangeNotSatisfiable,
        None,
    );
    assert_err(
        b.download("999999999", None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.download("not-an-id", None).await,
        ErrorKind::NotFound,
        None,
    );
}

async fn copy_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let src = at(&w.vault, "a.txt");
    let src_id = put(b, &w.vault, "a.txt", b"alpha").await.file_id().unwrap();
    b.create_folder(&at(&w.vault, "box")).await.unwrap();
    let blobs = w.store.blob_count().unwrap();

    let copied = b
        .copy(&src, &at(&w.vault, "box/a2.txt"), false)
        .await
        .unwrap();
    assert_eq!(copied.uri, "/nodes/pth/Acme/My First Vault/box/a2.txt");
    let copy_id = copied.file_id().unwrap();
    assert_ne!(copy_id, src_id);
    assert_eq!(
        copied.md5_checksum.as_deref(),
        Some(md5hex(b"alpha").as_str())
    );
    assert_eq!(content(b, &copy_id).await, b"alpha");
    assert_eq!(content(b, &src_id).await, b"alpha");
    // The copy shares the stored bytes.
    assert_eq!(w.store.blob_count().unwrap(), blobs);

    // The copy is its own file from now on.
    put(b, &w.vault, "a.txt", b"alpha v2").await;
    assert_eq!(content(b, &copy_id).await, b"alpha");

    put(b, &w.vault, "b.txt", b"beta").await;
    let b_path = at(&w.vault, "b.txt");
    assert_err(
        b.copy(&src, &b_path, false).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_eq!(
        content(b, &b.node(&b_path).await.unwrap().file_id().unwrap()).await,
        b"beta"
    );
    let over = b.copy(&src, &b_path, true).await.unwrap();
    assert_eq!(content(b, &over.file_id().unwrap()).await, b"alpha v2");

    // A folder is copied with everything under it.
    let tree = at(&w.vault, "tree");
    b.create_folder(&tree).await.unwrap();
    b.create_folder(&at(&tree, "sub")).await.unwrap();
    put(b, &at(&tree, "sub"), "deep.txt", b"deep").await;
    put(b, &tree, "top.txt", b"top").await;
    let t2 = at(&w.vault, "box/tree2");
    let copied = b.copy(&tree, &t2, false).await.unwrap();
    assert_eq!(copied.node_type, NodeType::FolderNodeType);
    assert_eq!(names(b, &t2).await, ["sub", "top.txt"]);
    let deep = b.node(&at(&t2, "sub/deep.txt")).await.unwrap();
    assert_eq!(content(b, &deep.file_id().unwrap()).await, b"deep");
    assert_eq!(names(b, &tree).await, ["sub", "top.txt"]);

    assert_err(
        b.copy(&at(&w.vault, "nope"), &at(&w.vault, "x"), false)
            .await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.copy(&src, &at(&w.vault, "missing/x"), false).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.copy(&w.vault, &at(&w.vault, "v2"), false).await,
        ErrorKind::Forbidden,
        None,
    );
}

async fn move_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let v = &w.vault;
    let id = put(b, v, "m.txt", b"move me").await.file_id().unwrap();

    // Rename in place keeps the file (ID and content).
    let moved = b
        .rename(&at(v, "m.txt"), &at(v, "n.txt"), false)
        .await
        .unwrap();
    assert_eq!(
        (moved.name.as_str(), moved.file_id().unwrap()),
        ("n.txt", id.clone())
    );
    assert_err(b.node(&at(v, "m.txt")).await, ErrorKind::NotFound, None);
    assert_eq!(content(b, &id).await, b"move me");

    // Across folders.
    b.create_folder(&at(v, "dst")).await.unwrap();
    let moved = b
        .rename(&at(v, "n.txt"), &at(v, "dst/n.txt"), false)
        .await
        .unwrap();
    assert_eq!(moved.uri, "/nodes/pth/Acme/My First Vault/dst/n.txt");
    assert_eq!(names(b, &at(v, "dst")).await, ["n.txt"]);
    assert_err(b.node(&at(v, "n.txt")).await, ErrorKind::NotFound, None);

    // A folder into itself.
    b.create_folder(&at(v, "dst/inner")).await.unwrap();
    assert_err(
        b.rename(&at(v, "dst"), &at(v, "dst/inner/dst"), false)
            .await,
        ErrorKind::BadRequest,
        None,
    );

    // Replace semantics: fail keeps both, replace overwrites and the source goes.
    let other = put(b, v, "o.txt", b"other").await.file_id().unwrap();
    let target = at(v, "dst/n.txt");
    assert_err(
        b.rename(&at(v, "o.txt"), &target, false).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_eq!(content(b, &id).await, b"move me");
    let over = b.rename(&at(v, "o.txt"), &target, true).await.unwrap();
    assert_eq!(over.file_id().unwrap(), other);
    assert_eq!(
        content(b, &b.node(&target).await.unwrap().file_id().unwrap()).await,
        b"other"
    );
    assert_err(b.node(&at(v, "o.txt")).await, ErrorKind::NotFound, None);

    // Kinds must match, and a folder replaced must be empty.
    put(b, v, "file", b"f").await;
    assert_err(
        b.rename(&at(v, "file"), &at(v, "dst"), true).await,
        ErrorKind::Conflict,
        None,
    );
    b.create_folder(&at(v, "empty")).await.unwrap();
    b.create_folder(&at(v, "full")).await.unwrap();
    put(b, &at(v, "full"), "x", b"x").await;
    assert_err(
        b.rename(&at(v, "empty"), &at(v, "full"), true).await,
        ErrorKind::Conflict,
        None,
    );
    assert_eq!(names(b, &at(v, "full")).await, ["x"]);
    b.rename(&at(v, "full"), &at(v, "empty"), true)
        .await
        .unwrap();
    assert_eq!(names(b, &at(v, "empty")).await, ["x"]);
    assert_err(b.node(&at(v, "full")).await, ErrorKind::NotFound, None);

    assert_err(
        b.rename(&at(v, "nope"), &at(v, "x"), false).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.rename(&w.vault, &at(v, "x"), false).await,
        ErrorKind::Forbidden,
        None,
    );
}

async fn delete_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let v = &w.vault;
    let id = put(b, v, "gone.txt", b"bye").await.file_id().unwrap();
    b.delete(&at(v, "gone.txt")).await.unwrap();
    assert_err(b.node(&at(v, "gone.txt")).await, ErrorKind::NotFound, None);
    assert_err(b.download(&id, None).await, ErrorKind::NotFound, None);
    assert_err(
        b.delete(&at(v, "gone.txt")).await,
        ErrorKind::NotFound,
        None,
    );

    let dir = at(v, "dir");
    b.create_folder(&dir).await.unwrap();
    b.create_folder(&at(&dir, "sub")).await.unwrap();
    let deep = put(b, &at(&dir, "sub"), "deep", b"deep")
        .await
        .file_id()
        .unwrap();
    b.delete(&dir).await.unwrap();
    assert_err(b.node(&at(v, "dir/sub")).await, ErrorKind::NotFound, None);
    assert_err(b.download(&deep, None).await, ErrorKind::NotFound, None);
    assert!(names(b, v).await.is_empty());

    assert_err(b.delete(v).await, ErrorKind::Forbidden, None);
    assert_err(b.delete(&path("/Acme")).await, ErrorKind::Forbidden, None);
    assert!(b.node(v).await.is_ok());
}

async fn other_accounts_are_forbidden<B: Backend>(w: &World<B>) {
    let (b, theirs) = (&w.a, &w.other);
    let ov = &w.other_vault;
    let their_file = put(theirs, ov, "secret.txt", b"secret")
        .await
        .file_id()
        .unwrap();
    let their_path = at(ov, "secret.txt");
    let mine = put(b, &w.vault, "mine.txt", b"mine").await;
    let f = ErrorKind::Forbidden;

    // By path.
    assert_err(b.node(&their_path).await, f, None);
    assert_err(b.node(&at(ov, "does-not-exist")).await, f, None);
    assert_err(b.list(ov, 0, 10).await, f, None);
    assert_err(b.create_folder(&at(ov, "x")).await, f, None);
    assert_err(b.create_file(ov, "x").await, f, None);
    assert_err(b.delete(&their_path).await, f, None);
    assert_err(
        b.copy(&their_path, &at(&w.vault, "stolen"), false).await,
        f,
        None,
    );
    assert_err(
        b.copy(&at(&w.vault, "mine.txt"), &at(ov, "planted"), false)
            .await,
        f,
        None,
    );
    assert_err(
        b.rename(&their_path, &at(&w.vault, "stolen"), false).await,
        f,
        None,
    );
    // By ID: not found, as an unused ID would be (IDs are not to be counted).
    let nf = ErrorKind::NotFound;
    assert_err(b.download(&their_file, None).await, nf, None);
    assert_err(b.begin_version(&their_file, 1, None).await, nf, None);
    assert_err(b.preview(&their_file).await, nf, None);
    assert_err(
        theirs.download(&mine.file_id().unwrap(), None).await,
        nf,
        None,
    );

    // Nothing of theirs changed.
    assert_eq!(names(theirs, ov).await, ["secret.txt"]);
    assert_eq!(content(theirs, &their_file).await, b"secret");
    assert_eq!(names(b, &w.vault).await, ["mine.txt"]);
}

/// Polls the preview metadata until it leaves InProgress.
async fn settled<B: Backend>(b: &B, id: &str) -> vaultfs::api::PreviewMeta {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let meta = b.preview(id).await.unwrap();
        if meta.status != PreviewStatus::InProgress {
            return meta;
        }
        assert!(
            Instant::now() < deadline,
            "preview of {id} still in progress after 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn preview_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let id = put(b, &w.vault, "notes.txt", &sample_text())
        .await
        .file_id()
        .unwrap();
    let meta = settled(b, &id).await;
    assert_eq!(meta.status, PreviewStatus::Ready);
    assert!(meta.pages.len() >= 2, "{meta:?}");
    let base = format!("/preview/id/Document/{id}");
    assert_eq!(
        meta.pdf_uri.as_deref(),
        Some(format!("{base}/pdf").as_str())
    );
    for (i, p) in meta.pages.iter().enumerate() {
        assert_eq!(p.page_number as usize, i + 1);
        assert_eq!(p.page_uri, format!("{base}/{}", i + 1));
        assert_eq!(
            (p.width, p.height),
            (1224, 1584),
            "Letter at 2 px per point"
        );
    }

    // Pages at 100%, scaled, and bounded; the aspect ratio is kept and every bound holds.
    let page = |n: u32, scale: Option<u32>, max_width: Option<u32>, max_height: Option<u32>| {
        let size = vaultfs::api::PageSize {
            scale,
            max_width,
            max_height,
        };
        b.preview_page(&id, n, size)
    };
    let full = page(1, None, None, None).await.unwrap();
    assert_eq!(full.content_type, "image/png");
    assert_eq!(png_size(&full.data), (1224, 1584));
    let thumb = page(2, Some(25), None, None).await.unwrap();
    assert_eq!(png_size(&thumb.data), (306, 396));
    let (w1, h1) = png_size(&page(1, None, Some(100), None).await.unwrap().data);
    assert_eq!(w1, 100);
    assert!((h1 as i64 - 129).abs() <= 1, "{w1}x{h1}");
    let (w2, h2) = png_size(&page(1, Some(50), Some(400), Some(300)).await.unwrap().data);
    assert!(w2 <= 400 && (299..=300).contains(&h2), "{w2}x{h2}");
    assert!(((w2 as f64 / h2 as f64) - 1224.0 / 1584.0).abs() < 0.01);
    let n = meta.pages.len() as u32;
    assert_err(
        page(n + 1, None, None, None).await,
        ErrorKind::NotFound,
        None,
    );

    // The PDF of a text file is made for it, with the text in it.
    let mut pdf = Vec::new();
    let mut body = b.preview_pdf(&id).await.unwrap().body;
    while let Some(chunk) = body.next().await {
        pdf.extend_from_slice(&chunk.unwrap());
    }
    assert!(pdf.starts_with(b"%PDF-"));

    // A copy shares the preview of its bytes at once; a new version gets a new one.
    let copy = b
        .copy(&at(&w.vault, "notes.txt"), &at(&w.vault, "copy.txt"), false)
        .await
        .unwrap();
    let copy_meta = b.preview(&copy.file_id().unwrap()).await.unwrap();
    assert_eq!(copy_meta.status, PreviewStatus::Ready);
    assert_eq!(copy_meta.pages.len(), meta.pages.len());
    put(b, &w.vault, "notes.txt", b"one short line\n").await;
    let meta2 = settled(b, &id).await;
    assert_eq!(meta2.status, PreviewStatus::Ready);
    assert_eq!(meta2.pages.len(), 1);

    // Bytes with no type: no preview, and no pages or PDF.
    let junk: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let jid = put(b, &w.vault, "blob.bin", &junk).await.file_id().unwrap();
    let jm = settled(b, &jid).await;
    assert_eq!(jm.status, PreviewStatus::TypeNotSupported);
    assert!(jm.pages.is_empty() && jm.pdf_uri.is_none());
    assert_err(
        b.preview_page(&jid, 1, Default::default()).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(b.preview_pdf(&jid).await, ErrorKind::NotFound, None);
    // A file created but never uploaded has nothing to preview.
    let empty = b.create_file(&w.vault, "never.txt").await.unwrap();
    let em = b.preview(&empty.file_id().unwrap()).await.unwrap();
    assert_eq!(em.status, PreviewStatus::TypeNotSupported);
    assert_err(b.preview("999999999").await, ErrorKind::NotFound, None);
}

// ----- the remote backend against a misbehaving server -----

/// What the hand-written server does with one request, given its number (from 0) and head.
enum Reply {
    /// Writes these bytes and closes the connection.
    Send(Vec<u8>),
    /// Writes these bytes and then keeps the connection open without a word.
    SendThenStall(Vec<u8>),
}

struct Mock {
    base: String,
    /// The head of every request received.
    heads: Arc<Mutex<Vec<String>>>,
}

impl Mock {
    fn count(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
    fn head(&self, i: usize) -> String {
        self.heads.lock().unwrap()[i].to_ascii_lowercase()
    }
}

/// A raw HTTP/1.1 server on 127.0.0.1 answering each request with `reply`.
async fn mock(reply: impl Fn(usize, &str) -> Reply + Send + Sync + 'static) -> Mock {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let reply = Arc::new(reply);
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (reply, seen) = (reply.clone(), seen.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.push(head.clone());
                    s.len() - 1
                };
                match reply(n, &head) {
                    Reply::Send(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        let _ = sock.shutdown().await;
                    }
                    Reply::SendThenStall(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                }
            });
        }
    });
    Mock { base, heads }
}

fn http(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn json(status: &str, body: &str) -> Vec<u8> {
    http(
        status,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

const NODE_OK: &str = r#"{"error":{"success":true},"message":{"name":"My First Vault","uri":"/nodes/pth/Acme/My First Vault","nodeType":"VaultNodeType","unknown":[1,2]}}"#;

/// Small bounds, so that the tests of failures are quick.
fn quick(base: &str) -> RemoteConfig {
    let mut c = RemoteConfig::new(base, "a@acme.test", "tok");
    c.connect_timeout = Duration::from_millis(500);
    c.idle_timeout = Duration::from_millis(400);
    c.total_timeout = Duration::from_millis(1500);
    c.retries = 3;
    c.backoff_base = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(40);
    c
}

fn vault() -> NodePath {
    path("/Acme/My First Vault")
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_retries_5xx_of_idempotent_calls_up_to_the_limit() {
    let m = mock(|n, _| {
        Reply::Send(if n < 2 {
            json(
                "503 Service Unavailable",
                r#"{"error":{"success":false,"error_code":"busy"}}"#,
            )
        } else {
            json("200 OK", NODE_OK)
        })
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    let node = b.node(&vault()).await.unwrap();
    assert_eq!(
        (node.name.as_str(), node.node_type),
        ("My First Vault", NodeType::VaultNodeType)
    );
    assert_eq!(m.count(), 3);
    // What was sent: the encoded path, Basic auth, JSON accepted.
    let head = m.head(0);
    assert!(
        head.starts_with("get /nodes/pth/acme/my%20first%20vault http/1.1"),
        "{head}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode("a@acme.test:tok");
    assert!(
        head.contains(&format!(
            "authorization: basic {}",
            basic.to_ascii_lowercase()
        )),
        "{head}"
    );
    assert!(head.contains("accept: application/json"), "{head}");

    // Always 503: 1 + 3 retries, then the error.
    let m = mock(|_, _| {
        Reply::Send(json(
            "503 Service Unavailable",
            r#"{"error":{"success":false}}"#,
        ))
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert_eq!(m.count(), 4);
    let mut c = quick(&m.base);
    c.retries = 0;
    let e = err(RemoteBackend::new(c).unwrap().node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert_eq!(m.count(), 5);

    // A DELETE or a move that reached the server is not repeated.
    let before = m.count();
    assert_eq!(
        err(b.delete(&at(&vault(), "x")).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(
        err(b.rename(&at(&vault(), "x"), &at(&vault(), "y"), true).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(
        err(b.begin_version("1", 1, None).await).kind,
        ErrorKind::Unavailable
    );
    assert_eq!(m.count(), before + 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_garbage_answers_are_typed_errors() {
    let answers: Vec<(Vec<u8>, ErrorKind, &str)> = vec![
        (
            http(
                "200 OK",
                &[("Content-Type", "text/html")],
                b"<html><body>Welcome</body></html>",
            ),
            ErrorKind::Server,
            "HTML",
        ),
        (
            json(
                "200 OK",
                r#"{"error":{"success":true},"message":{"name":"tru"#,
            ),
            ErrorKind::Server,
            "EOF",
        ),
        (
            json(
                "200 OK",
                r#"{"error":{"success":true},"message":{"name":42,"size":"big"}}"#,
            ),
            ErrorKind::Server,
            "expected",
        ),
        (
            json("200 OK", r#"{"message":{"name":"x"}}"#),
            ErrorKind::Server,
            "error",
        ),
        (json("200 OK", "[]"), ErrorKind::Server, ""),
        (http("200 OK", &[], b""), ErrorKind::Server, "empty"),
        (
            http(
                "502 Bad Gateway",
                &[("Content-Type", "text/html")],
                b"<h1>502</h1>",
            ),
            ErrorKind::Network,
            "502",
        ),
        (
            http("404 Not Found", &[("Content-Type", "text/plain")], b"no"),
            ErrorKind::NotFound,
            "404",
        ),
        // The public service says an invalid token with a 400.
        (
            json(
                "400 Bad Request",
                r#"{"error":{"success":false,"error_code":"invalid_token","error_text":"Token is invalid"}}"#,
            ),
            ErrorKind::Auth,
            "vaultfs login",
        ),
        (
            json(
                "401 Unauthorized",
                r#"{"error":{"success":false,"error_code":"invalid_token","error_text":"expired"}}"#,
            ),
            ErrorKind::Auth,
            "vaultfs login --server",
        ),
        // success decides, whatever the status says.
        (
            json(
                "200 OK",
                r#"{"error":{"success":false,"error_code":"not_found","status_code":404}}"#,
            ),
            ErrorKind::NotFound,
            "",
        ),
    ];
    for (i, (raw, kind, says)) in answers.into_iter().enumerate() {
        let m = mock(move |_, _| Reply::Send(raw.clone())).await;
        let mut c = quick(&m.base);
        c.retries = 0;
        let e = err(RemoteBackend::new(c).unwrap().node(&vault()).await);
        assert_eq!(e.kind, kind, "answer {i}: {e:?}");
        assert!(e.message.contains(says), "answer {i}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_silent_or_dead_server_fails_within_the_bound() {
    // Accepts, reads the request, never answers.
    let m = mock(|_, _| Reply::SendThenStall(Vec::new())).await;
    let c = quick(&m.base);
    let bound = c.total_timeout + Duration::from_millis(700);
    let b = RemoteBackend::new(c).unwrap();
    for call in 0..3 {
        let t = Instant::now();
        let e = match call {
            0 => err(b.node(&vault()).await),
            1 => err(b.download("1", None).await.map(|d| d.total_size)),
            _ => err(b.create_folder(&at(&vault(), "x")).await),
        };
        assert_eq!(e.kind, ErrorKind::Network, "{e:?}");
        assert!(t.elapsed() < bound, "call {call} took {:?}", t.elapsed());
    }
    // An upload to a server that takes nothing: no progress is an error too.
    let t = Instant::now();
    let e = err(b.upload("1", "2", 3, stream(b"abc")).await);
    assert_eq!(e.kind, ErrorKind::Network, "{e:?}");
    assert!(t.elapsed() < bound, "upload took {:?}", t.elapsed());

    // Nothing listens at all.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let b = RemoteBackend::new(quick(&format!("http://127.0.0.1:{port}"))).unwrap();
    let t = Instant::now();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Network);
    assert!(e.message.contains("after 4 attempt(s)"), "{e:?}");
    assert!(t.elapsed() < bound);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_broken_downloads_end_with_an_error() {
    let data = pattern(1000);
    let good_md5 = md5hex(&data);
    let d2 = data.clone();
    let m = mock(move |n, _| {
        let etag = format!("\"{good_md5}\"");
        match n {
            // Headers promise 1000 bytes, 500 come, then the connection closes.
            0 => Reply::Send(http("200 OK", &[("Content-Length", "1000")], &d2[..500])),
            // 500 come, then silence.
            1 => Reply::SendThenStall(http("200 OK", &[("Content-Length", "1000")], &d2[..500])),
            // All bytes, but not the ones the ETag (md5) describes.
            2 => Reply::Send(http(
                "200 OK",
                &[("ETag", "\"0123456789abcdef0123456789abcdef\"")],
                &d2,
            )),
            // A range that is shorter than its Content-Range says.
            3 => Reply::Send(http(
                "206 Partial Content",
                &[
                    ("Content-Range", "bytes 0-99/1000"),
                    ("Content-Length", "100"),
                    ("Accept-Ranges", "bytes"),
                ],
                &d2[..50],
            )),
            _ => Reply::Send(http("200 OK", &[("ETag", etag.as_str())], &d2)),
        }
    })
    .await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    for (i, kind) in [
        io::ErrorKind::UnexpectedEof,
        io::ErrorKind::TimedOut,
        io::ErrorKind::InvalidData,
    ]
    .into_iter()
    .enumerate()
    {
        let d = b.download("1", None).await.unwrap();
        assert_eq!(d.total_size, 1000);
        let e = read_all(d).await.unwrap_err();
        assert_eq!(e.kind(), kind, "download {i}: {e}");
        let inner = e
            .get_ref()
            .and_then(|e| e.downcast_ref::<Error>())
            .expect("an api::Error inside");
        assert!(!inner.message.is_empty());
    }
    let d = b
        .download("1", Some(RangeRequest::span(0, 100)))
        .await
        .unwrap();
    assert_eq!(d.range, Some((0, 99)));
    assert_eq!(
        read_all(d).await.unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    // And a good one, checked.
    let d = b.download("1", None).await.unwrap();
    assert!(read_all(d).await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_falls_back_to_whole_reads_without_range_support() {
    let data = pattern(1000);
    let d2 = data.clone();
    // A server that ignores Range and does not advertise it.
    let m = mock(move |_, _| Reply::Send(http("200 OK", &[], &d2))).await;
    let b = RemoteBackend::new(quick(&m.base)).unwrap();
    assert_eq!(b.supports_ranges(), None);
    let d = b
        .download(
            "7",
            Some(RangeRequest::From {
                start: 100,
                end: Some(199),
            }),
        )
        .await
        .unwrap();
    assert_eq!((d.range, d.total_size), (Some((100, 199)), 1000));
    assert!(read_all(d).await.unwrap() == data[100..200]);
    assert_eq!(b.supports_ranges(), Some(false));
    assert!(m.head(0).contains("range: bytes=100-199"));
    assert!(m.head(0).contains("accept: */*"), "{}", m.head(0));
    // Learned: no Range header any more, the cut is made here.
    let d = b
        .download("7", Some(RangeRequest::Suffix(10)))
        .await
        .unwrap();
    assert_eq!(d.range, Some((990, 999)));
    assert!(read_all(d).await.unwrap() == data[990..]);
    assert!(!m.head(1).contains("range:"), "{}", m.head(1));
    assert_err(
        b.download(
            "7",
            Some(RangeRequest::From {
                start: 1000,
                end: None,
            }),
        )
        .await,
        ErrorKind::RangeNotSatisfiable,
        None,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_learns_range_support_from_our_server() {
    let w = remote_world().await;
    let id = put(&w.a, &w.vault, "r.bin", &pattern(100))
        .await
        .file_id()
        .unwrap();
    assert_eq!(w.a.supports_ranges(), None);
    let d = w.a.download(&id, None).await.unwrap();
    drop(d);
    assert_eq!(w.a.supports_ranges(), Some(true));
}

// ----- the public service's dialect -----

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
    let data = pattern(300_000);
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

// ----- login -----

#[tokio::test(flavor = "multi_thread")]
async fn login_stores_a_token_that_the_remote_backend_uses() {
    let server = TestServer::start().await;
    server.store.add_user("a@acme.test", "Acme", "pw").unwrap();
    let pin = server
        .store
        .sign_in_for_pin("a@acme.test", "pw", login::CLIENT_ID, "")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("vaultfs/credentials.toml");

    let url = format!("{}/", server.base);
    let wrong = login::exchange_pin(&url, "a@acme.test", login::CLIENT_ID, "11111111")
        .await
        .unwrap_err();
    assert!(wrong.contains("pin"), "{wrong}");
    let creds = login::exchange_pin(&url, "a@acme.test", login::CLIENT_ID, &pin)
        .await
        .unwrap();
    assert_eq!(
        (creds.server.as_str(), creds.email.as_str()),
        (server.base.as_str(), "a@acme.test")
    );
    let left = creds.expires_at.duration_since(SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(13 * 24 * 3600), "{left:?}");
    login::save_credentials(&file, &creds).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(&server.base) && text.contains("a@acme.test"));

    let stored = login::credentials_in(&file, &server.base).unwrap();
    let b = RemoteBackend::new(stored.remote_config()).unwrap();
    assert_eq!(b.node(&vault()).await.unwrap().name, "My First Vault");

    // A revoked token: the error says what to do.
    server.store.revoke_tokens("a@acme.test").unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(
        e.message.contains(&format!(
            "vaultfs login --server {} --email a@acme.test",
            server.base
        )),
        "{e}"
    );
    assert!(!e.message.contains(&stored.token));

    assert!(login::remove_credentials(&file, &url).unwrap());
    let e = login::credentials_in(&file, &server.base).unwrap_err();
    assert!(e.contains("vaultfs login --server"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_speaks_tls_to_https_urls() {
    // Something that is not TLS behind an https:// URL: the handshake is tried and fails as a
    // connection error (retried, since nothing was sent), not as an unsupported scheme.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let _ = sock.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let b = RemoteBackend::new(quick(&format!("https://127.0.0.1:{port}"))).unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Network);
    assert!(e.message.contains("after 4 attempt(s)"), "{e:?}");
    // rustls's own words for a ServerHello that is not one.
    assert!(e.message.contains("corrupt message"), "{e:?}");
}
