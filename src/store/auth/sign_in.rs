//! Signing in with a password (argon2id): the authorization page's pin and its exchange for a
//! token, the web interface's session and the token of its forms.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use rand::Rng;
use sha2::{Digest, Sha256};

use super::lockout::Attempt;
use super::tokens::{issue_token, token_hash};
use super::{IssuedToken, Principal, SESSION_TTL, WEB_SESSION};
use crate::api::{Error, Result};
use crate::store::db::{OptionalExtension, params};
use crate::store::{Store, now_ns};

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

impl Store {
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
}
