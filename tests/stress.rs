//! Load: 16 workers doing mixed operations (create, write, append, truncate, read, rename,
//! delete, mkdir, list) at once against one mount, for a bounded number of steps, each checked
//! against an in-memory model of what its part of the tree must hold; then the whole tree is
//! checked again through the mount and, after a remount, from the store. No deadlock (a
//! watchdog), no lost file, no error when nothing failed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use common::env::{Env, Via, within};
use common::pattern;

const WORKERS: u64 = 16;
const STEPS: usize = 300;

/// One worker's view: files (relative to its folder) with their bytes, and its folders.
#[derive(Default, Clone)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
    /// What the worker did, to explain a failure.
    log: Vec<String>,
}

/// xorshift: reproducible per worker.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &'a [String]) -> Option<&'a String> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }
}

fn worker(root: PathBuf, seed: u64) -> Model {
    let mut m = Model::default();
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    fs::create_dir(&root).unwrap_or_else(|e| panic!("worker {seed}: mkdir: {e}"));
    for step in 0..STEPS {
        let files: Vec<String> = m.files.keys().cloned().collect();
        let dirs: Vec<String> = m.dirs.iter().cloned().collect();
        let ctx = |what: &str| format!("worker {seed} step {step}: {what}");
        match rng.below(10) {
            0 | 1 => {
                // Create or overwrite, at the top or in a folder.
                let dir = if rng.below(2) == 0 {
                    rng.pick(&dirs).cloned()
                } else {
                    None
                };
                let name = format!("f{}.bin", rng.below(12));
                let rel = dir.map_or(name.clone(), |d| format!("{d}/{name}"));
                let data = pattern(rng.below(64 * 1024) as usize, rng.next());
                fs::write(root.join(&rel), &data)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx(&format!("write {rel}"))));
                m.log
                    .push(format!("{step}: write {rel} ({} bytes)", data.len()));
                m.files.insert(rel, data);
            }
            2 => {
                if let Some(rel) = rng.pick(&files) {
                    let extra = pattern(rng.below(5000) as usize + 1, rng.next());
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(root.join(rel))
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx("open append")));
                    f.write_all(&extra).unwrap();
                    m.files.get_mut(rel).unwrap().extend_from_slice(&extra);
                }
            }
            3 => {
                if let Some(rel) = rng.pick(&files) {
                    let len = rng.below(70_000);
                    OpenOptions::new()
                        .write(true)
                        .open(root.join(rel))
                        .unwrap()
                        .set_len(len)
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx("truncate")));
                    m.files.get_mut(rel).unwrap().resize(len as usize, 0);
                }
            }
            4 | 5 => {
                if let Some(rel) = rng.pick(&files) {
                    let got = fs::read(root.join(rel))
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx(&format!("read {rel}"))));
                    assert!(
                        got == m.files[rel],
                        "{}",
                        ctx(&format!(
                            "{rel}: {} bytes read, {} expected",
                            got.len(),
                            m.files[rel].len()
                        ))
                    );
                }
            }
            6 => {
                // Rename, possibly over another file, possibly into or out of a folder.
                if let Some(from) = rng.pick(&files).cloned() {
                    let dir = if rng.below(2) == 0 {
                        rng.pick(&dirs).cloned()
                    } else {
                        None
                    };
                    let name = format!("r{}.bin", rng.below(8));
                    let to = dir.map_or(name.clone(), |d| format!("{d}/{name}"));
                    if to != from {
                        fs::rename(root.join(&from), root.join(&to)).unwrap_or_else(|e| {
                            panic!("{}: {e}", ctx(&format!("rename {from} {to}")))
                        });
                        m.log.push(format!("{step}: rename {from} -> {to}"));
                        let data = m.files.remove(&from).unwrap();
                        m.files.insert(to, data);
                    }
                }
            }
            7 => {
                if let Some(rel) = rng.pick(&files).cloned() {
                    fs::remove_file(root.join(&rel))
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx(&format!("unlink {rel}"))));
                    m.log.push(format!("{step}: unlink {rel}"));
                    m.files.remove(&rel);
                }
            }
            8 => {
                let d = format!("d{}", rng.below(4));
                if !m.dirs.contains(&d) {
                    fs::create_dir(root.join(&d))
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx("mkdir")));
                    m.dirs.insert(d);
                }
            }
            _ => {
                let mut names: Vec<String> = fs::read_dir(&root)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("readdir")))
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                names.sort();
                let mut want: Vec<String> = m
                    .files
                    .keys()
                    .filter(|k| !k.contains('/'))
                    .cloned()
                    .chain(m.dirs.iter().cloned())
                    .collect();
                want.sort();
                assert_eq!(names, want, "{}", ctx("listing"));
            }
        }
    }
    m
}

/// Every file of every worker holds its model's bytes, and nothing else is there.
fn check_tree(vault: &Path, models: &[Model]) {
    for (w, m) in models.iter().enumerate() {
        let root = vault.join(format!("w{w:02}"));
        for (rel, data) in &m.files {
            let got = fs::read(root.join(rel)).unwrap_or_else(|e| panic!("worker {w}: {rel}: {e}"));
            assert!(
                got == *data,
                "worker {w}: {rel}: {} bytes, {} expected",
                got.len(),
                data.len()
            );
        }
        let mut seen = BTreeSet::new();
        for d in std::iter::once(String::new()).chain(m.dirs.iter().cloned()) {
            for e in fs::read_dir(root.join(&d)).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                let rel = if d.is_empty() {
                    name
                } else {
                    format!("{d}/{name}")
                };
                if e.file_type().unwrap().is_file() {
                    seen.insert(rel);
                }
            }
        }
        let want: BTreeSet<String> = m.files.keys().cloned().collect();
        if seen != want {
            let odd: Vec<&String> = seen.symmetric_difference(&want).collect();
            let history: Vec<&String> = m
                .log
                .iter()
                .filter(|l| odd.iter().any(|o| l.contains(o.as_str())))
                .collect();
            panic!("worker {w}: files present differ on {odd:?}; history: {history:#?}");
        }
    }
}

fn sixteen_workers(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let vault = env.vault();
    let models = within(600, "16 workers", move || {
        let threads: Vec<_> = (0..WORKERS)
            .map(|w| {
                let root = vault.join(format!("w{w:02}"));
                std::thread::spawn(move || worker(root, w + 1))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("worker failed"))
            .collect::<Vec<Model>>()
    });
    check_tree(&env.vault(), &models);
    env.wait_uploaded();
    m.unmount();
    // From the store, through a fresh mount with an empty cache.
    let _ = fs::remove_dir_all(env.cache.join("cache"));
    let m = env.mount(&[]);
    let vault = env.vault();
    let models2 = models.clone();
    within(300, "checking after remount", move || {
        check_tree(&vault, &models2)
    });
    assert!(!m.log_text().contains("ERROR"), "{}", m.log_text());
    assert!(env.backend().store().check_integrity().unwrap().is_empty());
}

#[test]
fn sixteen_workers_local() {
    sixteen_workers(Via::Local);
}

#[test]
fn sixteen_workers_remote() {
    sixteen_workers(Via::Remote);
}
