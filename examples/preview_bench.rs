//! Benchmark of previews, end to end over HTTP: a store in a scratch dir with its preview
//! threads (as `vaultfs serve` runs them), served on loopback, driven by the remote backend.
//!
//! 1. time from the end of an upload to `Ready`, for a 20-page text file and for 20-page PDFs
//!    (one made by the store's own text rendering, one written by hand: two producers);
//! 2. latency of a 25% thumbnail once rendered: the first request (scaled then) and later ones
//!    (cached);
//! 3. upload and download throughput of a large file alone, then while previews render.
//!
//! 4. (`--section burst`) a burst of small distinct text files (3,000 by default) on both
//!    backends, with previews off (no preview threads) and on (`--previews`): create throughput,
//!    then the time until one more file asked for is `Ready` and its first page served, and the
//!    bytes of the previews nobody asked for against the files' bytes once the store is idle;
//! 5. (`--section tree`) a tree of 20,000 small files of which a few hundred are asked for,
//!    under a small `--preview-cache-size`: the largest size of the previews seen.
//!
//! ```sh
//! cargo run --release --example preview_bench -- [--dir /var/tmp] [--size-mib 256] [--runs 5]
//! cargo run --release --example preview_bench -- --section burst [--files 3000] [--previews eager]
//! cargo run --release --example preview_bench -- --section tree [--files 20000] [--asked 300]
//! ```
//!
//! Prints a Markdown table (medians, with min-max) and the machine's load average.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

// The hand-written PDFs and texts of the preview tests.
#[path = "../tests/common/fixtures.rs"]
mod fixtures;
use futures_util::StreamExt;

use vaultfs::api::{NodePath, PageSize, PreviewStatus};
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{PreviewMode, Store, StoreConfig, default_preview_workers};

#[derive(Parser)]
#[command(about = "Preview latency and its effect on transfers")]
struct Args {
    /// Parent of the scratch data dir (the disk measured)
    #[arg(long, default_value = "/tmp")]
    dir: std::path::PathBuf,
    /// Size of the large file transferred alone and during rendering, MiB
    #[arg(long, default_value_t = 256)]
    size_mib: usize,
    /// Runs of each latency figure
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Files rendered while the large file is transferred
    #[arg(long, default_value_t = 24)]
    busy_files: usize,
    /// latency (1-3), burst (4) or tree (5)
    #[arg(long, default_value = "latency")]
    section: String,
    /// Files of the burst (default 3000) or of the tree (default 20000)
    #[arg(long)]
    files: Option<usize>,
    /// Uploads at once in the burst (the mount's upload slots)
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Preview mode of the store: on-demand or eager
    #[arg(long, default_value = "on-demand", value_parser = |s: &str| s.parse::<PreviewMode>())]
    previews: PreviewMode,
    /// Files of the tree asked for
    #[arg(long, default_value_t = 300)]
    asked: usize,
    /// Preview cache bound of the tree, bytes
    #[arg(long, default_value_t = 4 << 20)]
    cache_size: u64,
    /// The `vaultfs` binary that renders each preview in a child process [default: the one
    /// built beside this example, `cargo build --release` first]
    #[arg(long)]
    renderer: Option<std::path::PathBuf>,
}

fn stream(data: Arc<Vec<u8>>) -> ByteStream {
    let n = data.len().div_ceil(1 << 20);
    Box::pin(futures_util::stream::iter((0..n).map(move |i| {
        let end = ((i + 1) << 20).min(data.len());
        Ok(bytes::Bytes::copy_from_slice(&data[i << 20..end]))
    })))
}

async fn put(b: &RemoteBackend, folder: &NodePath, name: &str, data: Arc<Vec<u8>>) -> String {
    let f = b.create_file(folder, name).await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let len = data.len() as u64;
    b.upload(&id, &vid, len, stream(data)).await.unwrap();
    id
}

/// Polls until the preview is Ready; the time it took.
async fn until_ready(b: &RemoteBackend, id: &str, since: Instant) -> (Duration, usize) {
    loop {
        let m = b.preview(id).await.unwrap();
        match m.status {
            PreviewStatus::Ready => return (since.elapsed(), m.pages.len()),
            PreviewStatus::InProgress => tokio::time::sleep(Duration::from_millis(2)).await,
            PreviewStatus::TypeNotSupported => panic!("{id}: no preview"),
        }
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "{id}: not ready after 120 s"
        );
    }
}

/// `pages` pages of text (60 lines of up to 90 characters make a page here); `tag` makes each
/// run's bytes new.
fn text(pages: usize, tag: usize) -> Vec<u8> {
    let mut t = String::new();
    for i in 0..pages * 60 {
        t.push_str(&format!(
            "{tag:04}/{i:05} The quick brown fox jumps over the lazy dog; Grüße, café, 1 € = {i}\n"
        ));
    }
    t.into_bytes()
}

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Stat {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

fn ms(s: &Stat) -> String {
    format!("{:.0} ms ({:.0}-{:.0})", s.median, s.min, s.max)
}

async fn download_all(b: &RemoteBackend, id: &str) -> u64 {
    let mut d = b.download(id, None).await.unwrap();
    let mut n = 0;
    while let Some(c) = d.body.next().await {
        n += c.unwrap().len() as u64;
    }
    n
}

/// `--renderer`, else `target/<profile>/vaultfs` beside `target/<profile>/examples/`.
fn renderer(args: &Args) -> std::path::PathBuf {
    let path = args.renderer.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("vaultfs")
    });
    assert!(
        path.is_file(),
        "no renderer at {} (cargo build --release, or --renderer)",
        path.display()
    );
    path
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match args.section.as_str() {
        "latency" => {}
        "burst" => return burst(&args).await,
        "tree" => return tree(&args).await,
        s => panic!("unknown section {s}"),
    }
    let tmp = tempfile::Builder::new()
        .prefix("vaultfs-preview-bench")
        .tempdir_in(&args.dir)
        .unwrap();
    let store = Arc::new(Store::open(&tmp.path().join("data"), StoreConfig::default()).unwrap());
    let workers = default_preview_workers();
    store.start_previews(workers, &renderer(&args)).unwrap();
    store
        .add_user("bench@example.com", "Bench", "bench-password")
        .unwrap();
    let pin = store
        .sign_in_for_pin("bench@example.com", "bench-password", "vaultfs", "")
        .unwrap();
    let token = store
        .exchange_pin("bench@example.com", "vaultfs", &pin, "")
        .unwrap()
        .token;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = vaultfs::server::router(store.clone(), Default::default());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let b = RemoteBackend::new(RemoteConfig::new(&base, "bench@example.com", &token)).unwrap();
    let folder = NodePath::parse_uri("/nodes/pth/Bench/My First Vault").unwrap();
    let mut rows: Vec<(String, String, String)> = Vec::new();

    // 1. Upload to Ready.
    let (mut text_t, mut made_t, mut hand_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut pages_seen = (0, 0, 0);
    for run in 0..args.runs {
        let data = Arc::new(text(20, run));
        let id = put(&b, &folder, &format!("text-{run}.txt"), data).await;
        let (t, n) = until_ready(&b, &id, Instant::now()).await;
        text_t.push(t.as_secs_f64() * 1000.0);
        pages_seen.0 = n;
        // The store's own PDF of that text, uploaded as a PDF of its own.
        let mut d = b.preview_pdf(&id).await.unwrap();
        let mut pdf = Vec::new();
        while let Some(c) = d.body.next().await {
            pdf.extend_from_slice(&c.unwrap());
        }
        pdf.extend_from_slice(format!("\n%run {run}\n").as_bytes());
        let pid = put(&b, &folder, &format!("made-{run}.pdf"), Arc::new(pdf)).await;
        let (t, n) = until_ready(&b, &pid, Instant::now()).await;
        made_t.push(t.as_secs_f64() * 1000.0);
        pages_seen.1 = n;
        let hid = put(
            &b,
            &folder,
            &format!("hand-{run}.pdf"),
            Arc::new(fixtures::shapes_pdf(20, run)),
        )
        .await;
        let (t, n) = until_ready(&b, &hid, Instant::now()).await;
        hand_t.push(t.as_secs_f64() * 1000.0);
        pages_seen.2 = n;
    }
    rows.push((
        format!("text file ({} pages): upload done → Ready", pages_seen.0),
        ms(&stat(text_t)),
        "< 1000 ms".into(),
    ));
    rows.push((
        format!("PDF made by the store ({} pages) → Ready", pages_seen.1),
        ms(&stat(made_t)),
        "< 1000 ms".into(),
    ));
    rows.push((
        format!("PDF written by hand ({} pages) → Ready", pages_seen.2),
        ms(&stat(hand_t)),
        "< 1000 ms".into(),
    ));

    // 2. A 25% thumbnail: first request (scaled now), then cached.
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let id = put(
            &b,
            &folder,
            &format!("thumb-{run}.txt"),
            Arc::new(text(2, 100 + run)),
        )
        .await;
        until_ready(&b, &id, Instant::now()).await;
        let size = PageSize {
            scale: Some(25),
            ..PageSize::default()
        };
        let t = Instant::now();
        b.preview_page(&id, 1, size).await.unwrap();
        first.push(t.elapsed().as_secs_f64() * 1000.0);
        for _ in 0..10 {
            let t = Instant::now();
            b.preview_page(&id, 1, size).await.unwrap();
            later.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let fmt_fine = |s: &Stat| format!("{:.1} ms ({:.1}-{:.1})", s.median, s.min, s.max);
    rows.push((
        "25% thumbnail, first request".into(),
        fmt_fine(&stat(first)),
        "< 50 ms".into(),
    ));
    rows.push((
        "25% thumbnail, later requests".into(),
        fmt_fine(&stat(later)),
        "< 50 ms".into(),
    ));

    // 3. Transfers alone, then while previews render.
    let size = args.size_mib << 20;
    let big: Arc<Vec<u8>> = Arc::new((0..size).map(|i| (i * 31 + i / 4099) as u8).collect());
    let mib = size as f64 / (1 << 20) as f64;
    let transfer = |label: &str, busy: bool| {
        let (b, folder, big, store) = (&b, &folder, big.clone(), store.clone());
        let label = label.to_string();
        let busy_files = args.busy_files;
        async move {
            let mut queued = Vec::new();
            if busy {
                for i in 0..busy_files {
                    let name = format!("busy-{label}-{i}.txt");
                    queued.push(put(b, folder, &name, Arc::new(text(20, 1000 + i))).await);
                }
                // Asked for, so they render during the transfers (on-demand renders files this
                // small only when asked).
                for q in &queued {
                    b.preview(q).await.unwrap();
                }
            }
            let t = Instant::now();
            let id = put(b, folder, &format!("big-{label}.bin"), big).await;
            let up = mib / t.elapsed().as_secs_f64();
            let t = Instant::now();
            assert_eq!(download_all(b, &id).await, size as u64);
            let down = mib / t.elapsed().as_secs_f64();
            let mut still = 0;
            for q in &queued {
                if b.preview(q).await.unwrap().status == PreviewStatus::InProgress {
                    still += 1;
                }
            }
            b.delete(&folder.child(&format!("big-{label}.bin")).unwrap())
                .await
                .unwrap();
            drop(store);
            (up, down, still)
        }
    };
    let (up_alone, down_alone, _) = transfer("alone", false).await;
    let (up_busy, down_busy, still) = transfer("busy", true).await;
    rows.push((
        format!("upload {mib:.0} MiB alone / while rendering"),
        format!(
            "{up_alone:.0} / {up_busy:.0} MiB/s ({:.0}%)",
            100.0 * up_busy / up_alone
        ),
        "not blocked".into(),
    ));
    rows.push((
        format!("download {mib:.0} MiB alone / while rendering"),
        format!(
            "{down_alone:.0} / {down_busy:.0} MiB/s ({:.0}%)",
            100.0 * down_busy / down_alone
        ),
        "not blocked".into(),
    ));
    rows.push((
        "previews still rendering when the transfers ended".into(),
        format!("{still} of {}", args.busy_files),
        "(shows they overlapped)".into(),
    ));

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "Preview benchmark: {} preview thread(s), {} cores, {} runs, load average {}\n",
        workers,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.runs,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("| measure | result (median, min-max) | target |");
    println!("|---|---|---|");
    for (a, b, c) in rows {
        println!("| {a} | {b} | {c} |");
    }
}

/// A 4 KiB text file, different for each `i`.
fn small(i: usize) -> Vec<u8> {
    let mut t = format!("small file {i}\n");
    while t.len() < 4096 - 40 {
        t.push_str(&format!("line {} of file {i}: some words\n", t.len()));
    }
    t.truncate(4096);
    t.into_bytes()
}

/// A store in `dir` with the mode and bound asked for, its threads started or not.
fn open_store(dir: &std::path::Path, args: &Args, cache: u64, previews: bool) -> Arc<Store> {
    let config = StoreConfig {
        previews: args.previews,
        preview_cache_size: cache,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::open(dir, config).unwrap());
    if previews {
        store
            .start_previews(default_preview_workers(), &renderer(args))
            .unwrap();
    }
    store
        .add_user("bench@example.com", "Bench", "bench-password")
        .unwrap();
    store
}

/// The built-in backend, or the remote one over a server on loopback.
enum Either {
    Local(LocalBackend),
    Remote(RemoteBackend),
}

async fn backend_for(store: &Arc<Store>, remote: bool) -> Either {
    if !remote {
        let acct = store.ensure_account("Bench").unwrap();
        return Either::Local(LocalBackend::for_account(store.clone(), acct));
    }
    let pin = store
        .sign_in_for_pin("bench@example.com", "bench-password", "vaultfs", "")
        .unwrap();
    let token = store
        .exchange_pin("bench@example.com", "vaultfs", &pin, "")
        .unwrap()
        .token;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = vaultfs::server::router(store.clone(), Default::default());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Either::Remote(
        RemoteBackend::new(RemoteConfig::new(&base, "bench@example.com", &token)).unwrap(),
    )
}

async fn put_any<B: Backend>(b: &B, folder: &NodePath, name: String, data: Vec<u8>) -> String {
    let name = name.as_str();
    let f = b.create_file(folder, name).await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    let len = data.len() as u64;
    b.upload(&id, &vid, len, stream(Arc::new(data)))
        .await
        .unwrap();
    id
}

/// Writes `n` small files, `parallel` at once; files per second.
async fn write_burst<B: Backend>(b: &B, folder: &NodePath, n: usize, parallel: usize) -> f64 {
    let t = Instant::now();
    futures_util::stream::iter(0..n)
        .map(|i| put_any(b, folder, format!("f{i:05}.txt"), small(i)))
        .buffer_unordered(parallel)
        .for_each(|_| async {})
        .await;
    n as f64 / t.elapsed().as_secs_f64()
}

/// Time until the preview of `id` is Ready, and until its first page is served.
async fn asked<B: Backend>(b: &B, id: &str) -> (Duration, Duration) {
    let t = Instant::now();
    let ready = loop {
        let m = b.preview(id).await.unwrap();
        if m.status == PreviewStatus::Ready {
            break t.elapsed();
        }
        assert!(t.elapsed() < Duration::from_secs(600), "never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    b.preview_page(id, 1, PageSize::default()).await.unwrap();
    (ready, t.elapsed())
}

fn du(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let m = e.metadata().unwrap();
            n += if m.is_dir() {
                du(&e.path())
            } else {
                m.blocks() * 512
            };
        }
    }
    n
}

async fn burst_on<B: Backend>(
    b: &B,
    store: &Arc<Store>,
    dir: &std::path::Path,
    args: &Args,
    n: usize,
    on: bool,
) -> (f64, Option<(Duration, Duration, u64, u64)>) {
    let folder = NodePath::parse_uri("/nodes/pth/Bench/My First Vault").unwrap();
    let rate = write_burst(b, &folder, n, args.parallel).await;
    if !on {
        return (rate, None);
    }
    // Straight after the burst: one more file, asked for at once.
    let id = put_any(b, &folder, "notes.txt".into(), text(3, 7)).await;
    let (ready, page) = asked(b, &id).await;
    // Then idle: whatever the background does with the burst.
    let t = Instant::now();
    while store.preview_stats().unwrap().background_pending > 0
        && t.elapsed() < Duration::from_secs(900)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(IDLE_WAIT).await;
    let s = store.preview_stats().unwrap();
    (
        rate,
        Some((
            ready,
            page,
            s.unrequested_bytes,
            du(&dir.join("data/previews")),
        )),
    )
}

const IDLE_WAIT: Duration = Duration::from_secs(3);

async fn burst(args: &Args) {
    let n = args.files.unwrap_or(3000);
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let files_bytes = (n * 4096) as f64;
    for remote in [false, true] {
        let which = if remote {
            "remote (HTTP loopback)"
        } else {
            "local"
        };
        let mut rates = [Vec::new(), Vec::new()];
        let mut after = None;
        let runs = (0..args.runs.max(1)).flat_map(|_| [false, true]);
        for on in runs {
            let k = on as usize;
            let tmp = tempfile::Builder::new()
                .prefix("vaultfs-preview-burst")
                .tempdir_in(&args.dir)
                .unwrap();
            let store = open_store(&tmp.path().join("data"), args, 1 << 30, on);
            let r = match backend_for(&store, remote).await {
                Either::Local(b) => burst_on(&b, &store, tmp.path(), args, n, on).await,
                Either::Remote(b) => burst_on(&b, &store, tmp.path(), args, n, on).await,
            };
            rates[k].push(r.0);
            if r.1.is_some() {
                after = r.1;
            }
        }
        let [off, on] = rates.map(stat);
        rows.push((
            format!(
                "{which}: create {n} x 4 KiB, {} at once, previews off / {} ({} runs each, alternating)",
                args.parallel, args.previews, args.runs
            ),
            format!(
                "{:.0} ({:.0}-{:.0}) / {:.0} ({:.0}-{:.0}) files/s ({:+.1}%)",
                off.median,
                off.min,
                off.max,
                on.median,
                on.min,
                on.max,
                100.0 * (on.median / off.median - 1.0)
            ),
            "within 10%".into(),
        ));
        let (ready, page, unrequested, on_disk) = after.expect("previews on ran");
        rows.push((
            format!("{which}: one more file asked for after the burst → Ready / first page"),
            format!(
                "{:.0} ms / {:.0} ms",
                ready.as_secs_f64() * 1e3,
                page.as_secs_f64() * 1e3
            ),
            "< 2000 ms / < 1000 ms".into(),
        ));
        rows.push((
            format!("{which}: unrequested previews, idle after the burst (du of previews/)"),
            format!(
                "{:.2} MiB ({:.1}% of the files' {:.1} MiB); du {:.2} MiB",
                unrequested as f64 / 1048576.0,
                100.0 * unrequested as f64 / files_bytes,
                files_bytes / 1048576.0,
                on_disk as f64 / 1048576.0
            ),
            "≤ 25%".into(),
        ));
    }
    print_rows(args, &rows);
}

async fn tree(args: &Args) {
    let n = args.files.unwrap_or(20000);
    let tmp = tempfile::Builder::new()
        .prefix("vaultfs-preview-tree")
        .tempdir_in(&args.dir)
        .unwrap();
    let store = open_store(&tmp.path().join("data"), args, args.cache_size, true);
    let acct = store.ensure_account("Bench").unwrap();
    let b = LocalBackend::for_account(store.clone(), acct);
    let root = NodePath::parse_uri("/nodes/pth/Bench/My First Vault").unwrap();
    let mut ids = Vec::new();
    let t = Instant::now();
    for d in 0..n.div_ceil(500) {
        let folder = root.child(&format!("d{d:03}")).unwrap();
        b.create_folder(&folder).await.unwrap();
        let names: Vec<usize> = (d * 500..((d + 1) * 500).min(n)).collect();
        let got: Vec<String> = futures_util::stream::iter(names)
            .map(|i| put_any(&b, &folder, format!("f{i:05}.txt"), small(i)))
            .buffered(args.parallel)
            .collect()
            .await;
        ids.extend(got);
    }
    let write = t.elapsed();
    let mut max_bytes = 0;
    let step = (n / args.asked.max(1)).max(1);
    let t = Instant::now();
    for id in ids.iter().step_by(step).take(args.asked) {
        asked(&b, id).await;
        max_bytes = max_bytes.max(store.preview_stats().unwrap().bytes);
    }
    let asking = t.elapsed();
    tokio::time::sleep(IDLE_WAIT).await;
    let s = store.preview_stats().unwrap();
    max_bytes = max_bytes.max(s.bytes);
    let on_disk = du(&tmp.path().join("data/previews"));
    let rows = vec![
        (
            format!(
                "{n} files written ({:.0} files/s)",
                n as f64 / write.as_secs_f64()
            ),
            format!("{} asked for in {:.1} s", args.asked, asking.as_secs_f64()),
            String::new(),
        ),
        (
            format!(
                "preview bytes, bound {:.1} MiB ({})",
                args.cache_size as f64 / 1048576.0,
                args.previews
            ),
            format!(
                "largest seen {:.2} MiB, at the end {:.2} MiB (du {:.2} MiB), {} evicted, {} ready",
                max_bytes as f64 / 1048576.0,
                s.bytes as f64 / 1048576.0,
                on_disk as f64 / 1048576.0,
                s.evicted,
                s.ready
            ),
            "within the bound".into(),
        ),
    ];
    print_rows(args, &rows);
}

fn print_rows(args: &Args, rows: &[(String, String, String)]) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "Preview benchmark ({}): {} preview thread(s) of each kind, {} cores, load average {}\n",
        args.section,
        default_preview_workers(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("| measure | result | target |");
    println!("|---|---|---|");
    for (a, b, c) in rows {
        println!("| {a} | {b} | {c} |");
    }
}
