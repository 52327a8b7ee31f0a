//! The forward pass on an NVIDIA GPU (feature `cuda`): weights uploaded once, the paged KV cache
//! in device memory in the engine's layout, kernels compiled at run time with NVRTC, projections
//! with cuBLAS.
//!
//! The device cache is allocated region by region from the same layout descriptor as the host
//! cache, so it is byte for byte what vLLM or SGLang would hold on the GPU, and the page
//! conversion kernel of `xinf_transfer::gpu::GpuPages` exports and imports pages straight
//! from it. The engine's `KvCache` only keeps the block accounting then.
//!
//! A step's device buffers (its plan and its scratch) are allocated once, for the largest step
//! the engine forms, and filled prefix by prefix. Decode-only steps (one token per sequence) of
//! up to 64 sequences read everything that changes from step to step (ids, positions, block
//! tables) from those buffers, so their launches depend on the batch size alone: each batch
//! size is captured once as a CUDA graph and replayed. Prefill and mixed steps, and every step
//! when graphs are off or a capture failed, launch kernel by kernel: the same kernels and gemms
//! with the same arguments, so the results are bit for bit the same.
//!
//! - `plan`: the host side every launch relies on (the step plan and the shape checks); the
//!   one part compiled without the feature `cuda`, so its tests run on machines with no GPU;
//! - `model`: `GpuModel`, the backend, which builds the parts below and runs each step;
//! - `forward`: the kernels and gemms of one step;
//! - `buffers`: the weights on the device, the step buffers and cuBLAS's workspace;
//! - `graphs`: capturing and replaying decode steps;
//! - `pages`: the cache's device memory, and its canonical pages in and out;
//! - `error`: why the backend could not load or run.
//!
//! Staging and receiving pages GPU to GPU is `xinf_transfer::gpu_handoff`, shared with the
//! engine servers' connectors.

// Without `cuda` only the tests use the plan.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod plan;

#[cfg(feature = "cuda")]
mod buffers;
#[cfg(feature = "cuda")]
mod error;
#[cfg(feature = "cuda")]
mod flash;
#[cfg(feature = "cuda")]
mod forward;
#[cfg(feature = "cuda")]
mod graphs;
#[cfg(feature = "cuda")]
#[cfg(feature = "cuda")]
mod model;
#[cfg(feature = "cuda")]
mod pages;

#[cfg(feature = "cuda")]
pub(crate) use model::GpuModel;
#[cfg(feature = "cuda")]
pub(crate) use plan::StepLimits;
pub use plan::step_buffer_bytes;

#[cfg(all(test, feature = "cuda"))]
mod tests;
