//! The `vaultfs` command: a thin layer of argument parsing over the mount, the server, the
//! store and the login flow; the one place that assembles them all.

mod check;
mod config;
mod control;
mod daemon;
mod link;
pub mod login;
mod mount;
mod mount_helper;
mod mounted;
mod notify;
mod options;
mod owner;
mod pin;
mod restore;
mod search;
mod status;
mod sync;
mod terminal;
mod users;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::server::{self, ServerOptions};
use crate::store::{PreviewMode, Store, StoreConfig};

#[derive(Parser)]
#[command(name = "vaultfs", version, about = "A document store as an ordinary folder", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount the store as a folder: the built-in store by default (nothing else to start).
    ///
    /// Runs in the foreground until unmounted (`fusermount3 -u DIR`, `umount DIR`) or stopped with
    /// Ctrl-C / SIGTERM; files not yet uploaded stay journaled and are uploaded by the next mount.
    Mount(options::MountArgs),
    /// Unmount a mount point: the daemon flushes pending uploads (within its --flush-timeout;
    /// the journal keeps the rest), unmounts and exits; this waits for it.
    Unmount(status::UnmountArgs),
    /// Show running mounts: backend, cache use, uploads with progress, recent errors, token.
    Status(status::StatusArgs),
    /// Wait until a mount (or every mount) has stored everything written to it; exits non-zero
    /// saying what is left and why (open for writing, server unreachable, --timeout).
    Sync(sync::SyncArgs),
    /// Bring back an earlier version of a file in a mount (as listed in `.versions/`): its
    /// bytes become the file's new current version; `--list` shows the versions. Or bring back
    /// a file or folder removed from a mount (`rm -rf`): a folder with its tree, every file with
    /// its versions; `--list FOLDER` shows what can be.
    Restore(restore::RestoreArgs),
    /// Keep a folder's (or a file's) files whole on disk, for use offline: never evicted,
    /// fetched again when they change; files added to a pinned folder later too. Same as
    /// `setfattr -n user.vaultfs.pinned -v 1 PATH`.
    Pin(pin::PinArgs),
    /// Unpin a folder or file: its files stay cached until evicted like any other.
    Unpin(pin::UnpinArgs),
    /// Serve the built-in store over HTTP: the whole interface, with pin-based login.
    ///
    /// Users are created with `vaultfs user add`; clients log in with `vaultfs login`.
    Serve(ServeArgs),
    /// Copy a built-in store (SQLite and its blob folder) into PostgreSQL and a shared blob
    /// store, and verify the copy (row counts, and every blob's SHA-256 read back).
    ///
    /// The store must not be in use (stop its server first); the destination database must be
    /// empty. Then serve it with `vaultfs serve --database ... --blobs ...`.
    Migrate(MigrateArgs),
    /// Verify a built-in store, as `git fsck` does: the database, the tree (a cycle of parents
    /// or a missing parent, which older builds could leave) and every blob's bytes against its
    /// SHA-256.
    ///
    /// The store must not be in use (stop its server first). `--repair` moves the parts of the
    /// tree that no account reaches into `lost+found` in their account's first vault. Exit
    /// status as fsck(8): 0 nothing found, 1 everything found repaired, 4 a problem remains, 8
    /// the check could not run.
    Check(check::CheckArgs),
    /// Print the browser link of a file in a mount (`--preview`, `--download`: those links).
    Link(link::LinkArgs),
    /// Find files by the words in them (text files, PDFs' text): paths with a line of
    /// context, best first. The built-in store, or `--server` (`vaultfs serve`).
    Search(search::SearchArgs),
    /// Manage the users of the built-in server (run against its data directory).
    #[command(subcommand)]
    User(users::UserCommand),
    /// Manage the client IDs that may ask for pins (`vaultfs` is always registered).
    #[command(subcommand)]
    Client(users::ClientCommand),
    /// Log in to a service (ours or the public one) with the pin flow; stores the token.
    Login(login::LoginArgs),
    /// Forget the stored login of a service.
    Logout(login::LogoutArgs),
    /// Print a shell completion script, e.g. `vaultfs completions bash > /etc/bash_completion.d/vaultfs`.
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `vaultfs manpage > /usr/local/share/man/man1/vaultfs.1`.
    Manpage,
}

/// Where the built-in store keeps its data.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct DataDir {
    /// Data directory of the built-in store [default: $XDG_DATA_HOME/vaultfs, or ~/.local/share/vaultfs]
    #[arg(long, env = "VAULTFS_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl DataDir {
    /// Whether a directory was given (else the default).
    pub fn is_given(&self) -> bool {
        self.data_dir.is_some()
    }

    pub fn path(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }
}

/// Our folder in an XDG base directory: `$VAR/vaultfs`, or `~/<fallback>/vaultfs` when the
/// variable is unset or empty (the one place these defaults are worked out).
pub fn xdg_dir(var: &str, fallback: &str) -> PathBuf {
    let base = std::env::var_os(var)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/"))
                .join(fallback)
        });
    base.join("vaultfs")
}

/// Where `vaultfs serve`, `user` and `client` find the store's metadata.
#[derive(Args, Clone, Default)]
pub struct Database {
    /// Metadata in PostgreSQL at this address (postgres://USER[:PASSWORD]@HOST[:PORT]/DB, or
    /// with `?host=/run/postgresql` for a socket) instead of vault.db in the data directory;
    /// several servers on one database (and one --blobs) are one store
    #[arg(long, env = "VAULTFS_DATABASE", value_name = "postgres://...", value_parser = parse_database)]
    database: Option<String>,
}

impl Database {
    pub fn url(&self) -> Option<String> {
        self.database.clone()
    }
}

/// `--database`: a PostgreSQL address.
fn parse_database(s: &str) -> Result<String, String> {
    if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
        return Err("must be a postgres:// address".into());
    }
    s.parse::<postgres::Config>()
        .map_err(|e| format!("not a PostgreSQL address: {e}"))?;
    Ok(s.to_string())
}

/// `$XDG_DATA_HOME/vaultfs`, or `~/.local/share/vaultfs`.
pub fn default_data_dir() -> PathBuf {
    xdg_dir("XDG_DATA_HOME", ".local/share")
}

#[derive(Args)]
struct MigrateArgs {
    /// The store to copy [default: $XDG_DATA_HOME/vaultfs, or ~/.local/share/vaultfs]
    #[command(flatten)]
    data: DataDir,
    /// Its blobs, if it was served with `--blobs DIR` [default: blobs/ in the data directory]
    #[arg(long, value_name = "DIR")]
    from_blobs: Option<PathBuf>,
    /// The destination: an empty PostgreSQL database
    #[arg(long, value_name = "postgres://...", value_parser = parse_database)]
    database: String,
    /// Where the destination keeps the bytes: a folder every server reaches, or
    /// a bucket (`s3://`, `gs://`, `az://BUCKET/PREFIX`, credentials as for `serve`)
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    blobs: String,
    /// Endpoint of an S3-compatible service for `--blobs s3://...`
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    s3_endpoint: Option<String>,
}

fn migrate(args: MigrateArgs) -> Result<(), Box<dyn std::error::Error>> {
    use crate::store::BlobLocation;
    let source = args.data.path();
    if !source.join("vault.db").exists() {
        return Err(format!("no store in {} (no vault.db)", source.display()).into());
    }
    let migration = crate::store::migrate::Migration {
        source: &source,
        source_blobs: args
            .from_blobs
            .map_or(BlobLocation::DataDir, BlobLocation::Dir),
        database: &args.database,
        blobs: blob_location(Some(&args.blobs), args.s3_endpoint.as_deref())?,
    };
    let started = std::time::Instant::now();
    let summary = migration
        .run(&mut |line| println!("{line}"))
        .map_err(|e| format!("migration failed: {e}"))?;
    println!(
        "migrated and verified in {:.1}s: {} account(s), {} blob(s) ({} bytes, every SHA-256          read back)",
        started.elapsed().as_secs_f64(),
        summary.accounts,
        summary.blobs,
        summary.blob_bytes
    );
    for (table, n) in &summary.rows {
        println!("  {table}: {n}");
    }
    println!(
        "serve it with: vaultfs serve --database {} --blobs {}",
        crate::store::migrate::redact(&args.database),
        args.blobs
    );
    Ok(())
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    data: DataDir,
    #[command(flatten)]
    database: Database,
    /// Address and port to listen on
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: SocketAddr,
    /// Where the files' bytes are kept: a folder, or a bucket: `s3://BUCKET/PREFIX` (S3 or
    /// S3-compatible), `gs://BUCKET/PREFIX` (Google Cloud Storage), `az://CONTAINER/PREFIX`
    /// (Azure), credentials from the service's usual chain (docs/deploy.md)
    /// [default: blobs/ in the data directory]
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    blobs: Option<String>,
    /// Endpoint of an S3-compatible service for `--blobs s3://...` (MinIO, Ceph, Garage, ...),
    /// e.g. http://127.0.0.1:9000 [default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or AWS]
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    s3_endpoint: Option<String>,
    /// Largest file an upload may announce, in bytes
    #[arg(long, default_value_t = 1 << 40, value_name = "BYTES")]
    max_file_size: u64,
    /// Largest JSON request body, in bytes
    #[arg(long, default_value_t = 64 * 1024, value_name = "BYTES")]
    max_json_body: usize,
    /// Lifetime of the tokens handed out by `/pin/auth`, in seconds (default: 14 days)
    #[arg(long, default_value_t = 14 * 24 * 3600, value_name = "SECONDS")]
    token_ttl: u64,
    /// Base URL of this server as browsers reach it (http or https), for the authorization
    /// link. Without it, only clients on this machine can log in (a link from a request's Host
    /// header could send users anywhere)
    #[arg(long, value_name = "URL", value_parser = parse_public_url)]
    public_url: Option<String>,
    /// Files and folders one account may hold; more are refused with 507 quota_exceeded
    #[arg(long, default_value_t = crate::store::DEFAULT_MAX_NODES_PER_ACCOUNT, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    max_nodes_per_account: u64,
    /// Bytes one account may hold, every version counted (suffixes K, M, G, T allowed)
    /// [default: off: any account may fill the disk for all; a warning at start says so]
    #[arg(long, value_parser = options::parse_size, value_name = "BYTES")]
    max_bytes_per_account: Option<u64>,
    /// Files and folders one request (a copy) may create; more are refused with 413
    /// too_many_nodes
    #[arg(long, default_value_t = crate::store::DEFAULT_MAX_NODES_PER_REQUEST, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    max_nodes_per_request: u64,
    #[command(flatten)]
    retention: RetentionArgs,
    /// Minutes a pin shown on the authorization page may wait to be exchanged (once)
    #[arg(long, default_value_t = 15, value_name = "MINUTES",
          value_parser = clap::value_parser!(u64).range(1..=7 * 24 * 60))]
    pin_ttl: u64,
    /// Threads rendering previews asked for, and as many for the background (idle priority)
    /// [default: half the cores]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    preview_workers: Option<u16>,
    /// Seconds a request body (an upload's or any other) may send nothing, or a client read
    /// nothing of an answer, before the request is cut off
    #[arg(long, default_value_t = server::DEFAULT_TRANSFER_IDLE_SECS, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    transfer_idle_timeout: u64,
    /// Uploads and downloads one user may run at once; more are answered 503 with Retry-After
    #[arg(long, default_value_t = server::DEFAULT_MAX_TRANSFERS_PER_USER as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_transfers_per_user: u64,
    /// Long polls of the change feed (`GET /changes?wait=`) one user may hold open at once;
    /// more are answered 503 with Retry-After
    #[arg(long, default_value_t = server::DEFAULT_MAX_WAITS_PER_USER as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_waits_per_user: u64,
    /// Changes each account's log keeps for the change feed (a client further behind lists
    /// again); none is kept longer than 7 days
    #[arg(long, default_value_t = crate::store::DEFAULT_CHANGE_LOG_ENTRIES, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    change_log_size: u64,
    /// Connections to PostgreSQL (--database) for requests, besides the store's own: how
    /// many requests' statements run at once on this server
    #[arg(long, default_value_t = crate::store::db::DEFAULT_POOL, value_name = "N",
          value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u64).range(1..=1000), |n| n as usize))]
    db_connections: usize,
    /// Password checks (argon2id, about 19 MiB each) run at once [default: the number of cores]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    password_checks: Option<u64>,
    /// Sign-ins that may wait for a password check; more are answered 503 with Retry-After
    #[arg(long, default_value_t = server::DEFAULT_PASSWORD_QUEUE as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    password_queue: u64,
    /// Seconds within which a request's head must arrive; also how long an idle kept-alive
    /// connection stays open
    #[arg(long, default_value_t = server::DEFAULT_HEADER_TIMEOUT_SECS, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: u64,
    /// Connections open at once (more wait to be accepted); lowered to what the open-file limit
    /// allows
    #[arg(long, default_value_t = server::DEFAULT_MAX_CONNECTIONS as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// Connections one source address may hold at once; more are closed at once
    #[arg(long, default_value_t = server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections_per_source: u64,
    /// A reverse proxy in front of this server (an address or ADDR/BITS; repeat for more):
    /// requests from it are counted against the address its forwarding header names
    /// (--proxy-header), read from the right past the trusted proxies. Without it, every
    /// client is the address it connects from, and one proxy is one client
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<server::proxy::Cidr>,
    /// The header the trusted proxies name the client in: x-forwarded-for or forwarded
    /// (RFC 7239); the other one is not read
    #[arg(
        long,
        default_value = "x-forwarded-for",
        value_name = "HEADER",
        requires = "trusted_proxies"
    )]
    proxy_header: server::proxy::ProxyHeader,
    /// Do not serve WebDAV at /dav/ (docs/webdav.md)
    #[arg(long)]
    no_webdav: bool,
    /// Answer WebDAV over plain HTTP from other machines too. Its clients send the password
    /// with every request, so by default /dav/ answers only this machine (loopback) and a
    /// --trusted-proxy that got the request over HTTPS
    #[arg(long, conflicts_with = "no_webdav")]
    webdav_allow_http: bool,
    #[command(flatten)]
    previews: PreviewArgs,
}

/// How the built-in store makes previews (`vaultfs serve`, and `vaultfs mount` of the built-in
/// store).
#[derive(Args, Clone, Debug, PartialEq)]
pub struct PreviewArgs {
    /// What is rendered without being asked for: `on-demand` renders a preview when it is asked
    /// for (at once, ahead of everything else) and, when the machine is idle, large files within
    /// a quarter of the files' bytes; `eager` renders every stored version when idle
    #[arg(long = "previews", default_value_t = PreviewMode::default(), value_name = "MODE",
          value_parser = clap::builder::TypedValueParser::map(
              clap::builder::PossibleValuesParser::new(["on-demand", "eager"]),
              |s| s.parse::<PreviewMode>().expect("a listed mode")))]
    pub mode: PreviewMode,
    /// Bound of the previews kept on disk (least recently used removed, rendered again when
    /// asked for), in bytes (suffixes K, M, G allowed)
    #[arg(long, default_value = options::format_size(crate::store::DEFAULT_PREVIEW_CACHE_SIZE),
          value_parser = options::parse_size, value_name = "BYTES")]
    pub preview_cache_size: u64,
}

/// Which earlier versions the built-in store keeps (`vaultfs serve`, and `vaultfs mount` of the
/// built-in store): the defaults undo a month of saves (the longest a careful user goes before
/// noticing a bad edit), at most 50 per file, and at most 1G of earlier bytes per file so that
/// a large file saved often (a disk image, a mailbox) does not fill the disk.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct RetentionArgs {
    /// Earlier versions of each file kept besides the current one (0: none)
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub keep_versions: u64,
    /// Days earlier versions, and deleted files, stay restorable (dropped at the file's next
    /// save, or by the store's hourly pass in idle time; 0: no bound by age, and deletes are
    /// final)
    #[arg(long, default_value_t = 30, value_name = "N")]
    pub keep_versions_days: u64,
    /// Bytes of earlier versions kept per file, newest first (the newest is kept whatever its
    /// size; 0: no bound by bytes; suffixes K, M, G allowed)
    #[arg(long, default_value = "1G", value_parser = options::parse_size, value_name = "BYTES")]
    pub keep_versions_bytes: u64,
}

impl RetentionArgs {
    /// The store configuration with this retention rule.
    pub fn apply(&self, config: StoreConfig) -> StoreConfig {
        let some = |n: u64| (n > 0).then_some(n);
        StoreConfig {
            retention: crate::store::Retention {
                count: Some(self.keep_versions),
                age: some(self.keep_versions_days).map(|d| Duration::from_secs(d * 24 * 3600)),
                bytes: some(self.keep_versions_bytes),
            },
            ..config
        }
    }
}

impl PreviewArgs {
    /// The store configuration with these preview settings.
    pub fn apply(&self, config: StoreConfig) -> StoreConfig {
        StoreConfig {
            previews: self.mode,
            preview_cache_size: self.preview_cache_size,
            ..config
        }
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    limit_malloc_arenas();
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The store's bounded renderer (`vaultfs render-preview KIND DIR`): not a command of the
    // CLI, so in no help, man page or completion; no logging, its output is its answer.
    if let [_, cmd, kind, dir] = &argv[..] {
        if cmd == "render-preview" {
            return crate::store::render_preview_main(&kind.to_string_lossy(), Path::new(dir));
        }
    }
    if argv
        .first()
        .is_some_and(|a| mount_helper::is_helper_name(a))
    {
        mount_helper::fill_environment();
        match mount_helper::remount(&argv[1..]) {
            Some(Ok(())) => return ExitCode::SUCCESS,
            Some(Err(e)) => {
                eprintln!("mount.fuse.vaultfs: {e}");
                return ExitCode::from(1);
            }
            None => {}
        }
        match mount_helper::translate(&argv[1..]) {
            Ok(Some(args)) => argv = std::iter::once("vaultfs".into()).chain(args).collect(),
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mount.fuse.vaultfs: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let cli = match parse_args(argv, &config::config_path()) {
        Ok(cli) => cli,
        Err(ArgsError::Clap(e)) => e.exit(),
        Err(ArgsError::Config(e)) => {
            eprintln!("vaultfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    init_logging();
    if !matches!(cli.command, Command::Mount(_) | Command::Serve(_)) {
        // A command printing into a closed pipe (`vaultfs status | head`) ends quietly, as
        // other command-line tools do; the daemons keep Rust's ignored SIGPIPE (their sockets
        // report EPIPE instead).
        // SAFETY: setting a signal's disposition to its default has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vaultfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why the arguments were not taken.
enum ArgsError {
    /// clap's (usage, `--help` and `--version` included): it prints and exits.
    Clap(clap::Error),
    /// The config file's.
    Config(String),
}

/// The command line, with what `config_file` gives `mount` and `serve` right after the command,
/// before the user's own flags: a flag given twice is no error, the later one wins.
fn parse_args(
    mut argv: Vec<std::ffi::OsString>,
    config_file: &std::path::Path,
) -> Result<Cli, ArgsError> {
    let parse = |argv: &[std::ffi::OsString]| {
        let cmd = <Cli as clap::CommandFactory>::command().args_override_self(true);
        let matches = cmd.try_get_matches_from(argv)?;
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
    };
    let cli = parse(&argv).map_err(ArgsError::Clap)?;
    let from_file = match &cli.command {
        Command::Mount(args) => config::mount_flags(config_file, args.mountpoint()),
        Command::Serve(_) => config::serve_flags(config_file),
        _ => return Ok(cli),
    };
    let extra = from_file.map_err(ArgsError::Config)?;
    if extra.is_empty() {
        return Ok(cli);
    }
    argv.splice(2..2, extra);
    parse(&argv).map_err(ArgsError::Clap)
}

/// glibc gives each thread that allocates its own arena, and those keep freed memory: a server
/// answering many requests at once grew past its memory target that way. Two arenas are enough
/// for a daemon whose threads mostly wait on I/O.
///
/// Large blocks (1 MiB and more: a password check's 19 MiB, a preview's pixels) are mapped and
/// unmapped on their own. Left to glibc's sliding threshold they come from the arenas once one
/// has been freed, and small allocations that land in the freed space keep those pages resident:
/// 300 sign-ins (never more than two checks at once) left `vaultfs serve` at 950 MiB.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt before any other thread exists; it only tunes the allocator.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

fn init_logging() {
    notify::init_logging();
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Mount(args) => mount::mount(args),
        Command::Unmount(args) => status::unmount(args),
        Command::Status(args) => status::status(args),
        Command::Sync(args) => sync::sync(args),
        Command::Restore(args) => restore::restore(args),
        Command::Pin(args) => pin::pin(args),
        Command::Unpin(args) => pin::unpin(args),
        Command::Serve(args) => serve(args),
        Command::Migrate(args) => migrate(args),
        Command::Check(args) => check::check(args),
        Command::Search(args) => search::search(args),
        Command::Link(args) => link::link(args),
        Command::User(cmd) => users::user(cmd),
        Command::Client(cmd) => users::client(cmd),
        Command::Login(args) => login::login(args),
        Command::Logout(args) => login::logout(args),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "vaultfs", &mut std::io::stdout());
            Ok(())
        }
        Command::Manpage => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?;
            Ok(())
        }
    }
}

/// `--public-url`: an http(s) address with a host, as browsers will be sent to it.
fn parse_public_url(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a web address: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("an http:// or https:// address with a host".into());
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// `--s3-endpoint`: an http(s) address with a host.
fn parse_endpoint(s: &str) -> Result<String, String> {
    parse_public_url(s)
}

/// Where `--blobs` and `--s3-endpoint` put the blobs.
fn blob_location(
    blobs: Option<&str>,
    s3_endpoint: Option<&str>,
) -> Result<crate::store::BlobLocation, String> {
    use crate::store::BlobLocation;
    let location = match blobs {
        None => BlobLocation::DataDir,
        Some(b) => BlobLocation::parse(b, s3_endpoint).map_err(|e| format!("--blobs {e}"))?,
    };
    if s3_endpoint.is_some() && !matches!(location, BlobLocation::Bucket(_)) {
        return Err("--s3-endpoint is for --blobs s3://BUCKET/PREFIX".into());
    }
    Ok(location)
}

fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.public_url.is_none() && !args.listen.ip().is_loopback() {
        log::warn!(
            "no --public-url: users on other machines cannot log in (set it to the address \
             browsers reach this server at)"
        );
    }
    if args.max_bytes_per_account.is_none() {
        // Off by default: how much each account may hold depends on the disk and on how many
        // share it, which the server cannot know (see the commit that made this a warning).
        log::warn!(
            "no byte quota: any account may store until the disk is full, for every account \
             (every earlier version the retention rule keeps counts); set \
             --max-bytes-per-account on a server shared by people who do not trust each other"
        );
    }
    let config = args.retention.apply(args.previews.apply(StoreConfig {
        max_file_size: args.max_file_size,
        token_ttl: Duration::from_secs(args.token_ttl),
        pin_ttl: Duration::from_secs(args.pin_ttl * 60),
        max_nodes_per_account: args.max_nodes_per_account,
        max_bytes_per_account: args.max_bytes_per_account.unwrap_or(u64::MAX),
        max_nodes_per_request: args.max_nodes_per_request,
        blobs: blob_location(args.blobs.as_deref(), args.s3_endpoint.as_deref())?,
        database: args.database.url(),
        change_log_entries: args.change_log_size,
        db_connections: args.db_connections,
        ..StoreConfig::default()
    }));
    let dir = args.data.path();
    if config.database.is_some() && matches!(config.blobs, crate::store::BlobLocation::DataDir) {
        log::warn!(
            "blobs in {} (this server's data dir): every other server of this database must \
             see the same blobs, or it is not one store (--blobs s3://BUCKET, or one shared \
             folder)",
            dir.display()
        );
    }
    let store = Arc::new(
        Store::open(&dir, config)
            .map_err(|e| format!("cannot open the store in {}: {e}", dir.display()))?,
    );
    let workers = args
        .preview_workers
        .map_or_else(crate::store::default_preview_workers, usize::from);
    store.start_previews(workers, &crate::store::this_program())?;
    store.start_expiry(crate::store::EXPIRE_EVERY)?;
    let options = ServerOptions {
        max_json_body: args.max_json_body,
        public_url: args.public_url,
        transfer_idle_timeout: Duration::from_secs(args.transfer_idle_timeout),
        max_transfers_per_user: args.max_transfers_per_user as usize,
        max_waits_per_user: args.max_waits_per_user as usize,
        password_checks: args
            .password_checks
            .map_or_else(server::limits::cores, |n| n as usize),
        password_queue: args.password_queue as usize,
        header_timeout: Duration::from_secs(args.header_timeout),
        max_connections: server::connections_within_open_file_limit(args.max_connections as usize),
        max_connections_per_source: args.max_connections_per_source as usize,
        trusted_proxies: args.trusted_proxies,
        proxy_header: args.proxy_header,
        webdav: !args.no_webdav,
        webdav_allow_http: args.webdav_allow_http,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let shutdown = server::shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        server::serve(listener, store, options, shutdown).await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn previews_of(argv: &[&str]) -> Result<(PreviewMode, u64), clap::Error> {
        let cli = Cli::try_parse_from(argv)?;
        let p = match cli.command {
            Command::Serve(a) => a.previews,
            Command::Mount(a) => a.previews,
            _ => unreachable!(),
        };
        Ok((p.mode, p.preview_cache_size))
    }

    #[test]
    fn preview_flags_of_serve_and_mount() {
        let on_demand = (PreviewMode::OnDemand, 1 << 30);
        assert_eq!(previews_of(&["vaultfs", "serve"]).unwrap(), on_demand);
        assert_eq!(previews_of(&["vaultfs", "mount", "/m"]).unwrap(), on_demand);
        assert_eq!(
            previews_of(&[
                "vaultfs",
                "serve",
                "--previews",
                "eager",
                "--preview-cache-size",
                "64M"
            ])
            .unwrap(),
            (PreviewMode::Eager, 64 << 20)
        );
        assert_eq!(
            previews_of(&["vaultfs", "mount", "/m", "--previews", "on-demand"]).unwrap(),
            on_demand
        );
        assert!(previews_of(&["vaultfs", "serve", "--previews", "lazy"]).is_err());
        assert!(previews_of(&["vaultfs", "serve", "--preview-cache-size", "1Q"]).is_err());
    }

    fn proxies_of(argv: &[&str]) -> Result<(Vec<String>, server::proxy::ProxyHeader), clap::Error> {
        match Cli::try_parse_from(argv)?.command {
            Command::Serve(a) => Ok((
                a.trusted_proxies.iter().map(|c| c.to_string()).collect(),
                a.proxy_header,
            )),
            _ => unreachable!(),
        }
    }

    #[test]
    fn trusted_proxies_of_serve() {
        use server::proxy::ProxyHeader;
        assert_eq!(
            proxies_of(&["vaultfs", "serve"]).unwrap(),
            (vec![], ProxyHeader::XForwardedFor)
        );
        assert_eq!(
            proxies_of(&[
                "vaultfs",
                "serve",
                "--trusted-proxy",
                "127.0.0.1",
                "--trusted-proxy",
                "10.0.0.0/8",
                "--trusted-proxy",
                "fd00::/8",
                "--proxy-header",
                "forwarded"
            ])
            .unwrap(),
            (
                vec![
                    "127.0.0.1/32".into(),
                    "10.0.0.0/8".into(),
                    "fd00::/8".into()
                ],
                ProxyHeader::Forwarded
            )
        );
        assert!(proxies_of(&["vaultfs", "serve", "--trusted-proxy", "nginx"]).is_err());
        assert!(proxies_of(&["vaultfs", "serve", "--trusted-proxy", "10.0.0.0/40"]).is_err());
        // A header without a proxy to trust is a mistake, said at once.
        assert!(proxies_of(&["vaultfs", "serve", "--proxy-header", "forwarded"]).is_err());
    }
}
