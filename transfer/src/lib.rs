//! How KV pages move between xinf's prefill and decode replicas: the canonical page format,
//! the engines' KV layouts it is converted from and into, and the transports that carry it.
//!
//! **Layouts and pages.** Every engine xinf talks to keeps its KV cache in its own memory
//! layout: vLLM FlashAttention `(2, NB, B, H, D)`, FlashInfer/Triton `(NB, 2, B, H, D)`, their
//! HND variants, SGLang's per-layer token pools `[slots, H, D]`. A [`KvLayout`] names one of
//! them and a [`LayoutDescriptor`] turns it into plane offsets and strides, so that one
//! gather/scatter routine ([`copy_pages`]) can address any of them: element
//! `(layer, kv, token)` of a sequence lives at
//! `plane(layer, kv) + blk * s_blk + off * s_tok + head * s_head + d` with
//! `blk = block_table[token / B]` and `off = token % B`. Between replicas the pages travel in
//! one canonical format whatever the two engines' layouts ([`PageShape`], [`PageHeader`]).
//!
//! **Transports.** [`transport`] moves a room's pages from the prefill side's provider to the
//! decode side: in process, over TCP (each process's page server), or by NIXL reads with the
//! TCP connection as side channel; [`device`] keeps them in GPU memory all the way, in process,
//! over CUDA IPC (`gpu_ipc`) or by NIXL reads of VRAM. [`nixl`] loads the NIXL library at run
//! time and holds the agents.
//!
//! **GPU conversion** (feature `cuda`): `gpu` runs the gather/scatter as one NVRTC kernel,
//! bit for bit the CPU's.

pub mod device;
mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod gpu_handoff;
#[cfg(feature = "cuda")]
pub mod gpu_ipc;
pub mod hex;
mod layout;
pub mod nixl;
mod page;
mod process;
pub mod sync;
pub mod transport;

pub use error::TransferError;
pub use layout::{KvLayout, KvLayoutKind, KvOrder, LayoutDescriptor, LayoutError, Plane};
pub use page::{
    Direction, PAGE_LAYOUT_VERSION, PAGE_TOKENS, PageDtype, PageHeader, PageShape, copy_pages,
    copy_token_pages, pages_for,
};
