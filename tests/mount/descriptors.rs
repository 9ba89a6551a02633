//! Open descriptors bounded (issue 46): the daemon kept one descriptor open for every file
//! written or read, so under `ulimit -n 1024` (as in many containers) new files failed with
//! "Too many open files" from about the 1,000th on, `tar c` read EIO, and `vaultfs status` could
//! not answer. Here a daemon under that limit writes, stores and reads back three times as many
//! files as it may open, answers `status` throughout, unmounts promptly and reads all after a
//! remount (the size runs in seconds; `scripts/bench scale` takes the large ones).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::env::{Env, Via};
use crate::common::mount::BIN;

both!(three_times_the_open_files_limit_written_stored_and_read_back);

const LIMIT: u64 = 1024;
const FOLDERS: usize = 30;
const PER_FOLDER: usize = 100;

fn content(d: usize, f: usize) -> Vec<u8> {
    format!("folder {d}, file {f}: a line of a document\n")
        .repeat(1 + (d * PER_FOLDER + f) % 40)
        .into_bytes()
}

/// Descriptors the process holds now.
fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Every file of the tree under `root` holds what was written.
fn check_tree(root: &Path) {
    for d in 0..FOLDERS {
        for f in 0..PER_FOLDER {
            let p = root.join(format!("d{d:02}/f{f:03}.txt"));
            let got = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert!(got == content(d, f), "{} differs", p.display());
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn three_times_the_open_files_limit_written_stored_and_read_back(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount_limited(&[], &[], Some(LIMIT));
    let pid = m.child.as_ref().unwrap().id();
    let root = env.vault().join("many");
    let mut peak = 0;
    for d in 0..FOLDERS {
        let dir = root.join(format!("d{d:02}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_FOLDER {
            let p = dir.join(format!("f{f:03}.txt"));
            fs::write(&p, content(d, f)).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
        peak = peak.max(open_fds(pid));
        if d % 10 == 9 {
            // The control socket answers while the uploads run (`status` asserts it exits 0
            // with its JSON).
            m.status();
        }
    }
    // Everything stored: `vaultfs sync` exits 0.
    run(Command::new(BIN)
        .arg("sync")
        .arg(&env.mnt)
        .args(["--timeout", "120"]));
    peak = peak.max(open_fds(pid));

    // Read back by the programs backups use, with no error.
    // (`tar` is given the files: a folder's times still move when it is listed again after
    // its files were stored, the store's time of the change replacing the mount's, which
    // `tar` takes for a folder changed while read: issue 49.)
    let list = env._tmp.path().join("files");
    let names: Vec<String> = (0..FOLDERS)
        .flat_map(|d| (0..PER_FOLDER).map(move |f| format!("d{d:02}/f{f:03}.txt\n")))
        .collect();
    fs::write(&list, names.concat()).unwrap();
    let tar = env._tmp.path().join("many.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&root)
        .arg("-T")
        .arg(&list));
    peak = peak.max(open_fds(pid));
    let copy = env._tmp.path().join("copy");
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", root.display()))
        .arg(&copy));
    peak = peak.max(open_fds(pid));
    check_tree(&copy);
    check_tree(&root);
    peak = peak.max(open_fds(pid));
    // Far from one per file: about 300 (built-in) and 410 (server) here, the pool's 256 and the
    // uploads and connections in flight; the bound leaves those room to vary.
    assert!(
        peak < LIMIT as usize * 3 / 4,
        "the daemon held {peak} descriptors for {} files",
        FOLDERS * PER_FOLDER
    );
    m.status();

    let t = Instant::now();
    m.unmount();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "unmount took {:?}",
        t.elapsed()
    );

    // A new mount under the same limit starts over the cache it left, and reads everything.
    let m = env.mount_limited(&[], &[], Some(LIMIT));
    check_tree(&root);
    let pid = m.child.as_ref().unwrap().id();
    assert!(open_fds(pid) < LIMIT as usize / 2);
}
