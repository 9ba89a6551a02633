//! The options of `vaultfs mount`, declared once: the fields of `MountArgs` (clap) are the table.
//! Each long flag `--cache-size` is also the config key `cache_size` (`[mount]` of config.toml)
//! and the mount helper's `-o cache_size=`; its default and help are clap's. The config file and
//! the helper read this table, so a flag added to `MountArgs` is a key and an `-o` option at
//! once, and `every_option_works_the_three_ways` sets it each way.

use std::path::{Path, PathBuf};

use clap::Args;

use super::DataDir;
use crate::api::NodePath;
use crate::backend::bwlimit::BwLimit;
use crate::fs::MountOptions;

/// The options: each is also a config.toml key and a mount helper `-o` option (below).
/// Defaults that MountOptions has are taken from it.
#[derive(Args, Debug, PartialEq)]
#[command(
    after_help = "Every option is also a key of [mount] in ~/.config/vaultfs/config.toml \
    and an -o option of `mount -t fuse.vaultfs` (fstab), without the dashes and with _ for -: \
    cache_size = \"4G\", read_only = true; -o cache_size=4G,read_only (or ro)."
)]
pub struct MountArgs {
    /// Where to mount (an existing, empty directory)
    pub(super) mountpoint: PathBuf,
    #[command(flatten)]
    pub(super) data: DataDir,
    /// Mount a server instead of the built-in store (log in first with `vaultfs login`)
    #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
    pub(super) server: Option<String>,
    /// Seconds a server call may take, retries included, before it fails with EIO
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    pub(super) timeout: f64,
    /// The folder to show at the mount point, e.g. "Local/My First Vault" [default: all accounts]
    #[arg(long, value_name = "PATH")]
    pub(super) root: Option<String>,
    /// Mount read-only
    #[arg(long)]
    pub(super) read_only: bool,
    /// Let other users into the mount (non-root needs `user_allow_other` in /etc/fuse.conf)
    #[arg(long)]
    pub(super) allow_other: bool,
    /// Staging files, upload journal and read cache [default: $XDG_CACHE_HOME/vaultfs/<backend>]
    #[arg(long, value_name = "DIR")]
    pub(super) cache_dir: Option<PathBuf>,
    /// Bound of the read cache, in bytes (suffixes K, M, G allowed)
    #[arg(long, default_value = format_size(MountOptions::default().cache_size),
          value_parser = parse_size, value_name = "BYTES")]
    pub(super) cache_size: u64,
    #[arg(long, value_parser = parse_size, value_name = "BYTES", help = format!(
        "Largest file the store takes; writing past it fails at once with EFBIG [default: the \
         built-in store's own limit, {} for a server]",
        format_size(MountOptions::default().max_file_size)))]
    pub(super) max_file_size: Option<u64>,
    /// Seconds the kernel may keep file attributes and names
    #[arg(long, default_value_t = MountOptions::default().attr_ttl.as_secs_f64(), value_name = "S")]
    pub(super) attr_ttl: f64,
    /// Seconds a directory listing is reused before it is fetched again (changes made elsewhere
    /// show within this time)
    #[arg(long, default_value_t = MountOptions::default().dir_ttl.as_secs_f64(), value_name = "S")]
    pub(super) dir_ttl: f64,
    /// Against a server without a change feed: seconds between listings of the folders used
    /// lately, so changes made elsewhere show (0: never; with a feed, changes show at once)
    #[arg(long, default_value_t = MountOptions::default().poll_interval.as_secs_f64(), value_name = "S")]
    pub(super) poll_interval: f64,
    /// Serve every read and write through the daemon: no FUSE passthrough (by default a file
    /// whose bytes are whole on local disk is read by the kernel itself, and a file created or
    /// truncated is written by it, where it allows that)
    #[arg(long)]
    pub(super) no_passthrough: bool,
    /// Write through the daemon, still reading through passthrough
    #[arg(long)]
    pub(super) no_kernel_writes: bool,
    /// Let desktop indexers (Tracker, LocalSearch, media scanners) walk the mount: by default
    /// its root answers `.trackerignore` and `.nomedia`, which keep them out (an indexer reads
    /// every file, and a remote mount would download the vault whole)
    #[arg(long)]
    pub(super) allow_indexing: bool,
    /// Write no thumbnails for file managers: by default the mount puts page one of each listed
    /// file's preview into the shared thumbnail cache ($XDG_CACHE_HOME/thumbnails), where file
    /// managers look before reading a file to make one
    #[arg(long)]
    pub(super) no_thumbnails: bool,
    /// The kernel's read-ahead for the mount, in KiB; 0 keeps the kernel's (128) [default:
    /// 1024 with passthrough, else the kernel's]
    #[arg(long, value_name = "KIB")]
    pub(super) read_ahead: Option<u32>,
    /// Seconds an unmount (SIGTERM, Ctrl-C, `vaultfs unmount`) waits for pending uploads; what is
    /// left stays journaled for the next mount
    #[arg(long, default_value_t = MountOptions::default().flush_timeout.as_secs_f64(),
          value_name = "S")]
    pub(super) flush_timeout: f64,
    /// Bandwidth limit of a server's transfers in bytes a second, rclone's spelling: `10M` both
    /// ways, `1M:5M` upload:download, `off` for none on a side
    #[arg(long, value_parser = parse_bwlimit, value_name = "RATE")]
    pub(super) bwlimit: Option<BwLimit>,
    /// Run in the background: return once the mount answers (exit 0), or fail with the reason
    #[arg(long)]
    pub(super) daemon: bool,
    /// Log file of --daemon [default: $XDG_STATE_HOME/vaultfs/<mount point>.log]
    #[arg(long, value_name = "FILE")]
    pub(super) log_file: Option<PathBuf>,
    /// Previews of the built-in store (a server has its own)
    #[command(flatten)]
    pub(super) previews: super::PreviewArgs,
    #[command(flatten)]
    pub(super) retention: super::RetentionArgs,
}

impl MountArgs {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

/// `2G` for 2 GiB: the largest suffix that is exact (what `parse_size` reads back).
pub fn format_size(n: u64) -> String {
    for (shift, suffix) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if n != 0 && n.trailing_zeros() >= shift {
            return format!("{}{suffix}", n >> shift);
        }
    }
    n.to_string()
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

pub(super) fn parse_bwlimit(s: &str) -> Result<BwLimit, String> {
    BwLimit::parse(s, parse_size)
}

pub(super) fn parse_root(s: &str) -> Result<NodePath, String> {
    let r = if s.starts_with("/nodes/pth") {
        NodePath::parse_uri(s)
    } else {
        NodePath::from_segments(s.trim_matches('/').split('/').filter(|x| !x.is_empty()))
    };
    r.map_err(|e| format!("bad --root `{s}`: {e}"))
}

/// One option of `vaultfs mount`.
pub struct MountOption {
    /// `--cache-size`
    pub flag: String,
    /// `cache_size`: the config key and the `-o` name.
    pub key: String,
    /// `--cache-size 4G` rather than `--read-only`.
    pub takes_value: bool,
}

/// Every option of `vaultfs mount` (the mount point aside), from its clap definition.
pub fn mount_options() -> Vec<MountOption> {
    let cmd = MountArgs::augment_args(clap::Command::new("mount"));
    cmd.get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            Some(MountOption {
                flag: format!("--{long}"),
                key: long.replace('-', "_"),
                takes_value: a.get_action().takes_values(),
            })
        })
        .collect()
}

/// The option called `key` (`cache_size` or `cache-size`).
pub fn find(key: &str) -> Option<MountOption> {
    let key = key.replace('-', "_");
    mount_options().into_iter().find(|o| o.key == key)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::cli::{Cli, Command, parse_args};

    fn parsed(argv: &[OsString], config: &std::path::Path) -> MountArgs {
        match parse_args(argv.to_vec(), config) {
            Ok(Cli {
                command: Command::Mount(a),
            }) => a,
            Ok(_) => unreachable!(),
            Err(crate::cli::ArgsError::Clap(e)) => panic!("{argv:?}: {e}"),
            Err(crate::cli::ArgsError::Config(e)) => panic!("{argv:?}: {e}"),
        }
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// A value for `arg` other than its default: one of its possible values, or one by the
    /// kind of value it takes.
    fn sample(arg: &clap::Arg) -> String {
        let default = arg.get_default_values().first().cloned();
        if let Some(v) = arg
            .get_possible_values()
            .into_iter()
            .map(|p| p.get_name().to_string())
            .find(|p| Some(p.as_str()) != default.as_ref().and_then(|d| d.to_str()))
        {
            return v;
        }
        let kind = arg.get_value_names().and_then(|n| n.first()).cloned();
        match kind.as_ref().map(|k| k.as_str()) {
            Some("S") => "2.5",
            Some("BYTES") => "3M",
            Some("KIB") => "256",
            Some("N") => "7",
            Some("DIR") => "/srv/somewhere",
            Some("FILE") => "/var/log/somewhere.log",
            Some("URL") => "http://127.0.0.1:9",
            Some("PATH") => "Local/Docs",
            Some("RATE") => "1M:5M",
            other => panic!(
                "--{}: no sample value for {other:?}; add one here",
                arg.get_long().unwrap()
            ),
        }
        .to_string()
    }

    /// The same as a TOML value: numbers as numbers, as people write them.
    fn toml_value(v: &str) -> String {
        if v.parse::<f64>().is_ok() {
            v.to_string()
        } else {
            format!("{v:?}")
        }
    }

    /// Each option set on the command line, in config.toml and with `-o` parses to the same
    /// arguments, which differ from those without it.
    #[test]
    fn every_option_works_the_three_ways() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none.toml");
        let file = dir.path().join("config.toml");
        let cmd = MountArgs::augment_args(clap::Command::new("mount"));
        let options = mount_options();
        assert!(options.len() >= 19, "{}", options.len());
        let plain = parsed(&os(&["vaultfs", "mount", "/m"]), &none);
        for opt in &options {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(&opt.flag[2..]))
                .unwrap();
            let value = opt.takes_value.then(|| sample(arg));
            let mut cli = os(&["vaultfs", "mount", "/m", "--daemon", &opt.flag]);
            cli.extend(value.iter().map(OsString::from));
            let from_cli = parsed(&cli, &none);
            let mut alone = cli.clone();
            alone.remove(3);
            assert!(
                parsed(&alone, &none) != plain,
                "{} changes nothing",
                opt.flag
            );

            let line = match &value {
                Some(v) => format!("{} = {}", opt.key, toml_value(v)),
                None => format!("{} = true", opt.key),
            };
            std::fs::write(&file, format!("[mount]\n{line}\n")).unwrap();
            let from_file = parsed(&os(&["vaultfs", "mount", "/m", "--daemon"]), &file);
            assert_eq!(from_file, from_cli, "config.toml `{line}`");

            let o = match &value {
                Some(v) => format!("{}={v}", opt.key),
                None => opt.key.clone(),
            };
            let helper = super::super::mount_helper::translate(&os(&["vaultfs", "/m", "-o", &o]))
                .unwrap_or_else(|e| panic!("-o {o}: {e}"))
                .unwrap();
            let argv: Vec<OsString> = std::iter::once("vaultfs".into()).chain(helper).collect();
            assert_eq!(parsed(&argv, &none), from_cli, "-o {o}");
        }
    }

    /// A flag given twice (by config.toml and by the user) is not an error: the last one wins.
    #[test]
    fn later_flags_win() {
        let none = std::path::Path::new("/nonexistent/config.toml");
        let a = parsed(
            &os(&[
                "vaultfs",
                "mount",
                "/m",
                "--daemon",
                "--daemon",
                "--attr-ttl",
                "3",
                "--attr-ttl",
                "4",
            ]),
            none,
        );
        let b = parsed(
            &os(&["vaultfs", "mount", "/m", "--daemon", "--attr-ttl", "4"]),
            none,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn sizes_and_roots() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        for n in [0, 1000, 4096, 2 << 30, 1 << 40, 3 << 20, (1 << 20) + 1] {
            assert_eq!(parse_size(&format_size(n)), Ok(n), "{}", format_size(n));
        }
        assert_eq!(format_size(2 << 30), "2G");
        assert_eq!(
            parse_root("Local/My First Vault").unwrap().uri(),
            "/nodes/pth/Local/My First Vault"
        );
        assert_eq!(
            parse_root("/nodes/pth/Local").unwrap().uri(),
            "/nodes/pth/Local"
        );
        assert!(parse_root("Local/../x").is_err());
        let b = parse_bwlimit("1M:5M").unwrap();
        assert_eq!((b.upload, b.download), (Some(1 << 20), Some(5 << 20)));
        assert_eq!(parse_bwlimit("10M").unwrap().download, Some(10 << 20));
    }
}
