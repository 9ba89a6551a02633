//! Users, registered clients, pins and delegation tokens of `vaultfs serve` (DESIGN.md §2).
//!
//! Passwords are argon2id hashes; tokens are 256 random bits kept only as their sha256; five
//! failures in fifteen minutes lock a user's pin exchange (or sign-in) with 429.

use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use rand::Rng;
use rusqlite::{OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::{Store, nodes, now_ns};
use crate::api::{Error, ErrorKind, Result};

/// The client ID that is always registered; the vaultfs CLI uses it.
pub const DEFAULT_CLIENT: &str = "vaultfs";
const MAX_FAILURES: i64 = 5;
const FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);

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

#[derive(Clone, Copy)]
enum Attempt {
    Pin,
    Password,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Attempt::Pin => "pin",
            Attempt::Password => "password",
        }
    }
}

/// A hash of a password nobody has, with the parameters of real ones: what an unknown e-mail's
/// password is checked against.
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
        let mut secret = [0u8; 32];
        rand::rng().fill(&mut secret);
        Argon2::default()
            .hash_password(&secret, &salt)
            .map(|h| h.to_string())
            .unwrap_or_default()
    })
}

fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
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
        let mut conn = self.lock();
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
        let conn = self.lock();
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
            .collect::<rusqlite::Result<_>>()?;
        Ok(users)
    }

    /// Removes a user with their pins and tokens; the account and its files stay.
    pub fn remove_user(&self, email: &str) -> Result<()> {
        let conn = self.lock();
        if conn.execute("DELETE FROM users WHERE email = ?1", [email])? == 0 {
            return Err(Error::not_found(format!("no user {email}")));
        }
        Ok(())
    }

    /// Revokes every token of a user; returns how many were live.
    pub fn revoke_tokens(&self, email: &str) -> Result<usize> {
        let conn = self.lock();
        let user: i64 = conn
            .query_row("SELECT id FROM users WHERE email = ?1", [email], |r| {
                r.get(0)
            })
            .optional()?
            .ok_or_else(|| Error::not_found(format!("no user {email}")))?;
        Ok(conn.execute(
            "UPDATE tokens SET revoked = 1 WHERE user_id = ?1 AND revoked = 0",
            [user],
        )?)
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
        let conn = self.lock();
        conn.execute(
            "INSERT OR IGNORE INTO clients (client_id, created_on) VALUES (?1, ?2)",
            params![client_id, now_ns()],
        )?;
        Ok(())
    }

    pub fn client_exists(&self, client_id: &str) -> Result<bool> {
        let conn = self.lock();
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

    /// 429 once a user has too many recent failures of this kind.
    fn check_lockout(&self, user_id: i64, kind: Attempt) -> Result<()> {
        let conn = self.lock();
        let since = now_ns() - FAILURE_WINDOW.as_nanos() as i64;
        let n: i64 = conn.query_row(
            "SELECT count(*) FROM auth_failures WHERE user_id = ?1 AND kind = ?2 AND at > ?3",
            params![user_id, kind.as_str(), since],
            |r| r.get(0),
        )?;
        if n >= MAX_FAILURES {
            return Err(Error::new(
                ErrorKind::TooManyRequests,
                "too_many_attempts",
                "too many failed attempts; try again in 15 minutes",
            ));
        }
        Ok(())
    }

    fn record_failure(&self, user_id: i64, kind: Attempt) -> Result<()> {
        let conn = self.lock();
        conn.execute(
            "INSERT INTO auth_failures (user_id, kind, at) VALUES (?1, ?2, ?3)",
            params![user_id, kind.as_str(), now_ns()],
        )?;
        Ok(())
    }

    fn clear_failures(&self, user_id: i64, kind: Attempt) -> Result<()> {
        let conn = self.lock();
        conn.execute(
            "DELETE FROM auth_failures WHERE user_id = ?1 AND kind = ?2",
            params![user_id, kind.as_str()],
        )?;
        Ok(())
    }

    fn user_by_email(&self, email: &str) -> Result<Option<(i64, String)>> {
        let conn = self.lock();
        Ok(conn
            .query_row(
                "SELECT id, password_hash FROM users WHERE email = ?1",
                [email],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// The sign-in of the authorization page: returns the user's pin for `client_id`, created on
    /// first use. The argon2 check runs without the store's lock held.
    pub fn sign_in_for_pin(&self, email: &str, password: &str, client_id: &str) -> Result<String> {
        self.require_client(client_id)?;
        let bad = || Error::auth("invalid_credentials", "wrong e-mail address or password");
        let Some((user_id, hash)) = self.user_by_email(email)? else {
            // The same check against a dummy hash: the same cost (and memory) as a real one, so
            // timing does not tell which e-mails exist.
            if let Ok(dummy) = PasswordHash::new(dummy_hash()) {
                let _ = Argon2::default().verify_password(password.as_bytes(), &dummy);
            }
            return Err(bad());
        };
        self.check_lockout(user_id, Attempt::Password)?;
        let parsed = PasswordHash::new(&hash)
            .map_err(|e| Error::internal(format!("stored hash unreadable: {e}")))?;
        if Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_err()
        {
            self.record_failure(user_id, Attempt::Password)?;
            return Err(bad());
        }
        self.clear_failures(user_id, Attempt::Password)?;
        let conn = self.lock();
        let existing: Option<String> = conn
            .query_row(
                "SELECT pin FROM pins WHERE user_id = ?1 AND client_id = ?2",
                params![user_id, client_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(pin) = existing {
            return Ok(pin);
        }
        // Eight digits without a leading zero, so it survives being sent as a JSON number.
        let pin = rand::rng()
            .random_range(10_000_000u32..100_000_000)
            .to_string();
        conn.execute(
            "INSERT INTO pins (user_id, client_id, pin, created_on) VALUES (?1, ?2, ?3, ?4)",
            params![user_id, client_id, pin, now_ns()],
        )?;
        Ok(pin)
    }

    /// `/pin/auth`: exchanges a pin for a delegation token.
    pub fn exchange_pin(&self, email: &str, client_id: &str, pin: &str) -> Result<IssuedToken> {
        self.require_client(client_id)?;
        let invalid = || Error::auth("invalid_pin", "wrong pin for this user and client");
        let Some((user_id, _)) = self.user_by_email(email)? else {
            return Err(invalid());
        };
        self.check_lockout(user_id, Attempt::Pin)?;
        let stored: Option<String> = {
            let conn = self.lock();
            conn.query_row(
                "SELECT pin FROM pins WHERE user_id = ?1 AND client_id = ?2",
                params![user_id, client_id],
                |r| r.get(0),
            )
            .optional()?
        };
        if stored.as_deref() != Some(pin.trim()) {
            self.record_failure(user_id, Attempt::Pin)?;
            return Err(invalid());
        }
        self.clear_failures(user_id, Attempt::Pin)?;
        let mut raw = [0u8; 32];
        rand::rng().fill(&mut raw);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let ttl = self.config.token_ttl;
        let now = now_ns();
        let conn = self.lock();
        conn.execute(
            "INSERT INTO tokens (hash, user_id, client_id, created_on, expires_on) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![token_hash(&token), user_id, client_id, now, now + ttl.as_nanos() as i64],
        )?;
        let email: String =
            conn.query_row("SELECT email FROM users WHERE id = ?1", [user_id], |r| {
                r.get(0)
            })?;
        Ok(IssuedToken {
            token,
            expires_in: ttl,
            email,
        })
    }

    /// Checks `email:token` from the Authorization header.
    pub fn authenticate(&self, email: &str, token: &str) -> Result<Principal> {
        let conn = self.lock();
        let row: Option<(i64, String, i64, i64, i64)> = conn
            .prepare_cached(
                "SELECT u.id, u.email, u.account_id, t.expires_on, t.revoked
                 FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.hash = ?1 AND u.email = ?2",
            )?
            .query_row(params![token_hash(token), email], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()?;
        match row {
            None => Err(Error::auth(
                "invalid_token",
                "the token is not valid for this user",
            )),
            Some((_, _, _, _, revoked)) if revoked != 0 => {
                Err(Error::auth("invalid_token", "the token was revoked"))
            }
            Some((_, _, _, expires, _)) if expires <= now_ns() => {
                Err(Error::auth("token_expired", "the token has expired"))
            }
            Some((user_id, email, account_id, _, _)) => Ok(Principal {
                user_id,
                email,
                account_id,
            }),
        }
    }

    /// Test and operator hook: makes every token of a user expire now.
    pub fn expire_tokens(&self, email: &str) -> Result<usize> {
        let conn = self.lock();
        Ok(conn.execute(
            "UPDATE tokens SET expires_on = ?2 WHERE user_id = (SELECT id FROM users WHERE email = ?1)",
            params![email, now_ns()],
        )?)
    }
}
