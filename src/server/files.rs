//! Downloads by document ID (with `Range`) and the three preview routes.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Caller;
use super::limits::holding;
use super::openapi::{ErrorEnvelope, NodeEnvelope, PreviewEnvelope};
use super::reply::{ApiResult, ok};
use crate::api::path::encode_segment;
use crate::api::{Error, ErrorKind, PageSize, RangeRequest};
use crate::backend::local::LocalBackend;
use crate::backend::{Backend, Download, PreviewImage};

/// A Content-Type from the file name; the bytes are served as they are whatever it says.
pub fn content_type(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "md" | "csv" | "rs" | "py" | "c" | "h" | "sh" | "toml" | "yaml" | "yml"
        | "ini" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "json" => "application/json",
        "xml" => "application/xml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "bmp" => "image/bmp",
        "tif" | "tiff" => "image/tiff",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "doc" => "application/msword",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xls" => "application/vnd.ms-excel",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        _ => "application/octet-stream",
    }
}

/// Streams a download with its headers: 200, or 206 with `Content-Range` for a range.
pub(super) fn send(d: Download, ctype: &str) -> Response {
    let len = d.len();
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(ctype)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(md5) = &d.node.md5_checksum {
        if let Ok(v) = HeaderValue::from_str(&format!("\"{md5}\"")) {
            h.insert(header::ETAG, v);
        }
    }
    // httpdate panics before 1970 (a time a client may set): no header for those.
    if let Some(t) = d
        .node
        .modified_time()
        .filter(|t| *t >= std::time::UNIX_EPOCH)
    {
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(t)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }
    let status = match d.range {
        Some((a, b)) => {
            let v = format!("bytes {a}-{b}/{}", d.total_size);
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&v).expect("ascii"),
            );
            StatusCode::PARTIAL_CONTENT
        }
        None => StatusCode::OK,
    };
    (status, h, Body::from_stream(d.body)).into_response()
}

/// `Content-Disposition` for `name`: the ASCII form for old browsers, the exact one in
/// `filename*` (RFC 6266).
pub(super) fn disposition(kind: &str, name: &str) -> HeaderValue {
    let plain: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let v = format!(
        "{kind}; filename=\"{plain}\"; filename*=UTF-8''{}",
        encode_segment(name)
    );
    HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("attachment"))
}

/// The headers of a file's bytes sent to a browser, whatever the file is: an attachment (saved,
/// not shown), never sniffed, and under a sandbox policy should it be opened anyway. An
/// uploaded HTML or SVG file would otherwise run its script as a page of this site. (The API's
/// download and the web interface's.)
pub(super) fn attachment(resp: &mut Response, name: &str) {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_DISPOSITION, disposition("attachment", name));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
}

#[utoipa::path(
    get,
    path = "/files/id/Document/{id}",
    tag = "files",
    operation_id = "download",
    summary = "The file's bytes, whole or one `Range: bytes=` range",
    params(
        ("id" = String, Path, description = "The file (document) ID", example = "1"),
        ("Range" = Option<String>, Header, description = "One range: `bytes=a-b`, `bytes=a-`, `bytes=-n`", example = "bytes=0-1023"),
    ),
    responses(
        (status = 200, description = "The bytes, with `ETag` (the md5), `Last-Modified`, `Accept-Ranges: bytes` and a Content-Type from the name; an attachment (`Content-Disposition`), `nosniff`, under `Content-Security-Policy: sandbox`", content_type = "*/*", body = Vec<u8>),
        (status = 206, description = "The range, with `Content-Range`", content_type = "*/*", body = Vec<u8>),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file (another account's file is not found either)", body = ErrorEnvelope),
        (status = 416, description = "`bad_range`: malformed, several ranges, or past the end", body = ErrorEnvelope),
        (status = 503, description = "`too_many_transfers`: the user runs the most uploads and downloads allowed at once (`Retry-After`)", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let d = download_of(&state, &caller.backend, caller.user_id, &id, &headers).await?;
    Ok(as_attachment(d))
}

/// The API's bytes of a file: a Content-Type from the name, but always an attachment under a
/// sandbox policy, never a page the browser shows (an uploaded `.html` or `.svg`).
fn as_attachment(d: Download) -> Response {
    let name = d.node.name.clone();
    let mut resp = send(d, content_type(&name));
    attachment(&mut resp, &name);
    resp
}

#[utoipa::path(
    get,
    path = "/files/id/Document/{id}/version/{version}",
    tag = "files",
    operation_id = "download_version",
    summary = "The bytes of one kept version of the file, or of a deleted file kept restorable (an extension of ours; ids from `vprop=1`), whole or one range",
    params(
        ("id" = String, Path, description = "The file (document) ID", example = "1"),
        ("version" = String, Path, description = "A `version_id` of the file's `versions`", example = "1"),
        ("Range" = Option<String>, Header, description = "One range: `bytes=a-b`, `bytes=a-`, `bytes=-n`", example = "bytes=0-1023"),
    ),
    responses(
        (status = 200, description = "The bytes, with `ETag` (that version's md5); an attachment, `nosniff`, under `Content-Security-Policy: sandbox`, as the current bytes are", content_type = "*/*", body = Vec<u8>),
        (status = 206, description = "The range, with `Content-Range`", content_type = "*/*", body = Vec<u8>),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file or kept version", body = ErrorEnvelope),
        (status = 416, description = "`bad_range`: malformed, several ranges, or past the end", body = ErrorEnvelope),
        (status = 503, description = "`too_many_transfers` (`Retry-After`)", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn download_version(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult {
    let d = version_of(
        &state,
        &caller.backend,
        caller.user_id,
        &id,
        &version,
        &headers,
    )
    .await?;
    Ok(as_attachment(d))
}

#[utoipa::path(
    post,
    path = "/files/id/Document/{id}/version/{version}/restore",
    tag = "files",
    operation_id = "restore_version",
    summary = "Make a kept version current again, as a new version (an extension of ours; ids from `vprop=1`)",
    description = "The bytes of `version` become the file's current version as a new version (its own `version_id`; the bytes are not copied), with the time of the restore as its modification time; the version it replaces stays among the kept versions, under the server's retention rule. Restoring the current version changes nothing. The change feed reports a `version` change.",
    params(
        ("id" = String, Path, description = "The file (document) ID", example = "1"),
        ("version" = String, Path, description = "A `version_id` of the file's `versions`", example = "1"),
    ),
    responses(
        (status = 200, description = "The file, the restored bytes current (their size and md5)", body = NodeEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file or kept version", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`; `quota_exceeded`: the new version would take the account over its quota of bytes", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn restore_version(
    caller: Caller,
    Path((id, version)): Path<(String, String)>,
) -> ApiResult {
    Ok(ok(caller.backend.restore_version(&id, &version).await?))
}

#[utoipa::path(
    post,
    path = "/files/id/Document/{id}/restore",
    tag = "files",
    operation_id = "restore_deleted",
    summary = "Bring a deleted file or folder back into its folder (an extension of ours; ids from `deleted=1`)",
    description = "The file goes back into the folder it was deleted from, with its ID and its kept versions, under its old name, or `NAME (restored YYYY-MM-DD HHMMSS).EXT` when a node has that name now. A folder (`folder: true` in `deleted`) comes back the same way with its tree, and with the entries under it deleted in the same run of deletes as it (`rm -rf` removes the files first, then the folders: each deleted within a minute of the next). Deleted files and folders are kept for the server's retention age (`--keep-versions-days`). The change feed reports a `created` change for the node restored.",
    params(("id" = String, Path, description = "The `id` of one of the folder's `deleted` files", example = "1")),
    responses(
        (status = 200, description = "The file, back in its folder", body = NodeEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such deleted file (restored already, pruned, another account's), or its folder is gone", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn restore_deleted(caller: Caller, Path(id): Path<String>) -> ApiResult {
    Ok(ok(caller.backend.restore_deleted(&id).await?))
}

/// The download of one kept version, holding a transfer slot as [`download_of`] does. (The
/// API's route and the web interface's.)
pub(super) async fn version_of(
    state: &AppState,
    backend: &LocalBackend,
    user: i64,
    id: &str,
    version: &str,
    headers: &HeaderMap,
) -> Result<Download, Error> {
    let range = range_of(headers)?;
    let slot = state.limits.transfer(user)?;
    let mut d = backend.download_version(id, version, range).await?;
    d.body = holding(d.body, slot);
    Ok(d)
}

/// The download of file `id` for `user`: whole, or the one range of the `Range` header; it
/// holds one of the user's transfer slots until its body is sent or dropped. (The API's route
/// and the web interface's download.)
pub(super) async fn download_of(
    state: &AppState,
    backend: &LocalBackend,
    user: i64,
    id: &str,
    headers: &HeaderMap,
) -> Result<Download, Error> {
    let range = range_of(headers)?;
    let slot = state.limits.transfer(user)?;
    let mut d = backend.download(id, range).await?;
    d.body = holding(d.body, slot);
    Ok(d)
}

/// The one range a request's `Range` header asks for.
fn range_of(headers: &HeaderMap) -> Result<Option<RangeRequest>, Error> {
    headers
        .get(header::RANGE)
        .map(|v| {
            v.to_str().map_err(|_| {
                Error::new(
                    ErrorKind::RangeNotSatisfiable,
                    "bad_range",
                    "unreadable Range header",
                )
            })
        })
        .transpose()?
        .map(RangeRequest::parse)
        .transpose()
}

/// The preview PDF of file `id` for `user`, holding a transfer slot as [`download_of`] does.
pub(super) async fn pdf_of(
    state: &AppState,
    backend: &LocalBackend,
    user: i64,
    id: &str,
) -> Result<Download, Error> {
    let slot = state.limits.transfer(user)?;
    let mut d = backend.preview_pdf(id).await?;
    d.body = holding(d.body, slot);
    Ok(d)
}

/// A preview page as a response, with its Content-Type.
pub(super) fn image(img: PreviewImage) -> Response {
    let mut resp = (StatusCode::OK, img.data).into_response();
    if let Ok(v) = HeaderValue::from_str(&img.content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

#[utoipa::path(
    get,
    path = "/preview/id/Document/{id}",
    tag = "previews",
    operation_id = "preview",
    summary = "Preview metadata: status, PDF and page images",
    params(("id" = String, Path, description = "The file (document) ID", example = "1")),
    responses(
        (status = 200, description = "The preview's status and pages", body = PreviewEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file (another account's file is not found either)", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn preview(caller: Caller, Path(id): Path<String>) -> ApiResult {
    Ok(ok(caller.backend.preview(&id).await?))
}

fn bounded(q: &HashMap<String, String>, name: &str, max: u32) -> Result<Option<u32>, Error> {
    q.get(name)
        .map(|v| {
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    Error::bad_request(
                        "bad_parameter",
                        format!("`{name}` must be a whole number from 1 to {max}"),
                    )
                })
        })
        .transpose()
}

#[utoipa::path(
    get,
    path = "/preview/id/Document/{id}/{page}",
    tag = "previews",
    operation_id = "preview_page",
    summary = "A page image (PNG), or the whole document as PDF (`pdf`)",
    params(
        ("id" = String, Path, description = "The file (document) ID", example = "1"),
        ("page" = String, Path, description = "A page number from 1, or `pdf`", example = "1"),
        ("scale" = Option<u32>, Query, description = "Percent, 1 to 100", minimum = 1, maximum = 100),
        ("max_width" = Option<u32>, Query, description = "Largest width in pixels", minimum = 1),
        ("max_height" = Option<u32>, Query, description = "Largest height in pixels", minimum = 1),
    ),
    responses(
        (status = 200, description = "The page image or the PDF", content_type = "*/*", body = Vec<u8>),
        (status = 400, description = "`bad_parameter`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`, `preview_not_supported`, or a page past the end", body = ErrorEnvelope),
        (status = 409, description = "`preview_not_ready`: still `InProgress`", body = ErrorEnvelope),
        (status = 503, description = "`too_many_transfers` (the PDF): the user runs the most uploads and downloads allowed at once (`Retry-After`)", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn preview_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, page)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    if page == "pdf" {
        let d = pdf_of(&state, &caller.backend, caller.user_id, &id).await?;
        return Ok(send(d, "application/pdf"));
    }
    let page = page_number(&page)?;
    let img = caller
        .backend
        .preview_page(&id, page, page_size(&q)?)
        .await?;
    Ok(image(img))
}

/// A page number of a preview route: a whole number from 1.
pub(super) fn page_number(page: &str) -> Result<u32, Error> {
    page.parse().ok().filter(|p| *p >= 1).ok_or_else(|| {
        Error::bad_request(
            "bad_parameter",
            "the page number must be a whole number from 1",
        )
    })
}

/// `scale`, `max_width` and `max_height` of a preview page request.
pub(super) fn page_size(q: &HashMap<String, String>) -> Result<PageSize, Error> {
    Ok(PageSize {
        scale: bounded(q, "scale", 100)?,
        max_width: bounded(q, "max_width", u32::MAX)?,
        max_height: bounded(q, "max_height", u32::MAX)?,
    })
}
