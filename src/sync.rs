//! Locks that outlive a panic. A thread that panics while holding a lock poisons it; the code of
//! this crate keeps what it guards whole across such a panic (or does not depend on it), so the
//! lock is taken anyway rather than spreading the panic to every later user.

use std::sync::{LockResult, Mutex, MutexGuard, PoisonError, TryLockError};

/// Locks `m`, also when a thread panicked while holding it.
pub(crate) fn relock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoisoned(m.lock())
}

/// Locks `m` if nobody holds it, also when a thread panicked while holding it; `None` when it is
/// held.
pub(crate) fn try_relock<T: ?Sized>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The guard of a lock, a read or write lock, or a condition variable's wait, also when it is
/// poisoned: `unpoisoned(lock.read())`, `unpoisoned(cond.wait(guard))`.
pub(crate) fn unpoisoned<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::relock;
    use std::sync::Mutex;

    #[test]
    fn a_poisoned_mutex_is_locked_anyway() {
        let m = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _held = m.lock().unwrap();
            panic!("poisons the lock");
        });
        assert!(m.is_poisoned());
        *relock(&m) += 1;
        assert_eq!(*relock(&m), 2);
    }
}
