//! What an answer shows of its prompt: the completions API's `echo` (the prompt's text before
//! the output and, with `logprobs`, its tokens' log-probabilities first) and vLLM's
//! `prompt_logprobs` (every prompt token's, in vLLM's shape).
//!
//! The engine reports the prompt as it took it ([`PromptReport`]); this decides what of it
//! each choice shows.

use crate::api::error::Problem;
use crate::api::logprobs::{PromptLogprobsOut, TextLogprobs};
use futures::StreamExt;
use xinf_engine::{FinishReason, MAX_TOP_LOGPROBS, PromptReport, TokenEvent, TokenStream, Usage};

/// vLLM's `prompt_logprobs` as a request gives it: at most [`MAX_TOP_LOGPROBS`] alternatives,
/// and, as vLLM has it, none to list in a stream (whose chunks have no place for them).
pub(crate) fn read_prompt_logprobs(value: Option<u64>, stream: bool) -> Result<Option<usize>, Problem> {
    match value {
        Some(n) if n > MAX_TOP_LOGPROBS as u64 => {
            Err(Problem::field("prompt_logprobs", "api-logprobs-too-many", "invalid_value"))
        }
        Some(n) if stream && n > 0 => {
            Err(Problem::field("prompt_logprobs", "api-prompt-logprobs-stream", "invalid_value"))
        }
        // A stream shows no prompt log-probabilities: nothing to compute.
        Some(_) if stream => Ok(None),
        n => Ok(n.map(|n| n as usize)),
    }
}

/// What a request asked to see of its prompt.
#[derive(Debug, Clone, Default)]
pub(crate) struct PromptShown {
    /// The completions API's `echo`: per prompt of the request, the text the client gave, shown
    /// as given; `None` for a prompt of token ids, whose decoding the engine reports.
    pub(crate) echo: Option<Vec<Option<String>>>,
    /// With `echo`, the alternatives listed for each echoed token (the completions API's
    /// `logprobs`); `None`: the echo has no log-probabilities.
    pub(crate) echo_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: the alternatives listed at each prompt position.
    pub(crate) prompt_logprobs: Option<usize>,
    /// `echo` with `max_tokens: 0`: the answer shows the prompt alone (see [`prompt_only`]).
    pub(crate) prompt_only: bool,
}

/// A choice's events with its output left out, for `echo` with `max_tokens: 0`: the engine
/// generates one token (no engine takes a request for none), which nobody sees; the choice
/// ends by its length, having generated nothing.
pub(crate) fn prompt_only(tokens: TokenStream) -> TokenStream {
    tokens
        .filter_map(|event| async move {
            match event {
                Ok(TokenEvent::Delta { .. }) => None,
                Ok(TokenEvent::Finished { usage, .. }) => Some(Ok(TokenEvent::Finished {
                    reason: FinishReason::Length,
                    usage: Usage { completion_tokens: 0, ..usage },
                })),
                other => Some(other),
            }
        })
        .boxed()
}

impl PromptShown {
    /// The alternatives the engine reports at each prompt position: enough for both uses.
    pub(crate) fn engine_count(&self) -> Option<usize> {
        match (self.echo_logprobs, self.prompt_logprobs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The text echoed before the output of the choice at `index` (`per_prompt` choices a
    /// prompt); `None` without `echo`.
    pub(crate) fn text(
        &self,
        index: usize,
        per_prompt: usize,
        report: Option<&PromptReport>,
    ) -> Option<String> {
        let given = self.echo.as_ref()?.get(index / per_prompt.max(1)).cloned().flatten();
        Some(given.unwrap_or_else(|| report.map(|r| r.text.clone()).unwrap_or_default()))
    }

    /// The echoed prompt's log-probabilities and the characters they span (where the output's
    /// offsets start); `None` unless `echo` and `logprobs` were both asked for.
    pub(crate) fn text_logprobs(&self, report: Option<&PromptReport>) -> Option<(TextLogprobs, usize)> {
        let top = self.echo.as_ref().and(self.echo_logprobs)?;
        let logprobs = report?.logprobs.as_ref()?;
        Some(TextLogprobs::of_prompt(logprobs, top))
    }

    /// vLLM's `prompt_logprobs` of a choice; `None` when not asked for.
    pub(crate) fn vllm(&self, report: Option<&PromptReport>) -> Option<PromptLogprobsOut> {
        let top = self.prompt_logprobs?;
        let logprobs = report?.logprobs.as_ref()?;
        Some(PromptLogprobsOut::new(logprobs, top))
    }
}
