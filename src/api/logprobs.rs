//! Token log-probabilities in the shapes of OpenAI's two APIs: chat's `logprobs.content`, one
//! object per token with its alternatives, and the completions API's parallel lists
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
//!
//! A log-probability that is not finite (a token the model gives no chance at all) is written
//! as -9999.0, as vLLM writes it: JSON has no infinity.

use serde::ser::{Serialize, SerializeMap, Serializer};
use xinf_engine::{Logprob, TokenLogprobs};

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
    token_logprobs: Vec<f32>,
    /// Per token, its alternatives by text (alternatives that decode alike keep the likelier).
    top_logprobs: Vec<ByText>,
    /// Per token, where its text starts in the choice's text, in characters.
    text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// Adds a token whose text starts `offset` characters into the choice's text.
    pub(crate) fn push(&mut self, t: &TokenLogprobs, offset: usize) {
        self.tokens.push(t.chosen.token.clone());
        self.token_logprobs.push(finite(t.chosen.logprob));
        let mut top = ByText::default();
        // Most likely first: a later token of the same text is less likely.
        for l in &t.top {
            if !top.0.iter().any(|(text, _)| *text == l.token) {
                top.0.push((l.token.clone(), finite(l.logprob)));
            }
        }
        self.top_logprobs.push(top);
        self.text_offset.push(offset);
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
}
