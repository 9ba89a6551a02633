//! Our extension: many small files in one request (`POST /nodes/batch`, advertised as
//! [`crate::api::EXT_BATCH_PUT`]), stored in one transaction with one flush
//! ([`crate::store::Store::put_files`], the built-in store's batches). A mount's write-back
//! sends what it gathered (`backend/remote/batch.rs`); one request and two transactions a file
//! made a server store small files at a sixth of the built-in store's pace.
//!
//! The body: the JSON array of [`BatchFile`] on one line, a newline, then each file's bytes,
//! exactly its `length`, in order. Each file is received into a private file beside the blobs,
//! hashed as it comes, and handed to the store sealed (it becomes the blob by a hard link).
//! A body that does not match its terms (short, long, malformed) fails whole and stores
//! nothing; each file's own refusal (its md5, a conflict, the quota, a missing folder) is its
//! result alone.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use bytes::BytesMut;
use futures_util::StreamExt;

use super::AppState;
use super::auth::Caller;
use super::openapi::{BatchEnvelope, ErrorEnvelope};
use super::reply::{ApiResult, INTERNAL_ERROR_TEXT, ok};
use super::request_id::request_id;
use crate::api::checksum::{Digests, md5_hex};
use crate::api::{
    BATCH_TYPE, BatchFile, BatchResults, Envelope, Error, ErrorKind, FileAttrs, NodePath,
};
use crate::backend::{Batches, PutFile};

/// Most files in one batch.
const MAX_FILES: usize = 1000;
/// Most bytes of the terms line.
const MAX_TERMS: usize = 1 << 20;
/// Most bytes of files in one batch (a client sends large files one by one).
const MAX_BYTES: u64 = 64 << 20;
/// Received bytes are written out in pieces of this size (memory per request).
const WRITE_AT: usize = 256 << 10;

#[utoipa::path(
    post,
    path = "/nodes/batch",
    tag = "upload",
    operation_id = "upload_batch",
    summary = "Many whole files in one request (an extension of ours, `batch-put`): each made at its path when absent (or the file `id`), with a new version of its bytes",
    request_body(content(
        (Vec<u8> = "application/vnd.vaultfs.batch"),
        (Vec<u8> = "application/octet-stream"),
    ), description = "The JSON array of the files' terms (`path`: the segments; `id`; step 2's `length`, `md5_checksum` (required), `modifiedOn`, `mode`, `if_match`, `if_none_match`) on one line, a newline, then each file's bytes, exactly its `length`, in order"),
    responses(
        (status = 200, description = "`results`: one envelope per file, in order; a refused file's has its `status_code` (400 `checksum_mismatch`, 404, 409, 412 `version_conflict`, 413, 507 `quota_exceeded`) and was not stored", body = BatchEnvelope),
        (status = 400, description = "`bad_batch`: the body does not match its terms; nothing stored", body = ErrorEnvelope),
        (status = 401, description = "`invalid_token`, `token_expired`", body = ErrorEnvelope),
        (status = 413, description = "`too_large`: more files or bytes than one batch takes", body = ErrorEnvelope),
        (status = 415, description = "`unsupported_media_type`: not `application/vnd.vaultfs.batch` (or `application/octet-stream`)", body = ErrorEnvelope),
        (status = 503, description = "`too_many_transfers` (`Retry-After`)", body = ErrorEnvelope),
        (status = 507, description = "`insufficient_storage`: the store's disk is full", body = ErrorEnvelope),
    ),
    security(("basic" = [])),
)]
pub async fn batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Ours, or bytes plainly (the route says what they are).
    let mime = ctype.split(';').next().unwrap_or("").trim();
    if ![BATCH_TYPE, "application/octet-stream"]
        .iter()
        .any(|t| mime.eq_ignore_ascii_case(t))
    {
        return Err(Error::new(
            ErrorKind::UnsupportedMedia,
            "unsupported_media_type",
            format!("a batch needs `Content-Type: {BATCH_TYPE}`"),
        )
        .into());
    }
    // Held until the batch is stored, fails or its connection goes away (as an upload's).
    let _slot = state.limits.transfer(caller.user_id)?;
    let mut received = Received::default();
    let stored = receive(&state, body, &mut received).await;
    let results = match stored {
        Ok(files) => {
            let store = caller.backend.put_files(files).await;
            let id = request_id();
            store
                .into_iter()
                .map(|r| match r {
                    Ok(node) => Envelope::ok(node),
                    Err(e) => Envelope::failure(&shown(e, &id), &id),
                })
                .collect()
        }
        Err(e) => {
            received.remove();
            return Err(e.into());
        }
    };
    received.remove();
    Ok(ok(BatchResults { results }))
}

/// A file's error as the client sees it: an internal one's detail stays in the log.
fn shown(e: Error, id: &str) -> Error {
    if e.kind != ErrorKind::Server {
        return e;
    }
    log::error!("{id} {}", e.message);
    Error::new(ErrorKind::Server, e.code, INTERNAL_ERROR_TEXT)
}

/// The private files written for a batch: their names go once it is through (a file stored
/// keeps its blob's name, a hard link).
#[derive(Default)]
struct Received(Vec<PathBuf>);

impl Received {
    fn remove(&mut self) {
        for p in self.0.drain(..) {
            if let Err(e) = std::fs::remove_file(&p) {
                log::warn!("{}: {e}", p.display());
            }
        }
    }
}

/// What one file of the batch is to become, from its terms.
struct Wanted {
    path: NodePath,
    id: Option<String>,
    length: u64,
    md5: String,
    attrs: FileAttrs,
    base: crate::api::Base,
}

fn bad(message: impl Into<String>) -> Error {
    Error::bad_request("bad_batch", message)
}

/// The terms of one file, checked.
fn wanted(f: BatchFile) -> Result<Wanted, Error> {
    let path = NodePath::from_segments(&f.path).map_err(|e| bad(format!("`path`: {e}")))?;
    let (Some(_), Some(name)) = (path.parent(), path.name()) else {
        return Err(bad(format!("`{path}` is not a file's path")));
    };
    crate::api::path::validate_name(name)?;
    let length = f
        .terms
        .length
        .ok_or_else(|| bad("every file needs its `length`"))?;
    let md5 = f
        .terms
        .md5_checksum
        .as_deref()
        .ok_or_else(|| bad("every file needs its `md5_checksum`"))?;
    let md5 = md5_hex(md5).ok_or_else(|| bad(format!("`{md5}` is not an md5")))?;
    Ok(Wanted {
        base: f.terms.base()?,
        attrs: f.terms.attrs().map_err(|e| bad(e.message))?,
        path,
        id: f.id,
        length,
        md5,
    })
}

/// Reads the body: the terms, then each file's bytes into a private file beside the blobs.
async fn receive(
    state: &AppState,
    body: Body,
    received: &mut Received,
) -> Result<Vec<PutFile>, Error> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    // The terms: up to the first newline.
    let line = loop {
        if let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line = buf.split_to(at + 1);
            break line;
        }
        if buf.len() > MAX_TERMS {
            return Err(too_large(format!(
                "the terms line is over {MAX_TERMS} bytes"
            )));
        }
        match stream.next().await {
            Some(chunk) => {
                buf.extend_from_slice(&chunk.map_err(|e| Error::from(super::limits::io_error(e)))?)
            }
            None => return Err(bad("the body ended before the terms' newline")),
        }
    };
    let terms: Vec<BatchFile> = serde_json::from_slice(&line[..line.len() - 1])
        .map_err(|e| bad(format!("the terms are not a JSON array of files: {e}")))?;
    if terms.len() > MAX_FILES {
        return Err(too_large(format!(
            "{} files; a batch takes at most {MAX_FILES}",
            terms.len()
        )));
    }
    let wanted: Vec<Wanted> = terms.into_iter().map(wanted).collect::<Result<_, _>>()?;
    // (Saturating: lengths a client made up must not wrap around the bound.)
    let total = wanted.iter().fold(0u64, |t, w| t.saturating_add(w.length));
    if total > MAX_BYTES {
        return Err(too_large(format!(
            "{total} bytes of files; a batch takes at most {MAX_BYTES}"
        )));
    }
    let mut files = Vec::with_capacity(wanted.len());
    for w in wanted {
        let (path, file) = new_file(state).await?;
        received.0.push(path);
        let mut left = w.length;
        let mut digests = Digests::default();
        let mut file = Some(file);
        loop {
            let take = (buf.len() as u64).min(left) as usize;
            if take > 0 && (take >= WRITE_AT || take as u64 == left) {
                let piece = buf.split_to(take).freeze();
                left -= take as u64;
                digests.update(&piece);
                let mut f = file.take().expect("the file is back after each write");
                file = Some(
                    tokio::task::spawn_blocking(move || f.write_all(&piece).map(|()| f))
                        .await
                        .map_err(|e| Error::internal(format!("a write task failed: {e}")))??,
                );
            }
            if left == 0 {
                break;
            }
            match stream.next().await {
                Some(chunk) => buf.extend_from_slice(
                    &chunk.map_err(|e| Error::from(super::limits::io_error(e)))?,
                ),
                None => return Err(bad("the body ended before the files' bytes did")),
            }
        }
        files.push(PutFile {
            path: w.path,
            file_id: w.id,
            source: Arc::new(file.expect("the file is back after each write")),
            len: w.length,
            sealed: true,
            digests: Some(digests),
            attrs: w.attrs,
            cancel: Default::default(),
            base: w.base,
            expect_md5: Some(w.md5),
        });
    }
    let mut over = buf.len();
    while let Some(chunk) = stream.next().await {
        over += chunk
            .map_err(|e| Error::from(super::limits::io_error(e)))?
            .len();
    }
    if over > 0 {
        return Err(bad(format!(
            "the body goes on {over} bytes past the files' bytes"
        )));
    }
    Ok(files)
}

fn too_large(message: String) -> Error {
    Error::new(ErrorKind::TooLarge, "too_large", message)
}

/// A private file beside the blobs (off the runtime's threads: a file system call).
async fn new_file(state: &AppState) -> Result<(PathBuf, std::fs::File), Error> {
    let store = state.store.clone();
    Ok(tokio::task::spawn_blocking(move || store.batch_file())
        .await
        .map_err(|e| Error::internal(format!("a task failed: {e}")))??)
}
