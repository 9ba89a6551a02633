//! The daemon's control socket: `$XDG_RUNTIME_DIR/vaultfs/<hash of the mount point>.sock`
//! (mode 0600, in a 0700 folder). One request per connection, one line each way:
//! `status` -> the mount's [`Status`] as JSON; `unmount` -> `{"unmounting":true}` at once, then
//! the [`Shutdown`] as JSON once the mount has ended and its uploads are done or journaled;
//! `{"pin":"REL","on":true}` (REL relative to the mount point) -> `{"ok":true}` or
//! `{"errno":N}`: `vaultfs pin` where the kernel refuses the attribute (a read-only mount).
//!
//! The folder may be `/tmp/vaultfs-<uid>` (no `XDG_RUNTIME_DIR`), which another local user could
//! create first and fill with a socket of theirs. So, as ssh-agent and tmux do, both sides use
//! the folder only if it is a real directory owned by this user and closed to others, and each
//! checks who is at the other end of a connection (`SO_PEERCRED`): the same user (or root, for
//! the daemon).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::fs::status::{Control, Shutdown, Status};

/// Where the control sockets live.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("vaultfs");
    }
    // SAFETY: geteuid cannot fail.
    match unsafe { libc::geteuid() } {
        0 => PathBuf::from("/run/vaultfs"),
        uid => std::env::temp_dir().join(format!("vaultfs-{uid}")),
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// `dir` is a directory (not a link to one) of this user that others cannot enter.
fn check_private_dir(dir: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.file_type().is_dir() || m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private folder of this user (owner {}, mode {:o}): another user may have \
             made it; remove it, or set XDG_RUNTIME_DIR",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Makes the control sockets' folder, or checks the one that is there.
fn private_dir(dir: &Path) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Ours but opened up (an older vaultfs, a chmod): closed again. Not ours: refused.
            if let Ok(m) = std::fs::symlink_metadata(dir) {
                if m.file_type().is_dir() && m.uid() == euid() && m.mode() & 0o077 != 0 {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
                }
            }
        }
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    check_private_dir(dir)
}

/// The user at the other end of a Unix socket.
#[cfg(not(target_os = "linux"))]
fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: getpeereid fills two integers of ours.
    if unsafe { libc::getpeereid(s.as_raw_fd(), &mut uid, &mut gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(uid)
}

/// The user at the other end of a Unix socket.
#[cfg(target_os = "linux")]
fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills a ucred of ours, of the size given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// The mount point as the daemon names it: canonical where it can be resolved.
pub fn canonical(mountpoint: &Path) -> PathBuf {
    std::fs::canonicalize(mountpoint)
        .or_else(|_| std::path::absolute(mountpoint))
        .unwrap_or_else(|_| mountpoint.to_path_buf())
}

/// The mount point `path` (absolute, resolved) is in: its nearest ancestor (or itself) that
/// is a vaultfs mount.
pub fn mount_of(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|p| crate::fs::unmount::is_vaultfs_mount(p))
        .map(Path::to_path_buf)
}

/// The mount a path given on the command line is in (`vaultfs sync ~/Vault/docs` as well as
/// `vaultfs sync ~/Vault`); the path itself where it is in none (no daemon answers there).
pub fn mount_given(path: &Path) -> PathBuf {
    mount_of(&canonical(path)).unwrap_or_else(|| path.to_path_buf())
}

/// The control socket of the mount at `mountpoint` (a hash keeps it within the 108 bytes a
/// socket path may have).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    use crate::api::checksum::Md5;
    let canon = canonical(mountpoint);
    let h = crate::api::checksum::hex(&Md5::digest(canon.as_os_str().as_encoded_bytes()));
    runtime_dir().join(format!("{}.sock", &h[..16]))
}

/// What the command layer adds to the fs layer's status.
#[derive(Clone, Default)]
pub struct Info {
    pub backend: String,
    pub token_expires: Option<String>,
    /// Where the mount's store is, for a command given a path in the mount (`vaultfs search`).
    pub store: Option<crate::fs::status::StoreAt>,
}

/// A running control server; [`Server::close`] ends it.
pub struct Server {
    path: PathBuf,
    /// The socket's inode: on close, the name is removed only if it is still this socket (a
    /// new daemon of the same mount point may have bound its own there meanwhile).
    ino: u64,
    task: tokio::task::JoinHandle<()>,
    /// Dropped on close: the unmount requests still writing their answer hold clones.
    busy: tokio::sync::mpsc::Sender<()>,
    idle: tokio::sync::mpsc::Receiver<()>,
}

/// Listens on the control socket of `mountpoint`.
pub fn start(
    rt: &tokio::runtime::Handle,
    mountpoint: &Path,
    control: Control,
    info: Info,
) -> std::io::Result<Server> {
    let path = socket_path(mountpoint);
    let dir = path.parent().expect("socket in a folder");
    private_dir(dir).map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
    // A socket left by a daemon that died: this mount point is ours now.
    let _ = std::fs::remove_file(&path);
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&path)?
    };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path)?);
    let (busy, idle) = tokio::sync::mpsc::channel(1);
    let busy2 = busy.clone();
    let task = rt.spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    // Out of descriptors, say: the connection waits in the backlog, and the
                    // loop must not spin on it.
                    log::warn!("control socket: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Only this user (or root) may ask; the socket's mode says so too.
            match conn.peer_cred().map(|c| c.uid()) {
                Ok(uid) if uid == euid() || uid == 0 => {}
                other => {
                    log::warn!("control socket: refused a connection from {other:?}");
                    continue;
                }
            }
            let (control, info, busy) = (control.clone(), info.clone(), busy2.clone());
            tokio::spawn(async move {
                if let Err(e) = serve_one(conn, control, info, busy).await {
                    log::debug!("control connection: {e}");
                }
            });
        }
    });
    Ok(Server {
        path,
        ino,
        task,
        busy,
        idle,
    })
}

/// A pin or unpin asked over the socket.
#[derive(serde::Serialize, serde::Deserialize)]
struct PinRequest {
    /// Relative to the mount point.
    pin: String,
    on: bool,
}

async fn serve_one(
    conn: tokio::net::UnixStream,
    control: Control,
    info: Info,
    busy: tokio::sync::mpsc::Sender<()>,
) -> std::io::Result<()> {
    let (r, mut w) = conn.into_split();
    let mut line = String::new();
    tokio::io::BufReader::new(r).read_line(&mut line).await?;
    let reply = match line.trim() {
        "status" => {
            let mut s = control.status();
            s.backend = info.backend.clone();
            s.token_expires = info.token_expires.clone();
            s.store = info.store.clone();
            serde_json::to_string(&s)?
        }
        "unmount" => {
            log::info!("unmount asked for over the control socket");
            w.write_all(b"{\"unmounting\":true}\n").await?;
            control.unmount();
            let done = control.finished().await;
            let r = serde_json::to_string(&done)?;
            drop(busy);
            r
        }
        other => match serde_json::from_str::<PinRequest>(other) {
            Ok(r) => match control.pin(Path::new(&r.pin), r.on) {
                Ok(()) => serde_json::json!({ "ok": true }).to_string(),
                Err(errno) => serde_json::json!({ "errno": errno }).to_string(),
            },
            Err(_) => {
                serde_json::json!({ "error": format!("unknown request `{other}`") }).to_string()
            }
        },
    };
    w.write_all(reply.as_bytes()).await?;
    w.write_all(b"\n").await?;
    w.shutdown().await
}

impl Server {
    /// Lets pending unmount answers go out (for at most 2 s), stops listening and removes
    /// the socket.
    pub async fn close(mut self) {
        self.task.abort();
        drop(self.busy);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.idle.recv()).await;
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A connection to the daemon of `mountpoint`: `None` if no daemon listens there, an error if
/// the folder or the answering process is not this user's.
fn connect(mountpoint: &Path) -> Option<Result<UnixStream, String>> {
    connect_path(&socket_path(mountpoint))
}

fn connect_path(path: &Path) -> Option<Result<UnixStream, String>> {
    let dir = path.parent()?;
    if std::fs::symlink_metadata(dir).is_err() {
        return None;
    }
    if let Err(e) = check_private_dir(dir) {
        return Some(Err(e));
    }
    let s = UnixStream::connect(path).ok()?;
    Some((|| {
        match peer_uid(&s) {
            Ok(uid) if uid == euid() => {}
            Ok(uid) => {
                return Err(format!(
                    "{} is answered by another user (uid {uid}), not by a vaultfs of yours",
                    path.display()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        Ok(s)
    })())
}

fn read_status(mut s: UnixStream) -> Result<Status, String> {
    s.write_all(b"status\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("no answer from the daemon: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("bad answer from the daemon: {e}"))
}

/// The status of the daemon of `mountpoint`, `None` if none runs there.
pub fn status(mountpoint: &Path) -> Option<Result<Status, String>> {
    connect(mountpoint).map(|c| c.and_then(read_status))
}

/// The status of every daemon with a control socket.
pub fn status_all() -> Vec<Status> {
    let Ok(dir) = std::fs::read_dir(runtime_dir()) else {
        return Vec::new();
    };
    let mut all: Vec<Status> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
        .filter_map(|e| connect_path(&e.path()))
        .filter_map(|c| c.and_then(read_status).ok())
        .collect();
    all.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    all
}

/// Pins (`on`) or unpins `rel` in the mount at `mountpoint`: `None` if no daemon listens
/// there; the errno the mount answered as an I/O error.
pub fn pin(mountpoint: &Path, rel: &Path, on: bool) -> Option<Result<(), std::io::Error>> {
    let mut s = match connect(mountpoint)? {
        Ok(s) => s,
        Err(e) => return Some(Err(std::io::Error::other(e))),
    };
    Some((|| {
        let rel = rel.to_str().ok_or(std::io::ErrorKind::InvalidInput)?;
        let req = PinRequest {
            pin: rel.to_string(),
            on,
        };
        s.write_all(format!("{}\n", serde_json::to_string(&req)?).as_bytes())?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        let answer: serde_json::Value = serde_json::from_str(&line)?;
        match answer["errno"].as_i64() {
            Some(n) => Err(std::io::Error::from_raw_os_error(n as i32)),
            None if answer["ok"] == true => Ok(()),
            None => Err(std::io::Error::other(format!("the daemon answered {line}"))),
        }
    })())
}

/// Asks the daemon of `mountpoint` to unmount and waits (at most `wait`) until it has; `None`
/// if no daemon listens there.
pub fn unmount(mountpoint: &Path, wait: Duration) -> Option<Result<Shutdown, String>> {
    let mut s = match connect(mountpoint)? {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    Some((|| {
        s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
        s.write_all(b"unmount\n").map_err(|e| e.to_string())?;
        let mut last = None;
        for line in BufReader::new(s).lines() {
            let line = line.map_err(|e| format!("waiting for the daemon: {e}"))?;
            if let Ok(done) = serde_json::from_str::<Shutdown>(&line) {
                last = Some(done);
            }
        }
        last.ok_or_else(|| "the daemon ended without saying how".to_string())
    })())
}
