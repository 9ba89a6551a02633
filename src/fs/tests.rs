//! The file system's logic against a backend that fails on purpose ([`Faulty`] over the
//! built-in store in a temporary dir), called directly: no kernel, no mount. Each test asserts
//! what a user would see: bytes read, errnos, names listed, what the store ends up holding.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Errno, RenameFlags};
use futures_util::StreamExt;

use super::nodes::Refresh;
use super::table::{Ino, ROOT};
use super::{Fs, MountOptions};
use crate::api::{Error, NodePath};
use crate::backend::faulty::{Fault, Faulty, Op};
use crate::backend::local::LocalBackend;
use crate::backend::{Backend, ByteStream};
use crate::store::Store;

pub(super) type TestFs = Fs<Faulty<LocalBackend>>;

pub(super) struct Harness {
    pub(super) fs: Arc<TestFs>,
    pub(super) vault: NodePath,
    pub(super) cache_dir: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

/// A file system over a fresh store, rooted at its vault.
pub(super) fn harness(one_by_one: bool, dir_ttl: Duration) -> Harness {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_local(&tmp.path().join("data")).unwrap());
    let local = LocalBackend::new(store);
    let backend = if one_by_one {
        Faulty::one_by_one(local)
    } else {
        Faulty::new(local)
    };
    let vault = NodePath::from_segments(["Local", "My First Vault"]).unwrap();
    let cache_dir = tmp.path().join("cache");
    let opts = MountOptions {
        root: vault.clone(),
        cache_dir: cache_dir.clone(),
        dir_ttl,
        ..MountOptions::default()
    };
    let fs = Fs::start(backend, opts, tokio::runtime::Handle::current()).unwrap();
    Harness {
        fs,
        vault,
        cache_dir,
        _tmp: tmp,
    }
}

/// No kernel to pass files through to: every open is served the plain way.
pub(super) fn no_backing(_: std::os::fd::BorrowedFd<'_>) -> std::io::Result<fuser::BackingId> {
    Err(std::io::ErrorKind::Unsupported.into())
}

impl Harness {
    pub(super) fn faults(&self) -> &Faulty<LocalBackend> {
        &self.fs.backend
    }

    pub(super) fn store(&self) -> &LocalBackend {
        self.faults().inner()
    }

    /// creat(2) of `name` in the root: its inode and handle.
    pub(super) async fn create(&self, name: &str) -> (Ino, u64) {
        let (attr, fh) = self
            .fs
            .create(ROOT, name, libc::O_CREAT | libc::O_WRONLY, 0, &no_backing)
            .await
            .unwrap();
        (attr.ino.0, fh.fh)
    }

    /// A new file in `dir` with `data`, fsynced and closed.
    pub(super) async fn write_file(&self, dir: Ino, name: &str, data: &[u8]) -> Ino {
        let (attr, fh) = self
            .fs
            .create(dir, name, libc::O_CREAT | libc::O_WRONLY, 0, &no_backing)
            .await
            .unwrap();
        let (ino, fh) = (attr.ino.0, fh.fh);
        assert_eq!(self.fs.write(fh, 0, data), Ok(data.len() as u32));
        self.fs.fsync(ino).await.unwrap();
        self.fs.release(fh);
        ino
    }

    /// The bytes the store holds at `name` of the vault (another client's view).
    pub(super) async fn stored(&self, name: &str) -> Option<Vec<u8>> {
        let node = self
            .store()
            .node(&self.vault.child(name).unwrap())
            .await
            .ok()?;
        let id = node.file_id()?;
        let download = self.store().download(&id, None).await.unwrap();
        let mut body = download.body;
        let mut out = Vec::new();
        while let Some(chunk) = body.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        Some(out)
    }

    /// Another client stores `data` at `name` of the vault (the three upload steps).
    pub(super) async fn put_remote(&self, name: &str, data: &'static [u8]) {
        let s = self.store();
        let file = s.create_file(&self.vault, name).await.unwrap();
        self.put_version(&file.file_id().unwrap(), data).await;
    }

    /// Another client stores `data` as a new version of file `id` (steps 2 and 3).
    pub(super) async fn put_version(&self, id: &str, data: &'static [u8]) {
        let s = self.store();
        let id = id.to_string();
        let ticket = s.begin_version(&id, data.len() as u64, None).await.unwrap();
        let body: ByteStream = Box::pin(futures_util::stream::once(async move {
            Ok(bytes::Bytes::from_static(data))
        }));
        s.upload(&id, &ticket.version_id().unwrap(), data.len() as u64, body)
            .await
            .unwrap();
    }

    pub(super) async fn read_all(&self, ino: Ino) -> super::OpResult<Vec<u8>> {
        self.fs.read(ino, 0, 1 << 20).await
    }

    pub(super) async fn names(&self, dir: Ino) -> Vec<String> {
        let mut names: Vec<String> = self
            .fs
            .readdir_snapshot(dir)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, _, n)| n)
            .filter(|n| n != "." && n != "..")
            .collect();
        names.sort();
        names
    }
}

/// Waits (up to `limit`) for `cond` to hold; panics with `what` when it never does.
pub(super) async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < until, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_the_store_refuses_stays_journaled_and_readable_until_stored() {
    let h = harness(false, TTL);
    h.faults().inject(Op::PutFiles, Fault::transport());
    let (ino, fh) = h.create("a.txt").await;
    h.fs.write(fh, 0, b"hello").unwrap();
    h.fs.release(fh);
    eventually(Duration::from_secs(5), "a batch tried", || async {
        h.faults().calls(Op::PutFiles) >= 1
    })
    .await;

    // Refused: still here, readable and journaled, not in the store.
    assert_eq!(h.read_all(ino).await.unwrap(), b"hello");
    assert_eq!(h.fs.journal.len(), 1);
    assert_eq!(h.stored("a.txt").await, None);
    assert_eq!(h.names(ROOT).await, ["a.txt"]);

    // The store is back: the retry stores it and the journal entry ends.
    h.faults().clear_all();
    eventually(
        Duration::from_secs(15),
        "stored after the fault",
        || async { h.stored("a.txt").await.as_deref() == Some(b"hello") },
    )
    .await;
    eventually(Duration::from_secs(5), "journal entry ended", || async {
        h.fs.journal.len() == 0
    })
    .await;
    assert_eq!(h.read_all(ino).await.unwrap(), b"hello");
    assert_eq!(h.fs.lookup(ROOT, "a.txt").await.unwrap().size, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_reports_eio_while_uploads_fail_and_stores_once_they_work() {
    // File by file (the remote backend's uploader), failing at step 3 with a 503.
    let h = harness(true, TTL);
    h.faults().inject(Op::Upload, Fault::status(503));
    let (ino, fh) = h.create("b.txt").await;
    h.fs.write(fh, 0, b"first").unwrap();
    h.fs.write(fh, 5, b" second").unwrap();
    assert_eq!(h.fs.fsync(ino).await, Err(Errno::EIO.into()));
    assert_eq!(h.read_all(ino).await.unwrap(), b"first second");
    assert_eq!(h.stored("b.txt").await.as_deref(), Some(&b""[..]));

    h.faults().clear_all();
    assert_eq!(h.fs.fsync(ino).await, Ok(()));
    // fsync returned: the store has the bytes now, not later.
    assert_eq!(
        h.stored("b.txt").await.as_deref(),
        Some(&b"first second"[..])
    );
    h.fs.release(fh);
    assert_eq!(h.read_all(ino).await.unwrap(), b"first second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_under_a_slow_store_returns_only_once_stored() {
    let h = harness(false, TTL);
    let delay = Duration::from_millis(600);
    h.faults().inject(Op::PutFiles, Fault::Delay(delay));
    let (ino, fh) = h.create("slow.txt").await;
    h.fs.write(fh, 0, b"patience").unwrap();
    let started = Instant::now();
    let fsync = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.fsync(ino).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !fsync.is_finished(),
        "fsync returned before the store answered"
    );
    assert_eq!(h.stored("slow.txt").await, None);

    assert_eq!(fsync.await.unwrap(), Ok(()));
    assert!(started.elapsed() >= delay);
    assert_eq!(
        h.stored("slow.txt").await.as_deref(),
        Some(&b"patience"[..])
    );
    h.fs.release(fh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_answered_from_cached_listings() {
    let h = harness(false, Duration::from_millis(100));
    h.put_remote("r.txt", b"remote").await;
    h.store()
        .create_folder(&h.vault.child("sub").unwrap())
        .await
        .unwrap();
    let file = h.fs.lookup(ROOT, "r.txt").await.unwrap();
    assert_eq!(file.size, 6);
    let sub = h.fs.lookup(ROOT, "sub").await.unwrap().ino.0;

    h.faults().inject(Op::List, Fault::transport());
    h.faults().inject(Op::Node, Fault::transport());
    tokio::time::sleep(Duration::from_millis(150)).await; // the listing is old now

    // What was listed is still there, as it was; what is not there is ENOENT, not EIO.
    assert_eq!(h.fs.lookup(ROOT, "r.txt").await.unwrap().size, 6);
    assert_eq!(h.fs.getattr(file.ino.0).await.unwrap().size, 6);
    assert_eq!(
        h.fs.lookup(ROOT, "nothing").await,
        Err(Errno::ENOENT.into())
    );
    assert_eq!(h.names(ROOT).await, ["r.txt", "sub"]);
    // A folder never listed cannot be answered: EIO.
    assert_eq!(h.fs.lookup(sub, "x").await, Err(Errno::EIO.into()));
    // The bytes still come (downloads work).
    assert_eq!(h.read_all(file.ino.0).await.unwrap(), b"remote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_errors_are_the_posix_ones_and_change_nothing() {
    let h = harness(false, TTL);
    h.write_file(ROOT, "a", b"A").await;
    h.write_file(ROOT, "b", b"B").await;
    let d1 = h.fs.mkdir(ROOT, "d1").await.unwrap().ino.0;
    let d2 = h.fs.mkdir(ROOT, "d2").await.unwrap().ino.0;
    h.write_file(d2, "x", b"X").await;
    let none = RenameFlags::empty();

    let rename = |a: &'static str, b: &'static str, flags| {
        let fs = h.fs.clone();
        async move { fs.rename(ROOT, a, ROOT, b, flags).await }
    };
    assert_eq!(
        rename("missing", "z", none).await,
        Err(Errno::ENOENT.into())
    );
    assert_eq!(rename("a", "d1", none).await, Err(Errno::EISDIR.into()));
    assert_eq!(rename("d1", "a", none).await, Err(Errno::ENOTDIR.into()));
    assert_eq!(rename("d1", "d2", none).await, Err(Errno::ENOTEMPTY.into()));
    let noreplace = RenameFlags::RENAME_NOREPLACE;
    assert_eq!(rename("a", "b", noreplace).await, Err(Errno::EEXIST.into()));
    let exchange = RenameFlags::RENAME_EXCHANGE;
    assert_eq!(rename("a", "b", exchange).await, Err(Errno::EINVAL.into()));
    assert_eq!(
        h.fs.rename(ROOT, "d1", d1, "inside", none).await,
        Err(Errno::EINVAL.into())
    );
    assert_eq!(h.fs.unlink(ROOT, "d1").await, Err(Errno::EISDIR.into()));
    assert_eq!(h.fs.rmdir(ROOT, "a").await, Err(Errno::ENOTDIR.into()));
    assert_eq!(h.fs.rmdir(ROOT, "d2").await, Err(Errno::ENOTEMPTY.into()));
    assert_eq!(
        h.fs.unlink(ROOT, "missing").await,
        Err(Errno::ENOENT.into())
    );
    assert_eq!(
        h.fs.mkdir(ROOT, "a").await.err().map(|e| e.errno()),
        Some(Errno::EEXIST)
    );
    let excl = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
    assert_eq!(
        h.fs.create(ROOT, "a", excl, 0, &no_backing)
            .await
            .err()
            .map(|e| e.errno()),
        Some(Errno::EEXIST)
    );
    assert_eq!(
        h.fs.create(ROOT, ".preview", libc::O_CREAT, 0, &no_backing)
            .await
            .err()
            .map(|e| e.errno()),
        Some(Errno::EROFS)
    );

    assert_eq!(h.names(ROOT).await, ["a", "b", "d1", "d2"]);
    assert_eq!(h.names(d2).await, ["x"]);
    assert_eq!(h.stored("a").await.as_deref(), Some(&b"A"[..]));
    assert_eq!(h.stored("b").await.as_deref(), Some(&b"B"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_map_to_one_errno_each_and_a_refused_delete_leaves_the_file() {
    let h = harness(false, TTL);
    let a = h.write_file(ROOT, "a", b"A").await;
    let rename = || {
        let fs = h.fs.clone();
        async move { fs.rename(ROOT, "a", ROOT, "c", RenameFlags::empty()).await }
    };
    let cases = [
        (Fault::transport(), Errno::EIO),
        (Fault::status(500), Errno::EIO),
        (Fault::status(409), Errno::EEXIST),
        (Fault::status(403), Errno::EACCES),
        (Fault::status(503), Errno::EAGAIN),
        (Fault::status(507), Errno::ENOSPC),
    ];
    for (fault, want) in cases.clone() {
        h.faults().inject_times(Op::Rename, fault, 1);
        assert_eq!(rename().await, Err(want.into()), "rename");
    }
    // A folder's delete is made before RMDIR is answered: its failures are the rmdir's.
    h.fs.mkdir(ROOT, "e").await.unwrap();
    for (fault, want) in cases {
        h.faults().inject_times(Op::Delete, fault, 1);
        assert_eq!(h.fs.rmdir(ROOT, "e").await, Err(want.into()), "rmdir");
    }
    // Nothing changed, here or in the store.
    assert_eq!(h.names(ROOT).await, ["a", "e"]);
    assert_eq!(h.read_all(a).await.unwrap(), b"A");
    assert_eq!(h.stored("a").await.as_deref(), Some(&b"A"[..]));
    assert_eq!(h.stored("c").await, None);

    // A file's is sent after UNLINK is answered (`deletes`). Refused, the file stays where it
    // was and is listed again.
    h.faults().inject_times(Op::Delete, Fault::status(403), 1);
    assert_eq!(h.fs.unlink(ROOT, "a").await, Ok(()));
    h.fs.deletes_sent().await;
    assert_eq!(h.names(ROOT).await, ["a", "e"]);
    assert_eq!(h.stored("a").await.as_deref(), Some(&b"A"[..]));
    // A passing failure (the server away a moment) is tried again.
    h.faults().inject_times(Op::Delete, Fault::status(503), 1);
    assert_eq!(h.fs.unlink(ROOT, "a").await, Ok(()));
    h.fs.deletes_sent().await;
    assert_eq!(h.stored("a").await, None);
    assert_eq!(h.names(ROOT).await, ["e"]);
    h.fs.rmdir(ROOT, "e").await.unwrap();

    // Gone from the store already (someone else removed it): the unlink succeeds.
    h.write_file(ROOT, "a", b"A").await;
    h.faults()
        .inject_times(Op::Delete, Fault::Fail(Error::not_found("gone")), 1);
    assert_eq!(h.fs.unlink(ROOT, "a").await, Ok(()));
    h.fs.deletes_sent().await;
    assert_eq!(h.names(ROOT).await, Vec::<String>::new());
    assert_eq!(h.fs.lookup(ROOT, "a").await, Err(Errno::ENOENT.into()));

    // And a mkdir on a full store.
    h.faults()
        .inject_times(Op::CreateFolder, Fault::status(507), 1);
    assert_eq!(
        h.fs.mkdir(ROOT, "d").await.err().map(|e| e.errno()),
        Some(Errno::ENOSPC)
    );
    assert_eq!(h.names(ROOT).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fail_with_eio_while_downloads_fail_then_come_back_whole() {
    let h = harness(false, TTL);
    h.put_remote("r.bin", b"0123456789").await;
    let ino = h.fs.lookup(ROOT, "r.bin").await.unwrap().ino.0;
    h.faults().inject(Op::Download, Fault::transport());
    assert_eq!(h.read_all(ino).await, Err(Errno::EIO.into()));
    h.faults().clear_all();
    assert_eq!(h.read_all(ino).await.unwrap(), b"0123456789");
    assert_eq!(h.fs.read(ino, 4, 3).await.unwrap(), b"456");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_is_answered_once_its_own_bytes_came_not_its_whole_chunk() {
    // Behind a slow link a 1 MiB chunk takes ~85 ms at 100 Mbit/s: the first page must not
    // wait for it. Every download here sends 256 KiB, then nothing more (a link gone quiet).
    let h = harness(false, TTL);
    let data: &'static [u8] = Box::leak((0..3 << 20).map(|i| (i % 251) as u8).collect());
    h.put_remote("big.bin", data).await;
    let ino = h.fs.lookup(ROOT, "big.bin").await.unwrap().ino.0;
    h.faults()
        .inject(Op::Download, Fault::StallAfter(256 << 10));
    let first = tokio::time::timeout(Duration::from_secs(20), h.fs.read(ino, 0, 128 << 10));
    assert_eq!(
        first.await.expect("the read waited for its whole chunk"),
        Ok(data[..128 << 10].to_vec())
    );
    // Bytes past what came wait: the reader is never handed a hole as data.
    let later = tokio::time::timeout(Duration::from_millis(300), h.fs.read(ino, 512 << 10, 4096));
    assert!(
        later.await.is_err(),
        "a read of bytes that never came returned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_in_a_folder_the_store_lost_is_stored_in_the_folder_made_again() {
    // The store acknowledged the folder, then lost it (restarted from before it; or another
    // client deleted it). An edit beats a delete (`conflict`): the folder is made again and
    // the file stored there, nothing set aside. (Before: set aside in lost+found and gone
    // from the mount.)
    let h = harness(false, TTL);
    h.faults().inject_times(Op::CreateFolder, Fault::Lose, 1);
    let dir = h.fs.mkdir(ROOT, "gone").await.unwrap().ino.0;
    let (_attr, fh) =
        h.fs.create(
            dir,
            "orphan.txt",
            libc::O_CREAT | libc::O_WRONLY,
            0,
            &no_backing,
        )
        .await
        .unwrap();
    let fh = fh.fh;
    h.fs.write(fh, 0, b"keep me").unwrap();
    h.fs.release(fh);

    let path = h.vault.child("gone").unwrap().child("orphan.txt").unwrap();
    eventually(Duration::from_secs(20), "stored again", || async {
        h.store().node(&path).await.is_ok() && h.fs.journal.len() == 0
    })
    .await;
    let id = h.store().node(&path).await.unwrap().file_id().unwrap();
    let mut body = h.store().download(&id, None).await.unwrap().body;
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(out, b"keep me");
    assert!(!std::fs::read_dir(h.cache_dir.join("lost+found")).is_ok_and(|d| d.count() > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_store_acknowledged_and_lost_is_gone_once_listed_again() {
    // What the mount does when a store restarts from before an acknowledged batch: it
    // trusted the answer (fsync succeeded, the journal entry ended), so nothing uploads the
    // file again, and the next listing takes it away. Recorded here as the behaviour as it is.
    let h = harness(false, Duration::from_millis(100));
    h.faults().inject_times(Op::PutFiles, Fault::Lose, 1);
    h.write_file(ROOT, "lost.txt", b"acknowledged").await;
    assert_eq!(h.stored("lost.txt").await, None);
    assert_eq!(h.fs.journal.len(), 0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    eventually(
        Duration::from_secs(5),
        "listed again without it",
        || async { h.fs.lookup(ROOT, "lost.txt").await == Err(Errno::ENOENT.into()) },
    )
    .await;
    assert_eq!(h.names(ROOT).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_taken_before_an_upload_does_not_bring_back_the_old_content() {
    // A listing asked for before the mount's own upload is stored, and answered after it,
    // holds the file's previous version: the mount must keep reading what it wrote.
    let h = harness(false, Duration::from_millis(50));
    h.put_remote("f.txt", b"old").await;
    let ino = h.fs.lookup(ROOT, "f.txt").await.unwrap().ino.0;
    assert_eq!(h.read_all(ino).await.unwrap(), b"old"); // in the read cache now
    tokio::time::sleep(Duration::from_millis(100)).await; // the listing is old

    h.faults()
        .inject_times(Op::List, Fault::SlowAnswer(Duration::from_millis(500)), 1);
    // This lookup starts a refresh (answered in 500 ms) and goes on from the old listing.
    h.fs.lookup(ROOT, "f.txt").await.unwrap();
    let opened =
        h.fs.open(ino, fuser::OpenFlags(libc::O_WRONLY | libc::O_TRUNC))
            .await
            .unwrap();
    h.fs.write(opened.fh, 0, b"new content").unwrap();
    h.fs.fsync(ino).await.unwrap();
    h.fs.release(opened.fh);
    assert_eq!(
        h.stored("f.txt").await.as_deref(),
        Some(&b"new content"[..])
    );
    assert_eq!(h.read_all(ino).await.unwrap(), b"new content");

    // The slow listing lands now.
    eventually(
        Duration::from_secs(5),
        "the slow listing answered",
        || async {
            h.faults().calls(Op::List) >= 2
                && h.fs
                    .nodes
                    .refreshes(Refresh::Listing)
                    .lock()
                    .unwrap()
                    .is_empty()
        },
    )
    .await;
    assert_eq!(h.fs.getattr(ino).await.unwrap().size, 11);
    assert_eq!(h.read_all(ino).await.unwrap(), b"new content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_asked_for_before_an_upload_do_not_bring_back_the_old_content() {
    // The same with a GETATTR's refresh of one node.
    let h = harness(false, Duration::from_millis(50));
    h.put_remote("g.txt", b"old").await;
    let ino = h.fs.lookup(ROOT, "g.txt").await.unwrap().ino.0;
    assert_eq!(h.read_all(ino).await.unwrap(), b"old");
    tokio::time::sleep(Duration::from_millis(100)).await; // the attributes are old

    h.faults()
        .inject_times(Op::Node, Fault::SlowAnswer(Duration::from_millis(500)), 1);
    // Answered from what the mount has while the refresh goes on.
    assert_eq!(h.fs.getattr(ino).await.unwrap().size, 3);
    let opened =
        h.fs.open(ino, fuser::OpenFlags(libc::O_WRONLY | libc::O_TRUNC))
            .await
            .unwrap();
    h.fs.write(opened.fh, 0, b"new content").unwrap();
    h.fs.fsync(ino).await.unwrap();
    h.fs.release(opened.fh);
    assert_eq!(h.read_all(ino).await.unwrap(), b"new content");

    eventually(Duration::from_secs(5), "the slow answer came", || async {
        h.fs.nodes
            .refreshes(Refresh::Attrs)
            .lock()
            .unwrap()
            .is_empty()
    })
    .await;
    assert_eq!(h.fs.attr(ino).unwrap().size, 11);
    assert_eq!(h.read_all(ino).await.unwrap(), b"new content");
}

/// A writer that opens a stored file just as the last other writer's close settles it (fstests
/// generic/451: readers open the file read-write in a loop while a writer opens, writes and
/// closes it). The close had already counted itself out when the new open joined the staged
/// copy; settling must not then drop that copy from the inode, or the new writer's bytes go to
/// a copy nobody reads or stores: reads served the old content, and the write was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_joining_a_staged_copy_as_the_last_close_settles_it_is_kept() {
    let h = harness(false, TTL);
    let ino = h.write_file(ROOT, "cycle.bin", b"pattern one").await;
    let rw = fuser::OpenFlags(libc::O_RDWR);
    // A reader opens read-write, and closes: its release counts itself out first...
    let reader = h.fs.open(ino, rw).await.unwrap();
    let staged = h.fs.writing(reader.fh).unwrap();
    assert_eq!(staged.leave(), Ok(true));
    // ...the writer opens in between and joins the same staged copy...
    let writer = h.fs.open(ino, rw).await.unwrap();
    assert!(Arc::ptr_eq(&staged, &h.fs.writing(writer.fh).unwrap()));
    // ...then the reader's release settles the copy, which it found clean.
    h.fs.settle(ino, &staged);
    h.fs.handles().remove(&reader.fh);

    assert_eq!(h.fs.write(writer.fh, 0, b"pattern two"), Ok(11));
    h.fs.release(writer.fh);
    assert_eq!(h.read_all(ino).await.unwrap(), b"pattern two");
    h.fs.fsync(ino).await.unwrap();
    eventually(Duration::from_secs(5), "the new bytes stored", || async {
        h.stored("cycle.bin").await.as_deref() == Some(b"pattern two")
    })
    .await;
}

/// An open that copies a stored file into a staging copy while the file gets a new version
/// (another writer here truncated, wrote and stored it meanwhile) does not stage the old bytes:
/// it copies again (fstests generic/451, "stale data from DIO read").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_copies_an_old_version_copies_again() {
    let h = harness(false, TTL);
    h.put_remote("v.bin", b"version one").await;
    let ino = h.fs.lookup(ROOT, "v.bin").await.unwrap().ino.0;
    // The slow copy: its download waits while the other writer stores a new version.
    h.faults()
        .inject_times(Op::Download, Fault::Delay(Duration::from_millis(800)), 1);
    let fs = h.fs.clone();
    let slow =
        tokio::spawn(async move { fs.open(ino, fuser::OpenFlags(libc::O_RDWR)).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let trunc = fuser::OpenFlags(libc::O_RDWR | libc::O_TRUNC);
    let writer = h.fs.open(ino, trunc).await.unwrap();
    assert_eq!(h.fs.write(writer.fh, 0, b"version two"), Ok(11));
    h.fs.fsync(ino).await.unwrap();
    h.fs.release(writer.fh);
    assert_eq!(
        h.stored("v.bin").await.as_deref(),
        Some(&b"version two"[..])
    );

    let opened = slow.await.unwrap();
    assert_eq!(h.read_all(ino).await.unwrap(), b"version two");
    h.fs.release(opened.fh);
    assert_eq!(h.read_all(ino).await.unwrap(), b"version two");
}

/// A file deleted elsewhere (the model, remote: T deleted `c.txt`, B rewrote it with fsync at
/// once): the kernel may still hold the name of the inode the mount has just detached. An open
/// or a truncate through it is refused with ESTALE, and the kernel looks the name up again (a
/// rewrite then creates the file anew); writing into the detached inode returned Ok to fsync
/// and stored nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_through_the_name_of_a_file_deleted_elsewhere_is_stored() {
    let h = harness(false, Duration::from_millis(50));
    h.put_remote("c.txt", b"theirs").await;
    let ino = h.fs.lookup(ROOT, "c.txt").await.unwrap().ino.0;
    h.store()
        .delete(&h.vault.child("c.txt").unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.names(ROOT).await, Vec::<String>::new());

    // What the kernel sends through the name it still holds.
    let trunc = fuser::OpenFlags(libc::O_WRONLY | libc::O_TRUNC);
    assert_eq!(
        h.fs.open(ino, trunc).await.err().map(|e| e.errno()),
        Some(Errno::ESTALE)
    );
    let rw = fuser::OpenFlags(libc::O_RDWR);
    assert_eq!(
        h.fs.open(ino, rw).await.err().map(|e| e.errno()),
        Some(Errno::ESTALE)
    );
    let truncate = h.fs.setattr(ino, Some(0), (None, None), None, (None, None));
    assert_eq!(truncate.await.err().map(|e| e.errno()), Some(Errno::ESTALE));
    // Its retry, looking the name up again: O_CREAT makes the file anew.
    assert_eq!(
        h.fs.lookup(ROOT, "c.txt").await.err().map(|e| e.errno()),
        Some(Errno::ENOENT)
    );
    h.write_file(ROOT, "c.txt", b"mine").await;
    assert_eq!(h.stored("c.txt").await.as_deref(), Some(&b"mine"[..]));
}

/// A move elsewhere landing while a writer's open copies the stored bytes into its staged copy
/// (the download goes on: the document is still there): the open is refused with ESTALE once
/// the copy is staged, not left writing into an inode whose bytes have no name to be stored
/// under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_elsewhere_during_a_writers_open_refuses_the_open() {
    let h = harness(false, Duration::from_millis(50));
    h.put_remote("d.txt", b"theirs").await;
    let ino = h.fs.lookup(ROOT, "d.txt").await.unwrap().ino.0;
    h.faults()
        .inject_times(Op::Download, Fault::Delay(Duration::from_millis(800)), 1);
    let fs = h.fs.clone();
    let open = tokio::spawn(async move { fs.open(ino, fuser::OpenFlags(libc::O_RDWR)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (from, to) = (
        h.vault.child("d.txt").unwrap(),
        h.vault.child("e.txt").unwrap(),
    );
    h.store().rename(&from, &to, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.names(ROOT).await, vec!["e.txt".to_string()]);
    assert_eq!(
        open.await.unwrap().err().map(|e| e.errno()),
        Some(Errno::ESTALE)
    );
    assert!(
        h.fs.nodes
            .inode(ino, |i| i.staged.is_none())
            .unwrap_or(true)
    );
}

/// A file another client made (step 1) and had not stored a version of yet, when this mount
/// listed it, then stored: an unlink here, which saw an empty file, leaves that version (an
/// edit beats a delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_of_a_file_seen_before_its_first_version_keeps_that_version() {
    let h = harness(false, TTL);
    let file = h.store().create_file(&h.vault, "new.txt").await.unwrap();
    let attr = h.fs.lookup(ROOT, "new.txt").await.unwrap();
    assert_eq!(attr.size, 0);
    h.put_version(&file.file_id().unwrap(), b"their first words")
        .await;
    let _ = h.fs.unlink(ROOT, "new.txt").await;
    assert_eq!(
        h.stored("new.txt").await.as_deref(),
        Some(&b"their first words"[..])
    );
}

/// A version another writer stores between the mount's look at a file and its delete (the
/// look found the version the user had): the store checks again in the delete itself, and
/// keeps the file (an edit beats a delete). The model lost such a version on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_stored_while_an_unlink_is_on_its_way_is_kept() {
    let h = harness(false, TTL);
    h.put_remote("w.txt", b"what I read").await;
    let ino = h.fs.lookup(ROOT, "w.txt").await.unwrap().ino.0;
    assert_eq!(h.read_all(ino).await.unwrap(), b"what I read");
    let id = h.store().node(&h.vault.child("w.txt").unwrap()).await;
    let id = id.unwrap().file_id().unwrap();
    h.faults()
        .inject_times(Op::Delete, Fault::Delay(Duration::from_millis(500)), 1);
    let fs = h.fs.clone();
    let unlink = tokio::spawn(async move { fs.unlink(ROOT, "w.txt").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    h.put_version(&id, b"their edit").await;
    unlink.await.unwrap().unwrap();
    assert_eq!(h.stored("w.txt").await.as_deref(), Some(&b"their edit"[..]));
}
