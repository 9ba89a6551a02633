//! Downloads (files and preview PDFs): ranges where the server has them, whole reads cut to the
//! range where it has not, and bodies checked against what the headers or the node announced.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::api::checksum::Md5;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};

use super::RemoteBackend;
use super::transport::{Req, bad_response, describe, header_str, network, stream_error};
use crate::api::checksum::md5_hex;
use crate::api::{Error, ErrorKind, Node, NodeType, RangeRequest, Result, format_time};
use crate::backend::bwlimit::limited;
use crate::backend::{ByteStream, Download};

/// What a server said about `Range` support, learned from its answers.
pub(super) const RANGES_UNKNOWN: u8 = 0;
pub(super) const RANGES_YES: u8 = 1;
pub(super) const RANGES_NO: u8 = 2;

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

/// The md5 in an ETag (`"hex"` or `"base64"`), as hex, when it is one.
fn etag_md5(h: &HeaderMap) -> Option<String> {
    let v = header_str(h, header::ETAG)?;
    md5_hex(v.trim().trim_start_matches("W/").trim_matches('"'))
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
    /// GET of a download or a PDF: the stream, checked against its headers, or against `size`
    /// (the node's, when the caller knows it) where a server sends no Content-Length.
    pub(super) async fn fetch(
        &self,
        path: String,
        file_id: &str,
        range: Option<RangeRequest>,
        size: Option<u64>,
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
                Err(self.failure(resp).await)
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
                body: limited(
                    checked_body(Body::Stream(resp), check),
                    self.inner.config.download_limit.clone(),
                ),
            });
        }

        // 200: the whole file, also when a range was asked of a server that ignores ranges.
        if length.is_none() && range.is_some() {
            self.inner.ranges.store(RANGES_NO, Ordering::Relaxed);
        }
        let (total, resp) = match (length, size) {
            (Some(total), _) | (None, Some(total)) => (total, Body::Stream(resp)),
            // Neither the headers nor the caller say how long: read it (bounded) to know.
            (None, None) => {
                let whole = self
                    .read_bounded(resp, self.inner.config.max_unsized_body)
                    .await?;
                (whole.len() as u64, Body::Whole(whole))
            }
        };
        let node = node_from_headers(file_id, &h, total);
        let (skip, take, range, md5) = match range {
            None => (0, None, None, node.md5_checksum.clone()),
            Some(asked) => {
                self.inner.ranges.store(RANGES_NO, Ordering::Relaxed);
                let (a, b) = asked.resolve(total)?;
                (a, Some(b - a + 1), Some((a, b)), None)
            }
        };
        let check = BodyCheck {
            expected: total,
            skip,
            take,
            md5,
            idle,
        };
        Ok(Download {
            node,
            total_size: total,
            range,
            body: limited(
                checked_body(resp, check),
                self.inner.config.download_limit.clone(),
            ),
        })
    }
}

/// A download's body: still on the wire, or already read (an answer of unknown length).
enum Body {
    Stream(reqwest::Response),
    Whole(Bytes),
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
fn checked_body(body: Body, check: BodyCheck) -> ByteStream {
    let inner: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>> = match body {
        Body::Stream(resp) => Box::pin(resp.bytes_stream()),
        Body::Whole(b) => Box::pin(futures_util::stream::iter([Ok(b)])),
    };
    let state = BodyState {
        inner,
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
                    let got = s
                        .hasher
                        .take()
                        .map(|h| crate::api::checksum::hex(&h.finalize()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

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
}
