//! One daemon per cache dir: the dir holds a mount's upload journal, and two daemons working
//! on one journal would upload its entries twice (or retire each other's staging files).
//!
//! A daemon owns its cache dir by an exclusive `flock` on `owner`, held until the process
//! exits, with its pid and mount point written in the file. A new mount that finds the lock
//! held:
//! - by the daemon of the same mount point (unmounted by the kernel, still storing what was
//!   written before): asks it to hand the journal over (SIGUSR1; it leaves at once, its batch
//!   in flight committed or not at all) and waits for the lock, at most [`HANDOVER_WAIT`];
//! - by a mount elsewhere of the same store (or a daemon that did not let go in time): takes
//!   the next free sibling dir, `<dir>.1`, `<dir>.2`, ... A journal left in a sibling is
//!   finished by the next mount that owns it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a new mount waits for the previous daemon of its mount point to let go.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);
/// Sibling dirs tried before giving up (that many mounts of one store at once).
const MAX_SIBLINGS: usize = 64;

/// Takes a cache dir for the daemon of `mountpoint`: `base` or a sibling (see the module's
/// comment). The lock is kept for the life of the process.
pub fn own_cache_dir(base: &Path, mountpoint: &Path) -> Result<PathBuf, String> {
    for n in 0..MAX_SIBLINGS {
        let dir = sibling(base, n);
        crate::fs::private_dir(&dir)
            .map_err(|e| format!("cannot use the cache dir {}: {e}", dir.display()))?;
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join("owner"))
            .map_err(|e| format!("cannot open {}: {e}", dir.join("owner").display()))?;
        let mut owned = try_lock(&f);
        if !owned {
            let (pid, holder) = read_owner(&mut f);
            if holder.as_deref() == Some(mountpoint) && pid > 0 {
                log::info!(
                    "the previous daemon of {} (pid {pid}) is still storing files; it hands its journal over",
                    mountpoint.display()
                );
                // SAFETY: a signal to the process that holds the lock, whose pid it wrote.
                unsafe { libc::kill(pid, libc::SIGUSR1) };
                let deadline = Instant::now() + HANDOVER_WAIT;
                while !owned && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                    owned = try_lock(&f);
                }
                if !owned {
                    log::warn!(
                        "pid {pid} kept {} for {}s; using another cache dir (its journal is finished later)",
                        dir.display(),
                        HANDOVER_WAIT.as_secs()
                    );
                }
            }
        }
        if owned {
            write_owner(&mut f, mountpoint);
            // Held until the process exits: a batch still committing on the way out must not
            // meet the next daemon's recovery of the same journal.
            std::mem::forget(f);
            return Ok(dir);
        }
    }
    Err(format!(
        "{MAX_SIBLINGS} cache dirs next to {} are in use by other vaultfs daemons",
        base.display()
    ))
}

fn sibling(base: &Path, n: usize) -> PathBuf {
    if n == 0 {
        return base.to_path_buf();
    }
    let mut name = base.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{n}"));
    base.with_file_name(name)
}

fn try_lock(f: &File) -> bool {
    // SAFETY: flock on a descriptor we hold.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// The pid and mount point the lock holder wrote (`0, None` when unreadable).
fn read_owner(f: &mut File) -> (i32, Option<PathBuf>) {
    let mut s = String::new();
    if f.rewind().and_then(|()| f.read_to_string(&mut s)).is_err() {
        return (0, None);
    }
    let mut lines = s.lines();
    let pid = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    (pid, lines.next().map(PathBuf::from))
}

fn write_owner(f: &mut File, mountpoint: &Path) {
    let line = format!("{}\n{}\n", std::process::id(), mountpoint.display());
    let written = f
        .set_len(0)
        .and_then(|()| f.rewind())
        .and_then(|()| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        log::warn!("cannot record this daemon as the cache dir's owner: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second owner of the same mount point elsewhere in this process cannot take a held dir
    /// (flock is per open file, so a second open in one process conflicts as another would):
    /// it gets a sibling.
    #[test]
    fn a_held_cache_dir_sends_the_next_mount_to_a_sibling() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("local-abc");
        let first = own_cache_dir(&base, Path::new("/mnt/a")).unwrap();
        assert_eq!(first, base);
        let second = own_cache_dir(&base, Path::new("/mnt/b")).unwrap();
        assert_eq!(second, tmp.path().join("local-abc.1"));
        let owner = std::fs::read_to_string(second.join("owner")).unwrap();
        assert_eq!(owner, format!("{}\n/mnt/b\n", std::process::id()));
    }
}
