//! Attributes of files whose backend does not keep them (the public service refuses them
//! alone and answers a version with its own time), kept in the cache dir by file ID and
//! content: they hold until the file's content changes. The table holds them; `attrs` decides
//! what to keep.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::api::FileAttrs;
use crate::api::kept_mode;
use crate::api::time::{ns_to_time, time_to_ns};

/// What the cache dir keeps of one file.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    /// The content they were set on.
    pub md5: Option<String>,
    pub mtime: Option<SystemTime>,
    /// As kept (`api::kept_mode`: all the permission bits, or from before, the execute bits).
    pub mode: Option<u32>,
}

/// Attributes of files whose backend does not keep them, in `attrs/` of the cache dir: one
/// file per file ID (named by the ID in hex), `md5 mtime_ns mode` (`-` for none). All read at
/// mount; written as they change (a small file renamed into place).
#[derive(Default)]
pub struct KeptHere {
    dir: Option<PathBuf>,
    files: HashMap<String, Kept>,
}

impl KeptHere {
    /// All that `dir` (made by the caller, private) keeps.
    pub fn load(dir: &Path) -> io::Result<KeptHere> {
        let mut files = HashMap::new();
        for e in std::fs::read_dir(dir)?.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(unhex) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let f: Vec<&str> = text.split_whitespace().collect();
            if let [md5, mtime, mode] = f[..] {
                let some = |s: &str| (s != "-").then(|| s.to_string());
                files.insert(
                    id,
                    Kept {
                        md5: some(md5),
                        mtime: some(mtime).and_then(|t| t.parse().ok()).map(ns_to_time),
                        mode: some(mode).and_then(|x| x.parse().ok()),
                    },
                );
            }
        }
        Ok(KeptHere {
            dir: Some(dir.to_path_buf()),
            files,
        })
    }

    /// What is kept for file `id` with content `md5`.
    pub fn get(&self, id: &str, md5: Option<&str>) -> Option<&Kept> {
        self.files.get(id).filter(|k| k.md5.as_deref() == md5)
    }

    pub(crate) fn remember(&mut self, id: &str, md5: Option<String>, attrs: FileAttrs) {
        let old = self.files.get(id).filter(|k| k.md5 == md5);
        let kept = Kept {
            mtime: attrs.modified.or(old.and_then(|k| k.mtime)),
            mode: attrs.mode.map(kept_mode).or(old.and_then(|k| k.mode)),
            md5,
        };
        if let Err(e) = self.write(id, Some(&kept)) {
            log::warn!("could not keep the times of file {id} in the cache dir: {e}");
        }
        self.files.insert(id.to_string(), kept);
    }

    pub(crate) fn forget(&mut self, id: &str) {
        if self.files.remove(id).is_some() {
            if let Err(e) = self.write(id, None) {
                log::warn!("could not forget the times of file {id} in the cache dir: {e}");
            }
        }
    }

    fn write(&self, id: &str, kept: Option<&Kept>) -> io::Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join(hex(id));
        let Some(k) = kept else {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        };
        let text = format!(
            "{} {} {}\n",
            k.md5.as_deref().unwrap_or("-"),
            k.mtime.map_or("-".into(), |t| time_to_ns(t).to_string()),
            k.mode.map_or("-".into(), |x| x.to_string()),
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    }
}

fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(name: &str) -> Option<String> {
    if name.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..name.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(name.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_here_survives_a_reload_and_holds_for_its_content_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("attrs");
        std::fs::create_dir(&dir).unwrap();
        let t = std::time::UNIX_EPOCH - std::time::Duration::new(100, 5);
        let mut k = KeptHere::load(&dir).unwrap();
        let attrs = FileAttrs {
            modified: Some(t),
            mode: Some(crate::api::whole_mode(0o444)),
        };
        k.remember("id/1 é", Some("abc".into()), attrs);
        k.remember("2", None, attrs);
        let k = KeptHere::load(&dir).unwrap();
        let want = Kept {
            md5: Some("abc".into()),
            mtime: Some(t),
            mode: Some(0o100444),
        };
        assert_eq!(k.get("id/1 é", Some("abc")), Some(&want));
        assert_eq!(k.get("id/1 é", Some("def")), None);
        let mut k = k;
        k.forget("2");
        assert!(KeptHere::load(&dir).unwrap().get("2", None).is_none());
    }
}
