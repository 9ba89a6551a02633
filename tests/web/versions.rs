//! Versions on a file's page (issue 32, item 4): listed with their time and size, each
//! downloadable, and restored (the version becomes current as a new version, the bytes it
//! replaces stay a version) by a form with the page's CSRF protection; a deleted file listed
//! in its folder's deleted files and restored; in Chromium too.

use super::{ALICE, BOB, VAULT, Visitor, alice};
use crate::browser;
use crate::common::{TestServer, content, served_retention};
use vaultfs::backend::local::LocalBackend;
use vaultfs::server::ServerOptions;

/// `report.txt` saved three times by Alice: its ID.
async fn three_saves(alice: &Visitor, token: &str) -> String {
    let mut id = String::new();
    for text in ["first draft", "second draft", "final"] {
        let (st, v) = alice
            .upload(VAULT, "report.txt", text.as_bytes(), token)
            .await;
        assert_eq!(st, 200, "{v}");
        id = v["message"]["id"].as_str().unwrap().to_string();
    }
    id
}

/// The version IDs of the file's page, newest first, and the one marked current.
fn version_rows(html: &str) -> (Vec<String>, Option<String>) {
    let mut ids = Vec::new();
    let mut current = None;
    for row in html.split("<tr class=\"version").skip(1) {
        let at = row.find("data-version=\"").unwrap() + "data-version=\"".len();
        let id = row[at..at + row[at..].find('"').unwrap()].to_string();
        if row.starts_with(" current") {
            current = Some(id.clone());
        }
        ids.push(id);
    }
    (ids, current)
}

/// Without a browser: the page lists every version, a version downloads as an attachment with
/// its own bytes, a restore without the page's token (or from another account) changes
/// nothing, and a restore with it makes the old bytes current and keeps the replaced ones.
#[tokio::test(flavor = "multi_thread")]
async fn versions_are_listed_downloaded_and_restored() {
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let (alice, token) = alice(&s).await;
    let id = three_saves(&alice, &token).await;
    let page = alice.get(&format!("/web/file/{id}")).await;
    assert_eq!(page.status, 200);
    let (ids, current) = version_rows(&page.body);
    assert_eq!(ids.len(), 3, "{}", page.body);
    assert_eq!(current.as_deref(), Some(ids[0].as_str()));
    assert!(page.body.contains("11 B"), "the first draft's size");
    let oldest = &ids[2];
    let d = alice
        .get(&format!("/web/download/{id}/version/{oldest}"))
        .await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body, "first draft");
    assert!(d.header("content-disposition").starts_with("attachment"));
    assert_eq!(d.header("x-content-type-options"), "nosniff");

    // Refused: no token, a wrong one, another account's session with its own token.
    let restore = format!("/web/restore/{id}/{oldest}");
    for form in [vec![], vec![("csrf", "guess")]] {
        let r = alice.post(&restore, &form).await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("Nothing was changed"));
    }
    s.store.add_user(BOB, "Other", "bob-pw").unwrap();
    let bob = Visitor::sign_in(&s, BOB, "bob-pw").await;
    let bobs = bob.form_token().await;
    let r = bob.post(&restore, &[("csrf", &bobs)]).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let b = LocalBackend::new(s.store.clone());
    assert_eq!(content(&b, &id).await, b"final");

    let r = alice.post(&restore, &[("csrf", &token)]).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.location(), format!("/web/file/{id}?view=info&id={id}"));
    assert_eq!(content(&b, &id).await, b"first draft");
    let (after, current) = version_rows(&alice.get(&format!("/web/file/{id}")).await.body);
    assert_eq!(after.len(), 4, "the restore is a new version");
    assert_eq!(current.as_deref(), Some(after[0].as_str()));
    assert_eq!(
        &after[1..],
        &ids[..],
        "every earlier version is still there"
    );
    let replaced = alice
        .get(&format!("/web/download/{id}/version/{}", ids[0]))
        .await;
    assert_eq!(
        replaced.body, "final",
        "the replaced bytes are a version now"
    );
    // Restoring the current version changes nothing.
    let r = alice
        .post(
            &format!("/web/restore/{id}/{}", after[0]),
            &[("csrf", &token)],
        )
        .await;
    assert_eq!(r.status, 303);
    assert_eq!(
        s.store
            .versions(vaultfs::store::Scope::All, &id)
            .unwrap()
            .len(),
        4
    );
    // A version that is not the file's: the 403 page of a link by ID.
    let r = alice
        .post(&format!("/web/restore/{id}/999999"), &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
}

/// In Chromium: the file page's versions, a download of an old one, and its restore.
#[tokio::test(flavor = "multi_thread")]
async fn versions_in_a_real_browser() {
    let (chromium, driver) = match browser::installed() {
        Ok(found) => found,
        Err(why) => {
            eprintln!("\n**********\nSKIPPED versions_in_a_real_browser: {why}\n**********\n");
            return;
        }
    };
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let (alice_http, token) = alice(&s).await;
    let id = three_saves(&alice_http, &token).await;
    let downloads = tempfile::tempdir().unwrap();
    let b = browser::Browser::start(&chromium, &driver, downloads.path()).await;
    b.goto(&s.url(&format!("/web/file/{id}"))).await;
    b.find("form.signin").await;
    b.fill("#email", ALICE).await;
    b.fill("#password", "alice-pw").await;
    b.click("form.signin button").await;
    let rows = || async {
        b.run(
            "return [...document.querySelectorAll('tr.version')].map(r => \
             [r.dataset.version, r.classList.contains('current'), \
              r.querySelector('td.size').textContent]);",
            serde_json::json!([]),
        )
        .await
    };
    b.wait_until("three versions", || async {
        rows().await.as_array().is_some_and(|r| r.len() == 3)
    })
    .await;
    let before = rows().await;
    assert_eq!(before[0][1], true, "the newest is current: {before}");
    assert_eq!(before[2][2], "11 B", "{before}");
    b.screenshot(
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("web-screenshots")
            .join("versions.png"),
    )
    .await;

    // The oldest downloaded: its own bytes.
    b.click("tr.version:last-child a[download]").await;
    let saved = downloads.path().join("report.txt");
    b.wait_until("the download of the first draft", || async {
        std::fs::read(&saved).is_ok_and(|got| got == b"first draft")
    })
    .await;

    // Restored: current again as a fourth version; the replaced one is a version.
    b.click("tr.version:last-child form.restore button").await;
    b.wait_until("four versions", || async {
        rows().await.as_array().is_some_and(|r| r.len() == 4)
    })
    .await;
    let after = rows().await;
    assert_eq!(after[0][1], true, "{after}");
    assert_eq!(after[0][2], "11 B", "{after}");
    let b_store = LocalBackend::new(s.store.clone());
    assert_eq!(content(&b_store, &id).await, b"first draft");
    let replaced = before[0][0].as_str().unwrap();
    let old = alice_http
        .get(&format!("/web/download/{id}/version/{replaced}"))
        .await;
    assert_eq!(old.body, "final");

    // Deleted from its page, then restored from the folder's deleted files.
    b.click("a.danger").await;
    b.wait_text("can be restored from the folder's deleted files for 30 days")
        .await;
    b.click("button.danger").await;
    b.find("p.deleted-link a").await;
    assert!(!b.text().await.contains("report.txt"));
    b.click("p.deleted-link a").await;
    b.find("tr.deleted form.undelete button").await;
    assert!(b.text().await.contains("report.txt"));
    b.screenshot(
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("web-screenshots")
            .join("deleted.png"),
    )
    .await;
    b.click("tr.deleted form.undelete button").await;
    b.wait_until("report.txt back in the folder", || async {
        b.run(
            "return [...document.querySelectorAll('td.name a')].some(a => a.textContent === 'report.txt');",
            serde_json::json!([]),
        )
        .await
        .as_bool()
        .unwrap_or(false)
    })
    .await;
    assert_eq!(content(&b_store, &id).await, b"first draft");
    assert_eq!(
        s.store
            .versions(vaultfs::store::Scope::All, &id)
            .unwrap()
            .len(),
        4,
        "restored with its versions"
    );
}

/// Without a browser: a file deleted from the page is listed in its folder's deleted files,
/// and restored by a form that needs the page's token.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_file_is_restored_from_the_folders_deleted_files() {
    let s = TestServer::start_with(served_retention(), ServerOptions::default()).await;
    let (alice, token) = alice(&s).await;
    let (_, up) = alice.upload(VAULT, "memo.txt", b"memo", &token).await;
    let id = up["message"]["id"].as_str().unwrap().to_string();
    let ask = alice.get(&format!("/web/delete/{VAULT}/memo.txt")).await;
    assert!(ask.body.contains("for 30 days"), "{}", ask.body);
    let r = alice
        .post(
            &format!("/web/delete/{VAULT}/memo.txt"),
            &[("csrf", &token)],
        )
        .await;
    assert_eq!(r.status, 303);
    let listing = alice.get(&format!("/web/browse/{VAULT}")).await.body;
    assert!(!listing.contains("memo.txt"));
    assert!(
        listing.contains(&format!("href=\"/web/deleted/{VAULT}\"")),
        "{listing}"
    );
    let page = alice.get(&format!("/web/deleted/{VAULT}")).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("memo.txt"), "{}", page.body);
    assert!(
        page.body
            .contains(&format!("action=\"/web/undelete/{id}\""))
    );
    // Its bytes downloadable from there before it is restored.
    let link = crate::common::attr_after(&page.body, "download>Download", "href").unwrap();
    let d = alice.get(&link).await;
    assert_eq!((d.status.as_u16(), d.body.as_str()), (200, "memo"));
    for form in [vec![], vec![("csrf", "guess")]] {
        let r = alice.post(&format!("/web/undelete/{id}"), &form).await;
        assert_eq!(r.status, 403, "{}", r.body);
    }
    assert!(
        !alice
            .get(&format!("/web/browse/{VAULT}"))
            .await
            .body
            .contains("memo.txt")
    );
    let r = alice
        .post(&format!("/web/undelete/{id}"), &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.location(), format!("/web/browse/{VAULT}"));
    assert!(
        alice
            .get(&format!("/web/browse/{VAULT}"))
            .await
            .body
            .contains("memo.txt")
    );
    let page = alice.get(&format!("/web/deleted/{VAULT}")).await;
    assert!(
        page.body.contains("No deleted files here."),
        "{}",
        page.body
    );

    // A folder deleted from the page is listed too, and comes back with its file.
    let r = alice
        .post(
            &format!("/web/folder/{VAULT}"),
            &[("csrf", &token), ("name", "plans")],
        )
        .await;
    assert_eq!(r.status, 303);
    let (st, _) = alice
        .upload(&format!("{VAULT}/plans"), "plan.txt", b"the plan", &token)
        .await;
    assert_eq!(st, 200);
    let r = alice
        .post(&format!("/web/delete/{VAULT}/plans"), &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let page = alice.get(&format!("/web/deleted/{VAULT}")).await.body;
    assert!(page.contains("plans/"), "{page}");
    let id = crate::common::attr_after(&page, "class=\"deleted folder\"", "data-id").unwrap();
    let r = alice
        .post(&format!("/web/undelete/{id}"), &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let inside = alice.get(&format!("/web/browse/{VAULT}/plans")).await.body;
    assert!(inside.contains("plan.txt"), "{inside}");
}
