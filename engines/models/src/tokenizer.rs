//! Tokenizers with their chat template and special tokens, from a Hugging Face folder or from
//! GGUF metadata.

use crate::{ChatTemplate, ModelError};
use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use sha2::{Digest, Sha256};
use std::path::Path;
use tokenizers::Tokenizer;
use xinf_engine::{ChatMessage, EngineError, Prompt};

mod bytes;

/// A tokenizer, its chat template and the ids that end generation.
pub struct TextTokenizer {
    inner: Tokenizer,
    chat_template: Option<ChatTemplate>,
    eos_token_ids: Vec<u32>,
    digest: String,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("digest", &self.digest).finish_non_exhaustive()
    }
}

fn tok_err(e: impl ToString) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// A special token in `tokenizer_config.json`: a plain string or an `AddedToken` object.
fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
        _ => None,
    }
}

impl TextTokenizer {
    fn finish(
        inner: Tokenizer,
        chat_template: Option<ChatTemplate>,
        mut eos: Vec<u32>,
    ) -> Result<Self, ModelError> {
        eos.sort_unstable();
        eos.dedup();
        let json = inner.to_string(false).map_err(tok_err)?;
        let mut h = Sha256::new();
        h.update(json.as_bytes());
        if let Some(t) = &chat_template {
            h.update(t.source().as_bytes());
        }
        let digest = format!("{:x}", h.finalize());
        Ok(Self { inner, chat_template, eos_token_ids: eos, digest })
    }

    /// Loads `tokenizer.json` and `tokenizer_config.json` (chat template, BOS/EOS) from a
    /// Hugging Face folder; `extra_eos` adds the model config's end-of-sequence ids.
    pub fn from_hf_dir(dir: &Path, extra_eos: &[u32]) -> Result<Self, ModelError> {
        let file = dir.join("tokenizer.json");
        if !file.is_file() {
            return Err(ModelError::MissingFile {
                dir: dir.display().to_string(),
                file: "tokenizer.json".into(),
            });
        }
        let inner = Tokenizer::from_file(&file)
            .map_err(|e| ModelError::Corrupt { file: file.display().to_string(), reason: e.to_string() })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| ModelError::Corrupt {
                file: cfg_path.display().to_string(),
                reason: e.to_string(),
            })?
        } else {
            serde_json::Value::Null
        };
        let bos = token_string(cfg.get("bos_token"));
        let eos = token_string(cfg.get("eos_token"));
        // The template may live in tokenizer_config.json or, in newer folders, chat_template.jinja.
        let jinja = dir.join("chat_template.jinja");
        let source = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_owned),
            _ if jinja.is_file() => {
                Some(std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?)
            }
            _ => None,
        };
        let chat_template = source.map(|s| ChatTemplate::new(&s, bos.clone(), eos.clone())).transpose()?;
        let mut eos_ids: Vec<u32> = extra_eos.to_vec();
        if let Some(id) = eos.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.push(id);
        }
        let gen_cfg = dir.join("generation_config.json");
        if let Ok(text) = std::fs::read_to_string(&gen_cfg)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        {
            match v.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos_ids.extend(n.as_u64().map(|x| x as u32)),
                Some(serde_json::Value::Array(a)) => {
                    eos_ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
        Self::finish(inner, chat_template, eos_ids)
    }

    /// Builds the tokenizer from GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, ModelError> {
        let mut inner = Tokenizer::from_gguf(content).map_err(tok_err)?;
        let md = &content.metadata;
        let pre = md.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        if pre == "smollm" || pre == "gpt2" || pre.is_empty() {
            // The original tokenizer.json of these models: byte-level BPE without a prefix
            // space; SmolLM also splits digits one by one.
            use tokenizers::pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence};
            let bl = ByteLevel::new(false, true, true);
            if pre == "smollm" {
                inner.with_pre_tokenizer(Some(Sequence::new(vec![Digits::new(true).into(), bl.into()])));
            } else {
                inner.with_pre_tokenizer(Some(bl));
            }
        }
        let tokens = match md.get("tokenizer.ggml.tokens") {
            Some(gguf_file::Value::Array(a)) => a,
            _ => return Err(tok_err("GGUF metadata has no tokenizer.ggml.tokens")),
        };
        let token = |key: &str| -> Option<(u32, String)> {
            let id = md.get(key)?.to_u32().ok()?;
            let s = tokens.get(id as usize)?.to_string().ok()?.clone();
            Some((id, s))
        };
        let bos = token("tokenizer.ggml.bos_token_id");
        let eos = token("tokenizer.ggml.eos_token_id");
        let chat_template = md
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .map(|s| {
                ChatTemplate::new(s, bos.as_ref().map(|b| b.1.clone()), eos.as_ref().map(|e| e.1.clone()))
            })
            .transpose()?;
        let eos_ids = eos.map(|e| vec![e.0]).unwrap_or_default();
        Self::finish(inner, chat_template, eos_ids)
    }

    /// The tokenizer of a resolved model: from its GGUF metadata or its folder's files.
    pub fn load(model: &crate::ResolvedModel) -> Result<Self, ModelError> {
        match model.format {
            crate::WeightsFormat::Gguf => {
                let path = &model.path;
                let mut f = std::fs::File::open(path)
                    .map_err(|source| ModelError::Io { path: path.display().to_string(), source })?;
                let content = gguf_file::Content::read(&mut f).map_err(|e| ModelError::Corrupt {
                    file: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                Self::from_gguf(&content)
            }
            crate::WeightsFormat::Safetensors => Self::from_hf_dir(&model.path, &[]),
        }
    }

    /// Saves `tokenizer.json` and a `tokenizer_config.json` (chat template, EOS) into `dir`, so
    /// a checkpoint written there loads with this tokenizer.
    pub fn save_hf(&self, dir: &Path) -> Result<(), ModelError> {
        let file = dir.join("tokenizer.json");
        self.inner.save(&file, false).map_err(tok_err)?;
        let mut config = serde_json::Map::new();
        if let Some(t) = &self.chat_template {
            config.insert("chat_template".into(), t.source().into());
        }
        if let Some(eos) = self.eos_token_ids.first().and_then(|&id| self.inner.id_to_token(id)) {
            config.insert("eos_token".into(), eos.into());
        }
        let path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&config).unwrap_or_default();
        std::fs::write(&path, text)
            .map_err(|source| ModelError::Io { path: path.display().to_string(), source })
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor adds
    /// (BOS for most Llama tokenizers).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        Ok(self.inner.encode(text, add_special_tokens).map_err(tok_err)?.get_ids().to_vec())
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// Renders chat messages with the model's template and a generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        self.render_chat_with(messages, None)
    }

    /// [`render_chat`](Self::render_chat) with more variables for the template.
    fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        args: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ModelError> {
        let t = self.chat_template.as_ref().ok_or_else(|| {
            ModelError::Template("this model has no chat template; use a plain prompt".into())
        })?;
        t.render_with(messages, true, args)
    }

    /// Token ids of rendered chat messages (the rendered text already holds the special tokens).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ModelError> {
        self.encode(&self.render_chat(messages)?, false)
    }

    /// The token ids a request's prompt becomes, as every engine behind xinf sees it: text with
    /// the tokenizer's special tokens, ids as they are, chat through the template. Refuses an
    /// empty prompt and ids outside a vocabulary of `vocab_size`, naming the field.
    pub fn prompt_ids(&self, prompt: &Prompt, vocab_size: usize) -> Result<Vec<u32>, EngineError> {
        let model = EngineError::from;
        let ids = match prompt {
            Prompt::Text(t) => self.encode(t, true).map_err(model)?,
            Prompt::Tokens(ids) => ids.clone(),
            Prompt::Chat(messages) => self.chat_ids(messages, None)?,
            Prompt::ChatWith { messages, template_args } => {
                let args = serde_json::from_str(template_args).map_err(|e| {
                    EngineError::invalid("chat_template_kwargs", format!("must be a JSON object: {e}"))
                })?;
                self.chat_ids(messages, Some(&args))?
            }
        };
        if ids.is_empty() {
            return Err(EngineError::invalid("prompt", "must not be empty"));
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {vocab_size} tokens"),
            ));
        }
        Ok(ids)
    }

    /// The token ids of a chat prompt; a template's refusal names `messages`.
    fn chat_ids(
        &self,
        messages: &[ChatMessage],
        args: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<u32>, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::invalid("messages", "must not be empty"));
        }
        let text = self.render_chat_with(messages, args).map_err(|e| match e {
            ModelError::Template(m) => EngineError::invalid("messages", m),
            other => EngineError::from(other),
        })?;
        self.encode(&text, false).map_err(EngineError::from)
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Ids that end generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The bytes each token id spells, for matching output against a grammar; `None` for
    /// special tokens and ids the tokenizer does not know. `Err` says why the vocabulary's
    /// alphabet cannot be read (neither byte-level BPE nor SentencePiece with byte fallback).
    pub fn token_bytes(&self) -> Result<Vec<Option<Vec<u8>>>, String> {
        bytes::token_bytes(&self.inner)
    }

    /// Hex sha256 of the tokenizer's serialized form and chat template.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}
