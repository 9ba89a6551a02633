//! The connections of `vaultfs serve`: accepted within a bound (in all and per source address),
//! each served by hyper with a timer, so that no client can keep one open for nothing:
//!
//! - the head of a request (and the wait for the next one on a kept-alive connection) must come
//!   within `header_timeout` (hyper's header read timeout, which axum's own `serve` leaves off);
//! - a request body that sends nothing for `transfer_idle_timeout` fails (`body_idle_limited`);
//! - a client that reads nothing of an answer for as long loses the connection ([`StallGuard`]);
//! - at most `max_connections` are open at once: beyond, new ones wait in the kernel's backlog
//!   (nothing is accepted, so no descriptor is spent); one source address holds at most
//!   `max_connections_per_source`: beyond, a new one is closed at once.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

use super::ServerOptions;
use super::limits::{Slots, StallGuard, idle_limited, io_error};

/// Serves `app` on `listener` until `shutdown` resolves, then lets the requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: &ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let per_source = Arc::new(Slots::<IpAddr>::new(options.max_connections_per_source));
    let proxies = Arc::new((options.trusted_proxies.clone(), options.proxy_header));
    let (stop_tx, stop_rx) = watch::channel(false);
    // Each connection's task holds a clone; when all are dropped, every connection has ended.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = accept(&listener) => r,
            () = &mut shutdown => break,
        };
        let Some(source_slot) = per_source.take(peer.ip().to_canonical()) else {
            log::debug!("{peer}: over the connections allowed per source, closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().unwrap_or(peer);
        let io = TokioIo::new(StallGuard::new(stream, options.transfer_idle_timeout));
        let proxies = proxies.clone();
        let stopping = Stopping(Some(stop_rx.clone()));
        let service = app
            .clone()
            .map_request(move |mut req: Request<hyper::body::Incoming>| {
                let client = super::proxy::client(peer.ip(), req.headers(), &proxies.0, proxies.1);
                req.extensions_mut().insert(Peer {
                    remote: peer,
                    local,
                    client,
                });
                req.extensions_mut().insert(stopping.clone());
                req.map(Body::new)
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_timeout)
            .keep_alive(true);
        let (mut stop, alive) = (stop_rx.clone(), alive_tx.clone());
        tokio::spawn(async move {
            let conn = builder.serve_connection(io, TowerToHyperService::new(service));
            let mut conn = std::pin::pin!(conn);
            let stopping = async {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::select! {
                r = conn.as_mut() => log_end(peer, r),
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    log_end(peer, conn.await);
                }
            }
            drop((permit, source_slot, alive));
        });
    }
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
    Ok(())
}

fn log_end(peer: SocketAddr, r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        log::debug!("{peer}: connection ended: {e}");
    }
}

/// The next connection. Errors such as EMFILE are waited out (as axum's listener does), not
/// spun on.
async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(c) => return c,
            Err(e) => {
                log::warn!("cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Middleware: every request body fails with `TimedOut` once its client sends nothing for the
/// transfer idle timeout (a JSON body as much as an upload).
///
/// An answer given before its request body was read to the end (an early 4xx/5xx of an upload)
/// says `Connection: close`: the unread rest is still on the wire, so the connection cannot
/// carry another request, and a client that pools connections must not reuse it.
pub async fn body_idle_limited(
    axum::extract::State(idle): axum::extract::State<Duration>,
    req: Request,
    next: Next,
) -> Response {
    use axum::body::HttpBody;
    let read_to_end = Arc::new(AtomicBool::new(req.body().is_end_stream()));
    let seen = read_to_end.clone();
    let req = req.map(|body| {
        let body = body.into_data_stream().map_err(io_error).chain(
            futures_util::stream::once(async move {
                seen.store(true, Ordering::Release);
                Ok(Bytes::new())
            })
            .try_filter(|b: &Bytes| std::future::ready(!b.is_empty())),
        );
        Body::from_stream(idle_limited(body, idle))
    });
    let mut response = next.run(req).await;
    if !read_to_end.load(Ordering::Acquire) {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The two ends of the connection a request came on (in its extensions when it came through
/// [`serve`]; the router alone, as some tests run it, has none).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The server's address the client reached.
    pub local: SocketAddr,
    /// The client's address: `remote`, or where a trusted proxy says it forwards the request
    /// from (`proxy::client`).
    pub client: IpAddr,
}

impl Peer {
    /// Whether the client is on this machine (not so when a proxy here forwards for another).
    pub fn is_loopback(&self) -> bool {
        self.client.to_canonical().is_loopback()
    }
}

/// Resolves when the server begins to shut down (a request that waits, a long poll of the
/// change feed, answers then instead of holding the shutdown up). Never, for a request that did
/// not come through [`serve`].
#[derive(Clone, Default)]
pub struct Stopping(Option<watch::Receiver<bool>>);

impl Stopping {
    pub async fn stopped(self) {
        match self.0 {
            Some(mut rx) => {
                let _ = rx.wait_for(|s| *s).await;
            }
            None => std::future::pending().await,
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Stopping {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Stopping>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The [`Peer`] of a request, if known.
pub struct Source(pub Option<Peer>);

impl Source {
    /// The client's address as the lockout counts it (`proxy::source_key`; '' when not known).
    pub fn key(&self) -> String {
        self.0
            .map(|p| super::proxy::source_key(p.client))
            .unwrap_or_default()
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Source {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Source(parts.extensions.get::<Peer>().copied()))
    }
}
