//! One engine at a time takes its memory on a GPU. vLLM and SGLang size their caches from the
//! memory free while they start (SGLang's `--mem-fraction-static` is a fraction of it, vLLM
//! profiles its own use against it), so an engine that allocates meanwhile is counted against
//! them, or they against it. Every engine holds its GPU's gate while it starts: an engine
//! server until it answers its health check, the native engine while it puts its weights and
//! KV cache on the GPU.
//!
//! The gate holds across the host's processes (several workers on one machine): within a
//! process a slot per GPU, and across processes a lock file per GPU in `/tmp`, named as the
//! host knows the GPU ([`crate::host_gpu`]) and held with `flock`,
//! which the system gives back when a process dies. A start waits for the gate only so long,
//! so that a process stuck while it holds it does not hold every later launch with it.

use crate::EngineError;
use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long the native engine waits for the gate (an engine server waits as long as it may
/// take to start, `launch_timeout_s`).
pub const GPU_START_PATIENCE: Duration = Duration::from_secs(900);

/// How often a start waiting for another process's lock asks again.
const RETRY: Duration = Duration::from_millis(100);

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

/// Waits until no other engine of the host is starting on this process's GPU `gpu`, at most
/// `patience`, and holds it until the result is dropped. Where the lock file cannot be had (a
/// read-only `/tmp`), only this process's engines wait for each other.
pub fn gpu_start_gate(gpu: usize, patience: Duration) -> Result<GpuStartGate, EngineError> {
    let deadline = Instant::now() + patience;
    let (busy, freed) = starting();
    // A panic while the set was held leaves it whole (an entry is inserted or removed).
    let mut held = busy.lock().unwrap_or_else(PoisonError::into_inner);
    while held.contains(&gpu) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(gave_up(gpu, patience, "another engine of this process"));
        }
        held = freed.wait_timeout(held, left).map_or_else(|e| e.into_inner().0, |(g, _)| g);
    }
    held.insert(gpu);
    drop(held);
    // From here the slot is the gate's: dropped on any return, it is given back.
    let mut gate = GpuStartGate { gpu, file: None };
    gate.file = host_lock(gpu, deadline, patience)?;
    Ok(gate)
}

/// The error of a start that waited `patience` for GPU `gpu` held by `holder`.
fn gave_up(gpu: usize, patience: Duration, holder: &str) -> EngineError {
    EngineError::Process(format!(
        "GPU {gpu}: {holder} was still starting an engine there after {} s; engines take their \
         memory on a GPU one at a time, so this one did not start",
        patience.as_secs()
    ))
}

/// The host-wide lock file of this process's GPU `gpu`.
fn lock_path(gpu: usize) -> PathBuf {
    let name = crate::host_gpu(gpu).unwrap_or_else(|_| gpu.to_string());
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    // `/tmp` itself, not `TMPDIR`: every process of the host must find the same file.
    Path::new("/tmp").join(format!("xinf-gpu-{name}.start.lock"))
}

/// Takes the host-wide lock of GPU `gpu`, waiting until `deadline` for another process that
/// holds it; the holder's process id goes into the file, for the message of one that waits.
fn host_lock(gpu: usize, deadline: Instant, patience: Duration) -> Result<Option<File>, EngineError> {
    let path = lock_path(gpu);
    // A file another user made may be readable only; `flock` needs no more.
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .or_else(|_| File::open(&path));
    let mut file = match opened {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no lock file for the GPU's start gate; only this process's engines wait for each other");
            return Ok(None);
        }
    };
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "the GPU's start gate could not be locked; only this process's engines wait for each other");
                return Ok(None);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(gave_up(gpu, patience, &holder(&path)));
        }
        if !told {
            told = true;
            tracing::info!(gpu, holder = %holder(&path), "another process is starting an engine on this GPU; waiting for it");
        }
        std::thread::sleep(left.min(RETRY));
    }
    // Only a note for others' messages: a file opened read-only keeps the last holder's.
    let _ = file.set_len(0).and_then(|()| writeln!(file, "{}", std::process::id()));
    Ok(Some(file))
}

/// Who holds the lock file at `path`, as its holder wrote it.
fn holder(path: &Path) -> String {
    // A process id and a newline; anything longer is not a holder's note (the file is anyone's
    // to write), and is not read whole.
    let mut text = String::new();
    let read = File::open(path).and_then(|f| f.take(32).read_to_string(&mut text));
    match read.ok().and_then(|_| text.trim().parse::<u32>().ok()) {
        Some(pid) => format!("process {pid}"),
        None => "another process".to_owned(),
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

    const LONG: Duration = Duration::from_secs(60);

    /// Takes the gate of `gpu` on another thread; the receiver hears when it is held.
    fn take_on_thread(gpu: usize) -> (mpsc::Receiver<()>, std::thread::JoinHandle<()>) {
        let (held, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _gate = gpu_start_gate(gpu, LONG).expect("the gate");
            let _ = held.send(());
        });
        (rx, thread)
    }

    /// The lock file of `gpu` opened apart and locked: another process's hold, as `flock` sees
    /// it, with that process's id written as a holder writes it.
    fn held_elsewhere(gpu: usize) -> File {
        let mut other = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_path(gpu))
            .expect("lock file");
        other.lock().expect("locked");
        other.set_len(0).expect("emptied");
        writeln!(other, "4242").expect("holder written");
        other
    }

    #[test]
    fn engines_of_one_process_start_on_a_gpu_one_at_a_time() {
        let first = gpu_start_gate(901, LONG).expect("the gate");
        let (rx, thread) = take_on_thread(901);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the second start waits");
        // Another GPU does not wait.
        drop(gpu_start_gate(902, LONG).expect("another GPU's gate"));
        drop(first);
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "and goes on once the first is done");
        thread.join().expect("thread");
        // A start that waits longer than it may gives up, naming why.
        let _first = gpu_start_gate(901, LONG).expect("the gate");
        let err = gpu_start_gate(901, Duration::from_millis(50)).err().expect("gave up").to_string();
        assert!(err.contains("GPU 901") && err.contains("another engine of this process"), "{err}");
    }

    #[test]
    fn a_start_waits_for_another_process_holding_the_gpus_lock_file() {
        let other = held_elsewhere(903);
        let (rx, thread) = take_on_thread(903);
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the start waits for the other process"
        );
        other.unlock().expect("unlocked");
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "and goes on once it let go");
        thread.join().expect("thread");
        // The gate's holder wrote itself into the file.
        let written = std::fs::read_to_string(lock_path(903)).expect("lock file");
        assert_eq!(written.trim(), std::process::id().to_string());
    }

    #[test]
    fn a_start_gives_up_on_a_process_that_keeps_the_lock_naming_it() {
        let other = held_elsewhere(904);
        let err = gpu_start_gate(904, Duration::from_millis(300)).err().expect("gave up").to_string();
        assert!(err.contains("GPU 904") && err.contains("process 4242") && err.contains("0 s"), "{err}");
        // The slot of this process was given back with the failed start.
        drop(other);
        drop(gpu_start_gate(904, LONG).expect("the gate once the other let go"));
    }
}
