//! The upload journal: which staging file belongs where. An entry is on disk before `release`
//! returns (written when staging starts, rewritten on rename), so a killed daemon, an unmount or
//! a server outage loses no byte: the next mount uploads what the journal lists.
//!
//! One append-only log, `journal/log`, of JSON lines: `put` (a staged file and its path, again
//! after a rename) and `done` (uploaded or gone). Each record is one `write` to a file opened
//! for appending, so a killed process leaves whole records; a torn last line (power cut) is
//! skipped. A file per entry, created, renamed and deleted per small file, made ext4's inode
//! allocator scan its recently freed inodes on every create (a third of the daemon's time in a
//! burst of small files). The log is rewritten with the live entries when a mount starts and
//! whenever it has grown large.
//!
//! Entries of the earlier layout (`journal/<id>.json`, one file each) are read and carried over.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::spares::{Spare, Spares};
use super::staging::Staged;
use super::status::SetAside;
use crate::api::{Base, NodePath};
use crate::sync::relock;

/// The log is rewritten with only its live entries once it is this large, and twice what the
/// last rewrite left: with 100,000 files waiting the live entries alone are 25 MB, and a fixed
/// bound rewrote them all at every append (70 GB written to store 100,000 files).
const COMPACT_AT: u64 = 4 << 20;

/// Where a staged file's bytes belong.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JournalEntry {
    /// `/nodes/pth/...`.
    pub path: String,
    /// The file's ID once it exists remotely.
    #[serde(default)]
    pub file_id: Option<String>,
    /// What the upload replaces (`Base::column`: absent = no check, for entries of builds
    /// before the conflict check, "" = a new name, else the md5 of the version it replaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Record {
    Put {
        id: u64,
        #[serde(flatten)]
        entry: JournalEntry,
    },
    Done {
        id: u64,
    },
}

struct Log {
    file: File,
    len: u64,
    /// The length the last rewrite left (its live entries).
    compacted: u64,
    /// Entries put and not done, by staging ID.
    live: HashMap<u64, JournalEntry>,
}

pub struct Journal {
    staging: PathBuf,
    dir: PathBuf,
    lost: PathBuf,
    /// Empty staging files made ahead of need (they also hand out the IDs).
    spares: Arc<Spares>,
    log: Mutex<Log>,
    /// The backend's largest file (see `Staged::limited`).
    max_file_size: u64,
    /// Whether staged files are hashed ahead with sha256 too (see `Staged::md5_only`).
    sha256: bool,
    /// Whether the kernel may write staging files itself (`staging::kernel_writes_safe`).
    leases: bool,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
}

/// The IDs of the files in `dir` named `<id>.<ext>`.
fn ids(dir: &Path, ext: &str) -> io::Result<Vec<u64>> {
    Ok(fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(ext)?.strip_suffix('.')?.parse().ok()
        })
        .collect())
}

impl Journal {
    /// Opens the journal of `cache_dir`: reads what an earlier run left and rewrites the log
    /// with just that.
    pub fn open(cache_dir: &Path, max_file_size: u64, sha256: bool) -> io::Result<Journal> {
        let staging = cache_dir.join("staging");
        let dir = cache_dir.join("journal");
        super::private_dir(&staging)?;
        super::private_dir(&dir)?;
        let log_path = dir.join("log");
        let mut live = HashMap::new();
        if let Ok(f) = File::open(&log_path) {
            for line in io::BufReader::new(f).split(b'\n') {
                match serde_json::from_slice::<Record>(&line?) {
                    Ok(Record::Put { id, entry }) => {
                        live.insert(id, entry);
                    }
                    Ok(Record::Done { id }) => {
                        live.remove(&id);
                    }
                    Err(e) => log::warn!("skipping a torn journal record: {e}"),
                }
            }
        }
        // The earlier layout: one file per entry.
        let legacy = ids(&dir, "json")?;
        for id in &legacy {
            let entry = fs::read(dir.join(format!("{id}.json")))
                .ok()
                .and_then(|b| serde_json::from_slice::<JournalEntry>(&b).ok());
            match entry {
                Some(e) => {
                    live.insert(*id, e);
                }
                None => log::warn!("journal entry {id} is unreadable; set aside"),
            }
        }
        let max = live
            .keys()
            .copied()
            .chain(ids(&staging, "data")?)
            .max()
            .unwrap_or(0);
        let (file, len) = Self::rewrite(&dir, &live)?;
        for id in legacy {
            let p = dir.join(format!("{id}.json"));
            if live.contains_key(&id) {
                let _ = fs::remove_file(p);
            } else {
                let _ = fs::rename(p, dir.join(format!("{id}.broken")));
            }
        }
        let spares = Spares::new(staging.clone(), max + 1);
        let leases = super::staging::kernel_writes_safe(&staging);
        Ok(Journal {
            leases,
            staging,
            dir,
            lost: cache_dir.join("lost+found"),
            spares,
            log: Mutex::new(Log {
                file,
                len,
                compacted: len,
                live,
            }),
            max_file_size,
            sha256,
        })
    }

    /// Writes a log holding `live` only (to a temporary name, renamed over the log).
    fn rewrite(dir: &Path, live: &HashMap<u64, JournalEntry>) -> io::Result<(File, u64)> {
        let tmp = dir.join("log.tmp");
        let mut buf = Vec::new();
        let mut ids: Vec<_> = live.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let rec = Record::Put {
                id,
                entry: live[&id].clone(),
            };
            serde_json::to_writer(&mut buf, &rec).map_err(io::Error::other)?;
            buf.push(b'\n');
        }
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&buf)?;
        }
        let path = dir.join("log");
        fs::rename(&tmp, &path)?;
        Ok((open_append(&path)?, buf.len() as u64))
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        relock(&self.log)
    }

    /// Appends one record (one write); compacts the log once it is large.
    fn append(&self, rec: &Record) -> io::Result<()> {
        self.append_all(std::slice::from_ref(rec))
    }

    /// Appends records with one write (a batch's ends cost one system call, not one each).
    fn append_all(&self, recs: &[Record]) -> io::Result<()> {
        let mut lines = Vec::new();
        for rec in recs {
            serde_json::to_writer(&mut lines, rec).map_err(io::Error::other)?;
            lines.push(b'\n');
        }
        let mut log = self.log();
        log.file.write_all(&lines)?;
        log.len += lines.len() as u64;
        for rec in recs {
            match rec {
                Record::Put { id, entry } => {
                    log.live.insert(*id, entry.clone());
                }
                Record::Done { id } => {
                    log.live.remove(id);
                }
            }
        }
        if log.len >= COMPACT_AT.max(2 * log.compacted) {
            match Self::rewrite(&self.dir, &log.live) {
                Ok((file, len)) => {
                    log.file = file;
                    log.len = len;
                    log.compacted = len;
                }
                Err(e) => log::warn!("could not compact the upload journal: {e}"),
            }
        }
        Ok(())
    }

    /// Files with an entry (waiting for upload, or open for writing).
    /// Whether the kernel may write staging files itself (`staging::kernel_writes_safe`).
    pub fn leases(&self) -> bool {
        self.leases
    }

    pub fn len(&self) -> usize {
        self.log().live.len()
    }

    /// A staged file as this journal's backend wants it (its size limit, its hashes).
    fn staged(&self, id: u64, path: PathBuf, size: u64, dirty: bool, base: Base) -> Staged {
        let s = Staged::new(id, path, size, dirty, base).limited(self.max_file_size);
        if self.sha256 { s } else { s.md5_only() }
    }

    /// A new, empty staging file for `path`, with its journal entry; `base` is the version its
    /// bytes will replace (`Staged::base`).
    pub fn create(
        &self,
        path: &NodePath,
        file_id: Option<String>,
        base: Base,
    ) -> io::Result<Staged> {
        let Spare {
            id,
            path: data_path,
        } = self.spares.take()?;
        let staged = self.staged(id, data_path, 0, false, base);
        self.record(&staged, path, file_id)?;
        Ok(staged)
    }

    /// (Re)writes the entry of a staged file (its path, file ID and base), unless it is what
    /// was last written.
    pub fn record(
        &self,
        staged: &Staged,
        path: &NodePath,
        file_id: Option<String>,
    ) -> io::Result<()> {
        let mut state = relock(&staged.journal);
        let entry = (path.uri(), file_id, staged.base());
        if state.finished || state.last.as_ref() == Some(&entry) {
            return Ok(());
        }
        self.append(&Record::Put {
            id: staged.id,
            entry: JournalEntry {
                path: entry.0.clone(),
                file_id: entry.1.clone(),
                base: entry.2.column().map(str::to_string),
            },
        })?;
        state.last = Some(entry);
        Ok(())
    }

    /// No file is staged any more (unmounted): the spare staging files go.
    pub fn shut_spares(&self) {
        self.spares.shut();
    }

    /// The upload is done (or the file is gone): forget the entry and the staging name.
    pub fn finish(&self, staged: &Staged) {
        self.finish_all([staged]);
    }

    /// `finish` for several staged files, their ends journaled with one write.
    pub fn finish_all<'a>(&self, staged: impl IntoIterator<Item = &'a Staged>) {
        let ending: Vec<&Staged> = staged
            .into_iter()
            .filter(|s| {
                let mut state = relock(&s.journal);
                !std::mem::replace(&mut state.finished, true)
            })
            .collect();
        if ending.is_empty() {
            return;
        }
        let recs: Vec<Record> = ending.iter().map(|s| Record::Done { id: s.id }).collect();
        if let Err(e) = self.append_all(&recs) {
            log::warn!(
                "could not journal the end of {} staged file(s): {e}",
                recs.len()
            );
        }
        for s in ending {
            s.stop_hashing();
            // Once stored, the read cache may hold it (`Staged::hand_over`): its to remove.
            if s.handed_over() {
                continue;
            }
            if let Err(e) = fs::remove_file(s.data_path()) {
                if e.kind() != io::ErrorKind::NotFound {
                    log::warn!("could not remove {}: {e}", s.data_path().display());
                }
            }
        }
    }

    /// Keeps the bytes of an upload that can never succeed (its folder is gone, say) where a
    /// person can find them, instead of dropping them.
    /// It is noted (`set-aside` beside `lost+found`) with `why`, for `vaultfs status` and
    /// `vaultfs sync` to say until the user moves or deletes the kept file ([`Journal::set_aside`]).
    pub fn quarantine(&self, staged: &Staged, path: &NodePath, why: &str) -> io::Result<PathBuf> {
        super::private_dir(&self.lost)?;
        let name = format!("{}-{}", staged.id, path.name().unwrap_or("file"));
        let dest = self.lost.join(name);
        // Linked where it can be: a copy costs the file's size again (a sparse file written
        // far past the end, which a store refuses as too large, would be copied whole).
        if fs::hard_link(staged.data_path(), &dest).is_err() {
            crate::api::files::copy_to_new(&*staged.file()?, staged.size(), &dest)?;
        }
        let note = SetAside {
            path: path.to_string(),
            kept: dest.display().to_string(),
            why: why.to_string(),
            at: crate::api::time::format_time(std::time::SystemTime::now()),
        };
        let line = serde_json::to_string(&note).expect("a note serializes") + "\n";
        // The bytes are kept either way; a note that cannot be written is said in the log.
        if let Err(e) =
            open_append(&self.set_aside_log()).and_then(|mut f| f.write_all(line.as_bytes()))
        {
            log::error!("could not note {} as set aside: {e}", dest.display());
        }
        self.finish(staged);
        Ok(dest)
    }

    fn set_aside_log(&self) -> PathBuf {
        self.lost.with_file_name("set-aside")
    }

    /// The edits set aside whose kept file is still in `lost+found`, oldest first: each a
    /// failure to store that the user has not dealt with yet.
    pub fn set_aside(&self) -> Vec<SetAside> {
        let Ok(text) = fs::read_to_string(self.set_aside_log()) else {
            return Vec::new();
        };
        let mut seen = std::collections::HashSet::new();
        let mut notes: Vec<SetAside> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<SetAside>(l).ok())
            .rev()
            .filter(|n| seen.insert(n.kept.clone()) && Path::new(&n.kept).exists())
            .collect();
        notes.reverse();
        notes
    }

    /// Staged files a previous run left, oldest first: (path, file id, staged file with its
    /// bytes). Of two entries for one path (a crash between a file's retirement and its next
    /// staging) the newest holds the content that counts.
    pub fn recover(&self) -> io::Result<Vec<(NodePath, Option<String>, Staged)>> {
        let mut live: Vec<(u64, JournalEntry)> = self
            .log()
            .live
            .iter()
            .map(|(id, e)| (*id, e.clone()))
            .collect();
        live.sort_by_key(|(id, _)| *id);
        let mut found = Vec::new();
        for (id, entry) in live {
            let data_path = self.staging.join(format!("{id}.data"));
            // Its metadata only: the file is opened when used (50,000 files left to upload
            // would otherwise hold as many descriptors from the start).
            let meta = fs::metadata(&data_path).ok().filter(|m| m.is_file());
            match (NodePath::parse_uri(&entry.path), meta) {
                (Ok(path), Some(meta)) => found.push((id, entry, path, meta, data_path)),
                _ => {
                    log::warn!("journal entry {id} has no data or a bad path; dropped");
                    self.append(&Record::Done { id })?;
                }
            }
        }
        let mut newest = HashMap::new();
        for (id, _, path, _, _) in &found {
            newest.insert(path.clone(), *id);
        }
        let mut out = Vec::new();
        for (id, entry, path, meta, data_path) in found {
            // Dirty: generation 1, nothing uploaded.
            let base = Base::from_column(entry.base.clone());
            let staged = self
                .staged(id, data_path, meta.len(), true, base.clone())
                .with_file_mtime(&meta);
            if newest.get(&path) != Some(&id) {
                log::info!("journal entry {id} superseded by a newer one of {path}");
                self.finish(&staged);
                continue;
            }
            *relock(&staged.journal) = super::staging::JournalState {
                finished: false,
                last: Some((entry.path, entry.file_id.clone(), base)),
            };
            out.push((path, entry.file_id, staged));
        }
        // Staging files without an entry belong to nothing (the entry is written first), and
        // copies cut short by a crash (`<id>.cow`) are garbage: the `.data` file is whole.
        let live = self.log().live.clone();
        for e in fs::read_dir(&self.staging)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let keep = name
                .strip_suffix(".data")
                .and_then(|id| id.parse::<u64>().ok())
                .is_some_and(|id| live.contains_key(&id));
            if !keep {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(out)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.spares.shut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn put(id: u64) -> Record {
        Record::Put {
            id,
            entry: JournalEntry {
                path: format!("/nodes/pth/Local/V/{}-{id:06}", "x".repeat(200)),
                file_id: None,
                base: Some(String::new()),
            },
        }
    }

    /// Live entries past the fixed bound (30,000 files waiting: 7 MB) are not rewritten at
    /// every append, and the log is still compacted once its dead records double it.
    #[test]
    fn a_log_of_many_live_entries_is_rewritten_as_it_doubles_not_at_every_append() {
        let tmp = tempfile::tempdir().unwrap();
        let j = Journal::open(tmp.path(), u64::MAX, false).unwrap();
        let log = tmp.path().join("journal").join("log");
        let ino = || fs::metadata(&log).unwrap().ino();
        let live: Vec<Record> = (0..30_000).map(put).collect();
        for chunk in live.chunks(1000) {
            j.append_all(chunk).unwrap();
        }
        assert!(fs::metadata(&log).unwrap().len() > COMPACT_AT);
        let before = ino();
        for id in 30_000..30_100 {
            j.append(&put(id)).unwrap();
        }
        assert_eq!(ino(), before, "the log was rewritten at an append");

        // The first 30,000 end; new files come and go until the log is rewritten.
        let done: Vec<Record> = (0..30_000).map(|id| Record::Done { id }).collect();
        j.append_all(&done).unwrap();
        let mut id = 40_000;
        while ino() == before {
            assert!(
                id < 100_000,
                "the log grew to {} B",
                fs::metadata(&log).unwrap().len()
            );
            j.append_all(&[put(id), Record::Done { id }]).unwrap();
            id += 1;
        }
        assert!(fs::metadata(&log).unwrap().len() < 100 << 10);
        drop(j);
        let j = Journal::open(tmp.path(), u64::MAX, false).unwrap();
        assert_eq!(j.len(), 100);
    }
}
