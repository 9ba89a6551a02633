//! The virtual, read-only `.versions/` of every folder (docs/design.md §5, "Versions in the
//! mount"):
//! `.versions/<file>/` lists the earlier versions the backend keeps of `<file>`, named by when
//! each was stored, in UTC: `2026-11-27 01.02.03.txt` (sortable, no colon, the file's extension
//! kept so applications open them; a second version stored within the same second is
//! `2026-11-27 01.02.03_2.txt`, which sorts after the first). Each reads as that version's bytes, with its size and
//! modification time; restoring is copying one back (`vaultfs restore` does that). A name no
//! file has in the folder any more lists the versions of the file last deleted under it, where
//! the backend keeps deleted files (the built-in store: its last version is among them).
//!
//! Like `.preview` (see `preview`), `.versions` is reached by name, never listed in its folder,
//! and nothing in it can be made, changed or removed (EROFS). Its inodes carry the preview
//! module's flag (so every virtual-inode path leads to `preview`, which hands them here) and
//! [`VFLAG`] besides. Backends that keep no versions (the public service shows none in a form
//! we know) have an empty `.versions/`.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType};
use futures_util::StreamExt;

use super::Fs;
use super::errno::errno;
use super::table::{Ino, InodeKind, Remote};
use crate::api::{Version, parse_time};
use crate::backend::Backend;
use crate::sync::relock;

/// The name of the virtual directory.
pub const DIR_NAME: &str = super::virtual_names::VERSIONS;
/// Set, beside the preview module's flag, in every inode of the `.versions` trees.
const VFLAG: Ino = super::virtual_names::FLAG | super::virtual_names::VERSIONS_BIT;
/// A file's list of versions is asked again after this long.
const LIST_TTL: Duration = Duration::from_secs(1);
/// Files asked for their versions at once while listing a `.versions` directory.
const LIST_CONCURRENCY: usize = 8;

/// Whether `ino` is a node of a `.versions` tree.
pub fn owns(ino: Ino) -> bool {
    ino & VFLAG == VFLAG
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Node {
    /// `<folder>/.versions`
    Root(Ino),
    /// `<folder>/.versions/<name>`
    File(Ino, String),
    /// `<folder>/.versions/<name>/<version>`: by the version's ID, which never changes.
    Item(Ino, String, String),
}

/// The earlier versions of one file, oldest first, with the names they are listed under.
type Named = Vec<(String, Version)>;

struct Listed {
    at: Instant,
    /// The file's ID (the key, but for a deleted file's list, kept by its path).
    id: String,
    versions: Arc<Named>,
}

#[derive(Default)]
pub struct Tree {
    ids: super::preview::VirtualInos<Node, VFLAG>,
    /// By file ID (a deleted file's: `deleted <path>`).
    lists: HashMap<String, Listed>,
}

/// When a version was stored (else when it was modified).
fn stored_at(v: &Version) -> Option<SystemTime> {
    v.created_on
        .as_deref()
        .or(v.modified_on.as_deref())
        .and_then(parse_time)
}

/// `2026-11-27 01.02.03` in UTC.
fn stamp(t: SystemTime) -> String {
    let dt = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => time::OffsetDateTime::UNIX_EPOCH + d,
        Err(e) => time::OffsetDateTime::UNIX_EPOCH - e.duration(),
    };
    format!(
        "{:04}-{:02}-{:02} {:02}.{:02}.{:02}",
        dt.year(),
        dt.month() as u8,
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    )
}

/// Names the earlier versions of `file` (the current one is the file itself), oldest first.
pub fn name_versions(file: &str, versions: Vec<Version>) -> Named {
    let ext = match file.rfind('.') {
        Some(i) if i > 0 => &file[i..],
        _ => "",
    };
    let mut earlier: Vec<(Option<SystemTime>, Version)> = versions
        .into_iter()
        .filter(|v| !v.current)
        .map(|v| (stored_at(&v), v))
        .collect();
    // The backend lists newest first; a stable sort keeps that order reversed for equal times.
    earlier.reverse();
    earlier.sort_by_key(|(t, _)| *t);
    let mut taken = std::collections::HashSet::new();
    earlier
        .into_iter()
        .map(|(t, v)| {
            let base = t.map_or_else(|| format!("version {}", v.version_id), stamp);
            let mut name = format!("{base}{ext}");
            let mut n = 2;
            while !taken.insert(name.clone()) {
                name = format!("{base}_{n}{ext}");
                n += 1;
            }
            (name, v)
        })
        .collect()
}

impl<B: Backend> Fs<B> {
    fn versions_tree(&self) -> MutexGuard<'_, Tree> {
        relock(&self.virtual_dirs.versions)
    }

    /// The stored file `name` of `folder` (a file not uploaded yet has no versions yet).
    async fn versioned_file(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> Result<(Remote, crate::api::NodePath), Errno> {
        let ino = self.child(folder, name).await?.ok_or(Errno::ENOENT)?;
        let t = self.table();
        let i = t.get(ino).ok_or(Errno::ENOENT)?;
        match (&i.kind, &i.remote) {
            (InodeKind::File, Some(r)) => Ok((r.clone(), i.path.clone())),
            _ => Err(Errno::ENOENT),
        }
    }

    /// The named earlier versions of `folder/name` and the file's ID (asked again after
    /// [`LIST_TTL`]). A backend that keeps none answers an empty list. A name no file has in
    /// the folder: the versions of the file last deleted under it, where the backend keeps
    /// deleted files (all of them earlier versions: the file is gone).
    async fn version_list(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> Result<(String, Arc<Named>), Errno> {
        let (r, path) = match self.versioned_file(folder, name).await {
            Err(Errno::ENOENT) => return self.deleted_version_list(folder, name).await,
            other => other?,
        };
        let cached = self
            .versions_tree()
            .lists
            .get(&r.id)
            .filter(|l| l.at.elapsed() < LIST_TTL)
            .map(|l| l.versions.clone());
        if let Some(versions) = cached {
            return Ok((r.id, versions));
        }
        let versions = match self.backend.versions(&path).await {
            Ok(v) => v,
            Err(e) if e.code == "no_versions" => Vec::new(),
            Err(e) => return Err(errno(&e)),
        };
        let named = Arc::new(name_versions(name, versions));
        self.versions_tree().lists.insert(
            r.id.clone(),
            Listed {
                at: Instant::now(),
                id: r.id.clone(),
                versions: named.clone(),
            },
        );
        Ok((r.id, named))
    }

    /// [`Self::version_list`] of a name no file has in `folder` (asked again after
    /// [`LIST_TTL`], by the name: the file deleted last under it may change).
    async fn deleted_version_list(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> Result<(String, Arc<Named>), Errno> {
        let dir = self.table().get(folder).map(|i| i.path.clone());
        let path = dir.and_then(|d| d.child(name).ok()).ok_or(Errno::ENOENT)?;
        let key = format!("deleted {path}");
        let cached = self
            .versions_tree()
            .lists
            .get(&key)
            .filter(|l| l.at.elapsed() < LIST_TTL)
            .map(|l| (l.id.clone(), l.versions.clone()));
        if let Some(found) = cached {
            return Ok(found);
        }
        let (id, versions) = self
            .backend
            .deleted_versions(&path)
            .await
            .map_err(|e| errno(&e))?
            .ok_or(Errno::ENOENT)?;
        let named = Arc::new(name_versions(name, versions));
        self.versions_tree().lists.insert(
            key,
            Listed {
                at: Instant::now(),
                id: id.clone(),
                versions: named.clone(),
            },
        );
        Ok((id, named))
    }

    /// The version `vid` of `folder/name` and the file's ID.
    async fn version_of(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
        vid: &str,
    ) -> Result<(String, Version), Errno> {
        let (id, list) = self.version_list(folder, name).await?;
        let v = list
            .iter()
            .find(|(_, v)| v.version_id == vid)
            .ok_or(Errno::ENOENT)?;
        Ok((id, v.1.clone()))
    }

    pub(super) async fn versions_getattr(self: &Arc<Self>, ino: Ino) -> Result<FileAttr, Errno> {
        let node = self.versions_tree().ids.node(ino).ok_or(Errno::ENOENT)?;
        let folder_time = |folder| {
            self.table()
                .get(folder)
                .map(|i| i.mtime)
                .ok_or(Errno::ENOENT)
        };
        match node {
            Node::Root(folder) => Ok(self.virtual_attr(ino, true, 0, folder_time(folder)?)),
            Node::File(folder, name) => {
                if self.version_list(folder, &name).await?.1.is_empty() {
                    return Err(Errno::ENOENT);
                }
                Ok(self.virtual_attr(ino, true, 0, folder_time(folder)?))
            }
            Node::Item(folder, name, vid) => {
                let (_, v) = self.version_of(folder, &name, &vid).await?;
                let time = v
                    .modified_on
                    .as_deref()
                    .and_then(parse_time)
                    .or_else(|| stored_at(&v))
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                Ok(self.virtual_attr(ino, false, v.size, time))
            }
        }
    }

    /// Lookup of `name` in a `.versions` directory, or of `.versions` in a real folder.
    pub(super) async fn versions_lookup(
        self: &Arc<Self>,
        parent: Ino,
        name: &str,
    ) -> Result<FileAttr, Errno> {
        let known = self.versions_tree().ids.node(parent);
        let node = match known {
            None if owns(parent) => return Err(Errno::ENOENT),
            None => match self.table().get(parent).map(|i| i.kind) {
                Some(InodeKind::Dir) => Node::Root(parent),
                Some(InodeKind::File) => return Err(Errno::ENOTDIR),
                None => return Err(Errno::ENOENT),
            },
            Some(Node::Root(folder)) => Node::File(folder, name.to_string()),
            Some(Node::File(folder, file)) => {
                let (_, list) = self.version_list(folder, &file).await?;
                let (_, v) = list.iter().find(|(n, _)| n == name).ok_or(Errno::ENOENT)?;
                Node::Item(folder, file, v.version_id.clone())
            }
            Some(Node::Item(..)) => return Err(Errno::ENOTDIR),
        };
        let ino = self.versions_tree().ids.ino(node);
        self.versions_getattr(ino).await
    }

    /// The entries of a `.versions` directory.
    pub(super) async fn versions_readdir(
        self: &Arc<Self>,
        ino: Ino,
    ) -> Result<Vec<(Ino, FileType, String)>, Errno> {
        let node = self.versions_tree().ids.node(ino).ok_or(Errno::ENOENT)?;
        let mut out = vec![(ino, FileType::Directory, ".".to_string())];
        match node {
            Node::Root(folder) => {
                out.push((folder, FileType::Directory, "..".into()));
                self.ensure_listing(folder).await?;
                let files: Vec<String> = {
                    let t = self.table();
                    let names = t
                        .get(folder)
                        .and_then(|i| i.listing())
                        .map(|(_, n)| n.clone())
                        .unwrap_or_default();
                    names
                        .into_iter()
                        .filter(|(_, c)| {
                            t.get(*c)
                                .is_some_and(|i| i.kind == InodeKind::File && i.remote.is_some())
                        })
                        .map(|(name, _)| name)
                        .collect()
                };
                let fs = self.clone();
                let mut shown: Vec<String> = futures_util::stream::iter(files)
                    .map(|name| {
                        let fs = fs.clone();
                        async move {
                            // A file whose versions cannot be asked for is left out, not an
                            // error for the whole listing.
                            let any = fs
                                .version_list(folder, &name)
                                .await
                                .is_ok_and(|(_, l)| !l.is_empty());
                            any.then_some(name)
                        }
                    })
                    .buffer_unordered(LIST_CONCURRENCY)
                    .filter_map(|n| async move { n })
                    .collect()
                    .await;
                shown.sort();
                let mut tree = self.versions_tree();
                for name in shown {
                    let c = tree.ids.ino(Node::File(folder, name.clone()));
                    out.push((c, FileType::Directory, name));
                }
            }
            Node::File(folder, name) => {
                let root = self.versions_tree().ids.ino(Node::Root(folder));
                out.push((root, FileType::Directory, "..".into()));
                let (_, list) = self.version_list(folder, &name).await?;
                let mut tree = self.versions_tree();
                for (vname, v) in list.iter() {
                    let c = tree
                        .ids
                        .ino(Node::Item(folder, name.clone(), v.version_id.clone()));
                    out.push((c, FileType::RegularFile, vname.clone()));
                }
            }
            Node::Item(..) => return Err(Errno::ENOTDIR),
        }
        Ok(out)
    }

    /// Opening a version: reading only.
    pub(super) fn versions_open(&self, ino: Ino, write: bool) -> Result<fuser::FopenFlags, Errno> {
        match self.versions_tree().ids.node(ino) {
            None => Err(Errno::ENOENT),
            Some(Node::Root(_) | Node::File(..)) => Err(Errno::EISDIR),
            Some(_) if write => Err(Errno::EROFS),
            // A version's bytes never change: the kernel may keep them.
            Some(_) => Ok(fuser::FopenFlags::FOPEN_KEEP_CACHE),
        }
    }

    /// Reads a version, fetched whole into the read cache (under a key of its own) on first use.
    pub(super) async fn versions_read(
        self: &Arc<Self>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let Some(Node::Item(folder, name, vid)) = self.versions_tree().ids.node(ino) else {
            return Err(Errno::EISDIR);
        };
        let (id, v) = self.version_of(folder, &name, &vid).await?;
        let key = format!("version-{id}-{vid}");
        let md5 = v.md5_checksum.as_deref();
        let entry = match self.reads.cache.complete(&key, md5) {
            Some(e) => e,
            None => {
                let d = self
                    .backend
                    .download_version(&id, &vid, None)
                    .await
                    .map_err(|e| errno(&e))?;
                let len = d.len();
                self.reads
                    .cache
                    .fill(&key, md5, len, d.body)
                    .await
                    .map_err(|e| errno(&e))?
            }
        };
        entry
            .read_cached(offset, size as usize)
            .await
            .map_err(|e| errno(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(id: &str, at: &str, current: bool) -> Version {
        Version {
            version_id: id.into(),
            size: 1,
            created_on: Some(at.into()),
            current,
            ..Version::default()
        }
    }

    #[test]
    fn earlier_versions_are_named_by_time_uniquely_with_the_extension() {
        let named = name_versions(
            "report.txt",
            vec![
                v("4", "2026-11-27T01:02:09Z", true),
                v("3", "2026-11-27T01:02:03.900Z", false),
                v("2", "2026-11-27T01:02:03.100Z", false),
                v("1", "2026-11-26T23:00:00Z", false),
            ],
        );
        let names: Vec<(&str, &str)> = named
            .iter()
            .map(|(n, v)| (n.as_str(), v.version_id.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("2026-11-26 23.00.00.txt", "1"),
                ("2026-11-27 01.02.03.txt", "2"),
                ("2026-11-27 01.02.03_2.txt", "3"),
            ]
        );
        assert_eq!(
            name_versions("Makefile", vec![v("1", "2026-01-02T03:04:05Z", false)])[0].0,
            "2026-01-02 03.04.05"
        );
    }
}
