//! The contract of the interface, written once against [`Backend`] and run twice: on the local
//! backend in process, and on the remote backend talking to `vaultfs serve` over loopback
//! (remote -> HTTP -> server -> store). Both must answer every case the same way.
//!
//! A third run puts the remote backend against `common::dialect`, a server that answers strictly
//! in the public service's documented shapes (integer codes, base64 md5, `Replace`, chunked
//! downloads, strings for numbers, capped pages, its own client ID).
//!
//! One binary (see Cargo.toml's note on test binaries). Here: the backends the contract runs on
//! (the worlds and `contract!`) and the helpers of the cases. The cases are in `nodes`,
//! `transfers`, `tree` and `previews`. Beside the contract: the remote backend alone against a
//! hand-written HTTP server that misbehaves (`remote_faults`), what only the public service's
//! dialect shows (`dialect_server`), and the login flow (`login`).

#[path = "../common/mod.rs"]
mod common;

// The contract's cases.
mod changes;
mod conflicts;
mod nodes;
mod previews;
mod transfers;
mod tree;

mod dialect_server;
mod login;
mod remote_faults;

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;

use changes::change_feed;
use common::dialect::{DialectOptions, DialectServer};
use common::{TestServer, md5hex};
use conflicts::{conflict_cases, version_cases};
use nodes::{
    attribute_cases, begin_version_cases, create_file_cases, folders, nodes_and_paging,
    other_accounts_are_forbidden,
};
use previews::preview_cases;
use transfers::{concurrent_uploads_get_their_own_answers, download_cases, upload_cases};
use tree::{copy_cases, delete_cases, move_cases};
use vaultfs::api::{Error, ErrorKind, Node, NodePath};
use vaultfs::backend::list_all;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream, Download};
use vaultfs::store::{Store, StoreConfig};

// ----- the backends the contract runs on -----
//
// One world per backend (a constructor below) and one module per world in `contract!`.

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
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
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
    conflict_cases,
    version_cases,
    change_feed,
);

// ----- helpers -----

fn path(uri: &str) -> NodePath {
    NodePath::parse_uri(&format!("/nodes/pth{uri}")).unwrap()
}

fn at(base: &NodePath, rel: &str) -> NodePath {
    rel.split('/')
        .fold(base.clone(), |p, s| p.child(s).unwrap())
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

use common::content;

async fn names<B: Backend>(b: &B, p: &NodePath) -> Vec<String> {
    let n = list_all(b, p, 1000).await.unwrap();
    n.children.unwrap().into_iter().map(|c| c.name).collect()
}

fn vault() -> NodePath {
    path("/Acme/My First Vault")
}
