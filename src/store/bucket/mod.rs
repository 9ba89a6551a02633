//! Blobs and previews in a bucket (`--blobs s3://BUCKET/PREFIX`, `gs://...`, `az://...`),
//! through apache's `object_store`: its clients of S3, Google Cloud Storage and Azure, with
//! their credential chains, signing, retries and multipart uploads (see docs/deploy.md).
//!
//! Keys are `PREFIX/blobs/<sha256>`. An object appears under its key only whole (a PUT, or a
//! multipart upload once completed), so a crash mid-upload leaves at worst an unfinished
//! multipart upload (invisible; a bucket lifecycle rule aborts them) or an object no version
//! refers to (swept).
//!
//! Synchronous, like the store it serves: each call runs on a small runtime the bucket owns
//! and the calling thread (one of the store's blocking threads) waits for it.
//!
//! Here: where the bucket is opened and the calls on it. Apart: where a bucket is
//! ([`location`]) and the reading of an object as a file ([`reader`]).

mod location;
mod reader;

pub use location::{BucketLocation, Service};
pub use reader::ObjectReader;

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use object_store::path::Path as Key;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

/// Files up to this size are sent in one PUT; larger ones in parts.
pub const MULTIPART_ABOVE: u64 = 16 << 20;
/// Size of the parts of a multipart upload (at least; S3 allows 10,000 parts).
const PART_SIZE: u64 = 16 << 20;
const MAX_PARTS: u64 = 10_000;
/// Parts of one upload in flight at once: a large file goes at the speed of several
/// connections, and holds at most this many parts in memory.
const PARTS_AT_ONCE: usize = 4;

/// One bucket (and prefix) of blobs.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Runs the library's calls; always `Some` but in `drop`.
    runtime: Option<tokio::runtime::Runtime>,
    prefix: String,
    location: BucketLocation,
}

/// Runs blocking waits from wherever the store is called: on a runtime's worker thread (a test
/// calling the store directly) it tells the runtime first.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn io_error(what: &str, e: object_store::Error) -> io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{what}: {e}"))
}

/// The bytes `[start, start + len)` of a file, read by position (the file's own offset is left
/// alone, so any number of these may read one file at once).
fn read_section(file: &File, start: u64, len: u64) -> io::Result<Bytes> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, start).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(e.kind(), "the file is shorter than the blob")
        } else {
            e
        }
    })?;
    Ok(Bytes::from(buf))
}

impl Bucket {
    /// The bucket at `location`, with credentials and settings from the environment (the
    /// service's usual chain, see docs/deploy.md). Nothing is sent until the first call (see
    /// [`Bucket::check`]).
    pub fn open(location: &BucketLocation) -> io::Result<Bucket> {
        let invalid = |e: object_store::Error| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{location}: {e}"))
        };
        // Set key by key, not as a whole `ClientOptions`, which would drop what the
        // environment set (a proxy, `AWS_ALLOW_HTTP`...). A part is 16 MiB: five minutes for
        // one is a stalled connection, not a slow one.
        let timeouts = [
            (ClientConfigKey::ConnectTimeout, "10s"),
            (ClientConfigKey::Timeout, "300s"),
        ];
        let store: Arc<dyn ObjectStore> = match location.service {
            Service::S3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&location.bucket);
                for (k, v) in timeouts {
                    b = b.with_config(AmazonS3ConfigKey::Client(k), v);
                }
                if let Some(e) = &location.endpoint {
                    // A service of our own on a private network or loopback (MinIO, moto...).
                    b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
                }
                Arc::new(b.build().map_err(invalid)?)
            }
            Service::Gcs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&location.bucket);
                for (k, v) in timeouts {
                    b = b.with_config(GoogleConfigKey::Client(k), v);
                }
                Arc::new(b.build().map_err(invalid)?)
            }
            Service::Azure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(&location.bucket);
                for (k, v) in timeouts {
                    b = b.with_config(AzureConfigKey::Client(k), v);
                }
                Arc::new(b.build().map_err(invalid)?)
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bucket")
            .enable_all()
            .build()?;
        Ok(Bucket {
            store,
            runtime: Some(runtime),
            prefix: location.prefix.clone(),
            location: location.clone(),
        })
    }

    pub fn location(&self) -> &BucketLocation {
        &self.location
    }

    /// Runs `f` on the bucket's runtime and waits for it, from any thread (one of another
    /// runtime included: the wait is on a channel, not a nested runtime).
    fn run<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let runtime = self.runtime.as_ref().expect("dropped only in drop");
        runtime.spawn(async move {
            let _ = tx.send(f.await);
        });
        blocking(|| rx.recv()).expect("the bucket's runtime runs while the bucket lives")
    }

    fn key(&self, hash: &str) -> String {
        format!("{}blobs/{hash}", self.prefix)
    }

    /// Claims the prefix for the store `owner` (a random ID kept with its database): the
    /// object `PREFIX/owner` names it, written on first use. A prefix another store claimed is
    /// refused, since each store sweeps the blobs its database does not know: two stores on one
    /// prefix would delete each other's bytes.
    pub fn claim(&self, owner: &str) -> io::Result<()> {
        let key = Key::from(format!("{}owner", self.prefix));
        let store = self.store.clone();
        let k = key.clone();
        let current = self.run(async move {
            match store.get(&k).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match current.map_err(|e| io_error(&format!("reading {key}"), e))? {
            Some(o) if String::from_utf8_lossy(&o).trim() == owner => Ok(()),
            Some(o) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} belongs to another store (owner {}, this one is {owner}); give each store a \
                     prefix of its own",
                    self.location,
                    String::from_utf8_lossy(&o).trim()
                ),
            )),
            None => {
                let store = self.store.clone();
                let body = PutPayload::from(owner.to_string());
                let k = key.clone();
                self.run(async move { store.put(&k, body).await })
                    .map(drop)
                    .map_err(|e| io_error(&format!("writing {key}"), e))
            }
        }
    }

    /// Whether the bucket answers (a listing of at most one key).
    pub fn check(&self) -> io::Result<()> {
        let store = self.store.clone();
        let prefix = Key::from(self.prefix.as_str());
        self.run(async move { store.list(Some(&prefix)).next().await.transpose() })
            .map(drop)
            .map_err(|e| io_error(&format!("listing {}", self.location), e))
    }

    /// Stores the first `len` bytes of `file`, whose sha256 is `sha256`, as that blob.
    pub fn put(&self, file: &Arc<File>, len: u64, sha256: &str) -> io::Result<()> {
        self.put_key(&self.key(sha256), file, len)
    }

    /// Stores the first `len` bytes of `file` under `key`: one PUT, or a multipart upload for
    /// large files (parts read from disk as they go: memory stays bounded whatever the size).
    /// Either way the object appears whole or not at all; a failed multipart upload is aborted.
    pub fn put_key(&self, key: &str, file: &Arc<File>, len: u64) -> io::Result<()> {
        let path = Key::from(key);
        let store = self.store.clone();
        let file = file.clone();
        let result = if len <= MULTIPART_ABOVE {
            let body = read_section(&file, 0, len)?;
            self.run(async move { store.put(&path, body.into()).await.map(drop) })
        } else {
            let part_size = PART_SIZE.max(len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20));
            self.run(async move {
                let upload = store.put_multipart(&path).await?;
                let mut write = WriteMultipart::new_with_chunk_size(upload, part_size as usize);
                let mut start = 0;
                while start < len {
                    if let Err(e) = write.wait_for_capacity(PARTS_AT_ONCE).await {
                        let _ = write.abort().await;
                        return Err(e);
                    }
                    let n = part_size.min(len - start);
                    let f = file.clone();
                    let read = tokio::task::spawn_blocking(move || read_section(&f, start, n))
                        .await
                        .map_err(io::Error::other)
                        .and_then(|r| r);
                    match read {
                        Ok(bytes) => write.put(bytes),
                        Err(e) => {
                            // Unfinished parts cost storage until aborted.
                            let _ = write.abort().await;
                            return Err(object_store::Error::Generic {
                                store: "file",
                                source: Box::new(e),
                            });
                        }
                    }
                    start += n;
                }
                write.finish().await.map(drop)
            })
        };
        result.map_err(|e| io_error(&format!("storing {key}"), e))
    }

    /// The blob's size, or `None` when the bucket has no such blob.
    pub fn size(&self, hash: &str) -> io::Result<Option<u64>> {
        self.size_key(&self.key(hash))
    }

    /// The size of the object `key`, or `None` when there is none.
    pub fn size_key(&self, key: &str) -> io::Result<Option<u64>> {
        let store = self.store.clone();
        let path = Key::from(key);
        match self.run(async move { store.head(&path).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_error(key, e)),
        }
    }

    pub fn remove(&self, hash: &str) -> io::Result<()> {
        self.remove_key(&self.key(hash))
    }

    /// Deletes the object `key` (none there is no error).
    pub fn remove_key(&self, key: &str) -> io::Result<()> {
        let store = self.store.clone();
        let path = Key::from(key);
        match self.run(async move { store.delete(&path).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error(&format!("deleting {key}"), e)),
        }
    }

    /// Every blob hash in the bucket under our prefix.
    pub fn list(&self) -> io::Result<Vec<String>> {
        let prefix = format!("{}blobs/", self.prefix);
        Ok(self
            .list_objects(&prefix)?
            .into_iter()
            .filter_map(|o| {
                let hash = o.key.strip_prefix(&prefix)?;
                (hash.len() == 64 && hash.bytes().all(|c| c.is_ascii_hexdigit()))
                    .then(|| hash.to_string())
            })
            .collect())
    }
}

/// An object found by [`Bucket::list_objects`].
pub struct Object {
    /// The whole key, prefix included.
    pub key: String,
    pub size: u64,
    /// When it was written.
    pub modified: Option<std::time::SystemTime>,
}

impl Bucket {
    /// The key of `name` under the store's prefix.
    pub fn prefixed(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Copies the object `from` to `to` inside the bucket (the service copies; the bytes do not
    /// travel). `to` appears whole or not at all.
    pub fn copy_key(&self, from: &str, to: &str) -> io::Result<()> {
        let store = self.store.clone();
        let (a, b) = (Key::from(from), Key::from(to));
        self.run(async move { store.copy(&a, &b).await })
            .map_err(|e| io_error(&format!("copying {from} to {to}"), e))
    }

    /// Every object under the folder-like `prefix` (a whole key, the store's prefix included,
    /// ending with `/`).
    pub fn list_objects(&self, prefix: &str) -> io::Result<Vec<Object>> {
        let store = self.store.clone();
        let path = Key::from(prefix);
        let listed = self.run(async move {
            let mut out = Vec::new();
            let mut objects = store.list(Some(&path));
            while let Some(o) = objects.next().await {
                let o = o?;
                out.push(Object {
                    key: o.location.to_string(),
                    size: o.size,
                    modified: Some(o.last_modified.into()),
                });
            }
            Ok(out)
        });
        listed.map_err(|e| io_error(&format!("listing {prefix}"), e))
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // Without waiting: the caller may be a runtime's thread, where a runtime may not be
        // dropped (its calls have all been answered by now).
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}
