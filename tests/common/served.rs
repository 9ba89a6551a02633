//! A real `vaultfs serve` process on loopback over a store in a directory, and its memory as
//! the kernel counts it (for the tests that bound it).

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use super::mount::BIN;

/// A `vaultfs serve` on a free loopback port, one preview worker of each kind; killed when
/// dropped.
pub struct Served {
    pub child: std::process::Child,
    pub base: String,
}

impl Served {
    /// With `extra` flags, its log (warnings) dropped.
    pub fn start(dir: &Path, extra: &[&str]) -> Served {
        Self::spawn(dir, extra, None)
    }

    /// The same with its log (info) appended to `log`.
    pub fn start_logged(dir: &Path, extra: &[&str], log: &Path) -> Served {
        Self::spawn(dir, extra, Some(log))
    }

    fn spawn(dir: &Path, extra: &[&str], log: Option<&Path>) -> Served {
        let port = super::free_port();
        let stderr = match log {
            Some(log) => Stdio::from(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap(),
            ),
            None => Stdio::null(),
        };
        let child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(dir)
            .args(["--preview-workers", "1"])
            .args(extra)
            .env("RUST_LOG", if log.is_some() { "info" } else { "warn" })
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        super::wait_for_port(port);
        Served {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
