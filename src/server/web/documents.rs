//! The pages of one file, addressed by its ID as the browser links are (`link_uri`: the file,
//! `preview_link_uri`: its preview, `download_link_uri`: its bytes), the preview's images and
//! PDF, and uploads into a folder.
//!
//! A file ID the person cannot see gives the 403 page, whether it is another account's file or
//! no file at all: the store answers both the same on purpose (IDs are sequential; telling them
//! apart would let anyone count other accounts' files), and for a shared link "not yours" is
//! the likely reason.

use std::collections::HashMap;

use axum::Form;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;

use super::super::AppState;
use super::super::files::{
    attachment, content_type, disposition, download_of, image, page_number, page_size, pdf_of,
    send, version_of,
};
use super::super::reply::{ApiError, ApiResult, ok};
use super::page::{escape, not_a_page, path_href, see_other, size, time, time_seconds};
use super::session::WebUser;
use super::web_path;
use crate::api::path::encode_segment;
use crate::api::{Base, Error, ErrorKind, Lock, Node, NodePath, PreviewStatus, Version};
use crate::backend::{Backend, Download};

/// Widest page image of the preview page, and of its thumbnails (pixels; the browser scales
/// them down further on a narrow screen).
const PAGE_WIDTH: u32 = 1200;
const THUMB_WIDTH: u32 = 160;
/// Someone's bytes: kept by no cache.
const PRIVATE: &str = "private, no-store";
/// The header the upload script sends the form token in.
const FORM_TOKEN_HEADER: &str = "x-form-token";

/// A lookup by ID: "not found" is the 403 of the module comment.
fn by_id(e: Error) -> Error {
    if e.kind == ErrorKind::NotFound {
        Error::forbidden("no file with this ID in your account")
    } else {
        e
    }
}

/// The file of `id`, with its folder's path.
async fn file_of(user: &WebUser, id: &str) -> Result<(Node, NodePath), Error> {
    let node = user.backend.file(id).await.map_err(by_id)?;
    let path = NodePath::parse_uri(&node.uri)?;
    Ok((node, path))
}

/// The buttons of a file's pages.
fn file_actions(node: &Node, preview: bool) -> String {
    let mut out = String::from("<p class=\"buttons\">");
    if let Some(d) = &node.download_link_uri {
        out.push_str(&format!(
            "<a class=\"button\" href=\"{}\" download>Download</a> ",
            escape(d)
        ));
    }
    let (label, other) = if preview {
        ("Details", &node.link_uri)
    } else {
        ("Preview", &node.preview_link_uri)
    };
    if let Some(h) = other {
        out.push_str(&format!(
            "<a class=\"button\" href=\"{}\">{label}</a>",
            escape(h)
        ));
    }
    out.push_str("</p>");
    out
}

/// GET `/web/file/{id}` (`link_uri`): what the file is, and what can be done with it.
pub async fn file(user: WebUser, Path(id): Path<String>) -> Response {
    let (node, path) = match file_of(&user, &id).await {
        Ok(found) => found,
        Err(e) => return user.error(&e),
    };
    // A backend without versions lists none (the page shows the file all the same).
    let versions = user.backend.versions(&path).await.unwrap_or_default();
    // Shown, not enforced here: a lock holds WebDAV clients back, nothing else.
    let locks = user.backend.locks(&path).await.unwrap_or_default();
    let token = escape(&user.form_token);
    let body = format!(
        "{actions}<dl class=\"facts\"><dt>Size</dt><dd>{size} ({bytes} bytes)</dd>\
         <dt>Modified</dt><dd>{modified}</dd><dt>Created</dt><dd>{created}</dd>\
         <dt>MD5</dt><dd><code>{md5}</code></dd>{locks}</dl>\
         <form class=\"rename\" method=\"post\" action=\"{rename}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
         <label for=\"new-name\">New name</label>\
         <input id=\"new-name\" name=\"name\" value=\"{name}\" required>\
         <button type=\"submit\">Rename</button></form>\
         <p><a class=\"button danger\" href=\"{delete}\">Delete…</a></p>{versions}",
        actions = file_actions(&node, false),
        versions = versions_section(&user, &id, &versions),
        locks = locks_facts(&locks),
        size = size(node.size.unwrap_or(0)),
        bytes = node.size.unwrap_or(0),
        modified = time(node.modified_on.as_deref()),
        created = time(node.created_on.as_deref()),
        md5 = escape(node.md5_checksum.as_deref().unwrap_or("")),
        rename = escape(&path_href("/web/rename", &path)),
        delete = escape(&path_href("/web/delete", &path)),
        name = escape(&node.name),
    );
    user.page(&node.name, path.parent().as_ref(), &body)
}

/// The WebDAV locks that hold a file (Finder, Word and other WebDAV clients lock what they
/// have open), as facts: who, from what, until when.
fn locks_facts(locks: &[Lock]) -> String {
    locks
        .iter()
        .map(|l| {
            let who = escape(l.by.as_deref().unwrap_or("someone"));
            let from = l
                .owner
                .as_deref()
                .filter(|o| Some(*o) != l.by.as_deref())
                .map(|o| format!(" ({})", escape(o)))
                .unwrap_or_default();
            let until = match &l.expires_on {
                Some(t) => format!(" until {}", time(Some(t))),
                None => String::new(),
            };
            format!(
                "<dt>Locked</dt><dd class=\"lock\">{} by {who}{from}{until}</dd>",
                if l.shared {
                    "Shared lock"
                } else {
                    "For editing"
                }
            )
        })
        .collect()
}

/// The kept versions of file `id` (newest first), each with its download and, but for the
/// current one, a form that makes it current again (a new version: the bytes it replaces stay
/// one of the versions).
fn versions_section(user: &WebUser, id: &str, versions: &[Version]) -> String {
    if versions.is_empty() {
        return String::new();
    }
    let token = escape(&user.form_token);
    let id_seg = encode_segment(id);
    let rows: String = versions
        .iter()
        .map(|v| {
            let vid = encode_segment(&v.version_id);
            let when = time_seconds(v.created_on.as_deref());
            let action = if v.current {
                "<span class=\"current\">Current</span>".to_string()
            } else {
                format!(
                    "<form class=\"restore\" method=\"post\" action=\"/web/restore/{id_seg}/{vid}\">\
                     <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
                     <button type=\"submit\" aria-label=\"Restore the version of {plain}\">Restore\
                     </button></form>",
                    plain = escape(v.created_on.as_deref().unwrap_or(""))
                )
            };
            format!(
                "<tr class=\"version{cur}\" data-version=\"{v_id}\"><td class=\"modified\">{when}</td>\
                 <td class=\"size\">{size}</td><td class=\"actions\">\
                 <a href=\"/web/download/{id_seg}/version/{vid}\" download>Download</a> {action}</td></tr>",
                cur = if v.current { " current" } else { "" },
                v_id = escape(&v.version_id),
                size = size(v.size),
            )
        })
        .collect();
    format!(
        "<section class=\"versions\" aria-labelledby=\"versions-title\">\
         <h2 id=\"versions-title\">Versions</h2><p class=\"note\">Restoring a version makes \
         its bytes current again; the bytes it replaces stay here as a version.</p>\
         <div class=\"table\"><table><thead><tr><th scope=\"col\">Saved</th>\
         <th scope=\"col\" class=\"size\">Size</th><th scope=\"col\" class=\"actions\">\
         <span class=\"visually-hidden\">Actions</span></th></tr></thead>\
         <tbody>{rows}</tbody></table></div></section>"
    )
}

/// GET `/web/preview/{id}` (`preview_link_uri`): the document page by page, with thumbnails;
/// while the preview is being made, a page that looks again every two seconds.
pub async fn preview(user: WebUser, Path(id): Path<String>) -> Response {
    let (node, path) = match file_of(&user, &id).await {
        Ok(found) => found,
        Err(e) => return user.error(&e),
    };
    let meta = match user.backend.preview(&id).await {
        Ok(m) => m,
        Err(e) => return user.error(&by_id(e)),
    };
    let base = format!("/web/preview/{}", encode_segment(&id));
    let actions = file_actions(&node, true);
    let body = match meta.status {
        PreviewStatus::InProgress => format!(
            "{actions}<p class=\"status\" role=\"status\">InProgress: the \
             preview is being made. This page looks again every two seconds.</p>"
        ),
        PreviewStatus::Ready => {
            let n = meta.pages.len();
            let mut thumbs = String::new();
            let mut pages = String::new();
            for p in &meta.pages {
                let k = p.page_number;
                let (w, h) = fit(p.width, p.height, PAGE_WIDTH);
                let (tw, th) = fit(p.width, p.height, THUMB_WIDTH);
                thumbs.push_str(&format!(
                    "<li><a href=\"#page-{k}\"><img src=\"{base}/{k}?max_width={THUMB_WIDTH}\" \
                     width=\"{tw}\" height=\"{th}\" alt=\"Page {k}\"></a></li>"
                ));
                pages.push_str(&format!(
                    "<figure id=\"page-{k}\"><img src=\"{base}/{k}?max_width={PAGE_WIDTH}\" \
                     width=\"{w}\" height=\"{h}\" loading=\"lazy\" alt=\"Page {k} of {n}\">\
                     <figcaption>Page {k} of {n}</figcaption></figure>"
                ));
            }
            format!(
                "{actions}<p><a href=\"{base}/pdf\">Open as PDF</a> ({n} page{s})</p>\
                 <nav aria-label=\"Pages\"><ol class=\"thumbs\">{thumbs}</ol></nav>\
                 <div class=\"pages\">{pages}</div>",
                s = if n == 1 { "" } else { "s" }
            )
        }
        PreviewStatus::TypeNotSupported => format!(
            "{actions}<p class=\"status\" role=\"status\">There is no preview for this kind of \
             file. Download it to open it.</p>"
        ),
    };
    let mut resp = user.page(&node.name, path.parent().as_ref(), &body);
    if meta.status == PreviewStatus::InProgress {
        // Every browser reloads on `Refresh`, script or not.
        resp.headers_mut()
            .insert("refresh", HeaderValue::from_static("2"));
    }
    resp
}

/// `width` x `height` scaled down (never up) to at most `max` wide.
fn fit(width: u32, height: u32, max: u32) -> (u32, u32) {
    if width <= max || width == 0 {
        return (width, height);
    }
    let h = (u64::from(height) * u64::from(max)).div_ceil(u64::from(width));
    (max, h.max(1) as u32)
}

/// GET `/web/download/{id}` (`download_link_uri`): the bytes as an attachment (ranges as the
/// API serves them). Never shown as a page of this site: an uploaded HTML or SVG file would
/// otherwise run its script with the person's session, so it is an attachment, in a sandbox,
/// never sniffed.
pub async fn download(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let d = download_of(&state, &user.backend, user.user_id, &id, &headers).await;
    as_attachment(&user, d)
}

/// A download's answer: the bytes as a private attachment that is never shown as a page; a
/// bad range in the API's words, any other error as the site's page.
fn as_attachment(user: &WebUser, d: Result<Download, Error>) -> Response {
    let d = match d {
        Ok(d) => d,
        Err(e) if e.kind == ErrorKind::RangeNotSatisfiable => return ApiError(e).into_response(),
        Err(e) => return user.error(&by_id(e)),
    };
    let name = d.node.name.clone();
    let mut resp = send(d, content_type(&name));
    not_a_page(&mut resp, PRIVATE);
    attachment(&mut resp, &name);
    resp
}

/// GET `/web/download/{id}/version/{version}`: the bytes of a kept version, as an attachment
/// under the same headers as the current bytes.
pub async fn download_version(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let d = version_of(&state, &user.backend, user.user_id, &id, &version, &headers).await;
    as_attachment(&user, d)
}

/// POST `/web/restore/{id}/{version}` (the file page's restore form): the version becomes
/// current again as a new version; back to the file's page.
pub async fn restore(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, version)): Path<(String, String)>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Some(refusal) = user.refuse_form(&state, &headers, f.get("csrf").map(String::as_str)) {
        return refusal;
    }
    match user.backend.restore_version(&id, &version).await {
        Ok(node) => see_other(node.link_uri.as_deref().unwrap_or("/web/")),
        Err(e) => user.error(&by_id(e)),
    }
}

/// GET `/web/preview/{id}/{page}`: a page image (`max_width` and the other sizes of the API's
/// route), or with `pdf` the whole document as PDF, shown in the browser.
pub async fn page(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, page)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let answer = async {
        if page == "pdf" {
            let d = pdf_of(&state, &user.backend, user.user_id, &id).await?;
            let name = format!("{}.pdf", d.node.name);
            let mut resp = send(d, "application/pdf");
            resp.headers_mut()
                .insert(header::CONTENT_DISPOSITION, disposition("inline", &name));
            return Ok(resp);
        }
        let img = user
            .backend
            .preview_page(&id, page_number(&page)?, page_size(&q)?)
            .await?;
        Ok::<_, Error>(image(img))
    };
    match answer.await {
        Ok(mut resp) => {
            not_a_page(&mut resp, PRIVATE);
            resp
        }
        Err(e) => user.error(&by_id(e)),
    }
}

/// POST `/web/upload/{folder}?name=...` (the page's upload script): the body is the file's
/// bytes, `Content-Length` long, the form token in `X-Form-Token`. Stored as the three upload
/// steps store it (the same backend calls: the file, created unless it exists; a version of
/// that length; the bytes, current once all arrived), so an existing file gets a new version.
/// The answer is the API's envelope (the script shows its `error_text`).
pub async fn upload(
    State(state): State<AppState>,
    user: WebUser,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> Response {
    let token = headers.get(FORM_TOKEN_HEADER).and_then(|v| v.to_str().ok());
    if let Some(refusal) = user.refuse_form(&state, &headers, token) {
        return refusal;
    }
    let stored: ApiResult = async {
        let folder = web_path(&uri, "/web/upload")?;
        let name = q
            .get("name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::missing("name"))?;
        let length: u64 = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::missing("Content-Length"))?;
        // Held until the upload ends, fails or its connection goes away.
        let _slot = state.limits.transfer(user.user_id)?;
        let path = folder.child(name)?;
        let new = match user.backend.node(&path).await {
            Ok(_) => false,
            Err(e) if e.kind == ErrorKind::NotFound => true,
            Err(e) => return Err(e.into()),
        };
        // A new file the quota cannot take is refused before it is made: no empty file is left
        // at the name (issue 47, item 11).
        if new {
            fits_quota(&user.backend.usage().await?, length)?;
        }
        let stored = store_upload(&user, &folder, name, length, body).await;
        if let (Err(_), true) = (&stored, new) {
            // Refused past step 1 (the quota taken meanwhile, the size limit, the connection
            // gone): the file this upload made goes again, unless someone wrote to it since.
            if let Err(e) = user.backend.delete_if(&path, &Base::Absent).await {
                log::debug!("{path}: the empty file of a failed web upload stays: {e}");
            }
        }
        let node = stored?;
        log::info!(
            "{} uploaded {} ({length} bytes) on the web",
            user.email,
            node.uri
        );
        Ok(ok(node))
    }
    .await;
    stored.unwrap_or_else(IntoResponse::into_response)
}

/// 507 `quota_exceeded` when a new file of `length` bytes would take the account past its quota
/// (`GET /usage`'s counts, as the store checks them at upload step 2).
fn fits_quota(usage: &Option<crate::api::Usage>, length: u64) -> Result<(), Error> {
    let Some(u) = usage else { return Ok(()) };
    for (what, held, more, max) in [
        ("files and folders", u.nodes, 1, u.max_nodes),
        ("bytes", u.bytes, length, u.max_bytes),
    ] {
        if let Some(max) = max.filter(|&m| held.saturating_add(more) > m) {
            return Err(Error::new(
                ErrorKind::InsufficientStorage,
                "quota_exceeded",
                format!("your account holds {held} {what}; this server allows {max}"),
            ));
        }
    }
    Ok(())
}

/// The three upload steps of a web upload: the file (created unless it exists), a version of
/// `length` bytes, the bytes (current once all arrived).
async fn store_upload(
    user: &WebUser,
    folder: &NodePath,
    name: &str,
    length: u64,
    body: Body,
) -> Result<Node, Error> {
    let created = user
        .backend
        .create_file(folder, name)
        .await?
        .file_id()
        .ok_or_else(|| Error::internal("step 1 returned no file"))?;
    let version = user.backend.begin_version(&created, length, None).await?;
    let version_id = version
        .version_id()
        .ok_or_else(|| Error::internal("step 2 returned no version"))?;
    // Already idle-limited, as every request body is (`conn::body_idle_limited`).
    let stream = Box::pin(
        body.into_data_stream()
            .map_err(super::super::limits::io_error),
    );
    user.backend
        .upload(&created, &version_id, length, stream)
        .await
}
