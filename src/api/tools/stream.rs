//! One streamed choice's output, read for calls as it comes.
//!
//! Text that cannot be a call goes out as it comes; text that may be one is held back to the
//! end of the choice and then sent as calls, or as text if it was none. A named function's
//! arguments go out as they come, since the grammar makes all of the output the arguments.

use super::parse::{self, PYTHON_TAG, TOOL_CALL};
use super::{Choice, Tools, call_id};
use crate::api::openai::{Delta, DeltaFunction, DeltaToolCall};
use std::sync::Arc;

/// Where a choice's output stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace, or the start of a call's mark, so far.
    Start,
    /// Text; a `<tool_call>` may still begin.
    Text,
    /// A call (or what may be one) began: everything is held to the end.
    Held,
    /// A named function's arguments, the call's first piece sent.
    Arguments,
}

/// A streamed choice's reader.
#[derive(Debug)]
pub(crate) struct ToolStream {
    tools: Arc<Tools>,
    state: State,
    /// Text not sent yet.
    held: String,
    /// Whether calls were sent.
    called: bool,
}

impl ToolStream {
    pub(crate) fn new(tools: Arc<Tools>) -> Self {
        Self { tools, state: State::Start, held: String::new(), called: false }
    }

    /// Whether this choice made calls.
    pub(crate) fn called(&self) -> bool {
        self.called
    }

    /// What to send of the next piece of text (an empty delta when nothing).
    pub(crate) fn push(&mut self, text: &str) -> Delta {
        if let Choice::Named(name) = &self.tools.choice {
            let first = self.state != State::Arguments;
            self.state = State::Arguments;
            self.called = true;
            return calls_delta(vec![piece(0, first.then(|| name.clone()), text.to_owned())]);
        }
        self.held.push_str(text);
        match (&self.tools.choice, self.state) {
            (Choice::Required, _) | (_, State::Held) => Delta::default(),
            (_, State::Start) => {
                let t = self.held.trim_start();
                if t.is_empty() || TOOL_CALL.starts_with(t) || PYTHON_TAG.starts_with(t) {
                    return Delta::default();
                }
                if t.starts_with(['{', '[']) || t.starts_with(TOOL_CALL) || t.starts_with(PYTHON_TAG) {
                    self.state = State::Held;
                    return Delta::default();
                }
                self.state = State::Text;
                self.text()
            }
            (_, State::Text | State::Arguments) => self.text(),
        }
    }

    /// Sends the held text up to a `<tool_call>` (then holding from it) or up to what may be
    /// the start of one.
    fn text(&mut self) -> Delta {
        let send = match self.held.find(TOOL_CALL) {
            Some(at) => {
                self.state = State::Held;
                at
            }
            None => self.held.len() - partial_mark(&self.held),
        };
        let rest = self.held.split_off(send);
        let out = std::mem::replace(&mut self.held, rest);
        content_delta(out)
    }

    /// What is left to send when the choice ends.
    pub(crate) fn finish(&mut self) -> Delta {
        let held = std::mem::take(&mut self.held);
        match (&self.tools.choice, self.state) {
            (Choice::Named(name), State::Start) => {
                self.called = true;
                calls_delta(vec![piece(0, Some(name.clone()), String::new())])
            }
            (Choice::Named(_), _) => Delta::default(),
            (Choice::Required, _) => match parse::required(&held, &self.tools.names()) {
                Some(calls) => self.calls(calls),
                None => content_delta(held),
            },
            (Choice::Auto, State::Held) => match parse::auto(&held, &self.tools.names()) {
                Some((_, calls)) => self.calls(calls),
                None => content_delta(held),
            },
            (Choice::Auto, _) => content_delta(held),
        }
    }

    fn calls(&mut self, calls: Vec<parse::Call>) -> Delta {
        self.called = true;
        let pieces = self.tools.limit(calls).into_iter().enumerate();
        calls_delta(pieces.map(|(i, c)| piece(i as u32, Some(c.name), c.arguments)).collect())
    }
}

/// Bytes at the end of `text` that may be the start of a `<tool_call>` mark.
fn partial_mark(text: &str) -> usize {
    (1..TOOL_CALL.len()).rev().find(|&n| text.ends_with(&TOOL_CALL[..n])).unwrap_or(0)
}

/// A call's piece: the first one of a call (with `name`) carries its id and type too.
fn piece(index: u32, name: Option<String>, arguments: String) -> DeltaToolCall {
    let first = name.is_some();
    DeltaToolCall {
        index,
        id: first.then(call_id),
        kind: first.then_some("function"),
        function: DeltaFunction { name, arguments },
    }
}

fn calls_delta(calls: Vec<DeltaToolCall>) -> Delta {
    Delta { tool_calls: Some(calls), ..Delta::default() }
}

fn content_delta(text: String) -> Delta {
    Delta { content: (!text.is_empty()).then_some(text), ..Delta::default() }
}
