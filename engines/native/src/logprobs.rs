//! The log-probabilities a request may ask for with each generated token: a log-softmax of the
//! model's raw logits (before penalties, temperature or filters, as vLLM reports them), the
//! chosen token's and the most likely tokens'.

use std::cmp::Ordering;
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
    TokenLogprobs { chosen: entry(chosen), top: most_likely(logits, top).into_iter().map(entry).collect() }
}

/// NaN as minus infinity; everything else as it is.
fn finite_or_min(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// `ln Σ exp(x)`, shifted by the largest value so that no term overflows.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().map(finite_or_min).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::from(max);
    }
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&x| (f64::from(finite_or_min(x)) - max).exp()).sum();
    max + sum.ln()
}

/// The ids of the `n` largest logits, largest first, equal values by ascending id.
fn most_likely(logits: &[f32], n: usize) -> Vec<u32> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let order = |a: &u32, b: &u32| {
        let (x, y) = (finite_or_min(logits[*a as usize]), finite_or_min(logits[*b as usize]));
        y.partial_cmp(&x).unwrap_or(Ordering::Equal).then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, order);
        ids.truncate(n);
    }
    ids.sort_unstable_by(order);
    ids
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
        let lse = log_sum_exp(&logits);
        assert!((lse - total.ln()).abs() < 1e-12);
        // Large logits do not overflow.
        let big = [1000.0f32, 1000.0];
        assert!((log_sum_exp(&big) - (1000.0 + 2f64.ln())).abs() < 1e-9);
        assert_eq!(log_sum_exp(&[f32::NAN, f32::NEG_INFINITY]), f64::NEG_INFINITY);
    }
}
