use super::*;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams { temperature, seed: Some(1234), ..SamplingParams::default() }
}

fn sampler(params: &SamplingParams) -> Sampler {
    Sampler::new(params)
}

/// Draws `n` tokens from the same logits (copied each time, as the engine does per step).
fn draws(sampler: &mut Sampler, logits: &[f32], n: usize) -> Vec<u32> {
    (0..n).map(|_| sampler.sample(&mut logits.to_vec(), &[], &[])).collect()
}

/// Reproducible pseudo-random logits in [-scale, scale).
fn random_logits(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale).collect()
}

/// Token ids sorted by logit, best first (ties by id).
fn ranked(logits: &[f32]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    ids
}

/// The reference top-p nucleus at temperature 1: a full sort, then the smallest prefix whose
/// mass reaches `top_p`.
fn reference_nucleus(logits: &[f32], top_p: f64) -> Vec<u32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The same f32 weights as the sampler, so that the cut is compared exactly.
    let weights: Vec<f64> = logits.iter().map(|&x| f64::from((x - max).exp())).collect();
    let total: f64 = weights.iter().sum();
    let mut mass = 0.0;
    let mut keep = Vec::new();
    for id in ranked(logits) {
        if !keep.is_empty() && mass >= top_p * total {
            break;
        }
        mass += weights[id as usize];
        keep.push(id);
    }
    keep
}

#[test]
fn greedy_is_argmax() {
    let mut s = sampler(&params(0.0));
    assert_eq!(s.sample(&mut [0.1, 2.0, -1.0, 1.5], &[], &[]), 1);
    assert_eq!(s.sample(&mut [-3.0, -2.0, -5.0], &[], &[]), 1);
}

#[test]
fn greedy_ties_go_to_the_lowest_index() {
    let mut s = sampler(&params(0.0));
    assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0], &[], &[]), 1);
    assert_eq!(s.sample(&mut [7.0, 7.0], &[], &[]), 0);
}

#[test]
fn greedy_draws_no_random_numbers() {
    for p in [params(0.0), SamplingParams { top_k: 1, ..params(1.0) }] {
        let mut s = sampler(&p);
        for _ in 0..10 {
            s.sample(&mut [0.5, 1.0, 0.25], &[], &[]);
        }
        let mut fresh = StdRng::seed_from_u64(1234);
        assert_eq!(s.rng.random::<u64>(), fresh.random::<u64>());
    }
}

/// A sampler that skips the first token's draw (sampled elsewhere) goes on as one that drew it.
#[test]
fn skipping_a_draw_continues_the_seeded_sequence() {
    let logits = random_logits(1000, 9, 3.0);
    let p = SamplingParams { seed: Some(5), ..params(1.0) };
    let whole = draws(&mut sampler(&p), &logits, 20);
    let mut rest = sampler(&p);
    rest.skip_draw();
    assert_eq!(draws(&mut rest, &logits, 19), whole[1..]);
    // Greedy settings draw nothing, so nothing is skipped.
    let mut greedy = sampler(&params(0.0));
    greedy.skip_draw();
    assert_eq!(greedy.rng.random::<u64>(), StdRng::seed_from_u64(1234).random::<u64>());
}

#[test]
fn same_seed_same_sequence_different_seed_differs() {
    let logits = random_logits(1000, 7, 3.0);
    let run = |seed: u64, top_k: usize, top_p: f32| {
        let p = SamplingParams { seed: Some(seed), top_k, top_p, ..params(1.0) };
        draws(&mut sampler(&p), &logits, 200)
    };
    for (top_k, top_p) in [(0, 1.0), (50, 1.0), (0, 0.9), (50, 0.9)] {
        assert_eq!(run(42, top_k, top_p), run(42, top_k, top_p));
        assert_ne!(run(42, top_k, top_p), run(43, top_k, top_p));
    }
}

#[test]
fn unseeded_samplers_differ() {
    let logits = random_logits(1000, 7, 1.0);
    let p = SamplingParams { seed: None, ..params(1.0) };
    assert_ne!(draws(&mut sampler(&p), &logits, 50), draws(&mut sampler(&p), &logits, 50));
}

#[test]
fn top_k_one_equals_greedy() {
    for seed in 0..20 {
        let logits = random_logits(5000, seed, 5.0);
        let expected = ranked(&logits)[0];
        let p = SamplingParams { top_k: 1, ..params(1.5) };
        assert!(draws(&mut sampler(&p), &logits, 5).iter().all(|&t| t == expected));
    }
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let logits = random_logits(50_000, 3, 2.0);
    let best: Vec<u32> = ranked(&logits)[..5].to_vec();
    let p = SamplingParams { top_k: 5, temperature: 2.0, ..params(1.0) };
    let seen = draws(&mut sampler(&p), &logits, 2000);
    assert!(seen.iter().all(|t| best.contains(t)));
    // A hot temperature over five close logits reaches all of them.
    assert!(best.iter().all(|t| seen.contains(t)));
}

#[test]
fn tiny_top_p_keeps_only_the_top_token() {
    let logits = random_logits(10_000, 11, 1.0);
    let top = ranked(&logits)[0];
    for top_k in [0, 100] {
        let p = SamplingParams { top_p: 1e-6, top_k, ..params(1.0) };
        assert!(draws(&mut sampler(&p), &logits, 500).iter().all(|&t| t == top));
    }
}

#[test]
fn top_p_matches_a_full_sort() {
    // Flat logits over a large vocabulary make the nucleus span several selection rounds.
    for (seed, scale, top_p) in [(1, 0.5, 0.5), (2, 4.0, 0.9), (3, 12.0, 0.95), (4, 1.0, 0.999)] {
        let logits = random_logits(20_000, seed, scale);
        let nucleus = reference_nucleus(&logits, f64::from(top_p));
        let p = SamplingParams { top_p, ..params(1.0) };
        let mut s = sampler(&p);
        for token in draws(&mut s, &logits, 300) {
            assert!(nucleus.contains(&token), "token {token} outside the nucleus of {}", nucleus.len());
        }
        // The sampler's own cut agrees with the reference one exactly.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut candidates: Vec<(f32, u32)> =
            logits.iter().zip(0u32..).map(|(&x, i)| ((x - max).exp(), i)).collect();
        let total: f64 = candidates.iter().map(|c| f64::from(c.0)).sum();
        let keep = top_p_select(&mut candidates, f64::from(top_p) * total);
        assert_eq!(keep, nucleus.len(), "seed {seed}");
        let mut ours: Vec<u32> = candidates[..keep].iter().map(|c| c.1).collect();
        ours.sort_unstable();
        let mut reference = nucleus.clone();
        reference.sort_unstable();
        assert_eq!(ours, reference);
    }
}

#[test]
fn top_p_applies_after_top_k() {
    // Probabilities 0.4, 0.3, 0.2, 0.1: top_k = 2 leaves 4/7 and 3/7, so top_p = 0.5 keeps only
    // the first; without top_k the nucleus would take two tokens.
    let logits: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
    let p = SamplingParams { top_k: 2, top_p: 0.5, ..params(1.0) };
    assert!(draws(&mut sampler(&p), &logits, 300).iter().all(|&t| t == 0));
    let p = SamplingParams { top_p: 0.5, ..params(1.0) };
    let seen = draws(&mut sampler(&p), &logits, 300);
    assert!(seen.iter().all(|&t| t < 2) && seen.contains(&1));
}

#[test]
fn min_p_drops_tokens_below_the_threshold() {
    // Relative to the top probability 0.5, min_p = 0.2 cuts below 0.1: token 3 (0.05) goes.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let p = SamplingParams { min_p: 0.2, ..params(1.0) };
    let seen = draws(&mut sampler(&p), &logits, 5000);
    assert!(!seen.contains(&3));
    assert!((0..3).all(|t| seen.contains(&t)));
    // Combined with top_k (the sorted path).
    let p = SamplingParams { min_p: 0.2, top_k: 3, ..params(1.0) };
    assert!(!draws(&mut sampler(&p), &logits, 2000).contains(&3));
    // min_p = 1 keeps the top token only.
    let p = SamplingParams { min_p: 1.0, ..params(1.0) };
    assert!(draws(&mut sampler(&p), &logits, 500).iter().all(|&t| t == 0));
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    let p = SamplingParams { repetition_penalty: 1.25, ..params(0.0) };
    let mut s = sampler(&p);
    // Token 0 appears in the prompt: 2.0 / 1.25 = 1.6 < 1.9.
    let mut logits = [2.0, 1.9, 0.0];
    assert_eq!(s.sample(&mut logits, &[0, 0, 2], &[]), 1);
    assert_eq!(logits, [1.6, 1.9, 0.0]);
    // Negative logits move away from zero: -1.0 * 1.25 = -1.25 < -1.1. Penalised once even
    // though it is in both prompt and output.
    let mut logits = [-1.0, -1.1];
    assert_eq!(s.sample(&mut logits, &[0], &[0, 0]), 1);
    assert_eq!(logits, [-1.25, -1.1]);
}

#[test]
fn frequency_penalty_counts_occurrences() {
    let p = SamplingParams { frequency_penalty: 0.2, ..params(0.0) };
    let mut s = sampler(&p);
    assert_eq!(s.sample(&mut [1.0, 0.5], &[0, 0, 0, 0], &[0, 0]), 0); // 1.0 - 0.4 = 0.6 > 0.5
    assert_eq!(s.sample(&mut [1.0, 0.5], &[], &[0, 0, 0]), 1); // 1.0 - 0.6 = 0.4 < 0.5
}

#[test]
fn presence_penalty_applies_once() {
    let p = SamplingParams { presence_penalty: 0.4, ..params(0.0) };
    let mut s = sampler(&p);
    let mut logits = [1.0, 0.5];
    assert_eq!(s.sample(&mut logits, &[], &[0, 0, 0]), 0); // 1.0 - 0.4 = 0.6 > 0.5
    assert!((logits[0] - 0.6).abs() < 1e-6);
    let p = SamplingParams { presence_penalty: 0.6, ..params(0.0) };
    assert_eq!(sampler(&p).sample(&mut [1.0, 0.5], &[], &[0]), 1);
}

#[test]
fn penalties_ignore_out_of_vocabulary_ids() {
    let p = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 1.0,
        presence_penalty: 1.0,
        ..params(0.0)
    };
    let mut logits = [1.0, 2.0];
    assert_eq!(sampler(&p).sample(&mut logits, &[7, u32::MAX], &[2, 99]), 1);
    assert_eq!(logits, [1.0, 2.0]);
}

#[test]
fn penalties_survive_changing_vocabulary_sizes() {
    let p = SamplingParams { repetition_penalty: 2.0, ..params(0.0) };
    let mut s = sampler(&p);
    assert_eq!(s.sample(&mut [4.0, 3.0, 1.0], &[0], &[]), 1);
    assert_eq!(s.sample(&mut [4.0, 3.0], &[0, 5], &[]), 1);
    assert_eq!(s.sample(&mut [4.0, 3.0, 1.0, 0.0, 0.0, 3.5], &[0, 1], &[]), 5);
}

/// Pearson's chi-square statistic of `seen` against probabilities `probs`.
fn chi_square(seen: &[u32], probs: &[f64]) -> f64 {
    let mut counts = vec![0usize; probs.len()];
    for &t in seen {
        counts[t as usize] += 1;
    }
    let n = seen.len() as f64;
    counts.iter().zip(probs).map(|(&c, &p)| (c as f64 - n * p).powi(2) / (n * p)).sum()
}

#[test]
fn sampling_follows_the_softmax() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let logits: Vec<f32> = probs.iter().map(|p: &f64| p.ln() as f32 + 3.0).collect();
    // With 3 degrees of freedom, chi-square exceeds 16.3 with probability 0.001; 30 is loose.
    let seen = draws(&mut sampler(&params(1.0)), &logits, 20_000);
    let chi2 = chi_square(&seen, &probs);
    assert!(chi2 < 30.0, "chi-square {chi2}");

    // Temperature 2 flattens to p^(1/2), renormalised.
    let roots: Vec<f64> = probs.iter().map(|p| p.sqrt()).collect();
    let sum: f64 = roots.iter().sum();
    let hot: Vec<f64> = roots.iter().map(|r| r / sum).collect();
    let seen = draws(&mut sampler(&params(2.0)), &logits, 20_000);
    let chi2 = chi_square(&seen, &hot);
    assert!(chi2 < 30.0, "chi-square {chi2} at temperature 2");
    // ... and is clearly not the temperature-1 distribution.
    assert!(chi_square(&seen, &probs) > 100.0);
}

#[test]
fn nan_logits_count_as_negative_infinity() {
    let nan = f32::NAN;
    assert_eq!(sampler(&params(0.0)).sample(&mut [nan, 1.0, nan, 0.5], &[], &[]), 1);
    assert_eq!(sampler(&params(0.0)).sample(&mut [nan, -1.0], &[], &[]), 1);
    let logits = [nan, 1.0, nan, f32::NEG_INFINITY];
    for top_k in [0, 2] {
        for top_p in [1.0, 0.9] {
            let p = SamplingParams { top_k, top_p, min_p: 0.1, ..params(1.0) };
            assert!(draws(&mut sampler(&p), &logits, 200).iter().all(|&t| t == 1));
        }
    }
}

#[test]
fn degenerate_rows_never_panic() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let ninf = f32::NEG_INFINITY;
    for p in [params(0.0), params(1.0), SamplingParams { top_k: 3, top_p: 0.5, min_p: 0.5, ..params(0.7) }] {
        let mut s = sampler(&p);
        assert_eq!(s.sample(&mut [], &[1], &[2]), 0);
        assert_eq!(s.sample(&mut [nan, nan, nan], &[], &[]), 0);
        assert_eq!(s.sample(&mut [ninf, ninf], &[], &[]), 0);
        assert_eq!(s.sample(&mut [nan, ninf, nan], &[], &[]), 0);
        assert_eq!(s.sample(&mut [0.0, inf, inf], &[], &[]), 1);
        assert_eq!(s.sample(&mut [-1e30, 1e30, f32::MAX], &[], &[]), 2);
    }
    // Out-of-range settings are clamped rather than trusted.
    let wild = SamplingParams {
        temperature: 1e-30,
        top_p: -1.0,
        min_p: 5.0,
        top_k: usize::MAX,
        repetition_penalty: 0.0,
        ..params(1.0)
    };
    assert_eq!(sampler(&wild).sample(&mut [0.5, 3.0, 2.0], &[1], &[1]), 1);
    let hot = SamplingParams { temperature: f32::INFINITY, ..params(1.0) };
    let seen = draws(&mut sampler(&hot), &[0.0, ninf, 1.0], 500);
    assert!(seen.iter().all(|&t| t != 1) && seen.contains(&0) && seen.contains(&2));
    let negative = SamplingParams { temperature: -1.0, ..params(1.0) };
    assert_eq!(sampler(&negative).sample(&mut [0.0, 2.0, 1.0], &[], &[]), 1);
}

#[test]
fn logit_bias_comes_first_and_ends_the_argmax_shortcut() {
    let logits = [1.0f32, 3.0, 2.0, 0.0];
    let mut p = params(0.0);
    assert!(sampler(&p).is_argmax());
    p.logit_bias = vec![(2, 1.5), (99, 100.0)];
    let mut s = sampler(&p);
    assert!(!s.is_argmax(), "the backend's argmax would not see the bias");
    let mut row = logits;
    assert_eq!(s.sample(&mut row, &[], &[]), 2, "3.5 now beats 3.0; the token past the row is ignored");
    assert_eq!(row, [1.0, 3.0, 3.5, 0.0]);
    // Banned by -100: the next best.
    p.logit_bias = vec![(1, -100.0)];
    assert_eq!(sampler(&p).sample(&mut logits.clone(), &[], &[]), 2);
}
