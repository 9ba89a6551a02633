//! `Authorization: Basic base64(email ":" token)` on every route but `/pin/*`.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine;

use super::AppState;
use super::reply::ApiError;
use crate::api::Error;
use crate::backend::local::LocalBackend;

/// The authenticated caller, as the backend limited to their account.
pub struct Caller {
    pub backend: LocalBackend,
    /// The user, for the limits per user.
    pub user_id: i64,
}

fn unauthorized(msg: &str) -> ApiError {
    ApiError(Error::auth("invalid_token", msg.to_string()))
}

/// Splits the header into (email, token).
pub(super) fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (email, token) = text.split_once(':')?;
    if email.is_empty() || token.is_empty() {
        return None;
    }
    Some((email.to_string(), token.to_string()))
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing Authorization header (Basic e-mail:token)"))?;
        let (email, token) = value.to_str().ok().and_then(parse_basic).ok_or_else(|| {
            unauthorized("malformed Authorization header (expected Basic e-mail:token)")
        })?;
        let principal = match state.store.remembered(&email, &token) {
            Some(p) => p,
            None => {
                let store = state.store.clone();
                tokio::task::spawn_blocking(move || store.authenticate(&email, &token))
                    .await
                    .map_err(|e| ApiError(Error::internal(format!("auth task failed: {e}"))))??
            }
        };
        let backend = LocalBackend::for_account(state.store.clone(), principal.account_id);
        Ok(Caller {
            backend,
            user_id: principal.user_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_basic;

    #[test]
    fn basic_header() {
        assert_eq!(
            parse_basic("Basic YUBiLmM6dG9r"),
            Some(("a@b.c".into(), "tok".into()))
        );
        assert_eq!(
            parse_basic("basic YUBiLmM6dG9r"),
            Some(("a@b.c".into(), "tok".into()))
        );
        assert_eq!(parse_basic("Bearer YUBiLmM6dG9r"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
        assert_eq!(parse_basic("Basic YUBiLmM="), None); // no colon
    }
}
