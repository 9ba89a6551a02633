//! Where the bytes are kept: `GET /healthz`, blobs in a folder of their own (`--blobs DIR`) and
//! in a bucket of a real S3-compatible server (moto, see `common::s3`): large files in parts,
//! deletes racing uploads of the same bytes, and a `vaultfs serve` killed mid-upload.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use sha2::Digest;

use common::TestServer;
use vaultfs::api::NodePath;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{BlobLocation, Store, StoreConfig};

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

fn stream(data: Bytes) -> ByteStream {
    // In 1 MiB pieces, as a network would deliver them.
    let chunks: Vec<std::io::Result<Bytes>> = (0..data.len())
        .step_by(1 << 20)
        .map(|i| Ok(data.slice(i..(i + (1 << 20)).min(data.len()))))
        .collect();
    Box::pin(futures_util::stream::iter(chunks))
}

/// [`common::pattern`] as `Bytes`.
fn pattern(len: usize, seed: u8) -> Bytes {
    common::pattern(len, seed.into()).into()
}

async fn put<B: Backend>(b: &B, folder: &NodePath, name: &str, data: Bytes) -> String {
    let file = b.create_file(folder, name).await.unwrap();
    let id = file.file_id().unwrap();
    let md5 = common::md5hex(&data);
    let vid = {
        let n = b
            .begin_version(&id, data.len() as u64, Some(&md5))
            .await
            .unwrap();
        n.file_ex_properties.unwrap().version_id.unwrap()
    };
    b.upload(&id, &vid, data.len() as u64, stream(data))
        .await
        .unwrap();
    id
}

use common::content;

fn vault() -> NodePath {
    NodePath::from_segments(["Acme", "My First Vault"]).unwrap()
}

/// A store with the blobs at `blobs` and the local backend of its account `Acme`.
fn open(data: &std::path::Path, blobs: BlobLocation) -> (Arc<Store>, LocalBackend) {
    let config = StoreConfig {
        blobs,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::open(data, config).unwrap());
    let acme = store.ensure_account("Acme").unwrap();
    (store.clone(), LocalBackend::for_account(store, acme))
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_says_whether_the_store_can_serve() {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let r = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["success"], true);
    // The blob folder gone: unhealthy, and a prober is told to come back, not why.
    std::fs::remove_dir_all(server.dir.join("blobs")).unwrap();
    let r = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["error_name"], "unhealthy");
    assert!(!body.to_string().contains("blobs"), "{body}");

    let Some(s3) = common::s3::s3() else { return };
    let config = StoreConfig {
        blobs: s3.location(),
        ..StoreConfig::default()
    };
    let server = TestServer::start_with(config, Default::default()).await;
    let r = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// `--blobs DIR`: the bytes are there and not in the data directory, and previews (which read
/// the blobs on threads of their own) find them.
#[tokio::test(flavor = "multi_thread")]
async fn blobs_in_a_folder_of_their_own() {
    let tmp = tempfile::tempdir().unwrap();
    let blobs = tmp.path().join("elsewhere");
    let (store, b) = open(&tmp.path().join("data"), BlobLocation::Dir(blobs.clone()));
    store.start_previews(1, std::path::Path::new(BIN)).unwrap();
    let data = Bytes::from_static(b"plain text, previewed as a page\n");
    let id = put(&b, &vault(), "a.txt", data.clone()).await;
    assert_eq!(content(&b, &id).await, data);
    let sha = vaultfs::api::checksum::hex(&sha2::Sha256::digest(&data));
    assert!(blobs.join(&sha[..2]).join(&sha).exists());
    assert!(!tmp.path().join("data/blobs").join(&sha[..2]).exists());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let p = b.preview(&id).await.unwrap();
        if p.status == vaultfs::api::PreviewStatus::Ready {
            assert_eq!(p.pages.len(), 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no preview: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.check_integrity().unwrap().is_empty());
}

/// A file above the single-PUT size goes up in parts, comes back whole and by ranges, and is
/// one object in the bucket; deleting it empties the bucket.
#[tokio::test(flavor = "multi_thread")]
async fn large_files_go_to_the_bucket_in_parts() {
    let Some(s3) = common::s3::s3() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (store, b) = open(tmp.path(), s3.location());
    let len = vaultfs::store::bucket::MULTIPART_ABOVE as usize + (5 << 20) + 123;
    let data = pattern(len, 7);
    let id = put(&b, &vault(), "big.bin", data.clone()).await;
    assert!(
        content(&b, &id).await == data,
        "the bytes came back changed"
    );
    // 100 bytes across the end of the first part (parts are as large as a single PUT's most).
    let at = vaultfs::store::bucket::MULTIPART_ABOVE as usize - 50;
    let range = vaultfs::api::RangeRequest::parse(&format!("bytes={at}-{}", at + 99)).unwrap();
    let mut d = b.download(&id, Some(range)).await.unwrap();
    let mut got = Vec::new();
    use futures_util::StreamExt;
    while let Some(c) = d.body.next().await {
        got.extend_from_slice(&c.unwrap());
    }
    assert_eq!(got, &data[at..at + 100]);
    assert_eq!(store.blob_count().unwrap(), 1);
    assert!(store.check_integrity().unwrap().is_empty());
    b.delete(&vault().child("big.bin").unwrap()).await.unwrap();
    assert!(store.wait_purged(Duration::from_secs(30)));
    assert_eq!(store.blob_count().unwrap(), 0);
}

/// What keeps a delete from taking bytes an upload is about to record: an upload that stored
/// its bytes ahead of its commit (or found them recorded) holds their hash, and removing the
/// blob meanwhile leaves the object; once nothing holds it, a remove takes it.
#[test]
fn bytes_stored_ahead_are_held_until_their_commit() {
    let Some(s3) = common::s3::s3() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let blobs = vaultfs::store::blobs::Blobs::at(tmp.path(), &s3.location()).unwrap();
    let staged = |data: &[u8]| {
        let mut w = blobs.writer().unwrap();
        w.write(Bytes::copy_from_slice(data)).unwrap();
        w.finish().unwrap()
    };
    let mut first = staged(b"shared bytes");
    let hash = first.sha256.clone();
    blobs.store_ahead(&mut first, |_| Ok(false)).unwrap();
    assert_eq!(blobs.size(&hash).unwrap(), Some(12));
    // A second upload of the same bytes finds them recorded: nothing sent, but held.
    let mut second = staged(b"shared bytes");
    blobs.store_ahead(&mut second, |_| Ok(true)).unwrap();
    drop(first);
    blobs.remove(&hash);
    assert_eq!(
        blobs.size(&hash).unwrap(),
        Some(12),
        "a held blob was removed"
    );
    drop(second);
    blobs.remove(&hash);
    assert_eq!(blobs.size(&hash).unwrap(), None);
}

/// Each store sweeps the blobs its database does not know, so a second store on the same
/// prefix would delete the first one's bytes: it is refused, and the first opens again.
#[test]
fn a_prefix_belongs_to_one_store() {
    let Some(s3) = common::s3::s3() else { return };
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let location = s3.location();
    let config = StoreConfig {
        blobs: location.clone(),
        ..StoreConfig::default()
    };
    drop(Store::open(one.path(), config.clone()).unwrap());
    let refused = Store::open(two.path(), config.clone()).err().unwrap();
    assert!(
        refused.message.contains("belongs to another store"),
        "{refused:?}"
    );
    drop(Store::open(one.path(), config).unwrap());
}

/// Blob garbage collection against uploads of the same bytes, end to end: each round deletes
/// the only file holding some bytes while another upload of those very bytes is on its way.
/// Whatever the order, the new file reads back whole (the window is narrow; the test above
/// shows the mechanism deterministically).
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_never_takes_bytes_an_upload_is_about_to_use() {
    let Some(s3) = common::s3::s3() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (store, b) = open(tmp.path(), s3.location());
    for round in 0..12u8 {
        let data = pattern(64 * 1024, round);
        put(&b, &vault(), "old", data.clone()).await;
        let (b1, b2) = (b.clone(), b.clone());
        let delete = tokio::spawn(async move {
            b1.delete(&vault().child("old").unwrap()).await.unwrap();
        });
        let name = format!("new-{round}");
        let upload = tokio::spawn(async move { put(&b2, &vault(), &name, data).await });
        delete.await.unwrap();
        let id = upload.await.unwrap();
        assert_eq!(
            content(&b, &id).await,
            pattern(64 * 1024, round),
            "round {round}"
        );
    }
    assert!(store.wait_purged(Duration::from_secs(30)));
    assert!(store.check_integrity().unwrap().is_empty());
    assert_eq!(store.blob_count().unwrap(), 12);
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(data: &std::path::Path, blobs: &str, endpoint: &str, port: u16) -> Serve {
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--blobs", blobs, "--s3-endpoint", endpoint])
        .env("VAULTFS_DATA_DIR", data)
        .env("XDG_CONFIG_HOME", data.join("no-config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_port(port);
    Serve(child)
}

/// `vaultfs serve --blobs s3://...` killed (SIGKILL) in the middle of an upload's body: after
/// a restart the file has its previous content, and the bucket holds no object of the
/// unfinished upload.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_upload_makes_nothing_partial_current() {
    let Some(s3) = common::s3::s3() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let BlobLocation::Bucket(loc) = s3.location() else {
        unreachable!()
    };
    let blobs = format!("s3://{}/{}", loc.bucket, loc.prefix);
    let mut add = Command::new(BIN)
        .args(["user", "add", "a@acme.test", "--account", "Acme"])
        .env("VAULTFS_DATA_DIR", &data)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    add.stdin.take().unwrap().write_all(b"pw-a\n").unwrap();
    assert!(add.wait().unwrap().success());

    let port = common::free_port();
    let server = serve(&data, &blobs, &s3.endpoint, port);
    let base = format!("http://127.0.0.1:{port}");
    let token = common::login(&base, "a@acme.test", "pw-a").await;
    let remote = vaultfs::backend::remote::RemoteBackend::new(
        vaultfs::backend::remote::RemoteConfig::new(&base, "a@acme.test", &token),
    )
    .unwrap();
    let old = Bytes::from_static(b"the content before");
    let id = put(&remote, &vault(), "f.bin", old.clone()).await;

    // Half of a 32 MiB body, then the server dies.
    let len = 32u64 << 20;
    let v = remote.begin_version(&id, len, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let body: ByteStream = Box::pin(tokio_stream_from(rx));
    let upload = {
        let (remote, id, vid) = (remote.clone(), id.clone(), vid.clone());
        tokio::spawn(async move { remote.upload(&id, &vid, len, body).await })
    };
    for i in 0..16u8 {
        tx.send(Ok(pattern(1 << 20, i))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(server); // SIGKILL
    drop(tx);
    assert!(upload.await.unwrap().is_err());

    let _server = serve(&data, &blobs, &s3.endpoint, port);
    assert_eq!(content(&remote, &id).await, old);
    let store = Store::open(
        &data,
        StoreConfig {
            blobs: BlobLocation::Bucket(loc),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    assert_eq!(store.blob_count().unwrap(), 1);
    assert!(store.check_integrity().unwrap().is_empty());
    // Nothing of the interrupted upload is left staged either.
    assert_eq!(std::fs::read_dir(data.join("tmp")).unwrap().count(), 0);
}

/// A stream of what arrives on `rx`.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}
