//! The kernel's read-ahead for the mount. FUSE offers at most 128 KiB at INIT (a larger
//! `max_readahead` is refused), so the backing device's `read_ahead_kb` in sysfs is set after
//! mounting, and what the kernel then holds is read back and logged.

use std::path::Path;

/// Sets the mount's read-ahead to `kb` KiB once it answers; the KiB in force after, or None
/// when it could not be read (not Linux, no sysfs).
#[cfg(target_os = "linux")]
pub(super) fn set(mountpoint: &Path, kb: u32) -> Option<u32> {
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
pub(super) fn set(_mountpoint: &Path, _kb: u32) -> Option<u32> {
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
