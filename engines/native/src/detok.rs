//! Incremental detokenization: text deltas for a growing list of token ids.
//!
//! Decoding one token at a time is wrong for byte-level and SentencePiece tokenizers (a
//! character may span tokens; a leading space depends on the previous token). As in TGI, the
//! text of a small window of recent tokens is decoded twice, with and without the newest
//! tokens, and only the difference is emitted, and only once it is not a partial character.

use xinf_models::TextTokenizer;

/// Offsets of the decoding window into a sequence's token list.
pub(crate) struct Detokenizer {
    prefix_offset: usize,
    read_offset: usize,
}

impl Detokenizer {
    /// Starts after a prompt of `prompt_len` tokens, using a few prompt tokens as context.
    pub(crate) fn new(prompt_len: usize) -> Self {
        Self { prefix_offset: prompt_len.saturating_sub(5), read_offset: prompt_len }
    }

    /// Text completed by the newest token(s) of `tokens`; empty while a character is partial.
    pub(crate) fn step(&mut self, tok: &TextTokenizer, tokens: &[u32]) -> String {
        let prefix = tok.decode(&tokens[self.prefix_offset..self.read_offset], true).unwrap_or_default();
        let text = tok.decode(&tokens[self.prefix_offset..], true).unwrap_or_default();
        if text.len() > prefix.len() && !text.ends_with('\u{FFFD}') {
            let delta = text.get(prefix.len()..).map(str::to_owned).unwrap_or_default();
            self.prefix_offset = self.read_offset;
            self.read_offset = tokens.len();
            delta
        } else {
            String::new()
        }
    }
}
