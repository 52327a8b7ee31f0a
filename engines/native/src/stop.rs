//! Stop strings over streamed text.
//!
//! Decoded text arrives a token at a time, and a stop string can span several tokens. A client
//! must never see any part of a stop string, so text that could still turn into one is held
//! back until it either completes a stop string (and is dropped with everything after it) or
//! stops being a possible start of one (and is released).

#[cfg(test)]
mod tests;

/// What the caller does with a piece of streamed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopOutcome {
    /// No stop string yet: send `emit` (possibly empty) and keep generating.
    Continue {
        /// Text that is safe to send.
        emit: String,
    },
    /// A stop string appeared: send `emit`, the text before it, and finish the request.
    Stopped {
        /// The last text to send.
        emit: String,
    },
}

/// Finds the first of a request's stop strings in its streamed output.
#[derive(Debug, Clone)]
pub(crate) struct StopMatcher {
    /// The stop strings, none empty.
    stops: Vec<String>,
    /// Text not yet emitted because it ends with the beginning of a stop string. Always shorter
    /// than the longest stop string.
    held: String,
    /// Set once a stop string was found; later text is discarded.
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored: they would match before any text
    /// (request validation rejects them anyway).
    pub(crate) fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether there are stop strings to look for (text may then be held back).
    pub(crate) fn has_stops(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Takes the next piece of decoded text and says what can be sent.
    ///
    /// Once it has returned [`StopOutcome::Stopped`], every later call returns `Stopped` with
    /// nothing to emit.
    pub(crate) fn push(&mut self, delta: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Stopped { emit: String::new() };
        }
        if self.stops.is_empty() {
            return StopOutcome::Continue { emit: delta.to_owned() };
        }
        self.held.push_str(delta);
        // The held text contains no complete stop string, so searching it all (it is short)
        // finds exactly the matches that the new text completes. Earliest start wins.
        let first = self.stops.iter().filter_map(|stop| self.held.find(stop.as_str())).min();
        if let Some(at) = first {
            self.held.truncate(at);
            self.stopped = true;
            return StopOutcome::Stopped { emit: std::mem::take(&mut self.held) };
        }
        let keep_from = self.partial_match_start();
        let rest = self.held.split_off(keep_from);
        StopOutcome::Continue { emit: std::mem::replace(&mut self.held, rest) }
    }

    /// The held-back text, at the end of a generation that did not stop on a stop string.
    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Where the longest suffix of the held text that begins some stop string starts, or the
    /// held length when there is none.
    fn partial_match_start(&self) -> usize {
        let text = self.held.as_str();
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A complete stop string would have matched, so the suffix is shorter than the longest.
        let earliest = text.len().saturating_sub(longest.saturating_sub(1));
        (earliest..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .find(|&i| {
                let suffix = &text.as_bytes()[i..];
                self.stops.iter().any(|stop| stop.as_bytes().starts_with(suffix))
            })
            .unwrap_or(text.len())
    }
}
