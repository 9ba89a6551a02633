//! The mount's daemon SIGKILLed while it downloads, on both backends: the reader gets an error
//! (never a hang, never wrong bytes), the next mount over the same cache dir serves the file
//! whole and exact, and bytes cached before the kill are never served for a file that changed
//! in the store meanwhile.

#[macro_use]
mod common;

use std::fs;
use std::io::{Cursor, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::env::{Env, VAULT, Via, within};
use common::mount::md5_of;
use common::{md5hex, pattern};
use vaultfs::api::NodePath;
use vaultfs::backend::{Backend, reader_stream};

both!(
    daemon_killed_mid_download_leaves_no_corrupt_cache,
    file_changed_after_a_partial_read_and_a_kill_is_read_new,
);

const MIB: usize = 1 << 20;

/// Files the mount's read cache holds (it keeps one sparse file per file version).
fn cache_entries(env: &Env) -> Vec<String> {
    fs::read_dir(env.cache.join("cache"))
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Stores `data` as `name` in the vault through the backend, as another client would.
fn store_file(env: &Env, name: &str, data: &[u8]) {
    let b = env.backend();
    let folder = NodePath::parse_uri(&format!("/nodes/pth/{VAULT}")).unwrap();
    let data = data.to_vec();
    env.rt.block_on(async move {
        let file = b.create_file(&folder, name).await.unwrap();
        let id = file.file_id().unwrap();
        let v = b
            .begin_version(&id, data.len() as u64, Some(&md5hex(&data)))
            .await
            .unwrap();
        let vid = v.version_id().unwrap();
        let len = data.len() as u64;
        let n = b
            .upload(&id, &vid, len, reader_stream(Cursor::new(data), len))
            .await
            .unwrap();
        assert_eq!(n.size, Some(len));
    });
}

/// `cat FILE` through the mount, read slowly from its pipe: after `before_kill` bytes `kill`
/// runs, then the rest is drained. Returns what came through and whether cat succeeded; it must
/// end within 60 seconds of the kill.
fn slow_cat(file: &Path, before_kill: usize, kill: impl FnOnce()) -> (Vec<u8>, bool) {
    let mut cat = Command::new("cat")
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = cat.stdout.take().unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    while got.len() < before_kill {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "cat ended after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
        std::thread::sleep(Duration::from_millis(5));
    }
    kill();
    let killed = Instant::now();
    let (rest, ok) = within(60, "cat after the daemon was killed", move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        let ok = cat.wait().unwrap().success();
        (rest, ok)
    });
    println!(
        "cat ended {:.1}s after the kill ({}), {} bytes after it",
        killed.elapsed().as_secs_f64(),
        if ok { "success" } else { "error" },
        rest.len()
    );
    got.extend_from_slice(&rest);
    (got, ok)
}

/// Mount flags that make reads go through the read cache: the built-in store's files are
/// otherwise read by the kernel from the store's own copy (passthrough, tests/reads.rs).
fn through_cache(via: Via) -> &'static [&'static str] {
    match via {
        Via::Local => &["--no-passthrough"],
        Via::Remote => &[],
    }
}

/// A 64 MiB file read with `cat` while the daemon is SIGKILLed mid-download: cat ends (with an
/// error) instead of hanging, every byte it printed is right, the next mount over the same cache
/// dir starts with no entry left from the dead daemon and reads the whole file exactly.
fn daemon_killed_mid_download_leaves_no_corrupt_cache(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let data = pattern(64 * MIB, 64);
    let want = md5hex(&data);
    let m = env.mount(through_cache(via));
    fs::write(env.vault().join("big.bin"), &data).unwrap();
    env.wait_uploaded();
    m.unmount();

    // A fresh mount: nothing cached; the read downloads as it goes.
    let m = env.mount(through_cache(via));
    let file = env.vault().join("big.bin");
    let (got, ok) = slow_cat(&file, 12 * MIB, || {
        assert!(!cache_entries(&env).is_empty(), "the read is not cached");
        m.kill();
    });
    assert!(
        got.len() < data.len(),
        "the daemon was killed after cat had read the whole file"
    );
    assert!(
        !ok,
        "cat succeeded with {} of {} bytes",
        got.len(),
        data.len()
    );
    assert!(
        got == data[..got.len()],
        "cat printed wrong bytes before the daemon died"
    );

    let m = env.mount(through_cache(via));
    assert!(
        cache_entries(&env).is_empty(),
        "the new mount kept the dead daemon's cache entries: {:?}",
        cache_entries(&env)
    );
    assert_eq!(md5_of(&file), want, "{}", m.log_text());
    // Read again, now from the cache, and once more after a remount.
    assert_eq!(md5_of(&file), want);
    m.unmount();
    let _m = env.mount(through_cache(via));
    assert_eq!(md5_of(&file), want);
}

/// A file is partly read (so partly cached), the daemon is SIGKILLed, and the file changes in
/// the store, keeping its size (one version) or not (another): the next mount over the same
/// cache dir serves exactly the new bytes, never the old cached ones.
fn file_changed_after_a_partial_read_and_a_kill_is_read_new(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let old = pattern(8 * MIB, 1);
    let same_size = pattern(8 * MIB, 2);
    let longer = pattern(9 * MIB + 123, 3);
    let m = env.mount(through_cache(via));
    fs::write(env.vault().join("doc.bin"), &old).unwrap();
    env.wait_uploaded();
    m.unmount();

    let mut current = &old;
    for new in [&same_size, &longer] {
        let m = env.mount(through_cache(via));
        let file = env.vault().join("doc.bin");
        let mut f = fs::File::open(&file).unwrap();
        let mut head = vec![0u8; 3 * MIB];
        f.read_exact(&mut head).unwrap();
        assert!(head[..] == current[..3 * MIB]);
        assert!(!cache_entries(&env).is_empty(), "the read is not cached");
        drop(f);
        m.kill();

        store_file(&env, "doc.bin", new);
        let m = env.mount(through_cache(via));
        let got = fs::read(&file).unwrap();
        assert_eq!(got.len(), new.len(), "{}", m.log_text());
        assert!(got == *new, "the mount served stale bytes after the change");
        m.unmount();
        current = new;
    }
}
