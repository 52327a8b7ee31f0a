//! Messages as a template sees them, and the Hermes tool format for templates that know no
//! tools.

use std::sync::Arc;

use minijinja::value::{Enumerator, Object, Value};
use serde_json::Value as Json;
use xinf_engine::{ChatMessage, ToolCall};

/// A message as the template sees it: a mapping with `role`, `content`, then `tool_calls` or
/// `tool_call_id` where the message has them.
///
/// A serialized struct would become a key-sorted map (`content` before `role`) and change the
/// text of `messages | tojson` and `message.items()`; transformers passes the dicts in the
/// order the client wrote them, which is `role` first in practice.
#[derive(Debug)]
pub(super) struct Message(pub(super) ChatMessage);

impl Object for Message {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.as_str())),
            "content" => Some(Value::from(self.0.content.as_str())),
            "tool_calls" if !self.0.tool_calls.is_empty() => {
                Some(Value::from(self.0.tool_calls.iter().map(call_value).collect::<Vec<_>>()))
            }
            "tool_call_id" => self.0.tool_call_id.as_deref().map(Value::from),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match (self.0.tool_calls.is_empty(), self.0.tool_call_id.is_some()) {
            (true, false) => Enumerator::Str(&["role", "content"]),
            (false, false) => Enumerator::Str(&["role", "content", "tool_calls"]),
            (true, true) => Enumerator::Str(&["role", "content", "tool_call_id"]),
            (false, true) => Enumerator::Str(&["role", "content", "tool_calls", "tool_call_id"]),
        }
    }
}

/// A call as vLLM hands it to templates: `{"id", "type": "function", "function": {"name",
/// "arguments"}}` with the arguments decoded from their JSON text, since templates write them
/// with `tojson` (a text that is not JSON stays a string).
fn call_value(call: &ToolCall) -> Value {
    let arguments =
        serde_json::from_str::<Json>(&call.arguments).unwrap_or_else(|_| Json::from(call.arguments.as_str()));
    Value::from_serialize(serde_json::json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }))
}

/// Whether a conversation needs tool support from its template: it offers tools, or holds a
/// call or a tool's answer.
pub(super) fn uses_tools(messages: &[ChatMessage], tools: &[Json]) -> bool {
    !tools.is_empty() || messages.iter().any(|m| !m.tool_calls.is_empty() || m.role == "tool")
}

/// Qwen2.5's words for the tools, which Hermes-style models (Qwen2.5, Qwen3, Hermes) are
/// trained on; the text between opens the tool list.
const TOOLS_HEAD: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const TOOLS_TAIL: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/// The conversation rewritten for a template that takes no `tools`, in the Hermes format as
/// Qwen2.5's template writes it: the tools appended to the system message (or one made for
/// them), each call an assistant made as a `<tool_call>` block after its text, and each run of
/// tool answers one user turn of `<tool_response>` blocks. `json` writes a value as Python's
/// `json.dumps` does.
pub(super) fn hermes(
    messages: &[ChatMessage],
    tools: &[Json],
    json: impl Fn(&Json) -> String,
) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let mut text = TOOLS_HEAD.to_owned();
        for tool in tools {
            text.push('\n');
            text.push_str(&json(tool));
        }
        text.push_str(TOOLS_TAIL);
        match messages.first() {
            Some(first) if first.role == "system" => {
                out.push(ChatMessage::new("system", format!("{}\n\n{text}", first.content)));
            }
            _ => out.push(ChatMessage::new("system", text)),
        }
    }
    let skip = usize::from(out.len() == 1 && messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(prev) if prev.tool_call_id.is_some() => {
                    prev.content.push('\n');
                    prev.content.push_str(&block);
                }
                // The user turn is marked as one of answers (by an empty call id) so that the
                // next answer joins it.
                _ => out.push(ChatMessage {
                    tool_call_id: Some(String::new()),
                    ..ChatMessage::new("user", block)
                }),
            }
            continue;
        }
        let mut content = m.content.clone();
        for call in &m.tool_calls {
            if !content.is_empty() {
                content.push('\n');
            }
            let arguments =
                serde_json::from_str::<Json>(&call.arguments).map_or(call.arguments.clone(), |a| json(&a));
            content.push_str(&format!(
                "<tool_call>\n{{\"name\": \"{}\", \"arguments\": {arguments}}}\n</tool_call>",
                call.name
            ));
        }
        out.push(ChatMessage::new(m.role.clone(), content));
    }
    // The marks have done their work; the template sees plain messages.
    out.iter_mut().for_each(|m| m.tool_call_id = None);
    out
}
