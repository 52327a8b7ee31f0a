//! KV-cache layout descriptors and the canonical page format that moves KV between prefill and
//! decode replicas.
//!
//! Every engine xinf talks to keeps its KV cache in its own memory layout: vLLM FlashAttention
//! `(2, NB, B, H, D)`, FlashInfer/Triton `(NB, 2, B, H, D)`, their HND variants, SGLang's
//! per-layer token pools `[slots, H, D]`. A [`KvLayout`] names one of them and a
//! [`LayoutDescriptor`] turns it into plane offsets and strides, so that one gather/scatter
//! routine can address any of them: element `(layer, kv, token)` of a sequence lives at
//! `plane(layer, kv) + blk * s_blk + off * s_tok + head * s_head + d` with
//! `blk = block_table[token / B]` and `off = token % B`.

pub mod device;
mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod gpu_ipc;
mod layout;
pub mod nixl;
mod page;
mod process;
pub mod sync;
pub mod transport;

pub use error::TransferError;
pub use layout::{KvLayout, KvLayoutKind, KvOrder, LayoutDescriptor, LayoutError, Plane};
pub use page::{
    Direction, PAGE_LAYOUT_VERSION, PAGE_TOKENS, PageDtype, PageHeader, PageShape, copy_pages, pages_for,
};
