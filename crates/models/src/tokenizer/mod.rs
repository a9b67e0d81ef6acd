//! Text ↔ token ids. Three sources of vocabularies:
//! * Hugging Face `tokenizer.json` via the `tokenizers` crate ([`hf`])
//! * GGUF-embedded vocabularies ([`gguf`]): `gpt2` byte-level BPE (built as a
//!   `tokenizers` BPE) and `llama` SentencePiece-style scored vocabularies
//! * llama2.c `tokenizer.bin` ([`scored`])

pub mod gguf;
pub mod hf;
pub mod scored;

use crate::{Error, Result};

/// The concrete vocabulary implementation.
pub enum TokenizerKind {
    /// A `tokenizers` pipeline (HF `tokenizer.json`, GGUF `gpt2`).
    Hf(Box<tokenizers::Tokenizer>),
    /// Score-ranked merges (llama2.c, GGUF `llama`).
    Scored(Box<scored::ScoredVocab>),
}

/// A tokenizer plus the special-token facts generation needs.
pub struct Tokenizer {
    pub kind: TokenizerKind,
    /// Prepend `bos` when encoding a prompt (when the pipeline does not
    /// already do it itself).
    pub add_bos: bool,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// Jinja chat template (GGUF `tokenizer.chat_template` or
    /// `tokenizer_config.json`); rendered by [`crate::chat::ChatTemplate`].
    pub chat_template: Option<String>,
}

impl Tokenizer {
    /// The BOS [`Tokenizer::encode`] prepends itself, if any: what a window
    /// cut from encoded text leads with, and what to strip from its head.
    /// `None` when the pipeline adds its own (its BOS is then text's).
    pub fn prepended_bos(&self) -> Option<u32> {
        self.bos.filter(|_| self.add_bos)
    }

    /// Encodes a prompt, adding BOS exactly when the model's tokenizer says so.
    /// Special tokens written in the text (`<|im_start|>`, `<start_of_turn>`)
    /// become their ids, so rendered chat templates tokenize as the model
    /// expects; every vocabulary kind behaves the same way here.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.prepended_bos().into_iter().collect();
        match &self.kind {
            TokenizerKind::Hf(t) => {
                let enc = t.encode(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
                ids.extend_from_slice(enc.get_ids());
            }
            TokenizerKind::Scored(v) => ids.extend(v.encode(text, true)),
        }
        Ok(ids)
    }

    /// Encodes text that follows tokens already fed (a question after a
    /// context, a continuation, an instruction inside a probe): as
    /// [`Tokenizer::encode`] without the BOS it prepends.
    pub fn encode_after(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        self.strip_bos(&mut ids);
        Ok(ids)
    }

    /// Removes the BOS this tokenizer prepends from the front of `ids`, if
    /// it is there (the one place that decides what "a leading BOS" is);
    /// whether it removed one.
    pub fn strip_bos(&self, ids: &mut Vec<u32>) -> bool {
        let leading = self.prepended_bos().is_some_and(|b| ids.first() == Some(&b));
        if leading {
            ids.remove(0);
        }
        leading
    }

    /// Encodes a rendered chat template. Special tokens written as text
    /// (`<|im_start|>`, `<start_of_turn>` …) become their single ids where the
    /// tokenizer knows them as added/special tokens. When the text already
    /// starts with the BOS string `bos_text` (templates that print
    /// `{{ bos_token }}`), BOS is not added a second time: the pipeline's
    /// post-processor is skipped and `add_bos` ignored.
    pub fn encode_chat(&self, text: &str, bos_text: Option<&str>) -> Result<Vec<u32>> {
        let leading_bos = match (self.bos, bos_text) {
            (Some(_), Some(b)) if !b.is_empty() && text.starts_with(b) => Some(b),
            _ => None,
        };
        let Some(bos_text) = leading_bos else {
            return self.encode(text);
        };
        match &self.kind {
            TokenizerKind::Hf(t) => {
                let enc = t.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
            TokenizerKind::Scored(v) => {
                let mut ids: Vec<u32> = self.bos.into_iter().collect();
                ids.extend(v.encode(&text[bos_text.len()..], true));
                Ok(ids)
            }
        }
    }

    /// The vocabulary string of one id (special tokens included), e.g. the
    /// `bos_token` a chat template prints.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.kind {
            TokenizerKind::Hf(t) => t.id_to_token(id),
            TokenizerKind::Scored(v) => v.piece(id).map(String::from),
        }
    }

    /// What one id stands for as raw bytes (OpenAI's per-token `bytes` in
    /// log-probs): byte-level BPE pieces mapped back through GPT-2's
    /// byte↔character table, `<0xXX>` byte-fallback pieces as their byte,
    /// the SentencePiece metaspace as a space. A token can be part of a
    /// UTF-8 character, so these are bytes, not text. Special ids (BOS,
    /// EOS, control tokens, which [`Self::decode`] skips) give their
    /// vocabulary string and `special: true`. `None` outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
        match &self.kind {
            TokenizerKind::Scored(v) => v.piece_bytes(id).map(|(bytes, special)| TokenBytes { bytes, special }),
            TokenizerKind::Hf(t) => {
                let piece = t.id_to_token(id)?;
                let added = t.get_added_vocabulary();
                if added.is_special_token(&piece) {
                    return Some(TokenBytes { bytes: piece.into_bytes(), special: true });
                }
                // added (non-special) tokens are stored as plain text
                if added.get_vocab().contains_key(&piece) {
                    return Some(TokenBytes { bytes: piece.into_bytes(), special: false });
                }
                let byte_level = matches!(t.get_decoder(), Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_)));
                let bytes = if byte_level {
                    piece.chars().map(|c| byte_level_byte(c).unwrap_or(b'?')).collect()
                } else if piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
                    u8::from_str_radix(&piece[3..5], 16).map_or_else(|_| piece.clone().into_bytes(), |b| vec![b])
                } else {
                    piece.replace('\u{2581}', " ").into_bytes()
                };
                Some(TokenBytes { bytes, special: false })
            }
        }
    }

    /// Decodes ids to text (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.kind {
            TokenizerKind::Hf(t) => t.decode(ids, true).map_err(|e| Error::Tokenizer(e.to_string())),
            TokenizerKind::Scored(v) => Ok(v.decode(ids)),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.kind {
            TokenizerKind::Hf(t) => t.get_vocab_size(true),
            TokenizerKind::Scored(v) => v.len(),
        }
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// The first id whose vocabulary string differs from `other`'s (the
    /// smaller vocabulary's size when one is a prefix of the other), or
    /// `None` when both map every id alike: what a draft model must share
    /// with its target.
    pub fn first_difference(&self, other: &Tokenizer) -> Option<u32> {
        let n = self.vocab_size().min(other.vocab_size()) as u32;
        (0..n)
            .find(|&id| self.token_text(id) != other.token_text(id))
            .or((self.vocab_size() != other.vocab_size()).then_some(n))
    }

    /// How this vocabulary differs from `other`'s, for an error message
    /// (`None` when they map every id alike).
    pub fn vocabulary_mismatch(&self, other: &Tokenizer) -> Option<String> {
        self.first_difference(other).map(|id| {
            format!(
                "id {id}: {:?} against {:?}, vocabularies of {} and {}",
                self.token_text(id),
                other.token_text(id),
                self.vocab_size(),
                other.vocab_size()
            )
        })
    }
}

/// One token as bytes: see [`Tokenizer::token_bytes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    /// A special id: not part of decoded text.
    pub special: bool,
}

/// The byte a character of GPT-2's byte-level alphabet stands for: the
/// printable bytes `!`..`~`, `¡`..`¬` and `®`..`ÿ` are themselves, the other
/// 68 bytes were moved to U+0100.. in increasing order.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let u = c as u32;
    if printable(u) {
        return Some(u as u8);
    }
    let k = u.checked_sub(256)? as usize;
    (0u32..256).filter(|&b| !printable(b)).nth(k).map(|b| b as u8)
}

/// Turns a growing list of ids into text pieces for a terminal: only
/// complete UTF-8 is emitted, and decoding context is kept so word-initial
/// spaces come out right. Each step decodes a short window (from the
/// start of the previous piece), not the whole text, so streaming n tokens
/// costs O(n) rather than O(n²).
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Window start: the first id of the piece emitted before the last one.
    prefix: usize,
    /// Ids up to here have been emitted.
    read: usize,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder { ids: Vec::new(), prefix: 0, read: 0 }
    }

    /// Adds one id and returns the newly printable text (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        // both decodes start at the same id, so a decoder that drops the
        // first token's leading space drops it from both
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let text = tok.decode(&self.ids[self.prefix..])?;
        match text.strip_prefix(before.as_str()) {
            Some(new) if !new.is_empty() && !new.ends_with('\u{fffd}') => {
                let new = new.to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                Ok(new)
            }
            _ => Ok(String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_level_alphabet_maps_back_to_bytes() {
        assert_eq!(super::byte_level_byte('a'), Some(b'a'));
        assert_eq!(super::byte_level_byte('\u{120}'), Some(b' ')); // Ġ
        assert_eq!(super::byte_level_byte('\u{10a}'), Some(b'\n')); // Ċ
        assert_eq!(super::byte_level_byte('\u{100}'), Some(0));
        assert_eq!(super::byte_level_byte('\u{143}'), Some(173));
        assert_eq!(super::byte_level_byte('ÿ'), Some(255));
        assert_eq!(super::byte_level_byte('\u{144}'), None);
    }
}
