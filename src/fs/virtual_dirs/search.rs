//! The virtual, read-only `.search/` of every folder (issue 35): `.search/QUERY/` lists the
//! files under the folder whose text holds every word of `QUERY`, best first, as
//! `vaultfs search DIR QUERY` and the web page's search box find them (the same backend call,
//! with the same number of hits). Each entry is a read-only file with the document's current
//! bytes, read by its ID through the read cache as the file itself is.
//!
//! In every folder, not only at the mount's root, so the folder one is in scopes the search as
//! the CLI's `DIR` and the web page's folder do: `cd Projects; ls .search/budget`.
//!
//! An entry is named as the file is; where several files found share a name, each (but one
//! directly in the folder) is named by its path under the folder with `/` written `／` (U+FF0F,
//! as rclone writes a slash in a name): `2024／Q1／report.txt`, the extension kept last so
//! applications open it.
//!
//! Like `.preview`, `.search` is reached by name, never listed, and nothing in it can be made,
//! changed or removed (EROFS): see `virtual_dirs`. The answer to a query is kept
//! [`RESULTS_TTL`], so `ls -l` (a listing, then a lookup of each entry) asks the backend once. A
//! backend without search (the public service) answers ENOTSUP for every query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::Errno;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::VirtualDir;
use crate::api::path::MAX_NAME_BYTES;
use crate::api::{NodePath, SearchHit};
use crate::backend::Backend;
use crate::fs::error::Error as FsError;
use crate::fs::table::{Ino, InodeKind, Remote};
use crate::fs::{Fs, OpResult, virtual_names};
use crate::sync::relock;

/// The answer to a query is asked again after this long.
const RESULTS_TTL: Duration = Duration::from_secs(5);
/// Hits whose node (size, md5, time) is asked for at once.
const NODE_CONCURRENCY: usize = 8;
/// What a slash in a path becomes in an entry's name.
const SLASH: char = '／';

/// One file found: its entry's name, its stored version and time.
#[derive(Clone)]
struct Entry {
    name: String,
    remote: Remote,
    mtime: SystemTime,
}

struct Found {
    at: Instant,
    entries: Arc<Vec<Entry>>,
}

/// The answers kept, by folder and query.
type Answers = HashMap<(Ino, String), Found>;

/// `.search`: its folders are the queries (by the query), their entries the files found (by
/// the file's ID, which never changes).
#[derive(Default)]
pub(super) struct Searches {
    found: Mutex<Answers>,
}

/// The entries' names of the files at `paths` (found under `dir`, in order): each file's name,
/// or where another file found has it too, its path under `dir` with `/` as [`SLASH`] (a file
/// directly in `dir` keeps its name). Unique: a name still taken gets ` (2)`, ` (3)`...
fn entry_names(dir: &NodePath, paths: &[NodePath]) -> Vec<String> {
    let rel =
        |p: &NodePath| -> Vec<String> { p.iter().skip(dir.depth()).map(str::to_string).collect() };
    let mut count: HashMap<&str, usize> = HashMap::new();
    for p in paths {
        *count.entry(p.name().unwrap_or_default()).or_default() += 1;
    }
    let mut taken = std::collections::HashSet::new();
    paths
        .iter()
        .map(|p| {
            let name = p.name().unwrap_or_default();
            let base = if count[name] > 1 {
                within_a_name(&rel(p).join(&SLASH.to_string()))
            } else {
                name.to_string()
            };
            let mut n = 1;
            let mut entry = base.clone();
            while !taken.insert(entry.clone()) {
                n += 1;
                entry = crate::api::path::tagged_name(&base, &n.to_string(), 1);
            }
            entry
        })
        .collect()
}

/// A path written as one name, within a name's 255 bytes (issue 47, item 9): one too long
/// keeps its end (the file's own name, the extension last) after `…`.
fn within_a_name(joined: &str) -> String {
    if joined.len() <= MAX_NAME_BYTES {
        return joined.to_string();
    }
    let mut start = joined.len() - (MAX_NAME_BYTES - '…'.len_utf8());
    while !joined.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &joined[start..])
}

impl<B: Backend> VirtualDir<B> for Searches {
    fn name(&self) -> &'static str {
        virtual_names::SEARCH
    }

    fn bit(&self) -> Ino {
        virtual_names::SEARCH_BIT
    }

    fn leaf_key<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        query: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, OpResult<String>> {
        async move {
            let entries = fs.found(folder, query, false).await?;
            let e = entries.iter().find(|e| e.name == name);
            Ok(e.ok_or(Errno::ENOENT)?.remote.id.clone())
        }
        .boxed()
    }

    /// A query's folder: asked here, so a query the backend refuses fails at its lookup.
    fn dir_time<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        query: &'a str,
    ) -> BoxFuture<'a, OpResult<SystemTime>> {
        async move {
            fs.found(folder, query, false).await?;
            fs.folder_time(folder).ok_or(Errno::ENOENT.into())
        }
        .boxed()
    }

    fn leaf_attr<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        query: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, OpResult<(u64, SystemTime)>> {
        async move {
            let e = fs.found_entry(folder, query, id, false).await?;
            Ok((e.remote.size, e.mtime))
        }
        .boxed()
    }

    /// None: the queries asked are not kept.
    fn list<'a>(
        &'a self,
        _fs: &'a Arc<Fs<B>>,
        _folder: Ino,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        futures_util::future::ready(Ok(Vec::new())).boxed()
    }

    /// The files found, best first.
    fn list_dir<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        query: &'a str,
    ) -> BoxFuture<'a, OpResult<Vec<(String, String)>>> {
        async move {
            let entries = fs.found(folder, query, false).await?;
            let entries = entries.iter();
            Ok(entries
                .map(|e| (e.remote.id.clone(), e.name.clone()))
                .collect())
        }
        .boxed()
    }

    /// The file's current version as last found, through the read cache (the file's own entry
    /// there, by its ID and md5).
    fn read<'a>(
        &'a self,
        fs: &'a Arc<Fs<B>>,
        folder: Ino,
        query: &'a str,
        id: &'a str,
        offset: u64,
        size: u32,
    ) -> BoxFuture<'a, OpResult<Vec<u8>>> {
        async move {
            let r = fs.found_entry(folder, query, id, true).await?.remote;
            let entry = (fs.reads.cache).entry(&r.id, r.md5.as_deref(), r.size)?;
            (fs.reads.cache)
                .read(&fs.backend, &entry, offset, size as usize)
                .await
                .map_err(FsError::from)
        }
        .boxed()
    }
}

impl<B: Backend> Fs<B> {
    fn searches(&self) -> MutexGuard<'_, Answers> {
        relock(&self.virtual_dirs.searches.found)
    }

    /// The files found under `folder` for `query` (asked again after [`RESULTS_TTL`]; `stale`:
    /// any answer kept will do, for reading an entry already found).
    async fn found(
        self: &Arc<Self>,
        folder: Ino,
        query: &str,
        stale: bool,
    ) -> OpResult<Arc<Vec<Entry>>> {
        let key = (folder, query.to_string());
        if let Some(f) = self.searches().get(&key) {
            if stale || f.at.elapsed() < RESULTS_TTL {
                return Ok(f.entries.clone());
            }
        }
        let dir = match self.nodes.inode(folder, |i| (i.kind, i.path.clone())) {
            Some((InodeKind::Dir, path)) => path,
            Some(_) => return Err(Errno::ENOTDIR.into()),
            None => return Err(Errno::ENOENT.into()),
        };
        let asked = Instant::now();
        let results = self
            .backend
            .search(&dir, query, crate::api::search::DEFAULT_LIMIT)
            .await?;
        // Each hit's stored version, in order; a hit moved or changed into something else
        // since is left out.
        let backend = self.backend.clone();
        let hits: Vec<(NodePath, Remote, SystemTime)> = futures_util::stream::iter(results.hits)
            .map(|h: SearchHit| {
                let backend = backend.clone();
                async move {
                    let path = NodePath::parse_uri(&h.uri).ok()?;
                    let node = backend.node(&path).await.ok()?;
                    if !node.is_file() || node.file_id().as_deref() != Some(h.id.as_str()) {
                        return None;
                    }
                    let remote = Remote {
                        id: h.id,
                        size: node.size.unwrap_or(0),
                        md5: node.md5_checksum.clone(),
                    };
                    let mtime = node.modified_time().unwrap_or(SystemTime::UNIX_EPOCH);
                    Some((path, remote, mtime))
                }
            })
            .buffered(NODE_CONCURRENCY)
            .filter_map(|h| async move { h })
            .collect()
            .await;
        let paths: Vec<NodePath> = hits.iter().map(|h| h.0.clone()).collect();
        let entries: Arc<Vec<Entry>> = Arc::new(
            entry_names(&dir, &paths)
                .into_iter()
                .zip(hits)
                .map(|(name, (_, remote, mtime))| Entry {
                    name,
                    remote,
                    mtime,
                })
                .collect(),
        );
        let mut found = self.searches();
        found.retain(|_, f| f.at.elapsed() < RESULTS_TTL);
        found.insert(
            key,
            Found {
                at: asked,
                entries: entries.clone(),
            },
        );
        Ok(entries)
    }

    /// The entry of file `id` among those found (`stale`: as for [`Self::found`]).
    async fn found_entry(
        self: &Arc<Self>,
        folder: Ino,
        query: &str,
        id: &str,
        stale: bool,
    ) -> OpResult<Entry> {
        let entries = self.found(folder, query, stale).await?;
        let e = entries.iter().find(|e| e.remote.id == id);
        e.cloned().ok_or(Errno::ENOENT.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> NodePath {
        NodePath::parse_uri(s).unwrap()
    }

    #[test]
    fn entries_are_named_as_their_files_and_by_their_paths_where_names_clash() {
        let dir = p("/nodes/pth/A/V");
        let paths = [
            p("/nodes/pth/A/V/2024/Q1/report.txt"),
            p("/nodes/pth/A/V/notes.md"),
            p("/nodes/pth/A/V/report.txt"),
            p("/nodes/pth/A/V/old/report.txt"),
            p("/nodes/pth/A/V/x/notes.txt"),
        ];
        assert_eq!(
            entry_names(&dir, &paths),
            [
                "2024／Q1／report.txt",
                "notes.md",
                "report.txt",
                "old／report.txt",
                "notes.txt"
            ]
        );
        // A file whose name is another's path under the folder: still unique.
        let paths = [
            p("/nodes/pth/A/V/a/b.txt"),
            p("/nodes/pth/A/V/b.txt"),
            p("/nodes/pth/A/V/a／b.txt"),
        ];
        assert_eq!(
            entry_names(&dir, &paths),
            ["a／b.txt", "b.txt", "a／b (2).txt"]
        );
    }

    /// Issue 47, item 9: files sharing a name deep in folders with long names: each entry is
    /// a name `ls` can open (within 255 bytes), ending in the file's own name.
    #[test]
    fn entries_of_deep_paths_fit_a_name() {
        let dir = p("/nodes/pth/A/V");
        let deep = ["d".repeat(200), "e".repeat(200), "report.pdf".into()].join("/");
        let paths = [
            p(&format!("/nodes/pth/A/V/{deep}")),
            p(&format!("/nodes/pth/A/V/{}/report.pdf", "f".repeat(250))),
            p("/nodes/pth/A/V/report.pdf"),
        ];
        let names = entry_names(&dir, &paths);
        for n in &names {
            assert!(n.len() <= MAX_NAME_BYTES, "{n}");
            assert!(n.ends_with("report.pdf"), "{n}");
            crate::api::path::validate_name(n).unwrap();
        }
        assert!(names[0].starts_with('…'), "{}", names[0]);
        assert_eq!(names[2], "report.pdf");
        assert_eq!(
            names.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
    }
}
