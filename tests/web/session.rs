//! Signing in and the session: pages reached by links after signing in, every page guarded and
//! the cookie flagged, a wrong password and the lockout, sessions apart from API tokens.

use std::time::{Duration, Instant};

use super::{ALICE, VAULT, Visitor, alice, assert_page_headers, page_of, urlencode};
use crate::common::{TestServer, attr_after};
use reqwest::StatusCode;
use serde_json::Value;
use vaultfs::server::ServerOptions;
use vaultfs::store::StoreConfig;

#[tokio::test(flavor = "multi_thread")]
async fn browser_links_open_pages_after_signing_in() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let (st, up) = alice
        .upload(VAULT, "report.txt", b"quarterly numbers", &token)
        .await;
    assert_eq!(st, 200, "{up}");
    let f = &up["message"];
    let id = f["id"].as_str().unwrap();
    for (link, page) in [
        ("link_uri", "/web/file/"),
        ("preview_link_uri", "/web/preview/"),
        ("download_link_uri", "/web/download/"),
    ] {
        let l = f[link].as_str().unwrap();
        assert!(
            l.starts_with(&s.url(page)) && l.ends_with(&format!("&id={id}")),
            "{l}"
        );
    }
    // The API's node has the same links, and its download route still wants a token.
    let creds = s.user("alice.api@acme.test", "Acme").await;
    let api: Value = reqwest::Client::new()
        .get(s.url(&format!("/nodes/pth/{VAULT}/report.txt")))
        .basic_auth(&creds.email, Some(&creds.token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(api["message"]["link_uri"], f["link_uri"]);
    let download_uri = api["message"]["download_uri"].as_str().unwrap();
    let anon = reqwest::get(s.url(download_uri)).await.unwrap();
    assert_eq!(anon.status(), 401);
    let envelope: Value = anon.json().await.unwrap();
    assert_eq!(envelope["error"]["error_name"], "invalid_token");

    // Opened without a session: the sign-in page, then back to the link.
    let link = f["link_uri"]
        .as_str()
        .unwrap()
        .strip_prefix(&s.base)
        .unwrap();
    let stranger = Visitor::new(&s);
    let r = stranger.get(link).await;
    assert_eq!(r.status, 303);
    assert_eq!(
        r.location(),
        format!("/web/signin?next={}", urlencode(link))
    );
    let signed = stranger.try_sign_in(ALICE, "alice-pw", link).await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    assert_eq!(signed.location(), link, "lands on the link opened");

    let page = alice.get(link).await;
    assert_eq!(page.status, 200);
    assert_page_headers(&page, "file page");
    assert!(page.body.contains("<h1>report.txt</h1>") && page.body.contains("17 bytes"));

    // The preview: InProgress first (rendered when asked for), with a page that reloads.
    let preview = f["preview_link_uri"].as_str().unwrap();
    let first = alice.get(preview).await;
    assert_eq!(first.status, 200);
    assert_page_headers(&first, "preview page");
    assert!(first.body.contains("InProgress"), "{}", first.body);
    assert_eq!(first.header("refresh"), "2");
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let p = alice.get(preview).await;
        if !p.body.contains("InProgress") {
            break p;
        }
        assert!(Instant::now() < deadline, "the preview never got ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(ready.body.contains("Page 1 of 1"), "{}", ready.body);
    assert!(ready.body.contains("<figure id=\"page-1\">"));
    let png = alice
        .get(&format!("/web/preview/{id}/1?max_width=1200"))
        .await;
    assert_eq!(png.status, 200);
    assert_eq!(png.header("content-type"), "image/png");
    let pdf = alice.get(&format!("/web/preview/{id}/pdf")).await;
    assert_eq!(
        (pdf.status, pdf.header("content-type")),
        (StatusCode::OK, "application/pdf")
    );
    assert!(pdf.body.starts_with("%PDF"));

    // The download: the bytes, as an attachment that cannot run as a page of this site.
    let d = alice.get(f["download_link_uri"].as_str().unwrap()).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body, "quarterly numbers");
    assert!(
        d.header("content-disposition")
            .starts_with("attachment; filename=\"report.txt\""),
        "{}",
        d.header("content-disposition")
    );
    assert!(d.header("content-security-policy").contains("sandbox"));
    assert_eq!(d.header("x-content-type-options"), "nosniff");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_page_is_guarded_and_the_cookie_is_flagged() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let (_, up) = alice.upload(VAULT, "a.txt", b"a", &token).await;
    let f = &up["message"];
    for path in [
        "/web/".to_string(),
        format!("/web/browse/{VAULT}"),
        f["link_uri"].as_str().unwrap().to_string(),
        f["preview_link_uri"].as_str().unwrap().to_string(),
        format!("/web/delete/{VAULT}/a.txt"),
        "/web/no/such/page".to_string(),
        "/web/file/999999?view=info&id=999999".to_string(),
    ] {
        assert_page_headers(&alice.get(&path).await, &path);
    }
    assert_page_headers(&Visitor::new(&s).get("/web/signin").await, "sign-in page");
    // The authorization page too.
    let pin = Visitor::new(&s)
        .get("/pin/authorize?client_id=vaultfs")
        .await;
    assert_page_headers(&pin, "pin page");

    // The session cookie: not for scripts, not sent by other sites' posts, not to the API.
    let fresh = Visitor::new(&s);
    let r = fresh.try_sign_in(ALICE, "alice-pw", "/web/").await;
    let c = r.set_cookie("vaultfs_session").unwrap();
    for flag in ["HttpOnly", "SameSite=Lax", "Path=/web"] {
        assert!(c.contains(flag), "{c}");
    }
    assert!(!c.contains("Secure"), "plain HTTP: {c}");
    assert!(!c.contains("Max-Age") && !c.contains("Expires"), "{c}");

    // Served behind TLS (an https public URL), it is Secure.
    let tls = TestServer::start_with(
        StoreConfig::default(),
        ServerOptions {
            public_url: Some("https://files.example".into()),
            ..Default::default()
        },
    )
    .await;
    tls.store.add_user(ALICE, "Acme", "alice-pw").unwrap();
    let v = Visitor::new(&tls);
    let form = v.get("/web/signin").await;
    assert!(
        form.set_cookie("vaultfs_signin")
            .unwrap()
            .contains("Secure")
    );
    let nonce = form.set_cookie("vaultfs_signin").unwrap();
    let csrf = attr_after(&form.body, "name=\"csrf\"", "value").unwrap();
    let r = v
        .http
        .post(tls.url("/web/signin"))
        .header("Origin", "https://files.example")
        .header("Cookie", nonce.split(';').next().unwrap())
        .form(&[("email", ALICE), ("password", "alice-pw"), ("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    let r = page_of(r).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(
        r.set_cookie("vaultfs_session")
            .unwrap()
            .contains("; Secure")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_signs_nobody_in_and_the_lockout_holds() {
    let s = TestServer::start().await;
    s.store.add_user(ALICE, "Acme", "alice-pw").unwrap();
    let v = Visitor::new(&s);
    let wrong = v.try_sign_in(ALICE, "not-it", "/web/").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("wrong e-mail address or password"));
    assert!(wrong.set_cookie("vaultfs_session").is_none());
    assert!(
        wrong.body.contains(&format!("value=\"{ALICE}\"")),
        "the e-mail is kept"
    );
    let empty = v.try_sign_in(ALICE, "", "/web/").await;
    assert_eq!(empty.status, 400);
    // The pin page's rule: after five failures the pair waits, right password or not.
    for _ in 0..4 {
        assert_eq!(v.try_sign_in(ALICE, "not-it", "/web/").await.status, 401);
    }
    let locked = v.try_sign_in(ALICE, "alice-pw", "/web/").await;
    assert_eq!(locked.status, 429);
    assert!(locked.body.contains("too many failed attempts"));
    assert!(locked.set_cookie("vaultfs_session").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_not_api_tokens_and_end_with_sign_out() {
    let s = TestServer::start().await;
    let creds = s.user(ALICE, "Acme").await;
    let alice = Visitor::sign_in(&s, ALICE, &format!("pw-{ALICE}")).await;
    let session = alice.cookie.clone().unwrap();
    let session_token = session.split_once('=').unwrap().1;
    let api = reqwest::Client::new()
        .get(s.url("/nodes/pth?children=1"))
        .basic_auth(ALICE, Some(session_token))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 401, "a session is no API token");
    let mut with_api_token = Visitor::new(&s);
    with_api_token.cookie = Some(format!("vaultfs_session={}", creds.token));
    assert_eq!(
        with_api_token.get("/web/").await.status,
        303,
        "an API token is no session"
    );

    let token = alice.form_token().await;
    assert_eq!(alice.post("/web/signout", &[]).await.status, 403);
    assert_eq!(alice.get("/web/").await.status, 200, "still signed in");
    let out = alice.post("/web/signout", &[("csrf", &token)]).await;
    assert_eq!(out.status, 303);
    assert_eq!(out.location(), "/web/signin");
    assert!(
        out.set_cookie("vaultfs_session")
            .unwrap()
            .contains("Max-Age=0")
    );
    let after = alice.get("/web/").await;
    assert_eq!(after.status, 303, "the old cookie is dead: {}", after.body);
    assert!(after.location().starts_with("/web/signin"));
}
