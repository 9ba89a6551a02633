//! Writes the kernel makes itself (FUSE passthrough) on a real mount: a file created or
//! truncated through the mount is written by the kernel straight to its staging file, with no
//! WRITE reaching the daemon; what it wrote is stored whole at close and at fsync (never a
//! stored version changed afterwards), whatever else shares the file meanwhile (readers, a
//! second writer, a map, a cut, an append); so is an empty file opened again (fio's way); an
//! existing file opened for update still goes through the daemon.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use common::env::{Env, Via, stored};
use common::mount::Mount;
use common::pattern;
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

both!(
    the_kernel_writes_new_files_itself,
    an_fsync_while_the_kernel_writes_stores_a_version_that_stays_whole,
    cuts_appends_a_second_writer_and_a_map_all_reach_the_store,
    an_update_in_place_goes_through_the_daemon,
    an_empty_file_opened_again_is_written_by_the_kernel,
    a_close_after_an_fsync_stores_only_a_change,
    an_allocation_larger_than_the_disk_fails_and_takes_no_room,
    a_file_removed_while_being_stored_is_not_stored,
);

/// WRITE requests the daemon answered so far.
fn daemon_writes(m: &Mount) -> u64 {
    m.status()["daemon_writes"].as_u64().unwrap()
}

/// Every blob of the built-in store holds the bytes its name (their sha256) says: no stored
/// version was written to after it was stored.
fn blobs_whole(env: &Env) {
    use sha2::{Digest, Sha256};
    let mut n = 0;
    for dir in fs::read_dir(env.data.join("blobs")).unwrap() {
        for blob in fs::read_dir(dir.unwrap().path()).unwrap() {
            let p = blob.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let sha: String = Sha256::digest(fs::read(&p).unwrap())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                sha,
                name,
                "blob {} was changed after it was stored",
                p.display()
            );
            n += 1;
        }
    }
    assert!(n > 0, "no blob stored");
}

/// The newest stored version of `name` (a file of the vault), read from the store's database
/// (the interface names none): a new version, even of the same bytes, has a new one.
fn version(env: &Env, name: &str) -> i64 {
    let conn = rusqlite::Connection::open(env.data.join("vault.db")).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    conn.query_row(
        "SELECT max(v.id) FROM versions v JOIN nodes n ON n.id = v.file_id \
         WHERE n.name = ?1 AND v.committed = 1",
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

/// A shared, writable map of the first `len` bytes of an open file, unmapped when dropped.
struct SharedMap {
    at: *mut libc::c_void,
    len: usize,
}

impl SharedMap {
    fn new(f: &File, len: usize) -> SharedMap {
        // SAFETY: a new map of an open descriptor; the kernel checks the rest.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        SharedMap { at, len }
    }

    /// Writes `bytes` at `offset` of the file through the map.
    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: within the map, which lives until `self` is dropped.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.at.cast::<u8>().add(offset),
                bytes.len(),
            )
        };
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the map made in `new`, unmapped once.
        assert_eq!(unsafe { libc::munmap(self.at, self.len) }, 0);
    }
}

fn kernel_writes(m: &Mount) -> bool {
    let st = m.status();
    st["writes"].as_str().unwrap().starts_with("passthrough")
}

fn the_kernel_writes_new_files_itself(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    assert!(kernel_writes(&m), "{}", m.status());
    let before = daemon_writes(&m);
    let data = pattern(3 << 20, 1);
    let p = env.vault().join("new.bin");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    for chunk in data.chunks(100_000) {
        f.write_all(chunk).unwrap();
    }
    // Size and content, while still open: through the handle, by name, and by another reader.
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    assert_eq!(fs::metadata(&p).unwrap().len(), data.len() as u64);
    let mut back = vec![0; 4096];
    f.read_exact_at(&mut back, 1 << 20).unwrap();
    assert_eq!(back, data[1 << 20..(1 << 20) + 4096]);
    assert_eq!(fs::read(&p).unwrap(), data);
    drop(f);
    // Many small files, as a copy or an untar makes them.
    for i in 0..50 {
        fs::write(
            env.vault().join(format!("small-{i}.txt")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    assert_eq!(daemon_writes(&m), before, "a WRITE reached the daemon");
    env.wait_uploaded();
    assert_eq!(stored(&env, "new.bin"), data);
    for i in [0, 17, 49] {
        assert_eq!(
            stored(&env, &format!("small-{i}.txt")),
            format!("file {i}\n").as_bytes()
        );
    }
    // The mtime the kernel's writes gave stays the file's after it is stored.
    let mtime = fs::metadata(&p).unwrap().modified().unwrap();
    drop(m);
    let m = env.mount(&[]);
    assert_eq!(fs::read(&p).unwrap(), data);
    assert_eq!(fs::metadata(&p).unwrap().modified().unwrap(), mtime);
    if via == Via::Local {
        blobs_whole(&env);
    }
    drop(m);
}

fn an_fsync_while_the_kernel_writes_stores_a_version_that_stays_whole(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let first = pattern(256 << 10, 2);
    let p = env.vault().join("log.bin");
    let mut f = File::create(&p).unwrap();
    f.write_all(&first).unwrap();
    f.sync_all().unwrap();
    // Stored at fsync, with the handle still open.
    assert_eq!(stored(&env, "log.bin"), first);
    // Written on: over the start and past the end.
    f.write_all_at(b"CHANGED", 0).unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"tail").unwrap();
    let mut want = first.clone();
    want[..7].copy_from_slice(b"CHANGED");
    want.extend_from_slice(b"tail");
    f.sync_data().unwrap();
    assert_eq!(stored(&env, "log.bin"), want);
    f.write_all(b" and more").unwrap();
    want.extend_from_slice(b" and more");
    drop(f);
    env.wait_uploaded();
    assert_eq!(stored(&env, "log.bin"), want);
    assert_eq!(fs::read(&p).unwrap(), want);
    if via == Via::Local {
        blobs_whole(&env);
    }
    drop(m);
}

fn cuts_appends_a_second_writer_and_a_map_all_reach_the_store(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("doc.txt");
    fs::write(&p, "the stored version\n").unwrap();
    env.wait_uploaded();
    let before = daemon_writes(&m);
    // Truncated by its open: the kernel writes it.
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    w.write_all(b"0123456789").unwrap();
    // Cut and extended while open.
    w.set_len(4).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"0123");
    w.set_len(6).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"0123\0\0");
    // An appender and an updater join the open file (they are passed through too).
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"+appended").unwrap();
    let u = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    u.write_all_at(b"AB", 0).unwrap();
    // A shared map of the updater, written after every descriptor is closed.
    let map = SharedMap::new(&u, 15);
    drop((w, a, u));
    // Long enough for a batch to store the file, had it not waited for the map.
    std::thread::sleep(std::time::Duration::from_millis(300));
    map.write(2, b"MAP");
    drop(map);
    let want = b"ABMAP\0+appended".to_vec();
    assert_eq!(fs::read(&p).unwrap(), want);
    assert_eq!(daemon_writes(&m), before, "a WRITE reached the daemon");
    env.wait_uploaded();
    assert_eq!(stored(&env, "doc.txt"), want);
    if via == Via::Local {
        blobs_whole(&env);
    }
    drop(m);
}

fn an_update_in_place_goes_through_the_daemon(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("db.bin");
    let data = pattern(64 << 10, 3);
    fs::write(&p, &data).unwrap();
    env.wait_uploaded();
    let before = daemon_writes(&m);
    // Opened for update without a cut: it may be written or not, only the daemon can tell.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(0)
        .open(&p)
        .unwrap();
    f.write_all_at(b"page", 4096).unwrap();
    drop(f);
    assert!(daemon_writes(&m) > before);
    let mut want = data.clone();
    want[4096..4100].copy_from_slice(b"page");
    env.wait_uploaded();
    assert_eq!(stored(&env, "db.bin"), want);
    // Opened for writing and closed unwritten (touch does that): no new version.
    let v = version(&env, "db.bin");
    drop(OpenOptions::new().write(true).open(&p).unwrap());
    env.wait_uploaded();
    assert_eq!(version(&env, "db.bin"), v);
    drop(m);
    // Switched off: new files go through the daemon too.
    let m = env.mount(&["--no-kernel-writes"]);
    assert_eq!(m.status()["writes"], "through the daemon");
    let before = daemon_writes(&m);
    fs::write(env.vault().join("new.txt"), "by the daemon").unwrap();
    assert!(daemon_writes(&m) > before);
    env.wait_uploaded();
    assert_eq!(stored(&env, "new.txt"), b"by the daemon");
    drop(m);
}

/// Bytes an unprivileged writer may still take where `p` is.
fn free_bytes(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs fills the zeroed struct for a NUL-terminated path.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut st), 0);
        st
    };
    st.f_bavail as u64 * st.f_frsize as u64
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a descriptor we hold open.
    match unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// fstests generic/213 asks for twice the free room: ext4 under the staging file gave what it
/// had, then failed, and kept it (and the size it reached). The disk stayed full until the
/// file was removed, and the store was asked for a file of that size.
fn an_allocation_larger_than_the_disk_fails_and_takes_no_room(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let data = pattern(1 << 20, 4);
    for (name, mode, fresh) in [
        ("grow.bin", 0, true),
        ("keep.bin", libc::FALLOC_FL_KEEP_SIZE, true),
        ("stored.bin", 0, false),
    ] {
        let p = env.vault().join(name);
        fs::write(&p, &data).unwrap();
        if !fresh {
            env.wait_uploaded();
        }
        let free = free_bytes(&env.cache);
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        let e = fallocate(&f, mode, 0, free.saturating_mul(2)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{name}: {e}");
        // The room is there at once, not when the file is removed.
        assert!(
            free_bytes(&env.cache) + (64 << 20) > free,
            "{name}: the failed allocation kept the disk's room"
        );
        assert_eq!(f.metadata().unwrap().len(), data.len() as u64, "{name}");
        // One that fits extends the file with zeros.
        fallocate(&f, 0, 0, 3 << 20).unwrap();
        drop(f);
        let mut want = data.clone();
        want.resize(3 << 20, 0);
        assert_eq!(fs::read(&p).unwrap(), want, "{name}");
        env.wait_uploaded();
        assert_eq!(stored(&env, name), want, "{name}");
    }
    drop(m);
}

/// `rm` of a file whose upload is under way gives the upload up instead of waiting for it (a
/// big file's hashing, its bytes on their way to a slow server), and the file is not stored;
/// the files beside it are.
fn a_file_removed_while_being_stored_is_not_stored(via: Via) {
    let Some(mut env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let (gone, kept) = (env.vault().join("gone.bin"), env.vault().join("kept.txt"));
    // Locally its upload hashes a gigabyte; over a server that takes 4 MiB/s it sends 128 MiB.
    let mib = match via {
        Via::Local => 1024,
        Via::Remote => {
            env.throttle_server(4 << 20);
            128
        }
    };
    let f = File::create(&gone).unwrap();
    let block = vec![7u8; 1 << 20];
    for i in 0..mib {
        f.write_all_at(&block, i << 20).unwrap();
    }
    drop(f);
    fs::write(&kept, "kept").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300)); // the upload starts
    let started = std::time::Instant::now();
    fs::remove_file(&gone).unwrap();
    if via == Via::Remote {
        // Not a benchmark: sending it all would have taken 32 s.
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(8), "rm took {took:?}");
    }
    assert!(!gone.exists());
    env.wait_uploaded();
    assert_eq!(stored(&env, "kept.txt"), b"kept");
    let p = NodePath::parse_uri("/nodes/pth/Local/My First Vault/gone.bin").unwrap();
    let e = env.rt.block_on(env.backend().node(&p)).unwrap_err();
    assert_eq!(e.kind, vaultfs::api::ErrorKind::NotFound, "{e}");
    drop(m);
    assert!(!env.cache.join("lost+found").exists());
    // No blob of the removed file's bytes, half-placed or whole.
    let store = vaultfs::store::Store::open_local(&env.data).unwrap();
    assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
    assert_eq!(store.blob_count().unwrap(), 1);
}

/// fio lays its file out empty, closes it, and opens it again (no cut) to write it: nothing
/// there for a write to leave as it was, so the kernel writes it too.
fn an_empty_file_opened_again_is_written_by_the_kernel(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("seq.bin");
    drop(File::create(&p).unwrap());
    env.wait_uploaded();
    let v = version(&env, "seq.bin");
    // Opened again and closed unwritten: nothing stored again.
    drop(OpenOptions::new().read(true).write(true).open(&p).unwrap());
    env.wait_uploaded();
    assert_eq!(version(&env, "seq.bin"), v);
    let before = daemon_writes(&m);
    let data = pattern(3 << 20, 5);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    drop(f);
    assert_eq!(daemon_writes(&m), before, "a WRITE reached the daemon");
    assert_eq!(fs::read(&p).unwrap(), data);
    env.wait_uploaded();
    assert_eq!(stored(&env, "seq.bin"), data);
    assert!(version(&env, "seq.bin") > v);
    if via == Via::Local {
        blobs_whole(&env);
    }
    drop(m);
}

/// A close after an fsync, with the times as the fsync saw them, may still hide a change (a map
/// writing a page again without a fault): the file is compared with the stored version. The
/// same bytes make no new version (`dd conv=fsync`); a change the times did not show is stored.
fn a_close_after_an_fsync_stores_only_a_change(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    // Larger than what a release compares at once.
    let data = pattern(3 << 20, 7);
    let p = env.vault().join("dd.bin");
    let mut f = File::create(&p).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    let v = version(&env, "dd.bin");
    drop(f);
    env.wait_uploaded();
    assert_eq!(version(&env, "dd.bin"), v, "the same bytes stored again");

    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(&data).unwrap();
    let map = SharedMap::new(&f, data.len());
    map.write(4096, b"first");
    f.sync_all().unwrap();
    map.write(4096, b"again");
    drop(map);
    drop(f);
    let mut want = data.clone();
    want[4096..4101].copy_from_slice(b"again");
    assert!(
        fs::read(&p).unwrap() == want,
        "the map's last write is not read back"
    );
    env.wait_uploaded();
    assert!(
        stored(&env, "dd.bin") == want,
        "the map's last write is not stored"
    );
    if via == Via::Local {
        blobs_whole(&env);
    }
    drop(m);
}
