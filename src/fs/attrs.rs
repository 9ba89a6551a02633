//! Attributes set through the mount (modification times from `touch`, `cp -p`, `tar x`,
//! `rsync -a`; the permission bits of a chmod), kept by the backend so that they outlive the
//! listing's TTL and a remount. A file with local changes carries them with its upload (the
//! staged file's time, the inode's bits); a stored file gets them alone
//! ([`Backend::set_attrs`]).
//!
//! A backend that does not keep them (the public service: it refuses the update alone and
//! answers a version with its own time) has them kept in the cache dir instead
//! (`table::KeptHere`), by file ID and content (md5): they hold until the file's content changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::TimeOrNow;

use super::Fs;
use super::error::is_transient;
use super::table::{Ino, Inode, InodeKind, KeptHere};
use crate::api::{FileAttrs, Node, Result, file_mode, whole_mode};
use crate::backend::Backend;

/// What a setattr leaves to do after the inode table has the new attributes.
pub(super) enum Keep {
    /// Nothing to store (atime only, a folder, nothing changed).
    Nothing,
    /// A staged file with no writer: its next upload carries them; start it.
    Settle(Arc<super::staging::Staged>),
    /// A stored file (ID, md5): set them on the backend.
    Send(String, Option<String>, FileAttrs),
}

impl<B: Backend> Fs<B> {
    /// Applies times and a mode to the inode (on the FUSE thread: no backend call) and says
    /// how they are to be kept.
    pub(super) fn set_attrs_here(
        &self,
        ino: Ino,
        (atime, mtime): (Option<TimeOrNow>, Option<TimeOrNow>),
        mode: Option<u32>,
    ) -> Keep {
        let when = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => from_kernel(t),
            TimeOrNow::Now => SystemTime::now(),
        };
        if mtime.is_none() && atime.is_none() && mode.is_none() {
            return Keep::Nothing;
        }
        let (atime, mtime) = (atime.map(when), mtime.map(when));
        (self.nodes)
            .inode_mut(ino, |i| set_here(i, atime, mtime, mode))
            .unwrap_or(Keep::Nothing)
    }

    /// Does what [`Fs::set_attrs_here`] left to do.
    pub(super) async fn keep_attrs(self: &Arc<Self>, ino: Ino, keep: Keep) {
        match keep {
            Keep::Nothing => {}
            Keep::Settle(staged) => self.settle(ino, &staged),
            Keep::Send(id, md5, attrs) => {
                // A listing fetched before the store has them must not put the old ones back
                // (two chmods in a row: the second came back as the first).
                let _ours = super::follow::Ours::sending(self, vec![ino]);
                if let Err(e) = store(self, &id, md5, attrs).await {
                    log::warn!("could not store the times or mode of file {id} ({e}): kept here");
                }
            }
        }
    }
}

/// A time of a SETATTR as the kernel meant it. fuser 0.18 reads a time before 1970, sent as
/// (negative seconds, nanoseconds counting up), as `epoch - (seconds + nanoseconds)`
/// (`system_time_from_time`, its own TODO): the nanoseconds are added back here.
fn from_kernel(t: SystemTime) -> SystemTime {
    match UNIX_EPOCH.duration_since(t) {
        Ok(d) if d.subsec_nanos() != 0 => {
            UNIX_EPOCH - Duration::from_secs(d.as_secs())
                + Duration::from_nanos(d.subsec_nanos().into())
        }
        _ => t,
    }
}

/// Sets a stored file's attributes (its content's md5 given) on the backend, or where the
/// backend does not keep them, here. An error only when the backend could not be reached
/// (they are kept here meanwhile; an upload tries again).
pub(super) async fn store<B: Backend>(
    fs: &Fs<B>,
    id: &str,
    md5: Option<String>,
    attrs: FileAttrs,
) -> Result<()> {
    match fs.backend.set_attrs(id, attrs).await {
        Ok(node) => {
            fs.nodes.kept(|k| answered(k, id, &node, attrs));
            Ok(())
        }
        Err(e) => {
            fs.nodes.kept(|k| k.remember(id, md5, attrs));
            if is_transient(&e) { Err(e) } else { Ok(()) }
        }
    }
}

/// The backend answered a request that carried `attrs` for file `id` with `node`: what it did
/// not keep is kept here, and what it kept needs nothing here.
pub(super) fn answered(kept: &mut KeptHere, id: &str, node: &Node, attrs: FileAttrs) {
    let time_kept = attrs.modified.is_none() || node.modified_time() == attrs.modified;
    let mode_kept = attrs
        .mode
        .is_none_or(|m| node.mode.map(file_mode) == Some(file_mode(m)));
    if time_kept && mode_kept {
        kept.forget(id);
    } else {
        kept.remember(id, node.md5_checksum.clone(), attrs);
    }
}

/// `Fs::set_attrs_here` of the inode `i`.
fn set_here(
    i: &mut Inode,
    atime: Option<SystemTime>,
    mtime: Option<SystemTime>,
    mode: Option<u32>,
) -> Keep {
    if let Some(t) = atime {
        i.atime = t;
    }
    i.ctime = SystemTime::now();
    let mode_changed = i.kind == InodeKind::File
        && mode.is_some_and(|m| {
            let old = i.perm.replace(m & 0o777);
            old != i.perm
        });
    if i.kind != InodeKind::File || i.unlinked || (mtime.is_none() && !mode_changed) {
        // Folders keep their times here only: the store sets a folder's time as its
        // entries change.
        if let Some(t) = mtime {
            i.mtime = t;
            i.times_here = i.kind == InodeKind::Dir;
        }
        return Keep::Nothing;
    }
    let modified = match &i.staged {
        Some(s) if s.set_attrs(mtime) => {
            return match s.has_writers() {
                false => Keep::Settle(s.clone()),
                true => Keep::Nothing,
            };
        }
        Some(s) => {
            // Also the inode's: a clean staged copy is dropped at close without retiring.
            i.mtime = s.mtime();
            i.mtime
        }
        None => {
            if let Some(t) = mtime {
                i.mtime = t;
            }
            i.mtime
        }
    };
    // The store keeps (or the cache dir, for a store that does not) the time sent: the
    // listing that says it leaves the atime set here as it is.
    i.store_time = Some(modified);
    match &i.remote {
        Some(r) => Keep::Send(
            r.id.clone(),
            r.md5.clone(),
            FileAttrs {
                modified: Some(modified),
                mode: i.perm.map(whole_mode),
            },
        ),
        None => Keep::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_times_before_1970_keep_their_nanoseconds() {
        // 1960-01-01T00:00:00.123456789Z reaches us as epoch - 315619200.123456789 s.
        let sent = UNIX_EPOCH - Duration::new(315_619_200, 123_456_789);
        let meant =
            UNIX_EPOCH - Duration::from_secs(315_619_200) + Duration::from_nanos(123_456_789);
        assert_eq!(from_kernel(sent), meant);
        let whole = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(from_kernel(whole), whole);
        let later = UNIX_EPOCH + Duration::new(5, 1);
        assert_eq!(from_kernel(later), later);
    }
}
