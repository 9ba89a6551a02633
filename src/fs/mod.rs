//! The mount: a FUSE filesystem over any [`Backend`] (docs/design.md §3).
//!
//! - `fuse`: the kernel's requests, converted and answered (fuser's `Filesystem`); the logic it
//!   calls returns typed results and never sees a reply, so tests call it without a mount:
//!   `listing` (listings, LOOKUP, GETATTR, READDIR), `namespace` (mkdir, create, unlink, rename,
//!   setattr, xattrs), `io` (open, read, write, release, fsync);
//! - `table`: inodes, attributes (and those kept here for a backend that keeps none), cached
//!   listings, a file's staged copy and passthrough backing file; at the bottom, it imports
//!   nothing of the modules around it; `nodes`: the table with its refreshes and follower;
//!   `errno`: the one error table;
//! - `staging`: write staging files, and the staged file's life (`staging/state.rs`: its
//!   states and which step may be taken from where; `staging/lifecycle.rs`: every step from
//!   open to retired, removed or renamed, as the mount takes it) with the one retry policy of
//!   uploads; `journal`: the upload journal; `upload`: the uploads part, the one place a file
//!   is scheduled (file by file, or for a batch where the backend is a store in this process,
//!   `LocalStore`: `writeback`, around its queue); the uploaders send and leave every change
//!   of a staged file's state to `lifecycle`;
//! - `descriptors`: the mount's own files opened when used, their open descriptors bounded;
//! - `cache`: the read cache; `reads`: the cache with the parts that use it; `virtual_dirs`: the virtual folders of every folder (`.preview`,
//!   `.versions`, `.search`, `.sh_thumbnails`: one module each behind one trait) and the router
//!   the request logic asks about virtual inodes and names, above the inode table and the read
//!   cache; `virtual_names`: their names and inode bits, at the bottom, for the modules below
//!   them; `markers`: the files that keep desktop indexers out; `space`: the account's quota
//!   as `df` shows it; `attrs`: times and modes kept; `freshness`: whether what was fetched may
//!   still be used; `follow`: changes made elsewhere (the backend's change feed, else polling)
//!   dropped from the caches; `passthrough`: opens the kernel reads from a local file itself;
//!   `pinned`: files and folders kept whole on disk (`vaultfs pin`); `thumbnails`: file
//!   managers' thumbnails of stored files, made from their previews.
//!
//! # Parts
//!
//! [`Fs`] holds what every request needs (the backend, the runtime, the options, the owner
//! shown, the kernel's notifier) and one part per concern, each a type of the module that
//! owns the concern, with its own fields (and methods where they touch that part only):
//!
//! - `nodes` (`nodes::Nodes`): the inode table, the refreshes of listings and attributes under
//!   way, whether what was fetched may still be used, the follower of changes made elsewhere;
//! - `handles` (`open::Handles`): open handles, the next number, those running a program;
//! - `reads` (`reads::Reads`): the read cache, prefetching, pins, passthrough, the kernel's
//!   read-ahead, and the READ and WRITE requests the daemon answered;
//! - `journal` (`journal::Journal`): the staged files that wait for upload, across restarts;
//! - `uploads` (`upload::Uploads`): uploads running, their window, the batch queue, the
//!   journal's hand-over to a new daemon, and what `vaultfs status` shows of them;
//! - `deletes` (`deletes::Deletes`): unlinks answered whose deletes are still to be sent;
//! - `conflicts` (`conflict::Conflicts`): conflict copies made;
//! - `offline` (`offline::Offline`): the tree kept for starting offline, and since and until
//!   when the backend is out of reach;
//! - `virtual_dirs` (`virtual_dirs::VirtualDirs`): the virtual nodes handed to the kernel and
//!   what each virtual folder keeps (preview metadata, version lists, search answers);
//! - `space` (`space::Space`): the account's use and quota as last asked.
//!
//! The logic of requests is `impl Fs` in the modules above, each reaching the parts it needs.
//!
//! Requests that need the backend run as tokio tasks and reply when done, so a slow call never
//! stalls unrelated operations; writes and reads of staged or cached bytes are answered on the
//! FUSE threads directly.
//!
//! # Locks
//!
//! Taken in this order only (a lock may be taken while holding one above it, never one below):
//!
//! 1. a file's `io` (`Inode::io`, async, held across backend calls): uploads and namespace
//!    changes of one node, one at a time; two at once only in inode order (rename);
//! 2. the write-back queue (`Uploads::writeback`, `writeback::queue`);
//! 3. the `uploading` set (`Uploads::uploading`);
//! 4. the inode table (`Nodes::table`; the attributes kept here live inside it), taken only by
//!    the table's own steps (`nodes`) and the staged file's (`staging/lifecycle`): a unit test
//!    in `src/layers.rs` fails on it taken elsewhere;
//! 5. a staged file's own: `order` (writes, truncates, seals) before its hashing-ahead state
//!    (whose hasher it may wait for); its journal state before the journal's log; its data,
//!    mtime and life (`state::State`) locks are innermost;
//! 6. the read cache's index (`Reads::cache`), then a cache entry's `present` set (an
//!    entry's async `fetching` is taken with none of the locks above held);
//! 7. `Nodes::freshness` (under the table; it asks the backend for its count of others' changes,
//!    which never waits: the built-in store only tries its connection's lock).
//!
//! The handle maps (`Fs::handles`), the refreshes under way (`Nodes::refreshing`,
//! `Nodes::attr_refreshing`), `Offline::until`, the virtual folders' locks
//! (`VirtualDirs`: their nodes, and what each folder keeps), the account's use (`Space`), the
//! pending deletes' queue (`Deletes`) and the status tracker's locks (`Uploads::tracker`) are
//! taken alone: nothing else is locked while
//! one is held, nor taken under it. The pins' locks (`Reads::pinned`) and the thumbnails' queue
//! (`Thumbnails::state`) are innermost: taken under any of the above, nothing under them. So is
//! the descriptor pool's (`descriptors::Pool`), with a lazily opened file's slot under it. No
//! std lock is held across an `.await`.

mod attrs;
mod cache;
mod conflict;
mod deletes;
mod descriptors;
mod echo;
mod error;
mod follow;
mod freshness;
mod fuse;
mod history;
mod io;
mod journal;
mod listing;
mod markers;
mod namespace;
mod nodes;
pub mod offline;
mod open;
mod pacing;
mod passthrough;
mod pinned;
mod prefetch;
mod read_ahead;
mod reads;
mod space;
mod spares;
mod staging;
pub mod status;
mod table;
#[cfg(test)]
mod tests;
mod thumbnails;
pub mod unmount;
mod upload;
mod virtual_dirs;
mod virtual_names;
mod writeback;
mod xattrs;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::Duration;

use fuser::{Config, MountOption, Notifier, SessionACL};

use crate::api::NodePath;
use crate::backend::Backend;
use cache::ReadCache;
use journal::Journal;
use staging::Staged;
use table::{Ino, Table};

/// The source as a mount option can carry it: the kernel's option string splits at commas and
/// tools split `/proc/mounts` at white space, so those become `_`.
fn mount_source(source: &str) -> String {
    let s: String = source
        .chars()
        .map(|c| {
            if c == ',' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if s.is_empty() { "vaultfs".into() } else { s }
}

/// How long an unmounted daemon asked for its journal lets what it is storing finish (the new
/// daemon waits for it longer: `cli::owner`).
const HANDOVER_FINISH: Duration = Duration::from_secs(5);

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The backend path shown at the mount point (`/nodes/pth` by default).
    pub root: NodePath,
    pub read_only: bool,
    /// Let other users (and root) into the mount (needs `user_allow_other` for non-root).
    pub allow_other: bool,
    /// Staging files, the upload journal and the read cache; one per backend.
    pub cache_dir: PathBuf,
    /// Bound of the read cache, in bytes.
    pub cache_size: u64,
    /// How long the kernel may keep attributes and entries.
    pub attr_ttl: Duration,
    /// How long a directory listing is reused before it is fetched again.
    pub dir_ttl: Duration,
    /// FUSE event-loop threads.
    pub threads: usize,
    /// Uploads in flight at first (the window then adapts: `pacing`).
    pub upload_concurrency: usize,
    /// How long an unmount waits for pending uploads before leaving them to the journal.
    pub flush_timeout: Duration,
    /// The mount's source as `/proc/mounts`, `df` and `findmnt -S` show it: `vaultfs` for the
    /// default store, `local:DIR` for another, the server's URL for a remote one.
    pub source: String,
    /// The largest file the backend takes: writing past it is EFBIG.
    pub max_file_size: u64,
    /// Pass opens of files whole on local disk through to the kernel where it allows it.
    pub passthrough: bool,
    /// With passthrough: the kernel writes files created or truncated through the mount to
    /// their staging files itself.
    pub kernel_writes: bool,
    /// The kernel's read-ahead for the mount in KiB: None decides by the way reads go
    /// (`read_ahead`), 0 keeps the kernel's.
    pub read_ahead_kb: Option<u32>,
    /// Without a change feed: how often folders used lately are listed again (`follow`);
    /// zero never.
    pub poll_interval: Duration,
    /// The backend was out of reach at start: show the tree kept in the cache dir (`offline`).
    pub start_offline: bool,
    /// Let desktop indexers in: no `.trackerignore` and `.nomedia` at the root (`markers`).
    pub allow_indexing: bool,
    /// The shared thumbnail cache (`$XDG_CACHE_HOME/thumbnails`) the mount writes file
    /// managers' thumbnails of listed files into (`thumbnails`); None: none written.
    pub thumbnails: Option<PathBuf>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            root: NodePath::root(),
            read_only: false,
            allow_other: false,
            cache_dir: PathBuf::from("/tmp/vaultfs-cache"),
            cache_size: 2 << 30,
            attr_ttl: Duration::from_secs(1),
            dir_ttl: Duration::from_secs(10),
            threads: 4,
            upload_concurrency: 16,
            flush_timeout: Duration::from_secs(30),
            source: "vaultfs".into(),
            max_file_size: 1 << 40,
            passthrough: true,
            read_ahead_kb: None,
            kernel_writes: true,
            poll_interval: Duration::from_secs(10),
            start_offline: false,
            allow_indexing: false,
            thumbnails: None,
        }
    }
}

/// One open file or directory.
enum Handle {
    File {
        ino: Ino,
        staged: Option<Arc<Staged>>,
        /// A writer whose writes the kernel makes itself, to the staged file (passthrough).
        kernel: bool,
    },
    Dir {
        entries: Vec<(Ino, fuser::FileType, String)>,
        /// Some of `entries` were read: a read from offset 0 again (rewinddir) lists the
        /// folder afresh.
        read: bool,
        /// The folder's time when `entries` were taken: changed since (a name added after
        /// `opendir`), a read from offset 0 lists it afresh too.
        taken: Option<std::time::SystemTime>,
    },
}

/// What the logic of a request returns: its result, or the errno the kernel gets.
pub(crate) type OpResult<T> = Result<T, error::Error>;

/// The filesystem's state, shared by the FUSE threads and the tasks they start.
pub(crate) struct Fs<B: Backend> {
    backend: Arc<B>,
    rt: tokio::runtime::Handle,
    opts: MountOptions,
    /// The owner the nodes show: the user the daemon runs as.
    uid: u32,
    gid: u32,
    /// Invalidates what the kernel caches, once mounted.
    notifier: OnceLock<Notifier>,
    /// The inode table and what keeps it fresh (`nodes::Nodes`).
    nodes: nodes::Nodes,
    /// Open handles (`open::Handles`).
    handles: open::Handles,
    /// The read cache and how reads reach it (`reads::Reads`).
    reads: reads::Reads,
    /// The staged files' upload journal (`journal::Journal`).
    journal: Journal,
    /// The uploads: running, paced, batched, handed over (`upload::Uploads`).
    uploads: upload::Uploads,
    /// Unlinks answered whose deletes are still to be sent (`deletes::Deletes`).
    deletes: deletes::Deletes,
    /// Conflict copies made (`conflict::Conflicts`).
    conflicts: conflict::Conflicts,
    /// The tree kept for starting offline, and since and until when the backend is out of
    /// reach (`offline::Offline`).
    offline: offline::Offline,
    /// The virtual folders of every folder (`virtual_dirs::VirtualDirs`).
    virtual_dirs: virtual_dirs::VirtualDirs,
    /// The account's use and quota, for `df` (`space::Space`).
    space: space::Space,
    /// Thumbnails queued and made for file managers (`thumbnails::Thumbnails`).
    thumbnails: thumbnails::Thumbnails,
}

impl<B: Backend> Fs<B> {
    /// The file system's state over `backend`, with its uploaders running and what an earlier
    /// run left in the journal queued; not mounted (`mount` does that, and sets the kernel's
    /// notifier then: without one, nothing is invalidated in a kernel).
    pub(crate) fn start(
        backend: B,
        opts: MountOptions,
        rt: tokio::runtime::Handle,
    ) -> std::io::Result<Arc<Self>> {
        private_dir(&opts.cache_dir)?;
        // sha256 only where the store that names blobs by it takes whole files (`put_files`).
        let local = backend.local().is_some();
        let journal = Journal::open(&opts.cache_dir, opts.max_file_size, local)?;
        let cache = ReadCache::open(opts.cache_dir.join("cache"), opts.cache_size)?;
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut table = Table::new(opts.root.clone());
        let kept = opts.cache_dir.join("attrs");
        private_dir(&kept)?;
        table.kept = table::KeptHere::load(&kept)?;
        let conflicts = conflict::Conflicts::open(&opts.cache_dir)?;
        let backend = Arc::new(backend);
        let others = backend.clone();
        // The built-in store's count of others' changes (`Freshness::fresh`); none elsewhere.
        let foreign = Box::new(move || others.local()?.foreign_changes());
        let fs = Arc::new(Fs {
            backend,
            rt,
            nodes: nodes::Nodes::new(table, opts.dir_ttl, foreign),
            handles: open::Handles::new(),
            reads: reads::Reads {
                cache,
                prefetch: prefetch::Prefetch::default(),
                pinned: pinned::Pinned::open(&opts.cache_dir),
                passthrough: passthrough::Passthrough::new(if opts.passthrough {
                    "the kernel did not offer passthrough"
                } else {
                    "switched off: --no-passthrough"
                }),
                counts: reads::Counts::default(),
                last_read: reads::LastRead::new(),
            },
            journal,
            uid,
            gid,
            uploads: upload::Uploads::new(opts.upload_concurrency),
            deletes: deletes::Deletes::default(),
            notifier: OnceLock::new(),
            offline: offline::Offline::open(&opts.cache_dir)?,
            opts,
            conflicts,
            virtual_dirs: virtual_dirs::VirtualDirs::default(),
            space: space::Space::default(),
            thumbnails: thumbnails::Thumbnails::default(),
        });
        if fs.opts.start_offline {
            fs.restore_snapshot();
        }
        offline::start(&fs);
        // Known before the first `df`.
        fs.refresh_usage();
        pinned::start(&fs);
        // Idle until a file is queued: a server tells whether it takes batches in its answers,
        // which may come after this.
        writeback::start(&fs);
        deletes::start(&fs);
        upload::recover(&fs)?;
        Ok(fs)
    }

    fn handles(&self) -> MutexGuard<'_, HashMap<u64, Handle>> {
        self.handles.lock()
    }
}

/// A node's `io` lock (`Inode::io`), and another node's with it, taken in inode order: two at
/// once only so ("Locks", 1): two callers taking the same pair cannot each hold one and wait.
pub(super) async fn lock_io_in_order(
    (ino, io): (Ino, Arc<tokio::sync::Mutex<()>>),
    other: Option<(Ino, Arc<tokio::sync::Mutex<()>>)>,
) -> (
    tokio::sync::OwnedMutexGuard<()>,
    Option<tokio::sync::OwnedMutexGuard<()>>,
) {
    match other {
        Some((o, other)) if o < ino => {
            let first = other.lock_owned().await;
            (first, Some(io.lock_owned().await))
        }
        Some((_, other)) => {
            let first = io.lock_owned().await;
            (first, Some(other.lock_owned().await))
        }
        None => (io.lock_owned().await, None),
    }
}

/// Creates (or keeps) a directory only its owner can enter: the cache dir holds the names and
/// bytes of files waiting for upload.
pub(crate) fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// auto_unmount goes through fusermount3 (from fuse3), which allows the kernel's allow_other
/// for root, or for others when /etc/fuse.conf says `user_allow_other`.
fn auto_unmount_possible() -> bool {
    let has_fusermount = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()));
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let allowed = root
        || std::fs::read_to_string("/etc/fuse.conf")
            .is_ok_and(|c| c.lines().any(|l| l.trim() == "user_allow_other"));
    has_fusermount && allowed
}

/// Mounts `backend` at `mountpoint` and serves until unmounted (or SIGINT/SIGTERM).
/// `ready` is called once the kernel has accepted the mount (the FUSE threads start right after
/// it returns), with the [`status::Control`] of this mount.
/// Raises the process's soft limit of open files to its hard limit (before a mount: the
/// descriptor pool's bound is a share of it); the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    descriptors::raise_limit()
}

pub fn mount<B: Backend>(
    backend: B,
    mountpoint: &std::path::Path,
    opts: MountOptions,
    rt: &tokio::runtime::Runtime,
    ready: impl FnOnce(status::Control),
) -> std::io::Result<()> {
    crate::api::files::raise_open_file_limit();
    let fs = Fs::start(backend, opts.clone(), rt.handle().clone())?;
    // The name file managers give the files (taken before mounting: a look at the mount point
    // afterwards would ask this daemon, not serving yet).
    let absolute = std::fs::canonicalize(mountpoint)?;

    let mut options = vec![
        MountOption::FSName(mount_source(&opts.source)),
        MountOption::Subtype("vaultfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        // Access times are not kept (reads never reach the store as changes): said plainly,
        // as `/proc/mounts` shows it, instead of the kernel's default `relatime`.
        MountOption::NoAtime,
    ];
    if opts.read_only {
        options.push(MountOption::RO);
    }
    let mut config = Config::default();
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    if auto_unmount_possible() {
        // fusermount3 then cleans the mount up if this process dies, even by SIGKILL. It needs
        // the kernel's allow_other; fuser still lets only the owner (and root) in.
        options.push(MountOption::AutoUnmount);
        if config.acl == SessionACL::Owner {
            config.acl = SessionACL::RootAndOwner;
        }
    }
    config.mount_options = options;
    config.n_threads = Some(opts.threads.max(1));
    let mut session = fuser::Session::new(fuse::FuseAdapter(fs.clone()), mountpoint, &config)?;
    let _ = fs.notifier.set(session.notifier());
    follow::start(&fs, mountpoint, rt);
    if let Some(cache) = &opts.thumbnails {
        thumbnails::start(&fs, cache.clone(), absolute);
    }
    log::info!("mounted {} at {}", opts.root, mountpoint.display());
    let stop = Arc::new(tokio::sync::Notify::new());
    let (finished_tx, finished) = tokio::sync::watch::channel(None);
    let control = {
        let fs = fs.clone();
        let mp = mountpoint.display().to_string();
        let fs2 = fs.clone();
        status::Control {
            status: Arc::new(move || status::snapshot(&fs, &mp)),
            pin: Arc::new(move |rel, on| {
                fs2.pin_relative(rel, on).map_err(|e| e.reply("pin").code())
            }),
            stop: stop.clone(),
            finished,
        }
    };
    ready(control);
    {
        let (fs, mp) = (fs.clone(), mountpoint.to_path_buf());
        // Set once the kernel has taken the INIT answer, which would lower it again.
        std::thread::spawn(move || {
            let want = || match fs.opts.read_ahead_kb {
                None => read_ahead::default_kb(fs.reads.passthrough.on()),
                Some(0) => None,
                Some(kb) => Some(kb),
            };
            if let Some(granted) = read_ahead::set(&mp, want) {
                fs.reads.counts.read_ahead_granted(granted);
            }
        });
    }

    // A new daemon of this mount point asks for the journal with SIGUSR1 (see
    // `cli::mount::own_cache_dir`); handled from now on, honoured once unmounted.
    let mut handover = {
        let _guard = rt.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?
    };
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.to_path_buf();
    rt.spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = stop.notified() => {}
        }
        log::info!("unmounting {}", mp.display());
        if let Err(e) = unmounter.unmount() {
            log::warn!("unmount failed: {e}");
        }
        // fusermount3's auto-unmount may leave it mounted, and a busy mount refuses a plain
        // unmount: detach it then (it goes once its last user lets go).
        tokio::time::sleep(Duration::from_millis(200)).await;
        if unmount::is_vaultfs_mount(&mp) {
            if let Err(e) = unmount::detach(&mp) {
                log::error!("cannot unmount {}: {e}", mp.display());
            }
        }
    });
    let result = session.run();
    offline::save(&fs, true);
    fs.journal.shut_spares();
    // Unmounted: the deletes answered are sent first (an upload after them may need the name).
    // Those not sent in time leave their files on the store: nothing is lost.
    let deletes = fs.deletes.pending();
    if deletes > 0 {
        log::info!("sending {deletes} delete(s)");
        let sent = rt.block_on(tokio::time::timeout(opts.flush_timeout, fs.deletes_sent()));
        if sent.is_err() {
            log::warn!(
                "{} delete(s) not sent in time: those files stay on the store",
                fs.deletes.pending()
            );
        }
    }
    // Unmounted: give uploads in flight a bounded time to finish; the journal keeps the rest.
    // A new mount of the same point may come meanwhile: it asks for the journal (SIGUSR1),
    // and this daemon leaves at once, its batch in flight committed or not at all.
    let running = fs.uploads.running();
    if running > 0 {
        log::info!(
            "waiting up to {}s for {running} upload(s) to finish",
            opts.flush_timeout.as_secs()
        );
    }
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + opts.flush_timeout;
        while fs.uploads.running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = handover.recv() => {
                    // What is being stored finishes (and ends its journal entry), so the next
                    // daemon does not store it again; nothing new starts.
                    fs.uploads.hand_over(tokio::time::Instant::now() + HANDOVER_FINISH).await;
                    log::info!("a new mount of {} takes the journal over", mountpoint.display());
                    break;
                }
            }
        }
    });
    let pending = fs.journal.len();
    if pending > 0 {
        log::info!(
            "{pending} file(s) not yet uploaded stay in the journal; the next mount uploads them"
        );
    } else if running > 0 {
        log::info!("all uploads finished");
    }
    let pins_pending = fs.pins_pending(&mountpoint.display().to_string());
    for p in &pins_pending {
        log::info!("pinned, not yet on disk (the next mount fetches the rest): {p}");
    }
    let _ = finished_tx.send(Some(status::Shutdown {
        left_in_journal: pending,
        pins_pending,
    }));
    result
}
