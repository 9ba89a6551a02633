//! How a failed store of a staged file is tried again: the one policy of both uploaders, the
//! batches of the built-in store (`writeback`) and the file-by-file uploads (`upload`).
//!
//! - A transient failure (the backend away, a 5xx, a full disk there: `errno::is_transient`)
//!   is retried for as long as it lasts: after 1 s, then twice as long each time up to 60 s,
//!   with up to 25% jitter so that many files do not come back at once.
//! - A permanent failure (the folder gone, the file refused) is retried the same way twice;
//!   the third sets the bytes aside in `lost+found` (`Fs::set_aside`), loudly.
//! - A success starts the count over.
//!
//! The remote backend's HTTP client retries under this policy, never beside it: a JSON step
//! (create the file, begin the version) is retried there on connection failures and 5xx within
//! its own `total_timeout`, and the bytes (step 3) are never retried there. So one attempt here
//! is one pass of the steps, however many requests the client made inside it: what reaches
//! this policy as transient already outlasted the client's retries, and a permanent error was
//! never retried by the client at all (three permanent failures are three calls).

use std::time::Duration;

use crate::api::Error;

/// The wait before the first retry; doubled each time after.
const FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
const MAX: Duration = Duration::from_secs(60);
/// Permanent failures tolerated before the bytes are set aside.
const PERMANENT_ATTEMPTS: u32 = 3;

/// The failures of one file's store in a row.
#[derive(Debug, Default, Clone)]
pub struct Retry {
    failures: u32,
    permanent: u32,
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again after this long.
    After(Duration),
    /// Give up: the bytes go to `lost+found`.
    SetAside,
}

impl Retry {
    /// A failed attempt, transient or not (`errno::is_transient`): when to try again.
    pub fn failed(&mut self, e: &Error) -> Next {
        self.failed_as(super::super::error::is_transient(e))
    }

    fn failed_as(&mut self, transient: bool) -> Next {
        self.failures += 1;
        if !transient {
            self.permanent += 1;
            if self.permanent >= PERMANENT_ATTEMPTS {
                return Next::SetAside;
            }
        }
        let wait = FIRST
            .saturating_mul(1 << (self.failures - 1).min(8))
            .min(MAX);
        Next::After(wait.mul_f64(1.0 + rand::random::<f64>() * 0.25))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(n: Next) -> Duration {
        match n {
            Next::After(d) => d,
            Next::SetAside => panic!("set aside"),
        }
    }

    #[test]
    fn transient_failures_back_off_doubling_to_a_minute_and_never_give_up() {
        let mut r = Retry::default();
        let mut bases = Vec::new();
        for _ in 0..12 {
            let d = wait(r.failed_as(true));
            let base = bases.last().map_or(FIRST, |b: &Duration| (*b * 2).min(MAX));
            assert!(
                d >= base && d <= base.mul_f64(1.25),
                "{d:?} for base {base:?}"
            );
            bases.push(base);
        }
        assert_eq!(bases[..4], [1, 2, 4, 8].map(Duration::from_secs));
        assert_eq!(*bases.last().unwrap(), MAX);
    }

    #[test]
    fn the_third_permanent_failure_sets_the_bytes_aside_transient_ones_between_or_not() {
        let mut r = Retry::default();
        wait(r.failed_as(false));
        wait(r.failed_as(true));
        wait(r.failed_as(true));
        wait(r.failed_as(false));
        assert_eq!(r.failed_as(false), Next::SetAside);
        // A success starts over: a fresh count.
        let mut r = Retry::default();
        assert!(wait(r.failed_as(false)) < Duration::from_secs(2));
    }
}
