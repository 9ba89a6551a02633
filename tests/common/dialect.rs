//! A second server for the tests, written from the interface and the public service's
//! documented samples rather than from `vaultfs serve`: it answers strictly in the documented
//! shapes. Integer `error_code`s and no `error_name`, "Object already exists" with HTTP 500
//! (also for `create_file` on an existing name), md5 in base64 (a hex md5 in step 2 is refused),
//! `Replace`/`Fail` spelled as the sample spells them, downloads chunked with no Content-Length
//! and no ranges, sizes and counts as strings, IDs as numbers, dates with an offset or as
//! `/Date(ms)/`, `per_page` capped, its own registered client ID, numeric pins (with a leading
//! zero). Behind the HTTP surface the files live in a built-in store (through `LocalBackend`),
//! so the contract's checks on the store work here too.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use vaultfs::api::{Error, ErrorKind, Node, NodePath, PageSize, parse_time};
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;
use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
use vaultfs::store::{Store, StoreConfig};

/// The client ID registered with this server (the only one it accepts).
pub const DIALECT_CLIENT: &str = "acme-docs-7f3a";

#[derive(Clone, Copy)]
pub struct DialectOptions {
    /// Most children a listing page holds, whatever `per_page` asks.
    pub per_page_cap: u64,
    /// Refuses every `md5_checksum` in step 2 (a server that knows another form).
    pub refuse_checksums: bool,
    /// Sends `total_children` with listings.
    pub counts: bool,
}

impl Default for DialectOptions {
    fn default() -> Self {
        DialectOptions {
            per_page_cap: 50,
            refuse_checksums: false,
            counts: true,
        }
    }
}

struct User {
    account: i64,
    pin: u64,
    tokens: Vec<String>,
}

struct Shared {
    store: Arc<Store>,
    options: DialectOptions,
    users: Mutex<HashMap<String, User>>,
    base: String,
    /// Requests answered, by method and path.
    log: Mutex<Vec<String>>,
}

pub struct DialectServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub store: Arc<Store>,
    shared: Arc<Shared>,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for DialectServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl DialectServer {
    pub async fn start(options: DialectOptions) -> DialectServer {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Self::start_in(&tmp.path().join("data"), options).await;
        s._tmp = Some(tmp);
        s
    }

    /// A server over the store in `dir`.
    pub async fn start_in(dir: &std::path::Path, options: DialectOptions) -> DialectServer {
        let store = Arc::new(Store::open(dir, StoreConfig::default()).unwrap());
        store
            .start_previews(1, std::path::Path::new(super::mount::BIN))
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            store: store.clone(),
            options,
            users: Mutex::new(HashMap::new()),
            base: base.clone(),
            log: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let (tx, _task) = super::serve(listener, app, Default::default());
        DialectServer {
            base,
            store,
            shared,
            _tmp: None,
            stop: Some(tx),
        }
    }

    /// A user of `account` (created with its vault if new); returns the user's pin, shown
    /// with its leading zero as the service's page shows pins.
    pub fn add_user(&self, email: &str, account: &str) -> String {
        self.store.add_user(email, account, "unused").unwrap();
        let account = self.store.ensure_account(account).unwrap();
        let mut users = self.shared.users.lock().unwrap();
        let pin = 4_711_000 + users.len() as u64;
        users.insert(
            email.to_string(),
            User {
                account,
                pin,
                tokens: Vec::new(),
            },
        );
        format!("{pin:08}")
    }

    /// How many requests `METHOD path` (query left off) came in.
    pub fn requests(&self, what: &str) -> usize {
        self.shared
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| *r == what)
            .count()
    }

    /// The pin flow as vaultfs does it (`/pin/end` with the registered client ID, the page,
    /// `/pin/auth`), through the remote backend's own calls; returns the token.
    pub async fn login(&self, email: &str) -> String {
        let remote = RemoteBackend::new(RemoteConfig::new(&self.base, "", "")).unwrap();
        let page_uri = remote.pin_end(DIALECT_CLIENT).await.unwrap();
        let pin = pin_from_page(&page_uri, email).await;
        remote
            .pin_auth(email, DIALECT_CLIENT, &pin)
            .await
            .unwrap()
            .token
    }
}

impl DialectServer {
    /// A new user of `account`, logged in: the remote backend as that user.
    pub async fn user(&self, email: &str, account: &str) -> RemoteBackend {
        self.add_user(email, account);
        let token = self.login(email).await;
        RemoteBackend::new(RemoteConfig::new(&self.base, email, &token)).unwrap()
    }
}

/// What a person does with the authorization page: sign in with the e-mail, read the pin.
pub async fn pin_from_page(page_uri: &str, email: &str) -> String {
    let html = reqwest::Client::new()
        .post(page_uri)
        .form(&[("email", email)])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    super::pin_in(&html).unwrap_or_else(|| panic!("no pin on the page: {html}"))
}

// ----- answers -----

fn envelope(status: StatusCode, v: Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/json; charset=utf-8".parse().unwrap(),
    );
    r
}

fn ok(message: Value) -> Response {
    envelope(
        StatusCode::OK,
        json!({"error": {"success": true}, "message": message}),
    )
}

/// The error object: an integer code, a text, a request id and the status; nothing else.
fn fail(status: u16, code: i64, text: &str) -> Response {
    envelope(
        StatusCode::from_u16(status).unwrap(),
        json!({"error": {
            "success": false,
            "error_code": code,
            "error_text": text,
            "instance_guid": format!("{:032x}", rand::random::<u128>()),
            "status_code": status,
        }}),
    )
}

/// The documented codes where the documentation has one; others are this server's own.
fn failure(e: &Error) -> Response {
    match e.kind {
        ErrorKind::NotFound => fail(404, -520093684, "Object not found."),
        ErrorKind::Conflict if e.code == "exists" => {
            fail(500, -1593835510, "Object already exists")
        }
        ErrorKind::BadRequest => fail(400, -2147467259, &e.message),
        ErrorKind::Auth => fail(401, -1593835519, "Authorization failed."),
        ErrorKind::Forbidden => fail(403, -2147024891, &e.message),
        ErrorKind::Conflict => fail(409, -1593835509, &e.message),
        ErrorKind::RangeNotSatisfiable => fail(416, -2147024809, &e.message),
        _ => fail(500, -2147418113, &e.message),
    }
}

fn bad_body(why: &str) -> Response {
    fail(400, -2147467259, why)
}

/// A node as the service writes it: see the module documentation.
fn node_json(n: &Node) -> Value {
    let mut v = serde_json::to_value(n).unwrap();
    reshape(&mut v);
    v
}

fn reshape(v: &mut Value) {
    let Some(o) = v.as_object_mut() else { return };
    for key in ["size", "total_children"] {
        if let Some(n) = o.get(key).and_then(Value::as_u64) {
            o.insert(key.into(), json!(n.to_string()));
        }
    }
    if let Some(id) = o
        .get("id")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<u64>().ok())
    {
        o.insert("id".into(), json!(id));
    }
    if let Some(m) = o.get("md5_checksum").and_then(Value::as_str) {
        o.insert("md5_checksum".into(), json!(base64_md5(m)));
    }
    if let Some(t) = o
        .get("createdOn")
        .and_then(Value::as_str)
        .and_then(parse_time)
    {
        let ms = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        o.insert("createdOn".into(), json!(format!("/Date({ms})/")));
    }
    if let Some(t) = o
        .get("modifiedOn")
        .and_then(Value::as_str)
        .and_then(parse_time)
    {
        let at = time::OffsetDateTime::from(t)
            .to_offset(time::UtcOffset::from_hms(-5, 0, 0).unwrap())
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        o.insert("modifiedOn".into(), json!(at));
    }
    if let Some(ex) = o.get_mut("fileExProperties").and_then(Value::as_object_mut) {
        // Only the upload address: the version ID is its last segment.
        ex.remove("version_id");
    }
    if let Some(kids) = o.get_mut("children").and_then(Value::as_array_mut) {
        kids.iter_mut().for_each(reshape);
    }
}

fn base64_md5(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The hex of a base64 md5, which is all step 2 takes.
fn md5_from_base64(s: &str) -> Option<String> {
    let b = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    (b.len() == 16).then(|| b.iter().map(|x| format!("{x:02x}")).collect())
}

// ----- the routes -----

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .map(|q| {
            url_pairs(q)
                .into_iter()
                .collect::<HashMap<String, String>>()
        })
        .unwrap_or_default();
    let method = parts.method.clone();
    s.log.lock().unwrap().push(format!("{method} {path}"));
    match (method.clone(), path.as_str()) {
        (Method::POST, "/pin/end") => return pin_end(&s, body).await,
        (Method::POST, "/pin/auth") => return pin_auth(&s, body).await,
        (Method::GET, "/authorize") => {
            return html("<form method=\"post\"><input name=\"email\"></form>".into());
        }
        (Method::POST, "/authorize") => return authorize(&s, body).await,
        _ => {}
    }
    let Some(b) = caller(&s, &parts.headers) else {
        return fail(401, -1593835519, "Authorization failed.");
    };
    let r = if path == "/nodes/pth" || path.starts_with("/nodes/pth/") {
        let np = match NodePath::parse_encoded(&path["/nodes/pth".len()..]) {
            Ok(p) => p,
            Err(e) => return failure(&e),
        };
        match method {
            Method::GET => get_node(&s, &b, &np, &query).await,
            Method::PUT => put_node(&b, &np, body).await,
            Method::POST => transfer(&b, &np, body).await,
            Method::DELETE => b
                .delete(&np)
                .await
                .map(|()| envelope(StatusCode::OK, json!({"error": {"success": true}}))),
            _ => Ok(fail(405, -2147467263, "Not implemented")),
        }
    } else if let Some(rest) = path.strip_prefix("/nodes/upload/") {
        match (method, rest.split_once('/')) {
            (Method::PUT, None) => begin_version(&s, &b, rest, body).await,
            (Method::PUT, Some((id, vid))) => upload(&b, id, vid, &parts.headers, body).await,
            _ => Ok(fail(405, -2147467263, "Not implemented")),
        }
    } else if let Some(id) = path.strip_prefix("/files/id/Document/") {
        b.download(id, None).await.map(|d| {
            let etag = d.node.md5_checksum.as_deref().map(base64_md5);
            chunked(d.body, "application/octet-stream", etag)
        })
    } else if let Some(rest) = path.strip_prefix("/preview/id/Document/") {
        preview(&b, rest, &query).await
    } else {
        Ok(fail(404, -520093684, "Object not found."))
    };
    r.unwrap_or_else(|e| failure(&e))
}

fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

fn html(body: String) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "text/html".parse().unwrap());
    r
}

async fn json_body(body: Body) -> Result<Value, Response> {
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .map_err(|_| bad_body("The request body could not be read."))?;
    serde_json::from_slice(&bytes).map_err(|_| bad_body("The request body is not valid JSON."))
}

/// The backend of the account whose user the Basic credentials name.
fn caller(s: &Shared, h: &HeaderMap) -> Option<LocalBackend> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(v.strip_prefix("Basic ")?)
        .ok()?;
    let (email, token) = std::str::from_utf8(&raw).ok()?.split_once(':')?;
    let users = s.users.lock().unwrap();
    let u = users.get(email)?;
    u.tokens
        .iter()
        .any(|t| t == token)
        .then(|| LocalBackend::for_account(s.store.clone(), u.account))
}

async fn pin_end(s: &Shared, body: Body) -> Response {
    let v = match json_body(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    match v["client_id"].as_str() {
        Some(DIALECT_CLIENT) => ok(json!({
            "authorization_uri": format!("{}/authorize?client_id={DIALECT_CLIENT}", s.base)
        })),
        Some(_) => bad_body("The client ID is not registered."),
        None => bad_body("client_id is missing."),
    }
}

/// The page after signing in: the pin, with its leading zero.
async fn authorize(s: &Shared, body: Body) -> Response {
    let bytes = axum::body::to_bytes(body, 1 << 16)
        .await
        .unwrap_or_default();
    let form = url_pairs(&String::from_utf8_lossy(&bytes).replace('+', " "));
    let email = form
        .iter()
        .find(|(k, _)| k == "email")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    match s.users.lock().unwrap().get(&email) {
        Some(u) => html(format!("<p>Your pin: <b id=\"pin\">{:08}</b></p>", u.pin)),
        None => html("<p>Unknown user</p>".into()),
    }
}

async fn pin_auth(s: &Shared, body: Body) -> Response {
    let v = match json_body(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (Some(email), Some(client), Some(pin)) = (
        v["user_email"].as_str(),
        v["pin_info"]["client_id"].as_str(),
        // A number, as the reference types it.
        v["pin_info"]["pin"].as_u64(),
    ) else {
        return bad_body("A parameter is missing or has the wrong type.");
    };
    if client != DIALECT_CLIENT {
        return bad_body("The client ID is not registered.");
    }
    let mut users = s.users.lock().unwrap();
    match users.get_mut(email) {
        Some(u) if u.pin == pin => {
            let token = format!("{:032x}", rand::random::<u128>());
            u.tokens.push(token.clone());
            ok(json!({"token": token, "expires_in": "1209600", "id": 4711 + u.account}))
        }
        _ => fail(401, -1593835519, "Authorization failed."),
    }
}

async fn get_node(
    s: &Shared,
    b: &LocalBackend,
    p: &NodePath,
    q: &HashMap<String, String>,
) -> vaultfs::api::Result<Response> {
    let num = |k: &str, d: u64| q.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let node = if q.get("children").is_some_and(|c| c != "0") {
        // Capped pages: the page number counts pages of the capped size.
        let per_page = num("per_page", 100).clamp(1, s.options.per_page_cap);
        b.list(p, num("page", 0), per_page).await?
    } else {
        b.node(p).await?
    };
    let mut v = node_json(&node);
    if !s.options.counts {
        v.as_object_mut().unwrap().remove("total_children");
    }
    Ok(ok(v))
}

async fn put_node(b: &LocalBackend, p: &NodePath, body: Body) -> vaultfs::api::Result<Response> {
    let v = match json_body(body).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let Some(list) = v.get("create_file") else {
        // Folders are outside the documented part: `{}` makes one, as docs/design.md decides.
        return Ok(ok(node_json(&b.create_folder(p).await?)));
    };
    let Some(name) = list[0]["name"].as_str() else {
        return Ok(bad_body("The file name is missing."));
    };
    // This server refuses an existing name.
    if let Ok(child) = p.child(name) {
        if b.node(&child).await.is_ok() {
            return Ok(fail(500, -1593835510, "Object already exists"));
        }
    }
    let file = b.create_file(p, name).await?;
    let mut folder = b.node(p).await?;
    folder.children = Some(vec![file]);
    Ok(ok(node_json(&folder)))
}

async fn transfer(b: &LocalBackend, src: &NodePath, body: Body) -> vaultfs::api::Result<Response> {
    let v = match json_body(body).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let (op, t) = match (v.get("copy"), v.get("move")) {
        (Some(t), None) => ("copy", t),
        (None, Some(t)) => ("move", t),
        _ => return Ok(bad_body("The body must hold copy or move.")),
    };
    // The sample's spelling, and nothing else.
    let replace = match t["replace"].as_str() {
        Some("Replace") => true,
        Some("Fail") => false,
        _ => return Ok(bad_body("replace must be Replace or Fail.")),
    };
    let Some(dst) = t["dst_uri"].as_str() else {
        return Ok(bad_body("dst_uri is missing."));
    };
    let dst = NodePath::parse_uri(dst)?;
    let node = if op == "copy" {
        b.copy(src, &dst, replace).await?
    } else {
        b.rename(src, &dst, replace).await?
    };
    Ok(ok(node_json(&node)))
}

async fn begin_version(
    s: &Shared,
    b: &LocalBackend,
    id: &str,
    body: Body,
) -> vaultfs::api::Result<Response> {
    let v = match json_body(body).await {
        Ok(v) => v,
        Err(r) => return Ok(r),
    };
    let Some(length) = v["length"].as_u64() else {
        return Ok(bad_body("length is missing or not a number."));
    };
    let md5 = match v.get("md5_checksum").and_then(Value::as_str) {
        None => None,
        Some(_) if s.options.refuse_checksums => {
            return Ok(bad_body("md5_checksum is not in the expected form."));
        }
        Some(m) => match md5_from_base64(m) {
            Some(hex) => Some(hex),
            None => return Ok(bad_body("md5_checksum is not a base64 md5.")),
        },
    };
    let node = b.begin_version(id, length, md5.as_deref()).await?;
    Ok(ok(node_json(&node)))
}

async fn upload(
    b: &LocalBackend,
    id: &str,
    vid: &str,
    h: &HeaderMap,
    body: Body,
) -> vaultfs::api::Result<Response> {
    if h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) != Some("application/binary") {
        return Ok(bad_body("Content-Type must be application/binary."));
    }
    let Some(length) = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
    else {
        return Ok(bad_body("The length of the bytes is missing."));
    };
    let stream = body.into_data_stream().map(|r| r.map_err(io::Error::other));
    let node = b.upload(id, vid, length, Box::pin(stream)).await?;
    Ok(ok(node_json(&node)))
}

/// A body sent chunked: no Content-Length, no ranges.
fn chunked(body: vaultfs::backend::ByteStream, ctype: &str, etag: Option<String>) -> Response {
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, ctype.parse().unwrap());
    if let Some(e) = etag {
        r.headers_mut()
            .insert(header::ETAG, format!("\"{e}\"").parse().unwrap());
    }
    r
}

async fn preview(
    b: &LocalBackend,
    rest: &str,
    q: &HashMap<String, String>,
) -> vaultfs::api::Result<Response> {
    let (id, what) = rest.split_once('/').unwrap_or((rest, ""));
    match what {
        "" => {
            let meta = b.preview(id).await?;
            let mut v = serde_json::to_value(&meta).unwrap();
            for p in v["pages"].as_array_mut().into_iter().flatten() {
                for k in ["width", "height"] {
                    let n = p[k].as_u64().unwrap();
                    p[k] = json!(n.to_string());
                }
            }
            Ok(ok(v))
        }
        "pdf" => {
            let d = b.preview_pdf(id).await?;
            Ok(chunked(d.body, "application/pdf", None))
        }
        page => {
            let Ok(n) = page.parse() else {
                return Ok(fail(404, -520093684, "Object not found."));
            };
            let num = |k: &str| q.get(k).and_then(|v| v.parse().ok());
            let size = PageSize {
                scale: num("scale"),
                max_width: num("max_width"),
                max_height: num("max_height"),
            };
            let img = b.preview_page(id, n, size).await?;
            let mut r = (StatusCode::OK, img.data).into_response();
            r.headers_mut()
                .insert(header::CONTENT_TYPE, img.content_type.parse().unwrap());
            Ok(r)
        }
    }
}
