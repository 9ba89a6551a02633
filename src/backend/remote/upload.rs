//! Upload steps 2 and 3: the version announced with its length and md5, the bytes streamed with
//! a watchdog on progress.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::Method;
use reqwest::header;

use super::RemoteBackend;
use super::transport::{JSON, Req, Retry, bad_response, checked, describe, network, required};
use crate::api::checksum::{md5_base64, md5_hex};
use crate::api::path::encode_segment;
use crate::api::{Base, Error, ErrorKind, FileAttrs, Node, Result, VersionRequest, format_time};
use crate::backend::bwlimit::limited;
use crate::backend::{ByteStream, PutTo, Whole};
use crate::sync::relock;

/// Versions announced and never sent are forgotten beyond this many (the map stays small).
const ANNOUNCED_MAX: usize = 4096;

impl RemoteBackend {
    /// Upload step 2. The md5 goes in base64, as the public service documents; a server that
    /// refuses it (400) gets the request again without one (the interface makes it optional), and
    /// step 3's answer is compared with it instead. A write is never lost to a spelling.
    pub(super) async fn announce_version(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        let md5 = match md5 {
            Some(m) => Some(md5_hex(m).ok_or_else(|| {
                Error::bad_request("bad_checksum", format!("`{m}` is not an md5"))
            })?),
            None => None,
        };
        let extras = md5.is_some() || !attrs.is_empty() || *base != Base::Any;
        let mut node = match self
            .version_request(file_id, Some(length), md5.as_deref(), attrs, base)
            .await
        {
            Err(e) if e.kind == ErrorKind::BadRequest && extras => {
                log::info!(
                    "{}: step 2 with an md5, attributes or a base was refused ({e}); announcing the length alone",
                    self.inner.base
                );
                let plain = (FileAttrs::default(), &Base::Any);
                self.version_request(file_id, Some(length), None, plain.0, plain.1)
                    .await?
            }
            other => other?,
        };
        let what = format!("PUT /nodes/upload/{file_id}");
        let ex = node
            .file_ex_properties
            .as_mut()
            .ok_or_else(|| bad_response(format!("{what}: no `fileExProperties`")))?;
        if ex.version_id.is_none() {
            // The upload address is `/nodes/upload/{file_id}/{version_id}`.
            let mut segments = ex.upload_uri.trim_end_matches('/').rsplit('/');
            let (version, file) = (segments.next(), segments.next());
            ex.version_id = version
                .filter(|v| !v.is_empty() && file == Some(file_id))
                .map(str::to_string);
        }
        let Some(version) = ex.version_id.clone() else {
            return Err(bad_response(format!("{what}: no document version ID")));
        };
        let node = checked(node, &what)?;
        // A server without the check of step 3 (the public service): the file as step 2 found
        // it, compared here. What commits between this and step 3 is the window left
        // (docs/design.md §5).
        if !ex_conflict_check(&node) && !base.holds(node.md5_checksum.as_deref()) {
            return Err(base.conflict(&node.uri));
        }
        if let Some(md5) = md5 {
            let mut announced = relock(&self.inner.announced);
            if announced.len() >= ANNOUNCED_MAX {
                announced.clear();
            }
            announced.insert((file_id.to_string(), version), md5);
        }
        Ok(node)
    }

    /// Our update of a file's attributes alone: step 2 without a length. A server that keeps
    /// none answers with an error or with the file as it was; the caller compares.
    pub(super) async fn update_attrs(&self, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        let node = self
            .version_request(file_id, None, None, attrs, &Base::Any)
            .await?;
        checked(node, &format!("PUT /nodes/upload/{file_id}"))
    }

    /// Step 2; without a length, our update of the attributes alone (which may be repeated).
    async fn version_request(
        &self,
        file_id: &str,
        length: Option<u64>,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        let mut body = VersionRequest {
            length,
            md5_checksum: md5.and_then(md5_base64),
            modified_on: attrs.modified.map(format_time),
            mode: attrs.mode,
            ..Default::default()
        };
        body.set_base(base);
        let retry = match length {
            Some(_) => Retry::UnsentOnly,
            None => Retry::Idempotent,
        };
        let path = format!("/nodes/upload/{}", encode_segment(file_id));
        self.call_node(Req::with_body(Method::PUT, path, &body, retry))
            .await
    }

    /// Upload step 3, then the stored md5 compared with the one announced in step 2.
    pub(super) async fn send_version(
        &self,
        file_id: &str,
        version_id: &str,
        length: u64,
        body: ByteStream,
    ) -> Result<Node> {
        let key = (file_id.to_string(), version_id.to_string());
        let want = relock(&self.inner.announced).get(&key).cloned();
        let path = format!(
            "/nodes/upload/{}/{}",
            encode_segment(file_id),
            encode_segment(version_id)
        );
        let node = self.put_bytes(path, Vec::new(), length, body).await?;
        relock(&self.inner.announced).remove(&key);
        if let (Some(want), Some(got)) = (want, &node.md5_checksum) {
            if &want != got {
                return Err(stored_other(got, &format!("file {file_id}"), &want));
            }
        }
        Ok(node)
    }

    /// Our extension (`server::whole`, where the server offers `api::EXT_WHOLE_PUT`): the
    /// bytes with the terms of step 2, in one request; steps 1 to 3 for a path.
    pub(super) async fn send_whole(&self, whole: Whole<'_>, body: ByteStream) -> Result<Node> {
        let Whole {
            to,
            length,
            md5,
            attrs,
            base,
        } = whole;
        let md5 = md5_hex(md5)
            .ok_or_else(|| Error::bad_request("bad_checksum", format!("`{md5}` is not an md5")))?;
        let path = match to {
            PutTo::File(id) => format!("/nodes/upload/{}", encode_segment(id)),
            PutTo::Path(p) => p.encoded(),
        };
        let mut headers = vec![(
            "content-md5",
            md5_base64(&md5).unwrap_or_else(|| md5.clone()),
        )];
        headers.extend(base.header());
        if let Some(t) = attrs.modified {
            headers.push((crate::api::MODIFIED_ON, format_time(t)));
        }
        if let Some(m) = attrs.mode {
            headers.push((crate::api::MODE, m.to_string()));
        }
        let node = self.put_bytes(path, headers, length, body).await?;
        // The server checked the md5 before the version became current; this is the answer's.
        if node.md5_checksum.as_deref() != Some(md5.as_str()) {
            let got = node.md5_checksum.as_deref().unwrap_or("none");
            return Err(stored_other(got, &node.uri, &md5));
        }
        Ok(node)
    }

    async fn put_bytes(
        &self,
        path: String,
        headers: Vec<(&'static str, String)>,
        length: u64,
        body: ByteStream,
    ) -> Result<Node> {
        let what = format!("PUT {path}");
        let sent = Bytes {
            method: Method::PUT,
            path,
            content_type: "application/binary",
            headers,
            length,
        };
        let node: Option<Node> = self.send_bytes(sent, body).await?;
        checked(required(node, &what)?, &what)
    }

    /// A request whose body is bytes (`length` of them, within the upload's bandwidth limit),
    /// watched for progress rather than bounded in time; its envelope's message.
    pub(super) async fn send_bytes<T: serde::de::DeserializeOwned>(
        &self,
        sent: Bytes,
        body: ByteStream,
    ) -> Result<Option<T>> {
        let Bytes {
            method,
            path,
            content_type,
            headers,
            length,
        } = sent;
        let progress = Arc::new(Progress {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        let mut rb = self
            .inner
            .http
            .request(method.clone(), self.url(&path))
            .header(header::ACCEPT, JSON)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::CONTENT_LENGTH, length)
            .body(counted_body(
                limited(body, self.inner.config.upload_limit.clone()),
                length,
                progress.clone(),
            ));
        if let Some(a) = self.auth() {
            rb = rb.header(header::AUTHORIZATION, a);
        }
        for (name, value) in headers {
            rb = rb.header(name, value);
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
                            "{method} {path}: the upload made no progress for {idle:?}"
                        )));
                    }
                }
            }
        };
        let resp = match outcome {
            Ok(resp) => resp,
            Err(e) => {
                return Err(progress.failure().unwrap_or_else(|| {
                    network(format!(
                        "{method} {path}: the upload failed: {}",
                        describe(&e)
                    ))
                }));
            }
        };
        self.envelope(resp).await.map_err(|e| {
            // A body goes once: a newer login (`vaultfs login` while mounted) is taken for the
            // upload's next attempt.
            if e.kind == ErrorKind::Auth && self.take_newer_login() {
                return e;
            }
            self.with_hint(e, true)
        })
    }
}

/// What [`RemoteBackend::send_bytes`] sends, but for the bytes.
pub(super) struct Bytes {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) content_type: &'static str,
    pub(super) headers: Vec<(&'static str, String)>,
    pub(super) length: u64,
}

/// The server stored other bytes than were sent (`what`: the file).
pub(super) fn stored_other(got: &str, what: &str, sent: &str) -> Error {
    Error::new(
        ErrorKind::Server,
        "checksum_mismatch",
        format!("the server stored md5 {got} for {what}; the bytes sent have {sent}"),
    )
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

/// Whether the server said it checks step 2's base again when step 3 commits (ours does).
fn ex_conflict_check(node: &Node) -> bool {
    node.file_ex_properties
        .as_ref()
        .and_then(|x| x.conflict_check)
        .unwrap_or(false)
}
