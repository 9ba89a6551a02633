//! `mount.fuse.vaultfs` (a symlink to the binary): what `mount -t fuse.vaultfs SOURCE DIR -o
//! OPTS` and `/etc/fstab` run. The options become `vaultfs mount` flags, and the mount goes to
//! the background once it answers (as mount(8) expects of a helper).
//!
//! SOURCE: `vaultfs` or `local` (the built-in store), `local:/data/dir`, or a server URL
//! (`https://...`, logged in with `vaultfs login` by the user who mounts).

use std::ffi::OsString;

/// Names under which the binary is the mount helper.
pub fn is_helper_name(argv0: &std::ffi::OsStr) -> bool {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    matches!(name, "mount.vaultfs" | "mount.fuse.vaultfs")
}

/// Options that are mount(8)'s or the kernel's business, or carry nothing for us.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "nofail",
    "_netdev",
    "rw",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "lazytime",
    "async",
    "sync",
    "dirsync",
    "silent",
    "loud",
];

/// Options with a value, and the flag each becomes.
const VALUED: &[(&str, &str)] = &[
    ("cache_size", "--cache-size"),
    ("cache_dir", "--cache-dir"),
    ("data_dir", "--data-dir"),
    ("server", "--server"),
    ("root", "--root"),
    ("timeout", "--timeout"),
    ("attr_ttl", "--attr-ttl"),
    ("dir_ttl", "--dir-ttl"),
    ("flush_timeout", "--flush-timeout"),
    ("log_file", "--log-file"),
    ("previews", "--previews"),
    ("preview_cache_size", "--preview-cache-size"),
];

/// `mount.fuse.vaultfs SOURCE DIR [-o OPTS]... [-n] [-s] [-v] [-f]` -> the arguments of
/// `vaultfs mount` (with `--daemon`), or `None` for a fake mount (`-f`).
pub fn translate(args: &[OsString]) -> Result<Option<Vec<OsString>>, String> {
    let mut positional = Vec::new();
    let mut opts: Vec<String> = Vec::new();
    let mut it = args.iter();
    let mut fake = false;
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                let v = it.next().ok_or("-o needs options")?;
                opts.extend(
                    v.to_str()
                        .ok_or("options must be UTF-8")?
                        .split(',')
                        .map(str::to_string),
                );
            }
            Some(o) if o.starts_with("-o") => opts.extend(o[2..].split(',').map(str::to_string)),
            Some("-n" | "-s" | "-v" | "-i") => {}
            Some("-f") => fake = true,
            Some(o) if o.starts_with('-') && o.len() > 1 => {
                return Err(format!("unknown option {o}"));
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] = <[OsString; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.vaultfs SOURCE DIR [-o OPTIONS]".to_string())?;
    let mut out: Vec<OsString> = vec!["mount".into(), dir, "--daemon".into()];
    let source = source.to_str().ok_or("SOURCE must be UTF-8")?.to_string();
    if source.starts_with("http://") || source.starts_with("https://") {
        out.extend(["--server".into(), source.into()]);
    } else if let Some(dir) = source.strip_prefix("local:") {
        out.extend(["--data-dir".into(), dir.into()]);
    } else if !matches!(source.as_str(), "vaultfs" | "local" | "none" | "") {
        return Err(format!(
            "unknown source `{source}`: use `vaultfs`, `local:/data/dir` or a server URL"
        ));
    }
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" {
            continue;
        }
        match (k, v) {
            ("ro", None) => out.push("--read-only".into()),
            ("allow_other", None) => out.push("--allow-other".into()),
            (k, Some(v)) => match VALUED.iter().find(|(name, _)| *name == k) {
                Some((_, flag)) => out.extend([(*flag).into(), v.into()]),
                None => return Err(format!("unknown mount option `{o}`")),
            },
            _ => return Err(format!("unknown mount option `{o}`")),
        }
    }
    Ok((!fake).then_some(out))
}

/// mount(8) runs helpers with an empty environment: give the mount the usual PATH (fusermount3)
/// and the user's HOME (default folders).
pub fn fill_environment() {
    if std::env::var_os("PATH").is_none() {
        // SAFETY: called at start-up, before any other thread exists.
        unsafe {
            std::env::set_var(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
        };
    }
    if std::env::var_os("HOME").is_none() {
        // SAFETY: getpwuid returns a static record or NULL; read at once, single-threaded.
        let home = unsafe {
            let pw = libc::getpwuid(libc::geteuid());
            (!pw.is_null() && !(*pw).pw_dir.is_null()).then(|| {
                std::ffi::CStr::from_ptr((*pw).pw_dir)
                    .to_string_lossy()
                    .into_owned()
            })
        };
        if let Some(h) = home {
            // SAFETY: as above.
            unsafe { std::env::set_var("HOME", h) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Option<Vec<String>>, String> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        translate(&args)
            .map(|o| o.map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect()))
    }

    #[test]
    fn fstab_options_become_flags() {
        assert_eq!(
            t(&[
                "vaultfs",
                "/mnt/v",
                "-o",
                "rw,_netdev,allow_other,ro,cache_size=1G,noauto"
            ])
            .unwrap()
            .unwrap(),
            [
                "mount",
                "/mnt/v",
                "--daemon",
                "--allow-other",
                "--read-only",
                "--cache-size",
                "1G"
            ]
        );
        assert_eq!(
            t(&["https://vault.example.com", "/v", "-n", "-oroot=Acme/Docs"])
                .unwrap()
                .unwrap(),
            [
                "mount",
                "/v",
                "--daemon",
                "--server",
                "https://vault.example.com",
                "--root",
                "Acme/Docs"
            ]
        );
        assert_eq!(
            t(&["local:/srv/store", "/v"]).unwrap().unwrap(),
            ["mount", "/v", "--daemon", "--data-dir", "/srv/store"]
        );
        assert_eq!(t(&["vaultfs", "/v", "-f"]).unwrap(), None);
        assert!(
            t(&["vaultfs", "/v", "-o", "bogus"])
                .unwrap_err()
                .contains("bogus")
        );
        assert!(t(&["vaultfs"]).is_err());
        assert!(t(&["ftp://x", "/v"]).is_err());
    }
}
