//! What a hostile page or user tries: forms posted from elsewhere, another account's file, names
//! that would be markup.

use super::{ALICE, BOB, VAULT, Visitor, alice, assert_page_headers, page_of, urlencode};
use crate::common::TestServer;

#[tokio::test(flavor = "multi_thread")]
async fn forms_from_elsewhere_are_refused() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    alice.upload(VAULT, "keep.txt", b"keep", &token).await;
    let target = format!("/web/delete/{VAULT}/keep.txt");
    let still_there = || async {
        alice
            .get(&format!("/web/browse/{VAULT}"))
            .await
            .body
            .contains("keep.txt")
    };

    let refusals = [
        ("no token", alice.post(&target, &[]).await),
        (
            "a wrong token",
            alice.post(&target, &[("csrf", "guess")]).await,
        ),
        (
            "another site's Origin",
            page_of(
                alice
                    .http
                    .post(s.url(&target))
                    .header("Cookie", alice.cookie.as_deref().unwrap())
                    .header("Origin", "http://evil.example")
                    .form(&[("csrf", token.as_str())])
                    .send()
                    .await
                    .unwrap(),
            )
            .await,
        ),
        (
            "Sec-Fetch-Site: cross-site",
            page_of(
                alice
                    .http
                    .post(s.url(&target))
                    .header("Cookie", alice.cookie.as_deref().unwrap())
                    .header("Sec-Fetch-Site", "cross-site")
                    .form(&[("csrf", token.as_str())])
                    .send()
                    .await
                    .unwrap(),
            )
            .await,
        ),
        (
            // What a cross-site post carries under SameSite=Lax: no session cookie.
            "no session",
            Visitor::new(&s).post(&target, &[("csrf", &token)]).await,
        ),
    ];
    for (what, r) in &refusals {
        assert_eq!(r.status, 403, "{what}: {}", r.body);
        assert_page_headers(r, what);
        assert!(r.body.contains("Nothing was changed"), "{what}");
        assert!(still_there().await, "{what} deleted the file");
    }
    // Another session's token is worth nothing in this one.
    s.store.add_user(BOB, "Other", "bob-pw").unwrap();
    let bob = Visitor::sign_in(&s, BOB, "bob-pw").await;
    let bobs = bob.form_token().await;
    assert_ne!(bobs, token);
    assert_eq!(alice.post(&target, &[("csrf", &bobs)]).await.status, 403);
    // The upload script's requests: the token in a header.
    let (st, _) = alice.upload(VAULT, "planted.txt", b"x", "guess").await;
    assert_eq!(st, 403);
    assert!(
        !alice
            .get(&format!("/web/browse/{VAULT}"))
            .await
            .body
            .contains("planted.txt")
    );
    // The sign-in form: its cookie and its field must agree, and the post come from here.
    let no_cookie = Visitor::new(&s)
        .post(
            "/web/signin",
            &[("email", ALICE), ("password", "alice-pw"), ("csrf", "x")],
        )
        .await;
    assert_eq!(no_cookie.status, 403);
    assert!(no_cookie.set_cookie("vaultfs_session").is_none());

    // From the page itself: done.
    let done = alice.post(&target, &[("csrf", &token)]).await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(done.location(), format!("/web/browse/{VAULT}"));
    assert!(!still_there().await);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_accounts_file_is_a_403_page() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    s.store.add_user(BOB, "Other", "bob-pw").unwrap();
    let bob = Visitor::sign_in(&s, BOB, "bob-pw").await;
    let bobs_token = bob.form_token().await;
    let (st, up) = bob
        .upload(
            "Other/My%20First%20Vault",
            "secret.txt",
            b"bob's",
            &bobs_token,
        )
        .await;
    assert_eq!(st, 200, "{up}");
    let f = &up["message"];
    let id = f["id"].as_str().unwrap();
    for path in [
        f["link_uri"].as_str().unwrap().to_string(),
        f["preview_link_uri"].as_str().unwrap().to_string(),
        f["download_link_uri"].as_str().unwrap().to_string(),
        format!("/web/preview/{id}/1"),
        format!("/web/preview/{id}/pdf"),
        "/web/browse/Other".to_string(),
        "/web/browse/Other/My%20First%20Vault/secret.txt".to_string(),
        "/web/delete/Other/My%20First%20Vault/secret.txt".to_string(),
        // No such file answers the same (IDs are not to be counted).
        "/web/file/987654?view=info&id=987654".to_string(),
    ] {
        let p = alice.get(&path).await;
        assert_eq!(p.status, 403, "{path}: {}", p.body);
        assert_page_headers(&p, &path);
        assert!(p.body.contains("Not available to you"), "{path}");
        assert!(!p.body.contains("bob's"), "{path}");
    }
    let missing = alice.get(&format!("/web/browse/{VAULT}/missing")).await;
    assert_eq!(missing.status, 404);
    let r = alice
        .post(
            "/web/rename/Other/My%20First%20Vault/secret.txt",
            &[("csrf", &token), ("name", "mine.txt")],
        )
        .await;
    assert_eq!(r.status, 403);
    assert!(
        bob.get("/web/browse/Other/My%20First%20Vault")
            .await
            .body
            .contains("secret.txt")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_names_are_shown_as_text() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let file = "<img src=x onerror=alert(1)>.txt";
    let folder = "\"><svg onload=alert(2)>";
    let (st, up) = alice.upload(VAULT, file, b"x", &token).await;
    assert_eq!(st, 200, "{up}");
    let r = alice
        .post(
            &format!("/web/folder/{VAULT}"),
            &[("csrf", &token), ("name", folder)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    for path in [
        format!("/web/browse/{VAULT}"),
        up["message"]["link_uri"].as_str().unwrap().to_string(),
        format!("/web/browse/{VAULT}/{}", urlencode(folder)),
        format!("/web/delete/{VAULT}/{}", urlencode(file)),
    ] {
        let p = alice.get(&path).await;
        assert_eq!(p.status, 200, "{path}");
        assert!(!p.body.contains("<img src=x"), "{path}: {}", p.body);
        assert!(!p.body.contains("<svg"), "{path}: {}", p.body);
    }
    let listing = alice.get(&format!("/web/browse/{VAULT}")).await.body;
    assert!(listing.contains("&lt;img src=x onerror=alert(1)&gt;.txt"));
    assert!(listing.contains("&quot;&gt;&lt;svg onload=alert(2)&gt;"));
}

/// An uploaded HTML or SVG file never runs as a page of this site, by either download route:
/// the API's `GET /files/id/Document/{id}` (before: served inline as `text/html` and
/// `image/svg+xml`, without `nosniff` or a policy) and `/web/download/{id}` both send it as an
/// attachment, never sniffed, in a sandbox; the bytes are the file's, ranges as before.
#[tokio::test(flavor = "multi_thread")]
async fn uploaded_html_and_svg_are_attachments_on_both_download_routes() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let api = s.user("alice.api@acme.test", "Acme").await;
    let files: [(&str, &[u8]); 2] = [
        ("x.html", b"<script>fetch('/nodes/pth')</script>"),
        (
            "y.svg",
            b"<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"alert(1)\"/>",
        ),
    ];
    for (name, data) in files {
        let (st, up) = alice.upload(VAULT, name, data, &token).await;
        assert_eq!(st, 200, "{up}");
        let id = up["message"]["id"].as_str().unwrap().to_string();
        let by_api = page_of(
            reqwest::Client::new()
                .get(s.url(&format!("/files/id/Document/{id}")))
                .basic_auth(&api.email, Some(&api.token))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let by_web = alice.get(&format!("/web/download/{id}")).await;
        // A kept version of it, by the versions route (`vprop=1` gives its ID).
        let file = reqwest::Client::new()
            .get(s.url(&format!(
                "/nodes/pth/Acme/My%20First%20Vault/{name}?vprop=1"
            )))
            .basic_auth(&api.email, Some(&api.token))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap();
        let vid = file["message"]["versions"][0]["version_id"]
            .as_str()
            .unwrap()
            .to_string();
        let by_version = page_of(
            reqwest::Client::new()
                .get(s.url(&format!("/files/id/Document/{id}/version/{vid}")))
                .basic_auth(&api.email, Some(&api.token))
                .send()
                .await
                .unwrap(),
        )
        .await;
        for (route, p) in [("api", &by_api), ("web", &by_web), ("version", &by_version)] {
            assert_eq!(p.status, 200, "{route} {name}");
            assert_eq!(p.body.as_bytes(), data, "{route} {name}");
            assert!(
                p.header("content-disposition")
                    .starts_with(&format!("attachment; filename=\"{name}\"")),
                "{route} {name}: {}",
                p.header("content-disposition")
            );
            assert_eq!(
                p.header("x-content-type-options"),
                "nosniff",
                "{route} {name}"
            );
            let csp = p.header("content-security-policy");
            assert!(
                csp.contains("sandbox") && csp.contains("default-src 'none'"),
                "{route} {name}: {csp}"
            );
        }
        // A range of it is the same attachment.
        let part = reqwest::Client::new()
            .get(s.url(&format!("/files/id/Document/{id}")))
            .basic_auth(&api.email, Some(&api.token))
            .header("Range", "bytes=0-3")
            .send()
            .await
            .unwrap();
        assert_eq!(part.status(), 206);
        assert!(
            part.headers()["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment")
        );
        assert_eq!(&part.bytes().await.unwrap()[..], &data[..4]);
    }
}
