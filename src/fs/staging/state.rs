//! Where a staged file is in its life, and which step may be taken from where: each step
//! below checks it and moves the state under the file's own small lock; `lifecycle` takes
//! the steps as the mount does.
//!
//! ```text
//!  made ──join──► Open ◄──join── Closed ──stored, no writer, the kernel let go──► Retired
//!    │             └──last leave──►  │  (settled: dirty, its upload is scheduled;
//!    │                               │   clean, retired at once)
//!    ├── superseded, removed, or replaced by a rename (no writer) ──────────────► Dropped
//!    └── stored in vain three times (`retry`) ──────────────────────────────────► SetAside
//! ```
//!
//! Open and Closed are the live states: the staged file is its inode's copy, read and written
//! in place of the stored version. Retired, Dropped and SetAside are final: the inode lets go
//! of the file in the same step, under the inode table's lock, so no writer can join it after.
//! The states the shared-vault and offline issues add (a conflict with another client's
//! version, a file kept while offline) belong in this type, and their steps here.

use std::fmt;

use super::Staged;
use crate::sync::relock;

/// Where a staged file is in its life (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Its inode's copy, with writers.
    Open,
    /// No writer: made and not yet joined, or settled (its changes wait for an upload, or,
    /// all stored, it waits for the kernel to let go of it).
    Closed,
    /// Stored and let go of: the file reads from the backend (and the read cache) again.
    Retired,
    /// Its bytes go nowhere: removed, replaced by a rename, or another copy took its place.
    Dropped,
    /// Stored in vain: its bytes are in `lost+found`.
    SetAside,
}

impl Life {
    /// Whether the file may still be written and stored.
    pub fn live(self) -> bool {
        matches!(self, Life::Open | Life::Closed)
    }
}

/// A step refused: the file was not in a state it may be taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Illegal {
    pub step: &'static str,
    pub from: Life,
    pub writers: u32,
}

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "staged file: cannot {} when {:?} with {} writer(s)",
            self.step, self.from, self.writers
        )
    }
}

impl std::error::Error for Illegal {}

/// The life of a staged file and its writers, changed together under one small lock (taken
/// with nothing under it: "a staged file's own" in `fs`, Locks).
#[derive(Debug)]
pub(super) struct State {
    life: Life,
    /// Open writable handles. A writer joins with the inode table locked, where a finished
    /// upload decides to retire the file, so no writer ever writes to a retired copy.
    writers: u32,
}

impl Default for State {
    fn default() -> Self {
        State {
            life: Life::Closed,
            writers: 0,
        }
    }
}

impl Staged {
    fn step<T>(
        &self,
        step: &'static str,
        legal: impl FnOnce(&State) -> bool,
        go: impl FnOnce(&mut State) -> T,
    ) -> Result<T, Illegal> {
        let mut s = relock(&self.state);
        if !legal(&s) {
            return Err(Illegal {
                step,
                from: s.life,
                writers: s.writers,
            });
        }
        Ok(go(&mut s))
    }

    /// Where the file is in its life (the steps below read it; so do tests).
    #[cfg(test)]
    pub fn life(&self) -> Life {
        relock(&self.state).life
    }

    /// Whether a writable handle holds the file.
    pub fn has_writers(&self) -> bool {
        relock(&self.state).writers > 0
    }

    /// Changes wait and no writer is left: the last close scheduled an upload, and one that
    /// just ended must go round again.
    pub fn waits_for_upload(&self) -> bool {
        self.is_dirty() && !self.has_writers()
    }

    /// **Open**: a writable handle joins (with the inode table locked). Refused once the file
    /// is retired, dropped or set aside: the writer stages the file again.
    pub(super) fn join(&self) -> Result<(), Illegal> {
        self.step(
            "join",
            |s| s.life.live(),
            |s| {
                s.writers += 1;
                s.life = Life::Open;
            },
        )
    }

    /// **Close**: a writable handle leaves; true when it was the last (the caller settles the
    /// file then). Legal whatever the life: a writer holds a file set aside until it closes.
    pub fn leave(&self) -> Result<bool, Illegal> {
        self.step(
            "leave",
            |s| s.writers > 0,
            |s| {
                s.writers -= 1;
                if s.writers == 0 && s.life == Life::Open {
                    s.life = Life::Closed;
                }
                s.writers == 0
            },
        )
    }

    /// The file was made as a copy of the stored version: not a change to upload by itself.
    pub(super) fn holds_stored(&self) -> Result<(), Illegal> {
        self.step(
            "take the stored bytes",
            |s| s.life == Life::Closed && s.writers == 0,
            |_| self.mark_uploaded(self.generation()),
        )
    }

    /// **Upload finished**: `generation` is stored (later ones may wait still).
    pub fn stored(&self, generation: u64) -> Result<(), Illegal> {
        self.step(
            "be stored",
            |s| s.life.live() && generation <= self.generation(),
            |_| self.mark_uploaded(generation),
        )
    }

    /// What an fsync waiting for `generation` of this file learns now: stored (that generation
    /// or a later one, or the file let go of: retired once stored, dropped with its name),
    /// set aside (false), or nothing yet (`None`).
    pub fn synced(&self, generation: u64) -> Option<bool> {
        match relock(&self.state).life {
            Life::Retired | Life::Dropped => Some(true),
            Life::SetAside => Some(false),
            Life::Open | Life::Closed => (self.uploaded.load(std::sync::atomic::Ordering::SeqCst)
                >= generation)
                .then_some(true),
        }
    }

    /// A generation that might have held the stored bytes (`kernel_changed`) was compared and
    /// found changed: it is stored like any other.
    pub(super) fn found_changed(&self) {
        self.make_sure();
    }

    /// **Retire**: stored and let go of, once no writer holds it and nothing new waits.
    pub(super) fn retire(&self) -> Result<(), Illegal> {
        self.step(
            "retire",
            |s| s.life.live() && s.writers == 0 && !self.is_dirty(),
            |s| s.life = Life::Retired,
        )
    }

    /// **Drop**: removed, replaced, or superseded by another copy, with no writer.
    pub fn drop_copy(&self) -> Result<(), Illegal> {
        self.step(
            "drop",
            |s| s.life.live() && s.writers == 0,
            |s| s.life = Life::Dropped,
        )
    }

    /// **Set aside**: its bytes could not be stored and went to `lost+found`. A writer that
    /// still holds it writes on to a file nobody stores.
    pub(super) fn set_aside(&self) -> Result<(), Illegal> {
        self.step("set aside", |s| s.life.live(), |s| s.life = Life::SetAside)
    }
}
