//! Mutation fuzzing of the model file loaders on real seed files from
//! `../shared`: the GGUF reader (header, metadata, tensor table, offsets)
//! and full GGUF loads of every fixture quant type (K-quants included, with
//! the embedded tokenizer), llama2.c checkpoints and tokenizers, and a
//! Hugging Face directory (`config.json` + safetensors header). Every input
//! must load or give a clear error: no panic, no hang, and no single
//! allocation beyond a stated multiple of the input's size (a huge count or
//! dimension in a header must be refused, not reserved). `KVSLIM_FUZZ_ITERS`
//! sets the inputs per target (see `testing/fuzz`).

mod common;
use kvslim_fuzz as fuzz;

use common::shared;
use fuzz::{iters, run, run_bytes, Limits};
use kvslim_models::loader::{gguf, llama2c, load_model, load_tokenizer};
use std::path::{Path, PathBuf};

/// A scratch folder for one target, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("kvslim-fuzz-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Allocation cap for whole-model loads: weights are dequantised to f32, so
/// a 2.6-bit K-quant tensor grows about 12x.
const LOAD_LIMITS: Limits =
    Limits { per_input: std::time::Duration::from_secs(20), alloc_factor: 16, alloc_slack: 1 << 20 };

/// Header parsing keeps every metadata value: a `Value` per array item is a
/// few machine words for at least one byte of file.
const HEADER_LIMITS: Limits =
    Limits { per_input: std::time::Duration::from_secs(10), alloc_factor: 48, alloc_slack: 1 << 20 };

fn gguf_seeds(files: &[&str]) -> Vec<(Vec<u8>, std::ops::Range<usize>)> {
    files
        .iter()
        .map(|f| {
            let p = shared().join("fixtures/gguf").join(f);
            let header = gguf::GgufFile::open(&p).unwrap_or_else(|e| panic!("seed {f}: {e}")).data_start;
            (read(&p), 0..header)
        })
        .collect()
}

#[test]
fn fuzz_gguf_header() {
    let seeds = gguf_seeds(&["qwen3/Q2_K.gguf", "llama/Q4_K_M.gguf", "gemma3/Q2_K.gguf"]);
    run_bytes("gguf-header", iters(3_000), HEADER_LIMITS, seeds, |d| {
        gguf::check_bytes(d).map(|_| ()).map_err(|e| e.to_string())
    });
}

#[test]
fn fuzz_gguf_load() {
    let files: Vec<String> = ["Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_0", "Q5_K_M", "Q6_K", "Q8_0"]
        .iter()
        .map(|q| format!("qwen3/{q}.gguf"))
        .filter(|f| shared().join("fixtures/gguf").join(f).exists())
        .collect();
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    let seeds = gguf_seeds(&refs);
    let dir = Scratch::new("gguf");
    let path = dir.0.join("m.gguf");
    run_bytes("gguf-load", iters(60), LOAD_LIMITS, seeds, move |d| {
        std::fs::write(&path, d).expect("write");
        load_model(&path).map(|_| ()).map_err(|e| e.to_string())
    });
}

#[test]
fn fuzz_llama2c_checkpoint() {
    let p = shared().join("models/stories260K/stories260K.bin");
    run_bytes("llama2c", iters(300), LOAD_LIMITS, vec![(read(&p), 0..28)], |d| {
        llama2c::parse(Path::new("fuzz.bin"), d).map(|_| ()).map_err(|e| e.to_string())
    });
}

#[test]
fn fuzz_llama2c_tokenizer() {
    let p = shared().join("models/stories260K/tok512.bin");
    let dir = Scratch::new("tok");
    let path = dir.0.join("tok.bin");
    let seed = read(&p);
    let n = seed.len();
    run_bytes("llama2c-tokenizer", iters(2_000), Limits::default(), vec![(seed, 0..n)], move |d| {
        std::fs::write(&path, d).expect("write");
        let tok = load_tokenizer(&path, Some(1), vec![2]).map_err(|e| e.to_string())?;
        let ids = tok.encode("Once upon a time, a <s> cat said \u{e9}\u{1F600}!").map_err(|e| e.to_string())?;
        tok.decode(&ids).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
fn fuzz_hf_dir() {
    let src = shared().join("fixtures/parity/llama-gqa-bf16");
    let config = String::from_utf8(read(&src.join("config.json"))).expect("utf-8 config");
    let st = read(&src.join("model.safetensors"));
    let hlen = 8 + u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let dir = Scratch::new("hf");
    let d = dir.0.clone();
    const DICT: &[&str] = &[
        "\"num_hidden_layers\": ",
        "\"hidden_size\": ",
        "\"num_attention_heads\": ",
        "\"num_key_value_heads\": ",
        "\"intermediate_size\": ",
        "\"vocab_size\": ",
        "\"head_dim\": ",
        "\"rope_scaling\": ",
        "\"rope_theta\": ",
        "\"tie_word_embeddings\": ",
        "\"architectures\": ",
        "\"torch_dtype\": ",
        "null",
        "true",
        "[]",
        "{}",
        ",",
    ];
    run(
        "hf-dir",
        iters(200),
        LOAD_LIMITS,
        move |r| {
            let (mut cfg, mut bytes) = (config.clone(), st.clone());
            let what = if r.below(2) == 0 {
                let (c, w) = fuzz::mutate_text(r, &config, DICT);
                cfg = c;
                format!("config.json: {w}")
            } else {
                format!("safetensors: {}", fuzz::mutate_bytes(r, &mut bytes, 0..hlen))
            };
            let size = cfg.len() + bytes.len();
            ((cfg, bytes), size, what)
        },
        move |(cfg, bytes): &(String, Vec<u8>)| {
            std::fs::write(d.join("config.json"), cfg).expect("write");
            std::fs::write(d.join("model.safetensors"), bytes).expect("write");
            load_model(&d).map(|_| ()).map_err(|e| e.to_string())
        },
    );
}

/// A small byte-level BPE `tokenizer.json` in the shape Hugging Face saves
/// (GPT-2/Qwen style: regex split, byte-level, merges, an added special
/// token), built here because `../shared` holds no `tokenizer.json` small
/// enough to mutate a million times.
fn tokenizer_json_seed() -> String {
    // GPT-2's byte → printable character table
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), 0.into());
    let mut shifted = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            char::from_u32(b).unwrap()
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        };
        let id = vocab.len();
        vocab.insert(c.to_string(), id.into());
    }
    let merges = ["Ġ t", "h e", "Ġt he", "i n", "a n", "Ġ a", "o n", "a t", "Ġ c", "Ġc at"];
    for m in merges {
        let id = vocab.len();
        vocab.insert(m.replace(' ', ""), id.into());
    }
    serde_json::to_string_pretty(&serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s?\\p{L}+|\\s?\\p{N}|\\s?[^\\s\\p{L}\\p{N}]+"},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    }))
    .unwrap()
}

#[test]
fn fuzz_hf_tokenizer_json() {
    const DICT: &[&str] = &[
        "\"type\": ",
        "\"BPE\"",
        "\"WordPiece\"",
        "\"Unigram\"",
        "\"ByteLevel\"",
        "\"Metaspace\"",
        "\"Sequence\"",
        "\"Split\"",
        "\"Regex\": ",
        "\"(a*)*$\"",
        "\"[\"",
        "\"vocab\": ",
        "\"merges\": ",
        "\"added_tokens\": ",
        "\"id\": ",
        "\"dropout\": ",
        "\"unk_token\": ",
        "\"byte_fallback\": ",
        "\"<0x41>\"",
        "null",
        "true",
        "[]",
        "{}",
        ",",
    ];
    let seed = tokenizer_json_seed();
    let dir = Scratch::new("tokenizer-json");
    let path = dir.0.join("tokenizer.json");
    // the seed itself loads and round-trips
    std::fs::write(&path, &seed).unwrap();
    let tok = load_tokenizer(&path, Some(0), vec![0]).expect("the seed tokenizer.json loads");
    let ids = tok.encode(" the cat in the hat").unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), " the cat in the hat");
    assert!(ids.len() < " the cat in the hat".len(), "merges apply: {ids:?}");
    let report = fuzz::run_text("hf-tokenizer-json", iters(300), Limits::default(), vec![seed], DICT, move |text| {
        std::fs::write(&path, text).expect("write");
        let tok = load_tokenizer(&path, Some(0), vec![0]).map_err(|e| e.to_string())?;
        let ids = tok.encode("the cat \u{e9}\u{1F600} <|endoftext|> 42!").map_err(|e| e.to_string())?;
        tok.decode(&ids).map_err(|e| e.to_string())?;
        Ok(())
    });
    assert!(report.accepted > 0, "{report:?}");
}

/// Found by `fuzz_hf_tokenizer_json` (cases 17 and 5761): a JSON syntax
/// error or a number out of range inside `decoder` made the `tokenizers`
/// crate panic (`expect("Helper")`); the loader now refuses both with an
/// error naming the file.
#[test]
fn tokenizer_json_with_a_broken_decoder_is_an_error() {
    let dir = Scratch::new("tokenizer-json-regression");
    let path = dir.0.join("tokenizer.json");
    let seed = tokenizer_json_seed();
    assert!(seed.contains("\"decoder\": {"));
    for broken in ["\"decoder\": {,", "\"decoder\": {\"x\": 1e999,"] {
        std::fs::write(&path, seed.replace("\"decoder\": {", broken)).unwrap();
        let e = load_tokenizer(&path, Some(0), vec![0]).err().expect("a broken tokenizer.json must not load");
        let e = e.to_string();
        assert!(e.contains("tokenizer.json") && e.contains("not valid JSON"), "{e}");
    }
}

// ------------------------------------------------ allocation-cap regressions

/// The smallest GGUF header: magic, version 3, then the counts.
fn gguf_header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

#[test]
fn gguf_huge_counts_are_refused_before_allocating() {
    for (t, kv) in [(u64::MAX, 0), (1 << 40, 0), (0, u64::MAX), (0, 1 << 40), (1 << 31, 1 << 31)] {
        let mut b = gguf_header(t, kv);
        b.extend([0u8; 64]);
        let e = gguf::check_bytes(&b).expect_err("huge count accepted").to_string();
        assert!(e.contains("claims") && e.contains("items"), "counts ({t}, {kv}): {e}");
    }
    // a metadata array claiming 2^40 u8 items in a tiny file
    let mut b = gguf_header(0, 1);
    b.extend(3u64.to_le_bytes());
    b.extend(b"key");
    b.extend(9u32.to_le_bytes()); // array
    b.extend(0u32.to_le_bytes()); // of u8
    b.extend((1u64 << 40).to_le_bytes());
    b.extend([0u8; 64]);
    let e = gguf::check_bytes(&b).expect_err("huge array accepted").to_string();
    assert!(e.contains("claims 1099511627776 items"), "{e}");
    // a string length of 2^63
    let mut b = gguf_header(0, 1);
    b.extend((1u64 << 63).to_le_bytes());
    b.extend([0u8; 64]);
    let e = gguf::check_bytes(&b).expect_err("huge string accepted").to_string();
    assert!(e.contains("string length"), "{e}");
}

#[test]
fn gguf_huge_tensor_dimension_is_refused() {
    let mut b = gguf_header(1, 0);
    b.extend(1u64.to_le_bytes());
    b.extend(b"w");
    b.extend(2u32.to_le_bytes()); // n_dims
    b.extend((1u64 << 40).to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend(0u32.to_le_bytes()); // f32
    b.extend(0u64.to_le_bytes());
    let e = gguf::check_bytes(&b).expect_err("huge dims accepted").to_string();
    assert!(e.contains("dimension of 1099511627776"), "{e}");
}

#[test]
fn llama2c_huge_header_sizes_are_refused() {
    // dim 2^30, 1 layer: the weights would need far more than the file
    let h: [i32; 7] = [1 << 30, 1 << 30, 1, 1, 1, 32000, 256];
    let mut b: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
    b.extend([0u8; 1024]);
    let e = llama2c::parse(Path::new("huge.bin"), &b).map(|_| ()).expect_err("huge header accepted").to_string();
    assert!(!e.is_empty());
}
