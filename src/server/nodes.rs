//! `/nodes/pth/...` (get, list, create folder, upload step 1, copy/move, delete) and
//! `/nodes/upload/...` (upload steps 2 and 3).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, Uri, header};
use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::de::DeserializeOwned;

use super::auth::Caller;
use super::reply::{ApiResult, ok, success};
use crate::api::path::NODES_PREFIX;
use crate::api::{
    CreateFileRequest, Error, ErrorKind, NodePath, Transfer, VersionRequest, parse_replace,
};
use crate::backend::Backend;

/// Children per page when `per_page` is not given, and the most a page may hold.
pub const MAX_PER_PAGE: u64 = 10_000;

/// The node path of the request line (percent-encoded segments after `/nodes/pth`).
fn node_path(uri: &Uri) -> Result<NodePath, Error> {
    let rest = uri
        .path()
        .strip_prefix(NODES_PREFIX)
        .ok_or_else(|| Error::bad_path("not a /nodes/pth path"))?;
    NodePath::parse_encoded(rest)
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

fn number(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, Error> {
    q.get(name)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                Error::bad_request("bad_parameter", format!("`{name}` must be a whole number"))
            })
        })
        .transpose()
}

pub async fn get(caller: Caller, uri: Uri, Query(q): Query<HashMap<String, String>>) -> ApiResult {
    let path = node_path(&uri)?;
    if !flag(&q, "children") {
        return Ok(ok(caller.backend.node(&path).await?));
    }
    let page = number(&q, "page")?.unwrap_or(0);
    let per_page = number(&q, "per_page")?.unwrap_or(MAX_PER_PAGE);
    if per_page == 0 || per_page > MAX_PER_PAGE {
        return Err(Error::bad_request(
            "bad_parameter",
            format!("`per_page` must be 1 to {MAX_PER_PAGE}"),
        )
        .into());
    }
    Ok(ok(caller.backend.list(&path, page, per_page).await?))
}

/// PUT on a node path: upload step 1 (`create_file`) on a folder, or `{}` to create a folder.
pub async fn put(caller: Caller, uri: Uri, body: Bytes) -> ApiResult {
    let path = node_path(&uri)?;
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
    let mut created = Vec::with_capacity(names.len());
    for n in &names {
        created.push(caller.backend.create_file(&path, n).await?);
    }
    // The folder object with the new files among its children (only those: a folder of
    // thousands is not listed again on every upload; `total_children` counts them all).
    let mut folder = caller.backend.list(&path, 0, 1).await?;
    folder.children = Some(created);
    Ok(ok(folder))
}

/// POST on a node path: `{"copy": {...}}` or `{"move": {...}}`.
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
    let dst = NodePath::parse_uri(&dst_uri)?;
    let node = if op == "copy" {
        caller.backend.copy(&src, &dst, replace).await?
    } else {
        caller.backend.rename(&src, &dst, replace).await?
    };
    Ok(ok(node))
}

pub async fn delete(caller: Caller, uri: Uri) -> ApiResult {
    let path = node_path(&uri)?;
    caller.backend.delete(&path).await?;
    Ok(success())
}

/// Upload step 2.
pub async fn begin_version(caller: Caller, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let req: VersionRequest = parse_json(&body)?;
    let length = req.length.ok_or_else(|| Error::missing("length"))?;
    Ok(ok(caller
        .backend
        .begin_version(&id, length, req.md5_checksum.as_deref())
        .await?))
}

/// Upload step 3: the raw bytes, streamed to the store.
pub async fn upload(
    caller: Caller,
    Path((id, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ctype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime != "application/binary" && mime != "application/octet-stream" {
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
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(ok(caller
        .backend
        .upload(&id, &version, length, Box::pin(stream))
        .await?))
}
