//! `vaultfs mount`: the built-in store by default, or a server logged in with `vaultfs login`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::DataDir;
use crate::api::NodePath;
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::backend::remote::RemoteBackend;
use crate::fs::{self, MountOptions};
use crate::store::Store;

#[derive(Args)]
pub struct MountArgs {
    /// Where to mount (an existing, empty directory)
    mountpoint: PathBuf,
    #[command(flatten)]
    data: DataDir,
    /// Mount a server instead of the built-in store (log in first with `vaultfs login`)
    #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
    server: Option<String>,
    /// Seconds a server call may take, retries included, before it fails with EIO
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    timeout: f64,
    /// The folder to show at the mount point, e.g. "Local/My First Vault" [default: all accounts]
    #[arg(long, value_name = "PATH")]
    root: Option<String>,
    /// Mount read-only
    #[arg(long)]
    read_only: bool,
    /// Let other users into the mount (non-root needs `user_allow_other` in /etc/fuse.conf)
    #[arg(long)]
    allow_other: bool,
    /// Staging files, upload journal and read cache [default: $XDG_CACHE_HOME/vaultfs/<backend>]
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Bound of the read cache, in bytes (suffixes K, M, G allowed)
    #[arg(long, default_value = "2G", value_parser = parse_size, value_name = "BYTES")]
    cache_size: u64,
    /// Seconds the kernel may keep file attributes and names
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    attr_ttl: f64,
    /// Seconds a directory listing is reused before it is fetched again (changes made elsewhere
    /// show within this time)
    #[arg(long, default_value_t = 10.0, value_name = "S")]
    dir_ttl: f64,
}

/// `4096`, `512K`, `100M`, `2G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in `{s}` (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{s}` is not a size"))
}

fn parse_root(s: &str) -> Result<NodePath, String> {
    let r = if s.starts_with("/nodes/pth") {
        NodePath::parse_uri(s)
    } else {
        NodePath::from_segments(s.trim_matches('/').split('/').filter(|x| !x.is_empty()))
    };
    r.map_err(|e| format!("bad --root `{s}`: {e}"))
}

/// `$XDG_CACHE_HOME/vaultfs` or `~/.cache/vaultfs`.
fn cache_base() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("vaultfs");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".cache/vaultfs")
}

/// A cache directory name per backend, so journals never mix between stores.
fn backend_key(kind: &str, identity: &str) -> String {
    use md5::{Digest, Md5};
    let h = crate::store::blobs::hex(&Md5::digest(identity.as_bytes()));
    format!("{kind}-{}", &h[..12])
}

fn check_mountpoint(p: &Path) -> Result<(), String> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", p.display())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(format!(
            "{} is a stale mount (\"Transport endpoint is not connected\"): run `fusermount3 -u {0}` (or `umount -l {0}` as root) first",
            p.display()
        )),
        Err(e) => Err(format!("cannot use {} as mount point: {e}", p.display())),
    }
}

pub fn mount(args: MountArgs) -> Result<(), Box<dyn std::error::Error>> {
    check_mountpoint(&args.mountpoint)?;
    let root = match &args.root {
        Some(r) => parse_root(r)?,
        None => NodePath::root(),
    };
    if !(args.attr_ttl >= 0.0 && args.dir_ttl >= 0.0 && args.timeout > 0.0) {
        return Err(
            "--attr-ttl and --dir-ttl must be zero or more seconds, --timeout more than zero"
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
            let backend = RemoteBackend::new(config)?;
            let identity = format!("{} {}", creds.server, creds.email);
            let what = format!("{} as {}", creds.server, creds.email);
            run(
                backend,
                &args,
                opts,
                &rt,
                backend_key("remote", &identity),
                what,
            )
        }
        None => {
            let data_dir = args.data.path();
            let store = Store::open_local(&data_dir)
                .map_err(|e| format!("cannot open the store in {}: {e}", data_dir.display()))?;
            let identity = std::fs::canonicalize(&data_dir).unwrap_or(data_dir.clone());
            let key = backend_key("local", &identity.to_string_lossy());
            let what = format!("the built-in store in {}", data_dir.display());
            run(
                LocalBackend::new(Arc::new(store)),
                &args,
                opts,
                &rt,
                key,
                what,
            )
        }
    }
}

fn run<B: Backend>(
    backend: B,
    args: &MountArgs,
    mut opts: MountOptions,
    rt: &tokio::runtime::Runtime,
    key: String,
    what: String,
) -> Result<(), Box<dyn std::error::Error>> {
    opts.cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| cache_base().join(key));
    // The mount root must exist before the kernel is asked to show it.
    rt.block_on(backend.node(&opts.root))
        .map_err(|e| format!("cannot reach {} in {what}: {e}", opts.root))?;
    let mp = args.mountpoint.clone();
    fs::mount(backend, &args.mountpoint, opts, rt, move || {
        eprintln!("vaultfs: {} is ready ({what})", mp.display());
    })
    .map_err(|e| format!("mount failed: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_roots() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(
            parse_root("Local/My First Vault").unwrap().uri(),
            "/nodes/pth/Local/My First Vault"
        );
        assert_eq!(
            parse_root("/nodes/pth/Local").unwrap().uri(),
            "/nodes/pth/Local"
        );
        assert!(parse_root("Local/../x").is_err());
    }
}
