//! Pinned folders and files: kept whole on disk for use offline (`vaultfs pin PATH`, or the
//! `user.vaultfs.pinned` attribute a file manager can set), as "always keep on this device"
//! does in SeaDrive or OneDrive.
//!
//! - The set of pins (store paths) lives in `<cache-dir>/pinned.json`, written aside and renamed
//!   over on each change. A folder pins everything under it, files made later included.
//! - A pass ([`pass`]) walks each pin through the mount's own listings (fetched afresh, with
//!   the folders above the pin: the snapshot for starting offline records them, so a pinned
//!   folder never opened lists offline too, under its name now), tells the read cache which
//!   versions are pinned, and fetches what is not whole on disk, [`FETCHES`] files at a time,
//!   through the read cache's download path.
//! - Passes run when a pin is set, every [`PASS_EVERY`], when the server answers again, and
//!   when the mount learns of a change under a pin ([`Fs::pins_learned`]: the one hook for
//!   listings, attributes, uploads and a feed follower). A new version of a pinned file is
//!   fetched; the old one is evictable again.
//! - The read cache never evicts pinned versions, and their bytes do not count against its
//!   bound (`--cache-size` bounds what is cached from reading). They are bounded by the cache
//!   disk instead: a file is not fetched when that would leave less than [`RESERVE`] free there
//!   (writes are staged on that disk too); `vaultfs status` then says so for its pin.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::Errno;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::table::{Ino, InodeKind, ROOT};
use super::{Fs, OpResult};
use crate::api::NodePath;
use crate::backend::Backend;
use crate::sync::relock;

/// The attribute that pins a file or folder (`1`), read back as `1` on a pin and `folder` on
/// what a pinned folder holds.
pub(super) const XATTR: &str = "user.vaultfs.pinned";
/// Pinned files downloaded at once.
const FETCHES: usize = 4;
/// How often pinned folders are walked again, for changes the mount was not told of.
const PASS_EVERY: Duration = Duration::from_secs(60);
/// How long a pass waits after a wake-up, so that a burst of changes makes one pass.
const SETTLE: Duration = Duration::from_millis(200);
/// Free space a pinned file's download leaves on the cache disk at least.
pub const RESERVE: u64 = 256 << 20;

fn pins_file(cache_dir: &Path) -> PathBuf {
    cache_dir.join("pinned.json")
}

#[derive(Serialize, Deserialize, Default)]
struct Saved {
    /// Store paths (`/nodes/pth/...`).
    pins: Vec<String>,
}

/// A version a pin holds: ID, md5, size.
type Version = (String, Option<String>, u64);

/// What the last pass found under a pin.
#[derive(Clone, Default)]
struct Found {
    files: Vec<Version>,
    /// Files written here and not stored yet: on disk in the staging area.
    local: u64,
    /// Folders under it the pass could not list (offline, never listed), or the pin itself
    /// missing.
    problem: Option<String>,
    checked: Option<SystemTime>,
}

/// The pins of a mount and what the passes found.
pub(super) struct Pinned {
    file: PathBuf,
    set: Mutex<BTreeSet<String>>,
    found: Mutex<BTreeMap<String, Found>>,
    /// The last download that failed, and why.
    trouble: Mutex<Option<String>>,
    wake: Arc<tokio::sync::Notify>,
}

impl Pinned {
    pub(super) fn open(cache_dir: &Path) -> Pinned {
        let saved: Saved = std::fs::read(pins_file(cache_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Pinned {
            file: pins_file(cache_dir),
            set: Mutex::new(saved.pins.into_iter().collect()),
            found: Mutex::default(),
            trouble: Mutex::default(),
            wake: Arc::default(),
        }
    }

    /// The pins, as store paths.
    fn list(&self) -> Vec<NodePath> {
        (relock(&self.set).iter())
            .filter_map(|u| NodePath::parse_uri(u).ok())
            .collect()
    }

    /// Whether `path` is pinned itself (`Some(true)`), through a folder above it
    /// (`Some(false)`), or not at all.
    pub(super) fn state_of(&self, path: &NodePath) -> Option<bool> {
        let set = relock(&self.set);
        if set.contains(&path.uri()) {
            return Some(true);
        }
        let above = (set.iter())
            .filter_map(|u| NodePath::parse_uri(u).ok())
            .any(|p| p.contains(path));
        above.then_some(false)
    }

    /// Adds or removes a pin, written to disk before it counts; false when nothing changed.
    fn set(&self, path: &NodePath, on: bool) -> std::io::Result<bool> {
        let mut set = relock(&self.set);
        let mut next = set.clone();
        let changed = if on {
            next.insert(path.uri())
        } else {
            next.remove(&path.uri())
        };
        if !changed {
            return Ok(false);
        }
        let saved = Saved {
            pins: next.iter().cloned().collect(),
        };
        super::offline::write_atomically(&self.file, &serde_json::to_vec(&saved)?)?;
        *set = next;
        Ok(true)
    }

    /// Moves the pins on `from` and under it below `to` (dropped for `None`), written to disk.
    fn moved(&self, from: &NodePath, to: Option<&NodePath>) -> std::io::Result<bool> {
        let mut set = relock(&self.set);
        let mut next = BTreeSet::new();
        for uri in set.iter() {
            let Ok(p) = NodePath::parse_uri(uri) else {
                continue;
            };
            if !from.contains(&p) {
                next.insert(uri.clone());
                continue;
            }
            let rest = &p.segments()[from.segments().len()..];
            let moved = to.map(|to| NodePath::from_segments(to.segments().iter().chain(rest)));
            if let Some(Ok(m)) = moved {
                next.insert(m.uri());
            }
        }
        if next == *set {
            return Ok(false);
        }
        let saved = Saved {
            pins: next.iter().cloned().collect(),
        };
        super::offline::write_atomically(&self.file, &serde_json::to_vec(&saved)?)?;
        *set = next;
        Ok(true)
    }
}

impl<B: Backend> Fs<B> {
    /// Pins (`on`) or unpins the file or folder `ino`: the SETXATTR and REMOVEXATTR of
    /// [`XATTR`]. A pin on a store in this process is refused (its files are on this disk
    /// already); unpinning what only a folder above pins is ENODATA (nothing set here).
    pub(super) fn pin(&self, ino: Ino, on: bool) -> OpResult<()> {
        if super::virtual_names::is_virtual(ino) {
            return Err(Errno::EPERM.into());
        }
        let (path, _) = self.path_of(ino)?;
        self.pin_path(&path, on)
    }

    /// The same by the path under the mount point, `rel` (`vaultfs pin` on a read-only mount,
    /// where the kernel refuses to set attributes: over the control socket). A path that
    /// turns out not to be in the store shows as such in `vaultfs status`.
    pub(super) fn pin_relative(&self, rel: &Path, on: bool) -> OpResult<()> {
        let mut path = self.opts.root.clone();
        for c in rel.components() {
            let std::path::Component::Normal(name) = c else {
                return Err(Errno::EINVAL.into());
            };
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            if super::virtual_names::is_virtual_name(name) {
                return Err(Errno::EPERM.into());
            }
            path = path.child(name).map_err(|_| Errno::EINVAL)?;
        }
        self.pin_path(&path, on)
    }

    fn pin_path(&self, path: &NodePath, on: bool) -> OpResult<()> {
        if self.backend.local().is_some() {
            return Err(Errno::EOPNOTSUPP.into());
        }
        match self.reads.pinned.set(path, on) {
            Ok(true) => {
                log::info!("{} {path}", if on { "pinned" } else { "unpinned" });
                if !on {
                    relock(&self.reads.pinned.found).remove(&path.uri());
                    self.apply_pins();
                }
                self.reads.pinned.wake.notify_one();
                Ok(())
            }
            Ok(false) if !on => Err(Errno::NO_XATTR.into()),
            Ok(false) => Ok(()),
            Err(e) => Err(super::error::Error::failed(format!(
                "cannot write {}: {e}",
                self.reads.pinned.file.display()
            ))),
        }
    }

    /// Folder `from` was renamed to `to` (or removed: `None`) through the mount: its pins, and
    /// those of what it holds, go with it. A pinned file's pin stays with its name instead:
    /// editors save by renaming the old file away and writing a new one under the name.
    pub(super) fn pins_moved(&self, from: &NodePath, to: Option<&NodePath>) {
        match self.reads.pinned.moved(from, to) {
            Ok(true) => self.reads.pinned.wake.notify_one(),
            Ok(false) => {}
            Err(e) => log::warn!("cannot write {}: {e}", self.reads.pinned.file.display()),
        }
    }

    /// The mount learned something of `path` (a listing, attributes, an upload, a change told
    /// by the server): if a pin holds it, a pass fetches its new version soon. The one hook for
    /// whatever learns of changes (a feed follower included); cheap when nothing is pinned.
    pub(super) fn pins_learned(&self, path: &NodePath) {
        let touches = (relock(&self.reads.pinned.set).iter())
            .filter_map(|u| NodePath::parse_uri(u).ok())
            .any(|p| p.contains(path) || path.contains(&p));
        if touches {
            self.reads.pinned.wake.notify_one();
        }
    }

    /// Tells the read cache the versions the pins hold now (from the last pass of each).
    fn apply_pins(&self) {
        let set = relock(&self.reads.pinned.set).clone();
        let keys: HashSet<String> = (relock(&self.reads.pinned.found).iter())
            .filter(|(p, _)| set.contains(*p))
            .flat_map(|(_, f)| f.files.iter())
            .map(|(id, md5, _)| super::cache::key(id, md5.as_deref()))
            .collect();
        self.reads.cache.set_pinned(keys);
    }

    /// The pins not yet whole on disk, in words, for the unmount's report (`vaultfs pin DIR`
    /// then `vaultfs unmount` said nothing of the files not fetched).
    pub(super) fn pins_pending(&self, mountpoint: &str) -> Vec<String> {
        if self.backend.local().is_some() {
            return Vec::new(); // the built-in store's files are on this disk
        }
        self.pin_status(mountpoint)
            .into_iter()
            .filter(|p| p.state != "on disk")
            .map(|p| {
                let at = if p.local_path.is_empty() {
                    &p.path
                } else {
                    &p.local_path
                };
                match p.files {
                    0 if p.checked.is_none() => format!("{at}: not listed yet"),
                    n => format!("{at}: {} of {n} file(s) on disk", p.whole_files),
                }
            })
            .collect()
    }

    /// The state of each pin for `vaultfs status`, `mountpoint` being where the root is mounted.
    pub(super) fn pin_status(&self, mountpoint: &str) -> Vec<super::status::Pin> {
        let found = relock(&self.reads.pinned.found).clone();
        let trouble = relock(&self.reads.pinned.trouble).clone();
        let offline = self.offline.now();
        let root = self.opts.root.segments().len();
        self.reads
            .pinned
            .list()
            .into_iter()
            .map(|p| {
                let f = found.get(&p.uri());
                let mut s = super::status::Pin {
                    path: p.to_string(),
                    local_path: if self.opts.root.contains(&p) {
                        let mut l = PathBuf::from(mountpoint);
                        l.extend(&p.segments()[root..]);
                        l.display().to_string()
                    } else {
                        String::new()
                    },
                    ..Default::default()
                };
                let Some(f) = f else {
                    s.state = if offline {
                        "offline: not listed yet".into()
                    } else {
                        "listing".into()
                    };
                    return s;
                };
                for (id, md5, size) in &f.files {
                    s.files += 1;
                    s.bytes += size;
                    if self.reads.cache.kept_whole(id, md5.as_deref()) {
                        s.whole_files += 1;
                        s.whole_bytes += size;
                    }
                }
                s.local_files = f.local;
                s.checked = f.checked.map(crate::api::format_time);
                s.problem = f.problem.clone();
                let pending = s.files - s.whole_files;
                s.state = match (&f.problem, pending) {
                    (Some(_), _) if offline => "offline: part not listed".into(),
                    (Some(_), _) => "incomplete".into(),
                    (None, 0) => "on disk".into(),
                    (None, _) if offline => "offline: waiting for the server".into(),
                    (None, _) => "fetching".into(),
                };
                if pending > 0 && s.problem.is_none() {
                    s.problem = trouble.clone();
                }
                s
            })
            .collect()
    }
}

/// Runs the passes as long as the file system lives (remote backends only).
pub(super) fn start<B: Backend>(fs: &Arc<Fs<B>>) {
    if fs.backend.local().is_some() {
        return;
    }
    let weak = Arc::downgrade(fs);
    let wake = fs.reads.pinned.wake.clone();
    fs.rt.spawn(async move {
        let mut woken = true;
        loop {
            let Some(f) = weak.upgrade() else { return };
            if !f.reads.pinned.list().is_empty() {
                if !f.offline.now() {
                    pass(&f).await;
                } else if woken {
                    // Keys and states from the listings kept (once per change: they change
                    // only with the pins meanwhile); no download can go.
                    walk_all(&f).await;
                }
            }
            let offline = f.offline.now();
            drop(f);
            // Offline: look again soon, the probe finds the server.
            let wait = if offline {
                Duration::from_secs(2)
            } else {
                PASS_EVERY
            };
            woken = tokio::time::timeout(wait, wake.notified()).await.is_ok();
            tokio::time::sleep(SETTLE).await;
        }
    });
}

/// Walks every pin (recording what each holds) and tells the cache; the files to fetch.
async fn walk_all<B: Backend>(fs: &Arc<Fs<B>>) -> Vec<Version> {
    let mut todo: BTreeMap<String, Version> = BTreeMap::new();
    let mut seen = HashSet::new();
    for pin in fs.reads.pinned.list() {
        let found = walk(fs, &pin).await;
        for v in &found.files {
            let k = super::cache::key(&v.0, v.1.as_deref());
            if seen.insert(k.clone()) && !fs.reads.cache.kept_whole(&v.0, v.1.as_deref()) {
                todo.insert(k, v.clone());
            }
        }
        // Unpinned meanwhile: not recorded.
        if relock(&fs.reads.pinned.set).contains(&pin.uri()) {
            relock(&fs.reads.pinned.found).insert(pin.uri(), found);
        }
    }
    let set = relock(&fs.reads.pinned.set).clone();
    relock(&fs.reads.pinned.found).retain(|p, _| set.contains(p));
    fs.apply_pins();
    todo.into_values().collect()
}

/// One pass: walks the pins, then fetches what is not whole on disk.
async fn pass<B: Backend>(fs: &Arc<Fs<B>>) {
    let todo = walk_all(fs).await;
    if todo.is_empty() {
        *relock(&fs.reads.pinned.trouble) = None;
        return;
    }
    let n = todo.len();
    let bytes: u64 = todo.iter().map(|v| v.2).sum();
    log::info!(
        "pinned: fetching {n} file(s), {}",
        super::status::human_bytes(bytes)
    );
    let failed: Vec<String> = futures_util::stream::iter(todo)
        .map(|v| fetch(fs, v))
        .buffer_unordered(FETCHES)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    *relock(&fs.reads.pinned.trouble) = failed.first().cloned();
    if let Some(e) = failed.first() {
        log::warn!("pinned: {} of {n} file(s) not fetched: {e}", failed.len());
    }
}

/// Fetches one pinned version whole into the read cache, if the cache disk has room for it.
async fn fetch<B: Backend>(fs: &Arc<Fs<B>>, (id, md5, size): Version) -> Result<(), String> {
    let free =
        std::fs::File::open(fs.reads.cache.dir()).and_then(|d| super::staging::free_bytes(&d));
    if let Ok(free) = free {
        if free < size.saturating_add(RESERVE) {
            return Err(format!(
                "no room in the cache dir for a pinned file of {} ({} free, {} kept free)",
                super::status::human_bytes(size),
                super::status::human_bytes(free),
                super::status::human_bytes(RESERVE)
            ));
        }
    }
    // (Copies the bytes of a file uploaded from here: off the runtime's threads.)
    let fs2 = fs.clone();
    let e = tokio::task::spawn_blocking(move || {
        fs2.reads.cache.entry_on_disk(&id, md5.as_deref(), size)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    e.fetch_all(fs.backend.as_ref()).await.map_err(|e| {
        if super::offline::unreachable(&e) {
            fs.offline.note_unreachable(Duration::from_secs(5));
        }
        e.to_string()
    })
}

/// What `pin` holds now, from the mount's listings (fetched where stale and the server is
/// there).
async fn walk<B: Backend>(fs: &Arc<Fs<B>>, pin: &NodePath) -> Found {
    let mut found = Found {
        checked: Some(SystemTime::now()),
        ..Default::default()
    };
    let ino = match resolve(fs, pin).await {
        Ok(i) => i,
        Err(e) => {
            found.problem = Some(e);
            return found;
        }
    };
    let mut queue = vec![ino];
    let mut unlisted = 0;
    while let Some(ino) = queue.pop() {
        let kind = fs.nodes.kind(ino);
        if kind == Some(InodeKind::Dir) && !listable(fs, ino).await {
            unlisted += 1;
            continue;
        }
        fs.nodes.inode(ino, |i| match i.kind {
            InodeKind::File if i.staged.is_some() => found.local += 1,
            InodeKind::File => {
                if let Some(r) = &i.remote {
                    found.files.push((r.id.clone(), r.md5.clone(), r.size));
                }
            }
            InodeKind::Dir => {
                if let Some((_, names)) = i.listing() {
                    queue.extend(names.values());
                }
            }
        });
    }
    if unlisted > 0 {
        found.problem = Some(format!(
            "{unlisted} folder(s) not listed yet (the server is out of reach)"
        ));
    }
    found
}

/// Whether folder `ino` has a listing to walk: fetched afresh where the server is there, so
/// that the offline snapshot records it as it is now (with the mount's own changes, which a
/// followed change feed never makes it fetch again); offline, the one the mount has.
async fn listable<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) -> bool {
    let (have, path) = (fs.nodes)
        .inode(ino, |i| (i.listing().is_some(), Some(i.path.clone())))
        .unwrap_or_default();
    let Some(path) = path.filter(|_| !fs.offline.now()) else {
        return have;
    };
    fs.refresh_listing(ino, &path).await.is_ok() || have
}

/// The inode of `pin`, looked up from the mount root.
async fn resolve<B: Backend>(fs: &Arc<Fs<B>>, pin: &NodePath) -> Result<Ino, String> {
    let root = &fs.opts.root;
    if !root.contains(pin) {
        return Err(format!("outside this mount's root {root}"));
    }
    let mut ino = ROOT;
    for name in &pin.segments()[root.segments().len()..] {
        // The folders above it too: the snapshot reaches it through them.
        if !listable(fs, ino).await {
            return Err("not listed yet (the server is out of reach)".into());
        }
        ino = match fs.child(ino, name).await {
            Ok(Some(i)) => i,
            Ok(None) => return Err("not in the store (removed or renamed?)".into()),
            Err(e) => return Err(format!("cannot look it up: {e:?}")),
        };
    }
    Ok(ino)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use fuser::Errno;

    use super::super::tests::{eventually, harness};
    use crate::backend::faulty::{Fault, Op};

    /// A pin asked for by a path under the mount point (the control socket's way) is only ever
    /// names under the mount root; pins are written down and follow their folder's renames.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pins_are_names_under_the_root_kept_on_disk_and_moved_with_their_folder() {
        // One by one: the store stands for a remote one, whose files can be pinned.
        let h = harness(true, Duration::from_secs(10));
        let fs = &h.fs;
        for bad in ["../x", "/etc", "a/../../b"] {
            assert_eq!(
                fs.pin_relative(Path::new(bad), true),
                Err(Errno::EINVAL.into()),
                "{bad}"
            );
        }
        assert_eq!(
            fs.pin_relative(Path::new("a/.preview/x"), true),
            Err(Errno::EPERM.into())
        );
        assert_eq!(
            fs.pin_relative(Path::new("a"), false),
            Err(Errno::NO_XATTR.into())
        );
        fs.pin_relative(Path::new("a"), true).unwrap();
        fs.pin_relative(Path::new("a"), true).unwrap();
        let a = h.vault.child("a").unwrap();
        let inside = a.child("f").unwrap();
        assert_eq!(fs.reads.pinned.state_of(&a), Some(true));
        assert_eq!(fs.reads.pinned.state_of(&inside), Some(false));
        assert_eq!(fs.reads.pinned.state_of(&h.vault), None);
        let saved = std::fs::read_to_string(h.cache_dir.join("pinned.json")).unwrap();
        assert!(
            saved.contains("/nodes/pth/Local/My First Vault/a"),
            "{saved}"
        );

        let b = h.vault.child("b").unwrap();
        fs.pins_moved(&a, Some(&b));
        assert_eq!(fs.reads.pinned.state_of(&a), None);
        assert_eq!(fs.reads.pinned.state_of(&b), Some(true));
        // What the next mount reads.
        let again = super::Pinned::open(&h.cache_dir);
        assert_eq!(again.state_of(&b), Some(true));
        fs.pins_moved(&h.vault, None);
        assert_eq!(fs.reads.pinned.state_of(&b), None);
    }

    /// A pinned file the store will not hand over is left, and its pin says why; once the
    /// store answers, the next pass the mount learns of fetches it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pinned_file_that_cannot_be_fetched_says_why_and_is_fetched_later() {
        let h = harness(true, Duration::from_secs(10));
        h.put_remote("doc.txt", b"kept offline").await;
        let refused = crate::api::Error::forbidden("no downloads today");
        h.faults().inject(Op::Download, Fault::Fail(refused));
        h.fs.pin_relative(Path::new("doc.txt"), true).unwrap();
        let status = || h.fs.pin_status("/mnt").remove(0);
        eventually(Duration::from_secs(10), "the refusal in status", || async {
            status()
                .problem
                .is_some_and(|p| p.contains("no downloads today"))
        })
        .await;
        let p = status();
        assert_eq!(
            (p.state.as_str(), p.files, p.whole_files),
            ("fetching", 1, 0)
        );
        assert_eq!(p.local_path, "/mnt/doc.txt");

        h.faults().clear_all();
        h.fs.pins_learned(&h.vault);
        eventually(Duration::from_secs(10), "the file on disk", || async {
            status().state == "on disk"
        })
        .await;
        let p = status();
        assert_eq!((p.whole_files, p.whole_bytes, p.problem), (1, 12, None));
    }
}
