//! `GET /search`: full-text search of the caller's account (an extension of ours; the store's
//! index, `store::search`). Hits are the caller's files only, checked as listings check them.

use std::collections::HashMap;

use axum::extract::{Query, State};

use super::AppState;
use super::auth::Caller;
use super::nodes::number;
use super::openapi::{ErrorEnvelope, SearchEnvelope};
use super::reply::{ApiResult, ok};
use crate::api::{Error, NodePath};

pub use crate::api::search::DEFAULT_LIMIT;

#[utoipa::path(
    get,
    path = "/search",
    tag = "search",
    operation_id = "search",
    summary = "An extension of ours: the caller's files whose text holds every word of `q`, best first",
    description = "Searches the text the server has indexed (text files: plain text, Markdown, \
        CSV, code; the text layer of PDFs), made in idle time after each version: a file \
        stored a moment ago may not be found yet. A file is found by its current version; its \
        path (`uri`) is where it is now. Words are matched whole, case and accents aside; \
        `word*` matches a prefix (built-in store). A search reads for 2 s at most: then it \
        answers the hits found so far, with `more: true`. A server without this route answers \
        404.",
    params(
        ("q" = String, Query, description = "The words to find, all of them: at most 32 different ones (the same word twice counts once) in at most 1024 bytes, no NUL"),
        ("path" = Option<String>, Query, description = "Only files under this folder (a decoded path, `/nodes/pth/...` or `/Account/Vault/...`)"),
        ("limit" = Option<u64>, Query, description = "Hits per answer (default 50, at most 1000)", minimum = 1, maximum = 1000),
    ),
    responses(
        (status = 200, description = "The files found (possibly none)", body = SearchEnvelope),
        (status = 400, description = "`bad_parameter`: no `q`, no words in it, more than 32 different words or 1024 bytes, a NUL; a bad `limit` or `path`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 403, description = "`forbidden`: `path` is outside the caller's account", body = ErrorEnvelope),
        (status = 404, description = "`not_found`: no such `path`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn search(
    caller: Caller,
    State(_state): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let words = q
        .get("q")
        .ok_or_else(|| Error::bad_request("bad_parameter", "`q` is required"))?;
    let limit = number(&q, "limit")?.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > crate::store::MAX_SEARCH_LIMIT {
        return Err(Error::bad_request("bad_parameter", "`limit` must be 1 to 1000").into());
    }
    let dir = match q.get("path").map(|p| p.trim()) {
        None | Some("") | Some("/") => NodePath::root(),
        Some(p) => NodePath::parse_uri(p)
            .or_else(|_| NodePath::from_segments(p.split('/').filter(|s| !s.is_empty())))?,
    };
    let found = caller.backend.search_in(&dir, words, limit).await?;
    Ok(ok(found))
}
