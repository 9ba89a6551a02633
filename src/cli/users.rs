//! `vaultfs user ...` and `vaultfs client ...`: operator commands on the server's data directory
//! (safe while the server runs: the database takes concurrent writers).

use std::io::{BufRead, IsTerminal, Write};

use clap::Subcommand;

use super::{DataDir, Database};
use crate::store::{Store, StoreConfig};

#[derive(Subcommand)]
pub enum UserCommand {
    /// Add a user; the password is read from standard input (first line).
    ///
    /// A new account gets a vault "My First Vault".
    Add {
        /// The user's e-mail address (their login)
        email: String,
        /// The account the user belongs to (created if new)
        #[arg(long)]
        account: String,
        #[command(flatten)]
        data: StoreArgs,
    },
    /// List users with their account and number of live tokens.
    List {
        #[command(flatten)]
        data: StoreArgs,
    },
    /// Remove a user, their pins and their tokens (the account's files stay).
    Remove {
        email: String,
        #[command(flatten)]
        data: StoreArgs,
    },
    /// Revoke every token and pin of a user (they must log in again). Their app passwords
    /// stay: `vaultfs user app-password revoke` revokes those.
    Revoke {
        email: String,
        #[command(flatten)]
        data: StoreArgs,
    },
    /// App passwords: one per device of a user's WebDAV clients (docs/webdav.md).
    #[command(subcommand)]
    AppPassword(AppPasswordCommand),
}

#[derive(Subcommand)]
pub enum AppPasswordCommand {
    /// Make an app password for a device; it is shown once.
    Add {
        /// The user's e-mail address
        email: String,
        /// The device, to tell the user's passwords apart ("Anna's Mac")
        name: String,
        #[command(flatten)]
        data: StoreArgs,
    },
    /// List a user's app passwords (names and when last used, never the passwords).
    List {
        email: String,
        #[command(flatten)]
        data: StoreArgs,
    },
    /// Revoke one app password: its device can no longer connect.
    Revoke {
        email: String,
        name: String,
        #[command(flatten)]
        data: StoreArgs,
    },
}

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Register a client ID that may ask for pins.
    Add {
        client_id: String,
        #[command(flatten)]
        data: StoreArgs,
    },
}

type CmdResult = Result<(), Box<dyn std::error::Error>>;

/// The store of a server: its data directory, and its database when that is PostgreSQL.
#[derive(clap::Args)]
pub struct StoreArgs {
    #[command(flatten)]
    data: DataDir,
    #[command(flatten)]
    database: Database,
}

fn open(args: &StoreArgs) -> Result<Store, Box<dyn std::error::Error>> {
    let dir = args.data.path();
    let config = StoreConfig {
        database: args.database.url(),
        ..StoreConfig::default()
    };
    Ok(Store::open(&dir, config)
        .map_err(|e| format!("cannot open the store in {}: {e}", dir.display()))?)
}

pub fn user(cmd: UserCommand) -> CmdResult {
    match cmd {
        UserCommand::Add {
            email,
            account,
            data,
        } => {
            let password = read_password()?;
            open(&data)?.add_user(&email, &account, &password)?;
            println!("added {email} to account {account}");
        }
        UserCommand::List { data } => {
            let users = open(&data)?.list_users()?;
            println!("{:<32} {:<24} {:<10} CREATED", "EMAIL", "ACCOUNT", "TOKENS");
            for u in users {
                let created = crate::api::format_time(crate::api::time::ns_to_time(u.created_on));
                println!(
                    "{:<32} {:<24} {:<10} {}",
                    u.email,
                    u.account,
                    u.active_tokens,
                    &created[..19]
                );
            }
        }
        UserCommand::Remove { email, data } => {
            open(&data)?.remove_user(&email)?;
            println!("removed {email}");
        }
        UserCommand::Revoke { email, data } => {
            let n = open(&data)?.revoke_tokens(&email)?;
            println!("revoked {n} token(s) of {email}, and any pin not yet used");
        }
        UserCommand::AppPassword(cmd) => app_password(cmd)?,
    }
    Ok(())
}

fn app_password(cmd: AppPasswordCommand) -> CmdResult {
    let when = |ns: i64| {
        let t = crate::api::format_time(crate::api::time::ns_to_time(ns));
        t[..19].replace('T', " ")
    };
    match cmd {
        AppPasswordCommand::Add { email, name, data } => {
            let password = open(&data)?.add_app_password(&email, &name)?;
            eprintln!(
                "app password {name:?} of {email}: give it to the device's WebDAV client with \
                 the e-mail address as the user name; it is not shown again"
            );
            println!("{password}");
        }
        AppPasswordCommand::List { email, data } => {
            let list = open(&data)?.list_app_passwords(&email)?;
            println!("{:<32} {:<20} LAST USED", "NAME", "CREATED");
            for p in list {
                println!(
                    "{:<32} {:<20} {}",
                    p.name,
                    when(p.created_on),
                    p.last_used_on.map_or_else(|| "never".to_string(), when)
                );
            }
        }
        AppPasswordCommand::Revoke { email, name, data } => {
            open(&data)?.revoke_app_password(&email, &name)?;
            println!("revoked app password {name:?} of {email}");
        }
    }
    Ok(())
}

pub fn client(cmd: ClientCommand) -> CmdResult {
    match cmd {
        ClientCommand::Add { client_id, data } => {
            open(&data)?.add_client(&client_id)?;
            println!("registered client {client_id}");
        }
    }
    Ok(())
}

/// The first line of standard input; on a terminal, asked for without echo.
fn read_password() -> Result<String, Box<dyn std::error::Error>> {
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    let mut line = String::new();
    if tty {
        eprint!("Password: ");
        std::io::stderr().flush()?;
        let _echo = EchoOff::new();
        stdin.lock().read_line(&mut line)?;
        eprintln!();
    } else {
        stdin.lock().read_line(&mut line)?;
    }
    let pw = line.trim_end_matches(['\r', '\n']).to_string();
    if pw.is_empty() {
        return Err("no password given on standard input".into());
    }
    Ok(pw)
}

/// Turns terminal echo off for as long as it lives.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a zeroed termios they fill in.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return EchoOff(None);
            }
            let saved = t;
            t.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            EchoOff(Some(saved))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(t) = self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, &t);
            }
        }
    }
}
