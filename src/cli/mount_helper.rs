//! `mount.fuse.vaultfs` (a symlink to the binary): what `mount -t fuse.vaultfs SOURCE DIR -o
//! OPTS` and `/etc/fstab` run. The options become `vaultfs mount` flags (each flag is an option:
//! `cache_size=4G`, `no_passthrough`; `options.rs`), and the mount goes to
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

/// The helper's arguments: positional ones, the `-o` options one by one, and whether `-f`
/// (a fake mount) was given.
fn parse(args: &[OsString]) -> Result<(Vec<OsString>, Vec<String>, bool), String> {
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
    Ok((positional, opts, fake))
}

/// `mount -o remount,...` (`None` when the options do not ask for one): what the kernel can
/// change on a running FUSE mount by itself, done with mount(2); anything the daemon would
/// have to reopen is refused, saying how to change it.
pub fn remount(args: &[OsString]) -> Option<Result<(), String>> {
    let (positional, opts, fake) = parse(args).ok()?;
    if !opts.iter().any(|o| o == "remount") {
        return None;
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (positional, fake);
        Some(Err(
            "mount -o remount works on Linux only: unmount and mount again".into(),
        ))
    }
    #[cfg(target_os = "linux")]
    Some((|| {
        let flags = remount_flags(&opts)?;
        let dir = positional.last().ok_or("usage: mount -o remount DIR")?;
        if fake {
            return Ok(());
        }
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
            .map_err(|_| "NUL in the mount point".to_string())?;
        // SAFETY: a valid C string; no source, type or data (a remount keeps them).
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                c.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("remount of {}: {e}", dir.to_string_lossy()));
        }
        Ok(())
    })())
}

/// The FUSE kernel's own options, shown in `/proc/mounts` and passed back by `mount -o
/// remount`; they stay as they are.
#[cfg(target_os = "linux")]
const FUSE_KERNEL: &[&str] = &[
    "user_id",
    "group_id",
    "default_permissions",
    "allow_other",
    "rootmode",
    "max_read",
    "blksize",
    "fd",
    "fsname",
    "subtype",
];

/// mount(2) flags of a remount with `opts`: ro or rw and exec or noexec change; vaultfs keeps
/// nosuid, nodev and noatime; its own options cannot change while it runs.
#[cfg(target_os = "linux")]
fn remount_flags(opts: &[String]) -> Result<libc::c_ulong, String> {
    let mut flags = libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    for o in opts.iter().filter(|o| !o.is_empty() && *o != "remount") {
        match o.as_str() {
            "ro" => flags |= libc::MS_RDONLY,
            "noexec" => flags |= libc::MS_NOEXEC,
            "suid" | "dev" => {
                return Err(format!("`{o}`: a vaultfs mount is always nosuid,nodev"));
            }
            k if IGNORED.contains(&k) || k.starts_with("x-") || k.starts_with("comment") => {}
            _ => {
                let k = o.split_once('=').map_or(o.as_str(), |(k, _)| k);
                // mount(8) repeats the FUSE kernel's options of the running mount.
                if FUSE_KERNEL.contains(&k) {
                    continue;
                }
                return Err(format!(
                    "`{k}` cannot change while vaultfs runs: unmount it and mount it again"
                ));
            }
        }
    }
    Ok(flags)
}

/// `mount.fuse.vaultfs SOURCE DIR [-o OPTS]... [-n] [-s] [-v] [-f]` -> the arguments of
/// `vaultfs mount` (with `--daemon`), or `None` for a fake mount (`-f`).
pub fn translate(args: &[OsString]) -> Result<Option<Vec<OsString>>, String> {
    let (positional, opts, fake) = parse(args)?;
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
        // `ro` as mount(8) spells it; every other option is a flag of `vaultfs mount`.
        let k = if k == "ro" { "read_only" } else { k };
        let opt = super::options::find(k).ok_or_else(|| format!("unknown mount option `{o}`"))?;
        match (opt.takes_value, v) {
            (true, Some(v)) => out.extend([opt.flag.into(), v.into()]),
            (false, None) => out.push(opt.flag.into()),
            (true, None) => return Err(format!("mount option `{k}` needs a value: {k}=...")),
            (false, Some(_)) => return Err(format!("mount option `{k}` takes no value")),
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

    #[test]
    #[cfg(target_os = "linux")]
    fn a_remount_changes_what_the_kernel_can_and_refuses_the_rest() {
        let o = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        let base = libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
        // As mount(8) passes them: the new flag and the running mount's options.
        let ro = o("remount,ro,nosuid,nodev,noatime,user_id=0,group_id=0,default_permissions");
        assert_eq!(remount_flags(&ro), Ok(base | libc::MS_RDONLY));
        assert_eq!(
            remount_flags(&o("remount,rw,noexec")),
            Ok(base | libc::MS_NOEXEC)
        );
        for bad in [
            "remount,cache_size=1G",
            "remount,server=http://x",
            "remount,suid",
        ] {
            assert!(remount_flags(&o(bad)).is_err(), "{bad}");
        }
        let args: Vec<OsString> = ["vaultfs", "/mnt/v", "-o", "remount,ro", "-f"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(remount(&args), Some(Ok(())));
        assert_eq!(remount(&args[..2]), None);
    }

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
