//! SmolLM2-135M-Instruct (GGUF v3, Q4_1) against what Hugging Face
//! transformers computes for the same file (`../shared/fixtures/smollm2`,
//! made by `tools/make_smollm2_reference.py`): embedded byte-level BPE
//! tokenizer, greedy continuation, teacher-forced log-probs, logits and
//! attention maps.

mod common;

use common::{max_abs_diff, shared};
use kvslim_cache::PolicySpec;
use kvslim_kernels::Products;
use kvslim_models::loader::safetensors::SafetensorsFiles;
use kvslim_models::{load_model, LoadedModel, Logits, Scratch, Trace};
use std::path::PathBuf;
use std::sync::OnceLock;

const PROMPT: &str = "The capital of France is Paris. The capital of Germany is";

fn model_path() -> PathBuf {
    shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn fixture_dir() -> PathBuf {
    shared().join("fixtures/smollm2")
}

/// The model and its reference must exist: a missing file fails the test
/// with its path (never a silent pass).
fn require_files() {
    for p in [model_path(), fixture_dir().join("reference.safetensors")] {
        assert!(p.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", p.display());
    }
}

fn load(products: Products) -> LoadedModel {
    require_files();
    let mut m = load_model(&model_path()).unwrap_or_else(|e| panic!("loading SmolLM2: {e}"));
    m.model.weights.set_products(products);
    m
}

/// The model with f32 products: parity with transformers on the
/// dequantized weights is a claim about the f32 path.
fn model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| load(Products::F32))
}

fn refs() -> SafetensorsFiles {
    require_files();
    SafetensorsFiles::open(&fixture_dir().join("reference.safetensors")).unwrap()
}

fn ids(r: &SafetensorsFiles, name: &str) -> Vec<u32> {
    r.get(name).unwrap().to_i64().iter().map(|&v| v as u32).collect()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn config_matches_the_readme() {
    let c = &model().model.config;
    assert_eq!((c.n_layers, c.hidden_size, c.ffn_size, c.n_heads, c.n_kv_heads, c.head_dim), (30, 576, 1536, 9, 3, 64));
    assert_eq!((c.vocab_size, c.context_len), (49152, 8192));
    assert!(c.tied_embeddings);
    let rope = c.rope.unwrap();
    assert_eq!((rope.theta, rope.rotary_dim), (100000.0, 64));
    assert!((c.norm_eps - 1e-5).abs() < 1e-9);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    let w = &model().model.weights;
    assert_eq!(w.token_embedding.dtype(), kvslim_kernels::DType::Q8_0);
    assert_eq!(w.layers[0].q.weight.dtype(), kvslim_kernels::DType::Q4_1);
    let t = model().tokenizer.as_ref().expect("embedded tokenizer");
    assert!(!t.add_bos);
    assert!(t.chat_template.as_deref().is_some_and(|s| s.contains("<|im_start|>")));
}

#[test]
fn tokenizer_matches_reference() {
    let t = model().tokenizer.as_ref().expect("embedded tokenizer");
    let r = refs();
    let text = std::fs::read_to_string(fixture_dir().join("text.txt")).unwrap();
    let got = t.encode(&text).unwrap();
    let want = ids(&r, "input_ids");
    assert!(got.len() >= want.len(), "text gave only {} ids", got.len());
    assert_eq!(&got[..want.len()], &want[..], "first {} ids of text.txt", want.len());
    assert_eq!(t.decode(&got).unwrap(), text, "decode(encode(text))");

    let prompt = t.encode(PROMPT).unwrap();
    assert_eq!(prompt, ids(&r, "prompt_ids"));
    assert_eq!(t.decode(&prompt).unwrap(), PROMPT);

    // control tokens are single ids and are skipped on decode
    let chat = t.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(chat[0], 1, "<|im_start|> is id 1: {chat:?}");
    assert_eq!(*chat.last().unwrap(), 2, "<|im_end|> is id 2: {chat:?}");
    assert_eq!(t.decode(&chat).unwrap(), "user\nHi");
    // digits are split one by one, non-ASCII survives the byte-level round trip
    for s in ["In 2024, 12345 people paid €3.50 — naïve café 東京", "  two  spaces\n\n"] {
        assert_eq!(t.decode(&t.encode(s).unwrap()).unwrap(), s);
    }
}

#[test]
fn greedy_continuation_matches_reference() {
    let m = &model().model;
    let r = refs();
    let prompt = ids(&r, "prompt_ids");
    let want = ids(&r, "greedy_ids");
    let new = want.len() - prompt.len();
    let mut cache = m.new_cache(&PolicySpec::full(), want.len(), want.len()).unwrap();
    let mut s = Scratch::new();
    m.forward(&prompt, &mut cache, &mut s, Logits::Last).unwrap();
    let mut out = prompt.clone();
    for step in 0..new {
        let next = argmax(s.logits());
        out.push(next);
        if step + 1 < new {
            m.forward(&[next], &mut cache, &mut s, Logits::Last).unwrap();
        }
    }
    if let Some(t) = &model().tokenizer {
        eprintln!("greedy: {:?}", t.decode(&out[prompt.len()..]).unwrap());
    }
    assert_eq!(out, want, "greedy continuation");
}

#[test]
fn teacher_forced_logprobs_logits_and_attention() {
    let m = &model().model;
    let r = refs();
    let input = ids(&r, "input_ids");
    let n = input.len();
    let v = m.config.vocab_size;
    let mut cache = m.new_cache(&PolicySpec::full(), n, n).unwrap();
    let mut s = Scratch::new();
    s.trace = Some(Trace::default());
    m.forward(&input, &mut cache, &mut s, Logits::All).unwrap();
    let logits = s.logits();
    assert_eq!(logits.len(), n * v);

    // per-token log-probs
    let want_lp = r.get("next_token_logprob").unwrap().to_f32().unwrap();
    let mut got_lp = Vec::with_capacity(n - 1);
    for i in 0..n - 1 {
        let row = &logits[i * v..(i + 1) * v];
        let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = row.iter().map(|&x| (x as f64 - mx).exp()).sum::<f64>().ln() + mx;
        got_lp.push((row[input[i + 1] as usize] as f64 - lse) as f32);
    }
    let mean_abs = got_lp.iter().zip(&want_lp).map(|(a, b)| (a - b).abs() as f64).sum::<f64>() / want_lp.len() as f64;
    let max_lp = max_abs_diff(&got_lp, &want_lp);
    let nll = -got_lp.iter().map(|&x| x as f64).sum::<f64>() / got_lp.len() as f64;
    eprintln!("log-probs: mean |Δ| {mean_abs:.2e}, max |Δ| {max_lp:.2e} nats; mean NLL {nll:.4} (HF 3.3168)");
    assert!(mean_abs < 0.01, "log-prob mean |Δ| {mean_abs}");
    assert!(max_lp < 0.1, "log-prob max |Δ| {max_lp}");

    // logits at the stored rows
    let rows = ids(&r, "logit_rows");
    let want_logits = r.get("logits").unwrap().to_f32().unwrap();
    let mut worst = 0f32;
    let mut scale = 0f32;
    for (k, &row) in rows.iter().enumerate() {
        let got = &logits[row as usize * v..(row as usize + 1) * v];
        let want = &want_logits[k * v..(k + 1) * v];
        worst = worst.max(max_abs_diff(got, want));
        scale = scale.max(want.iter().fold(0f32, |a, b| a.max(b.abs())));
        assert_eq!(argmax(got), argmax(want), "argmax at row {row}");
    }
    eprintln!("logits: max |Δ| {worst:.2e} (max |logit| {scale:.1})");
    // measured 7.7e-5 (float32 summation order only); 1e-3 leaves margin
    assert!(worst < 1e-3, "logits max |Δ| {worst}");

    // attention maps
    let trace = s.trace.take().unwrap();
    assert_eq!(trace.ctx, n);
    for l in [0usize, 15, 29] {
        let want = r.get(&format!("attn.{l}")).unwrap().to_f32().unwrap();
        let d = max_abs_diff(&trace.attn[l], &want);
        eprintln!("attn.{l}: max |Δ| {d:.2e}");
        assert!(d < 1e-4, "attn.{l} max |Δ| {d}");
    }
}

/// The default integer products (8-bit activations, as llama.cpp) move
/// log-probs by a few hundredths of a nat and keep the greedy text and the
/// argmax at the stored rows; the mean NLL stays within 1% of
/// transformers'. (Measured: mean |Δ| 0.057, NLL 3.3244 against 3.3168.)
#[test]
fn int8_products_stay_close_to_transformers() {
    let m = load(Products::Int8);
    let m = &m.model;
    let r = refs();
    let input = ids(&r, "input_ids");
    let (n, v) = (input.len(), m.config.vocab_size);
    let mut cache = m.new_cache(&PolicySpec::full(), n, n).unwrap();
    let mut s = Scratch::new();
    m.forward(&input, &mut cache, &mut s, Logits::All).unwrap();
    let logits = s.logits();
    let want_lp = r.get("next_token_logprob").unwrap().to_f32().unwrap();
    let (mut abs, mut nll, mut want_nll) = (0f64, 0f64, 0f64);
    for i in 0..n - 1 {
        let row = &logits[i * v..(i + 1) * v];
        let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = row.iter().map(|&x| (x as f64 - mx).exp()).sum::<f64>().ln() + mx;
        let lp = row[input[i + 1] as usize] as f64 - lse;
        abs += (lp - want_lp[i] as f64).abs();
        nll -= lp;
        want_nll -= want_lp[i] as f64;
    }
    let (abs, nll, want_nll) = (abs / (n - 1) as f64, nll / (n - 1) as f64, want_nll / (n - 1) as f64);
    eprintln!("int8 products: log-prob mean |Δ| {abs:.3}, NLL {nll:.4} (HF {want_nll:.4})");
    assert!(abs < 0.1, "log-prob mean |Δ| {abs}");
    assert!((nll - want_nll).abs() < 0.01 * want_nll, "NLL {nll} vs {want_nll}");
    let rows = ids(&r, "logit_rows");
    let want_logits = r.get("logits").unwrap().to_f32().unwrap();
    for (k, &row) in rows.iter().enumerate() {
        let got = &logits[row as usize * v..(row as usize + 1) * v];
        assert_eq!(argmax(got), argmax(&want_logits[k * v..(k + 1) * v]), "argmax at row {row}");
    }
}
