//! Previews end to end: the virtual `.preview/` of the mount on both backends, and what the
//! interface contract (tests/contract/) cannot show from outside: 409 before Ready, previews of
//! bytes stored before previews existed, preview files going with their bytes.
//!
//! One binary (see Cargo.toml's note on test binaries), its tests by concern in the modules
//! below: `mounted` (the `.preview/` tree, on both backends), `search` (`GET /search`),
//! `searched` (the mount's `.search/` tree, on both backends), `thumbnails` (file managers'
//! thumbnails in the shared cache, on both backends), `lifecycle` (409 before Ready,
//! bytes stored before previews, preview files going with their bytes), `scheduling` (asked-for
//! first, idle otherwise, bounded), `accounts` (what previews may tell of another account's
//! bytes, issue 19 item 8), `hostile` (files that would take the server's memory, issue 31).
//! The helpers more than one of them uses are here.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod accounts;
mod fair;
mod hostile;
mod lifecycle;
mod mounted;
mod scheduling;
mod search;
mod searched;
mod thumbnails;

use std::fs;
use std::path::Path;

use vaultfs::api::NodePath;
use vaultfs::backend::{Backend, ByteStream};

fn vault() -> NodePath {
    NodePath::parse_uri("/nodes/pth/Local/My First Vault").unwrap()
}

fn once(data: Vec<u8>) -> ByteStream {
    Box::pin(futures_util::stream::once(async move {
        Ok(bytes::Bytes::from(data))
    }))
}

/// The three upload steps through a backend; returns the file ID.
async fn put<B: Backend>(b: &B, folder: &NodePath, name: &str, data: &[u8]) -> String {
    let f = b.create_file(folder, name).await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
    let vid = v.file_ex_properties.unwrap().version_id.unwrap();
    b.upload(&id, &vid, data.len() as u64, once(data.to_vec()))
        .await
        .unwrap();
    id
}

fn status(dir: &Path) -> String {
    fs::read_to_string(dir.join("status")).unwrap_or_default()
}

/// One page of text, different for each `i`.
fn small_text(i: usize) -> Vec<u8> {
    format!("file {i}\n{}", "some words on a line of text\n".repeat(40)).into_bytes()
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The previews table as the store keeps it: blob -> (status, updated_on, requested).
fn rows(dir: &Path) -> std::collections::HashMap<String, (i64, i64, i64)> {
    let conn = rusqlite::Connection::open(dir.join("vault.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT blob, status, updated_on, requested FROM previews")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}
