//! The lockout of failed sign-ins, pin exchanges and WebDAV authentications (the module's
//! doc, `auth.rs`, says why so): counted per (e-mail, source) pair before the check runs, and
//! per e-mail from all sources together.

use std::time::Duration;

use crate::api::{Error, ErrorKind, Result};
use crate::store::db::{Conn, params};
use crate::store::{Store, now_ns};

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

#[derive(Clone, Copy)]
pub(super) enum Attempt {
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
pub(super) fn must_wait(
    conn: &Conn,
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

impl Store {
    /// Counts an attempt of `kind` by `source` for `email` before it is checked, atomically (the
    /// store's lock): 429 while the pair waits out its backoff, or while the e-mail, over its
    /// failures from all sources, is slowed for sources it was never signed into from;
    /// otherwise the attempt is counted as a failure until [`Store::attempt_succeeded`] clears
    /// the pair's count. So concurrent attempts cannot all be checked before the first failures
    /// are seen.
    pub(super) fn begin_attempt(&self, email: &str, source: &str, kind: Attempt) -> Result<()> {
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
    pub(super) fn attempt_succeeded(&self, email: &str, source: &str, kind: Attempt) -> Result<()> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
