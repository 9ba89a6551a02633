//! Requests and retries, JSON answers and the envelope: what every call of the remote backend
//! goes through.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::Rng;
use reqwest::Method;
use reqwest::header::{self, HeaderMap};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::RemoteBackend;
use crate::api::checksum::md5_hex;
use crate::api::{Envelope, Error, ErrorKind, Node, RangeRequest, Result};

/// Statuses worth another attempt of an idempotent call.
pub(super) const RETRY_STATUSES: [u16; 4] = [500, 502, 503, 504];

pub(super) const JSON: &str = "application/json";

/// How a call may be repeated (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Retry {
    /// Repeating it has the effect of doing it once.
    Idempotent,
    /// Repeated only when the request surely did not reach the server.
    UnsentOnly,
}

/// One request of a JSON call or a download.
pub(super) struct Req {
    pub(super) method: Method,
    /// Encoded path and query, appended to the base URL.
    pub(super) path: String,
    pub(super) json: Option<Bytes>,
    pub(super) retry: Retry,
    pub(super) auth: bool,
    /// `application/json` for JSON calls (docs/design.md §2); anything for bytes.
    pub(super) accept: &'static str,
    pub(super) range: Option<RangeRequest>,
    /// More headers (our extensions; a server that does not know them ignores them).
    pub(super) headers: Vec<(&'static str, String)>,
    /// A long poll: sent on the connections kept for waits (`Inner::waits`).
    pub(super) waits: bool,
}

impl Req {
    pub(super) fn get(path: String) -> Req {
        Req {
            method: Method::GET,
            path,
            json: None,
            retry: Retry::Idempotent,
            auth: true,
            accept: JSON,
            range: None,
            headers: Vec::new(),
            waits: false,
        }
    }

    pub(super) fn with_body(
        method: Method,
        path: String,
        body: &impl Serialize,
        retry: Retry,
    ) -> Req {
        let json = serde_json::to_vec(body).expect("request bodies serialize");
        Req {
            method,
            path,
            json: Some(json.into()),
            retry,
            auth: true,
            accept: JSON,
            range: None,
            headers: Vec::new(),
            waits: false,
        }
    }

    pub(super) fn anonymous(mut self) -> Req {
        self.auth = false;
        self
    }

    pub(super) fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

pub(super) fn network(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Network, "network_error", message)
}

pub(super) fn bad_response(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Server, "bad_response", message)
}

/// A reqwest error with its causes ("connection refused" is in the source chain).
pub(super) fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}

/// An interface error inside a byte stream.
pub(super) fn stream_error(kind: io::ErrorKind, e: Error) -> io::Error {
    io::Error::new(kind, e)
}

/// The first characters of a body, on one line, for error messages.
pub(super) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decodes a JSON answer: the envelope decides success (`error.success`), then the message is
/// read as `T`. Anything else becomes a typed error that says what came back.
pub(super) fn decode<T: DeserializeOwned>(
    status: u16,
    ctype: &str,
    body: &[u8],
) -> Result<Option<T>> {
    let value: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Err(not_json(status, ctype, body, &e.to_string())),
    };
    if !value.get("error").is_some_and(serde_json::Value::is_object) {
        return Err(not_json(status, ctype, body, "no `error` object"));
    }
    let env: Envelope<serde_json::Value> = serde_json::from_value(value)
        .map_err(|e| not_json(status, ctype, body, &format!("malformed envelope: {e}")))?;
    match env.into_result(status)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
            bad_response(format!(
                "the server's answer does not have the expected fields: {e}"
            ))
        }),
    }
}

/// The error for an answer that is not the interface's JSON envelope.
pub(super) fn not_json(status: u16, ctype: &str, body: &[u8], why: &str) -> Error {
    let what = if ctype.starts_with("text/html") || body.trim_ascii_start().starts_with(b"<") {
        "an HTML page".to_string()
    } else if body.is_empty() {
        "an empty body".to_string()
    } else {
        format!(
            "something that is not the interface's JSON ({why}): {}",
            snippet(body)
        )
    };
    if status >= 300 {
        let kind = ErrorKind::from_status(status);
        return Error::new(
            kind,
            kind.default_code(),
            format!("the server answered {status} with {what}"),
        );
    }
    bad_response(format!("the server answered {status} with {what}"))
}

/// A node from the server, once its IDs are known to be harmless (see [`Node::check_ids`]).
/// Their md5s are made hex whichever spelling the server used (one it cannot read is dropped:
/// the cache then keys on the ID and size alone).
pub(super) fn checked(mut node: Node, what: &str) -> Result<Node> {
    node.check_ids()
        .map_err(|e| bad_response(format!("{what}: {}", e.message)))?;
    let mut todo = vec![&mut node];
    while let Some(n) = todo.pop() {
        n.md5_checksum = n.md5_checksum.as_deref().and_then(md5_hex);
        todo.extend(n.children.iter_mut().flatten());
    }
    Ok(node)
}

pub(super) fn required<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| bad_response(format!("the answer to {what} has no `message`")))
}

pub(super) fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

impl RemoteBackend {
    /// Delay before retry `attempt` (from 1): exponential, capped, with jitter in [50%, 100%] so
    /// that clients failing together do not come back together.
    pub(super) fn backoff(&self, attempt: u32) -> Duration {
        let c = &self.inner.config;
        let exp = c
            .backoff_base
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(c.backoff_max);
        exp.mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    /// Sends a request, retrying as its [`Retry`] allows; returns the response of the last
    /// attempt (possibly a 5xx), or a Network error.
    pub(super) async fn send(&self, req: &Req) -> Result<reqwest::Response> {
        let url = self.url(&req.path);
        let mut attempt = 0;
        loop {
            let http = match req.waits {
                true => &self.inner.waits,
                false => &self.inner.http,
            };
            let mut rb = http
                .request(req.method.clone(), &url)
                .header(header::ACCEPT, req.accept);
            if req.auth {
                if let Some(a) = self.auth() {
                    rb = rb.header(header::AUTHORIZATION, a);
                }
            }
            if let Some(body) = &req.json {
                rb = rb.header(header::CONTENT_TYPE, JSON).body(body.clone());
            }
            if let Some(r) = req.range {
                rb = rb.header(header::RANGE, r.to_string());
            }
            for (name, value) in &req.headers {
                rb = rb.header(*name, value);
            }
            let outcome = match rb.send().await {
                // A 5xx is read here: its code decides whether it is worth another attempt (the
                // public service sends "already exists" with 500).
                Ok(resp) if RETRY_STATUSES.contains(&resp.status().as_u16()) => {
                    Err(Err(self.failure(resp).await))
                }
                Ok(resp) => {
                    self.learn_extensions(resp.headers());
                    Ok(resp)
                }
                Err(e) => Err(Ok(e)),
            };
            let again = match &outcome {
                Ok(_) => false,
                Err(Err(e)) => {
                    req.retry == Retry::Idempotent
                        && matches!(
                            e.kind,
                            ErrorKind::Server | ErrorKind::Network | ErrorKind::Unavailable
                        )
                }
                Err(Ok(e)) => e.is_connect() || (req.retry == Retry::Idempotent && !e.is_builder()),
            };
            if !again || attempt >= self.inner.config.retries {
                return outcome.map_err(|e| match e {
                    Err(e) => e,
                    Ok(e) => network(format!(
                        "{} failed after {} attempt(s): {}",
                        req.what(),
                        attempt + 1,
                        describe(&e)
                    )),
                });
            }
            attempt += 1;
            let delay = self.backoff(attempt);
            match &outcome {
                Err(Err(e)) => log::debug!("{}: {e}, retry in {delay:?}", req.what()),
                Err(Ok(e)) => log::debug!("{}: {}, retry in {delay:?}", req.what(), describe(e)),
                Ok(_) => {}
            }
            drop(outcome);
            tokio::time::sleep(delay).await;
        }
    }

    /// The error an unsuccessful answer carries (its envelope read, or what came instead).
    pub(super) async fn failure(&self, resp: reqwest::Response) -> Error {
        let status = resp.status();
        match self.envelope::<serde_json::Value>(resp).await {
            Err(e) => e,
            Ok(_) => bad_response(format!("the server answered {status} and no content")),
        }
    }

    /// Runs `fut` within `total_timeout`.
    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let limit = self.inner.config.total_timeout;
        tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
            Err(network(format!(
                "{what}: no complete answer from {} within {limit:?}",
                self.inner.base
            )))
        })
    }

    /// Reads a whole (small) body, with the idle bound between chunks and a size bound.
    pub(super) async fn read_body(&self, resp: reqwest::Response) -> Result<Bytes> {
        self.read_bounded(resp, self.inner.config.max_json_response)
            .await
    }

    /// Reads a whole body of at most `limit` bytes, with the idle bound between chunks.
    pub(super) async fn read_bounded(
        &self,
        mut resp: reqwest::Response,
        limit: usize,
    ) -> Result<Bytes> {
        let c = &self.inner.config;
        let mut buf = BytesMut::new();
        loop {
            match tokio::time::timeout(c.idle_timeout, resp.chunk()).await {
                Err(_) => {
                    return Err(network(format!(
                        "the answer stalled: no byte for {:?}",
                        c.idle_timeout
                    )));
                }
                Ok(Err(e)) => {
                    return Err(network(format!(
                        "the connection broke while reading the answer: {}",
                        describe(&e)
                    )));
                }
                Ok(Ok(None)) => return Ok(buf.freeze()),
                Ok(Ok(Some(chunk))) => {
                    if buf.len() + chunk.len() > limit {
                        return Err(bad_response(format!(
                            "the answer is larger than {limit} bytes"
                        )));
                    }
                    buf.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// Reads and decodes the envelope of a response.
    pub(super) async fn envelope<T: DeserializeOwned>(
        &self,
        resp: reqwest::Response,
    ) -> Result<Option<T>> {
        let status = resp.status().as_u16();
        let ctype = header_str(resp.headers(), header::CONTENT_TYPE)
            .unwrap_or("")
            .to_ascii_lowercase();
        let body = self.read_body(resp).await?;
        decode(status, &ctype, &body)
    }

    /// A JSON call: request, retries, envelope, all within `total_timeout`.
    /// A refused token is tried once more when a newer login took its place.
    pub(super) async fn call<T: DeserializeOwned>(&self, req: Req) -> Result<Option<T>> {
        let what = req.what();
        let auth = req.auth;
        let once = || {
            self.bounded(&what, async {
                let resp = self.send(&req).await?;
                self.envelope(resp).await
            })
        };
        match once().await {
            Err(e) if auth && e.kind == ErrorKind::Auth && self.take_newer_login() => once().await,
            r => r,
        }
        .map_err(|e| self.with_hint(e, auth))
    }

    /// A JSON call whose answer must carry a message.
    pub(super) async fn call_message<T: DeserializeOwned>(&self, req: Req) -> Result<T> {
        let what = req.what();
        required(self.call(req).await?, &what)
    }

    /// A JSON call answered by a node (with its children): every ID in it is checked before
    /// anything uses it (a hostile server's `../../x` never reaches the mount).
    pub(super) async fn call_node(&self, req: Req) -> Result<Node> {
        let what = req.what();
        let node: Node = self.call_message(req).await?;
        checked(node, &what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_envelopes_and_garbage() {
        let ok: Option<Node> = decode(
            200,
            JSON,
            br#"{"error":{"success":true},"message":{"name":"a","extra":1}}"#,
        )
        .unwrap();
        assert_eq!(ok.unwrap().name, "a");
        let e = decode::<Node>(
            404,
            JSON,
            br#"{"error":{"success":false,"error_code":"not_found","error_text":"no such file"}}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_ref(), e.message.as_str()),
            (ErrorKind::NotFound, "not_found", "no such file")
        );
        // The public service's way of saying the token is bad.
        let e = decode::<Node>(
            400,
            JSON,
            br#"{"error":{"success":false,"error_code":"invalid_token"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Auth);
        // Its integer codes, as numbers or strings, decide before the status; its text is kept.
        let e = decode::<Node>(
            500,
            JSON,
            br#"{"error":{"success":false,"error_code":-1593835510,"error_text":"Object already exists","status_code":"500"}}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_ref(), e.number, e.message.as_str()),
            (
                ErrorKind::Conflict,
                "exists",
                Some(-1593835510),
                "Object already exists"
            )
        );
        let e = decode::<Node>(
            400,
            JSON,
            br#"{"error":{"success":false,"error_code":"-1593835519"}}"#,
        )
        .unwrap_err();
        assert_eq!((e.kind, e.number), (ErrorKind::Auth, Some(-1593835519)));
        assert!(e.message.contains("-1593835519"), "{}", e.message);
        let e = decode::<Node>(200, "text/html", b"<html><body>hi</body></html>").unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_ref()),
            (ErrorKind::Server, "bad_response")
        );
        assert!(e.message.contains("HTML"), "{}", e.message);
        let e =
            decode::<Node>(200, JSON, br#"{"error":{"success":true},"message":{"na"#).unwrap_err();
        assert_eq!(e.code, "bad_response");
        let e = decode::<Node>(
            200,
            JSON,
            br#"{"error":{"success":true},"message":{"size":"big"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, "bad_response");
        let e = decode::<Node>(502, "text/plain", b"Bad Gateway").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Network);
        let e = decode::<Node>(200, JSON, br#"[1,2]"#).unwrap_err();
        assert_eq!(e.code, "bad_response");
    }
}
