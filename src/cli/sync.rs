//! `vaultfs sync [DIR]`: waits until a mount (or every mount) has stored everything written to
//! it, for scripts and for a laptop about to close. Exit 0 once nothing is pending; otherwise an
//! error that says what is left and why (still open for writing, the server away, the time
//! given up).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use super::control;
use crate::fs::status::{Status, human_bytes};

/// How often the mounts are asked, with a few files pending.
const POLL: Duration = Duration::from_millis(100);
/// ... and at most this seldom with many: a mount's status costs it a walk of the files pending.
const POLL_MANY: Duration = Duration::from_secs(1);
/// Without --timeout, how long a mount may stay offline before sync gives up on it: its files
/// are safe in the journal, and a script should hear at once that they are not stored.
const OFFLINE_PATIENCE: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct SyncArgs {
    /// A mount point, or any path inside a mount [default: every running mount]
    mountpoint: Option<PathBuf>,
    /// Give up after this many seconds [default: wait as long as uploads make headway; stop
    /// after 10 s of the server being unreachable]
    #[arg(long, value_name = "S")]
    timeout: Option<f64>,
    /// Print nothing while waiting (the outcome is the exit status and, on failure, stderr)
    #[arg(long, short)]
    quiet: bool,
}

pub fn sync(args: SyncArgs) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let deadline = args
        .timeout
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let live = !args.quiet && std::io::stderr().is_terminal();
    let mut offline_since: Option<Instant> = None;
    loop {
        let mounts = match &args.mountpoint {
            Some(given) => {
                let mp = control::mount_given(given);
                match control::status(&mp) {
                    Some(r) => vec![r?],
                    None => {
                        return Err(format!(
                            "no running vaultfs mount at {} (no daemon answers on {})",
                            given.display(),
                            control::socket_path(&mp).display()
                        )
                        .into());
                    }
                }
            }
            None => control::status_all(),
        };
        // (Deletes answered and not sent yet count: a folder removed is not gone from the
        // store until they are.)
        let pending: usize = mounts
            .iter()
            .map(|m| m.uploads_pending() + m.deletes_pending)
            .sum();
        if pending == 0 && mounts.iter().any(|m| !m.set_aside.is_empty()) {
            if live {
                eprintln!();
            }
            return Err(set_aside(&mounts).into());
        }
        if pending == 0 {
            if live {
                eprintln!("\rvaultfs: everything is stored{:30}", "");
            }
            return Ok(());
        }
        let offline = mounts.iter().any(|m| m.offline);
        offline_since = match (offline, offline_since) {
            (true, None) => Some(Instant::now()),
            (true, since) => since,
            (false, _) => None,
        };
        let gave_up = deadline.is_some_and(|d| Instant::now() >= d);
        let away =
            deadline.is_none() && offline_since.is_some_and(|t| t.elapsed() >= OFFLINE_PATIENCE);
        if gave_up || away {
            if live {
                eprintln!();
            }
            let why = if offline {
                "the server is unreachable; they are kept in the journal and stored once it is back"
            } else if gave_up {
                "still uploading or open for writing when the time ran out"
            } else {
                "not stored"
            };
            return Err(
                format!("{pending} file(s) not stored yet: {why}\n{}", left(&mounts)).into(),
            );
        }
        if live {
            eprint!("\r{}", progress(&mounts, started.elapsed()));
        }
        std::thread::sleep(poll_after(pending));
    }
}

/// The pause before asking again, longer as more files are pending, so that the walks of a
/// long sync cost the mounts a bounded share of their time (a second's wait is nothing to a
/// sync of thousands of files).
fn poll_after(pending: usize) -> Duration {
    let times = u32::try_from(pending / 1000 + 1).unwrap_or(u32::MAX);
    POLL.saturating_mul(times).min(POLL_MANY)
}

/// One line: files and bytes still to store, and the rate of those being sent.
fn progress(mounts: &[Status], elapsed: Duration) -> String {
    let files: usize = mounts.iter().map(Status::uploads_pending).sum();
    let bytes: u64 = mounts.iter().map(Status::pending_bytes).sum();
    let uploads = mounts.iter().flat_map(|m| &m.uploads);
    let (sent, rate) = uploads.fold((0, 0.0), |(s, r), u| (s + u.sent, r + u.rate));
    let offline = if mounts.iter().any(|m| m.offline) {
        ", server unreachable"
    } else {
        ""
    };
    format!(
        "vaultfs: {files} file(s) to store, {} of {} sent, {}/s{offline} ({:.0} s)   ",
        human_bytes(sent),
        human_bytes(bytes),
        human_bytes(rate as u64),
        elapsed.as_secs_f64()
    )
}

/// The edits the store refused, kept in lost+found: a failure until the user deals with them.
fn set_aside(mounts: &[Status]) -> String {
    let notes: Vec<_> = mounts.iter().flat_map(|m| &m.set_aside).collect();
    let mut out = format!(
        "{} edit(s) could not be stored; their bytes are kept in lost+found (move each back \
         into the mount under a name the store takes, or delete it, once dealt with):\n",
        notes.len()
    );
    for a in notes {
        out += &format!("  {}: {}\n    kept in {}\n", a.path, a.why, a.kept);
    }
    out.trim_end().to_string()
}

/// What is left, a line per file, with the mount's recent errors (the reason, when there is one).
fn left(mounts: &[Status]) -> String {
    let mut out = String::new();
    for m in mounts.iter().filter(|m| m.uploads_pending() > 0) {
        for u in &m.uploads {
            let state = if u.running { "sending" } else { "waiting" };
            out += &format!("  {state}  {}  {}\n", human_bytes(u.size), u.path);
        }
        if m.unlisted_waiting() > 0 {
            out += &format!("  and {} more waiting\n", m.unlisted_waiting());
        }
        if let Some(e) = m.errors.last() {
            out += &format!("  last error on {}: {}\n", m.mountpoint, e.message);
        }
    }
    out.trim_end().to_string()
}
