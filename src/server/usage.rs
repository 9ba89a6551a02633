//! `GET /usage`: what the caller's account holds and may hold (an extension of ours), so `df` on
//! a mount shows the account's quota rather than the disk under the mount's cache.

use axum::extract::State;

use super::AppState;
use super::auth::Caller;
use super::openapi::{ErrorEnvelope, UsageEnvelope};
use super::reply::{ApiResult, ok};
use crate::backend::Backend;

#[utoipa::path(
    get,
    path = "/usage",
    tag = "usage",
    operation_id = "usage",
    summary = "An extension of ours: the bytes and the files and folders the caller's account holds, and its quota of each",
    description = "Bytes count every version kept, and files deleted but kept restorable, as the \
        quota is checked (`quota_exceeded`). A quota this server does not set is absent. A \
        server without this route answers 404.",
    responses(
        (status = 200, description = "The account's use and quota", body = UsageEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn usage(caller: Caller, State(_state): State<AppState>) -> ApiResult {
    let held = caller.backend.usage().await?;
    Ok(ok(held.unwrap_or_default()))
}
