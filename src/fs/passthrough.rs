//! FUSE passthrough: an open file whose bytes are whole on local disk (the built-in store's
//! blob, a complete read-cache file) is handed to the kernel, which then reads it (and maps it)
//! without asking the daemon. A file created or truncated through the mount is handed over with
//! its staging file, which the kernel then writes itself (`io::kernel_writer`; what that asks of
//! the staged file's life is in `staging`, "kernel writers").
//!
//! The kernel binds one backing file to an inode while any passthrough open of it lasts: every
//! other open of that inode must be a passthrough open of the same backing file, or it fails
//! with EIO (and a passthrough open of an inode open the plain way fails too). So:
//!
//! - an inode with passthrough opens shares their backing file with readers of the same
//!   version; it never gets a plain open nor a staged copy (`Inode::pt`, a
//!   `table::Backing`; `Inode::plain_pending`);
//! - an open that needs something else (a writer, a reader of a newer version) moves the name to
//!   a new inode ([`super::table::Table::reissue`]) and answers ESTALE: the kernel looks the
//!   name up again and opens the new inode (open(2) retries once on ESTALE). The readers keep
//!   the old inode and the version they opened, like readers of a file replaced by a rename.
//!
//! Fallback: a kernel without passthrough, a daemon without CAP_SYS_ADMIN (the kernel refuses
//! the backing file), `--no-passthrough`, macOS: every open is served the plain way.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use fuser::BackingId;

use super::cache::CachedFile;
use super::table::Remote;
use crate::sync::relock;

/// Registers an open file with the kernel as a backing file (`ReplyOpen::open_backing`).
pub(crate) type Register<'a> = dyn Fn(BorrowedFd<'_>) -> io::Result<BackingId> + Sync + 'a;

/// Blob paths remembered at most (a reopen of one of them needs no store query).
const PATHS: usize = 1 << 16;

/// The mount's passthrough state.
pub(super) struct Passthrough {
    on: AtomicBool,
    /// Why reads go through the daemon, when they do.
    why_off: Mutex<String>,
    /// Blob paths by version key.
    paths: Mutex<HashMap<String, PathBuf>>,
}

/// Where a version's bytes are whole on local disk.
pub(super) enum Source {
    File(File),
    /// A complete read-cache file, and its descriptor (open while the source is).
    CachedFile(Arc<CachedFile>, Arc<File>),
    /// A staged file, which the kernel writes too (its handles hold it).
    Staged(Arc<File>),
}

impl Source {
    pub(super) fn file(&self) -> &File {
        match self {
            Source::File(f) => f,
            Source::CachedFile(_, f) | Source::Staged(f) => f,
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.file().as_fd()
    }

    /// What the backing file made of this source keeps alive while it is open: a read-cache
    /// file is never evicted meanwhile.
    pub(super) fn keep(&self) -> Option<Arc<dyn Send + Sync>> {
        match self {
            Source::CachedFile(e, _) => Some(e.clone() as Arc<dyn Send + Sync>),
            Source::File(_) | Source::Staged(_) => None,
        }
    }
}

/// The key of a file's version (None: no md5 to tell versions apart).
pub(super) fn key(r: &Remote) -> Option<String> {
    r.md5.as_ref().map(|m| format!("{}-{m}-{}", r.id, r.size))
}

impl Passthrough {
    /// Off until the kernel offers it at INIT; `why` says why until then.
    pub(super) fn new(why: &str) -> Passthrough {
        Passthrough {
            on: AtomicBool::new(false),
            why_off: Mutex::new(why.to_string()),
            paths: Mutex::default(),
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// `Ok`: the kernel serves whole local files; `Err(why)`: reads go through the daemon.
    pub(super) fn set(&self, r: Result<(), String>) {
        match r {
            Ok(()) => self.on.store(true, Ordering::Relaxed),
            Err(why) => {
                self.on.store(false, Ordering::Relaxed);
                *relock(&self.why_off) = why;
            }
        }
    }

    /// What `vaultfs status` and the mount's log say about reads.
    pub(super) fn describe(&self) -> String {
        if self.on() {
            "passthrough (the kernel reads whole local files itself)".into()
        } else {
            let why = relock(&self.why_off);
            format!("through the daemon ({why})")
        }
    }

    /// The blob of a version, opened by the path the store gave for it before.
    pub(super) fn reopen(&self, key: &str, size: u64) -> Option<File> {
        let path = relock(&self.paths).get(key).cloned()?;
        // Removed since (the version deleted): the store is asked again.
        let f = File::open(&path).ok()?;
        (f.metadata().ok()?.len() == size).then_some(f)
    }

    pub(super) fn remember(&self, key: &str, path: PathBuf) {
        let mut paths = relock(&self.paths);
        if paths.len() >= PATHS {
            paths.clear();
        }
        paths.insert(key.to_string(), path);
    }

    /// A backing file for `source`, or None (passthrough switched off) when the kernel refuses
    /// it: without CAP_SYS_ADMIN it always will.
    pub(super) fn register(&self, source: &Source, register: &Register<'_>) -> Option<BackingId> {
        match register(source.fd()) {
            Ok(id) => Some(id),
            Err(e) => {
                if self.on.swap(false, Ordering::Relaxed) {
                    let why = match e.raw_os_error() {
                        Some(libc::EPERM) => "the kernel refused a backing file: not privileged \
                                              (passthrough needs CAP_SYS_ADMIN)"
                            .to_string(),
                        _ => format!("the kernel refused a backing file: {e}"),
                    };
                    log::warn!("reads go through the daemon from now on: {why}");
                    self.set(Err(why));
                }
                None
            }
        }
    }
}

/// Whether this process may register backing files (CAP_SYS_ADMIN in its effective set).
pub(super) fn privileged() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}
