//! The log-probabilities a request may ask for with each generated token: a log-softmax of the
//! model's raw logits (before penalties, temperature or filters, as vLLM reports them), the
//! chosen token's and the most likely tokens'.

use xinf_engine::{Logprob, TokenLogprobs};
use xinf_models::TextTokenizer;

/// The log-probabilities of `chosen` and of the `top` most likely tokens under `logits`, the
/// tokens' texts decoded alone with `tokenizer`.
///
/// The normaliser is summed in F64, so a 150k-word vocabulary loses no precision to the sum; a
/// NaN logit counts as minus infinity (probability 0).
pub(crate) fn token_logprobs(
    logits: &[f32],
    chosen: u32,
    top: usize,
    tokenizer: &TextTokenizer,
) -> TokenLogprobs {
    let value = |i: usize| logits.get(i).copied().map_or(f32::NEG_INFINITY, finite_or_min);
    let lse = log_sum_exp(logits);
    let entry = |id: u32| Logprob {
        token_id: id,
        token: tokenizer.decode(&[id], false).unwrap_or_default(),
        logprob: (f64::from(value(id as usize)) - lse) as f32,
    };
    let top = most_likely(logits, top).into_iter().map(entry).collect();
    TokenLogprobs { chosen: entry(chosen), top, rank: Some(rank(logits, value(chosen as usize))) }
}

/// The rank of `value` among `logits`: 1 plus how many are larger (NaN counts as minus
/// infinity), so equal values share the better rank.
fn rank(logits: &[f32], value: f32) -> u32 {
    let larger = logits.iter().filter(|&&x| finite_or_min(x) > value).count();
    u32::try_from(larger).unwrap_or(u32::MAX).saturating_add(1)
}

/// NaN as minus infinity; everything else as it is.
fn finite_or_min(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// `ln Σ exp(x)`, shifted by the largest value so that no term overflows. Each term is an F32
/// exponential (the row is a step's work on the engine's thread), their sum is F64.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().map(finite_or_min).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::from(max);
    }
    let sum: f64 = logits.iter().map(|&x| f64::from((finite_or_min(x) - max).exp())).sum();
    f64::from(max) + sum.ln()
}

/// The ids of the `n` largest logits, largest first, equal values by ascending id: one pass
/// that keeps the best `n` so far (`n` is at most 20), where most values lose at the first
/// comparison.
fn most_likely(logits: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    for (id, &x) in (0u32..).zip(logits) {
        let x = finite_or_min(x);
        // A full list keeps its last entry over an equal value: that one has the lower id.
        if best.len() == n && best.last().is_some_and(|&(last, _)| x <= last) {
            continue;
        }
        // After the equal values: they have lower ids.
        let at = best.partition_point(|&(v, _)| v >= x);
        best.insert(at, (x, id));
        best.truncate(n);
    }
    best.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_come_first_and_ties_go_by_id() {
        let logits = [1.0, 3.0, f32::NAN, 3.0, -2.0, 2.5];
        assert_eq!(most_likely(&logits, 3), [1, 3, 5]);
        assert_eq!(most_likely(&logits, 0), Vec::<u32>::new());
        assert_eq!(most_likely(&logits, 10), [1, 3, 5, 0, 4, 2]);
    }

    #[test]
    fn log_probabilities_are_a_log_softmax() {
        let logits = [0.5f32, -1.0, 2.0, 0.0];
        let total: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        // F32 exponentials: within a few units of F32's last place.
        let lse = log_sum_exp(&logits);
        assert!((lse - total.ln()).abs() < 1e-6, "{lse} against {}", total.ln());
        // Large logits do not overflow.
        let big = [1000.0f32, 1000.0];
        assert!((log_sum_exp(&big) - (1000.0 + 2f64.ln())).abs() < 1e-6);
        assert_eq!(log_sum_exp(&[f32::NAN, f32::NEG_INFINITY]), f64::NEG_INFINITY);
    }

    #[test]
    fn ranks_count_the_larger_values() {
        let logits = [1.0, 3.0, f32::NAN, 3.0, -2.0, 2.5];
        assert_eq!(rank(&logits, 3.0), 1);
        assert_eq!(rank(&logits, 2.5), 3);
        assert_eq!(rank(&logits, -2.0), 5);
        assert_eq!(rank(&logits, f32::NEG_INFINITY), 6);
    }
}
