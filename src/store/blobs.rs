//! Bytes on disk, content-addressed by sha256: `blobs/<2 hex>/<64 hex>`. A blob is written to
//! `tmp/`, hashed on the way, fsynced, and only then renamed into place, so a blob file is
//! always whole. md5 is computed alongside because it is the interface's checksum.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use md5::{Digest, Md5};

use crate::api::checksum::hex;
use sha2::Sha256;

#[derive(Clone)]
pub struct BlobDir {
    blobs: PathBuf,
    tmp: PathBuf,
    /// The device of the blobs' file system: a file elsewhere cannot be linked in.
    dev: u64,
}

/// A fully written, fsynced staging file with its length and hashes.
#[derive(Debug)]
pub struct Staged {
    pub path: PathBuf,
    pub len: u64,
    pub md5: String,
    pub sha256: String,
}

impl Drop for Staged {
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

    /// fsyncs the file and hands it over, with its hashes, for `BlobDir::commit`.
    pub fn finish(mut self) -> io::Result<Staged> {
        let file = self.file.take().expect("finish called twice");
        file.sync_all()?;
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
        let staged = Staged {
            path: std::mem::take(&mut self.path),
            len: self.len,
            md5,
            sha256: hex(&std::mem::take(&mut self.sha).finalize()),
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
        let (blobs, tmp) = (root.join("blobs"), root.join("tmp"));
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
        })
    }

    /// Moves a staged file into its content address (durably: the directory is fsynced too).
    /// Called with the store's lock held, after checking that no blob of that hash is recorded.
    pub fn commit(&self, staged: &mut Staged) -> io::Result<()> {
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
