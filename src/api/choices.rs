//! Several choices for one request (`n` > 1), or several prompts (a completions batch): each
//! choice of each prompt is an engine request of its own, `<id>-<index>` with index `k·n + i` for
//! prompt `k`'s choice `i`, as OpenAI numbers them. Choice `i` gets the seed plus `i` when a seed
//! is given (so that a prompt's choices differ and each is reproducible). All run side by side. Their token streams are merged, each
//! event tagged with its choice's index. Aborting the request's id aborts every choice: the
//! abort route looks the id up in [`Fanouts`].

use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use xinf_engine::{EngineError, GenerateRequest, TokenEvent, TokenStream};

/// The most choices one request may ask for: each is a sequence of its own in the engine.
pub(crate) const MAX_CHOICES: usize = 16;

/// The most engine requests (prompts × choices) one request may start: a batch's sequences all
/// wait in one engine's queue at once, and half the default queue leaves room for others.
pub(crate) const MAX_FANOUT: usize = 128;

/// Token events of every choice of a request, each with its choice's index.
pub(crate) type ChoiceStream = BoxStream<'static, (usize, Result<TokenEvent, EngineError>)>;

/// The engine request of each of `n` choices of each of `requests` (one per prompt, all with the
/// request's id), in choice-index order; a lone prompt's lone choice is the request itself.
pub(crate) fn split(requests: Vec<GenerateRequest>, n: usize) -> Vec<GenerateRequest> {
    if n == 1 && requests.len() == 1 {
        return requests;
    }
    let mut out = Vec::with_capacity(requests.len() * n);
    for (k, request) in requests.into_iter().enumerate() {
        for i in 0..n {
            let mut r = request.clone();
            r.request_id = choice_id(&request.request_id, k * n + i);
            r.sampling.seed = request.sampling.seed.map(|s| s.wrapping_add(i as u64));
            out.push(r);
        }
    }
    out
}

/// The engine request id of choice `index` of request `id`.
pub(crate) fn choice_id(id: &str, index: usize) -> String {
    format!("{id}-{index}")
}

/// The choices' streams as one, in the order events come.
pub(crate) fn merge(streams: Vec<TokenStream>) -> ChoiceStream {
    let tagged = streams.into_iter().enumerate().map(|(i, s)| s.map(move |e| (i, e)).boxed());
    futures::stream::select_all(tagged).boxed()
}

/// The ids of the requests running with several choices, and their counts.
#[derive(Debug, Default, Clone)]
pub(crate) struct Fanouts(Arc<Mutex<HashMap<String, usize>>>);

impl Fanouts {
    /// Records that `id` runs as `n` choices, until the returned guard is dropped.
    pub(crate) fn register(&self, id: &str, n: usize) -> Registered {
        xinf_transfer::sync::lock(&self.0).insert(id.to_owned(), n);
        Registered { fanouts: self.clone(), id: id.to_owned() }
    }

    /// The engine request ids of `id`'s choices, when it runs as several.
    pub(crate) fn choice_ids(&self, id: &str) -> Vec<String> {
        let n = xinf_transfer::sync::lock(&self.0).get(id).copied().unwrap_or(0);
        (0..n).map(|i| choice_id(id, i)).collect()
    }
}

/// A multi-choice request's entry in [`Fanouts`], removed on drop.
#[derive(Debug)]
pub(crate) struct Registered {
    fanouts: Fanouts,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        xinf_transfer::sync::lock(&self.fanouts.0).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xinf_engine::{Prompt, SamplingParams};

    #[test]
    fn choices_get_their_own_ids_and_seeds() {
        let request = GenerateRequest {
            request_id: "r".into(),
            prompt: Prompt::Text("x".into()),
            sampling: SamplingParams { seed: Some(u64::MAX), ..SamplingParams::default() },
        };
        assert_eq!(split(vec![request.clone()], 1), vec![request.clone()]);
        let three = split(vec![request.clone()], 3);
        let ids: Vec<&str> = three.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, ["r-0", "r-1", "r-2"]);
        let seeds: Vec<Option<u64>> = three.iter().map(|r| r.sampling.seed).collect();
        assert_eq!(seeds, [Some(u64::MAX), Some(0), Some(1)]);
    }

    #[test]
    fn a_batch_numbers_its_choices_prompt_by_prompt() {
        let request = |text: &str| GenerateRequest {
            request_id: "r".into(),
            prompt: Prompt::Text(text.into()),
            sampling: SamplingParams { seed: Some(7), ..SamplingParams::default() },
        };
        let four = split(vec![request("a"), request("b")], 2);
        let got: Vec<(&str, &Prompt, Option<u64>)> =
            four.iter().map(|r| (r.request_id.as_str(), &r.prompt, r.sampling.seed)).collect();
        let (a, b) = (Prompt::Text("a".into()), Prompt::Text("b".into()));
        assert_eq!(
            got,
            [("r-0", &a, Some(7)), ("r-1", &a, Some(8)), ("r-2", &b, Some(7)), ("r-3", &b, Some(8))]
        );
        let alone = split(vec![request("a"), request("b")], 1);
        let ids: Vec<&str> = alone.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, ["r-0", "r-1"]);
    }

    #[test]
    fn a_registration_lasts_as_long_as_its_guard() {
        let f = Fanouts::default();
        let guard = f.register("r", 2);
        assert_eq!(f.choice_ids("r"), ["r-0", "r-1"]);
        assert!(f.choice_ids("other").is_empty());
        drop(guard);
        assert!(f.choice_ids("r").is_empty());
    }
}
