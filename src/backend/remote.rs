//! The backend over HTTP: the interface (spec §4, DESIGN.md §2) spoken to `vaultfs serve` or to
//! the public service, with one pooled client.
//!
//! Failure handling, decided once here:
//! - Every wait is bounded. JSON calls (with their retries) end within `total_timeout`; a
//!   download must produce its headers within `total_timeout` and then a byte at least every
//!   `idle_timeout` (its total time is unbounded, as its size is); an upload must make progress
//!   every `idle_timeout`. A dead server is [`ErrorKind::Network`], never a hang.
//! - Retries (exponential backoff with jitter, at most `retries`) follow what a repeat would do:
//!   calls that are idempotent on the server (GET, upload step 1, copy with `replace`) are
//!   retried on connection failures, time-outs and 500/502/503/504. The others (DELETE, move,
//!   folder creation, upload step 2, the token exchange) are retried only when the connection
//!   could not be established, i.e. the request surely never reached the server: a DELETE
//!   repeated after it succeeded answers 404, a step 2 repeated creates a second version, a
//!   move repeated fails. Upload step 3 is never retried here: the body stream can be sent only
//!   once; a repeated identical step 3 succeeds on our server, so the caller retries with a
//!   fresh stream.
//! - Bodies are checked: a download shorter or longer than its headers say, or (for whole reads)
//!   with another md5 than its ETag, ends its stream with an error, never with short data.
//!   Errors inside a [`ByteStream`] are `io::Error`s wrapping an [`api::Error`](Error).
//! - Answers that are not the interface's JSON (HTML, truncated, wrong types) are
//!   [`ErrorKind::Server`] with code `bad_response`.

use std::io;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use md5::{Digest, Md5};
use rand::Rng;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Backend, ByteStream, Download, PreviewImage};
use crate::api::path::encode_segment;
use crate::api::{
    Envelope, Error, ErrorKind, Node, NodePath, NodeType, PageSize, PinAuthResponse,
    PinEndResponse, PreviewMeta, RangeRequest, Result, VersionRequest, format_time,
};

/// Settings of a [`RemoteBackend`].
#[derive(Clone)]
pub struct RemoteConfig {
    /// `https://rest.smartvault.com` or `http://127.0.0.1:8080` (a path prefix is kept).
    pub base_url: String,
    /// The user's e-mail and delegation token; both empty for the pin exchange only.
    pub email: String,
    pub token: String,
    /// Time to establish a connection (TCP and TLS).
    pub connect_timeout: Duration,
    /// Longest wait for the next byte of an answer, or for an upload to make progress.
    pub idle_timeout: Duration,
    /// Bound on a whole JSON call, retries included, and on waiting for a download's headers.
    pub total_timeout: Duration,
    /// Retries after the first attempt (see the module documentation for which calls).
    pub retries: u32,
    /// First backoff delay; doubled each retry up to `backoff_max`, with jitter.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Largest JSON answer accepted, in bytes.
    pub max_json_response: usize,
}

impl RemoteConfig {
    pub fn new(base_url: &str, email: &str, token: &str) -> RemoteConfig {
        RemoteConfig {
            base_url: base_url.to_string(),
            email: email.to_string(),
            token: token.to_string(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            total_timeout: Duration::from_secs(60),
            retries: 3,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            max_json_response: 64 << 20,
        }
    }
}

// The token never appears in logs or panics.
impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("base_url", &self.base_url)
            .field("email", &self.email)
            .field("token", &"<redacted>")
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("total_timeout", &self.total_timeout)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// What a server said about `Range` support, learned from its answers.
const RANGES_UNKNOWN: u8 = 0;
const RANGES_YES: u8 = 1;
const RANGES_NO: u8 = 2;

/// Statuses worth another attempt of an idempotent call.
const RETRY_STATUSES: [u16; 4] = [500, 502, 503, 504];

const JSON: &str = "application/json";

#[derive(Clone)]
pub struct RemoteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    base: String,
    auth: Option<HeaderValue>,
    config: RemoteConfig,
    ranges: AtomicU8,
}

/// How a call may be repeated (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Retry {
    /// Repeating it has the effect of doing it once.
    Idempotent,
    /// Repeated only when the request surely did not reach the server.
    UnsentOnly,
}

/// One request of a JSON call or a download.
struct Req {
    method: Method,
    /// Encoded path and query, appended to the base URL.
    path: String,
    json: Option<Bytes>,
    retry: Retry,
    auth: bool,
    /// `application/json` for JSON calls (spec §4); anything for bytes.
    accept: &'static str,
    range: Option<RangeRequest>,
}

impl Req {
    fn get(path: String) -> Req {
        Req {
            method: Method::GET,
            path,
            json: None,
            retry: Retry::Idempotent,
            auth: true,
            accept: JSON,
            range: None,
        }
    }

    fn with_body(method: Method, path: String, body: &impl Serialize, retry: Retry) -> Req {
        let json = serde_json::to_vec(body).expect("request bodies serialize");
        Req {
            method,
            path,
            json: Some(json.into()),
            retry,
            auth: true,
            accept: JSON,
            range: None,
        }
    }

    fn anonymous(mut self) -> Req {
        self.auth = false;
        self
    }

    fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

fn network(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Network, "network_error", message)
}

fn bad_response(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Server, "bad_response", message)
}

/// A reqwest error with its causes ("connection refused" is in the source chain).
fn describe(e: &reqwest::Error) -> String {
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
fn stream_error(kind: io::ErrorKind, e: Error) -> io::Error {
    io::Error::new(kind, e)
}

/// The first characters of a body, on one line, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decodes a JSON answer: the envelope decides success (`error.success`), then the message is
/// read as `T`. Anything else becomes a typed error that says what came back.
fn decode<T: DeserializeOwned>(status: u16, ctype: &str, body: &[u8]) -> Result<Option<T>> {
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
fn not_json(status: u16, ctype: &str, body: &[u8], why: &str) -> Error {
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
        let kind = ErrorKind::from_status(status, None);
        return Error::new(
            kind,
            kind.default_code(),
            format!("the server answered {status} with {what}"),
        );
    }
    bad_response(format!("the server answered {status} with {what}"))
}

/// A node from the server, once its IDs are known to be harmless (see [`Node::check_ids`]).
fn checked(node: Node, what: &str) -> Result<Node> {
    node.check_ids()
        .map_err(|e| bad_response(format!("{what}: {}", e.message)))?;
    Ok(node)
}

fn required<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| bad_response(format!("the answer to {what} has no `message`")))
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// `bytes a-b/total` of a 206.
fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b, total) = (
        a.trim().parse().ok()?,
        b.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (a <= b && b < total).then_some((a, b, total))
}

/// The md5 in an ETag (`"hex"`), when it is one.
fn etag_md5(h: &HeaderMap) -> Option<String> {
    let v = header_str(h, header::ETAG)?;
    let v = v.trim().trim_start_matches("W/").trim_matches('"');
    (v.len() == 32 && v.bytes().all(|c| c.is_ascii_hexdigit())).then(|| v.to_ascii_lowercase())
}

/// The file as a download's headers describe it (the download route returns no JSON).
fn node_from_headers(file_id: &str, h: &HeaderMap, total: u64) -> Node {
    let name = header_str(h, header::CONTENT_DISPOSITION)
        .and_then(|v| v.split_once("filename=\""))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(name, _)| name.to_string())
        .unwrap_or_default();
    let modified_on = header_str(h, header::LAST_MODIFIED)
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .map(format_time);
    Node {
        name,
        id: Some(file_id.to_string()),
        node_type: NodeType::FileNodeType,
        size: Some(total),
        md5_checksum: etag_md5(h),
        modified_on,
        ..Default::default()
    }
}

impl RemoteBackend {
    pub fn new(config: RemoteConfig) -> Result<RemoteBackend> {
        let base = config.base_url.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::bad_request(
                "bad_url",
                format!("`{base}` is not an http:// or https:// URL"),
            ));
        }
        let auth = if config.email.is_empty() || config.token.is_empty() {
            None
        } else {
            use base64::Engine;
            let raw = format!("{}:{}", config.email, config.token);
            let value = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            );
            let mut v = HeaderValue::from_str(&value).map_err(|_| {
                Error::bad_request("bad_credentials", "the e-mail address is not valid here")
            })?;
            v.set_sensitive(true); // kept out of debug output
            Some(v)
        };
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.idle_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("vaultfs/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::internal(format!("cannot set up the HTTP client: {e}")))?;
        Ok(RemoteBackend {
            inner: Arc::new(Inner {
                http,
                base,
                auth,
                config,
                ranges: AtomicU8::new(RANGES_UNKNOWN),
            }),
        })
    }

    pub fn config(&self) -> &RemoteConfig {
        &self.inner.config
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// Whether the server is known to answer `Range` requests (`None`: not learned yet).
    pub fn supports_ranges(&self) -> Option<bool> {
        match self.inner.ranges.load(Ordering::Relaxed) {
            RANGES_YES => Some(true),
            RANGES_NO => Some(false),
            _ => None,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.inner.base, path)
    }

    /// Delay before retry `attempt` (from 1): exponential, capped, with jitter in [50%, 100%] so
    /// that clients failing together do not come back together.
    fn backoff(&self, attempt: u32) -> Duration {
        let c = &self.inner.config;
        let exp = c
            .backoff_base
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(c.backoff_max);
        exp.mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    /// Sends a request, retrying as its [`Retry`] allows; returns the response of the last
    /// attempt (possibly a 5xx), or a Network error.
    async fn send(&self, req: &Req) -> Result<reqwest::Response> {
        let url = self.url(&req.path);
        let mut attempt = 0;
        loop {
            let mut rb = self
                .inner
                .http
                .request(req.method.clone(), &url)
                .header(header::ACCEPT, req.accept);
            if req.auth {
                if let Some(a) = &self.inner.auth {
                    rb = rb.header(header::AUTHORIZATION, a.clone());
                }
            }
            if let Some(body) = &req.json {
                rb = rb.header(header::CONTENT_TYPE, JSON).body(body.clone());
            }
            if let Some(r) = req.range {
                rb = rb.header(header::RANGE, r.to_string());
            }
            let outcome = rb.send().await;
            let again = match &outcome {
                Ok(resp) => {
                    req.retry == Retry::Idempotent
                        && RETRY_STATUSES.contains(&resp.status().as_u16())
                }
                Err(e) => e.is_connect() || (req.retry == Retry::Idempotent && !e.is_builder()),
            };
            if !again || attempt >= self.inner.config.retries {
                return outcome.map_err(|e| {
                    network(format!(
                        "{} failed after {} attempt(s): {}",
                        req.what(),
                        attempt + 1,
                        describe(&e)
                    ))
                });
            }
            attempt += 1;
            let delay = self.backoff(attempt);
            match &outcome {
                Ok(resp) => log::debug!("{}: {}, retry in {delay:?}", req.what(), resp.status()),
                Err(e) => log::debug!("{}: {}, retry in {delay:?}", req.what(), describe(e)),
            }
            drop(outcome);
            tokio::time::sleep(delay).await;
        }
    }

    /// Runs `fut` within `total_timeout`.
    async fn bounded<T>(
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

    /// Adds what to do to an authentication failure of a logged-in call.
    fn with_hint(&self, mut e: Error, auth: bool) -> Error {
        if auth && e.kind == ErrorKind::Auth {
            e.message = format!(
                "{} (the login for {base} is not valid any more: run `vaultfs login --server {base} \
                 --email {email}` again)",
                e.message,
                base = self.inner.base,
                email = self.inner.config.email,
            );
        }
        e
    }

    /// Reads a whole (small) body, with the idle bound between chunks and a size bound.
    async fn read_body(&self, mut resp: reqwest::Response) -> Result<Bytes> {
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
                    if buf.len() + chunk.len() > c.max_json_response {
                        return Err(bad_response(format!(
                            "the answer is larger than {} bytes",
                            c.max_json_response
                        )));
                    }
                    buf.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// Reads and decodes the envelope of a response.
    async fn envelope<T: DeserializeOwned>(&self, resp: reqwest::Response) -> Result<Option<T>> {
        let status = resp.status().as_u16();
        let ctype = header_str(resp.headers(), header::CONTENT_TYPE)
            .unwrap_or("")
            .to_ascii_lowercase();
        let body = self.read_body(resp).await?;
        decode(status, &ctype, &body)
    }

    /// A JSON call: request, retries, envelope, all within `total_timeout`.
    async fn call<T: DeserializeOwned>(&self, req: Req) -> Result<Option<T>> {
        let what = req.what();
        let auth = req.auth;
        self.bounded(&what, async {
            let resp = self.send(&req).await?;
            self.envelope(resp).await
        })
        .await
        .map_err(|e| self.with_hint(e, auth))
    }

    /// A JSON call whose answer must carry a message.
    async fn call_message<T: DeserializeOwned>(&self, req: Req) -> Result<T> {
        let what = req.what();
        required(self.call(req).await?, &what)
    }

    /// A JSON call answered by a node (with its children): every ID in it is checked before
    /// anything uses it (a hostile server's `../../x` never reaches the mount).
    async fn call_node(&self, req: Req) -> Result<Node> {
        let what = req.what();
        let node: Node = self.call_message(req).await?;
        checked(node, &what)
    }

    /// `POST /pin/end`: the URL where the user authorizes `client_id` and is shown the pin.
    pub async fn pin_end(&self, client_id: &str) -> Result<String> {
        let body = serde_json::json!({ "client_id": client_id });
        let req = Req::with_body(Method::POST, "/pin/end".into(), &body, Retry::Idempotent);
        let r: PinEndResponse = self.call_message(req.anonymous()).await?;
        Ok(r.authorization_uri)
    }

    /// `POST /pin/auth`: exchanges the pin for a delegation token (not retried once sent: each
    /// exchange issues a token, and failures count towards the lockout).
    pub async fn pin_auth(
        &self,
        email: &str,
        client_id: &str,
        pin: &str,
    ) -> Result<PinAuthResponse> {
        let pin = pin.trim();
        // A number on the wire (spec §4.10), unless it would lose a leading zero.
        let pin_value = match pin.parse::<u64>() {
            Ok(n) if !pin.starts_with('0') => serde_json::json!(n),
            _ => serde_json::json!(pin),
        };
        let body = serde_json::json!({
            "user_email": email,
            "pin_info": { "client_id": client_id, "pin": pin_value },
        });
        let req = Req::with_body(Method::POST, "/pin/auth".into(), &body, Retry::UnsentOnly);
        self.call_message(req.anonymous()).await
    }

    /// GET of a download or a PDF: the stream, checked against its headers.
    async fn fetch(
        &self,
        path: String,
        file_id: &str,
        range: Option<RangeRequest>,
    ) -> Result<Download> {
        let known = self.inner.ranges.load(Ordering::Relaxed);
        let mut req = Req::get(path);
        req.accept = "*/*";
        // A server that does not know ranges ignores the header and sends everything, which is
        // handled below; once it is known not to, the header is left off.
        req.range = range.filter(|_| known != RANGES_NO);
        let what = req.what();
        let resp = self
            .bounded(&what, async {
                let resp = self.send(&req).await?;
                if matches!(resp.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT) {
                    return Ok(resp);
                }
                let status = resp.status();
                match self.envelope::<serde_json::Value>(resp).await {
                    Err(e) => Err(e),
                    Ok(_) => Err(bad_response(format!(
                        "{what}: the server answered {status} and no content"
                    ))),
                }
            })
            .await
            .map_err(|e| self.with_hint(e, true))?;
        let h = resp.headers().clone();
        match header_str(&h, header::ACCEPT_RANGES).map(str::trim) {
            Some(v) if v.eq_ignore_ascii_case("bytes") => {
                self.inner.ranges.store(RANGES_YES, Ordering::Relaxed)
            }
            Some(v) if v.eq_ignore_ascii_case("none") => {
                self.inner.ranges.store(RANGES_NO, Ordering::Relaxed)
            }
            _ => {}
        }
        let length: Option<u64> =
            header_str(&h, header::CONTENT_LENGTH).and_then(|v| v.trim().parse().ok());
        let idle = self.inner.config.idle_timeout;

        if resp.status() == StatusCode::PARTIAL_CONTENT {
            let Some(asked) = range else {
                return Err(bad_response(format!(
                    "{what}: a partial answer (206) to a request for the whole file"
                )));
            };
            let (a, b, total) = header_str(&h, header::CONTENT_RANGE)
                .and_then(parse_content_range)
                .ok_or_else(|| {
                    bad_response(format!("{what}: a 206 without a usable Content-Range"))
                })?;
            let (want_a, want_b) = asked.resolve(total)?;
            if a != want_a || b > want_b {
                return Err(bad_response(format!(
                    "{what}: the server sent bytes {a}-{b}, not the {want_a}-{want_b} asked for"
                )));
            }
            let len = b - a + 1;
            if length.is_some_and(|l| l != len) {
                return Err(bad_response(format!(
                    "{what}: Content-Length and Content-Range disagree"
                )));
            }
            let check = BodyCheck {
                expected: len,
                skip: 0,
                take: None,
                md5: None,
                idle,
            };
            return Ok(Download {
                node: node_from_headers(file_id, &h, total),
                total_size: total,
                range: Some((a, b)),
                body: checked_body(resp, check),
            });
        }

        // 200: the whole file, also when a range was asked of a server that ignores ranges.
        let total = length
            .ok_or_else(|| bad_response(format!("{what}: the download has no Content-Length")))?;
        let node = node_from_headers(file_id, &h, total);
        match range {
            None => {
                let check = BodyCheck {
                    expected: total,
                    skip: 0,
                    take: None,
                    md5: node.md5_checksum.clone(),
                    idle,
                };
                Ok(Download {
                    node,
                    total_size: total,
                    range: None,
                    body: checked_body(resp, check),
                })
            }
            Some(asked) => {
                self.inner.ranges.store(RANGES_NO, Ordering::Relaxed);
                let (a, b) = asked.resolve(total)?;
                let check = BodyCheck {
                    expected: total,
                    skip: a,
                    take: Some(b - a + 1),
                    md5: None,
                    idle,
                };
                Ok(Download {
                    node,
                    total_size: total,
                    range: Some((a, b)),
                    body: checked_body(resp, check),
                })
            }
        }
    }
}
/// What a download's body must be.
struct BodyCheck {
    /// Bytes the server announced.
    expected: u64,
    /// Bytes to drop and to keep (a range cut out of a whole answer).
    skip: u64,
    take: Option<u64>,
    /// The md5 the whole body must have.
    md5: Option<String>,
    idle: Duration,
}

struct BodyState {
    inner: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    check: BodyCheck,
    received: u64,
    hasher: Option<Md5>,
    done: bool,
}

/// The body of a download as a [`ByteStream`] that ends with an error, not short or altered
/// data, when the answer breaks off, stalls, runs long or has another md5.
fn checked_body(resp: reqwest::Response, check: BodyCheck) -> ByteStream {
    let state = BodyState {
        inner: Box::pin(resp.bytes_stream()),
        hasher: check.md5.as_ref().map(|_| Md5::new()),
        check,
        received: 0,
        done: false,
    };
    Box::pin(futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if s.done || s.check.take == Some(0) {
                return None;
            }
            let expected = s.check.expected;
            let fail = |s: &mut BodyState, kind: io::ErrorKind, e: Error| {
                s.done = true;
                Some(Err(stream_error(kind, e)))
            };
            let item = match tokio::time::timeout(s.check.idle, s.inner.next()).await {
                Err(_) => {
                    let e = network(format!(
                        "the download stalled: no byte for {:?} after {} of {expected} bytes",
                        s.check.idle, s.received
                    ));
                    fail(&mut s, io::ErrorKind::TimedOut, e)
                }
                Ok(Some(Err(e))) => {
                    let kind = if e.is_timeout() {
                        io::ErrorKind::TimedOut
                    } else {
                        io::ErrorKind::UnexpectedEof
                    };
                    let e = network(format!(
                        "the download broke off after {} of {expected} bytes: {}",
                        s.received,
                        describe(&e)
                    ));
                    fail(&mut s, kind, e)
                }
                Ok(None) if s.received < expected => {
                    let e = network(format!(
                        "the download ended after {} of {expected} bytes",
                        s.received
                    ));
                    fail(&mut s, io::ErrorKind::UnexpectedEof, e)
                }
                Ok(None) => {
                    let got = s.hasher.take().map(|h| format!("{:x}", h.finalize()));
                    match (got, &s.check.md5) {
                        (Some(got), Some(want)) if &got != want => {
                            let e = Error::new(
                                ErrorKind::Server,
                                "checksum_mismatch",
                                format!(
                                    "the downloaded bytes have md5 {got}, the server said {want}"
                                ),
                            );
                            fail(&mut s, io::ErrorKind::InvalidData, e)
                        }
                        _ => None,
                    }
                }
                Ok(Some(Ok(mut chunk))) => {
                    s.received += chunk.len() as u64;
                    if s.received > expected {
                        let e = bad_response(format!(
                            "the server sent more than the {expected} bytes it announced"
                        ));
                        fail(&mut s, io::ErrorKind::InvalidData, e)
                    } else {
                        if let Some(h) = &mut s.hasher {
                            h.update(&chunk);
                        }
                        let skip = s.check.skip.min(chunk.len() as u64);
                        chunk = chunk.slice(skip as usize..);
                        s.check.skip -= skip;
                        if let Some(take) = &mut s.check.take {
                            chunk.truncate((*take).min(chunk.len() as u64) as usize);
                            *take -= chunk.len() as u64;
                        }
                        if chunk.is_empty() {
                            continue;
                        }
                        Some(Ok(chunk))
                    }
                }
            };
            return item.map(|i| (i, s));
        }
    }))
}

/// Upload progress, shared by the body stream and the watchdog of [`RemoteBackend::upload`].
struct Progress {
    start: Instant,
    /// Milliseconds since `start` of the last chunk taken by the connection.
    last_ms: AtomicU64,
    /// Why the body stream failed, when it did.
    failure: Mutex<Option<Error>>,
}

impl Progress {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
    fn fail(&self, e: Error) -> io::Error {
        let err = io::Error::other(e.clone());
        *self.failure.lock().unwrap() = Some(e);
        err
    }
    fn failure(&self) -> Option<Error> {
        self.failure.lock().unwrap().clone()
    }
}

/// The upload body, checked to be exactly `length` bytes (the Content-Length sent).
fn counted_body(body: ByteStream, length: u64, progress: Arc<Progress>) -> reqwest::Body {
    let mismatch = move |sent: u64| {
        Error::bad_request(
            "length_mismatch",
            format!(
                "the bytes to upload do not match the announced length: {length} announced, {sent} given"
            ),
        )
    };
    let stream =
        futures_util::stream::unfold((body, 0u64, false), move |(mut body, sent, done)| {
            let progress = progress.clone();
            async move {
                if done {
                    return None;
                }
                let (item, done) = match body.next().await {
                    Some(Ok(chunk)) => {
                        let sent = sent + chunk.len() as u64;
                        if sent > length {
                            return Some((Err(progress.fail(mismatch(sent))), (body, sent, true)));
                        }
                        progress.touch();
                        return Some((Ok(chunk), (body, sent, false)));
                    }
                    Some(Err(e)) => {
                        let err = Error::new(
                            ErrorKind::Server,
                            "upload_body_failed",
                            format!("reading the bytes to upload failed: {e}"),
                        );
                        (Err(progress.fail(err)), true)
                    }
                    None if sent < length => (Err(progress.fail(mismatch(sent))), true),
                    None => return None,
                };
                Some((item, (body, sent, done)))
            }
        });
    reqwest::Body::wrap_stream(stream)
}

impl Backend for RemoteBackend {
    async fn node(&self, path: &NodePath) -> Result<Node> {
        self.call_node(Req::get(path.encoded())).await
    }

    async fn list(&self, path: &NodePath, page: u64, per_page: u64) -> Result<Node> {
        let p = format!(
            "{}?children=1&page={page}&per_page={per_page}",
            path.encoded()
        );
        self.call_node(Req::get(p)).await
    }

    async fn create_folder(&self, path: &NodePath) -> Result<Node> {
        let req = Req::with_body(
            Method::PUT,
            path.encoded(),
            &serde_json::json!({}),
            Retry::UnsentOnly,
        );
        self.call_node(req).await
    }

    async fn create_file(&self, folder: &NodePath, name: &str) -> Result<Node> {
        let body = serde_json::json!({ "create_file": [{ "name": name }] });
        // Idempotent: an existing file of that name is returned as it is.
        let req = Req::with_body(Method::PUT, folder.encoded(), &body, Retry::Idempotent);
        let what = req.what();
        let parent: Node = self.call_node(req).await?;
        let mut children = parent.children.unwrap_or_default();
        let at = children
            .iter()
            .position(|c| c.name == name)
            .or_else(|| (children.len() == 1).then_some(0))
            .ok_or_else(|| bad_response(format!("{what}: `{name}` is not among the children")))?;
        let mut node = children.swap_remove(at);
        let id = node
            .file_id()
            .ok_or_else(|| bad_response(format!("{what}: the new file has no ID")))?;
        node.id = Some(id);
        Ok(node)
    }

    async fn begin_version(&self, file_id: &str, length: u64, md5: Option<&str>) -> Result<Node> {
        let body = VersionRequest {
            length: Some(length),
            md5_checksum: md5.map(str::to_string),
        };
        let path = format!("/nodes/upload/{}", encode_segment(file_id));
        let req = Req::with_body(Method::PUT, path, &body, Retry::UnsentOnly);
        let what = req.what();
        let mut node: Node = self.call_node(req).await?;
        let ex = node
            .file_ex_properties
            .as_mut()
            .ok_or_else(|| bad_response(format!("{what}: no `fileExProperties`")))?;
        if ex.version_id.is_none() {
            // The upload address is `/nodes/upload/{file_id}/{version_id}`.
            ex.version_id = ex
                .upload_uri
                .rsplit_once('/')
                .map(|(_, v)| v.to_string())
                .filter(|v| !v.is_empty() && v != file_id);
        }
        if ex.version_id.is_none() {
            return Err(bad_response(format!("{what}: no document version ID")));
        }
        checked(node, &what)
    }

    async fn upload(
        &self,
        file_id: &str,
        version_id: &str,
        length: u64,
        body: ByteStream,
    ) -> Result<Node> {
        let path = format!(
            "/nodes/upload/{}/{}",
            encode_segment(file_id),
            encode_segment(version_id)
        );
        let progress = Arc::new(Progress {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        let mut rb = self
            .inner
            .http
            .put(self.url(&path))
            .header(header::ACCEPT, JSON)
            .header(header::CONTENT_TYPE, "application/binary")
            .header(header::CONTENT_LENGTH, length)
            .body(counted_body(body, length, progress.clone()));
        if let Some(a) = &self.inner.auth {
            rb = rb.header(header::AUTHORIZATION, a.clone());
        }
        let idle = self.inner.config.idle_timeout;
        let tick = (idle / 4).max(Duration::from_millis(20));
        let send = rb.send();
        tokio::pin!(send);
        // The whole upload may take long; what must not happen is no progress for `idle`.
        let outcome = loop {
            tokio::select! {
                r = &mut send => break r,
                _ = tokio::time::sleep(tick) => {
                    if progress.idle() > idle {
                        return Err(network(format!(
                            "PUT {path}: the upload made no progress for {idle:?}"
                        )));
                    }
                }
            }
        };
        let resp = match outcome {
            Ok(resp) => resp,
            Err(e) => {
                return Err(progress.failure().unwrap_or_else(|| {
                    network(format!("PUT {path}: the upload failed: {}", describe(&e)))
                }));
            }
        };
        let node: Option<Node> = self
            .envelope(resp)
            .await
            .map_err(|e| self.with_hint(e, true))?;
        let what = format!("PUT {path}");
        checked(required(node, &what)?, &what)
    }

    async fn download(&self, file_id: &str, range: Option<RangeRequest>) -> Result<Download> {
        let path = format!("/files/id/Document/{}", encode_segment(file_id));
        self.fetch(path, file_id, range).await
    }

    async fn copy(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        // Copying with `replace` again gives the same result; with `fail` it would not.
        let retry = if replace {
            Retry::Idempotent
        } else {
            Retry::UnsentOnly
        };
        self.call_node(transfer_req("copy", src, dst, replace, retry))
            .await
    }

    async fn rename(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        self.call_node(transfer_req("move", src, dst, replace, Retry::UnsentOnly))
            .await
    }

    async fn delete(&self, path: &NodePath) -> Result<()> {
        let mut req = Req::get(path.encoded());
        req.method = Method::DELETE;
        req.retry = Retry::UnsentOnly;
        self.call::<serde_json::Value>(req).await.map(|_| ())
    }

    async fn preview(&self, file_id: &str) -> Result<PreviewMeta> {
        let path = format!("/preview/id/Document/{}", encode_segment(file_id));
        self.call_message(Req::get(path)).await
    }

    async fn preview_page(&self, file_id: &str, page: u32, size: PageSize) -> Result<PreviewImage> {
        let mut path = format!("/preview/id/Document/{}/{page}", encode_segment(file_id));
        let query: Vec<String> = [
            ("scale", size.scale),
            ("max_width", size.max_width),
            ("max_height", size.max_height),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect();
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        let mut req = Req::get(path);
        req.accept = "image/*, application/json;q=0.5";
        let what = req.what();
        self.bounded(&what, async {
            let resp = self.send(&req).await?;
            let status = resp.status();
            if !status.is_success() {
                self.envelope::<serde_json::Value>(resp).await?;
                return Err(bad_response(format!("{what}: answered {status}")));
            }
            let content_type = header_str(resp.headers(), header::CONTENT_TYPE)
                .unwrap_or("application/octet-stream")
                .to_string();
            let data = self.read_body(resp).await?;
            Ok(PreviewImage { content_type, data })
        })
        .await
        .map_err(|e| self.with_hint(e, true))
    }

    async fn preview_pdf(&self, file_id: &str) -> Result<Download> {
        let path = format!("/preview/id/Document/{}/pdf", encode_segment(file_id));
        self.fetch(path, file_id, None).await
    }
}

fn transfer_req(op: &str, src: &NodePath, dst: &NodePath, replace: bool, retry: Retry) -> Req {
    let body = serde_json::json!({
        op: { "dst_uri": dst.uri(), "replace": if replace { "replace" } else { "fail" } }
    });
    Req::with_body(Method::POST, src.encoded(), &body, retry)
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

    #[test]
    fn parses_content_range_and_etag() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(parse_content_range("bytes 5-4/100"), None);
        assert_eq!(parse_content_range("bytes 0-100/100"), None);
        assert_eq!(parse_content_range("bytes */100"), None);
        let mut h = HeaderMap::new();
        h.insert(
            header::ETAG,
            HeaderValue::from_static("\"0123456789ABCDEF0123456789abcdef\""),
        );
        assert_eq!(
            etag_md5(&h).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        h.insert(header::ETAG, HeaderValue::from_static("\"v2\""));
        assert_eq!(etag_md5(&h), None);
    }

    #[test]
    fn config_debug_hides_the_token() {
        let c = RemoteConfig::new("http://x", "a@b.c", "s3cret-token");
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
