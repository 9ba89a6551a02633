//! App passwords, one per device for WebDAV clients (`vaultfs user app-password`), kept as
//! their sha256 like tokens; and WebDAV's Basic authentication, which takes one or a token, and
//! the device either is (`store::seen`).

use std::time::Duration;

use rand::Rng;

use super::Principal;
use super::lockout::{Attempt, must_wait};
use super::tokens::{TokenKey, token_hash};
use crate::api::{Error, ErrorKind, Result};
use crate::store::db::{OptionalExtension, params};
use crate::store::seen::Device;
use crate::store::{Store, now_ns};

/// A new app password: 24 characters of an alphabet without look-alikes (no 0/o, 1/l/i), in
/// groups of six to be typed on a phone: 4.9 bits each, 118 bits in all, so (like tokens) it is
/// kept as its sha256, not an argon2 hash, and guessing it is hopeless.
fn new_app_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..4)
        .map(|_| {
            (0..6)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// Where an app password found valid is remembered among the tokens: apart from the tokens
/// of the same e-mail (an e-mail has no space), so that the API never takes it for a token.
fn app_password_key(hash: &[u8], email: &str) -> TokenKey {
    (hash.to_vec(), Some(format!("app-password {email}")))
}

/// The WebDAV device that signs in with `secret`, an app password or a token (`store::seen`):
/// keyed as `app_passwords` and `tokens` key the secret, so that it goes with its revocation.
pub fn dav_device(secret: &str) -> Device {
    Device::of_hash(token_hash(secret))
}

/// An app password as `vaultfs user app-password list` shows it (never the password).
#[derive(Debug, Clone)]
pub struct AppPassword {
    pub name: String,
    pub created_on: i64,
    /// Last used, to within [`APP_PASSWORD_USE_RECORDED`].
    pub last_used_on: Option<i64>,
}

/// How stale an app password's `last_used_on` may be before a use writes it again (a write per
/// WebDAV request would be one per request).
pub const APP_PASSWORD_USE_RECORDED: Duration = Duration::from_secs(3600);

impl Store {
    /// Makes an app password named `name` (the device) for `email`'s WebDAV clients: shown
    /// once (returned here), kept as its sha256. A name the user has already is 409.
    pub fn add_app_password(&self, email: &str, name: &str) -> Result<String> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
            return Err(Error::bad_request(
                "bad_name",
                "an app password's name is 1 to 100 characters, without control characters",
            ));
        }
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let user_id: i64 = tx
            .query_row("SELECT id FROM users WHERE email = ?1", [email], |r| {
                r.get(0)
            })
            .optional()?
            .ok_or_else(|| Error::not_found(format!("no user {email}")))?;
        let taken = tx
            .prepare_cached("SELECT 1 FROM app_passwords WHERE user_id = ?1 AND name = ?2")?
            .exists(params![user_id, name])?;
        if taken {
            return Err(Error::conflict(
                "exists",
                format!("{email} has an app password named {name:?} already"),
            ));
        }
        let password = new_app_password();
        tx.execute(
            "INSERT INTO app_passwords (hash, user_id, name, created_on) VALUES (?1, ?2, ?3, ?4)",
            params![token_hash(&password), user_id, name, now_ns()],
        )?;
        tx.commit()?;
        Ok(password)
    }

    /// `email`'s app passwords, by name.
    pub fn list_app_passwords(&self, email: &str) -> Result<Vec<AppPassword>> {
        let conn = self.conn()?;
        let user: Option<i64> = conn
            .query_row("SELECT id FROM users WHERE email = ?1", [email], |r| {
                r.get(0)
            })
            .optional()?;
        let user = user.ok_or_else(|| Error::not_found(format!("no user {email}")))?;
        let rows = conn
            .prepare_cached(
                "SELECT name, created_on, last_used_on FROM app_passwords WHERE user_id = ?1
                 ORDER BY name",
            )?
            .query_map([user], |r| {
                Ok(AppPassword {
                    name: r.get(0)?,
                    created_on: r.get(1)?,
                    last_used_on: r.get(2)?,
                })
            })?
            .collect::<crate::store::db::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Revokes `email`'s app password `name`: its device must be given a new one.
    pub fn revoke_app_password(&self, email: &str, name: &str) -> Result<()> {
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        let hashes: Vec<Vec<u8>> = tx
            .prepare(
                "DELETE FROM app_passwords WHERE name = ?2
                 AND user_id = (SELECT id FROM users WHERE email = ?1) RETURNING hash",
            )?
            .query_map(params![email, name.trim()], |r| r.get(0))?
            .collect::<crate::store::db::Result<_>>()?;
        if hashes.is_empty() {
            return Err(Error::not_found(format!(
                "{email} has no app password named {name:?}"
            )));
        }
        // What its device was shown goes with it.
        crate::store::seen::forget_devices(&tx, &hashes)?;
        tx.commit()?;
        // Remembered app passwords (PostgreSQL) are checked again: gone at once here, within
        // TOKEN_RECHECK at the other servers.
        self.tokens.forget();
        Ok(())
    }

    /// WebDAV's `Authorization: Basic email:secret` from `source` (the client's address), the
    /// secret a token of the API or an app password, under the lockout of sign-ins (its own
    /// count, `webdav`): 429 while the pair waits; a failure counted. A source with no failure
    /// writes nothing (every WebDAV request carries the header).
    pub fn authenticate_dav(&self, email: &str, secret: &str, source: &str) -> Result<Principal> {
        let lower = email.to_lowercase();
        let failures = {
            let conn = self.conn()?;
            must_wait(&conn, &lower, source, Attempt::Dav, now_ns())?
        };
        let found = match self.principal(secret, Some(email)) {
            Ok(p) => Ok(p),
            Err(e) if e.kind == ErrorKind::Auth => match self.app_password_user(email, secret)? {
                Some(p) => Ok(p),
                None => Err(e),
            },
            Err(e) => return Err(e),
        };
        match found {
            Ok(p) => {
                if failures > 0 {
                    self.attempt_succeeded(email, source, Attempt::Dav)?;
                }
                Ok(p)
            }
            Err(e) => {
                // Counted; 429 instead when the pair must wait already.
                self.begin_attempt(email, source, Attempt::Dav)?;
                Err(match &*e.code {
                    "token_expired" => e,
                    _ => Error::auth(
                        "invalid_credentials",
                        "wrong e-mail address, token or app password",
                    ),
                })
            }
        }
    }

    /// The user of an app password, its use recorded (at most once per
    /// [`APP_PASSWORD_USE_RECORDED`]).
    fn app_password_user(&self, email: &str, secret: &str) -> Result<Option<Principal>> {
        let hash = token_hash(secret);
        // On PostgreSQL remembered as a token is (TOKEN_RECHECK), so that the next requests of
        // the device ask the database nothing; read before the row, so that a revocation in
        // between is not remembered over.
        let key = app_password_key(&hash, email);
        let generation = match self.db.is_pg().then(|| self.tokens.get(&key)) {
            Some(Ok(p)) => return Ok(Some(p)),
            Some(Err(generation)) => Some(generation),
            None => None,
        };
        let row: Option<(i64, String, i64, Option<i64>)> = self
            .conn()?
            .prepare_cached(
                "SELECT u.id, u.email, u.account_id, a.last_used_on
                 FROM app_passwords a JOIN users u ON u.id = a.user_id
                 WHERE a.hash = ?1 AND u.email = ?2",
            )?
            .query_row(params![hash, email], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()?;
        let Some((user_id, email, account_id, used)) = row else {
            return Ok(None);
        };
        let now = now_ns();
        if used.is_none_or(|t| t < now - APP_PASSWORD_USE_RECORDED.as_nanos() as i64) {
            self.lock()?.execute(
                "UPDATE app_passwords SET last_used_on = ?2 WHERE hash = ?1",
                params![hash, now],
            )?;
        }
        let p = Principal {
            user_id,
            email,
            account_id,
        };
        if let Some(generation) = generation {
            self.tokens.put(key, p.clone(), i64::MAX, generation);
        }
        Ok(Some(p))
    }

    /// [`Store::authenticate_dav`] when the answer is remembered (PostgreSQL): a token, or an
    /// app password (remembered apart, so that the API's [`Store::remembered`] never takes
    /// one).
    pub fn remembered_dav(&self, email: &str, secret: &str) -> Option<Principal> {
        if !self.db.is_pg() || email.contains(char::is_whitespace) {
            return None;
        }
        let hash = token_hash(secret);
        self.tokens
            .get(&app_password_key(&hash, email))
            .or_else(|_| self.tokens.get(&(hash, Some(email.to_string()))))
            .ok()
    }
}
