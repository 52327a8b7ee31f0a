//! Locking shared state without letting one panic spread to every later caller.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data over when a previous holder panicked with it locked.
///
/// Poisoning says that a thread panicked while it held the lock, not that the data is broken.
/// The state xinf keeps behind a lock (registries, pools, maps, a library handle) is consistent
/// between statements, so the next caller can go on using it; `lock().unwrap()` would instead
/// turn one failed request into a panic in every request after it, for the life of the
/// process. State that a panic could leave half-updated must not be locked with this.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::lock;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_poisoned_lock_is_taken_over_with_its_data() {
        let shared = Arc::new(Mutex::new(vec![1, 2]));
        let held = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut v = lock(&held);
            v.push(3);
            panic!("a holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        lock(&shared).push(4);
        assert_eq!(*lock(&shared), [1, 2, 3, 4]);
    }
}
