//! A model's chat settings from its launch, which the REST layer reads for every chat answer:
//! Xinference's `reasoning_content` and `enable_thinking` launch keys.

/// How a model's chat answers are made and read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatDefaults {
    /// The model's registry name (`qwen3`), by which the REST layer finds its reasoning marks.
    pub model_name: String,
    /// `reasoning_content: true`: answers show the model's reasoning apart from its content.
    pub reasoning_content: bool,
    /// `enable_thinking`: the chat template's `enable_thinking` for requests that do not set it
    /// (hybrid models such as Qwen3 then answer without reasoning). `None` leaves it to the
    /// template.
    pub enable_thinking: Option<bool>,
}
