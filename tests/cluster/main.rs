//! Several `vaultfs serve` processes on one PostgreSQL database and one blob store are one
//! store (issue 15): each test runs two real server processes (`--database postgres://...`,
//! blobs in moto's S3 when it is installed, else in one shared folder) and talks to them over
//! loopback as clients would behind a load balancer. Skipped, loudly, without PostgreSQL.

mod changes;
#[path = "../common/mod.rs"]
mod common;
mod dav;
mod previews;
mod schema;
mod search;
mod tls;
mod tokens;
mod transactions;
mod writers;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use sha2::Digest;

use vaultfs::api::{ErrorKind, NodePath};
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{BlobLocation, Store, StoreConfig};

const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

/// One database and one blob store, shared by the servers of a test.
struct Cluster {
    database: String,
    /// `--blobs` and `--s3-endpoint`
    blobs: Vec<String>,
    location: BlobLocation,
    tmp: tempfile::TempDir,
}

/// A `vaultfs serve` process (killed when dropped) and a client of it.
struct Node {
    child: Child,
    port: u16,
    data: PathBuf,
    /// Its standard error (info, and debug for previews), when it was kept.
    log: Option<PathBuf>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the server logged so far.
    fn logged(&self) -> String {
        std::fs::read_to_string(self.log.as_ref().expect("a server with a log")).unwrap()
    }
}

impl Cluster {
    fn new() -> Option<Cluster> {
        Some(Cluster::on(common::pg::pg()?))
    }

    /// One on a bucket (skipped, saying so, without an S3 server), with the user
    /// a@acme.test (password `pw-a`) in the account Acme.
    fn with_bucket() -> Option<Cluster> {
        let cluster = Cluster::new()?;
        if !matches!(cluster.location, BlobLocation::Bucket(_)) {
            eprintln!("\n*** SKIPPED: previews shared through a bucket need moto_server ***\n");
            return None;
        }
        cluster.add_user("a@acme.test", "Acme", "pw-a");
        Some(cluster)
    }

    /// A cluster on a database of `pg`.
    fn on(pg: &common::pg::PgServer) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let (blobs, location) = match common::s3::s3() {
            Some(s3) => {
                let location = s3.location();
                let BlobLocation::Bucket(l) = &location else {
                    unreachable!()
                };
                let url = format!("s3://{}/{}", l.bucket, l.prefix);
                (
                    vec![
                        "--blobs".into(),
                        url,
                        "--s3-endpoint".into(),
                        s3.endpoint.clone(),
                    ],
                    location,
                )
            }
            None => {
                let dir = tmp.path().join("blobs");
                let arg = dir.to_str().unwrap().to_string();
                (vec!["--blobs".into(), arg], BlobLocation::Dir(dir))
            }
        };
        Cluster {
            database: pg.database(),
            blobs,
            location,
            tmp,
        }
    }

    /// `vaultfs user add` against the shared database.
    fn add_user(&self, email: &str, account: &str, password: &str) {
        let mut add = Command::new(BIN)
            .args(["user", "add", email, "--account", account])
            .args(["--database", &self.database])
            .env("VAULTFS_DATA_DIR", self.tmp.path().join("cli"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        add.stdin
            .take()
            .unwrap()
            .write_all(format!("{password}\n").as_bytes())
            .unwrap();
        assert!(add.wait().unwrap().success());
    }

    /// A server with a data directory of its own (`name`), on a new port.
    fn serve(&self, name: &str) -> Node {
        self.serve_on(name, common::free_port())
    }

    fn serve_on(&self, name: &str, port: u16) -> Node {
        self.serve_with(name, port, &[])
    }

    /// A server with more flags, logging into `<name>.log` (what its preview threads do
    /// included).
    fn serve_with(&self, name: &str, port: u16, flags: &[&str]) -> Node {
        self.serve_blobs(name, port, &self.blobs, flags)
    }

    /// A server of the database with the blobs given (`--blobs` and its options).
    fn serve_blobs(&self, name: &str, port: u16, blobs: &[String], flags: &[&str]) -> Node {
        let data = self.tmp.path().join(name);
        let log = self.tmp.path().join(format!("{name}.log"));
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", &self.database])
            .args(blobs)
            .args(flags)
            .env("VAULTFS_DATA_DIR", &data)
            .env("XDG_CONFIG_HOME", self.tmp.path().join("no-config"))
            .env("RUST_LOG", "info,vaultfs::store::previews=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        common::wait_for_port(port);
        Node {
            child,
            port,
            data,
            log: Some(log),
        }
    }

    /// The store as a third process sees it (for its integrity check).
    fn store(&self) -> Store {
        Store::open(
            &self.tmp.path().join("checker"),
            StoreConfig {
                database: Some(self.database.clone()),
                blobs: self.location.clone(),
                ..StoreConfig::default()
            },
        )
        .unwrap()
    }
}

fn client(node: &Node, email: &str, token: &str) -> RemoteBackend {
    RemoteBackend::new(RemoteConfig::new(&node.base(), email, token)).unwrap()
}

/// Which of the two servers of [`two_servers`] the user signs in at.
enum Sign {
    AtOne,
    AtTwo,
}

/// A new cluster with the user `a@acme.test` (account Acme), served by two servers (`one` and
/// `two`), and the user's token from signing in at one of them; `None` without PostgreSQL.
async fn two_servers(sign: Sign) -> Option<(Cluster, Node, Node, String)> {
    let cluster = Cluster::new()?;
    cluster.add_user("a@acme.test", "Acme", "pw-a");
    let (one, two) = (cluster.serve("one"), cluster.serve("two"));
    let at = match sign {
        Sign::AtOne => &one,
        Sign::AtTwo => &two,
    };
    let token = common::login(&at.base(), "a@acme.test", "pw-a").await;
    Some((cluster, one, two, token))
}

/// The user `a@acme.test`'s clients of the two servers.
fn clients(one: &Node, two: &Node, token: &str) -> (RemoteBackend, RemoteBackend) {
    (
        client(one, "a@acme.test", token),
        client(two, "a@acme.test", token),
    )
}

fn vault() -> NodePath {
    NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap()
}

/// `rel` (names joined by `/`) in the vault.
fn at(rel: &str) -> NodePath {
    rel.split('/')
        .fold(vault(), |p, name| p.child(name).unwrap())
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

fn md5hex(data: &[u8]) -> String {
    vaultfs::api::checksum::hex(&<md5::Md5 as md5::Digest>::digest(data))
}

fn stream(data: Bytes) -> ByteStream {
    Box::pin(futures_util::stream::iter([Ok::<_, std::io::Error>(data)]))
}

/// The three upload steps; the file's ID.
async fn put<B: Backend>(b: &B, name: &str, data: Bytes) -> String {
    let id = b
        .create_file(&vault(), name)
        .await
        .unwrap()
        .file_id()
        .unwrap();
    upload(b, &id, data).await;
    id
}

/// Steps 2 and 3 of a file; the md5 step 3 answered.
async fn upload<B: Backend>(b: &B, id: &str, data: Bytes) -> String {
    let v = b
        .begin_version(id, data.len() as u64, Some(&md5hex(&data)))
        .await
        .unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let node = b
        .upload(id, &vid, data.len() as u64, stream(data))
        .await
        .unwrap();
    node.md5_checksum.unwrap()
}

use common::content;

async fn names<B: Backend>(b: &B) -> Vec<String> {
    vaultfs::backend::list_all(b, &vault(), 100)
        .await
        .unwrap()
        .children
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect()
}

/// Writes through one server are read through the other; a token and a lockout made at one
/// hold at the other; a delete at one frees the name at both.
#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_database_are_one_store() {
    // Signed in at one; the token works at two.
    let Some((cluster, one, two, token)) = two_servers(Sign::AtOne).await else {
        return;
    };
    let (a, b) = clients(&one, &two, &token);
    let data = pattern(3 << 20, 7);
    let id = put(&a, "report.pdf", data.clone()).await;
    assert_eq!(content(&b, &id).await, data);
    assert_eq!(names(&b).await, ["report.pdf"]);
    b.create_folder(&at("Folder")).await.unwrap();
    b.copy(&at("report.pdf"), &at("Folder/copy.pdf"), false)
        .await
        .unwrap();
    let copy = a.node(&at("Folder/copy.pdf")).await.unwrap();
    assert_eq!(content(&a, &copy.id.unwrap()).await, data);
    b.delete(&at("report.pdf")).await.unwrap();
    let gone = a.node(&at("report.pdf")).await.unwrap_err();
    assert!(gone.is(ErrorKind::NotFound), "{gone:?}");
    // A new version at two is what one serves.
    let newer = pattern(1000, 9);
    let copy_id = a.node(&at("Folder/copy.pdf")).await.unwrap().id.unwrap();
    upload(&b, &copy_id, newer.clone()).await;
    assert_eq!(content(&a, &copy_id).await, newer);

    // Failed pin exchanges at one count at two: the sixth, wherever it goes, is refused.
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let node = if i % 2 == 0 { &one } else { &two };
        let r = http
            .post(format!("{}/pin/auth", node.base()))
            .json(&serde_json::json!({"user_email": "a@acme.test",
                "pin_info": {"client_id": "vaultfs", "pin": 11111111 + i}}))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses[..5], [401; 5]);
    assert_eq!(statuses[5], 429);

    let store = cluster.store();
    assert!(store.check_integrity().unwrap().is_empty());
}

/// The same name taken at once through both servers, by many clients: one file (all get its
/// ID), one folder (one creation, conflicts for the rest), one move into a free name; never two
/// nodes of one name.
/// A server of a shared database that keeps the blobs in its own data dir is no part of one
/// store with the others: it says so when it starts; one on the shared blobs does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_on_blobs_of_its_own_says_it_is_not_one_store() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    let shared = cluster.serve_with("shared", common::free_port(), &[]);
    let alone = cluster.serve_blobs("alone", common::free_port(), &[], &[]);
    assert!(
        !shared.logged().contains("not one store"),
        "{}",
        shared.logged()
    );
    let said = alone.logged();
    assert!(said.contains("not one store"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn races_on_one_name_across_two_servers() {
    let Some((cluster, one, two, token)) = two_servers(Sign::AtOne).await else {
        return;
    };
    let clients: Vec<RemoteBackend> = (0..16)
        .map(|i| client(if i % 2 == 0 { &one } else { &two }, "a@acme.test", &token))
        .collect();

    let ids = futures_util::future::join_all(
        clients
            .iter()
            .map(|c| async move { c.create_file(&vault(), "same.txt").await.unwrap().file_id() }),
    )
    .await;
    assert!(
        ids.iter().all(|id| id.is_some() && *id == ids[0]),
        "{ids:?}"
    );

    let made = futures_util::future::join_all(
        clients
            .iter()
            .map(|c| async move { c.create_folder(&at("Same folder")).await }),
    )
    .await;
    assert_eq!(made.iter().filter(|r| r.is_ok()).count(), 1, "{made:?}");
    assert!(made.iter().flatten_err().all(|e| e.is(ErrorKind::Conflict)));

    // Sixteen files, each moved at once onto one free name without replace: one wins.
    for (i, c) in clients.iter().enumerate() {
        put(c, &format!("src{i}.txt"), pattern(100, i as u8)).await;
    }
    let moved = futures_util::future::join_all(clients.iter().enumerate().map(|(i, c)| {
        let src = at(&format!("src{i}.txt"));
        async move { c.rename(&src, &at("target.txt"), false).await }
    }))
    .await;
    assert_eq!(moved.iter().filter(|r| r.is_ok()).count(), 1, "{moved:?}");
    // And sixteen copies onto one name with replace: one file of that name remains.
    let copied = futures_util::future::join_all(
        clients
            .iter()
            .map(|c| async move { c.copy(&at("target.txt"), &at("copied.txt"), true).await }),
    )
    .await;
    assert!(copied.iter().all(|r| r.is_ok()), "{copied:?}");
    let mut listed = names(&clients[1]).await;
    let before = listed.len();
    listed.dedup();
    assert_eq!(listed.len(), before, "a name listed twice: {listed:?}");
    assert_eq!(listed.iter().filter(|n| *n == "copied.txt").count(), 1);
    assert_eq!(listed.iter().filter(|n| *n == "target.txt").count(), 1);
    assert_eq!(listed.iter().filter(|n| n.starts_with("src")).count(), 15);
    assert!(cluster.store().check_integrity().unwrap().is_empty());
}

/// Versions of one file uploaded at once through both servers: each upload's answer is its own
/// bytes' md5, and the file ends as one of them, whole.
#[tokio::test(flavor = "multi_thread")]
async fn uploads_to_one_file_from_two_servers_get_their_own_answers() {
    let Some((cluster, one, two, token)) = two_servers(Sign::AtOne).await else {
        return;
    };
    let (a, b) = clients(&one, &two, &token);
    let id = put(&a, "shared.bin", pattern(10, 0)).await;
    let bodies: Vec<Bytes> = (1..=8).map(|i| pattern(200_000 + i, i as u8)).collect();
    let answers = futures_util::future::join_all(bodies.iter().enumerate().map(|(i, data)| {
        let (c, id, data) = (if i % 2 == 0 { &a } else { &b }, id.clone(), data.clone());
        async move { upload(c, &id, data).await }
    }))
    .await;
    for (answer, data) in answers.iter().zip(&bodies) {
        assert_eq!(*answer, md5hex(data));
    }
    let now = content(&b, &id).await;
    assert!(
        bodies.iter().any(|d| *d == now),
        "the file is none of the uploads"
    );
    assert_eq!(content(&a, &id).await, now);
    assert!(cluster.store().check_integrity().unwrap().is_empty());
}

/// A new cluster whose two servers keep no version or deleted file (a delete lets go of its
/// bytes at once), with the user `a@acme.test`'s clients of each; `None` without PostgreSQL.
async fn freeing_servers() -> Option<(Cluster, (Node, Node), RemoteBackend, RemoteBackend)> {
    let cluster = Cluster::new()?;
    cluster.add_user("a@acme.test", "Acme", "pw-a");
    let final_deletes = ["--keep-versions", "0", "--keep-versions-days", "0"];
    let one = cluster.serve_with("one", common::free_port(), &final_deletes);
    let two = cluster.serve_with("two", common::free_port(), &final_deletes);
    let token = common::login(&one.base(), "a@acme.test", "pw-a").await;
    let (a, b) = clients(&one, &two, &token);
    Some((cluster, (one, two), a, b))
}

/// The same bytes let go at one server (a file deleted, its blob unreferenced: no version or
/// deleted file is kept) while the other stores them again for a new file (its step 3 at the
/// same moment), round after round: no server waits for the other's whole request (each
/// commits under the writers' lock alone), so this is where a removal could take bytes that a
/// new row records. Every new file reads back whole, and the store's check finds every blob.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_let_go_at_one_server_while_stored_again_at_the_other_are_kept() {
    let Some((cluster, _servers, a, b)) = freeing_servers().await else {
        return;
    };
    for round in 0..80u8 {
        let data = pattern(70_000 + round as usize, round);
        let old = format!("old{round}.bin");
        put(&a, &old, data.clone()).await;
        let new = b
            .create_file(&vault(), &format!("new{round}.bin"))
            .await
            .unwrap()
            .file_id()
            .unwrap();
        let old = at(&old);
        // The delete a little later each round, to meet the other's step 3 at each of its
        // moments (its body received, its hold taken, its bytes looked for, its commit).
        let later = Duration::from_micros(u64::from(round % 40) * 500);
        let delete = async {
            tokio::time::sleep(later).await;
            a.delete(&old).await
        };
        let (deleted, stored) = tokio::join!(delete, upload(&b, &new, data.clone()));
        deleted.unwrap();
        assert_eq!(stored, md5hex(&data));
        assert_eq!(content(&a, &new).await, data, "round {round}");
    }
    let problems = cluster.store().check_integrity().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// The same with the bytes stored again in a batch at the other server (`POST /nodes/batch`,
/// `Store::put_files`, which takes the blob's lock as step 3 does): each new file is whole.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_let_go_at_one_server_while_a_batch_stores_them_at_the_other_are_kept() {
    use vaultfs::backend::PutFile;
    let Some((cluster, _servers, a, b)) = freeing_servers().await else {
        return;
    };
    // Its answers say it takes batches.
    b.node(&vault()).await.unwrap();
    let batches = b.batches().expect("our server takes batches");
    let dir = tempfile::tempdir().unwrap();
    for round in 0..60u8 {
        let data = pattern(50_000 + round as usize, round);
        let old = format!("old{round}.bin");
        put(&a, &old, data.clone()).await;
        let src = dir.path().join(format!("src{round}"));
        std::fs::write(&src, &data).unwrap();
        let file = PutFile {
            path: at(&format!("new{round}.bin")),
            file_id: None,
            source: std::sync::Arc::new(std::fs::File::open(&src).unwrap()),
            len: data.len() as u64,
            sealed: false,
            digests: None,
            attrs: Default::default(),
            cancel: Default::default(),
            base: vaultfs::api::Base::Absent,
            expect_md5: None,
        };
        let old = at(&old);
        let later = Duration::from_micros(u64::from(round % 30) * 500);
        let delete = async {
            tokio::time::sleep(later).await;
            a.delete(&old).await
        };
        let (deleted, mut stored) = tokio::join!(delete, batches.put_files(vec![file]));
        deleted.unwrap();
        let node = stored.pop().unwrap().unwrap();
        assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(&data).as_str()));
        let id = node.file_id().unwrap();
        assert_eq!(content(&a, &id).await, data, "round {round}");
    }
    let problems = cluster.store().check_integrity().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// One server killed (SIGKILL) in the middle of an upload's body: the other goes on serving the
/// file's previous content, the killed one restarts on the same store, and nothing of the
/// unfinished upload became current or was left recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_upload_makes_nothing_partial_current() {
    let Some((cluster, one, two, token)) = two_servers(Sign::AtTwo).await else {
        return;
    };
    let (a, b) = clients(&one, &two, &token);
    let old = Bytes::from_static(b"the content before");
    let id = put(&a, "f.bin", old.clone()).await;

    let len = 16u64 << 20;
    let v = a.begin_version(&id, len, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let body: ByteStream = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|x| (x, rx))
    }));
    let sending = {
        let (a, id, vid) = (a.clone(), id.clone(), vid.clone());
        tokio::spawn(async move { a.upload(&id, &vid, len, body).await })
    };
    for i in 0..8u8 {
        tx.send(Ok(pattern(1 << 20, i))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (port, data) = (one.port, one.data.clone());
    drop(one); // SIGKILL
    drop(tx);
    assert!(sending.await.unwrap().is_err());

    assert_eq!(content(&b, &id).await, old);
    let one = cluster.serve_on("one", port);
    assert_eq!(
        content(&client(&one, "a@acme.test", &token), &id).await,
        old
    );
    if let BlobLocation::Bucket(_) = cluster.location {
        // Nothing of the interrupted upload is left staged (its own folder, cleared at start).
        assert_eq!(std::fs::read_dir(data.join("tmp")).unwrap().count(), 0);
    }
    let store = cluster.store();
    assert!(store.check_integrity().unwrap().is_empty());
    assert_eq!(store.blob_count().unwrap(), 1);
}

/// PostgreSQL stopped under a running server: its requests are answered 503 with `Retry-After`
/// in bounded time (no panic, no hang), `/healthz` says so, the process stays up, and once
/// PostgreSQL is back the same server answers again without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_goes_away_is_503_until_it_is_back() {
    let Some(pg) = common::pg::own() else {
        return;
    };
    let cluster = Cluster::on(&pg);
    cluster.add_user("a@acme.test", "Acme", "pw-a");
    let mut one = cluster.serve("one");
    let token = common::login(&one.base(), "a@acme.test", "pw-a").await;
    let a = client(&one, "a@acme.test", &token);
    let data = pattern(100_000, 3);
    let id = put(&a, "kept.bin", data.clone()).await;

    let http = reqwest::Client::new();
    let listing = format!("{}/nodes/pth/Acme/My%20First%20Vault", one.base());
    let get = |url: String| {
        let http = http.clone();
        let token = token.clone();
        async move {
            let started = std::time::Instant::now();
            let r = http
                .get(url)
                .basic_auth("a@acme.test", Some(token))
                .header("Accept", "application/json")
                .timeout(Duration::from_secs(60))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.headers().clone(), started.elapsed())
        }
    };
    assert_eq!(get(listing.clone()).await.0, 200);

    pg.stop();
    for url in [
        listing.clone(),
        format!("{}/files/id/Document/{id}", one.base()),
        format!("{}/healthz", one.base()),
    ] {
        let (status, headers, took) = get(url.clone()).await;
        assert_eq!(status, 503, "{url}");
        assert!(headers.contains_key("retry-after"), "{url}: {headers:?}");
        assert!(took < Duration::from_secs(15), "{url} took {took:?}");
    }
    // Several at once, as a busy server sees them: each answered, none kills the process.
    // (They queue for the store's lock: once it was not taken, the next ones fail fast.)
    let started = std::time::Instant::now();
    let many = futures_util::future::join_all((0..8).map(|_| get(listing.clone()))).await;
    assert!(many.iter().all(|(s, ..)| *s == 503), "{many:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "{many:?}");
    assert!(one.child.try_wait().unwrap().is_none(), "the server died");

    pg.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while get(listing.clone()).await.0 != 200 {
        assert!(std::time::Instant::now() < deadline, "still failing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get(format!("{}/healthz", one.base())).await.0, 200);
    assert_eq!(content(&a, &id).await, data);
    let newer = pattern(5000, 4);
    assert_eq!(upload(&a, &id, newer.clone()).await, md5hex(&newer));
    assert_eq!(content(&a, &id).await, newer);
    assert!(one.child.try_wait().unwrap().is_none());
}

/// `vaultfs migrate`: a built-in store made by a server on SQLite (two accounts, folders,
/// files with several versions, a user each, a client) copied into an empty PostgreSQL database
/// and a blob store, then served from there: every file reads back whole with its md5, the old
/// token still works (the pin key came along), and a second migration into it is refused.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_copies_a_built_in_store_and_verifies_it() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    let source = cluster.tmp.path().join("sqlite-store");
    let cli = |args: &[&str], stdin: &str| {
        let mut c = Command::new(BIN)
            .args(args)
            .env("VAULTFS_DATA_DIR", &source)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    for (email, account) in [("a@acme.test", "Acme"), ("b@other.test", "Other")] {
        let out = cli(&["user", "add", email, "--account", account], "pw\n");
        assert!(out.status.success(), "{out:?}");
    }
    assert!(cli(&["client", "add", "thirdparty"], "").status.success());
    let port = common::free_port();
    let sqlite_server = Node {
        child: Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("VAULTFS_DATA_DIR", &source)
            .env("XDG_CONFIG_HOME", cluster.tmp.path().join("no-config"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        port,
        data: source.clone(),
        log: None,
    };
    common::wait_for_port(port);
    let token = common::login(&sqlite_server.base(), "a@acme.test", "pw").await;
    let a = client(&sqlite_server, "a@acme.test", &token);
    a.create_folder(&at("Folder")).await.unwrap();
    a.create_folder(&at("Folder/Inner")).await.unwrap();
    // Files in the vault and in folders, most with several versions; one copied (a blob
    // shared by two files); earlier versions are kept.
    let mut files: Vec<(String, NodePath, Bytes)> = Vec::new();
    for (i, (folder, name)) in [
        ("", "one.bin"),
        ("Folder", "two.bin"),
        ("Folder/Inner", "three.bin"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = if folder.is_empty() {
            vault()
        } else {
            at(folder)
        };
        let id = a.create_file(&dir, name).await.unwrap().file_id().unwrap();
        let mut last = Bytes::new();
        for v in 0..=i {
            last = pattern(40_000 * (i + 1) + v, (i * 10 + v) as u8);
            assert_eq!(upload(&a, &id, last.clone()).await, md5hex(&last));
        }
        files.push((id, dir.child(name).unwrap(), last));
    }
    a.copy(&at("one.bin"), &at("Folder/copy.bin"), false)
        .await
        .unwrap();
    let copy = a.node(&at("Folder/copy.bin")).await.unwrap().id.unwrap();
    files.push((copy, at("Folder/copy.bin"), files[0].2.clone()));
    let b_token = common::login(&sqlite_server.base(), "b@other.test", "pw").await;
    let b = client(&sqlite_server, "b@other.test", &b_token);
    let other = Bytes::from_static(b"the other account's file");
    let b_file = b
        .create_file(
            &NodePath::parse_uri("/nodes/pth/Other/My First Vault").unwrap(),
            "b.txt",
        )
        .await
        .unwrap()
        .file_id()
        .unwrap();
    upload(&b, &b_file, other.clone()).await;
    // A deleted file, kept restorable with its bytes (serve's default retention rule).
    let gone = pattern(30_000, 77);
    let gone_id = put(&a, "deleted.bin", gone.clone()).await;
    a.delete(&at("deleted.bin")).await.unwrap();
    drop(sqlite_server);

    // Migrated while nothing has the store open.
    let migrate = |dir: &std::path::Path| {
        Command::new(BIN)
            .arg("migrate")
            .args(["--database", &cluster.database])
            .args(&cluster.blobs)
            .env("VAULTFS_DATA_DIR", dir)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    // A blob whose bytes no longer match its hash: refused with the reason, nothing committed.
    let hash = vaultfs::api::checksum::hex(&sha2::Sha256::digest(&other));
    let blob = source.join("blobs").join(&hash[..2]).join(&hash);
    let original = std::fs::read(&blob).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&blob, b"rotten bytes").unwrap();
    let bad = migrate(&source);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains(&hash) && why.contains("hashing to"), "{why}");
    std::fs::write(&blob, &original).unwrap();

    let started = std::time::Instant::now();
    let out = migrate(&source);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("migrate took {:?}:\n{said}", started.elapsed());
    assert!(said.contains("migrated and verified"), "{said}");
    assert!(said.contains("2 account(s)"), "{said}");
    // Six versions of three files, the other account's file and the deleted one (the copy
    // shares a blob).
    assert!(said.contains("8 blob(s)"), "{said}");

    // Served from PostgreSQL: every file whole, the old tokens good.
    let node = cluster.serve("after");
    let a = client(&node, "a@acme.test", &token);
    for (id, path, data) in &files {
        let got = content(&a, id).await;
        assert_eq!(got.len(), data.len());
        assert!(got == *data, "file {id} differs");
        let n = a.node(path).await.unwrap();
        assert_eq!(n.md5_checksum.as_deref(), Some(md5hex(data).as_str()));
    }
    let b = client(&node, "b@other.test", &b_token);
    assert_eq!(content(&b, &b_file).await, other);
    // New rows get new IDs (the sequences moved past the copied ones), and sign-in works.
    a.create_folder(&at("After")).await.unwrap();
    put(&a, "new.bin", pattern(1000, 99)).await;
    common::login(&node.base(), "b@other.test", "pw").await;
    // The deleted file came along: listed, and restored with its bytes.
    let http = reqwest::Client::new();
    let listed: serde_json::Value = http
        .get(format!(
            "{}/nodes/pth/Acme/My%20First%20Vault?deleted=1",
            node.base()
        ))
        .basic_auth("a@acme.test", Some(&token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["message"]["deleted"][0]["id"],
        gone_id.as_str(),
        "{listed}"
    );
    let restored = http
        .post(format!(
            "{}/files/id/Document/{gone_id}/restore",
            node.base()
        ))
        .basic_auth("a@acme.test", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(restored.status(), 200);
    assert!(content(&a, &gone_id).await == gone);
    // And an earlier version made current again, on PostgreSQL too.
    let (two, two_path, two_now) = &files[1];
    let listed: serde_json::Value = http
        .get(format!("{}{}?vprop=1", node.base(), two_path.encoded()))
        .basic_auth("a@acme.test", Some(&token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let versions = listed["message"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{listed}");
    let older = versions[1]["version_id"].as_str().unwrap();
    let restored = http
        .post(format!(
            "{}/files/id/Document/{two}/version/{older}/restore",
            node.base()
        ))
        .basic_auth("a@acme.test", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(restored.status(), 200);
    assert_eq!(
        a.node(two_path).await.unwrap().md5_checksum,
        versions[1]["md5_checksum"].as_str().map(str::to_string)
    );
    assert!(content(&a, two).await != *two_now);
    assert!(cluster.store().check_integrity().unwrap().is_empty());

    // Into a database that holds a store: refused, with the reason.
    let again = migrate(&source);
    assert!(!again.status.success());
    let why = String::from_utf8_lossy(&again.stderr);
    assert!(why.contains("not empty"), "{why}");
}

/// The errors of a list of results.
trait FlattenErr<'a, E: 'a> {
    fn flatten_err(self) -> impl Iterator<Item = &'a E>;
}

impl<'a, T: 'a, E: 'a, I: Iterator<Item = &'a Result<T, E>>> FlattenErr<'a, E> for I {
    fn flatten_err(self) -> impl Iterator<Item = &'a E> {
        self.filter_map(|r| r.as_ref().err())
    }
}
