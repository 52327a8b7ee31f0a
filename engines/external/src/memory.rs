//! A replica's share of its GPU, as each engine's memory flag reads it.
//!
//! xinf's `gpu_memory_utilization` is a share of the GPU's whole memory, and so is vLLM's
//! `--gpu-memory-utilization`. SGLang's `--mem-fraction-static` is not: it is a fraction of
//! the memory free when its server starts (SGLang 0.5.15,
//! `model_runner_kv_cache_mixin.py`, `_profile_available_bytes`: the KV pool is what is free
//! after the weights load, less `1 - fraction` of what was free before). On a GPU that other
//! replicas already use, the same number gives a later SGLang server less than its share, and
//! on a well-filled GPU nothing ("Loaded weights leave no GPU memory for the KV cache"). So
//! xinf hands SGLang the fraction of the free memory that is its share of the whole.

use crate::flavor::Flavor;
use xinf_engine::EngineError;

/// A GPU's memory as the driver reports it just before a server starts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuMemory {
    pub(crate) free: u64,
    pub(crate) total: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

/// The value of `flavor`'s memory flag for a replica whose share of GPU `gpu` is `share`.
/// Without the driver's figures (`memory` is `None`) the share goes as it is.
pub(crate) fn engine_fraction(
    flavor: Flavor,
    share: f64,
    gpu: usize,
    memory: Option<GpuMemory>,
) -> Result<f64, EngineError> {
    let Some(GpuMemory { free, total }) = memory.filter(|m| m.free > 0 && m.total > 0) else {
        return Ok(share);
    };
    if flavor != Flavor::Sglang {
        return Ok(share);
    }
    let want = share * total as f64;
    if want > free as f64 {
        return Err(EngineError::Model(format!(
            "GPU {gpu} has {:.1} GiB free, and gpu_memory_utilization {share} asks for {:.1} GiB of its {:.1} \
             GiB (other processes hold the rest): give the replica a smaller share or stop what holds the GPU",
            free as f64 / GIB,
            want / GIB,
            total as f64 / GIB,
        )));
    }
    // Rounded down, so that SGLang never takes more than the share.
    Ok((want / free as f64 * 1e4).floor() / 1e4)
}

/// GPU `gpu`'s free and total memory now; `None` in a build without the driver (`cuda`
/// feature) or where the driver does not answer, logged.
pub(crate) fn probe(gpu: usize) -> Option<GpuMemory> {
    #[cfg(feature = "cuda")]
    {
        match xinf_transfer::gpu::memory(gpu) {
            Ok((free, total)) => return Some(GpuMemory { free, total }),
            Err(e) => tracing::warn!(gpu, error = %e, "the driver did not tell the GPU's free memory"),
        }
    }
    tracing::debug!(gpu, "no free-memory figure for the GPU: the memory share goes to the engine as it is");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn sglang_gets_its_share_of_the_whole_as_a_fraction_of_what_is_free() {
        // 0.06 of an 80 GiB GPU of which 13.6 GiB are free: 4.8 GiB, 0.3529 of the free memory.
        let m = GpuMemory { free: 13_600 * G / 1000, total: 80 * G };
        let f = engine_fraction(Flavor::Sglang, 0.06, 0, Some(m)).expect("fits");
        assert_eq!(f, 0.3529);
        assert!(f * m.free as f64 <= 0.06 * m.total as f64, "never more than the share");
        // An empty GPU: nearly the share itself.
        let empty = GpuMemory { free: 79 * G, total: 80 * G };
        assert_eq!(engine_fraction(Flavor::Sglang, 0.5, 0, Some(empty)).expect("fits"), 0.5063);
    }

    #[test]
    fn vllm_and_unknown_memory_take_the_share_as_it_is() {
        let m = GpuMemory { free: 10 * G, total: 80 * G };
        assert_eq!(engine_fraction(Flavor::Vllm, 0.06, 0, Some(m)).expect("vLLM"), 0.06);
        assert_eq!(engine_fraction(Flavor::Sglang, 0.06, 0, None).expect("no figures"), 0.06);
        let zero = GpuMemory { free: 0, total: 0 };
        assert_eq!(engine_fraction(Flavor::Sglang, 0.06, 0, Some(zero)).expect("no figures"), 0.06);
    }

    #[test]
    fn a_share_larger_than_the_free_memory_is_refused_with_the_figures() {
        let m = GpuMemory { free: 30 * G, total: 80 * G };
        let e = engine_fraction(Flavor::Sglang, 0.5, 1, Some(m)).expect_err("40 GiB of 30 free");
        let text = e.to_string();
        for part in ["GPU 1", "30.0 GiB free", "gpu_memory_utilization 0.5", "40.0 GiB", "80.0 GiB"] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
