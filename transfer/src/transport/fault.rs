//! Fault injection, a test knob: `XINF_TRANSFER_FAULT`, read once by the serving process, makes
//! its page server misbehave so that tests can check that clients fail promptly and typed:
//!
//! - `cut-after:<N>`: close the connection after writing `N` bytes (header included) of a
//!   successful answer, i.e. a transfer cut mid-frame; the client gets [`TransferError::Io`];
//! - `nixl-error`: answer a NIXL request with a range that is not registered memory, so the
//!   client's NIXL read fails with [`TransferError::Nixl`].
//!
//! Errors are never cut: only successful answers are.
//!
//! [`TransferError::Io`]: crate::transport::TransferError::Io
//! [`TransferError::Nixl`]: crate::transport::TransferError::Nixl

use std::sync::OnceLock;

/// A misbehaviour of the page server, for tests (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Fault {
    /// Serve correctly.
    #[default]
    None,
    /// Close the connection after writing this many bytes of a successful answer.
    CutAfter(u64),
    /// Answer NIXL requests with a range that is not registered memory.
    NixlError,
}

impl Fault {
    /// `XINF_TRANSFER_FAULT` of this process, read once (an unknown value is logged, ignored).
    pub(crate) fn from_env() -> Self {
        static FAULT: OnceLock<Fault> = OnceLock::new();
        *FAULT.get_or_init(|| {
            let Ok(spec) = std::env::var("XINF_TRANSFER_FAULT") else { return Fault::None };
            match Fault::parse(&spec) {
                Some(f) => {
                    tracing::warn!(fault = spec, "the page server injects a fault (XINF_TRANSFER_FAULT)");
                    f
                }
                None => {
                    tracing::warn!(fault = spec, "unknown XINF_TRANSFER_FAULT, ignored");
                    Fault::None
                }
            }
        })
    }

    fn parse(spec: &str) -> Option<Self> {
        match spec.trim() {
            "" | "none" => Some(Fault::None),
            "nixl-error" => Some(Fault::NixlError),
            s => s.strip_prefix("cut-after:").and_then(|n| n.trim().parse().ok()).map(Fault::CutAfter),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fault;

    #[test]
    fn faults_parse() {
        assert_eq!(Fault::parse("cut-after:4096"), Some(Fault::CutAfter(4096)));
        assert_eq!(Fault::parse("nixl-error"), Some(Fault::NixlError));
        assert_eq!(Fault::parse(""), Some(Fault::None));
        assert_eq!(Fault::parse("cut-after:"), None);
        assert_eq!(Fault::parse("explode"), None);
    }
}
