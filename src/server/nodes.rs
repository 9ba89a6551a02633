//! `/nodes/pth/...` (get, list, create folder, upload step 1, copy/move, delete) and
//! `/nodes/upload/...` (upload steps 2 and 3).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::{HeaderMap, Uri, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::AppState;
use super::auth::Caller;
use super::openapi::{
    ErrorEnvelope, NodeEnvelope, PutNodeBody, SuccessEnvelope, TransferBody,
    VersionRequest as VersionBody, WholeTerms,
};
use super::reply::{ApiResult, ok, success};
use crate::api::path::NODES_PREFIX;
use crate::api::{
    Base, CreateFileRequest, Error, ErrorKind, NodePath, NodeType, Transfer, VersionRequest,
    parse_replace,
};
use crate::backend::Backend;

/// Children per page when `per_page` is not given, and the most a page may hold.
pub const MAX_PER_PAGE: u64 = 10_000;

/// The node path of the request line (percent-encoded segments after `/nodes/pth`), in NFC.
fn node_path(uri: &Uri) -> Result<NodePath, Error> {
    let rest = uri
        .path()
        .strip_prefix(NODES_PREFIX)
        .ok_or_else(|| Error::bad_path("not a /nodes/pth path"))?;
    NodePath::parse_encoded(rest)?.into_nfc()
}

/// A JSON body (an empty body reads as `{}`), with a clear error when it is not.
pub(super) fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, Error> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| Error::bad_request("bad_json", format!("invalid JSON body: {e}")))
}

fn flag(q: &HashMap<String, String>, name: &str) -> bool {
    q.get(name)
        .is_some_and(|v| !matches!(v.as_str(), "0" | "false"))
}

pub(super) fn number(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, Error> {
    q.get(name)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                Error::bad_request("bad_parameter", format!("`{name}` must be a whole number"))
            })
        })
        .transpose()
}

#[utoipa::path(
    get,
    path = "/nodes/pth/{*path}",
    tag = "nodes",
    operation_id = "get_node",
    summary = "A node by path; with `children=1` a container with a page of its children",
    params(
        ("path" = String, Path, description = "Account, vault, folders and name: percent-encoded UTF-8 segments joined by `/`", example = "Acme"),
        ("children" = Option<String>, Query, description = "Anything but `0`/`false`: list the direct children (paged)", example = "1"),
        ("page" = Option<u64>, Query, description = "Page of children, from 0", minimum = 0),
        ("per_page" = Option<u64>, Query, description = "Children per page (default and most: 10000)", minimum = 1, maximum = 10000),
        ("vprop" = Option<String>, Query, description = "Anything but `0`/`false`, on a file: its kept versions as `versions`, newest first (ids for `/files/id/Document/{id}/version/{version}`)", example = "1"),
        ("locks" = Option<String>, Query, description = "Anything but `0`/`false` (our extension): the WebDAV locks that hold the node, as `locks` (taken on it, or on a folder above it for its whole tree)", example = "1"),
        ("deleted" = Option<String>, Query, description = "Anything but `0`/`false`, on a vault or folder (our extension; with or without `children`): the files deleted from it and kept restorable, as `deleted`, most recently deleted first (restore one with `POST /files/id/Document/{id}/restore`)", example = "1"),
    ),
    responses(
        (status = 200, description = "The node", body = NodeEnvelope),
        (status = 400, description = "`bad_path` (empty, `.`/`..`, NUL or encoded `/` segment), `path_too_deep` (over 256 segments), `bad_parameter`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`: outside the caller's account", body = ErrorEnvelope),
        (status = 404, description = "`not_found`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn get(caller: Caller, uri: Uri, Query(q): Query<HashMap<String, String>>) -> ApiResult {
    let path = node_path(&uri)?;
    let mut node = if !flag(&q, "children") {
        let mut node = caller.backend.node(&path).await?;
        if flag(&q, "vprop") && node.is_file() {
            node.versions = Some(caller.backend.versions(&path).await?);
        }
        node
    } else {
        let page = number(&q, "page")?.unwrap_or(0);
        let per_page = number(&q, "per_page")?.unwrap_or(MAX_PER_PAGE);
        if per_page == 0 || per_page > MAX_PER_PAGE {
            return Err(Error::bad_request(
                "bad_parameter",
                format!("`per_page` must be 1 to {MAX_PER_PAGE}"),
            )
            .into());
        }
        caller.backend.list(&path, page, per_page).await?
    };
    let holds_files = matches!(
        node.node_type,
        NodeType::VaultNodeType | NodeType::FolderNodeType
    );
    if flag(&q, "locks") {
        node.locks = Some(caller.backend.locks(&path).await?);
    }
    if flag(&q, "deleted") && holds_files {
        node.deleted = Some(caller.backend.deleted_files(&path).await?);
    }
    Ok(ok(node))
}

/// PUT on a node path: upload step 1 (`create_file`) on a folder, or `{}` to create a folder;
/// with a binary body, a whole file (our extension: `whole`).
#[utoipa::path(
    put,
    path = "/nodes/pth/{*path}",
    tag = "nodes",
    operation_id = "put_node",
    summary = "`{}`: create the folder at this path; `{\"create_file\": [{\"name\"}]}`: upload step 1 in this folder; bytes (an extension of ours): the file at this path, made when absent, with a new version of these bytes (steps 1 to 3 in one request)",
    params(("path" = String, Path, description = "Percent-encoded UTF-8 segments joined by `/`", example = "Acme/My%20First%20Vault"),
        WholeTerms,
    ),
    request_body(content(
        (PutNodeBody = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    ), description = "JSON (an empty body counts as `{}`), or the file's bytes: exactly `Content-Length` of them"),
    responses(
        (status = 200, description = "The new folder, or the folder with the new (or existing) files as `children`; for bytes, the file with the new version current", body = NodeEnvelope),
        (status = 400, description = "`bad_path`, `path_too_deep`, `bad_json`, `bad_request`, `missing_parameter`, `bad_parameter`; bytes: `length_mismatch`, `checksum_mismatch` (the file keeps its previous content)", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`: outside the caller's account, or not allowed on an account", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: the parent folder (bytes under `vaultfs-if-match`: the file)", body = ErrorEnvelope),
        (status = 409, description = "A node of that name exists (folder), or a folder of that name (file)", body = ErrorEnvelope),
        (status = 412, description = "Bytes: `version_conflict`, the condition does not hold; the file keeps the other version", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`, `file_too_large`", body = ErrorEnvelope),
        (status = 503, description = "Bytes: `too_many_transfers` (`Retry-After`)", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`: the store's disk is full; `quota_exceeded`: the account holds the most files and folders, or bytes, allowed", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    uri: Uri,
    req: axum::extract::Request,
) -> ApiResult {
    let path = node_path(&uri)?;
    if super::whole::is_binary(req.headers()) {
        let (parts, body) = req.into_parts();
        return super::whole::file(&state, &caller, &path, &parts.headers, body).await;
    }
    match Bytes::from_request(req, &state).await {
        Ok(body) => put_json(caller, path, body).await,
        // Too large: the framework's answer, made an envelope like any (`context`).
        Err(rejection) => Ok(rejection.into_response()),
    }
}

/// A folder made, or upload step 1.
async fn put_json(caller: Caller, path: NodePath, body: Bytes) -> ApiResult {
    let value: serde_json::Value = parse_json(&body)?;
    let obj = value
        .as_object()
        .ok_or_else(|| Error::bad_request("bad_json", "the body must be a JSON object"))?;
    if obj.is_empty() {
        return Ok(ok(caller.backend.create_folder(&path).await?));
    }
    if !obj.contains_key("create_file") || obj.len() != 1 {
        return Err(Error::bad_request(
            "bad_request",
            "expected `{\"create_file\": [{\"name\": ...}]}` or `{}`",
        )
        .into());
    }
    let req: CreateFileRequest = serde_json::from_value(value).map_err(|e| {
        Error::bad_request(
            "bad_json",
            format!("`create_file` must be an array of {{\"name\"}}: {e}"),
        )
    })?;
    if req.create_file.is_empty() {
        return Err(Error::missing("create_file[].name").into());
    }
    let names: Vec<String> = req
        .create_file
        .into_iter()
        .map(|e| {
            e.name
                .filter(|n| !n.is_empty())
                .ok_or_else(|| Error::missing("create_file[].name"))
        })
        .collect::<Result<_, _>>()?;
    for n in &names {
        crate::api::path::validate_name(n)?;
    }
    // The folder object with the new files among its children (only those: a folder of
    // thousands is not listed again on every upload; `total_children` counts them all). A
    // name that is a folder fails the request (the others are made).
    let (mut folder, files) = caller.backend.create_files_in(&path, names).await?;
    folder.children = Some(files.into_iter().collect::<Result<_, _>>()?);
    Ok(ok(folder))
}

/// POST on a node path: `{"copy": {...}}` or `{"move": {...}}`.
#[utoipa::path(
    post,
    path = "/nodes/pth/{*path}",
    tag = "nodes",
    operation_id = "transfer_node",
    summary = "Copy or move the node at this path to `dst_uri`",
    params(("path" = String, Path, description = "Percent-encoded UTF-8 segments joined by `/`", example = "Acme/My%20First%20Vault/a.txt")),
    request_body(content = TransferBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The node at its destination", body = NodeEnvelope),
        (status = 400, description = "`bad_path`, `path_too_deep` (also when a node of the subtree would end up over 256 segments deep), `bad_json`, `bad_request`, `bad_parameter`, `missing_parameter`; a folder into itself", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`: source or destination outside the caller's account, or an account or vault", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: the source or the destination's folder", body = ErrorEnvelope),
        (status = 409, description = "The destination exists and `replace` is `fail`, or is of the other kind", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`; `too_many_nodes`: a copy of more nodes than one request may create", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`; `quota_exceeded`: the copy would take the account over its quota", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn post(caller: Caller, uri: Uri, body: Bytes) -> ApiResult {
    let src = node_path(&uri)?;
    let value: serde_json::Value = parse_json(&body)?;
    let obj = value
        .as_object()
        .ok_or_else(|| Error::bad_request("bad_json", "the body must be a JSON object"))?;
    let (op, inner) = match obj.iter().next() {
        Some((k, v)) if obj.len() == 1 && (k == "copy" || k == "move") => (k.clone(), v.clone()),
        _ => {
            return Err(Error::bad_request(
                "bad_request",
                "the body must have exactly one key, `copy` or `move`",
            )
            .into());
        }
    };
    let t: Transfer = serde_json::from_value(inner).map_err(|e| {
        Error::bad_request(
            "bad_json",
            format!("`{op}` must be {{\"dst_uri\", \"replace\"}}: {e}"),
        )
    })?;
    let dst_uri = t.dst_uri.ok_or_else(|| Error::missing("dst_uri"))?;
    let replace = t.replace.ok_or_else(|| Error::missing("replace"))?;
    let replace = parse_replace(&replace).ok_or_else(|| {
        Error::bad_request("bad_parameter", "`replace` must be `fail` or `replace`")
    })?;
    let dst = NodePath::parse_uri(&dst_uri)?.into_nfc()?;
    let node = if op == "copy" {
        caller.backend.copy(&src, &dst, replace).await?
    } else {
        caller.backend.rename(&src, &dst, replace).await?
    };
    Ok(ok(node))
}

#[utoipa::path(
    delete,
    path = "/nodes/pth/{*path}",
    tag = "nodes",
    operation_id = "delete_node",
    summary = "Delete a file, or a folder with everything under it",
    params(
        ("path" = String, Path, description = "Percent-encoded UTF-8 segments joined by `/`", example = "Acme/My%20First%20Vault/a.txt"),
        ("vaultfs-if-match" = Option<String>, Header, description = "An extension of ours: delete the file only while its current version has this md5 (hex or base64); else 412 `version_conflict` and nothing is deleted"),
        ("vaultfs-if-none-match" = Option<String>, Header, description = "An extension of ours: `*` deletes the file only while it holds no version (or an empty one)"),
    ),
    responses(
        (status = 200, description = "The default success object", body = SuccessEnvelope),
        (status = 400, description = "`bad_path`, `path_too_deep`, `bad_parameter`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`: outside the caller's account, or an account or vault", body = ErrorEnvelope),
        (status = 404, description = "`not_found`", body = ErrorEnvelope),
        (status = 412, description = "`version_conflict`: the file's current version is not the one the condition names", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn delete(caller: Caller, uri: Uri, headers: HeaderMap) -> ApiResult {
    let path = node_path(&uri)?;
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let base = crate::api::Base::from_delete_headers(
        header(crate::api::DELETE_IF_MATCH),
        header(crate::api::DELETE_IF_NONE_MATCH),
    )?;
    caller.backend.delete_if(&path, &base).await?;
    Ok(success())
}

// The same four methods on `/nodes/pth` itself (the root: the caller's accounts).

#[utoipa::path(
    get,
    path = "/nodes/pth",
    tag = "nodes",
    operation_id = "get_root",
    summary = "The root: with `children=1`, the accounts the caller may see",
    params(
        ("children" = Option<String>, Query, description = "Anything but `0`/`false`: list the accounts", example = "1"),
        ("page" = Option<u64>, Query, description = "Page of children, from 0", minimum = 0),
        ("per_page" = Option<u64>, Query, description = "Children per page (default and most: 10000)", minimum = 1, maximum = 10000),
    ),
    responses(
        (status = 200, description = "The root node", body = NodeEnvelope),
        (status = 400, description = "`bad_parameter`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn get_root(caller: Caller, uri: Uri, q: Query<HashMap<String, String>>) -> ApiResult {
    get(caller, uri, q).await
}

#[utoipa::path(
    put,
    path = "/nodes/pth",
    tag = "nodes",
    operation_id = "put_root",
    summary = "Nothing can be created at the root (accounts are made by the operator)",
    request_body(content = PutNodeBody, content_type = "application/json"),
    responses(
        (status = 400, description = "`bad_json`, `bad_request`, `missing_parameter`, `bad_path`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn put_root(caller: Caller, uri: Uri, body: Bytes) -> ApiResult {
    put_json(caller, node_path(&uri)?, body).await
}

#[utoipa::path(
    post,
    path = "/nodes/pth",
    tag = "nodes",
    operation_id = "transfer_root",
    summary = "The root cannot be copied or moved",
    request_body(content = TransferBody, content_type = "application/json"),
    responses(
        (status = 400, description = "`bad_json`, `bad_request`, `bad_parameter`, `missing_parameter`, `bad_path`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`", body = ErrorEnvelope),
        (status = 413, description = "`body_too_large`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn post_root(caller: Caller, uri: Uri, body: Bytes) -> ApiResult {
    post(caller, uri, body).await
}

#[utoipa::path(
    delete,
    path = "/nodes/pth",
    tag = "nodes",
    operation_id = "delete_root",
    summary = "The root cannot be deleted",
    responses(
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn delete_root(caller: Caller, uri: Uri, headers: HeaderMap) -> ApiResult {
    delete(caller, uri, headers).await
}

/// Upload step 2.
#[utoipa::path(
    put,
    path = "/nodes/upload/{id}",
    tag = "upload",
    operation_id = "begin_version",
    summary = "Upload step 2: announce a version of this length (and md5); without a length, set the file's modification time or mode; bytes (an extension of ours): steps 2 and 3 in one request",
    params(("id" = String, Path, description = "The file ID (from step 1)", example = "1"),
        WholeTerms,
    ),
    request_body(content(
        (VersionBody = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    ), description = "JSON, or (an extension of ours) the version's bytes, exactly `Content-Length` of them, with its terms as headers: steps 2 and 3 in one request"),
    responses(
        (status = 200, description = "The file, with `fileExProperties.upload_uri` for step 3; for bytes, the file with the new version current", body = NodeEnvelope),
        (status = 400, description = "`bad_json`, `missing_parameter`, `bad_parameter`; bytes: `length_mismatch`, `checksum_mismatch` (the file keeps its previous content)", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file (another account's file is not found either)", body = ErrorEnvelope),
        (status = 412, description = "`version_conflict`: `if_match`/`if_none_match` does not hold (another version is current)", body = ErrorEnvelope),
        (status = 413, description = "`file_too_large`, `body_too_large`", body = ErrorEnvelope),
        (status = 503, description = "Bytes: `too_many_transfers` (`Retry-After`)", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`; `quota_exceeded`: the version would take the account over its quota of bytes", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn begin_version(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    req: axum::extract::Request,
) -> ApiResult {
    if super::whole::is_binary(req.headers()) {
        let (parts, body) = req.into_parts();
        return super::whole::version(&state, &caller, &id, &parts.headers, body).await;
    }
    let body = match Bytes::from_request(req, &state).await {
        Ok(b) => b,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let req: VersionRequest = parse_json(&body)?;
    let attrs = req.attrs()?;
    let base = req.base()?;
    let Some(length) = req.length else {
        if base != Base::Any {
            return Err(Error::missing("length").into());
        }
        if attrs.is_empty() {
            return Err(Error::missing("length").into());
        }
        return Ok(ok(caller.backend.set_attrs(&id, attrs).await?));
    };
    Ok(ok(caller
        .backend
        .begin_version_with(&id, length, req.md5_checksum.as_deref(), attrs, &base)
        .await?))
}

/// Upload step 3: the raw bytes, streamed to the store.
#[utoipa::path(
    put,
    path = "/nodes/upload/{id}/{version}",
    tag = "upload",
    operation_id = "upload_bytes",
    summary = "Upload step 3: the bytes of the version announced in step 2",
    params(
        ("id" = String, Path, description = "The file ID", example = "1"),
        ("version" = String, Path, description = "The version ID of step 2's `upload_uri`", example = "1"),
    ),
    request_body(content(
        (Vec<u8> = "application/binary"),
        (Vec<u8> = "application/octet-stream"),
    ), description = "Exactly the announced length"),
    responses(
        (status = 200, description = "The file; the new version is current", body = NodeEnvelope),
        (status = 400, description = "`length_mismatch`, `checksum_mismatch`: the file keeps its previous content", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such file or pending version", body = ErrorEnvelope),
        (status = 409, description = "The version is no longer pending", body = ErrorEnvelope),
        (status = 412, description = "`version_conflict`: step 2's `if_match`/`if_none_match` no longer holds; the file keeps the other version", body = ErrorEnvelope),
        (status = 413, description = "`file_too_large`", body = ErrorEnvelope),
        (status = 415, description = "`unsupported_media_type`: not `application/binary`", body = ErrorEnvelope),
        (status = 503, description = "`too_many_transfers`: the user runs the most uploads and downloads allowed at once (`Retry-After`)", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`; `quota_exceeded`: the bytes would take the account over its quota", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    if !super::whole::is_binary(&headers) {
        return Err(Error::new(
            ErrorKind::UnsupportedMedia,
            "unsupported_media_type",
            "upload step 3 needs `Content-Type: application/binary`",
        )
        .into());
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Held until the upload ends, fails or its connection goes away.
    let _slot = state.limits.transfer(caller.user_id)?;
    super::whole::receive(&caller, &id, &version, length, body).await
}
