//! One engine at a time takes its memory on a GPU. vLLM and SGLang size their caches from the
//! memory free while they start (SGLang's `--mem-fraction-static` is a fraction of it, vLLM
//! profiles its own use against it), so an engine that allocates meanwhile is counted against
//! them, or they against it. Every engine holds its GPU's gate while it starts: an engine
//! server until it answers its health check, the native engine while it puts its weights and
//! KV cache on the GPU.
//!
//! The gate holds across the host's processes (several workers on one machine): within a
//! process a slot per GPU, and across processes a lock file per GPU in the temporary
//! directory, named as the host knows the GPU ([`crate::host_gpu`]) and held with `flock`,
//! which the system gives back when a process dies.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

/// GPU `gpu` of this process held for an engine's start; given back when dropped.
#[must_use = "the gate is given back when this is dropped"]
pub struct GpuStartGate {
    gpu: usize,
    file: Option<File>,
}

/// The GPUs of this process on which an engine is starting.
fn starting() -> &'static (Mutex<HashSet<usize>>, Condvar) {
    static STARTING: OnceLock<(Mutex<HashSet<usize>>, Condvar)> = OnceLock::new();
    STARTING.get_or_init(Default::default)
}

/// Waits until no other engine of the host is starting on this process's GPU `gpu`, and holds
/// it until the result is dropped. Where the lock file cannot be had (a read-only temporary
/// directory), only this process's engines wait for each other.
pub fn gpu_start_gate(gpu: usize) -> GpuStartGate {
    let (busy, freed) = starting();
    // A panic while the set was held leaves it whole (an entry is inserted or removed).
    let mut held = busy.lock().unwrap_or_else(PoisonError::into_inner);
    while held.contains(&gpu) {
        held = freed.wait(held).unwrap_or_else(PoisonError::into_inner);
    }
    held.insert(gpu);
    drop(held);
    GpuStartGate { gpu, file: host_lock(gpu) }
}

/// The host-wide lock file of this process's GPU `gpu`.
fn lock_path(gpu: usize) -> PathBuf {
    let name = crate::host_gpu(gpu).unwrap_or_else(|_| gpu.to_string());
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    std::env::temp_dir().join(format!("xinf-gpu-{name}.start.lock"))
}

/// Takes the host-wide lock of GPU `gpu`, waiting for another process that holds it.
fn host_lock(gpu: usize) -> Option<File> {
    let path = lock_path(gpu);
    // A file another user made may be readable only; `flock` needs no more.
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .or_else(|_| File::open(&path));
    let file = match opened {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no lock file for the GPU's start gate; only this process's engines wait for each other");
            return None;
        }
    };
    match file.try_lock() {
        Ok(()) => return Some(file),
        Err(TryLockError::WouldBlock) => {
            tracing::info!(gpu, path = %path.display(), "another process is starting an engine on this GPU; waiting for it");
        }
        Err(TryLockError::Error(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "the GPU's start gate could not be locked; only this process's engines wait for each other");
            return None;
        }
    }
    match file.lock() {
        Ok(()) => Some(file),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the GPU's start gate could not be locked; only this process's engines wait for each other");
            None
        }
    }
}

impl Drop for GpuStartGate {
    fn drop(&mut self) {
        // The host's lock first, so that an engine of this process waiting for the slot does
        // not then wait for the lock as well.
        drop(self.file.take());
        let (busy, freed) = starting();
        busy.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.gpu);
        freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Takes the gate of `gpu` on another thread; the receiver hears when it is held.
    fn take_on_thread(gpu: usize) -> (mpsc::Receiver<()>, std::thread::JoinHandle<()>) {
        let (held, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _gate = gpu_start_gate(gpu);
            let _ = held.send(());
        });
        (rx, thread)
    }

    #[test]
    fn engines_of_one_process_start_on_a_gpu_one_at_a_time() {
        let first = gpu_start_gate(901);
        let (rx, thread) = take_on_thread(901);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the second start waits");
        // Another GPU does not wait.
        drop(gpu_start_gate(902));
        drop(first);
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "and goes on once the first is done");
        thread.join().expect("thread");
    }

    #[test]
    fn a_start_waits_for_another_process_holding_the_gpus_lock_file() {
        // Another process's hold, as `flock` sees it: the same file opened apart and locked.
        let other =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(lock_path(903));
        let other = other.expect("lock file");
        other.lock().expect("locked");
        let (rx, thread) = take_on_thread(903);
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the start waits for the other process"
        );
        other.unlock().expect("unlocked");
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "and goes on once it let go");
        thread.join().expect("thread");
    }
}
