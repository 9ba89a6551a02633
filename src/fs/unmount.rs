//! Unmounting from outside the FUSE session: a lazy detach for a busy mount, and stale mounts
//! (a daemon that died leaves "Transport endpoint is not connected").

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether `p` is a mount point whose daemon is gone.
pub fn is_stale(p: &Path) -> bool {
    std::fs::metadata(p).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Whether a vaultfs mount sits at `p` (per /proc/self/mountinfo).
pub fn is_vaultfs_mount(p: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = p.to_string_lossy();
    info.lines().any(|l| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let mut f = l.split(' ');
        let mountpoint = f.nth(4).map(unescape);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        mountpoint.as_deref() == Some(&*want) && fstype == Some("fuse.vaultfs")
    })
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts `p` now, or as soon as it is no longer busy (`umount -l`): with umount2 as root,
/// through `fusermount3 -u -z` otherwise.
pub fn detach(p: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: a valid C string; umount2 only reads it.
    #[cfg(target_os = "linux")]
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    // SAFETY: the same (no lazy unmount here: it fails while busy).
    #[cfg(not(target_os = "linux"))]
    let r = unsafe { libc::unmount(c.as_ptr(), 0) };
    if r == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINVAL) {
        return Ok(()); // not (or no longer) a mount point
    }
    let out = Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(p)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(io::Error::other(format!(
            "fusermount3 -u -z: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(err),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape("/mnt/My\\040Vault"), "/mnt/My Vault");
        assert_eq!(super::unescape("/plain"), "/plain");
    }
}
