//! Picks the next token from a row of logits, with vLLM's sampling semantics.
//!
//! The order of the steps is vLLM's (v0 sampler): `logit_bias`, penalties (repetition, then
//! frequency and presence), then greedy argmax or temperature, top-k, top-p, min-p and a draw
//! from the softmax. Clients tune these knobs against vLLM and OpenAI, so the same settings
//! must mean the same thing here.
//!
//! The sampler runs on the CPU once per generated token of every request, over vocabularies of
//! 50k–150k entries, so it avoids full sorts where it can (partial selection for top-k and
//! top-p) and reuses its scratch buffers instead of allocating per call. It never panics on odd
//! input: NaN logits count as `-inf`, out-of-vocabulary token ids in the history are ignored,
//! and parameters outside their validated ranges are clamped to something sensible.

use std::cmp::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xinf_engine::SamplingParams;

#[cfg(test)]
mod tests;

/// How many candidates top-p sorts first; the nucleus of a peaked distribution usually fits, and
/// each further round takes [`TOP_P_GROWTH`] times as many.
const TOP_P_FIRST_ROUND: usize = 64;
/// Growth factor of the candidate window between top-p rounds.
const TOP_P_GROWTH: usize = 4;

/// The sampling state of one request: its settings, its random generator and scratch space.
pub(crate) struct Sampler {
    /// Non-positive (or NaN) means greedy.
    temperature: f32,
    /// 0 keeps every token.
    top_k: usize,
    /// 1 disables nucleus sampling.
    top_p: f32,
    /// 0 disables; clamped to at most 1 so the top token always survives.
    min_p: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    repetition_penalty: f32,
    /// Added to these tokens' logits first.
    logit_bias: Vec<(u32, f32)>,
    /// Seeded from the request's seed for reproducible output, from the OS otherwise.
    rng: StdRng,
    /// `(value, token)` candidates: logits while selecting by rank, then unnormalised
    /// probabilities `exp((logit - max) / temperature)`.
    candidates: Vec<(f32, u32)>,
    /// Per-token stamps that deduplicate the history when applying penalties; a token is marked
    /// when `marks[token] == stamp`, so clearing is a counter increment, not a pass over the
    /// vocabulary.
    marks: Vec<u32>,
    /// The current mark value.
    stamp: u32,
}

impl Sampler {
    /// A sampler for a request with `params`.
    pub(crate) fn new(params: &SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::try_from_os_rng().unwrap_or_else(|_| StdRng::seed_from_u64(fallback_seed())),
        };
        Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p.clamp(0.0, 1.0),
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            repetition_penalty: params.repetition_penalty,
            logit_bias: params.logit_bias.clone(),
            rng,
            candidates: Vec::new(),
            marks: Vec::new(),
            stamp: 0,
        }
    }

    /// Draws, and drops, the random number of a token sampled elsewhere: the first token a
    /// prefill replica sampled under the same seed. A seeded request then goes on with the
    /// numbers an ordinary replica would draw for its later tokens, and answers the same.
    pub(crate) fn skip_draw(&mut self) {
        if !self.is_greedy() {
            let _ = self.rng.random::<f64>();
        }
    }

    /// Whether sampling reduces to argmax. Like [`SamplingParams::is_greedy`], plus negative or
    /// NaN temperatures, which have no sampling meaning.
    fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the next token is the largest logit as the backend computed it: greedy, and no
    /// bias or penalty that changes the logits first.
    pub(crate) fn is_argmax(&self) -> bool {
        self.is_greedy()
            && self.logit_bias.is_empty()
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && (self.repetition_penalty == 1.0
                || !self.repetition_penalty.is_finite()
                || self.repetition_penalty <= 0.0)
    }

    /// Chooses the next token from `logits` (one per vocabulary entry), given the `prompt` and
    /// the `output` generated so far.
    ///
    /// The bias and the penalties are applied to `logits` in place (a biased token outside the
    /// row is ignored). Greedy settings draw no random numbers,
    /// so a seeded request that mixes greedy and sampled steps stays reproducible.
    pub(crate) fn sample(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) -> u32 {
        for &(id, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits, prompt, output);
        let (best, max) = argmax(logits);
        // All `-inf`/NaN: nothing to sample from. `+inf`: the softmax puts all mass on it.
        if self.is_greedy() || !max.is_finite() {
            return best;
        }
        self.sample_filtered(logits, max)
    }

    /// Repetition penalty over prompt ∪ output (HF: divide positive logits, multiply negative
    /// ones), then OpenAI's frequency and presence penalties over the output.
    fn apply_penalties(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        let repetition = self.repetition_penalty;
        let repetition_active = repetition != 1.0 && repetition.is_finite() && repetition > 0.0;
        let frequency = self.frequency_penalty;
        let presence = self.presence_penalty;
        let additive_active = (frequency != 0.0 || presence != 0.0) && !output.is_empty();
        if !repetition_active && !additive_active {
            return;
        }
        if self.marks.len() != logits.len() {
            self.marks.clear();
            self.marks.resize(logits.len(), 0);
            self.stamp = 0;
        }
        if repetition_active {
            let stamp = self.next_stamp();
            for &token in prompt.iter().chain(output) {
                let t = token as usize;
                if let (Some(mark), Some(logit)) = (self.marks.get_mut(t), logits.get_mut(t))
                    && *mark != stamp
                {
                    *mark = stamp;
                    *logit = if *logit > 0.0 { *logit / repetition } else { *logit * repetition };
                }
            }
        }
        if additive_active {
            let stamp = self.next_stamp();
            for &token in output {
                let t = token as usize;
                if let (Some(mark), Some(logit)) = (self.marks.get_mut(t), logits.get_mut(t)) {
                    // frequency × count, applied once per occurrence.
                    *logit -= frequency;
                    if *mark != stamp {
                        *mark = stamp;
                        *logit -= presence;
                    }
                }
            }
        }
    }

    /// A mark value no token carries yet.
    fn next_stamp(&mut self) -> u32 {
        if self.stamp == u32::MAX {
            self.marks.fill(0);
            self.stamp = 0;
        }
        self.stamp += 1;
        self.stamp
    }

    /// Temperature, top-k, top-p and min-p, then a draw. `max` is the largest logit (finite).
    fn sample_filtered(&mut self, logits: &[f32], max: f32) -> u32 {
        let temperature = self.temperature;
        // `(x - max) / T <= 0`, so the weights are in [0, 1] with exactly 1 for the top token
        // and nothing overflows, however small the temperature.
        // A NaN (NaN logit, `-inf / inf`) counts as zero probability.
        let weight = |x: f32| {
            let w = ((x - max) / temperature).exp();
            if w >= 0.0 { w } else { 0.0 }
        };
        let candidates = &mut self.candidates;
        candidates.clear();

        // Rank-based filtering works on logits: dividing by T > 0 and exp keep the order.
        let mut sorted = false;
        if self.top_k > 0 && self.top_k < logits.len() {
            candidates.extend(logits.iter().zip(0u32..).map(|(&x, i)| (nan_to_neg_inf(x), i)));
            candidates.select_nth_unstable_by(self.top_k - 1, by_value_desc);
            candidates.truncate(self.top_k);
            candidates.sort_unstable_by(by_value_desc);
            sorted = true;
            for c in candidates.iter_mut() {
                c.0 = weight(c.0);
            }
        } else {
            candidates.extend(logits.iter().zip(0u32..).map(|(&x, i)| (weight(x), i)));
        }

        // vLLM keeps a token when the mass of the tokens ranked above it is below top_p (the
        // smallest prefix reaching top_p), and always the top token. The mass is relative to
        // what top-k left.
        if self.top_p < 1.0 {
            let total: f64 = candidates.iter().map(|c| f64::from(c.0)).sum();
            let target = f64::from(self.top_p) * total;
            let keep = if sorted {
                nucleus_len(candidates, 0, 0.0, target).0
            } else {
                top_p_select(candidates, target)
            };
            candidates.truncate(keep);
            sorted = true;
        }

        // min-p: probability at least min_p times the top one, i.e. weight >= min_p.
        if self.min_p > 0.0 {
            let min_p = self.min_p;
            if sorted {
                let keep = candidates.partition_point(|c| c.0 >= min_p).max(1);
                candidates.truncate(keep);
            } else {
                candidates.retain(|c| c.0 >= min_p);
            }
        }

        let total: f64 = candidates.iter().map(|c| f64::from(c.0)).sum();
        let mut remaining = self.rng.random::<f64>() * total;
        let mut fallback = None;
        for &(w, token) in candidates.iter() {
            if w > 0.0 {
                let w = f64::from(w);
                if remaining < w {
                    return token;
                }
                remaining -= w;
                fallback = Some(token);
            }
        }
        // Rounding can leave `remaining` a hair above the last weight.
        fallback.unwrap_or_else(|| argmax(logits).0)
    }
}

/// Orders candidates by value, largest first, then by token id, so that selection and sorting
/// give the same result on every run (seeded reproducibility).
fn by_value_desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// NaN ranks with `-inf`.
fn nan_to_neg_inf(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// The first index of the largest value (NaN counts as `-inf`) and that value; `(0, -inf)` for
/// an empty slice.
fn argmax(values: &[f32]) -> (u32, f32) {
    let mut best = 0u32;
    let mut max = f32::NEG_INFINITY;
    for (&x, i) in values.iter().zip(0u32..) {
        if x > max {
            best = i;
            max = x;
        }
    }
    (best, max)
}

/// Walks candidates sorted from `start` on, with `mass` the weight of those before `start`, and
/// returns how many make up the nucleus (capped at `candidates.len()`) and whether it closed
/// within them.
fn nucleus_len(candidates: &[(f32, u32)], start: usize, mut mass: f64, target: f64) -> (usize, f64, bool) {
    for (i, c) in candidates.iter().enumerate().skip(start) {
        if i > 0 && mass >= target {
            return (i, mass, true);
        }
        mass += f64::from(c.0);
    }
    (candidates.len(), mass, false)
}

/// Sorts just enough of the unsorted `candidates` to find the top-p nucleus: the top 64 first,
/// then 4× more per round. Returns the nucleus size; `candidates[..size]` is sorted.
fn top_p_select(candidates: &mut [(f32, u32)], target: f64) -> usize {
    let len = candidates.len();
    if len == 0 {
        return 0;
    }
    let mut done = 0;
    let mut mass = 0.0;
    let mut window = TOP_P_FIRST_ROUND.min(len);
    loop {
        let rest = &mut candidates[done..];
        let want = window - done;
        if want < rest.len() {
            rest.select_nth_unstable_by(want - 1, by_value_desc);
        }
        rest[..want].sort_unstable_by(by_value_desc);
        let (keep, new_mass, closed) = nucleus_len(&candidates[..window], done, mass, target);
        if closed || window == len {
            return keep;
        }
        done = window;
        mass = new_mass;
        window = window.saturating_mul(TOP_P_GROWTH).min(len);
    }
}

/// A seed for the rare host where the OS generator fails: std's per-thread hash keys (varied per
/// instance) mixed with the clock, so requests without a seed still differ.
fn fallback_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(elapsed) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(elapsed.as_nanos());
    }
    hasher.finish()
}
