//! The names, inode numbers and attributes of the mount's virtual nodes: the virtual folders of
//! every folder (`virtual_dirs`: `.preview`, `.versions`, `.search`, `.sh_thumbnails`) and the
//! marker files of the root (`markers`).
//!
//! At the bottom of the mount's modules, importing none of them: the modules below the virtual
//! folders (the offline snapshot, the pins, the markers) and the request logic tell a virtual
//! inode or name by these alone, so no import runs from them up to the folders, which sit above
//! the inode table and the read cache (issue 48).

use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};

/// An inode number, as the inode table's `Ino` (spelled here so this module imports nothing).
type Ino = u64;

/// The virtual folders' names, one in every folder.
pub const PREVIEW: &str = ".preview";
pub const VERSIONS: &str = ".versions";
pub const SEARCH: &str = ".search";
pub const SHARED_THUMBS: &str = ".sh_thumbnails";

/// Set in every virtual inode number: the table's numbers count up from 1 and never get there.
pub const FLAG: Ino = 1 << 62;
/// Beside [`FLAG`], the bit of each kind of virtual node (the `.preview` trees' have none):
/// each kind counts its own numbers from 1, and none counts as far as bit 58.
pub const VERSIONS_BIT: Ino = 1 << 61;
pub const SEARCH_BIT: Ino = 1 << 60;
pub const MARKERS_BIT: Ino = 1 << 59;
pub const SHARED_THUMBS_BIT: Ino = 1 << 58;

/// Whether `ino` is a virtual node's (a virtual folder's or a marker file's).
pub fn is_virtual(ino: Ino) -> bool {
    ino & FLAG != 0
}

/// Whether `name` is a virtual folder's: in any folder, the name is the virtual folder's and
/// never a real node's (a real one stored under it is hidden; none can be made: EROFS).
pub fn is_virtual_name(name: &str) -> bool {
    [PREVIEW, VERSIONS, SEARCH, SHARED_THUMBS].contains(&name)
}

/// The attributes of a virtual node: read-only, owned by `uid`/`gid` (the mounting user).
pub fn attr(ino: Ino, dir: bool, size: u64, time: SystemTime, uid: u32, gid: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o555 } else { 0o444 },
        nlink: if dir { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 128 * 1024,
        flags: 0,
    }
}
