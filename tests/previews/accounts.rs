//! Previews across accounts (issue 19, item 8): another account's bytes cannot be confirmed
//! through them, and each file gets the preview its own name implies.

use std::time::{Duration, Instant};

use super::{put, sha256};
use crate::common;
use crate::common::fixtures::{png_size, sample_text};
use vaultfs::api::{ErrorKind, NodePath, PreviewStatus};
use vaultfs::backend::Backend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};

/// The preview status of file `id` once it is no longer `InProgress` (within 60 s).
async fn settle(b: &RemoteBackend, id: &str) -> PreviewStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = b.preview(id).await.unwrap().status;
        if st != PreviewStatus::InProgress {
            return st;
        }
        assert!(Instant::now() < deadline, "still in progress after 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
