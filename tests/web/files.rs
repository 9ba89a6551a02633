//! Working with files in the pages: uploads, folders, renames, sorting and paging.

use super::{VAULT, alice, html_unescape, urlencode};
use crate::common::TestServer;

/// The names in a listing's table, in order.
fn names(html: &str) -> Vec<String> {
    html.split("<td class=\"name\"><a href=\"")
        .skip(1)
        .map(|rest| {
            let start = rest.find('>').unwrap() + 1;
            html_unescape(&rest[start..start + rest[start..].find('<').unwrap()])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_folders_renames_sorting_and_paging() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    // An upload of an existing name is a new version of that file.
    let (_, one) = alice.upload(VAULT, "a.txt", b"one", &token).await;
    let (_, two) = alice
        .upload(VAULT, "a.txt", b"second version", &token)
        .await;
    assert_eq!(one["message"]["id"], two["message"]["id"]);
    let id = two["message"]["id"].as_str().unwrap();
    assert_eq!(
        s.store.version_history(id).unwrap().len(),
        2,
        "two versions"
    );
    let d = alice
        .get(two["message"]["download_link_uri"].as_str().unwrap())
        .await;
    assert_eq!(d.body, "second version");
    // A folder with a name that needs encoding, and an upload into it.
    let r = alice
        .post(
            &format!("/web/folder/{VAULT}"),
            &[("csrf", &token), ("name", "Résumé & co")],
        )
        .await;
    assert_eq!(r.status, 303);
    let sub = format!("{VAULT}/{}", urlencode("Résumé & co"));
    let (st, _) = alice.upload(&sub, "cv.txt", b"cv", &token).await;
    assert_eq!(st, 200);
    assert_eq!(
        names(&alice.get(&format!("/web/browse/{sub}")).await.body),
        ["cv.txt"]
    );
    let taken = alice
        .post(
            &format!("/web/folder/{VAULT}"),
            &[("csrf", &token), ("name", "a.txt")],
        )
        .await;
    assert_eq!(taken.status, 409);
    assert!(taken.body.contains("already exists"), "{}", taken.body);

    alice.upload(VAULT, "b.bin", &[0u8; 300], &token).await;
    alice.upload(VAULT, "c.bin", &[0u8; 3000], &token).await;
    let listing = |q: &str| {
        let path = format!("/web/browse/{VAULT}?{q}");
        let alice = &alice;
        async move { alice.get(&path).await.body }
    };
    // Folders first, then by the column asked for.
    assert_eq!(
        names(&listing("").await),
        ["Résumé & co", "a.txt", "b.bin", "c.bin"]
    );
    assert_eq!(
        names(&listing("sort=size&order=desc").await),
        ["Résumé & co", "c.bin", "b.bin", "a.txt"]
    );
    let first = listing("sort=size&order=desc&per_page=2").await;
    assert_eq!(names(&first), ["Résumé & co", "c.bin"]);
    assert!(first.contains("Page 1 of 2 (4 entries)"));
    assert!(first.contains("aria-sort=\"descending\""));
    let second = listing("sort=size&order=desc&per_page=2&page=2").await;
    assert_eq!(names(&second), ["b.bin", "a.txt"]);

    // Rename: to the file's page under its new name.
    let r = alice
        .post(
            &format!("/web/rename/{VAULT}/a.txt"),
            &[("csrf", &token), ("name", "renamed.txt")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.location(),
        // The page's redirect is relative, the API's link absolute.
        two["message"]["link_uri"]
            .as_str()
            .unwrap()
            .strip_prefix(&s.base)
            .unwrap(),
        "same file"
    );
    assert!(
        alice
            .get(r.location())
            .await
            .body
            .contains("<h1>renamed.txt</h1>")
    );
    // Delete, after the confirmation page.
    let ask = alice.get(&format!("/web/delete/{VAULT}/b.bin")).await;
    assert!(ask.body.contains("cannot be undone"));
    let gone = alice
        .post(&format!("/web/delete/{VAULT}/b.bin"), &[("csrf", &token)])
        .await;
    assert_eq!(gone.status, 303);
    assert_eq!(
        names(&listing("").await),
        ["Résumé & co", "c.bin", "renamed.txt"]
    );
}

/// An upload the quota refuses (507) leaves nothing behind (issue 47, item 11; before: an empty
/// file at the name): a new name stays free, listed nowhere, not even as deleted; an existing
/// file keeps its content and its versions.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_refused_by_the_quota_leaves_nothing_at_the_name() {
    let s = TestServer::start_with(
        vaultfs::store::StoreConfig {
            max_bytes_per_account: 10_000,
            ..crate::common::served_retention()
        },
        Default::default(),
    )
    .await;
    let (alice, token) = alice(&s).await;
    let (st, _) = alice.upload(VAULT, "a.txt", &[b'a'; 4000], &token).await;
    assert_eq!(st, 200);
    let (st, two) = alice.upload(VAULT, "a.txt", b"second", &token).await;
    assert_eq!(st, 200);
    let id = two["message"]["id"].as_str().unwrap().to_string();
    let download = two["message"]["download_link_uri"]
        .as_str()
        .unwrap()
        .to_string();
    // A new file past the quota.
    let (st, refused) = alice.upload(VAULT, "big.bin", &[0; 8000], &token).await;
    assert_eq!(st.as_u16(), 507, "{refused}");
    assert_eq!(
        refused["error"]["error_name"], "quota_exceeded",
        "{refused}"
    );
    let folder = alice.get(&format!("/web/browse/{VAULT}")).await;
    assert_eq!(names(&folder.body), ["a.txt"]);
    let deleted = alice.get(&format!("/web/deleted/{VAULT}")).await;
    assert!(!deleted.body.contains("big.bin"), "{}", deleted.body);
    // A new version of an existing file past the quota.
    let (st, refused) = alice.upload(VAULT, "a.txt", &[b'b'; 8000], &token).await;
    assert_eq!(st.as_u16(), 507, "{refused}");
    assert_eq!(alice.get(&download).await.body, "second");
    assert_eq!(s.store.version_history(&id).unwrap().len(), 2);
    assert_eq!(
        names(&alice.get(&format!("/web/browse/{VAULT}")).await.body),
        ["a.txt"]
    );
    // The name stays free: the same upload, small enough, is a new file.
    let (st, fine) = alice.upload(VAULT, "big.bin", b"small", &token).await;
    assert_eq!(st, 200, "{fine}");
    assert_eq!(s.store.check_integrity().unwrap(), Vec::<String>::new());
}

/// A file a WebDAV client holds locked (Finder, Word) says so on its page: who, from what, until
/// when; once let go of, nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_locked_file_says_who_holds_it() {
    use vaultfs::store::dav::DavLockRow;
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let (st, v) = alice.upload(VAULT, "report.txt", b"draft", &token).await;
    assert_eq!(st, 200, "{v}");
    let id = v["message"]["id"].as_str().unwrap().to_string();
    let page = alice.get(&format!("/web/file/{id}")).await;
    assert!(!page.body.contains("Locked"), "{}", page.body);
    // As a LOCK over WebDAV keeps it (`server::dav::locks`).
    let expires = std::time::SystemTime::now() + std::time::Duration::from_secs(600);
    let row = DavLockRow {
        token: "urn:uuid:0b2b7f0e-4a1c-4e7e-9d43-2f0b6a1f0c11".into(),
        account: "Acme".into(),
        path: format!("/{VAULT}/report.txt"),
        principal: Some(super::ALICE.into()),
        owner: Some(
            r#"<D:owner xmlns:D="DAV:"><D:href>Alice's <b>Mac</b></D:href></D:owner>"#.into(),
        ),
        shared: false,
        deep: false,
        timeout_secs: Some(600),
        expires_on: Some(
            expires
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i64,
        ),
    };
    s.store.dav_lock(row.clone(), |_| None).unwrap().unwrap();
    let page = alice.get(&format!("/web/file/{id}")).await;
    assert!(
        page.body.contains(&format!(
            "<dt>Locked</dt><dd class=\"lock\">For editing by {} (Alice&#39;s Mac) until <time",
            super::ALICE
        )),
        "{}",
        page.body
    );
    s.store.dav_unlock(&[row.token]).unwrap();
    let page = alice.get(&format!("/web/file/{id}")).await;
    assert!(!page.body.contains("Locked"), "{}", page.body);
}
