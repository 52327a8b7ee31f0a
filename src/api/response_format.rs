//! `response_format`: the shape a generation's output must take (OpenAI's `text`,
//! `json_object` and `json_schema`), read into the engine's [`StructuredOutput`].

use crate::api::error::Problem;
use serde_json::Value;
use xinf_engine::{MAX_SCHEMA_BYTES, StructuredOutput};

/// The shape `value` asks for; `None` for free text (no `response_format`, or `text`).
pub(crate) fn read(value: Option<&Value>) -> Result<Option<StructuredOutput>, Problem> {
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
}
