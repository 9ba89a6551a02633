//! What the mount keeps and how it learns of changes: attributes the kernel forgot, changes made
//! elsewhere (another mount of the store, a read-only mount), and the read cache's bound.

use std::fs::{self, File, OpenOptions};
use std::io::Write;

use super::{allocated, errno_of};
use crate::common;
use crate::common::env::{Env, VAULT, Via};
use crate::common::mount::{names, wait_for};
use crate::common::pattern;
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

both!(
    listed_attributes_survive_the_kernel_forgetting,
    read_only_mount_and_changes_made_elsewhere,
    read_cache_stays_within_its_bound,
);

/// Listings carry each entry's attributes (READDIRPLUS): sizes are right straight from a
/// listing, and after the kernel drops its dentries and inodes (FORGETs of the references the
/// listing gave it) every entry still resolves, lists and reads the same.
fn listed_attributes_survive_the_kernel_forgetting(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let dir = env.vault().join("sized");
    fs::create_dir(&dir).unwrap();
    for i in 0..300usize {
        fs::write(dir.join(format!("f{i:03}")), pattern(i * 7, i as u64)).unwrap();
    }
    for i in 0..5 {
        fs::create_dir(dir.join(format!("d{i}"))).unwrap();
    }
    env.wait_uploaded();
    let check = |when: &str| {
        let mut files = 0;
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let md = e.metadata().unwrap();
            if let Some(i) = name.strip_prefix('f') {
                let i: usize = i.parse().unwrap();
                assert_eq!(md.len(), (i * 7) as u64, "{when}: size of {name}");
                assert!(md.is_file(), "{when}: {name}");
                files += 1;
            } else {
                assert!(md.is_dir(), "{when}: {name}");
            }
        }
        assert_eq!(files, 300, "{when}");
        assert_eq!(
            fs::read(dir.join("f299")).unwrap(),
            pattern(299 * 7, 299),
            "{when}"
        );
    };
    check("first listing");
    let drop_caches = || fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    drop_caches();
    check("after the kernel forgot");
    check("listed again");
    m.unmount();
    let m = env.mount(&[]);
    check("after a remount");
    drop_caches();
    check("after a remount and a forget");
    m.unmount();
}

fn read_only_mount_and_changes_made_elsewhere(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--dir-ttl", "1"]);
    fs::write(env.vault().join("seen.txt"), "before").unwrap();
    env.wait_uploaded();
    // Another client changes the store directly.
    let b = env.backend();
    let vault = NodePath::parse_uri("/nodes/pth/Local/My First Vault").unwrap();
    env.rt.block_on(async {
        let f = b.create_file(&vault, "elsewhere.txt").await.unwrap();
        let id = f.id.unwrap();
        let data = b"made elsewhere".to_vec();
        let t = b.begin_version(&id, data.len() as u64, None).await.unwrap();
        let vid = t.file_ex_properties.unwrap().version_id.unwrap();
        let body = Box::pin(futures_util::stream::once(async move {
            Ok(bytes::Bytes::from(data))
        }));
        b.upload(&id, &vid, 14, body).await.unwrap();
        b.delete(&vault.child("seen.txt").unwrap()).await.unwrap();
    });
    wait_for(10, "the change to show", || {
        env.vault().join("elsewhere.txt").exists() && !env.vault().join("seen.txt").exists()
    });
    assert_eq!(
        fs::read_to_string(env.vault().join("elsewhere.txt")).unwrap(),
        "made elsewhere"
    );
    m.unmount();

    let m = env.mount(&["--read-only"]);
    let v = env.vault();
    assert_eq!(
        fs::read_to_string(v.join("elsewhere.txt")).unwrap(),
        "made elsewhere"
    );
    assert_eq!(errno_of(fs::write(v.join("new.txt"), "x")), libc::EROFS);
    assert_eq!(
        errno_of(
            OpenOptions::new()
                .append(true)
                .open(v.join("elsewhere.txt"))
        ),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::create_dir(v.join("nd"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::remove_file(v.join("elsewhere.txt"))),
        libc::EROFS
    );
    drop(m);
}

fn read_cache_stays_within_its_bound(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&["--cache-size", "8M"]);
    let files: Vec<Vec<u8>> = (0..6).map(|i| pattern(3 << 20, 40 + i)).collect();
    for (i, data) in files.iter().enumerate() {
        fs::write(env.vault().join(format!("c{i}.bin")), data).unwrap();
    }
    env.wait_uploaded();
    m.unmount();
    let m = env.mount(&["--cache-size", "8M"]);
    for _ in 0..2 {
        for (i, data) in files.iter().enumerate() {
            assert_eq!(
                &fs::read(env.vault().join(format!("c{i}.bin"))).unwrap(),
                data,
                "{}",
                m.log_text()
            );
            let held = allocated(&env.cache.join("cache"));
            assert!(
                held <= 8 << 20,
                "cache holds {held} bytes, over its 8 MiB bound"
            );
        }
    }
}

/// The built-in store's small files are read straight from their blobs: reading them makes no
/// copy in the read cache (a second file on the same disk for each file read, and most of a
/// cold `tar`'s time), and a file another process changes reads as its new bytes.
#[test]
fn small_files_of_the_built_in_store_are_read_without_a_cached_copy() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let files: Vec<Vec<u8>> = (0..40)
        .map(|i| pattern(1000 + i * 997, 70 + i as u64))
        .collect();
    for (i, data) in files.iter().enumerate() {
        common::env::put_elsewhere(&env, &format!("s{i:02}.txt"), data);
    }
    let m = env.mount(&[]);
    for (i, data) in files.iter().enumerate() {
        let got = fs::read(env.vault().join(format!("s{i:02}.txt"))).unwrap();
        assert!(&got == data, "s{i:02}.txt read otherwise\n{}", m.log_text());
    }
    let held = allocated(&env.cache.join("cache"));
    assert_eq!(
        held, 0,
        "the read cache holds {held} bytes after reading stored files"
    );
    common::env::new_version_elsewhere(&env, "s00.txt", b"changed elsewhere");
    let s00 = env.vault().join("s00.txt");
    wait_for(10, "the other process's bytes", || {
        fs::read(&s00).unwrap() == b"changed elsewhere"
    });
    drop(m);
}

/// Two mounts of one built-in store see each other's changes at once, listings cached or not
/// (fstests generic/732: a file renamed back and forth through the two).
#[test]
fn two_mounts_of_one_store_see_each_others_changes_at_once() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m1 = env.mount(&[]);
    let (m2, v2) = second_mount(&env);
    let v1 = env.vault();
    fs::create_dir(v1.join("A")).unwrap();
    fs::create_dir(v1.join("B")).unwrap();
    fs::write(v1.join("A/f"), b"one").unwrap();
    File::open(v1.join("A/f")).unwrap().sync_all().unwrap();
    // Both mounts list both folders, so each has them cached.
    for v in [&v1, &v2] {
        assert_eq!(names(&v.join("A")), ["f"]);
        assert!(names(&v.join("B")).is_empty());
    }
    fs::rename(v1.join("A/f"), v1.join("B/f")).unwrap();
    assert_eq!(fs::read(v2.join("B/f")).unwrap(), b"one");
    assert!(names(&v2.join("A")).is_empty());
    fs::rename(v2.join("B/f"), v2.join("A/f")).unwrap();
    assert_eq!(fs::read(v1.join("A/f")).unwrap(), b"one");
    assert!(names(&v1.join("B")).is_empty());
    fs::rename(v1.join("A/f"), v1.join("B/f")).unwrap();

    // New names, new bytes and removals, each way.
    fs::create_dir(v2.join("C")).unwrap();
    assert!(v1.join("C").is_dir());
    let mut g = File::create(v1.join("B/g")).unwrap();
    g.write_all(b"from one").unwrap();
    g.sync_all().unwrap();
    drop(g);
    assert_eq!(fs::read(v2.join("B/g")).unwrap(), b"from one");
    fs::write(v2.join("B/g"), b"changed by two").unwrap();
    File::open(v2.join("B/g")).unwrap().sync_all().unwrap();
    assert_eq!(fs::read(v1.join("B/g")).unwrap(), b"changed by two");
    fs::remove_file(v1.join("B/f")).unwrap();
    assert_eq!(names(&v2.join("B")), ["g"]);
    assert!(!v2.join("B/f").exists());

    m2.unmount();
    m1.unmount();
}

/// A second mount of `env`'s built-in store, and its vault.
fn second_mount(env: &Env) -> (common::mount::Mount, std::path::PathBuf) {
    let mnt2 = env._tmp.path().join("mnt2");
    let cache2 = env._tmp.path().join("cache2");
    let m2 = common::mount::Mount::start(
        &mnt2,
        &[
            "--cache-dir",
            cache2.to_str().unwrap(),
            "--data-dir",
            env.data.to_str().unwrap(),
        ],
    );
    (m2, mnt2.join(VAULT))
}

/// A file renamed as soon as it is closed is under its new name on the store when the rename
/// returns, while another mount has the store open: renamed here only, it turned up there
/// moments later, and `cat` there failed (fstests generic/732, `touch a/f; mv a/f b/` here and
/// `cat b/f` there, 1 run in 50). The last of 200 files written in a row waits in the queue of
/// the batches before it: renamed at once, it is not stored yet.
#[test]
fn a_file_renamed_as_soon_as_closed_is_there_for_another_mount() {
    let Some(env) = Env::new(Via::Local) else {
        return;
    };
    let m1 = env.mount(&[]);
    let (m2, v2) = second_mount(&env);
    let v1 = env.vault();
    fs::create_dir(v1.join("a")).unwrap();
    fs::create_dir(v1.join("b")).unwrap();
    for round in 0..3 {
        for i in 0..200 {
            fs::write(v1.join(format!("a/f{round}-{i}")), format!("{round}-{i}")).unwrap();
        }
        let last = format!("f{round}-199");
        fs::rename(v1.join("a").join(&last), v1.join("b").join(&last)).unwrap();
        assert_eq!(
            fs::read_to_string(v2.join("b").join(&last)).unwrap(),
            format!("{round}-199")
        );
    }
    env.wait_uploaded();
    assert_eq!(names(&v2.join("a")).len(), 597);
    m2.unmount();
    m1.unmount();
}
