//! `GET /changes`: the change feed of the caller's account (an extension of ours), a long poll.
//!
//! **Why a long poll** (not server-sent events or a WebSocket): one plain GET with the
//! interface's envelope and Basic auth, which every HTTP client, proxy and load balancer
//! passes as it is; the cursor is in the request, so a client that lost its connection (a
//! server restart, another server of the cluster behind the balancer) goes on exactly where
//! it was, with nothing to resume on the server; and an idle client costs one open request per
//! `wait` (up to 60 s), which holds no thread: it sleeps on the store's wake-ups
//! (`store::changes`). Changes made meanwhile wait in the log, so none falls between two polls.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};

use super::AppState;
use super::auth::Caller;
use super::conn::Stopping;
use super::nodes::number;
use super::openapi::{ChangesEnvelope, ErrorEnvelope};
use super::reply::{ApiResult, ok};
use crate::api::{ChangesPage, Error};

/// The longest `wait`: under the idle timeouts of common proxies (60 s and more).
pub const MAX_WAIT_SECS: u64 = 55;
/// The most changes a page holds, and the default.
pub const MAX_LIMIT: u64 = 1000;

#[utoipa::path(
    get,
    path = "/changes",
    tag = "changes",
    operation_id = "get_changes",
    summary = "An extension of ours: what changed in the caller's account after `cursor`, oldest first; with `wait`, a long poll",
    description = "Without `cursor`: no changes and the cursor to follow from (ask with it next). \
        With `cursor`: the changes after it (created, version, attributes, deleted, moved, \
        copied; a folder's delete, move or copy is one change for the whole tree), at most \
        `limit`, and the cursor to ask with next; `more` says that more are waiting. When there \
        are none and `wait` is given, the answer waits until one comes or `wait` seconds have \
        passed (then no changes and the same cursor). A cursor older than the oldest change \
        kept (each account keeps the last 10,000 by default, none older than 7 days) or not \
        of this server is answered with `reset: true` and the current cursor: drop what is \
        cached, list again, and follow from there. A server without this route answers 404: \
        poll instead.",
    params(
        ("cursor" = Option<u64>, Query, description = "The `cursor` of the last answer", minimum = 0),
        ("wait" = Option<u64>, Query, description = "Seconds to wait for a change when there is none (0: answer at once, the default; at most 55)", minimum = 0, maximum = 55),
        ("limit" = Option<u64>, Query, description = "Changes per answer (default and most: 1000)", minimum = 1, maximum = 1000),
    ),
    responses(
        (status = 200, description = "The changes after the cursor (possibly none), or `reset`", body = ChangesEnvelope),
        (status = 400, description = "`bad_parameter`", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 503, description = "`too_many_waits`: the user holds the most long polls allowed at once (`Retry-After`)", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn changes(
    caller: Caller,
    State(state): State<AppState>,
    stopping: Stopping,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let cursor = number(&q, "cursor")?;
    let wait = number(&q, "wait")?.unwrap_or(0);
    if wait > MAX_WAIT_SECS {
        return Err(Error::bad_request(
            "bad_parameter",
            format!("`wait` must be 0 to {MAX_WAIT_SECS} seconds"),
        )
        .into());
    }
    let limit = number(&q, "limit")?.unwrap_or(MAX_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(Error::bad_request(
            "bad_parameter",
            format!("`limit` must be 1 to {MAX_LIMIT}"),
        )
        .into());
    }
    let wait = match cursor {
        Some(_) => Duration::from_secs(wait),
        None => Duration::ZERO,
    };
    // Counted while it waits (a page read at once needs no slot).
    let _slot = if wait.is_zero() {
        None
    } else {
        Some(state.limits.wait(caller.user_id)?)
    };
    let page = tokio::select! {
        page = caller.backend.changes_page(cursor, wait, limit) => page?,
        // The server is stopping: nothing came, ask again (elsewhere).
        () = stopping.stopped() => ChangesPage {
            cursor: cursor.unwrap_or_default(),
            ..Default::default()
        },
    };
    Ok(ok(page))
}
