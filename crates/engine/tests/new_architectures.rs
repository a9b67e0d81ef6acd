//! The engine's paths on the GGUF families added with sliding-window layers,
//! QK norms and sandwich norms (gemma3, qwen3, phi3; `../shared/fixtures/gguf`
//! Q8_0 files): batched decode equals solo decode, the sequential
//! verifier equals decode steps bit for bit, paged equals fixed slots,
//! quantized KV runs, and speculative greedy equals plain greedy — every
//! one under full, H2O and the baselines, with Gemma 3's window of 16
//! crossed (96 tokens).

use kvslim_cache::{PolicySpec, SequenceCache};
use kvslim_engine::speculative::{speculative_run, NgramDrafter, Verification};
use kvslim_engine::{generate, GenerateOptions, SamplingParams, Session};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{load_model, Logits, Model, Scratch};
mod common;

use common::{shared, test_file};

/// The Q8_0 fixture with f32 products: these tests compare computation
/// paths to f32 rounding, which 8-bit activations would turn into whole
/// quantization steps.
fn model(arch: &str) -> Model {
    let mut m = load_model(&shared().join("fixtures/gguf").join(arch).join("Q8_0.gguf")).unwrap().model;
    m.weights.set_products(kvslim_kernels::Products::F32);
    m
}

/// The fixture's 96 token ids (BOS first).
fn ids() -> Vec<u32> {
    let p = shared().join("fixtures/gguf/summary.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn held(c: &SequenceCache) -> Vec<Vec<u32>> {
    let st = c.store();
    (0..st.layers()).flat_map(|l| (0..st.kv_heads()).map(move |h| st.head(l, h).positions().to_vec())).collect()
}

const ARCHS: [&str; 3] = ["gemma3", "qwen3", "phi3"];
const POLICIES: [&str; 5] =
    ["full", "h2o:heavy=6,recent=6", "sink:sink=2,recent=10", "window:recent=20,kv_dtype=q8", "h2o:heavy=12,recent=12"];
const PROMPT: usize = 24;

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Solo decode (prompt prefilled, then one token per step) against
/// `forward_sequential` (bit for bit), `forward_batch` (two sequences in
/// lockstep; to rounding), `forward_batch_exact` (bit for bit) and paged
/// against fixed slots (bit for bit).
#[test]
fn batch_and_sequential_paths_equal_solo_decode() {
    let tokens = ids();
    for arch in ARCHS {
        let m = model(arch);
        for spec in POLICIES {
            let policy = PolicySpec::parse_and_load(spec).unwrap();
            let mut solo = Session::new(&m, &policy, 96, PROMPT).unwrap();
            solo.feed(&tokens[..PROMPT], Logits::Last).unwrap();
            let mut seq_cache = solo.cache.clone();
            let (mut b1, mut b2) = (solo.cache.clone(), solo.cache.clone());
            let (mut e1, mut e2) = (solo.cache.clone(), solo.cache.clone());
            let mut es = BatchScratch::new();
            let mut want = Vec::new();
            for &t in &tokens[PROMPT..] {
                want.extend_from_slice(solo.feed(&[t], Logits::Last).unwrap());
            }
            let mut s = Scratch::new();
            m.forward_sequential(&tokens[PROMPT..], &mut seq_cache, &mut s).unwrap();
            assert_eq!(bits(s.logits()), bits(&want), "{arch} {spec}: sequential");
            assert_eq!(held(&seq_cache), held(&solo.cache), "{arch} {spec}: sequential kept sets");
            let mut bs = BatchScratch::new();
            let vocab = m.config.vocab_size;
            for (i, &t) in tokens[PROMPT..].iter().enumerate() {
                let mut items = [BatchItem { token: t, cache: &mut b1 }, BatchItem { token: t, cache: &mut b2 }];
                m.forward_batch(&mut items, &mut bs).unwrap();
                // the batch reads each weight row once for both rows (GEMM):
                // sums in another order, so equal to rounding, not bits; an
                // int8 KV code may then round the other way (one step of a
                // row's scale), which moves these logits (std ~2.5) by a few
                // hundredths — a wrong row would move them by whole units
                let tol = if spec.contains("q8") { 0.1 } else { 1e-3 };
                for j in 0..2 {
                    let d = max_abs_diff(bs.logits(j), &want[i * vocab..(i + 1) * vocab]);
                    assert!(d < tol, "{arch} {spec} step {i}: batch differs from solo by {d}");
                }
                // the exact batch: a second sequence a step behind, so the rows differ
                let mut exact = vec![BatchItem { token: t, cache: &mut e1 }];
                if i > 0 {
                    exact.push(BatchItem { token: tokens[PROMPT + i - 1], cache: &mut e2 });
                }
                m.forward_batch_exact(&mut exact, &mut es).unwrap();
                let row = &want[i * vocab..(i + 1) * vocab];
                assert_eq!(bits(es.logits(0)), bits(row), "{arch} {spec} step {i}: exact batch");
                if i > 0 {
                    let behind = &want[(i - 1) * vocab..i * vocab];
                    assert_eq!(bits(es.logits(1)), bits(behind), "{arch} {spec} step {i}: exact batch, second row");
                }
            }
            assert_eq!(held(&e1), held(&solo.cache), "{arch} {spec}: exact batch kept sets");
            assert_eq!(held(&b1), held(&solo.cache), "{arch} {spec}: batch kept sets");
            // paged storage changes nothing but where rows live
            let mut paged = policy.clone();
            paged.storage.page_size = Some(4);
            let mut p = Session::new(&m, &paged, 96, PROMPT).unwrap();
            let mut got = Vec::new();
            p.feed(&tokens[..PROMPT], Logits::Last).unwrap();
            for &t in &tokens[PROMPT..] {
                got.extend_from_slice(p.feed(&[t], Logits::Last).unwrap());
            }
            assert_eq!(bits(&got), bits(&want), "{arch} {spec}: paged");
        }
    }
}

/// Greedy speculative decoding (n-gram drafts) gives plain greedy's tokens.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    let tokens = ids();
    for arch in ARCHS {
        let m = model(arch);
        for spec in ["full", "h2o:heavy=6,recent=6"] {
            let o = GenerateOptions {
                max_tokens: 40,
                sampling: SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 },
                policy: PolicySpec::parse_and_load(spec).unwrap(),
                eos: vec![],
            };
            let prompt = &tokens[..8];
            let plain = generate(&m, prompt, &o, |_| true).unwrap();
            for k in [2, 4] {
                let s = speculative_run(&m, prompt, &o, &mut NgramDrafter::default(), k, Verification::Exact, |_| true)
                    .unwrap();
                assert_eq!(s.generation.token_ids, plain.token_ids, "{arch} {spec} k={k}");
            }
        }
    }
}

/// Beam search (beams fork the whole cache, sliding-window state
/// included): paged beams (the default) give the same hypotheses as beams
/// on fixed slots, and every hypothesis' local layers hold no more than
/// the window.
#[test]
fn beams_on_sliding_window_layers() {
    use kvslim_engine::beam::{beam_search, beam_search_in, BeamOptions, BeamStorage};
    let tokens = ids();
    let m = model("gemma3");
    for spec in ["full", "h2o:heavy=6,recent=6"] {
        let o = BeamOptions {
            beams: 3,
            max_tokens: 24,
            length_penalty: 1.0,
            early_stopping: true,
            policy: PolicySpec::parse_and_load(spec).unwrap(),
            eos: vec![],
            keep_caches: true,
        };
        let prompt = &tokens[..20];
        let paged = beam_search(&m, prompt, &o).unwrap();
        let fixed = beam_search_in(&m, prompt, &o, BeamStorage { as_specified: true, pool: None }, None).unwrap();
        let key = |h: &[kvslim_engine::beam::Hypothesis]| -> Vec<(Vec<u32>, u64)> {
            h.iter().map(|x| (x.token_ids.clone(), x.logprob.to_bits())).collect()
        };
        assert_eq!(key(&paged), key(&fixed), "{spec}: paged beams vs fixed slots");
        for h in &paged {
            let c = h.cache.as_ref().unwrap();
            assert!(c.store().head(0, 0).len() <= 15, "{spec}: the local layer holds at most W − 1 = 15");
        }
    }
}

/// CHAI (online clustering on the probe, and static membership) composes
/// with sliding-window layers: it runs, and with one cluster per query
/// head it changes nothing.
#[test]
fn chai_on_sliding_window_layers() {
    let tokens = ids();
    let m = model("gemma3");
    let heads = m.config.n_heads;
    let plan = |k: usize| {
        let layer = serde_json::json!({
            "k": k,
            "errors": (0..heads).map(|i| (heads - i) as f64).collect::<Vec<_>>(),
            "static_clusters": (0..heads).collect::<Vec<_>>().chunks(heads / k).map(|c| c.to_vec()).collect::<Vec<_>>(),
        });
        test_file(&format!("newarch-chai-{k}.json"), &serde_json::json!({ "layers": vec![layer; 2] }).to_string())
    };
    let run = |spec: &str| -> Vec<f32> {
        let mut s = Session::new(&m, &PolicySpec::parse_and_load(spec).unwrap(), 96, 96).unwrap();
        s.feed(&tokens, Logits::All).unwrap().to_vec()
    };
    let dense = run("full");
    let (p4, p2) = (plan(heads), plan(2));
    for spec in [format!("full+chai:plan={p4}"), format!("full+chai-static:plan={p4}")] {
        let got = run(&spec);
        assert!(max_abs_diff(&got, &dense) < 1e-4, "{spec}: one head per cluster is dense attention");
    }
    for spec in [format!("h2o:heavy=8,recent=8+chai:plan={p2}"), format!("full+chai-static:plan={p2}")] {
        let got = run(&spec);
        assert!(got.iter().all(|x| x.is_finite()), "{spec}");
        assert!(max_abs_diff(&got, &dense) > 1e-3, "{spec}: sharing scores changes the output");
    }
}
