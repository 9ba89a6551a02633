//! `vaultfs serve`: the interface over HTTP (axum), exactly as DESIGN.md §2 decides, backed by the
//! local backend scoped to the caller's account.

mod auth;
mod context;
mod files;
mod nodes;
mod pin;
mod reply;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};

use crate::api::{Error, ErrorKind};
use crate::store::Store;
pub use reply::ApiError;

/// Settings of the HTTP side (the store has its own).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest JSON request body, in bytes.
    pub max_json_body: usize,
    /// Base URL that authorization links start with; by default taken from the request's Host.
    pub public_url: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_json_body: 64 * 1024,
            public_url: None,
        }
    }
}

#[derive(Clone)]
pub(crate) struct AppState {
    store: Arc<Store>,
    options: Arc<ServerOptions>,
}

/// The application: every route of the interface, the authorization page, and the envelope on
/// every failure.
pub fn router(store: Arc<Store>, options: ServerOptions) -> Router {
    let state = AppState {
        store,
        options: Arc::new(options.clone()),
    };
    Router::new()
        .route(
            "/nodes/pth",
            get(nodes::get)
                .put(nodes::put)
                .post(nodes::post)
                .delete(nodes::delete),
        )
        .route(
            "/nodes/pth/{*rest}",
            get(nodes::get)
                .put(nodes::put)
                .post(nodes::post)
                .delete(nodes::delete),
        )
        .route("/nodes/upload/{id}", put(nodes::begin_version))
        .route("/nodes/upload/{id}/{version}", put(nodes::upload))
        .route("/files/id/Document/{id}", get(files::download))
        .route("/preview/id/Document/{id}", get(files::preview))
        .route("/preview/id/Document/{id}/{page}", get(files::preview_page))
        .route("/pin/end", post(pin::end))
        .route("/pin/auth", post(pin::auth))
        .route("/pin/authorize", get(pin::page).post(pin::sign_in))
        .fallback(|| async {
            ApiError(Error::new(
                ErrorKind::NotFound,
                "unknown_route",
                "no such route",
            ))
        })
        .layer(DefaultBodyLimit::max(options.max_json_body))
        .layer(axum::middleware::from_fn(context::request_context))
        .with_state(state)
}

/// Serves until SIGINT or SIGTERM, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Arc<Store>,
    options: ServerOptions,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    log::info!("serving {} on http://{addr}", store.dir().display());
    axum::serve(listener, router(store, options))
        .with_graceful_shutdown(shutdown_signal())
        .await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    log::info!("shutting down");
}
