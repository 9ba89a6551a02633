//! Reads shaped for latency: a reader going through a folder's small files in listing order
//! (`cat *`, `grep -r`, a file manager sniffing each file) finds the next ones fetched already,
//! where each would otherwise cost the reader a round trip.
//!
//! Two opens of files of one folder in listing order (the second at most [`SKIP`] names after
//! the first: a reader may pass over some) start it: the next [`AHEAD_FILES`] files of up to
//! [`SMALL`] bytes after the one opened, at most [`AHEAD_BYTES`] of them, are downloaded into the
//! read cache at once, in parallel; each further open in order moves that window on. An open
//! out of order (another folder, a name behind, a jump) ends the pattern and cancels the
//! downloads still running ahead of it. Larger files have their own read-ahead (`cache`), and a
//! store in this process needs none of this (its files are on local disk).

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::{Arc, Mutex};

use super::Fs;
use super::table::{Ino, InodeKind, Table};
use crate::backend::Backend;
use crate::sync::relock;

/// Files fetched ahead of the reader, and their bytes at most.
pub const AHEAD_FILES: usize = 16;
pub const AHEAD_BYTES: u64 = 8 << 20;
/// The largest file fetched whole ahead of its open.
pub const SMALL: u64 = 1 << 20;
/// Names a reader may pass over between two opens that still count as in order.
const SKIP: usize = 4;

/// The pattern being followed, and the downloads it started (by name: listing order).
#[derive(Default)]
pub struct Prefetch {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    dir: Option<Ino>,
    last: String,
    ahead: BTreeMap<String, tokio::task::AbortHandle>,
}

impl State {
    /// Ends the pattern: downloads still running are cancelled.
    fn reset(&mut self, dir: Option<Ino>, name: &str) {
        for (_, task) in std::mem::take(&mut self.ahead) {
            task.abort();
        }
        self.dir = dir;
        self.last = name.to_string();
    }
}

/// A file to fetch: its name, ID, md5 and size.
type Next = (String, String, Option<String>, u64);

/// An OPEN for reading of `ino`: follows the pattern, starts or moves the window, or ends it.
pub fn opened<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) {
    if fs.backend.local().is_some() {
        return;
    }
    let Some((dir, name, next)) = next_files(fs, ino) else {
        return;
    };
    let mut st = relock(&fs.reads.prefetch.state);
    let in_order = st.dir == Some(dir)
        && name > st.last
        && passed_over(fs, dir, &st.last, &name).is_some_and(|n| n <= SKIP);
    if !in_order {
        st.reset(Some(dir), &name);
        return;
    }
    st.last = name.clone();
    // What the reader reached is its own now (a download of it still running goes on).
    st.ahead = st.ahead.split_off(&name);
    st.ahead.remove(&name);
    for (n, id, md5, size) in next {
        if st.ahead.contains_key(&n) || fs.reads.cache.complete(&id, md5.as_deref()).is_some() {
            continue;
        }
        let fs2 = fs.clone();
        let task = fs.rt.spawn(async move {
            let e = match fs2.reads.cache.entry(&id, md5.as_deref(), size) {
                Ok(e) => e,
                Err(err) => return log::debug!("prefetch of {id}: {err}"),
            };
            if let Err(err) = e.fetch_all(fs2.backend.as_ref()).await {
                log::debug!("prefetch of {id}: {err}");
            }
        });
        st.ahead.insert(n, task.abort_handle());
    }
}

/// The folder of `ino`, its name, and the files after it in the folder's listing that are
/// fetched ahead (within the bounds), from the listing the mount holds.
fn next_files<B: Backend>(fs: &Fs<B>, ino: Ino) -> Option<(Ino, String, Vec<Next>)> {
    fs.nodes.read(|t| next_files_in(t, ino))
}

/// `next_files` from the table `t`.
fn next_files_in(t: &Table, ino: Ino) -> Option<(Ino, String, Vec<Next>)> {
    let path = t.get(ino)?.path.clone();
    let name = path.name()?.to_string();
    let dir = t.ino_of(&path.parent()?)?;
    let (_, names) = t.get(dir)?.listing()?;
    let mut next = Vec::new();
    let mut bytes = 0;
    for (n, &i) in names.range::<str, _>((Excluded(name.as_str()), Unbounded)) {
        if next.len() >= AHEAD_FILES {
            break;
        }
        let Some(inode) = t.get(i) else { continue };
        let Some(r) = inode.remote.as_ref() else {
            continue;
        };
        if inode.kind != InodeKind::File || inode.staged.is_some() || r.size > SMALL {
            continue;
        }
        if bytes + r.size > AHEAD_BYTES {
            break;
        }
        bytes += r.size;
        next.push((n.clone(), r.id.clone(), r.md5.clone(), r.size));
    }
    Some((dir, name, next))
}

/// How many names of `dir`'s listing lie between `from` and `to` (`None`: no listing).
fn passed_over<B: Backend>(fs: &Fs<B>, dir: Ino, from: &str, to: &str) -> Option<usize> {
    fs.nodes.inode(dir, |d| {
        let (_, names) = d.listing()?;
        let between = names.range::<str, _>((Excluded(from), Excluded(to)));
        Some(between.take(SKIP + 1).count())
    })?
}
