//! WebDAV at `/dav/` (issue 50): the store for the clients that speak it (macOS Finder, Windows
//! Explorer, GNOME Files, rclone, davfs2), on by default, `vaultfs serve --no-webdav` to turn
//! off. The protocol (XML, PROPFIND, conditional headers, LOCK) is the `dav-server` crate's;
//! what is under it is ours ([`fs`]): each account a collection, its vaults and folders below,
//! files by name, every call one of the local backend scoped to the caller's account, as the
//! API's handlers make them.
//!
//! - **Authentication**: HTTP Basic with the e-mail and an app password, one per device
//!   (`vaultfs user app-password add`: Finder and Explorer cannot run the pin flow), or a token
//!   of the API; failures under the lockout of sign-ins. A client that sends none is asked
//!   (`WWW-Authenticate: Basic`), which every WebDAV client answers.
//! - **Not over plain HTTP** from another machine: Basic sends the secret in clear, so `/dav/`
//!   answers only a client on this machine (loopback), one behind a trusted proxy that says it
//!   got the request over HTTPS (`--trusted-proxy`, `X-Forwarded-Proto: https` or `Forwarded:
//!   proto=https`), or anyone when the operator says so (`--webdav-allow-http`).
//! - **ETags** are the files' versions (their md5), and an `If-Match` is checked by the store
//!   inside the commit of the upload (docs/design.md §5): a stale one is 412 and changes nothing,
//!   also when the other version came in between dav-server's own check and the commit.
//! - **A PUT without preconditions** (no `If-Match`, `If-None-Match`, `If` or
//!   `If-Unmodified-Since`) over a version its device was never shown keeps both
//!   (`store::seen`): the version stays at the name, the bytes become a conflict copy beside it,
//!   and the PUT answers `201 Created` with the copy's `Location`. What each device was shown is
//!   noted as it is answered ([`fs`]); the device is the app password (or token) signed in with.
//! - **Limits** as for the API: a GET or PUT holds one of the user's transfer slots (503 beyond),
//!   bodies are idle-limited like every request's, the store checks sizes and quotas.
//! - **Locks** are held by the store ([`locks`]): every server of one PostgreSQL sees them, and
//!   they are let go of when they expire.
//!
//! Not in `/openapi.json`: WebDAV is its own protocol with its own methods (PROPFIND, MKCOL,
//! LOCK...), which OpenAPI cannot describe (docs/design.md §4).

mod caller;
mod fs;
mod handles;
mod locks;
mod meta;

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use dav_server::DavHandler;
use dav_server::davpath::DavPath;
use futures_util::TryStreamExt;

use super::AppState;
use super::conn::Peer;
use crate::api::{Base, Error, ErrorKind, NodePath};
use crate::backend::local::LocalBackend;
use crate::store::seen::Device;
pub use caller::DavCaller;

/// Where WebDAV is served.
pub const PREFIX: &str = "/dav";

/// The realm clients show when they ask for a password.
const REALM: &str = "Basic realm=\"vaultfs\", charset=\"UTF-8\"";

/// The routes of `/dav` (merged into the server's router unless `--no-webdav`).
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/dav", any(handle))
        .route("/dav/", any(handle))
        .route("/dav/{*rest}", any(handle))
}

/// The WebDAV handler, built once: the file system and the lock system over the store.
pub(super) fn handler(store: std::sync::Arc<crate::store::Store>) -> DavHandler<DavCaller> {
    DavHandler::builder()
        .strip_prefix(PREFIX)
        .filesystem(Box::new(fs::StoreFs))
        .locksystem(locks::StoreLs::new(store))
        .build_handler()
}

/// What dav-server does not tell its file system but ours needs: the request as a whole.
pub struct Request {
    method: Method,
    /// The request's path in the store.
    path: Option<NodePath>,
    /// A COPY's or MOVE's destination.
    dest: Option<NodePath>,
    /// `Overwrite` (T unless F).
    overwrite: bool,
    /// `Depth` is infinity (or absent).
    infinite: bool,
    /// What a PUT replaces, from `If-Match` / `If-None-Match`.
    base: Base,
    /// No precondition (`If-Match`, `If-None-Match`, `If`, `If-Unmodified-Since`): a PUT keeps
    /// both over a version its device was never shown.
    unconditional: bool,
    /// Where a PUT's bytes went instead: the conflict copy made beside its file.
    kept_as: Mutex<Option<NodePath>>,
    /// The whole tree of a COPY was copied by the store.
    copied: AtomicBool,
    /// The last error of the store in this request, for the statuses dav-server cannot give.
    failed: Mutex<Option<Error>>,
}

impl Request {
    fn of(method: &Method, headers: &HeaderMap, path: &str) -> Request {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let store_path = |p: &str| {
            let mut d = DavPath::new(p).ok()?;
            d.set_prefix(PREFIX).ok()?;
            caller::node_path(&d).ok()
        };
        let dest = header("destination").and_then(|d| {
            let path = match d.parse::<axum::http::Uri>() {
                Ok(uri) => uri.path().to_string(),
                Err(_) => d.to_string(),
            };
            store_path(&path)
        });
        Request {
            method: method.clone(),
            path: store_path(path),
            dest,
            overwrite: !header("overwrite").is_some_and(|o| o.trim().eq_ignore_ascii_case("f")),
            infinite: header("depth").is_none_or(|d| d.trim().eq_ignore_ascii_case("infinity")),
            base: base_of(header("if-match"), header("if-none-match")),
            unconditional: ["if-match", "if-none-match", "if", "if-unmodified-since"]
                .iter()
                .all(|h| !headers.contains_key(*h)),
            kept_as: Mutex::new(None),
            copied: AtomicBool::new(false),
            failed: Mutex::new(None),
        }
    }

    fn is(&self, method: &str) -> bool {
        self.method.as_str() == method
    }

    /// The tree under `p` is deleted or copied whole by the store: dav-server's walk of it,
    /// which would do it node by node, sees it empty.
    fn walk_cut_short(&self, p: &NodePath) -> bool {
        let under = |top: &Option<NodePath>| top.as_ref().is_some_and(|t| t.contains(p));
        (self.is("DELETE") && self.infinite && under(&self.path))
            || ((self.is("COPY") || self.is("MOVE")) && self.overwrite && under(&self.dest))
            || (self.copied.load(Ordering::Acquire) && under(&self.path))
    }

    /// `p` is the destination of a COPY to infinite depth of a folder: the source to copy.
    fn whole_tree_copy(&self, p: &NodePath) -> Option<NodePath> {
        (self.is("COPY") && self.infinite && self.dest.as_ref() == Some(p))
            .then(|| self.path.clone())
            .flatten()
    }

    /// `p` is the file an overwriting COPY or MOVE replaces.
    fn replaces(&self, p: &NodePath) -> bool {
        (self.is("COPY") || self.is("MOVE")) && self.overwrite && self.dest.as_ref() == Some(p)
    }
}

/// The version a PUT replaces: `If-Match` with one ETag (a version's md5), `If-None-Match: *`
/// (a new name). Anything else is left to dav-server's own check (`Base::Any` here).
fn base_of(if_match: Option<&str>, if_none_match: Option<&str>) -> Base {
    if if_none_match.is_some_and(|v| v.trim() == "*") {
        return Base::Absent;
    }
    let Some(tags) = if_match else {
        return Base::Any;
    };
    let tags: Vec<&str> = tags.split(',').map(str::trim).collect();
    match tags.as_slice() {
        [tag] if *tag != "*" => {
            let tag = tag.strip_prefix("W/").unwrap_or(tag).trim_matches('"');
            if tag.len() == 32 && tag.bytes().all(|b| b.is_ascii_hexdigit()) {
                Base::Md5(tag.to_ascii_lowercase())
            } else {
                // No version of ours has that tag: nothing can match it.
                Base::Md5(String::new())
            }
        }
        _ => Base::Any,
    }
}

/// Whether Basic may be asked for on this request: the client is on this machine, or behind a
/// trusted proxy that got it over HTTPS, or the operator allowed plain HTTP.
fn transport_allowed(state: &AppState, peer: Option<Peer>, headers: &HeaderMap) -> bool {
    if state.options.webdav_allow_http {
        return true;
    }
    // Without a connection (the router called in process) there is no network to protect.
    let Some(peer) = peer else { return true };
    if peer.is_loopback() {
        return true;
    }
    let from_proxy = |ip: IpAddr| {
        state
            .options
            .trusted_proxies
            .iter()
            .any(|c| c.contains(ip.to_canonical()))
    };
    from_proxy(peer.remote.ip()) && forwarded_https(headers)
}

/// The proxy says the client's request came over HTTPS (`X-Forwarded-Proto` or `Forwarded`'s
/// `proto`; the last hop's, which is the trusted proxy's own).
fn forwarded_https(headers: &HeaderMap) -> bool {
    super::proxy::forwarded_proto(headers).as_deref() == Some("https")
}

fn text(status: StatusCode, msg: &str) -> Response {
    let mut resp = (status, format!("{msg}\n")).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// 401 asking for Basic credentials.
fn challenge(msg: &str) -> Response {
    let mut resp = text(StatusCode::UNAUTHORIZED, msg);
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
    resp
}

/// An error of ours as a plain answer (the status of its kind; 503 with `Retry-After`).
fn failure(e: &Error) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if e.kind == ErrorKind::Auth {
        return challenge(&e.message);
    }
    let msg = if e.kind == ErrorKind::Server {
        log::error!("webdav: {e}");
        super::reply::INTERNAL_ERROR_TEXT
    } else {
        &e.message
    };
    let mut resp = text(status, msg);
    if e.kind == ErrorKind::Unavailable {
        super::reply::retry_after(&mut resp);
    }
    resp
}

/// The caller of `Authorization: Basic email:secret`, the secret an app password (`vaultfs
/// user app-password add`) or a token of the API, checked under the lockout of sign-ins
/// (`Store::authenticate_dav`): the backend scoped to their account, their user ID, e-mail and
/// device (the secret's: an app password is a device, a token one sign-in).
async fn authenticate(
    state: &AppState,
    peer: Option<Peer>,
    headers: &HeaderMap,
) -> Result<(LocalBackend, i64, String, Device), Response> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(challenge(
            "sign in with your e-mail address and an app password",
        ));
    };
    let Some((email, secret)) = value.to_str().ok().and_then(super::auth::parse_basic) else {
        return Err(challenge("malformed Authorization header (expected Basic)"));
    };
    let device = crate::store::auth::dav_device(&secret);
    let principal = match state.store.remembered_dav(&email, &secret) {
        Some(p) => p,
        None => {
            let store = state.store.clone();
            let e2 = email.clone();
            let source = super::conn::Source(peer).key();
            tokio::task::spawn_blocking(move || store.authenticate_dav(&e2, &secret, &source))
                .await
                .map_err(|e| failure(&Error::internal(format!("auth task failed: {e}"))))?
                .map_err(|e| failure(&e))?
        }
    };
    Ok((
        LocalBackend::for_account(state.store.clone(), principal.account_id),
        principal.user_id,
        email,
        device,
    ))
}

/// Every answer of `/dav/`: WebDAV's own, not the API's envelope.
async fn handle(state: State<AppState>, req: axum::extract::Request) -> Response {
    let mut resp = serve(state, req).await;
    resp.extensions_mut().insert(super::context::OwnProtocol);
    resp
}

async fn serve(State(state): State<AppState>, req: axum::extract::Request) -> Response {
    let peer = req.extensions().get::<Peer>().copied();
    if !transport_allowed(&state, peer, req.headers()) {
        return text(
            StatusCode::FORBIDDEN,
            "WebDAV sends the password with every request: reach this server over HTTPS (a \
             proxy named by --trusted-proxy), or from this machine",
        );
    }
    let (backend, user_id, email, device) = match authenticate(&state, peer, req.headers()).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let transfer = matches!(req.method().as_str(), "GET" | "PUT");
    let slot = match transfer.then(|| state.limits.transfer(user_id)).transpose() {
        Ok(s) => s,
        Err(e) => return failure(&e),
    };
    let mut req = req;
    // dav-server answers a PROPFIND of infinite depth (a walk of the whole tree below, in one
    // answer) only to a request that says it is litmus's: nobody may say so here.
    req.headers_mut().remove("x-litmus");
    let request = std::sync::Arc::new(Request::of(req.method(), req.headers(), req.uri().path()));
    let caller = DavCaller {
        backend,
        device,
        request: request.clone(),
    };
    let resp = state.dav.handle_guarded(req, email, caller).await;
    let (mut parts, body) = resp.into_parts();
    // What dav-server has no status for: a version conflict found by the store's own check
    // (dav-server says 405 "exists"), a limit of ours (it says 500).
    if parts.status.as_u16() >= 400
        && let Some(e) = crate::sync::relock(&request.failed).take()
    {
        match e.kind {
            ErrorKind::Precondition | ErrorKind::TooManyRequests | ErrorKind::Unavailable => {
                return failure(&e);
            }
            _ => {}
        }
    }
    if parts.status == StatusCode::UNAUTHORIZED {
        parts
            .headers
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
    }
    let body = Body::new(body);
    let body = match slot {
        // Held until the answer's bytes are sent (a GET) or the upload stored (a PUT).
        Some(slot) => Body::from_stream(super::limits::holding(
            Box::pin(body.into_data_stream().map_err(super::limits::io_error)),
            slot,
        )),
        None => body,
    };
    if parts.status.is_success()
        && let Some(copy) = crate::sync::relock(&request.kept_as).take()
    {
        kept_beside(&mut parts, &copy);
    }
    let mut resp = Response::from_parts(parts, body);
    // A file's bytes are never a page of this site (an uploaded .html or .svg would run its
    // script here): an attachment, not sniffed, sandboxed, as the API's downloads.
    if matches!(request.method.as_str(), "GET" | "HEAD") && resp.status().is_success() {
        let name = request
            .path
            .as_ref()
            .and_then(|p| p.name())
            .unwrap_or("file");
        super::files::attachment(&mut resp, name);
    }
    resp
}

/// A PUT whose bytes became a conflict copy: `201 Created` at the copy's `Location`, without
/// the ETag and time of the copy, which are not the file's the PUT named.
fn kept_beside(parts: &mut axum::http::response::Parts, copy: &NodePath) {
    parts.status = StatusCode::CREATED;
    parts.headers.remove(header::ETAG);
    parts.headers.remove(header::LAST_MODIFIED);
    let at = copy.encoded()[crate::api::path::NODES_PREFIX.len()..].to_string();
    if let Ok(v) = HeaderValue::from_str(&format!("{PREFIX}{at}")) {
        parts.headers.insert(header::LOCATION, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_is_the_version() {
        let md5 = "0123456789abcdef0123456789ABCDEF";
        assert_eq!(
            base_of(Some(&format!("\"{md5}\"")), None),
            Base::Md5(md5.to_ascii_lowercase())
        );
        assert_eq!(
            base_of(Some(&format!("W/\"{md5}\"")), None),
            Base::Md5(md5.to_ascii_lowercase())
        );
        assert_eq!(base_of(Some("\"other\""), None), Base::Md5(String::new()));
        assert_eq!(base_of(Some("*"), None), Base::Any);
        assert_eq!(base_of(Some("\"a\", \"b\""), None), Base::Any);
        assert_eq!(base_of(None, Some("*")), Base::Absent);
        assert_eq!(base_of(None, None), Base::Any);
    }

    #[test]
    fn forwarded_over_https() {
        let mut h = HeaderMap::new();
        assert!(!forwarded_https(&h));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(forwarded_https(&h));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https, http"));
        assert!(!forwarded_https(&h));
        let mut h = HeaderMap::new();
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=192.0.2.1;proto=https"),
        );
        assert!(forwarded_https(&h));
    }
}
