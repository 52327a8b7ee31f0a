//! The sampling fields both generation APIs take, parsed once for both request types and
//! turned into the engine's [`SamplingParams`] by one function.
//!
//! A request body is parsed as [`WithSampling<R>`]: the sampling fields go to
//! [`SamplingFields`], every other key to the request type `R`, in one pass over the JSON
//! object. `#[serde(flatten)]` would do the split too, but it buffers the values it hands to
//! the flattened struct, so a wrongly typed sampling field would be reported without its name
//! and the inner request type could not refuse unknown fields itself. Here each value is read
//! straight from the body, so errors keep naming the field and `R` keeps
//! `deny_unknown_fields`.

use crate::api::choices::MAX_CHOICES;
use crate::api::error::Problem;
use crate::api::openai::StopField;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;
use xinf_engine::{MAX_LOGIT_BIAS, SamplingParams};

/// The sampling fields both generation APIs share, as the client sent them.
#[derive(Debug, Default)]
pub(crate) struct SamplingFields {
    pub(crate) max_tokens: Option<usize>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) seed: Option<u64>,
    pub(crate) stop: Option<StopField>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) ignore_eos: Option<bool>,
    pub(crate) min_tokens: Option<usize>,
    pub(crate) stop_token_ids: Option<Vec<u32>>,
    pub(crate) n: Option<u64>,
}

impl SamplingFields {
    /// Engine sampling settings with OpenAI defaults (temperature 1, top_p 1), checked: the
    /// error names the first bad field.
    pub(crate) fn into_params(self) -> Result<SamplingParams, Problem> {
        let d = SamplingParams::default();
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(_) => return Err(Problem::field("top_k", "api-top-k-invalid", "invalid_value")),
        };
        let params = SamplingParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k,
            min_p: self.min_p.unwrap_or(d.min_p),
            seed: self.seed,
            stop: self.stop.map(StopField::into_vec).unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens: self.min_tokens.unwrap_or(0),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            // Each API spells it its own way (a switch and a count, or a count): set by its route.
            logprobs: None,
            // Set by the route from `echo`, `logprobs` and `prompt_logprobs`.
            prompt_logprobs: None,
            echo: false,
            // Read with the request's other fields by its route (see [`logit_bias`]).
            logit_bias: Vec::new(),
            // Read from `response_format` by its route.
            structured: None,
            structured_after: None,
        };
        params.validate()?;
        Ok(params)
    }

    /// The choices asked for (`n`, 1 by default), at most [`MAX_CHOICES`].
    pub(crate) fn choices(&self) -> Result<usize, Problem> {
        match self.n {
            None => Ok(1),
            Some(n @ 1..) if n <= MAX_CHOICES as u64 => Ok(n as usize),
            Some(_) => Err(Problem::field("n", "api-n-range", "invalid_value")),
        }
    }

    /// Reads the value of `key` when it is a sampling field; `false` (nothing read) for any
    /// other key.
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "max_tokens" => self.max_tokens = map.next_value()?,
            "temperature" => self.temperature = map.next_value()?,
            "top_p" => self.top_p = map.next_value()?,
            "top_k" => self.top_k = map.next_value()?,
            "min_p" => self.min_p = map.next_value()?,
            "seed" => self.seed = map.next_value()?,
            "stop" => self.stop = map.next_value()?,
            "presence_penalty" => self.presence_penalty = map.next_value()?,
            "frequency_penalty" => self.frequency_penalty = map.next_value()?,
            "repetition_penalty" => self.repetition_penalty = map.next_value()?,
            "ignore_eos" => self.ignore_eos = map.next_value()?,
            "min_tokens" => self.min_tokens = map.next_value()?,
            "stop_token_ids" => self.stop_token_ids = map.next_value()?,
            "n" => self.n = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// OpenAI's `logit_bias`: an object from token ids (as strings) to numbers within
/// [-100, 100], at most [`MAX_LOGIT_BIAS`] of them; absent, null or `{}` biases nothing. Whether
/// the ids are in the vocabulary is the engine's check.
pub(crate) fn logit_bias(value: Option<&Value>) -> Result<Vec<(u32, f32)>, Problem> {
    let invalid = || Problem::field("logit_bias", "api-logit-bias-invalid", "invalid_value");
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) if m.len() <= MAX_LOGIT_BIAS => m
            .iter()
            .map(|(k, v)| {
                let id = k.trim().parse::<u32>().map_err(|_| invalid())?;
                let bias = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(invalid)?;
                Ok((id, bias as f32))
            })
            .collect(),
        Some(_) => Err(invalid()),
    }
}

/// A generation request body: the shared sampling fields, and `rest`, the request type that
/// takes every other key (and refuses the ones it does not know).
#[derive(Debug)]
pub(crate) struct WithSampling<R> {
    pub(crate) sampling: SamplingFields,
    pub(crate) rest: R,
}

impl<'de, R: Deserialize<'de>> Deserialize<'de> for WithSampling<R> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut reader = Reader::default();
        let rest = R::deserialize(SplitDeserializer { inner: deserializer, reader: &mut reader })?;
        Ok(Self { sampling: reader.fields, rest })
    }
}

/// The sampling fields read so far, and their keys, to refuse a key given twice as the derived
/// request types do.
#[derive(Default)]
struct Reader {
    fields: SamplingFields,
    seen: Vec<String>,
}

/// The body's deserializer as `R` sees it: the same, except that the object it visits no
/// longer shows the sampling keys.
struct SplitDeserializer<'a, D> {
    inner: D,
    reader: &'a mut Reader,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for SplitDeserializer<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(SplitVisitor { inner: visitor, reader: self.reader })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_struct(name, fields, SplitVisitor { inner: visitor, reader: self.reader })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// `R`'s visitor (its `expecting` text unchanged), given the object without the sampling keys.
struct SplitVisitor<'a, V> {
    inner: V,
    reader: &'a mut Reader,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SplitVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(SplitMap { inner: map, reader: self.reader })
    }
}

/// The body's object with the sampling keys taken out (their values go to the reader).
struct SplitMap<'a, A> {
    inner: A,
    reader: &'a mut Reader,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SplitMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.inner.next_key::<String>()? {
            if self.reader.seen.contains(&key) {
                return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
            }
            if self.reader.fields.read(&key, &mut self.inner)? {
                self.reader.seen.push(key);
                continue;
            }
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openai::{ChatCompletionRequest, CompletionRequest};

    fn parse<R: serde::de::DeserializeOwned>(json: &str) -> Result<WithSampling<R>, (String, String)> {
        let de = &mut serde_json::Deserializer::from_str(json);
        serde_path_to_error::deserialize(de).map_err(|e| (e.path().to_string(), e.into_inner().to_string()))
    }

    #[test]
    fn sampling_keys_go_to_the_sampling_fields() {
        let r = parse::<CompletionRequest>(
            r#"{"model": "m", "temperature": 0.5, "prompt": "hi", "stop": ["x"], "n": 1, "max_tokens": 3}"#,
        );
        let Ok(r) = r else { panic!("{r:?}") };
        assert_eq!(r.rest.model, "m");
        assert_eq!(r.sampling.temperature, Some(0.5));
        assert_eq!(r.sampling.max_tokens, Some(3));
        assert_eq!(r.sampling.n, Some(1));
        let params = r.sampling.into_params().ok().map(|p| (p.stop, p.max_tokens));
        assert_eq!(params, Some((vec!["x".to_owned()], Some(3))));
    }

    #[test]
    fn errors_still_name_the_field() {
        let chat = r#""model": "m", "messages": []"#;
        let err = |json: &str| parse::<ChatCompletionRequest>(json).err().unwrap_or_default();
        let (path, detail) = err(&format!("{{{chat}, \"top_k\": \"many\"}}"));
        assert_eq!(path, "top_k");
        assert!(detail.starts_with("invalid type: string \"many\", expected i64"), "{detail}");
        let (path, detail) = err(&format!("{{{chat}, \"stop\": 5}}"));
        assert_eq!((path.as_str(), detail.contains("StopField")), ("stop", true), "{detail}");
        let (_, detail) = err(&format!("{{{chat}, \"seed\": 1, \"seed\": null}}"));
        assert!(detail.starts_with("duplicate field `seed`"), "{detail}");
        let (_, detail) = err(&format!("{{{chat}, \"model\": \"again\"}}"));
        assert!(detail.starts_with("duplicate field `model`"), "{detail}");
        let (_, detail) = err(&format!("{{{chat}, \"best_of\": 1}}"));
        assert!(detail.starts_with("unknown field `best_of`"), "{detail}");
        let (_, detail) = err("5");
        assert!(
            detail.starts_with("invalid type: integer `5`, expected struct ChatCompletionRequest"),
            "{detail}"
        );
    }
}
