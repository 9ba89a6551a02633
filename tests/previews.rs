//! Previews end to end: the virtual `.preview/` of the mount on both backends, and what the
//! interface contract (tests/contract/) cannot show from outside: 409 before Ready, previews of
//! bytes stored before previews existed, preview files going with their bytes.

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env::{Env, Via};
use common::fixtures::{png_size, sample_text, shapes_pdf};
use common::mount::{names, wait_for};
use vaultfs::api::{ErrorKind, NodePath, PreviewStatus};
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{PreviewMode, Store, StoreConfig};

both!(
    previews_in_the_mount,
    a_preview_asked_for_in_the_mount_goes_first
);

fn vault() -> NodePath {
    NodePath::parse_uri("/nodes/pth/Local/My First Vault").unwrap()
}

fn once(data: Vec<u8>) -> ByteStream {
    Box::pin(futures_util::stream::once(async move {
        Ok(bytes::Bytes::from(data))
    }))
}

/// The three upload steps through a backend; returns the file ID.
async fn put<B: Backend>(b: &B, folder: &NodePath, name: &str, data: &[u8]) -> String {
    let f = b.create_file(folder, name).await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    b.upload(&id, &vid, data.len() as u64, once(data.to_vec()))
        .await
        .unwrap();
    id
}

#[track_caller]
fn assert_erofs<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
}

fn status(dir: &Path) -> String {
    fs::read_to_string(dir.join("status")).unwrap_or_default()
}

fn previews_in_the_mount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    // A real `.preview` already in the store, at the top and inside a folder.
    let b = env.backend();
    env.rt.block_on(async {
        let hidden = vault().child(".preview").unwrap();
        b.create_folder(&hidden).await.unwrap();
        put(&b, &hidden, "keep.txt", b"not to be touched").await;
        let sub = vault().child("sub").unwrap();
        b.create_folder(&sub).await.unwrap();
        let sub_hidden = sub.child(".preview").unwrap();
        b.create_folder(&sub_hidden).await.unwrap();
        put(&b, &sub_hidden, "keep.txt", b"nor this").await;
    });

    let m = env.mount(&[]);
    let v = env.vault();
    let pdf = shapes_pdf(3, 0);
    fs::write(v.join("notes.txt"), sample_text()).unwrap();
    fs::write(v.join("paper.pdf"), &pdf).unwrap();
    let junk: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(v.join("data.bin"), &junk).unwrap();
    env.wait_uploaded();

    // Reached by name, not listed (so cp -r, rm -r, find and git do not walk into it).
    assert_eq!(names(&v), ["data.bin", "notes.txt", "paper.pdf", "sub"]);
    let pv = v.join(".preview");
    assert!(pv.is_dir());
    let (notes, paper) = (pv.join("notes.txt"), pv.join("paper.pdf"));
    let started = Instant::now();
    wait_for(60, "both previews to be ready", || {
        status(&notes) == "Ready\n" && status(&paper) == "Ready\n"
    });
    eprintln!("previews ready {:?} after the uploads", started.elapsed());
    // Files with no preview have no entry; the real `.preview` stays hidden.
    assert_eq!(names(&pv), ["notes.txt", "paper.pdf"]);
    assert!(!pv.join("data.bin").exists());
    assert!(!pv.join("keep.txt").exists());

    let items = names(&notes);
    let pages = items.iter().filter(|n| n.starts_with("page-")).count();
    assert!(pages >= 2, "{items:?}");
    assert_eq!(
        items.iter().filter(|n| n.starts_with("thumb-")).count(),
        pages
    );
    assert!(items.contains(&"document.pdf".to_string()) && items.contains(&"status".to_string()));
    for n in 1..=pages {
        for (name, size) in [
            (format!("page-{n:04}.png"), (1224, 1584)),
            (format!("thumb-{n:04}.png"), (306, 396)),
        ] {
            let p = notes.join(&name);
            let bytes = fs::read(&p).unwrap();
            // The size `ls -l` shows is the size of what is read.
            assert_eq!(
                fs::metadata(&p).unwrap().len(),
                bytes.len() as u64,
                "{name}"
            );
            assert_eq!(png_size(&bytes), size, "{name}");
        }
    }
    let made = fs::read(notes.join("document.pdf")).unwrap();
    assert!(made.starts_with(b"%PDF-"));
    // The preview PDF of a PDF is the file itself; its pages are rendered from it.
    assert_eq!(fs::read(paper.join("document.pdf")).unwrap(), pdf);
    assert_eq!(
        names(&paper)
            .iter()
            .filter(|n| n.starts_with("page-"))
            .count(),
        3
    );
    assert_eq!(
        png_size(&fs::read(paper.join("page-0002.png")).unwrap()),
        (1224, 1584)
    );
    assert!(!notes.join(format!("page-{:04}.png", pages + 1)).exists());
    assert!(!notes.join("page-1.png").exists());

    // Read-only, all of it.
    assert_erofs(fs::write(notes.join("status"), "x"), "write status");
    assert_erofs(fs::write(notes.join("new.png"), "x"), "create in a preview");
    assert_erofs(
        fs::remove_file(notes.join("page-0001.png")),
        "unlink a page",
    );
    assert_erofs(fs::create_dir(pv.join("new")), "mkdir in .preview");
    assert_erofs(fs::rename(notes.join("status"), v.join("s")), "move out");
    assert_erofs(fs::rename(v.join("data.bin"), notes.join("d")), "move in");
    assert_erofs(fs::rename(&pv, v.join("p")), "rename .preview");
    assert_erofs(fs::remove_dir(&notes), "rmdir a preview");
    assert!(fs::remove_dir_all(&pv).is_err());
    assert!(fs::write(v.join(".preview"), "x").is_err());
    // A folder holding a hidden `.preview` is not empty; it is kept, with it.
    let e = fs::remove_dir(v.join("sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    assert_eq!(names(&v), ["data.bin", "notes.txt", "paper.pdf", "sub"]);

    // A new version gets its own preview.
    fs::write(v.join("notes.txt"), "one short line\n").unwrap();
    env.wait_uploaded();
    wait_for(60, "the new version's preview", || {
        status(&notes) == "Ready\n" && !notes.join("page-0002.png").exists()
    });
    assert_eq!(
        png_size(&fs::read(notes.join("page-0001.png")).unwrap()),
        (1224, 1584)
    );
    m.unmount();

    // Nothing the mount did touched the real `.preview` folders.
    env.rt.block_on(async {
        for dir in [".preview", "sub/.preview"] {
            let p = dir
                .split('/')
                .fold(vault(), |p, s| p.child(s).unwrap())
                .child("keep.txt")
                .unwrap();
            let node = b.node(&p).await.unwrap();
            assert!(node.size.unwrap() > 0, "{dir}/keep.txt is gone");
        }
    });
}

/// A store opened without preview threads, as `vaultfs user ...` opens it.
fn quiet_store(dir: &Path) -> Arc<Store> {
    Arc::new(Store::open(dir, StoreConfig::default()).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn not_ready_is_409_then_rendered_once_threads_start() {
    let tmp = tempfile::tempdir().unwrap();
    let store = quiet_store(&tmp.path().join("data"));
    store.add_user("a@acme.test", "Acme", "pw").unwrap();
    let acme = store.ensure_account("Acme").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(vaultfs::server::serve(
        listener,
        store.clone(),
        Default::default(),
        std::future::pending(),
    ));
    let token = common::login(&base, "a@acme.test", "pw").await;
    let remote = RemoteBackend::new(RemoteConfig::new(&base, "a@acme.test", &token)).unwrap();
    let local = LocalBackend::for_account(store.clone(), acme);

    let folder = NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap();
    let id = put(&remote, &folder, "notes.txt", &sample_text()).await;
    // Nobody renders yet: in progress, and pages or PDF are 409 preview_not_ready.
    for _ in 0..2 {
        assert_eq!(
            remote.preview(&id).await.unwrap().status,
            PreviewStatus::InProgress
        );
        let e = remote
            .preview_page(&id, 1, Default::default())
            .await
            .err()
            .unwrap();
        assert_eq!(
            (e.kind, &*e.code),
            (ErrorKind::Conflict, "preview_not_ready")
        );
        assert_eq!(e.status(), 409);
        let e = local.preview_pdf(&id).await.err().unwrap();
        assert_eq!(e.code, "preview_not_ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A raw request shows the envelope and the status.
    let resp = reqwest::Client::new()
        .get(format!("{base}/preview/id/Document/{id}/1"))
        .basic_auth("a@acme.test", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["success"], false);
    assert_eq!(body["error"]["error_name"], "preview_not_ready");

    // Threads started later pick up what was left in progress.
    store.start_previews(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while remote.preview(&id).await.unwrap().status != PreviewStatus::Ready {
        assert!(Instant::now() < deadline, "never rendered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = remote
        .preview_page(&id, 1, Default::default())
        .await
        .unwrap();
    assert_eq!(png_size(&page.data), (1224, 1584));
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_stored_before_previews_get_one_on_first_request_and_lose_it_with_the_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let store = quiet_store(&dir);
    store.ensure_account("Local").unwrap();
    let b = LocalBackend::new(store.clone());
    let id = put(&b, &vault(), "paper.pdf", &shapes_pdf(2, 0)).await;
    // As a database from before previews would be: no row for these bytes.
    rusqlite::Connection::open(dir.join("vault.db"))
        .unwrap()
        .execute("DELETE FROM previews", [])
        .unwrap();
    store.start_previews(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let meta = loop {
        let m = b.preview(&id).await.unwrap();
        if m.status == PreviewStatus::Ready {
            break m;
        }
        assert_eq!(m.status, PreviewStatus::InProgress);
        assert!(Instant::now() < deadline, "never rendered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(meta.pages.len(), 2);
    let preview_dirs = || {
        walk(&dir.join("previews"))
            .into_iter()
            // Finished previews only, not a job's scratch dir.
            .filter(|p| !p.starts_with(dir.join("previews/tmp")))
            .filter(|p| p.file_name().is_some_and(|n| n == "page-0001.png"))
            .count()
    };
    assert_eq!(preview_dirs(), 1);

    // A copy shares it; deleting one keeps it; deleting the last frees it with the bytes.
    let copy = vault().child("copy.pdf").unwrap();
    b.copy(&vault().child("paper.pdf").unwrap(), &copy, false)
        .await
        .unwrap();
    b.delete(&vault().child("paper.pdf").unwrap())
        .await
        .unwrap();
    assert_eq!(preview_dirs(), 1);
    b.delete(&copy).await.unwrap();
    assert_eq!(preview_dirs(), 0);
    assert!(store.check_integrity().unwrap().is_empty());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
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
    let data = sample_text();
    let id = put(&b, &vault(), "notes.txt", &data).await;
    let pages = ask_until_ready(&b, &id, 60).await;
    let first = b.preview_page(&id, 1, Default::default()).await.unwrap();
    // One file gone (the others are still there).
    std::fs::remove_file(preview_dir(&dir, &sha256(&data)).join("page-0001.png")).unwrap();
    let e = b
        .preview_page(&id, 1, Default::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, "preview_not_ready");
    assert_eq!(ask_until_ready(&b, &id, 60).await, pages);
    let again = b.preview_page(&id, 1, Default::default()).await.unwrap();
    assert_eq!(again.data, first.data);
    assert!(
        preview_dir(&dir, &sha256(&data))
            .join("page-0001.png")
            .exists()
    );
}

// ------------------------------------------------ asked-for first, idle otherwise, bounded

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
        store.start_previews(1).unwrap();
    }
    let b = LocalBackend::new(store.clone());
    (store, b)
}

/// One page of text, different for each `i`.
fn small_text(i: usize) -> Vec<u8> {
    format!("file {i}\n{}", "some words on a line of text\n".repeat(40)).into_bytes()
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The previews table as the store keeps it: blob -> (status, updated_on, requested).
fn rows(dir: &Path) -> std::collections::HashMap<String, (i64, i64, i64)> {
    let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT blob, status, updated_on, requested FROM previews")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

const READY_ROW: i64 = 1;

/// Asks for the preview until it is Ready (each ask is a request: it goes first).
async fn ask_until_ready<B: Backend>(b: &B, id: &str, secs: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let m = b.preview(id).await.unwrap();
        match m.status {
            PreviewStatus::Ready => return m.pages.len(),
            PreviewStatus::InProgress => {}
            s => panic!("{id}: {s:?}"),
        }
        assert!(Instant::now() < deadline, "{id}: not ready after {secs}s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    store.start_previews(1).unwrap();
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
    ask_until_ready(&b, &ids[last], 60).await;
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
        ask_until_ready(&b, &id, 60).await;
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
    ask_until_ready(&b, &bb, 60).await;
    ask_until_ready(&b, &c, 60).await;
    let s = store.preview_stats().unwrap();
    assert_eq!((s.ready, s.evicted), (3, 0), "{s:?}");
    // `a` is used again (after the store's 1 s granularity), so `b` is now the least recent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ask_until_ready(&b, &a, 60).await;
    let d = put(&b, &vault(), "d.txt", &text('d')).await;
    ask_until_ready(&b, &d, 60).await;
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
    ask_until_ready(&b, &bb, 60).await;
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
        ask_until_ready(&b, &id, 60).await;
        store.preview_stats().unwrap().bytes
    };
    let bound = one * 7 / 2;
    let (store, b) = store_with(&dir, PreviewMode::OnDemand, bound, true);
    // Two versions of f, both previewed: the first is no file's current version any more.
    let f = put(&b, &vault(), "f.txt", &text("f1")).await;
    ask_until_ready(&b, &f, 60).await;
    put(&b, &vault(), "f.txt", &text("f2")).await;
    ask_until_ready(&b, &f, 60).await;
    // One more goes over the bound: f's old version goes, not z (older, but current).
    let e = put(&b, &vault(), "e.txt", &text("e")).await;
    ask_until_ready(&b, &e, 60).await;
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
    assert_eq!(ask_until_ready(&b, &id, 60).await, 1);
}

/// After a burst of small files written through the mount, the one asked for under `.preview/`
/// is rendered at once, on the store's side (over a server too), and nothing else is.
fn a_preview_asked_for_in_the_mount_goes_first(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let n = 200;
    let start = Instant::now();
    for i in 0..n {
        fs::write(v.join(format!("f{i:03}.txt")), small_text(i)).unwrap();
    }
    fs::write(v.join("notes.txt"), sample_text()).unwrap();
    env.wait_uploaded();
    eprintln!(
        "{} files written and stored in {:?}",
        n + 1,
        start.elapsed()
    );
    let notes = v.join(".preview/notes.txt");
    let asked = Instant::now();
    wait_for(60, "the preview asked for", || status(&notes) == "Ready\n");
    eprintln!("asked for: Ready after {:?}", asked.elapsed());
    assert!(names(&notes).contains(&"page-0001.png".to_string()));
    let r = rows(&env.data);
    assert_eq!(r[&sha256(&sample_text())].2, 1, "rendered as asked for");
    let unasked = (0..n)
        .filter(|&i| r.get(&sha256(&small_text(i))).is_some_and(|x| x.0 != 0))
        .count();
    assert_eq!(unasked, 0, "small files rendered without being asked for");
    m.unmount();
}

/// Another account's bytes cannot be confirmed through previews (issue 19, item 8): Bob uploads
/// the bytes Alice has, under another name, and asks for their preview. It is made once, but
/// Bob is told it is in progress first, for as long as making it took, as for bytes nobody had
/// (before: `Ready` at once, which told him somebody holds them). Then it is ready for him too.
#[tokio::test(flavor = "multi_thread")]
async fn a_preview_made_for_another_account_is_not_ready_at_once() {
    let s = common::TestServer::start().await;
    let remote_of = |c: &common::Creds| {
        RemoteBackend::new(RemoteConfig::new(&s.base, &c.email, &c.token)).unwrap()
    };
    let alice = remote_of(&s.user("alice@example.com", "Acme").await);
    let bob = remote_of(&s.user("bob@example.com", "Bobco").await);
    let settle = async |b: &RemoteBackend, id: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let st = b.preview(id).await.unwrap().status;
            if st != PreviewStatus::InProgress {
                return st;
            }
            assert!(Instant::now() < deadline, "still in progress after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let text = sample_text();
    let theirs = put(
        &alice,
        &NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap(),
        "secret.txt",
        &text,
    )
    .await;
    assert_eq!(settle(&alice, &theirs).await, PreviewStatus::Ready);
    let mine = put(
        &bob,
        &NodePath::parse_uri("/nodes/pth/Bobco/My First Vault").unwrap(),
        "guess.txt",
        &text,
    )
    .await;
    assert_eq!(
        bob.preview(&mine).await.unwrap().status,
        PreviewStatus::InProgress,
        "a preview made for another account is ready at once"
    );
    let e = bob
        .preview_page(&mine, 1, Default::default())
        .await
        .err()
        .expect("a page before it is ready");
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
    assert_eq!(settle(&bob, &mine).await, PreviewStatus::Ready);
    // Alice, who waited for it the first time, is not made to wait again.
    assert_eq!(
        alice.preview(&theirs).await.unwrap().status,
        PreviewStatus::Ready
    );
    assert!(s.store.check_integrity().unwrap().is_empty());
}

/// Which kind of preview some bytes get is chosen by each file's own name (issue 19, item 8):
/// a log with control characters is text as `x.log` or `x.txt` and has no preview as `x.dat`.
/// In one account and across two, whichever name came first, each file gets the preview its
/// name implies (before: the first name the bytes had decided for every file, in every
/// account); two names that pick the same kind still share one rendering.
#[tokio::test(flavor = "multi_thread")]
async fn each_name_gets_the_preview_its_own_type_implies() {
    let s = common::TestServer::start().await;
    let remote_of = |c: &common::Creds| {
        RemoteBackend::new(RemoteConfig::new(&s.base, &c.email, &c.token)).unwrap()
    };
    let alice = remote_of(&s.user("alice@example.com", "Acme").await);
    let bob = remote_of(&s.user("bob@example.com", "Bobco").await);
    let av = NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap();
    let bv = NodePath::parse_uri("/nodes/pth/Bobco/My First Vault").unwrap();
    let settle = async |b: &RemoteBackend, id: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let st = b.preview(id).await.unwrap().status;
            if st != PreviewStatus::InProgress {
                return st;
            }
            assert!(Instant::now() < deadline, "still in progress after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // Text by its name only: 8 control characters in 188 bytes.
    let noisy = |case: usize| {
        let mut v = format!("case {case}\n").into_bytes();
        v.extend_from_slice(&b"log line\n".repeat(20));
        v.extend_from_slice(&[0x01; 8]);
        v
    };
    use PreviewStatus::{Ready, TypeNotSupported};
    let cases: [(
        &RemoteBackend,
        &NodePath,
        &str,
        &RemoteBackend,
        &NodePath,
        &str,
    ); 4] = [
        (&alice, &av, "a.txt", &alice, &av, "b.dat"),
        (&alice, &av, "c.dat", &alice, &av, "d.log"),
        (&alice, &av, "e.dat", &bob, &bv, "f.txt"),
        (&alice, &av, "g.log", &bob, &bv, "h.dat"),
    ];
    let want = |name: &str| {
        if name.ends_with(".dat") {
            TypeNotSupported
        } else {
            Ready
        }
    };
    for (case, (b1, v1, n1, b2, v2, n2)) in cases.into_iter().enumerate() {
        let data = noisy(case);
        let first = put(b1, v1, n1, &data).await;
        assert_eq!(settle(b1, &first).await, want(n1), "case {case}: {n1}");
        let second = put(b2, v2, n2, &data).await;
        assert_eq!(
            settle(b2, &second).await,
            want(n2),
            "case {case}: {n2} after {n1}"
        );
        // The first is still what its own name implies.
        assert_eq!(
            settle(b1, &first).await,
            want(n1),
            "case {case}: {n1} again"
        );
        for (b, id, name) in [(b1, &first, n1), (b2, &second, n2)] {
            let page = b.preview_page(id, 1, Default::default()).await;
            if want(name) == Ready {
                assert_eq!(png_size(&page.unwrap().data), (1224, 1584), "{name}");
            } else {
                assert!(page.is_err(), "{name} has no pages");
            }
        }
    }
    // `.txt` and `.log` pick the same kind: one rendering for both accounts.
    let data = noisy(9);
    let mine = put(&alice, &av, "i.txt", &data).await;
    assert_eq!(settle(&alice, &mine).await, Ready);
    let theirs = put(&bob, &bv, "j.log", &data).await;
    assert_eq!(settle(&bob, &theirs).await, Ready);
    let conn = rusqlite::Connection::open(s.dir.join("vault.db")).unwrap();
    let rendered: i64 = conn
        .query_row(
            "SELECT count(*) FROM previews WHERE blob = ?1",
            [sha256(&data)],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rendered, 1, "one preview for (bytes, text)");
    assert!(s.store.check_integrity().unwrap().is_empty());
}
