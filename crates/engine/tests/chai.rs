//! CHAI through the engine: dense equivalence, shared probabilities with
//! own values, the K cache that really shrinks, probe handling,
//! determinism and composition with H2O.

use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions, Session};
use kvslim_kernels::Matrix;
use kvslim_models::weights::Linear;
use kvslim_models::{load_model, Logits, Model, Trace};
mod common;

use common::{chai_plan, shared, test_file};

/// A 64-token session of the 4-head `mha` model under a CHAI plan of
/// `ks` clusters per layer.
fn chai_session<'a>(m: &'a Model, name: &str, ks: &[usize]) -> Session<'a> {
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={}", chai_plan(name, 4, ks))).unwrap();
    Session::new(m, &spec, 64, 64).unwrap()
}

fn mha() -> Model {
    load_model(&shared().join("fixtures/parity/llama-mha-tied")).unwrap().model
}

fn stories() -> Model {
    load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap().model
}

fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn logprobs(m: &Model, spec: &str, tokens: &[u32], prefill: usize) -> Vec<f64> {
    let opts = PerplexityOptions { prefill, ..PerplexityOptions::new(PolicySpec::parse_and_load(spec).unwrap()) };
    perplexity(m, tokens, &opts, |_, _| {}).unwrap().logprobs
}

#[test]
fn k_equal_heads_is_bit_identical_to_dense() {
    let m = stories();
    let t = ids(120, 512);
    let p = chai_plan("kH", 8, &[8; 5]);
    assert_eq!(logprobs(&m, &format!("chai:plan={p}"), &t, 0), logprobs(&m, "full", &t, 0));
    // a prefill while CHAI's probe collects takes the exact per-token path
    // (it records every head's probabilities); dense prefill takes the tiled
    // kernel (online softmax): the same sums in another order
    let (chai, full) = (logprobs(&m, &format!("chai:plan={p}"), &t, 40), logprobs(&m, "full", &t, 40));
    assert_eq!(chai.len(), full.len());
    for (a, b) in chai.iter().zip(&full) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn members_share_probabilities_but_use_their_own_values() {
    let m = mha();
    let mut s = chai_session(&m, "k2", &[4, 2]);
    s.feed(&ids(20, 320), Logits::Last).unwrap();
    s.scratch.trace = Some(Trace::default());
    s.feed(&[7], Logits::Last).unwrap();
    let tr = s.scratch.trace.take().unwrap();
    let report = s.cache.head_sharing().unwrap().report();
    assert_eq!(report[1].clusters.len(), 2);
    let hd = m.config.head_dim;
    let ctx = tr.ctx;
    for (cl, &rep) in report[1].clusters.iter().zip(&report[1].representatives) {
        for &h in cl {
            let (a, b) = (&tr.attn[1][h * ctx..(h + 1) * ctx], &tr.attn[1][rep * ctx..(rep + 1) * ctx]);
            assert_eq!(a, b, "head {h} uses representative {rep}'s probabilities");
            if h != rep {
                let out = &tr.att_out[1];
                assert_ne!(&out[h * hd..(h + 1) * hd], &out[rep * hd..(rep + 1) * hd], "own V, own output");
            }
        }
    }
}

#[test]
fn one_cluster_of_identical_heads_equals_dense() {
    let mut m = mha();
    let (hd, d) = (m.config.head_dim, m.config.hidden_size);
    // every head of layer 1 gets head 0's query and key projection
    let layer = &mut m.weights.layers[1];
    for lin in [&mut layer.q, &mut layer.k] {
        let w = lin.weight.to_f32();
        let rows = lin.weight.rows();
        let copied: Vec<f32> = (0..rows).flat_map(|r| w[(r % hd) * d..(r % hd + 1) * d].to_vec()).collect();
        *lin = Linear::new(Matrix::from_f32(rows, d, &copied).unwrap(), None);
    }
    let p = chai_plan("k1", 4, &[4, 1]);
    let t = ids(40, 320);
    assert_eq!(logprobs(&m, &format!("chai:plan={p}"), &t, 0), logprobs(&m, "full", &t, 0));
}

#[test]
fn k_cache_shrinks_to_the_predicted_fraction() {
    // MHA: layer 1 keeps K for k = 2 of 4 heads: (H + k) / 2H of its bytes
    let m = mha();
    let mut s = chai_session(&m, "bytes", &[4, 2]);
    let dense_layer = s.cache.store().layer_bytes(1).kv;
    s.feed(&ids(30, 320), Logits::Last).unwrap();
    assert_eq!(s.cache.store().layer_bytes(0).kv, dense_layer, "k = H stays dense");
    assert_eq!(s.cache.store().layer_bytes(1).kv * 8, dense_layer * 6, "(4 + 2) / 8 of the dense bytes");

    // GQA (stories260K, 8 query / 4 KV heads): a KV head loses K only when no representative reads it
    let m = stories();
    let p = chai_plan("gqa", 8, &[2; 5]);
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={p}")).unwrap();
    let mut s = Session::new(&m, &spec, 64, 64).unwrap();
    let per_head_k = s.cache.store().head(0, 0).kv_bytes() / 2;
    let dense = s.cache.store().bytes().kv;
    s.feed(&ids(30, 512), Logits::Last).unwrap();
    let report = s.cache.head_sharing().unwrap().report();
    let mut predicted = dense;
    for layer in &report {
        let mut used: Vec<usize> = layer.representatives.iter().map(|r| r / 2).collect();
        used.sort_unstable();
        used.dedup();
        predicted -= (4 - used.len()) * per_head_k;
    }
    assert_eq!(s.cache.store().bytes().kv, predicted);
    assert!(predicted < dense, "two representatives of eight heads leave at least two KV heads without K");
}

#[test]
fn short_prompts_stay_dense_until_the_probe_completes_and_clustering_is_deterministic() {
    let m = stories();
    let p = chai_plan("probe", 8, &[3; 5]);
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={p},probe=5")).unwrap();
    let run = || {
        let mut s = Session::new(&m, &spec, 64, 64).unwrap();
        s.feed(&[1, 403, 407], Logits::Last).unwrap();
        assert!(s.cache.head_sharing().unwrap().report().is_empty(), "3 < probe tokens: still dense");
        s.feed(&[261], Logits::Last).unwrap();
        s.feed(&[378], Logits::Last).unwrap();
        let r = s.cache.head_sharing().unwrap().report();
        assert_eq!(r.len(), 5, "clustered right after the 5th token");
        r.iter().map(|l| l.clusters.clone()).collect::<Vec<_>>()
    };
    let a = run();
    assert_eq!(a, run(), "same input, same clusters");
    // a prompt spanning the probe gives the same clusters as token-by-token feeding
    let mut s = Session::new(&m, &spec, 64, 64).unwrap();
    s.feed(&[1, 403, 407, 261, 378, 432, 383], Logits::Last).unwrap();
    let b: Vec<_> = s.cache.head_sharing().unwrap().report().iter().map(|l| l.clusters.clone()).collect();
    assert_eq!(a, b);
}

#[test]
fn h2o_composed_with_chai_keeps_aligned_slot_sets_and_bounded_memory() {
    let m = stories();
    let p = chai_plan("compose", 8, &[3; 5]);
    let spec = PolicySpec::parse_and_load(&format!("h2o:heavy=12,recent=12+chai:plan={p}")).unwrap();
    let t = ids(300, 512);
    let mut s = Session::new(&m, &spec, t.len(), t.len()).unwrap();
    let bytes_after_probe = {
        s.feed(&t[..40], Logits::Last).unwrap();
        s.cache.store().bytes().kv
    };
    for &id in &t[40..] {
        s.feed(&[id], Logits::Last).unwrap();
    }
    assert_eq!(s.cache.store().bytes().kv, bytes_after_probe, "bounded: nothing grows");
    let heads = s.cache.head_sharing().unwrap();
    for l in 0..5 {
        let lh = heads.layer(l).unwrap();
        for comp in &lh.components {
            let lead = s.cache.store().head(l, comp.leader).positions().to_vec();
            assert_eq!(lead.len(), 24);
            for &kv in &comp.kv_heads {
                assert_eq!(
                    s.cache.store().head(l, kv).positions(),
                    &lead[..],
                    "layer {l}: KV heads of a component stay aligned"
                );
            }
        }
    }
    // perplexity reports the clusters
    let opts = PerplexityOptions::new(spec.clone());
    let r = perplexity(&m, &t, &opts, |_, _| {}).unwrap();
    let cl = r.chai_clusters.as_ref().unwrap();
    assert_eq!(cl.len(), 5);
    assert!(cl.iter().all(|l| l.clusters.len() == 3 && l.representatives.len() == 3));
    assert!(r.nll.is_finite());
}

#[test]
fn plan_for_another_model_is_a_clear_error() {
    let m = stories();
    let p = chai_plan("wrong", 4, &[2, 2]);
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={p}")).unwrap();
    let e = Session::new(&m, &spec, 10, 10).err().expect("5 layers × 8 heads vs a 2-layer 4-head plan").to_string();
    assert!(e.contains("layer") || e.contains("head"), "{e}");
}

/// A stories260K plan (group 2: 8 query / 4 KV heads) with GQA-aware
/// sharing keeping `keep` KV heads in every layer.
fn kv_plan(name: &str, keep: usize) -> String {
    let layers: Vec<_> = (0..5).map(|_| serde_json::json!({ "k": 2 * keep, "errors": [], "kv_keep": keep })).collect();
    test_file(&format!("chai-kv-{name}.json"), &serde_json::json!({ "group": 2, "layers": layers }).to_string())
}

#[test]
fn kv_group_sharing_frees_the_keys_of_the_dropped_kv_heads() {
    let m = stories();
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={}", kv_plan("keep1", 1))).unwrap();
    let mut s = Session::new(&m, &spec, 64, 64).unwrap();
    let per_head_k = s.cache.store().head(0, 0).kv_bytes() / 2;
    let dense = s.cache.store().bytes().kv;
    s.feed(&ids(30, 512), Logits::Last).unwrap();
    s.scratch.trace = Some(Trace::default());
    s.feed(&[7], Logits::Last).unwrap();
    let tr = s.scratch.trace.take().unwrap();
    assert_eq!(s.cache.store().bytes().kv, dense - 5 * 3 * per_head_k, "3 of 4 KV heads lose K in each of 5 layers");
    for (l, layer) in s.cache.head_sharing().unwrap().report().iter().enumerate() {
        // both query heads of the one kept KV head represent; everyone else reads them
        let kept = layer.representatives[0] / 2;
        let mut reps = layer.representatives.clone();
        reps.sort_unstable();
        assert_eq!(reps, vec![2 * kept, 2 * kept + 1], "layer {l}");
        for (cl, &rep) in layer.clusters.iter().zip(&layer.representatives) {
            for &h in cl {
                let row = |h: usize| &tr.attn[l][h * tr.ctx..(h + 1) * tr.ctx];
                assert_eq!(row(h), row(rep), "layer {l}: head {h} uses {rep}'s probabilities");
            }
        }
    }
    // a plan whose kv_keep does not match k for this model's groups is refused by name
    let layer = serde_json::json!({ "k": 4, "errors": [], "kv_keep": 3 });
    let bad = test_file("chai-kv-bad.json", &serde_json::json!({ "layers": vec![layer; 5] }).to_string());
    let spec = PolicySpec::parse_and_load(&format!("chai:plan={bad}")).unwrap();
    let e = Session::new(&m, &spec, 10, 10).err().expect("3 kept KV heads are 6 query heads, not k = 4").to_string();
    assert!(e.contains("kv_keep"), "{e}");
}

#[test]
fn quality_calibration_keeps_the_measured_kl_within_each_budget() {
    use kvslim_engine::calibrate::{calibrate_quality, calibration_windows, probe_features, CalibrateOptions};
    let loaded = common::stories();
    let m = &loaded.model;
    let ids = common::tokens(&loaded, 900);
    let opts = CalibrateOptions { probe: 5, config: Default::default(), model_name: "stories260K".into(), seq_len: 64 };
    let (cal, plan) =
        probe_features(m, &calibration_windows(&ids[..450], Some(1), 16, 65).unwrap(), &opts, |_, _| {}).unwrap();
    let windows = calibration_windows(&ids[450..], Some(1), 1, 301).unwrap();
    let plans = calibrate_quality(m, &cal, plan.clone(), &windows, &[0.0, 0.1, 1e9], |_, _| {}).unwrap();
    let q: Vec<_> = plans.iter().map(|p| p.quality.clone().unwrap()).collect();
    assert_eq!((q[0].kv_heads_freed, q[0].measured_kl), (0, 0.0), "a zero budget keeps every layer dense");
    assert!(plans[0].layers.iter().all(|l| l.kv_keep.is_none() && l.k == 8));
    assert_eq!(q[2].kv_heads_freed, 15, "an unbounded budget shares every layer down to one KV head");
    assert!(q[1].measured_kl <= 0.1 && q[1].kv_heads_freed > 0 && q[1].kv_heads_freed < 15, "{:?}", q[1]);
    // every layer's single-layer KLs are recorded, dearer with fewer kept heads
    for l in &plans[1].layers {
        assert_eq!(l.kl_by_kv_keep.len(), 3);
        assert!(l.kl_by_kv_keep[0] > l.kl_by_kv_keep[2], "{:?}", l.kl_by_kv_keep);
    }
    // the recorded KL is what perplexity --compare-full measures with the written plan
    for (p, q) in plans.iter().zip(&q) {
        let path = test_file(&format!("chai-quality-{}.json", q.max_kl), &p.to_json());
        let spec = PolicySpec::parse_and_load(&format!("chai:plan={path}")).unwrap();
        let opts = PerplexityOptions { prefill: windows[0].len(), compare_full: true, ..PerplexityOptions::new(spec) };
        let r = perplexity(m, &windows[0], &opts, |_, _| {}).unwrap();
        let kl = r.compare_full.unwrap().kl_mean;
        assert!((kl - q.measured_kl).abs() < 1e-9, "budget {}: {kl} vs {}", q.max_kl, q.measured_kl);
    }
    // the engine blames its setting by type; each front end names it
    match calibrate_quality(m, &cal, plan, &windows, &[-0.1], |_, _| {}).unwrap_err() {
        kvslim_engine::EngineError::Setting(s) => {
            assert_eq!(s.setting, kvslim_engine::Setting::MaxKl);
            assert!(s.message("--max-kl").starts_with("--max-kl must be"), "{}", s.message("--max-kl"));
        }
        e => panic!("not a setting error: {e}"),
    }
}

#[test]
fn drift_checks_keep_every_key_and_recluster_from_a_reprobe() {
    let m = stories();
    let p = chai_plan("drift", 8, &[2; 5]);
    let dense_bytes = Session::new(&m, &PolicySpec::full(), 64, 64).unwrap().cache.store().bytes().kv;
    // threshold ~0: every re-probe re-clusters; 2 (the largest cosine distance): none does
    for (threshold, every_layer_reclustered) in [("0.000001", true), ("2", false)] {
        let spec = PolicySpec::parse_and_load(&format!("chai:plan={p},drift=4:{threshold}")).unwrap();
        let mut s = Session::new(&m, &spec, 64, 64).unwrap();
        // probe (5 tokens), 4 tokens shared, then the re-probe's 5 steps run dense
        s.feed(&ids(9, 512), Logits::Last).unwrap();
        assert!(s.cache.collecting_probe(), "the re-probe is due");
        s.scratch.trace = Some(Trace::default());
        s.feed(&[7], Logits::Last).unwrap();
        let tr = s.scratch.trace.take().unwrap();
        let (h0, h1) = (&tr.attn[0][..tr.ctx], &tr.attn[0][tr.ctx..2 * tr.ctx]);
        assert_ne!(h0, h1, "a re-probe step runs every head on its own keys");
        s.feed(&ids(4, 512), Logits::Last).unwrap();
        assert!(!s.cache.collecting_probe());
        assert_eq!(s.cache.store().bytes().kv, dense_bytes, "drift checks keep every KV head's K");
        let report = s.cache.head_sharing().unwrap().report();
        for (l, layer) in report.iter().enumerate() {
            assert_eq!(layer.clusters.len(), 2, "layer {l}: re-clustering keeps the plan's k");
            assert_eq!(layer.reclustered > 0, every_layer_reclustered, "layer {l} at threshold {threshold}");
            assert!(layer.max_drift > 0.0 && layer.max_drift <= 2.0, "layer {l}: {}", layer.max_drift);
        }
        // shared again after the re-probe: members read their representative's row
        s.scratch.trace = Some(Trace::default());
        s.feed(&[9], Logits::Last).unwrap();
        let tr = s.scratch.trace.take().unwrap();
        let rep_of = &s.cache.head_sharing().unwrap().layer(0).unwrap().representative_of;
        for (h, &r) in rep_of.iter().enumerate() {
            assert_eq!(&tr.attn[0][h * tr.ctx..(h + 1) * tr.ctx], &tr.attn[0][r * tr.ctx..(r + 1) * tr.ctx]);
        }
    }
}
