//! An engine's own command-line flags, from a table generated from the engine's argument parser
//! (`scripts/engine-flags.py`): `engine_config` keys that are not xinf's become flags, checked
//! by name and by kind before anything starts, so a typo is a launch error naming the key, not
//! an engine that exits with a usage message after a minute of imports.

use xinf_engine::{EngineError, FlagValue};

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagKind {
    /// `store_true`: present or absent.
    Switch,
    /// `BooleanOptionalAction`: `--x` or `--no-x`.
    Bool,
    /// One or more values after the flag.
    List,
    /// One value after the flag.
    Value,
}

/// One engine's flag table.
#[derive(Debug)]
pub(crate) struct FlagTable {
    /// The engine, for messages (`vLLM 0.26.0`).
    engine: &'static str,
    /// `(flag without the dashes, kind)`, in the table's order.
    flags: Vec<(&'static str, FlagKind)>,
}

impl FlagTable {
    /// Reads a generated table: `--flag kind` per line, `#` comments.
    pub(crate) fn parse(engine: &'static str, text: &'static str) -> Self {
        let flags = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (flag, kind) = l.trim().split_once(' ')?;
                let kind = match kind.trim() {
                    "switch" => FlagKind::Switch,
                    "bool" => FlagKind::Bool,
                    "list" => FlagKind::List,
                    _ => FlagKind::Value,
                };
                Some((flag.strip_prefix("--")?, kind))
            })
            .collect();
        Self { engine, flags }
    }

    /// The kind of a flag, by its name without dashes (`max-num-seqs`).
    pub(crate) fn kind(&self, flag: &str) -> Option<FlagKind> {
        self.flags.iter().find(|(f, _)| *f == flag).map(|(_, k)| *k)
    }

    /// Reads one `engine_config` key as a flag of this engine: its value must suit the flag's
    /// kind. `None` for a `null` value (Xinference's clients send absent options as nulls).
    pub(crate) fn read(
        &self,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<Option<FlagValue>, EngineError> {
        use serde_json::Value;
        let field = format!("engine_config.{key}");
        let flag = flag_name(key);
        let Some(kind) = self.kind(&flag) else {
            return Err(EngineError::invalid(
                field,
                format!("{} has no flag --{flag} (the engine's flags are listed by its --help)", self.engine),
            ));
        };
        let scalar = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        };
        let bad = |what: &str| Err(EngineError::invalid(field.clone(), format!("--{flag} takes {what}")));
        Ok(Some(match (kind, value) {
            (_, Value::Null) => return Ok(None),
            (FlagKind::Switch | FlagKind::Bool, Value::Bool(b)) => FlagValue::Switch(*b),
            (FlagKind::Switch | FlagKind::Bool, _) => return bad("true or false"),
            (FlagKind::List, Value::Array(items)) => {
                match items.iter().map(scalar).collect::<Option<Vec<_>>>() {
                    Some(items) if !items.is_empty() => FlagValue::List(items),
                    _ => return bad("a non-empty list of strings or numbers"),
                }
            }
            (FlagKind::List | FlagKind::Value, Value::Object(_)) => FlagValue::Json(value.to_string()),
            (FlagKind::List | FlagKind::Value, v) => match scalar(v) {
                Some(s) => FlagValue::Text(s),
                None => return bad("a string or a number"),
            },
        }))
    }

    /// The command-line arguments of flags read by [`read`](Self::read).
    pub(crate) fn args(&self, flags: &[(String, FlagValue)]) -> Vec<String> {
        let mut out = Vec::new();
        for (key, value) in flags {
            let flag = flag_name(key);
            match (self.kind(&flag), value) {
                (Some(FlagKind::Switch), FlagValue::Switch(true)) => out.push(format!("--{flag}")),
                (Some(FlagKind::Switch), FlagValue::Switch(false)) => {}
                (Some(FlagKind::Bool), FlagValue::Switch(b)) => {
                    out.push(if *b { format!("--{flag}") } else { format!("--no-{flag}") })
                }
                (_, FlagValue::List(items)) => {
                    out.push(format!("--{flag}"));
                    out.extend(items.iter().cloned());
                }
                (_, FlagValue::Text(t) | FlagValue::Json(t)) => {
                    out.push(format!("--{flag}"));
                    out.push(t.clone());
                }
                (_, FlagValue::Switch(b)) => {
                    out.push(format!("--{flag}"));
                    out.push(b.to_string());
                }
            }
        }
        out
    }
}

/// The flag an `engine_config` key names: `max_num_seqs` and `max-num-seqs` are both
/// `--max-num-seqs`.
pub(crate) fn flag_name(key: &str) -> String {
    key.trim_start_matches('-').replace('_', "-")
}

#[cfg(test)]
mod tests;
