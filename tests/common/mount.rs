//! A real `vaultfs mount` process over a temporary mount point, unmounted (and killed if need be)
//! when dropped. FUSE tests need root and /dev/fuse.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_vaultfs");

pub struct Mount {
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

/// Whether this machine can run FUSE tests.
pub fn fuse_available() -> bool {
    // SAFETY: geteuid cannot fail.
    Path::new("/dev/fuse").exists() && unsafe { libc::geteuid() } == 0
}

fn st_dev(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.dev())
}

impl Mount {
    /// `vaultfs status --json` of this mount.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .arg("status")
            .arg(&self.dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Starts `vaultfs mount DIR ARGS...` and waits until the mount answers.
    pub fn start(dir: &Path, args: &[&str]) -> Mount {
        Self::start_with_env(dir, args, &[])
    }

    /// The same, with extra environment variables for the daemon.
    pub fn start_with_env(dir: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Mount {
        Self::start_limited(dir, args, envs, None)
    }

    /// The same, with the daemon's open-files limit (soft and hard) set to `nofile`, as
    /// `ulimit -n` in a container sets it.
    pub fn start_limited(
        dir: &Path,
        args: &[&str],
        envs: &[(&str, &Path)],
        nofile: Option<u64>,
    ) -> Mount {
        use std::os::unix::process::CommandExt;
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.with_extension("log");
        let before = st_dev(dir);
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = Command::new(BIN);
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
            unsafe {
                cmd.pre_exec(move || {
                    let rl = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("mount")
            .arg(dir)
            .args(args)
            // `VAULTFS_TEST_MOUNT_LOG` (a RUST_LOG filter) for more of a test's mounts.
            .env(
                "RUST_LOG",
                std::env::var("VAULTFS_TEST_MOUNT_LOG").unwrap_or("info,fuser=warn".into()),
            )
            // The thumbnails the mount writes for file managers stay beside it, out of the
            // user's own cache (a test may give its own).
            .env("XDG_CACHE_HOME", dir.with_extension("xdg-cache"))
            .envs(envs.iter().map(|(k, v)| (*k, *v)))
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .unwrap();
        let mut m = Mount {
            dir: dir.to_path_buf(),
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if st_dev(dir) != before {
                return m;
            }
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("vaultfs mount exited with {status}: {}", m.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "mount did not come up: {}",
                m.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Unmounts and waits for the daemon to exit (it flushes nothing more: the journal keeps
    /// what is not uploaded).
    pub fn unmount(mut self) {
        self.stop();
    }

    /// `umount` and nothing more: the kernel lets go, the daemon goes on storing what is left
    /// (it is waited for when this is dropped).
    pub fn umount_only(&mut self) {
        let st = Command::new("umount").arg(&self.dir).status().unwrap();
        assert!(st.success(), "umount {}", self.dir.display());
    }

    /// Kills the daemon with SIGKILL, as a crash would, and clears the dead mount.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }

    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("umount")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while c.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.wait();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `f` holds, for at most `secs` seconds.
pub fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// md5 of a file, read in 1 MiB pieces.
pub fn md5_of(p: &Path) -> String {
    use md5::{Digest, Md5};
    use std::io::Read;
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    vaultfs::api::checksum::hex(&h.finalize())
}

/// Mounts a tmpfs of `mib` MiB at `dir` (root only); unmounted when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn new(dir: &Path, mib: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Runs `script` with `sh -c` in `cwd`; fails the test unless it succeeds. Its stdout.
/// The names in a folder, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn sh(cwd: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
