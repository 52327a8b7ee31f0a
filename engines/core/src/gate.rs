//! One engine at a time takes its memory on a GPU. vLLM and SGLang size their caches from the
//! memory free while they start (SGLang's `--mem-fraction-static` is a fraction of it, vLLM
//! profiles its own use against it), so an engine of this process that allocates meanwhile is
//! counted against them, or they against it. Every engine of the process holds its GPU's gate
//! while it starts: an engine server until it answers its health check, the native engine
//! while it puts its weights and KV cache on the GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The lock an engine holds on GPU `gpu` of this process while it takes its memory there.
pub fn gpu_start_gate(gpu: usize) -> Arc<Mutex<()>> {
    static GATES: OnceLock<Mutex<HashMap<usize, Arc<Mutex<()>>>>> = OnceLock::new();
    let gates = GATES.get_or_init(Mutex::default);
    // A panic while the map was held leaves it whole (an entry is inserted or not).
    let mut gates = gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    gates.entry(gpu).or_default().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gate_per_gpu() {
        assert!(Arc::ptr_eq(&gpu_start_gate(3), &gpu_start_gate(3)));
        assert!(!Arc::ptr_eq(&gpu_start_gate(3), &gpu_start_gate(4)));
    }
}
