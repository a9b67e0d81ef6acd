//! Hugging Face `tokenizer.json`.

use super::{Tokenizer, TokenizerKind};
use crate::{Error, Result};
use std::path::Path;

/// Loads `tokenizer.json`. BOS/EOS are taken from the model config; the
/// pipeline's own post-processor decides about BOS, so `add_bos` is false.
pub fn load(path: &Path, bos: Option<u32>, eos: Vec<u32>) -> Result<Tokenizer> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let t =
        tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
    let chat_template = path
        .parent()
        .map(|d| d.join("tokenizer_config.json"))
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("chat_template").and_then(|t| t.as_str()).map(String::from));
    Ok(Tokenizer { kind: TokenizerKind::Hf(Box::new(t)), add_bos: false, bos, eos, chat_template })
}
