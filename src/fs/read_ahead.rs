//! The kernel's read-ahead for the mount. FUSE offers at most 128 KiB at INIT (a larger
//! `max_readahead` is refused), so the backing device's `read_ahead_kb` in sysfs is set after
//! mounting, and what the kernel then holds is read back and logged.
//!
//! By default it depends on how reads go (docs/benchmarks.md, "Reads"): with passthrough the
//! daemon reads what is not on local disk yet, downloads, which 1 MiB requests speed up; without
//! it the daemon also serves cached files, which 128 KiB requests serve faster.

use std::path::Path;

/// Read-ahead (KiB) by default: with passthrough, without.
pub(super) fn default_kb(passthrough: bool) -> Option<u32> {
    passthrough.then_some(1024)
}

/// Sets the mount's read-ahead to what `want` says once the mount answers (None: the kernel's
/// own); the KiB in force after, or None when it could not be read (not Linux, no sysfs).
#[cfg(target_os = "linux")]
pub(super) fn set(mountpoint: &Path, want: impl FnOnce() -> Option<u32>) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    // Blocks until the kernel has processed INIT (requests wait for it).
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => {
            log::warn!("read-ahead not set: {}: {e}", mountpoint.display());
            return None;
        }
    };
    let knob = bdi_knob(dev);
    let Some(kb) = want() else {
        let granted = granted(&knob)?;
        log::info!("read-ahead: {granted} KiB (the kernel's)");
        return Some(granted);
    };
    let written = std::fs::write(&knob, format!("{kb}\n"));
    let granted = granted(&knob)?;
    match written {
        _ if granted == kb => log::info!("read-ahead: {granted} KiB"),
        // Only root may set it: an unprivileged mount keeps the kernel's.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            log::info!("read-ahead: {granted} KiB (the kernel's; setting it needs root)")
        }
        Err(e) => log::warn!("read-ahead: {granted} KiB (asked for {kb}: {e})"),
        Ok(()) => log::warn!("read-ahead: {granted} KiB (asked for {kb})"),
    }
    Some(granted)
}

#[cfg(not(target_os = "linux"))]
pub(super) fn set(_mountpoint: &Path, _want: impl FnOnce() -> Option<u32>) -> Option<u32> {
    None
}

/// `/sys/class/bdi/<major>:<minor>/read_ahead_kb` of the device `dev`.
#[cfg(target_os = "linux")]
fn bdi_knob(dev: u64) -> std::path::PathBuf {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    std::path::PathBuf::from(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
}

#[cfg(target_os = "linux")]
fn granted(knob: &Path) -> Option<u32> {
    std::fs::read_to_string(knob).ok()?.trim().parse().ok()
}
