//! The web interface of `vaultfs serve` (issue 16), over real loopback HTTP against a real
//! server and store: first as a browser speaks it, with reqwest (headers, cookie flags, the
//! sign-in and its lockout, CSRF refusals, the 403 of another account, escaping, uploads,
//! sorting, paging), so the logic is covered on any machine; then in a real headless Chromium
//! driven over WebDriver (`in_a_real_browser`), which is skipped, loudly, where the Debian
//! packages `chromium` and `chromium-driver` are not installed. Its screenshots are saved under
//! `target/tmp/web-screenshots/`.

#[path = "web/browser.rs"]
mod browser;
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::fixtures::shapes_pdf;
use common::{TestServer, attr_after, pin_in};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use serde_json::Value;
use vaultfs::server::ServerOptions;
use vaultfs::store::StoreConfig;

const VAULT: &str = "Acme/My%20First%20Vault";
const ALICE: &str = "alice@acme.test";
const BOB: &str = "bob@other.test";

/// What a browser does with cookies and redirects, by hand: no redirect is followed (the tests
/// look at each), the session cookie is kept once signed in.
struct Visitor {
    http: reqwest::Client,
    base: String,
    cookie: Option<String>,
}

struct Page {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Page {
    fn location(&self) -> &str {
        self.headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The `Set-Cookie` header that sets or removes `name`.
    fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with(&format!("{name}=")))
            .map(str::to_string)
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn page_of(resp: reqwest::Response) -> Page {
    Page {
        status: resp.status(),
        headers: resp.headers().clone(),
        body: resp.text().await.unwrap(),
    }
}

impl Visitor {
    fn new(s: &TestServer) -> Visitor {
        Visitor {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: s.base.clone(),
            cookie: None,
        }
    }

    /// A request with the session cookie (if any) and, for a form, this site's `Origin`, as a
    /// browser sends them from the site's own pages.
    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            r = r.header("Cookie", c);
        }
        if method != reqwest::Method::GET {
            r = r.header("Origin", &self.base);
        }
        r
    }

    async fn get(&self, path: &str) -> Page {
        page_of(self.req(reqwest::Method::GET, path).send().await.unwrap()).await
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Page {
        page_of(
            self.req(reqwest::Method::POST, path)
                .form(form)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// The sign-in form filled in as a person does: the page first (its cookie and fields),
    /// then the post.
    async fn try_sign_in(&self, email: &str, password: &str, next: &str) -> Page {
        let form = self
            .get(&format!("/web/signin?next={}", urlencode(next)))
            .await;
        assert_eq!(form.status, 200, "{}", form.body);
        let nonce = form
            .set_cookie("vaultfs_signin")
            .expect("the sign-in cookie");
        let nonce = nonce.split(';').next().unwrap().to_string();
        let csrf = attr_after(&form.body, "name=\"csrf\"", "value").unwrap();
        let kept_next = attr_after(&form.body, "name=\"next\"", "value").unwrap();
        page_of(
            self.req(reqwest::Method::POST, "/web/signin")
                .header("Cookie", nonce)
                .form(&[
                    ("email", email),
                    ("password", password),
                    ("csrf", &csrf),
                    ("next", &html_unescape(&kept_next)),
                ])
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Signs in and keeps the session cookie.
    async fn sign_in(s: &TestServer, email: &str, password: &str) -> Visitor {
        let mut v = Visitor::new(s);
        let resp = v.try_sign_in(email, password, "/web/").await;
        assert_eq!(resp.status, 303, "{}", resp.body);
        let c = resp
            .set_cookie("vaultfs_session")
            .expect("a session cookie");
        v.cookie = Some(c.split(';').next().unwrap().to_string());
        v
    }

    /// The session's form token, as the pages carry it.
    async fn form_token(&self) -> String {
        let page = self.get("/web/").await;
        attr_after(&page.body, "name=\"csrf\"", "value").expect("a form token on the page")
    }

    /// The upload script's request: the bytes of `name` into the folder (encoded path).
    async fn upload(
        &self,
        folder: &str,
        name: &str,
        data: &[u8],
        token: &str,
    ) -> (StatusCode, Value) {
        let resp = self
            .req(
                reqwest::Method::POST,
                &format!("/web/upload/{folder}?name={}", urlencode(name)),
            )
            .header("X-Form-Token", token)
            .header("Content-Type", "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        // A refusal is the 403 page; the rest is the API's envelope.
        let body = resp.text().await.unwrap();
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }
}

fn urlencode(s: &str) -> String {
    vaultfs::api::path::encode_segment(s)
}

/// The few entities the pages write in attribute values.
fn html_unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Alice (account Acme) signed in, with her form token.
async fn alice(s: &TestServer) -> (Visitor, String) {
    s.store.add_user(ALICE, "Acme", "alice-pw").unwrap();
    let v = Visitor::sign_in(s, ALICE, "alice-pw").await;
    let token = v.form_token().await;
    (v, token)
}

/// The headers every page must have.
#[track_caller]
fn assert_page_headers(p: &Page, what: &str) {
    assert!(
        p.header("content-type").starts_with("text/html"),
        "{what}: {}",
        p.header("content-type")
    );
    let csp = p.header("content-security-policy");
    assert!(csp.contains("default-src 'none'"), "{what}: {csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
    assert_eq!(p.header("x-frame-options"), "DENY", "{what}");
    assert_eq!(p.header("x-content-type-options"), "nosniff", "{what}");
    assert_eq!(p.header("cache-control"), "no-store", "{what}");
}

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
            l.starts_with(page) && l.ends_with(&format!("&id={id}")),
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
    let link = f["link_uri"].as_str().unwrap();
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
        two["message"]["link_uri"].as_str().unwrap(),
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
