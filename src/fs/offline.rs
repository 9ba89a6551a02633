//! Offline: the tree the mount fetched, kept in its cache dir so that a mount started with the
//! server out of reach shows it (listed from this snapshot, read from the whole files the read
//! cache kept, writes staged in the journal), and the probe that finds the server again.
//!
//! - Each listing fetched is recorded (`record`), and each folder's entries as this mount
//!   changed them (`write_here`: the feed keeps listings fresh without fetching them again
//!   after the mount's own changes); every `SAVE_EVERY` the folders recorded since are written,
//!   one file a folder (`offline/tree/<sha256 of its URI>.json`), and the read cache's index,
//!   each aside and renamed over, so a crash leaves the previous whole file, never a torn one.
//!   One file a folder, and none held in memory: a save costs the folders that changed, not
//!   the whole tree (which one `tree.json` rewrote every 2 s while anything changed, and kept
//!   whole in memory: issue 46).
//! - `cli::mount` probes the root for at most `START_PROBE`: unreachable, with a snapshot,
//!   the mount starts offline (`MountOptions::start_offline`) from it.
//! - While offline, the probe asks for the root under the uploads' retry policy
//!   (`staging::retry`); once it answers, uploads waiting for their next attempt go at once
//!   and listings are fetched again as they age. Both moments are logged and `vaultfs status`
//!   says since when the mount is offline.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::Fs;
use super::nodes::Nodes;
use super::staging::{Next, Retry};
use super::table::Ino;
use crate::api::{Error, Node, NodePath, NodeType};
use crate::backend::Backend;
use crate::sync::relock;

/// How long `vaultfs mount` waits for the root before it starts from the snapshot.
pub const START_PROBE: Duration = Duration::from_secs(2);
/// How often the snapshot and the read cache's index are written (when changed).
const SAVE_EVERY: Duration = Duration::from_secs(2);
/// Offline "until the probe says otherwise".
const UNTIL_PROBED: Duration = Duration::from_secs(10 * 365 * 86400);

/// The snapshot's folder in the cache dir: one file a folder listed.
fn tree_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("offline").join("tree")
}

/// The snapshot of one file before there was one a folder (read once, then split).
fn old_tree_file(cache_dir: &Path) -> PathBuf {
    cache_dir.join("offline").join("tree.json")
}

/// The file of the folder at `uri` (its name a digest: whatever the server calls a folder,
/// a plain name in the snapshot's folder).
fn folder_file(dir: &Path, uri: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let name = crate::api::checksum::hex(&Sha256::digest(uri.as_bytes()));
    dir.join(format!("{name}.json"))
}

/// What the last listing said of an entry that the table knows less of (its name moves to the
/// key of the map it is read into).
#[derive(Deserialize)]
struct Said {
    #[serde(default)]
    name: String,
    #[serde(rename = "nodeType", default)]
    node_type: NodeType,
    #[serde(rename = "createdOn", default)]
    created_on: Option<String>,
}

/// A folder's file read light: its node, and what it said of each entry.
#[derive(Deserialize)]
struct LastFolder {
    #[serde(flatten)]
    folder: Node,
    #[serde(default)]
    children: Vec<Said>,
}

/// The folder at `uri` as last written, read light; None if never written.
fn read_last(dir: &Path, uri: &str) -> Option<LastFolder> {
    let f = std::fs::File::open(folder_file(dir, uri)).ok()?;
    let last: LastFolder = serde_json::from_reader(std::io::BufReader::new(f)).ok()?;
    (last.folder.uri == uri).then_some(last)
}

/// A folder's file as written: the folder's node, its entries streamed from the table.
#[derive(Serialize)]
struct Written<'a> {
    #[serde(flatten)]
    folder: &'a Node,
    children: Entries<'a>,
}

/// The entries of a listed folder, taken from the table `PART` at a time as they are written.
struct Entries<'a> {
    nodes: &'a Nodes,
    dir: Ino,
    said: &'a HashMap<String, Said>,
}

/// Entries taken from the table at a time (the table's lock is held for these only).
const PART: usize = 1000;

impl Serialize for Entries<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(None)?;
        let mut after: Option<String> = None;
        loop {
            let (part, last) = self
                .nodes
                .read(|t| t.entries_after(self.dir, after.as_deref(), PART));
            let Some(last) = last else { break };
            for mut c in part {
                if let Some(b) = self.said.get(&c.name) {
                    if b.node_type.is_file() == c.node_type.is_file() {
                        c.node_type = b.node_type;
                        c.created_on = b.created_on.clone().or(c.created_on);
                    }
                }
                seq.serialize_element(&c)?;
            }
            after = Some(last);
        }
        seq.end()
    }
}

/// A writer that hashes what goes through it.
struct Hashing<W> {
    inner: W,
    digest: std::collections::hash_map::DefaultHasher,
}

impl<W: std::io::Write> std::io::Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::hash::Hasher;
        let n = self.inner.write(buf)?;
        self.digest.write(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The folder at `uri` as last recorded, with its children; None if never listed.
fn read_folder(dir: &Path, uri: &str) -> Option<Node> {
    let bytes = std::fs::read(folder_file(dir, uri)).ok()?;
    let node: Node = serde_json::from_slice(&bytes).ok()?;
    // A digest names the file: the URI inside says whose it is.
    (node.uri == uri).then_some(node)
}

/// Whether the cache dir holds a snapshot with `root` in it: a mount may start offline.
pub fn can_start_offline(cache_dir: &Path, root: &NodePath) -> bool {
    read_folder(&tree_dir(cache_dir), &root.uri()).is_some()
        || load_old(cache_dir).contains_key(&root.uri())
}

/// Whether `e` says the backend is out of reach (rather than the root being wrong).
pub fn unreachable(e: &Error) -> bool {
    super::error::is_transient(e)
}

fn load_old(cache_dir: &Path) -> BTreeMap<String, Node> {
    std::fs::read(old_tree_file(cache_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// A snapshot of one file (before this release) split into one file a folder, then removed.
fn split_old(cache_dir: &Path, dir: &Path) -> std::io::Result<()> {
    let old = old_tree_file(cache_dir);
    if !old.exists() {
        return Ok(());
    }
    for (uri, mut node) in load_old(cache_dir) {
        node.uri = uri.clone();
        write_atomically(&folder_file(dir, &uri), &serde_json::to_vec(&node)?)?;
    }
    std::fs::remove_file(old)
}

/// Writes `bytes` to `path` whole or not at all: to a file beside it (`aside`), synced,
/// renamed over.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = aside(path);
    let written = crate::api::files::new_private(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A name beside `path` for one write of it: its name, this process and a count, `.tmp`. Two
/// writers never share one, and one a crash left never stands in the way: under one fixed
/// name (made with `O_EXCL`), a file left by a crash mid-write failed every later save of
/// that folder, the pins or the cache's index until removed by hand.
fn aside(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Files a crash left aside in the snapshot's folder (`aside`): this daemon owns the cache dir.
fn sweep_aside(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The snapshot and the offline state of a mount: since when the backend is out of reach,
/// and until when it counts as such.
pub(super) struct Offline {
    /// The snapshot's folder (`tree_dir`).
    dir: PathBuf,
    /// Folder URI -> the folder's node with its children, recorded since the last save.
    pending: Mutex<BTreeMap<String, Node>>,
    /// A digest of each folder's file as written last: a listing fetched again unchanged is
    /// not written again.
    written: Mutex<HashMap<String, u64>>,
    /// Since when the backend is out of reach (None: reachable).
    since: Mutex<Option<SystemTime>>,
    /// Until when the backend counts as unreachable (cached listings are used meanwhile).
    until: Mutex<Option<std::time::Instant>>,
    /// Told when the backend answers again: uploads waiting to retry go at once.
    pub(super) reconnected: tokio::sync::Notify,
    /// Held by a save: the last, at unmount, may come while a periodic one is under way, whose
    /// older view of a folder could otherwise be renamed over the newer one.
    saving: Mutex<()>,
}

impl Offline {
    pub(super) fn open(cache_dir: &Path) -> std::io::Result<Offline> {
        let dir = tree_dir(cache_dir);
        super::private_dir(&dir)?;
        sweep_aside(&dir);
        if let Err(e) = split_old(cache_dir, &dir) {
            log::warn!("cannot split the offline snapshot into one file a folder: {e}");
        }
        Ok(Offline {
            dir,
            pending: Mutex::new(BTreeMap::new()),
            written: Mutex::new(HashMap::new()),
            since: Mutex::new(None),
            until: Mutex::new(None),
            reconnected: tokio::sync::Notify::new(),
            saving: Mutex::new(()),
        })
    }

    /// A listing fetched: `node` (its folder) with `children`; written with the next save
    /// if it changed.
    pub(super) fn record(&self, path: &NodePath, node: &Node, children: &[Node]) {
        let mut n = node.clone();
        n.uri = path.uri();
        n.children = Some(children.to_vec());
        relock(&self.pending).insert(path.uri(), n);
    }

    /// A folder's entries as this mount changed them (`Table::snapshot_due`), written now:
    /// what the last listing said of each name is kept where the table knows less (a vault's
    /// type, a file's creation time). The entries are taken from the table a part at a time
    /// and written as they come: a folder of 100,000 files was 100,000 nodes in memory twice
    /// over (the table's and the last file's) and its whole text besides.
    fn write_here(&self, nodes: &Nodes, dir: Ino) -> std::io::Result<()> {
        let Some(node) = nodes.read(|t| t.listed_folder(dir)) else {
            return Ok(());
        };
        let uri = node.uri.clone();
        // What the last listing said: one fetched since the last save, or the folder's file.
        // (A folder made here was never listed: the table's view of it is all there is.)
        let mut fetched = relock(&self.pending).remove(&uri);
        let (folder, said): (Node, HashMap<String, Said>) = match fetched.as_mut() {
            Some(f) => {
                let children = f.children.take();
                let folder = f.clone();
                f.children = children;
                let said = f.children.iter().flatten().map(|c| {
                    let said = Said {
                        name: String::new(),
                        node_type: c.node_type,
                        created_on: c.created_on.clone(),
                    };
                    (c.name.clone(), said)
                });
                (folder, said.collect())
            }
            None => match read_last(&self.dir, &uri) {
                Some(last) => {
                    let said =
                        (last.children.into_iter()).map(|mut s| (std::mem::take(&mut s.name), s));
                    (last.folder, said.collect())
                }
                None => (node, HashMap::new()),
            },
        };
        let out = Written {
            folder: &folder,
            children: Entries {
                nodes,
                dir,
                said: &said,
            },
        };
        let written = self.write_folder(&uri, |w| serde_json::to_writer(w, &out));
        if written.is_err() {
            // Kept for the next save.
            if let Some(f) = fetched {
                relock(&self.pending).entry(uri).or_insert(f);
            }
            nodes.snapshot_again(dir);
        }
        written
    }

    /// Writes the folders fetched since the last save and not written with this mount's
    /// changes (`write_here`).
    fn save(&self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut *relock(&self.pending));
        let mut failed = None;
        for (uri, node) in pending {
            if let Err(e) = self.write_folder(&uri, |w| serde_json::to_writer(w, &node)) {
                // Kept for the next save (unless recorded anew meanwhile).
                relock(&self.pending).entry(uri).or_insert(node);
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Writes the file of the folder at `uri` as `json` writes it (through a buffer, hashed as
    /// it goes), aside, synced and renamed over; unless it is what was written last.
    fn write_folder(
        &self,
        uri: &str,
        json: impl FnOnce(&mut dyn std::io::Write) -> serde_json::Result<()>,
    ) -> std::io::Result<()> {
        use std::hash::Hasher;
        let path = folder_file(&self.dir, uri);
        let tmp = aside(&path);
        let file = crate::api::files::new_private(&tmp)?;
        let mut w = Hashing {
            inner: std::io::BufWriter::new(file),
            digest: std::collections::hash_map::DefaultHasher::new(),
        };
        let done = json(&mut w)
            .map_err(std::io::Error::other)
            .and_then(|()| w.inner.into_inner().map_err(|e| e.into_error()));
        let unchanged = |digest| relock(&self.written).get(uri) == Some(&digest);
        let digest = w.digest.finish();
        let kept = done.and_then(|file| match unchanged(digest) {
            true => Ok(false),
            false => file
                .sync_all()
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map(|()| true),
        });
        match kept {
            Ok(true) => {
                relock(&self.written).insert(uri.to_string(), digest);
                Ok(())
            }
            other => {
                let _ = std::fs::remove_file(&tmp);
                other.map(|_| ())
            }
        }
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
        let dir = &self.offline.dir;
        let dirs = (self.nodes).restore(&self.opts.root, |p| read_folder(dir, &p.uri()));
        self.offline.note_unreachable(UNTIL_PROBED);
        log::warn!(
            "started offline from the tree kept in {} ({dirs} folder(s))",
            self.offline.dir.display()
        );
    }
}

/// Writes the snapshot and the read cache's index, if changed since last written.
pub(super) fn save<B: Backend>(fs: &Fs<B>, last: bool) {
    // The built-in store is never out of reach: no snapshot to keep (listing a changed folder
    // again every `SAVE_EVERY` made a large `rm -rf` cost the square of the folder's size).
    // Over a server a large folder rests between saves for the same reason, but for the last.
    let keep = fs.backend.local().is_none();
    let _one = relock(&fs.offline.saving);
    for dir in fs.nodes.snapshot_due(keep, last) {
        if let Err(e) = fs.offline.write_here(&fs.nodes, dir) {
            log::warn!("cannot write the offline snapshot of a folder: {e}");
        }
    }
    if let Err(e) = fs.offline.save() {
        log::warn!("cannot write the offline snapshot: {e}");
    }
    // The built-in store's bytes are local files already: its cached copies are not kept for
    // the next mount (listing them cost an fdatasync of each new one and a rewrite of the
    // whole list every `SAVE_EVERY`, most of a cold `tar` of 10,000 files).
    if keep {
        if let Err(e) = fs.reads.cache.save_index() {
            log::warn!("cannot write the read cache's index: {e}");
        }
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
            // (Files written and synced: off the runtime's workers.)
            let _ = tokio::task::spawn_blocking(move || save(&f, false)).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeType;

    fn folder(path: &NodePath, children: &[&str]) -> (Node, Vec<Node>) {
        let node = Node {
            name: path.name().unwrap_or_default().to_string(),
            uri: path.uri(),
            node_type: NodeType::FolderNodeType,
            ..Node::default()
        };
        let children = (children.iter())
            .map(|n| Node {
                name: n.to_string(),
                uri: path.child(n).unwrap().uri(),
                node_type: NodeType::FileNodeType,
                id: Some(format!("id-{n}")),
                size: Some(1),
                ..Node::default()
            })
            .collect();
        (node, children)
    }

    /// One file a folder: a save writes the folders recorded since, and not one whose listing
    /// came again unchanged; nothing else is written, and each reads back whole.
    #[test]
    fn a_save_writes_the_folders_that_changed_and_only_those() {
        let tmp = tempfile::tempdir().unwrap();
        let off = Offline::open(tmp.path()).unwrap();
        let a = NodePath::from_segments(["Acme", "Vault", "a"]).unwrap();
        let b = NodePath::from_segments(["Acme", "Vault", "b"]).unwrap();
        for (p, names) in [(&a, ["x", "y"]), (&b, ["z", "w"])] {
            let (n, c) = folder(p, &names);
            off.record(p, &n, &c);
        }
        off.save().unwrap();
        let file_a = folder_file(&off.dir, &a.uri());
        let file_b = folder_file(&off.dir, &b.uri());
        let inode = |f: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(f).unwrap());
        let (ino_a, ino_b) = (inode(&file_a), inode(&file_b));
        // a listed again as it was, b with a name gone: only b's file is written anew.
        let (n, c) = folder(&a, &["x", "y"]);
        off.record(&a, &n, &c);
        let (n, c) = folder(&b, &["z"]);
        off.record(&b, &n, &c);
        off.save().unwrap();
        assert_eq!(inode(&file_a), ino_a, "a unchanged: not written");
        assert_ne!(
            inode(&file_b),
            ino_b,
            "b changed: written aside and renamed over"
        );
        let names = |p: &NodePath| -> Vec<String> {
            (read_folder(&off.dir, &p.uri()).unwrap().children.unwrap())
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(names(&a), ["x", "y"]);
        assert_eq!(names(&b), ["z"]);
        assert_eq!(std::fs::read_dir(&off.dir).unwrap().count(), 2);
    }

    /// A file a crash left aside (under the fixed name of earlier builds, or this one's) does
    /// not stand in the way of a save, and the next mount removes it.
    #[test]
    fn a_file_left_aside_by_a_crash_stops_no_save() {
        let tmp = tempfile::tempdir().unwrap();
        let off = Offline::open(tmp.path()).unwrap();
        let a = NodePath::from_segments(["Acme", "Vault", "a"]).unwrap();
        let file = folder_file(&off.dir, &a.uri());
        let left = [file.with_extension("tmp"), aside(&file)];
        for l in &left {
            std::fs::write(l, b"{\"torn").unwrap();
        }
        let (n, c) = folder(&a, &["x"]);
        off.record(&a, &n, &c);
        off.save().unwrap();
        assert_eq!(
            read_folder(&off.dir, &a.uri()).unwrap().children.unwrap()[0].name,
            "x"
        );
        let pins = tmp.path().join("pinned.json");
        std::fs::write(pins.with_extension("tmp"), b"torn").unwrap();
        write_atomically(&pins, b"[]").unwrap();
        assert_eq!(std::fs::read(&pins).unwrap(), b"[]");
        drop(off);
        let off = Offline::open(tmp.path()).unwrap();
        assert!(left.iter().all(|l| !l.exists()));
        assert_eq!(std::fs::read_dir(&off.dir).unwrap().count(), 1);
    }

    /// The snapshot of one file an older mount left is split into one file a folder, and goes.
    #[test]
    fn the_snapshot_of_one_file_is_split_into_one_a_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let root = NodePath::from_segments(["Acme", "Vault"]).unwrap();
        let (mut n, c) = folder(&root, &["x"]);
        n.children = Some(c);
        std::fs::create_dir_all(tmp.path().join("offline")).unwrap();
        let old: BTreeMap<String, Node> = [(root.uri(), n)].into();
        std::fs::write(old_tree_file(tmp.path()), serde_json::to_vec(&old).unwrap()).unwrap();
        assert!(can_start_offline(tmp.path(), &root));
        let off = Offline::open(tmp.path()).unwrap();
        assert!(!old_tree_file(tmp.path()).exists());
        assert!(can_start_offline(tmp.path(), &root));
        let kept = read_folder(&off.dir, &root.uri()).unwrap();
        assert_eq!(kept.children.unwrap()[0].name, "x");
    }

    /// A folder changed here is written from the table a part at a time, all its entries
    /// there, with what the last listing said where the table knows less (a vault's type, a
    /// creation time); written again unchanged, its file is left as it was.
    #[test]
    fn a_large_folder_is_written_from_the_table_with_what_its_listing_said() {
        let tmp = tempfile::tempdir().unwrap();
        let off = Offline::open(tmp.path()).unwrap();
        let root = NodePath::parse_uri("/nodes/pth/Local/V").unwrap();
        let mut t = crate::fs::table::Table::new(root.clone());
        let path = root.child("big").unwrap();
        let dir = t.ensure(&path, crate::fs::table::InodeKind::Dir);
        let n = 2 * PART + 7;
        let mut names = BTreeMap::new();
        for i in 0..n {
            let name = format!("d{i:05}");
            let ino = t.ensure(
                &path.child(&name).unwrap(),
                crate::fs::table::InodeKind::Dir,
            );
            names.insert(name, ino);
        }
        t.get_mut(dir).unwrap().set_listing(names);
        let nodes = Nodes::new(t, Duration::from_secs(1), Box::new(|| None));

        // The listing fetched before: a vault among the entries, a creation time.
        let said = |name: &str, node_type| Node {
            name: name.into(),
            uri: path.child(name).unwrap().uri(),
            node_type,
            created_on: Some("2020-01-02T03:04:05Z".into()),
            ..Node::default()
        };
        let folder = Node {
            name: "big".into(),
            uri: path.uri(),
            node_type: NodeType::FolderNodeType,
            ..Node::default()
        };
        let fetched = [
            said("d00003", NodeType::VaultNodeType),
            said("d00004", NodeType::FolderNodeType),
        ];
        off.record(&path, &folder, &fetched);
        off.write_here(&nodes, dir).unwrap();

        let back = read_folder(&off.dir, &path.uri()).unwrap();
        let children = back.children.unwrap();
        let got: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
        let want: Vec<String> = (0..n).map(|i| format!("d{i:05}")).collect();
        assert_eq!(got, want);
        assert_eq!(children[3].node_type, NodeType::VaultNodeType);
        assert_eq!(
            children[4].created_on.as_deref(),
            Some("2020-01-02T03:04:05Z")
        );
        assert_eq!(children[5].node_type, NodeType::FolderNodeType);

        // Again, from the file written (nothing fetched since): the same, not written again.
        let file = folder_file(&off.dir, &path.uri());
        let inode = |f: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(f).unwrap());
        let ino = inode(&file);
        off.write_here(&nodes, dir).unwrap();
        assert_eq!(inode(&file), ino);
        let again = read_folder(&off.dir, &path.uri()).unwrap();
        assert_eq!(
            again.children.unwrap()[3].node_type,
            NodeType::VaultNodeType
        );
    }
}
