//! `vaultfs pin PATH` / `vaultfs unpin PATH`: keep a folder's (or a file's) files whole on disk,
//! for use offline.
//!
//! Pinning is setting the `user.vaultfs.pinned` attribute through the mount, as a file manager
//! can (`setfattr -n user.vaultfs.pinned -v 1 DIR`): one way in, the mount's own, and no route
//! of its own beside it. The mount keeps the set of pins in its cache dir and fetches in the
//! background; this command then tells how far that is (`--wait`: until all is on disk).

use std::ffi::CString;
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

use super::control;
use crate::fs::status::{Pin, human_bytes};

const XATTR: &str = "user.vaultfs.pinned";
/// How long `--wait` waits without headway while the mount reports a problem or is offline.
const STUCK: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct PinArgs {
    /// A folder or file in a mount
    path: PathBuf,
    /// Wait until everything it holds is on disk (progress on stderr)
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this many seconds
    #[arg(long, value_name = "S", requires = "wait")]
    timeout: Option<f64>,
}

#[derive(Args)]
pub struct UnpinArgs {
    /// A pinned folder or file in a mount
    path: PathBuf,
}

/// Sets (`Some`) or removes the pin attribute of `path`: what the mount answered.
fn set(path: &Path, value: Option<&[u8]>) -> std::io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes())?;
    let name = CString::new(XATTR).expect("no NUL");
    // SAFETY: NUL-terminated strings and a buffer of the length given, all ours.
    let r = unsafe {
        match value {
            Some(v) => libc::setxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0),
            None => libc::removexattr(p.as_ptr(), name.as_ptr()),
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins or unpins `abs` in the mount at `mp`: through the attribute, or where the kernel
/// refuses that (a read-only mount) over the mount's control socket.
fn set_pin(abs: &Path, mp: &Path, on: bool) -> std::io::Result<()> {
    let r = set(abs, on.then_some(b"1".as_slice()));
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            let rel = abs.strip_prefix(mp).unwrap_or(Path::new(""));
            control::pin(mp, rel, on).unwrap_or(Err(e))
        }
        r => r,
    }
}

/// `path` made absolute and resolved, with the mount point it is in.
fn locate(path: &Path) -> Result<(PathBuf, PathBuf), String> {
    let abs = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mp = control::mount_of(&abs)
        .ok_or_else(|| format!("{} is not in a vaultfs mount", abs.display()))?;
    Ok((abs, mp))
}

/// What an errno from the mount means to the user.
fn explain(e: &std::io::Error, path: &Path, on: bool) -> String {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => format!(
            "{}: this mount's store is on this machine; its files are always on disk",
            path.display()
        ),
        Some(libc::ENODATA) if !on => format!(
            "{} is not pinned itself (pinned through a folder above it, or not at all)",
            path.display()
        ),
        Some(libc::EPERM) => format!("{}: cannot be pinned (a virtual folder)", path.display()),
        _ => format!("{}: {e}", path.display()),
    }
}

/// The pin of `abs` as the mount's status shows it.
fn pin_state(mp: &Path, abs: &Path) -> Option<Pin> {
    let s = control::status(mp)?.ok()?;
    // The daemon names it under the mount point as mounted (through a link, maybe).
    let same = |p: &Pin| {
        Path::new(&p.local_path) == abs
            || std::fs::canonicalize(&p.local_path).is_ok_and(|c| c == abs)
    };
    s.pins.into_iter().find(same)
}

fn line(p: &Pin) -> String {
    format!(
        "{}: {} of {} file(s) on disk, {} of {}",
        p.state,
        p.whole_files,
        p.files,
        human_bytes(p.whole_bytes),
        human_bytes(p.bytes)
    )
}

pub fn pin(args: PinArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (abs, mp) = locate(&args.path)?;
    set_pin(&abs, &mp, true).map_err(|e| explain(&e, &abs, true))?;
    if !args.wait {
        match pin_state(&mp, &abs) {
            Some(p) if p.state != "listing" => {
                eprintln!("vaultfs: pinned {} ({})", abs.display(), line(&p))
            }
            _ => eprintln!(
                "vaultfs: pinned {}; its files are fetched in the background (`vaultfs status` shows how far)",
                abs.display()
            ),
        }
        return Ok(());
    }
    let started = Instant::now();
    let deadline = args
        .timeout
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let mut progress = (0, Instant::now());
    let live = std::io::stderr().is_terminal();
    loop {
        let p = pin_state(&mp, &abs)
            .ok_or_else(|| format!("the mount at {} no longer answers", mp.display()))?;
        if p.state == "on disk" {
            let cr = if live { "\r" } else { "" };
            eprintln!("{cr}vaultfs: pinned {} ({})", abs.display(), line(&p));
            return Ok(());
        }
        if p.whole_files != progress.0 {
            progress = (p.whole_files, Instant::now());
        }
        // Stuck (the server away, no room on disk): said now rather than waited on.
        let stuck = (p.problem.is_some() || p.state.starts_with("offline"))
            && progress.1.elapsed() >= STUCK;
        if stuck || deadline.is_some_and(|d| Instant::now() >= d) {
            if live {
                eprintln!();
            }
            let why = (p.problem.as_ref())
                .map(|w| format!(": {w}"))
                .unwrap_or_default();
            return Err(format!(
                "pinned {}, not all on disk yet ({}){why}",
                abs.display(),
                line(&p)
            )
            .into());
        }
        if live {
            eprint!("\rvaultfs: {}   ", line(&p));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn unpin(args: UnpinArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (abs, mp) = locate(&args.path)?;
    set_pin(&abs, &mp, false).map_err(|e| explain(&e, &abs, false))?;
    eprintln!(
        "vaultfs: unpinned {}; its files stay cached until evicted like any other",
        abs.display()
    );
    Ok(())
}
