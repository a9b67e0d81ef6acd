//! Tokenizers embedded in GGUF metadata (`tokenizer.ggml.*`).
//!
//! * `model = gpt2`: byte-level BPE, built as a `tokenizers` pipeline from
//!   `tokens` and `merges`; the pre-tokenizer follows `tokenizer.ggml.pre`.
//! * `model = llama`: SentencePiece-style score-ranked merges
//!   ([`ScoredVocab`]) from `tokens` and `scores` (Llama 2, Gemma 3).
//!   User-defined tokens (type 4: Gemma's `"\n"`, space and tab runs, HTML
//!   tags) are cut out of the text before merging and control tokens (type
//!   3) when special tokens are parsed, as llama.cpp does;
//!   `tokenizer.ggml.add_space_prefix` (default true, false for Gemma)
//!   decides the dummy leading space.
//!
//! `tokenizer.ggml.pre` values understood for `gpt2` (as llama.cpp's
//! pre-tokenizer types): absent, `default`, `gpt2`; `smollm`, `starcoder`,
//! `refact` (digits one by one); `llama-bpe`, `llama3`; `qwen2` (Qwen2,
//! Qwen2.5 and Qwen3 GGUFs). Any other value is an error naming the
//! supported ones: guessing a split would silently tokenize differently
//! from the model's training.
//!
//! Token types (`tokenizer.ggml.token_type`) follow llama.cpp: 1 normal,
//! 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.

use super::scored::{ScoredVocab, SpaceStyle};
use super::{Tokenizer, TokenizerKind};
use crate::loader::gguf::metadata::Metadata;
use crate::{Error, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_UNUSED: i64 = 5;

/// The Llama 3 pre-tokenizer split (llama.cpp `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Qwen2 pre-tokenizer split (llama.cpp `qwen2`): Llama 3's, except that
/// digits split one by one (`\p{N}`, not `\p{N}{1,3}`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Builds the tokenizer described by `tokenizer.ggml.*`, or `None` when the
/// file carries none. `bos`/`eos` come from the model's metadata.
pub fn from_metadata(md: &Metadata, bos: Option<u32>, eos: Vec<u32>) -> Result<Option<Tokenizer>> {
    let Some(model) = md.str("tokenizer.ggml.model")? else {
        return Ok(None);
    };
    let bad = |why: String| Error::Tokenizer(format!("{}: {why}", md.path().display()));
    let tokens =
        md.strings("tokenizer.ggml.tokens")?.ok_or_else(|| bad("`tokenizer.ggml.tokens` is missing".into()))?;
    if tokens.is_empty() {
        return Err(bad("`tokenizer.ggml.tokens` is empty".into()));
    }
    let types = match md.i64s("tokenizer.ggml.token_type")? {
        Some(t) if t.len() == tokens.len() => t,
        Some(t) => {
            return Err(bad(format!("`tokenizer.ggml.token_type` has {} entries for {} tokens", t.len(), tokens.len())))
        }
        None => vec![1; tokens.len()],
    };
    for (key, id) in [("bos", bos)].into_iter().chain(eos.iter().map(|&e| ("eos", Some(e)))) {
        if let Some(id) = id {
            if id as usize >= tokens.len() {
                return Err(bad(format!("{key} token id {id} is outside the tokenizer's {} tokens", tokens.len())));
            }
        }
    }
    let chat_template = md.str("tokenizer.chat_template")?.map(String::from);
    let add_bos_key = md.bool("tokenizer.ggml.add_bos_token")?;

    let (kind, add_bos) = match model {
        "gpt2" => {
            let pre = md.str("tokenizer.ggml.pre")?;
            let t = byte_level_bpe(md, &tokens, &types, pre).map_err(&bad)?;
            (TokenizerKind::Hf(Box::new(t)), add_bos_key.unwrap_or(false))
        }
        "llama" => {
            let scores = match md.f32s("tokenizer.ggml.scores")? {
                Some(s) if s.len() == tokens.len() => s,
                Some(s) => {
                    return Err(bad(format!(
                        "`tokenizer.ggml.scores` has {} entries for {} tokens",
                        s.len(),
                        tokens.len()
                    )))
                }
                None => vec![0.0; tokens.len()],
            };
            let special = types.iter().map(|&t| matches!(t, TYPE_UNKNOWN | TYPE_CONTROL | TYPE_UNUSED)).collect();
            let dummy_prefix = md.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            let pieces = tokens.iter().map(|s| s.to_string()).collect();
            let ids_of = |wanted: &[i64]| -> Vec<u32> {
                types.iter().enumerate().filter(|(_, t)| wanted.contains(t)).map(|(i, _)| i as u32).collect()
            };
            let vocab = ScoredVocab::new(pieces, scores, special, SpaceStyle::Metaspace, dummy_prefix)
                .with_verbatim(&ids_of(&[TYPE_USER_DEFINED]), &ids_of(&[TYPE_CONTROL, TYPE_UNKNOWN]))
                .map_err(|e| bad(e.to_string()))?;
            (TokenizerKind::Scored(Box::new(vocab)), add_bos_key.unwrap_or(true))
        }
        other => return Err(bad(format!("tokenizer model `{other}` is not supported (supported: gpt2, llama)"))),
    };
    if add_bos && bos.is_none() {
        return Err(bad("`tokenizer.ggml.add_bos_token` is set but there is no `tokenizer.ggml.bos_token_id`".into()));
    }
    Ok(Some(Tokenizer { kind, add_bos, bos, eos, chat_template }))
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: Option<&str>) -> std::result::Result<PreTokenizerWrapper, String> {
    let byte_level = |use_regex| ByteLevel::new(false, true, use_regex);
    Ok(match pre.unwrap_or("default") {
        "default" | "gpt2" => byte_level(true).into(),
        // digits one by one, then GPT-2's split
        "smollm" | "starcoder" | "refact" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into()
        }
        "llama-bpe" | "llama3" => {
            Sequence::new(vec![regex_split("llama3", LLAMA3_SPLIT)?.into(), byte_level(false).into()]).into()
        }
        "qwen2" => Sequence::new(vec![regex_split("qwen2", QWEN2_SPLIT)?.into(), byte_level(false).into()]).into(),
        other => {
            return Err(format!(
                "pre-tokenizer `{other}` (tokenizer.ggml.pre) is not supported \
                 (supported: default, gpt2, smollm, starcoder, refact, llama-bpe, llama3, qwen2)"
            ))
        }
    })
}

/// A split that keeps every regex match (and every gap between matches)
/// as its own piece, as llama.cpp's regex pre-tokenizers do.
fn regex_split(name: &str, pattern: &str) -> std::result::Result<Split, String> {
    Split::new(SplitPattern::Regex(pattern.into()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| format!("{name} split regex: {e}"))
}

/// Byte-level BPE from GGUF tokens and merges.
fn byte_level_bpe(
    md: &Metadata,
    tokens: &[&str],
    types: &[i64],
    pre: Option<&str>,
) -> std::result::Result<tokenizers::Tokenizer, String> {
    let pre = pre_tokenizer(pre)?;
    let merges_raw =
        md.strings("tokenizer.ggml.merges").map_err(|e| e.to_string())?.ok_or("`tokenizer.ggml.merges` is missing")?;
    let mut vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(t.to_string()).or_insert(i as u32);
    }
    let mut merges: Merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| format!("merge {i} `{m}` is not two space-separated tokens"))?;
        merges.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("cannot build the BPE model: {e}"))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(pre));
    t.with_decoder(Some(ByteLevelDecoder::default()));
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, &ty)| ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED)
        .map(|(s, _)| AddedToken::from(s.to_string(), true))
        .collect();
    t.add_special_tokens(&special);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// The pieces a `tokenizer.ggml.pre` pipeline cuts `text` into, as
    /// slices of the original text (the byte-level step renames bytes but
    /// keeps the cuts).
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let p = pre_tokenizer(Some(pre)).unwrap();
        let mut s = PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    /// Expected splits from Python's `regex` module (PyPI) on the pattern in
    /// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` comment:
    /// `regex.findall(P, text)`.
    #[test]
    fn qwen2_split() {
        let cases: &[(&str, &[&str])] = &[
            ("Hello world 12345 abc", &["Hello", " world", " ", "1", "2", "3", "4", "5", " abc"]),
            (
                "I'm sure they'll say it's OK, DON'T YOU'VE we'd",
                &[
                    "I", "'m", " sure", " they", "'ll", " say", " it", "'s", " OK", ",", " DON", "'T", " YOU", "'VE",
                    " we", "'d",
                ],
            ),
            (
                "你好世界，今天是2024年！ 東京タワー",
                &["你好世界", "，今天是", "2", "0", "2", "4", "年", "！", " 東京タワー"],
            ),
            ("a   b\t\tc   \n\n  d  ", &["a", "  ", " b", "\t", "\tc", "   \n\n", " ", " d", "  "]),
            ("line1\r\nline2\n\n\nend\n", &["line", "1", "\r\n", "line", "2", "\n\n\n", "end", "\n"]),
            ("x = foo(bar);  // ok?!\n", &["x", " =", " foo", "(bar", ");", " ", " //", " ok", "?!\n"]),
            ("  leading and trailing   ", &[" ", " leading", " and", " trailing", "   "]),
            ("3.14159 + ٣٤ = ⅷ", &["3", ".", "1", "4", "1", "5", "9", " +", " ", "٣", "٤", " =", " ", "ⅷ"]),
        ];
        for (text, want) in cases {
            assert_eq!(pieces("qwen2", text), *want, "text {text:?}");
        }
    }

    /// Llama 3 keeps up to three digits together where Qwen2 splits each:
    /// the two names must not share one pipeline by mistake.
    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(pieces("llama3", "in 12345"), ["in", " ", "123", "45"]);
        assert_eq!(pieces("qwen2", "in 12345"), ["in", " ", "1", "2", "3", "4", "5"]);
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error_naming_the_known_ones() {
        let Err(e) = pre_tokenizer(Some("deepseek-llm")) else { panic!("an unknown pre-tokenizer was accepted") };
        assert!(e.contains("`deepseek-llm`") && e.contains("qwen2") && e.contains("llama3"), "{e}");
    }
}
