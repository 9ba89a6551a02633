//! A mount under test on either backend: the built-in store, or `vaultfs serve` on loopback
//! (in the test process) through the remote backend, with a logged-in user of account `Local`.
#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::mount::{Mount, fuse_available};
use vaultfs::backend::local::LocalBackend;
use vaultfs::store::Store;

/// The writable folder of the mount.
pub const VAULT: &str = "Local/My First Vault";

/// Which backend the mount under test uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Via {
    /// The built-in store, in the mount's own process.
    Local,
    /// `vaultfs serve` on loopback (in this test process), through the remote backend.
    Remote,
}

pub struct Env {
    pub _tmp: tempfile::TempDir,
    pub data: PathBuf,
    pub cache: PathBuf,
    pub mnt: PathBuf,
    pub config: PathBuf,
    pub server: Option<super::TestServer>,
    pub rt: tokio::runtime::Runtime,
}

impl Env {
    pub fn new(via: Via) -> Option<Env> {
        Self::new_with(via, Default::default())
    }

    /// The same with a server of these limits (remote).
    pub fn new_with(via: Via, options: vaultfs::server::ServerOptions) -> Option<Env> {
        Self::new_with_store(via, Default::default(), options)
    }

    /// The same with a server's store of this configuration (remote).
    pub fn new_with_store(
        via: Via,
        store: vaultfs::store::StoreConfig,
        options: vaultfs::server::ServerOptions,
    ) -> Option<Env> {
        if !fuse_available() {
            eprintln!("skipped: needs root and /dev/fuse");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let data = tmp.path().join("data");
        let config = tmp.path().join("config");
        let server = (via == Via::Remote).then(|| {
            rt.block_on(async {
                let s = super::TestServer::start_in(&data, store, options).await;
                let creds = s.user("tester@example.com", "Local").await;
                super::save_login(
                    &config.join("vaultfs/credentials.toml"),
                    &s.base,
                    creds,
                    std::time::Duration::from_secs(3600),
                );
                s
            })
        });
        Some(Env {
            data,
            cache: tmp.path().join("cache"),
            mnt: tmp.path().join("mnt"),
            config,
            server,
            rt,
            _tmp: tmp,
        })
    }

    pub fn mount(&self, extra: &[&str]) -> Mount {
        self.mount_with_env(extra, &[])
    }

    /// The same, with more environment variables for the daemon.
    pub fn mount_with_env(&self, extra: &[&str], more_env: &[(&str, &std::path::Path)]) -> Mount {
        self.mount_limited(extra, more_env, None)
    }

    /// The same, the daemon's open-files limit set to `nofile` (`ulimit -n`).
    pub fn mount_limited(
        &self,
        extra: &[&str],
        more_env: &[(&str, &std::path::Path)],
        nofile: Option<u64>,
    ) -> Mount {
        let mut args = vec!["--cache-dir", self.cache.to_str().unwrap()];
        let base;
        match &self.server {
            Some(s) => {
                base = s.base.clone();
                args.extend(["--server", base.as_str()]);
                if !extra.contains(&"--timeout") {
                    args.extend(["--timeout", "10"]);
                }
            }
            None => args.extend(["--data-dir", self.data.to_str().unwrap()]),
        }
        args.extend_from_slice(extra);
        // Every mount of a suite run another way (`VAULTFS_TEST_MOUNT_ARGS=--no-passthrough`).
        let more = std::env::var("VAULTFS_TEST_MOUNT_ARGS").unwrap_or_default();
        args.extend(more.split_whitespace());
        let mut envs = vec![("XDG_CONFIG_HOME", self.config.as_path())];
        envs.extend_from_slice(more_env);
        Mount::start_limited(&self.mnt, &args, &envs, nofile)
    }

    pub fn vault(&self) -> PathBuf {
        self.mnt.join(VAULT)
    }

    /// The store behind the mount, as another client sees it.
    pub fn backend(&self) -> LocalBackend {
        let store = match &self.server {
            Some(s) => s.store.clone(),
            None => Arc::new(Store::open_local(&self.data).unwrap()),
        };
        LocalBackend::new(store)
    }

    /// Stops the server and mounts again from the cache dir alone (`--timeout 3`): the mount
    /// starts offline, within 10 s. Returns it and the server's address (`serve_again`).
    #[allow(dead_code)] // for the mount tests only
    pub fn mount_offline(&mut self) -> (Mount, String) {
        let server = self.server.take().expect("a server to stop");
        let base = server.base.clone();
        self.rt.block_on(server.stop());
        let cache = self.cache.to_str().unwrap();
        let args = ["--cache-dir", cache, "--server", &base, "--timeout", "3"];
        let started = std::time::Instant::now();
        let m = Mount::start_with_env(&self.mnt, &args, &[("XDG_CONFIG_HOME", &self.config)]);
        let took = started.elapsed();
        eprintln!("mounted offline in {:.2} s", took.as_secs_f64());
        assert!(took.as_secs() < 10, "{took:?}\n{}", m.log_text());
        assert_eq!(m.status()["offline"], true, "{}", m.log_text());
        (m, base.trim_start_matches("http://").to_string())
    }

    /// Starts the server again on `addr` over the same data dir (after a test stopped it).
    pub fn serve_again(&mut self, addr: &str) {
        let data = self.data.clone();
        self.server = Some(self.rt.block_on(super::TestServer::start_at(
            &data,
            addr,
            Default::default(),
            Default::default(),
        )));
    }

    /// Puts a proxy on the server's port that lets `rate` bytes a second through towards it
    /// (answers go back at full speed): the server itself moves to another port. For the rest
    /// of the test.
    pub fn throttle_server(&mut self, rate: u64) {
        self.behind_proxy(move |client, upstream| {
            let pace = move |piece: &[u8]| {
                std::thread::sleep(Duration::from_secs_f64(piece.len() as f64 / rate as f64))
            };
            relay(client, &upstream, pace, |_| {})
        });
    }

    /// Puts a proxy on the server's port that holds each piece of a request `delay` before
    /// passing it on (a link's latency, one way) and keeps every byte of the requests: what
    /// the mount asked, for the rest of the test (as `throttle_server`, once the mount runs).
    pub fn record_requests(&mut self, delay: Duration) -> Arc<std::sync::Mutex<Vec<u8>>> {
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = sent.clone();
        self.behind_proxy(move |client, upstream| {
            let log = log.clone();
            let keep = move |piece: &[u8]| {
                log.lock().unwrap().extend_from_slice(piece);
                std::thread::sleep(delay);
            };
            relay(client, &upstream, keep, |_| {})
        });
        sent
    }

    /// Puts a proxy on the server's port that holds each piece of an answer `delay` before
    /// passing it on: what the server did is done well before the mount hears of it.
    #[allow(dead_code)] // for the link tests only
    pub fn delay_answers(&mut self, delay: Duration) {
        self.behind_proxy(move |client, upstream| {
            relay(
                client,
                &upstream,
                |_| {},
                move |_| std::thread::sleep(delay),
            )
        });
    }

    /// Moves the server to another port and carries each connection to its port with `pipe`.
    fn behind_proxy(
        &mut self,
        pipe: impl Fn(std::net::TcpStream, String) + Clone + Send + 'static,
    ) {
        let server = self.server.take().expect("a remote env");
        let addr = server.base.trim_start_matches("http://").to_string();
        self.rt.block_on(server.stop());
        let data = self.data.clone();
        let behind = self.rt.block_on(super::TestServer::start_at(
            &data,
            "127.0.0.1:0",
            Default::default(),
            Default::default(),
        ));
        let upstream = behind.base.trim_start_matches("http://").to_string();
        self.server = Some(behind);
        let listener = std::net::TcpListener::bind(&addr).unwrap();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { break };
                let (upstream, pipe) = (upstream.clone(), pipe.clone());
                std::thread::spawn(move || pipe(client, upstream));
            }
        });
    }

    /// Waits until no staged file is left: every file written is stored.
    pub fn wait_uploaded(&self) {
        wait_stored(&self.cache, &self.mnt);
    }
}

/// Waits until the mount at `mnt` with cache dir `cache` has stored every file written (its
/// journal and log tail shown when it does not within 120 s).
pub fn wait_stored(cache: &std::path::Path, mnt: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while pending_uploads(cache) > 0 {
        if std::time::Instant::now() > deadline {
            let journal = fs::read_to_string(cache.join("journal/log")).unwrap_or_default();
            let log = fs::read_to_string(mnt.with_extension("log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "uploads did not finish; journal: {journal}\nlog tail:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Files a mount with this cache dir has staged and not yet stored (or still open for
/// writing): the entries of its journal (`journal/log`, JSON lines `put`/`done` by staging ID)
/// whose staging file `staging/<id>.data` is there. Not the staging folder alone: it also holds
/// empty spare files made ahead of need, which belong to nothing yet.
pub fn pending_uploads(cache: &std::path::Path) -> usize {
    let log = fs::read_to_string(cache.join("journal/log")).unwrap_or_default();
    let mut live = std::collections::HashSet::new();
    for line in log.lines() {
        let Ok(rec) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(id) = rec["id"].as_u64() else {
            continue;
        };
        match rec["op"].as_str() {
            Some("put") => {
                live.insert(id);
            }
            Some("done") => {
                live.remove(&id);
            }
            _ => {}
        }
    }
    live.into_iter()
        .filter(|id| cache.join(format!("staging/{id}.data")).exists())
        .count()
}

/// Runs `f` on a thread and fails the test if it takes longer than `secs` (nothing may hang).
pub fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} hung for more than {secs}s"))
}

/// Each test runs on both backends: `both!(name, ...)` makes `local::name` and `remote::name`
/// calling `name(Via::Local)` and `name(Via::Remote)`.
#[allow(unused_macros)]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(#[test] fn $name() { super::$name(super::Via::Local) })*
        }
        mod remote {
            $(#[test] fn $name() { super::$name(super::Via::Remote) })*
        }
    };
}

/// Stores `data` as a new version of `name` (`sub/name.txt` in a folder) in the vault, as
/// another client does (the file made first if it is not there).
pub fn put_elsewhere(env: &Env, name: &str, data: &[u8]) {
    use vaultfs::backend::Backend;
    let b = env.backend();
    let path = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/{name}")).unwrap();
    let data = data.to_vec();
    env.rt.block_on(async {
        let (folder, name) = (path.parent().unwrap(), path.name().unwrap());
        let f = b.create_file(&folder, name).await.unwrap();
        let id = f.id.unwrap();
        let len = data.len() as u64;
        let t = b.begin_version(&id, len, None).await.unwrap();
        let vid = t.file_ex_properties.unwrap().version_id.unwrap();
        let body = Box::pin(futures_util::stream::once(async move {
            Ok(bytes::Bytes::from(data))
        }));
        b.upload(&id, &vid, len, body).await.unwrap();
    });
}

/// The names in the vault's top folder, sorted, as another client lists them.
pub fn stored_names(env: &Env) -> Vec<String> {
    use vaultfs::backend::Backend;
    let b = env.backend();
    let path = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}")).unwrap();
    let node = env.rt.block_on(b.list(&path, 0, 1000)).unwrap();
    let mut v: Vec<String> = node
        .children
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect();
    v.sort();
    v
}

/// Another client stores `data` as a new version of the vault's file `name` (steps 2 and 3).
pub fn new_version_elsewhere(env: &Env, name: &str, data: &[u8]) {
    use vaultfs::backend::Backend;
    let b = env.backend();
    let path = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/{name}")).unwrap();
    let data = data.to_vec();
    env.rt.block_on(async {
        let id = b.node(&path).await.unwrap().file_id().unwrap();
        let len = data.len() as u64;
        let v = b.begin_version(&id, len, None).await.unwrap();
        let body = vaultfs::backend::reader_stream(std::io::Cursor::new(data), len);
        b.upload(&id, &v.version_id().unwrap(), len, body)
            .await
            .unwrap();
    });
}

/// The stored bytes of `name` in the vault, as another client reads them.
pub fn stored(env: &Env, name: &str) -> Vec<u8> {
    use vaultfs::backend::Backend;
    let b = env.backend();
    let p = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/Local/My First Vault/{name}"))
        .unwrap();
    env.rt.block_on(async {
        let id = b.node(&p).await.unwrap().file_id().unwrap().to_string();
        super::content(&b, &id).await
    })
}

/// Carries one connection to `upstream`, each piece of a request through `request` and each
/// piece of an answer through `answer` before it goes on (the proxies' latency, rate, log).
fn relay(
    client: std::net::TcpStream,
    upstream: &str,
    request: impl FnMut(&[u8]) + Send + 'static,
    answer: impl FnMut(&[u8]) + Send + 'static,
) {
    let Ok(server) = std::net::TcpStream::connect(upstream) else {
        return;
    };
    let (from_server, to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || carry(from_server, to_client, answer));
    carry(client, server, request);
}

/// One direction of [`relay`]: until either end closes, then both.
fn carry(mut from: std::net::TcpStream, mut to: std::net::TcpStream, mut each: impl FnMut(&[u8])) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        each(&buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
