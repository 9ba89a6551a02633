//! Following changes made elsewhere (docs/design.md §5, "Following changes"): one task per
//! mount that long-polls the backend's change feed (`Backend::changes`) from the cursor taken
//! at mount time and, for each change, drops exactly what it makes stale: the parent folder's
//! cached listing, the node's attributes (so the next open reads the new version), and the
//! kernel's entries, attributes and pages (`inval_entry`, `inval_inode`; a delete and the
//! source of a move by `FUSE_NOTIFY_DELETE`, which reaches inotify watchers as `IN_DELETE`).
//! While the feed is followed, listings stay fresh until it says otherwise (`Freshness`).
//!
//! Without a feed (a server that has none: the public service) the task polls instead, every
//! `--poll-interval`: one listing per folder used lately, and the folders of open files.
//!
//! Changes this mount made itself come back through the feed too: one whose effect the table
//! already shows (the name is there, changed here at or after the change's time, or being
//! changed here now ([`Ours`]); or it is gone here already) is skipped, and a file with staged
//! bytes is never invalidated.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fuser::INodeNo;

use super::Fs;
use super::staging::{Next, Retry};
pub(super) use super::table::Kernel;
use super::table::{Effects, Ino, Told};
use crate::api::NodeType;
use crate::api::{Change, ChangeKind, NodePath};
use crate::backend::Backend;
use crate::sync::relock;

/// How long one request of the feed waits for a change (the remote backend cuts it to its
/// client's idle timeout).
const WAIT: Duration = Duration::from_secs(25);

/// How often the built-in store's count of other processes' commits is looked at (a read of
/// shared memory, as `freshness` does at each use).
const FOREIGN_LOOK: Duration = Duration::from_millis(250);

/// A folder used this recently is polled (without a feed).
const RECENT: Duration = Duration::from_secs(300);

/// The follower's state kept in `Fs`.
#[derive(Default)]
pub(super) struct Follow {
    /// Where the mount is (for `echo_remove`).
    mountpoint: std::sync::OnceLock<std::path::PathBuf>,
    /// Removals the follower makes through the mount, by parent and name. Taken alone.
    /// Each removal's node: a lookup of the name meanwhile answers it (a kernel entry that
    /// aged meanwhile is looked up again before the removal, and the removal then goes on).
    echo: std::sync::Mutex<HashMap<(Ino, String), Echo>>,
    /// The pids of the children making those removals: only their lookups are so answered (a
    /// user's lookup meanwhile finds the name gone). Taken alone.
    echo_children: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Polling (no feed): folders used are noted.
    polling: AtomicBool,
    /// Folders listed or looked up in, and when last (for polling without a feed). Taken alone.
    used: std::sync::Mutex<HashMap<Ino, Instant>>,
}

impl Follow {
    /// Folder `dir` was used now (listed, looked up in).
    pub(super) fn used(&self, dir: Ino) {
        if self.polling.load(Ordering::Relaxed) {
            relock(&self.used).insert(dir, Instant::now());
        }
    }
}

/// How long the mount waits at start for the cursor to follow from (taken before the kernel
/// asks for anything, nothing listed before it needs listing again).
const FIRST_CURSOR: Duration = Duration::from_secs(2);

/// Starts following `fs`'s backend (once mounted at `mountpoint`, the kernel's notifier set,
/// before the kernel's requests are served).
pub(super) fn start<B: Backend>(
    fs: &Arc<Fs<B>>,
    mountpoint: &std::path::Path,
    rt: &tokio::runtime::Runtime,
) {
    let _ = fs.nodes.follow.mountpoint.set(mountpoint.to_path_buf());
    let first = rt.block_on(async {
        tokio::time::timeout(FIRST_CURSOR, fs.backend.changes(None, Duration::ZERO)).await
    });
    let fs = fs.clone();
    rt.spawn(async move {
        match first {
            Ok(Ok(None)) => poll(fs).await,
            Ok(Ok(Some(page))) => {
                fs.nodes.freshness.following.store(true, Ordering::Relaxed);
                follow(fs, Some(page.cursor)).await;
            }
            // Not now (the server away, slow): from a cursor taken later, dropping what was
            // cached before it.
            _ => follow(fs, None).await,
        }
    });
}

async fn follow<B: Backend>(fs: Arc<Fs<B>>, mut cursor: Option<u64>) {
    let mut retry = Retry::default();
    // The built-in store's count of other processes' commits, as last seen.
    let mut foreign = None;
    loop {
        let wait = if cursor.is_some() {
            WAIT
        } else {
            Duration::ZERO
        };
        let wait = match (cursor, fs.backend.local()) {
            (Some(_), Some(local)) => {
                // The built-in store in this process: another process's commit (a mount or
                // `vaultfs serve` on the same folder) shows in its commit count, read from
                // shared memory; this process's own changes need no following.
                loop {
                    let now = local.foreign_changes();
                    if now != foreign || now.is_none() {
                        foreign = now;
                        break;
                    }
                    tokio::time::sleep(FOREIGN_LOOK).await;
                }
                Duration::ZERO
            }
            _ => wait,
        };
        match fs.backend.changes(cursor, wait).await {
            Ok(None) => {
                fs.nodes.freshness.following.store(false, Ordering::Relaxed);
                return poll(fs).await;
            }
            Ok(Some(page)) => {
                retry = Retry::default();
                if cursor.is_none() || page.reset {
                    // A new cursor (after a feed that lost ours, or none at start): what was
                    // cached before it may have missed changes.
                    if page.reset {
                        log::info!("change feed reset: dropping what is cached");
                    }
                    expire_all(&fs);
                } else {
                    apply(&fs, &page.changes).await;
                }
                cursor = Some(page.cursor);
                fs.nodes.freshness.following.store(true, Ordering::Relaxed);
                if page.more {
                    continue;
                }
            }
            Err(e) => {
                // Until it answers again, listings live for the listing TTL only; the changes
                // missed meanwhile come with the next page (or a reset).
                fs.nodes.freshness.following.store(false, Ordering::Relaxed);
                let d = match retry.failed(&e) {
                    Next::After(d) => d,
                    Next::SetAside => Duration::from_secs(60),
                };
                log::debug!("change feed: {e}; again in {d:?}");
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// Polls what the user has open or listed lately, every `--poll-interval` (0: never).
async fn poll<B: Backend>(fs: Arc<Fs<B>>) {
    let every = fs.opts.poll_interval;
    if every.is_zero() {
        return;
    }
    log::info!("the server has no change feed: polling recent folders every {every:?}");
    fs.nodes.follow.polling.store(true, Ordering::Relaxed);
    loop {
        tokio::time::sleep(every).await;
        if fs.offline.now() {
            continue;
        }
        let mut dirs: BTreeSet<Ino> = {
            let mut used = relock(&fs.nodes.follow.used);
            used.retain(|_, at| at.elapsed() < RECENT);
            used.keys().copied().collect()
        };
        let files: Vec<Ino> = fs
            .handles()
            .values()
            .filter_map(|h| match h {
                super::Handle::File { ino, .. } => Some(*ino),
                super::Handle::Dir { .. } => None,
            })
            .collect();
        fs.nodes.read(|t| {
            for ino in files {
                let parent = t.get(ino).and_then(|i| i.path.parent());
                if let Some(p) = parent.and_then(|p| t.ino_of(&p)) {
                    dirs.insert(p);
                }
            }
            dirs.retain(|d| {
                t.get(*d)
                    .is_some_and(|i| !i.unlinked && i.listing().is_some())
            });
        });
        for dir in dirs {
            let Ok(path) = fs.dir_path(dir) else { continue };
            // Changed names and bytes reach the kernel from here (`refresh_listing`).
            if let Err(e) = fs.refresh_listing(dir, &path).await {
                log::debug!("polling {path}: {e:?}");
            }
        }
    }
}

/// Everything cached may be stale (a reset of the feed): listings and attributes are fetched
/// again at their next use, and the kernel forgets the attributes of every folder.
fn expire_all<B: Backend>(fs: &Fs<B>) {
    let Some(past) = fs.nodes.freshness.expired() else {
        return;
    };
    let dirs = fs.nodes.expire_all(past);
    notify(fs, dirs.into_iter().map(Kernel::Attrs).collect());
}

/// Nodes this mount is renaming or deleting, from before its request goes until after the
/// answer is in the table: the feed can bring the change back before the answer comes, and it
/// is this mount's own, not another writer's (`Table::changed_here_since`).
pub(super) struct Ours<'a, B: Backend> {
    fs: &'a Fs<B>,
    inos: Vec<Ino>,
    /// Names made by the change (a folder, a rename's destination): the feed's word of one
    /// that comes before the answer must not drop the kernel's entry, which the answer makes
    /// (`appeared`; a shell's new working folder came out unreachable: git's "unable to get
    /// current working directory").
    names: Vec<NodePath>,
}

impl<'a, B: Backend> Ours<'a, B> {
    pub(super) fn sending(fs: &'a Fs<B>, inos: Vec<Ino>) -> Self {
        Self::sending_to(fs, inos, Vec::new())
    }

    /// The same, for a change that makes the names `names`.
    pub(super) fn sending_to(fs: &'a Fs<B>, inos: Vec<Ino>, names: Vec<NodePath>) -> Self {
        fs.nodes.sending(&inos, &names);
        Ours { fs, inos, names }
    }
}

impl<B: Backend> Drop for Ours<'_, B> {
    fn drop(&mut self) {
        self.fs.nodes.answered(&self.inos, &self.names);
    }
}

/// A removal of the follower's own through the mount (`Follow::echo_remove`): the node, its
/// path and whether a folder.
#[derive(Clone)]
pub(super) struct Echo {
    pub(super) ino: Ino,
    pub(super) path: NodePath,
    pub(super) dir: bool,
}

impl Follow {
    /// Whether UNLINK or RMDIR of `name` in `parent` is the follower's own (answered at once:
    /// the node is gone from the store already, and from the table).
    pub(super) fn is_echo(&self, parent: Ino, name: &str) -> bool {
        relock(&self.echo)
            .remove(&(parent, name.to_string()))
            .is_some()
    }

    /// The node a removal of the follower's own is on its way to (`None`: not one, or a lookup
    /// by another process than the removal's child `pid`): what that LOOKUP answers.
    pub(super) fn echo_of(&self, parent: Ino, name: &str, pid: u32) -> Option<Echo> {
        if !relock(&self.echo_children).contains(&pid) {
            return None;
        }
        relock(&self.echo).get(&(parent, name.to_string())).cloned()
    }

    /// Removes the paths through the mount (`echo`), each answered by `is_echo`: the kernel
    /// then drops its entry and tells watchers (`IN_DELETE`), which no notification does
    /// (Linux 6.18's `FUSE_NOTIFY_DELETE` drops the entry with `d_delete`, which tells no
    /// watcher). Whether each went that way.
    fn echo_remove(&self, root: &NodePath, gone: &[(Ino, Ino, NodePath, bool)]) -> Vec<bool> {
        let Some(mnt) = self.mountpoint.get() else {
            return vec![false; gone.len()];
        };
        let mut local = Vec::new();
        let mut keys = Vec::new();
        // Which of `gone` are under the mount's root (and so in `local`, in order).
        let mut inside = Vec::with_capacity(gone.len());
        for (parent, ino, path, dir) in gone {
            let name = path.name().filter(|_| root.contains(path) && path != root);
            inside.push(name.is_some());
            let Some(name) = name else { continue };
            let mut p = mnt.clone();
            for seg in &path.segments()[root.depth()..] {
                p.push(seg);
            }
            let echo = Echo {
                ino: *ino,
                path: path.clone(),
                dir: *dir,
            };
            keys.push(((*parent, name.to_string()), echo));
            local.push((p, *dir));
        }
        relock(&self.echo).extend(keys.iter().cloned());
        let mut child = None;
        let removed = super::echo::remove_all(&local, |pid| {
            child = Some(pid);
            relock(&self.echo_children).insert(pid);
        });
        if let Some(pid) = child {
            relock(&self.echo_children).remove(&pid);
        }
        // Not reached where it failed (the kernel had no entry: it looked the name up, and it
        // is gone).
        let mut echo = relock(&self.echo);
        for (k, _) in &keys {
            echo.remove(k);
        }
        drop(echo);
        let mut went = removed.into_iter();
        inside
            .into_iter()
            .map(|inside| inside && went.next().unwrap_or(false))
            .collect()
    }
}

pub(super) fn notify<B: Backend>(fs: &Fs<B>, mut what: Vec<Kernel>) {
    let Some(n) = fs.notifier.get().cloned() else {
        return;
    };
    if what.is_empty() {
        return;
    }
    // Removals first: an entry dropped before (a create and a delete of one name in a page)
    // would leave the kernel nothing to remove, and watchers no event.
    what.sort_by_key(|k| !matches!(k, Kernel::Delete(..)));
    let follow = fs.nodes.follow.clone();
    let root = fs.opts.root.clone();
    // Outside any request: the kernel may wait on one of ours while handling a notification.
    tokio::task::spawn_blocking(move || {
        let gone: Vec<_> = what
            .iter()
            .filter_map(|k| match k {
                Kernel::Delete(p, ino, path, dir) => Some((*p, *ino, path.clone(), *dir)),
                _ => None,
            })
            .collect();
        let mut echoed = follow.echo_remove(&root, &gone).into_iter();
        for k in what {
            let r = match &k {
                Kernel::Entry(p, name) => n.inval_entry(INodeNo(*p), OsStr::new(name)),
                Kernel::Delete(p, c, path, _) => {
                    if echoed.next().unwrap_or(false) {
                        Ok(())
                    } else {
                        log::debug!("{path}: not removed through the mount, the kernel told");
                        let name = OsStr::new(path.name().unwrap_or_default());
                        n.delete(INodeNo(*p), INodeNo(*c), name)
                            .or_else(|_| n.inval_entry(INodeNo(*p), name))
                    }
                }
                Kernel::Attrs(i) => n.inval_inode(INodeNo(*i), -1, 0),
            };
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    log::debug!("kernel notification failed: {e}");
                }
            }
        }
    });
}

/// Applies one page of changes.
async fn apply<B: Backend>(fs: &Arc<Fs<B>>, changes: &[Change]) {
    let Some(past) = fs.nodes.freshness.expired() else {
        return;
    };
    let mut effects = Effects::default();
    let mut learned = Vec::new();
    // Where the page makes a folder (created, moved or copied there), and its last change
    // that does: a folder deleted before that is made again by the end of the page.
    let mut folder_made = HashMap::new();
    for (n, c) in changes.iter().enumerate() {
        let made = matches!(
            c.kind,
            ChangeKind::Created | ChangeKind::Moved | ChangeKind::Copied
        );
        if made && c.node_type != NodeType::FileNodeType {
            if let Ok(p) = NodePath::parse_uri(&c.uri) {
                folder_made.insert(p, n);
            }
        }
    }
    for (n, c) in changes.iter().enumerate() {
        let Ok(path) = NodePath::parse_uri(&c.uri) else {
            continue;
        };
        let again = |p: &NodePath| folder_made.get(p).is_some_and(|&m| m > n);
        learned.push(path.clone());
        let from = c
            .from_uri
            .as_deref()
            .and_then(|u| NodePath::parse_uri(u).ok());
        // When it happened, on this machine's clock (the server's, on loopback).
        let at = crate::api::parse_time(&c.at)
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .and_then(|ago| Instant::now().checked_sub(ago))
            .unwrap_or_else(Instant::now);
        let told = Told {
            c,
            path: &path,
            from: from.as_ref(),
            at,
            again: &again,
        };
        fs.nodes.changed_elsewhere(told, past, &mut effects);
    }
    let Effects {
        kernel,
        refetch,
        relist,
    } = effects;
    for k in &kernel {
        if let Kernel::Delete(_, ino, path, dir) = k {
            fs.thumbnails_gone(*ino, path, *dir);
        }
    }
    notify(fs, kernel);
    for (dir, path) in relist {
        // Its entries gone elsewhere leave the kernel from here (`refresh_listing`).
        match fs.refresh_listing(dir, &path).await {
            Ok(()) => {}
            // Gone after all (seen there while its delete was being committed): as any other.
            Err(e) if e.errno() == fuser::Errno::ENOENT => {
                let Some(pino) = fs.nodes.folder_gone_elsewhere(dir, &path) else {
                    continue;
                };
                log::debug!("{path}: gone elsewhere");
                fs.thumbnails_gone(dir, &path, true);
                notify(
                    fs,
                    vec![Kernel::Delete(pino, dir, path, true), Kernel::Attrs(pino)],
                );
            }
            Err(e) => log::debug!("listing {path} again: {e:?}"),
        }
    }
    for (ino, path) in refetch {
        let before = fs.nodes.remote(ino);
        // Tells the kernel itself when the bytes changed (`inval_inode` of the pages).
        let _ = fs.refresh_attr(ino, &path).await;
        let after = fs.nodes.remote(ino);
        if let (Some(b), Some(a)) = (before, after) {
            if b.md5 != a.md5 || b.size != a.size {
                // The old version's cached bytes will not be read again.
                fs.reads.cache.invalidate(&b.id);
            } else {
                notify(fs, vec![Kernel::Attrs(ino)]);
            }
        }
    }
    // What pinned folders hold is fetched again (`pinned`).
    for path in &learned {
        fs.pins_learned(path);
    }
}
