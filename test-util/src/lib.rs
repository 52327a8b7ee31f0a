//! What the tests of every xinf crate share (a dev-dependency only): the GPU gate, tokio
//! runtimes, scratch directories, polling, and a seeded generator for test data.
//!
//! ```
//! use xinf_test_util::Rng;
//! let (mut a, mut b) = (Rng::new(7), Rng::new(7));
//! assert_eq!(a.next_u64(), b.next_u64());
//! assert!(a.below(10) < 10);
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

/// Whether GPU tests are asked for (`XINF_TEST_GPU=1`); otherwise says, loudly, that `test` is
/// skipped, so a run without a GPU never passes silently.
pub fn gpu_tests_enabled(test: &str) -> bool {
    if std::env::var("XINF_TEST_GPU").as_deref() == Ok("1") {
        return true;
    }
    eprintln!(
        "SKIPPED {test}: set XINF_TEST_GPU=1 on a host with an NVIDIA GPU (and a --features cuda build)"
    );
    false
}

/// A multi-thread tokio runtime of two workers, as the actors and servers run on.
#[allow(clippy::expect_used)]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A single-thread tokio runtime, for tests that drive one engine.
#[allow(clippy::expect_used)]
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

/// A scratch directory of one test, removed when dropped.
#[allow(clippy::expect_used)]
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a scratch directory")
}

/// Waits until `check` holds, checking every 50 ms; panics naming `what` after `limit`.
pub fn poll(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`poll`] for async checks, without blocking the runtime.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A seeded xorshift64 generator: the same data for the same seed on every run and host.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (0 is replaced: xorshift never leaves 0).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A float in (0, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// A standard normal float (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (2.0 * std::f32::consts::PI * b).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_range_and_repeat_per_seed() {
        let mut r = Rng::new(0);
        assert_ne!(r.next_u64(), 0);
        let first: Vec<u64> = (0..8).map(|_| Rng::new(42).below(5)).collect();
        assert!(first.iter().all(|&x| x < 5));
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        for _ in 0..100 {
            let u = a.uniform();
            assert!(u > 0.0 && u < 1.0);
            assert_eq!(u.to_bits(), b.uniform().to_bits());
        }
        assert!(Rng::new(9).normal().is_finite());
    }
}
