//! `vaultfs serve`: the interface over HTTP (axum), exactly as docs/design.md §2 decides, backed by the
//! local backend scoped to the caller's account.

mod auth;
mod batch;
mod changes;
pub mod conn;
mod context;
mod dav;
mod files;
mod health;
pub mod limits;
mod links;
mod nodes;
mod openapi;
mod pin;
pub mod proxy;
mod reply;
mod request_id;
mod search;
mod usage;
mod web;
mod whole;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{Error, ErrorKind};
use crate::store::Store;
pub use openapi::openapi_path;
pub use reply::ApiError;

/// Settings of the HTTP side (the store has its own).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest JSON request body, in bytes.
    pub max_json_body: usize,
    /// Base URL that authorization links and the web links of files (`link_uri`, ...) start
    /// with; by default the latter are taken from the request's Host (`links`).
    pub public_url: Option<String>,
    /// An upload body that sends nothing, or a client that reads nothing of an answer, for
    /// this long is cut off (see [`limits`]).
    pub transfer_idle_timeout: Duration,
    /// Uploads (step 3) and downloads one user may run at once; beyond: 503 with Retry-After.
    pub max_transfers_per_user: usize,
    /// Long polls of the change feed one user may hold at once; beyond: 503 with Retry-After.
    pub max_waits_per_user: usize,
    /// Password checks (argon2id) run at once; by default the number of cores.
    pub password_checks: usize,
    /// Sign-ins that may wait for a password check; beyond: 503 with Retry-After.
    pub password_queue: usize,
    /// The head of a request, and the next one on a kept-alive connection, must come within
    /// this (see [`conn`]).
    pub header_timeout: Duration,
    /// Connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// Connections one source address may hold; more are closed at once.
    pub max_connections_per_source: usize,
    /// Reverse proxies whose forwarding header names the client (see [`proxy`]); none by
    /// default: the client is the address a connection comes from.
    pub trusted_proxies: Vec<proxy::Cidr>,
    /// The header they name it in.
    pub proxy_header: proxy::ProxyHeader,
    /// WebDAV at `/dav/` (see [`dav`]); on by default.
    pub webdav: bool,
    /// WebDAV's Basic authentication also over plain HTTP from other machines (off: only from
    /// loopback or through a trusted proxy that got the request over HTTPS).
    pub webdav_allow_http: bool,
}

/// Defaults of the limits (`vaultfs serve --help` shows them).
pub const DEFAULT_TRANSFER_IDLE_SECS: u64 = 60;
pub const DEFAULT_MAX_TRANSFERS_PER_USER: usize = 128;
pub const DEFAULT_MAX_WAITS_PER_USER: usize = 16;
pub const DEFAULT_PASSWORD_QUEUE: usize = 64;
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 256;

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_json_body: 64 * 1024,
            public_url: None,
            transfer_idle_timeout: Duration::from_secs(DEFAULT_TRANSFER_IDLE_SECS),
            max_transfers_per_user: DEFAULT_MAX_TRANSFERS_PER_USER,
            max_waits_per_user: DEFAULT_MAX_WAITS_PER_USER,
            password_checks: limits::cores(),
            password_queue: DEFAULT_PASSWORD_QUEUE,
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            trusted_proxies: Vec::new(),
            proxy_header: proxy::ProxyHeader::default(),
            webdav: true,
            webdav_allow_http: false,
        }
    }
}

#[derive(Clone)]
pub(crate) struct AppState {
    store: Arc<Store>,
    options: Arc<ServerOptions>,
    limits: Arc<limits::Limits>,
    openapi: openapi::Document,
    dav: dav_server::DavHandler<dav::DavCaller>,
}

/// Every route of the interface, the authorization page and `/openapi.json`, each registered
/// from its handler's `#[utoipa::path]` attribute (the one source of both the routing and the
/// document). Register routes here and only through `routes!`: `tests/openapi.rs` checks that
/// the document and the router list the same routes.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(
            nodes::get_root,
            nodes::put_root,
            nodes::post_root,
            nodes::delete_root
        ))
        .routes(routes!(nodes::get, nodes::put, nodes::post, nodes::delete))
        .routes(routes!(nodes::begin_version))
        .routes(routes!(files::download_version))
        .routes(routes!(files::restore_version))
        .routes(routes!(files::restore_deleted))
        .routes(routes!(nodes::upload))
        .routes(routes!(batch::batch))
        .routes(routes!(changes::changes))
        .routes(routes!(search::search))
        .routes(routes!(usage::usage))
        .routes(routes!(files::download))
        .routes(routes!(files::preview))
        .routes(routes!(files::preview_page))
        .routes(routes!(pin::end))
        .routes(routes!(pin::auth))
        .routes(routes!(pin::page, pin::sign_in))
        .routes(routes!(openapi::document))
        .routes(routes!(health::healthz))
}

/// The OpenAPI 3.1 document of the server, as `GET /openapi.json` serves it.
pub fn openapi() -> utoipa::openapi::OpenApi {
    openapi::finish(routes().into_openapi())
}

/// The application: every route of the interface, the authorization page, the OpenAPI
/// document, the envelope on every failure, and beside them the web interface's pages and
/// WebDAV at `/dav/` (not API routes, so not in the document: see [`web`] and [`dav`]).
pub fn router(store: Arc<Store>, options: ServerOptions) -> Router {
    let (app, doc) = routes().split_for_parts();
    let doc = openapi::finish(doc)
        .to_json()
        .expect("the OpenAPI document serializes");
    let state = AppState {
        dav: dav::handler(store.clone()),
        store,
        options: Arc::new(options.clone()),
        limits: Arc::new(limits::Limits::new(&options)),
        openapi: Arc::new(doc),
    };
    let app = app.merge(web::router());
    // WebDAV is a protocol of its own beside the API, not in the OpenAPI document (docs/design.md
    // §4).
    let app = if options.webdav {
        app.merge(dav::router())
    } else {
        app
    };
    app.fallback(|| async {
        ApiError(Error::new(
            ErrorKind::NotFound,
            "unknown_route",
            "no such route",
        ))
    })
    .layer(DefaultBodyLimit::max(options.max_json_body))
    .layer(axum::middleware::from_fn_with_state(
        options.transfer_idle_timeout,
        conn::body_idle_limited,
    ))
    .layer(axum::middleware::from_fn_with_state(
        Arc::new(links::LinkBase {
            public_url: options.public_url.clone(),
            trusted_proxies: options.trusted_proxies.clone(),
        }),
        links::absolute_links,
    ))
    .layer(axum::middleware::from_fn(context::request_context))
    .with_state(state)
}

/// Serves until `shutdown` resolves (see [`shutdown_signal`]), then finishes the requests in
/// flight. The connections are bounded and timed as [`conn`] says.
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Arc<Store>,
    options: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    log::info!(
        "serving {} (blobs in {}) on http://{addr}",
        store.dir().display(),
        store.blobs_location()
    );
    let app = router(store, options.clone());
    conn::serve(listener, app, &options, shutdown).await
}

/// `wanted` connections, or fewer when the open-file limit (raised to its hard limit first) could
/// not hold two descriptors for each (its socket and a file being downloaded) and some to spare:
/// a server out of descriptors accepts nothing, for anyone.
pub fn connections_within_open_file_limit(wanted: usize) -> usize {
    let limit = crate::api::files::raise_open_file_limit() as usize;
    let fits = limit.saturating_sub(64) / 2;
    if wanted > fits {
        log::warn!(
            "--max-connections {wanted} lowered to {fits}: the open-file limit is {limit} (ulimit -n)"
        );
    }
    wanted.min(fits).max(1)
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, so call it
/// before the port opens: a SIGTERM that comes as soon as clients can connect must still shut
/// down cleanly, not kill the process.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        log::info!("shutting down");
    })
}
