//! Hostile files against a real `vaultfs serve` (issue 31): a PDF page of 60,000 page-sized
//! fills (2.5 GB rendered in the server's process before), a PDF whose content stream inflates
//! to 8 GiB (the allocator aborted the server, and again after every restart), 2 MB of
//! combining accents (0.8 GB). Rendering runs in a bounded child process: the server's own peak
//! memory stays small, its answers go on, the PDFs are not supported (recorded, so a restart
//! does not render them again), the text is rendered with its marks capped.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use flate2::{Compress, Compression, FlushCompress, write::ZlibEncoder};

use super::{rows, sha256};
use crate::common;
use crate::common::memory_kib;
use crate::common::served::Served;
use vaultfs::api::PreviewStatus;
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};

/// The server's own peak resident memory while it previews the hostile files, in MiB (it
/// reached 2.5 GB, or died, before).
const SERVER_PEAK_MIB: u64 = 400;
const NOT_SUPPORTED_ROW: i64 = 2;
const READY_ROW: i64 = 1;

/// A one-page Letter PDF whose content stream is `data`, under `filter`.
fn one_page_pdf(filter: &str, data: &[u8]) -> Vec<u8> {
    let objects: Vec<Vec<u8>> = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>".to_vec(),
        [
            format!("<< /Length {} /Filter {filter} >>\nstream\n", data.len()).as_bytes(),
            data,
            b"\nendstream",
        ]
        .concat(),
    ];
    crate::common::fixtures::pdf_of_objects(&objects)
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut z = ZlibEncoder::new(Vec::new(), Compression::best());
    z.write_all(data).unwrap();
    z.finish().unwrap()
}

/// `n` fills of the whole page, Flate-compressed: about 4 KB for 60,000.
fn fills_pdf(n: usize) -> Vec<u8> {
    let content = "0.5 g 0 0 612 792 re f\n".repeat(n);
    one_page_pdf("/FlateDecode", &zlib(content.as_bytes()))
}

/// A content stream of `gib` GiB of zeros, Flate twice (a few KB): the inner stream is built
/// without compressing the zeros (one MiB compressed, then the same bytes for each further MiB:
/// with only zeros behind it, every further MiB compresses alike).
fn inflating_pdf(gib: u64) -> Vec<u8> {
    let mib = vec![0u8; 1 << 20];
    let mut c = Compress::new(Compression::best(), false);
    let mut chunk = |input: &[u8], flush| {
        let mut out = Vec::with_capacity(64 << 10);
        c.compress_vec(input, &mut out, flush).unwrap();
        out
    };
    let first = chunk(&mib, FlushCompress::Sync);
    let second = chunk(&mib, FlushCompress::Sync);
    let third = chunk(&mib, FlushCompress::Sync);
    assert_eq!(second, third, "a MiB of zeros after zeros compresses alike");
    let end = chunk(&[], FlushCompress::Finish);
    let total = gib << 30;
    // zlib: header, the raw deflate stream, Adler-32 of the zeros (a = 1, b = total mod 65521).
    let adler = (((total % 65521) as u32) << 16) | 1;
    let mut inner = vec![0x78, 0xda];
    inner.extend_from_slice(&first);
    for _ in 1..(total >> 20) {
        inner.extend_from_slice(&second);
    }
    inner.extend_from_slice(&end);
    inner.extend_from_slice(&adler.to_be_bytes());
    one_page_pdf("[/FlateDecode /FlateDecode]", &zlib(&inner))
}

/// 2 MB of combining acute accents after one letter.
fn accents_text() -> Vec<u8> {
    let mut t = "e".to_string();
    t.push_str(&"\u{301}".repeat(1 << 20));
    t.push('\n');
    t.into_bytes()
}

/// The status and the reason the store recorded for a preview of the bytes `hash`.
fn row(dir: &Path, hash: &str) -> Option<(i64, Option<String>)> {
    let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
    conn.query_row(
        "SELECT status, reason FROM previews WHERE blob = ?1",
        [hash],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_files_cannot_take_the_servers_memory_nor_crash_loop_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let log = tmp.path().join("serve.log");
    {
        let store = vaultfs::store::Store::open(&dir, Default::default()).unwrap();
        store.add_user("h@example.com", "Hostile", "pw").unwrap();
    }
    let (fills, inflating, accents) = (fills_pdf(60_000), inflating_pdf(8), accents_text());
    println!(
        "hostile files: fills {} B, inflating {} B, accents {} B",
        fills.len(),
        inflating.len(),
        accents.len()
    );
    // Eager: the idle-time renderer takes the fills by itself, nobody asks for them.
    let served = Served::start_logged(&dir, &["--previews", "eager"], &log);
    let pid = served.child.id();
    let token = common::login(&served.base, "h@example.com", "pw").await;
    let creds = common::Creds {
        email: "h@example.com".into(),
        token: token.clone(),
    };
    let remote =
        RemoteBackend::new(RemoteConfig::new(&served.base, "h@example.com", &token)).unwrap();
    let http = reqwest::Client::new();
    let vault = "/nodes/pth/Hostile/My%20First%20Vault";
    let (before, _) = memory_kib(pid);
    common::upload(&http, &served.base, &creds, vault, "fills.pdf", &fills).await;
    let bomb = common::upload(&http, &served.base, &creds, vault, "bomb.pdf", &inflating).await;
    let text = common::upload(&http, &served.base, &creds, vault, "accents.txt", &accents).await;

    let (fills_hash, bomb_hash) = (sha256(&fills), sha256(&inflating));
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut slowest = Duration::ZERO;
    loop {
        // Asked for (each request moves them to the front); the fills are left to the idle
        // renderer.
        let b = remote.preview(&bomb).await.unwrap().status;
        let t = remote.preview(&text).await.unwrap().status;
        let f = row(&dir, &fills_hash).map(|r| r.0);
        // Other requests are answered meanwhile, and at once.
        let asked = Instant::now();
        let listing = http
            .get(format!("{}{vault}", served.base))
            .basic_auth("h@example.com", Some(&token))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        assert_eq!(listing.status(), 200);
        slowest = slowest.max(asked.elapsed());
        if b != PreviewStatus::InProgress
            && t != PreviewStatus::InProgress
            && f == Some(NOT_SUPPORTED_ROW)
        {
            assert_eq!(b, PreviewStatus::TypeNotSupported);
            assert_eq!(t, PreviewStatus::Ready, "the accents are rendered, capped");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all done: bomb {b:?}, accents {t:?}, fills row {f:?}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (peak, now) = memory_kib(pid);
    let reasons = [row(&dir, &fills_hash), row(&dir, &bomb_hash)];
    println!(
        "server RSS {} MiB before, peak {} MiB, {} MiB after; slowest listing {slowest:?}; \
         recorded: {reasons:?}",
        before / 1024,
        peak / 1024,
        now / 1024
    );
    assert!(
        peak / 1024 < SERVER_PEAK_MIB,
        "server peak {} MiB over {SERVER_PEAK_MIB} MiB",
        peak / 1024
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a listing took {slowest:?}"
    );
    // The fills were stopped by the child's memory bound (2.5 GB unbounded), the inflating
    // content by the renderer's bound on it (8.4 GB unbounded; the child's bound stopped it
    // too before that bound was there).
    let reason = |r: &Option<(i64, Option<String>)>| r.as_ref().and_then(|r| r.1.clone());
    let fills_reason = reason(&reasons[0]).unwrap_or_default();
    assert!(
        fills_reason.starts_with("the renderer needed more than"),
        "{fills_reason}"
    );
    assert_eq!(
        reason(&reasons[1]).as_deref(),
        Some("a page's content inflates to more than 256 MiB")
    );

    // Killed hard and started again: nothing is rendered again, the answers stand.
    let mut served = served;
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    drop(served);
    let logged_before = std::fs::read_to_string(&log).unwrap().len();
    let served = Served::start_logged(&dir, &["--previews", "eager"], &log);
    let pid = served.child.id();
    // Past the idle delay the background would have waited.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let remote =
        RemoteBackend::new(RemoteConfig::new(&served.base, "h@example.com", &token)).unwrap();
    assert_eq!(
        remote.preview(&bomb).await.unwrap().status,
        PreviewStatus::TypeNotSupported
    );
    assert_eq!(
        remote.preview(&text).await.unwrap().status,
        PreviewStatus::Ready
    );
    let statuses: Vec<i64> = [&fills_hash, &bomb_hash, &sha256(&accents)]
        .iter()
        .map(|h| rows(&dir)[*h].0)
        .collect();
    assert_eq!(statuses, [NOT_SUPPORTED_ROW, NOT_SUPPORTED_ROW, READY_ROW]);
    let second_log = std::fs::read_to_string(&log).unwrap()[logged_before..].to_string();
    assert!(
        !second_log.contains("earlier run") && !second_log.contains("renderer died"),
        "rendered again after the restart:\n{second_log}"
    );
    let (peak, _) = memory_kib(pid);
    assert!(peak / 1024 < SERVER_PEAK_MIB, "peak {} MiB", peak / 1024);
}

/// The renderers running as children of `pid` (their process IDs).
fn renderers_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: the fields after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(pid) && cmdline.windows(14).any(|w| w == b"render-preview") {
            found.push(child);
        }
    }
    found
}

/// The server killed while a renderer works on one long page (12,000 page-sized fills: seconds
/// of work within the memory bound): the renderer goes with it at once, not rendering on by
/// itself (nobody would be there to kill it at its time bound; between pages it would stop on
/// its closed output); after the restart the job, left in progress, is taken again.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_render_leaves_no_renderer_and_takes_the_job_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let log = tmp.path().join("serve.log");
    {
        let store = vaultfs::store::Store::open(&dir, Default::default()).unwrap();
        store.add_user("h@example.com", "Hostile", "pw").unwrap();
    }
    let long = fills_pdf(12_000);
    let mut served = Served::start_logged(&dir, &["--previews", "eager"], &log);
    let pid = served.child.id();
    let token = common::login(&served.base, "h@example.com", "pw").await;
    let creds = common::Creds {
        email: "h@example.com".into(),
        token,
    };
    let http = reqwest::Client::new();
    let vault = "/nodes/pth/Hostile/My%20First%20Vault";
    common::upload(&http, &served.base, &creds, vault, "long.pdf", &long).await;
    // The idle-time renderer starts on it after the writes stop.
    let started = |pid: u32| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = renderers_of(pid);
            if !r.is_empty() {
                return r;
            }
            assert!(Instant::now() < deadline, "no renderer started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let renderers = started(pid).await;
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    drop(served);
    // Gone at once: no process left, or a zombie waiting for whoever adopted it to reap it.
    // (Without PR_SET_PDEATHSIG it renders on for seconds.)
    let running = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
            .unwrap_or(false)
    };
    let gone_by = Instant::now() + Duration::from_millis(1500);
    while renderers.iter().any(running) {
        assert!(Instant::now() < gone_by, "a renderer outlived its server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hash = sha256(&long);
    assert_eq!(row(&dir, &hash).map(|r| r.0), Some(0), "left in progress");

    let served = Served::start_logged(&dir, &["--previews", "eager"], &log);
    let again = started(served.child.id()).await;
    assert!(again.iter().all(|p| !renderers.contains(p)));
    let r = http
        .get(format!("{}{vault}", served.base))
        .basic_auth(&creds.email, Some(&creds.token))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
