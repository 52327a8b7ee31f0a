//! A request inside the engine: its tokens, the KV blocks that hold them, and where its output
//! goes.

use super::prompt::PromptTally;
use super::scheduler::{Fresh, Schedulable};
use crate::detok::Detokenizer;
use crate::grammar::Constraint;
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use tokio::sync::{mpsc, oneshot};
use xinf_engine::{EngineError, KvPages, PinnedPrefill, TokenEvent, TokenLogprobs};

/// Where a generating request's events go.
pub(super) type EventTx = mpsc::UnboundedSender<Result<TokenEvent, EngineError>>;

/// Where a pinned prefill's answer goes.
pub(super) type PinnedReply = oneshot::Sender<Result<PinnedPrefill, EngineError>>;

/// What happens when a sequence has its first sampled token.
pub(super) enum Mode {
    /// Ordinary generation: stream every token.
    Generate,
    /// Prefill for export: reply with the first token and keep the KV pinned.
    Pinned(Option<PinnedReply>),
}

/// One request as the compute thread runs it: its tokens (the prompt, then what was sampled),
/// how far the cache holds them, and how its output is cut and streamed.
pub(super) struct Seq {
    pub(super) id: String,
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    /// Tokens whose K and V are in the cache.
    pub(super) computed: usize,
    pub(super) table: Vec<u32>,
    pub(super) max_tokens: usize,
    pub(super) sampler: Sampler,
    pub(super) stop: StopMatcher,
    pub(super) detok: Detokenizer,
    pub(super) stop_ids: Vec<u32>,
    /// Output tokens before a stop id may be sampled (`min_tokens`).
    pub(super) min_tokens: usize,
    pub(super) tx: EventTx,
    pub(super) mode: Mode,
    /// Canonical pages to scatter into the cache on admission.
    pub(super) import: Option<Import>,
    /// Tokens already known not to need sampling (an imported first token), with the
    /// log-probabilities the prefill side reported for it.
    pub(super) preset: Option<(u32, Option<Box<TokenLogprobs>>)>,
    /// Alternatives to report with each token's log-probabilities; `None`: none reported.
    pub(super) logprobs: Option<usize>,
    /// A pinned prefill's first token's log-probabilities, for its answer.
    pub(super) first_logprobs: Option<Box<TokenLogprobs>>,
    /// The shape the output must take (`response_format`), where the request gave one.
    pub(super) constraint: Option<Constraint>,
    /// The prefix-cache keys of the table's first full blocks, as far as they are known.
    pub(super) block_keys: Vec<u64>,
    /// What the request asked to be told of its prompt, gathered as the prompt is computed.
    pub(super) prompt: Option<PromptTally>,
}

/// Prompt KV given to a sequence instead of computed.
pub(super) struct Import {
    /// Canonical pages, back to back (host memory, or received into this engine's GPU).
    pub(super) pages: KvPages,
    /// Prompt tokens the pages cover (scattered into the cache).
    pub(super) tokens: usize,
    /// Tokens of cache to hold on admission.
    pub(super) need: usize,
}

impl Seq {
    /// Whether the next chunk must return the logits of every position (prompt
    /// log-probabilities not all known yet).
    pub(super) fn wants_prompt_logits(&self) -> bool {
        self.prompt.as_ref().is_some_and(|t| t.wants_logits(self.prompt_len))
    }

    /// Whether the next token may not be a stop id yet (`min_tokens` not reached).
    pub(super) fn holds_stops(&self) -> bool {
        self.tokens.len() - self.prompt_len < self.min_tokens && !self.stop_ids.is_empty()
    }
}

impl Schedulable for Seq {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn computed(&self) -> usize {
        self.computed
    }

    fn table(&mut self) -> &mut Vec<u32> {
        &mut self.table
    }

    fn held_blocks(&self) -> usize {
        self.table.len()
    }

    fn import_need(&self) -> Option<usize> {
        self.import.as_ref().map(|i| i.need)
    }

    fn forget(&mut self) {
        self.computed = 0;
        self.import = None;
        self.block_keys.clear();
    }

    fn fresh(&mut self) -> Option<Fresh<'_>> {
        // Prompt log-probabilities need every position's logits: nothing comes from the cache.
        let fresh = self.computed == 0
            && self.import.is_none()
            && self.table.is_empty()
            && !self.wants_prompt_logits();
        fresh.then_some((&self.tokens, self.prompt_len, &mut self.table, &mut self.block_keys))
    }

    fn set_computed(&mut self, tokens: usize) {
        self.computed = tokens;
    }

    fn known(&self) -> (&[u32], usize) {
        (&self.tokens, self.prompt_len)
    }

    fn chunk_limit(&self) -> usize {
        match &self.prompt {
            Some(t) if self.wants_prompt_logits() => t.chunk_rows,
            _ => usize::MAX,
        }
    }
}
