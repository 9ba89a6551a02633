//! Turning results into HTTP responses: the envelope (built by `api::envelope`) as JSON with the
//! status of the error's kind.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::request_id::request_id;
use crate::api::{Envelope, Error, ErrorKind};

/// An interface error as a response: the error envelope with the request id.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

/// What a client is told about an internal error: the detail (a database's or the system's
/// text) goes to the log only, under the request id the client gets as `instance_guid`.
pub const INTERNAL_ERROR_TEXT: &str =
    "the server could not complete this request; its log has the details under this instance_guid";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let id = request_id();
        if self.0.kind == ErrorKind::Server {
            log::error!("{id} {}", self.0.message);
            let generic = Error::new(ErrorKind::Server, self.0.code, INTERNAL_ERROR_TEXT);
            return error_response(&generic, &id);
        }
        let mut resp = error_response(&self.0, &id);
        if self.0.kind == ErrorKind::Unavailable {
            retry_after(&mut resp);
        }
        resp
    }
}

/// `Retry-After` of a 503 (the server is at one of its limits: password checks, transfers).
pub const RETRY_AFTER_SECS: u64 = 2;

/// Says when to come back, on a 503 (an envelope or a page).
pub fn retry_after(resp: &mut Response) {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
}

pub fn error_response(err: &Error, id: &str) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, &Envelope::<()>::failure(err, id))
}

pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    // The web links of nodes absolute, against this request's base (`links`).
    let base = super::links::base();
    let bytes = crate::api::with_link_base(base.as_deref(), || serde_json::to_vec(body))
        .expect("wire types serialize");
    let mut resp = (status, bytes).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A success envelope carrying `message`.
pub fn ok<T: Serialize>(message: T) -> Response {
    json(StatusCode::OK, &Envelope::ok(message))
}

/// The default success object.
pub fn success() -> Response {
    json(StatusCode::OK, &crate::api::envelope::success())
}

pub type ApiResult = Result<Response, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A database's text never reaches the client; the request id does.
    #[test]
    fn internal_errors_say_nothing_of_their_cause() {
        let e = Error::internal("database error: too many levels of trigger recursion");
        let resp = ApiError(e).into_response();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body =
            futures_util::FutureExt::now_or_never(axum::body::to_bytes(resp.into_body(), 1 << 16))
                .unwrap()
                .unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(INTERNAL_ERROR_TEXT), "{text}");
        assert!(
            !text.contains("database") && !text.contains("trigger"),
            "{text}"
        );
    }

    #[test]
    fn unavailable_says_when_to_come_back() {
        let e = Error::new(ErrorKind::Unavailable, "busy", "busy");
        let resp = ApiError(e).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }
}
