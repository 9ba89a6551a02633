//! The pin exchange (docs/design.md §2): `/pin/end`, `/pin/auth`, and the authorization page
//! where a user signs in and is shown their pin. The page is plain HTML with no JavaScript, may
//! not be framed or cached (the headers of every page: `web::page::respond`), and takes its form
//! only from its own origin.

use std::collections::HashMap;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::AppState;
use super::conn::Source;
use super::nodes::parse_json;
use super::openapi::{
    ErrorEnvelope, PinAuthEnvelope, PinAuthRequest as PinAuthBody, PinEndEnvelope,
    PinEndRequest as PinEndBody, SignInForm,
};
use super::reply::{ApiError, ApiResult, ok, retry_after};
use super::web::page::{PIN_PAGE_POLICY, escape, respond};
use crate::api::path::encode_segment;
use crate::api::{
    Error, ErrorKind, PinAuthRequest, PinAuthResponse, PinEndRequest, PinEndResponse,
};
use crate::store::Store;

/// A call of the store (which blocks) on a blocking thread; a task that failed is an internal
/// error. The web pages' store calls go through here too.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("task failed: {e}")))?
}

/// Runs the password check `check` when the bound on checks at once gives it a turn (each takes
/// argon2's memory, so beyond the queue the answer is 503 "later", before any is spent). The
/// turn ends with the check itself, even if the request is dropped meanwhile. Every sign-in with
/// a password (this page's, the web interface's) goes through here.
pub(super) async fn password_check<T: Send + 'static>(
    state: &AppState,
    check: impl FnOnce(&Store) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let turn = state.limits.passwords.enter().await?;
    let store = state.store.clone();
    blocking(move || {
        let _turn = turn;
        check(&store)
    })
    .await
}

fn required(v: Option<String>, name: &str) -> Result<String, Error> {
    v.map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::missing(name))
}

/// The base URL the user's browser reaches this server at: the configured public URL, never a
/// request's Host header (which a client or a proxy's client chooses). Without one, only a
/// client on this machine is answered, with the address it connected to.
fn base_url(state: &AppState, source: &Source) -> Result<String, Error> {
    if let Some(u) = &state.options.public_url {
        return Ok(u.trim_end_matches('/').to_string());
    }
    match source.0 {
        Some(peer) if peer.is_loopback() => Ok(format!("http://{}", peer.local)),
        _ => Err(Error::bad_request(
            "no_public_url",
            "this server does not know the address browsers reach it at; \
             its operator sets it with `vaultfs serve --public-url`",
        )),
    }
}

/// Whether a form post comes from this server's own page: a browser says where the form was
/// (`Origin`, else `Referer`) and whether that was another site (`Sec-Fetch-Site`); a client
/// that is no browser says nothing and is let through (it could not be made to post by a
/// page). The origin expected is the public URL's, or the one the browser asked for (`Host`).
pub(super) fn same_origin(state: &AppState, headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if text(header::HeaderName::from_static("sec-fetch-site"))
        .is_some_and(|s| s.eq_ignore_ascii_case("cross-site"))
    {
        return false;
    }
    let origin_of = |url: &str| {
        reqwest::Url::parse(url)
            .ok()
            .map(|u| u.origin().ascii_serialization())
    };
    let Some(sent) = text(header::ORIGIN).or_else(|| text(header::REFERER)) else {
        return true;
    };
    let expected = match &state.options.public_url {
        Some(u) => origin_of(u),
        None => text(header::HOST).and_then(|h| origin_of(&format!("http://{h}"))),
    };
    expected.is_some() && origin_of(sent) == expected
}

#[utoipa::path(
    post,
    path = "/pin/end",
    tag = "pin",
    operation_id = "pin_end",
    summary = "Pin exchange, step 1: the page where the user signs in and gets a pin",
    request_body(content = PinEndBody, content_type = "application/json"),
    responses(
        (status = 200, description = "`authorization_uri`: the page to visit", body = PinEndEnvelope),
        (status = 400, description = "`missing_parameter`, `unknown_client`, `bad_json`; `no_public_url`: a client on another machine while the server has no `--public-url`", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`", body = ErrorEnvelope),
    ),
    security(()),
)]
pub async fn end(State(state): State<AppState>, source: Source, body: Bytes) -> ApiResult {
    let req: PinEndRequest = parse_json(&body)?;
    let client_id = required(req.client_id, "client_id")?;
    let store = state.store.clone();
    let cid = client_id.clone();
    if !blocking(move || store.client_exists(&cid)).await? {
        return Err(Error::bad_request(
            "unknown_client",
            format!("client `{client_id}` is not registered"),
        )
        .into());
    }
    let uri = format!(
        "{}/pin/authorize?client_id={}",
        base_url(&state, &source)?,
        encode_segment(&client_id)
    );
    Ok(ok(PinEndResponse {
        authorization_uri: uri,
    }))
}

#[utoipa::path(
    post,
    path = "/pin/auth",
    tag = "pin",
    operation_id = "pin_auth",
    summary = "Pin exchange, step 2: a delegation token for the user's pin",
    request_body(content = PinAuthBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The token, its lifetime in seconds and the user's e-mail", body = PinAuthEnvelope),
        (status = 400, description = "`missing_parameter`, `unknown_client`, `bad_json`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_pin`", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`", body = ErrorEnvelope),
        (status = 429, description = "`too_many_attempts`: after 5 failures for one e-mail from one address, that pair waits (1 minute, doubling)", body = ErrorEnvelope),
    ),
    security(()),
)]
pub async fn auth(State(state): State<AppState>, source: Source, body: Bytes) -> ApiResult {
    let req: PinAuthRequest = parse_json(&body)?;
    let email = required(req.user_email, "user_email")?;
    let info = req.pin_info.ok_or_else(|| Error::missing("pin_info"))?;
    let client_id = required(info.client_id, "pin_info.client_id")?;
    let pin = required(info.pin, "pin_info.pin")?;
    let store = state.store.clone();
    let source = source.key();
    let issued = blocking(move || store.exchange_pin(&email, &client_id, &pin, &source)).await?;
    log::info!(
        "issued a token to {} for {} seconds",
        issued.email,
        issued.expires_in.as_secs()
    );
    Ok(ok(PinAuthResponse {
        token: issued.token,
        expires_in: issued.expires_in.as_secs(),
        id: Some(issued.email),
    }))
}

fn page_html(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;max-width:28em;margin:3em auto;padding:0 1em}}\
         label{{display:block;margin:.8em 0}}input{{width:100%;padding:.4em}}\
         #pin{{font-size:2em;letter-spacing:.1em}}.error{{color:#b00}}</style></head>\
         <body><h1>{title}</h1>{body}</body></html>\n"
    )
}

fn form(client_id: &str, email: &str, error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", escape(e)))
        .unwrap_or_default();
    page_html(
        "Authorize vaultfs",
        &format!(
            "<p>The application <b>{cid}</b> asks for access to your files. Sign in to get a pin for it.</p>{error}\
             <form method=\"post\" action=\"/pin/authorize\">\
             <input type=\"hidden\" name=\"client_id\" value=\"{cid}\">\
             <label>E-mail <input type=\"email\" name=\"email\" value=\"{email}\" required autofocus></label>\
             <label>Password <input type=\"password\" name=\"password\" required></label>\
             <button type=\"submit\">Sign in</button></form>",
            cid = escape(client_id),
            email = escape(email),
        ),
    )
}

/// Every page of the authorization: no script, style only inline, the headers of every page.
fn html(status: StatusCode, body: String) -> Response {
    respond(status, PIN_PAGE_POLICY, body)
}

/// GET `/pin/authorize?client_id=...`: the sign-in form.
#[utoipa::path(
    get,
    path = "/pin/authorize",
    tag = "pin",
    operation_id = "authorize_page",
    summary = "The authorization page (HTML for people): the sign-in form",
    params(("client_id" = Option<String>, Query, description = "The application asking", example = "vaultfs")),
    responses(
        (status = 200, description = "The form", content_type = "text/html", body = String),
        (status = 400, description = "An unknown application (a page)", content_type = "text/html", body = String),
    ),
    security(()),
)]
pub async fn page(
    State(state): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let client_id = q.get("client_id").cloned().unwrap_or_default();
    let store = state.store.clone();
    let cid = client_id.clone();
    match blocking(move || store.client_exists(&cid)).await {
        Ok(true) => html(StatusCode::OK, form(&client_id, "", None)),
        Ok(false) => html(
            StatusCode::BAD_REQUEST,
            page_html(
                "Unknown application",
                "<p class=\"error\">This link names no registered application.</p>",
            ),
        ),
        Err(e) => ApiError(e).into_response(),
    }
}

/// POST `/pin/authorize`: checks the password and shows the pin.
#[utoipa::path(
    post,
    path = "/pin/authorize",
    tag = "pin",
    operation_id = "authorize_sign_in",
    summary = "The authorization page's form: a good sign-in shows the pin (`id=\"pin\"`)",
    request_body(content = SignInForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "The pin (a page)", content_type = "text/html", body = String),
        (status = 400, description = "The form again: e-mail or password missing", content_type = "text/html", body = String),
        (status = 401, description = "The form again: wrong e-mail address or password", content_type = "text/html", body = String),
        (status = 403, description = "A page: the form was posted from another site (`Origin`, `Referer`, `Sec-Fetch-Site`)", content_type = "text/html", body = String),
        (status = 413, description = "`body_too_large`", body = ErrorEnvelope),
        (status = 415, description = "`unsupported_media_type`: not a form", body = ErrorEnvelope),
        (status = 429, description = "The form again: too many failed attempts", content_type = "text/html", body = String),
        (status = 503, description = "The form again: too many sign-ins at once (`Retry-After`)", content_type = "text/html", body = String),
    ),
    security(()),
)]
pub async fn sign_in(
    State(state): State<AppState>,
    source: Source,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let client_id = f.get("client_id").cloned().unwrap_or_default();
    if !same_origin(&state, &headers) {
        return html(
            StatusCode::FORBIDDEN,
            page_html(
                "Not signed in",
                "<p class=\"error\">This form was sent from another site. Open the \
                 authorization link you were given and sign in there.</p>",
            ),
        );
    }
    let email = f
        .get("email")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let password = f.get("password").cloned().unwrap_or_default();
    if email.is_empty() || password.is_empty() {
        return html(
            StatusCode::BAD_REQUEST,
            form(
                &client_id,
                &email,
                Some("Enter your e-mail address and password."),
            ),
        );
    }
    let (e2, c2, source) = (email.clone(), client_id.clone(), source.key());
    match password_check(&state, move |store| {
        store.sign_in_for_pin(&e2, &password, &c2, &source)
    })
    .await
    {
        Ok(pin) => {
            log::info!("{email} signed in on the authorization page for client {client_id}");
            html(
                StatusCode::OK,
                page_html(
                    "Your pin",
                    &format!(
                        "<p>Enter this pin in <b>{cid}</b> (for the vaultfs CLI: at the prompt of \
                         <code>vaultfs login</code>):</p><p><code id=\"pin\">{pin}</code></p>\
                         <p>It works once, within {minutes} minutes. Signing in again gives a new \
                         one.</p>",
                        cid = escape(&client_id),
                        minutes = state.store.config().pin_ttl.as_secs().div_ceil(60),
                    ),
                ),
            )
        }
        Err(e) if e.kind == ErrorKind::Unavailable => {
            let mut resp = html(
                StatusCode::SERVICE_UNAVAILABLE,
                form(&client_id, &email, Some(&e.message)),
            );
            retry_after(&mut resp);
            resp
        }
        Err(e) if e.kind == ErrorKind::TooManyRequests => html(
            StatusCode::TOO_MANY_REQUESTS,
            form(&client_id, &email, Some(&e.message)),
        ),
        Err(e) if matches!(e.kind, ErrorKind::Auth | ErrorKind::BadRequest) => html(
            StatusCode::UNAUTHORIZED,
            form(&client_id, &email, Some(&e.message)),
        ),
        Err(e) => ApiError(e).into_response(),
    }
}
