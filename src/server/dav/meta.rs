//! A node as dav-server sees it: its metadata (`Meta`, with the ETag) and its entry in a
//! listing.

use std::time::{SystemTime, UNIX_EPOCH};

use dav_server::fs::{DavDirEntry, DavMetaData, FsError, FsFuture, FsResult};

use crate::api::Node;

/// A node's metadata as dav-server asks for it.
#[derive(Debug, Clone)]
pub struct Meta {
    dir: bool,
    pub(super) len: u64,
    modified: SystemTime,
    created: Option<SystemTime>,
    /// A file's current version (its md5): the ETag.
    pub(super) md5: Option<String>,
    exec: bool,
}

impl Meta {
    /// A file being written, not stored yet: `len` bytes so far, no version.
    pub(super) fn unstored(len: u64) -> Meta {
        Meta {
            dir: false,
            len,
            modified: SystemTime::now(),
            created: None,
            md5: None,
            exec: false,
        }
    }

    /// `node`'s metadata as the store gives it.
    pub(super) fn of(node: &Node) -> Meta {
        let time = |t: &Option<String>| t.as_deref().and_then(crate::api::parse_time);
        Meta {
            dir: !node.is_file(),
            len: node.size.unwrap_or(0),
            modified: time(&node.modified_on).unwrap_or(UNIX_EPOCH),
            created: time(&node.created_on),
            md5: node.is_file().then(|| {
                node.md5_checksum
                    .clone()
                    .unwrap_or_else(|| crate::api::checksum::EMPTY_MD5.to_string())
            }),
            exec: node.mode.is_some_and(|m| m & 0o111 != 0),
        }
    }
}

impl DavMetaData for Meta {
    fn len(&self) -> u64 {
        self.len
    }
    fn modified(&self) -> FsResult<SystemTime> {
        Ok(self.modified)
    }
    fn is_dir(&self) -> bool {
        self.dir
    }
    fn created(&self) -> FsResult<SystemTime> {
        self.created.ok_or(FsError::NotImplemented)
    }
    fn executable(&self) -> FsResult<bool> {
        if self.dir {
            return Err(FsError::NotImplemented);
        }
        Ok(self.exec)
    }
    /// A file's ETag is its version (the md5 of its bytes, what the store's conflict check
    /// compares: docs/design.md §5); a folder's, its time.
    fn etag(&self) -> Option<String> {
        if let Some(md5) = &self.md5 {
            return Some(md5.clone());
        }
        let t = self.modified.duration_since(UNIX_EPOCH).ok()?;
        Some(format!("{:x}", t.as_micros()))
    }
}

struct Entry {
    name: String,
    meta: Meta,
}

impl DavDirEntry for Entry {
    fn name(&self) -> Vec<u8> {
        self.name.as_bytes().to_vec()
    }
    fn metadata(&self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        Box::pin(std::future::ready(Ok(m)))
    }
    fn is_dir(&self) -> FsFuture<'_, bool> {
        Box::pin(std::future::ready(Ok(self.meta.dir)))
    }
}

pub(super) fn entries(children: Vec<Node>) -> Vec<FsResult<Box<dyn DavDirEntry>>> {
    children
        .into_iter()
        .map(|child| {
            let e: Box<dyn DavDirEntry> = Box::new(Entry {
                meta: Meta::of(&child),
                name: child.name,
            });
            Ok(e)
        })
        .collect()
}
