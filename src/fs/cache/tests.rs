//! The read cache's tests.

use super::*;

/// Whatever ID and md5 a server sent, the cache's files are plain names in its own dir.
#[test]
fn file_names_never_come_from_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let cache = ReadCache::open(dir.clone(), 1 << 30).unwrap();
    let hostile = [
        ("../../../../../../../../../../tmp/x", None),
        ("7", Some("/../../../../etc/passwd")),
        ("/abs/path", Some("..")),
        ("a\0b", None),
        ("", Some("")),
    ];
    for (id, md5) in hostile {
        let e = cache.entry(id, md5, 10).unwrap();
        let path = e.file.path();
        assert_eq!(path.parent(), Some(dir.as_path()), "{id:?} {md5:?}");
        let name = path.file_name().unwrap().to_str().unwrap();
        let (hash, n) = name.split_once('.').unwrap();
        assert!(hash.len() == 64 && hash.bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(n.parse::<u64>().is_ok(), "{name}");
    }
    let names = fs::read_dir(&dir).unwrap().count();
    assert_eq!(names, hostile.len());
    assert!(!tmp.path().join("tmp").exists());
}

/// Whole files outlive the mount (listed in the index, synced first); partly fetched ones
/// and files the index does not list go.
#[test]
fn whole_files_are_kept_for_the_next_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let cache = ReadCache::open(dir.clone(), 1 << 30).unwrap();
    let whole = cache.entry("1", Some("m1"), 5).unwrap();
    whole.file().unwrap().write_all_at(b"hello", 0).unwrap();
    whole.mark(0);
    let part = cache.entry("2", Some("m2"), 3 * CHUNK).unwrap();
    part.mark(0);
    cache.save_index().unwrap();
    fs::write(dir.join("stray.0"), b"x").unwrap();
    drop((whole, part, cache));

    let cache = ReadCache::open(dir.clone(), 1 << 30).unwrap();
    let e = cache.complete("1", Some("m1")).expect("kept");
    assert_eq!(e.pread(0, 5).unwrap(), b"hello");
    assert!(cache.complete("2", Some("m2")).is_none());
    assert_eq!(cache.usage().2, 1);
    // The kept file, the index; no stray, no partial file.
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
    // A new entry never takes the kept file's name.
    let other = cache.entry("3", None, 1).unwrap();
    assert_ne!(other.file.path(), e.file.path());
}

/// Pinned versions are never evicted and their bytes do not count against the bound; the
/// index says which they are, so a cache opened again over its bound keeps them too.
#[test]
fn pinned_files_outlive_eviction_and_the_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let whole = |cache: &ReadCache, id: &str| {
        let e = cache.entry(id, None, CHUNK).unwrap();
        e.mark(0);
    };
    let cache = ReadCache::open(dir.clone(), 2 * CHUNK).unwrap();
    cache.set_pinned([key("p1", None), key("p2", None)].into());
    for id in ["p1", "p2", "a", "b", "c"] {
        whole(&cache, id);
    }
    // Two pinned, and two others within the bound.
    assert_eq!(cache.usage(), (4 * CHUNK, 2 * CHUNK, 4, 2 * CHUNK));
    assert!(cache.kept_whole("p1", None) && cache.kept_whole("p2", None));
    assert!(!cache.kept_whole("a", None) && cache.kept_whole("c", None));
    cache.save_index().unwrap();
    drop(cache);

    // Opened with a smaller bound: the pinned ones stay, the others go down to it.
    let cache = ReadCache::open(dir.clone(), CHUNK).unwrap();
    assert_eq!(cache.usage().3, 2 * CHUNK);
    assert!(cache.kept_whole("p1", None) && cache.kept_whole("p2", None));
    assert_eq!(cache.usage().0, 3 * CHUNK);
    // Unpinned: evicted down to the bound at once.
    cache.set_pinned([key("p2", None)].into());
    assert_eq!(cache.usage(), (2 * CHUNK, CHUNK, 2, CHUNK));
    assert!(cache.kept_whole("p2", None));
}

/// A file deleted drops every cached version of it, through the index by ID (no walk of the
/// cache), and the index follows the entries evicted, replaced and dropped.
#[test]
fn a_file_gone_drops_its_versions_and_only_those() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = ReadCache::open(tmp.path().join("cache"), 3 * CHUNK).unwrap();
    for (id, md5) in [("a", "m1"), ("a", "m2"), ("b", "m1")] {
        cache.entry(id, Some(md5), CHUNK).unwrap().mark(0);
    }
    assert_eq!(cache.usage().2, 3);
    cache.invalidate("a");
    assert_eq!(cache.usage().0, CHUNK);
    assert_eq!(cache.usage().2, 1);
    assert!(cache.kept_whole("b", Some("m1")));
    // Evicted past the bound (the oldest: b), then asked to go: nothing left to drop.
    for id in ["c", "d", "e"] {
        cache.entry(id, None, CHUNK).unwrap().mark(0);
    }
    assert!(!cache.kept_whole("b", Some("m1")));
    cache.invalidate("b");
    assert_eq!(cache.usage().0, 3 * CHUNK);
    // A version replaced by one of another size: one entry, dropped with its file.
    cache.entry("c", None, 2).unwrap();
    assert_eq!(cache.usage().2, 3);
    cache.invalidate("c");
    assert_eq!(cache.usage().2, 2);
    assert_eq!(cache.lock().by_id.len(), 2, "the index holds d and e only");
}
