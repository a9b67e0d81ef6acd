//! Logit, attention and hidden-state parity with Hugging Face transformers
//! on the tiny random checkpoints in `../shared/fixtures/parity`.

mod common;

use common::{max_abs_diff, shared};
use kvslim_cache::PolicySpec;
use kvslim_models::loader::safetensors::SafetensorsFiles;
use kvslim_models::{load_model, Logits, Scratch, Trace};

fn check_fixture(name: &str) {
    let dir = shared().join("fixtures/parity").join(name);
    let m = load_model(&dir).unwrap_or_else(|e| panic!("{name}: {e}")).model;
    let refs = SafetensorsFiles::open(&dir.join("reference.safetensors")).unwrap();
    let ids: Vec<u32> = refs.get("input_ids").unwrap().to_i64().iter().map(|&v| v as u32).collect();
    let n = ids.len();
    let want_logits = refs.get("logits").unwrap().to_f32().unwrap();
    let tol: f32 = if name.ends_with("bf16") { 2e-3 } else { 1e-4 };

    // one prefill chunk, traced
    let mut cache = m.new_cache(&PolicySpec::full(), n, n).unwrap();
    let mut s = Scratch::new();
    s.trace = Some(Trace::default());
    m.forward(&ids, &mut cache, &mut s, Logits::All).unwrap();
    let d = max_abs_diff(s.logits(), &want_logits);
    let trace = s.trace.take().unwrap();
    for l in 0..m.config.n_layers {
        let h = refs.get(&format!("hidden.{l}")).unwrap().to_f32().unwrap();
        let dh = max_abs_diff(&trace.hidden[l], &h);
        assert!(dh <= tol, "{name}: hidden.{l} max |Δ| = {dh}");
        let a = refs.get(&format!("attn.{l}")).unwrap().to_f32().unwrap();
        let da = max_abs_diff(&trace.attn[l], &a);
        assert!(da <= tol, "{name}: attn.{l} max |Δ| = {da}");
        eprintln!("{name} layer {l}: hidden {dh:.2e} attn {da:.2e}");
    }
    assert!(d <= tol, "{name}: prefill logits max |Δ| = {d} > {tol}");

    // token-by-token decode gives the same logits
    let mut cache = m.new_cache(&PolicySpec::full(), n, n).unwrap();
    let mut s = Scratch::new();
    let v = m.config.vocab_size;
    let mut worst = 0f32;
    for (t, &id) in ids.iter().enumerate() {
        m.forward(&[id], &mut cache, &mut s, Logits::Last).unwrap();
        worst = worst.max(max_abs_diff(s.logits(), &want_logits[t * v..(t + 1) * v]));
    }
    assert!(worst <= tol, "{name}: incremental decode logits max |Δ| = {worst} > {tol}");
    eprintln!("{name}: logits max |Δ| prefill {d:.2e}, decode {worst:.2e}");
}

/// One parity test per fixture (run in parallel, failing by name).
macro_rules! parity_tests {
    ($($test:ident: $fixture:literal,)*) => {$(
        #[test]
        fn $test() {
            check_fixture($fixture);
        }
    )*};
}

parity_tests! {
    parity_llama_gqa: "llama-gqa",
    parity_llama_gqa_bf16: "llama-gqa-bf16",
    parity_llama_mha_tied: "llama-mha-tied",
    parity_mistral: "mistral",
    parity_qwen2: "qwen2",
    parity_gpt2: "gpt2",
    parity_opt: "opt",
    parity_gpt_neox: "gpt-neox",
}
