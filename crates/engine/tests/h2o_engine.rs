//! H2O through the whole engine: no-eviction equivalence, bounded memory on
//! long runs, streaming prefill.

use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions};
use kvslim_models::{load_model, LoadedModel};
mod common;

use common::{shared, stories};

fn tokens(m: &LoadedModel, chars: usize, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    let end = text.char_indices().nth(chars).map_or(text.len(), |(i, _)| i);
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text[..end]).unwrap();
    assert!(ids.len() >= n, "need {n} tokens, text gave {}", ids.len());
    ids.truncate(n);
    ids
}

#[test]
fn h2o_with_budget_above_length_is_bit_identical_to_full() {
    let m = stories();
    let ids = tokens(&m, 6000, 300);
    for prefill in [0, 120] {
        let run = |spec: &str| {
            let opts = PerplexityOptions { prefill, ..PerplexityOptions::new(PolicySpec::parse(spec).unwrap()) };
            perplexity(&m.model, &ids, &opts, |_, _| {}).unwrap()
        };
        let full = run("full");
        for spec in ["h2o:heavy=200,recent=100", "h2o:heavy=150,recent=150,prefill=stream:32", "window:recent=300"] {
            let h = run(spec);
            assert_eq!(h.logprobs, full.logprobs, "{spec} prefill {prefill}: logprobs must be bit-identical");
        }
    }
}

#[test]
fn stories260k_2000_tokens_under_h2o_keep_constant_memory() {
    let m = stories();
    let ids = tokens(&m, 40_000, 2000);
    let spec = PolicySpec::parse("h2o:heavy=32,recent=32").unwrap();
    let c = &m.model.config;
    let r = perplexity(&m.model, &ids, &PerplexityOptions::new(spec), |_, _| {}).unwrap();
    // exactly (B+1) slots of K and V per layer and KV head, f32
    let want = c.n_layers * c.n_kv_heads * (64 + 1) * c.head_dim * 4 * 2;
    assert_eq!(r.kv_bytes_allocated, want);
    assert_eq!(r.kv_metadata_bytes, c.n_layers * c.n_kv_heads * (64 + 1) * 8);
    assert!(r.kept.iter().flatten().all(|h| h.len() == 64), "64 slots held at the end");
    // beyond the trained context of 512 the model still predicts (uniform would be ln 512 = 6.24)
    assert!(r.nll.is_finite() && r.nll < 3.0, "mean NLL {}", r.nll);
    eprintln!("stories260K 2000 tokens h2o:32+32 NLL {:.4}, KV {} bytes", r.nll, r.kv_bytes_allocated);
}

#[test]
fn smollm2_2000_tokens_under_h2o_keep_constant_memory() {
    let m = load_model(&shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let text = std::fs::read_to_string(shared().join("data/wikitext2/wiki.test.raw")).unwrap();
    let end = text.char_indices().nth(12_000).map_or(text.len(), |(i, _)| i);
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text[..end]).unwrap();
    assert!(ids.len() >= 2000);
    ids.truncate(2000);
    let c = &m.model.config;
    let spec = PolicySpec::parse("h2o:heavy=32,recent=32").unwrap();
    let opts = PerplexityOptions { prefill: 256, ..PerplexityOptions::new(spec) };
    let r = perplexity(&m.model, &ids, &opts, |_, _| {}).unwrap();
    assert_eq!(r.kv_bytes_allocated, c.n_layers * c.n_kv_heads * 65 * c.head_dim * 8);
    assert!(r.nll.is_finite() && r.nll < 6.0, "mean NLL {}", r.nll);
    eprintln!("SmolLM2 2000 tokens h2o:32+32 NLL {:.4}, KV {} bytes", r.nll, r.kv_bytes_allocated);
}
