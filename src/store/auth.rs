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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::db::{OptionalExtension, params};
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use rand::Rng;
use sha2::{Digest, Sha256};

use super::{Store, nodes, now_ns};
use crate::api::{Error, ErrorKind, Result};

/// The client ID that is always registered; the vaultfs CLI uses it.
pub const DEFAULT_CLIENT: &str = "vaultfs";
/// The client ID of web sessions' tokens (the web interface's sign-in). It has a space, which
/// `vaultfs client add` refuses, so no application can be registered under it and get pins
/// for it; and the API refuses its tokens.
pub const WEB_SESSION: &str = "web session";
/// How long a web session lasts after its sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Failures of one (e-mail, source) pair before it must wait.
const MAX_FAILURES: i64 = 5;
/// The wait after the fifth failure; it doubles with each further one, up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// Failures older than this are forgotten.
const FAILURE_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Failures for one e-mail from all sources together (within the window) before the account is
/// slowed: from then on, sources it has not been signed into from share one attempt at a time,
/// spaced by [`ACCOUNT_FIRST_SPACING`] doubling with each further failure up to
/// [`ACCOUNT_MAX_SPACING`] (some 110 guesses a day, however many addresses an attacker has).
const ACCOUNT_FAILURES: i64 = 20;
const ACCOUNT_FIRST_SPACING: Duration = Duration::from_secs(60);
const ACCOUNT_MAX_SPACING: Duration = Duration::from_secs(15 * 60);
/// A source a sign-in or pin exchange succeeded from stays known to that e-mail this long:
/// failures from elsewhere never slow it (the owner's own machines stay open under attack).
const KNOWN_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);
/// The `kind` of the rows that record a source known to an e-mail.
const KNOWN: &str = "known";
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
pub(super) struct TokenCache(Mutex<(HashMap<TokenKey, Checked>, u64)>);

/// A token's hash, and the e-mail given with it (`None`: a web session).
type TokenKey = (Vec<u8>, Option<String>);

struct Checked {
    principal: Principal,
    expires_on: i64,
    at: Instant,
}

impl TokenCache {
    /// The token's user if it was found valid lately; else the generation to remember it in.
    fn get(&self, key: &TokenKey) -> std::result::Result<Principal, u64> {
        let cache = crate::sync::relock(&self.0);
        match cache.0.get(key) {
            Some(c) if c.at.elapsed() < TOKEN_RECHECK && c.expires_on > now_ns() => {
                Ok(c.principal.clone())
            }
            _ => Err(cache.1),
        }
    }

    fn put(&self, key: TokenKey, p: Principal, expires_on: i64, generation: u64) {
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
    fn forget(&self) {
        let mut cache = crate::sync::relock(&self.0);
        cache.0.clear();
        cache.1 += 1;
    }
}

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
    /// WebDAV's Basic authentication (a token or an app password, `server::dav`).
    Dav,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Attempt::Pin => "pin",
            Attempt::Password => "password",
            Attempt::Dav => "webdav",
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

/// 256 random bits, URL-safe base64: a delegation token or a web session.
fn new_token() -> String {
    let mut raw = [0u8; 32];
    rand::rng().fill(&mut raw);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new token of `user_id` for `client_id`, valid for `ttl`: stored as its hash, returned with
/// the user's e-mail as stored.
fn issue_token(
    conn: &super::db::Conn,
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

/// HMAC-SHA256 (RFC 2104) of `msg` under `key` (at most one block long).
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let pad = |byte: u8| {
        let mut p = [byte; 64];
        p.iter_mut().zip(key).for_each(|(p, k)| *p ^= k);
        p
    };
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The stored form of a pin: keyed, and bound to its user and client.
fn pin_hash(key: &[u8; 32], user_id: i64, client_id: &str, pin: &str) -> Vec<u8> {
    hmac_sha256(key, format!("{user_id}\0{client_id}\0{pin}").as_bytes()).to_vec()
}

/// Equality that takes as long whatever the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The wait imposed after `failures` recent failures of one (e-mail, source) pair.
fn backoff(failures: i64) -> Duration {
    if failures < MAX_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - MAX_FAILURES).min(16) as u32;
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// The spacing of attempts from unknown sources after `failures` failures of one e-mail from
/// all sources.
fn account_spacing(failures: i64) -> Duration {
    if failures < ACCOUNT_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - ACCOUNT_FAILURES).min(16) as u32;
    (ACCOUNT_FIRST_SPACING * 2u32.pow(doublings)).min(ACCOUNT_MAX_SPACING)
}

/// 429 `too_many_attempts` until `until` (ns).
fn wait_error(until: i64, now: i64) -> Error {
    let minutes = (until - now + 59_999_999_999) / 60_000_000_000;
    Error::new(
        ErrorKind::TooManyRequests,
        "too_many_attempts",
        format!("too many failed attempts; try again in {minutes} minute(s)"),
    )
}

/// 429 while `source` must wait before trying `email` again with `kind` (its backoff, or the
/// e-mail's spacing for sources it was never signed into from); else the pair's failures
/// within the window. Reads only.
fn must_wait(
    conn: &super::db::Conn,
    email: &str,
    source: &str,
    kind: Attempt,
    now: i64,
) -> Result<i64> {
    let since = now - FAILURE_WINDOW.as_nanos() as i64;
    let (failures, last): (i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT count(*), max(at) FROM auth_attempts
             WHERE email = ?1 AND source = ?2 AND kind = ?3 AND at > ?4",
        )?
        .query_row(params![email, source, kind.as_str(), since], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let wait_until = last.unwrap_or(0) + backoff(failures).as_nanos() as i64;
    if failures >= MAX_FAILURES && wait_until > now {
        return Err(wait_error(wait_until, now));
    }
    let known = conn
        .prepare_cached(
            "SELECT 1 FROM auth_attempts WHERE email = ?1 AND source = ?2 AND kind = ?3",
        )?
        .exists(params![email, source, KNOWN])?;
    if !known {
        let (n, last): (i64, Option<i64>) = conn
            .prepare_cached(
                "SELECT count(*), max(at) FROM auth_attempts
                 WHERE email = ?1 AND kind = ?2 AND at > ?3",
            )?
            .query_row(params![email, kind.as_str(), since], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        let wait_until = last.unwrap_or(0) + account_spacing(n).as_nanos() as i64;
        if n >= ACCOUNT_FAILURES && wait_until > now {
            return Err(wait_error(wait_until, now));
        }
    }
    Ok(failures)
}

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

    /// Counts an attempt of `kind` by `source` for `email` before it is checked, atomically (the
    /// store's lock): 429 while the pair waits out its backoff, or while the e-mail, over its
    /// failures from all sources, is slowed for sources it was never signed into from;
    /// otherwise the attempt is counted as a failure until [`Store::attempt_succeeded`] clears
    /// the pair's count. So concurrent attempts cannot all be checked before the first failures
    /// are seen.
    fn begin_attempt(&self, email: &str, source: &str, kind: Attempt) -> Result<()> {
        let conn = self.lock()?;
        let now = now_ns();
        let email = email.to_lowercase();
        let since = now - FAILURE_WINDOW.as_nanos() as i64;
        // Old rows of this e-mail go as it is tried, so none lingers past its use.
        conn.prepare_cached(
            "DELETE FROM auth_attempts WHERE email = ?1
             AND ((kind <> ?2 AND at <= ?3) OR at <= ?4)",
        )?
        .execute(params![
            email,
            KNOWN,
            since,
            now - KNOWN_WINDOW.as_nanos() as i64
        ])?;
        must_wait(&conn, &email, source, kind, now)?;
        conn.prepare_cached(
            "INSERT INTO auth_attempts (email, source, kind, at) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![email, source, kind.as_str(), now])?;
        Ok(())
    }

    /// The attempt begun by [`Store::begin_attempt`] was right: the pair starts afresh, and the
    /// source is known to the e-mail from now on.
    fn attempt_succeeded(&self, email: &str, source: &str, kind: Attempt) -> Result<()> {
        let conn = self.lock()?;
        let email = email.to_lowercase();
        conn.execute(
            "DELETE FROM auth_attempts WHERE email = ?1 AND source = ?2 AND kind IN (?3, ?4)",
            params![email, source, kind.as_str(), KNOWN],
        )?;
        conn.execute(
            "INSERT INTO auth_attempts (email, source, kind, at) VALUES (?1, ?2, ?3, ?4)",
            params![email, source, KNOWN, now_ns()],
        )?;
        Ok(())
    }

    fn user_by_email(&self, email: &str) -> Result<Option<(i64, String)>> {
        let conn = self.lock()?;
        Ok(conn
            .query_row(
                "SELECT id, password_hash FROM users WHERE email = ?1",
                [email],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// Checks `email`'s password for a sign-in from `source` (the client's address), with the
    /// lockout of failed attempts: the user's ID when it is right. The argon2 check runs without
    /// the store's lock held. The authorization page and the web interface both sign in here.
    fn check_password(&self, email: &str, password: &str, source: &str) -> Result<i64> {
        let bad = || Error::auth("invalid_credentials", "wrong e-mail address or password");
        // Counted before the check, for known and unknown e-mails alike: the answers do not
        // tell which exist.
        self.begin_attempt(email, source, Attempt::Password)?;
        let Some((user_id, hash)) = self.user_by_email(email)? else {
            // The same check against a dummy hash: the same cost (and memory) as a real one, so
            // timing does not tell which e-mails exist.
            if let Ok(dummy) = PasswordHash::new(dummy_hash()) {
                let _ = Argon2::default().verify_password(password.as_bytes(), &dummy);
            }
            return Err(bad());
        };
        let parsed = PasswordHash::new(&hash)
            .map_err(|e| Error::internal(format!("stored hash unreadable: {e}")))?;
        if Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_err()
        {
            return Err(bad());
        }
        self.attempt_succeeded(email, source, Attempt::Password)?;
        Ok(user_id)
    }

    /// The sign-in of the authorization page from `source` (the client's address): returns a
    /// new pin for `client_id`, which replaces any earlier one and expires unused after the pin
    /// lifetime.
    pub fn sign_in_for_pin(
        &self,
        email: &str,
        password: &str,
        client_id: &str,
        source: &str,
    ) -> Result<String> {
        self.require_client(client_id)?;
        let user_id = self.check_password(email, password, source)?;
        // Eight digits without a leading zero, so it survives being sent as a JSON number.
        let pin = rand::rng()
            .random_range(10_000_000u32..100_000_000)
            .to_string();
        let now = now_ns();
        let conn = self.lock()?;
        conn.execute(
            "INSERT INTO pins (user_id, client_id, hash, created_on, expires_on)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (user_id, client_id) DO UPDATE SET hash = excluded.hash,
                 created_on = excluded.created_on, expires_on = excluded.expires_on",
            params![
                user_id,
                client_id,
                pin_hash(&self.pin_key, user_id, client_id, &pin),
                now,
                now + self.config.pin_ttl.as_nanos() as i64
            ],
        )?;
        Ok(pin)
    }

    /// The sign-in of the web interface from `source`: a new session (a token of the
    /// [`WEB_SESSION`] pseudo-client, which the API does not accept), valid for [`SESSION_TTL`].
    pub fn sign_in_web(&self, email: &str, password: &str, source: &str) -> Result<IssuedToken> {
        let user_id = self.check_password(email, password, source)?;
        let conn = self.lock()?;
        issue_token(&conn, user_id, WEB_SESSION, SESSION_TTL)
    }

    /// The user of a web session (the cookie's token).
    pub fn web_session(&self, token: &str) -> Result<Principal> {
        self.principal(token, None)
    }

    /// Signs a web session out: its token is revoked.
    pub fn end_web_session(&self, token: &str) -> Result<()> {
        let conn = self.lock()?;
        conn.execute(
            "UPDATE tokens SET revoked = 1 WHERE hash = ?1 AND client_id = ?2",
            params![token_hash(token), WEB_SESSION],
        )?;
        self.tokens.forget();
        Ok(())
    }

    /// The value a web session's forms carry against cross-site requests: keyed (the pin key,
    /// with its own prefix) and bound to the session, so it needs no storage and another
    /// session's value is worth nothing.
    pub fn form_token(&self, session: &str) -> String {
        let mac = hmac_sha256(&self.pin_key, format!("form\0{session}").as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac)
    }

    /// Whether `given` is [`Store::form_token`] of `session` (in constant time).
    pub fn form_token_matches(&self, session: &str, given: &str) -> bool {
        same(self.form_token(session).as_bytes(), given.as_bytes())
    }

    /// `/pin/auth` from `source`: exchanges a pin for a delegation token. A pin is used once.
    pub fn exchange_pin(
        &self,
        email: &str,
        client_id: &str,
        pin: &str,
        source: &str,
    ) -> Result<IssuedToken> {
        self.require_client(client_id)?;
        let invalid = || Error::auth("invalid_pin", "wrong pin for this user and client");
        self.begin_attempt(email, source, Attempt::Pin)?;
        let Some((user_id, _)) = self.user_by_email(email)? else {
            return Err(invalid());
        };
        let now = now_ns();
        let conn = self.lock()?;
        let tx = conn.transaction()?;
        // Taken, checked and issued in one transaction: a pin gives one token.
        let stored: Option<Vec<u8>> = tx
            .query_row(
                "DELETE FROM pins WHERE user_id = ?1 AND client_id = ?2 AND expires_on > ?3
                 RETURNING hash",
                params![user_id, client_id, now],
                |r| r.get(0),
            )
            .optional()?;
        let given = pin_hash(&self.pin_key, user_id, client_id, pin.trim());
        if !stored.is_some_and(|h| same(&h, &given)) {
            // The transaction rolls back: a wrong guess does not burn the pin.
            return Err(invalid());
        }
        let issued = issue_token(&tx, user_id, client_id, self.config.token_ttl)?;
        tx.commit()?;
        drop(conn);
        self.attempt_succeeded(email, source, Attempt::Pin)?;
        Ok(issued)
    }

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
            .collect::<super::db::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Revokes `email`'s app password `name`: its device must be given a new one.
    pub fn revoke_app_password(&self, email: &str, name: &str) -> Result<()> {
        let conn = self.lock()?;
        let n = conn.execute(
            "DELETE FROM app_passwords WHERE name = ?2
             AND user_id = (SELECT id FROM users WHERE email = ?1)",
            params![email, name.trim()],
        )?;
        if n == 0 {
            return Err(Error::not_found(format!(
                "{email} has no app password named {name:?}"
            )));
        }
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

    /// Checks `email:token` from the Authorization header. Web sessions are not API tokens.
    pub fn authenticate(&self, email: &str, token: &str) -> Result<Principal> {
        self.principal(token, Some(email))
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
    fn principal(&self, token: &str, email: Option<&str>) -> Result<Principal> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_is_rfc_4231() {
        // RFC 4231 test case 2 ("Jefe"), the key zero-padded to 32 bytes as HMAC pads it anyway.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = hmac_sha256(&key, b"what do ya want for nothing?");
        assert_eq!(
            crate::api::checksum::hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn accounts_are_slowed_from_their_twentieth_failure() {
        assert_eq!(account_spacing(19), Duration::ZERO);
        assert_eq!(account_spacing(20), ACCOUNT_FIRST_SPACING);
        assert_eq!(account_spacing(21), ACCOUNT_FIRST_SPACING * 2);
        assert_eq!(account_spacing(1000), ACCOUNT_MAX_SPACING);
    }

    #[test]
    fn backoff_doubles_from_the_fifth_failure() {
        assert_eq!(backoff(4), Duration::ZERO);
        assert_eq!(backoff(5), FIRST_BACKOFF);
        assert_eq!(backoff(6), FIRST_BACKOFF * 2);
        assert_eq!(backoff(1000), MAX_BACKOFF);
    }
}
