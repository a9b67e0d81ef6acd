//! Quantized and paged KV on stories260K (skipped with a message when
//! `../shared` is absent): the two evaluation modes of a quantized cache
//! (mode (a): eviction decisions fixed by an f32 reference run; mode (b):
//! decisions made on the quantized cache) and the paged statistics in
//! perplexity reports and matrix rows.

use kvslim_cache::policy::FollowDecisions;
use kvslim_cache::{KvDtype, PolicySpec};
use kvslim_engine::{perplexity, PerplexityOptions, Session};
use kvslim_eval::results::to_csv;
use kvslim_eval::{run_matrix, MatrixConfig, TaskSpec};
use kvslim_models::{LoadedModel, Logits};
mod common;

use common::{shared_dir, stories};

fn story_ids(m: &LoadedModel, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(shared_dir().join("data/tinystories/tinystories_val.txt")).unwrap();
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text).unwrap();
    ids.truncate(n);
    assert_eq!(ids.len(), n);
    ids
}

fn opts(spec: &str, from: Option<KvDtype>) -> PerplexityOptions {
    let mut o = PerplexityOptions::new(PolicySpec::parse_and_load(spec).unwrap());
    o.decisions_from = from;
    o
}

#[test]
fn decisions_from_rejects_the_same_dtype_and_head_policies() {
    let m = stories();
    let ids = story_ids(&m, 32);
    let e = perplexity(&m.model, &ids, &opts("h2o:heavy=8,recent=8,kv_dtype=f32", Some(KvDtype::F32)), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("already stores K/V as f32"), "{e}");
    let e = perplexity(&m.model, &ids, &opts("h2o:heavy=8,recent=8", Some(KvDtype::F32)), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("already stores K/V as f32"), "the default dtype is f32: {e}");
    let plan = std::env::temp_dir().join(format!("kvslim-qkv-plan-{}.json", std::process::id()));
    let layers: Vec<String> = (0..5).map(|_| r#"{"k": 2, "errors": [4, 3, 2, 1]}"#.to_string()).collect();
    std::fs::write(&plan, format!(r#"{{"layers": [{}]}}"#, layers.join(","))).unwrap();
    let spec = format!("h2o:heavy=8,recent=8,kv_dtype=q8+chai:plan={}", plan.display());
    let e = perplexity(&m.model, &ids, &opts(&spec, Some(KvDtype::F32)), |_, _| {}).unwrap_err().to_string();
    std::fs::remove_file(&plan).unwrap();
    assert!(e.contains("head policy"), "{e}");
}

/// Mode (a) driven by hand: the q8 session, following the f32 session's
/// kept sets through [`FollowDecisions`], holds exactly the same positions
/// after every token, in decode steps and in streamed prefill chunks.
#[test]
fn follower_keeps_the_reference_sets_at_every_step() {
    let m = stories();
    let n = 200;
    let ids = story_ids(&m, n);
    // streamed prefill hands the kept sets over between chunks; page
    // eviction drops several slots at once
    for spec in [
        "h2o:heavy=16,recent=16",
        "h2o:heavy=12,recent=12,prefill=stream:16",
        "h2o:heavy=12,recent=12,page=8,page_score=sum",
    ] {
        let reference_spec = PolicySpec::parse_and_load(spec).unwrap();
        let mut quant_spec = reference_spec.clone();
        quant_spec.storage.kv_dtype = KvDtype::Q8;
        let mut reference = Session::new(&m.model, &reference_spec, n, n).unwrap();
        let kept = FollowDecisions::handle();
        let mut cache = m.model.new_cache(&quant_spec, n, n).unwrap();
        cache.follow_decisions(kept.clone(), reference.cache.policy(), n);
        let mut follower = Session::with_cache(&m.model, cache);
        let chunk = reference.cache.policy().prefill_chunk().unwrap_or(64);
        let mut evicted = false;
        let mut fed = 0;
        let mut pieces: Vec<&[u32]> = ids[..64].chunks(chunk).collect();
        pieces.extend(ids[64..].chunks(1));
        for piece in pieces {
            reference.feed(piece, Logits::Last).unwrap();
            let want = reference.cache.store().kept_positions();
            *kept.lock().unwrap() = want.clone();
            follower.feed(piece, Logits::Last).unwrap();
            fed += piece.len();
            assert_eq!(follower.cache.store().kept_positions(), want, "{spec}: after {fed} tokens");
            evicted |= want[0][0].len() < fed;
        }
        assert!(evicted, "{spec}: the budget must bind");
    }
}

#[test]
fn mode_a_follows_f32_decisions_and_stays_close_to_f32() {
    let m = stories();
    let ids = story_ids(&m, 300);
    let f32_run = perplexity(&m.model, &ids, &opts("h2o:heavy=24,recent=24", None), |_, _| {}).unwrap();
    let mode_a =
        perplexity(&m.model, &ids, &opts("h2o:heavy=24,recent=24,kv_dtype=q8", Some(KvDtype::F32)), |_, _| {}).unwrap();
    let mode_b = perplexity(&m.model, &ids, &opts("h2o:heavy=24,recent=24,kv_dtype=q8", None), |_, _| {}).unwrap();
    let d = mode_a.decisions.as_ref().expect("mode (a) reports the reference");
    let (layers, kv_heads) = (m.model.config.n_layers, m.model.config.n_kv_heads);
    assert_eq!(d.reference_kv_dtype, "f32");
    assert_eq!(d.kept_sets_checked, (ids.len() - 1) * layers * kv_heads);
    assert_eq!(d.kept_sets_differing, 0);
    assert_eq!(mode_a.kept, f32_run.kept, "same kept sets after the last token");
    // the reference inside mode (a) is the f32 run itself
    assert!((d.reference_nll - f32_run.nll).abs() < 1e-9, "{} vs {}", d.reference_nll, f32_run.nll);
    let rel = (mode_a.ppl / f32_run.ppl - 1.0).abs();
    assert!(rel < 0.01, "q8 with f32 decisions: ppl {} vs f32 {} ({:.3}%)", mode_a.ppl, f32_run.ppl, rel * 100.0);
    assert!(d.kl_vs_reference > 0.0 && d.kl_vs_reference < 0.01, "KL {}", d.kl_vs_reference);
    // mode (b) decides on its own: no reference, and q8 stores fewer bytes than f32
    assert!(mode_b.decisions.is_none());
    assert!(mode_b.kv_bytes_allocated < f32_run.kv_bytes_allocated);
    assert_eq!(mode_a.kv_bytes_allocated, mode_b.kv_bytes_allocated);
    assert!(mode_a.decode_ms_median.is_some() && mode_a.decode_steps == ids.len() - 1);
}

#[test]
fn paged_statistics_in_reports() {
    let m = stories();
    let ids = story_ids(&m, 200);
    let fixed = perplexity(&m.model, &ids, &opts("h2o:heavy=16,recent=16", None), |_, _| {}).unwrap();
    assert!(fixed.paged.is_none());
    let r = perplexity(&m.model, &ids, &opts("h2o:heavy=16,recent=16,page=8", None), |_, _| {}).unwrap();
    let c = perplexity(&m.model, &ids, &opts("h2o:heavy=16,recent=16,page=8,compact=16", None), |_, _| {}).unwrap();
    let heads = m.model.config.n_layers * m.model.config.n_kv_heads;
    for rep in [&r, &c] {
        let p = rep.paged.as_ref().expect("paged");
        assert_eq!(p.page_size, 8);
        assert_eq!(p.live_final, 32 * heads, "B slots per head after the last step");
        assert_eq!(p.fragmentation_slots, p.pages_final * 8 - p.live_final);
        assert!(p.pages_peak >= p.pages_final && p.kv_bytes_peak >= p.kv_bytes_final);
        assert_eq!(rep.kv_bytes_peak, p.kv_bytes_peak);
        assert!(p.fragmentation_pct >= 0.0 && p.fragmentation_pct < 100.0);
        // same decisions and results as the fixed-slot store
        assert!((rep.nll - fixed.nll).abs() < 1e-9);
    }
    let (p, pc) = (r.paged.as_ref().unwrap(), c.paged.as_ref().unwrap());
    // without compact=N a head repacks only when it reaches its page cap
    let cap = kvslim_cache::store::paged::page_cap(33, 8);
    assert!(p.pages_peak <= cap * heads, "{} pages > {cap} per head", p.pages_peak);
    assert!(p.bytes_moved < pc.bytes_moved, "compact=16 repacks more often: {pc:?} {p:?}");
    assert!(pc.bytes_moved > 0 && pc.bytes_moved_per_step > 0.0);
    assert!((pc.bytes_moved_per_step - pc.bytes_moved as f64 / c.decode_steps as f64).abs() < 1e-9);
    assert!(pc.fragmentation_mean_pct < p.fragmentation_mean_pct, "compaction removes holes: {pc:?} {p:?}");
}

#[test]
fn matrix_rows_carry_paged_metrics_and_decisions() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let data = shared_dir().join("data/tinystories/tinystories_val.txt");
    let task = TaskSpec::parse(&format!("ppl:{},seq_len=96,limit=2", data.display())).unwrap();
    let mut cfg = MatrixConfig::new("stories260K", vec![task]);
    cfg.policies = ["full", "full:kv_dtype=q8", "h2o:kv_dtype=q8", "h2o:page=8,compact=16"].map(String::from).to_vec();
    cfg.budgets = vec!["25%".into()];
    cfg.decisions_from = Some(KvDtype::F32);
    cfg.charts = false;
    let rows = run_matrix(&m.model, tok, &cfg, |_| {}).unwrap();
    assert_eq!(rows.len(), 4);
    let by = |p: &str| rows.iter().find(|r| r.key.policy == p).unwrap_or_else(|| panic!("{p}"));
    // full: nothing to follow, its own reference
    let full = by("full");
    assert_eq!((full.key.decisions_from.as_deref(), full.metrics["kl"]), (None, 0.0));
    // full with q8 K/V: no decisions to follow, but compared with the f32 full cache
    let fq = by("full:kv_dtype=q8");
    assert!(fq.key.decisions_from.is_none());
    assert!(fq.metrics["kl"] > 0.0, "q8 full cache differs from f32: {:?}", fq.metrics);
    assert!(fq.metrics["kv_bytes_peak"] < full.metrics["kv_bytes_peak"]);
    // quantized h2o follows the f32 run's decisions
    let hq = by("h2o:kv_dtype=q8");
    assert_eq!(hq.key.decisions_from.as_deref(), Some("f32"));
    assert_eq!(hq.key.decisions_from.as_deref(), Some("f32"));
    assert_eq!(hq.metrics["kept_differing"], 0.0);
    assert!((hq.metrics["ppl"] / hq.metrics["ref_ppl"] - 1.0).abs() < 0.01, "{:?}", hq.metrics);
    assert!(hq.metrics["kl_ref"] >= 0.0);
    // f32 paged h2o: the reference dtype already, so its own decisions; page metrics
    let pg = by("h2o:page=8,compact=16");
    assert!(pg.key.decisions_from.is_none());
    for k in ["pages_peak", "kv_bytes_peak", "fragmentation", "bytes_moved_per_step"] {
        assert!(pg.metrics.get(k).is_some_and(|v| v.is_finite() && *v >= 0.0), "{k}: {:?}", pg.metrics);
    }
    assert!(pg.metrics["bytes_moved_per_step"] > 0.0);
    assert!(!hq.metrics.contains_key("pages_peak"), "not paged");
    let csv = to_csv(&rows);
    let head = csv.lines().next().unwrap();
    assert!(head.starts_with("model,policy,budget,task,decisions_from,items,"), "{head}");
    for k in ["pages_peak", "kv_bytes_peak", "fragmentation", "bytes_moved_per_step", "ref_ppl", "kl_ref"] {
        assert!(head.split(',').any(|c| c == k), "{k} in {head}");
    }
    assert!(csv.lines().any(|l| l.starts_with("stories260K,h2o:kv_dtype=q8,25%,") && l.contains(",f32,")));
}
