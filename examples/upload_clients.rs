//! Uploads per second of many clients at once against one or more servers of a store (the
//! figure of issue 15: several `vaultfs serve` on one database and one blob store).
//!
//! `--clients` clients, each with its own `RemoteBackend` (its own connections), each
//! uploading `--files` new files of `--size` bytes one after another (the three steps, with
//! md5), client `i` talking to server `i mod n` of the `--url`s given. Every file's bytes
//! differ, so each upload stores a new blob. With several users (`--email`, `--token` and
//! `--folder` each given once per user, in the same order), client `i` is user `i mod users`'s
//! (and talks to server `(i / users) mod n`): clients of accounts side by side (issue 46).
//!
//! ```sh
//! cargo build --release --example upload_clients
//! VAULTFS_TOKEN=... target/release/examples/upload_clients --url http://127.0.0.1:8080 \
//!     --url http://127.0.0.1:8081 --email alice@example.com --folder "Acme/My First Vault"
//! ```
//!
//! stdout gets `key=value` lines (uploads, seconds, uploads per second, latency percentiles in
//! ms) for scripts (`scripts/bench server` and `scripts/bench shared` read them). The files are
//! left in a new folder of `--folder`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use vaultfs::api::checksum::{Md5, hex};

use vaultfs::api::NodePath;
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};

#[derive(Parser)]
#[command(about = "Uploads per second of many concurrent clients")]
struct Args {
    /// Base URL of a server; repeat for several servers of one store
    #[arg(long, required = true)]
    url: Vec<String>,
    /// The user's e-mail address; repeat (or separate by commas) for several users
    #[arg(long, env = "VAULTFS_EMAIL", required = true, value_delimiter = ',')]
    email: Vec<String>,
    /// The user's token, one per user (prefer the environment, commas between users:
    /// arguments are visible in `ps`)
    #[arg(
        long,
        env = "VAULTFS_TOKEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    token: Vec<String>,
    /// Folder to work in, e.g. "Acme/My First Vault" (a new folder is made in it); one per user
    #[arg(long, required = true)]
    folder: Vec<String>,
    /// Number of concurrent clients
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Files each client uploads
    #[arg(long, default_value_t = 40)]
    files: usize,
    /// Size of each file in bytes
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Seed of the files' bytes: give each run against one store its own, or the store already
    /// holds the bytes (a new version of known bytes stores no new blob)
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(args))
}

/// The bytes of file `j` of client `i` in run `seed`: different for every file.
fn body(seed: u64, i: usize, j: usize, size: usize) -> Bytes {
    let file = (i as u64) << 32 | j as u64;
    let mut x = (file ^ seed.rotate_left(48)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(size);
    out.into()
}

async fn one_upload(
    b: &RemoteBackend,
    folder: &NodePath,
    name: &str,
    data: Bytes,
) -> Result<(), BoxError> {
    let md5 = hex(&Md5::digest(&data));
    let id = b
        .create_file(folder, name)
        .await?
        .file_id()
        .ok_or("create_file returned no file ID")?;
    let ticket = b.begin_version(&id, data.len() as u64, Some(&md5)).await?;
    let vid = ticket
        .version_id()
        .ok_or("upload step 2 returned no version")?;
    let len = data.len() as u64;
    let body: vaultfs::backend::ByteStream =
        Box::pin(futures_util::stream::iter([Ok::<_, std::io::Error>(data)]));
    let stored = b.upload(&id, &vid, len, body).await?;
    if stored.md5_checksum.as_deref() != Some(md5.as_str()) {
        return Err(format!("{name}: stored md5 {:?}, sent {md5}", stored.md5_checksum).into());
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), BoxError> {
    let users = args.email.len();
    if args.token.len() != users || args.folder.len() != users {
        return Err(format!(
            "{users} e-mail address(es), {} token(s), {} folder(s): one of each per user",
            args.token.len(),
            args.folder.len()
        )
        .into());
    }
    // Each user's new folder, made before the clock starts.
    let mut folders = Vec::with_capacity(users);
    for u in 0..users {
        let base = NodePath::parse_uri(&format!("/nodes/pth/{}", args.folder[u]))?;
        let first = RemoteBackend::new(RemoteConfig::new(
            &args.url[0],
            &args.email[u],
            &args.token[u],
        ))?;
        let folder = base.child(&format!("upload-clients-{}", std::process::id()))?;
        first.create_folder(&folder).await?;
        folders.push(folder);
    }
    let clients: Vec<(usize, RemoteBackend)> = (0..args.clients)
        .map(|i| {
            let (u, url) = (i % users, &args.url[(i / users) % args.url.len()]);
            RemoteBackend::new(RemoteConfig::new(url, &args.email[u], &args.token[u]))
                .map(|b| (u, b))
        })
        .collect::<Result<_, _>>()?;
    // Bodies made before the clock starts.
    let bodies: Vec<Vec<Bytes>> = (0..args.clients)
        .map(|i| {
            (0..args.files)
                .map(|j| body(args.seed, i, j, args.size))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .zip(bodies)
        .enumerate()
        .map(|(i, ((u, b), bodies))| {
            let folder = folders[u].clone();
            tokio::spawn(async move {
                let mut times = Vec::new();
                for (j, data) in bodies.into_iter().enumerate() {
                    let t = Instant::now();
                    one_upload(&b, &folder, &format!("c{i:02}-{j:04}.bin"), data).await?;
                    times.push(t.elapsed());
                }
                // When this client finished: a user's rate is its clients' files over its last.
                Ok::<_, BoxError>((u, times, started.elapsed()))
            })
        })
        .collect();
    let mut times: Vec<Duration> = Vec::new();
    let mut per_user = vec![(0usize, Duration::ZERO); users];
    for t in tasks {
        let (u, mine, done) = t.await??;
        per_user[u].0 += mine.len();
        per_user[u].1 = per_user[u].1.max(done);
        times.extend(mine);
    }
    let took = started.elapsed();
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
    let n = times.len();
    println!("servers={}", args.url.len());
    println!("users={users}");
    for (u, (n, took)) in per_user.iter().enumerate() {
        println!(
            "uploads_per_s_user{u}={:.1}",
            *n as f64 / took.as_secs_f64().max(1e-9)
        );
    }
    println!("clients={}", args.clients);
    println!("uploads={n}");
    println!("size={}", args.size);
    println!("seconds={:.3}", took.as_secs_f64());
    println!("uploads_per_s={:.1}", n as f64 / took.as_secs_f64());
    println!("p50_ms={:.1}", pct(0.5).as_secs_f64() * 1000.0);
    println!("p99_ms={:.1}", pct(0.99).as_secs_f64() * 1000.0);
    Ok(())
}
