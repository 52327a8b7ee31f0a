//! The prompts: their text, and their sizing to the lengths wanted as the server's own
//! tokenizer counts them, capped to the model's context.

use serde_json::json;
use xinf_i18n::Catalog;
use xinf_models::SplitMix64;

use super::args::BenchArgs;
use crate::cli::client::Client;

/// Tokens a first guess of the prompt size assumes per English word.
const TOKENS_PER_WORD: f64 = 1.3;
/// Measurements at most per prompt length: the word count scales linearly enough that one or
/// two corrections land within the tolerance.
const SIZING_ROUNDS: usize = 4;
/// Room left in the context for the request number that starts every prompt, which can take a
/// token or two more than the number the prompt was measured with.
const TAG_SLACK: usize = 4;

/// Words of the prompt text: common English, which tokenizers count at about
/// [`TOKENS_PER_WORD`] tokens each.
const WORDS: &str = "the of and to in is that for it as was with be by on not he this are or his from at which \
    but have an had they you were their one all we can her has there been if more when will \
    would who so no time people water river mountain city garden morning evening story number \
    music window light house road winter summer market letter question answer small large quiet \
    bright early late old new green blue walks reads builds finds carries opens watches \
    remembers slowly often together always never again under between across behind";

/// The first `n` words of the text of the `class`-th prompt length: sentences of 6 to 14
/// words. The text of `n` words starts the text of `n + 1` (but for its final period), so the
/// token count grows with `n` and sizing converges.
fn prompt_text(seed: u64, class: usize, n: usize) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = SplitMix64::new(seed ^ (class as u64).wrapping_mul(0xa076_1d64_78bd_642f));
    let mut out = String::new();
    let mut sentence_left = 0;
    for i in 0..n {
        let Some(word) = words.get(rng.below(words.len())) else { break };
        if i > 0 {
            out.push(' ');
        }
        if sentence_left == 0 {
            sentence_left = 6 + rng.below(9);
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        } else {
            out.push_str(word);
        }
        sentence_left -= 1;
        if sentence_left == 0 || i + 1 == n {
            out.push('.');
        }
    }
    out
}

/// The prompt of request `number`. Every request starts with its own number, so that a server
/// with a prefix cache computes each prompt in full, as it would for distinct users.
pub(super) fn tagged(number: usize, body: &str) -> String {
    format!("Request {number:06}. {body}")
}

/// How far a measured length may be from the wanted one: 2 %, at least one token.
fn tolerance(target: usize) -> usize {
    (target / 50).max(1)
}

/// The word count a first measurement starts from.
fn initial_words(target: usize) -> usize {
    ((target as f64 / TOKENS_PER_WORD).round() as usize).max(1)
}

/// The word count to try after `words` words measured `tokens` tokens: scaled in proportion,
/// and at least one word toward the target unless it was hit, so that every round moves.
fn next_word_count(words: usize, tokens: usize, target: usize) -> usize {
    let scaled = ((words as f64 * target as f64 / tokens.max(1) as f64).round() as usize).max(1);
    if scaled != words {
        return scaled;
    }
    match tokens.cmp(&target) {
        std::cmp::Ordering::Less => words + 1,
        std::cmp::Ordering::Greater => words.saturating_sub(1).max(1),
        std::cmp::Ordering::Equal => words,
    }
}

/// The prompt length to aim at for `requested` tokens in a context of `context` tokens: the
/// output, the request number and the sizing tolerance must fit next to it. `None` when
/// nothing fits.
pub(super) fn capped_length(requested: usize, context: Option<usize>, output_tokens: usize) -> Option<usize> {
    let Some(context) = context else { return Some(requested) };
    let room = context.saturating_sub(output_tokens + TAG_SLACK + tolerance(context));
    (room > 0).then_some(requested.min(room))
}

/// The word count whose prompt measures closest to `target` tokens, with its length, from at
/// most [`SIZING_ROUNDS`] measurements.
fn fit_words(
    target: usize,
    mut measure: impl FnMut(usize) -> Result<usize, String>,
) -> Result<(usize, usize), String> {
    let mut words = initial_words(target);
    // A tokenizer counting far more tokens a word than guessed can put the first guess past
    // the context, which the server refuses: halve it until a measurement answers.
    let mut first = measure(words);
    for _ in 1..SIZING_ROUNDS {
        if first.is_ok() || words == 1 {
            break;
        }
        words = words.div_ceil(2);
        first = measure(words);
    }
    let mut tokens = first?;
    let mut best = (words, tokens);
    for _ in 1..SIZING_ROUNDS {
        if tokens.abs_diff(target) <= tolerance(target) {
            break;
        }
        words = next_word_count(words, tokens, target);
        tokens = measure(words)?;
        if tokens.abs_diff(target) < best.1.abs_diff(target) {
            best = (words, tokens);
        }
    }
    Ok(best)
}

/// A prompt of one of the wanted lengths, without its request number.
pub(super) struct Prompt {
    /// The text every prompt begins with (`--shared-prefix-tokens`), empty when none.
    pub(super) prefix: String,
    pub(super) body: String,
    /// Its length as the server counts it, request number included.
    pub(super) tokens: usize,
}

impl Prompt {
    /// The text of request `number`: the shared prefix, the request number, the body.
    pub(super) fn text(&self, number: usize) -> String {
        format!("{}{}", self.prefix, tagged(number, &self.body))
    }
}

/// The prompt-text class of the shared prefix, apart from every prompt length's.
const PREFIX_CLASS: usize = usize::MAX;

/// The prompt length, as the server counts it.
fn measure(client: &Client, uid: &str, prompt: &str, cat: &Catalog) -> Result<usize, String> {
    let body = json!({"model": uid, "prompt": prompt, "max_tokens": 1, "temperature": 0});
    let answer = client.post("/v1/completions", &body).map_err(|e| e.text(cat))?;
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| cat.text("cli-bench-no-usage", &[]))
}

/// A uid as one path segment: everything but unreserved characters percent-encoded.
fn path_segment(uid: &str) -> String {
    uid.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The model's context length, when the server reports it (xinf's `xinf.context_length`).
pub(super) fn context_length(client: &Client, uid: &str) -> Option<usize> {
    let info = client.get(&format!("/v1/models/{}", path_segment(uid))).ok()?;
    info["xinf"]["context_length"].as_u64().map(|n| n as usize)
}

/// The prompts, sized with `uid`'s tokenizer to the wanted lengths capped to `context`.
pub(super) fn size_prompts(
    args: &BenchArgs,
    client: &Client,
    uid: &str,
    context: Option<usize>,
    cat: &Catalog,
) -> Result<Vec<Prompt>, String> {
    let failed = |detail: String| cat.text("cli-bench-measure-failed", &[("uid", uid), ("detail", &detail)]);
    let prefix = match args.shared_prefix_tokens {
        0 => String::new(),
        n => {
            let (words, _) =
                fit_words(n, |words| measure(client, uid, &prompt_text(args.seed, PREFIX_CLASS, words), cat))
                    .map_err(failed)?;
            format!("{} ", prompt_text(args.seed, PREFIX_CLASS, words))
        }
    };
    let mut prompts = Vec::with_capacity(args.prompt_tokens.len());
    for (class, &requested) in args.prompt_tokens.iter().enumerate() {
        let target = capped_length(requested, context, args.output_tokens).ok_or_else(|| {
            let (output, context) = (args.output_tokens.to_string(), context.unwrap_or(0).to_string());
            cat.text("cli-bench-no-room", &[("output", &output), ("context", &context)])
        })?;
        // The request number and a word at least follow the shared prefix.
        if args.shared_prefix_tokens > 0 && target <= args.shared_prefix_tokens + TAG_SLACK + 4 {
            let (prefix, length) = (args.shared_prefix_tokens.to_string(), target.to_string());
            return Err(cat.text("cli-bench-prefix-too-long", &[("prefix", &prefix), ("length", &length)]));
        }
        let text = |words| format!("{prefix}{}", tagged(0, &prompt_text(args.seed, class, words)));
        let (words, tokens) =
            fit_words(target, |words| measure(client, uid, &text(words), cat)).map_err(failed)?;
        prompts.push(Prompt { prefix: prefix.clone(), body: prompt_text(args.seed, class, words), tokens });
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_counts_scale_toward_the_target() {
        assert_eq!(initial_words(130), 100);
        assert_eq!(initial_words(1), 1);
        assert_eq!(next_word_count(100, 150, 120), 80);
        assert_eq!(next_word_count(100, 100, 200), 200);
        // Rounding that would not move steps one word toward the target.
        assert_eq!(next_word_count(100, 100, 100), 100);
        assert_eq!(next_word_count(100, 101, 100), 99);
        assert_eq!(next_word_count(100, 199, 200), 101);
        assert_eq!(next_word_count(1, 50, 10), 1);
        assert_eq!(tolerance(2833), 56);
        assert_eq!(tolerance(40), 1);
    }

    #[test]
    fn sizing_converges_on_a_tokenizer_like_count() {
        // 1.5 tokens a word plus 6 for the request number.
        let count = |words: usize| words * 3 / 2 + 6;
        for target in [40, 173, 733, 2833] {
            let mut calls = 0;
            let fitted = fit_words(target, |w| {
                calls += 1;
                Ok(count(w))
            });
            let Ok((words, tokens)) = fitted else { panic!("{fitted:?}") };
            assert_eq!(tokens, count(words));
            assert!(tokens.abs_diff(target) <= tolerance(target), "{target}: {tokens}");
            assert!(calls <= SIZING_ROUNDS, "{calls}");
        }
        assert_eq!(fit_words(40, |_| Err("down".into())), Err("down".into()));
        // 3.7 tokens a word (a tokenizer that knows few of the words) in a context of 4,096:
        // the first guess is refused, the halved one measures, and sizing goes on from there.
        let dense = |words: usize| {
            let tokens = words * 37 / 10 + 6;
            if tokens > 4096 { Err(format!("{tokens} tokens, over the context")) } else { Ok(tokens) }
        };
        let Ok((words, tokens)) = fit_words(2833, dense) else { panic!("not sized") };
        assert!(tokens.abs_diff(2833) <= tolerance(2833) && tokens == dense(words).unwrap_or(0), "{tokens}");
    }

    #[test]
    fn lengths_are_capped_to_the_context() {
        assert_eq!(capped_length(2833, None, 32), Some(2833));
        assert_eq!(capped_length(2833, Some(8192), 32), Some(2833));
        // 2048 - 32 output - 4 tag - 40 tolerance.
        assert_eq!(capped_length(2833, Some(2048), 32), Some(1972));
        assert_eq!(capped_length(40, Some(2048), 32), Some(40));
        assert_eq!(capped_length(40, Some(32), 32), None);
    }

    #[test]
    fn prompt_text_is_deterministic_and_grows_by_prefix() {
        let long = prompt_text(7, 2, 50);
        assert_eq!(long, prompt_text(7, 2, 50));
        assert_ne!(long, prompt_text(8, 2, 50));
        assert_ne!(long, prompt_text(7, 3, 50));
        assert_eq!(long.split_whitespace().count(), 50);
        let short = prompt_text(7, 2, 20);
        assert!(long.starts_with(short.trim_end_matches('.')), "{short} / {long}");
        assert!(short.ends_with('.') && short.starts_with(char::is_uppercase), "{short}");
        assert_eq!(prompt_text(0, 0, 0), "");
        assert!(tagged(12, "Hello.").starts_with("Request 000012. "));
    }

    #[test]
    fn uids_are_escaped_in_paths() {
        assert_eq!(path_segment("Qwen/Qwen2.5 7B"), "Qwen%2FQwen2.5%207B");
        assert_eq!(path_segment("m-1_x~"), "m-1_x~");
    }
}
