//! What the store answers about previews (the metadata, page and PDF calls of the mount's
//! `.preview/` and of HTTP), starting the threads, and their statistics.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;

use super::queue::Tier;
use super::workers::Pool;
use super::{
    IN_PROGRESS, NOT_SUPPORTED, PreviewState, PreviewStats, READY, SCALED_CACHE_BYTES,
    USE_GRANULARITY_NS, files_bytes, judge, key, kind_of, page_file, want,
};
use crate::api::{Error, PageSize, Result};
use crate::preview::{self, PreviewKind};
use crate::store::blobs::BlobFile;
use crate::store::db::{Conn as Connection, OptionalExtension, params};
use crate::store::nodes::resolve::file_by_id;
use crate::store::{Scope, Store, now_ns, ns_to_time};
use crate::sync::relock;

/// Scaled page images made on request (by preview key, page, width, height), bounded by their
/// bytes.
pub(super) struct Scaled {
    pub(super) lru: lru::LruCache<(String, u32, u32, u32), Bytes>,
    pub(super) bytes: usize,
}

pub(super) fn not_ready() -> Error {
    Error::conflict(
        "preview_not_ready",
        "the preview is still being generated; ask again when its status is Ready",
    )
}

pub(super) fn not_supported() -> Error {
    Error::new(
        crate::api::ErrorKind::NotFound,
        "preview_not_supported",
        "this file type has no preview",
    )
}

/// A ready preview: its blob and kind, page sizes, and whether it made its own PDF.
pub(super) struct ReadyPreview {
    pub(super) hash: String,
    pub(super) kind: PreviewKind,
    pub(super) pages: Vec<(u32, u32)>,
    pub(super) own_pdf: bool,
}

impl Store {
    /// Starts the preview threads (once per process; later calls do nothing): `workers` for
    /// asked-for jobs and as many for the background, and queues every preview left in
    /// progress by an earlier run for the background. Each job runs in a child process,
    /// `renderer render-preview` (the `vaultfs` binary: [`crate::store::this_program`] from
    /// the binary itself, its path from tests).
    pub fn start_previews(&self, workers: usize, renderer: &std::path::Path) -> Result<()> {
        let p = &self.previews;
        if p.started.set(()).is_err() {
            return Ok(());
        }
        let pending: Vec<(String, String, String)> = {
            let conn = self.lock()?;
            let mut stmt = conn.prepare(
                "SELECT blob, kind, name FROM previews WHERE status = 0 ORDER BY updated_on",
            )?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<crate::store::db::Result<_>>()?
        };
        for (hash, kind, name) in &pending {
            if let Some(kind) = PreviewKind::parse(kind) {
                p.enqueue(hash, kind, name);
            }
        }
        let pool = Pool {
            blobs: self.blobs.clone(),
            db: p.db.clone(),
            shared: p.shared.clone(),
            files_bytes: Arc::default(),
            renderer: renderer.into(),
        };
        let mut slots = Vec::new();
        for _ in 0..workers.max(1) {
            slots.push(pool.spawn(Tier::Asked));
            slots.push(pool.spawn(Tier::Background));
        }
        std::thread::Builder::new()
            .name("preview-watch".into())
            .spawn(move || pool.supervise(slots))?;
        // The search index is made in the same idle time, by the same child program.
        self.search.start(
            p.db.clone(),
            self.blobs.clone(),
            p.idle_probe(),
            renderer,
            self.dir.join("search.tmp"),
        )?;
        if !pending.is_empty() {
            log::info!(
                "{} preview(s) left from an earlier run queued",
                pending.len()
            );
        }
        Ok(())
    }

    /// A write is under way (an upload committing): background previews wait until writes
    /// have stopped for [`IDLE_AFTER`]. Cheap (one atomic); call it as often as convenient.
    pub(crate) fn note_write_activity(&self) {
        self.previews.note_write_activity();
    }

    /// How much longer until writes have stopped for [`IDLE_AFTER`] (`None`: idle now): other
    /// background work of the store waits as the previews' does.
    pub(crate) fn writes_for(&self) -> Option<std::time::Duration> {
        self.previews.shared.writes_for()
    }

    /// What the previews hold and what the threads did.
    pub fn preview_stats(&self) -> Result<PreviewStats> {
        let sh = &self.previews.shared;
        let conn = self.lock()?;
        let (ready, bytes, unrequested, unrequested_bytes): (i64, i64, i64, i64) = conn.query_row(
            &format!(
                "SELECT count(*), CAST(COALESCE(SUM({max}(bytes, 0)), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN 1 ELSE 0 END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN requested = 0 THEN {max}(bytes, 0) END), 0)
                            AS BIGINT)
                 FROM previews WHERE status = 1",
                max = conn.greatest()
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        let files_bytes = files_bytes(&conn)?;
        let time = |a: &AtomicI64| match a.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns_to_time(ns)),
        };
        Ok(PreviewStats {
            mode: sh.mode,
            cache_size: sh.cache_size,
            ready: ready as u64,
            bytes: bytes as u64,
            unrequested: unrequested as u64,
            unrequested_bytes: unrequested_bytes as u64,
            files_bytes,
            background_pending: sh.background_pending(),
            requested_started: sh.requested_started.load(Ordering::Relaxed),
            background_started: sh.background_started.load(Ordering::Relaxed),
            background_yielded: sh.background_yielded.load(Ordering::Relaxed),
            first_background_start: time(&sh.first_background_ns),
            last_background_start: time(&sh.last_background_ns),
            evicted: sh.evicted.load(Ordering::Relaxed),
        })
    }

    /// The file's current bytes: their blob hash, or None for a file never uploaded.
    pub(super) fn current_blob(
        conn: &Connection,
        scope: Scope,
        file_id: &str,
    ) -> Result<(String, Option<String>)> {
        let row = file_by_id(conn, scope, file_id)?;
        let blob: Option<String> = conn
            .query_row(
                "SELECT v.blob FROM nodes n JOIN versions v ON v.id = n.current_version WHERE n.id = ?1",
                [row.id],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        Ok((row.name, blob))
    }

    /// The preview of a file's current bytes. Asking puts its rendering at the front of the
    /// queue (or starts it, for bytes nobody has asked about yet), and marks it used.
    pub fn preview(&self, scope: Scope, file_id: &str) -> Result<PreviewState> {
        Ok(self.preview_of(scope, file_id)?.0)
    }

    /// The preview state and the preview it is (the blob and the kind the file's name chooses;
    /// when ready, whether it has its own PDF).
    pub(super) fn preview_of(
        &self,
        scope: Scope,
        file_id: &str,
    ) -> Result<(PreviewState, String, PreviewKind, bool)> {
        let conn = self.lock()?;
        let (name, Some(hash)) = Self::current_blob(&conn, scope, file_id)? else {
            return Ok((
                PreviewState::NotSupported,
                String::new(),
                PreviewKind::Unsupported,
                false,
            ));
        };
        let kind = kind_of(&conn, &self.blobs, &hash, &name)?;
        if kind == PreviewKind::Unsupported {
            return Ok((PreviewState::NotSupported, hash, kind, false));
        }
        type Row = (i64, Option<String>, bool, i64, bool);
        let row: Option<Row> = conn
            .prepare_cached(
                "SELECT status, pages, own_pdf, used_on, requested FROM previews
                 WHERE blob = ?1 AND kind = ?2",
            )?
            .query_row(params![hash, kind.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()?;
        if let (Scope::Account(account), Some((status, ..))) = (scope, &row) {
            if *status != IN_PROGRESS && Self::still_making_for(&conn, account, &hash, kind)? {
                return Ok((PreviewState::InProgress, hash, kind, false));
            }
        }
        let waiting = |conn: &Connection| -> Result<()> {
            if let Scope::Account(account) = scope {
                // Being made while this account waits: it sees it when it is done.
                conn.prepare_cached(
                    "INSERT INTO preview_access (account_id, blob, kind, ready_on) VALUES (?1, ?2, ?3, 0)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![account, hash, kind.as_str()])?;
            }
            Ok(())
        };
        let state = match row {
            None => {
                want(&conn, &self.blobs, &hash, &name)?;
                waiting(&conn)?;
                drop(conn);
                self.ask(&hash, kind, &name)?
            }
            Some((IN_PROGRESS, ..)) => {
                waiting(&conn)?;
                drop(conn);
                self.ask(&hash, kind, &name)?
            }
            Some((READY, pages, own_pdf, used_on, requested)) => {
                let now = now_ns();
                if !requested || now - used_on > USE_GRANULARITY_NS {
                    conn.prepare_cached(
                        "UPDATE previews SET used_on = ?3, requested = 1 WHERE blob = ?1 AND kind = ?2",
                    )?
                    .execute(params![hash, kind.as_str(), now])?;
                }
                let pages = pages
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default();
                return Ok((PreviewState::Ready { pages }, hash, kind, own_pdf));
            }
            Some(_) => PreviewState::NotSupported,
        };
        Ok((state, hash, kind, false))
    }

    /// Whether `account` is to be told a finished preview is still being made: the first time it
    /// asks for a preview made before (maybe for another account), it waits as long as making
    /// it took, as it would have for bytes nobody had. Later answers follow the preview.
    pub(super) fn still_making_for(
        conn: &Connection,
        account: i64,
        hash: &str,
        kind: PreviewKind,
    ) -> Result<bool> {
        let now = now_ns();
        let ready_on: Option<i64> = conn
            .prepare_cached(
                "SELECT ready_on FROM preview_access WHERE account_id = ?1 AND blob = ?2 AND kind = ?3",
            )?
            .query_row(params![account, hash, kind.as_str()], |r| r.get(0))
            .optional()?;
        let ready_on = match ready_on {
            Some(t) => t,
            None => {
                let took: i64 = conn
                    .prepare_cached("SELECT render_ns FROM previews WHERE blob = ?1 AND kind = ?2")?
                    .query_row(params![hash, kind.as_str()], |r| r.get(0))?;
                let t = now.saturating_add(took.max(0));
                conn.prepare_cached(
                    "INSERT INTO preview_access (account_id, blob, kind, ready_on) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![account, hash, kind.as_str(), t])?;
                t
            }
        };
        Ok(ready_on > now)
    }

    /// Somebody asked for a preview in progress: its job goes to the front. Bytes that cannot
    /// have a preview of that kind (too large) are recorded so at once, without rendering.
    pub(super) fn ask(&self, hash: &str, kind: PreviewKind, name: &str) -> Result<PreviewState> {
        let shared = &self.previews.shared;
        if shared.bump(&key(hash, kind)) {
            return Ok(PreviewState::InProgress);
        }
        if let Ok(Err(reason)) = judge(&self.blobs, hash, kind) {
            log::info!("no preview for {name}: {reason}");
            self.lock()?
                .prepare_cached(
                    "UPDATE previews SET status = ?3, reason = ?4, updated_on = ?5
                     WHERE blob = ?1 AND kind = ?2 AND status = 0",
                )?
                .execute(params![
                    hash,
                    kind.as_str(),
                    NOT_SUPPORTED,
                    reason,
                    now_ns()
                ])?;
            return Ok(PreviewState::NotSupported);
        }
        shared.push_asked(hash, kind, name);
        Ok(PreviewState::InProgress)
    }

    /// The blob of a file whose preview is ready, and its page sizes.
    pub(super) fn ready(&self, scope: Scope, file_id: &str) -> Result<ReadyPreview> {
        match self.preview_of(scope, file_id)? {
            (PreviewState::Ready { pages }, hash, kind, own_pdf) => Ok(ReadyPreview {
                hash,
                kind,
                pages,
                own_pdf,
            }),
            (PreviewState::InProgress, ..) => Err(not_ready()),
            (PreviewState::NotSupported, ..) => Err(not_supported()),
        }
    }

    /// A file of a ready preview was not there: it was evicted meanwhile, or it was lost (a
    /// cache folder emptied, previews a server kept on its own disk before they moved to the
    /// bucket): then its row goes too. Asking again renders it again; meanwhile it is not
    /// ready.
    pub(super) fn evicted_meanwhile(
        &self,
        scope: Scope,
        file_id: &str,
        (hash, kind, name): (&str, PreviewKind, &str),
        e: std::io::Error,
    ) -> Error {
        if e.kind() != std::io::ErrorKind::NotFound {
            return e.into();
        }
        if let Err(e) = self.forget_lost_preview(hash, kind, name) {
            return e;
        }
        match self.preview_of(scope, file_id) {
            Ok(_) => not_ready(),
            Err(e) => e,
        }
    }

    /// Drops the ready row of a preview whose file `name` is missing. Checked in a transaction:
    /// a preview is placed and made ready in one, and its row removed before its files, so a
    /// ready row seen there with a file missing has lost it.
    fn forget_lost_preview(&self, hash: &str, kind: PreviewKind, name: &str) -> Result<()> {
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let missing = match self.blobs.open_preview(hash, kind.as_str(), name) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(e.into()),
        };
        if missing
            && tx.execute(
                "DELETE FROM previews WHERE blob = ?1 AND kind = ?2 AND status = 1",
                params![hash, kind.as_str()],
            )? == 1
        {
            log::info!(
                "the preview of {hash} ({}) was lost: made again",
                kind.as_str()
            );
        }
        tx.commit()?;
        Ok(())
    }

    /// Page `page` (from 1) as PNG, scaled as asked (made from the stored page and cached).
    pub fn preview_page(
        &self,
        scope: Scope,
        file_id: &str,
        page: u32,
        size: &PageSize,
    ) -> Result<Bytes> {
        let ReadyPreview {
            hash, kind, pages, ..
        } = self.ready(scope, file_id)?;
        let (w, h) = *pages
            .get((page as usize).wrapping_sub(1))
            .ok_or_else(|| Error::not_found(format!("the preview has {} page(s)", pages.len())))?;
        let (tw, th) = preview::fit(w, h, size);
        let cache_key = (key(&hash, kind), page, tw, th);
        let cache = &self.previews.scaled;
        if let Some(b) = relock(cache).lru.get(&cache_key) {
            return Ok(b.clone());
        }
        let png = self
            .blobs
            .read_preview(&hash, kind.as_str(), &page_file(page as usize))
            .map_err(|e| {
                let name = page_file(page as usize);
                self.evicted_meanwhile(scope, file_id, (&hash, kind, &name), e)
            })?;
        if (tw, th) == (w, h) {
            return Ok(Bytes::from(png));
        }
        let scaled = preview::scale_png(&png, tw, th)
            .map_err(|e| Error::internal(format!("could not scale page {page}: {e}")))?;
        let scaled = Bytes::from(scaled);
        let mut c = relock(cache);
        c.bytes += scaled.len();
        if let Some(old) = c.lru.put(cache_key, scaled.clone()) {
            c.bytes -= old.len();
        }
        while c.bytes > SCALED_CACHE_BYTES {
            match c.lru.pop_lru() {
                Some((_, b)) => c.bytes -= b.len(),
                None => break,
            }
        }
        Ok(scaled)
    }

    /// The document PDF of a ready preview, opened, with its size.
    pub fn preview_pdf(&self, scope: Scope, file_id: &str) -> Result<(BlobFile, u64)> {
        let ready = self.ready(scope, file_id)?;
        let file = if ready.own_pdf {
            self.blobs
                .open_preview(&ready.hash, ready.kind.as_str(), "document.pdf")
                .map_err(|e| {
                    let lost = (ready.hash.as_str(), ready.kind, "document.pdf");
                    self.evicted_meanwhile(scope, file_id, lost, e)
                })?
        } else {
            // The preview of a PDF is the PDF itself.
            let _guard = self.lock()?; // a delete cannot remove the blob meanwhile
            self.blobs.open(&ready.hash)?
        };
        let len = file.len();
        Ok((file, len))
    }
}
