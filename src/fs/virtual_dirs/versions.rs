//! The virtual, read-only `.versions/` of every folder (docs/design.md §5, "Versions in the
//! mount"):
//! `.versions/<file>/` lists the earlier versions the backend keeps of `<file>`, named by when
//! each was stored, in UTC: `2026-11-27 01.02.03.txt` (sortable, no colon, the file's extension
//! kept so applications open them; a second version stored within the same second is
//! `2026-11-27 01.02.03_002.txt`, which sorts after the first, and the tenth, `_010`, after the
//! ninth). Each reads as that version's
//! bytes, with its size and modification time; restoring is copying one back (`vaultfs restore`
//! does that). A name no file has in the folder any more lists the versions of the file last
//! deleted under it, where the backend keeps deleted files (the built-in store: its last version
//! is among them).
//!
//! Like `.preview`, `.versions` is reached by name, never listed in its folder, and nothing in it
//! can be made, changed or removed (EROFS): see `virtual_dirs`. Backends that keep no versions
//! (the public service shows none in a form we know) have an empty `.versions/`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FopenFlags};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::VirtualDir;
use crate::api::path::MAX_NAME_BYTES;
use crate::api::{Version, parse_time};
use crate::backend::Backend;
use crate::fs::error::Error as FsError;
use crate::fs::table::Ino;
use crate::fs::{Fs, OpResult, virtual_names};
use crate::sync::relock;

/// A file's list of versions is asked again after this long.
const LIST_TTL: Duration = Duration::from_secs(1);
/// Files asked for their versions at once while listing a `.versions` directory.
const LIST_CONCURRENCY: usize = 8;

/// The earlier versions of one file, oldest first, with the names they are listed under.
type Named = Vec<(String, Version)>;

struct Listed {
    at: Instant,
    /// The file's ID (the key, but for a deleted file's list, kept by its path).
    id: String,
    versions: Arc<Named>,
}

/// `.versions`: its folders are the files (by name), their entries the versions (by the
/// version's ID, which never changes).
#[derive(Default)]
pub(super) struct Versions {
    /// By file ID (a deleted file's: `deleted <path>`).
    lists: Mutex<HashMap<String, Listed>>,
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
            // Within a name's 255 bytes with a number after it (issue 47, item 9): a long
            // extension is cut at its end.
            let room = MAX_NAME_BYTES.saturating_sub(base.len() + "_0000".len());
            let ext = crate::api::path::cut_at_char(ext, room);
            let mut name = format!("{base}{ext}");
            let mut n = 2;
            while !taken.insert(name.clone()) {
                // Zero-padded, so that `ls` sorts the tenth after the ninth.
                name = format!("{base}_{n:03}{ext}");
                n += 1;
            }
            (name, v)
        })
        .collect()
}

impl<B: Backend> VirtualDir<B> for Versions {
    fn name(&self) -> &'static str {
        virtual_names::VERSIONS
    }

    fn bit(&self) -> Ino {
        virtual_names::VERSIONS_BIT
    }

    fn leaf_key<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        async move {
            let (_, list) = fs.version_list(folder, file).await?;
            let (_, v) = list.iter().find(|(n, _)| n == name).ok_or(Errno::ENOENT)?;
            Ok(v.version_id.clone())
        }
        .boxed()
    }

    /// A file's folder: while it has earlier versions.
    fn dir_time<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
    ) -> BoxFuture<'a, OpResult<SystemTime>> {
        async move {
            if fs.version_list(folder, file).await?.1.is_empty() {
                return Err(Errno::ENOENT.into());
            }
            fs.folder_time(folder).ok_or(Errno::ENOENT.into())
        }
        .boxed()
    }

    fn leaf_attr<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
        vid: &'a str,
    ) -> BoxFuture<'a, OpResult<(u64, SystemTime)>> {
        async move {
            let (_, v) = fs.version_of(folder, file, vid).await?;
            let time = v
                .modified_on
                .as_deref()
                .and_then(parse_time)
                .or_else(|| stored_at(&v))
                .unwrap_or(SystemTime::UNIX_EPOCH);
            Ok((v.size, time))
        }
        .boxed()
    }

    /// The stored files with earlier versions, by name.
    fn list<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let stored = fs.stored_files(folder).await?;
            let files = stored.map(|s| s.files).unwrap_or_default();
            let mut shown: Vec<String> = futures_util::stream::iter(files)
                .map(|(name, _)| async move {
                    // A file whose versions cannot be asked for is left out, not an error for
                    // the whole listing.
                    let any = fs
                        .version_list(folder, &name)
                        .await
                        .is_ok_and(|(_, l)| !l.is_empty());
                    any.then_some(name)
                })
                .buffer_unordered(LIST_CONCURRENCY)
                .filter_map(|n| async move { n })
                .collect()
                .await;
            shown.sort();
            Ok(shown.into_iter().map(|n| (n.clone(), n)).collect())
        }
        .boxed()
    }

    /// The file's earlier versions, oldest first.
    fn list_dir<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let (_, list) = fs.version_list(folder, file).await?;
            let entries = list.iter();
            Ok(entries
                .map(|(vname, v)| (v.version_id.clone(), vname.clone()))
                .collect())
        }
        .boxed()
    }

    /// A version's bytes never change: the kernel may keep them.
    fn open_flags(&self, _leaf: &str) -> FopenFlags {
        FopenFlags::FOPEN_KEEP_CACHE
    }

    fn read<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        file: &'a str,
        vid: &'a str,
        offset: u64,
        size: u32,
    ) -> BoxFuture<'a, OpResult<Vec<u8>>> {
        fs.read_version(folder, file, vid, offset, size).boxed()
    }
}

impl<B: Backend> Fs<B> {
    fn version_lists(&self) -> MutexGuard<'_, HashMap<String, Listed>> {
        relock(&self.virtual_dirs.versions.lists)
    }

    /// The named earlier versions of `folder/name` and the file's ID (asked again after
    /// [`LIST_TTL`]). A backend that keeps none answers an empty list. A name no file has in
    /// the folder: the versions of the file last deleted under it, where the backend keeps
    /// deleted files (all of them earlier versions: the file is gone).
    async fn version_list(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
    ) -> OpResult<(String, Arc<Named>)> {
        // (A file not uploaded yet has no versions yet.)
        let (r, _, path) = match self.stored_file(folder, name).await {
            Err(e) if e.errno() == Errno::ENOENT => {
                return self.deleted_version_list(folder, name).await;
            }
            other => other?,
        };
        let cached = self
            .version_lists()
            .get(&r.id)
            .filter(|l| l.at.elapsed() < LIST_TTL)
            .map(|l| l.versions.clone());
        if let Some(versions) = cached {
            return Ok((r.id, versions));
        }
        let versions = match self.backend.versions(&path).await {
            Ok(v) => v,
            Err(e) if e.code == "no_versions" => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let named = Arc::new(name_versions(name, versions));
        self.version_lists().insert(
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
    ) -> OpResult<(String, Arc<Named>)> {
        let dir = self.nodes.inode(folder, |i| i.path.clone());
        let path = dir.and_then(|d| d.child(name).ok()).ok_or(Errno::ENOENT)?;
        let key = format!("deleted {path}");
        let cached = self
            .version_lists()
            .get(&key)
            .filter(|l| l.at.elapsed() < LIST_TTL)
            .map(|l| (l.id.clone(), l.versions.clone()));
        if let Some(found) = cached {
            return Ok(found);
        }
        // A file this mount just deleted is among the store's deleted files once its delete
        // is sent (`deletes`).
        self.deletes_sent().await;
        let (id, versions) = self
            .backend
            .deleted_versions(&path)
            .await?
            .ok_or(Errno::ENOENT)?;
        let named = Arc::new(name_versions(name, versions));
        self.version_lists().insert(
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
    ) -> OpResult<(String, Version)> {
        let (id, list) = self.version_list(folder, name).await?;
        let v = list
            .iter()
            .find(|(_, v)| v.version_id == vid)
            .ok_or(Errno::ENOENT)?;
        Ok((id, v.1.clone()))
    }

    /// Reads a version, fetched whole into the read cache (under a key of its own) on first use.
    async fn read_version(
        self: &Arc<Self>,
        folder: Ino,
        name: &str,
        vid: &str,
        offset: u64,
        size: u32,
    ) -> OpResult<Vec<u8>> {
        let (id, v) = self.version_of(folder, name, vid).await?;
        let key = format!("version-{id}-{vid}");
        let md5 = v.md5_checksum.as_deref();
        let entry = match self.reads.cache.complete(&key, md5) {
            Some(e) => e,
            None => {
                let d = self.backend.download_version(&id, vid, None).await?;
                let len = d.len();
                self.reads.cache.fill(&key, md5, len, d.body).await?
            }
        };
        entry
            .read_cached(offset, size as usize)
            .await
            .map_err(FsError::from)
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
                ("2026-11-27 01.02.03_002.txt", "3"),
            ]
        );
        // Twelve saves in one second sort as they were made, as `ls` sorts names.
        let many: Vec<Version> = (0..12)
            .rev()
            .map(|i| {
                v(
                    &i.to_string(),
                    &format!("2026-11-27T01:02:03.{i:03}Z"),
                    false,
                )
            })
            .collect();
        let named = name_versions("sheet.ods", many);
        let mut sorted: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        sorted.sort();
        let ids: Vec<&str> = sorted
            .iter()
            .map(|n| {
                named
                    .iter()
                    .find(|(m, _)| m == n)
                    .unwrap()
                    .1
                    .version_id
                    .as_str()
            })
            .collect();
        assert_eq!(
            ids,
            ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"]
        );
        assert_eq!(
            name_versions("Makefile", vec![v("1", "2026-01-02T03:04:05Z", false)])[0].0,
            "2026-01-02 03.04.05"
        );
    }

    /// Issue 47, item 9: a file whose extension is most of its name: each version's name
    /// fits 255 bytes, and stays unique.
    #[test]
    fn versions_of_a_long_extension_fit_a_name() {
        let file = format!("a.{}", "é".repeat(126));
        let saves: Vec<Version> = (0..3)
            .map(|i| v(&i.to_string(), "2026-11-27T01:02:03Z", false))
            .collect();
        let named = name_versions(&file, saves);
        for (n, _) in &named {
            crate::api::path::validate_name(n).unwrap();
            assert!(
                n.starts_with("2026-11-27 01.02.03") && n.contains(".éé"),
                "{n}"
            );
        }
        assert_eq!(
            named
                .iter()
                .map(|(n, _)| n)
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3
        );
    }
}
