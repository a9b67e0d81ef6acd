//! Hugging Face `tokenizer.json`.

use super::{Tokenizer, TokenizerKind};
use crate::{Error, Result};
use std::path::Path;

/// Loads `tokenizer.json`. BOS/EOS are taken from the model config; the
/// pipeline's own post-processor decides about BOS, so `add_bos` is false.
pub fn load(path: &Path, bos: Option<u32>, eos: Vec<u32>) -> Result<Tokenizer> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |e: String| Error::Tokenizer(format!("{}: {e}", path.display()));
    // `tokenizers` panics on some malformed files (found by fuzzing: its
    // untagged decoder helper unwraps a JSON error, a syntax error or a
    // number out of range), so the file is parsed as JSON first and a panic
    // left inside the library becomes an error
    serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let t = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(&bytes))
        .map_err(|_| bad("the tokenizers library could not read this file (it panicked)".into()))?
        .map_err(|e| bad(e.to_string()))?;
    let chat_template = path.parent().and_then(chat_template_beside);
    Ok(Tokenizer { kind: TokenizerKind::Hf(Box::new(t)), add_bos: false, bos, eos, chat_template })
}

/// The chat template in `dir`: `tokenizer_config.json`'s `chat_template`
/// (a string, or a list of `{name, template}` of which `default` is used),
/// else a `chat_template.jinja` file (newer transformers save it there).
pub fn chat_template_beside(dir: &Path) -> Option<String> {
    let config = std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let from_config = config.as_ref().and_then(|v| match v.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(String::from)),
        _ => None,
    });
    from_config.or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok())
}

#[cfg(test)]
mod tests {
    use super::chat_template_beside;

    #[test]
    fn template_forms() {
        let dir = std::env::temp_dir().join(format!("kvslim-hf-chat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("tokenizer_config.json");
        std::fs::write(&cfg, r#"{"chat_template": "{{ x }}"}"#).unwrap();
        assert_eq!(chat_template_beside(&dir).as_deref(), Some("{{ x }}"));
        std::fs::write(
            &cfg,
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .unwrap();
        assert_eq!(chat_template_beside(&dir).as_deref(), Some("D"));
        std::fs::write(&cfg, r#"{"bos_token": "<s>"}"#).unwrap();
        assert_eq!(chat_template_beside(&dir), None);
        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        assert_eq!(chat_template_beside(&dir).as_deref(), Some("J"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
