//! The fuser adapter: each kernel request's arguments converted (names, inode numbers, flags),
//! the logic of `listing`, `namespace` and `io` called, and its typed result turned into the
//! reply. Calls that may need the backend run as tokio tasks that reply when done; the rest
//! are answered on the FUSE thread.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use super::namespace::SetattrNow;
use super::{Fs, OpResult};
use crate::api::path::{MAX_NAME_BYTES, validate_name};
use crate::backend::Backend;

/// The `Filesystem` the session runs: a handle on the shared state.
pub struct FuseAdapter<B: Backend>(pub Arc<Fs<B>>);

/// A name from the kernel as the backend takes it.
fn name_of(name: &OsStr) -> OpResult<String> {
    let s = name.to_str().ok_or(Errno::EINVAL)?;
    if s.len() > MAX_NAME_BYTES {
        return Err(Errno::ENAMETOOLONG.into());
    }
    validate_name(s).map_err(|_| Errno::EINVAL)?;
    Ok(s.to_string())
}

/// Runs `f` on the runtime and hands its result to `reply`.
fn spawn<B, T, F, R>(fs: &Arc<Fs<B>>, f: F, reply: R)
where
    B: Backend,
    T: Send + 'static,
    F: std::future::Future<Output = OpResult<T>> + Send + 'static,
    R: FnOnce(OpResult<T>) + Send + 'static,
{
    fs.rt.spawn(async move { reply(f.await) });
}

fn empty(op: &str, reply: ReplyEmpty, r: OpResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.reply(op)),
    }
}

/// An extended attribute's value (or the list of names) as the kernel asked: its size when
/// `size` is 0, ERANGE when it does not fit.
fn xattr(op: &str, reply: ReplyXattr, size: u32, r: OpResult<Vec<u8>>) {
    match r {
        Err(e) => reply.error(e.reply(op)),
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
    }
}

impl<B: Backend> Filesystem for FuseAdapter<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        // The kernel offers at most 128 KiB here: take what it offers (more is set through
        // sysfs once mounted, see `read_ahead`).
        if let Err(most) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(most);
        }
        let _ = config.set_max_background(64);
        // O_TRUNC comes with the open, not as a SETATTR after it: the file is staged empty
        // (not copied first and cut after), and the kernel can write it itself from the start.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // Killing setuid/setgid bits and file capabilities on a write or chown is the file
        // system's: there is none to kill here (modes keep the nine permission bits alone, and no
        // `security.*` xattr exists). Else the kernel asks for `security.capability` (a
        // GETXATTR) before each chown and each file's first write: two of a `tar x`'s eleven
        // requests per file.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        let fs = &self.0;
        if fs.opts.passthrough {
            fs.reads.passthrough.set(passthrough(config));
        }
        log::info!("reads: {}", fs.reads.passthrough.describe());
        log::info!("writes: {}", fs.describe_writes());
        // READDIRPLUS: a listing carries each entry's attributes, so `ls -l`, `find` and
        // `stat` of a fresh folder need no LOOKUP per file (AUTO: the kernel uses it while
        // the listing's entries are then looked at).
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e.reply("lookup")),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        let entry = move |r: OpResult<fuser::FileAttr>| match r {
            Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e.reply("lookup")),
        };
        if let Some(r) = fs.lookup_cached(parent.0, &name, req.pid()) {
            return entry(r);
        }
        spawn(
            &self.0,
            async move { fs.lookup(parent.0, &name).await },
            entry,
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.0.clone();
        let ttl = fs.ttl();
        if let Some(attr) = fs.getattr_cached(ino.0) {
            return reply.attr(&ttl, &attr);
        }
        spawn(
            &self.0,
            async move { fs.getattr(ino.0).await },
            move |r| match r {
                Ok(attr) => reply.attr(&ttl, &attr),
                Err(e) => reply.error(e.reply("getattr")),
            },
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fs = self.0.clone();
        let ttl = fs.ttl();
        let times = (atime, mtime);
        let attr = move |r: OpResult<fuser::FileAttr>| match r {
            Ok(attr) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e.reply("setattr")),
        };
        // A truncate by name of a file passthrough readers hold: the name moves first (the
        // readers keep their version; see `passthrough`).
        if size.is_some() && fs.held_by_passthrough(ino.0) {
            return spawn(
                &self.0,
                async move {
                    // Ok: they closed meanwhile, and the truncate goes on here.
                    fs.truncate_elsewhere(ino.0).await?;
                    fs.setattr(ino.0, size, times, mode, (uid, gid)).await
                },
                attr,
            );
        }
        // Without a size and with nothing the backend keeps (atime, a folder's time),
        // answered on the FUSE thread: `tar x` and `cp -p` set times on every file.
        if size.is_none() {
            return match fs.setattr_now(ino.0, times, mode, (uid, gid)) {
                Ok(SetattrNow::Done(a)) => attr(Ok(a)),
                Ok(SetattrNow::Keep(keep)) => spawn(
                    &self.0,
                    async move { fs.setattr_keep(ino.0, keep).await },
                    attr,
                ),
                Err(e) => attr(Err(e)),
            };
        }
        spawn(
            &self.0,
            async move { fs.setattr(ino.0, size, times, mode, (uid, gid)).await },
            attr,
        );
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files come through create().
        reply.error(Fs::<B>::refused(parent.0));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e.reply("mkdir")),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        spawn(
            &self.0,
            async move { fs.mkdir(parent.0, &name).await },
            move |r| match r {
                Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
                Err(e) => reply.error(e.reply("mkdir")),
            },
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e.reply("unlink")),
        };
        // The follower's own removal of what is gone elsewhere (`follow::echo`).
        if self.0.nodes.follow.is_echo(parent.0, &name) {
            return reply.ok();
        }
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.unlink(parent.0, &name).await },
            move |r| empty("unlink", reply, r),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e.reply("rmdir")),
        };
        // The follower's own removal of what is gone elsewhere (`follow::echo`).
        if self.0.nodes.follow.is_echo(parent.0, &name) {
            return reply.ok();
        }
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.rmdir(parent.0, &name).await },
            move |r| empty("rmdir", reply, r),
        );
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _link: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Fs::<B>::refused(parent.0));
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Fs::<B>::refused(newparent.0));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = match (name_of(name), name_of(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e.reply("rename")),
        };
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move {
                fs.rename(parent.0, &name, newparent.0, &newname, flags)
                    .await
            },
            move |r| empty("rename", reply, r),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.0.clone();
        if let Some(r) = fs.open_now(ino.0, flags, &|fd| reply.open_backing(fd)) {
            return opened(reply, fs.handles.note_running(ino.0, flags, r));
        }
        self.0.rt.spawn(async move {
            let r = fs
                .open_with(ino.0, flags, &|fd| reply.open_backing(fd))
                .await;
            opened(reply, fs.handles.note_running(ino.0, flags, r));
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.0.reads.counts.read();
        let data = move |r: OpResult<Vec<u8>>| match r {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e.reply("read")),
        };
        // Staged bytes are local: answer at once; the rest may need the network.
        if let Some(r) = self.0.read_staged(ino.0, offset, size) {
            return data(r);
        }
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.read(ino.0, offset, size).await },
            data,
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.0.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e.reply("write")),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty("flush", reply, self.0.flush(fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.handles.release_running(fh.0);
        self.0.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        spawn(&self.0, async move { fs.fsync(ino.0).await }, move |r| {
            empty("fsync", reply, r)
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move { fs.opendir(ino.0).await },
            move |r| match r {
                Ok(fh) => reply.opened(FileHandle(fh), fuser::FopenFlags::empty()),
                Err(e) => reply.error(e.reply("opendir")),
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let fs = self.0.clone();
        // A rewound handle is listed afresh first (see `Fs::rewound`).
        if !fs.rewound(ino.0, fh.0, offset) {
            return fill(&fs, fh.0, offset, reply);
        }
        spawn(
            &self.0,
            {
                let fs = fs.clone();
                async move { fs.relist(ino.0, fh.0).await }
            },
            move |r| match r {
                Ok(()) => fill(&fs, fh.0, offset, reply),
                Err(e) => reply.error(e.reply("readdir")),
            },
        );
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let fs = self.0.clone();
        if !fs.rewound(ino.0, fh.0, offset) {
            return fill_plus(&fs, ino.0, fh.0, offset, reply);
        }
        spawn(
            &self.0,
            {
                let fs = fs.clone();
                async move { fs.relist(ino.0, fh.0).await }
            },
            move |r| match r {
                Ok(()) => fill_plus(&fs, ino.0, fh.0, offset, reply),
                Err(e) => reply.error(e.reply("readdirplus")),
            },
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are made on the backend before they are acknowledged, but for
        // deletes answered early (`deletes`): sent before this returns.
        if self.0.deletes.pending() == 0 {
            return reply.ok();
        }
        let fs = self.0.clone();
        spawn(
            &self.0,
            async move {
                fs.deletes_sent().await;
                Ok(())
            },
            move |r| empty("fsyncdir", reply, r),
        );
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.0.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _pos: u32,
        reply: ReplyEmpty,
    ) {
        empty(
            "setxattr",
            reply,
            self.0.change_xattr(ino.0, name, Some(value)),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if name.to_str() == Some(super::xattrs::LOCK_XATTR) {
            let fs = self.0.clone();
            let r = move |r| xattr("getxattr", reply, size, r);
            return spawn(&self.0, async move { fs.lock_xattr(ino.0).await }, r);
        }
        if let Some(link) =
            (name.to_str()).and_then(|n| super::xattrs::LINK_XATTRS.iter().find(|l| **l == n))
        {
            let fs = self.0.clone();
            let r = move |r| xattr("getxattr", reply, size, r);
            return spawn(&self.0, async move { fs.link_xattr(ino.0, link).await }, r);
        }
        xattr("getxattr", reply, size, self.0.getxattr(ino.0, name));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr("listxattr", reply, size, Ok(self.0.listxattr(ino.0)));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty("removexattr", reply, self.0.change_xattr(ino.0, name, None));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks modes itself.
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // The new file's permission bits are kept like a chmod's (docs/design.md §3).
        let perm = mode & !umask & 0o777;
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e.reply("create")),
        };
        let fs = self.0.clone();
        let ttl = fs.ttl();
        if let Some(r) =
            fs.create_cached(parent.0, &name, flags, perm, &|fd| reply.open_backing(fd))
        {
            return created(reply, &ttl, r);
        }
        self.0.rt.spawn(async move {
            let r = fs
                .create(parent.0, &name, flags, perm, &|fd| reply.open_backing(fd))
                .await;
            created(reply, &ttl, r);
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _off_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _off_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.0.copy_file_range() {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e.reply("copy_file_range")),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            "fallocate",
            reply,
            self.0.fallocate(fh.0, offset, length, mode),
        );
    }

    /// No file here is a device: every ioctl is "not a terminal" (ENOTTY), quietly. Python's
    /// `open()` asks each file whether it is a terminal (TCGETS), and fuser's default answer
    /// logged a warning each time (21,491 for 20,000 files).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}

/// The answer to an OPEN: passed through to its backing file, or the plain way.
fn opened(reply: ReplyOpen, r: OpResult<super::io::Opened>) {
    match r {
        Ok(o) => match &o.backing {
            Some(id) => reply.opened_passthrough(FileHandle(o.fh), o.flags, id),
            None => reply.opened(FileHandle(o.fh), o.flags),
        },
        Err(e) => reply.error(e.reply("open")),
    }
}

fn created(
    reply: ReplyCreate,
    ttl: &std::time::Duration,
    r: OpResult<(fuser::FileAttr, super::io::Opened)>,
) {
    match r {
        Ok((attr, o)) => match &o.backing {
            Some(id) => {
                reply.created_passthrough(ttl, &attr, Generation(0), FileHandle(o.fh), o.flags, id)
            }
            None => reply.created(ttl, &attr, Generation(0), FileHandle(o.fh), o.flags),
        },
        Err(e) => reply.error(e.reply("create")),
    }
}

/// Asks the kernel for passthrough: `Err(why)` when it cannot be had.
fn passthrough(config: &mut KernelConfig) -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("no passthrough on this system".into());
    }
    if config
        .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
        .is_err()
    {
        return Err("the kernel does not offer passthrough".into());
    }
    if !super::passthrough::privileged() {
        return Err("not privileged: passthrough needs CAP_SYS_ADMIN".into());
    }
    // Backing files on a plain file system; the mount itself may be stacked under overlayfs.
    config
        .set_max_stack_depth(1)
        .map(drop)
        .map_err(|_| "the kernel refused the stacking depth".to_string())
}

/// READDIR from the handle's snapshot into `reply`.
fn fill<B: Backend>(fs: &Fs<B>, fh: u64, offset: u64, mut reply: ReplyDirectory) {
    let r = fs.readdir(fh, offset, |ino, next, kind, name| {
        reply.add(INodeNo(ino), next, kind, name)
    });
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.reply("readdir")),
    }
}

/// READDIRPLUS from the handle's snapshot into `reply`.
fn fill_plus<B: Backend>(
    fs: &Fs<B>,
    ino: u64,
    fh: u64,
    offset: u64,
    mut reply: ReplyDirectoryPlus,
) {
    let r = fs.readdirplus(ino, fh, offset, |cino, next, name, valid, attr| {
        reply.add(INodeNo(cino), next, name, valid, attr, Generation(0))
    });
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.reply("readdirplus")),
    }
}
