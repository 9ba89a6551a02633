//! `GET /healthz` for load balancers and monitors: 200 while the store's database answers and
//! its blobs (folder or bucket) are reachable, else 503. No authentication, no body to parse.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::openapi::{ErrorEnvelope, SuccessEnvelope};
use super::reply::{ApiError, json};
use crate::api::{Error, ErrorKind};

/// A check that takes longer than this counts as a failure: a probe must not hang on a stuck
/// database or bucket.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    operation_id = "healthz",
    summary = "Whether this server can serve: its database answers and its blobs are reachable",
    security(()),
    responses(
        (status = 200, description = "Healthy", body = SuccessEnvelope),
        (status = 503, description = "`unhealthy`: the database or the blob store is unreachable, or did not answer within 5 s (`Retry-After`)", body = ErrorEnvelope),
    ),
)]
pub async fn healthz(State(state): State<AppState>) -> Response {
    let store = state.store.clone();
    let check = tokio::task::spawn_blocking(move || store.health());
    let failure = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(Ok(()))) => {
            return json(StatusCode::OK, &crate::api::envelope::success());
        }
        Ok(Ok(Err(e))) => e.message,
        Ok(Err(e)) => format!("health check failed: {e}"),
        Err(_) => format!("health check took more than {CHECK_TIMEOUT:?}"),
    };
    // The detail is for the operator's log; the prober learns only that it failed.
    log::warn!("unhealthy: {failure}");
    ApiError(Error::new(
        ErrorKind::Unavailable,
        "unhealthy",
        "the database or the blob store is unreachable",
    ))
    .into_response()
}
