//! Users, registered clients, pins and delegation tokens of `vaultfs serve` (docs/design.md §2).
//!
//! Passwords are argon2id hashes; tokens are 256 random bits kept only as their sha256; pins are
//! kept as a keyed hash (HMAC-SHA256 under `pin.key`, a file of the data dir, so a copy of the
//! database alone cannot be searched for them), are used once and expire. Failed sign-ins and
//! pin exchanges are counted per e-mail address (known or not) and source address (an IPv6
//! one by its /64, `server::proxy`), before the check runs: five lock that pair out with a
//! doubling backoff, which an attacker cannot aim at someone else's sign-in. Twenty from all
//! sources together slow the e-mail for every source it was not signed into from before: they
//! share one attempt at a time, further and further apart, so rotating addresses gains little,
//! while the owner's own machines are never held back by failures elsewhere.
//!
//! By concern, each file over those below it: `tokens.rs` (tokens and web sessions, and those
//! found valid lately) and `lockout.rs` (the counting of failed attempts) at the bottom;
//! `sign_in.rs` (passwords, pins, web sessions) and `app_passwords.rs` (WebDAV's devices and
//! its Basic authentication) over them. This file holds the users and clients, and the types
//! and names the others share.

mod app_passwords;
mod lockout;
mod sign_in;
mod tokens;

use std::time::Duration;

use super::db::{OptionalExtension, params};
use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, SaltString};

use super::{Store, nodes, now_ns};
use crate::api::{Error, Result};
pub use app_passwords::{APP_PASSWORD_USE_RECORDED, AppPassword, dav_device};
pub(super) use tokens::TokenCache;

/// The client ID that is always registered; the vaultfs CLI uses it.
pub const DEFAULT_CLIENT: &str = "vaultfs";
/// The client ID of web sessions' tokens (the web interface's sign-in). It has a space, which
/// `vaultfs client add` refuses, so no application can be registered under it and get pins
/// for it; and the API refuses its tokens.
pub const WEB_SESSION: &str = "web session";
/// How long a web session lasts after its sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: i64,
    pub email: String,
    pub account_id: i64,
}

#[derive(Debug, Clone)]
pub struct UserInfo {
    pub email: String,
    pub account: String,
    pub created_on: i64,
    pub active_tokens: i64,
}

/// A token handed out by a pin exchange.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: String,
    pub expires_in: Duration,
    pub email: String,
}

fn validate_email(email: &str) -> Result<()> {
    let ok = email.len() <= 254
        && email
            .split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty())
        && !email
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ':');
    if ok {
        Ok(())
    } else {
        Err(Error::bad_request(
            "bad_email",
            format!("`{email}` is not an e-mail address"),
        ))
    }
}

impl Store {
    /// Adds a user to an account (created with its first vault if new).
    pub fn add_user(&self, email: &str, account: &str, password: &str) -> Result<()> {
        validate_email(email)?;
        crate::api::path::validate_name(account)?;
        if password.is_empty() {
            return Err(Error::bad_request("bad_password", "the password is empty"));
        }
        let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
        let hash = Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map_err(|e| Error::internal(format!("password hashing failed: {e}")))?
            .to_string();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        if tx
            .prepare("SELECT 1 FROM users WHERE email = ?1")?
            .exists([email])?
        {
            return Err(Error::conflict(
                "exists",
                format!("user {email} already exists"),
            ));
        }
        let account_id = nodes::ensure_account(&tx, account)?;
        tx.execute(
            "INSERT INTO users (email, account_id, password_hash, created_on) VALUES (?1, ?2, ?3, ?4)",
            params![email, account_id, hash, now_ns()],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn list_users(&self) -> Result<Vec<UserInfo>> {
        let conn = self.lock()?;
        let now = now_ns();
        let mut stmt = conn.prepare(
            "SELECT u.email, a.name, u.created_on,
                    (SELECT count(*) FROM tokens t WHERE t.user_id = u.id AND t.revoked = 0 AND t.expires_on > ?1)
             FROM users u JOIN nodes a ON a.id = u.account_id ORDER BY u.email",
        )?;
        let users = stmt
            .query_map([now], |r| {
                Ok(UserInfo {
                    email: r.get(0)?,
                    account: r.get(1)?,
                    created_on: r.get(2)?,
                    active_tokens: r.get(3)?,
                })
            })?
            .collect::<super::db::Result<_>>()?;
        Ok(users)
    }

    /// Removes a user with their pins and tokens; the account and its files stay.
    pub fn remove_user(&self, email: &str) -> Result<()> {
        let conn = self.lock()?;
        let removed = conn.execute("DELETE FROM users WHERE email = ?1", [email])?;
        // Once committed: a check in between would remember the token as it was.
        self.tokens.forget();
        if removed == 0 {
            return Err(Error::not_found(format!("no user {email}")));
        }
        Ok(())
    }

    /// Revokes every token and pin of a user; returns how many tokens were live.
    pub fn revoke_tokens(&self, email: &str) -> Result<usize> {
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let user: i64 = tx
            .query_row("SELECT id FROM users WHERE email = ?1", [email], |r| {
                r.get(0)
            })
            .optional()?
            .ok_or_else(|| Error::not_found(format!("no user {email}")))?;
        let n = tx.execute(
            "UPDATE tokens SET revoked = 1 WHERE user_id = ?1 AND revoked = 0",
            [user],
        )?;
        // A pin not yet exchanged would otherwise give a new token after the revocation.
        tx.execute("DELETE FROM pins WHERE user_id = ?1", [user])?;
        tx.commit()?;
        self.tokens.forget();
        Ok(n)
    }

    pub fn add_client(&self, client_id: &str) -> Result<()> {
        if client_id.is_empty()
            || client_id.len() > 128
            || client_id
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Error::bad_request(
                "bad_client_id",
                "a client ID is 1 to 128 printable characters",
            ));
        }
        let conn = self.lock()?;
        conn.execute(
            "INSERT INTO clients (client_id, created_on) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![client_id, now_ns()],
        )?;
        Ok(())
    }

    pub fn client_exists(&self, client_id: &str) -> Result<bool> {
        let conn = self.lock()?;
        Ok(conn
            .prepare_cached("SELECT 1 FROM clients WHERE client_id = ?1")?
            .exists([client_id])?)
    }

    fn require_client(&self, client_id: &str) -> Result<()> {
        if self.client_exists(client_id)? {
            Ok(())
        } else {
            Err(Error::bad_request(
                "unknown_client",
                format!("client `{client_id}` is not registered"),
            ))
        }
    }
}
