//! Third-party file system suites against real mounts on both backends:
//!
//! - pjdfstest (POSIX conformance) with `tests/pjdfstest/pjdfstest.toml`; every failure must be
//!   listed in `tests/pjdfstest/expected-failures.toml` with its reason, and a listed test that
//!   passes fails the run too, so the list stays exact;
//! - fsx (random reads, writes, mmap, truncates, ... checked against a model) with
//!   `tests/fsx/fsx.toml`, a fixed seed and [`FSX_OPS`] operations, then the file as stored by
//!   the backend must be the file fsx left.
//!
//! The tools are installed by `.ci/run` (`cargo install --locked pjdfstest fsx`); without them
//! these tests fail, unless `VAULTFS_SKIP_SUITES=1`.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::env::{Env, VAULT, Via};
use common::mount::{fuse_available, md5_of};
use common::suite::{expected_failures, find_tool, run_logged, skip_suites, suite_file, tail};
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;

/// fsx operations per backend, and its seed.
const FSX_OPS: u64 = 20_000;
const FSX_SEED: u64 = 20_251_121;

/// How long one tool run may take before it is killed and the test fails.
const TOOL_TIMEOUT: Duration = Duration::from_secs(900);

both!(pjdfstest, fsx);

/// The tool to run, or None when this test is to be skipped (no FUSE here, or
/// `VAULTFS_SKIP_SUITES=1`). A missing tool fails the test: CI installs it.
fn tool(name: &str) -> Option<PathBuf> {
    if skip_suites() {
        return None;
    }
    if !fuse_available() {
        eprintln!("skipped: needs root and /dev/fuse");
        return None;
    }
    match find_tool(name) {
        Some(p) => Some(p),
        None => panic!(
            "`{name}` is not installed (looked on PATH and in ~/.cargo/bin). Run .ci/run, which \
             installs it with `cargo install --locked pjdfstest fsx`, or set VAULTFS_SKIP_SUITES=1 \
             to skip the third-party suites"
        ),
    }
}

/// What one pjdfstest run said about each test case.
#[derive(Default)]
struct PjdResults {
    /// name -> "ok", "FAILED", "skipped", "failed as expected", "PASSED UNEXPECTEDLY"
    status: BTreeMap<String, String>,
    /// name -> the failure message pjdfstest printed
    detail: BTreeMap<String, String>,
}

fn parse_pjdfstest(out: &str) -> PjdResults {
    const STATUSES: [&str; 5] = [
        "PASSED UNEXPECTEDLY",
        "failed as expected",
        "FAILED",
        "skipped",
        "ok",
    ];
    let mut r = PjdResults::default();
    let mut current: Option<String> = None;
    for line in out.lines() {
        if line.starts_with(char::is_whitespace) {
            if let Some(name) = &current {
                let d = r.detail.entry(name.clone()).or_default();
                if d.lines().count() < 4 && !line.trim().is_empty() {
                    d.push_str(line.trim());
                    d.push(' ');
                }
            }
            continue;
        }
        current = None;
        let Some((name, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim();
        if let Some(s) = STATUSES.iter().find(|s| rest == **s) {
            r.status.insert(name.to_string(), s.to_string());
            if *s == "FAILED" {
                current = Some(name.to_string());
            }
        }
    }
    r
}

fn pjdfstest(via: Via) {
    let Some(bin) = tool("pjdfstest") else { return };
    let Some(env) = Env::new(via) else { return };
    // The suite switches to the dummy users of its config: they need to reach the mount.
    let m = env.mount(&["--allow-other"]);
    let expected = expected_failures("pjdfstest/expected-failures.toml", via);

    // The committed config, plus the expected failures, so pjdfstest reports them as such.
    let cfg_path = suite_file("pjdfstest/pjdfstest.toml");
    let mut cfg: toml::Table = toml::from_str(&fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let settings = cfg
        .entry("settings")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .unwrap();
    settings.insert(
        "expected_failures".into(),
        toml::Value::Array(
            expected
                .keys()
                .map(|k| toml::Value::String(k.clone()))
                .collect(),
        ),
    );
    let run_cfg = env._tmp.path().join("pjdfstest.toml");
    fs::write(&run_cfg, toml::to_string(&cfg).unwrap()).unwrap();

    let dir = env.vault().join("pjdfstest");
    fs::create_dir(&dir).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.arg("-c")
        .arg(&run_cfg)
        .arg("-p")
        .arg(&dir)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0");
    let started = Instant::now();
    let (_, out) = run_logged(cmd, &env._tmp.path().join("pjdfstest.out"), TOOL_TIMEOUT);
    let elapsed = started.elapsed();
    let r = parse_pjdfstest(&out);
    assert!(
        r.status.len() > 300,
        "pjdfstest ran only {} test cases; its output:\n{}\nmount log:\n{}",
        r.status.len(),
        tail(&out, 80),
        m.log_text()
    );

    let count = |s: &str| r.status.values().filter(|v| *v == s).count();
    eprintln!(
        "pjdfstest on {via:?} in {:.0?}: {} passed, {} failed as expected, {} skipped, \
         {} failed, {} passed unexpectedly",
        elapsed,
        count("ok"),
        count("failed as expected"),
        count("skipped"),
        count("FAILED"),
        count("PASSED UNEXPECTEDLY"),
    );

    let mut problems = Vec::new();
    let failed: Vec<_> = r.status.iter().filter(|(_, s)| *s == "FAILED").collect();
    if !failed.is_empty() {
        let mut p = format!(
            "{} test(s) failed that tests/pjdfstest/expected-failures.toml does not list \
             (a bug, or an entry to add with its reason):",
            failed.len()
        );
        for (name, _) in failed {
            let d = r.detail.get(name).map(String::as_str).unwrap_or("");
            p.push_str(&format!("\n  {name}: {}", d.trim()));
        }
        problems.push(p);
    }
    let passed: Vec<_> = r
        .status
        .iter()
        .filter(|(_, s)| *s == "PASSED UNEXPECTEDLY")
        .map(|(n, _)| n.as_str())
        .collect();
    if !passed.is_empty() {
        let mut p = format!(
            "{} test(s) listed in tests/pjdfstest/expected-failures.toml now pass on {via:?}: \
             remove them (or move them to the other backend's table):",
            passed.len()
        );
        for name in passed {
            p.push_str(&format!("\n  {name} (listed because: {})", expected[name]));
        }
        problems.push(p);
    }
    let ran: BTreeSet<&str> = r.status.keys().map(String::as_str).collect();
    let unknown: Vec<_> = expected
        .keys()
        .filter(|k| !ran.contains(k.as_str()))
        .collect();
    if !unknown.is_empty() {
        problems.push(format!(
            "tests/pjdfstest/expected-failures.toml lists test(s) pjdfstest did not run: \
             {unknown:?}"
        ));
    }
    assert!(
        problems.is_empty(),
        "pjdfstest on {via:?}:\n{}\n\nmount log (tail):\n{}",
        problems.join("\n\n"),
        tail(&m.log_text(), 40)
    );
    m.unmount();
}

fn fsx(via: Via) {
    let Some(bin) = tool("fsx") else { return };
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let file = env.vault().join("fsx.dat");
    let artifacts = env._tmp.path().join("fsx-artifacts");
    fs::create_dir_all(&artifacts).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.arg("-N")
        .arg(FSX_OPS.to_string())
        .arg("-S")
        .arg(FSX_SEED.to_string())
        .arg("-f")
        .arg(suite_file("fsx/fsx.toml"))
        .arg("-P")
        .arg(&artifacts)
        .arg(&file);
    let started = Instant::now();
    let (ok, out) = run_logged(cmd, &env._tmp.path().join("fsx.out"), TOOL_TIMEOUT);
    let elapsed = started.elapsed();
    if !ok {
        let log = fs::read_dir(&artifacts)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".fsxlog"))
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>();
        panic!(
            "fsx on {via:?} failed (reproduce: fsx -N {FSX_OPS} -S {FSX_SEED} -f \
             tests/fsx/fsx.toml FILE on a mount):\n{}\n\nits operation log (tail):\n{}\n\n\
             mount log (tail):\n{}",
            tail(&out, 60),
            tail(&log, 40),
            tail(&m.log_text(), 40)
        );
    }
    eprintln!("fsx on {via:?}: {FSX_OPS} operations in {elapsed:.0?}, all checks passed");

    // What fsx left is what the backend stores.
    let len = fs::metadata(&file).unwrap().len();
    let sum = md5_of(&file);
    env.wait_uploaded();
    let node = env.rt.block_on(async {
        let path = NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/fsx.dat")).unwrap();
        env.backend().node(&path).await.unwrap()
    });
    assert_eq!(node.size, Some(len), "stored size of fsx's file on {via:?}");
    assert_eq!(
        node.md5_checksum.as_deref(),
        Some(sum.as_str()),
        "stored md5 of fsx's file on {via:?}"
    );
    m.unmount();

    // And a new mount reads the same bytes.
    let m = env.mount(&[]);
    assert_eq!(md5_of(&file), sum, "fsx's file after a remount on {via:?}");
    m.unmount();
}
