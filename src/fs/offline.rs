//! Offline: the tree the mount fetched, kept in its cache dir so that a mount started with the
//! server out of reach shows it (listed from this snapshot, read from the whole files the read
//! cache kept, writes staged in the journal), and the probe that finds the server again.
//!
//! - Each listing fetched is recorded (`record`), and each folder's entries as this mount
//!   changed them (`record_here`: the feed keeps listings fresh without fetching them again
//!   after the mount's own changes); every `SAVE_EVERY` the snapshot
//!   (`offline/tree.json`) and the read cache's index are written aside and renamed over, so a
//!   crash leaves the previous whole file, never a torn one.
//! - `cli::mount` probes the root for at most `START_PROBE`: unreachable, with a snapshot,
//!   the mount starts offline (`MountOptions::start_offline`) from it.
//! - While offline, the probe asks for the root under the uploads' retry policy
//!   (`staging::retry`); once it answers, uploads waiting for their next attempt go at once
//!   and listings are fetched again as they age. Both moments are logged and `vaultfs status`
//!   says since when the mount is offline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::Fs;
use super::staging::{Next, Retry};
use super::table::{InodeKind, ROOT};
use crate::api::{Error, Node, NodePath};
use crate::backend::Backend;
use crate::sync::relock;

/// How long `vaultfs mount` waits for the root before it starts from the snapshot.
pub const START_PROBE: Duration = Duration::from_secs(2);
/// How often the snapshot and the read cache's index are written (when changed).
const SAVE_EVERY: Duration = Duration::from_secs(2);
/// Offline "until the probe says otherwise".
const UNTIL_PROBED: Duration = Duration::from_secs(10 * 365 * 86400);

/// The snapshot's file in the cache dir.
fn tree_file(cache_dir: &Path) -> PathBuf {
    cache_dir.join("offline").join("tree.json")
}

/// Whether the cache dir holds a snapshot with `root` in it: a mount may start offline.
pub fn can_start_offline(cache_dir: &Path, root: &NodePath) -> bool {
    load(cache_dir).contains_key(&root.uri())
}

/// Whether `e` says the backend is out of reach (rather than the root being wrong).
pub fn unreachable(e: &Error) -> bool {
    super::errno::is_transient(e)
}

fn load(cache_dir: &Path) -> BTreeMap<String, Node> {
    std::fs::read(tree_file(cache_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes `bytes` to `path` whole or not at all: to a file beside it, synced, renamed over.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = crate::api::files::new_private(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The snapshot and the offline state of a mount: since when the backend is out of reach,
/// and until when it counts as such.
pub(super) struct Offline {
    file: PathBuf,
    /// Folder URI -> the folder's node with its children, as last listed.
    tree: Mutex<BTreeMap<String, Node>>,
    dirty: AtomicBool,
    /// Since when the backend is out of reach (None: reachable).
    since: Mutex<Option<SystemTime>>,
    /// Until when the backend counts as unreachable (cached listings are used meanwhile).
    until: Mutex<Option<std::time::Instant>>,
    /// Told when the backend answers again: uploads waiting to retry go at once.
    pub(super) reconnected: tokio::sync::Notify,
}

impl Offline {
    pub(super) fn open(cache_dir: &Path) -> std::io::Result<Offline> {
        super::private_dir(&cache_dir.join("offline"))?;
        Ok(Offline {
            file: tree_file(cache_dir),
            tree: Mutex::new(load(cache_dir)),
            dirty: AtomicBool::new(false),
            since: Mutex::new(None),
            until: Mutex::new(None),
            reconnected: tokio::sync::Notify::new(),
        })
    }

    /// A listing fetched: `node` (its folder) with `children`; written with the next save
    /// if it changed.
    pub(super) fn record(&self, path: &NodePath, node: &Node, children: &[Node]) {
        let mut n = node.clone();
        n.children = Some(children.to_vec());
        let mut tree = relock(&self.tree);
        if tree.get(&path.uri()) != Some(&n) {
            tree.insert(path.uri(), n);
            self.dirty.store(true, Ordering::Relaxed);
        }
    }

    /// A folder's entries as this mount changed them (`Table::listings_changed_here`): what
    /// the last listing said of each name is kept where the table knows less (a vault's type,
    /// a file's creation time).
    fn record_here(&self, node: Node, children: Vec<Node>) {
        let mut tree = relock(&self.tree);
        // A folder made here was never listed: the table's view of it is all there is.
        let folder = tree.entry(node.uri.clone()).or_insert(node);
        let before: BTreeMap<String, Node> = folder
            .children
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();
        let children = children
            .into_iter()
            .map(|mut c| {
                if let Some(b) = before.get(&c.name) {
                    if b.node_type.is_file() == c.node_type.is_file() {
                        c.node_type = b.node_type;
                        c.created_on = b.created_on.clone().or(c.created_on);
                    }
                }
                c
            })
            .collect();
        folder.children = Some(children);
        self.dirty.store(true, Ordering::Relaxed);
    }

    fn save(&self) -> std::io::Result<()> {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&*relock(&self.tree))?;
        write_atomically(&self.file, &bytes).inspect_err(|_| {
            self.dirty.store(true, Ordering::Relaxed);
        })
    }

    /// Since when the backend is out of reach, if it is.
    pub(super) fn since(&self) -> Option<SystemTime> {
        *relock(&self.since)
    }

    /// The backend failed recently: serve what we have without asking again.
    pub(super) fn now(&self) -> bool {
        relock(&self.until).is_some_and(|t| std::time::Instant::now() < t)
    }

    /// The backend could not be reached: the mount counts as offline (listings answered from
    /// what it has, `vaultfs status` says so) for at least `d`.
    pub(super) fn note_unreachable(&self, d: Duration) {
        let until = std::time::Instant::now() + d;
        {
            let mut o = relock(&self.until);
            *o = Some(o.map_or(until, |t| t.max(until)));
        }
        self.went_away();
    }

    /// The backend answered a request that needed it: it is reachable again.
    pub(super) fn note_reachable(&self) {
        *relock(&self.until) = None;
        self.came_back();
    }

    /// The backend is out of reach: logged once, until it answers again.
    fn went_away(&self) {
        let mut s = relock(&self.since);
        if s.is_none() {
            *s = Some(SystemTime::now());
            log::warn!(
                "offline: the backend is out of reach; listing what the mount knows, staging writes"
            );
        }
    }

    /// The backend answered: logged once, and uploads waiting to retry go now.
    fn came_back(&self) {
        if let Some(t) = relock(&self.since).take() {
            let secs = t.elapsed().unwrap_or_default().as_secs();
            log::info!("reconnected after {secs} s offline");
            self.reconnected.notify_waiters();
        }
    }
}

impl<B: Backend> Fs<B> {
    /// Loads the snapshot's listings under the mount root into the table (the mount starts
    /// offline). Listings are loaded as fetched now; they are fetched again once they age.
    pub(super) fn restore_snapshot(&self) {
        let tree = relock(&self.offline.tree).clone();
        let root = self.opts.root.uri();
        let mut t = self.table();
        let mut dirs = 0;
        // Parents before children: a shorter URI of the same prefix sorts first.
        for (uri, node) in &tree {
            if !(uri == &root || uri.starts_with(&format!("{root}/"))) {
                continue;
            }
            let Ok(path) = NodePath::parse_uri(uri) else {
                continue;
            };
            let dir = if uri == &root {
                ROOT
            } else {
                match t.ino_of(&path) {
                    Some(i) => i,
                    None => continue, // its parent was not listed
                }
            };
            if dir != ROOT {
                t.update_from(dir, node);
            }
            let mut names = BTreeMap::new();
            for child in node.children.iter().flatten() {
                if child.name == super::virtual_names::PREVIEW {
                    continue;
                }
                if let Ok(cpath) = path.child(&child.name) {
                    names.insert(child.name.clone(), t.upsert(&cpath, child).0);
                }
            }
            if let Some(i) = t.get_mut(dir).filter(|i| i.kind == InodeKind::Dir) {
                i.set_listing(names);
                dirs += 1;
            }
        }
        drop(t);
        self.offline.note_unreachable(UNTIL_PROBED);
        log::warn!(
            "started offline from the tree kept in {} ({dirs} folder(s))",
            self.offline.file.display()
        );
    }
}

/// Writes the snapshot and the read cache's index, if changed since last written.
pub(super) fn save<B: Backend>(fs: &Fs<B>) {
    // The built-in store is never out of reach: no snapshot to keep (listing a changed folder
    // again every `SAVE_EVERY` made a large `rm -rf` cost the square of the folder's size).
    let keep = fs.backend.local().is_none();
    for (folder, children) in fs.table().listings_changed_here(keep) {
        fs.offline.record_here(folder, children);
    }
    if let Err(e) = fs.offline.save() {
        log::warn!("cannot write the offline snapshot: {e}");
    }
    if let Err(e) = fs.reads.cache.save_index() {
        log::warn!("cannot write the read cache's index: {e}");
    }
}

/// Writes the snapshot and the read cache's index as they change, and probes the backend
/// while it is out of reach; both end with the file system.
pub(super) fn start<B: Backend>(fs: &Arc<Fs<B>>) {
    let weak = Arc::downgrade(fs);
    fs.rt.spawn(async move {
        loop {
            tokio::time::sleep(SAVE_EVERY).await;
            let Some(f) = weak.upgrade() else { return };
            save(&f);
        }
    });
    let weak = Arc::downgrade(fs);
    fs.rt.spawn(async move {
        let mut retry = Retry::default();
        loop {
            let Some(f) = weak.upgrade() else { return };
            if f.offline.since().is_none() {
                drop(f);
                retry = Retry::default();
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            match f.backend.node(&f.opts.root).await {
                Ok(_) => {
                    f.offline.note_reachable();
                    retry = Retry::default();
                }
                Err(e) => {
                    let wait = match retry.failed(&e) {
                        Next::After(w) => w,
                        // The root itself refused: nothing to reconnect to; try now and then.
                        Next::SetAside => Duration::from_secs(60),
                    };
                    log::debug!(
                        "still offline ({e}); next probe in {:.1} s",
                        wait.as_secs_f64()
                    );
                    drop(f);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    });
}
