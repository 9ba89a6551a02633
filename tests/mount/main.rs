//! The mount on the built-in store, used the way people use folders: std::fs, cp, diff, mv, rm,
//! shell appends, git, editors' atomic saves; remounts and a SIGKILLed daemon.
//!
//! One binary (see Cargo.toml's note on test binaries), its tests by concern in the modules
//! below: `namespace` (names, folders, links, errors), `io` (the bytes of files), `crash`
//! (outages, killed daemons and servers, remounts), `caches` (what the mount keeps and how it
//! learns of changes), `options` (mount options, the config file, the mount's source),
//! `versions` (the `.versions/` tree), `model` (random writers checked against a reference
//! model). The helpers more than one of them uses are here.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod caches;
mod conflicts;
mod crash;
mod descriptors;
mod follow;
mod io;
mod link;
mod model;
mod namespace;
mod offline;
mod options;
mod pinned;
mod versions;
mod webdav;

use std::fs;
use std::path::Path;

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// Bytes of the files in a directory (what the read cache holds on disk).
/// Disk used by the files under `dir` (allocated blocks, so holes count for nothing); 0 for
/// a folder not made yet.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(p, m)| {
            if m.is_dir() {
                allocated(&p)
            } else {
                m.blocks() * 512
            }
        })
        .sum()
}
