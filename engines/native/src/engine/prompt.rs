//! A prompt's report ([`TokenEvent::Prompt`](xinf_engine::TokenEvent::Prompt)): its ids and
//! text, and with `prompt_logprobs` every prompt token's log-probability, gathered from the
//! logits of every prompt position as the prompt is computed, a chunk at a time.
//!
//! A chunk that returns every position's logits makes a row of the vocabulary's size per token,
//! so such a sequence computes at most [`PromptTally::chunk_rows`] tokens a step; it never takes
//! blocks from the prefix cache (their positions' logits were never computed); and positions
//! computed again after a preemption are counted once.

use crate::model::Row;
use xinf_engine::{PromptLogprobs, PromptReport, TokenLogprobs};
use xinf_models::TextTokenizer;

/// A prompt's report ([`xinf_engine::TokenEvent::Prompt`]) as it is gathered: the prompt
/// tokens' log-probabilities come from the logits of every prompt position, one chunk at a
/// time.
pub(crate) struct PromptTally {
    /// Alternatives reported at each position; `None`: the prompt is reported without
    /// log-probabilities (`echo` alone).
    pub(super) top: Option<usize>,
    /// The log-probabilities of prompt tokens `1..`, as far as computed.
    pub(super) rest: Vec<TokenLogprobs>,
    /// Whether the report went out: a sequence recomputed after preemption reports nothing
    /// again.
    pub(super) sent: bool,
    /// The most tokens of a chunk that returns every position's logits: each is a row of the
    /// vocabulary's size.
    pub(super) chunk_rows: usize,
}

/// The most bytes of logits a chunk that returns every position's logits may make (F32 rows
/// of the vocabulary's size): 64 MiB, about 340 positions of a 49k vocabulary.
const PROMPT_LOGIT_BYTES: usize = 64 << 20;

impl PromptTally {
    /// The tally of a request that asks for its prompt with `top` alternatives (if any), for
    /// a vocabulary of `vocab` tokens.
    pub(super) fn new(top: Option<usize>, vocab: usize) -> Self {
        let chunk_rows = (PROMPT_LOGIT_BYTES / (4 * vocab.max(1))).max(16);
        Self { top, rest: Vec::new(), sent: false, chunk_rows }
    }

    /// Whether a chunk of a `prompt_len`-token prompt must return every position's logits:
    /// log-probabilities are asked for and not all of them are known yet.
    pub(super) fn wants_logits(&self, prompt_len: usize) -> bool {
        self.top.is_some() && !self.sent && self.rest.len() + 1 < prompt_len
    }

    /// The report of `prompt`, once: `None` when it went out already.
    pub(super) fn report(&mut self, prompt: &[u32], tokenizer: &TextTokenizer) -> Option<Box<PromptReport>> {
        if self.sent {
            return None;
        }
        self.sent = true;
        let logprobs = self.top.map(|_| PromptLogprobs {
            first: prompt.first().and_then(|&t| tokenizer.decode(&[t], false).ok()).unwrap_or_default(),
            rest: std::mem::take(&mut self.rest),
        });
        let text = tokenizer.decode(prompt, false).unwrap_or_default();
        Some(Box::new(PromptReport { token_ids: prompt.to_vec(), text, logprobs }))
    }

    /// Adds the log-probabilities of the prompt tokens that `rows` give: the logits of every
    /// position from `start` on, of a sequence of `tokens` whose first `prompt_len` are the
    /// prompt.
    pub(super) fn tally(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        start: usize,
        rows: &[Row],
        tokenizer: &TextTokenizer,
    ) {
        let top = self.top.unwrap_or(0);
        // Row `i` holds position `start + i`'s logits, which give the next token's probability.
        for (p, row) in (start..).zip(rows) {
            let Some(&next) = tokens.get(p + 1).filter(|_| p + 1 < prompt_len) else { break };
            // Positions tallied before a preemption are computed again but counted once.
            if p != self.rest.len() {
                continue;
            }
            if let Row::Logits(row) = row {
                self.rest.push(crate::logprobs::token_logprobs(row, next, top, tokenizer));
            }
        }
    }
}
