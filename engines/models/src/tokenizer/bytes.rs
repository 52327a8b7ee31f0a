//! Each token's bytes, for matching output against a grammar byte by byte.
//!
//! A tokenizer's vocabulary spells tokens in its model's own alphabet: byte-level BPE (GPT-2,
//! Llama 3, Qwen, SmolLM) maps every byte to a printable character, SentencePiece writes a
//! space as `▁` and an unknown byte as `<0xNN>`. Which one applies is read from the decoder,
//! the part of the tokenizer that turns tokens back into text.

use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;

/// How a vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// Every byte one character (GPT-2's table).
    ByteLevel,
    /// Text as UTF-8 with `space` for a space, other bytes as `<0xNN>` tokens.
    ByteFallback { space: char },
}

/// Reads the spelling from a decoder (possibly a sequence of them).
fn spelling(d: &DecoderWrapper, found: &mut Option<Spelling>, space: &mut char) {
    match d {
        DecoderWrapper::ByteLevel(_) => *found = Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) => {
            found.get_or_insert(Spelling::ByteFallback { space: '▁' });
        }
        DecoderWrapper::Metaspace(m) => *space = m.get_replacement(),
        DecoderWrapper::Sequence(seq) => {
            for d in seq.get_decoders() {
                spelling(d, found, space);
            }
        }
        _ => {}
    }
}

/// GPT-2's byte-to-character table, inverted: the printable Latin-1 characters stand for
/// themselves, the other bytes for U+0100 onwards in byte order.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b as char, b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                (c, b)
            }
        })
        .collect()
}

/// The bytes of every token id below `vocab_size`; `None` for special tokens (they spell no
/// text), ids the tokenizer does not know, and tokens outside the vocabulary's alphabet.
/// `Err` names why the vocabulary's spelling cannot be read.
pub(super) fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Option<Vec<u8>>>, String> {
    let (mut found, mut space) = (None, '▁');
    if let Some(d) = tokenizer.get_decoder() {
        spelling(d, &mut found, &mut space);
    }
    let found = match found {
        Some(Spelling::ByteFallback { .. }) => Spelling::ByteFallback { space },
        Some(s) => s,
        None => {
            return Err(format!(
                "the tokenizer's decoder ({}) is neither byte-level nor byte-fallback",
                tokenizer
                    .get_decoder()
                    .map_or("none".to_owned(), |d| format!("{d:?}").chars().take(60).collect())
            ));
        }
    };
    let added = tokenizer.get_added_tokens_decoder();
    let table = byte_level_table();
    let size = tokenizer.get_vocab_size(true) as u32;
    Ok((0..size)
        .map(|id| {
            if let Some(a) = added.get(&id) {
                return (!a.special).then(|| a.content.clone().into_bytes());
            }
            let name = tokenizer.id_to_token(id)?;
            match found {
                Spelling::ByteLevel => name.chars().map(|c| table.get(&c).copied()).collect(),
                Spelling::ByteFallback { space } => {
                    let hex = name.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
                    match hex.filter(|h| h.len() == 2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(b) => Some(vec![b]),
                        None => Some(name.replace(space, " ").into_bytes()),
                    }
                }
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_table_covers_every_byte_once() {
        let t = byte_level_table();
        assert_eq!(t.len(), 256);
        let mut bytes: Vec<u8> = t.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255u8).collect::<Vec<_>>());
        // GPT-2's spellings of a space and a newline.
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }

    fn tokenizer(vocab: &str, decoder: &str) -> Tokenizer {
        let json = format!(
            r#"{{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {decoder},
            "model": {{"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true,
                "vocab": {vocab}, "merges": []}}}}"#
        );
        json.parse().unwrap_or_else(|e| panic!("{e}: {json}"))
    }

    #[test]
    fn both_spellings_give_each_tokens_bytes() {
        let gpt2 = tokenizer(
            r#"{"<s>": 0, "Ġhello": 1, "Ċ": 2, "Ã©": 3}"#,
            r#"{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}"#,
        );
        let bytes = token_bytes(&gpt2).expect("byte-level");
        assert_eq!(
            bytes,
            [None, Some(b" hello".to_vec()), Some(b"\n".to_vec()), Some("é".as_bytes().to_vec())]
        );

        let llama = tokenizer(
            r#"{"<s>": 0, "▁hello": 1, "<0x0A>": 2, "é": 3}"#,
            r#"{"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]}"#,
        );
        let bytes = token_bytes(&llama).expect("byte fallback");
        assert_eq!(
            bytes,
            [None, Some(b" hello".to_vec()), Some(b"\n".to_vec()), Some("é".as_bytes().to_vec())]
        );

        let neither = tokenizer(r#"{"<s>": 0, "a": 1}"#, r#"{"type": "Fuse"}"#);
        assert!(token_bytes(&neither).is_err());
    }
}
