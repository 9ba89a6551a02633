//! A model that checks it (issue 32, item 5), in the manner of mountpoint-s3's reference tests:
//! a seeded random sequence of creates, writes, saves-by-rename, renames, reads and deletes on
//! two mounts of one store (A and B, each with a cache dir of its own) and through the
//! interface directly (T, a third writer), with settles, remounts (unmount or SIGKILL) and, on
//! the remote backend, server restarts between. The reference model is the set of every content
//! a close (or fsync, then close) on a mount reported stored, and every content T stored.
//!
//! After each step every content that is certainly stored (T's; a mount's once that mount has
//! no upload left) is reachable in the store: as a current file (its name, a conflict copy, a
//! renamed file) or one of a file's kept versions. After each settle (both mounts' uploads
//! stored, then polled until A, B and the store list the same names, bytes and versions) every
//! content ever closed is reachable through mount A alone, by reading files and `.versions/`.
//!
//! What a user gave up on purpose is excused, and nothing else. The exact rule:
//! 1. A content a mount replaced itself (a later write, append or rename onto the same name,
//!    or a delete of it, on the same mount) before that mount had stored it: writeback keeps
//!    only the last of a file's saves made in a row.
//! 2. A destroy by writer W (W deletes a name, and the store's file under that name goes, with
//!    its versions) excuses that file's versions from the newest
//!    one W knew down to the oldest. W knew a version if W wrote it, read it (a mount reads the
//!    file first, as a user looks at what they delete or save over; T reads the store's
//!    current version), or saw it at a settle. What lies under a version W knew goes with it:
//!    a save of W's replaced what W's mount then listed (the base the store checks), and a
//!    deleted file's versions are not kept (no trash yet, issue 32 item 4). A version newer
//!    than every one W knew, an edit made elsewhere that W never had, is never excused: that
//!    is what a delete or rename from a stale view would lose. Nor is an edit overwritten by a
//!    concurrent edit elsewhere: it must be a conflict copy or a version.
//!
//! 3. The store's retention rule: the built-in store keeps a file's 50 newest earlier versions
//!    (`--keep-versions`, the default of `vaultfs mount`; the test server keeps all). A file
//!    at the bound that gained k versions since the last check may have dropped k of its
//!    earlier ones, and no more.
//!
//! A rename over a file excuses nothing: the store keeps the file under the name, the bytes
//! moved its new version and the moved file's versions its earlier ones (`Store::transfer`).
//!
//! The model looks for what stale views lose, not for the milliseconds between a check and
//! its act (docs/design.md names those windows): a mount deletes only a file it shows, read
//! just before with the store unchanged meanwhile; a mount's rename and T's delete run once
//! the other writers' uploads are stored; uploads, conflicts and everything else run freely.
//!
//! `VAULTFS_MODEL_SEED=N` replays a run's operations (their timing may differ; the seed is
//! printed, and a failure prints it with every step taken), `VAULTFS_MODEL_STEPS=N` makes a
//! run longer (default 250: about 30 s a backend), `VAULTFS_MODEL_LOGS=DIR` keeps both mounts'
//! logs of a failed run there. A run fails at the first EIO or ESTALE a writer meets (a save
//! that failed stops a user as surely as a lost one); `VAULTFS_MODEL_LENIENT=1` counts them
//! instead, printed at the end, to see what else a run finds past one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::env::{Env, VAULT, Via, pending_uploads, put_elsewhere, wait_stored};
use crate::common::mount::Mount;
use crate::common::{md5hex, pattern};
use vaultfs::api::{ErrorKind, NodePath};
use vaultfs::backend::Backend;
use vaultfs::backend::local::LocalBackend;

both!(random_writers_lose_no_stored_byte);

/// The names the writers use, in two folders.
const NAMES: [&str; 5] = ["a.txt", "b.txt", "c.txt", "sub/d.txt", "sub/e.txt"];
/// Listings fetched again after 1 s instead of 10 (the default), to keep settles short.
const MOUNT_ARGS: [&str; 2] = ["--dir-ttl", "1"];
/// A settle fails when the views still differ after this long.
const SETTLE_BOUND: Duration = Duration::from_secs(30);
/// Earlier versions the built-in store keeps of a file (`vaultfs mount`'s default
/// `--keep-versions`): rule 3.
const KEPT_BY_MOUNT: usize = 50;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Who {
    A,
    B,
    T,
}

/// splitmix64: small, deterministic, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, s: &[T]) -> T {
        s[self.below(s.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a mount or the store shows: by path under the vault, the current content's md5 and
/// the md5s of its earlier versions (sorted).
type View = BTreeMap<String, (String, Vec<String>)>;

struct Content {
    who: Who,
    step: usize,
    /// The name it was written to; a mount's rename moves it while not yet stored.
    name: String,
    /// Certainly in the store: T's at once, a mount's once it had no upload left.
    confirmed: bool,
}

struct Side {
    mount: Option<Mount>,
    mnt: PathBuf,
    cache: PathBuf,
}

struct Run {
    env: Env,
    via: Via,
    seed: u64,
    rng: Rng,
    a: Side,
    b: Side,
    contents: HashMap<String, Content>,
    knew: HashMap<Who, HashSet<String>>,
    excused: HashMap<String, String>,
    /// The store as the last check saw it (rule 3).
    last_store: View,
    log: Vec<String>,
    step: usize,
    /// Failed operations by their error (ENOENT: the name was not there in that view).
    errors: BTreeMap<String, usize>,
    settles: usize,
}

fn random_writers_lose_no_stored_byte(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let seed = std::env::var("VAULTFS_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let steps: usize = std::env::var("VAULTFS_MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(250);
    eprintln!("model ({via:?}): VAULTFS_MODEL_SEED={seed} VAULTFS_MODEL_STEPS={steps}");
    let a = env.mount(&MOUNT_ARGS);
    let (b, mnt_b, cache_b) = super::conflicts::second_mount_with(&env, &MOUNT_ARGS);
    let mut run = Run {
        a: Side {
            mount: Some(a),
            mnt: env.mnt.clone(),
            cache: env.cache.clone(),
        },
        b: Side {
            mount: Some(b),
            mnt: mnt_b,
            cache: cache_b,
        },
        env,
        via,
        seed,
        rng: Rng(seed),
        contents: HashMap::new(),
        knew: HashMap::new(),
        excused: HashMap::new(),
        last_store: View::new(),
        log: Vec::new(),
        step: 0,
        errors: BTreeMap::new(),
        settles: 0,
    };
    fs::create_dir(run.vault(Who::A).join("sub")).unwrap();
    run.settle();
    let started = Instant::now();
    for step in 1..=steps {
        run.step = step;
        run.one_step();
        run.confirm();
        run.check_store();
    }
    run.step += 1;
    run.settle();
    let copies = run
        .store_view()
        .keys()
        .filter(|n| n.contains(" (conflict "))
        .count();
    eprintln!(
        "model ({via:?}) seed {seed}: {steps} steps in {:.1} s, {} contents kept track of, {} \
         excused, {copies} conflict copies, {} settles, failed \
         operations {:?}; nothing lost",
        started.elapsed().as_secs_f64(),
        run.contents.len(),
        run.excused.len(),
        run.settles,
        run.errors,
    );
    // Errors other than a name not there, with the operation that met them.
    for line in run
        .log
        .iter()
        .filter(|l| l.contains("os error") && !l.contains("(os error 2)"))
    {
        eprintln!("model ({via:?}): {line}");
    }
    for side in [&mut run.a, &mut run.b] {
        if let Some(m) = side.mount.take() {
            m.unmount();
        }
    }
}

impl Run {
    fn side(&self, who: Who) -> &Side {
        match who {
            Who::A => &self.a,
            Who::B => &self.b,
            Who::T => unreachable!("T has no mount"),
        }
    }

    fn vault(&self, who: Who) -> PathBuf {
        self.side(who).mnt.join(VAULT)
    }

    fn backend(&self) -> LocalBackend {
        self.env.backend()
    }

    fn note(&mut self, line: String) {
        self.log.push(format!("#{} {line}", self.step));
    }

    /// New, unique bytes for `name` written by `who`.
    fn bytes(&mut self, who: Who, name: &str) -> Vec<u8> {
        let mut b = format!("{who:?} step {} {name} seed {}\n", self.step, self.seed).into_bytes();
        let len = self.rng.below(3000) as usize;
        b.extend(pattern(len, self.seed ^ (self.step as u64) << 8));
        b
    }

    fn one_step(&mut self) {
        let who = if self.rng.chance(50) { Who::A } else { Who::B };
        let name = self.rng.pick(&NAMES);
        match self.rng.below(100) {
            0..=27 => self.write(who, name),
            28..=39 => self.save_by_rename(who, name),
            40..=47 => {
                let to = self.rng.pick(&NAMES);
                self.rename(who, name, to)
            }
            48..=54 => self.delete(who, name),
            55..=61 => {
                self.read(who, name);
            }
            62..=71 => self.t_write(name),
            72..=74 => self.t_delete(name),
            75..=77 => {
                let to = self.rng.pick(&NAMES);
                self.t_rename(name, to)
            }
            78..=89 => self.settle(),
            90..=95 => self.remount(who),
            _ if self.via == Via::Remote => self.restart_server(),
            _ => self.settle(),
        }
    }

    /// A content closed (or stored, for T) by `who` under `name`.
    fn wrote(&mut self, who: Who, name: &str, data: &[u8]) {
        let md5 = md5hex(data);
        self.supersede(who, name, "written again");
        self.knew.entry(who).or_default().insert(md5.clone());
        self.contents.insert(
            md5,
            Content {
                who,
                step: self.step,
                name: name.to_string(),
                confirmed: who == Who::T,
            },
        );
    }

    /// Rule 1: `who`'s own contents under `name` not yet stored are replaced by its own act.
    fn supersede(&mut self, who: Who, name: &str, how: &str) {
        if who == Who::T {
            return;
        }
        for (md5, c) in &self.contents {
            if c.who == who && !c.confirmed && c.name == name && !self.excused.contains_key(md5) {
                self.excused.insert(
                    md5.clone(),
                    format!(
                        "{how} on {who:?} (#{}) before {who:?} had stored it",
                        self.step
                    ),
                );
            }
        }
    }

    /// A mount's contents not yet stored under `from` move with its rename.
    fn moved(&mut self, who: Who, from: &str, to: &str) {
        for c in self.contents.values_mut() {
            if c.who == who && !c.confirmed && c.name == from {
                c.name = to.to_string();
            }
        }
    }

    // Operations of a mount.

    /// A whole rewrite (`fs::write`), a truncate and write through a descriptor opened without
    /// O_TRUNC, or an append (its bytes read back through the same descriptor), some with fsync.
    fn write(&mut self, who: Who, name: &str) {
        let path = self.vault(who).join(name);
        let how = self.rng.below(3);
        let fsync = self.rng.chance(30);
        let data = self.bytes(who, name);
        let r: std::io::Result<Vec<u8>> = (|| match how {
            0 => {
                let mut f = fs::File::create(&path)?;
                f.write_all(&data)?;
                if fsync {
                    f.sync_all()?;
                }
                Ok(data.clone())
            }
            1 => {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)?;
                f.set_len(0)?;
                f.write_all(&data)?;
                if fsync {
                    f.sync_all()?;
                }
                Ok(data.clone())
            }
            _ => {
                let mut f = OpenOptions::new().read(true).append(true).open(&path)?;
                f.write_all(&data)?;
                if fsync {
                    f.sync_all()?;
                }
                f.rewind()?;
                let mut all = Vec::new();
                f.read_to_end(&mut all)?;
                Ok(all)
            }
        })();
        let kind = ["rewrite", "truncate+write", "append"][how as usize];
        match r {
            Ok(all) => {
                self.note(format!(
                    "{who:?} {kind} {name} (fsync {fsync}) -> {}",
                    &md5hex(&all)[..8]
                ));
                self.wrote(who, name, &all);
            }
            Err(e) => self.failed(format!("{who:?} {kind} {name} (fsync {fsync})"), e),
        }
    }

    /// An editor's save: the file read, new bytes written to a temporary file, that file
    /// renamed over the name (sometimes once stored, sometimes at once).
    fn save_by_rename(&mut self, who: Who, name: &str) {
        self.read(who, name);
        let tmp_name = match name.rsplit_once('/') {
            Some((dir, base)) => format!("{dir}/.{base}.{who:?}.swp"),
            None => format!(".{name}.{who:?}.swp"),
        };
        let data = self.bytes(who, name);
        let tmp = self.vault(who).join(&tmp_name);
        if let Err(e) = fs::write(&tmp, &data) {
            return self.failed(format!("{who:?} save {name} (temporary file)"), e);
        }
        self.wrote(who, &tmp_name, &data);
        let stored_first = self.rng.chance(40);
        if stored_first {
            let s = self.side(who);
            wait_stored(&s.cache, &s.mnt);
        }
        self.note(format!(
            "{who:?} save-by-rename {name} (stored first {stored_first}) -> {}",
            &md5hex(&data)[..8]
        ));
        self.replace(who, &tmp_name, name);
    }

    fn rename(&mut self, who: Who, from: &str, to: &str) {
        if from == to {
            self.read(who, from);
            return;
        }
        // What is renamed over is looked at first (once the other mount's uploads are stored,
        // as `replace` wants).
        let other = self.side(if who == Who::A { Who::B } else { Who::A });
        wait_stored(&other.cache, &other.mnt);
        self.read(who, to);
        self.note(format!("{who:?} rename {from} -> {to}"));
        self.replace(who, from, to);
    }

    /// `rename(from, to)` on `who`'s mount. The other mount's uploads are stored first, so that the history taken is what the
    /// rename meets: the model looks at stale views, not at the milliseconds between the
    /// mount's check and its move (docs/design.md names that window).
    fn replace(&mut self, who: Who, from: &str, to: &str) {
        let v = self.vault(who);
        let other = self.side(if who == Who::A { Who::B } else { Who::A });
        wait_stored(&other.cache, &other.mnt);
        self.own_save_stored(who, to);
        // (What was under `to` stays: the store keeps that file, the bytes its new version.)
        match fs::rename(v.join(from), v.join(to)) {
            Ok(()) => {
                self.supersede(who, to, "renamed over");
                self.moved(who, from, to);
            }
            Err(e) => self.failed(format!("{who:?} rename {from} -> {to}"), e),
        }
    }

    /// A user deletes a file they see (and have just looked at).
    fn delete(&mut self, who: Who, name: &str) {
        self.own_save_stored(who, name);
        let Some(before) = self.look(who, name) else {
            return;
        };
        let path = self.vault(who).join(name);
        // The mount answers an unlink before the store's delete (`fs::deletes`); an fsync of
        // the folder returns once it is made, as a user makes a delete durable.
        let synced = |p: &Path| fs::File::open(p.parent().unwrap())?.sync_all();
        match fs::remove_file(&path).and_then(|()| synced(&path)) {
            Ok(()) => {
                self.note(format!("{who:?} delete {name} (held {})", held(&before)));
                self.supersede(who, name, "deleted");
                self.destroyed(who, name, before, "deleted");
            }
            Err(e) => self.failed(format!("{who:?} delete {name}"), e),
        }
    }

    /// `who` reads `name`, and the store's file there is taken before and after: the same
    /// (else the read raced with an upload landing, and the look is taken again), so that
    /// what was read is what the history says. None: no file to see.
    fn look(&mut self, who: Who, name: &str) -> Option<Option<(String, Vec<String>)>> {
        loop {
            let before = self.history(name);
            let shown = self.read(who, name);
            let after = self.history(name);
            if before == after {
                return shown.then_some(after);
            }
        }
    }

    /// Before `who` destroys `name`: its own save of that name, if one is on its way, stored
    /// first, so that the history taken before the destroy has it on top (the mount's own
    /// upload may land just before its delete or rename, and the save replaced what the
    /// mount knew then: its base).
    fn own_save_stored(&mut self, who: Who, name: &str) {
        let on_its_way = self
            .contents
            .values()
            .any(|c| c.who == who && !c.confirmed && c.name == name);
        if on_its_way {
            let s = self.side(who);
            wait_stored(&s.cache, &s.mnt);
            self.confirm();
        }
    }

    /// A user opens the file: what it shows is known to `who` from now on. Whether there was
    /// a file to show.
    fn read(&mut self, who: Who, name: &str) -> bool {
        match fs::read(self.vault(who).join(name)) {
            Ok(data) => {
                let md5 = md5hex(&data);
                self.note(format!("{who:?} read {name} -> {}", &md5[..8]));
                self.knew.entry(who).or_default().insert(md5);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                self.failed(format!("{who:?} read {name}"), e);
                false
            }
        }
    }

    fn failed(&mut self, what: String, e: std::io::Error) {
        // An I/O error or a stale handle ends the run, as a save that failed would stop a user
        // (`VAULTFS_MODEL_LENIENT=1`: counted, and printed at the end).
        if std::env::var_os("VAULTFS_MODEL_LENIENT").is_none()
            && matches!(e.raw_os_error(), Some(libc::EIO | libc::ESTALE))
        {
            self.fail(&format!("{what}: {e}"), &[], None);
        }
        *self.errors.entry(e.to_string()).or_default() += 1;
        self.note(format!("{what}: {e}"));
    }

    /// Unmounts (or SIGKILLs) one mount and mounts its cache dir again.
    fn remount(&mut self, who: Who) {
        let kill = self.rng.chance(50);
        self.note(format!(
            "{who:?} {}",
            if kill { "killed" } else { "unmounted" }
        ));
        let side = match who {
            Who::A => &mut self.a,
            _ => &mut self.b,
        };
        let m = side.mount.take().unwrap();
        if kill {
            m.kill();
        } else {
            m.unmount();
        }
        let m = match who {
            Who::A => self.env.mount(&MOUNT_ARGS),
            _ => super::conflicts::second_mount_with(&self.env, &MOUNT_ARGS).0,
        };
        match who {
            Who::A => self.a.mount = Some(m),
            _ => self.b.mount = Some(m),
        }
    }

    /// Stops the server and starts it again where the mounts expect it.
    fn restart_server(&mut self) {
        self.note("server restarted".into());
        let server = self.env.server.take().unwrap();
        let addr = server.base.trim_start_matches("http://").to_string();
        self.env.rt.block_on(server.stop());
        std::thread::sleep(Duration::from_millis(300));
        self.env.serve_again(&addr);
    }

    // The third writer: the interface itself.

    fn path(name: &str) -> NodePath {
        NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/{name}")).unwrap()
    }

    fn t_write(&mut self, name: &str) {
        let data = self.bytes(Who::T, name);
        put_elsewhere(&self.env, name, &data);
        self.note(format!("T write {name} -> {}", &md5hex(&data)[..8]));
        self.wrote(Who::T, name, &data);
    }

    /// T deletes only with no mount upload on its way: the interface's delete is unconditional,
    /// so an upload landing between T's look and its delete would go unseen with the file (the
    /// window of every client of the interface, which the mounts' own deletes check).
    fn t_delete(&mut self, name: &str) {
        for who in [Who::A, Who::B] {
            let s = self.side(who);
            wait_stored(&s.cache, &s.mnt);
        }
        self.confirm();
        let before = self.history(name);
        // A client of the interface deletes what it shows: the current version.
        if let Some(current) = before.as_ref().and_then(|(_, h)| h.first()) {
            self.knew.entry(Who::T).or_default().insert(current.clone());
        }
        let b = self.backend();
        match self.env.rt.block_on(b.delete(&Self::path(name))) {
            Ok(()) => {
                self.note(format!("T delete {name} (held {})", held(&before)));
                self.destroyed(Who::T, name, before, "deleted");
            }
            Err(e) => self.note(format!("T delete {name}: {e}")),
        }
    }

    fn t_rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        let b = self.backend();
        let r = self
            .env
            .rt
            .block_on(b.rename(&Self::path(from), &Self::path(to), false));
        match r {
            Ok(_) => self.note(format!("T rename {from} -> {to}")),
            Err(e) => self.note(format!("T rename {from} -> {to}: {e}")),
        }
    }

    // The reference model.

    /// The store's file at `name`: its ID and its versions' md5s, newest (current) first.
    fn history(&self, name: &str) -> Option<(String, Vec<String>)> {
        let b = self.backend();
        let path = Self::path(name);
        let gone = |e: &vaultfs::api::Error| e.kind == ErrorKind::NotFound;
        self.env.rt.block_on(async {
            let n = match b.node(&path).await {
                Err(e) if gone(&e) => return None,
                r => r.expect("the store's node"),
            };
            let id = n.file_id()?;
            let vs = match b.versions(&path).await {
                Err(e) if gone(&e) => return None,
                r => r.expect("the store's versions"),
            };
            let md5s = vs
                .iter()
                .filter_map(|v| v.md5_checksum.as_deref().map(str::to_ascii_lowercase))
                .collect();
            Some((id, md5s))
        })
    }

    /// Rule 2: after `who` deleted `name`, which held the file `before`: if
    /// that file is gone from the name, its versions up to the newest `who` knew are excused.
    fn destroyed(
        &mut self,
        who: Who,
        name: &str,
        before: Option<(String, Vec<String>)>,
        how: &str,
    ) {
        let Some((id, versions)) = before else { return };
        if self.history(name).is_some_and(|(now, _)| now == id) {
            return;
        }
        let knew = self.knew.entry(who).or_default();
        let Some(newest_known) = versions.iter().position(|m| knew.contains(m)) else {
            return;
        };
        for md5 in &versions[newest_known..] {
            self.excused.entry(md5.clone()).or_insert_with(|| {
                format!(
                    "{how} by {who:?} (#{}), which knew it or a later version",
                    self.step
                )
            });
        }
    }

    /// Rule 3: a file of `now` with as many earlier versions as the store keeps, which gained
    /// k contents since the last check, may have dropped up to k of the earlier versions it
    /// had then (the oldest: the rule's, tested with the store); those are excused.
    fn pruned(&mut self, now: &View) {
        let before = std::mem::replace(&mut self.last_store, now.clone());
        let kept = match self.via {
            Via::Local => KEPT_BY_MOUNT,
            _ => return,
        };
        let reachable_now = reachable(now);
        for (cur, earlier) in now.values().filter(|(_, e)| e.len() >= kept) {
            let line: HashSet<&String> = std::iter::once(cur).chain(earlier).collect();
            // The same file then: one sharing a content with it (a rename over a file
            // moves the history with it, so the name may differ).
            for (then_cur, then_earlier) in before.values() {
                let then: HashSet<&String> =
                    std::iter::once(then_cur).chain(then_earlier).collect();
                if then.is_disjoint(&line) {
                    continue;
                }
                let gained = line.difference(&then).count();
                let dropped: Vec<&String> = then_earlier
                    .iter()
                    .filter(|m| !reachable_now.contains(*m))
                    .collect();
                if dropped.is_empty() || dropped.len() > gained {
                    continue;
                }
                for m in dropped {
                    self.excused.entry(m.clone()).or_insert_with(|| {
                        format!(
                            "dropped by the retention rule ({kept} kept) at #{}",
                            self.step
                        )
                    });
                }
            }
        }
    }

    /// Mounts with no upload left have stored (or made conflict copies of) every content
    /// closed on them.
    fn confirm(&mut self) {
        for who in [Who::A, Who::B] {
            let s = self.side(who);
            if pending_uploads(&s.cache) == 0 {
                let mut newly = Vec::new();
                for (m, c) in self.contents.iter_mut() {
                    if c.who == who && !c.confirmed {
                        c.confirmed = true;
                        newly.push(m[..8].to_string());
                    }
                }
                if !newly.is_empty() {
                    self.note(format!("{who:?} has stored {}", newly.join(" ")));
                }
            }
        }
    }

    /// Every content certainly stored and not excused is in the store, as a file or a version.
    fn check_store(&mut self) {
        let store = self.store_view();
        self.pruned(&store);
        let reachable = reachable(&store);
        let lost: Vec<&String> = self
            .contents
            .iter()
            .filter(|(m, c)| {
                c.confirmed && !self.excused.contains_key(*m) && !reachable.contains(*m)
            })
            .map(|(m, _)| m)
            .collect();
        if !lost.is_empty() {
            self.fail(
                "stored contents are in no file and no version of the store",
                &lost,
                None,
            );
        }
    }

    /// Both mounts' uploads stored; then A, B and the store polled until they show the same
    /// names, bytes and versions; then every content not excused is reachable through A.
    fn settle(&mut self) {
        self.settles += 1;
        for who in [Who::A, Who::B] {
            let s = self.side(who);
            wait_stored(&s.cache, &s.mnt);
        }
        self.confirm();
        self.check_store();
        let started = Instant::now();
        let view = loop {
            let store = self.store_view();
            let a = mount_view(&self.vault(Who::A));
            let b = mount_view(&self.vault(Who::B));
            if let (Ok(a), Ok(b)) = (&a, &b) {
                if *a == store && *b == store {
                    break store;
                }
            }
            if started.elapsed() > SETTLE_BOUND {
                let diff = format!(
                    "store: {}\nA: {}\nB: {}",
                    show(&store),
                    a.as_ref().map_or_else(|e| e.to_string(), show),
                    b.as_ref().map_or_else(|e| e.to_string(), show)
                );
                self.fail(
                    "the mounts do not agree with the store after a settle",
                    &[],
                    Some(diff),
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        self.note(format!(
            "settled in {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            show(&view)
        ));
        let reachable = reachable(&view);
        let lost: Vec<&String> = self
            .contents
            .keys()
            .filter(|m| !self.excused.contains_key(*m) && !reachable.contains(*m))
            .collect();
        if !lost.is_empty() {
            self.fail(
                "contents closed on a mount or stored by T are out of a user's reach",
                &lost,
                None,
            );
        }
        // Everyone has seen everything now.
        for who in [Who::A, Who::B, Who::T] {
            self.knew
                .entry(who)
                .or_default()
                .extend(reachable.iter().cloned());
        }
    }

    /// The vault as the store has it.
    fn store_view(&self) -> View {
        let b = self.backend();
        let mut view = View::new();
        for dir in ["", "sub/"] {
            let path = NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/{dir}")).unwrap();
            let node = self.env.rt.block_on(b.list(&path, 0, 1000)).unwrap();
            for child in node.children.unwrap_or_default() {
                if !child.is_file() {
                    continue;
                }
                let name = format!("{dir}{}", child.name);
                let versions = self.env.rt.block_on(b.versions(&Self::path(&name)));
                let mut earlier: Vec<String> = versions
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|v| !v.current)
                    .filter_map(|v| v.md5_checksum.map(|m| m.to_ascii_lowercase()))
                    .collect();
                earlier.sort();
                let md5 = child.md5_checksum.unwrap_or_default().to_ascii_lowercase();
                view.insert(name, (md5, earlier));
            }
        }
        view
    }

    fn fail(&self, what: &str, lost: &[&String], more: Option<String>) -> ! {
        let mut lines = vec![format!(
            "{what} (model on {:?}, VAULTFS_MODEL_SEED={}, at step {})",
            self.via, self.seed, self.step
        )];
        for m in lost {
            let c = &self.contents[*m];
            lines.push(format!(
                "lost: {} written by {:?} at #{} as {}",
                &m[..8],
                c.who,
                c.step,
                c.name
            ));
        }
        lines.extend(more);
        lines.push("steps:".into());
        lines.extend(self.log.iter().cloned());
        lines.push(format!("store now: {}", show(&self.store_view())));
        for (who, s) in [(Who::A, &self.a), (Who::B, &self.b)] {
            let log = s.mount.as_ref().map(Mount::log_text).unwrap_or_default();
            // The whole logs, where `VAULTFS_MODEL_LOGS=DIR` asks for them.
            if let Some(dir) = std::env::var_os("VAULTFS_MODEL_LOGS") {
                let _ = fs::write(Path::new(&dir).join(format!("{who:?}.log")), &log);
            }
            for l in log
                .lines()
                .filter(|l| l.contains("conflict") || l.contains("elsewhere") || l.contains("WARN"))
            {
                lines.push(format!("{who:?} log: {l}"));
            }
        }
        panic!("{}", lines.join("\n"));
    }
}

/// A file's versions as `history` gave them, for the log.
fn held(h: &Option<(String, Vec<String>)>) -> String {
    match h {
        Some((_, v)) => v.iter().map(|m| &m[..8]).collect::<Vec<_>>().join(" "),
        None => "nothing".into(),
    }
}

/// Every content a view holds: current files and earlier versions.
fn reachable(view: &View) -> HashSet<String> {
    view.values()
        .flat_map(|(cur, earlier)| std::iter::once(cur).chain(earlier))
        .cloned()
        .collect()
}

fn show(view: &View) -> String {
    let items: Vec<String> = view
        .iter()
        .map(|(n, (cur, earlier))| {
            let e: Vec<&str> = earlier.iter().map(|m| &m[..8]).collect();
            format!("{n}={} [{}]", &cur[..cur.len().min(8)], e.join(" "))
        })
        .collect();
    items.join(", ")
}

/// The vault as a user of a mount sees it: each file read, each `.versions/FILE/` listed and
/// read. An error (a name gone while looked at) means the view is still moving.
fn mount_view(vault: &Path) -> std::io::Result<View> {
    // An error names the path it came from (a settle that fails says where the views differ).
    let at = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    };
    let mut view = View::new();
    for dir in ["", "sub/"] {
        let d = vault.join(dir);
        for e in fs::read_dir(&d).map_err(at(&d))? {
            let e = e.map_err(at(&d))?;
            if !e.file_type().map_err(at(&e.path()))?.is_file() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let md5 = md5hex(&fs::read(e.path()).map_err(at(&e.path()))?);
            let mut earlier = Vec::new();
            let versions = d.join(".versions").join(&name);
            match fs::read_dir(&versions) {
                Ok(list) => {
                    for v in list {
                        let v = v.map_err(at(&versions))?.path();
                        earlier.push(md5hex(&fs::read(&v).map_err(at(&v))?));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(at(&versions)(e)),
            }
            earlier.sort();
            view.insert(format!("{dir}{name}"), (md5, earlier));
        }
    }
    Ok(view)
}
