//! Function calling: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`.
//!
//! The tools reach the model through its chat template (as vLLM passes them; a template that
//! reads no tools gets them in the Hermes format). What comes back is read per choice:
//! - `auto`: the model writes text or calls in its own format, Hermes `<tool_call>` blocks
//!   (Qwen2.5, Qwen3, Hermes; and the format the fallback teaches) or Llama 3's bare JSON
//!   objects; calls of functions the request did not offer stay text.
//! - `required`: a grammar holds the output to a JSON array of `{"name", "arguments"}` objects,
//!   one per call, each name one of the tools and its arguments of that tool's schema.
//! - a named function: a grammar holds the output to that function's arguments.
//!
//! `none` (and no `tool_choice` with no tools) leaves the tools out of the prompt.

mod parse;
mod stream;

pub(crate) use stream::ToolStream;

use crate::api::error::Problem;
use crate::api::openai::{OutFunction, OutToolCall, ToolIn};
use serde_json::{Value, json};
use xinf_engine::{FinishReason, MAX_SCHEMA_BYTES, StructuredOutput};

/// Most tools a request may offer (OpenAI's limit).
pub(crate) const MAX_TOOLS: usize = 128;

/// What the model may do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Choice {
    /// Answer or call, as it likes.
    Auto,
    /// Call one or more.
    Required,
    /// Call this one.
    Named(String),
}

/// A request's checked tools.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// The tools as templates get them (vLLM's dicts).
    template: Value,
    /// Each function's name and the JSON Schema of its arguments.
    functions: Vec<(String, Value)>,
    choice: Choice,
    /// Whether several calls may answer one request.
    parallel: bool,
}

/// A function name as OpenAI allows it: letters, digits, `_` and `-`, 1 to 64 of them.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads the request's tool fields; `None` when the model is to see no tools (none given, or
/// `tool_choice: "none"`).
pub(crate) fn read(
    tools: Option<Vec<ToolIn>>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, Problem> {
    let tools = tools.unwrap_or_default();
    let choice_field = || Problem::field("tool_choice", "api-tool-choice-invalid", "invalid_value");
    if tools.is_empty() {
        // As OpenAI: a tool choice means nothing without tools.
        return match choice {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s == "none" => Ok(None),
            Some(_) => Err(Problem::field("tool_choice", "api-tool-choice-without-tools", "invalid_value")),
        };
    }
    if tools.len() > MAX_TOOLS {
        return Err(Problem::field_with(
            "tools",
            "api-tools-too-many",
            "invalid_value",
            ("limit", MAX_TOOLS.to_string()),
        ));
    }
    let mut functions: Vec<(String, Value)> = Vec::with_capacity(tools.len());
    let mut template = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        let f = tool.function;
        if !valid_name(&f.name) {
            return Err(Problem::field(
                format!("tools[{i}].function.name"),
                "api-tool-name-invalid",
                "invalid_value",
            ));
        }
        if functions.iter().any(|(n, _)| *n == f.name) {
            return Err(Problem::field(
                format!("tools[{i}].function.name"),
                "api-tool-name-twice",
                "invalid_value",
            ));
        }
        let schema = match &f.parameters {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) if p.to_string().len() <= MAX_SCHEMA_BYTES => p.clone(),
            Some(_) => {
                let field = format!("tools[{i}].function.parameters");
                return Err(Problem::field(field, "api-tool-parameters-invalid", "invalid_value"));
            }
        };
        let mut function = json!({"name": f.name, "description": f.description, "parameters": f.parameters});
        if let (Some(strict), Some(o)) = (f.strict, function.as_object_mut()) {
            o.insert("strict".into(), Value::Bool(strict));
        }
        template.push(json!({"type": "function", "function": function}));
        functions.push((f.name, schema));
    }
    let choice = match choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            _ => return Err(choice_field()),
        },
        Some(Value::Object(o)) => {
            let name = match (o.get("type").and_then(Value::as_str), o.get("function")) {
                (Some("function"), Some(Value::Object(f))) if o.len() == 2 => {
                    f.get("name").and_then(Value::as_str)
                }
                _ => None,
            };
            let name = name.ok_or_else(choice_field)?;
            if !functions.iter().any(|(n, _)| n == name) {
                return Err(Problem::field_with(
                    "tool_choice.function.name",
                    "api-tool-choice-unknown",
                    "invalid_value",
                    ("name", name.to_owned()),
                ));
            }
            Choice::Named(name.to_owned())
        }
        Some(_) => return Err(choice_field()),
    };
    Ok(Some(Tools {
        template: Value::Array(template),
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

impl Tools {
    /// The tools as the chat template's `tools` variable.
    pub(crate) fn template_value(&self) -> &Value {
        &self.template
    }

    /// The grammar that `required` and a named function hold the output to; `None` for `auto`.
    pub(crate) fn grammar(&self) -> Option<StructuredOutput> {
        match &self.choice {
            Choice::Auto => None,
            Choice::Named(name) => {
                let schema = self.functions.iter().find(|(n, _)| n == name).map(|(_, s)| s.to_string());
                schema.map(StructuredOutput::JsonSchema)
            }
            Choice::Required => {
                let calls: Vec<Value> = self
                    .functions
                    .iter()
                    .map(|(name, schema)| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"type": "string", "enum": [name]}, "arguments": schema},
                            "required": ["name", "arguments"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut array = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if let (false, Some(o)) = (self.parallel, array.as_object_mut()) {
                    o.insert("maxItems".into(), json!(1));
                }
                Some(StructuredOutput::JsonSchema(array.to_string()))
            }
        }
    }

    fn names(&self) -> Vec<&str> {
        self.functions.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The calls in a whole output, and the text that is left as content (`None` when the
    /// answer is only calls).
    pub(crate) fn answer(&self, text: String) -> (Option<String>, Vec<OutToolCall>) {
        let (content, calls) = match &self.choice {
            Choice::Named(name) => (None, vec![parse::Call { name: name.clone(), arguments: text }]),
            Choice::Required => match parse::required(&text, &self.names()) {
                Some(calls) => (None, calls),
                None => (Some(text), Vec::new()),
            },
            Choice::Auto => match parse::auto(&text, &self.names()) {
                Some((before, calls)) => ((!before.trim().is_empty()).then(|| before.to_owned()), calls),
                None => (Some(text), Vec::new()),
            },
        };
        let calls = self.limit(calls).into_iter().map(parse::Call::into_out).collect();
        (content, calls)
    }

    /// At most one call unless the request allows several.
    fn limit(&self, mut calls: Vec<parse::Call>) -> Vec<parse::Call> {
        if !self.parallel {
            calls.truncate(1);
        }
        calls
    }

    /// The finish reason of a choice: `tool_calls` when the model chose to call (`auto` or
    /// `required`) and stopped by itself; a named function's call ends with `stop`, as OpenAI's.
    pub(crate) fn finish_name(&self, reason: FinishReason, called: bool) -> &'static str {
        match (&self.choice, reason, called) {
            (Choice::Auto | Choice::Required, FinishReason::Stop, true) => "tool_calls",
            _ => reason.as_str(),
        }
    }
}

/// A new call id, as OpenAI's look (`call_` and 24 letters and digits).
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// An output call.
fn out_call(name: String, arguments: String) -> OutToolCall {
    OutToolCall { id: call_id(), kind: "function", function: OutFunction { name, arguments } }
}

#[cfg(test)]
mod tests;
