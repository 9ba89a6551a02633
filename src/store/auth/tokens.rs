//! Delegation tokens and web sessions: 256 random bits, kept only as their sha256; issued,
//! checked (`principal`), and on PostgreSQL remembered for a second once found valid
//! (`TokenCache`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use rand::Rng;
use sha2::{Digest, Sha256};

use super::{IssuedToken, Principal, WEB_SESSION};
use crate::api::{Error, Result};
use crate::store::db::{Conn, OptionalExtension, params};
use crate::store::{Store, now_ns};

/// How long a token found valid is taken at its word, on PostgreSQL only: there a check is a
/// round trip to the database, and an upload makes three requests. A revocation by another
/// process (another server, `vaultfs user revoke`) takes effect within this; one by this
/// process at once; an expiry at its time.
const TOKEN_RECHECK: Duration = Duration::from_secs(1);
/// Tokens remembered at most (past it, those due for a check are forgotten).
const TOKENS_REMEMBERED: usize = 4096;

/// Tokens found valid lately (see [`TOKEN_RECHECK`]), by their hash and the e-mail given with
/// them; and how many times they were all forgotten, so that a check which read a token before
/// a revocation here does not remember it after.
#[derive(Default)]
pub(in crate::store) struct TokenCache(Mutex<(HashMap<TokenKey, Checked>, u64)>);

/// A token's hash, and the e-mail given with it (`None`: a web session).
pub(super) type TokenKey = (Vec<u8>, Option<String>);

struct Checked {
    principal: Principal,
    expires_on: i64,
    at: Instant,
}

impl TokenCache {
    /// The token's user if it was found valid lately; else the generation to remember it in.
    pub(super) fn get(&self, key: &TokenKey) -> std::result::Result<Principal, u64> {
        let cache = crate::sync::relock(&self.0);
        match cache.0.get(key) {
            Some(c) if c.at.elapsed() < TOKEN_RECHECK && c.expires_on > now_ns() => {
                Ok(c.principal.clone())
            }
            _ => Err(cache.1),
        }
    }

    pub(super) fn put(&self, key: TokenKey, p: Principal, expires_on: i64, generation: u64) {
        let mut cache = crate::sync::relock(&self.0);
        let (map, current) = &mut *cache;
        if *current != generation {
            return;
        }
        if map.len() >= TOKENS_REMEMBERED {
            map.retain(|_, c| c.at.elapsed() < TOKEN_RECHECK);
        }
        if map.len() < TOKENS_REMEMBERED {
            let at = Instant::now();
            map.insert(
                key,
                Checked {
                    principal: p,
                    expires_on,
                    at,
                },
            );
        }
    }

    /// After a revocation here: every token is checked again.
    pub(super) fn forget(&self) {
        let mut cache = crate::sync::relock(&self.0);
        cache.0.clear();
        cache.1 += 1;
    }
}

/// 256 random bits, URL-safe base64: a delegation token or a web session.
fn new_token() -> String {
    let mut raw = [0u8; 32];
    rand::rng().fill(&mut raw);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

pub(super) fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new token of `user_id` for `client_id`, valid for `ttl`: stored as its hash, returned with
/// the user's e-mail as stored.
pub(super) fn issue_token(
    conn: &Conn,
    user_id: i64,
    client_id: &str,
    ttl: Duration,
) -> Result<IssuedToken> {
    let token = new_token();
    let now = now_ns();
    conn.execute(
        "INSERT INTO tokens (hash, user_id, client_id, created_on, expires_on) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![token_hash(&token), user_id, client_id, now, now + ttl.as_nanos() as i64],
    )?;
    let email = conn.query_row("SELECT email FROM users WHERE id = ?1", [user_id], |r| {
        r.get(0)
    })?;
    Ok(IssuedToken {
        token,
        expires_in: ttl,
        email,
    })
}

impl Store {
    /// Checks `email:token` from the Authorization header. Web sessions are not API tokens.
    pub fn authenticate(&self, email: &str, token: &str) -> Result<Principal> {
        self.principal(token, Some(email))
    }

    /// [`Store::authenticate`] when the answer is remembered (PostgreSQL, see
    /// [`TOKEN_RECHECK`]): no database, no blocking, so a server can ask from async code
    /// before handing the check to a blocking thread.
    pub fn remembered(&self, email: &str, token: &str) -> Option<Principal> {
        if !self.db.is_pg() || email.contains(char::is_whitespace) {
            return None;
        }
        self.tokens
            .get(&(token_hash(token), Some(email.to_string())))
            .ok()
    }

    /// The user of a live token: a delegation token of `email` (`Some`), or a web session
    /// (`None`).
    pub(super) fn principal(&self, token: &str, email: Option<&str>) -> Result<Principal> {
        // No e-mail has a space; the key of a remembered app password has one
        // (`app_password_key`), and must never be taken for a token's.
        if email.is_some_and(|e| e.contains(char::is_whitespace)) {
            return Err(Error::auth(
                "invalid_token",
                "the token is not valid for this user",
            ));
        }
        let key = (token_hash(token), email.map(str::to_string));
        let generation = if self.db.is_pg() {
            match self.tokens.get(&key) {
                Ok(p) => return Ok(p),
                Err(generation) => Some(generation),
            }
        } else {
            None
        };
        let conn = self.conn()?;
        let row: Option<(i64, String, i64, i64, i64)> = conn
            .prepare_cached(
                "SELECT u.id, u.email, u.account_id, t.expires_on, t.revoked
                 FROM tokens t JOIN users u ON u.id = t.user_id
                 WHERE t.hash = ?1 AND (t.client_id = ?3) = (CAST(?2 AS TEXT) IS NULL)
                   AND (CAST(?2 AS TEXT) IS NULL OR u.email = ?2)",
            )?
            .query_row(params![key.0, email, WEB_SESSION], |r| {
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
            Some((user_id, email, account_id, expires_on, _)) => {
                let p = Principal {
                    user_id,
                    email,
                    account_id,
                };
                if let Some(generation) = generation {
                    self.tokens.put(key, p.clone(), expires_on, generation);
                }
                Ok(p)
            }
        }
    }

    /// Test and operator hook: makes every token of a user expire now.
    pub fn expire_tokens(&self, email: &str) -> Result<usize> {
        let conn = self.lock()?;
        let n = conn.execute(
            "UPDATE tokens SET expires_on = ?2 WHERE user_id = (SELECT id FROM users WHERE email = ?1)",
            params![email, now_ns()],
        )?;
        self.tokens.forget();
        Ok(n)
    }
}
