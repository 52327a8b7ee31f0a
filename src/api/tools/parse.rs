//! Reading calls out of a model's output text.

use crate::api::openai::OutToolCall;
use serde_json::Value;

/// Opens a call in the Hermes format.
pub(super) const TOOL_CALL: &str = "<tool_call>";
/// Closes a call in the Hermes format.
const TOOL_CALL_END: &str = "</tool_call>";
/// Llama 3's mark before a call; it is a special token, so it is usually not in the text.
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";

/// A call read from the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Call {
    pub(super) name: String,
    /// JSON text.
    pub(super) arguments: String,
}

impl Call {
    pub(super) fn into_out(self) -> OutToolCall {
        super::out_call(self.name, self.arguments)
    }

    /// A call from a `{"name": .., "arguments"|"parameters": {..}}` object naming one of
    /// `names`.
    fn from_object(value: &Value, names: &[&str]) -> Option<Self> {
        let o = value.as_object()?;
        let name = o.get("name")?.as_str()?;
        if !names.contains(&name) {
            return None;
        }
        let arguments = match o.get("arguments").or_else(|| o.get("parameters")) {
            Some(a @ Value::Object(_)) => a.to_string(),
            // Some models write the arguments as JSON text, as OpenAI sends them.
            Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()) => {
                s.clone()
            }
            None => "{}".to_owned(),
            Some(_) => return None,
        };
        Some(Self { name: name.to_owned(), arguments })
    }
}

/// The calls of `tool_choice: "required"`'s output: a JSON array of call objects.
pub(super) fn required(text: &str, names: &[&str]) -> Option<Vec<Call>> {
    let items: Vec<Value> = serde_json::from_str(text).ok()?;
    let calls: Option<Vec<Call>> = items.iter().map(|v| Call::from_object(v, names)).collect();
    calls.filter(|c| !c.is_empty())
}

/// The calls of a free (`auto`) output, and the text before them: Hermes `<tool_call>`
/// blocks after any text, or Llama 3's JSON object(s) (one, a list, or several joined by `;`)
/// as the whole output. `None` when the output is not calls of offered functions, which then
/// stays content as a whole.
pub(super) fn auto<'a>(text: &'a str, names: &[&str]) -> Option<(&'a str, Vec<Call>)> {
    if let Some(start) = text.find(TOOL_CALL) {
        return hermes(&text[start..], names).map(|calls| (&text[..start], calls));
    }
    let body = text.trim_start();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
    if !body.starts_with('{') && !body.starts_with('[') {
        return None;
    }
    let values: Vec<Value> = match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(items)) => items,
        Ok(v) => vec![v],
        Err(_) => {
            body.split(';').map(|part| serde_json::from_str(part.trim()).ok()).collect::<Option<_>>()?
        }
    };
    let calls: Option<Vec<Call>> = values.iter().map(|v| Call::from_object(v, names)).collect();
    calls.filter(|c| !c.is_empty()).map(|c| ("", c))
}

/// Hermes blocks: `<tool_call>{..}</tool_call>`, whitespace between, the last one's closing
/// tag optional (a model may end the output there).
fn hermes(mut rest: &str, names: &[&str]) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let body = rest.strip_prefix(TOOL_CALL)?;
        let (json, after) = match body.find(TOOL_CALL_END) {
            Some(end) => (&body[..end], &body[end + TOOL_CALL_END.len()..]),
            None => (body, ""),
        };
        calls.push(Call::from_object(&serde_json::from_str(json.trim()).ok()?, names)?);
        rest = after;
    }
    (!calls.is_empty()).then_some(calls)
}
