//! A real PostgreSQL for the tests of `--database postgres://...`: the Debian packages'
//! server (`.ci/run` installs `postgresql`), made by `initdb` in a temporary directory and run
//! as an unprivileged user (`nobody` when the tests run as root, as PostgreSQL refuses root),
//! listening on a socket in that directory only (no port to collide with). One per test
//! binary, started on first use; each store gets a database of its own. When the binary ends
//! the server is stopped and its directory removed by the shell that watches it. Where
//! PostgreSQL cannot be found, [`pg`] says so loudly and the tests skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The running server.
pub struct PgServer {
    /// The directory holding its data and socket.
    pub dir: PathBuf,
    /// Its port: the socket's name (`.s.PGSQL.PORT`), and TCP's where it listens there too.
    pub port: u16,
}

/// The newest installed server's `bin` folder (or `VAULTFS_PG_BIN`).
fn bin_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VAULTFS_PG_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

const NOBODY: u32 = 65534;

fn as_owner(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        // std drops the supplementary groups when it changes the user of a root process.
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd
}

fn start() -> Option<PgServer> {
    start_with(5432, String::new())
}

/// A server on `port` with `settings` (more `-c name=value` words) after ours.
fn start_with(port: u16, settings: String) -> Option<PgServer> {
    let Some(bin) = bin_dir() else {
        eprintln!(
            "\n*** SKIPPED: no PostgreSQL server (`.ci/run` installs the Debian package \
             postgresql; or set VAULTFS_PG_BIN to the folder of initdb and postgres) ***\n"
        );
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix("vaultfs-pg")
        .tempdir()
        .unwrap()
        .keep();
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let data = dir.join("data");
    let out = as_owner(Command::new(bin.join("initdb")).args([
        "-D",
        data.to_str().unwrap(),
        "-U",
        "vaultfs",
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-sync",
    ]))
    .output()
    .expect("run initdb");
    if !out.status.success() {
        eprintln!(
            "\n*** SKIPPED: initdb failed: {} ***\n",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    let postgres = bin.join("postgres");
    // The watcher: runs the server, and when this test binary ends (its death signal) stops
    // it at once and removes the directory.
    // A server stopped by [`PgServer::stop`] (the file `paused` beside its data) is started
    // again when that file goes ([`PgServer::start`]).
    let script = format!(
        "trap 'kill -QUIT $pid 2>/dev/null; wait $pid; rm -rf \"$0\"; exit 0' TERM INT
         while :; do
             {setpriv} {postgres} -D \"$0/data\" -k \"$0\" -c listen_addresses= -c fsync=off \
                 -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 \
                 -p {port} {settings} >>\"$0/log\" 2>&1 &
             pid=$!
             wait $pid
             [ -e \"$0/paused\" ] || break
             while [ -e \"$0/paused\" ]; do sleep 0.1; done
         done
         rm -rf \"$0\"",
        setpriv = if unsafe { libc::getuid() } == 0 {
            format!("setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups")
        } else {
            String::new()
        },
        postgres = postgres.display(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let watched = dir.clone();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&script)
            .arg(&watched)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let _ = tx.send(cmd.spawn().map(drop));
        loop {
            std::thread::park();
        }
    });
    if let Err(e) = rx.recv().expect("the spawning thread answers") {
        eprintln!("\n*** SKIPPED: PostgreSQL would not start: {e} ***\n");
        return None;
    }
    let server = PgServer { dir, port };
    server.wait_up();
    Some(server)
}

/// A server of the caller's own (for a test that stops it), or `None` as [`pg`].
pub fn own() -> Option<PgServer> {
    std::thread::spawn(start).join().expect("PostgreSQL start")
}

/// A server of the caller's own on `port` (of its socket, and of TCP if `settings` listen
/// there) with more settings (`-c name=value ...`, given to the shell as they are), or `None`
/// as [`pg`].
pub fn own_with(port: u16, settings: &str) -> Option<PgServer> {
    let settings = settings.to_string();
    std::thread::spawn(move || start_with(port, settings))
        .join()
        .expect("PostgreSQL start")
}

/// The shared server, or `None` (said loudly) when PostgreSQL is not installed.
pub fn pg() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    // On a thread of its own: the synchronous client must not run on a runtime's thread.
    SERVER
        .get_or_init(|| std::thread::spawn(start).join().expect("PostgreSQL start"))
        .as_ref()
}

impl PgServer {
    /// Waits until the server takes connections (at most a minute).
    fn wait_up(&self) {
        let url = self.url("postgres");
        let dir = self.dir.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match postgres::Client::connect(&url, postgres::NoTls) {
                    Ok(_) => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => panic!(
                        "PostgreSQL did not come up in {}: {e}\n{}",
                        dir.display(),
                        std::fs::read_to_string(dir.join("log")).unwrap_or_default()
                    ),
                }
            }
        })
        .join()
        .expect("PostgreSQL up");
    }

    /// Stops the server (a fast shutdown: its sessions are ended) until [`PgServer::start`].
    pub fn stop(&self) {
        std::fs::write(self.dir.join("paused"), b"").unwrap();
        let pidfile = self.dir.join("data/postmaster.pid");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("postmaster.pid")
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid in postmaster.pid");
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while pidfile.exists() {
            assert!(Instant::now() < deadline, "PostgreSQL did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server [`PgServer::stop`] stopped, and waits until it takes connections.
    pub fn start(&self) {
        std::fs::remove_file(self.dir.join("paused")).unwrap();
        self.wait_up();
    }

    /// The address of database `db`, over the server's socket.
    pub fn url(&self, db: &str) -> String {
        url_in(&self.dir, self.port, db)
    }

    /// A new, empty database for one store; its address.
    pub fn database(&self) -> String {
        let name = format!("t{:016x}", rand::random::<u64>());
        let admin = self.url("postgres");
        let sql = format!("CREATE DATABASE {name}");
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
            c.batch_execute(&sql).unwrap();
        })
        .join()
        .expect("CREATE DATABASE");
        self.url(&name)
    }
}

fn url_in(dir: &Path, port: u16, db: &str) -> String {
    format!(
        "postgres://vaultfs@localhost:{port}/{db}?host={}",
        dir.display()
    )
}
