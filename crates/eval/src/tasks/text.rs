//! Plain-text tasks: perplexity text cut into token windows, and prompts
//! for free generation.

use super::read_text;
use crate::error::{EvalError, Result};
use kvslim_engine::calibrate::text_tokens;
pub use kvslim_engine::calibrate::token_windows;
use kvslim_models::Tokenizer;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A text to score by teacher forcing. Line endings are normalised to `\n`
/// (WikiText-2 raw comes with CRLF).
#[derive(Clone, Debug)]
pub struct PplText {
    pub path: PathBuf,
    pub text: String,
}

/// Loads a perplexity text (plain or `.bz2`).
pub fn load_ppl_text(path: &Path) -> Result<PplText> {
    let raw = read_text(path)?;
    let text = raw.replace("\r\n", "\n");
    if text.trim().is_empty() {
        return Err(EvalError::File { path: path.into(), reason: "the text is empty".into() });
    }
    Ok(PplText { path: path.into(), text })
}

impl PplText {
    /// Tokenizes the text (BOS stripped) and cuts it with [`token_windows`];
    /// BOS starts each window when the tokenizer adds one. With
    /// `max_windows`, only a prefix of the text (cut at a line end) is
    /// tokenized, grown until it yields enough tokens.
    pub fn windows(&self, tok: &Tokenizer, seq_len: usize, max_windows: Option<usize>) -> Result<Vec<Vec<u32>>> {
        let bos = tok.prepended_bos();
        let need = max_windows.map(|w| w.saturating_mul(seq_len).saturating_add(1));
        let mut prefix = need.map_or(self.text.len(), |n| n.saturating_mul(8).min(self.text.len()));
        let body = loop {
            let end = cut_at_line_end(&self.text, prefix);
            let ids = tok.encode(&self.text[..end])?;
            let body = text_tokens(&ids, bos);
            if end >= self.text.len() || need.is_none_or(|n| body.len() >= n) {
                break body.to_vec();
            }
            prefix = prefix.saturating_mul(2);
        };
        Ok(token_windows(&body, seq_len, bos, max_windows))
    }
}

/// The end of the line containing byte `at` (or the text's end).
fn cut_at_line_end(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    match text.as_bytes()[at..].iter().position(|&b| b == b'\n') {
        Some(i) => at + i + 1,
        None => text.len(),
    }
}

/// A prompt for free generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenPrompt {
    pub prompt: String,
    /// Per-prompt generation length (jsonl `"max_tokens"`), else the task's.
    pub max_tokens: Option<usize>,
}

#[derive(Deserialize)]
struct RawPrompt {
    prompt: String,
    #[serde(default)]
    max_tokens: Option<usize>,
}

/// Parses generation prompts. Two forms:
///
/// * jsonl — `{"prompt": "...", "max_tokens": 64}` per line (`max_tokens`
///   optional), used when the file name ends in `.jsonl` or the first
///   non-blank line starts with `{`; escapes like `\n` are JSON's;
/// * plain text — every non-blank line is one prompt, taken verbatim
///   (trailing `\r` dropped; a literal `\n` stays two characters).
pub fn parse_gen_prompts(path: &Path, text: &str) -> Result<Vec<GenPrompt>> {
    let is_jsonl = path.to_string_lossy().ends_with(".jsonl")
        || text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_start().starts_with('{'));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if is_jsonl {
            let raw: RawPrompt = serde_json::from_str(line)
                .map_err(|e| EvalError::parse(path, i + 1, format!("expected {{\"prompt\": str}}: {e}")))?;
            if raw.prompt.is_empty() {
                return Err(EvalError::parse(path, i + 1, "empty prompt"));
            }
            out.push(GenPrompt { prompt: raw.prompt, max_tokens: raw.max_tokens });
        } else {
            out.push(GenPrompt { prompt: line.to_string(), max_tokens: None });
        }
    }
    if out.is_empty() {
        return Err(EvalError::File { path: path.into(), reason: "no prompts".into() });
    }
    Ok(out)
}

/// Loads generation prompts (see [`parse_gen_prompts`]).
pub fn load_gen_prompts(path: &Path) -> Result<Vec<GenPrompt>> {
    parse_gen_prompts(path, &read_text(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_full_and_start_with_bos() {
        let body: Vec<u32> = (10..30).collect();
        let w = token_windows(&body, 8, Some(1), None);
        assert_eq!(w.len(), 2); // 20 body tokens, 7 per window
        assert_eq!(w[0], [1, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(w[1][1], 17);
        let w = token_windows(&body, 8, None, Some(1));
        assert_eq!(w, [(10..18).collect::<Vec<u32>>()]);
        let w = token_windows(&body[..3], 8, Some(1), None);
        assert_eq!(w, [vec![1, 10, 11, 12]]);
        assert!(token_windows(&[], 8, Some(1), None).is_empty());
        assert!(token_windows(&body, 8, Some(1), Some(0)).is_empty());
    }

    #[test]
    fn prompts_plain_and_jsonl() {
        let p = Path::new("p.txt");
        let got = parse_gen_prompts(p, "Once upon a time\r\n\nThe capital of France is\n").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].prompt, "Once upon a time");
        let j = parse_gen_prompts(p, "{\"prompt\": \"a\\nb\", \"max_tokens\": 5}\n{\"prompt\": \"c\"}\n").unwrap();
        assert_eq!(j[0], GenPrompt { prompt: "a\nb".into(), max_tokens: Some(5) });
        assert_eq!(j[1].max_tokens, None);
        let e = parse_gen_prompts(Path::new("p.jsonl"), "{\"prompt\": \"a\"}\n{\"text\": 1}\n").unwrap_err();
        assert!(e.to_string().starts_with("p.jsonl:2: expected {\"prompt\": str}"), "{e}");
        assert!(parse_gen_prompts(p, "  \n").unwrap_err().to_string().contains("no prompts"));
    }

    #[test]
    fn line_cut() {
        assert_eq!(cut_at_line_end("ab\ncd\nef", 1), 3);
        assert_eq!(cut_at_line_end("ab\ncd\nef", 7), 8);
        assert_eq!(cut_at_line_end("ab", 9), 2);
    }
}
