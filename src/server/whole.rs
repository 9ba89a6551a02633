//! Our extension: a file's bytes in one request, for a client far away. The interface stores a
//! file in three round trips (`create_file`, the version with its length and md5, the bytes);
//! a client that knows this server (`api::EXTENSIONS`) sends the bytes with the version's
//! terms instead, as a binary PUT:
//!
//! - on `/nodes/upload/{id}`: steps 2 and 3 of the file `id`;
//! - on `/nodes/pth/{path}`: steps 1 to 3 of the file at `path` (made when absent).
//!
//! The terms are headers: `Content-Length` (the exact length, required), `Content-MD5` (base64,
//! or hex), our condition `vaultfs-if-match` / `vaultfs-if-none-match` (as a DELETE's), and
//! `vaultfs-modified-on` / `vaultfs-mode` (as step 2's `modifiedOn` and `mode`). The store does
//! what the three steps do, in their order, and refuses what they refuse: a version whose bytes
//! are short, long or of another md5 is never current.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use futures_util::TryStreamExt;

use super::AppState;
use super::auth::Caller;
use super::reply::{ApiResult, ok};
use crate::api::{Base, Error, FileAttrs, Node, NodePath, parse_time};
use crate::backend::Backend;

/// Whether the body is bytes (an upload) rather than JSON.
pub(super) fn is_binary(headers: &HeaderMap) -> bool {
    let ctype = header_str(headers, header::CONTENT_TYPE.as_str()).unwrap_or("");
    let mime = ctype.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/binary")
        || mime.eq_ignore_ascii_case("application/octet-stream")
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The version's terms from the headers.
struct Terms {
    length: u64,
    md5: Option<String>,
    attrs: FileAttrs,
    base: Base,
}

impl Terms {
    fn of(headers: &HeaderMap) -> Result<Terms, Error> {
        let length = header_str(headers, header::CONTENT_LENGTH.as_str())
            .ok_or_else(|| Error::missing("Content-Length"))?
            .parse()
            .map_err(|_| Error::bad_request("bad_parameter", "`Content-Length` is not a length"))?;
        let md5 = match header_str(headers, "content-md5") {
            Some(m) => Some(crate::api::checksum::md5_hex(m).ok_or_else(|| {
                Error::bad_request(
                    "bad_checksum",
                    format!("`Content-MD5`: `{m}` is not an md5"),
                )
            })?),
            None => None,
        };
        let modified = match header_str(headers, crate::api::MODIFIED_ON) {
            Some(t) => Some(parse_time(t).ok_or_else(|| {
                Error::bad_request(
                    "bad_parameter",
                    format!("`{}`: `{t}` is not a time", crate::api::MODIFIED_ON),
                )
            })?),
            None => None,
        };
        let mode = match header_str(headers, crate::api::MODE) {
            Some(m) => Some(m.parse().map_err(|_| {
                Error::bad_request(
                    "bad_parameter",
                    format!("`{}`: `{m}` is not a mode", crate::api::MODE),
                )
            })?),
            None => None,
        };
        let base = Base::from_delete_headers(
            header_str(headers, crate::api::DELETE_IF_MATCH),
            header_str(headers, crate::api::DELETE_IF_NONE_MATCH),
        )?;
        Ok(Terms {
            length,
            md5,
            attrs: FileAttrs { modified, mode },
            base,
        })
    }
}

/// Steps 2 and 3 of the file `id` in one request.
pub(super) async fn version(
    state: &AppState,
    caller: &Caller,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult {
    let terms = Terms::of(headers)?;
    store(state, caller, id, terms, body).await
}

/// Steps 1 to 3 of the file at `path` in one request: made when absent (never under a
/// condition on its bytes: `vaultfs-if-match` of a file that is not there is 404, not a new
/// empty file).
pub(super) async fn file(
    state: &AppState,
    caller: &Caller,
    path: &NodePath,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult {
    let terms = Terms::of(headers)?;
    let (Some(_), Some(name)) = (path.parent(), path.name()) else {
        return Err(Error::bad_path("a file's path is a folder and a name").into());
    };
    crate::api::path::validate_name(name)?;
    // Held until the upload ends, fails or its connection goes away (as step 3's).
    let _slot = state.limits.transfer(caller.user_id)?;
    let (ticket, made) = caller
        .backend
        .begin_version_at(
            path,
            terms.length,
            terms.md5.as_deref(),
            terms.attrs,
            &terms.base,
        )
        .await?;
    let stored = receive_for(caller, &ticket, terms.length, body).await;
    if stored.is_err() && made {
        // A request that failed leaves no file it made: taken away while still without bytes
        // (never another writer's version stored meanwhile).
        if let Err(e) = caller.backend.delete_if(path, &Base::Absent).await {
            log::debug!("{path}: the file a failed upload made stays: {e}");
        }
    }
    stored
}

async fn store(state: &AppState, caller: &Caller, id: &str, t: Terms, body: Body) -> ApiResult {
    let _slot = state.limits.transfer(caller.user_id)?;
    let ticket = caller
        .backend
        .begin_version_with(id, t.length, t.md5.as_deref(), t.attrs, &t.base)
        .await?;
    receive_for(caller, &ticket, t.length, body).await
}

/// The bytes of the pending version step 2 answered with (`ticket`).
async fn receive_for(caller: &Caller, ticket: &Node, length: u64, body: Body) -> ApiResult {
    let (Some(id), Some(version)) = (ticket.file_id(), ticket.version_id()) else {
        return Err(Error::internal("step 2 gave no version").into());
    };
    receive(caller, &id, &version, length, body).await
}

/// The bytes of a pending version, streamed to the store (step 3's, and the whole PUT's).
pub(super) async fn receive(
    caller: &Caller,
    id: &str,
    version: &str,
    length: u64,
    body: Body,
) -> ApiResult {
    // Already idle-limited, as every request body is (`conn::body_idle_limited`).
    let stream = Box::pin(body.into_data_stream().map_err(super::limits::io_error));
    Ok(ok(caller
        .backend
        .upload(id, version, length, stream)
        .await?))
}
