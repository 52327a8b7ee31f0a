//! Chat templates: the Jinja programs that Hugging Face models ship (in
//! `tokenizer_config.json` or `chat_template.jinja`) to turn a list of messages into the
//! model's prompt text.
//!
//! Templates are written against Python's Jinja2 as configured by `transformers`, so the
//! environment here reproduces that configuration on top of minijinja: `trim_blocks` and
//! `lstrip_blocks` on, no trailing newline kept, `raise_exception` and `strftime_now` as
//! globals, a `tojson` filter that formats like Python's `json.dumps`, and Python string,
//! dict and list methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//! `minijinja_contrib::pycompat`. A prompt that differs by a single space or newline from what
//! the model was trained on degrades its output, which is why these details matter.

use std::fmt::{self, Write as _};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, context};
use xinf_engine::ChatMessage;

use crate::ModelError;

mod messages;
mod time;

#[cfg(test)]
mod tests;

/// The name the template is registered under; it appears in error locations.
const TEMPLATE_NAME: &str = "chat_template";

/// A compiled Hugging Face chat template.
///
/// Cheap to share: it is `Send + Sync` and rendering takes `&self`, so one instance serves every
/// request of a model.
pub struct ChatTemplate {
    /// The environment owns the compiled template (and its source), so it is `'static`.
    env: Environment<'static>,
    /// The template text, kept for [`ChatTemplate::source`] (diagnostics, `/v1/models`).
    source: String,
    /// `bos_token` of the tokenizer; undefined in the template when the model has none.
    bos_token: Option<String>,
    /// `eos_token` of the tokenizer; undefined in the template when the model has none.
    eos_token: Option<String>,
    /// Whether the template reads `tools`; one that does not is given tools in the Hermes
    /// format ([`messages::hermes`]).
    takes_tools: bool,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the tokenizer's special tokens.
    ///
    /// Syntax errors are reported here, once per model, rather than on every request.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        // transformers: `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
        // extensions=[AttributeExtension, loopcontrols])`; Jinja2 drops the final newline.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", time::strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned()).map_err(template_error)?;
        let takes_tools = env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?
            .undeclared_variables(false)
            .contains("tools");
        Ok(Self { env, source: source.to_owned(), bos_token, eos_token, takes_tools })
    }

    /// The template text as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` into prompt text; with `add_generation_prompt` the text ends with the
    /// header that makes the model answer as the assistant.
    ///
    /// Fails with [`ModelError::Template`] when the template raises (its own
    /// `raise_exception`, e.g. on roles that do not alternate) or hits an evaluation error.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_with(messages, add_generation_prompt, None)
    }

    /// [`render`](Self::render) with more variables for the template (vLLM's
    /// `chat_template_kwargs`, such as Qwen3's `enable_thinking`, and the request's `tools`).
    /// They cannot replace the variables xinf sets (`messages`, `add_generation_prompt`, the
    /// special tokens).
    ///
    /// A template that does not read `tools` gets the tools, calls and answers written into
    /// the messages in the Hermes format instead ([`messages::hermes`]), so that a model whose
    /// template knows no tools still sees them rather than losing them without a word.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        args: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ModelError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        let tools = match args.and_then(|a| a.get("tools")) {
            Some(serde_json::Value::Array(tools)) => tools.as_slice(),
            _ => &[],
        };
        let rewritten;
        let messages = if !self.takes_tools && messages::uses_tools(messages, tools) {
            rewritten = messages::hermes(messages, tools, python_json);
            rewritten.as_slice()
        } else {
            messages
        };
        // transformers passes `tools=None` and `documents=None` when the request has none, so
        // templates test them with `is none` / `is not none` as well as `is defined`.
        let or_none = |name: &str| {
            args.and_then(|a| a.get(name))
                .filter(|v| !v.is_null())
                .map_or(Value::from(()), Value::from_serialize)
        };
        let ctx = context! {
            messages => messages.iter().map(|m| Value::from_object(messages::Message(m.clone()))).collect::<Vec<_>>(),
            add_generation_prompt => add_generation_prompt,
            bos_token => special_token(self.bos_token.as_deref()),
            eos_token => special_token(self.eos_token.as_deref()),
            tools => if self.takes_tools { or_none("tools") } else { Value::from(()) },
            documents => or_none("documents"),
            ..Value::from_serialize(args)
        };
        template.render(ctx).map_err(template_error)
    }
}

/// `value` as Python's `json.dumps` writes it (what `tojson` gives a template).
fn python_json(value: &serde_json::Value) -> String {
    let style = JsonStyle {
        ensure_ascii: false,
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    match write_json(&mut out, &Value::from_serialize(value), &style, 0) {
        Ok(()) => out,
        // Only a value nested past `MAX_JSON_DEPTH` fails; serde's own text is still JSON.
        Err(_) => value.to_string(),
    }
}

/// A special token as a template value: transformers only passes tokens the tokenizer defines,
/// so a missing one is undefined (renders as nothing), not `none`.
fn special_token(token: Option<&str>) -> Value {
    token.map_or(Value::UNDEFINED, Value::from)
}

/// Marks an error raised by the template itself, so that its message reaches the user verbatim
/// instead of wrapped in minijinja's "invalid operation ... (in chat_template:3)".
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// Converts a minijinja error, keeping the template's own message when it raised one and the
/// whole cause chain otherwise.
fn template_error(err: minijinja::Error) -> ModelError {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<Raised>() {
            return ModelError::Template(raised.0.clone());
        }
        // A cause chain of a few links at most; quadratic growth is not a concern.
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    ModelError::Template(message)
}

/// `raise_exception(message)`: how templates reject conversations they cannot format.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `tojson`, as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
///
/// minijinja's own `tojson` is compact (`{"a":1}`) and HTML-escapes `<`, `>`, `&` and `'`;
/// Python writes `{"a": 1}` and leaves those characters alone. Tool schemas rendered into a
/// prompt must match the text the model was trained on, hence this replacement.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = usize::try_from(v)
                    .map_err(|_| invalid("tojson: indent must be a non-negative integer or a string"))?;
                Some(" ".repeat(n))
            }
        },
    };
    // Python's defaults depend on whether the output is indented.
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() && !seps.is_undefined() => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => match (item.as_str(), key.as_str()) {
                    (Some(item), Some(key)) => (item.to_owned(), key.to_owned()),
                    _ => return Err(invalid("tojson: separators must be two strings")),
                },
                _ => return Err(invalid("tojson: separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

/// Shorthand for an invalid-operation template error.
fn invalid(detail: &'static str) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, detail)
}

/// The `json.dumps` options of [`tojson`].
struct JsonStyle {
    ensure_ascii: bool,
    /// The text of one indentation level; `None` writes everything on one line.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// Deepest nesting [`write_json`] follows; template values are not cyclic, but a bound keeps a
/// pathological value from exhausting the stack.
const MAX_JSON_DEPTH: usize = 256;

/// Writes `value` the way Python's `json.dumps` does.
fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), minijinja::Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(invalid("tojson: value is nested too deeply"));
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', &items, |out, item, depth| {
                write_json(out, item, style, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, depth, '{', '}', &entries, |out, (key, item), depth| {
                write_json_str(out, key, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, item, style, depth)
            })?;
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(invalid("tojson: value is not JSON serializable"));
        }
        // `ValueKind` is non-exhaustive.
        _ => return Err(invalid("tojson: value is not JSON serializable")),
    }
    Ok(())
}

/// Writes the items of an array or object with Python's separators and indentation.
fn write_container<T>(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A number as Python prints it in JSON: integers as they are, floats with a fraction
/// (`1.0`), and Python's non-standard `NaN` / `Infinity`.
fn write_number(out: &mut String, value: &Value) {
    if !value.is_integer()
        && let Ok(f) = f64::try_from(value.clone())
    {
        if f.is_nan() {
            out.push_str("NaN");
            return;
        }
        if f.is_infinite() {
            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
            return;
        }
    }
    // minijinja already prints integers plainly and finite floats with a `.0`.
    let _ = write!(out, "{value}");
}

/// The string form of a map key: Python converts `True`, `None` and numbers to strings and
/// rejects everything else.
fn json_key(key: &Value) -> Result<String, minijinja::Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        _ => Err(invalid("tojson: keys must be strings, numbers, booleans or none")),
    }
}

/// A JSON string literal with Python's escapes: `\"`, `\\`, the short forms of control
/// characters and `\u00XX` for the rest; with `ensure_ascii` everything outside printable
/// ASCII becomes `\uXXXX` (surrogate pairs beyond the BMP).
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
