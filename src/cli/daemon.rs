//! `--daemon`: the process forks before any thread exists; the child mounts in a new session
//! with its logs in a file, and the parent waits for the child's verdict: it exits 0 once the
//! mount answers, or non-zero with the child's error.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use crate::sync::relock;

/// The child's end of the verdict pipe.
pub struct Verdict(Mutex<Option<File>>);

impl Verdict {
    /// The mount answers: the parent exits 0.
    pub fn ok(&self) {
        self.send("ok\n");
    }

    /// Mounting failed: the parent prints `msg` and exits non-zero.
    pub fn fail(&self, msg: &str) {
        self.send(&format!("error: {msg}\n"));
    }

    fn send(&self, line: &str) {
        if let Some(mut f) = relock(&self.0).take() {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Forks. Returns in the child (detached, stdin from /dev/null, stdout and stderr appended to
/// `log`); the parent never returns: it exits with the child's verdict.
pub fn fork(log: &Path) -> Result<Verdict, String> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let logf = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .map_err(|e| format!("cannot open the log file {}: {e}", log.display()))?;
    let fds = cloexec_pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: both descriptors are new and owned here.
    let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: no other thread exists yet (the runtime is started after this), so the child
    // may go on running Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(reader);
            let null = File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
            // SAFETY: plain descriptor calls on descriptors this process owns.
            unsafe {
                libc::setsid();
                libc::dup2(null.as_raw_fd(), 0);
                libc::dup2(logf.as_raw_fd(), 1);
                libc::dup2(logf.as_raw_fd(), 2);
            }
            Ok(Verdict(Mutex::new(Some(writer))))
        }
        child => {
            drop(writer);
            std::process::exit(parent(reader, child, log))
        }
    }
}

fn parent(mut reader: File, child: libc::pid_t, log: &Path) -> i32 {
    let mut verdict = String::new();
    let _ = reader.read_to_string(&mut verdict);
    if verdict.starts_with("ok") {
        return 0;
    }
    if let Some(msg) = verdict.strip_prefix("error: ") {
        eprintln!("vaultfs: {}", msg.trim_end());
        return 1;
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    eprintln!(
        "vaultfs: the mount process ended without mounting (wait status {status}); see {}",
        log.display()
    );
    1
}

/// A pipe whose ends close on exec.
fn cloexec_pipe() -> std::io::Result<[std::os::fd::RawFd; 2]> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors.
    #[cfg(target_os = "linux")]
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    // SAFETY: the same, then flags on the two descriptors just made (no thread runs yet that
    // could exec in between: see the caller).
    #[cfg(not(target_os = "linux"))]
    let r = unsafe {
        let r = libc::pipe(fds.as_mut_ptr());
        for fd in fds {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        r
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fds)
}
