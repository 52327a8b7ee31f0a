//! Local prefill (`max_local_prefill_tokens`): a prefill replica leaves a short prompt to the
//! decode replica, which computes it as an ordinary replica would. A handoff costs a prefill
//! leg, a fetch and a decode leg whatever the prompt's length; a short prompt costs the decode
//! replica less than that.

use super::Handoff;
use serde::{Deserialize, Serialize};
use xinf_engine::{Engine, EngineError, GenerateRequest, ModelContract, Prompt};

/// What a prefill replica answers a prefill with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Prefilled {
    /// The prompt is computed and its KV waits in a room.
    Room(Box<Handoff>),
    /// The prompt is short enough for the decode replica to compute itself
    /// (`max_local_prefill_tokens`): nothing was computed here.
    Local,
}

#[cfg(test)]
impl Prefilled {
    /// The handoff of a prompt that was computed here.
    pub(crate) fn room(self) -> Box<Handoff> {
        match self {
            Self::Room(handoff) => handoff,
            Self::Local => panic!("the prompt was left to the decode replica"),
        }
    }
}

/// Whether a prompt is short enough (`limit` tokens at most; a limit of 0 keeps every prompt)
/// for the decode replica to compute it itself, skipping the handoff. A prompt that stays is
/// given to the engine as the ids counted here, unless the request asks for the prompt's
/// log-probabilities: tokenizing costs about a microsecond a token, on the way to the first
/// token.
pub(super) fn leaves_to_decode(
    engine: &dyn Engine,
    request: &mut GenerateRequest,
    limit: usize,
) -> Result<bool, EngineError> {
    if limit == 0 {
        return Ok(false);
    }
    let ids = engine.prompt_token_ids(&request.prompt)?;
    if ids.len() <= limit {
        admissible(engine.contract(), request, ids.len())?;
        return Ok(true);
    }
    if request.sampling.prompt_logprobs.is_none() {
        request.prompt = Prompt::Tokens(ids);
    }
    Ok(false)
}

/// Refuses here, as the decode replica would, a short prompt's request that no engine of the
/// model takes (bad sampling values, a `logit_bias` token outside the vocabulary, prompt plus
/// `max_tokens` beyond the model's context), so that a prompt counted as left to the decode
/// replica is one it computes. Both replicas share the model's contract (checked at launch).
fn admissible(
    contract: &ModelContract,
    request: &GenerateRequest,
    prompt_len: usize,
) -> Result<(), EngineError> {
    request.sampling.validate()?;
    request.sampling.check_bias_tokens(contract.vocab_size)?;
    request.sampling.max_tokens_within(prompt_len, contract.context_length).map(|_| ())
}
