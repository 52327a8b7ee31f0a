//! Server-sent events, as both engine servers stream them: `data: <payload>` lines separated by
//! blank lines. Only `data` fields matter here.

use xinf_engine::EngineError;

/// The longest event xinf accepts from an engine; a stream that never ends an event within it
/// is broken.
const MAX_EVENT_BYTES: usize = 8 << 20;

/// Splits a byte stream into the `data` payloads of its events.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    buf: Vec<u8>,
}

impl SseDecoder {
    /// Adds bytes and returns the payloads of the events they complete.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, EngineError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = find_event_end(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end.0 + end.1).take(end.0).collect();
            out.extend(payload(&String::from_utf8_lossy(&event)));
        }
        if self.buf.len() > MAX_EVENT_BYTES {
            return Err(EngineError::Process(format!(
                "the engine sent an event longer than {MAX_EVENT_BYTES} bytes"
            )));
        }
        Ok(out)
    }

    /// The payload of a last event the stream ended without a blank line after.
    pub(crate) fn finish(&mut self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        payload(&text)
    }
}

/// The `data` of one event (its `data:` lines joined), if it has any.
fn payload(event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    (!data.is_empty()).then(|| data.join("\n"))
}

/// Where the first event ends: `(length of the event, length of the separator)`.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
