//! The GGUF architectures (llama, qwen2, qwen3, gemma3, phi3) against
//! references we did not write: `../shared/fixtures/gguf`, tiny random
//! models converted and quantized by llama.cpp's own tools, with
//! llama.cpp's logits at every position and, for the Q8_0 files,
//! transformers' logits on the file's own dequantized weights.
//!
//! kvslim computes in f32 on dequantized weights, so the Q8_0 files must
//! match transformers to ~1e-4 (the forward pass is exact per
//! architecture, Gemma 3's sliding window and layer pattern included);
//! llama.cpp quantizes activations to 8 bits before its integer dot
//! products, so against llama.cpp we report top-1 agreement and mean |Δ|
//! and bound the maximum by the gap the fixture README measured between
//! llama.cpp and transformers on the same weights.

mod common;

use common::{base64_decode, f32s_le, shared};
use kvslim_cache::PolicySpec;
use kvslim_models::{load_model, LoadedModel, Logits, Scratch};
use serde_json::Value;
use std::path::PathBuf;

const ARCHS: [&str; 5] = ["llama", "qwen2", "qwen3", "gemma3", "phi3"];

fn dir(arch: &str) -> PathBuf {
    shared().join("fixtures/gguf").join(arch)
}

fn reference(arch: &str, ty: &str) -> Value {
    let p = dir(arch).join(format!("{ty}.reference.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn load(arch: &str, ty: &str) -> LoadedModel {
    let p = dir(arch).join(format!("{ty}.gguf"));
    let mut m = load_model(&p).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()));
    // parity with transformers on the dequantized weights: f32 products
    m.model.weights.set_products(kvslim_kernels::Products::F32);
    m
}

/// Teacher-forced logits of every position, as one prefill chunk.
fn all_logits(m: &LoadedModel, tokens: &[u32]) -> Vec<f32> {
    let model = &m.model;
    let mut cache = model.new_cache(&PolicySpec::parse("full").unwrap(), tokens.len(), tokens.len()).unwrap();
    let mut s = Scratch::new();
    model.forward(tokens, &mut cache, &mut s, Logits::All).unwrap();
    s.logits().to_vec()
}

/// Logits of every position, one decode step at a time.
fn decoded_logits(m: &LoadedModel, tokens: &[u32]) -> Vec<f32> {
    let model = &m.model;
    let mut cache = model.new_cache(&PolicySpec::parse("full").unwrap(), tokens.len(), tokens.len()).unwrap();
    let mut s = Scratch::new();
    let mut out = Vec::new();
    for &t in tokens {
        model.forward(&[t], &mut cache, &mut s, Logits::Last).unwrap();
        out.extend_from_slice(s.logits());
    }
    out
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

struct Gap {
    max: f32,
    mean: f32,
    top1: f32,
}

fn gap(a: &[f32], b: &[f32], vocab: usize) -> Gap {
    assert_eq!(a.len(), b.len());
    let max = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let mean = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).sum::<f64>() / a.len() as f64;
    let rows = a.len() / vocab;
    let agree = (0..rows).filter(|&r| argmax(&a[r * vocab..(r + 1) * vocab]) == argmax(&b[r * vocab..(r + 1) * vocab]));
    Gap { max, mean: mean as f32, top1: agree.count() as f32 / rows as f32 }
}

/// Q8_0, every architecture: the forward pass equals transformers run on
/// the same dequantized weights, in prefill and in decode.
#[test]
fn q8_0_matches_transformers_on_dequantized_weights() {
    for arch in ARCHS {
        let r = reference(arch, "Q8_0");
        let tokens = ids(&r["token_ids"]);
        let vocab = r["n_vocab"].as_u64().unwrap() as usize;
        let hf = f32s_le(&base64_decode(r["transformers"]["dequant_logits"].as_str().unwrap()));
        let m = load(arch, "Q8_0");
        let prefill = all_logits(&m, &tokens);
        let g = gap(&prefill, &hf, vocab);
        eprintln!("{arch} Q8_0 vs transformers(dequant): max {:.2e} mean {:.2e} top-1 {:.3}", g.max, g.mean, g.top1);
        assert!(g.max <= 1e-3, "{arch}: prefill logits differ from transformers by up to {}", g.max);
        let decode = decoded_logits(&m, &tokens);
        let g = gap(&decode, &hf, vocab);
        assert!(g.max <= 1e-3, "{arch}: decode logits differ from transformers by up to {}", g.max);
        let llama = f32s_le(&base64_decode(r["logits"].as_str().unwrap()));
        let g = gap(&prefill, &llama, vocab);
        eprintln!("{arch} Q8_0 vs llama.cpp: max {:.2e} mean {:.2e} top-1 {:.3}", g.max, g.mean, g.top1);
    }
}

/// Gemma 3's local layer masks keys 16 or more tokens back and its global
/// layer does not: both a window of 15 and no window at all change the
/// logits from position 15 or 16 on (a check that the test above can fail).
#[test]
fn gemma3_window_is_what_makes_it_match() {
    let r = reference("gemma3", "Q8_0");
    let tokens = ids(&r["token_ids"]);
    let hf = f32s_le(&base64_decode(r["transformers"]["dequant_logits"].as_str().unwrap()));
    let vocab = 512;
    let m = load("gemma3", "Q8_0");
    let w = m.model.config.features.sliding_window.clone().expect("gemma3 has sliding-window layers");
    assert_eq!((w.window, w.local_layers.clone(), w.local_rope_theta), (16, vec![true, false], Some(10_000.0)));
    for window in [15, 17] {
        let mut c = m.model.config.clone();
        c.features.sliding_window.as_mut().unwrap().window = window;
        let path = dir("gemma3").join("Q8_0.gguf");
        let file = kvslim_models::loader::gguf::GgufFile::open(&path).unwrap();
        let (_, mut weights) = kvslim_models::loader::gguf::build(&file).unwrap();
        weights.set_products(kvslim_kernels::Products::F32);
        let other = LoadedModel { model: kvslim_models::Model::new(c, weights).unwrap(), tokenizer: None };
        let logits = all_logits(&other, &tokens);
        // positions below both windows see the same keys
        let same = window.min(16);
        let early = gap(&logits[..same * vocab], &hf[..same * vocab], vocab);
        let rest = gap(&logits[same * vocab..], &hf[same * vocab..], vocab);
        assert!(early.max <= 1e-3, "window {window}: the first {same} positions cannot tell");
        assert!(rest.max > 0.05, "window {window} should change later logits (max Δ {})", rest.max);
    }
}

/// Bounded memory: with `full`, the local layer of the Gemma 3 fixture
/// holds at most its window while the global layer holds every token.
#[test]
fn gemma3_local_layer_cache_is_bounded_by_its_window() {
    let r = reference("gemma3", "Q8_0");
    let tokens = ids(&r["token_ids"]);
    let m = load("gemma3", "Q8_0");
    let mut cache = m.model.new_cache(&PolicySpec::parse("full").unwrap(), 96, 96).unwrap();
    assert_eq!(cache.store().head(0, 0).capacity(), 16);
    assert_eq!(cache.store().head(1, 0).capacity(), 96);
    let mut s = Scratch::new();
    m.model.forward(&tokens[..40], &mut cache, &mut s, Logits::None).unwrap();
    for &t in &tokens[40..60] {
        m.model.forward(&[t], &mut cache, &mut s, Logits::Last).unwrap();
        assert_eq!(cache.store().head(0, 1).len(), 15);
    }
    assert_eq!(cache.store().head(1, 1).len(), 60);
    let mut held: Vec<u32> = cache.store().head(0, 0).positions().to_vec();
    held.sort_unstable();
    assert_eq!(held, (45..60).collect::<Vec<u32>>());
}

/// The Hugging Face name of a GGUF tensor in the qwen2/qwen3/gemma3/phi3
/// layouts (the inverse of llama.cpp's converter), and whether Gemma's
/// `1 + w` norm convention must be undone.
fn hf_name(arch: &str, gguf: &str) -> (String, bool) {
    let gemma = arch == "gemma3";
    let top = match gguf {
        "token_embd.weight" => Some(("model.embed_tokens.weight".to_string(), false)),
        "output_norm.weight" => Some(("model.norm.weight".to_string(), gemma)),
        "output.weight" => Some(("lm_head.weight".to_string(), false)),
        _ => None,
    };
    if let Some(t) = top {
        return t;
    }
    let rest = gguf.strip_prefix("blk.").expect("block tensor");
    let (layer, what) = rest.split_once('.').unwrap();
    let (stem, kind) = what.rsplit_once('.').unwrap();
    let p = format!("model.layers.{layer}");
    let (name, norm) = match stem {
        "attn_norm" => (format!("{p}.input_layernorm"), true),
        "attn_q" => (format!("{p}.self_attn.q_proj"), false),
        "attn_k" => (format!("{p}.self_attn.k_proj"), false),
        "attn_v" => (format!("{p}.self_attn.v_proj"), false),
        "attn_qkv" => (format!("{p}.self_attn.qkv_proj"), false),
        "attn_output" => (format!("{p}.self_attn.o_proj"), false),
        "attn_q_norm" => (format!("{p}.self_attn.q_norm"), true),
        "attn_k_norm" => (format!("{p}.self_attn.k_norm"), true),
        "ffn_norm" if gemma => (format!("{p}.pre_feedforward_layernorm"), true),
        "ffn_norm" => (format!("{p}.post_attention_layernorm"), true),
        "post_attention_norm" => (format!("{p}.post_attention_layernorm"), true),
        "post_ffw_norm" => (format!("{p}.post_feedforward_layernorm"), true),
        "ffn_gate" => (format!("{p}.mlp.gate_proj"), false),
        "ffn_up" if arch == "phi3" => (format!("{p}.mlp.gate_up_proj"), false),
        "ffn_up" => (format!("{p}.mlp.up_proj"), false),
        "ffn_down" => (format!("{p}.mlp.down_proj"), false),
        other => panic!("unmapped tensor {other}"),
    };
    (format!("{name}.{kind}"), norm && gemma)
}

/// The same families from Hugging Face safetensors: a checkpoint written
/// from the Q8_0 file's dequantized tensors (exactly what transformers was
/// given for `dequant_logits`) must reproduce transformers' logits.
#[test]
fn hf_safetensors_of_the_new_families_match_transformers() {
    for arch in ["qwen2", "qwen3", "gemma3", "phi3"] {
        let r = reference(arch, "Q8_0");
        let hp = &r["hparams"];
        let file = kvslim_models::loader::gguf::GgufFile::open(&dir(arch).join("Q8_0.gguf")).unwrap();
        let mut tensors = Vec::new();
        for t in file.tensors() {
            let mut data = vec![0f32; t.numel()];
            kvslim_kernels::quant::dequantize(t.dtype, file.data(t), &mut data);
            let (name, minus_one) = hf_name(arch, &t.name);
            if minus_one {
                data.iter_mut().for_each(|w| *w -= 1.0);
            }
            let shape: Vec<usize> = t.dims.iter().rev().copied().collect();
            tensors.push((name, shape, data));
        }
        let class = match arch {
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            "gemma3" => "Gemma3ForCausalLM",
            _ => "Phi3ForCausalLM",
        };
        let mut config = serde_json::json!({
            "architectures": [class],
            "hidden_size": hp["n_embd"], "intermediate_size": hp["n_ff"],
            "num_attention_heads": hp["n_head"], "num_key_value_heads": hp["n_head_kv"],
            "head_dim": hp["head_dim"], "num_hidden_layers": hp["n_layer"],
            "rms_norm_eps": hp["rms_norm_eps"], "rope_theta": hp["rope_theta"],
            "max_position_embeddings": 256, "vocab_size": hp["n_vocab"],
            "tie_word_embeddings": hp["tied_embeddings"], "bos_token_id": 1, "eos_token_id": 2,
        });
        if arch == "gemma3" {
            let extra = serde_json::json!({
                "sliding_window": hp["sliding_window"], "layer_types": hp["layer_types"],
                "query_pre_attn_scalar": hp["query_pre_attn_scalar"], "rope_local_base_freq": hp["rope_theta_swa"],
                "hidden_activation": hp["activation"],
            });
            config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        }
        let out = std::env::temp_dir().join(format!("kvslim-hf-{arch}-{}", std::process::id()));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("config.json"), config.to_string()).unwrap();
        common::write_safetensors_f32(&out.join("model.safetensors"), &tensors);
        let m = load_model(&out).unwrap_or_else(|e| panic!("{arch} from safetensors: {e}"));
        std::fs::remove_dir_all(&out).ok();
        let tokens = ids(&r["token_ids"]);
        let hf = f32s_le(&base64_decode(r["transformers"]["dequant_logits"].as_str().unwrap()));
        let g = gap(&all_logits(&m, &tokens), &hf, 512);
        eprintln!("{arch} safetensors vs transformers(dequant): max {:.2e} mean {:.2e}", g.max, g.mean);
        assert!(g.max <= 1e-3, "{arch} from safetensors: logits differ from transformers by up to {}", g.max);
    }
}

/// Every fixture file (every quantization mix) loads, and its logits come
/// as close to llama.cpp's as an f32 engine can: within the gap the
/// fixture README measured between llama.cpp and transformers on the same
/// dequantized weights (`max_gap` below, from its Files tables, with 25%
/// headroom for our own f32 rounding), and llama.cpp's greedy continuation
/// is reproduced up to its first step whose margin is within that distance.
#[test]
fn every_quantization_mix_tracks_llama_cpp() {
    // llama.cpp vs transformers(dequant) max |Δ| per file, from the fixture README
    let max_gap = |arch: &str, ty: &str| -> f32 {
        let table: &[(&str, &[(&str, f32)])] = &[
            (
                "llama",
                &[
                    ("Q8_0", 0.397),
                    ("Q6_K", 0.531),
                    ("Q5_K_M", 0.540),
                    ("Q4_K_M", 0.678),
                    ("Q3_K_M", 0.443),
                    ("Q2_K", 0.577),
                    ("Q5_0", 0.357),
                    ("Q4_0", 0.317),
                ],
            ),
            (
                "qwen2",
                &[
                    ("Q8_0", 0.0937),
                    ("Q5_K_M", 0.144),
                    ("Q4_K_M", 0.124),
                    ("Q3_K_M", 0.120),
                    ("Q2_K", 0.140),
                    ("Q4_0", 0.115),
                ],
            ),
            (
                "qwen3",
                &[
                    ("Q8_0", 0.463),
                    ("Q5_K_M", 0.819),
                    ("Q4_K_M", 0.812),
                    ("Q3_K_M", 0.539),
                    ("Q2_K", 0.648),
                    ("Q4_0", 0.538),
                ],
            ),
            (
                "gemma3",
                &[
                    ("Q8_0", 0.565),
                    ("Q5_K_M", 0.918),
                    ("Q4_K_M", 0.821),
                    ("Q3_K_M", 0.838),
                    ("Q2_K", 0.794),
                    ("Q4_0", 0.779),
                ],
            ),
            (
                "phi3",
                &[
                    ("Q8_0", 0.363),
                    ("Q5_K_M", 0.664),
                    ("Q4_K_M", 0.455),
                    ("Q3_K_M", 0.614),
                    ("Q2_K", 0.513),
                    ("Q4_0", 0.404),
                ],
            ),
        ];
        let row = table.iter().find(|(a, _)| *a == arch).unwrap().1;
        row.iter().find(|(t, _)| *t == ty).unwrap_or_else(|| panic!("no gap for {arch} {ty}")).1
    };
    let mut files = 0;
    for arch in ARCHS {
        let mut types: Vec<String> = std::fs::read_dir(dir(arch))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".gguf").map(String::from))
            .collect();
        types.sort();
        for ty in &types {
            let r = reference(arch, ty);
            let tokens = ids(&r["token_ids"]);
            let vocab = r["n_vocab"].as_u64().unwrap() as usize;
            let llama = f32s_le(&base64_decode(r["logits"].as_str().unwrap()));
            let m = load(arch, ty);
            let g = gap(&all_logits(&m, &tokens), &llama, vocab);
            let bound = 1.25 * max_gap(arch, ty);
            eprint!(
                "{arch:6} {ty:6} vs llama.cpp: max {:.3} (bound {bound:.3}) mean {:.4} top-1 {:.3}",
                g.max, g.mean, g.top1
            );
            assert!(g.max <= bound, "{arch} {ty}: max |Δ| {} above {bound}", g.max);
            // greedy: equal up to llama.cpp's first step whose top-1/top-2
            // margin is within our measured distance from its logits
            let prompt = ids(&r["greedy_prompt_ids"]);
            let want = ids(&r["greedy_ids"]);
            let margins: Vec<f64> =
                r["greedy_margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let stable = margins.iter().position(|&mg| mg < g.max as f64).unwrap_or(want.len());
            let model = &m.model;
            let mut cache = model.new_cache(&PolicySpec::parse("full").unwrap(), 64, 64).unwrap();
            let mut s = Scratch::new();
            model.forward(&prompt, &mut cache, &mut s, Logits::Last).unwrap();
            let mut got = Vec::new();
            for _ in 0..stable {
                let t = argmax(s.logits()) as u32;
                got.push(t);
                model.forward(&[t], &mut cache, &mut s, Logits::Last).unwrap();
            }
            assert_eq!(got, want[..stable], "{arch} {ty}: greedy continuation (first {stable} stable steps)");
            eprintln!(", greedy equal for the {stable} of 16 steps before a margin below it");
            files += 1;
        }
    }
    assert_eq!(files, 32, "the fixture holds 32 GGUF files");
}
