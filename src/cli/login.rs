//! `vaultfs login` and `vaultfs logout`: the pin exchange of docs/design.md §2, and the credentials file
//! (`$XDG_CONFIG_HOME/vaultfs/credentials.toml`, mode 0600) that the mount reads through
//! [`credentials_for`]. The token is never printed or logged.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, IsTerminal, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::api::{Secret, format_time, parse_time};
use crate::backend::remote::{RemoteBackend, RemoteConfig};

/// The client ID the CLI uses unless told otherwise (`vaultfs serve` always knows it). The
/// public service accepts only IDs registered in a developer account: `--client-id`, or
/// `client_id` in the server's section of config.toml.
pub const CLIENT_ID: &str = "vaultfs";

#[derive(Args)]
pub struct LoginArgs {
    /// Base URL of the service, e.g. https://rest.smartvault.com or http://127.0.0.1:8080
    #[arg(long, value_name = "URL")]
    server: String,
    /// Your e-mail address on that service
    #[arg(long, value_name = "EMAIL")]
    email: String,
    /// Read a pin you already have from standard input (a line) instead of starting the flow;
    /// `VAULTFS_PIN` in the environment does the same. A pin is never taken from the command
    /// line, where other users of the machine see it (`ps`, /proc/PID/cmdline)
    #[arg(long)]
    pin_stdin: bool,
    /// Print the authorization URL without opening a browser
    #[arg(long)]
    no_browser: bool,
    /// The client ID to log in as (registered with the service); default: `client_id` of
    /// `[server."URL"]` in config.toml, else the one of the last login to this server, else
    /// `vaultfs`
    #[arg(long, value_name = "ID")]
    client_id: Option<String>,
}

#[derive(Args)]
pub struct LogoutArgs {
    /// Base URL of the service to forget the login of
    #[arg(long, value_name = "URL")]
    server: String,
}

/// A stored login for one server. (Its `Debug` shows no token: a [`Secret`].)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The server's base URL, normalized (no trailing slash).
    pub server: String,
    pub email: String,
    pub token: Secret,
    pub expires_at: SystemTime,
}

impl Credentials {
    /// The remote backend's settings for this login (default time-outs).
    pub fn remote_config(&self) -> RemoteConfig {
        RemoteConfig::new(&self.server, &self.email, self.token.expose())
    }
}

/// The file: one table per server URL.
#[derive(Default, Serialize, Deserialize)]
struct CredentialsFile {
    #[serde(default)]
    servers: BTreeMap<String, StoredLogin>,
}

/// One server's login as the credentials file keeps it (a table under `[servers]`).
#[derive(Serialize, Deserialize)]
struct StoredLogin {
    email: String,
    token: String,
    /// RFC 3339, UTC.
    expires_at: String,
    /// The client ID the token was issued to (absent in files written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_id: Option<String>,
}

/// The key a server is stored under: the URL as given, without trailing slashes.
pub fn normalize_server(url: &str) -> String {
    url.trim().trim_end_matches('/').to_string()
}

/// `$XDG_CONFIG_HOME/vaultfs/credentials.toml`, or `~/.config/vaultfs/credentials.toml`.
pub fn credentials_path() -> PathBuf {
    super::xdg_dir("XDG_CONFIG_HOME", ".config").join("credentials.toml")
}

/// The login for `server_url` from the default file, or a message saying how to log in.
pub fn credentials_for(server_url: &str) -> Result<Credentials, String> {
    credentials_in(&credentials_path(), server_url)
}

/// The login for `server_url` stored in `file`, valid now.
pub fn credentials_in(file: &Path, server_url: &str) -> Result<Credentials, String> {
    let server = normalize_server(server_url);
    let how = |why: &str| {
        format!("{why}: run `vaultfs login --server {server} --email YOUR_EMAIL` first")
    };
    let entries = read_file(file)?;
    let entry = entries
        .servers
        .get(&server)
        .ok_or_else(|| how(&format!("not logged in to {server}")))?;
    let expires_at = parse_time(&entry.expires_at).ok_or_else(|| {
        how(&format!(
            "the login for {server} in {} is unreadable",
            file.display()
        ))
    })?;
    if expires_at <= SystemTime::now() {
        return Err(format!(
            "the login for {server} expired on {}: run `vaultfs login --server {server} --email {}` again",
            entry.expires_at, entry.email
        ));
    }
    Ok(Credentials {
        server,
        email: entry.email.clone(),
        token: entry.token.as_str().into(),
        expires_at,
    })
}

fn read_file(file: &Path) -> Result<CredentialsFile, String> {
    match fs::read_to_string(file) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| format!("{} is not a valid credentials file: {e}", file.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(CredentialsFile::default()),
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    }
}

/// Replaces `file` atomically with a new one created with mode 0600 (never readable by others,
/// not even briefly), in a directory made private to its owner.
fn write_file(file: &Path, content: &CredentialsFile) -> Result<(), String> {
    let dir = file
        .parent()
        .ok_or_else(|| format!("{} has no directory", file.display()))?;
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
    let text = format!(
        "# vaultfs logins, one per server (written by `vaultfs login`; keep this file private)\n{}",
        toml::to_string(content).map_err(|e| format!("cannot write the credentials: {e}"))?
    );
    let tmp = dir.join(format!(".credentials.toml.{}.tmp", std::process::id()));
    let result = (|| -> io::Result<()> {
        let _ = fs::remove_file(&tmp);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, file)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("cannot write {}: {e}", file.display())
    })
}

/// Stores (or replaces) the login of `creds.server` in `file`.
pub fn save_credentials(file: &Path, creds: &Credentials) -> Result<(), String> {
    save_login(file, creds, None)
}

/// [`save_credentials`], noting the client ID the token was issued to.
pub fn save_login(file: &Path, creds: &Credentials, client_id: Option<&str>) -> Result<(), String> {
    let mut content = read_file(file)?;
    content.servers.insert(
        normalize_server(&creds.server),
        StoredLogin {
            email: creds.email.clone(),
            token: creds.token.expose().to_string(),
            expires_at: format_time(creds.expires_at),
            client_id: client_id.map(str::to_string),
        },
    );
    write_file(file, &content)
}

/// The client ID to log in to `server` as: the one given, else `client_id` of the server's
/// section in `config` (`[server."URL"]`), else the one of the last login stored in
/// `credentials`, else [`CLIENT_ID`].
pub fn client_id_for(
    given: Option<&str>,
    config: &Path,
    credentials: &Path,
    server: &str,
) -> Result<String, String> {
    if let Some(id) = given {
        return Ok(id.to_string());
    }
    if let Some(id) = super::config::server_client_id(config, &normalize_server(server))? {
        return Ok(id);
    }
    let last = read_file(credentials)?
        .servers
        .remove(&normalize_server(server))
        .and_then(|e| e.client_id);
    Ok(last.unwrap_or_else(|| CLIENT_ID.to_string()))
}

/// Removes the login of `server_url` from `file`; false when there was none.
pub fn remove_credentials(file: &Path, server_url: &str) -> Result<bool, String> {
    let mut content = read_file(file)?;
    if content
        .servers
        .remove(&normalize_server(server_url))
        .is_none()
    {
        return Ok(false);
    }
    write_file(file, &content)?;
    Ok(true)
}

/// `POST /pin/auth`: the pin exchanged for a login (not yet stored).
pub async fn exchange_pin(
    server: &str,
    email: &str,
    client_id: &str,
    pin: &str,
) -> Result<Credentials, String> {
    let remote = anonymous(server)?;
    let issued = remote
        .pin_auth(email, client_id, pin)
        .await
        .map_err(|e| format!("the pin was not accepted: {e}"))?;
    if issued.token.is_empty() {
        return Err("the server answered without a token".into());
    }
    // The expiry is kept as an absolute time: `expires_in` counts from now.
    let expires_at = SystemTime::now() + Duration::from_secs(issued.expires_in);
    let email = match issued.id {
        Some(id) if id.contains('@') => id,
        _ => email.to_string(),
    };
    Ok(Credentials {
        server: normalize_server(server),
        email,
        token: issued.token.into(),
        expires_at,
    })
}

fn anonymous(server: &str) -> Result<RemoteBackend, String> {
    RemoteBackend::new(RemoteConfig::new(&normalize_server(server), "", "")).map_err(|e| e.message)
}

/// Opens `url` in the desktop's browser, when there is a desktop.
fn open_browser(url: &str) {
    let desktop = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !desktop && !cfg!(target_os = "macos") {
        return;
    }
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let spawned = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        log::debug!("cannot run {opener}: {e}");
    }
}

/// The authorization address a server sent, made safe to print and to open
/// ([`super::terminal::web_url`]: a web address, one relative to the server joined to it, with
/// no character that could rewrite the terminal). Anything else is refused (a server could send
/// `file:///etc/passwd` or escape sequences).
fn authorization_url(server: &str, sent: &str) -> Result<String, String> {
    super::terminal::web_url(Some(server), sent)
        .map_err(|e| format!("{server} sent an authorization address that is {e}"))
}

/// Reads the pin from standard input (the terminal, or a pipe).
fn read_pin() -> Result<String, String> {
    let stdin = io::stdin();
    if stdin.is_terminal() {
        eprint!("Pin: ");
        let _ = io::stderr().flush();
    }
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the pin: {e}"))?;
    Ok(line)
}

fn check_pin(pin: &str) -> Result<String, String> {
    let pin = pin.trim();
    if pin.is_empty() || !pin.bytes().all(|c| c.is_ascii_digit()) {
        return Err("the pin is the number shown on the authorization page".into());
    }
    Ok(pin.to_string())
}

/// `vaultfs login`.
pub fn login(args: LoginArgs) -> Result<(), Box<dyn std::error::Error>> {
    let server = normalize_server(&args.server);
    let file = credentials_path();
    let client_id = args.client_id.as_deref().map(str::trim);
    if client_id.is_some_and(str::is_empty) {
        return Err("--client-id cannot be empty".into());
    }
    let client_id = client_id_for(client_id, &super::config::config_path(), &file, &server)?;
    let rt = tokio::runtime::Runtime::new()?;
    let from_env = std::env::var("VAULTFS_PIN").ok().filter(|p| !p.is_empty());
    let pin = match from_env {
        // A pin at hand: straight to the exchange.
        Some(pin) => check_pin(&pin)?,
        None if args.pin_stdin => check_pin(&read_pin()?)?,
        None => {
            let remote = anonymous(&server)?;
            let sent = rt
                .block_on(remote.pin_end(&client_id))
                .map_err(|e| format!("cannot start the login at {server}: {e}"))?;
            let url = authorization_url(&server, &sent)?;
            eprintln!(
                "Open this address, sign in as {} and authorize {client_id}:",
                args.email
            );
            println!("{url}");
            if !args.no_browser {
                open_browser(&url);
            }
            eprintln!("Then enter the pin it shows.");
            check_pin(&read_pin()?)?
        }
    };
    let creds = rt.block_on(exchange_pin(&server, &args.email, &client_id, &pin))?;
    save_login(&file, &creds, Some(&client_id))?;
    eprintln!(
        "Logged in to {server} as {} until {} (stored in {}).",
        creds.email,
        format_time(creds.expires_at),
        file.display()
    );
    Ok(())
}

/// `vaultfs logout`.
pub fn logout(args: LogoutArgs) -> Result<(), Box<dyn std::error::Error>> {
    let server = normalize_server(&args.server);
    let file = credentials_path();
    if remove_credentials(&file, &server)? {
        eprintln!("Logged out of {server}.");
    } else {
        eprintln!("Not logged in to {server}; nothing to do.");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_web_addresses_without_control_characters_are_shown_or_opened() {
        let s = "https://vault.example.com";
        let ok = |u: &str| authorization_url(s, u);
        assert_eq!(
            ok("https://vault.example.com/pin/authorize?client_id=vaultfs").unwrap(),
            "https://vault.example.com/pin/authorize?client_id=vaultfs"
        );
        assert_eq!(
            ok("/pin/authorize?client_id=vaultfs").unwrap(),
            "https://vault.example.com/pin/authorize?client_id=vaultfs"
        );
        assert!(ok("http://other.example/x").is_ok());
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "https://vault.example.com/\u{1b}[2J\u{1b}]0;owned\u{7}",
            "https://vault.example.com/\u{202e}fdp.exe",
            "https://vault.example.com/a\nb",
            "data:text/html,hi",
        ] {
            let e = ok(bad).unwrap_err();
            assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
        }
    }

    fn creds(server: &str, token: &str, expires_at: SystemTime) -> Credentials {
        Credentials {
            server: server.into(),
            email: "a@b.c".into(),
            token: token.into(),
            expires_at,
        }
    }

    #[test]
    fn stores_per_server_privately_and_expires() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("cfg/vaultfs/credentials.toml");
        let later = SystemTime::now() + Duration::from_secs(3600);
        let missing = credentials_in(&file, "http://one").unwrap_err();
        assert!(
            missing.contains("vaultfs login --server http://one"),
            "{missing}"
        );

        save_credentials(&file, &creds("http://one/", "tok-1", later)).unwrap();
        save_credentials(&file, &creds("http://two", "tok-2", later)).unwrap();
        let mode = fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = fs::metadata(file.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        let got = credentials_in(&file, "http://one").unwrap();
        assert_eq!(
            (got.token.expose(), got.server.as_str()),
            ("tok-1", "http://one")
        );
        assert!(!format!("{got:?}").contains("tok-1"));
        // Times round-trip to the second at least.
        let diff = got
            .expires_at
            .duration_since(later)
            .unwrap_or_else(|e| e.duration());
        assert!(diff < Duration::from_secs(1));

        save_credentials(
            &file,
            &creds(
                "http://one",
                "old",
                SystemTime::now() - Duration::from_secs(1),
            ),
        )
        .unwrap();
        let expired = credentials_in(&file, "http://one").unwrap_err();
        assert!(
            expired.contains("expired") && expired.contains("--email a@b.c"),
            "{expired}"
        );

        assert!(remove_credentials(&file, "http://one").unwrap());
        assert!(!remove_credentials(&file, "http://one").unwrap());
        assert!(credentials_in(&file, "http://one").is_err());
        assert_eq!(
            credentials_in(&file, "http://two").unwrap().token.expose(),
            "tok-2"
        );
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["credentials.toml"]);
    }

    #[test]
    fn garbage_file_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("credentials.toml");
        fs::write(&file, "servers = 3\n[[[").unwrap();
        let e = credentials_in(&file, "http://one").unwrap_err();
        assert!(e.contains("not a valid credentials file"), "{e}");
    }

    #[test]
    fn pins_are_digits() {
        assert_eq!(check_pin(" 12345678\n").unwrap(), "12345678");
        assert!(check_pin("12a4").is_err());
        assert!(check_pin("\n").is_err());
    }
}
