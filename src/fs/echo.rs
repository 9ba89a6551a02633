//! Removals through the mount itself, made by a child process, never by the daemon.
//!
//! The follower removes a name deleted elsewhere through the mount (`follow::Follow`), so that
//! the kernel tells inotify watchers (`IN_DELETE`). A thread of the daemon must not make that
//! call: killed (SIGKILL) while its request is being served, the daemon's FUSE threads are gone
//! and that thread waits for an answer for ever, the process cannot end, so `/dev/fuse` is
//! never closed and the mount hangs until its connection is aborted by hand (the model test
//! hung so, once). A forked child makes the calls instead, without the daemon's descriptors:
//! the daemon may then die at any time, its `/dev/fuse` closes, and the kernel ends the child's
//! request with an error.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Removes each path (a folder when its flag is set) through the kernel; whether each went.
/// `started` gets the child's pid before the child makes its first call (the mount answers the
/// lookups of that pid alone as the follower's: `Follow::echo_of`).
pub(super) fn remove_all(paths: &[(PathBuf, bool)], started: impl FnOnce(u32)) -> Vec<bool> {
    let failed = vec![false; paths.len()];
    let Ok(names) = paths
        .iter()
        .map(|(p, _)| CString::new(p.as_os_str().as_bytes()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return failed;
    };
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return failed;
    }
    let (rd, wr) = (fds[0], fds[1]);
    // The go-ahead: the child waits for it (or for its end) until `started` has run.
    let mut go = [0; 2];
    // SAFETY: as above.
    if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        // SAFETY: our descriptors, not used after.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return failed;
    }
    // SAFETY: the child only makes async-signal-safe calls (dup2, close_range, read, unlink,
    // rmdir, write, _exit) on memory prepared before the fork: no lock or allocator is touched.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            // Only the pipes stay open, as descriptors 3 and 4 (`/dev/fuse` above all must go).
            if libc::dup2(wr, 3) < 0 || libc::dup2(go[0], 4) < 0 {
                libc::_exit(1);
            }
            libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32);
            // Read again when a signal broke the wait; bounded, so that no error can keep the
            // child (and the follower waiting on it) here for ever.
            let mut byte = [0u8; 1];
            for _ in 0..100 {
                if libc::read(4, byte.as_mut_ptr().cast(), 1) >= 0 {
                    break;
                }
            }
            for (name, (_, dir)) in names.iter().zip(paths) {
                let r = if *dir {
                    libc::rmdir(name.as_ptr())
                } else {
                    libc::unlink(name.as_ptr())
                };
                let byte = [u8::from(r == 0)];
                libc::write(3, byte.as_ptr().cast(), 1);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our own descriptors, not used after.
    unsafe {
        libc::close(wr);
        libc::close(go[0]);
    }
    if pid < 0 {
        // SAFETY: as above.
        unsafe {
            libc::close(rd);
            libc::close(go[1]);
        }
        return failed;
    }
    started(pid as u32);
    // SAFETY: as above; its end is the go-ahead.
    unsafe { libc::close(go[1]) };
    let mut answers = Vec::with_capacity(paths.len());
    let mut byte = [0u8; 1];
    while answers.len() < paths.len() {
        // SAFETY: one byte into `byte`.
        let n = unsafe { libc::read(rd, byte.as_mut_ptr().cast(), 1) };
        match n {
            1 => answers.push(byte[0] == 1),
            n if n < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    answers.resize(paths.len(), false);
    // SAFETY: our descriptor, and our child, waited for once.
    unsafe {
        libc::close(rd);
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }
    answers
}

#[cfg(test)]
mod tests {
    /// Files and folders removed by the child, each answer in its place.
    #[test]
    fn the_child_removes_and_answers_for_each_path() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        let d = tmp.path().join("d");
        std::fs::write(&f, b"x").unwrap();
        std::fs::create_dir(&d).unwrap();
        let missing = tmp.path().join("missing");
        let mut child = None;
        let got = super::remove_all(
            &[(f.clone(), false), (missing, false), (d.clone(), true)],
            |pid| child = Some(pid),
        );
        assert_eq!(got, [true, false, true]);
        assert!(child.is_some_and(|pid| pid != std::process::id()));
        assert!(!f.exists() && !d.exists());
    }
}
