//! Client-side benchmark of the remote backend (`vaultfs::backend::remote::RemoteBackend`)
//! against a running server, usually `vaultfs serve` on loopback:
//!
//! 1. the three-step upload of a file, its md5 computed first (as the mount does): the time of
//!    the hashing, of steps 1 + 2, of step 3, and the totals with and without the hashing;
//! 2. downloads of that file, read to the end and discarded (the first one after dropping the
//!    page cache when `--drop-caches` is given and allowed, i.e. as root);
//! 3. N `node()` calls (the mount's stat) on a small file, one after the other over the
//!    client's pooled connection: calls/s and latency percentiles.
//!
//! ```sh
//! cargo build --release --example remote_bench
//! VAULTFS_TOKEN=... target/release/examples/remote_bench --url http://127.0.0.1:8080 \
//!     --email alice@example.com --folder "Acme/My First Vault" --file big.bin
//! ```
//!
//! Progress goes to stderr; stdout gets one `key=value` line per figure (seconds, bytes,
//! MiB/s, calls/s) for scripts (`scripts/bench server` reads them). The files it creates are
//! deleted at the end unless `--keep`. With `--server-pid`, the server's CPU time (user +
//! system, from /proc) is reported for each phase beside the client's own.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use vaultfs::api::checksum::{Md5, hex};

use vaultfs::api::NodePath;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, reader_stream};

#[derive(Parser)]
#[command(about = "Upload, download and stat throughput of the remote backend")]
struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:8080
    #[arg(long, env = "VAULTFS_URL")]
    url: String,
    /// The user's e-mail address
    #[arg(long, env = "VAULTFS_EMAIL")]
    email: String,
    /// The user's token (prefer the environment: arguments are visible in `ps`)
    #[arg(long, env = "VAULTFS_TOKEN", hide_env_values = true)]
    token: String,
    /// Folder to work in, e.g. "Acme/My First Vault"
    #[arg(long, default_value = "Local/My First Vault")]
    folder: String,
    /// The file to upload and download
    #[arg(long)]
    file: PathBuf,
    /// Name of the uploaded file in the folder [default: remote-bench-PID.bin]
    #[arg(long)]
    name: Option<String>,
    /// Number of downloads (the first is cold with --drop-caches)
    #[arg(long, default_value_t = 2)]
    downloads: u32,
    /// Number of `node()` calls on the small file
    #[arg(long, default_value_t = 2000)]
    stats: u32,
    /// Drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches) before the first download,
    /// when allowed (the file to upload is read as it is: put it in the page cache first for
    /// figures comparable with `curl -T` from the page cache)
    #[arg(long)]
    drop_caches: bool,
    /// PID of the server, to report its CPU time per phase (same machine only)
    #[arg(long)]
    server_pid: Option<u32>,
    /// Keep the uploaded files
    #[arg(long)]
    keep: bool,
}

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(args))
}

/// CPU time (user + system) of this process.
fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time (user + system) of another process, from /proc/PID/stat.
fn proc_cpu(pid: Option<u32>) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// Client and server CPU time between two points.
struct Cpu {
    client: Duration,
    server: Option<Duration>,
    pid: Option<u32>,
}

impl Cpu {
    fn start(pid: Option<u32>) -> Cpu {
        Cpu {
            client: self_cpu(),
            server: proc_cpu(pid),
            pid,
        }
    }

    /// Prints `PREFIX_cpu_client=S` and `PREFIX_cpu_server=S`.
    fn report(&self, prefix: &str) {
        let c = self_cpu().saturating_sub(self.client);
        println!("{prefix}_cpu_client={:.3}", c.as_secs_f64());
        if let (Some(a), Some(b)) = (self.server, proc_cpu(self.pid)) {
            println!(
                "{prefix}_cpu_server={:.3}",
                b.saturating_sub(a).as_secs_f64()
            );
        }
    }
}

fn drop_caches(enabled: bool) -> bool {
    if !enabled {
        return false;
    }
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let ok = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    if !ok {
        eprintln!("remote_bench: cannot drop the page cache (not root?): reads are warm");
    }
    ok
}

fn mibps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1048576.0
}

fn md5_file(path: &PathBuf) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The three steps of an upload; returns (file ID, time of steps 1 + 2, time of step 3).
async fn upload(
    b: &RemoteBackend,
    folder: &NodePath,
    name: &str,
    size: u64,
    md5: &str,
    body: vaultfs::backend::ByteStream,
) -> Result<(String, Duration, Duration), BoxError> {
    let t0 = Instant::now();
    let file = b.create_file(folder, name).await?;
    let id = file.file_id().ok_or("create_file returned no file ID")?;
    let ticket = b.begin_version(&id, size, Some(md5)).await?;
    let vid = ticket
        .version_id()
        .ok_or("upload step 2 returned no version")?;
    let t12 = t0.elapsed();
    let t1 = Instant::now();
    let stored = b.upload(&id, &vid, size, body).await?;
    let t3 = t1.elapsed();
    if stored.md5_checksum.as_deref().is_some_and(|m| m != md5) {
        return Err(format!(
            "the server stored md5 {:?}, expected {md5}",
            stored.md5_checksum
        )
        .into());
    }
    Ok((id, t12, t3))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let backend = RemoteBackend::new(RemoteConfig::new(&args.url, &args.email, &args.token))?;
    let folder = NodePath::from_segments(
        args.folder
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty()),
    )?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("remote-bench-{}.bin", std::process::id()));
    let small_name = format!("remote-bench-{}-small.txt", std::process::id());
    let size = std::fs::metadata(&args.file)?.len();
    println!("size={size}");

    // The folder must be there; this also opens the pooled connection.
    backend.node(&folder).await?;

    // --- upload: hash first, then the three steps ---------------------------------------------
    eprintln!(
        "remote_bench: hashing {} ({size} bytes)",
        args.file.display()
    );
    let cpu = Cpu::start(args.server_pid);
    let t0 = Instant::now();
    let path = args.file.clone();
    let md5 = tokio::task::spawn_blocking(move || md5_file(&path)).await??;
    let t_hash = t0.elapsed();
    cpu.report("hash");
    println!("hash_s={:.6}", t_hash.as_secs_f64());
    println!("hash_mibps={:.1}", mibps(size, t_hash));

    eprintln!("remote_bench: uploading (three steps)");
    let cpu = Cpu::start(args.server_pid);
    let body = reader_stream(File::open(&args.file)?, size);
    let (id, t12, t3) = upload(&backend, &folder, &name, size, &md5, body).await?;
    cpu.report("upload");
    let up = t12 + t3;
    println!("upload_steps12_s={:.6}", t12.as_secs_f64());
    println!("upload_step3_s={:.6}", t3.as_secs_f64());
    println!("upload_step3_mibps={:.1}", mibps(size, t3));
    println!("upload_s={:.6}", up.as_secs_f64());
    println!("upload_mibps={:.1}", mibps(size, up));
    println!("upload_with_hash_s={:.6}", (up + t_hash).as_secs_f64());
    println!("upload_with_hash_mibps={:.1}", mibps(size, up + t_hash));

    // --- downloads ----------------------------------------------------------------------------
    for i in 1..=args.downloads {
        let cold = i == 1 && drop_caches(args.drop_caches);
        eprintln!(
            "remote_bench: download {i} ({})",
            if cold { "cold" } else { "warm" }
        );
        let cpu = Cpu::start(args.server_pid);
        let t0 = Instant::now();
        let mut dl = backend.download(&id, None).await?;
        let mut n = 0u64;
        while let Some(chunk) = dl.body.next().await {
            n += chunk?.len() as u64;
        }
        let t = t0.elapsed();
        if n != size {
            return Err(format!("download {i} gave {n} bytes, expected {size}").into());
        }
        let key = if i == 1 {
            if cold {
                "download_cold"
            } else {
                "download_first"
            }
            .to_string()
        } else {
            format!("download{i}")
        };
        cpu.report(&key);
        println!("{key}_s={:.6}", t.as_secs_f64());
        println!("{key}_mibps={:.1}", mibps(size, t));
    }

    // --- stat round trips ---------------------------------------------------------------------
    eprintln!("remote_bench: {} node() calls", args.stats);
    let small = folder.child(&small_name)?;
    let body = reader_stream(std::io::Cursor::new(b"hello, world\n".to_vec()), 13);
    let small_md5 = hex(&Md5::digest(b"hello, world\n"));
    upload(&backend, &folder, &small_name, 13, &small_md5, body).await?;
    backend.node(&small).await?; // warm-up
    let mut lat = Vec::with_capacity(args.stats as usize);
    let cpu = Cpu::start(args.server_pid);
    let t0 = Instant::now();
    for _ in 0..args.stats {
        let t = Instant::now();
        let n = backend.node(&small).await?;
        lat.push(t.elapsed());
        if n.size != Some(13) {
            return Err(format!("node() returned size {:?}, expected 13", n.size).into());
        }
    }
    let total = t0.elapsed();
    cpu.report("stat");
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    println!("stat_n={}", args.stats);
    println!("stat_s={:.6}", total.as_secs_f64());
    println!(
        "stat_per_s={:.0}",
        args.stats as f64 / total.as_secs_f64().max(1e-9)
    );
    println!("stat_p50_us={:.0}", pct(0.50));
    println!("stat_p99_us={:.0}", pct(0.99));
    println!("stat_max_us={:.0}", pct(1.0));

    if !args.keep {
        backend.delete(&folder.child(&name)?).await?;
        backend.delete(&small).await?;
    }
    Ok(())
}
