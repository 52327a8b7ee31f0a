//! Structured output: the tokens a sequence may sample next so that its output stays a prefix
//! of a text of the requested shape (a JSON Schema, a regular expression, one of a list of
//! texts), through llguidance.
//!
//! [`Grammars`] is built once per engine from the tokenizer (each token's bytes in a trie, the
//! model's end-of-sequence ids as the grammar's end) and compiles each request's schema into a
//! [`Constraint`]. Compiling happens when the request is submitted, on the caller's thread, so a
//! bad schema is refused before the request is queued. Each step, a helper thread asks every
//! constrained sequence that samples for its mask while the forward pass runs (the mask depends
//! only on the tokens consumed so far); the compute thread applies it to the row and feeds the
//! grammar the token chosen. llguidance's limits bound
//! both the compile and every mask, whatever schema a client sends.

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory, regex_to_lark};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use xinf_engine::{EngineError, StructuredOutput};
use xinf_models::TextTokenizer;

/// The vocabulary as llguidance sees it: every token's bytes in a trie.
struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Used by llguidance for literal text inside a grammar, which JSON Schemas do not force
    /// token by token: the trie's greedy tokenization is enough.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// The whitespace allowed between two JSON tokens: at most one line break and 16 spaces or tabs,
/// enough for indented documents. Left unbounded, a sampled output can wander off into
/// whitespace until it runs out of tokens, which small models do at higher temperatures.
const WHITESPACE: &str = r"[\x20\x09]{1,16}|\r?\n[\x20\x09]{0,16}";

/// Compiles requests' shapes for one model.
pub(crate) struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// The vocabulary of `tokenizer`, padded to the model's `vocab_size` logits (ids past the
    /// tokenizer's are never allowed), ending at `eos`.
    pub(crate) fn new(tokenizer: &TextTokenizer, vocab_size: usize, eos: &[u32]) -> Result<Self, String> {
        let mut words: Vec<Vec<u8>> = tokenizer
            .token_bytes()?
            .into_iter()
            .enumerate()
            // Special tokens and unknown ids spell no text: the trie's special marker and a
            // name that no grammar matches.
            .map(|(id, b)| b.unwrap_or_else(|| special(id)))
            .collect();
        words.truncate(vocab_size);
        while words.len() < vocab_size {
            words.push(special(words.len()));
        }
        Self::from_words(&words, eos)
    }

    /// The vocabulary of these tokens' bytes, ending at `eos`.
    fn from_words(words: &[Vec<u8>], eos: &[u32]) -> Result<Self, String> {
        let vocab_size = words.len();
        let first_eos = eos.first().copied().ok_or("the model has no end-of-sequence token")?;
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(Vocabulary { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// The constraint of a request asking for `shape`, from the first token or after the
    /// reasoning mark `after`; the error names `response_format`.
    pub(crate) fn constraint(
        &self,
        shape: &StructuredOutput,
        after: Option<&str>,
    ) -> Result<Constraint, EngineError> {
        let invalid = |e: String| EngineError::invalid("response_format", e);
        let (what, grammar) = match (shape.schema(), shape.regex()) {
            (Some(text), _) => {
                let mut schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| invalid(format!("the JSON Schema is not JSON: {e}")))?;
                if let Some(o) = schema.as_object_mut() {
                    // llguidance reads its options from the schema; a client's own are kept.
                    o.entry("x-guidance")
                        .or_insert_with(|| serde_json::json!({"whitespace_pattern": WHITESPACE}));
                }
                let grammar = match after {
                    Some(mark) => {
                        TopLevelGrammar::from_lark(after_reasoning(mark, &format!("%json {schema}")))
                    }
                    None => TopLevelGrammar::from_json_schema(schema),
                };
                ("JSON Schema", grammar)
            }
            (None, Some(rx)) => {
                let grammar = match after {
                    Some(mark) => TopLevelGrammar::from_lark(after_reasoning(
                        mark,
                        &format!("/{}/", regex_to_lark(&rx, "")),
                    )),
                    None => TopLevelGrammar::from_regex(&rx),
                };
                ("regular expression", grammar)
            }
            (None, None) => return Err(invalid("no shape was given".into())),
        };
        // llguidance guards its matcher against its own panics but not the compile: a client's
        // schema must not take the caller's thread down either way.
        let compiled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.factory.create_parser(grammar)))
                .map_err(|_| invalid(format!("the {what} could not be compiled")))?;
        let parser = compiled
            .map_err(|e| invalid(format!("the {what} cannot be followed: {}", why(&e.to_string()))))?;
        Ok(Constraint { matcher: Matcher::new(Ok(parser)) })
    }
}

/// The cause in llguidance's account of a grammar it cannot compile. A regular expression's is
/// a report of several lines, with the grammar llguidance wrapped it in and carets under both;
/// its `error:` line is the cause. Other accounts are one line, kept whole.
fn why(account: &str) -> &str {
    let cause = account.lines().find_map(|l| l.trim_start().strip_prefix("error: "));
    cause.or_else(|| account.lines().next()).unwrap_or(account).trim()
}

/// A Lark grammar of free text up to the first `mark` (a reasoning model's thinking, whatever
/// it writes, its opening mark included), a little whitespace, then `answer`.
fn after_reasoning(mark: &str, answer: &str) -> String {
    // A JSON string's escapes are those of a Lark string.
    let mark = serde_json::Value::from(mark).to_string();
    format!(
        "start: thinking SPACE answer\nthinking[suffix={mark}]: /(.|\\n)*/\nSPACE: /[ \\t\\r\\n]{{0,8}}/\nanswer: {answer}\n"
    )
}

/// The name of a token that spells no text (special, or past the tokenizer's vocabulary).
fn special(id: usize) -> Vec<u8> {
    let mut name = format!("<[{id}]>").into_bytes();
    name.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
    name
}

/// One sequence's place in its grammar.
pub(crate) struct Constraint {
    matcher: Matcher,
}

/// The tokens a grammar allows next, one bit each.
pub(crate) struct Mask(toktrie::SimpleVob);

impl Constraint {
    /// Sets the logits of the tokens the grammar does not allow next to -inf. The grammar
    /// always allows something: once complete, the end-of-sequence tokens.
    pub(crate) fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.allowed().map(|m| m.apply(logits))
    }

    /// The tokens allowed next. It depends only on the tokens consumed so far, so the worker
    /// computes it while the forward pass runs.
    pub(crate) fn allowed(&mut self) -> Result<Mask, String> {
        self.matcher.compute_mask().map(Mask).map_err(|e| e.to_string())
    }

    /// Moves past `token`, the sequence's next output token.
    pub(crate) fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the output is a complete document and its end has been consumed.
    pub(crate) fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}

impl Mask {
    /// Sets the logits of the tokens not allowed to -inf, 32 at a time where a word of the
    /// mask is all one way (most of a vocabulary is, under a grammar); a logit past the mask's
    /// end is not allowed.
    pub(crate) fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        let mut rows = logits.chunks_mut(32);
        for (&word, row) in words.iter().zip(rows.by_ref()) {
            match word {
                u32::MAX => {}
                0 => row.fill(f32::NEG_INFINITY),
                _ => {
                    for (bit, l) in row.iter_mut().enumerate() {
                        if word & (1 << bit) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        rows.for_each(|row| row.fill(f32::NEG_INFINITY));
    }
}

#[cfg(test)]
mod tests {
    use super::{Constraint, Grammars, Mask, special};
    use toktrie::SimpleVob;
    use xinf_engine::StructuredOutput;

    /// Every byte a token, then `<think>`, `</think>` and an end-of-sequence token.
    fn grammars() -> Grammars {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"<think>".to_vec());
        words.push(b"</think>".to_vec());
        words.push(special(words.len()));
        Grammars::from_words(&words, &[258]).expect("grammars")
    }

    /// Feeds `text` byte by byte (the marks as their own tokens); `Err` at the first byte the
    /// grammar refuses, else whether the output may end there.
    fn feed(c: &mut Constraint, text: &str) -> Result<bool, usize> {
        let mut at = 0;
        while at < text.len() {
            let (token, len) = match &text[at..] {
                t if t.starts_with("</think>") => (257, 8),
                t if t.starts_with("<think>") => (256, 7),
                t => (u32::from(t.as_bytes()[0]), 1),
            };
            let allowed = c.allowed().map_err(|_| at)?;
            if !allowed.0.is_allowed(token) {
                return Err(at);
            }
            c.advance(token).map_err(|_| at)?;
            at += len;
        }
        // A grammar with nothing left to add stops by itself; else the end must be allowed.
        Ok(c.is_done() || c.allowed().is_ok_and(|m| m.0.is_allowed(258)))
    }

    #[test]
    fn after_a_reasoning_mark_the_shape_holds() {
        let g = grammars();
        let schema = StructuredOutput::JsonSchema(
            r#"{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}"#.into(),
        );
        let regex = StructuredOutput::Regex("(yes|no)".into());
        let json = |text: &str| feed(&mut g.constraint(&schema, Some("</think>")).expect("compiles"), text);
        // Anything while it thinks, marks of its own and a lone `<` included; then the shape.
        assert_eq!(json("<think>\nhm: 2 < 3, {not json}\n</think>\n\n{\"a\": 1}"), Ok(true));
        assert_eq!(json("no opening mark</think>{\"a\": 7}"), Ok(true));
        // Still thinking: not an answer yet, and not an error.
        assert_eq!(json("<think>{\"a\": 1}"), Ok(false));
        // The first closing mark ends the thinking: what follows must be the shape.
        assert_eq!(json("x</think>prose"), Err(9));
        assert_eq!(json("x</think>y</think>{\"a\": 1}"), Err(9));
        let answer = |text: &str| feed(&mut g.constraint(&regex, Some("</think>")).expect("compiles"), text);
        assert_eq!(answer("<think>maybe</think> yes"), Ok(true));
        assert_eq!(answer("<think>maybe</think>perhaps"), Err(20));
        // Without a mark the shape holds from the first token, as before.
        assert_eq!(feed(&mut g.constraint(&regex, None).expect("compiles"), "yes"), Ok(true));
        assert!(feed(&mut g.constraint(&regex, None).expect("compiles"), "<think>").is_err());
    }

    #[test]
    fn a_mask_keeps_exactly_the_allowed_logits() {
        // Words all set, all clear and mixed, a partial last word, and logits past the mask.
        for (size, logits_len) in [(100usize, 100usize), (100, 130), (64, 64), (33, 40)] {
            let mut vob = SimpleVob::alloc(size);
            let allowed: Vec<usize> = (0..size).filter(|i| i < &32 || i % 7 == 3).collect();
            allowed.iter().for_each(|&i| vob.allow_token(i as u32));
            let mut logits: Vec<f32> = (0..logits_len).map(|i| i as f32).collect();
            Mask(vob).apply(&mut logits);
            for (i, l) in logits.iter().enumerate() {
                let kept = allowed.contains(&i);
                assert_eq!(*l == i as f32, kept, "logit {i} of {logits_len} (mask of {size})");
                assert_eq!(*l == f32::NEG_INFINITY, !kept, "logit {i}");
            }
        }
    }

    /// A pattern llguidance cannot compile is refused with its cause alone, not llguidance's
    /// report around it.
    #[test]
    fn a_broken_pattern_is_refused_with_its_cause() {
        let g = grammars();
        let err = |shape: StructuredOutput| match g.constraint(&shape, None) {
            Err(xinf_engine::EngineError::InvalidRequest { field, reason }) => {
                assert_eq!(field, "response_format");
                reason
            }
            other => panic!("{:?}", other.map(|_| "compiled")),
        };
        let regex = err(StructuredOutput::Regex("((".into()));
        assert_eq!(regex, "the regular expression cannot be followed: unclosed group");
        let schema = err(StructuredOutput::JsonSchema(r#"{"type": "strin"}"#.into()));
        assert!(
            schema.starts_with("the JSON Schema cannot be followed: ") && !schema.contains('\n'),
            "{schema}"
        );
    }
}
