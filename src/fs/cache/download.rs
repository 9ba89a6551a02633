//! The read cache's downloads: the runs of chunks each request claims while it brings them
//! (each chunk is downloaded once), how far each has written, the read-ahead of sequential
//! readers, and the waits of readers for their own bytes.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use futures_util::StreamExt;

use super::{AHEAD_RUNS, CHANGED, CHUNK, CachedFile, PIECE};
use crate::api::{Error, RangeRequest, Result};
use crate::backend::Backend;
use crate::sync::relock;

/// A run of chunks one request is downloading: its first and last chunk, and the offset up to
/// which it has written the bytes.
pub(super) struct Run {
    pub(super) span: (u64, u64),
    pub(super) upto: u64,
}

impl Run {
    pub(super) fn covers(&self, chunk: u64) -> bool {
        self.span.0 <= chunk && chunk <= self.span.1
    }
}

/// Chunks `run` of a file being downloaded by one request; given up when dropped (downloaded
/// or not: a waiter then claims what is still missing itself).
struct Claim {
    e: Arc<CachedFile>,
    run: (u64, u64),
}

impl Drop for Claim {
    fn drop(&mut self) {
        relock(&self.e.inflight).retain(|r| r.span != self.run);
        self.e.arrived.notify_waiters();
    }
}

/// Claims the chunks of `first..=last` that are neither present nor on their way, in runs of
/// at most `piece` chunks; true in `.1` when some are on their way in other downloads.
fn claim(e: &Arc<CachedFile>, first: u64, last: u64, piece: u64) -> (Vec<Claim>, bool) {
    let present = relock(&e.present);
    let mut inflight = relock(&e.inflight);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut others = false;
    let mut open = false;
    for c in first..=last {
        if present.contains(&c) {
            open = false;
            continue;
        }
        if inflight.iter().any(|r| r.covers(c)) {
            others = true;
            open = false;
            continue;
        }
        match runs.last_mut() {
            Some((a, b)) if open && c - *a < piece => *b = c,
            _ => runs.push((c, c)),
        }
        open = true;
    }
    inflight.extend(runs.iter().map(|&span| Run {
        span,
        upto: span.0 * CHUNK,
    }));
    let claims = runs
        .into_iter()
        .map(|run| Claim { e: e.clone(), run })
        .collect();
    (claims, others)
}

/// Downloads the missing chunks of `first..=last` in the background, in pieces, beside those
/// already running (at most [`AHEAD_RUNS`] per file): the reader goes on with what it has while
/// the next come. A failure is only logged: the reader fetches what it then lacks itself.
pub(super) fn read_ahead<B: Backend>(backend: &Arc<B>, e: &Arc<CachedFile>, first: u64, last: u64) {
    let running = relock(&e.inflight).len();
    if running >= AHEAD_RUNS || e.missing(first, last).is_empty() {
        return;
    }
    let (claims, _) = claim(e, first, last, PIECE);
    // Claims past the limit are dropped here: unclaimed again.
    for c in claims.into_iter().take(AHEAD_RUNS - running) {
        let backend = backend.clone();
        tokio::spawn(async move {
            if let Err(err) = fetch(backend.as_ref(), &c.e, c.run.0, c.run.1).await {
                log::debug!("read-ahead of {}: {err}", c.e.id);
            }
        });
    }
}

/// Downloads what is missing of chunks `first..=last`, waiting for those other downloads
/// bring (each chunk is fetched once; one whose download failed is claimed again here).
pub(super) async fn fetch_missing<B: Backend>(
    backend: &B,
    e: &Arc<CachedFile>,
    first: u64,
    last: u64,
) -> Result<()> {
    loop {
        let arrived = e.arrived.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        let (claims, others) = claim(e, first, last, u64::MAX);
        for c in &claims {
            fetch(backend, e, c.run.0, c.run.1).await?;
        }
        drop(claims);
        if !others {
            return Ok(());
        }
        if e.missing(first, last).is_empty() {
            return Ok(());
        }
        arrived.await;
    }
}

/// Waits until bytes `offset..end` are in the entry, downloading the chunks that hold them that
/// no other download brings. Its downloads go on in the background once the reader has its
/// bytes: the rest of their chunks is what a sequential reader asks for next.
pub(super) async fn fetch_for_read<B: Backend>(
    backend: &Arc<B>,
    e: &Arc<CachedFile>,
    offset: u64,
    end: u64,
) -> Result<()> {
    let (first, last) = (offset / CHUNK, (end - 1) / CHUNK);
    let mut mine = tokio::task::JoinSet::new();
    loop {
        let arrived = e.arrived.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        if e.has(offset, end) {
            // Dropping the set would abort them; what they bring is still wanted.
            mine.detach_all();
            return Ok(());
        }
        // A download of another reader that failed gave its chunks back: claimed again here.
        for c in claim(e, first, last, u64::MAX).0 {
            let backend = backend.clone();
            mine.spawn(async move {
                let r = fetch(backend.as_ref(), &c.e, c.run.0, c.run.1).await;
                if let Err(err) = &r {
                    log::debug!("download of {} for a read: {err}", c.e.id);
                }
                r
            });
        }
        tokio::select! {
            _ = &mut arrived => {}
            Some(done) = mine.join_next(), if !mine.is_empty() => {
                done.map_err(|err| Error::internal(format!("download task failed: {err}")))??;
            }
        }
    }
}

/// Downloads chunks `first..=last` into the entry, marking each once it is whole and telling
/// waiters how far it has written meanwhile.
async fn fetch<B: Backend>(backend: &B, e: &CachedFile, first: u64, last: u64) -> Result<()> {
    let start = first * CHUNK;
    let end = ((last + 1) * CHUNK).min(e.size);
    let range = RangeRequest::span(start, end - start);
    let mut d = backend
        .download_sized(&e.id, Some(range), Some(e.size))
        .await?;
    if d.node.md5_checksum.is_some() && e.md5.is_some() && d.node.md5_checksum != e.md5 {
        return Err(Error::new(
            crate::api::ErrorKind::Conflict,
            CHANGED,
            "the file changed while it was being read",
        ));
    }
    let mut off = d.range.map_or(0, |(a, _)| a);
    if off != start {
        return Err(Error::internal("the server sent another range than asked"));
    }
    let mut pending_chunk = first;
    let file = e.file()?;
    while let Some(bytes) = d.body.next().await {
        let bytes = bytes.map_err(download_failed)?;
        // The entry's file starts as one hole: zeros need not be written (a sparse file
        // stays sparse here, and in the copies made from it).
        if bytes.iter().any(|&b| b != 0) {
            file.write_all_at(&bytes, off)?;
        }
        off += bytes.len() as u64;
        while pending_chunk <= last && ((pending_chunk + 1) * CHUNK).min(e.size) <= off {
            e.mark(pending_chunk);
            pending_chunk += 1;
        }
        e.progress((first, last), off);
    }
    if off < end {
        return Err(Error::new(
            crate::api::ErrorKind::Network,
            "short_download",
            "the download ended early",
        ));
    }
    Ok(())
}

/// A download's body that broke off, as the reader's error.
pub(super) fn download_failed(err: impl std::fmt::Display) -> Error {
    Error::new(
        crate::api::ErrorKind::Network,
        "download_failed",
        err.to_string(),
    )
}
