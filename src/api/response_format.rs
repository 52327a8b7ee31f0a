//! The shape a generation's output must take, read into the engine's [`StructuredOutput`]:
//! OpenAI's `response_format` (`text`, `json_object`, `json_schema`) or vLLM's
//! `structured_outputs` (`json`, `json_object`, `regex`, `choice`); at most one of the two.

use crate::api::error::Problem;
use serde_json::Value;
use xinf_engine::{MAX_SCHEMA_BYTES, StructuredOutput};

/// The shape a request asks for with `response_format` or `structured_outputs`; `None` for
/// free text.
pub(crate) fn read_either(
    response_format: Option<&Value>,
    structured_outputs: Option<&Value>,
) -> Result<Option<StructuredOutput>, Problem> {
    match (read(response_format)?, structured_outputs) {
        (None, None) => Ok(None),
        (shape, None) => Ok(shape),
        (None, Some(s)) => read_structured_outputs(s).map(Some),
        (Some(_), Some(_)) => {
            Err(Problem::field("structured_outputs", "api-structured-outputs-twice", "invalid_value"))
        }
    }
}

/// The parameter an engine's refusal of the shape [`read_either`] read should name: the key of
/// `structured_outputs` that gave it, else `response_format`.
pub(crate) fn shape_param(structured_outputs: Option<&Value>) -> String {
    structured_outputs
        .and_then(single_shape)
        .map_or_else(|| "response_format".to_owned(), |(k, _)| format!("structured_outputs.{k}"))
}

/// The one non-null key of a `structured_outputs` object, with its value; `None` when it is no
/// object or names no shape or several.
fn single_shape(v: &Value) -> Option<(&String, &Value)> {
    let mut given = v.as_object()?.iter().filter(|(_, v)| !v.is_null());
    given.next().filter(|_| given.next().is_none())
}

/// vLLM's `structured_outputs`: exactly one of `json` (a schema, or its text), `json_object`
/// (true), `regex` (text) and `choice` (texts).
fn read_structured_outputs(v: &Value) -> Result<StructuredOutput, Problem> {
    let invalid = |field: &str| {
        Problem::field(
            format!("structured_outputs.{field}"),
            "api-structured-outputs-invalid",
            "invalid_value",
        )
    };
    let Some((key, value)) = single_shape(v) else {
        return Err(Problem::field("structured_outputs", "api-structured-outputs-one", "invalid_value"));
    };
    let shape = match key.as_str() {
        "json" => {
            let text = match value {
                Value::String(s) => {
                    serde_json::from_str::<Value>(s).map_err(|_| invalid("json"))?;
                    s.clone()
                }
                Value::Object(_) | Value::Bool(_) => value.to_string(),
                _ => return Err(invalid("json")),
            };
            StructuredOutput::JsonSchema(text)
        }
        "json_object" if value.as_bool() == Some(true) => StructuredOutput::JsonObject,
        "regex" => StructuredOutput::Regex(value.as_str().ok_or_else(|| invalid("regex"))?.to_owned()),
        "choice" => {
            let texts: Option<Vec<String>> =
                value.as_array().and_then(|a| a.iter().map(|t| t.as_str().map(str::to_owned)).collect());
            StructuredOutput::Choice(texts.filter(|t| !t.is_empty()).ok_or_else(|| invalid("choice"))?)
        }
        "json_object" => return Err(invalid("json_object")),
        other => {
            return Err(Problem::field(
                format!("structured_outputs.{other}"),
                "api-structured-outputs-unsupported",
                "unsupported_parameter",
            ));
        }
    };
    if shape.text_len() > MAX_SCHEMA_BYTES {
        return Err(Problem::field(
            format!("structured_outputs.{key}"),
            "api-response-format-schema-too-long",
            "invalid_value",
        ));
    }
    Ok(shape)
}

/// The shape `value` asks for; `None` for free text (no `response_format`, or `text`).
fn read(value: Option<&Value>) -> Result<Option<StructuredOutput>, Problem> {
    let Some(format) = value else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(StructuredOutput::JsonObject)),
        Some("json_schema") => {
            let param = "response_format.json_schema.schema";
            // OpenAI nests the schema under `json_schema` with its name and `strict`; a schema
            // may be an object or `true`/`false`.
            let schema = format
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| Problem::field(param, "api-response-format-schema", "invalid_value"))?;
            let text = schema.to_string();
            if text.len() > MAX_SCHEMA_BYTES {
                return Err(Problem::field(param, "api-response-format-schema-too-long", "invalid_value"));
            }
            Ok(Some(StructuredOutput::JsonSchema(text)))
        }
        Some(kind) => Err(Problem::field_with(
            "response_format",
            "api-response-format-unsupported",
            "unsupported_parameter",
            ("kind", kind.to_owned()),
        )),
        None => Err(Problem::field("response_format", "api-response-format-invalid", "invalid_value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(v: Value) -> String {
        match read(Some(&v)) {
            Ok(s) => format!("{s:?}"),
            Err(Problem::Field { field, key, .. }) => format!("{field}: {key}"),
            Err(other) => format!("{other:?}"),
        }
    }

    #[test]
    fn shapes() {
        assert_eq!(read(None).ok(), Some(None));
        assert_eq!(read(Some(&json!({"type": "text"}))).ok(), Some(None));
        assert_eq!(
            read(Some(&json!({"type": "json_object"}))).ok(),
            Some(Some(StructuredOutput::JsonObject))
        );
        let schema =
            json!({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}});
        assert_eq!(
            read(Some(&schema)).ok(),
            Some(Some(StructuredOutput::JsonSchema(r#"{"type":"integer"}"#.into())))
        );
        assert_eq!(
            key(json!({"type": "json_schema"})),
            "response_format.json_schema.schema: api-response-format-schema"
        );
        assert_eq!(
            key(json!({"type": "json_schema", "json_schema": {"schema": "x"}})),
            "response_format.json_schema.schema: api-response-format-schema"
        );
        let long = json!({"type": "json_schema", "json_schema": {"schema": {"description": "x".repeat(MAX_SCHEMA_BYTES)}}});
        assert_eq!(key(long), "response_format.json_schema.schema: api-response-format-schema-too-long");
        assert_eq!(key(json!({"type": "grammar"})), "response_format: api-response-format-unsupported");
        assert_eq!(key(json!({})), "response_format: api-response-format-invalid");
        assert_eq!(key(json!(5)), "response_format: api-response-format-invalid");
    }

    fn either(v: Value) -> String {
        match read_either(None, Some(&v)) {
            Ok(s) => format!("{s:?}"),
            Err(Problem::Field { field, key, .. }) => format!("{field}: {key}"),
            Err(other) => format!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_shape_names_its_key() {
        assert_eq!(shape_param(None), "response_format");
        assert_eq!(shape_param(Some(&json!(null))), "response_format");
        assert_eq!(shape_param(Some(&json!({"regex": "((", "choice": null}))), "structured_outputs.regex");
        assert_eq!(shape_param(Some(&json!({"json": {}}))), "structured_outputs.json");
    }

    #[test]
    fn vllm_structured_outputs() {
        assert_eq!(either(json!({"regex": "[0-9]+"})), r#"Some(Regex("[0-9]+"))"#);
        assert_eq!(either(json!({"choice": ["yes", "no"], "regex": null})), r#"Some(Choice(["yes", "no"]))"#);
        assert_eq!(
            either(json!({"json": {"type": "integer"}})),
            r#"Some(JsonSchema("{\"type\":\"integer\"}"))"#
        );
        assert_eq!(
            either(json!({"json": "{\"type\": \"integer\"}"})),
            r#"Some(JsonSchema("{\"type\": \"integer\"}"))"#
        );
        assert_eq!(either(json!({"json_object": true})), "Some(JsonObject)");
        assert_eq!(
            either(json!({"json": "{nope"})),
            "structured_outputs.json: api-structured-outputs-invalid"
        );
        assert_eq!(
            either(json!({"choice": []})),
            "structured_outputs.choice: api-structured-outputs-invalid"
        );
        assert_eq!(
            either(json!({"choice": ["a", 1]})),
            "structured_outputs.choice: api-structured-outputs-invalid"
        );
        assert_eq!(either(json!({"regex": 5})), "structured_outputs.regex: api-structured-outputs-invalid");
        assert_eq!(
            either(json!({"grammar": "root ::= x"})),
            "structured_outputs.grammar: api-structured-outputs-unsupported"
        );
        assert_eq!(
            either(json!({"regex": "a", "choice": ["b"]})),
            "structured_outputs: api-structured-outputs-one"
        );
        assert_eq!(either(json!({})), "structured_outputs: api-structured-outputs-one");
        assert_eq!(either(json!("x")), "structured_outputs: api-structured-outputs-one");
        let both = read_either(Some(&json!({"type": "json_object"})), Some(&json!({"regex": "a"})));
        assert!(matches!(both, Err(Problem::Field { key: "api-structured-outputs-twice", .. })));
        assert!(matches!(
            read_either(Some(&json!({"type": "text"})), Some(&json!({"regex": "a"}))),
            Ok(Some(_))
        ));
    }
}
