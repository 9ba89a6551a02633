//! systemd integration without libsystemd: readiness over `$NOTIFY_SOCKET` (sd_notify's datagram
//! protocol), and log lines the journal reads well when stderr is the journal.

use std::io::Write;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (`READY=1`, `STATUS=...`, newline-separated) to the service manager, if
/// there is one. Errors are logged, never fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET").filter(|p| !p.is_empty()) else {
        return;
    };
    if let Err(e) = send(&path, state) {
        log::warn!("cannot notify systemd at {}: {e}", path.to_string_lossy());
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    // An abstract socket (Linux): `@name`.
    #[cfg(target_os = "linux")]
    if let Some(name) = std::os::unix::ffi::OsStrExt::as_bytes(path).strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
        return Ok(());
    }
    sock.send_to(state.as_bytes(), path)?;
    Ok(())
}

/// Whether stderr is connected to the journal (`$JOURNAL_STREAM` names its device and inode).
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The logger: `RUST_LOG` (default `info`) to stderr. When stderr is the journal, lines carry
/// the syslog priority prefix (`<3>`) instead of a timestamp and colours: the journal adds its
/// own time and shows the level.
pub fn init_logging() {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if stderr_is_journal() {
        b.write_style(env_logger::WriteStyle::Never);
        b.format(|buf, record| {
            let prio = match record.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            writeln!(buf, "<{prio}>{}: {}", record.target(), record.args())
        });
    }
    b.init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn notifies_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        super::send(path.as_os_str(), "READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
    }
}
