//! The short soak (what CI runs): 8 clients for 20 s (`KVSLIM_SOAK_SECONDS`
//! overrides) against an in-process stories260K server with an API key and
//! short timeouts, mixing greedy, sampled, cancelled and beam requests with
//! malformed, oversized, unknown-policy, beyond-context and stalled ones.
//! Every request must get its expected answer (greedy and beam text equal
//! to solo runs), the KV must come back to 0, and memory stay bounded.
//! A second, shorter run cuts its prompts from a text (`prompt_file`) and
//! mixes its own policies, then checks the inputs the driver must refuse.

use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions, SamplingParams};
use kvslim_loadtest::soak::{self, GreedyReference, Prompt, SoakConfig};
use kvslim_server::{HttpLimits, Limits};
use std::time::Duration;
mod common;

#[test]
fn short_soak_answers_everything_and_returns_the_kv() {
    let secs: u64 = std::env::var("KVSLIM_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let key = "soak-key";
    let http = HttpLimits {
        max_body_bytes: 64 << 10,
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(5),
        request_timeout: Some(Duration::from_secs(120)),
        max_connections: 512,
    };
    let limits = Limits { kv_memory: 64 << 20, max_batch: 16, queue_limit: 64, ..Limits::default() };
    let (addr, _, _) =
        common::start_with(limits, Duration::from_secs(5), |s| s.with_http_limits(http).with_api_key(Some(key.into())));
    let mut cfg = SoakConfig::new(addr, Duration::from_secs(secs));
    cfg.clients.api_key = Some(key.into());
    // in-process: the test's own peak includes the server's
    cfg.clients.server_pid = Some(std::process::id());
    cfg.oversize_bytes = 1 << 20;
    cfg.stalled = true;
    cfg.seed = 17;
    let report = soak::run(&cfg).expect("solo references");
    println!("{}", serde_json::to_string_pretty(&report.json).unwrap());
    assert!(report.failures.is_empty(), "unexpected outcomes: {:#?}", report.failures);
    assert!(report.passed(), "{}", report.json);
    let kinds = report.json["requests_by_kind"].as_object().unwrap();
    for k in ["greedy", "sampled", "cancelled", "malformed", "oversized", "unknown_policy", "beyond_context"] {
        assert!(kinds.get(k).and_then(|v| v.as_u64()).unwrap_or(0) > 0, "no {k} request in {kinds:?}");
    }
    check_references(&report.greedy_references);
    // stories260K weighs ~1 MB and its KV pool is capped at 64 MiB
    let rss = report.json["peak_rss_bytes"].as_u64().unwrap_or(0);
    assert!(rss < 1 << 30, "peak RSS {rss} bytes");
}

/// The solo references are what the engine gives without the server.
fn check_references(refs: &[GreedyReference]) {
    let m = common::stories();
    let tok = m.tokenizer.as_ref().unwrap();
    assert!(!refs.is_empty());
    for r in refs {
        let opts = GenerateOptions {
            max_tokens: r.max_tokens,
            sampling: SamplingParams::default(),
            policy: PolicySpec::parse(&r.policy).unwrap(),
            eos: tok.eos.clone(),
        };
        let ids = match &r.prompt {
            Prompt::Text(t) => tok.encode(t).unwrap(),
            Prompt::Ids { ids, .. } => ids.clone(),
        };
        let g = generate(&m.model, &ids, &opts, |_| true).unwrap();
        assert_eq!(tok.decode(&g.token_ids).unwrap(), r.text, "{:?} under {}", r.prompt, r.policy);
    }
}

/// The soak with prompts cut from a text (4 windows of exactly 96 tokens,
/// sent as ids) and its own policy mix: a few seconds, every answer
/// expected, the KV back to 0; then the inputs it must refuse before any
/// load, each with its reason.
#[test]
fn soak_with_prompt_file_and_policy_mix() {
    let limits = Limits { kv_memory: 64 << 20, max_batch: 16, queue_limit: 64, ..Limits::default() };
    let (addr, _, _) = common::start_with(limits, Duration::from_secs(5), |s| s);
    let text = common::shared().join("data/tinystories/tinystories_val.txt");
    let policies = ["full", "h2o:heavy=10%,recent=10%,kv_dtype=q8", "window:recent=32"];
    let mut cfg = SoakConfig::new(addr.clone(), Duration::from_secs(4));
    cfg.clients.count = 4;
    cfg.clients.max_tokens = 16;
    cfg.seed = 5;
    cfg.clients.prompt_file = Some(text.clone());
    cfg.clients.prompt_tokens = Some(96);
    cfg.policies = policies.iter().map(|p| p.to_string()).collect();
    let report = soak::run(&cfg).expect("solo references");
    println!("{}", serde_json::to_string_pretty(&report.json).unwrap());
    assert!(report.passed(), "{:#?} {}", report.failures, report.json);
    assert_eq!(report.json["prompts"].as_array().unwrap().len(), 4);
    assert!(report.json["requests_by_kind"]["greedy"].as_u64().unwrap_or(0) > 0);
    // 4 windows x 3 policies, each window exactly 96 distinct-from-the-others ids
    assert_eq!(report.greedy_references.len(), 12);
    let mut windows: Vec<&Vec<u32>> = Vec::new();
    for r in &report.greedy_references {
        let Prompt::Ids { ids, .. } = &r.prompt else { panic!("a text prompt: {:?}", r.prompt) };
        assert_eq!(ids.len(), 96);
        if !windows.contains(&ids) {
            windows.push(ids);
        }
    }
    assert_eq!(windows.len(), 4);
    check_references(&report.greedy_references);

    let refused = |change: &dyn Fn(&mut SoakConfig)| {
        let mut c = cfg.clone();
        change(&mut c);
        soak::run(&c).expect_err("must be refused")
    };
    let e = refused(&|c| c.clients.prompt_tokens = Some(512));
    assert!(e.contains("does not fit the server's context of 512"), "{e}");
    let e = refused(&|c| c.clients.prompt_file = Some(text.with_file_name("no-such-file.txt")));
    assert!(e.contains("cannot read prompt file") && e.contains("no-such-file.txt"), "{e}");
    let e = refused(&|c| c.policies = vec!["full".into(), "h2o:heavy=8,nope=1".into()]);
    assert!(e.contains("refuses the KV policy `h2o:heavy=8,nope=1`") && e.contains("nope"), "{e}");
    let e = refused(&|c| c.policies.clear());
    assert!(e.contains("policy list is empty"), "{e}");
    assert_eq!(common::metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
}
