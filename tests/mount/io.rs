//! The bytes of files: appends, random writes and truncates against a model, a large file,
//! readers beside writers, the store's size limit, and the room files take.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::process::Command;

use super::allocated;
use crate::common::env::{Env, VAULT, Via};
use crate::common::mount::{md5_of, sh};
use crate::common::pattern;
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

both!(
    appends_random_writes_and_truncates_match_a_model,
    large_file_checksum_survives_remount,
    concurrent_readers_and_writers,
    a_running_program_is_neither_cut_nor_opened_for_writing,
    a_terminal_query_is_not_a_terminal_and_logs_nothing,
);

fn appends_random_writes_and_truncates_match_a_model(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("model.bin");
    let mut model: Vec<u8> = Vec::new();
    // Shell appends.
    sh(
        &env.vault(),
        "echo one >> model.bin && echo two >> model.bin",
    );
    model.extend_from_slice(b"one\ntwo\n");
    assert_eq!(fs::read(&p).unwrap(), model);
    // Random writes, some past the end (a hole reads as zeros).
    let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for (i, off) in [3u64, 100_000, 50, 7, 250_000, 0].iter().enumerate() {
        let data = pattern(1000 + i * 333, i as u64 + 10);
        f.write_all_at(&data, *off).unwrap();
        let end = *off as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[*off as usize..end].copy_from_slice(&data);
    }
    // Reading through the same handle sees the writes.
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, model);
    // Truncate down and up.
    f.set_len(60_000).unwrap();
    model.truncate(60_000);
    f.set_len(70_000).unwrap();
    model.resize(70_000, 0);
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), 70_000);
    assert_eq!(fs::read(&p).unwrap(), model);
    // truncate(2) by path, without an open handle.
    Command::new("truncate")
        .arg("-s")
        .arg("1234")
        .arg(&p)
        .status()
        .unwrap();
    model.truncate(1234);
    assert_eq!(fs::read(&p).unwrap(), model);
    // Two writers on one file at once.
    let mut a = OpenOptions::new().write(true).open(&p).unwrap();
    let mut b = OpenOptions::new().write(true).open(&p).unwrap();
    a.write_all(b"AAAA").unwrap();
    b.seek(SeekFrom::Start(2000)).unwrap();
    b.write_all(b"BBBB").unwrap();
    drop(a);
    drop(b);
    model[..4].copy_from_slice(b"AAAA");
    model.resize(2004, 0);
    model[2000..2004].copy_from_slice(b"BBBB");
    assert_eq!(fs::read(&p).unwrap(), model);
    m.unmount();
    let m = env.mount(&[]);
    assert_eq!(
        fs::read(env.vault().join("model.bin")).unwrap(),
        model,
        "{}",
        m.log_text()
    );
}

fn large_file_checksum_survives_remount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let src = env._tmp.path().join("big.bin");
    {
        let mut f = File::create(&src).unwrap();
        for i in 0..200 {
            f.write_all(&pattern(1 << 20, i)).unwrap();
        }
    }
    let sum = md5_of(&src);
    let m = env.mount(&[]);
    fs::copy(&src, env.vault().join("big.bin")).unwrap();
    assert_eq!(md5_of(&env.vault().join("big.bin")), sum);
    env.wait_uploaded();
    m.unmount();
    // A fresh cache: the bytes come from the store.
    let _ = fs::remove_dir_all(env.cache.join("cache"));
    let m = env.mount(&[]);
    assert_eq!(
        fs::metadata(env.vault().join("big.bin")).unwrap().len(),
        200 << 20
    );
    assert_eq!(
        md5_of(&env.vault().join("big.bin")),
        sum,
        "{}",
        m.log_text()
    );
    // Ranged reads in the middle, cold.
    let f = File::open(env.vault().join("big.bin")).unwrap();
    let mut buf = vec![0u8; 10_000];
    f.read_exact_at(&mut buf, (150 << 20) + 12_345).unwrap();
    assert_eq!(buf, pattern(1 << 20, 150)[12_345..22_345]);
}

fn concurrent_readers_and_writers(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    fs::write(v.join("shared.bin"), pattern(2 << 20, 99)).unwrap();
    let mut threads = Vec::new();
    for t in 0..8u64 {
        let v = v.clone();
        threads.push(std::thread::spawn(move || {
            for round in 0..5u64 {
                let data = pattern(100_000 + (t * 1000) as usize, t * 100 + round);
                let p = v.join(format!("w{t}.bin"));
                fs::write(&p, &data).unwrap();
                assert_eq!(fs::read(&p).unwrap(), data);
                assert_eq!(
                    fs::read(v.join("shared.bin")).unwrap(),
                    pattern(2 << 20, 99)
                );
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&[]);
    for t in 0..8u64 {
        let data = pattern(100_000 + (t * 1000) as usize, t * 100 + 4);
        assert_eq!(
            fs::read(env.vault().join(format!("w{t}.bin"))).unwrap(),
            data,
            "{}",
            m.log_text()
        );
    }
}

/// A write, a cut or a reservation past the largest file the store takes fails at once with
/// EFBIG (fstests generic/308: a 4 KiB write at 16 TiB used to tie the remote mount up hashing
/// a sparse file the server would refuse); what fits is written and stored.
#[test]
fn a_file_past_the_store_limit_is_efbig_at_once() {
    for via in [Via::Local, Via::Remote] {
        let Some(env) = Env::new(via) else {
            return;
        };
        let m = env.mount(&["--max-file-size", "1M"]);
        let v = env.vault();
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(v.join("sparse.bin"))
            .unwrap();
        let efbig = |r: std::io::Result<()>| {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EFBIG), "{via:?}")
        };
        efbig(f.write_all_at(b"x", 16 << 40));
        efbig(f.write_all_at(&[7u8; 4096], (1 << 20) - 100));
        efbig(f.set_len((1 << 20) + 1));
        f.write_all_at(b"fits", (1 << 20) - 4).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::metadata(v.join("sparse.bin")).unwrap().len(), 1 << 20);
        env.wait_uploaded();
        m.unmount();
    }
}

/// The built-in store of a mount takes the room of the versions its retention rule keeps: a
/// file saved ten times under `--keep-versions 3` keeps four versions' bytes, and a sparse
/// file's holes cost no disk, through rewrites and appends (fstests generic/013 filled 31 GB
/// with fsstress's truncated files).
#[test]
fn saved_and_sparse_files_take_the_room_of_their_data() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m = env.mount(&["--keep-versions", "3"]);
    let v = env.vault();
    for i in 0..10u64 {
        let mut f = File::create(v.join("saved.bin")).unwrap();
        f.write_all(&pattern(1 << 20, i)).unwrap();
        f.sync_all().unwrap();
    }
    let sparse = v.join("sparse.img");
    File::create(&sparse).unwrap().set_len(256 << 20).unwrap();
    for tail in [&b"one"[..], b"two"] {
        let mut f = OpenOptions::new().append(true).open(&sparse).unwrap();
        f.write_all(tail).unwrap();
        f.sync_all().unwrap();
    }
    env.wait_uploaded();
    assert_eq!(fs::read(v.join("saved.bin")).unwrap(), pattern(1 << 20, 9));
    let mut f = File::open(&sparse).unwrap();
    let mut end = [0u8; 6];
    f.seek(SeekFrom::End(-6)).unwrap();
    f.read_exact(&mut end).unwrap();
    assert_eq!(&end, b"onetwo");
    assert_eq!(f.metadata().unwrap().len(), (256 << 20) + 6);
    drop(f);
    let blobs = allocated(&env.data.join("blobs"));
    assert!(
        blobs < 6 << 20,
        "the store's blobs take {blobs} bytes for 4 kept versions of 1 MiB"
    );
    let b = env.backend();
    let id = env
        .rt
        .block_on(b.node(&NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/saved.bin")).unwrap()))
        .unwrap()
        .file_id()
        .unwrap();
    assert_eq!(b.store().version_history(&id).unwrap().len(), 4);
    assert!(b.store().check_integrity().unwrap().is_empty());
    m.unmount();
}

/// A program run from the mount: opening it for writing is ETXTBSY, and so is O_RDONLY|O_TRUNC,
/// which the kernel checks only after the daemon's OPEN (that OPEN cut the file first: the
/// program died of SIGBUS, and under load the open then succeeded: pjdfstest open::etxtbsy).
fn a_running_program_is_neither_cut_nor_opened_for_writing(via: Via) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let Some(env) = Env::new(via) else { return };
    let _m = env.mount(&[]);
    let prog = env.vault().join("sleep");
    let original = fs::read("/bin/sleep").unwrap();
    fs::write(&prog, &original).unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(&prog).arg("60").spawn().unwrap();
    let writer = |o: &mut OpenOptions| o.open(&prog).map(drop).unwrap_err().raw_os_error();
    assert_eq!(writer(OpenOptions::new().write(true)), Some(libc::ETXTBSY));
    assert_eq!(
        writer(OpenOptions::new().read(true).custom_flags(libc::O_TRUNC)),
        Some(libc::ETXTBSY)
    );
    assert_eq!(
        fs::read(&prog).unwrap(),
        original,
        "the running program was cut"
    );
    assert!(child.try_wait().unwrap().is_none(), "the program died");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Python's `open()` asks every file whether it is a terminal (ioctl TCGETS): the answer is
/// ENOTTY, as from any file on disk, and the daemon logs nothing for it (it once logged a
/// three-line warning per open: 21,491 for 20,000 files).
fn a_terminal_query_is_not_a_terminal_and_logs_nothing(via: Via) {
    use std::os::fd::AsRawFd;
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let p = env.vault().join("notes.txt");
    fs::write(&p, b"a line\n").unwrap();
    let f = File::open(&p).unwrap();
    // SAFETY: a termios for the kernel to fill, on a descriptor we own.
    let (r, errno) = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        let r = libc::ioctl(f.as_raw_fd(), libc::TCGETS, &mut t);
        (r, std::io::Error::last_os_error().raw_os_error())
    };
    assert_eq!((r, errno), (-1, Some(libc::ENOTTY)));
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sys\nfor _ in range(50):\n    assert open(sys.argv[1]).read() == 'a line\\n'")
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = m.log_text();
    assert!(!log.contains("Not Implemented"), "{log}");
}
