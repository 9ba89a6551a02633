//! Previews end to end: the virtual `.preview/` of the mount on both backends, and what the
//! interface contract (tests/contract.rs) cannot show from outside: 409 before Ready, previews of
//! bytes stored before previews existed, preview files going with their bytes.

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env::{Env, Via};
use common::fixtures::{png_size, sample_text, shapes_pdf};
use common::mount::wait_for;
use vaultfs::api::{ErrorKind, NodePath, PreviewStatus};
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::backend::{Backend, ByteStream};
use vaultfs::store::{Store, StoreConfig};

both!(previews_in_the_mount);

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

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
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
    let app = vaultfs::server::router(store.clone(), Default::default());
    tokio::spawn(async move { axum::serve(listener, app).await });
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
    assert_eq!(body["error"]["error_code"], "preview_not_ready");

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
