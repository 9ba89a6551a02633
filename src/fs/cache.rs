//! The read cache: one sparse file per remote file version (ID and md5) in the cache dir, filled
//! by ranged downloads in 1 MiB chunks, with read-ahead that grows for sequential readers. An LRU
//! bounds its bytes. A chunk is marked present only once all its bytes are written, so a reader
//! never sees a hole as data. Whole files of a server outlive the mount (`offline`): `save_index`
//! lists them, synced to disk first, in `index.json`, and the next mount keeps those and drops
//! the rest (a partly fetched file's chunks are not trusted across runs). The built-in store's
//! are not listed: they are copies of local blobs, as quick to read again as to keep.
//!
//! Pinned files (`pinned`) are exempt from eviction: the bound holds the other entries, pinned
//! ones come on top of it (as "always keep on this device" does elsewhere), and the index says
//! which keys are pinned, so a mount started offline evicts none of them before it knows its pins.
//!
//! Behind a link with round trips of tens of ms, one download after the other leaves the link
//! idle a round trip each time: a sequential reader's read-ahead goes out in pieces of
//! [`PIECE`] chunks, up to [`AHEAD_RUNS`] of them at once, from its first read on (a window of
//! [`FIRST_WINDOW`]), and a reader whose chunks are on their way waits for them, not for the
//! whole piece. Each chunk is downloaded once: a download claims its chunks while it runs, and
//! says how far it has written: a read is answered once its own bytes are there, not once the
//! whole chunk is (a 128 KiB read in a 1 MiB chunk behind a 100 Mbit/s link waits ~10 ms, not
//! ~85).
//!
//! File names in the cache dir never come from the server: the ID and md5 it sends are only
//! hashed (sha256) into a name, so no answer can make the mount write outside the cache dir.
//!
//! An entry's file is open only while used (`descriptors`): a cache of 50,000 small files holds
//! at most the pool's bound of descriptors, and a mount starting over a large cache opens none.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use lru::LruCache;

use super::descriptors::LazyFile;
use crate::api::{Error, Result};
use crate::backend::Backend;
use crate::sync::relock;

mod download;
use download::{Run, fetch_for_read, fetch_missing, read_ahead};

pub const CHUNK: u64 = 1 << 20;
const MAX_READAHEAD: u64 = 32 * CHUNK;
/// The read-ahead of a file's first sequential read.
const FIRST_WINDOW: u64 = 8 * CHUNK;
/// The bytes of a read that come before its read-ahead starts (see `ReadCache::read`): what a
/// viewer needs of a file's first page.
const FIRST_BYTES: u64 = 128 << 10;
/// Chunks in one read-ahead request, and such requests running at once per file.
const PIECE: u64 = 4;
const AHEAD_RUNS: usize = 4;

pub struct CachedFile {
    pub id: String,
    pub md5: Option<String>,
    pub size: u64,
    /// Its file: a name in the cache dir, or for adopted bytes the staging file handed over
    /// (see `adopt`). Removed when the entry is dropped, unless kept for the next mount.
    file: LazyFile,
    /// Adopted from an upload: not listed in `index.json` (the next mount's journal recovery
    /// removes the staging file), and copied into the cache dir when it must outlive the
    /// mount (`entry_on_disk`).
    adopted: bool,
    present: Mutex<Present>,
    /// A whole-file fill at a time (`fill`): readers of the same key wait for it.
    fetching: tokio::sync::Mutex<()>,
    /// The chunk runs being downloaded (see `download::Claim`) and how far each has written;
    /// `arrived` wakes their waiters as bytes come and runs end.
    inflight: Mutex<Vec<Run>>,
    arrived: tokio::sync::Notify,
    /// End of the last read and the current read-ahead window, for sequential readers.
    last_end: AtomicU64,
    window: AtomicU64,
    /// Its file stays when it is dropped: listed in `index.json` for the next mount.
    kept: AtomicBool,
}

/// The chunks of a cached version its file holds: every one (a whole file: taken over from an
/// upload, kept from the last run, filled), or those listed as they arrive. A whole file, the
/// common case by far, keeps no set (one was made for every file written).
#[derive(Default)]
enum Present {
    All,
    #[default]
    None,
    Some(HashSet<u64>),
}

impl Present {
    fn contains(&self, chunk: &u64) -> bool {
        match self {
            Present::All => true,
            Present::None => false,
            Present::Some(s) => s.contains(chunk),
        }
    }

    fn insert(&mut self, chunk: u64) {
        match self {
            Present::All => {}
            Present::None => *self = Present::Some(HashSet::from([chunk])),
            Present::Some(s) => {
                s.insert(chunk);
            }
        }
    }
}

impl CachedFile {
    fn new(
        id: &str,
        md5: Option<&str>,
        size: u64,
        file: LazyFile,
        adopted: bool,
        present: Present,
    ) -> Arc<CachedFile> {
        Arc::new(CachedFile {
            id: id.to_string(),
            md5: md5.map(str::to_string),
            size,
            file,
            adopted,
            present: Mutex::new(present),
            fetching: tokio::sync::Mutex::new(()),
            inflight: Mutex::new(Vec::new()),
            arrived: tokio::sync::Notify::new(),
            last_end: AtomicU64::new(0),
            window: AtomicU64::new(FIRST_WINDOW / 2),
            kept: AtomicBool::new(false),
        })
    }

    fn missing(&self, first: u64, last: u64) -> Vec<u64> {
        let present = relock(&self.present);
        (first..=last).filter(|c| !present.contains(c)).collect()
    }

    fn mark(&self, chunk: u64) {
        relock(&self.present).insert(chunk);
        self.arrived.notify_waiters();
    }

    /// Whether bytes `offset..end` can be read: each chunk present, or written that far by the
    /// download running over it (present and inflight are taken in `download::claim`'s order).
    fn has(&self, offset: u64, end: u64) -> bool {
        let present = relock(&self.present);
        let inflight = relock(&self.inflight);
        (offset / CHUNK..=(end - 1) / CHUNK).all(|c| {
            present.contains(&c)
                || (inflight.iter()).any(|r| r.covers(c) && r.upto >= end.min((c + 1) * CHUNK))
        })
    }

    /// The download of `run` has written its bytes up to `upto`.
    fn progress(&self, run: (u64, u64), upto: u64) {
        if let Some(r) = relock(&self.inflight).iter_mut().find(|r| r.span == run) {
            r.upto = upto;
        }
        self.arrived.notify_waiters();
    }

    /// The cached bytes' file (handed to the kernel once complete: `passthrough`), opened
    /// again if the descriptor pool closed it.
    pub fn file(&self) -> io::Result<Arc<File>> {
        self.file.get()
    }

    /// Whether it is a whole file of the cache dir's own, listed for the next mount.
    fn kept_whole(&self) -> bool {
        !self.adopted && self.is_complete()
    }

    pub fn is_complete(&self) -> bool {
        self.size == 0 || self.missing(0, (self.size - 1) / CHUNK).is_empty()
    }

    fn pread(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let len = len.min(self.size.saturating_sub(offset) as usize);
        let mut buf = vec![0u8; len];
        self.file.get()?.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        if !self.kept.load(Ordering::Relaxed) {
            let _ = fs::remove_file(self.file.path());
        }
    }
}

pub struct ReadCache {
    dir: PathBuf,
    max_bytes: u64,
    inner: Mutex<Inner>,
    files: AtomicU64,
    /// The keys `index.json` lists (`save_index`), and those it lists as pinned.
    saved: Mutex<HashSet<String>>,
    saved_pinned: Mutex<HashSet<String>>,
}

/// The cache goes with the mount: the files its index lists stay for the next one.
impl Drop for ReadCache {
    fn drop(&mut self) {
        let saved = relock(&self.saved);
        for (k, e) in self.lock().lru.iter() {
            if saved.contains(k) {
                e.kept.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The index of whole files kept for the next mount.
const INDEX: &str = "index.json";

/// A whole file in `index.json`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Whole {
    id: String,
    md5: Option<String>,
    size: u64,
    /// Its name in the cache dir.
    file: String,
    /// Exempt from eviction (a pinned file's version).
    #[serde(default)]
    pinned: bool,
}

struct Inner {
    lru: LruCache<String, Arc<CachedFile>>,
    /// The keys in `lru` of each file ID: a file deleted drops its versions without a walk of
    /// the whole cache (which made `rm -rf` of a folder cost the square of its size).
    by_id: HashMap<String, Vec<String>>,
    bytes: u64,
    /// Keys of the versions pinned files have (present or still to fetch): never evicted.
    pinned: HashSet<String>,
}

/// The most versions the cache keeps track of, whatever their size.
const MAX_ENTRIES: usize = 1 << 20;

/// `lru` and `by_id` change together, only here.
impl Inner {
    /// Adds or replaces the entry of `k`; returns what it replaced (or the LRU's own eviction
    /// at its capacity), its bytes no longer counted.
    fn put(&mut self, k: String, e: Arc<CachedFile>) {
        let id = e.id.clone();
        self.bytes += e.size;
        if let Some((old_k, old)) = self.lru.push(k.clone(), e) {
            self.bytes -= old.size;
            if old_k != k {
                self.unindex(&old.id, &old_k);
            }
        }
        if self.lru.len() > MAX_ENTRIES {
            self.pop_lru();
        }
        let keys = self.by_id.entry(id).or_default();
        if !keys.contains(&k) {
            keys.push(k);
        }
    }

    fn pop(&mut self, k: &str) -> Option<Arc<CachedFile>> {
        let e = self.lru.pop(k)?;
        self.bytes -= e.size;
        self.unindex(&e.id, k);
        Some(e)
    }

    fn pop_lru(&mut self) -> Option<(String, Arc<CachedFile>)> {
        let (k, e) = self.lru.pop_lru()?;
        self.bytes -= e.size;
        self.unindex(&e.id, &k);
        Some((k, e))
    }

    fn unindex(&mut self, id: &str, k: &str) {
        if let Some(keys) = self.by_id.get_mut(id) {
            keys.retain(|x| x != k);
            if keys.is_empty() {
                self.by_id.remove(id);
            }
        }
    }
}

/// The in-memory key of a cached version. (Never a file name: see [`ReadCache::file_for`].)
pub(super) fn key(id: &str, md5: Option<&str>) -> String {
    format!("{id}-{}", md5.unwrap_or("none"))
}

impl ReadCache {
    pub fn open(dir: PathBuf, max_bytes: u64) -> io::Result<ReadCache> {
        super::private_dir(&dir)?;
        let inner = Inner {
            // Unbounded by count here, bounded in `put`: `LruCache::new` sizes its map for
            // the bound at once (36 MB for a million entries, kept by every mount).
            lru: LruCache::unbounded(),
            by_id: HashMap::new(),
            bytes: 0,
            pinned: HashSet::new(),
        };
        let cache = ReadCache {
            dir,
            max_bytes,
            inner: Mutex::new(inner),
            files: AtomicU64::new(0),
            saved: Mutex::new(HashSet::new()),
            saved_pinned: Mutex::new(HashSet::new()),
        };
        cache.keep_whole_files()?;
        Ok(cache)
    }

    /// Takes back the whole files the last run listed in its index; every other file goes
    /// (chunks of a partly fetched file are not trusted across runs).
    fn keep_whole_files(&self) -> io::Result<()> {
        let listed: Vec<Whole> = fs::read(self.dir.join(INDEX))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut keep = std::collections::HashMap::new();
        let mut inner = self.lock();
        // Pinned first: keeping the others below evicts down to the bound.
        for w in listed.iter().filter(|w| w.pinned) {
            inner.pinned.insert(key(&w.id, w.md5.as_deref()));
        }
        *relock(&self.saved_pinned) = inner.pinned.clone();
        for w in listed {
            // Only plain names this cache made (hex digest, a dot, a number).
            if w.file.contains('/') || w.file.starts_with('.') {
                continue;
            }
            keep.insert(w.file.clone(), w);
        }
        let mut next = 0;
        for d in fs::read_dir(&self.dir)? {
            let d = d?;
            let name = d.file_name().to_string_lossy().into_owned();
            let path = d.path();
            let whole = keep
                .remove(&name)
                .filter(|w| d.metadata().is_ok_and(|m| m.is_file() && m.len() == w.size));
            let Some(w) = whole else {
                if name != INDEX {
                    let _ = fs::remove_file(&path);
                }
                continue;
            };
            if let Some(n) = name.rsplit('.').next().and_then(|n| n.parse::<u64>().ok()) {
                next = next.max(n + 1);
            }
            // Opened when first read: a mount over a cache of 20,000 files opens none of them.
            let file = LazyFile::new(path, true);
            let e = CachedFile::new(&w.id, w.md5.as_deref(), w.size, file, false, Present::All);
            let k = key(&w.id, w.md5.as_deref());
            relock(&self.saved).insert(k.clone());
            self.insert(&mut inner, k, e);
        }
        self.files.store(next, Ordering::Relaxed);
        Ok(())
    }

    /// Lists the whole files in `index.json` (synced to disk first, then written aside and
    /// renamed over), for the next mount: `keep_whole_files`. Nothing is written when the
    /// list did not change.
    pub fn save_index(&self) -> io::Result<()> {
        let (whole, pinned): (Vec<(String, Arc<CachedFile>)>, HashSet<String>) = {
            let inner = self.lock();
            let whole: Vec<_> = inner
                .lru
                .iter()
                .filter(|(_, e)| e.kept_whole())
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect();
            let pinned = (whole.iter())
                .filter(|(k, _)| inner.pinned.contains(k))
                .map(|(k, _)| k.clone())
                .collect();
            (whole, pinned)
        };
        let keys: HashSet<String> = whole.iter().map(|(k, _)| k.clone()).collect();
        let mut saved = relock(&self.saved);
        let mut saved_pinned = relock(&self.saved_pinned);
        if *saved == keys && *saved_pinned == pinned {
            return Ok(());
        }
        let mut list = Vec::new();
        for (k, e) in &whole {
            if !saved.contains(k) {
                e.file.get()?.sync_data()?;
            }
            let file = e.file.path().file_name();
            list.push(Whole {
                id: e.id.clone(),
                md5: e.md5.clone(),
                size: e.size,
                file: file
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                pinned: pinned.contains(k),
            });
        }
        super::offline::write_atomically(&self.dir.join(INDEX), &serde_json::to_vec(&list)?)?;
        *saved = keys;
        *saved_pinned = pinned;
        Ok(())
    }

    /// The folder of the cache's files.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        relock(&self.inner)
    }

    /// The cache entry of this version of a file, new (empty) if not cached.
    pub fn entry(&self, id: &str, md5: Option<&str>, size: u64) -> Result<Arc<CachedFile>> {
        let k = key(id, md5);
        let mut inner = self.lock();
        if let Some(e) = inner.lru.get(&k) {
            if e.size == size {
                return Ok(e.clone());
            }
        }
        inner.pop(&k);
        let path = self.file_for(&k);
        let file = crate::api::files::new_private(&path)?;
        file.set_len(size)?;
        let file = LazyFile::opened(path, true, file);
        let e = CachedFile::new(id, md5, size, file, false, Present::default());
        self.insert(&mut inner, k, e.clone());
        Ok(e)
    }

    /// A new file name for an entry: never one an older entry (still being read) has, since
    /// an entry removes its file when dropped. The key holds what the server sent (ID, md5), so
    /// the name is its sha256 in hex: a plain name in the cache dir whatever the server said.
    fn file_for(&self, key: &str) -> PathBuf {
        use sha2::{Digest, Sha256};
        let mut name = crate::api::checksum::hex(&Sha256::digest(key.as_bytes()));
        name.push_str(&format!(".{}", self.files.fetch_add(1, Ordering::Relaxed)));
        self.dir.join(name)
    }

    /// Records an entry (replacing one of the same key) and evicts down to the bound.
    fn insert(&self, inner: &mut Inner, k: String, e: Arc<CachedFile>) {
        inner.put(k, e);
        self.evict(inner);
    }

    /// Drops least recently used entries nobody is reading until the cache fits its bound;
    /// pinned entries stay, and their bytes do not count against it.
    fn evict(&self, inner: &mut Inner) {
        if inner.bytes <= self.max_bytes {
            return;
        }
        let pinned = pinned_bytes(inner);
        let mut skipped = Vec::new();
        // The bytes of the entries taken out to go back: still held.
        let mut held = 0;
        while inner.bytes + held - pinned > self.max_bytes {
            let Some((k, e)) = inner.pop_lru() else {
                break;
            };
            if Arc::strong_count(&e) > 1 || inner.pinned.contains(&k) {
                held += e.size;
                skipped.push((k, e)); // in use or pinned: keep
            }
        }
        // Entries in use go back, still least recently used.
        for (k, e) in skipped.into_iter().rev() {
            inner.put(k.clone(), e);
            inner.lru.demote(&k);
        }
    }

    /// Bytes held (the sizes of the cached versions), the bound, the number of files, and the
    /// bytes of pinned ones among them.
    pub fn usage(&self) -> (u64, u64, usize, u64) {
        let inner = self.lock();
        let pinned = pinned_bytes(&inner);
        (inner.bytes, self.max_bytes, inner.lru.len(), pinned)
    }

    /// The versions pinned files have now (`pinned`): these are never evicted, the others
    /// again once evicted down to the bound.
    pub fn set_pinned(&self, keys: HashSet<String>) {
        let mut inner = self.lock();
        if inner.pinned != keys {
            inner.pinned = keys;
            self.evict(&mut inner);
        }
    }

    /// Whether this version is whole in a file of the cache dir (kept for the next mount).
    pub fn kept_whole(&self, id: &str, md5: Option<&str>) -> bool {
        (self.lock().lru.peek(&key(id, md5))).is_some_and(|e| e.kept_whole())
    }

    /// The entry of a version to keep on disk (a pinned file's): as [`ReadCache::entry`], but
    /// bytes adopted from an upload, which live in a staging file the next mount removes, are
    /// copied into a file of the cache dir, so that they outlive the mount too.
    pub fn entry_on_disk(&self, id: &str, md5: Option<&str>, size: u64) -> Result<Arc<CachedFile>> {
        let k = key(id, md5);
        let adopted = (self.lock().lru.peek(&k))
            .filter(|e| e.adopted && e.size == size && e.is_complete())
            .cloned();
        let Some(a) = adopted else {
            return self.entry(id, md5, size);
        };
        let path = self.file_for(&k);
        let file = crate::api::files::new_private(&path)?;
        file.set_len(size)?;
        crate::api::files::copy_range(&*a.file.get()?, &file, size)?;
        let e = CachedFile::new(
            id,
            md5,
            size,
            LazyFile::opened(path, true, file),
            false,
            Present::All,
        );
        let mut inner = self.lock();
        self.insert(&mut inner, k, e.clone());
        Ok(e)
    }

    /// Forgets every cached version of a file that is gone, so its bytes free their disk (the
    /// cache disk is also where writes are staged). A reader still holding one keeps it until done.
    pub fn invalidate(&self, id: &str) {
        let mut inner = self.lock();
        for k in inner.by_id.get(id).cloned().unwrap_or_default() {
            inner.pop(&k);
        }
    }

    /// Reads `len` bytes at `offset`, downloading the missing chunks it needs first; the
    /// read-ahead of a sequential reader downloads in the background meanwhile.
    pub async fn read<B: Backend>(
        &self,
        backend: &Arc<B>,
        e: &Arc<CachedFile>,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        if offset >= e.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = (offset + len as u64).min(e.size);
        // Sequential readers get a read-ahead window that doubles up to MAX_READAHEAD.
        let window = if e.last_end.swap(end, Ordering::SeqCst) == offset {
            let w = (e.window.load(Ordering::SeqCst) * 2).min(MAX_READAHEAD);
            e.window.store(w, Ordering::SeqCst);
            w
        } else {
            e.window.store(CHUNK, Ordering::SeqCst);
            0
        };
        let last = (end - 1) / CHUNK;
        let ahead_last = ((end + window).min(e.size) - 1) / CHUNK;
        // The read-ahead once this read's first bytes are here: started beside them, its
        // pieces shared the link with them, and the first page of a cold file came ~5x later
        // behind a 50 ms link. Nor once all of them are: a read of a whole chunk (the kernel's
        // read-ahead asks for 1 MiB) would leave the link idle while the read-ahead's requests
        // (a new connection each, under HTTP/1.1) make their round trips; started now, their
        // bytes come as this read's last ones have.
        let first = end.min(offset + FIRST_BYTES);
        if !e.has(offset, first) {
            fetch_for_read(backend, e, offset, first).await?;
        }
        if ahead_last > last {
            read_ahead(backend, e, last + 1, ahead_last);
        }
        if !e.has(offset, end) {
            fetch_for_read(backend, e, offset, end).await?;
        }
        let e2 = e.clone();
        tokio::task::spawn_blocking(move || e2.pread(offset, (end - offset) as usize))
            .await
            .map_err(|err| Error::internal(format!("cache read task failed: {err}")))?
            .map_err(Error::from)
    }

    /// Downloads the whole file into `dest` (for a writer that opens an existing file),
    /// from the cache where complete.
    pub async fn copy_into<B: Backend>(
        &self,
        backend: &B,
        e: &Arc<CachedFile>,
        dest: &File,
    ) -> Result<()> {
        if e.size == 0 {
            return Ok(());
        }
        if !e.is_complete() {
            fetch_missing(backend, e, 0, (e.size - 1) / CHUNK).await?;
        }
        let (src, dst) = (e.file.get()?, dest.try_clone()?);
        let size = e.size;
        // In the kernel, and only the data: holes stay holes.
        tokio::task::spawn_blocking(move || crate::api::files::copy_range(&src, &dst, size))
            .await
            .map_err(|err| Error::internal(format!("copy task failed: {err}")))??;
        Ok(())
    }

    /// Makes the bytes of a just-uploaded staging file the cached content of that version,
    /// so reading back what was written needs no download. The staging file is handed over
    /// (`staging`, `Staged::hand_over`): the journal leaves it when the entry ends, and the
    /// entry removes it when evicted, so there is no link or copy to make per stored file.
    /// The staged file is never written again once it is retired.
    pub fn adopt(&self, id: &str, md5: Option<&str>, size: u64, staged: LazyFile) {
        let e = CachedFile::new(id, md5, size, staged, true, Present::All);
        let mut inner = self.lock();
        self.insert(&mut inner, key(id, md5), e);
    }
}

/// The bytes of the pinned entries held.
fn pinned_bytes(inner: &Inner) -> u64 {
    (inner.pinned.iter())
        .filter_map(|k| inner.lru.peek(k))
        .map(|e| e.size)
        .sum()
}

impl ReadCache {
    /// The complete entry of that key, if cached (the virtual preview files are fetched whole,
    /// under keys of their own).
    pub fn complete(&self, id: &str, md5: Option<&str>) -> Option<Arc<CachedFile>> {
        self.lock()
            .lru
            .get(&key(id, md5))
            .filter(|e| e.is_complete())
            .cloned()
    }

    /// Caches a whole file of `size` bytes from `body`; readers of the same key wait for it.
    pub async fn fill(
        &self,
        id: &str,
        md5: Option<&str>,
        size: u64,
        mut body: crate::backend::ByteStream,
    ) -> Result<Arc<CachedFile>> {
        let e = self.entry(id, md5, size)?;
        let guard = e.fetching.lock().await;
        if e.is_complete() {
            drop(guard);
            return Ok(e);
        }
        let mut off = 0u64;
        let file = e.file.get()?;
        while let Some(bytes) = body.next().await {
            let bytes = bytes.map_err(download::download_failed)?;
            if off + bytes.len() as u64 > size {
                return Err(Error::internal("the server sent more bytes than announced"));
            }
            file.write_all_at(&bytes, off)?;
            off += bytes.len() as u64;
        }
        if off != size {
            return Err(Error::new(
                crate::api::ErrorKind::Network,
                "short_download",
                "the download ended early",
            ));
        }
        for c in 0..size.div_ceil(CHUNK) {
            e.mark(c);
        }
        drop(guard);
        Ok(e)
    }
}

impl CachedFile {
    /// Downloads what is missing of the whole file (a prefetch: `prefetch`).
    pub async fn fetch_all<B: Backend>(self: &Arc<Self>, backend: &B) -> Result<()> {
        if self.size == 0 {
            return Ok(());
        }
        fetch_missing(backend, self, 0, (self.size - 1) / CHUNK).await
    }

    /// Bytes of a complete entry (no download).
    pub async fn read_cached(self: &Arc<Self>, offset: u64, len: usize) -> Result<Vec<u8>> {
        let e = self.clone();
        tokio::task::spawn_blocking(move || e.pread(offset, len))
            .await
            .map_err(|err| Error::internal(format!("cache read task failed: {err}")))?
            .map_err(Error::from)
    }
}

/// The error code of a download that found another version than its entry's.
pub(super) const CHANGED: &str = "changed";

#[cfg(test)]
mod tests;
