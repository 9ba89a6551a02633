//! A preview's life: 409 before Ready, made for bytes stored before previews existed, and gone
//! with its bytes.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{put, vault};
use crate::common;
use crate::common::fixtures::{png_size, sample_text, shapes_pdf};
use vaultfs::api::{ErrorKind, NodePath, PreviewStatus};
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::store::{Store, StoreConfig};

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
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
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
    store
        .start_previews(1, std::path::Path::new(common::mount::BIN))
        .unwrap();
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

/// A renderer that cannot be started is not the file's fault: the preview stays in progress
/// (not recorded as not supported), and renders once a renderer runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_renderer_that_cannot_start_records_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let id = {
        let store = quiet_store(&dir);
        store.ensure_account("Local").unwrap();
        store
            .start_previews(1, Path::new("/nonexistent/vaultfs"))
            .unwrap();
        let b = LocalBackend::new(store.clone());
        let id = put(&b, &vault(), "notes.txt", &sample_text()).await;
        for _ in 0..10 {
            let status = b.preview(&id).await.unwrap().status;
            assert_eq!(status, PreviewStatus::InProgress);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        id
    };
    // The same store with a renderer that runs.
    let store = quiet_store(&dir);
    store
        .start_previews(1, Path::new(common::mount::BIN))
        .unwrap();
    let b = LocalBackend::new(store.clone());
    assert!(common::preview_pages_when_ready(&b, &id, 60).await > 0);
}
