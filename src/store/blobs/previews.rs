//! The previews of the blobs, kept where the blobs are (see the module above): where a preview
//! is rendered, placed, read and removed.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{BlobFile, Blobs};

/// Temporary keys of previews on their way into a bucket left this long are a dead server's.
const PREVIEW_TMP_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A rendered preview on its way to its name ([`Blobs::place_preview`]): its folder under
/// `previews/tmp/` and, with a bucket, the copies of its files under temporary keys. Dropped,
/// whatever is left of it is removed.
pub struct StagedPreview {
    dir: PathBuf,
    /// With a bucket: the temporary prefix (`PREFIX/previews/tmp/<name>/`) and the names put
    /// under it.
    uploaded: Option<(Arc<crate::store::bucket::Bucket>, String, Vec<String>)>,
}

impl StagedPreview {
    /// The local folder the preview is rendered into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for StagedPreview {
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        if let Some((bucket, tmp, names)) = self.uploaded.take() {
            for name in names {
                if let Err(e) = bucket.remove_key(&format!("{tmp}{name}")) {
                    log::debug!("could not remove {tmp}{name}: {e}");
                }
            }
        }
    }
}

/// The folder of every kind of the previews of `hash` under `root`.
fn preview_blob_dir(root: &Path, hash: &str) -> PathBuf {
    root.join(&hash[..2]).join(hash)
}

fn remove_preview_dir(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            log::warn!("could not remove the preview {}: {e}", dir.display());
        }
    }
}

/// The sizes of the files of a folder (none when it is missing).
fn file_sizes(dir: &Path) -> io::Result<Vec<u64>> {
    match fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The previews of the blobs: where a preview is rendered, placed, read and removed.
impl Blobs {
    /// `previews/<hash[0..2]>/<hash>/<kind>/` in the data directory: a preview in a folder.
    fn preview_dir(&self, hash: &str, kind: &str) -> PathBuf {
        preview_blob_dir(&self.previews, hash).join(kind)
    }

    /// The local folder of previews (`<data dir>/previews`; with a bucket only its `tmp/` is
    /// used, and what stores of before the bucket left).
    pub fn local_previews(&self) -> &Path {
        &self.previews
    }

    /// `PREFIX/previews/<hash>/<kind>/`, or every kind's `PREFIX/previews/<hash>/`.
    fn preview_prefix(
        bucket: &crate::store::bucket::Bucket,
        hash: &str,
        kind: Option<&str>,
    ) -> String {
        match kind {
            Some(k) => bucket.prefixed(&format!("previews/{hash}/{k}/")),
            None => bucket.prefixed(&format!("previews/{hash}/")),
        }
    }

    /// A new, empty folder under `previews/tmp/` to render a preview of `hash` into.
    pub fn preview_staging(&self, hash: &str) -> io::Result<StagedPreview> {
        let dir = self
            .previews
            .join("tmp")
            .join(format!("{hash}-{:016x}", rand::random::<u64>()));
        fs::create_dir_all(&dir)?;
        Ok(StagedPreview {
            dir,
            uploaded: None,
        })
    }

    /// With a bucket: puts the files of a rendered preview under temporary keys, before the
    /// caller decides (under the store's lock) whether it is placed. A folder has nothing to do
    /// ahead: its rename is cheap.
    pub fn upload_preview(&self, staged: &mut StagedPreview) -> io::Result<()> {
        let Some(bucket) = &self.bucket else {
            return Ok(());
        };
        let name = staged
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("preview")
            .to_string();
        let tmp = bucket.prefixed(&format!("previews/tmp/{name}/"));
        let mut entries: Vec<_> = fs::read_dir(&staged.dir)?.collect::<io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        // Recorded as they go, so that a failure midway removes what was put.
        let (_, _, names) = staged
            .uploaded
            .insert((bucket.clone(), tmp.clone(), Vec::new()));
        for entry in entries {
            let Some(file_name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let file = File::open(entry.path())?;
            let len = file.metadata()?.len();
            bucket.put_key(&format!("{tmp}{file_name}"), &Arc::new(file), len)?;
            names.push(file_name);
        }
        Ok(())
    }

    /// Gives a staged preview its name (durably), replacing whatever was there: the folder
    /// renamed into place, or the temporary objects copied under the preview's keys. Called
    /// under the store's lock, once the caller knows this render is the one recorded. On
    /// failure nothing of it is left under its name.
    pub fn place_preview(
        &self,
        staged: &mut StagedPreview,
        hash: &str,
        kind: &str,
    ) -> io::Result<()> {
        match &self.bucket {
            None => {
                let dest = self.preview_dir(hash, kind);
                let _ = fs::remove_dir_all(&dest);
                let parent = dest.parent().expect("preview dir has a parent");
                fs::create_dir_all(parent)?;
                fs::rename(&staged.dir, &dest)?;
                staged.dir = PathBuf::new();
                File::open(parent)?.sync_all()
            }
            Some(bucket) => {
                let Some((_, tmp, names)) = &staged.uploaded else {
                    return Err(io::Error::other("the preview was not uploaded"));
                };
                self.remove_preview(hash, Some(kind));
                let dest = Self::preview_prefix(bucket, hash, Some(kind));
                let copied = names
                    .iter()
                    .try_for_each(|n| bucket.copy_key(&format!("{tmp}{n}"), &format!("{dest}{n}")));
                if copied.is_err() {
                    self.remove_preview(hash, Some(kind));
                }
                copied
            }
        }
    }

    /// The whole file `name` of a preview (`NotFound` when it is not there).
    pub fn read_preview(&self, hash: &str, kind: &str, name: &str) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.open_preview(hash, kind, name)?.read_to_end(&mut out)?;
        Ok(out)
    }

    /// The file `name` of a preview, opened (`NotFound` when it is not there).
    pub fn open_preview(&self, hash: &str, kind: &str, name: &str) -> io::Result<BlobFile> {
        match &self.bucket {
            None => BlobFile::from_file(File::open(self.preview_dir(hash, kind).join(name))?),
            Some(b) => {
                let key = format!("{}{name}", Self::preview_prefix(b, hash, Some(kind)));
                let len = b
                    .size_key(&key)?
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, key.clone()))?;
                Ok(BlobFile {
                    inner: Box::new(crate::store::bucket::ObjectReader::at_key(
                        b.clone(),
                        key,
                        len,
                    )),
                    len,
                })
            }
        }
    }

    /// The sizes of the files of a preview (none when it is not there).
    pub fn preview_sizes(&self, hash: &str, kind: &str) -> io::Result<Vec<u64>> {
        match &self.bucket {
            None => file_sizes(&self.preview_dir(hash, kind)),
            Some(b) => Ok(b
                .list_objects(&Self::preview_prefix(b, hash, Some(kind)))?
                .into_iter()
                .map(|o| o.size)
                .collect()),
        }
    }

    /// Removes the preview of `hash` of one kind, or of every kind (`None`: the bytes are gone).
    pub fn remove_preview(&self, hash: &str, kind: Option<&str>) {
        match (&self.bucket, kind) {
            (None, None) => remove_preview_dir(&preview_blob_dir(&self.previews, hash)),
            (None, Some(k)) => {
                let dir = self.preview_dir(hash, k);
                remove_preview_dir(&dir);
                // The blob's folder goes with its last kind.
                if let Some(parent) = dir.parent() {
                    let _ = fs::remove_dir(parent);
                }
            }
            (Some(b), kind) => {
                let removed = b
                    .list_objects(&Self::preview_prefix(b, hash, kind))
                    .and_then(|objects| objects.iter().try_for_each(|o| b.remove_key(&o.key)));
                if let Err(e) = removed {
                    log::warn!("could not remove the preview of {hash}: {e}");
                }
            }
        }
    }

    /// After a crash: empties `previews/tmp/`, removes a bucket's temporary preview objects
    /// (only those older than an hour when `shared`: other servers may be placing theirs),
    /// and every preview whose `(hash, kind)` `keep` refuses (no ready row accounts for it), or
    /// that is not named as a preview is. With a bucket, the previews a store of before the
    /// bucket kept on local disk go too. The number of previews removed.
    pub fn sweep_previews(
        &self,
        shared: bool,
        mut keep: impl FnMut(&str, &str) -> crate::api::Result<bool>,
    ) -> crate::api::Result<usize> {
        for entry in fs::read_dir(self.previews.join("tmp"))? {
            let _ = fs::remove_dir_all(entry?.path());
        }
        let mut removed = 0;
        let Some(bucket) = &self.bucket else {
            for prefix in fs::read_dir(&self.previews)? {
                let prefix = prefix?;
                if prefix.file_name() == "tmp" || !prefix.file_type()?.is_dir() {
                    continue;
                }
                for entry in fs::read_dir(prefix.path())? {
                    let entry = entry?;
                    let hash = entry.file_name();
                    let Some(hash) = hash.to_str().filter(|_| entry.path().is_dir()) else {
                        remove_preview_dir(&entry.path());
                        removed += 1;
                        continue;
                    };
                    for kind in fs::read_dir(entry.path())? {
                        let kind = kind?;
                        let known = match kind.file_name().to_str() {
                            Some(k) => keep(hash, k)?,
                            None => false,
                        };
                        if !known {
                            remove_preview_dir(&kind.path());
                            removed += 1;
                        }
                    }
                    // Gone when no kind is left.
                    let _ = fs::remove_dir(entry.path());
                }
            }
            return Ok(removed);
        };
        let mut local = 0;
        for entry in fs::read_dir(&self.previews)? {
            let entry = entry?;
            if entry.file_name() != "tmp" {
                remove_preview_dir(&entry.path());
                local += 1;
            }
        }
        if local > 0 {
            log::info!("removed the previews kept on local disk before they moved to the bucket");
        }
        let root = bucket.prefixed("previews/");
        let tmp = format!("{root}tmp/");
        let cutoff = std::time::SystemTime::now() - PREVIEW_TMP_TTL;
        let mut verdicts: HashMap<(String, String), bool> = HashMap::new();
        for object in bucket.list_objects(&root)? {
            let rest = &object.key[root.len()..];
            let drop = if object.key.starts_with(&tmp) {
                !shared || object.modified.is_none_or(|t| t < cutoff)
            } else {
                let mut parts = rest.splitn(3, '/');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(hash), Some(kind), Some(_)) => {
                        let verdict = match verdicts.get(&(hash.to_string(), kind.to_string())) {
                            Some(v) => *v,
                            None => {
                                let v = keep(hash, kind)?;
                                if !v {
                                    removed += 1;
                                }
                                verdicts.insert((hash.to_string(), kind.to_string()), v);
                                v
                            }
                        };
                        !verdict
                    }
                    _ => true,
                }
            };
            if drop {
                bucket.remove_key(&object.key)?;
            }
        }
        Ok(removed)
    }
}
