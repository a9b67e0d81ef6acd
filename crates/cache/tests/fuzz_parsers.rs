//! Mutation fuzzing of the cache crate's text parsers: the policy grammar
//! (`PolicySpec::parse`) and the CHAI plan JSON (`ChaiPlan::from_json`).
//! Every input must parse or give a clear error: no panic, no hang, no
//! allocation far beyond the input's size. `KVSLIM_FUZZ_ITERS` sets the
//! inputs per target (see `testing/fuzz`).

use kvslim_fuzz as fuzz;

use fuzz::{iters, run_text, Limits};
use kvslim_cache::policy::chai::ChaiPlan;
use kvslim_cache::PolicySpec;

const SPECS: &[&str] = &[
    "full",
    "full:page=16,kv_dtype=q8",
    "full:page=8,compact=4",
    "h2o:heavy=10%,recent=10%",
    "h2o:heavy=10,recent=6,prefill=stream:8",
    "h2o:heavy=1,recent=0,sink=2,score=norm",
    "h2o:heavy=10%,recent=10%,sink=4,score=persist:8:0.5",
    "h2o:heavy=1,recent=1,page=8,compact=8,page_score=sum",
    "h2o:agg=max,score=decay:0.9",
    "h2o:heavy=100,recent=100,score=tova",
    "window:recent=1%",
    "h2o+window:recent=3",
    "chai:plan=p.json+h2o:heavy=1,recent=1",
    "chai-static:plan=x.json,probe=5",
    "full+chai:plan=p.json",
];

const SPEC_DICT: &[&str] = &[
    "full",
    "h2o",
    "window",
    "chai",
    "chai-static",
    "+",
    ":",
    ",",
    "=",
    "%",
    "heavy=",
    "recent=",
    "sink=",
    "score=",
    "agg=",
    "page=",
    "compact=",
    "page_score=",
    "kv_dtype=",
    "prefill=",
    "stream:",
    "plan=",
    "probe=",
    "rep=",
    "q8",
    "q4",
    "q3",
    "f16",
    "decay:",
    "persist:",
    "tova",
    "norm",
    "sum",
    "max",
    "mean",
    " ",
    "\u{0}",
    "é",
    "%%",
    "::",
];

#[test]
fn fuzz_policy_grammar() {
    run_text(
        "policy-grammar",
        iters(20_000),
        Limits::default(),
        SPECS.iter().map(|s| s.to_string()).collect(),
        SPEC_DICT,
        |s| {
            match PolicySpec::parse(s) {
                Err(e) => Err(e.to_string()),
                Ok(spec) => {
                    // what parses prints back to a spec that parses to the same text
                    let shown = spec.to_string();
                    let again = PolicySpec::parse(&shown).map_err(|e| format!("round trip of {shown:?} failed: {e}"));
                    match again {
                        Ok(a) if a.to_string() == shown => {}
                        Ok(a) => panic!("{s:?} printed as {shown:?}, which re-prints as {a}"),
                        Err(e) => panic!("{s:?}: {e}"),
                    }
                    let _ = spec.budget(1000);
                    Ok(())
                }
            }
        },
    );
}

const PLAN: &str = r#"{"model": "tiny", "n_heads": 4, "probe": 5, "samples": 8, "seq_len": 64,
 "elbow_rule": "max-chord-distance", "max_k": 4, "dense_layers": 1, "restarts": 2, "seed": 7,
 "feature": "probe-lower-triangle",
 "layers": [{"k": 4, "errors": [3.0, 2.0, 1.0, 0.0], "elbow_k": 2, "static_clusters": [[0], [1], [2], [3]]},
            {"k": 2, "errors": [2.5, 0.5, 0.25, 0.0], "elbow_k": 2, "static_clusters": [[0, 2], [1, 3]]},
            {"k": 1, "errors": [0.0], "static_clusters": [[0, 1, 2, 3]]}]}"#;

const PLAN_MIN: &str = r#"{"layers": [{"k": 3, "errors": [1, 0.5, 0.1]}, {"k": 1, "errors": []}]}"#;

const PLAN_DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "\"k\": ",
    "\"errors\": ",
    "\"layers\": ",
    "\"static_clusters\": ",
    "\"n_heads\": ",
    "\"probe\": ",
    "\"elbow_k\": ",
    "[[0], [1]]",
    "[]",
    "{}",
    "-1",
    "1e400",
    "18446744073709551615",
    "\\u0000",
    "\\ud800",
];

#[test]
fn fuzz_chai_plan_json() {
    run_text("chai-plan", iters(20_000), Limits::default(), vec![PLAN.into(), PLAN_MIN.into()], PLAN_DICT, |s| {
        let plan = ChaiPlan::from_json(s)?;
        // a plan that passed its own check validates against its own shape
        let heads = if plan.n_heads == 0 { plan.layers.iter().map(|l| l.k).max().unwrap_or(1) } else { plan.n_heads };
        let _ = plan.validate(plan.layers.len(), heads);
        let _ = ChaiPlan::from_json(&plan.to_json()).map_err(|e| panic!("plan re-read failed: {e}"));
        Ok(())
    });
}

// The harness itself: each check it makes can fail.

#[test]
#[should_panic(expected = "allocated")]
fn harness_catches_an_oversized_allocation() {
    run_text("harness-alloc", 3, Limits::default(), vec!["x".into()], &[], |_| {
        let v: Vec<u8> = Vec::with_capacity(64 << 20);
        std::hint::black_box(&v);
        Ok(())
    });
}

#[test]
#[should_panic(expected = "PANIC: boom")]
fn harness_catches_a_panic() {
    run_text("harness-panic", 3, Limits::default(), vec!["x".into()], &[], |_| panic!("boom"));
}

#[test]
#[should_panic(expected = "hang")]
fn harness_catches_a_hang() {
    let limits = Limits { per_input: std::time::Duration::from_millis(200), ..Limits::default() };
    run_text("harness-hang", 1, limits, vec!["x".into()], &[], |_| {
        std::thread::sleep(std::time::Duration::from_secs(2));
        Ok(())
    });
}

#[test]
#[should_panic(expected = "empty error message")]
fn harness_catches_an_empty_error() {
    run_text("harness-empty", 1, Limits::default(), vec!["x".into()], &[], |_| Err(String::new()));
}
