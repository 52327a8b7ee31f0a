//! Who may use a page server: peers holding the page plane's key.
//!
//! Every process of a cluster (and every engine server xinf starts) holds one [`PageKey`],
//! derived from the cluster's secret ([`PageKey::from_secret`]; `xinf local` makes a random one
//! per process and hands it to its engine servers in `XINF_KV_KEY`). A page server proves it
//! holds the key to each client, and each client to the server, before any request is read:
//!
//! 1. server → client: `b"XKA1"` and a 16-byte random nonce `ns`;
//! 2. client → server: its own nonce `nc` and `SHA-256("c" · key · ns · nc)`;
//! 3. server → client, as an answer (`status:u8 len:u64` and the body): when that matches,
//!    status [`OK`](super::wire::OK) and `SHA-256("s" · key · nc · ns)`; otherwise
//!    [`FAILED`](super::wire::FAILED) and why, and the connection is closed.
//!
//! The key never crosses the wire, both proofs are compared in constant time, and a proof
//! cannot be replayed (each side picks a fresh nonce). The handshake must complete within
//! [`FRAME_TIME`](super::wire::FRAME_TIME). A process whose key was never set uses the all-zero
//! key: processes that set none (tests, a connector run by hand) still talk to each other, and
//! to nothing that holds a real key.

use super::wire::{self, AnswerHead, FAILED, OK};
use crate::error::TransferError;
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The first bytes a page server sends on a connection.
const HELLO: [u8; 4] = *b"XKA1";
const NONCE: usize = 16;
const PROOF: usize = 32;

/// The page plane's key (32 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct PageKey([u8; 32]);

impl std::fmt::Debug for PageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageKey(..)")
    }
}

impl PageKey {
    /// The key of the cluster whose nodes share `secret`.
    pub fn from_secret(secret: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"xinf-page-plane-v1\0");
        h.update(secret.as_bytes());
        Self(h.finalize().into())
    }

    /// A fresh random key (one process, or `xinf local` and its engine servers).
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The key as 64 hex digits (how engine servers are given it, in `XINF_KV_KEY`).
    pub fn to_hex(&self) -> String {
        crate::hex::encode(&self.0)
    }

    /// A key from its 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, TransferError> {
        crate::hex::decode(text.trim())
            .and_then(|raw| <[u8; 32]>::try_from(raw).ok())
            .map(Self)
            .ok_or_else(|| TransferError::Protocol("a page key is 64 hex digits".into()))
    }

    fn proof(&self, side: u8, first: &[u8; NONCE], second: &[u8; NONCE]) -> [u8; PROOF] {
        let mut h = Sha256::new();
        h.update([side]);
        h.update(self.0);
        h.update(first);
        h.update(second);
        h.finalize().into()
    }
}

static KEY: OnceLock<PageKey> = OnceLock::new();

/// Sets this process's page key, once; `false` (and the key is left as it was) when another
/// key was set before. Clients and the page server of the process use it.
pub fn set_process_key(key: PageKey) -> bool {
    let set = KEY.get_or_init(|| key.clone());
    *set == key
}

/// This process's page key (all zeros when none was set).
pub(crate) fn process_key() -> &'static PageKey {
    KEY.get_or_init(|| PageKey([0; 32]))
}

/// This process's page key as 64 hex digits: what a process this one starts (an engine
/// server) is given in `XINF_KV_KEY` to serve and fetch pages with this process.
pub fn process_key_hex() -> String {
    process_key().to_hex()
}

/// Compares two proofs in constant time.
fn same(a: &[u8; PROOF], b: &[u8; PROOF]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The server's side: `Ok(true)` when the client proved it holds `key`; `Ok(false)` when it did
/// not (it was told, and the caller closes the connection).
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &PageKey,
) -> std::io::Result<bool> {
    let ns: [u8; NONCE] = rand::random();
    let mut hello = Vec::with_capacity(HELLO.len() + NONCE);
    hello.extend_from_slice(&HELLO);
    hello.extend_from_slice(&ns);
    stream.write_all(&hello).await?;
    stream.flush().await?;
    let mut answer = [0u8; NONCE + PROOF];
    tokio::time::timeout(wire::FRAME_TIME, stream.read_exact(&mut answer)).await.map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to the page server's hello")
    })??;
    let (nc, proof) = answer.split_at(NONCE);
    let nc: [u8; NONCE] = nc.try_into().map_err(std::io::Error::other)?;
    let proof: [u8; PROOF] = proof.try_into().map_err(std::io::Error::other)?;
    if !same(&proof, &key.proof(b'c', &ns, &nc)) {
        let body = wire::error_body(&TransferError::Unauthenticated(
            "the client does not hold this cluster's page key".into(),
        ));
        stream.write_all(&AnswerHead { status: FAILED, len: body.len() as u64 }.encode()).await?;
        stream.write_all(&body).await?;
        stream.flush().await?;
        return Ok(false);
    }
    stream.write_all(&AnswerHead { status: OK, len: PROOF as u64 }.encode()).await?;
    stream.write_all(&key.proof(b's', &nc, &ns)).await?;
    stream.flush().await?;
    Ok(true)
}

/// The client's side, right after connecting.
pub(crate) async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &PageKey,
) -> Result<(), HandshakeError> {
    let mut hello = [0u8; HELLO.len() + NONCE];
    stream.read_exact(&mut hello).await?;
    if hello[..HELLO.len()] != HELLO {
        return Err(HandshakeError::Refused("not a page server (or one of an older version)".into()));
    }
    let ns: [u8; NONCE] = hello[HELLO.len()..].try_into().map_err(std::io::Error::other)?;
    let nc: [u8; NONCE] = rand::random();
    let mut answer = Vec::with_capacity(NONCE + PROOF);
    answer.extend_from_slice(&nc);
    answer.extend_from_slice(&key.proof(b'c', &ns, &nc));
    stream.write_all(&answer).await?;
    stream.flush().await?;
    // The server's proof, or its refusal, as an answer.
    let mut head = [0u8; AnswerHead::LEN];
    stream.read_exact(&mut head).await?;
    let head = AnswerHead::decode(head);
    if head.status != OK || head.len != PROOF as u64 {
        let mut body = vec![0u8; head.len.min(4096) as usize];
        stream.read_exact(&mut body).await?;
        let why = match wire::answer_result(head.status, body) {
            Err(e) => e.to_string(),
            Ok(_) => "the page server's proof is malformed".into(),
        };
        return Err(HandshakeError::Refused(why));
    }
    let mut proof = [0u8; PROOF];
    stream.read_exact(&mut proof).await?;
    if !same(&proof, &key.proof(b's', &nc, &ns)) {
        return Err(HandshakeError::Refused("the page server does not hold this cluster's page key".into()));
    }
    Ok(())
}

/// Why a client's handshake failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    Io(std::io::Error),
    Refused(String),
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

#[cfg(test)]
mod tests;
