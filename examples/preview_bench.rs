//! Benchmark of previews, end to end over HTTP: a store in a scratch dir with its preview
//! threads (as `vaultfs serve` runs them), served on loopback, driven by the remote backend.
//!
//! 1. time from the end of an upload to `Ready`, for a 20-page text file and for 20-page PDFs
//!    (one made by the store's own text rendering, one written by hand: two producers);
//! 2. latency of a 25% thumbnail once rendered: the first request (scaled then) and later ones
//!    (cached);
//! 3. upload and download throughput of a large file alone, then while previews render.
//!
//! ```sh
//! cargo run --release --example preview_bench -- [--dir /var/tmp] [--size-mib 256] [--runs 5]
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
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{Store, StoreConfig, default_preview_workers};

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

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let tmp = tempfile::Builder::new()
        .prefix("vaultfs-preview-bench")
        .tempdir_in(&args.dir)
        .unwrap();
    let store = Arc::new(Store::open(&tmp.path().join("data"), StoreConfig::default()).unwrap());
    let workers = default_preview_workers();
    store.start_previews(workers).unwrap();
    store
        .add_user("bench@example.com", "Bench", "bench-password")
        .unwrap();
    let pin = store
        .sign_in_for_pin("bench@example.com", "bench-password", "vaultfs")
        .unwrap();
    let token = store
        .exchange_pin("bench@example.com", "vaultfs", &pin)
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
