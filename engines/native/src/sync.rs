//! Locking shared by the engine's threads.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the value when a thread panicked while holding it. Every value locked
/// in this crate (sets of request ids, free lists of staging memory) is whole between any two
/// statements, so a poisoned lock holds nothing half-changed, while refusing it would fail
/// every later request for one panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
