//! The frames of the page server's TCP connection, in one place for both of its sides.
//!
//! All integers are little endian. A client opens a connection per fetch; after the handshake
//! in which both sides prove they hold the page key (`auth`), the server serves the requests
//! of a connection one after the other until the client closes it (or leaves it idle for
//! [`IDLE`]).
//!
//! **Requests** (client to server, one [`Request`]): a 4-byte magic, then the pages it asks
//! for, `room:u64 provider:u64 first:u32 count:u32`, then what that kind of fetch adds:
//!
//! | magic     | fetch                            | adds                      | frame bytes |
//! |-----------|----------------------------------|---------------------------|-------------|
//! | `b"XKV1"` | host pages, in the answer        | nothing                   | 28          |
//! | `b"XKN1"` | host pages, read with NIXL       | `timeout_ms:u32`          | 32          |
//! | `b"XKG1"` | GPU pages (CUDA IPC, NIXL VRAM)  | `timeout_ms:u32 route:u8` | 33          |
//! | `b"XKR1"` | release the room (`first`, `count` 0) | nothing              | 28          |
//!
//! `route` is [`DeviceRoute::code`]: 1 CUDA IPC, 2 NIXL VRAM (0, in process, never needs the
//! wire but is understood).
//!
//! **Answer** (server to client, one per request): `status:u8 len:u64`, then `len` bytes (at
//! most [`MAX_FRAME`]):
//!
//! - status 0 ([`OK`]): for `XKV1` the pages, back to back; for `XKR1` one byte, 1 when the
//!   room was there and is now freed, 0 when it was gone already; for `XKN1` the NIXL stage,
//!   `agent_len:u32 agent generation:u64 md_len:u32 md addr:u64 len:u64 dev:u64` (the staging
//!   agent, its metadata and where the range lies); for `XKG1` the JSON pair `[stage, len]` of
//!   a [`DeviceStage`] and the bytes staged, e.g. `[{"cuda-ipc":{"handle":"…"}},3000]`;
//! - status 1 ([`FAILED`]): a JSON [`TransferError`], or UTF-8 text (the answer to a frame
//!   with an unknown magic, after which the server closes the connection).
//!
//! **Done** (client to server, after a successful `XKN1` or `XKG1` answer): `b"XKND"` once its
//! NIXL read or GPU copy is over, which frees the staging memory for the next fetch. The server
//! keeps the staged range until then, or until `timeout_ms` after the request when the
//! connection drops first (the client may still be reading).

use crate::device::{DeviceRoute, DeviceStage};
use crate::error::TransferError;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Host pages, sent in the answer.
const MAGIC_HOST: [u8; 4] = *b"XKV1";
/// Host pages, staged for a NIXL read.
const MAGIC_NIXL: [u8; 4] = *b"XKN1";
/// GPU pages, staged in device memory.
const MAGIC_DEVICE: [u8; 4] = *b"XKG1";
/// The end of a room: the decode side is done with it.
const MAGIC_RELEASE: [u8; 4] = *b"XKR1";
/// The longest request after its magic (`XKG1`).
const MAX_BODY: usize = 29;

/// The client's "my read (or copy) is over" on a staged fetch's connection.
pub(crate) const DONE: &[u8; 4] = b"XKND";
/// Largest answer accepted: a bound against a corrupt length, far above any real range.
pub(crate) const MAX_FRAME: u64 = 64 << 30;
/// What a client reserves for an answer before its bytes arrive; the rest grows as they do.
pub(crate) const INITIAL_READ: u64 = 16 << 20;
/// How long a connection may sit between requests, and how long the rest of a started request
/// may take to arrive: a peer that opens connections and sends nothing, or half a frame, does
/// not hold a task and a socket for ever.
pub(crate) const IDLE: std::time::Duration = std::time::Duration::from_secs(120);
pub(crate) const FRAME_TIME: std::time::Duration = std::time::Duration::from_secs(10);
/// Answer status: the result of the request follows.
pub(crate) const OK: u8 = 0;
/// Answer status: an error follows.
pub(crate) const FAILED: u8 = 1;

/// The pages a request asks for: `count` pages of `room` from `first` on, of provider
/// `provider` in the serving process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pages {
    pub(crate) room: u64,
    pub(crate) provider: u64,
    pub(crate) first: u32,
    pub(crate) count: u32,
}

/// One request frame (see the module doc for the bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `XKV1`: the pages themselves, in the answer.
    Host(Pages),
    /// `XKN1`: the pages staged for a NIXL read, kept for at most `timeout_ms` without a done.
    Nixl { pages: Pages, timeout_ms: u32 },
    /// `XKG1`: the pages staged in GPU memory for `route`, kept as for [`Request::Nixl`].
    Device { pages: Pages, timeout_ms: u32, route: DeviceRoute },
    /// `XKR1`: frees the room (its `first` and `count` are 0).
    Release(Pages),
}

/// A frame that is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadRequest {
    /// Not one of this protocol's magics; the server answers and closes the connection, as it
    /// cannot know where the next frame would start.
    #[error("not a page fetch (bad magic)")]
    Magic([u8; 4]),
    /// An `XKG1` request for a route this build does not know.
    #[error("device route {0}")]
    Route(u8),
    /// Fewer bytes than the magic says.
    #[error("a truncated request")]
    Truncated,
    /// More bytes than the magic says.
    #[error("{0} bytes after the request")]
    Trailing(usize),
}

impl Request {
    /// The frame, magic first.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (magic, pages) = match self {
            Self::Host(pages) => (MAGIC_HOST, pages),
            Self::Nixl { pages, .. } => (MAGIC_NIXL, pages),
            Self::Device { pages, .. } => (MAGIC_DEVICE, pages),
            Self::Release(pages) => (MAGIC_RELEASE, pages),
        };
        let mut out = Vec::with_capacity(magic.len() + MAX_BODY);
        out.extend_from_slice(&magic);
        out.extend_from_slice(&pages.room.to_le_bytes());
        out.extend_from_slice(&pages.provider.to_le_bytes());
        out.extend_from_slice(&pages.first.to_le_bytes());
        out.extend_from_slice(&pages.count.to_le_bytes());
        match self {
            Self::Host(_) | Self::Release(_) => {}
            Self::Nixl { timeout_ms, .. } => out.extend_from_slice(&timeout_ms.to_le_bytes()),
            Self::Device { timeout_ms, route, .. } => {
                out.extend_from_slice(&timeout_ms.to_le_bytes());
                out.push(route.code());
            }
        }
        out
    }

    /// Decodes exactly one frame, magic included.
    pub(crate) fn decode(frame: &[u8]) -> Result<Self, BadRequest> {
        let mut fields = Fields(frame);
        let magic = fields.take()?;
        let pages = Pages {
            room: fields.u64()?,
            provider: fields.u64()?,
            first: fields.u32()?,
            count: fields.u32()?,
        };
        let request = match magic {
            MAGIC_HOST => Self::Host(pages),
            MAGIC_RELEASE => Self::Release(pages),
            MAGIC_NIXL => Self::Nixl { pages, timeout_ms: fields.u32()? },
            MAGIC_DEVICE => {
                let timeout_ms = fields.u32()?;
                let code = fields.u8()?;
                let route = DeviceRoute::from_code(code).ok_or(BadRequest::Route(code))?;
                Self::Device { pages, timeout_ms, route }
            }
            other => return Err(BadRequest::Magic(other)),
        };
        match fields.0.len() {
            0 => Ok(request),
            n => Err(BadRequest::Trailing(n)),
        }
    }

    /// Reads the next request off `stream`: `None` when the peer closed the connection between
    /// requests, or left it idle for [`IDLE`]. A bad magic is known from the first 4 bytes, and
    /// nothing more is read then; the rest of a frame must come within [`FRAME_TIME`].
    pub(crate) async fn read<R: AsyncRead + Unpin>(
        stream: &mut R,
    ) -> std::io::Result<Option<Result<Self, BadRequest>>> {
        let mut frame = [0u8; 4 + MAX_BODY];
        match tokio::time::timeout(IDLE, stream.read_exact(&mut frame[..4])).await {
            Ok(Ok(_)) => {}
            // An idle connection is closed like one the peer closed.
            Err(_) => return Ok(None),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Ok(Err(e)) => return Err(e),
        }
        let body = match [frame[0], frame[1], frame[2], frame[3]] {
            MAGIC_HOST | MAGIC_RELEASE => 24,
            MAGIC_NIXL => 28,
            MAGIC_DEVICE => MAX_BODY,
            other => return Ok(Some(Err(BadRequest::Magic(other)))),
        };
        tokio::time::timeout(FRAME_TIME, stream.read_exact(&mut frame[4..4 + body])).await.map_err(
            |_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the rest of a request never came"),
        )??;
        Ok(Some(Self::decode(&frame[..4 + body])))
    }
}

/// Little-endian fields taken off the front of a frame.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], BadRequest> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(BadRequest::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, BadRequest> {
        self.take().map(u64::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, BadRequest> {
        self.take().map(u32::from_le_bytes)
    }

    fn u8(&mut self) -> Result<u8, BadRequest> {
        self.take().map(u8::from_le_bytes)
    }
}

/// The head of an answer: its status and the length of the body after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnswerHead {
    pub(crate) status: u8,
    pub(crate) len: u64,
}

impl AnswerHead {
    /// Bytes of an encoded head.
    pub(crate) const LEN: usize = 9;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut head = [0u8; Self::LEN];
        head[0] = self.status;
        head[1..].copy_from_slice(&self.len.to_le_bytes());
        head
    }

    pub(crate) fn decode(head: [u8; Self::LEN]) -> Self {
        let [status, len @ ..] = head;
        Self { status, len: u64::from_le_bytes(len) }
    }
}

/// What an answer says, from its status and body: the body of a success, else the error.
pub(crate) fn answer_result(status: u8, body: Vec<u8>) -> Result<Vec<u8>, TransferError> {
    match status {
        OK => Ok(body),
        FAILED => Err(serde_json::from_slice(&body)
            .unwrap_or_else(|_| TransferError::Source(String::from_utf8_lossy(&body).into_owned()))),
        s => Err(TransferError::Protocol(format!("status {s}"))),
    }
}

/// The body of a [`FAILED`] answer carrying `e`.
pub(crate) fn error_body(e: &TransferError) -> Vec<u8> {
    serde_json::to_vec(e).unwrap_or_default()
}

/// The body of a successful `XKG1` answer.
pub(crate) fn device_stage_body(stage: &DeviceStage, len: usize) -> Vec<u8> {
    serde_json::to_vec(&(stage, len)).unwrap_or_default()
}

/// The stage and length of a successful `XKG1` answer.
pub(crate) fn decode_device_stage(body: &[u8]) -> Result<(DeviceStage, usize), TransferError> {
    serde_json::from_slice(body).map_err(|e| TransferError::Protocol(format!("a GPU stage answer: {e}")))
}

#[cfg(test)]
mod tests;
