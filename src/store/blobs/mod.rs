//! The bytes of files, content-addressed by sha256 and immutable, behind one interface
//! ([`Blobs`]) with two places to keep them: a folder (`blobs/<2 hex>/<64 hex>`, [`BlobDir`]) or
//! a bucket of S3, GCS or Azure ([`super::bucket`]). Either way a blob is first written to `tmp/` on local
//! disk, hashed on the way (and fsynced when that file is to become the blob: a folder's), and
//! only then named (renamed into place, or PUT under its key), so a blob under its name is
//! always whole. md5 is computed alongside because it is
//! the interface's checksum.
//!
//! The previews of the blobs go where the blobs go, so that every server of a store finds
//! those any of them rendered: `previews/<2 hex>/<64 hex>/<kind>/` in the data directory beside
//! a folder of blobs (the layout of every store before buckets), `PREFIX/previews/<64 hex>/
//! <kind>/` with a bucket. Either way a preview is rendered into `previews/tmp/` on local disk
//! and only then named (its folder renamed into place, or its files PUT under temporary keys
//! and copied under their names), never partly under its own name ([`StagedPreview`]): see
//! `previews.rs`.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::api::checksum::Md5;
use bytes::Bytes;
use sha2::Digest;

use crate::api::checksum::hex;
use crate::sync::relock;
use sha2::Sha256;

mod previews;
pub use previews::StagedPreview;

#[derive(Clone)]
pub struct BlobDir {
    pub(super) blobs: PathBuf,
    tmp: PathBuf,
    /// The device of the blobs' file system: a file elsewhere cannot be linked in.
    dev: u64,
}

/// A blob's bytes written whole to `tmp/`, fsynced, with their length and hashes, but not yet
/// named (committed) as a blob: [`Blobs::commit`] does that; dropped before, the file is removed.
#[derive(Debug)]
pub struct StagedBlob {
    pub path: PathBuf,
    pub len: u64,
    pub md5: String,
    pub sha256: String,
    /// In the bucket already (see [`Blobs::store_ahead`]), kept there by `hold`.
    stored: bool,
    hold: Option<Hold>,
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        // Once committed the file has been renamed away; otherwise it is garbage.
        let _ = fs::remove_file(&self.path);
    }
}

/// Writes a staging file while hashing it. md5 runs on a thread of its own, fed the same
/// chunks, so the two hashes and the disk write overlap (uploads are CPU-bound otherwise).
/// Dropped before `finish`, it removes the file.
pub struct BlobWriter {
    file: Option<File>,
    path: PathBuf,
    len: u64,
    sha: Sha256,
    md5: Md5State,
    /// The file becomes the blob (a folder's): fsynced at `finish`. Bytes bound for a bucket
    /// are durable once the bucket has them; their staging file is read back from the page
    /// cache and removed, and a crash leaves it for `clear_tmp`.
    durable: bool,
}

/// md5 is hashed inline for the first [`MD5_THREAD_AFTER`] bytes; a larger upload moves it to a
/// thread of its own, fed the same chunks (a thread per small file cost more than its hashing).
enum Md5State {
    Inline(Md5),
    Thread {
        tx: std::sync::mpsc::SyncSender<Bytes>,
        thread: std::thread::JoinHandle<String>,
    },
    Taken,
}

const MD5_THREAD_AFTER: u64 = 4 << 20;

impl BlobWriter {
    pub fn write(&mut self, buf: Bytes) -> io::Result<()> {
        self.sha.update(&buf);
        self.file
            .as_mut()
            .expect("writer used after finish")
            .write_all(&buf)?;
        self.len += buf.len() as u64;
        if let Md5State::Inline(h) = &mut self.md5 {
            if self.len <= MD5_THREAD_AFTER {
                h.update(&buf);
                return Ok(());
            }
            let Md5State::Inline(mut h) = std::mem::replace(&mut self.md5, Md5State::Taken) else {
                unreachable!("matched above");
            };
            let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(16);
            let thread = std::thread::Builder::new()
                .name("md5".into())
                .spawn(move || {
                    for chunk in rx {
                        h.update(&chunk);
                    }
                    hex(&h.finalize())
                })?;
            self.md5 = Md5State::Thread { tx, thread };
        }
        if let Md5State::Thread { tx, .. } = &self.md5 {
            tx.send(buf)
                .map_err(|_| io::Error::other("md5 thread stopped"))?;
        }
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// fsyncs the file (unless bound for a bucket) and hands it over, with its hashes, for
    /// `Blobs::commit`.
    pub fn finish(mut self) -> io::Result<StagedBlob> {
        let file = self.file.take().expect("finish called twice");
        if self.durable {
            file.sync_all()?;
        }
        drop(file);
        let md5 = match std::mem::replace(&mut self.md5, Md5State::Taken) {
            Md5State::Inline(h) => hex(&h.finalize()),
            Md5State::Thread { tx, thread } => {
                drop(tx);
                thread
                    .join()
                    .map_err(|_| io::Error::other("md5 thread panicked"))?
            }
            Md5State::Taken => return Err(io::Error::other("md5 state lost")),
        };
        let staged = StagedBlob {
            path: std::mem::take(&mut self.path),
            len: self.len,
            md5,
            sha256: hex(&std::mem::take(&mut self.sha).finalize()),
            stored: false,
            hold: None,
        };
        Ok(staged)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl BlobDir {
    pub fn open(root: &Path) -> io::Result<BlobDir> {
        BlobDir::at(root.join("blobs"), root.join("tmp"))
    }

    /// Blobs in `blobs`, staged in `tmp` (on the same file system: they are renamed across).
    pub fn at(blobs: PathBuf, tmp: PathBuf) -> io::Result<BlobDir> {
        fs::create_dir_all(&blobs)?;
        fs::create_dir_all(&tmp)?;
        let dev = std::os::unix::fs::MetadataExt::dev(&fs::metadata(&blobs)?);
        Ok(BlobDir { blobs, tmp, dev })
    }

    /// Whether an open file is on the blobs' file system (and can become a blob by a link).
    pub fn can_link(&self, f: &File) -> bool {
        f.metadata()
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::dev(&m) == self.dev)
    }

    pub fn path(&self, hash: &str) -> PathBuf {
        self.blobs.join(&hash[..2]).join(hash)
    }

    /// The folder of files being written (on the same file system as the blobs).
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    /// A fresh name in `tmp/`.
    pub fn tmp_name(&self, prefix: &str) -> PathBuf {
        self.tmp
            .join(format!("{prefix}-{:016x}", rand::random::<u64>()))
    }

    /// A new staging file in `tmp/`.
    pub fn writer(&self) -> io::Result<BlobWriter> {
        let path = self.tmp_name("up");
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(BlobWriter {
            file: Some(file),
            path,
            len: 0,
            sha: Sha256::new(),
            md5: Md5State::Inline(Md5::new()),
            durable: true,
        })
    }

    /// Moves a staged file into its content address (durably: the directory is fsynced too).
    /// Called with the store's lock held, after checking that no blob of that hash is recorded.
    pub fn commit(&self, staged: &mut StagedBlob) -> io::Result<()> {
        if staged.path.as_os_str().is_empty() {
            // In place already: a transaction that recorded it was rolled back (a group
            // commit retried one by one).
            return Ok(());
        }
        let dest = self.path(&staged.sha256);
        let dir = dest.parent().expect("blob path has a parent");
        fs::create_dir_all(dir)?;
        fs::rename(&staged.path, &dest)?;
        staged.path = PathBuf::new();
        File::open(dir)?.sync_all()
    }

    pub fn remove(&self, hash: &str) {
        if let Err(e) = fs::remove_file(self.path(hash)) {
            if e.kind() != io::ErrorKind::NotFound {
                log::warn!("could not remove blob {hash}: {e}");
            }
        }
    }

    /// Empties `tmp/`: whatever is there belongs to uploads that died with the process.
    pub fn clear_tmp(&self) -> io::Result<usize> {
        let mut n = 0;
        for entry in fs::read_dir(&self.tmp)? {
            let entry = entry?;
            if fs::remove_file(entry.path()).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Every blob hash on disk (for the sweep of blobs a crash left unrecorded).
    pub fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for dir in fs::read_dir(&self.blobs)? {
            let dir = dir?;
            if !dir.file_type()?.is_dir() {
                continue;
            }
            for f in fs::read_dir(dir.path())? {
                if let Some(name) = f?.file_name().to_str() {
                    if name.len() == 64 && name.bytes().all(|c| c.is_ascii_hexdigit()) {
                        out.push(name.to_string());
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Where the store keeps its blobs (`--blobs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BlobLocation {
    /// `blobs/` in the data directory.
    #[default]
    DataDir,
    /// A folder of its own (staging in its `.tmp/`, on the same file system).
    Dir(PathBuf),
    /// A bucket of S3, GCS or Azure (staging in the data directory's `tmp/`).
    Bucket(super::bucket::BucketLocation),
}

impl BlobLocation {
    /// `s3://BUCKET/PREFIX` (or `gs://`, `az://`) or a folder.
    pub fn parse(s: &str, s3_endpoint: Option<&str>) -> Result<BlobLocation, String> {
        match super::bucket::BucketLocation::parse(s, s3_endpoint) {
            Some(l) => l.map(BlobLocation::Bucket),
            None if s.contains("://") => Err(format!("{s}: not s3://, gs://, az:// nor a folder")),
            None => Ok(BlobLocation::Dir(PathBuf::from(s))),
        }
    }
}

impl std::fmt::Display for BlobLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobLocation::DataDir => f.write_str("the data directory"),
            BlobLocation::Dir(d) => write!(f, "{}", d.display()),
            BlobLocation::Bucket(l) => write!(f, "{l}"),
        }
    }
}

pub trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

/// The bytes of one blob, opened for reading (a file, or an object read by ranges).
pub struct BlobFile {
    inner: Box<dyn ReadSeek>,
    len: u64,
}

impl BlobFile {
    /// A local file, read as it is.
    pub fn from_file(f: File) -> io::Result<BlobFile> {
        let len = f.metadata()?.len();
        Ok(BlobFile {
            inner: Box::new(f),
            len,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Read for BlobFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Seek for BlobFile {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}

/// Hashes whose bytes an upload has stored ahead of its commit (see [`Blobs::store_ahead`]):
/// their deletion waits, counted per hash.
type Holds = Arc<Mutex<HashMap<String, usize>>>;

/// While alive, the bytes of its hash are not deleted from the bucket.
#[derive(Debug)]
struct Hold {
    holds: Holds,
    hash: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut h = relock(&self.holds);
        if let Some(n) = h.get_mut(&self.hash) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.hash);
            }
        }
    }
}

/// The random ID of the store in `root` (`store.id`, made on first use), which claims a
/// bucket's prefix for it.
fn owner_id(root: &Path) -> io::Result<String> {
    let path = root.join("store.id");
    match fs::read_to_string(&path) {
        Ok(id) => Ok(id.trim().to_string()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = format!("{:032x}", rand::random::<u128>());
            let tmp = root.join(format!("store.id.{:016x}", rand::random::<u64>()));
            fs::write(&tmp, &id)?;
            File::open(&tmp)?.sync_all()?;
            // No overwrite: a store opened twice at once keeps the first ID.
            match fs::hard_link(&tmp, &path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let _ = fs::remove_file(&tmp);
            Ok(fs::read_to_string(&path)?.trim().to_string())
        }
        Err(e) => Err(e),
    }
}

/// The blobs of a store: staged in a local folder, kept there or in a bucket.
#[derive(Clone)]
pub struct Blobs {
    /// Staging (`tmp/`), and the blobs themselves unless there is a bucket.
    dir: BlobDir,
    bucket: Option<Arc<super::bucket::Bucket>>,
    holds: Holds,
    /// `<data dir>/previews`: the previews rendered into `tmp/`, and kept here unless there is
    /// a bucket.
    previews: PathBuf,
}

impl Blobs {
    /// The blobs of the store in `root` at `location`.
    pub fn at(root: &Path, location: &BlobLocation) -> io::Result<Blobs> {
        Blobs::owned_by(root, location, None)
    }

    /// The same, claiming a bucket's prefix for `owner`: the ID of a shared database (every
    /// server of the store has it), else (`None`) `store.id` in `root`.
    pub fn owned_by(
        root: &Path,
        location: &BlobLocation,
        owner: Option<String>,
    ) -> io::Result<Blobs> {
        let (dir, bucket) = match location {
            BlobLocation::DataDir => (BlobDir::open(root)?, None),
            BlobLocation::Dir(d) => (BlobDir::at(d.clone(), d.join(".tmp"))?, None),
            BlobLocation::Bucket(l) => {
                let bucket = super::bucket::Bucket::open(l)?;
                let owner = match owner {
                    Some(o) => o,
                    None => owner_id(root)?,
                };
                bucket.claim(&owner)?;
                // Only `tmp/` is used: the blob folder stays empty.
                (
                    BlobDir::at(root.join("blobs"), root.join("tmp"))?,
                    Some(Arc::new(bucket)),
                )
            }
        };
        let previews = root.join("previews");
        fs::create_dir_all(previews.join("tmp"))?;
        Ok(Blobs {
            dir,
            bucket,
            holds: Holds::default(),
            previews,
        })
    }

    /// The folder of the blobs, when they are in one (hard links, batch fsyncs and direct
    /// paths are for those only).
    pub fn local(&self) -> Option<&BlobDir> {
        self.bucket.is_none().then_some(&self.dir)
    }

    pub fn is_remote(&self) -> bool {
        self.bucket.is_some()
    }

    /// A new staging file in `tmp/`.
    pub fn writer(&self) -> io::Result<BlobWriter> {
        let mut w = self.dir.writer()?;
        w.durable = self.bucket.is_none();
        Ok(w)
    }

    /// A fresh name in `tmp/`.
    pub fn tmp_name(&self, prefix: &str) -> PathBuf {
        self.dir.tmp_name(prefix)
    }

    /// Whether an open file can become a blob by a hard link.
    pub fn can_link(&self, f: &File) -> bool {
        self.local().is_some_and(|d| d.can_link(f))
    }

    /// Empties `tmp/` (see [`BlobDir::clear_tmp`]).
    pub fn clear_tmp(&self) -> io::Result<usize> {
        self.dir.clear_tmp()
    }

    /// With a bucket: stores the staged bytes under their key now, before the caller takes the
    /// store's lock (a network transfer must not hold every other request up), and holds the
    /// hash until `staged` is dropped, so that a delete meanwhile of the last version that used
    /// the same bytes leaves them for this upload. `known` tells whether the store records the
    /// blob (then its bytes are there already); it is asked after the hold is taken. A folder
    /// has nothing to do ahead: its rename is cheap and done under the lock.
    pub fn store_ahead(
        &self,
        staged: &mut StagedBlob,
        known: impl FnOnce(&str) -> crate::api::Result<bool>,
    ) -> crate::api::Result<()> {
        let Some(bucket) = &self.bucket else {
            return Ok(());
        };
        let mut holds = relock(&self.holds);
        *holds.entry(staged.sha256.clone()).or_default() += 1;
        drop(holds);
        staged.hold = Some(Hold {
            holds: self.holds.clone(),
            hash: staged.sha256.clone(),
        });
        if !known(&staged.sha256)? {
            let file = Arc::new(File::open(&staged.path)?);
            bucket.put(&file, staged.len, &staged.sha256)?;
        }
        staged.stored = true;
        Ok(())
    }

    /// Gives staged bytes their name (durably), unless [`Blobs::store_ahead`] did. Called with
    /// the store's lock held, when no blob of that hash is recorded.
    pub fn commit(&self, staged: &mut StagedBlob) -> io::Result<()> {
        match &self.bucket {
            None => self.dir.commit(staged),
            Some(_) if staged.stored => Ok(()),
            Some(b) => b.put(
                &Arc::new(File::open(&staged.path)?),
                staged.len,
                &staged.sha256,
            ),
        }
    }

    /// Stores the first `len` bytes of `file` as the blob `sha256` in the bucket (for a
    /// bucket only; a folder's blobs are linked or renamed into place by the caller).
    pub fn put_file(&self, file: &Arc<File>, len: u64, sha256: &str) -> io::Result<()> {
        match &self.bucket {
            Some(b) => b.put(file, len, sha256),
            None => Err(io::Error::other("put_file is for a bucket")),
        }
    }

    /// Opens a blob for reading (`NotFound` when it is not there).
    pub fn open(&self, hash: &str) -> io::Result<BlobFile> {
        match &self.bucket {
            None => BlobFile::from_file(File::open(self.dir.path(hash))?),
            Some(b) => {
                let len = b
                    .size(hash)?
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, hash.to_string()))?;
                Ok(BlobFile {
                    inner: Box::new(super::bucket::ObjectReader::new(b.clone(), hash, len)),
                    len,
                })
            }
        }
    }

    /// The blob's size where it is kept, `None` when it is missing.
    pub fn size(&self, hash: &str) -> io::Result<Option<u64>> {
        match &self.bucket {
            None => match fs::metadata(self.dir.path(hash)) {
                Ok(m) => Ok(Some(m.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
            Some(b) => b.size(hash),
        }
    }

    /// Removes a blob no version uses any more (called under the store's lock); bytes an
    /// upload holds stay (it is about to record them again).
    pub fn remove(&self, hash: &str) {
        match &self.bucket {
            None => self.dir.remove(hash),
            Some(b) => {
                let holds = relock(&self.holds);
                if holds.contains_key(hash) {
                    return;
                }
                if let Err(e) = b.remove(hash) {
                    if e.kind() != io::ErrorKind::NotFound {
                        log::warn!("could not remove blob {hash}: {e}");
                    }
                }
            }
        }
    }

    /// Every blob hash kept (for the sweep of blobs a crash left unrecorded).
    pub fn list(&self) -> io::Result<Vec<String>> {
        match &self.bucket {
            None => self.dir.list(),
            Some(b) => b.list(),
        }
    }

    /// Whether the blobs are reachable (`GET /healthz`).
    pub fn check(&self) -> io::Result<()> {
        match &self.bucket {
            None => fs::metadata(&self.dir.blobs).map(drop),
            Some(b) => b.check(),
        }
    }

    /// Where they are, for logs.
    pub fn describe(&self) -> String {
        match &self.bucket {
            None => self.dir.blobs.display().to_string(),
            Some(b) => b.location().to_string(),
        }
    }
}
