//! Running third-party suites (pjdfstest, fsx, fstests): finding the tool, running it with a
//! time limit, and the committed expected-failures lists.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::env::Via;

/// The path of an installed tool: on PATH, or in cargo's bin directory.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(h).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Whether `VAULTFS_SKIP_SUITES=1` asks to skip the third-party suites (said on stderr).
pub fn skip_suites() -> bool {
    let skip = std::env::var("VAULTFS_SKIP_SUITES").as_deref() == Ok("1");
    if skip {
        eprintln!("skipped: VAULTFS_SKIP_SUITES=1");
    }
    skip
}

/// Runs `cmd` with its output to `out`, killing it after `limit`. Returns whether it exited
/// successfully, and its output.
pub fn run_logged(mut cmd: Command, out: &Path, limit: Duration) -> (bool, String) {
    let f = File::create(out).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = strip_ansi(&fs::read_to_string(out).unwrap_or_default());
    match status {
        Some(s) => (s.success(), text),
        None => panic!(
            "{cmd:?} did not finish within {limit:?}; its output so far:\n{}",
            tail(&text, 60)
        ),
    }
}

/// `s` without terminal colour sequences.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A file under `tests/`.
pub fn suite_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

/// The expected failures in `tests/<rel>` for `via`: `[all]` and the backend's own table,
/// name -> reason. Every entry needs a reason.
pub fn expected_failures(rel: &str, via: Via) -> BTreeMap<String, String> {
    let path = suite_file(rel);
    let text = fs::read_to_string(&path).unwrap();
    let doc: toml::Table = toml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid TOML: {e}", path.display()));
    let own = match via {
        Via::Local => "local",
        Via::Remote => "remote",
    };
    let mut out = BTreeMap::new();
    for (section, entries) in &doc {
        assert!(
            ["all", "local", "remote"].contains(&section.as_str()),
            "{}: unknown table [{section}] (use [all], [local] or [remote])",
            path.display()
        );
        if section != "all" && section != own {
            continue;
        }
        let entries = entries
            .as_table()
            .unwrap_or_else(|| panic!("{}: [{section}] must be a table", path.display()));
        for (name, reason) in entries {
            let reason = reason.as_str().unwrap_or_default().trim();
            assert!(
                !reason.is_empty(),
                "{}: `{name}` needs a reason",
                path.display()
            );
            out.insert(name.clone(), reason.to_string());
        }
    }
    out
}
