//! Signing in and out of the web interface, the session cookie, and the checks every form
//! passes.
//!
//! - The session is a token of the store (`Store::sign_in_web`: the same users, passwords and
//!   lockout as the authorization page, the same bound on password checks at once), sent as the
//!   cookie `vaultfs_session`: `HttpOnly` (no script reads it), `SameSite=Lax` (no other site's
//!   form post carries it), `Path=/web` (the API never sees it), `Secure` when the server's
//!   public URL is https (it serves plain HTTP itself, behind a TLS proxy then). No `Max-Age`:
//!   it ends with the browser, and the store ends it after `SESSION_TTL` anyway.
//! - Every form post must come from this server's pages (`Origin`/`Referer`/`Sec-Fetch-Site`,
//!   as the authorization page checks) and carry the session's form token
//!   (`Store::form_token`). The sign-in form, before there is a session, carries a random value
//!   that must equal its `vaultfs_signin` cookie (`SameSite=Strict`), so another site cannot sign
//!   a browser in to an account of its choosing either.

use std::collections::HashMap;

use axum::Form;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use rand::Rng;

use super::super::AppState;
use super::super::conn::Source;
use super::super::pin::{password_check, same_origin};
use super::super::reply::retry_after;
use super::page::{Viewer, WEB_POLICY, error_page, escape, layout, respond, see_other};
use crate::api::path::encode_segment;
use crate::api::{Error, ErrorKind, NodePath};
use crate::backend::local::LocalBackend;

pub const SESSION_COOKIE: &str = "vaultfs_session";
const SIGN_IN_COOKIE: &str = "vaultfs_signin";
/// Longest `next` address kept through the sign-in.
const MAX_NEXT: usize = 2048;

/// A signed-in person, as the backend limited to their account.
pub struct WebUser {
    pub backend: LocalBackend,
    pub user_id: i64,
    pub email: String,
    pub form_token: String,
    session: String,
}

impl WebUser {
    pub fn viewer(&self) -> Viewer<'_> {
        Viewer {
            email: &self.email,
            form_token: &self.form_token,
        }
    }

    /// A page for this person (200).
    pub fn page(&self, title: &str, trail: Option<&NodePath>, body: &str) -> Response {
        respond(
            StatusCode::OK,
            WEB_POLICY,
            layout(title, Some(&self.viewer()), trail, body),
        )
    }

    /// An error as a page for this person.
    pub fn error(&self, err: &Error) -> Response {
        error_page(err, Some(&self.viewer()))
    }

    /// The refusal (403 page) of a form post that did not come from this server's page of this
    /// session: another origin, or no or the wrong form token (`given`); `None` for the page's
    /// own.
    pub fn refuse_form(
        &self,
        state: &AppState,
        headers: &HeaderMap,
        given: Option<&str>,
    ) -> Option<Response> {
        let token_ok = given.is_some_and(|g| state.store.form_token_matches(&self.session, g));
        if same_origin(state, headers) && token_ok {
            return None;
        }
        log::info!(
            "refused a form post of {} (origin or form token)",
            self.email
        );
        Some(refused(Some(&self.viewer())))
    }
}

/// The 403 page of a form post from elsewhere.
fn refused(viewer: Option<&Viewer>) -> Response {
    respond(
        StatusCode::FORBIDDEN,
        WEB_POLICY,
        layout(
            "Refused",
            viewer,
            None,
            "<p class=\"error\" role=\"alert\">This request did not come from a page of this \
             server (or the page was from an earlier sign-in). Nothing was changed. Go back, \
             reload the page and try again.</p>",
        ),
    )
}

/// The value of the cookie `name`, if the request has it.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value: `value` for the session, or `None` to remove the cookie.
fn set_cookie(
    state: &AppState,
    name: &str,
    value: Option<&str>,
    path: &str,
    same_site: &str,
) -> HeaderValue {
    let secure = state
        .options
        .public_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    let mut c = match value {
        Some(v) => format!("{name}={v}"),
        None => format!("{name}=; Max-Age=0"),
    };
    c.push_str(&format!("; Path={path}; HttpOnly; SameSite={same_site}"));
    if secure {
        c.push_str("; Secure");
    }
    HeaderValue::from_str(&c).expect("cookie values are base64")
}

/// A page's own address to come back to after signing in: only pages of the web interface
/// (never another site's address, which would make the sign-in an open redirect).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/web/")
                && !n.starts_with("/web//")
                && n.len() <= MAX_NEXT
                && !n.chars().any(|c| c.is_control() || c == '\\') =>
        {
            n.to_string()
        }
        _ => "/web/".to_string(),
    }
}

/// The sign-in page's address that comes back to `next` afterwards.
fn sign_in_href(next: &str) -> String {
    format!("/web/signin?next={}", encode_segment(next))
}

/// The session of a request, if it has a live one: (token, user).
fn session_of(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(String, crate::store::auth::Principal)>, Error> {
    let Some(token) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    match state.store.web_session(token) {
        Ok(p) => Ok(Some((token.to_string(), p))),
        Err(e) if e.kind == ErrorKind::Auth => Ok(None),
        Err(e) => Err(e),
    }
}

impl FromRequestParts<AppState> for WebUser {
    /// A page or a download without a session goes to the sign-in page and comes back after;
    /// anything else (a form post, an upload) is refused.
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let (store, headers) = (state.store.clone(), parts.headers.clone());
        let st = state.clone();
        let found = tokio::task::spawn_blocking(move || session_of(&st, &headers))
            .await
            .map_err(|e| Error::internal(format!("session task failed: {e}")))
            .and_then(|r| r)
            .map_err(|e| error_page(&e, None))?;
        match found {
            Some((session, p)) => Ok(WebUser {
                backend: LocalBackend::for_account(store.clone(), p.account_id),
                user_id: p.user_id,
                email: p.email,
                form_token: store.form_token(&session),
                session,
            }),
            None if matches!(parts.method, Method::GET | Method::HEAD) => {
                let here = parts
                    .uri
                    .path_and_query()
                    .map(|pq| pq.as_str())
                    .unwrap_or("/web/");
                Err(see_other(&sign_in_href(&safe_next(Some(here)))))
            }
            None => Err(refused(None)),
        }
    }
}

/// The sign-in form, with `error` above it when the last try failed.
fn form_page(
    status: StatusCode,
    next: &str,
    nonce: &str,
    email: &str,
    error: Option<&str>,
) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", escape(e)))
        .unwrap_or_default();
    let body = format!(
        "{error}<form class=\"signin\" method=\"post\" action=\"/web/signin\">\
         <input type=\"hidden\" name=\"next\" value=\"{next}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{nonce}\">\
         <label for=\"email\">E-mail</label>\
         <input id=\"email\" type=\"email\" name=\"email\" value=\"{email}\" autocomplete=\"username\" required autofocus>\
         <label for=\"password\">Password</label>\
         <input id=\"password\" type=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
         <button type=\"submit\">Sign in</button></form>",
        next = escape(next),
        nonce = escape(nonce),
        email = escape(email),
    );
    respond(status, WEB_POLICY, layout("Sign in", None, None, &body))
}

/// GET `/web/signin?next=...`: the form (or, signed in already, straight on to `next`).
pub async fn form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let next = safe_next(q.get("next").map(String::as_str));
    let st = state.clone();
    let hs = headers.clone();
    if let Ok(Ok(Some(_))) = tokio::task::spawn_blocking(move || session_of(&st, &hs)).await {
        return see_other(&next);
    }
    let mut raw = [0u8; 16];
    rand::rng().fill(&mut raw);
    let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    let mut resp = form_page(StatusCode::OK, &next, &nonce, "", None);
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(
            &state,
            SIGN_IN_COOKIE,
            Some(&nonce),
            "/web/signin",
            "Strict",
        ),
    );
    resp
}

/// POST `/web/signin`: checks the password; on success sets the session and goes to `next`.
pub async fn sign_in(
    State(state): State<AppState>,
    source: Source,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let next = safe_next(f.get("next").map(String::as_str));
    let nonce = cookie(&headers, SIGN_IN_COOKIE)
        .unwrap_or_default()
        .to_string();
    let email = f
        .get("email")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let nonce_ok = !nonce.is_empty() && f.get("csrf").is_some_and(|c| *c == nonce);
    if !same_origin(&state, &headers) || !nonce_ok {
        return refused(None);
    }
    let password = f.get("password").cloned().unwrap_or_default();
    if email.is_empty() || password.is_empty() {
        return form_page(
            StatusCode::BAD_REQUEST,
            &next,
            &nonce,
            &email,
            Some("Enter your e-mail address and password."),
        );
    }
    let (e2, source) = (email.clone(), source.key());
    match password_check(&state, move |store| {
        store.sign_in_web(&e2, &password, &source)
    })
    .await
    {
        Ok(issued) => {
            log::info!("{} signed in to the web interface", issued.email);
            let mut resp = see_other(&next);
            let h = resp.headers_mut();
            h.append(
                header::SET_COOKIE,
                set_cookie(&state, SESSION_COOKIE, Some(&issued.token), "/web", "Lax"),
            );
            h.append(
                header::SET_COOKIE,
                set_cookie(&state, SIGN_IN_COOKIE, None, "/web/signin", "Strict"),
            );
            resp
        }
        Err(e) => {
            let status = match e.kind {
                ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
                ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Auth | ErrorKind::BadRequest => StatusCode::UNAUTHORIZED,
                _ => return error_page(&e, None),
            };
            let mut resp = form_page(status, &next, &nonce, &email, Some(&e.message));
            if status == StatusCode::SERVICE_UNAVAILABLE {
                retry_after(&mut resp);
            }
            resp
        }
    }
}

/// POST `/web/signout`: ends the session (in the store too) and removes the cookie.
pub async fn sign_out(
    State(state): State<AppState>,
    user: WebUser,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Some(refusal) = user.refuse_form(&state, &headers, f.get("csrf").map(String::as_str)) {
        return refusal;
    }
    let store = state.store.clone();
    let session = user.session.clone();
    match tokio::task::spawn_blocking(move || store.end_web_session(&session)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return user.error(&e),
        Err(e) => return user.error(&Error::internal(format!("sign-out task failed: {e}"))),
    }
    log::info!("{} signed out of the web interface", user.email);
    let mut resp = see_other("/web/signin");
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, SESSION_COOKIE, None, "/web", "Lax"),
    );
    resp.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_the_web_interface() {
        assert_eq!(
            safe_next(Some("/web/file/3?view=info&id=3")),
            "/web/file/3?view=info&id=3"
        );
        for bad in [
            "https://evil.example/",
            "//evil.example/web/",
            "/web//evil.example",
            "/web/\\evil",
            "/nodes/pth",
            "/web/a\nb",
        ] {
            assert_eq!(safe_next(Some(bad)), "/web/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/web/");
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; vaultfs_session=tok"),
        );
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("tok"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "vaultfs"), None);
    }
}
