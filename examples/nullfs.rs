//! The machine's FUSE ceiling for scripts/bench: a file system that keeps names and sizes and
//! drops every byte written (reads return zeros). Mounted with vaultfs's options and thread
//! count, what it does per request is close to nothing, so its figures are what the kernel and
//! the FUSE channel cost alone.
//!
//!     cargo run --release --example nullfs -- MOUNTPOINT [THREADS]
//!
//! The ceiling of a design with staging files: `NULLFS_STAGING=DIR` gives each created file a
//! real file in DIR that writes go to (through the daemon), and `NULLFS_PASSTHROUGH=1` beside
//! it has the kernel write that file itself (FUSE passthrough, as vaultfs's kernel writes).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

struct Node {
    dir: bool,
    size: u64,
    parent: u64,
    children: HashMap<String, u64>,
}

struct NullFs {
    nodes: Mutex<(u64, HashMap<u64, Node>)>,
    /// NULLFS_STAGING=DIR: each created file gets a real file there (as a staging file).
    staging: Option<std::path::PathBuf>,
    /// NULLFS_PASSTHROUGH=1 (with NULLFS_STAGING): the kernel writes that file itself.
    pt: bool,
    files: Mutex<HashMap<u64, (std::fs::File, Option<fuser::BackingId>)>>,
}

fn attr(ino: u64, n: &Node) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: n.size,
        blocks: n.size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind: if n.dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if n.dir { 0o755 } else { 0o644 },
        nlink: if n.dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 128 * 1024,
        flags: 0,
    }
}

impl NullFs {
    fn add(&self, parent: u64, name: &OsStr, dir: bool) -> Result<FileAttr, Errno> {
        let name = name.to_string_lossy().into_owned();
        let mut g = self.nodes.lock().unwrap();
        let (next, nodes) = &mut *g;
        let p = nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if p.children.contains_key(&name) {
            return Err(Errno::EEXIST);
        }
        let ino = *next;
        *next += 1;
        let n = Node {
            dir,
            size: 0,
            parent,
            children: HashMap::new(),
        };
        let a = attr(ino, &n);
        nodes.insert(ino, n);
        nodes.get_mut(&parent).unwrap().children.insert(name, ino);
        Ok(a)
    }

    fn remove(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let mut g = self.nodes.lock().unwrap();
        let nodes = &mut g.1;
        let ino = nodes
            .get_mut(&parent)
            .and_then(|p| p.children.remove(name.to_str().unwrap_or_default()))
            .ok_or(Errno::ENOENT)?;
        nodes.remove(&ino);
        Ok(())
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        if self.pt {
            config
                .add_capabilities(fuser::InitFlags::FUSE_PASSTHROUGH)
                .unwrap();
            config.set_max_stack_depth(1).unwrap();
        }
        // No READDIRPLUS (vaultfs asks for it): listings are not what this ceiling measures,
        // and plain READDIR is all it implements.
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let g = self.nodes.lock().unwrap();
        let found = g.1.get(&parent.0).and_then(|p| {
            let ino = *p.children.get(name.to_str()?)?;
            Some(attr(ino, g.1.get(&ino)?))
        });
        match found {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.nodes.lock().unwrap().1.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &attr(ino.0, n)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut g = self.nodes.lock().unwrap();
        match g.1.get_mut(&ino.0) {
            Some(n) => {
                if let Some(s) = size {
                    n.size = s;
                }
                reply.attr(&TTL, &attr(ino.0, n))
            }
            None => reply.error(Errno::ENOENT),
        }
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
        match self.add(parent.0, name, true) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let a = match self.add(parent.0, name, false) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let Some(dir) = &self.staging else {
            return reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty());
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(a.ino.0.to_string()))
            .unwrap();
        if self.pt {
            let id = reply.open_backing(&f).unwrap();
            reply.created_passthrough(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
                &id,
            );
            self.files.lock().unwrap().insert(a.ino.0, (f, Some(id)));
        } else {
            self.files.lock().unwrap().insert(a.ino.0, (f, None));
            reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty());
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
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
        let len = self
            .nodes
            .lock()
            .unwrap()
            .1
            .get(&ino.0)
            .map_or(0, |n| n.size);
        let n = len.saturating_sub(offset).min(u64::from(size)) as usize;
        reply.data(&vec![0u8; n]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Some(n) = self.nodes.lock().unwrap().1.get_mut(&ino.0) {
            n.size = n.size.max(offset + data.len() as u64);
        }
        if let Some((f, _)) = self.files.lock().unwrap().get(&ino.0) {
            use std::os::unix::fs::FileExt;
            f.write_at(data, offset).unwrap();
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The backing id closes with it (fuser's BackingId drop).
        self.files.lock().unwrap().remove(&ino.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let g = self.nodes.lock().unwrap();
        let Some(d) = g.1.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let mut entries = vec![
            (ino.0, FileType::Directory, ".".to_string()),
            (d.parent, FileType::Directory, "..".to_string()),
        ];
        for (name, c) in &d.children {
            let kind = match g.1.get(c) {
                Some(n) if n.dir => FileType::Directory,
                _ => FileType::RegularFile,
            };
            entries.push((*c, kind, name.clone()));
        }
        for (i, (c, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*c), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 30, 1 << 30, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mountpoint = args.next().expect("usage: nullfs MOUNTPOINT [THREADS]");
    let threads: usize = args.next().map_or(4, |t| t.parse().expect("THREADS"));
    let mut root = HashMap::new();
    root.insert(
        1,
        Node {
            dir: true,
            size: 0,
            parent: 1,
            children: HashMap::new(),
        },
    );
    let staging = std::env::var_os("NULLFS_STAGING").map(std::path::PathBuf::from);
    let fs = NullFs {
        nodes: Mutex::new((2, root)),
        pt: staging.is_some() && std::env::var_os("NULLFS_PASSTHROUGH").is_some(),
        staging,
        files: Mutex::default(),
    };
    // The options vaultfs mounts with (src/fs/mod.rs).
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("nullfs".into()),
        MountOption::Subtype("nullfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::AutoUnmount,
    ];
    config.acl = SessionACL::RootAndOwner;
    config.n_threads = Some(threads.max(1));
    let mut session = fuser::Session::new(fs, std::path::Path::new(&mountpoint), &config)?;
    let mut unmounter = session.unmount_callable();
    // SIGTERM/SIGINT unmount (the benchmark stops contenders that way): blocked in every thread
    // (threads inherit the mask) and taken by one waiting thread.
    // SAFETY: a sigset on our stack, given to the signal calls that fill and read it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits for one of the blocked signals of `set`.
        unsafe { libc::sigwait(&set, &mut sig) };
        let _ = unmounter.unmount();
    });
    session.run()
}
