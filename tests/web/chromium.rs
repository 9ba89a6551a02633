//! The web interface in a real headless Chromium (skipped, loudly, without it).

use std::path::Path;
use std::time::Instant;

use super::{ALICE, BOB, VAULT, Visitor};
use crate::browser;
use crate::common;
use crate::common::fixtures::shapes_pdf;
use crate::common::{TestServer, pin_in};
use vaultfs::server::ServerOptions;

/// Waits until the listing's table shows `name`.
async fn in_table(b: &browser::Browser, name: &str) {
    b.wait_until(&format!("{name} in the table"), || async {
        b.run(
            "return [...document.querySelectorAll('td.name a')].some(a => a.textContent === arguments[0]);",
            serde_json::json!([name]),
        )
        .await
        .as_bool()
        .unwrap_or(false)
    })
    .await;
}

/// Serves `html` at `/` of a new loopback server: another site, for the CSRF attempt.
async fn other_site(html: String) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let html = html.clone();
            async move { axum::response::Html(html) }
        }),
    );
    let (stop, _) = common::serve(listener, app, ServerOptions::default());
    (port, stop)
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_real_browser() {
    let (chromium, driver) = match browser::installed() {
        Ok(found) => found,
        Err(why) => {
            eprintln!(
                "\n**********\nSKIPPED in_a_real_browser: {why}. The web interface's browser \
                 tests need the Debian packages: apt-get install chromium chromium-driver \
                 (.ci/run installs them).\n**********\n"
            );
            return;
        }
    };
    let started = Instant::now();
    let s = TestServer::start().await;
    s.store.add_user(ALICE, "Acme", "alice-pw").unwrap();
    s.store.add_user(BOB, "Other", "bob-pw").unwrap();
    let alice_http = Visitor::sign_in(&s, ALICE, "alice-pw").await;
    let token = alice_http.form_token().await;
    let report = shapes_pdf(3, 1);
    let (_, pdf) = alice_http
        .upload(VAULT, "Quarterly report.pdf", &report, &token)
        .await;
    alice_http
        .upload(VAULT, "notes.txt", &common::fixtures::sample_text(), &token)
        .await;
    let bob_http = Visitor::sign_in(&s, BOB, "bob-pw").await;
    let bobs = bob_http.form_token().await;
    let (_, secret) = bob_http
        .upload(
            "Other/My%20First%20Vault",
            "bob-secret.txt",
            b"bob's",
            &bobs,
        )
        .await;

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
    let downloads = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let b = browser::Browser::start(&chromium, &driver, downloads.path()).await;
    let shot = |name: &str| shots.join(format!("{name}.png"));

    // A colleague's preview link, opened without a session: the sign-in page.
    eprintln!("browser: sign-in page");
    let preview = s.url(pdf["message"]["preview_link_uri"].as_str().unwrap());
    b.goto(&preview).await;
    b.find("form.signin").await;
    b.screenshot(&shot("sign-in")).await;
    // A wrong password: the form again, with the error.
    eprintln!("browser: wrong password");
    b.fill("#email", ALICE).await;
    b.fill("#password", "not-it").await;
    b.click("form.signin button").await;
    b.wait_text("wrong e-mail address or password").await;
    // The right one: on to the link opened, where the preview shows up (the page reloads itself
    // while it is InProgress).
    eprintln!("browser: sign-in, preview");
    b.fill("#password", "alice-pw").await;
    b.click("form.signin button").await;
    b.wait_until("the preview page", || async {
        b.url().await.starts_with(&preview)
    })
    .await;
    b.wait_until("three thumbnails and the first page drawn", || async {
        b.run(
            "const imgs = [...document.querySelectorAll('.thumbs img'), \
             document.querySelector('#page-1 img')];\
             return imgs.length === 4 && imgs.every(i => i && i.complete && i.naturalWidth > 0);",
            serde_json::json!([]),
        )
        .await
        .as_bool()
        .unwrap_or(false)
    })
    .await;
    b.wait_text("Page 3 of 3").await;
    b.screenshot(&shot("preview")).await;

    // Download.
    eprintln!("browser: download");
    b.click("a[download]").await;
    let saved = downloads.path().join("Quarterly report.pdf");
    b.wait_until("the download", || async {
        std::fs::read(&saved).is_ok_and(|got| got == report)
    })
    .await;

    // Up to the vault through the breadcrumbs.
    eprintln!("browser: breadcrumbs");
    b.click("nav[aria-label=Breadcrumb] a[aria-current=page]")
        .await;
    b.wait_text("notes.txt").await;
    // Upload two files through the form.
    eprintln!("browser: upload");
    let (up1, up2) = (
        work.path().join("up-one.txt"),
        work.path().join("up-two.txt"),
    );
    std::fs::write(&up1, "first upload").unwrap();
    std::fs::write(&up2, "second upload").unwrap();
    b.fill("#files", &format!("{}\n{}", up1.display(), up2.display()))
        .await;
    b.click("form.upload button").await;
    // In the table: the page reloads once all are stored (the names show in the progress list
    // before).
    in_table(&b, "up-one.txt").await;
    in_table(&b, "up-two.txt").await;
    // And one by drag and drop (a drop event with a file, as the browser makes it).
    eprintln!("browser: drag and drop");
    b.run(
        "const dt = new DataTransfer();\
         dt.items.add(new File(['dropped bytes'], 'dropped.txt', {type: 'text/plain'}));\
         const zone = document.querySelector('.drop');\
         for (const t of ['dragenter', 'dragover', 'drop']) \
           zone.dispatchEvent(new DragEvent(t, {dataTransfer: dt, bubbles: true, cancelable: true}));",
        serde_json::json!([]),
    )
    .await;
    in_table(&b, "dropped.txt").await;
    // A new folder.
    eprintln!("browser: new folder");
    b.fill("#folder-name", "Archive 2026").await;
    b.click("form.folder button").await;
    in_table(&b, "Archive 2026").await;
    b.screenshot(&shot("folder")).await;
    b.set_window(390, 844).await;
    b.screenshot(&shot("folder-phone")).await;
    b.set_window(1280, 1000).await;
    let listing = alice_http.get(&format!("/web/browse/{VAULT}")).await.body;
    for name in ["up-one.txt", "up-two.txt", "dropped.txt", "Archive 2026"] {
        assert!(listing.contains(name), "{name} is not stored");
    }

    // Rename, on the file's page.
    eprintln!("browser: rename");
    b.click("td.name a[href^='/web/file/']").await;
    b.find("form.rename").await;
    let old = b
        .run(
            "return document.querySelector('h1').textContent;",
            serde_json::json!([]),
        )
        .await;
    b.fill("#new-name", "renamed in the browser.txt").await;
    b.click("form.rename button").await;
    b.wait_until("the new name", || async {
        b.run(
            "return document.querySelector('h1').textContent;",
            serde_json::json!([]),
        )
        .await
            == "renamed in the browser.txt"
    })
    .await;
    b.screenshot(&shot("file")).await;
    // Delete it, after the confirmation.
    eprintln!("browser: delete");
    b.click("a.danger").await;
    b.wait_text("cannot be undone").await;
    b.click("button.danger").await;
    b.wait_until("the vault without the file", || async {
        let t = b.text().await;
        t.contains("notes.txt") || t.contains("up-one.txt")
    })
    .await;
    assert!(!b.text().await.contains("renamed in the browser.txt"));
    assert!(
        !b.text().await.contains(old.as_str().unwrap()),
        "{old} is still there"
    );

    // Another account's link.
    eprintln!("browser: another account's link");
    b.goto(&s.url(secret["message"]["link_uri"].as_str().unwrap()))
        .await;
    b.wait_text("Not available to you").await;
    assert!(!b.text().await.contains("bob's"));
    b.screenshot(&shot("forbidden")).await;

    // A page of another site posts a delete to this one: refused, nothing deleted.
    eprintln!("browser: CSRF from another origin");
    let target = s.url(&format!("/web/delete/{VAULT}/up-one.txt"));
    let (port, _stop) = other_site(format!(
        "<!DOCTYPE html><title>Win a prize</title><form method=post action=\"{target}\">\
         <input type=hidden name=csrf value=guess></form>\
         <script>document.forms[0].submit()</script>"
    ))
    .await;
    b.goto(&format!("http://localhost:{port}/")).await;
    b.wait_text("Nothing was changed").await;
    assert!(
        alice_http
            .get(&format!("/web/browse/{VAULT}"))
            .await
            .body
            .contains("up-one.txt"),
        "the other site's post deleted the file"
    );

    // The authorization page works in a browser too (its form's Origin check).
    eprintln!("browser: pin page");
    b.goto(&s.url("/pin/authorize?client_id=vaultfs")).await;
    b.fill("input[name=email]", ALICE).await;
    b.fill("input[name=password]", "alice-pw").await;
    b.click("button[type=submit]").await;
    b.find("#pin").await;
    let html = b
        .run(
            "return document.documentElement.outerHTML;",
            serde_json::json!([]),
        )
        .await;
    assert!(pin_in(html.as_str().unwrap()).is_some_and(|p| p.len() == 8));

    // Sign out: back to the sign-in page, and the pages want a sign-in again.
    eprintln!("browser: sign-out");
    b.goto(&s.url("/web/")).await;
    b.click("form.signout button").await;
    b.wait_until("the sign-in page", || async {
        b.url().await.contains("/web/signin")
    })
    .await;
    b.goto(&s.url(&format!("/web/browse/{VAULT}"))).await;
    b.find("form.signin").await;
    drop(b);
    eprintln!(
        "browser tests passed in {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        shots.display()
    );
}

/// A folder's page shows a folder made and a file deleted elsewhere (another connection, the
/// same account) by itself, within a second: it follows the change feed.
#[tokio::test(flavor = "multi_thread")]
async fn a_folder_page_follows_changes_made_elsewhere() {
    let (chromium, driver) = match browser::installed() {
        Ok(found) => found,
        Err(why) => {
            eprintln!(
                "\n**********\nSKIPPED a_folder_page_follows_changes_made_elsewhere: {why}\n**********\n"
            );
            return;
        }
    };
    let s = TestServer::start().await;
    s.store.add_user(ALICE, "Acme", "alice-pw").unwrap();
    let alice_http = Visitor::sign_in(&s, ALICE, "alice-pw").await;
    let token = alice_http.form_token().await;
    alice_http.upload(VAULT, "old.txt", b"old", &token).await;
    let downloads = tempfile::tempdir().unwrap();
    let b = browser::Browser::start(&chromium, &driver, downloads.path()).await;
    b.goto(&s.url(&format!("/web/browse/{VAULT}"))).await;
    b.find("form.signin").await;
    b.fill("#email", ALICE).await;
    b.fill("#password", "alice-pw").await;
    b.click("form.signin button").await;
    in_table(&b, "old.txt").await;
    // Its poll is waiting by now; the changes come through the API, not this page.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let vault = vaultfs::api::NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap();
    let all = vaultfs::store::Scope::All;
    let made = Instant::now();
    s.store
        .create_folder(all, &vault.child("made elsewhere").unwrap())
        .unwrap();
    in_table(&b, "made elsewhere").await;
    eprintln!("a folder made elsewhere shown after {:?}", made.elapsed());
    assert!(made.elapsed() < std::time::Duration::from_secs(1));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let gone = Instant::now();
    s.store
        .delete(all, &vault.child("old.txt").unwrap())
        .unwrap();
    b.wait_until("old.txt gone from the table", || async {
        !b.run(
            "return [...document.querySelectorAll('td.name a')].some(a => a.textContent === 'old.txt');",
            serde_json::json!([]),
        )
        .await
        .as_bool()
        .unwrap_or(true)
    })
    .await;
    eprintln!("a file deleted elsewhere gone after {:?}", gone.elapsed());
    assert!(gone.elapsed() < std::time::Duration::from_secs(1));
}
