//! The grammar's tests: round trips, percentages, errors, eviction
//! configs and allocators.

use super::*;
use crate::testing::assert_refused;

#[test]
fn parses_every_policy_and_round_trips() {
    for s in [
        "full",
        "window:recent=64",
        "sink:sink=4,recent=60",
        "heavy:heavy=32",
        "random:budget=64,recent=16,seed=7",
        "h2o:heavy=32,recent=32",
        "h2o:heavy=10%,recent=10%,agg=max,prefill=stream:16",
        "h2o:heavy=10%,recent=10%,prefill=snap:32:7",
        "h2o:heavy=8,recent=8,prefill=snap:16:1,score=norm",
        "h2o:heavy=8,recent=8,prefill=expect:64",
        "h2o:heavy=8,recent=8,prefill=kvzip,alloc=ada:0.2",
        "h2o:heavy=8,recent=8,prefill=kvzip,alloc=global",
        "h2o:heavy=8,recent=8,prefill=kvzip:512",
        "h2o:heavy=8,recent=8,prefill=kvzap",
        "h2o:heavy=8,recent=8,prefill=kvzap:calib/kvzap/m.kvzap,score=norm,alloc=global",
        "h2o:heavy=8,recent=8,prefill=rkv:0.9",
        "h2o:heavy=8,recent=8,prefill=rkv:0.75,score=norm",
        "full:page=16,kv_dtype=q8",
        "h2o:heavy=32,recent=32,page=8,compact=64,kv_dtype=q4",
        "random:budget=64,recent=16,seed=7,page=16,page_score=topm:4",
        "h2o:heavy=32,recent=32,page=32,page_score=max,kv_dtype=f16",
        "h2o:heavy=32,recent=32,score=norm",
        "h2o:heavy=32,recent=32,score=decay:0.9",
        "h2o:heavy=32,recent=32,agg=max,score=tova",
        "h2o:heavy=32,recent=32,sink=4,score=vnorm,prefill=snap:32",
        "h2o:heavy=32,recent=32,score=vnorm,page=16",
        "h2o:heavy=32,recent=32,score=persist:16",
        "h2o:heavy=10%,recent=10%,sink=4,score=persist:8:0.5",
        "heavy:heavy=32,sink=2,score=tova",
        "window:recent=60,sink=4",
        "random:budget=64,recent=16,seed=7,sink=4",
        "h2o:heavy=8,recent=8,sink=4,score=decay:0.5+chai:plan=p.json",
        "h2o:heavy=32,recent=32,alloc=pyramid:0.5",
        "h2o:heavy=10%,recent=10%,score=norm,alloc=ada:0.2",
        "h2o:heavy=32,recent=32,alloc=pyramid:0.25/ada:0",
        "h2o:heavy=32,recent=32,page=16,alloc=ada:0.2",
        "h2o:heavy=8,recent=8,alloc=pyramid:0.5+chai:plan=p.json",
        "chai:plan=p.json,probe=5,rep=first,drift=64:0.5",
    ] {
        let p = PolicySpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(PolicySpec::parse(&p.to_string()).unwrap(), p, "{s}");
    }
    assert_eq!(PolicySpec::parse(" full ").unwrap(), PolicySpec::full());
}

#[test]
fn percentages_resolve_once_against_the_base_length() {
    let p = PolicySpec::parse("h2o:heavy=10%,recent=10%").unwrap();
    assert_eq!(p.budget(1000), Some(200)); // 20% total, not 20% extra heavy
    assert_eq!(p.build(1000).capacity(5000), 201);
    assert_eq!(PolicySpec::parse("window:recent=1%").unwrap().budget(10), Some(1));
}

#[test]
fn bad_specs_name_the_problem() {
    let cases = [
        ("fancy:x=1", "unknown policy `fancy`"),
        ("full:x=1", "unknown parameter `x`"),
        ("h2o:heavy=32", "needs `recent=`"),
        ("h2o:heavy=32,recent=x", "not a slot count"),
        ("h2o:heavy=32,recent=0%", "must be in (0, 100]"),
        ("h2o:heavy=1,recent=1,agg=mean", "agg"),
        ("h2o:heavy=1,recent=1,prefill=stream:0", "prefill"),
        ("h2o:heavy=1,recent=1,prefill=snap:0", "snap:W[:K]"),
        ("h2o:heavy=1,recent=1,prefill=snap:8:4", "K odd"),
        ("h2o:heavy=1,recent=1,prefill=snap:8,score=tova", "needs score=sum, norm or vnorm"),
        ("h2o:heavy=1,recent=1,prefill=expect,score=vnorm", "prefill=expect scores the prompt once"),
        ("h2o:heavy=1,recent=1,prefill=kvzip,score=tova", "prefill=kvzip scores the prompt once"),
        ("h2o:heavy=1,recent=1,prefill=kvzip:0", "`kvzip[:C]`"),
        ("h2o:heavy=1,recent=1,recent_share=0.1", "recent_share splits a budget family's slots"),
        ("h2o:heavy=1,recent=1,prefill=kvzap:", "names no file"),
        ("h2o:heavy=1,recent=1,prefill=kvzap,score=vnorm", "prefill=kvzap scores the prompt once"),
        ("h2o:heavy=1,recent=1,prefill=rkv:0", "`rkv[:P]`"),
        ("h2o:heavy=1,recent=1,prefill=rkv:1.5", "`rkv[:P]`"),
        ("h2o:heavy=1,recent=1,prefill=rkv:0.9,score=tova", "prefill=rkv scores the prompt once"),
        ("h2o:heavy=1,heavy=2,recent=1", "given twice"),
        ("h2o:heavy=0,recent=0", "≥ 1"),
        ("random:budget=8,recent=8", "smaller than budget"),
        ("window:recent", "not key=value"),
        ("", "empty policy name"),
        ("h2o:heavy=1,recent=1+foo", "only a head policy"),
        ("chai:probe=5", "needs `plan=FILE`"),
        ("chai-static:plan=x.json,probe=5", "no probe"),
        ("chai:plan=x.json,drift=0", "drift: `0` is not a check interval"),
        ("chai:plan=x.json,drift=8:3", "drift: threshold `3`"),
        ("chai-static:plan=x.json,drift=8", "chai-static keeps its membership"),
        ("h2o:heavy=1,recent=1+chai:plan=x.json,drift=8", "drift: re-clustering"),
        ("h2o:heavy=1,recent=1,compact=8", "need a paged store"),
        ("h2o:heavy=1,recent=1,page=0", "page: `0`"),
        ("h2o:heavy=1,recent=1,page=8,compact=8,page_score=sum", "choose one"),
        ("h2o:heavy=1,recent=1,page=8,page_score=mean", "page_score"),
        ("h2o:heavy=1,recent=1,kv_dtype=q3", "kv_dtype"),
        ("full:page=8,compact=4", "only apply to a policy that evicts"),
        ("sink:sink=4,recent=60,page=16,page_score=sum", "no page to evict"),
        ("chai:plan=x.json+h2o:heavy=1,recent=1", "token policy first"),
        ("h2o:heavy=1,recent=1,score=decay:-0.5", "score: decay: `-0.5` is not a factor in [0, 1]"),
        ("h2o:heavy=1,recent=1,score=fancy", "score: unknown score family `fancy`"),
        ("heavy:heavy=1,score=persist:30", "score: persist: window `30`"),
        ("h2o:heavy=1,recent=1,sink=x", "sink: `x`"),
        ("window:recent=4,score=tova", "unknown parameter `score`"),
        ("random:budget=4,score=tova", "unknown parameter `score`"),
        ("h2o:heavy=1,recent=1,alloc=pyramid:0", "alloc: pyramid ratio `0` must be in (0, 1]"),
        ("h2o:heavy=1,recent=1,alloc=ada:2", "alloc: ada floor `2` must be in [0, 1]"),
        ("h2o:heavy=1,recent=1,alloc=fancy", "alloc: unknown allocator `fancy`"),
        ("h2o:heavy=1,recent=1,alloc=ada+chai:plan=p.json", "cannot compose with chai"),
        ("h2o:heavy=1,recent=1,alloc=global+chai:plan=p.json", "cannot compose with chai"),
        ("h2o:heavy=1,recent=1,alloc=global/ada", "does not combine with pyramid or ada"),
        ("h2o:heavy=1,recent=1,alloc=global:2", "alloc: global floor `2` must be in [0, 1]"),
        ("h2o:heavy=1,recent=1,page=8,page_score=max,alloc=ada", "does not take page_score"),
        ("heavy:heavy=4,alloc=pyramid", "unknown parameter `alloc`"),
        ("window:recent=4,alloc=ada", "unknown parameter `alloc`"),
        ("auto", "needs `budget=B`"),
        ("auto:budget=0", "at least 1 slot"),
        ("auto:budget=20%,score=norm", "unknown parameter"),
        ("auto:budget=20%+chai:plan=p.json", "whole policy"),
        ("tuned", "needs `file=FILE`"),
        ("tuned:file=a.json,x=1", "unknown parameter `x`"),
        ("tuned:file=a.json+chai:plan=p.json", "whole policy"),
        ("h2o:heavy=1,recent=1+tuned:file=a.json", "only a head policy"),
    ];
    assert_refused(PolicySpec::parse, &cases);
}

#[test]
fn parsing_reads_no_file_and_loading_names_it() {
    let text = "h2o:heavy=1,recent=1+chai:plan=/no/such/plan.json";
    let mut p = PolicySpec::parse(text).unwrap();
    assert!(p.head.as_ref().is_some_and(|h| h.plan.is_none()));
    assert_eq!(PolicySpec::parse(&p.to_string()).unwrap(), p, "round-trips unloaded");
    let e = p.load_plans().unwrap_err().to_string();
    assert!(e.contains("/no/such/plan.json"), "{e}");
    let e = PolicySpec::parse_and_load(text).unwrap_err().to_string();
    assert!(e.contains(text) && e.contains("cannot read"), "{e}");
    // a spec that skipped loading is refused where a cache would use it
    let h = PolicySpec::parse("chai:plan=/no/such/plan.json").unwrap().head.unwrap();
    let e = crate::policy::chai::HeadSharing::new(h, 2, 4, 2).err().unwrap();
    assert!(e.contains("/no/such/plan.json") && e.contains("not loaded"), "{e}");
    // a bad plan file is named too
    let bad = std::env::temp_dir().join(format!("kvslim-spec-bad-plan-{}.json", std::process::id()));
    std::fs::write(&bad, "{not json").unwrap();
    let e = PolicySpec::parse_and_load(&format!("chai-static:plan={}", bad.display())).unwrap_err().to_string();
    assert!(e.contains(&bad.display().to_string()) && e.contains("invalid JSON"), "{e}");
    std::fs::remove_file(&bad).unwrap();
}

#[test]
fn eviction_configs_are_what_each_family_means() {
    let cfg = |s: &str| {
        let t = PolicySpec::parse(s).unwrap().token;
        let Parts { name, evict, .. } = t.parts();
        evict.map(|e| e.resolve(name, 1000))
    };
    assert_eq!(cfg("full"), None);
    let c = cfg("sink:sink=4,recent=60").unwrap();
    assert_eq!((c.name, c.budget, c.recent, c.sinks, c.rule), ("sink", 64, 60, 4, VictimRule::Oldest));
    let c = cfg("random:budget=8,recent=50%,seed=3").unwrap();
    assert_eq!((c.budget, c.recent, c.rule), (8, 7, VictimRule::Random { seed: 3 }), "B_r < B");
    let c = cfg("h2o:heavy=10%,recent=5,agg=max,prefill=stream:16").unwrap();
    assert_eq!((c.budget, c.recent, c.agg, c.prefill_chunk), (105, 5, Some(ScoreAgg::Max), Some(16)));
    let c = cfg("heavy:heavy=32").unwrap();
    assert_eq!((c.budget, c.recent, c.rule, c.agg), (32, 0, VictimRule::LowestScore, Some(ScoreAgg::Sum)));
    // sinks are extra slots protecting the first positions, in every family
    for (spec, budget, recent) in [
        ("window:recent=60,sink=4", 64, 60),
        ("heavy:heavy=30,sink=4", 34, 0),
        ("random:budget=60,recent=20,sink=4", 64, 20),
        ("h2o:heavy=30,recent=30,sink=4", 64, 30),
    ] {
        let c = cfg(spec).unwrap();
        assert_eq!((c.budget, c.recent, c.sinks), (budget, recent, 4), "{spec}");
    }
    // the score family reaches the built policy; `sum` is today's H2O
    let rule = |s: &str| PolicySpec::parse(s).unwrap().build(1000).score_rule();
    assert_eq!(rule("h2o:heavy=4,recent=4"), ScoreRule::Sum);
    assert_eq!(rule("h2o:heavy=4,recent=4,score=sum"), ScoreRule::Sum);
    assert_eq!(rule("h2o:heavy=4,recent=4,score=decay:0.25"), ScoreRule::Decay(0.25));
    assert_eq!(rule("heavy:heavy=4,score=persist:12:2"), ScoreRule::Persist { window: 12, threshold: 2.0 });
    assert_eq!(
        PolicySpec::parse("h2o:heavy=4,recent=4,score=sum").unwrap(),
        PolicySpec::parse("h2o:heavy=4,recent=4").unwrap()
    );
}

/// Σ over layers and KV heads of the per-head budgets is the plain
/// spec's; layers (pyramid) and heads (ada) get different shares; the
/// store is allocated per layer at its own capacity.
#[test]
fn allocators_keep_the_total_budget() {
    let (layers, kv) = (30, 3);
    let total = |p: &dyn CachePolicy| -> usize {
        (0..layers).flat_map(|l| (0..kv).map(move |h| (l, h))).map(|(l, h)| p.head_budget(l, h).unwrap()).sum()
    };
    for text in ["h2o:heavy=102,recent=102", "h2o:heavy=10%,recent=10%,sink=4", "h2o:heavy=51,recent=51,agg=max"] {
        let plain = PolicySpec::parse(text).unwrap();
        let b = plain.budget(1024).unwrap();
        for alloc in ["pyramid", "pyramid:0.5", "pyramid:1", "ada", "ada:0", "pyramid:0.1/ada:0.5"] {
            let spec = PolicySpec::parse(&format!("{text},alloc={alloc}")).unwrap();
            assert_eq!(spec.budget(1024), Some(b), "the average per-head budget is unchanged");
            let p = spec.build_for(1024, layers, kv);
            assert_eq!(total(p.as_ref()), b * layers * kv, "{text},alloc={alloc}");
        }
    }
    let spec = PolicySpec::parse("h2o:heavy=100,recent=20,alloc=pyramid:0.25").unwrap();
    let p = spec.build_for(1000, 2, 3);
    assert_eq!((p.head_budget(0, 2), p.head_budget(1, 0)), (Some(180), Some(60)), "160 + 20 and 40 + 20");
    assert_eq!((p.layer_capacity(0, 1000), p.layer_capacity(1, 1000)), (181, 61));
    // ada: each head is allocated for the most it can win, 3·100 − 2·20
    let p = PolicySpec::parse("h2o:heavy=100,recent=20,alloc=ada:0.2").unwrap().build_for(1000, 2, 3);
    assert_eq!(p.layer_capacity(0, 1000), 20 + 260 + 1);
    assert_eq!(p.head_budget(0, 0), Some(120), "the uniform budget until the layer first overflows");
    // without a model shape (`build`), the plain policy
    assert_eq!(spec.build(1000).capacity(1000), 121);
    // global: nothing is budgeted until the ranking over every unit, so a
    // head is allocated for the whole sequence; the ranking keeps the total
    let mut p = PolicySpec::parse("h2o:heavy=100,recent=20,alloc=global").unwrap().build_for(1000, 2, 3);
    assert_eq!(p.layer_capacity(1, 1000), 1001);
    assert!(p.global_decision_pending());
    let positions: Vec<u32> = (0..1000).collect();
    let scores: Vec<Vec<f32>> = (0..6).map(|u| (0..1000).map(|t| ((t * 7 + u * 13) % 101) as f32).collect()).collect();
    let units: Vec<(&[u32], &[f32])> = scores.iter().map(|s| (&positions[..], &s[..])).collect();
    p.decide_global(&units);
    assert!(!p.global_decision_pending());
    let sum: usize = (0..2).flat_map(|l| (0..3).map(move |h| (l, h))).map(|(l, h)| p.head_budget(l, h).unwrap()).sum();
    assert_eq!(sum, 6 * 120, "Σ budgets = units × (heavy + recent)");
}

#[test]
fn a_default_page_size_serves_compact_and_page_score_only() {
    let p = PolicySpec::parse_with_page("h2o:heavy=1,recent=1,compact=8", Some(16)).unwrap();
    assert_eq!((p.storage.page_size, p.storage.compact_every), (Some(16), Some(8)));
    let p = PolicySpec::parse_with_page("h2o:heavy=1,recent=1,page=4,page_score=max", Some(16)).unwrap();
    assert_eq!(p.storage.page_size, Some(4), "an explicit page wins");
    assert_eq!(PolicySpec::parse_with_page("h2o:heavy=1,recent=1", Some(16)).unwrap().storage.page_size, None);
    assert!(PolicySpec::parse_with_page("h2o:heavy=1,recent=1,compact=8", None).is_err());
}

/// `prefill=kvzap[:FILE]`: the file is only named (parsing reads none),
/// kept as written, and the eviction scores by the predictor.
#[test]
fn kvzap_names_its_predictor() {
    let own = PolicySpec::parse("h2o:heavy=8,recent=8,prefill=kvzap").unwrap();
    assert_eq!(own.kvzap(), Some(None));
    let named = PolicySpec::parse("h2o:heavy=8,recent=8,prefill=kvzap:/no/such/file.kvzap").unwrap();
    assert_eq!(named.kvzap(), Some(Some("/no/such/file.kvzap")));
    assert_eq!(named.to_string(), "h2o:heavy=8,recent=8,prefill=kvzap:/no/such/file.kvzap");
    assert_ne!(own, named);
    assert_eq!(PolicySpec::parse("h2o:heavy=8,recent=8,prefill=kvzip").unwrap().kvzap(), None);
    let Parts { name, evict, .. } = named.token.parts();
    let c = evict.unwrap().resolve(name, 100);
    assert_eq!(c.observation, Some(Observation::Kvzap { file: Some("/no/such/file.kvzap") }));
}
