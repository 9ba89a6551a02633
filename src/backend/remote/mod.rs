//! The backend over HTTP: the interface (docs/design.md §2) spoken to `vaultfs serve` or to
//! the public service, with one pooled client.
//!
//! Failure handling, decided once here:
//! - Every wait is bounded. JSON calls (with their retries) end within `total_timeout`; a
//!   download must produce its headers within `total_timeout` and then a byte at least every
//!   `idle_timeout` (its total time is unbounded, as its size is); an upload must make progress
//!   every `idle_timeout`. A dead server is [`ErrorKind::Network`], never a hang.
//! - Retries (exponential backoff with jitter, at most `retries`) follow what a repeat would do:
//!   calls that are idempotent on the server (GET, upload step 1, copy with `replace`) are
//!   retried on connection failures, time-outs and 500/502/503/504 whose error code is not one
//!   that a repeat cannot change (the public service sends "already exists" with 500). The others (DELETE, move,
//!   folder creation, upload step 2, the token exchange) are retried only when the connection
//!   could not be established, i.e. the request surely never reached the server: a DELETE
//!   repeated after it succeeded answers 404, a step 2 repeated creates a second version, a
//!   move repeated fails. Upload step 3 is never retried here: the body stream can be sent only
//!   once; a repeated identical step 3 succeeds on our server, so the caller retries with a
//!   fresh stream.
//! - Bodies are checked: a download shorter or longer than its headers (or, without a
//!   Content-Length, the node's size) say, or (for whole reads) with another md5 than its ETag,
//!   ends its stream with an error, never with short data.
//!   Errors inside a [`ByteStream`] are `io::Error`s wrapping an [`api::Error`](Error).
//! - Answers that are not the interface's JSON (HTML, truncated, wrong types) are
//!   [`ErrorKind::Server`] with code `bad_response`.
//!
//! The public service's dialect (docs/design.md §2) is read wherever it can appear: integer or string
//! error codes ([`crate::api::Error::from_server`]), md5 in hex or base64 (made hex in
//! `transport::checked`), numbers as strings and other date forms (`api::types`, `api::time`).
//! What is sent follows its documentation: base64 md5 (`upload`), `Replace`/`Fail`, numeric pins.
//!
//! The parts: `transport` (requests, retries, envelopes), `download`, `upload` (steps 2 and 3),
//! `pin` (the pin exchange).

mod batch;
mod changes;
mod download;
mod pin;
mod transport;
mod upload;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{self, HeaderValue};

use super::bwlimit::Bucket;
use super::{Backend, ByteStream, Download, PreviewImage};
use crate::api::path::encode_segment;
use crate::api::{
    Base, Error, ErrorKind, FileAttrs, Lock, Node, NodePath, PageSize, PreviewMeta, RangeRequest,
    Result, Secret, Version,
};
use download::{RANGES_NO, RANGES_UNKNOWN, RANGES_YES};
use transport::{Req, Retry, bad_response, header_str};

/// Connections to the server kept idle between bursts (see `RemoteBackend::new`).
const IDLE_CONNECTIONS: usize = 32;

/// Settings of a [`RemoteBackend`]. (Its `Debug` shows no token: a [`Secret`].)
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// `https://rest.smartvault.com` or `http://127.0.0.1:8080` (a path prefix is kept).
    pub base_url: String,
    /// The user's e-mail and delegation token; both empty for the pin exchange only.
    pub email: String,
    pub token: Secret,
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
    /// Largest download read without a Content-Length when its size is not known otherwise
    /// (it is held in memory to learn its length).
    pub max_unsized_body: usize,
    /// Most children one listing of a folder takes (all its pages); a listing of more fails.
    pub max_listing_entries: u64,
    /// Most memory the children of one listing may hold while it is read.
    pub max_listing_bytes: u64,
    /// `--bwlimit`: the buckets upload and download bodies go through.
    pub upload_limit: Option<Arc<Bucket>>,
    pub download_limit: Option<Arc<Bucket>>,
    /// Where a newer login of the same user is read when the server refuses the token (a
    /// `vaultfs login` while mounted): none, the token is the one given for good.
    pub relogin: Option<Relogin>,
}

/// The token of the same user as `vaultfs login` keeps it now (read again when the server
/// refuses the one in use; `None` when there is none).
#[derive(Clone)]
pub struct Relogin(pub Arc<dyn Fn() -> Option<Secret> + Send + Sync>);

impl std::fmt::Debug for Relogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Relogin")
    }
}

impl RemoteConfig {
    pub fn new(base_url: &str, email: &str, token: &str) -> RemoteConfig {
        RemoteConfig {
            base_url: base_url.to_string(),
            email: email.to_string(),
            token: Secret::new(token),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            total_timeout: Duration::from_secs(60),
            retries: 3,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            max_json_response: 64 << 20,
            max_unsized_body: 64 << 20,
            // `vaultfs serve`'s default quota of one account: a whole account in one folder.
            // A child costs the mount about 1 KB while its listing is read.
            max_listing_entries: crate::store::DEFAULT_MAX_NODES_PER_ACCOUNT,
            max_listing_bytes: super::MAX_LISTING_BYTES,
            upload_limit: None,
            download_limit: None,
            relogin: None,
        }
    }
}

/// The `Authorization` header of `email` and `token` (none without both).
fn auth_header(email: &str, token: &Secret) -> Result<Option<HeaderValue>> {
    if email.is_empty() || token.is_empty() {
        return Ok(None);
    }
    use base64::Engine;
    let raw = format!("{email}:{}", token.expose());
    let value = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    let mut v = HeaderValue::from_str(&value).map_err(|_| {
        Error::bad_request("bad_credentials", "the e-mail address is not valid here")
    })?;
    v.set_sensitive(true); // kept out of debug output
    Ok(Some(v))
}

#[derive(Clone)]
pub struct RemoteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The change feed's long polls, on connections of their own: one held for its wait
    /// would otherwise be the warm connection the user's next request finds taken (a new
    /// one: a round trip more, at 150 ms half a cold `ls -l`).
    waits: reqwest::Client,
    /// Base URL without a trailing slash.
    base: String,
    /// Swapped for a newer login's (`RemoteConfig::relogin`).
    auth: std::sync::RwLock<Option<HeaderValue>>,
    config: RemoteConfig,
    ranges: AtomicU8,
    /// What the server said it offers beyond the interface (`api::EXTENSIONS`): it checks a
    /// DELETE's condition itself; it takes a file's bytes in one request.
    deletes_checked: AtomicBool,
    whole_puts: AtomicBool,
    /// ... and many small files in one (`batch`).
    batch_puts: AtomicBool,
    /// The md5 (hex) of each version announced in step 2 and not yet sent, by (file ID,
    /// version ID): step 3's answer is checked against it, also when step 2 had to go without.
    announced: Mutex<HashMap<(String, String), String>>,
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
        let auth = auth_header(&config.email, &config.token)?;
        let client = |idle: usize| {
            reqwest::Client::builder()
                .connect_timeout(config.connect_timeout)
                .read_timeout(config.idle_timeout)
                .pool_idle_timeout(Duration::from_secs(60))
                // At most this many kept idle (rclone keeps twice its checkers and transfers):
                // otherwise every connection a burst of requests opens stays, a descriptor
                // each, for the idle timeout, toward the daemon's open-files limit.
                .pool_max_idle_per_host(idle)
                // Connections kept warm between bursts (a new one costs a round trip, more
                // with TLS), and small requests sent at once.
                .tcp_keepalive(Duration::from_secs(30))
                .tcp_nodelay(true)
                .user_agent(concat!("vaultfs/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| Error::internal(format!("cannot set up the HTTP client: {e}")))
        };
        Ok(RemoteBackend {
            inner: Arc::new(Inner {
                http: client(IDLE_CONNECTIONS)?,
                waits: client(1)?,
                base,
                auth: std::sync::RwLock::new(auth),
                config,
                ranges: AtomicU8::new(RANGES_UNKNOWN),
                deletes_checked: AtomicBool::new(false),
                whole_puts: AtomicBool::new(false),
                batch_puts: AtomicBool::new(false),
                announced: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The files and folders deleted from the folder at `path` and kept restorable (our
    /// server's `deleted=1`; a server without it lists none and says so).
    pub async fn deleted_files(&self, path: &NodePath) -> Result<Vec<crate::api::DeletedFile>> {
        let node = self
            .call_node(Req::get(format!("{}?deleted=1", path.encoded())))
            .await?;
        node.deleted.ok_or_else(super::no_deleted)
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

    /// The `Authorization` header in use.
    fn auth(&self) -> Option<HeaderValue> {
        self.inner
            .auth
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// After the server refused the token: a newer login of the same user (`vaultfs login`
    /// while mounted) takes its place. True when there was one to take.
    fn take_newer_login(&self) -> bool {
        let Some(Relogin(read)) = &self.inner.config.relogin else {
            return false;
        };
        let Some(Ok(Some(newer))) = read().map(|t| auth_header(&self.inner.config.email, &t))
        else {
            return false;
        };
        let mut auth = self.inner.auth.write().unwrap_or_else(|e| e.into_inner());
        if auth.as_ref() == Some(&newer) {
            return false;
        }
        *auth = Some(newer);
        log::info!(
            "the server refused the token in use: took the newer login of {} for {} (vaultfs login)",
            self.inner.config.email,
            self.inner.base
        );
        true
    }

    /// What the server offers beyond the interface, from an answer's `api::EXTENSIONS` (our
    /// server says it on every answer, so it is known from the first; a server that never
    /// says it gets the interface alone).
    fn learn_extensions(&self, headers: &header::HeaderMap) {
        let Some(list) = headers
            .get(crate::api::EXTENSIONS)
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        for ext in list.split(',').map(str::trim) {
            let flag = match ext {
                crate::api::EXT_DELETE_IF => &self.inner.deletes_checked,
                crate::api::EXT_WHOLE_PUT => &self.inner.whole_puts,
                crate::api::EXT_BATCH_PUT => &self.inner.batch_puts,
                _ => continue,
            };
            flag.store(true, Ordering::Relaxed);
        }
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
}

impl Backend for RemoteBackend {
    fn listing_limits(&self) -> Option<super::ListingLimits> {
        let c = &self.inner.config;
        Some(super::ListingLimits {
            entries: c.max_listing_entries,
            bytes: c.max_listing_bytes,
            time: c.total_timeout.saturating_mul(super::LISTING_TIMEOUTS),
        })
    }

    async fn changes(
        &self,
        cursor: Option<u64>,
        wait: Duration,
    ) -> Result<Option<crate::api::ChangesPage>> {
        self.feed(cursor, wait).await
    }

    async fn search(
        &self,
        dir: &NodePath,
        query: &str,
        limit: u64,
    ) -> Result<crate::api::SearchResults> {
        self.find(dir, query, limit).await
    }

    async fn usage(&self) -> Result<Option<crate::api::Usage>> {
        self.account_usage().await
    }

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
        let parent: Node = match self.call_node(req).await {
            // A server that refuses an existing name: the file is there, and step 2 adds a
            // version to it (a folder of that name stays a conflict).
            Err(e) if e.already_exists() => {
                let file = self.node(&folder.child(name)?).await?;
                return match file.file_id() {
                    Some(id) if file.is_file() => Ok(Node {
                        id: Some(id),
                        ..file
                    }),
                    _ => Err(e),
                };
            }
            other => other?,
        };
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

    async fn create_files(&self, folder: &NodePath, names: &[String]) -> Result<Vec<Result<Node>>> {
        if names.len() == 1 {
            return Ok(vec![self.create_file(folder, &names[0]).await]);
        }
        let entries: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({ "name": n }))
            .collect();
        let body = serde_json::json!({ "create_file": entries });
        let req = Req::with_body(Method::PUT, folder.encoded(), &body, Retry::Idempotent);
        let what = req.what();
        let parent = match self.call_node(req).await {
            Ok(p) => p,
            // One name refused (a folder of that name; a server that refuses existing names)
            // fails the whole request: each name alone says which.
            Err(e)
                if e.already_exists()
                    || matches!(
                        e.kind,
                        ErrorKind::Conflict | ErrorKind::BadRequest | ErrorKind::TooLarge
                    ) =>
            {
                let mut out = Vec::with_capacity(names.len());
                for n in names {
                    out.push(self.create_file(folder, n).await);
                }
                return Ok(out);
            }
            Err(e) => return Err(e),
        };
        let mut by_name: HashMap<String, Node> = parent
            .children
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();
        Ok(names
            .iter()
            .map(|n| {
                let mut node = by_name.remove(n).ok_or_else(|| {
                    bad_response(format!("{what}: `{n}` is not among the children"))
                })?;
                let id = node
                    .file_id()
                    .ok_or_else(|| bad_response(format!("{what}: the new file has no ID")))?;
                node.id = Some(id);
                Ok(node)
            })
            .collect())
    }

    async fn begin_version_with(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        self.announce_version(file_id, length, md5, attrs, base)
            .await
    }

    async fn set_attrs(&self, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        self.update_attrs(file_id, attrs).await
    }

    async fn upload(
        &self,
        file_id: &str,
        version_id: &str,
        length: u64,
        body: ByteStream,
    ) -> Result<Node> {
        self.send_version(file_id, version_id, length, body).await
    }

    /// Our server's route (`deleted_files` gives the IDs).
    async fn restore_deleted(&self, id: &str) -> Result<Node> {
        let path = format!("/files/id/Document/{}/restore", encode_segment(id));
        self.call_node(Req::with_body(
            Method::POST,
            path,
            &serde_json::json!({}),
            Retry::UnsentOnly,
        ))
        .await
    }

    async fn versions(&self, path: &NodePath) -> Result<Vec<Version>> {
        let node = self
            .call_node(Req::get(format!("{}?vprop=1", path.encoded())))
            .await?;
        node.versions.ok_or_else(super::no_versions)
    }

    async fn locks(&self, path: &NodePath) -> Result<Vec<Lock>> {
        // A server without them answers the node alone.
        let node = self
            .call_node(Req::get(format!("{}?locks=1", path.encoded())))
            .await?;
        Ok(node.locks.unwrap_or_default())
    }

    async fn download_version(
        &self,
        file_id: &str,
        version_id: &str,
        range: Option<RangeRequest>,
    ) -> Result<Download> {
        // A route of ours: the public service answers it 404, never with the current bytes.
        let path = format!(
            "/files/id/Document/{}/version/{}",
            encode_segment(file_id),
            encode_segment(version_id)
        );
        self.fetch(path, file_id, range, None).await
    }

    async fn download(&self, file_id: &str, range: Option<RangeRequest>) -> Result<Download> {
        self.download_sized(file_id, range, None).await
    }

    async fn download_sized(
        &self,
        file_id: &str,
        range: Option<RangeRequest>,
        size: Option<u64>,
    ) -> Result<Download> {
        let path = format!("/files/id/Document/{}", encode_segment(file_id));
        self.fetch(path, file_id, range, size).await
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

    async fn delete_if(&self, path: &NodePath, base: &Base) -> Result<()> {
        let mut req = Req::get(path.encoded());
        req.method = Method::DELETE;
        req.retry = Retry::UnsentOnly;
        // Our own headers: a server that does not know them ignores them.
        req.headers.extend(base.header());
        self.call::<serde_json::Value>(req).await.map(|_| ())
    }

    fn batches(&self) -> Option<&dyn super::Batches> {
        match self.inner.batch_puts.load(Ordering::Relaxed) {
            true => Some(self),
            false => None,
        }
    }

    fn checks_deletes(&self) -> bool {
        self.inner.deletes_checked.load(Ordering::Relaxed)
    }

    fn puts_whole(&self) -> bool {
        self.inner.whole_puts.load(Ordering::Relaxed)
    }

    async fn put_whole(&self, whole: super::Whole<'_>, body: ByteStream) -> Result<Node> {
        self.send_whole(whole, body).await
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
        self.fetch(path, file_id, None, None).await
    }
}

fn transfer_req(op: &str, src: &NodePath, dst: &NodePath, replace: bool, retry: Retry) -> Req {
    // The documented sample's spelling; our server matches it in any case.
    let replace = if replace { "Replace" } else { "Fail" };
    let body = serde_json::json!({ op: { "dst_uri": dst.uri(), "replace": replace } });
    Req::with_body(Method::POST, src.encoded(), &body, retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_debug_hides_the_token() {
        let c = RemoteConfig::new("http://x", "a@b.c", "s3cret-token");
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
