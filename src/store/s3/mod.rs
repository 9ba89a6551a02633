//! Blobs in an S3-compatible bucket (`--blobs s3://BUCKET/PREFIX`): a small client of the five
//! calls the store needs (put, multipart put, ranged get, delete, list), signed with AWS
//! Signature Version 4, over the reqwest and rustls the remote backend already builds.
//!
//! Keys are `PREFIX/blobs/<sha256>`. A blob is immutable and named by its sha256, so every
//! single PUT is signed with that hash as its payload hash and the server checks the bytes it
//! got against their name. An object appears under its key only whole (a PUT, or a multipart
//! upload once completed), so a crash mid-upload leaves at worst an unfinished multipart upload
//! (invisible; a bucket lifecycle rule aborts them) or an object no version refers to (swept).
//!
//! Synchronous, like the store it serves: calls run on the store's blocking threads.
//!
//! Here: where the bucket is and the calls on it, with their retries. Apart: the signing of a
//! request ([`sign`]) and the reading of a blob as a file ([`reader`]).

mod reader;
mod sign;

pub use reader::ObjectReader;

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::blocking::{Body, Client, Response};
use sha2::{Digest, Sha256};

use crate::api::checksum::hex;
use sign::{Credentials, ToSign, amz_date, authorization, encode};

/// Files up to this size are sent in one PUT; larger ones in parts.
pub const MULTIPART_ABOVE: u64 = 64 << 20;
/// Size of the parts of a multipart upload (at least; S3 allows 10,000 parts).
const PART_SIZE: u64 = 16 << 20;
const MAX_PARTS: u64 = 10_000;
/// The sha256 of nothing: the payload hash of a request without a body.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// Attempts of a request that failed for a reason that may pass (a 5xx, a broken connection).
const ATTEMPTS: u32 = 4;

/// Where blobs go: `s3://BUCKET/PREFIX`, and the endpoint of an S3-compatible service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
    /// `http(s)://host[:port]` of an S3-compatible service; `None`: AWS (the region's endpoint,
    /// or `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` when set).
    pub endpoint: Option<String>,
}

impl S3Location {
    /// `s3://BUCKET` or `s3://BUCKET/PREFIX`; `None` for anything that is not an s3 URL.
    pub fn parse(s: &str, endpoint: Option<&str>) -> Option<Result<S3Location, String>> {
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty()
            || !bucket
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-".contains(&c))
        {
            return Some(Err(format!("{s}: not a bucket name")));
        }
        let prefix = prefix.trim_matches('/');
        Some(Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_string()),
        }))
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)?;
        if let Some(e) = &self.endpoint {
            write!(f, " at {e}")?;
        }
        Ok(())
    }
}

/// One bucket (and prefix) of blobs.
pub struct Bucket {
    /// Always `Some` but in `drop`.
    http: Option<Client>,
    /// `scheme://host[:port]`
    origin: String,
    /// The Host header as signed (the port only when not the scheme's default).
    host: String,
    /// `/BUCKET` with path-style addressing (any endpoint given), empty with virtual hosts.
    bucket_path: String,
    prefix: String,
    region: String,
    creds: Credentials,
    location: S3Location,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The texts of every `<tag>` element of a (small, trusted) XML answer, entities decoded.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(a) = rest.find(&open) {
        let after = &rest[a + open.len()..];
        let Some(b) = after.find(&close) else { break };
        out.push(
            after[..b]
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&"),
        );
        rest = &after[b + close.len()..];
    }
    out
}

/// The bytes `[start, start + len)` of a file, read by position (the file's own offset is left
/// alone, so any number of these may read one file at once).
struct Section {
    file: Arc<File>,
    pos: u64,
    end: u64,
}

impl Read for Section {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min((self.end - self.pos) as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than the blob",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// A request's body, made anew for each attempt.
enum Payload<'a> {
    Empty,
    Text(String),
    File {
        file: &'a Arc<File>,
        start: u64,
        len: u64,
    },
}

impl Payload<'_> {
    fn body(&self) -> Option<Body> {
        match self {
            Payload::Empty => None,
            Payload::Text(t) => Some(Body::from(t.clone())),
            Payload::File { file, start, len } => Some(Body::sized(
                Section {
                    file: (*file).clone(),
                    pos: *start,
                    end: start + len,
                },
                *len,
            )),
        }
    }
}

/// Runs blocking network I/O from wherever the store is called: on a runtime's worker thread
/// (a test calling the store directly) it tells the runtime first, as reqwest's blocking
/// client requires.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Bucket {
    /// The bucket at `location`, with credentials and region from the AWS environment
    /// variables. Nothing is sent until the first call (see [`Bucket::check`]).
    pub fn open(location: &S3Location) -> io::Result<Bucket> {
        let missing = |v: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{v} is not set (the credentials of {location})"),
            )
        };
        let creds = Credentials {
            access_key: env("AWS_ACCESS_KEY_ID").ok_or_else(|| missing("AWS_ACCESS_KEY_ID"))?,
            secret_key: env("AWS_SECRET_ACCESS_KEY")
                .ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY"))?,
            session_token: env("AWS_SESSION_TOKEN"),
        };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = location
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"));
        // A given endpoint (MinIO, Ceph, Garage, moto...) is addressed path-style, which they
        // all accept; AWS itself by virtual host.
        let (url, bucket_path) = match endpoint {
            Some(e) => (
                e.trim_end_matches('/').to_string(),
                format!("/{}", location.bucket),
            ),
            None => (
                format!("https://{}.s3.{region}.amazonaws.com", location.bucket),
                String::new(),
            ),
        };
        let parsed = reqwest::Url::parse(&url)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
        let host = match (parsed.host_str(), parsed.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{url}: no host"),
                ));
            }
        };
        // reqwest's blocking client runs a runtime of its own, which may be neither made nor
        // dropped on a thread of another runtime (a test opening the store): a thread of its own.
        let http = std::thread::spawn(|| {
            Client::builder()
                .connect_timeout(Duration::from_secs(10))
                // A part is at most a few hundred MiB; a stalled connection must not hang an
                // upload.
                .timeout(Duration::from_secs(3600))
                .build()
        })
        .join()
        .map_err(|_| io::Error::other("the HTTP client panicked"))?
        .map_err(io::Error::other)?;
        Ok(Bucket {
            http: Some(http),
            origin: format!("{}://{host}", parsed.scheme()),
            host,
            bucket_path,
            prefix: location.prefix.clone(),
            region,
            creds,
            location: location.clone(),
        })
    }

    pub fn location(&self) -> &S3Location {
        &self.location
    }

    fn key(&self, hash: &str) -> String {
        format!("{}blobs/{hash}", self.prefix)
    }

    /// One signed request, retried while it fails for a reason that may pass. A 404 is
    /// `NotFound`; any other failure says what the service answered.
    fn send(
        &self,
        method: Method,
        key: Option<&str>,
        query: &[(&str, &str)],
        extra: &[(&str, String)],
        payload_sha256: &str,
        payload: Payload<'_>,
    ) -> io::Result<Response> {
        let path = match key {
            Some(k) => format!("{}/{}", self.bucket_path, encode(k, true)),
            None if self.bucket_path.is_empty() => "/".to_string(),
            None => self.bucket_path.clone(),
        };
        let mut q: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (encode(k, false), encode(v, false)))
            .collect();
        q.sort();
        let query = q
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let url = if query.is_empty() {
            format!("{}{path}", self.origin)
        } else {
            format!("{}{path}?{query}", self.origin)
        };
        let what = format!("S3 {method} {}", key.unwrap_or(&self.location.bucket));
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100 << attempt));
            }
            let date = amz_date(time::OffsetDateTime::now_utc());
            let mut headers: Vec<(String, String)> = vec![
                ("host".into(), self.host.clone()),
                ("x-amz-content-sha256".into(), payload_sha256.into()),
                ("x-amz-date".into(), date.clone()),
            ];
            if let Some(t) = &self.creds.session_token {
                headers.push(("x-amz-security-token".into(), t.clone()));
            }
            for (k, v) in extra {
                headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
            }
            headers.sort();
            let auth = authorization(
                &self.creds,
                &self.region,
                &date,
                &ToSign {
                    method: method.as_str(),
                    path: &path,
                    query: &query,
                    headers: &headers,
                    payload_sha256,
                },
            );
            let http = self.http.as_ref().expect("dropped only in drop");
            let mut req = http.request(method.clone(), &url);
            for (k, v) in headers.iter().filter(|(k, _)| k != "host") {
                req = req.header(k, v);
            }
            req = req.header("authorization", auth);
            if let Some(body) = payload.body() {
                req = req.body(body);
            }
            match blocking(|| req.send()) {
                Ok(r) if r.status().is_success() => return Ok(r),
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    return Err(io::Error::new(io::ErrorKind::NotFound, what));
                }
                Ok(r) => {
                    let status = r.status();
                    let mut text = String::new();
                    let _ = blocking(|| r.take(8192).read_to_string(&mut text));
                    let code = xml_values(&text, "Code").pop().unwrap_or_default();
                    let e = io::Error::other(format!("{what}: {status} {code}"));
                    if !status.is_server_error() {
                        return Err(e);
                    }
                    last = Some(e);
                }
                Err(e) => last = Some(io::Error::other(format!("{what}: {e}"))),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// Claims the prefix for the store `owner` (a random ID kept with its database): the
    /// object `PREFIX/owner` names it, written on first use. A prefix another store claimed is
    /// refused, since each store sweeps the blobs its database does not know: two stores on one
    /// prefix would delete each other's bytes.
    pub fn claim(&self, owner: &str) -> io::Result<()> {
        let key = format!("{}owner", self.prefix);
        let current = match self.send(
            Method::GET,
            Some(&key),
            &[],
            &[],
            EMPTY_SHA256,
            Payload::Empty,
        ) {
            Ok(r) => Some(blocking(|| r.text()).map_err(io::Error::other)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match current {
            Some(o) if o.trim() == owner => Ok(()),
            Some(o) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} belongs to another store (owner {}, this one is {owner}); give each store a \
                     prefix of its own",
                    self.location,
                    o.trim()
                ),
            )),
            None => {
                let sha = hex(&Sha256::digest(owner.as_bytes()));
                self.send(
                    Method::PUT,
                    Some(&key),
                    &[],
                    &[("content-length", owner.len().to_string())],
                    &sha,
                    Payload::Text(owner.to_string()),
                )
                .map(drop)
            }
        }
    }

    /// Whether the bucket answers (a listing of at most one key).
    pub fn check(&self) -> io::Result<()> {
        self.send(
            Method::GET,
            None,
            &[
                ("list-type", "2"),
                ("max-keys", "1"),
                ("prefix", &self.prefix),
            ],
            &[],
            EMPTY_SHA256,
            Payload::Empty,
        )
        .map(drop)
    }

    /// Stores the first `len` bytes of `file`, whose sha256 is `sha256`, as that blob: one PUT
    /// (checked by the service against the hash), or a multipart upload for large files. The
    /// file is streamed from disk; memory stays bounded whatever its size.
    pub fn put(&self, file: &Arc<File>, len: u64, sha256: &str) -> io::Result<()> {
        self.put_key(&self.key(sha256), file, len, sha256)
    }

    /// Stores the first `len` bytes of `file`, whose sha256 is `sha256`, under `key` (as
    /// [`Bucket::put`]).
    pub fn put_key(&self, key: &str, file: &Arc<File>, len: u64, sha256: &str) -> io::Result<()> {
        if len <= MULTIPART_ABOVE {
            return self
                .send(
                    Method::PUT,
                    Some(key),
                    &[],
                    &[("content-length", len.to_string())],
                    sha256,
                    Payload::File {
                        file,
                        start: 0,
                        len,
                    },
                )
                .map(drop);
        }
        let created = self.send(
            Method::POST,
            Some(key),
            &[("uploads", "")],
            &[],
            EMPTY_SHA256,
            Payload::Empty,
        )?;
        let text = blocking(|| created.text()).map_err(io::Error::other)?;
        let upload_id = xml_values(&text, "UploadId")
            .pop()
            .ok_or_else(|| io::Error::other(format!("no UploadId in {text}")))?;
        let result = self.put_parts(key, &upload_id, file, len);
        if result.is_err() {
            // Unfinished parts cost storage until aborted.
            if let Err(e) = self.send(
                Method::DELETE,
                Some(key),
                &[("uploadId", &upload_id)],
                &[],
                EMPTY_SHA256,
                Payload::Empty,
            ) {
                log::warn!("could not abort the multipart upload of {key}: {e}");
            }
        }
        result
    }

    fn put_parts(&self, key: &str, upload_id: &str, file: &Arc<File>, len: u64) -> io::Result<()> {
        let part_size = PART_SIZE.max(len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20));
        let mut done = String::from("<CompleteMultipartUpload>");
        let mut start = 0;
        let mut number = 1u32;
        while start < len {
            let n = part_size.min(len - start);
            // Hashed from the file first (page cache), then streamed: the part is never held
            // in memory whole.
            let mut sha = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut section = Section {
                file: file.clone(),
                pos: start,
                end: start + n,
            };
            loop {
                let k = section.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                sha.update(&buf[..k]);
            }
            let r = self.send(
                Method::PUT,
                Some(key),
                &[("partNumber", &number.to_string()), ("uploadId", upload_id)],
                &[("content-length", n.to_string())],
                &hex(&sha.finalize()),
                Payload::File {
                    file,
                    start,
                    len: n,
                },
            )?;
            let etag = r
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| io::Error::other("a part's answer has no ETag"))?
                .to_string();
            done.push_str(&format!(
                "<Part><PartNumber>{number}</PartNumber><ETag>{}</ETag></Part>",
                etag.replace('&', "&amp;").replace('"', "&quot;")
            ));
            start += n;
            number += 1;
        }
        done.push_str("</CompleteMultipartUpload>");
        let sha = hex(&Sha256::digest(done.as_bytes()));
        let r = self.send(
            Method::POST,
            Some(key),
            &[("uploadId", upload_id)],
            &[("content-type", "application/xml".into())],
            &sha,
            Payload::Text(done),
        )?;
        // The service may answer 200 and report the failure in the body.
        let text = blocking(|| r.text()).map_err(io::Error::other)?;
        if text.contains("<Error>") {
            return Err(io::Error::other(format!(
                "completing the upload of {key}: {}",
                xml_values(&text, "Code").pop().unwrap_or(text)
            )));
        }
        Ok(())
    }

    /// The blob's size, or `None` when the bucket has no such blob.
    pub fn size(&self, hash: &str) -> io::Result<Option<u64>> {
        self.size_key(&self.key(hash))
    }

    /// The size of the object `key`, or `None` when there is none.
    pub fn size_key(&self, key: &str) -> io::Result<Option<u64>> {
        match self.send(
            Method::HEAD,
            Some(key),
            &[],
            &[],
            EMPTY_SHA256,
            Payload::Empty,
        ) {
            // The header itself: reqwest's `content_length` is the body's, none for a HEAD.
            Ok(r) => Ok(r
                .headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok()?.parse().ok())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the object `key` from `start` on.
    fn get_from(&self, key: &str, start: u64) -> io::Result<Response> {
        self.send(
            Method::GET,
            Some(key),
            &[],
            &[("range", format!("bytes={start}-"))],
            EMPTY_SHA256,
            Payload::Empty,
        )
    }

    pub fn remove(&self, hash: &str) -> io::Result<()> {
        self.remove_key(&self.key(hash))
    }

    /// Deletes the object `key` (none there is no error: S3 answers a delete of nothing 204).
    pub fn remove_key(&self, key: &str) -> io::Result<()> {
        self.send(
            Method::DELETE,
            Some(key),
            &[],
            &[],
            EMPTY_SHA256,
            Payload::Empty,
        )
        .map(drop)
    }

    /// Every blob hash in the bucket under our prefix.
    pub fn list(&self) -> io::Result<Vec<String>> {
        let prefix = format!("{}blobs/", self.prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("list-type", "2"), ("prefix", prefix.as_str())];
            if let Some(t) = &token {
                query.push(("continuation-token", t));
            }
            let r = self.send(Method::GET, None, &query, &[], EMPTY_SHA256, Payload::Empty)?;
            let text = blocking(|| r.text()).map_err(io::Error::other)?;
            for key in xml_values(&text, "Key") {
                if let Some(hash) = key.strip_prefix(&prefix) {
                    if hash.len() == 64 && hash.bytes().all(|c| c.is_ascii_hexdigit()) {
                        out.push(hash.to_string());
                    }
                }
            }
            token = xml_values(&text, "NextContinuationToken").pop();
            if token.is_none() || xml_values(&text, "IsTruncated").pop().as_deref() != Some("true")
            {
                return Ok(out);
            }
        }
    }
}

/// An object found by [`Bucket::list_objects`].
pub struct Object {
    /// The whole key, prefix included.
    pub key: String,
    pub size: u64,
    /// When it was written (`None` when the answer did not say in a form understood).
    pub modified: Option<std::time::SystemTime>,
}

impl Bucket {
    /// The key of `name` under the store's prefix.
    pub fn prefixed(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Copies the object `from` to `to` inside the bucket (the service copies; the bytes do not
    /// travel). `to` appears whole or not at all.
    pub fn copy_key(&self, from: &str, to: &str) -> io::Result<()> {
        let source = format!("/{}/{}", self.location.bucket, encode(from, true));
        let r = self.send(
            Method::PUT,
            Some(to),
            &[],
            &[
                ("x-amz-copy-source", source),
                ("content-length", "0".into()),
            ],
            EMPTY_SHA256,
            Payload::Text(String::new()),
        )?;
        // A copy may answer 200 and report its failure in the body.
        let text = blocking(|| r.text()).map_err(io::Error::other)?;
        if text.contains("<Error>") {
            return Err(io::Error::other(format!(
                "copying {from} to {to}: {}",
                xml_values(&text, "Code").pop().unwrap_or(text)
            )));
        }
        Ok(())
    }

    /// Every object whose key starts with `prefix` (a whole key, the store's prefix included).
    pub fn list_objects(&self, prefix: &str) -> io::Result<Vec<Object>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("list-type", "2"), ("prefix", prefix)];
            if let Some(t) = &token {
                query.push(("continuation-token", t));
            }
            let r = self.send(Method::GET, None, &query, &[], EMPTY_SHA256, Payload::Empty)?;
            let text = blocking(|| r.text()).map_err(io::Error::other)?;
            for item in xml_values(&text, "Contents") {
                let Some(key) = xml_values(&item, "Key").pop() else {
                    continue;
                };
                let size = xml_values(&item, "Size")
                    .pop()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let modified = xml_values(&item, "LastModified").pop().and_then(|t| {
                    time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339)
                        .ok()
                        .map(std::time::SystemTime::from)
                });
                out.push(Object {
                    key,
                    size,
                    modified,
                });
            }
            token = xml_values(&text, "NextContinuationToken").pop();
            if token.is_none() || xml_values(&text, "IsTruncated").pop().as_deref() != Some("true")
            {
                return Ok(out);
            }
        }
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // See `open`: not on the caller's thread, which may be a runtime's.
        if let Some(http) = self.http.take() {
            std::thread::spawn(move || drop(http));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of AWS's documentation of Signature Version 4 for S3 (GET Object with a
    /// range): our signature must be theirs.
    #[test]
    fn signs_as_the_documentation_s_example() {
        let creds = Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let headers = [
            ("host", "examplebucket.s3.amazonaws.com"),
            ("range", "bytes=0-9"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", "20130524T000000Z"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let auth = authorization(
            &creds,
            "us-east-1",
            "20130524T000000Z",
            &ToSign {
                method: "GET",
                path: "/test.txt",
                query: "",
                headers: &headers,
                payload_sha256: EMPTY_SHA256,
            },
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn locations_and_encoding() {
        let l = S3Location::parse("s3://docs/vault/a/", Some("http://127.0.0.1:9000/"))
            .unwrap()
            .unwrap();
        assert_eq!(l.bucket, "docs");
        assert_eq!(l.prefix, "vault/a/");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(
            S3Location::parse("s3://b", None).unwrap().unwrap().prefix,
            ""
        );
        assert!(S3Location::parse("s3://", None).unwrap().is_err());
        assert!(S3Location::parse("s3://Bad_Name/x", None).unwrap().is_err());
        assert!(S3Location::parse("/var/blobs", None).is_none());
        assert_eq!(encode("a b/c~d+e", true), "a%20b/c~d%2Be");
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(
            xml_values("<R><Key>a&amp;b</Key><Key>c</Key></R>", "Key"),
            ["a&b", "c"]
        );
    }
}
