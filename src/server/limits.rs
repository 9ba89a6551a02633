//! The limits that keep one client from stopping the server for everyone (docs/security.md):
//!
//! - **Transfers** (upload step 3, downloads, preview PDFs) hold no thread while they wait for
//!   the network (the disk I/O of each chunk is a short blocking task). A request body that sends
//!   nothing for `transfer_idle_timeout` is aborted ([`idle_limited`], on every request); a
//!   connection whose client reads nothing of an answer for as long is closed ([`StallGuard`], on
//!   every connection: see `conn`). One user runs at most `max_transfers_per_user` at once
//!   ([`TransferSlots`]); beyond that: 503 `too_many_transfers` with `Retry-After`.
//! - **Long polls of the change feed** (`GET /changes?wait=`) hold no thread and cost nothing
//!   while they wait (see `store::changes`); one user holds at most `max_waits_per_user` at
//!   once ([`Limits::wait`]); beyond that: 503 `too_many_waits` with `Retry-After`.
//! - **Password checks** (argon2id, ~19 MiB and tens of milliseconds each) run at most
//!   `password_checks` at once (the cores, by default) with at most `password_queue` waiting
//!   ([`HashGate`]); beyond that: 503 with `Retry-After`, before any memory is spent.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::api::{Error, ErrorKind};
use crate::backend::ByteStream;
use crate::sync::relock;

/// The limits of one server, shared by its requests.
pub struct Limits {
    pub transfers: Arc<TransferSlots>,
    /// Long polls of the change feed, per user.
    pub waits: Arc<Slots<i64>>,
    pub passwords: HashGate,
    pub transfer_idle: Duration,
}

impl Limits {
    pub fn new(options: &super::ServerOptions) -> Limits {
        Limits {
            transfers: Arc::new(TransferSlots::new(options.max_transfers_per_user)),
            waits: Arc::new(Slots::new(options.max_waits_per_user)),
            passwords: HashGate::new(options.password_checks, options.password_queue),
            transfer_idle: options.transfer_idle_timeout,
        }
    }
}

// ----- counted slots: transfers per user, connections per source -----

/// At most `per_key` of something (transfers of a user, connections of a source address) at
/// once for each key.
pub struct Slots<K> {
    per_key: usize,
    running: Mutex<HashMap<K, usize>>,
}

/// One slot taken; free again when this is dropped (the transfer or connection ended, failed,
/// or went away).
pub struct Slot<K: Eq + Hash + Copy> {
    slots: Arc<Slots<K>>,
    key: K,
}

impl<K: Eq + Hash + Copy> Slots<K> {
    pub fn new(per_key: usize) -> Slots<K> {
        Slots {
            per_key: per_key.max(1),
            running: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, usize>> {
        relock(&self.running)
    }

    /// A slot for one more of `key`, or `None` when it holds `per_key` already.
    pub fn take(self: &Arc<Self>, key: K) -> Option<Slot<K>> {
        let mut running = self.lock();
        let n = running.entry(key).or_insert(0);
        if *n >= self.per_key {
            return None;
        }
        *n += 1;
        Some(Slot {
            slots: self.clone(),
            key,
        })
    }

    /// Slots `key` holds (tests, status).
    pub fn running(&self, key: K) -> usize {
        self.lock().get(&key).copied().unwrap_or(0)
    }
}

impl<K: Eq + Hash + Copy> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut running = self.slots.lock();
        if let Some(n) = running.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.key);
            }
        }
    }
}

/// The transfers (upload step 3, downloads, preview PDFs) of each user.
pub type TransferSlots = Slots<i64>;
pub type TransferSlot = Slot<i64>;

impl Limits {
    /// A slot for one more transfer of `user`, or 503 `too_many_transfers`.
    pub fn transfer(&self, user: i64) -> Result<TransferSlot, Error> {
        self.transfers.take(user).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "too_many_transfers",
                format!(
                    "you have {} uploads and downloads running, the most this server allows at once; \
                     try again when one has finished",
                    self.transfers.per_key
                ),
            )
        })
    }
}

impl Limits {
    /// A slot for one more long poll of `user`, or 503 `too_many_waits`.
    pub fn wait(&self, user: i64) -> Result<Slot<i64>, Error> {
        self.waits.take(user).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "too_many_waits",
                format!(
                    "you are waiting for changes in {} requests already, the most this server \
                     allows at once; ask without `wait`, or when one has returned",
                    self.waits.per_key
                ),
            )
        })
    }
}

/// A body that holds `slot` until it ends or is dropped.
pub fn holding(body: ByteStream, slot: TransferSlot) -> ByteStream {
    Box::pin(body.map(move |item| {
        let _ = &slot;
        item
    }))
}

/// A request body's error as an I/O error: the one [`idle_limited`] made (`TimedOut`) is kept as
/// it is.
pub fn io_error(e: axum::Error) -> io::Error {
    match e.into_inner().downcast::<io::Error>() {
        Ok(e) => *e,
        Err(e) => io::Error::other(e),
    }
}

/// A request body that fails with `TimedOut` when no bytes come for `idle`.
pub fn idle_limited<S>(body: S, idle: Duration) -> ByteStream
where
    S: Stream<Item = io::Result<Bytes>> + Send + 'static,
{
    let body: ByteStream = Box::pin(body);
    Box::pin(futures_util::stream::unfold(
        (body, false),
        move |(mut body, done)| async move {
            if done {
                return None;
            }
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(item)) => Some((item, (body, false))),
                Ok(None) => None,
                Err(_) => {
                    let e = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client sent nothing for {idle:?}"),
                    );
                    Some((Err(e), (body, true)))
                }
            }
        },
    ))
}

// ----- connections whose client stops reading -----

/// A connection that fails its writes once the peer has taken nothing for `limit` (a download
/// nobody reads, an answer to a client that went silent). Reads are passed through.
pub struct StallGuard<S> {
    inner: S,
    limit: Duration,
    /// Armed when a write could not proceed; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    pub fn new(inner: S, limit: Duration) -> StallGuard<S> {
        StallGuard {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: `Pending` until the peer has taken nothing for
    /// `limit`, then an error that makes the server drop the connection.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.stall(cx).map(Err),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(r, cx)
    }
}

// ----- password hashing -----

/// At most `running` password checks at once, at most `queue` more waiting for their turn.
pub struct HashGate {
    permits: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    queue: usize,
}

/// One waiting request, counted until it gets its turn or goes away.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl HashGate {
    pub fn new(running: usize, queue: usize) -> HashGate {
        HashGate {
            permits: Arc::new(Semaphore::new(running.max(1))),
            waiting: Arc::new(AtomicUsize::new(0)),
            queue,
        }
    }

    /// A turn to check a password (held until dropped), or 503 `busy` when the queue is full.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, Error> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy());
        }
        let _waiting = Waiting(self.waiting.clone());
        self.permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| busy())
    }
}

fn busy() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "busy",
        "the server is checking too many passwords right now; try again in a moment",
    )
}

/// Cores of this machine: the default number of password checks at once.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_slots_are_per_user_and_come_back() {
        let limits = Limits::new(&crate::server::ServerOptions {
            max_transfers_per_user: 2,
            ..Default::default()
        });
        let a1 = limits.transfer(1).unwrap();
        let _a2 = limits.transfer(1).unwrap();
        let e = limits.transfer(1).err().unwrap();
        assert_eq!((e.status(), e.code.as_ref()), (503, "too_many_transfers"));
        let _b = limits.transfer(2).unwrap();
        drop(a1);
        let _a3 = limits.transfer(1).unwrap();
        assert_eq!(limits.transfers.running(1), 2);
    }

    #[tokio::test]
    async fn hash_gate_queues_a_bounded_number() {
        let gate = Arc::new(HashGate::new(1, 2));
        let first = gate.enter().await.unwrap();
        let (g1, g2) = (gate.clone(), gate.clone());
        let w1 = tokio::spawn(async move { g1.enter().await.map(drop) });
        let w2 = tokio::spawn(async move { g2.enter().await.map(drop) });
        while gate.waiting.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let e = gate.enter().await.err().unwrap();
        assert_eq!(e.status(), 503);
        drop(first);
        w1.await.unwrap().unwrap();
        w2.await.unwrap().unwrap();
        assert_eq!(gate.waiting.load(Ordering::SeqCst), 0);
        drop(gate.enter().await.unwrap());
    }
}
