//! Reasoning apart from the answer: a model launched with `reasoning_content: true` (Qwen3,
//! DeepSeek-R1, QwQ) writes its thinking between two marks (`<think>` … `</think>`), and a chat
//! answer shows it as the message's `reasoning_content`, the rest as `content`, as Xinference,
//! vLLM and DeepSeek's API do.
//!
//! Read as Xinference reads it: the output's reasoning runs from its start (after the opening
//! mark when the output begins with one, which the templates of R1-style models put into the
//! prompt instead) to the closing mark; an output that never closes it is all reasoning. A
//! request that turns thinking off (`chat_template_kwargs: {"enable_thinking": false}`, or the
//! launch's `enable_thinking: false`) is not read at all: its output is all content.
//!
//! The same reader serves whole answers and streams, so that the two always split an output
//! alike: a stream holds back only what may be the start of a mark.

use serde_json::{Map, Value};
use xinf_actors::ChatDefaults;
use xinf_engine::Prompt;
use xinf_models::{ReasoningMarks, THINK_MARKS};

/// Applies a model's chat settings to a chat prompt: the launch's `enable_thinking` where the
/// request's `chat_template_kwargs` leave it out. Gives the marks the answer is read by; `None`
/// when it is not read (no `reasoning_content` at launch, a registry family that does not
/// reason, or thinking turned off for this request).
pub(crate) fn apply(defaults: &ChatDefaults, prompt: &mut Prompt) -> Option<ReasoningMarks> {
    // A model launched with neither key, the common case: nothing to set or read, and no
    // request's template variables parsed for it.
    if !defaults.reasoning_content && defaults.enable_thinking.is_none() {
        return None;
    }
    let mut args: Map<String, Value> = match prompt {
        Prompt::Chat(_) => Map::new(),
        Prompt::ChatWith { template_args, .. } => serde_json::from_str(template_args).unwrap_or_default(),
        Prompt::Text(_) | Prompt::Tokens(_) => return None,
    };
    let asked = args.get("enable_thinking").filter(|v| !v.is_null()).cloned();
    // As the templates read it: anything but `false` leaves thinking on.
    let thinking = match &asked {
        Some(v) => *v != Value::Bool(false),
        None => defaults.enable_thinking != Some(false),
    };
    if let (None, Some(on), Prompt::Chat(messages) | Prompt::ChatWith { messages, .. }) =
        (asked, defaults.enable_thinking, &mut *prompt)
    {
        args.insert("enable_thinking".to_owned(), Value::Bool(on));
        let messages = std::mem::take(messages);
        *prompt = Prompt::ChatWith { messages, template_args: Value::Object(args).to_string() };
    }
    if !defaults.reasoning_content || !thinking {
        return None;
    }
    match xinf_models::find_family(&defaults.model_name) {
        Some(family) => family.reasoning,
        // A model launched from a path under a name of its own: the marks every open reasoning
        // model writes.
        None => Some(THINK_MARKS),
    }
}

/// Where an output stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace, or the start of the opening mark, so far.
    Start,
    /// In the reasoning, before the closing mark.
    Reasoning,
    /// After the closing mark: the answer.
    Answer,
}

/// One choice's output, split as it comes.
#[derive(Debug, Clone)]
pub(crate) struct ReasoningStream {
    marks: ReasoningMarks,
    state: State,
    /// Text not placed yet: leading whitespace, or what may be the start of a mark.
    held: String,
}

/// What a piece of output adds to each part.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) reasoning: String,
    pub(crate) content: String,
}

impl ReasoningStream {
    pub(crate) fn new(marks: ReasoningMarks) -> Self {
        Self { marks, state: State::Start, held: String::new() }
    }

    /// Splits the next piece of output.
    pub(crate) fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        if self.state == State::Answer {
            out.content.push_str(text);
            return out;
        }
        self.held.push_str(text);
        if self.state == State::Start {
            let rest = self.held.trim_start();
            if rest.is_empty() || (self.marks.start.starts_with(rest) && rest.len() < self.marks.start.len())
            {
                return out;
            }
            // The opening mark goes; without one, the template opened the reasoning.
            let after = rest.strip_prefix(self.marks.start).unwrap_or(rest);
            self.held = after.to_owned();
            self.state = State::Reasoning;
        }
        match self.held.find(self.marks.end) {
            Some(at) => {
                out.reasoning = self.held[..at].to_owned();
                out.content = self.held[at + self.marks.end.len()..].to_owned();
                self.held.clear();
                self.state = State::Answer;
            }
            None => {
                let keep = partial_mark(&self.held, self.marks.end);
                let rest = self.held.split_off(self.held.len() - keep);
                out.reasoning = std::mem::replace(&mut self.held, rest);
            }
        }
        out
    }

    /// What is left when the output ends: an unclosed reasoning's last characters.
    pub(crate) fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start if held.trim().is_empty() => Split::default(),
            _ => Split { reasoning: held, content: String::new() },
        }
    }

    /// A whole output, split.
    pub(crate) fn split_whole(marks: ReasoningMarks, text: &str) -> Split {
        let mut reader = Self::new(marks);
        let mut out = reader.push(text);
        out.reasoning.push_str(&reader.finish().reasoning);
        out
    }
}

/// Bytes at the end of `text` that may be the start of `mark` (never the whole mark).
fn partial_mark(text: &str, mark: &str) -> usize {
    (1..mark.len()).rev().find(|&n| mark.is_char_boundary(n) && text.ends_with(&mark[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xinf_engine::ChatMessage;

    fn chat(args: Option<Value>) -> Prompt {
        let messages = vec![ChatMessage::new("user", "hi")];
        match args {
            Some(args) => Prompt::ChatWith { messages, template_args: args.to_string() },
            None => Prompt::Chat(messages),
        }
    }

    fn args_of(prompt: &Prompt) -> Option<Value> {
        match prompt {
            Prompt::ChatWith { template_args, .. } => serde_json::from_str(template_args).ok(),
            _ => None,
        }
    }

    fn defaults(name: &str, reasoning: bool, thinking: Option<bool>) -> ChatDefaults {
        ChatDefaults { model_name: name.into(), reasoning_content: reasoning, enable_thinking: thinking }
    }

    #[test]
    fn the_launch_and_the_request_decide_whether_answers_are_read() {
        // Not asked for at launch: nothing read, nothing added to the prompt.
        let mut p = chat(None);
        assert_eq!(apply(&defaults("qwen3", false, None), &mut p), None);
        assert_eq!(p, chat(None));
        // Asked for: a reasoning family's marks, or the usual ones for a name the registry
        // does not know; none for a family that does not reason.
        assert_eq!(apply(&defaults("qwen3", true, None), &mut chat(None)), Some(THINK_MARKS));
        assert_eq!(apply(&defaults("my-r1", true, None), &mut chat(None)), Some(THINK_MARKS));
        assert_eq!(apply(&defaults("smollm2-instruct", true, None), &mut chat(None)), None);
        // The request turns thinking off: not read.
        let mut p = chat(Some(serde_json::json!({"enable_thinking": false, "x": 1})));
        assert_eq!(apply(&defaults("qwen3", true, Some(true)), &mut p), None);
        assert_eq!(args_of(&p), Some(serde_json::json!({"enable_thinking": false, "x": 1})));
    }

    #[test]
    fn the_launch_default_fills_only_what_the_request_leaves_out() {
        let mut p = chat(None);
        assert_eq!(apply(&defaults("qwen3", true, Some(false)), &mut p), None);
        assert_eq!(args_of(&p), Some(serde_json::json!({"enable_thinking": false})));
        let mut p = chat(Some(serde_json::json!({"tools": []})));
        apply(&defaults("qwen3", false, Some(false)), &mut p);
        assert_eq!(args_of(&p), Some(serde_json::json!({"tools": [], "enable_thinking": false})));
        // The request's own value wins, and decides the reading.
        let mut p = chat(Some(serde_json::json!({"enable_thinking": true})));
        assert_eq!(apply(&defaults("qwen3", true, Some(false)), &mut p), Some(THINK_MARKS));
        assert_eq!(args_of(&p), Some(serde_json::json!({"enable_thinking": true})));
        // Completions prompts have no template.
        let mut p = Prompt::Text("x".into());
        apply(&defaults("qwen3", true, Some(false)), &mut p);
        assert_eq!(p, Prompt::Text("x".into()));
    }

    fn marks() -> ReasoningMarks {
        xinf_models::THINK_MARKS
    }

    fn whole(text: &str) -> (String, String) {
        let s = ReasoningStream::split_whole(marks(), text);
        (s.reasoning, s.content)
    }

    fn pair(r: &str, c: &str) -> (String, String) {
        (r.to_owned(), c.to_owned())
    }

    #[test]
    fn whole_outputs() {
        // Qwen3: both marks in the output.
        assert_eq!(whole("<think>\nhm\n</think>\n\nHello."), pair("\nhm\n", "\n\nHello."));
        // R1: the template opened the reasoning.
        assert_eq!(whole("hm</think>Hi"), pair("hm", "Hi"));
        // Never closed (cut by max_tokens): all reasoning.
        assert_eq!(whole("<think>still going"), pair("still going", ""));
        assert_eq!(whole("no marks at all"), pair("no marks at all", ""));
        // Whitespace before the opening mark goes with it; an empty output stays empty.
        assert_eq!(whole("  \n<think>a</think>b"), pair("a", "b"));
        assert_eq!(whole(""), pair("", ""));
        assert_eq!(whole("<think></think>"), pair("", ""));
        // A second closing mark is answer text.
        assert_eq!(whole("a</think>b</think>c"), pair("a", "b</think>c"));
        // A prefix of the opening mark alone, then the end.
        assert_eq!(whole("<thi"), pair("<thi", ""));
    }

    /// Every way of cutting an output into pieces gives the whole answer's split.
    #[test]
    fn streams_split_as_whole_answers_do() {
        let outputs = [
            "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
            "reasoning first</think>then the answer",
            "<think>unfinished </thi",
            "   <think>x</think>",
            "plain",
            "<think>a</think></think>",
            "é<think>ü</think>ö",
        ];
        for text in outputs {
            let expected = whole(text);
            let chars: Vec<char> = text.chars().collect();
            for size in 1..=4 {
                let mut reader = ReasoningStream::new(marks());
                let (mut reasoning, mut content) = (String::new(), String::new());
                for piece in chars.chunks(size) {
                    let s = reader.push(&piece.iter().collect::<String>());
                    reasoning.push_str(&s.reasoning);
                    content.push_str(&s.content);
                }
                let s = reader.finish();
                reasoning.push_str(&s.reasoning);
                content.push_str(&s.content);
                assert_eq!((reasoning, content), expected, "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn a_stream_holds_back_only_what_may_be_a_mark() {
        let mut reader = ReasoningStream::new(marks());
        assert_eq!(reader.push("<th"), Split::default());
        assert_eq!(reader.push("ink>I think"), Split { reasoning: "I think".into(), content: String::new() });
        assert_eq!(reader.push(" so</"), Split { reasoning: " so".into(), content: String::new() });
        assert_eq!(reader.push("think>Yes"), Split { reasoning: String::new(), content: "Yes".into() });
        assert_eq!(reader.push("</think>"), Split { reasoning: String::new(), content: "</think>".into() });
    }
}
