//! GGUF loader tests on tiny files written here (`common::gguf`): metadata
//! of every value type, a SentencePiece (`llama`) vocabulary, a byte-level
//! BPE (`gpt2`) vocabulary, and every supported tensor type against an
//! in-memory model. Corrupt files: `gguf_synthetic_errors.rs`.

mod common;

use common::gguf::*;
use common::max_abs_diff as max_abs;
use kvslim_kernels::quant::{dequantize, quantize};
use kvslim_kernels::DType;
use kvslim_models::load_model;
use kvslim_models::loader::gguf::{GgufFile, Value};
use kvslim_models::tokenizer::TokenizerKind;

#[test]
fn metadata_of_every_value_type_parses() {
    let mut g = tiny_file(DType::F32, true);
    g.kv("t.u8", Value::U8(200))
        .kv("t.i8", Value::I8(-100))
        .kv("t.u16", Value::U16(60000))
        .kv("t.i16", Value::I16(-30000))
        .kv("t.u32", Value::U32(4_000_000_000))
        .kv("t.i32", Value::I32(-2_000_000_000))
        .kv("t.f32", Value::F32(1.5))
        .kv("t.bool", Value::Bool(true))
        .kv("t.str", V::s("héllo"))
        .kv("t.u64", Value::U64(u64::MAX))
        .kv("t.i64", Value::I64(i64::MIN))
        .kv("t.f64", Value::F64(-2.25))
        .kv("t.empty", V::Arr(4, vec![]))
        .kv(
            "t.nested",
            V::Arr(9, vec![V::Arr(0, vec![Value::U8(1).into(), Value::U8(2).into()]), V::Arr(8, vec![V::s("x")])]),
        )
        .kv("general.alignment", Value::U32(64));
    g.alignment = 64;
    let (bytes, _) = g.bytes();
    let f = TempFile::new("meta", &bytes);
    let file = GgufFile::open(&f.0).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.alignment, 64);
    assert!(file.data_start.is_multiple_of(64));
    let md = &file.metadata;
    let get = |k: &str| md.get(k).unwrap().clone();
    assert_eq!(get("t.u8"), Value::U8(200));
    assert_eq!(get("t.i8"), Value::I8(-100));
    assert_eq!(get("t.u16"), Value::U16(60000));
    assert_eq!(get("t.i16"), Value::I16(-30000));
    assert_eq!(get("t.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("t.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("t.f32"), Value::F32(1.5));
    assert_eq!(get("t.bool"), Value::Bool(true));
    assert_eq!(get("t.str"), Value::Str("héllo".into()));
    assert_eq!(get("t.u64"), Value::U64(u64::MAX));
    assert_eq!(get("t.i64"), Value::I64(i64::MIN));
    assert_eq!(get("t.f64"), Value::F64(-2.25));
    assert_eq!(get("t.empty"), Value::Array(vec![]));
    assert_eq!(
        get("t.nested"),
        Value::Array(vec![Value::Array(vec![Value::U8(1), Value::U8(2)]), Value::Array(vec![Value::Str("x".into())])])
    );
    assert_eq!(md.usize("llama.block_count").unwrap(), Some(LAYERS));
    assert!(md.usize("t.i8").is_err(), "negative value as usize");
    assert!(md.str("t.u8").is_err(), "wrong type is an error");
    assert_eq!(md.keys().next(), Some("general.architecture"));
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, vec![HIDDEN, sp_vocab().0.len()]);
    assert_eq!(embd.dtype, DType::F32);
    assert_eq!(file.tensors().len(), 2 + 9 * LAYERS);
    // and the model still loads with 64-byte alignment
    let m = load_model(&f.0).unwrap();
    assert_eq!(m.model.config.n_layers, LAYERS);
}

#[test]
fn sentencepiece_vocab_round_trip_and_bos() {
    let g = tiny_file(DType::F32, true);
    let (bytes, _) = g.bytes();
    let lm = load_bytes("sp", &bytes).unwrap();
    let t = lm.tokenizer.expect("embedded tokenizer");
    assert!(matches!(t.kind, TokenizerKind::Scored(_)));
    assert!(t.add_bos, "llama vocabularies add BOS by default");
    let (tokens, _, _) = sp_vocab();
    let id = |p: &str| tokens.iter().position(|t| t == p).unwrap() as u32;
    assert_eq!(t.encode("hello world").unwrap(), vec![1, id("▁hello"), id("▁world")]);
    assert_eq!(t.decode(&t.encode("hello world").unwrap()).unwrap(), "hello world");
    // byte fallback for characters outside the vocabulary
    for s in ["hello cat, wörld!", "a  b\nc", "東京"] {
        let ids = t.encode(s).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(t.decode(&ids).unwrap(), s, "round trip of {s:?} via {ids:?}");
    }
    assert_eq!(t.eos, vec![2]);
    assert_eq!(t.vocab_size(), tokens.len());

    for (flag, want_bos) in [(true, true), (false, false)] {
        let mut g = tiny_file(DType::F32, true);
        g.kv("tokenizer.ggml.add_bos_token", Value::Bool(flag));
        let t = load_bytes("bos", &g.bytes().0).unwrap().tokenizer.unwrap();
        let ids = t.encode("hello").unwrap();
        assert_eq!(ids[0] == 1, want_bos, "add_bos_token={flag}: {ids:?}");
        assert_eq!(ids.last(), Some(&id("▁hello")));
    }
    // add_space_prefix = false: no dummy leading space
    let mut g = tiny_file(DType::F32, true);
    g.kv("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    let t = load_bytes("prefix", &g.bytes().0).unwrap().tokenizer.unwrap();
    let ids = t.encode("hello").unwrap();
    assert!(!ids.contains(&id("▁hello")), "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), "hello");
}

#[test]
fn byte_level_bpe_vocab_with_special_tokens() {
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    // the 256 byte-level characters, then merges
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into()];
    tokens.extend(alphabet.iter().map(|c| c.to_string()));
    let merges = ["Ġ t", "h e", "Ġt he", "c a", "ca t", "Ġ cat"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    types[1] = 3;
    let vocab = tokens.len();
    let id = |p: &str| tokens.iter().position(|t| t == p).unwrap() as u32;
    for pre in ["gpt2", "smollm", "llama-bpe", "qwen2"] {
        let mut g = Gguf::new();
        base_meta(&mut g);
        g.kv("tokenizer.ggml.model", V::s("gpt2"))
            .kv("tokenizer.ggml.pre", V::s(pre))
            .kv("tokenizer.ggml.tokens", V::strs(&tokens))
            .kv("tokenizer.ggml.token_type", V::i32s(&types))
            .kv("tokenizer.ggml.merges", V::strs(&merges))
            .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(0));
        add_tensors(&mut g, &raw_model(vocab, true, 3), DType::F32);
        let t = load_bytes("bpe", &g.bytes().0).unwrap().tokenizer.unwrap();
        assert!(matches!(t.kind, TokenizerKind::Hf(_)));
        assert!(!t.add_bos, "gpt2 vocabularies add no BOS by default");
        let ids = t.encode("<|im_start|>the cat").unwrap();
        assert_eq!(ids, vec![1, id("t"), id("he"), id("Ġcat")], "pre {pre}");
        assert_eq!(t.decode(&ids).unwrap(), "the cat", "special tokens skipped");
        let s = "Tea at 12:05 — café";
        assert_eq!(t.decode(&t.encode(s).unwrap()).unwrap(), s, "pre {pre}");
    }
    // an unknown pre-tokenizer is named in the error
    let mut g = Gguf::new();
    base_meta(&mut g);
    g.kv("tokenizer.ggml.model", V::s("gpt2"))
        .kv("tokenizer.ggml.pre", V::s("deepseek-llm"))
        .kv("tokenizer.ggml.tokens", V::strs(&tokens))
        .kv("tokenizer.ggml.merges", V::strs(&merges));
    add_tensors(&mut g, &raw_model(vocab, true, 3), DType::F32);
    let e = err_of(load_bytes("pre", &g.bytes().0)).to_string();
    assert!(e.contains("deepseek-llm") && e.contains("not supported"), "{e}");
}

#[test]
fn every_tensor_type_matches_the_in_memory_model() {
    let vocab = sp_vocab().0.len();
    let tokens = [1u32, 280, 5, 270, 42, 283, 7, 2];
    for tied in [true, false] {
        let raw = raw_model(vocab, tied, 11);
        let exact = logits(&memory_model(&raw, None), &tokens);
        let scale = exact.iter().fold(0f32, |a, b| a.max(b.abs()));
        for (dt, tol) in [
            (DType::F32, 1e-6),
            // relative to max |logit|; measured on this random model:
            // f16 5e-4, bf16 5e-3, q8_0 1.1e-2, q4_0 0.16, q4_1 0.20
            (DType::F16, 2e-3),
            (DType::BF16, 0.02),
            (DType::Q8_0, 0.04),
            (DType::Q4_0, 0.35),
            (DType::Q4_1, 0.35),
        ] {
            let mut g = Gguf::new();
            base_meta(&mut g);
            sp_tokenizer_meta(&mut g);
            add_tensors(&mut g, &raw, dt);
            let lm = load_bytes("dtype", &g.bytes().0).unwrap();
            let m = &lm.model;
            let c = &m.config;
            let want = expected_config(vocab, tied);
            assert_eq!(
                format!("{:?}", serde_json::to_value(c).unwrap()),
                format!("{:?}", serde_json::to_value(&want).unwrap())
            );
            assert_eq!(m.weights.token_embedding.dtype(), dt);
            assert_eq!(m.weights.layers[1].down.weight.dtype(), dt);
            assert_eq!(m.weights.lm_head.is_none(), tied);
            let got = logits(m, &tokens);
            // the same stored bytes in memory: identical up to rounding
            let same = max_abs(&got, &logits(&memory_model(&raw, Some(dt)), &tokens));
            // against exact f32 weights: quantization error only
            let drift = max_abs(&got, &exact);
            eprintln!("{dt} tied={tied}: |Δ| vs in-memory {same:.1e}, vs f32 {drift:.3} (max |logit| {scale:.1})");
            assert!(same <= 1e-5, "{dt}: loaded vs in-memory {same}");
            assert!(drift <= tol * scale, "{dt}: drift {drift} > {tol} × {scale}");
        }
    }
    // norms stored as f16 are widened to f32
    let raw = raw_model(vocab, true, 11);
    let mut g = Gguf::new();
    base_meta(&mut g);
    add_tensors(&mut g, &raw, DType::F32);
    g.tensor("output_norm.weight", &[HIDDEN], DType::F16, &raw.final_norm);
    let lm = load_bytes("f16norm", &g.bytes().0).unwrap();
    let mut want = vec![0f32; HIDDEN];
    dequantize(DType::F16, &quantize(DType::F16, &raw.final_norm), &mut want);
    assert_eq!(lm.model.weights.final_norm.weight, want);
    assert!(lm.tokenizer.is_none(), "no tokenizer.ggml.model: no tokenizer");
}
