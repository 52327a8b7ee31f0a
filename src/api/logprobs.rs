//! Token log-probabilities in the shapes of OpenAI's two APIs: chat's `logprobs.content`, one
//! object per token with its alternatives, and the completions API's parallel lists
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
//!
//! A log-probability that is not finite (a token the model gives no chance at all) is written
//! as -9999.0, as vLLM writes it: JSON has no infinity.

use serde::ser::{Serialize, SerializeMap, Serializer};
use xinf_engine::{Logprob, PromptLogprobs, TokenLogprobs};

/// What stands for minus infinity.
const NO_CHANCE: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() { logprob } else { NO_CHANCE }
}

/// Chat's `logprobs` of a choice or of a chunk's choice.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct ChatLogprobs {
    pub(crate) content: Vec<ChatTokenLogprob>,
}

/// One token of chat's `logprobs.content`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ChatTokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative of a chat token.
#[derive(Debug, Clone, serde::Serialize)]
struct ChatTopLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

impl ChatTopLogprob {
    fn of(l: &Logprob) -> Self {
        Self { token: l.token.clone(), logprob: finite(l.logprob), bytes: l.token.as_bytes().to_vec() }
    }
}

impl ChatLogprobs {
    /// Adds a token.
    pub(crate) fn push(&mut self, t: &TokenLogprobs) {
        let chosen = ChatTopLogprob::of(&t.chosen);
        self.content.push(ChatTokenLogprob {
            token: chosen.token,
            logprob: chosen.logprob,
            bytes: chosen.bytes,
            top_logprobs: t.top.iter().map(ChatTopLogprob::of).collect(),
        });
    }
}

/// The completions API's `logprobs` of a choice or of a chunk's choice.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct TextLogprobs {
    tokens: Vec<String>,
    /// `null` for an echoed prompt's first token, which has nothing before it.
    token_logprobs: Vec<Option<f32>>,
    /// Per token, its alternatives by text (alternatives that decode alike keep the likelier).
    top_logprobs: Vec<Option<ByText>>,
    /// Per token, where its text starts in the choice's text, in characters.
    text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// Adds a token whose text starts `offset` characters into the choice's text.
    pub(crate) fn push(&mut self, t: &TokenLogprobs, offset: usize) {
        self.push_limited(t, t.top.len(), offset);
    }

    /// [`push`](Self::push) with at most `top` alternatives.
    fn push_limited(&mut self, t: &TokenLogprobs, top: usize, offset: usize) {
        self.tokens.push(t.chosen.token.clone());
        self.token_logprobs.push(Some(finite(t.chosen.logprob)));
        let mut by_text = ByText::default();
        // Most likely first: a later token of the same text is less likely.
        for l in t.top.iter().take(top) {
            if !by_text.0.iter().any(|(text, _)| *text == l.token) {
                by_text.0.push((l.token.clone(), finite(l.logprob)));
            }
        }
        self.top_logprobs.push(Some(by_text));
        self.text_offset.push(offset);
    }

    /// The log-probabilities of an echoed prompt (`echo` with `logprobs`), `top` alternatives
    /// each, as the first entries of a choice's list: the first token has none (`null`).
    /// Returns them and the characters their texts span, where the output's offsets start.
    pub(crate) fn of_prompt(p: &PromptLogprobs, top: usize) -> (Self, usize) {
        let mut l = Self::default();
        l.tokens.push(p.first.clone());
        l.token_logprobs.push(None);
        l.top_logprobs.push(None);
        l.text_offset.push(0);
        let mut offset = p.first.chars().count();
        for t in &p.rest {
            l.push_limited(t, top, offset);
            offset += width(t);
        }
        (l, offset)
    }

    /// Appends `other`'s tokens after these.
    pub(crate) fn extend(&mut self, other: Self) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

/// vLLM's `prompt_logprobs`: per prompt token, `null` for the first, then an object from
/// token id (as text) to `{"logprob", "rank", "decoded_token"}` holding the prompt's token and
/// the most likely ones at its position (the prompt's token first).
#[derive(Debug, Clone, Default)]
pub(crate) struct PromptLogprobsOut(Vec<Option<Vec<(u32, VllmLogprob)>>>);

/// One entry of a [`PromptLogprobsOut`] position.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct VllmLogprob {
    logprob: f32,
    rank: Option<u32>,
    decoded_token: String,
}

impl PromptLogprobsOut {
    /// The prompt's log-probabilities with at most `top` alternatives per position.
    pub(crate) fn new(p: &PromptLogprobs, top: usize) -> Self {
        let mut out = vec![None];
        for t in &p.rest {
            let entry = |l: &Logprob, rank| {
                (l.token_id, VllmLogprob { logprob: finite(l.logprob), rank, decoded_token: l.token.clone() })
            };
            let mut position = vec![entry(&t.chosen, t.rank)];
            for (i, l) in t.top.iter().take(top).enumerate() {
                if l.token_id != t.chosen.token_id {
                    position.push(entry(l, Some(i as u32 + 1)));
                }
            }
            out.push(Some(position));
        }
        Self(out)
    }
}

impl Serialize for PromptLogprobsOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for position in &self.0 {
            seq.serialize_element(&position.as_ref().map(|p| ById(p)))?;
        }
        seq.end()
    }
}

/// A position of [`PromptLogprobsOut`] as a JSON object keyed by token id.
struct ById<'a>(&'a [(u32, VllmLogprob)]);

impl Serialize for ById<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (id, l) in self.0 {
            map.serialize_entry(&id.to_string(), l)?;
        }
        map.end()
    }
}

/// A token's alternatives as a JSON object from text to log-probability, most likely first;
/// the values are written as the F32 they are, as `token_logprobs` writes them.
#[derive(Debug, Clone, Default)]
struct ByText(Vec<(String, f32)>);

impl Serialize for ByText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (text, logprob) in &self.0 {
            map.serialize_entry(text, logprob)?;
        }
        map.end()
    }
}

/// The characters a token's text adds to the offsets that follow it.
pub(crate) fn width(t: &TokenLogprobs) -> usize {
    t.chosen.token.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn token(id: u32, text: &str, logprob: f32) -> Logprob {
        Logprob { token_id: id, token: text.into(), logprob }
    }

    fn sample() -> TokenLogprobs {
        TokenLogprobs {
            chosen: token(7, "é", -0.25),
            top: vec![
                token(7, "é", -0.25),
                token(9, " a", -1.5),
                token(3, " a", -2.0),
                token(4, "x", f32::NEG_INFINITY),
            ],
            rank: Some(1),
        }
    }

    #[test]
    fn chat_lists_each_token_with_its_bytes_and_alternatives() {
        let mut l = ChatLogprobs::default();
        l.push(&sample());
        let v = serde_json::to_value(&l).expect("serializes");
        assert_eq!(v["content"][0]["token"], "é");
        assert_eq!(v["content"][0]["logprob"], -0.25);
        assert_eq!(v["content"][0]["bytes"], json!([0xc3, 0xa9]));
        assert_eq!(v["content"][0]["top_logprobs"].as_array().map(Vec::len), Some(4));
        assert_eq!(
            v["content"][0]["top_logprobs"][1],
            json!({"token": " a", "logprob": -1.5, "bytes": [32, 97]})
        );
        assert_eq!(v["content"][0]["top_logprobs"][3]["logprob"], -9999.0);
    }

    #[test]
    fn completions_keep_parallel_lists_and_the_likelier_of_equal_texts() {
        let mut l = TextLogprobs::default();
        l.push(&sample(), 0);
        l.push(&sample(), width(&sample()));
        let v = serde_json::to_value(&l).expect("serializes");
        assert_eq!(v["tokens"], json!(["é", "é"]));
        assert_eq!(v["token_logprobs"], json!([-0.25, -0.25]));
        assert_eq!(v["top_logprobs"][0], json!({"é": -0.25, " a": -1.5, "x": -9999.0}));
        assert_eq!(v["text_offset"], json!([0, 1]));
    }

    #[test]
    fn an_echoed_prompt_starts_with_a_token_of_no_log_probability() {
        let mut second = sample();
        second.chosen = token(5, "ab", -3.0);
        second.rank = Some(6);
        let prompt = PromptLogprobs { first: "Hi".into(), rest: vec![second.clone()] };
        let (mut l, offset) = TextLogprobs::of_prompt(&prompt, 2);
        assert_eq!(offset, 4);
        l.push(&sample(), offset);
        let v = serde_json::to_value(&l).expect("serializes");
        assert_eq!(v["tokens"], json!(["Hi", "ab", "é"]));
        assert_eq!(v["token_logprobs"], json!([null, -3.0, -0.25]));
        assert_eq!(v["top_logprobs"][0], json!(null));
        assert_eq!(v["top_logprobs"][1], json!({"é": -0.25, " a": -1.5}));
        assert_eq!(v["text_offset"], json!([0, 2, 4]));

        let v = serde_json::to_value(PromptLogprobsOut::new(&prompt, 2)).expect("serializes");
        assert_eq!(
            v,
            json!([null, {
                "5": {"logprob": -3.0, "rank": 6, "decoded_token": "ab"},
                "7": {"logprob": -0.25, "rank": 1, "decoded_token": "é"},
                "9": {"logprob": -1.5, "rank": 2, "decoded_token": " a"},
            }])
        );
    }
}
