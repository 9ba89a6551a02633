//! Asked-for first, idle otherwise, bounded: which preview is made when, and how many are kept.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{put, rows, sha256, small_text, vault};
use crate::common;
use crate::common::fixtures::png_size;
use vaultfs::api::PreviewStatus;
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;
use vaultfs::store::{PreviewMode, Store, StoreConfig};

/// A store with its preview threads (one of each kind), as `vaultfs serve --previews MODE
/// --preview-cache-size BYTES` opens it, and the built-in backend over it.
fn store_with(
    dir: &Path,
    mode: PreviewMode,
    cache: u64,
    start: bool,
) -> (Arc<Store>, LocalBackend) {
    let config = StoreConfig {
        previews: mode,
        preview_cache_size: cache,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::open(dir, config).unwrap());
    store.ensure_account("Local").unwrap();
    if start {
        store
            .start_previews(1, std::path::Path::new(common::mount::BIN))
            .unwrap();
    }
    let b = LocalBackend::new(store.clone());
    (store, b)
}

const READY_ROW: i64 = 1;

/// The folder of the text preview of the bytes `hash`.
fn preview_dir(dir: &Path, hash: &str) -> std::path::PathBuf {
    dir.join("previews")
        .join(&hash[..2])
        .join(hash)
        .join("text")
}

#[tokio::test(flavor = "multi_thread")]
async fn asked_for_previews_come_first_latest_request_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    // Eager: every file is queued for the background; nobody renders yet.
    let (store, b) = store_with(&dir, PreviewMode::Eager, 1 << 30, false);
    let n = 120;
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(put(&b, &vault(), &format!("f{i:03}.txt"), &small_text(i)).await);
    }
    assert_eq!(store.preview_stats().unwrap().background_pending, n as u64);
    // Three asked for, in this order, from the middle and the start of the queue.
    let asked = [60, 7, 100];
    for &i in &asked {
        assert_eq!(
            b.preview(&ids[i]).await.unwrap().status,
            PreviewStatus::InProgress
        );
    }
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
    // Waiting without asking again (every request moves its job to the front).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !asked
        .iter()
        .all(|&i| rows(&dir)[&sha256(&small_text(i))].0 == READY_ROW)
    {
        assert!(Instant::now() < deadline, "asked-for previews not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Order of completion: the latest request first, and all three before any background job.
    let done = rows(&dir);
    let at = |i: usize| done[&sha256(&small_text(i))];
    let (a, b7, c) = (at(60), at(7), at(100));
    assert!(
        c.1 < b7.1 && b7.1 < a.1,
        "latest request first: {c:?} {b7:?} {a:?}"
    );
    for i in (0..n).filter(|i| !asked.contains(i)) {
        let (status, when, requested) = at(i);
        assert_eq!(requested, 0);
        if status == READY_ROW {
            assert!(
                when > a.1,
                "background file {i} finished before an asked-for one"
            );
        }
    }
    assert!([a, b7, c].iter().all(|r| r.2 == 1), "marked as asked for");

    // Under load: the background is rendering (the store is idle now); one more is asked for.
    // It is done next: at most the background job already under way finishes before it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.preview_stats().unwrap().background_started == 0 {
        assert!(Instant::now() < deadline, "the background never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The background takes the newest first: the oldest files are the last in its queue.
    let last = 0;
    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    common::preview_pages_when_ready(&b, &ids[last], 60).await;
    let done = rows(&dir);
    let mine = done[&sha256(&small_text(last))].1;
    let overtaken = done
        .values()
        .filter(|(s, t, r)| *s == READY_ROW && *r == 0 && *t > asked_at && *t < mine)
        .count();
    assert!(overtaken <= 1, "{overtaken} background jobs finished first");
    let left = done.values().filter(|(s, ..)| *s == 0).count();
    eprintln!("asked-for file done with {left} background jobs still queued");
}

#[tokio::test(flavor = "multi_thread")]
async fn background_renders_only_once_writes_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let (store, b) = store_with(&dir, PreviewMode::Eager, 1 << 30, true);
    // Uploads for 3 s, one every 20 ms: no background job may start meanwhile.
    let start = Instant::now();
    let mut ids = Vec::new();
    let mut asked = None;
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(3) {
        ids.push(put(&b, &vault(), &format!("w{i:04}.txt"), &small_text(i)).await);
        let s = store.preview_stats().unwrap();
        assert_eq!(
            s.background_started, 0,
            "a background render started during uploads"
        );
        // Asked-for work is not held back by the writes.
        if i == 10 {
            assert_eq!(
                b.preview(&ids[5]).await.unwrap().status,
                PreviewStatus::InProgress
            );
            asked = Some(Instant::now());
        }
        if let Some(t) = asked {
            if b.preview(&ids[5]).await.unwrap().status == PreviewStatus::Ready {
                eprintln!(
                    "asked-for preview ready {:?} after asking, uploads going on",
                    t.elapsed()
                );
                asked = None;
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        asked.is_none(),
        "the asked-for preview waited for the uploads to end"
    );
    let writes_ended = std::time::SystemTime::now();
    // Then, once the store has been idle for a while, the background does its work (only the
    // first of it is waited for: idle priority gets nothing while other programs keep the
    // cores busy).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = store.preview_stats().unwrap();
        if s.unrequested > 0 {
            let first = s.first_background_start.expect("background ran");
            assert!(
                first >= writes_ended,
                "a background render started before the writes ended"
            );
            break;
        }
        assert!(Instant::now() < deadline, "background not done: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn least_recently_used_previews_are_evicted_and_rendered_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let text = |c: char| format!("{c}\n{}", "a line of text in the file\n".repeat(50)).into_bytes();
    // The size of one preview, measured.
    let one = {
        let (store, b) = store_with(&dir, PreviewMode::OnDemand, 1 << 30, true);
        let id = put(&b, &vault(), "a.txt", &text('a')).await;
        common::preview_pages_when_ready(&b, &id, 60).await;
        store.preview_stats().unwrap().bytes
    };
    assert!(one > 0);
    // Room for three and a half.
    let bound = one * 7 / 2;
    let (store, b) = store_with(&dir, PreviewMode::OnDemand, bound, true);
    let a = b
        .node(&vault().child("a.txt").unwrap())
        .await
        .unwrap()
        .file_id()
        .unwrap();
    let bb = put(&b, &vault(), "b.txt", &text('b')).await;
    let c = put(&b, &vault(), "c.txt", &text('c')).await;
    common::preview_pages_when_ready(&b, &bb, 60).await;
    common::preview_pages_when_ready(&b, &c, 60).await;
    let s = store.preview_stats().unwrap();
    assert_eq!((s.ready, s.evicted), (3, 0), "{s:?}");
    // `a` is used again (after the store's 1 s granularity), so `b` is now the least recent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    common::preview_pages_when_ready(&b, &a, 60).await;
    let d = put(&b, &vault(), "d.txt", &text('d')).await;
    common::preview_pages_when_ready(&b, &d, 60).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.preview_stats().unwrap().evicted == 0 {
        assert!(Instant::now() < deadline, "nothing evicted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = store.preview_stats().unwrap();
    assert!(s.bytes <= bound, "{} bytes over the bound {bound}", s.bytes);
    assert_eq!((s.ready, s.evicted), (3, 1), "{s:?}");
    let r = rows(&dir);
    let hb = sha256(&text('b'));
    assert!(!r.contains_key(&hb), "b's row is gone");
    assert!(!preview_dir(&dir, &hb).exists(), "b's files are gone");
    for k in ['a', 'c', 'd'] {
        let h = sha256(&text(k));
        assert_eq!(r[&h].0, READY_ROW, "{k} kept");
        assert!(preview_dir(&dir, &h).join("page-0001.png").exists());
    }
    // Asked for again, `b` is rendered again (and another goes to keep the bound).
    assert_eq!(
        b.preview(&bb).await.unwrap().status,
        PreviewStatus::InProgress
    );
    common::preview_pages_when_ready(&b, &bb, 60).await;
    let page = b.preview_page(&bb, 1, Default::default()).await.unwrap();
    assert_eq!(png_size(&page.data), (1224, 1584));
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.preview_stats().unwrap().evicted < 2 {
        assert!(Instant::now() < deadline, "the bound was not kept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = store.preview_stats().unwrap();
    assert!(s.bytes <= bound && s.ready == 3, "{s:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn previews_of_versions_gone_or_replaced_go_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let text = |tag: &str| format!("{tag}\n{}", "words words words\n".repeat(30)).into_bytes();
    let one = {
        let (store, b) = store_with(&dir, PreviewMode::OnDemand, 1 << 30, true);
        let id = put(&b, &vault(), "z.txt", &text("z")).await;
        common::preview_pages_when_ready(&b, &id, 60).await;
        store.preview_stats().unwrap().bytes
    };
    let bound = one * 7 / 2;
    let (store, b) = store_with(&dir, PreviewMode::OnDemand, bound, true);
    // Two versions of f, both previewed: the first is no file's current version any more.
    let f = put(&b, &vault(), "f.txt", &text("f1")).await;
    common::preview_pages_when_ready(&b, &f, 60).await;
    put(&b, &vault(), "f.txt", &text("f2")).await;
    common::preview_pages_when_ready(&b, &f, 60).await;
    // One more goes over the bound: f's old version goes, not z (older, but current).
    let e = put(&b, &vault(), "e.txt", &text("e")).await;
    common::preview_pages_when_ready(&b, &e, 60).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.preview_stats().unwrap().evicted == 0 {
        assert!(Instant::now() < deadline, "nothing evicted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (h1, h2, hz) = (sha256(&text("f1")), sha256(&text("f2")), sha256(&text("z")));
    assert!(
        !preview_dir(&dir, &h1).exists(),
        "the replaced version's preview went first"
    );
    assert!(preview_dir(&dir, &hz).exists() && preview_dir(&dir, &h2).exists());

    // Deleting the file removes the preview of its versions with their bytes.
    b.delete(&vault().child("f.txt").unwrap()).await.unwrap();
    assert!(!preview_dir(&dir, &h2).exists());
    assert!(!rows(&dir).contains_key(&h2));

    // A preview directory no row accounts for (a crash between the two) is removed when the
    // store is next opened alone.
    let stray = preview_dir(&dir, &"ab".repeat(32));
    fs::create_dir_all(&stray).unwrap();
    fs::write(stray.join("page-0001.png"), b"x").unwrap();
    drop((store, b));
    let (store, _b) = store_with(&dir, PreviewMode::OnDemand, bound, false);
    assert!(!stray.exists());
    assert!(preview_dir(&dir, &hz).exists());
    assert!(store.check_integrity().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn unrequested_previews_stay_within_a_quarter_of_the_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let (store, b) = store_with(&dir, PreviewMode::OnDemand, 1 << 30, true);
    // Many small files: rendered only when asked for.
    for i in 0..150 {
        put(&b, &vault(), &format!("s{i:03}.txt"), &small_text(i)).await;
    }
    // A large PDF whose preview is small: rendered ahead.
    let big_pdf = common::fixtures::pdf(&[format!(
        "BT /F1 24 Tf 72 700 Td (a large file) Tj ET\n%{}",
        "x".repeat(140 << 10)
    )]);
    put(&b, &vault(), "big.pdf", &big_pdf).await;
    // Large pictures of noise, whose previews weigh as much as they do: over the share.
    let noise = |seed: u32| {
        let img = image::RgbImage::from_fn(320, 320, |x, y| {
            let v = (x * 7919 + y * 104729 + seed).wrapping_mul(2654435761);
            image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
        });
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        assert!(png.len() as u64 > 128 << 10);
        png
    };
    for i in 0..2 {
        put(&b, &vault(), &format!("noise{i}.png"), &noise(i)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let s = loop {
        let s = store.preview_stats().unwrap();
        if s.background_pending == 0 {
            break s;
        }
        assert!(Instant::now() < deadline, "background not done: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("{s:?}");
    assert!(
        s.unrequested_bytes <= s.files_bytes / 4,
        "unrequested previews {} over a quarter of {}",
        s.unrequested_bytes,
        s.files_bytes
    );
    let r = rows(&dir);
    assert_eq!(
        r[&sha256(&big_pdf)].0,
        READY_ROW,
        "the large PDF rendered ahead"
    );
    assert_eq!(s.unrequested, 1, "{s:?}");
    for i in 0..2 {
        assert_eq!(
            r[&sha256(&noise(i))].0,
            0,
            "noise{i}.png kept over the share"
        );
    }
    for i in 0..150 {
        assert_eq!(
            r[&sha256(&small_text(i))].0,
            0,
            "s{i:03}.txt rendered unasked"
        );
    }
    // Asked for, the rest is rendered as usual.
    let id = b
        .node(&vault().child("noise0.png").unwrap())
        .await
        .unwrap()
        .file_id()
        .unwrap();
    assert_eq!(common::preview_pages_when_ready(&b, &id, 60).await, 1);
}

/// A ready preview whose files were lost (its folder emptied, or a server of a shared store
/// that kept it on its own disk before previews moved to the bucket), even one of them: the
/// read that misses it answers not ready, and the preview is made again rather than being
/// ready for ever with nothing behind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_ready_preview_whose_files_are_lost_is_made_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let (_store, b) = store_with(&dir, PreviewMode::OnDemand, 1 << 30, true);
    let data = crate::common::fixtures::sample_text();
    let id = put(&b, &vault(), "notes.txt", &data).await;
    let pages = common::preview_pages_when_ready(&b, &id, 60).await;
    let first = b.preview_page(&id, 1, Default::default()).await.unwrap();
    // One file gone (the others are still there).
    std::fs::remove_file(preview_dir(&dir, &sha256(&data)).join("page-0001.png")).unwrap();
    let e = b
        .preview_page(&id, 1, Default::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, "preview_not_ready");
    assert_eq!(common::preview_pages_when_ready(&b, &id, 60).await, pages);
    let again = b.preview_page(&id, 1, Default::default()).await.unwrap();
    assert_eq!(again.data, first.data);
    assert!(
        preview_dir(&dir, &sha256(&data))
            .join("page-0001.png")
            .exists()
    );
}
