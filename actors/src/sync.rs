//! Locking that survives a panicked holder.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a holder that panicked: the maps guarded here stay
/// consistent between statements, and a poisoned lock must not take the node down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
