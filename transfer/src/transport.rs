//! Moving canonical pages from a prefill replica to a decode replica.
//!
//! The prefill side owns a [`PageProvider`]: given a room and a page range it gathers those
//! pages out of its engine's KV cache. The decode side fetches them with [`fetch`] (or
//! [`fetch_device`], GPU to GPU) through a transport chosen from the provider's [`Endpoint`]:
//!
//! - **in-process** when the provider lives in the same process (the endpoint carries the
//!   [`process_nonce`] of the provider's process), a direct call with no copy beyond the
//!   gather;
//! - **TCP** otherwise: a [`PageServer`] per process serves every provider registered with it
//!   on a data port of its own, so bulk bytes never travel on the actor control channel. One
//!   fetch moves the whole range as one frame (pages are coalesced, not sent one by one).
//! - **NIXL** when asked for ([`TransportPolicy::Nixl`]): the page server's TCP connection is
//!   only the side channel (as in vLLM's NixlConnector). The server gathers the range into
//!   memory registered with its NIXL agent and answers with the agent's metadata and where the
//!   range lies; the fetching process reads it with one NIXL READ (UCX picks RDMA, shared
//!   memory or TCP) and then says so on the same connection, which frees the staging memory for
//!   the next fetch. See [`crate::nixl`] for loading the library and the agents.
//! - **GPU to GPU** ([`fetch_device`], see [`crate::device`]): in process, or with the page
//!   server's connection as the side channel again, carrying where the provider staged the
//!   pages in GPU memory (a CUDA IPC handle, a NIXL VRAM range) and the "done" after the copy.
//!
//! Every connection starts with a handshake in which server and client prove they hold the
//! cluster's page key (`auth`); a peer without it is refused before any request is read.
//!
//! The modules, in the order a fetch meets them: `endpoint` (where a provider is, how a fetch
//! may travel), `provider` (the trait and this process's registry), `client` (the fetching
//! side), `auth` (the handshake), `wire` (the frames on the page server's connection, documented there byte by byte),
//! `server` (the page server) and `fault` (`XINF_TRANSFER_FAULT`, making a page server
//! misbehave for tests).

mod admission;
mod auth;
mod client;
mod endpoint;
mod fault;
mod provider;
mod server;
mod wire;

pub use crate::error::TransferError;
pub use crate::process::process_nonce;
pub use auth::{PageKey, process_key_hex, set_process_key};
pub use client::{fetch, fetch_device, release};
pub use endpoint::{Endpoint, TransportKind, TransportPolicy};
pub use provider::{PageProvider, Registration};
pub use server::PageServer;

#[cfg(test)]
mod tests;
