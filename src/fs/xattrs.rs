//! The `user.vaultfs.*` extended attributes: the file's IDs and links (read-only, from the
//! store), the conflict a conflict copy stands for, pinning (the one that can be set), and the
//! WebDAV locks that hold a file (asked of the backend at each read: locks come and go
//! without any change to the file).

use fuser::Errno;

use super::pinned::XATTR as PIN_XATTR;
use super::table::Ino;
use super::virtual_dirs::is_virtual;
use super::{Fs, OpResult};
use crate::api::Lock;
use crate::backend::Backend;

/// On a conflict copy: the file it conflicts with and that file's version (`fs::conflict`).
const CONFLICT_XATTR: &str = "user.vaultfs.conflict";

/// The WebDAV locks that hold a file or folder, one line each (`lock_text`); not listed (a
/// round trip for each `listxattr`, and no copy should carry it), read by name.
pub(super) const LOCK_XATTR: &str = "user.vaultfs.lock";

/// The web links of a stored file, asked of the backend when read (`link_xattr`); read by
/// name, never listed, as the lock: `cp -a` and `getfattr -d` would ask the backend three times
/// a file, and a copy elsewhere has no use for the links of this one.
pub(super) const LINK_XATTRS: [&str; 3] = [
    "user.vaultfs.link_uri",
    "user.vaultfs.preview_link_uri",
    "user.vaultfs.download_link_uri",
];

/// Listed on a stored file.
const XATTRS: [&str; 1] = ["user.vaultfs.id"];

impl<B: Backend> Fs<B> {
    /// GETXATTR: only `user.vaultfs.*` exists. Other namespaces (security.selinux, the POSIX
    /// ACLs) are "not supported" rather than "not set": `ls -l` and other tools then stop
    /// asking this file system for them, instead of two round trips per file listed.
    pub(super) fn getxattr(&self, ino: Ino, name: &std::ffi::OsStr) -> OpResult<Vec<u8>> {
        if !name.as_encoded_bytes().starts_with(b"user.") {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if name.to_str() == Some(PIN_XATTR) {
            let (path, _) = self.path_of(ino)?;
            return match self.reads.pinned.state_of(&path) {
                Some(true) => Ok(b"1".to_vec()),
                Some(false) => Ok(b"folder".to_vec()),
                None => Err(Errno::NO_XATTR.into()),
            };
        }
        let (path, r) = (self.nodes)
            .inode(ino, |i| (i.path.clone(), i.remote.clone()))
            .ok_or(Errno::ENOENT)?;
        if name.to_str() == Some(CONFLICT_XATTR) {
            return (self.conflicts.of_copy(&path))
                .map(String::into_bytes)
                .ok_or(Errno::NO_XATTR.into());
        }
        match (name.to_str(), r) {
            (Some("user.vaultfs.id"), Some(r)) => Ok(r.id.into_bytes()),
            _ => Err(Errno::NO_XATTR.into()),
        }
    }

    /// GETXATTR of one of [`LINK_XATTRS`]: the link the backend gives the stored file now
    /// (read when asked: a mount keeps no three URLs for every file it lists).
    pub(super) async fn link_xattr(&self, ino: Ino, name: &str) -> OpResult<Vec<u8>> {
        let (path, id) = (self.nodes)
            .inode(ino, |i| {
                (i.path.clone(), i.remote.as_ref().map(|r| r.id.clone()))
            })
            .ok_or(Errno::ENOENT)?;
        let Some(id) = id else {
            return Err(Errno::NO_XATTR.into());
        };
        let node = self.backend.node(&path).await?;
        // Another file at the name since: not this one's link.
        if node.file_id().as_deref() != Some(id.as_str()) {
            return Err(Errno::NO_XATTR.into());
        }
        let link = match name {
            "user.vaultfs.link_uri" => node.link_uri,
            "user.vaultfs.preview_link_uri" => node.preview_link_uri,
            _ => node.download_link_uri,
        };
        link.map(String::into_bytes).ok_or(Errno::NO_XATTR.into())
    }

    /// LISTXATTR: the names, each ended by a NUL (the ID of a stored file; the conflict
    /// attribute on conflict copies; the pin attribute on what is pinned).
    pub(super) fn listxattr(&self, ino: Ino) -> Vec<u8> {
        let (has, path) = (self.nodes)
            .inode(ino, |i| (i.remote.is_some(), Some(i.path.clone())))
            .unwrap_or_default();
        let mut buf = Vec::new();
        let conflict = path
            .as_ref()
            .is_some_and(|p| self.conflicts.of_copy(p).is_some());
        let pinned = path.is_some_and(|p| self.reads.pinned.state_of(&p).is_some());
        let names = XATTRS.iter().filter(|_| has);
        let names = names.chain(conflict.then_some(&CONFLICT_XATTR));
        for n in names.chain(pinned.then_some(&PIN_XATTR)) {
            buf.extend_from_slice(n.as_bytes());
            buf.push(0);
        }
        buf
    }

    /// SETXATTR (`value` given), REMOVEXATTR: only the pin attribute changes (`1` pins, `0`
    /// or its removal unpins: `pinned`); the others are the backend's, read-only.
    pub(super) fn change_xattr(
        &self,
        ino: Ino,
        name: &std::ffi::OsStr,
        value: Option<&[u8]>,
    ) -> OpResult<()> {
        if name.to_str() != Some(PIN_XATTR) {
            return Err(Errno::ENOTSUP.into());
        }
        match value.map(|v| v.trim_ascii()) {
            Some(b"1") => self.pin(ino, true),
            Some(b"0") | None => self.pin(ino, false),
            Some(_) => Err(Errno::EINVAL.into()),
        }
    }

    /// GETXATTR of [`LOCK_XATTR`]: the locks the backend says hold the node now; "not set"
    /// when none does (or the backend keeps none).
    pub(super) async fn lock_xattr(&self, ino: Ino) -> OpResult<Vec<u8>> {
        if is_virtual(ino) {
            return Err(Errno::NO_XATTR.into());
        }
        let (path, _) = self.path_of(ino)?;
        let locks = match self.backend.locks(&path).await {
            Err(e) if e.kind == crate::api::ErrorKind::NotFound => Vec::new(),
            other => other?,
        };
        if locks.is_empty() {
            return Err(Errno::NO_XATTR.into());
        }
        Ok(locks.iter().map(lock_text).collect::<String>().into_bytes())
    }
}

/// One lock as a line: `exclusive lock by anna@example.com (Anna's Mac) on
/// /nodes/pth/Acme/Vault/report.docx until 2026-12-07T12:00:00Z` (the path a folder's above,
/// for a lock of its whole tree).
fn lock_text(l: &Lock) -> String {
    let mut s = format!(
        "{} lock by {}",
        if l.shared { "shared" } else { "exclusive" },
        l.by.as_deref().unwrap_or("someone")
    );
    if let Some(o) = l.owner.as_deref().filter(|o| Some(*o) != l.by.as_deref()) {
        s.push_str(&format!(" ({o})"));
    }
    s.push_str(&format!(" on {}", l.on));
    match &l.expires_on {
        Some(t) => s.push_str(&format!(" until {t}")),
        None => s.push_str(" until it is let go of"),
    }
    // One line a lock, whatever a client (or a server) put in its texts.
    let mut line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    line.push('\n');
    line
}
