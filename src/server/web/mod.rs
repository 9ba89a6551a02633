//! The web interface of `vaultfs serve` (issue 16): pages for people behind the browser links
//! of every file, served by the server itself.
//!
//! **How a browser link gets a page while API clients keep their JSON.** The links of a file
//! object (`link_uri`, `preview_link_uri`, `download_link_uri`, built in `api::file_links`)
//! point at pages of this module, under `/web/`: `/web/file/{id}`, `/web/preview/{id}` and
//! `/web/download/{id}`, each still ending in `&id=<id>` (docs/design.md §2). The API routes are
//! untouched: they answer JSON (or bytes) to an `Authorization` header and nothing else, with
//! no content negotiation, so no API client can be handed a page, and `download_uri` stays the
//! API's download route. A person opening a link without a session is sent to the sign-in page
//! and back to the link afterwards (`session`).
//!
//! The pages are HTML rendered here (no build step), with one small script (uploads with
//! progress, drag and drop) and one stylesheet, both served from `/web/static/`: nothing is
//! fetched from elsewhere, and the policy of every page (`page::WEB_POLICY`) says so to the
//! browser. They are not API routes, so `/openapi.json` does not list them (schemathesis fuzzes
//! what it lists, with the API's Basic auth, which these pages do not take).

mod app_passwords;
mod browse;
mod documents;
mod live;
pub(super) mod page;
mod search;
mod session;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};

use super::AppState;
use crate::api::{Error, NodePath};
use page::{error_page, see_other};

/// The routes of the pages (merged into the server's router beside the API's).
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { see_other("/web/") }))
        .route("/web", get(|| async { see_other("/web/") }))
        .route("/web/", get(browse::root))
        .route("/web/browse/{*path}", get(browse::folder))
        .route("/web/signin", get(session::form).post(session::sign_in))
        .route("/web/signout", post(session::sign_out))
        .route(
            app_passwords::PAGE,
            get(app_passwords::list).post(app_passwords::add),
        )
        .route("/web/app-passwords/revoke", post(app_passwords::revoke))
        .route("/web/file/{id}", get(documents::file))
        .route("/web/preview/{id}", get(documents::preview))
        .route("/web/preview/{id}/{page}", get(documents::page))
        .route("/web/download/{id}", get(documents::download))
        .route(
            "/web/download/{id}/version/{version}",
            get(documents::download_version),
        )
        .route("/web/restore/{id}/{version}", post(documents::restore))
        .route("/web/deleted/{*path}", get(browse::deleted))
        .route("/web/undelete/{id}", post(browse::undelete))
        .route("/web/upload/{*folder}", post(documents::upload))
        .route("/web/folder/{*parent}", post(browse::new_folder))
        .route("/web/rename/{*path}", post(browse::rename))
        .route(
            "/web/delete/{*path}",
            get(browse::confirm_delete).post(browse::delete),
        )
        .route("/web/search", get(search::everywhere))
        .route("/web/search/{*path}", get(search::within))
        .route("/web/changes/{*folder}", get(live::changes))
        .route("/web/static/{name}", get(asset))
        .route("/web/{*rest}", any(not_found))
}

/// The node path of a page's address after `prefix` (percent-encoded segments, as the API's
/// paths are, parsed by the same code, in NFC).
fn web_path(uri: &Uri, prefix: &str) -> Result<NodePath, Error> {
    let rest = uri
        .path()
        .strip_prefix(prefix)
        .ok_or_else(|| Error::bad_path(format!("not a {prefix} address")))?;
    NodePath::parse_encoded(rest)?.into_nfc()
}

/// GET `/web/static/{name}`: the stylesheet and the script, compiled in.
async fn asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    let (body, ctype) = match name.as_str() {
        "style.css" => (include_str!("style.css"), "text/css; charset=utf-8"),
        "app.js" => (include_str!("app.js"), "text/javascript; charset=utf-8"),
        _ => return not_found().await,
    };
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    page::not_a_page(&mut resp, "max-age=3600");
    resp
}

/// Any other address under `/web/`: the 404 page.
async fn not_found() -> Response {
    error_page(&Error::not_found("no such page"), None)
}
