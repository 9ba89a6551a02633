//! A real S3-compatible server for the tests of `--blobs s3://...`: moto's server mode, from
//! the virtualenv `.ci/run` installs it into (or `VAULTFS_MOTO_SERVER`). One per test binary,
//! started on first use and ended with the binary; each store gets a prefix of its own in one
//! bucket. Where moto cannot be had, [`s3`] says so loudly and the tests skip.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vaultfs::store::BlobLocation;
use vaultfs::store::bucket::BucketLocation;

pub const BUCKET: &str = "vaultfs-test";

/// The endpoint of the running server (`http://127.0.0.1:PORT`).
pub struct S3Server {
    pub endpoint: String,
}

fn moto_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VAULTFS_MOTO_SERVER") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let p = cache.join("vaultfs-ci/moto/bin/moto_server");
    p.exists().then_some(p)
}

fn start() -> Option<S3Server> {
    let Some(moto) = moto_path() else {
        eprintln!(
            "\n*** SKIPPED: no S3-compatible server (moto_server; `.ci/run` installs it into \
             ~/.cache/vaultfs-ci/moto, or set VAULTFS_MOTO_SERVER) ***\n"
        );
        return None;
    };
    let port = super::free_port();
    // Started from a thread that never ends, so that PR_SET_PDEATHSIG (which follows the
    // thread that spawned the child) ends moto when this test binary ends, however it ends.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&moto);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let _ = tx.send(cmd.spawn().map(drop));
        loop {
            std::thread::park();
        }
    });
    if let Err(e) = rx.recv().expect("the spawning thread answers") {
        eprintln!("\n*** SKIPPED: moto_server would not start: {e} ***\n");
        return None;
    }
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let http = reqwest::blocking::Client::new();
    // moto takes any credentials; the bucket is made once.
    loop {
        match http.put(format!("{endpoint}/{BUCKET}")).send() {
            Ok(r) if r.status().is_success() => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("moto_server did not come up on {endpoint}: {other:?}"),
        }
    }
    // SAFETY: set once, before any store of this binary reads them; Rust's own environment
    // accesses are serialized.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_REGION", "us-east-1");
    }
    Some(S3Server { endpoint })
}

/// The shared server, or `None` (said loudly) when moto is not installed.
pub fn s3() -> Option<&'static S3Server> {
    static SERVER: OnceLock<Option<S3Server>> = OnceLock::new();
    // Started on a thread of its own: reqwest's blocking client must not run on a runtime's.
    SERVER
        .get_or_init(|| std::thread::spawn(start).join().expect("moto start"))
        .as_ref()
}

impl S3Server {
    /// A new, empty place for one store's blobs.
    pub fn location(&self) -> BlobLocation {
        let prefix = format!("s3://{BUCKET}/t{:016x}", rand::random::<u64>());
        BlobLocation::Bucket(
            BucketLocation::parse(&prefix, Some(&self.endpoint))
                .unwrap()
                .unwrap(),
        )
    }
}
