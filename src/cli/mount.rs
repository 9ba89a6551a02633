//! `vaultfs mount`: the built-in store by default, or a server logged in with `vaultfs login`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::control::Info;
use super::options::{MountArgs, parse_root};
use crate::api::NodePath;
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::backend::remote::RemoteBackend;
use crate::fs::status::StoreAt;
use crate::fs::{self, MountOptions};
use crate::store::Store;
use crate::sync::relock;

/// `$XDG_CACHE_HOME/vaultfs` or `~/.cache/vaultfs`.
fn cache_base() -> PathBuf {
    super::xdg_dir("XDG_CACHE_HOME", ".cache")
}

/// The freedesktop thumbnail cache: `$XDG_CACHE_HOME/thumbnails` or `~/.cache/thumbnails`.
fn thumbnail_cache() -> PathBuf {
    let base = cache_base();
    base.parent().unwrap_or(&base).join("thumbnails")
}

/// A cache directory name per backend, so journals never mix between stores.
fn backend_key(kind: &str, identity: &str) -> String {
    use crate::api::checksum::Md5;
    let h = crate::api::checksum::hex(&Md5::digest(identity.as_bytes()));
    format!("{kind}-{}", &h[..12])
}

/// Checks the mount point; a stale mount left by a daemon that died is unmounted first.
fn check_mountpoint(p: &Path) -> Result<(), String> {
    if fs::unmount::is_stale(p) {
        log::warn!(
            "{} is a stale mount (\"Transport endpoint is not connected\": its daemon died); unmounting it",
            p.display()
        );
        fs::unmount::detach(p)
            .map_err(|e| format!("cannot unmount the stale mount {}: {e}", p.display()))?;
    }
    let status = super::control::status(p);
    // Still mounted: refused, whether its daemon answers or not (one that cannot answer, out of
    // descriptors or stuck, once had a second mount stacked on it).
    if fs::unmount::is_vaultfs_mount(&super::control::canonical(p)) {
        let who = match &status {
            Some(Ok(st)) => format!("pid {}", st.pid),
            _ => "its daemon does not answer".to_string(),
        };
        return Err(format!(
            "{} is already mounted by vaultfs ({who}); `vaultfs unmount {0}` first",
            p.display(),
        ));
    }
    if let Some(Ok(st)) = status {
        // A daemon answers for this point, unmounted by the kernel (`umount`, a restart) and
        // still storing what was written: this mount takes its journal over (`owner`), so
        // scripts and fstab can remount at once.
        // Not on the terminal of `mount`: nothing is wrong.
        log::debug!(
            "{} was unmounted; its daemon (pid {}) is finishing its uploads",
            p.display(),
            st.pid
        );
    }
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", p.display())),
        Err(e) => Err(format!("cannot use {} as mount point: {e}", p.display())),
    }
}

/// systemd's path escaping (`systemd-escape --path`): `/home/a/My Vault` -> `home-a-My\x20Vault`.
pub fn escape_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    let t = s.trim_matches('/');
    if t.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, b) in t.bytes().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// `$XDG_STATE_HOME/vaultfs/<escaped mount point>.log`.
fn default_log_file(mountpoint: &Path) -> PathBuf {
    super::xdg_dir("XDG_STATE_HOME", ".local/state")
        .join(format!("{}.log", escape_path(mountpoint)))
}

pub fn mount(mut args: MountArgs) -> Result<(), Box<dyn std::error::Error>> {
    check_mountpoint(&args.mountpoint)?;
    args.mountpoint = super::control::canonical(&args.mountpoint);
    let verdict = if args.daemon {
        let log = args
            .log_file
            .clone()
            .unwrap_or_else(|| default_log_file(&args.mountpoint));
        Some(Arc::new(super::daemon::fork(&log)?))
    } else {
        None
    };
    // Up to the hard limit, as systemd gives its services: what the mount keeps open is
    // bounded by a share of it (`fs`, descriptors), whatever its history.
    let limit = fs::raise_open_files_limit();
    log::debug!("open files: limit {limit}");
    let result = mount_checked(&args, verdict.clone());
    if let (Err(e), Some(v)) = (&result, &verdict) {
        v.fail(&e.to_string());
    }
    result
}

fn mount_checked(
    args: &MountArgs,
    verdict: Option<Arc<super::daemon::Verdict>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = match &args.root {
        Some(r) => parse_root(r)?,
        None => NodePath::root(),
    };
    if !(args.attr_ttl >= 0.0
        && args.dir_ttl >= 0.0
        && args.poll_interval >= 0.0
        && args.flush_timeout >= 0.0
        && args.timeout > 0.0)
    {
        return Err(
            "--attr-ttl, --dir-ttl, --poll-interval and --flush-timeout must be zero or more seconds, --timeout more than zero"
                .into(),
        );
    }
    let opts = MountOptions {
        root,
        read_only: args.read_only,
        allow_other: args.allow_other,
        cache_size: args.cache_size,
        attr_ttl: Duration::from_secs_f64(args.attr_ttl),
        dir_ttl: Duration::from_secs_f64(args.dir_ttl),
        poll_interval: Duration::from_secs_f64(args.poll_interval),
        flush_timeout: Duration::from_secs_f64(args.flush_timeout),
        passthrough: !args.no_passthrough,
        read_ahead_kb: args.read_ahead,
        kernel_writes: !args.no_kernel_writes,
        allow_indexing: args.allow_indexing,
        thumbnails: (!args.no_thumbnails).then(thumbnail_cache),
        ..MountOptions::default()
    };
    let rt = tokio::runtime::Runtime::new()?;
    match &args.server {
        Some(url) => {
            let creds = super::login::credentials_for(url)?;
            let mut config = creds.remote_config();
            config.total_timeout = Duration::from_secs_f64(args.timeout);
            config.idle_timeout = config.idle_timeout.min(config.total_timeout);
            config.connect_timeout = config.connect_timeout.min(config.total_timeout);
            (config.upload_limit, config.download_limit) =
                args.bwlimit.unwrap_or_default().buckets();
            // A `vaultfs login` of the same user while mounted: taken when the server refuses
            // the token in use (issue 47, item 12). Another user's login is not this mount's.
            let (file, server, email) = (
                super::login::credentials_path(),
                creds.server.clone(),
                creds.email.clone(),
            );
            config.relogin = Some(crate::backend::remote::Relogin(std::sync::Arc::new(
                move || {
                    let newer = super::login::credentials_in(&file, &server).ok()?;
                    (newer.email == email).then_some(newer.token)
                },
            )));
            let backend = RemoteBackend::new(config)?;
            let identity = format!("{} {}", creds.server, creds.email);
            let info = Info {
                backend: format!("{} as {}", creds.server, creds.email),
                token_expires: Some(crate::api::format_time(creds.expires_at)),
                store: Some(StoreAt::Server(url.clone())),
            };
            let key = backend_key("remote", &identity);
            let opts = MountOptions {
                source: url.clone(),
                max_file_size: args.max_file_size.unwrap_or(opts.max_file_size),
                ..opts
            };
            run(backend, args, opts, &rt, key, info, verdict)
        }
        None => {
            let data_dir = args.data.path();
            // Earlier versions are kept under the retention rule, readable in `.versions/`.
            let config = args
                .retention
                .apply(args.previews.apply(crate::store::StoreConfig::default()));
            let store = Store::open_local_with(&data_dir, config)
                .map_err(|e| format!("cannot open the store in {}: {e}", data_dir.display()))?;
            store.start_previews(
                crate::store::default_preview_workers(),
                &crate::store::this_program(),
            )?;
            let identity = std::fs::canonicalize(&data_dir).unwrap_or(data_dir.clone());
            let key = backend_key("local", &identity.to_string_lossy());
            let info = Info {
                backend: format!("the built-in store in {}", data_dir.display()),
                token_expires: None,
                store: Some(StoreAt::DataDir(identity.clone())),
            };
            let store_max = store.config().max_file_size;
            let store = Arc::new(store);
            store.start_expiry(crate::store::EXPIRE_EVERY)?;
            let backend = LocalBackend::new(store);
            let mut opts = opts;
            opts.max_file_size = args.max_file_size.unwrap_or(store_max).min(store_max);
            if args.data.is_given() {
                opts.source = format!("local:{}", identity.display());
            }
            run(backend, args, opts, &rt, key, info, verdict)
        }
    }
}

fn run<B: Backend>(
    backend: B,
    args: &MountArgs,
    mut opts: MountOptions,
    rt: &tokio::runtime::Runtime,
    key: String,
    info: Info,
    verdict: Option<Arc<super::daemon::Verdict>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let what = info.backend.clone();
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| cache_base().join(key));
    opts.cache_dir = super::owner::own_cache_dir(&cache_dir, &args.mountpoint)?;
    // The mount root must exist before the kernel is asked to show it; out of reach, the mount
    // starts from the tree its cache dir kept, if it has one (waiting for it `START_PROBE`).
    let cannot = |e: &dyn std::fmt::Display| format!("cannot reach {} in {what}: {e}", opts.root);
    if fs::offline::can_start_offline(&opts.cache_dir, &opts.root) {
        let probe = fs::offline::START_PROBE;
        match rt.block_on(async { tokio::time::timeout(probe, backend.node(&opts.root)).await }) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if !fs::offline::unreachable(&e) => return Err(cannot(&e).into()),
            Ok(Err(e)) => {
                log::warn!("{}; starting offline", cannot(&e));
                opts.start_offline = true;
            }
            Err(_) => {
                log::warn!("{}; starting offline", cannot(&"no answer within 2 s"));
                opts.start_offline = true;
            }
        }
    } else {
        rt.block_on(backend.node(&opts.root))
            .map_err(|e| cannot(&e))?;
    }
    let mp = args.mountpoint.clone();
    let before = dev_of(&mp);
    let server = Arc::new(Mutex::new(None));
    let server2 = server.clone();
    let handle = rt.handle().clone();
    let result = fs::mount(backend, &args.mountpoint, opts, rt, move |control| {
        match super::control::start(&handle, &mp, control.clone(), info) {
            Ok(s) => *relock(&server2) = Some(s),
            Err(e) => {
                log::warn!("no control socket (`vaultfs status` will not see this mount): {e}")
            }
        }
        // The FUSE threads start when this returns: wait for the mount to answer elsewhere.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while dev_of(&mp) == before {
                if std::time::Instant::now() > deadline {
                    let msg = format!("{} did not answer within 30 s", mp.display());
                    log::error!("{msg}; unmounting");
                    if let Some(v) = &verdict {
                        v.fail(&msg);
                    }
                    control.unmount();
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            log::info!("{} is ready ({what})", mp.display());
            super::notify::notify(&format!(
                "READY=1\nSTATUS=Mounted {} ({what})",
                mp.display()
            ));
            if let Some(v) = &verdict {
                v.ok();
            }
        });
    });
    let server = relock(&server).take();
    if let Some(s) = server {
        rt.block_on(s.close());
    }
    result.map_err(|e| format!("mount failed: {e}"))?;
    Ok(())
}

fn dev_of(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.dev())
}
