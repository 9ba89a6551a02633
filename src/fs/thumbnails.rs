//! Thumbnails for file managers, made from the store's previews: the files themselves are never
//! read (docs/design.md §3, "Thumbnails for file managers").
//!
//! GIO (Nautilus, Nemo), tumbler (Thunar), libfm (PCManFM) and KIO (Dolphin) all treat a FUSE
//! mount other than sshfs as local and, before running a thumbnailer that reads the whole file,
//! look in the shared cache of the freedesktop Thumbnail Managing Standard:
//! `$XDG_CACHE_HOME/thumbnails/<size>/<md5 of the file URI>.png`, valid when its tEXt
//! `Thumb::URI` and `Thumb::MTime` match the file (and `Thumb::Size`, where given). So for the
//! stored files of a folder listed here, the mount writes those entries itself, from page one
//! of the store's preview, and the file manager finds them before it thinks of reading.
//! (tumbler compares `Thumb::MTime` to the microsecond, as `sec.usec`, which GIO and KIO
//! refuse: the standard's whole seconds are written, valid for Thunar only for files of a
//! whole-second time.)
//!
//! The work is bounded and never on a FUSE request: a listing only queues (at most
//! [`MAX_QUEUED`] files; the rest are queued by a later listing), and walks a folder's names
//! only when the folder changed since its last walk ([`Walked`]); one task makes one entry at a
//! time and asks the store for at most [`RENDERING`] previews at once. An entry whose file
//! changed is made again (a listing, this mount's upload of it, or a new version learned from
//! elsewhere queues it), with the new `Thumb::MTime`. A file deleted (here, or learned gone)
//! loses its entries, as a renamed file loses those of its old name.
//!
//! The queue's lock is innermost: taken under the inode table, nothing taken under it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use super::Fs;
use super::table::{Ino, Inode, InodeKind, Table};
use crate::api::{NodePath, PageSize, PreviewStatus};
use crate::backend::Backend;
use crate::sync::relock;

/// The sizes written: the standard's `normal` and `large`, what file managers ask for at their
/// usual zoom levels (Dolphin looks only in the one its zoom asks for).
pub(super) const SIZES: [(&str, u32); 2] = [("normal", 128), ("large", 256)];
/// Larger entries another program made: removed when stale, since GIO takes the largest
/// entry there is and would find it invalid (then thumbnail the file by reading it).
const OTHER_SIZES: [&str; 2] = ["x-large", "xx-large"];
/// How long the mount goes without a reader's READ of stored bytes before entries are made
/// (their previews are fetched over the same link: `reads::LastRead`).
const READERS_FIRST: Duration = Duration::from_millis(500);
/// Files waiting at most: a listing of 100,000 files queues the first of them only.
const MAX_QUEUED: usize = 1000;
/// Files (and folders listed) remembered; forgotten all at once past this (then made again
/// as listed).
const MAX_SEEN: usize = 100_000;
/// A file whose entries could not be made (the store away, say) is tried again after this.
const AFTER_ERROR: Duration = Duration::from_secs(300);
/// Files whose previews are being rendered at once, at most: asking the store for a file's
/// preview puts it among the jobs somebody asked for, and a listing of 1000 files must not
/// fill that queue ahead of the user's own asks. The rest wait here without asking.
const RENDERING: usize = 4;
/// A preview still rendering is asked again after a quarter of the time waited so far, within
/// these bounds (a small file's preview takes about a second; a store whose renderer is behind
/// is asked about once in 8 s), and for at most `GIVE_UP` (then as after an error).
const RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(8);
const GIVE_UP: Duration = Duration::from_secs(120);

/// The mount's part: where the cache is, the queue and what was done.
#[derive(Default)]
pub(super) struct Thumbnails {
    /// The thumbnail cache (`.../thumbnails`) and the mount point; unset while off.
    at: OnceLock<(PathBuf, PathBuf)>,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// Not asked for yet, oldest first.
    queue: VecDeque<Job>,
    /// Asked for, their previews still rendering (at most [`RENDERING`]).
    rendering: VecDeque<Job>,
    /// Those of both.
    queued: HashSet<Ino>,
    /// What each file's entries were last made (or found not to be made) for, and until when
    /// that holds where making them failed.
    seen: HashMap<Ino, (Stamp, Option<Instant>)>,
    /// Folders listed (a file stored into one is queued at once), and their last walk when
    /// it queued all their files.
    folders: HashMap<Ino, Option<Walked>>,
    /// What the entries of files gone were made for: removed by the task.
    gone: Vec<Stamp>,
    /// Walks of a folder's names (for the tests).
    #[cfg(test)]
    walks: usize,
}

/// A folder whose names were all queued (or done) as it was: its listing as fetched then and
/// its time (moved by this mount's creates, deletes and renames in it, and by those learned
/// from elsewhere). Its files changed otherwise are queued one by one (`thumbnails_stored`),
/// so a listing of it walks its names again only once either moved, or after
/// [`AFTER_ERROR`] (files whose entries failed are tried again).
#[derive(Clone, Copy, PartialEq)]
struct Walked {
    fetched: Instant,
    mtime: SystemTime,
    at: Instant,
}

/// What an entry depends on: the file's place (its URI), version and time as `stat` shows it.
#[derive(Clone, PartialEq, Debug)]
struct Stamp {
    path: NodePath,
    md5: Option<String>,
    mtime: i64,
}

impl Stamp {
    fn of(i: &Inode) -> Option<Stamp> {
        let r = i.remote.as_ref()?;
        Some(Stamp {
            path: i.path.clone(),
            md5: r.md5.clone(),
            mtime: unix_secs(i.mtime),
        })
    }

    /// The same as `Stamp::of(i)`, without building one (a listing checks every file).
    fn holds_for(&self, i: &Inode) -> bool {
        i.remote.as_ref().is_some_and(|r| r.md5 == self.md5)
            && self.mtime == unix_secs(i.mtime)
            && self.path == i.path
    }
}

struct Job {
    ino: Ino,
    id: String,
    size: u64,
    stamp: Stamp,
    /// What its entries were made for last, if at another path (renamed): those go.
    moved_from: Option<Stamp>,
    /// When the store was first asked for its preview, and when to ask again.
    asked: Option<Instant>,
    not_before: Instant,
}

/// Seconds since the epoch, as `st_mtime` has them (floored).
fn unix_secs(t: SystemTime) -> i64 {
    crate::api::time::time_to_ns(t).div_euclid(1_000_000_000)
}

/// The `file://` URI of `path` as GLib's `g_filename_to_uri` spells it (the same characters
/// kept, the rest %XX): the entry's name is the md5 of exactly this.
pub(super) fn file_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"!$&'()*+,-./:=@_~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// Starts making entries into `cache` (`$XDG_CACHE_HOME/thumbnails`) for the files under
/// `mountpoint` (absolute, as file managers name the files).
pub(super) fn start<B: Backend>(fs: &Arc<Fs<B>>, cache: PathBuf, mountpoint: PathBuf) {
    if fs.thumbnails.at.set((cache, mountpoint)).is_ok() {
        let fs = fs.clone();
        fs.rt
            .clone()
            .spawn(async move { fs.make_thumbnails().await });
    }
}

impl<B: Backend> Fs<B> {
    /// `folder` was listed: its stored files whose entries are missing or stale are queued.
    pub(super) fn thumbnails_listed(&self, folder: Ino) {
        if self.thumbnails.at.get().is_some() {
            self.nodes.read(|t| self.listed_in(t, folder));
        }
    }

    /// `thumbnails_listed`, from the table `t`.
    fn listed_in(&self, t: &Table, folder: Ino) {
        let Some(dir) = t.get(folder) else { return };
        let Some((fetched, names)) = dir.listing() else {
            return;
        };
        let now = Instant::now();
        let mut s = relock(&self.thumbnails.state);
        let same =
            |w: Walked| (w.fetched, w.mtime) == (*fetched, dir.mtime) && now < w.at + AFTER_ERROR;
        if s.folders.get(&folder).copied().flatten().is_some_and(same) {
            return;
        }
        if s.folders.len() >= MAX_SEEN {
            s.folders.clear();
        }
        #[cfg(test)]
        {
            s.walks += 1;
        }
        let before = s.queue.len();
        let mut whole = true;
        for &ino in names.values() {
            if s.queue.len() >= MAX_QUEUED {
                whole = false;
                break;
            }
            queue(&mut s, t, ino);
        }
        let walked = whole.then_some(Walked {
            fetched: *fetched,
            mtime: dir.mtime,
            at: now,
        });
        s.folders.insert(folder, walked);
        if s.queue.len() > before {
            self.thumbnails.wake.notify_one();
        }
    }

    /// A version of `ino` was stored (by this mount, or elsewhere and its attributes fetched
    /// since): its entries follow, if it had some or its folder was listed (a file manager
    /// shows it).
    pub(super) fn thumbnails_stored(&self, ino: Ino) {
        self.nodes.read(|t| self.thumbnails_stored_in(t, ino));
    }

    /// `thumbnails_stored`, for a step that holds the table.
    pub(super) fn thumbnails_stored_in(&self, t: &Table, ino: Ino) {
        if self.thumbnails.at.get().is_none() {
            return;
        }
        let mut s = relock(&self.thumbnails.state);
        let folder = (t.get(ino))
            .and_then(|i| t.ino_of(&i.path.parent()?))
            .is_some_and(|f| s.folders.contains_key(&f));
        let known = folder || s.seen.contains_key(&ino);
        if known && s.queue.len() < MAX_QUEUED && queue(&mut s, t, ino) {
            self.thumbnails.wake.notify_one();
        }
    }

    /// `ino` at `path` is gone (deleted here, or learned gone from elsewhere; `dir`: a folder,
    /// not one this mount removed, which was empty): the entries made for it, or for the files
    /// under it, are removed by the task. A file queued meanwhile gets none (the task looks).
    pub(super) fn thumbnails_gone(&self, ino: Ino, path: &NodePath, dir: bool) {
        if self.thumbnails.at.get().is_none() {
            return;
        }
        let mut s = relock(&self.thumbnails.state);
        let s = &mut *s;
        if let Some((stamp, _)) = s.seen.remove(&ino) {
            s.gone.push(stamp);
        }
        if dir {
            s.folders.remove(&ino);
            s.seen.retain(|_, (stamp, _)| {
                let inside = path.contains(&stamp.path);
                if inside {
                    s.gone.push(stamp.clone());
                }
                !inside
            });
        }
        if !s.gone.is_empty() {
            self.thumbnails.wake.notify_one();
        }
    }

    /// The one task that makes entries, one at a time: files whose previews were rendering
    /// when asked last, once due again, else the oldest queued while fewer than [`RENDERING`]
    /// are rendering. The entries of files gone are removed first.
    async fn make_thumbnails(self: Arc<Self>) {
        let th = &self.thumbnails;
        loop {
            let gone = std::mem::take(&mut relock(&th.state).gone);
            if !gone.is_empty() {
                self.remove_entries(gone).await;
                continue;
            }
            // Readers first (see `reads::LastRead`).
            let wait = self.reads.last_read.quiet_in(READERS_FIRST);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
                continue;
            }
            // A job, or when the next one is due (None: when one is queued).
            let next = {
                let mut s = relock(&th.state);
                let first = (s.rendering.iter().enumerate()).min_by_key(|(_, j)| j.not_before);
                let (k, due) = first.map_or((0, None), |(k, j)| (k, Some(j.not_before)));
                if due.is_some_and(|at| at <= Instant::now()) {
                    s.rendering.remove(k).ok_or(due)
                } else if s.rendering.len() < RENDERING && !s.queue.is_empty() {
                    s.queue.pop_front().ok_or(due)
                } else {
                    Err(due)
                }
            };
            let mut job = match next {
                Ok(job) => job,
                Err(Some(at)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at.into()) => {}
                        () = th.wake.notified() => {}
                    }
                    continue;
                }
                Err(None) => {
                    th.wake.notified().await;
                    continue;
                }
            };
            let made = self.thumbnail(&job).await;
            // The state taken under the table: a delete done there ends before this looks,
            // or after `seen` has the file (and removes its entries then).
            let (mut s, gone) = self.nodes.read(|t| {
                let s = relock(&th.state);
                let gone = match t.get(job.ino) {
                    Some(i) => i.unlinked,
                    None => t.ino_of(&job.stamp.path).is_none(),
                };
                (s, gone)
            });
            if gone {
                s.queued.remove(&job.ino);
                s.gone.push(job.stamp);
                continue;
            }
            let now = Instant::now();
            let asked = *job.asked.get_or_insert(now);
            let until = match made {
                Ok(false) if now < asked + GIVE_UP => {
                    job.not_before = now + ((now - asked) / 4).clamp(RETRY, MAX_RETRY);
                    s.rendering.push_back(job);
                    continue;
                }
                Ok(true) => None,
                // Not before long, even if listed again: a listing would ask each time.
                Ok(false) => Some(now + AFTER_ERROR),
                Err(e) => {
                    log::debug!("no thumbnail of {}: {e}", job.stamp.path);
                    Some(now + AFTER_ERROR)
                }
            };
            s.queued.remove(&job.ino);
            if s.seen.len() >= MAX_SEEN {
                s.seen.clear();
            }
            s.seen.insert(job.ino, (job.stamp, until));
        }
    }

    /// Makes `job`'s entries. False while the preview is still rendering.
    async fn thumbnail(&self, job: &Job) -> Result<bool, String> {
        let (cache, mountpoint) = self.thumbnails.at.get().ok_or("off")?;
        let meta = self
            .backend
            .preview(&job.id)
            .await
            .map_err(|e| e.to_string())?;
        match meta.status {
            PreviewStatus::InProgress => return Ok(false),
            PreviewStatus::TypeNotSupported => return Ok(true),
            PreviewStatus::Ready if meta.pages.is_empty() => return Ok(true),
            PreviewStatus::Ready => {}
        }
        let (name, uri) = entry_of(mountpoint, &self.opts.root, &job.stamp.path);
        let old: Vec<_> = (job.moved_from.iter())
            .map(|st| (entry_of(mountpoint, &self.opts.root, &st.path), st.mtime))
            .collect();
        let mut pngs = Vec::new();
        for (dir, px) in SIZES {
            let size = PageSize {
                scale: None,
                max_width: Some(px),
                max_height: Some(px),
            };
            let img =
                (self.backend.preview_page(&job.id, 1, size).await).map_err(|e| e.to_string())?;
            pngs.push((dir, px, img.data));
        }
        // Changed meanwhile: the next listing queues it with what it is now (gone: none).
        if !self
            .nodes
            .inode(job.ino, |i| !i.unlinked && job.stamp.holds_for(i))
            .unwrap_or(false)
        {
            return Ok(true);
        }
        let (cache, stamp, size) = (cache.clone(), job.stamp.clone(), job.size);
        let write = move || -> Result<(), String> {
            for (dir, px, data) in pngs {
                let png = tagged_png(&data, px, &uri, &stamp.mtime.to_string(), size)?;
                write_entry(&cache.join(dir), &name, &png).map_err(|e| e.to_string())?;
            }
            for dir in OTHER_SIZES {
                let p = cache.join(dir).join(&name);
                if p.exists() && !entry_matches(&p, &uri, stamp.mtime) {
                    let _ = std::fs::remove_file(&p);
                }
            }
            // The entries of its old name (still its own: no other file's made there since).
            remove_own(&cache, &old);
            Ok(())
        };
        tokio::task::spawn_blocking(write)
            .await
            .map_err(|e| e.to_string())??;
        Ok(true)
    }
}

impl<B: Backend> Fs<B> {
    /// Removes the entries made for the files gone.
    async fn remove_entries(&self, gone: Vec<Stamp>) {
        let Some((cache, mountpoint)) = self.thumbnails.at.get() else {
            return;
        };
        let entries: Vec<_> = (gone.iter())
            .map(|st| (entry_of(mountpoint, &self.opts.root, &st.path), st.mtime))
            .collect();
        let cache = cache.clone();
        let _ = tokio::task::spawn_blocking(move || remove_own(&cache, &entries)).await;
    }
}

/// The entry's name (the md5 of the file's URI) and that URI, for the file at `path`.
fn entry_of(mountpoint: &Path, root: &NodePath, path: &NodePath) -> (String, String) {
    let rel = &path.segments()[root.segments().len()..];
    let uri = file_uri(&rel.iter().fold(mountpoint.to_path_buf(), |p, s| p.join(s)));
    let md5 = crate::api::checksum::Md5::digest(uri.as_bytes());
    (format!("{}.png", crate::api::checksum::hex(&md5)), uri)
}

/// Removes the entries (of each size written) named and still made for the URI and time given
/// (not one made since for another file of that name).
fn remove_own(cache: &Path, entries: &[((String, String), i64)]) {
    for ((name, uri), mtime) in entries {
        for (dir, _) in SIZES {
            let p = cache.join(dir).join(name);
            if entry_matches(&p, uri, *mtime) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

/// The names file managers thumbnail and the store renders: PDFs and the images it decodes
/// (`preview::sniff`). Not text: Nautilus, Thunar and PCManFM show none for it, and a shell's
/// `ls` of a source tree would have the store render every file.
const THUMBNAILED: &[&str] = &[
    "pdf", "png", "jpg", "jpeg", "jpe", "gif", "webp", "bmp", "tif", "tiff",
];

pub(super) fn thumbnailed(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(_, ext)| THUMBNAILED.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

/// Queues `ino` if it is a stored file of a thumbnailed kind whose entries are missing or
/// stale (not while it has local changes: the store's preview is of the version before them).
fn queue(s: &mut State, t: &Table, ino: Ino) -> bool {
    let Some(i) = t.get(ino) else { return false };
    if i.kind != InodeKind::File || i.staged.is_some() || s.queued.contains(&ino) {
        return false;
    }
    if !i.path.name().is_some_and(thumbnailed) {
        return false;
    }
    let done = |(st, until): &(Stamp, Option<Instant>)| {
        st.holds_for(i) && until.is_none_or(|u| Instant::now() < u)
    };
    if s.seen.get(&ino).is_some_and(done) {
        return false;
    }
    let (Some(r), Some(stamp)) = (i.remote.as_ref(), Stamp::of(i)) else {
        return false;
    };
    let moved_from = (s.seen.get(&ino))
        .map(|(st, _)| st.clone())
        .filter(|st| st.path != stamp.path);
    s.queued.insert(ino);
    s.queue.push_back(Job {
        ino,
        id: r.id.clone(),
        size: r.size,
        stamp,
        moved_from,
        asked: None,
        not_before: Instant::now(),
    });
    true
}

/// The store's page image (PNG, or whatever a server sends), at most `px` a side, as a PNG
/// with the standard's keys. Decoded within bounds: a server may send anything.
pub(super) fn tagged_png(
    data: &[u8],
    px: u32,
    uri: &str,
    mtime: &str,
    size: u64,
) -> Result<Vec<u8>, String> {
    let mut reader = image::ImageReader::new(std::io::Cursor::new(data))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(4096);
    limits.max_image_height = Some(4096);
    limits.max_alloc = Some(64 << 20);
    reader.limits(limits);
    let mut img = reader.decode().map_err(|e| e.to_string())?;
    if img.width() > px || img.height() > px {
        img = img.thumbnail(px, px);
    }
    let rgba = img.to_rgba8();
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, rgba.width(), rgba.height());
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    for (k, v) in [
        ("Thumb::URI", uri.to_string()),
        ("Thumb::MTime", mtime.to_string()),
        ("Thumb::Size", size.to_string()),
        ("Software", "vaultfs".to_string()),
    ] {
        enc.add_text_chunk(k.into(), v).map_err(|e| e.to_string())?;
    }
    let mut w = enc.write_header().map_err(|e| e.to_string())?;
    w.write_image_data(&rgba).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Whether the entry at `p` is for `uri` at `mtime`.
fn entry_matches(p: &Path, uri: &str, mtime: i64) -> bool {
    let Ok(bytes) = std::fs::read(p) else {
        return false;
    };
    let Ok(reader) = png::Decoder::new(std::io::Cursor::new(bytes)).read_info() else {
        return false;
    };
    let text = &reader.info().uncompressed_latin1_text;
    let get = |k: &str| {
        text.iter()
            .find(|c| c.keyword == k)
            .map(|c| c.text.as_str())
    };
    get("Thumb::URI") == Some(uri) && get("Thumb::MTime") == Some(&mtime.to_string())
}

/// Writes an entry as the standard asks: a temporary file in the same folder renamed over
/// it (readers never see half of one), 0600 in folders of 0700 (made here if missing).
fn write_entry(dir: &Path, name: &str, png: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{name}.vaultfs-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = crate::api::files::new_private(&tmp)?;
    f.write_all(png)?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_spelled_as_glib_spells_them() {
        assert_eq!(
            file_uri(Path::new("/m/Local/My First Vault/a#b%c;d?.pdf")),
            "file:///m/Local/My%20First%20Vault/a%23b%25c%3Bd%3F.pdf"
        );
        assert_eq!(
            file_uri(Path::new("/m/x/Grüße (1)+~,@.pdf")),
            "file:///m/x/Gr%C3%BC%C3%9Fe%20(1)+~,@.pdf"
        );
    }

    /// A listing of more files than the queue holds queues as many as it holds, a later listing
    /// the rest, and a listing once all are done queues (and asks the store) nothing. Files of
    /// kinds no file manager thumbnails (text) are never asked for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_folder_is_queued_in_bounded_parts() {
        use crate::backend::faulty::Op;
        use crate::fs::table::ROOT;
        use crate::fs::tests::{TTL, eventually, harness};
        let h = harness(false, TTL);
        let n = MAX_QUEUED + 300;
        for i in 0..n {
            let name = format!("f{i:05}.pdf");
            h.store().create_file(&h.vault, &name).await.unwrap();
        }
        let text = 50;
        for i in 0..text {
            let name = format!("t{i:05}.txt");
            h.store().create_file(&h.vault, &name).await.unwrap();
        }
        let cache = tempfile::tempdir().unwrap();
        start(&h.fs, cache.path().to_path_buf(), PathBuf::from("/m"));
        let th = &h.fs.thumbnails;
        // Queued or done, whatever the worker got to: the bound, then all.
        let taken = || {
            let s = relock(&th.state);
            (s.queued.len() + s.seen.len(), s.queued.is_empty())
        };
        for want in [MAX_QUEUED, n] {
            assert_eq!(h.names(ROOT).await.len(), n + text);
            assert_eq!(taken().0, want);
            eventually(Duration::from_secs(60), "the queue done", || async {
                taken().1
            })
            .await;
        }
        let asked = h.faults().calls(Op::Preview);
        assert_eq!(asked, n as u64, "each file's preview asked for once");
        h.names(ROOT).await;
        assert_eq!(taken(), (n, true));
        assert_eq!(h.faults().calls(Op::Preview), asked);
    }

    /// A folder listed again walks its names only once it changed since its last walk: a
    /// file made in it, its listing fetched again (expired by a change learned from
    /// elsewhere); not while it is as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_folder_is_walked_again_only_once_changed() {
        use crate::fs::table::ROOT;
        use crate::fs::tests::{eventually, harness};
        let h = harness(false, Duration::from_secs(3600));
        for i in 0..20 {
            let name = format!("f{i:02}.pdf");
            h.store().create_file(&h.vault, &name).await.unwrap();
        }
        let cache = tempfile::tempdir().unwrap();
        start(&h.fs, cache.path().to_path_buf(), PathBuf::from("/m"));
        let th = &h.fs.thumbnails;
        let walks = || relock(&th.state).walks;
        assert_eq!(h.names(ROOT).await.len(), 20);
        assert_eq!(walks(), 1);
        eventually(Duration::from_secs(60), "the queue done", || async {
            relock(&th.state).queued.is_empty()
        })
        .await;
        for _ in 0..3 {
            h.names(ROOT).await;
        }
        assert_eq!(walks(), 1, "walked again unchanged");
        h.write_file(ROOT, "new.pdf", b"%PDF-1.4").await;
        h.names(ROOT).await;
        h.names(ROOT).await;
        assert_eq!(walks(), 2, "a file made in it");
        let past = h.fs.nodes.freshness.expired().unwrap();
        h.fs.nodes.expire_listing(ROOT, past);
        eventually(
            Duration::from_secs(10),
            "its listing fetched again",
            || async {
                h.names(ROOT).await;
                walks() == 3
            },
        )
        .await;
        h.names(ROOT).await;
        assert_eq!(walks(), 3);
    }

    #[test]
    fn a_huge_page_image_is_refused_not_decoded() {
        let mut src = Vec::new();
        image::DynamicImage::ImageLuma8(image::GrayImage::new(5000, 10))
            .write_to(&mut std::io::Cursor::new(&mut src), image::ImageFormat::Png)
            .unwrap();
        assert!(tagged_png(&src, 128, "file:///m/a.pdf", "0", 1).is_err());
    }

    #[test]
    fn entries_carry_the_keys_and_fit_their_size() {
        let big = image::RgbImage::from_pixel(300, 400, image::Rgb([200, 10, 10]));
        let mut src = Vec::new();
        image::DynamicImage::ImageRgb8(big)
            .write_to(&mut std::io::Cursor::new(&mut src), image::ImageFormat::Png)
            .unwrap();
        let png = tagged_png(&src, 128, "file:///m/a.pdf", "1700000000", 42).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_entry(dir.path(), "x.png", &png).unwrap();
        let p = dir.path().join("x.png");
        assert!(entry_matches(&p, "file:///m/a.pdf", 1_700_000_000));
        assert!(!entry_matches(&p, "file:///m/a.pdf", 1_700_000_001));
        let img = image::load_from_memory(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!((img.width(), img.height()), (96, 128));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
