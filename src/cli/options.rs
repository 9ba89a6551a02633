//! The options of `vaultfs mount`, declared once: the fields of `MountArgs` (clap) are the table.
//! Each long flag `--cache-size` is also the config key `cache_size` (`[mount]` of config.toml)
//! and the mount helper's `-o cache_size=`; its default and help are clap's. The config file and
//! the helper read this table, so a flag added to `MountArgs` is a key and an `-o` option at
//! once, and `every_option_works_the_three_ways` sets it each way.

use clap::Args;

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
    let cmd = super::mount::MountArgs::augment_args(clap::Command::new("mount"));
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
    use crate::cli::{Cli, Command, mount::MountArgs, parse_args};

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
}
