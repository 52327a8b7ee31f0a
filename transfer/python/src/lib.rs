//! `xinf_kv._native`: xinf's page plane inside an engine server's process.
//!
//! The KV connectors of the Python package `xinf_kv` (a vLLM KV connector, an SGLang transfer
//! backend) run inside the engine's own processes, beside its KV cache. They use this module
//! for everything that touches bytes, so that no Python loop walks pages or tokens:
//!
//! - [`Layout`](layout::Layout): an engine's KV layout (xinf's `LayoutDescriptor`) and the copies
//!   between engine memory and canonical pages on the CPU (`gather_host`, `scatter_host`);
//! - [`PageHost`](rooms::PageHost) (the prefill side): gathers a finished prompt's KV into
//!   staging memory (GPU memory where the cache is on a GPU) and serves it as a room on a page
//!   server of the engine's process, until the room is released or its lease runs out;
//! - [`PageLoader`](loader::PageLoader) (the decode side): fetches a room's pages (GPU to GPU
//!   by CUDA IPC on one host, else over TCP) and scatters them into the engine's cache, in the
//!   background; the connector polls for finished loads.
//!
//! Memory is named by address (`tensor.data_ptr()`): the engine's tensors stay the engine's.

#[cfg(feature = "cuda")]
mod gpu;
mod layout;
mod load;
mod loader;
mod rooms;
mod runtime;

use pyo3::prelude::*;

/// The module object Python imports as `xinf_kv._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<layout::Layout>()?;
    m.add_class::<rooms::PageHost>()?;
    m.add_class::<loader::PageLoader>()?;
    m.add_function(wrap_pyfunction!(layout::gather_host, m)?)?;
    m.add_function(wrap_pyfunction!(layout::scatter_host, m)?)?;
    m.add("PAGE_TOKENS", xinf_transfer::PAGE_TOKENS)?;
    m.add("CUDA", cfg!(feature = "cuda"))?;
    Ok(())
}
