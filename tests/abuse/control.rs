//! The control socket's folder (item 13), squatted by another local user.

use std::process::{Command, Stdio};

use super::BIN;

/// `vaultfs ARGS` run as the user `uid` (the test runs as root), with `tmp` as its temporary
/// folder and no XDG_RUNTIME_DIR: its control sockets are in `<tmp>/vaultfs-<uid>`.
fn vaultfs_as(uid: u32, tmp: &std::path::Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(BIN)
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp)
        .env("HOME", tmp)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Another local user makes `/tmp/vaultfs-<uid>` first (the fallback without XDG_RUNTIME_DIR)
/// and answers on the socket of a mount point: `vaultfs status` does not show their answer and
/// `vaultfs unmount` does not report their success (before: both did). A socket of another user
/// in a folder that is ours is refused too (SO_PEERCRED).
#[test]
fn a_squatted_control_folder_is_refused() {
    use std::os::unix::fs::{PermissionsExt, chown};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("not root: skipped (the test runs commands as another user)");
        return;
    }
    let (victim, squatter) = (65534u32, 65533u32);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mp = tmp.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let sock_name = {
        use md5::{Digest, Md5};
        let canon = std::fs::canonicalize(&mp).unwrap();
        let h: String = Md5::digest(canon.as_os_str().as_encoded_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{}.sock", &h[..16])
    };
    let dir = tmp.path().join(format!("vaultfs-{victim}"));
    // The squatter's folder, open to all, and a socket that answers everything with success.
    let answer_forever = |sock: std::path::PathBuf| {
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for conn in listener.incoming().flatten() {
                let mut line = String::new();
                let mut r = std::io::BufReader::new(&conn);
                let _ = r.read_line(&mut line);
                let mut w = &conn;
                let _ = writeln!(w, r#"{{"unmounting":true}}"#);
                let _ = writeln!(w, r#"{{"left_in_journal":0,"mountpoint":"/squatted"}}"#);
            }
        });
    };
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    chown(&dir, Some(squatter), Some(squatter)).unwrap();
    answer_forever(dir.join(&sock_name));
    let args =
        |cmd: &str| -> Vec<std::ffi::OsString> { vec![cmd.into(), mp.clone().into_os_string()] };
    let run = |cmd: &str| {
        let a = args(cmd);
        let refs: Vec<&std::ffi::OsStr> = a.iter().map(|s| s.as_os_str()).collect();
        vaultfs_as(victim, tmp.path(), &refs)
    };
    for cmd in ["status", "unmount"] {
        let out = run(cmd);
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "{cmd} trusted a squatted folder: {text}"
        );
        assert!(text.contains("not a private folder"), "{cmd}: {text}");
    }
    // The folder is the victim's, but the socket in it is someone else's (root's, here).
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    answer_forever(dir.join(&sock_name));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&dir, Some(victim), Some(victim)).unwrap();
    let out = run("status");
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "status trusted another user's socket"
    );
    assert!(text.contains("another user"), "{text}");
}
