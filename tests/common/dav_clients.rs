//! The real WebDAV clients the tests drive (issue 50), each Debian's package that `.ci/run`
//! installs: rclone's webdav backend, davfs2 (`mount -t davfs`) and cadaver. The calls block: an
//! async test whose server answers on its own runtime runs them on a blocking thread.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether `bin` is on the PATH; says why a test skips when it is not (only then).
pub fn installed(bin: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: `{bin}` is not installed (.ci/run installs it: apt-get install {bin})");
    }
    found
}

/// Runs a command to its end: whether it succeeded, and what it printed (stdout, then stderr).
pub fn output(mut cmd: Command) -> (bool, String) {
    let out = cmd.output().expect("the command starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// rclone's command for the remote `vault:`: its webdav backend at `url`, signed in as `email`
/// with `secret`, its config file in `dir`; `extra` goes before the command's own arguments.
pub fn rclone_remote(
    dir: &Path,
    url: String,
    (email, secret): (&str, &str),
    extra: Vec<OsString>,
) -> impl Fn(&[&str]) -> Command + use<> {
    let mut obscure = Command::new("rclone");
    // `--`: a token may begin with `-`.
    obscure.args(["obscure", "--", secret]);
    let (ok, obscured) = output(obscure);
    assert!(ok, "{obscured}");
    let config = dir.join("rclone.conf");
    std::fs::write(&config, "").unwrap();
    let (email, obscured) = (email.to_string(), obscured.trim().to_string());
    move |args: &[&str]| {
        let mut c = Command::new("rclone");
        c.arg("--config")
            .arg(&config)
            .args(&extra)
            .args(args)
            .env("RCLONE_CONFIG_VAULT_TYPE", "webdav")
            .env("RCLONE_CONFIG_VAULT_URL", &url)
            .env("RCLONE_CONFIG_VAULT_VENDOR", "other")
            .env("RCLONE_CONFIG_VAULT_USER", &email)
            .env("RCLONE_CONFIG_VAULT_PASS", &obscured);
        c
    }
}

/// Writes `home/.netrc` so that cadaver signs in to `base`'s host as `email` with `secret`.
pub fn cadaver_netrc(home: &Path, base: &str, (email, secret): (&str, &str)) {
    let host = base
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .split(':')
        .next()
        .unwrap();
    let netrc = home.join(".netrc");
    std::fs::write(
        &netrc,
        format!("machine {host} login {email} password {secret}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&netrc, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// A cadaver session (the command-line WebDAV client) with `commands` on its input, signed in
/// through `home`'s `.netrc` ([`cadaver_netrc`]): what it printed.
pub fn cadaver(home: &Path, url: String, commands: &str) -> String {
    let mut child = Command::new("cadaver")
        .arg(url)
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cadaver starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether davfs2 can mount here: installed, as root, with /dev/fuse.
pub fn davfs_can_mount() -> bool {
    if !installed("mount.davfs") {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: mount -t davfs needs root and /dev/fuse");
        return false;
    }
    true
}

/// A davfs2 mount (`mount -t davfs`, as root) of a WebDAV folder, in a temporary directory with
/// its secrets and configuration; unmounted (lazily, whatever happened) when dropped.
///
/// Listing a davfs2 mount fails with EINVAL on this machine's kernel, against any server
/// (rclone's `serve webdav` too): files are reached by name.
pub struct Davfs {
    pub mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Davfs {
    /// Mounts `url` (a folder's, ending in `/`) signed in as `email` with `secret` (an app
    /// password); uploads are sent at close (`delay_upload 0`) and files locked while open.
    pub fn mount(url: &str, (email, secret): (&str, &str)) -> Result<Davfs, String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // davfs2's daemon runs as its own user: it must reach its files.
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let secrets = dir.path().join("secrets");
        std::fs::write(&secrets, format!("{} {email} {secret}\n", mnt.display())).unwrap();
        std::fs::set_permissions(&secrets, PermissionsExt::from_mode(0o600)).unwrap();
        let conf = dir.path().join("davfs2.conf");
        let settings = format!(
            "secrets {}\ndelay_upload 0\nuse_locks 1\n",
            secrets.display()
        );
        std::fs::write(&conf, settings).unwrap();
        let mut mount = Command::new("mount");
        mount
            .args(["-t", "davfs", url])
            .arg(&mnt)
            .arg("-o")
            .arg(format!("conf={}", conf.display()))
            .stdin(Stdio::null());
        match output(mount) {
            (true, _) => Ok(Davfs { mnt, _dir: dir }),
            (false, out) => Err(format!("mount -t davfs: {out}")),
        }
    }

    /// Unmounts: davfs2 has stored every file once `umount` returns (it waits for them).
    pub fn unmount(self) -> Result<(), String> {
        let mut umount = Command::new("umount");
        umount.arg(&self.mnt);
        match output(umount) {
            (true, _) => Ok(()),
            (false, out) => Err(format!("umount of davfs2: {out}")),
        }
    }
}

impl Drop for Davfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
    }
}
