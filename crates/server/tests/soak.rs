//! The short soak (what CI runs): 8 clients for 20 s (`KVSLIM_SOAK_SECONDS`
//! overrides) against an in-process stories260K server with an API key and
//! short timeouts, mixing greedy, sampled, cancelled and beam requests with
//! malformed, oversized, unknown-policy, beyond-context and stalled ones.
//! Every request must get its expected answer (greedy and beam text equal
//! to solo runs), the KV must come back to 0, and memory stay bounded.

use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions, SamplingParams};
use kvslim_loadtest::soak::{self, SoakConfig};
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
    let cfg = SoakConfig {
        addr,
        clients: 8,
        duration: Duration::from_secs(secs),
        api_key: Some(key.into()),
        // in-process: the test's own peak includes the server's
        server_pid: Some(std::process::id()),
        oversize_bytes: 1 << 20,
        stalled: true,
        max_tokens: 48,
        seed: 17,
    };
    let report = soak::run(&cfg).expect("solo references");
    println!("{}", serde_json::to_string_pretty(&report.json).unwrap());
    assert!(report.failures.is_empty(), "unexpected outcomes: {:#?}", report.failures);
    assert!(report.passed(), "{}", report.json);
    let kinds = report.json["requests_by_kind"].as_object().unwrap();
    for k in ["greedy", "sampled", "cancelled", "malformed", "oversized", "unknown_policy", "beyond_context"] {
        assert!(kinds.get(k).and_then(|v| v.as_u64()).unwrap_or(0) > 0, "no {k} request in {kinds:?}");
    }
    // the solo references are what the engine gives without the server
    let m = common::stories();
    let tok = m.tokenizer.as_ref().unwrap();
    for (prompt, policy, max_tokens, text) in &report.greedy_references {
        let opts = GenerateOptions {
            max_tokens: *max_tokens,
            sampling: SamplingParams::default(),
            policy: PolicySpec::parse(policy).unwrap(),
            eos: tok.eos.clone(),
        };
        let g = generate(&m.model, &tok.encode(prompt).unwrap(), &opts, |_| true).unwrap();
        assert_eq!(&tok.decode(&g.token_ids).unwrap(), text, "{prompt:?} under {policy}");
    }
    // stories260K weighs ~1 MB and its KV pool is capped at 64 MiB
    let rss = report.json["peak_rss_bytes"].as_u64().unwrap_or(0);
    assert!(rss < 1 << 30, "peak RSS {rss} bytes");
}
