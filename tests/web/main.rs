//! The web interface of `vaultfs serve` (issue 16), over real loopback HTTP against a real
//! server and store: first as a browser speaks it, with reqwest (headers, cookie flags, the
//! sign-in and its lockout, CSRF refusals, the 403 of another account, escaping, uploads,
//! sorting, paging), so the logic is covered on any machine; then in a real headless Chromium
//! driven over WebDriver (`in_a_real_browser`), which is skipped, loudly, where the Debian
//! packages `chromium` and `chromium-driver` are not installed. Its screenshots are saved under
//! `target/tmp/web-screenshots/`.
//!
//! One binary (see Cargo.toml's note on test binaries), its tests by concern in the modules
//! below: `session` (signing in, the session cookie, signing out), `hostile` (forms from other
//! sites, another account's file, hostile names), `files` (uploads, folders, renames, sorting,
//! paging), `chromium` (all of it in a real browser, driven through `browser`), `versions` (a file's
//! versions, deleted files, their restores), `search` (the search box), `app_passwords` (a
//! person's own WebDAV app passwords). The visitor that speaks to the pages as a browser does,
//! and the helpers more than one of them uses, are here.

#[path = "../common/mod.rs"]
mod common;

mod app_passwords;
mod browser;
mod chromium;
mod files;
mod hostile;
mod search;
mod session;
mod versions;

use crate::common::{TestServer, attr_after};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use serde_json::Value;

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
            .request(method.clone(), absolute(&self.base, path));
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
/// `path` on the server at `base`; an absolute address (a link the server sent) as it is.
fn absolute(base: &str, path: &str) -> String {
    if path.starts_with("http://") || path.starts_with("https://") {
        return path.to_string();
    }
    format!("{base}{path}")
}

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
