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
    /// Encodes a prompt, adding BOS exactly when the model's tokenizer says so.
    /// Special tokens written in the text (`<|im_start|>`, `<start_of_turn>`)
    /// become their ids, so rendered chat templates tokenize as the model
    /// expects; every vocabulary kind behaves the same way here.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        match &self.kind {
            TokenizerKind::Hf(t) => {
                let enc = t.encode(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
                ids.extend_from_slice(enc.get_ids());
            }
            TokenizerKind::Scored(v) => ids.extend(v.encode(text, true)),
        }
        Ok(ids)
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
