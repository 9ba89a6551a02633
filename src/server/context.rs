//! Per-request context: a request id (kept by `request_id.rs`; in each error's `instance_guid`
//! and in the log line), an access log line, panics turned into 500s, and every error response
//! that did not come from our handlers (the framework's own rejections: body too large, wrong
//! method...) put into the error envelope.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::FutureExt;

use super::reply::{INTERNAL_ERROR_TEXT, error_response};
use super::request_id::{self, request_id};
use crate::api::{Error, ErrorKind};

/// In a response's extensions: it is another protocol's answer (WebDAV's, `server::dav`), to
/// be sent as it is, not put into the API's error envelope.
#[derive(Debug, Clone, Copy)]
pub struct OwnProtocol;

pub async fn request_context(req: Request, next: Next) -> Response {
    let id = format!("{:016x}", rand::random::<u64>());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let start = Instant::now();
    let resp = request_id::scope(id.clone(), async move {
        match AssertUnwindSafe(next.run(req)).catch_unwind().await {
            Ok(resp) => resp,
            Err(_) => error_response(
                &Error::internal("the server hit a bug handling this request"),
                &request_id(),
            ),
        }
    })
    .await;
    // A protocol's own answers (WebDAV's statuses and XML) are not the API's envelope.
    let mut resp = if resp.extensions().get::<OwnProtocol>().is_some() {
        resp
    } else {
        into_envelope(resp, &id).await
    };
    // What a client may count on beyond the interface (`api::EXTENSIONS`), on every answer:
    // known from the first one.
    resp.headers_mut().insert(
        crate::api::EXTENSIONS,
        axum::http::HeaderValue::from_static(crate::api::OUR_EXTENSIONS),
    );
    log::info!(
        "{id} {method} {path} {} {:.1}ms",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64() * 1e3
    );
    resp
}

/// Rewrites an error response that is neither our JSON envelope nor an HTML page.
async fn into_envelope(resp: Response, id: &str) -> Response {
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/json") || ctype.starts_with("text/html") {
        return resp;
    }
    // The framework's headers stay (`Connection: close` from `conn::body_idle_limited` on an
    // answer given before its body was read: lost, a pooling client reused the dropped
    // connection; `Allow` of a 405), but those of the body replaced.
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .filter(|s| !s.trim().is_empty());
    let (kind, code, default_text) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorKind::TooLarge,
            "body_too_large",
            "the request body is too large",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            ErrorKind::MethodNotAllowed,
            "method_not_allowed",
            "method not allowed on this route",
        ),
        StatusCode::NOT_FOUND => (ErrorKind::NotFound, "unknown_route", "no such route"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            ErrorKind::UnsupportedMedia,
            "unsupported_media_type",
            "unsupported content type",
        ),
        s if s.is_client_error() => (ErrorKind::BadRequest, "bad_request", "bad request"),
        _ => (ErrorKind::Server, "internal_error", INTERNAL_ERROR_TEXT),
    };
    // A server error's text stays in the log.
    let text = if kind == ErrorKind::Server {
        if let Some(t) = &text {
            log::error!("{id} {t}");
        }
        None
    } else {
        text
    };
    // The status becomes our kind's (a 422 of the framework is a 400 here), so the HTTP status
    // and `status_code` always agree.
    let mut resp = error_response(
        &Error::new(kind, code, text.unwrap_or_else(|| default_text.to_string())),
        id,
    );
    for (name, value) in &parts.headers {
        resp.headers_mut().append(name, value.clone());
    }
    resp
}
