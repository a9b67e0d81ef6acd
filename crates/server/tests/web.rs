//! The web page's side of the server: `/` and its files (served without
//! the API key), `POST /v1/kv/inspect` (shapes, the trace replaying to the
//! kept sets, every limit), `POST /v1/kv/policy`, and the chat usage's KV
//! fields the page shows. `crates/cli/tests/kv_inspect.rs` checks the kept
//! sets against `kvslim perplexity --kept-out`.

mod common;

use common::{metric, start_with, stories};
use kvslim_engine::{perplexity, PerplexityOptions};
use kvslim_loadtest::http_client::{request, request_with, Response};
use kvslim_server::{HttpLimits, Limits};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const TEXT: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big red ball under a tree. She ran to get it, but a small dog got there first. The dog wagged its tail and Lily laughed.";

fn limits() -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 4, queue_limit: 8, kv_page_size: 16, prefix_cache: 0, ..Limits::default() }
}

fn post(addr: &str, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, Some(&body.to_string())).unwrap()
}

fn error_code(r: &Response) -> (u16, Value, Value) {
    let v = r.json();
    (r.status, v["error"]["param"].clone(), v["error"]["code"].clone())
}

#[test]
fn page_is_served_without_the_key_and_the_api_needs_it() {
    let key = "sk-web-test";
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_api_key(Some(key.into())));
    let page = request(&addr, "GET", "/", None).unwrap();
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(page.text().contains("/web/app.js"));
    assert!(page.header("content-security-policy").unwrap().contains("default-src 'self'"));
    for (path, ct) in [("/web/app.js", "text/javascript"), ("/web/app.css", "text/css")] {
        let r = request(&addr, "GET", path, None).unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").unwrap().starts_with(ct), "{path}");
        assert!(r.body.len() > 1000, "{path}");
    }
    // only the page's own files are public
    assert_eq!(request(&addr, "GET", "/web/secrets.json", None).unwrap().status, 401);
    let body = json!({"prompt": TEXT, "kv_policy": "h2o:heavy=8,recent=8"}).to_string();
    let r = request(&addr, "POST", "/v1/kv/inspect", Some(&body)).unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    let auth = format!("Bearer {key}");
    let r = request_with(&addr, "POST", "/v1/kv/inspect", Some(&body), &[("Authorization", &auth)]).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request_with(&addr, "POST", "/v1/kv/policy", Some(r#"{"kv_policy":"full"}"#), &[("Authorization", &auth)])
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A per-(layer, KV head) field of an inspect answer (`{"layers": [{"kv_heads":
/// [...]}]}`) as nested vectors.
fn per_head<T: serde::de::DeserializeOwned>(field: &Value) -> Vec<Vec<T>> {
    let layers = field["layers"].as_array().unwrap();
    layers.iter().map(|l| serde_json::from_value(l["kv_heads"].clone()).unwrap()).collect()
}

/// The answer's shapes; `kept` and `scores` equal the engine's perplexity
/// run on the same ids; the trace, replayed, gives exactly the kept sets.
#[test]
fn inspect_matches_the_engine_and_its_trace_replays_to_the_kept_sets() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s);
    let m = stories();
    let spec = "h2o:heavy=8,recent=8";
    for prefill in [0usize, 20] {
        let r = post(
            &addr,
            "/v1/kv/inspect",
            &json!({"prompt": TEXT, "kv_policy": spec, "prefill": prefill, "trace": true, "retained_mass": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let ids: Vec<u32> = v["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, m.tokenizer.as_ref().unwrap().encode(TEXT).unwrap(), "the tokenizer's ids, BOS included");
        let n = ids.len();
        assert_eq!(v["tokens"].as_array().unwrap().len(), n);
        assert_eq!(v["fed"], n - 1);
        let spec_p = kvslim_cache::PolicySpec::parse_and_load(spec).unwrap();
        let want =
            perplexity(&m.model, &ids, &PerplexityOptions { prefill, ..PerplexityOptions::new(spec_p) }, |_, _| {})
                .unwrap();
        let kept: Vec<Vec<Vec<u32>>> = per_head(&v["kept"]);
        assert_eq!(kept, want.kept, "prefill {prefill}");
        assert_eq!(per_head::<Vec<f32>>(&v["scores"]), want.kept_scores);
        assert_eq!(v["kv_bytes"], want.kv_bytes_allocated);
        assert_eq!(v["budget_slots"], 16);
        assert!(v["kv_bytes"].as_u64().unwrap() < v["kv_bytes_full"].as_u64().unwrap());
        let mass = v["retained_mass"]["per_layer"].as_array().unwrap();
        assert_eq!(mass.len(), 5);
        assert!(mass.iter().all(|x| (0.0..=1.0).contains(&x.as_f64().unwrap())));
        // replay: what the prefill chunk kept (the same run cut after it),
        // then every later position less the traced victims
        let trace = v["trace"].as_array().unwrap();
        assert!(!trace.is_empty());
        let start: Option<Vec<Vec<Vec<u32>>>> = (prefill > 1).then(|| {
            let cut = &ids[..=prefill];
            let spec_p = kvslim_cache::PolicySpec::parse_and_load(spec).unwrap();
            let o = PerplexityOptions { prefill, ..PerplexityOptions::new(spec_p) };
            let k = perplexity(&m.model, cut, &o, |_, _| {}).unwrap().kept;
            assert_eq!(k, per_head::<Vec<u32>>(&v["prefill_kept"]));
            k
        });
        assert_eq!(start.is_none(), v["prefill_kept"].is_null());
        for (l, layer) in kept.iter().enumerate() {
            for (h, got) in layer.iter().enumerate() {
                let victims: BTreeSet<u32> = trace
                    .iter()
                    .filter(|e| e[1] == l && e[2] == h)
                    .map(|e| {
                        let step = e[0].as_u64().unwrap() as usize;
                        assert!(step <= n - 2 && step >= prefill, "steps are decode positions: {step}");
                        e[3].as_u64().unwrap() as u32
                    })
                    .collect();
                let first = start.as_ref().map_or(vec![], |s| s[l][h].clone());
                let from = if start.is_some() { prefill as u32 } else { 0 };
                let replayed: Vec<u32> =
                    first.into_iter().chain(from..(n - 1) as u32).filter(|p| !victims.contains(p)).collect();
                assert_eq!(&replayed, got, "layer {l} head {h} prefill {prefill}");
            }
        }
    }
    // `full` keeps everything fed and costs exactly the full cache
    let v = post(&addr, "/v1/kv/inspect", &json!({"prompt": TEXT, "kv_policy": "full"})).json();
    let n = v["token_ids"].as_array().unwrap().len();
    assert_eq!(v["kv_bytes"], v["kv_bytes_full"]);
    assert_eq!(v["kept"]["layers"][4]["kv_heads"][3].as_array().unwrap().len(), n - 1);
    assert!(v["trace"].is_null() && v["retained_mass"].is_null());
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0, "the reservation is given back");
}

/// A conversation is inspected as the chat endpoint would prompt the model.
#[test]
fn inspect_takes_chat_messages_as_the_chat_endpoint_renders_them() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s);
    let messages = json!([{"role": "user", "content": TEXT}, {"role": "assistant", "content": "Lily was happy."}, {"role": "user", "content": "And then?"}]);
    let v = post(&addr, "/v1/kv/inspect", &json!({"messages": messages, "kv_policy": "h2o:heavy=8,recent=8"})).json();
    let chat = post(&addr, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 1})).json();
    let ids: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
    assert_eq!(ids.len() as u64, chat["usage"]["prompt_tokens"].as_u64().unwrap(), "{v}");
    let plain = post(&addr, "/v1/kv/inspect", &json!({"prompt": TEXT})).json();
    assert!(ids.len() > plain["token_ids"].as_array().unwrap().len());
    let m = stories();
    let spec = kvslim_cache::PolicySpec::parse_and_load("h2o:heavy=8,recent=8").unwrap();
    let want = perplexity(&m.model, &ids, &PerplexityOptions::new(spec), |_, _| {}).unwrap();
    assert_eq!(per_head::<Vec<u32>>(&v["kept"]), want.kept);
    let both = post(&addr, "/v1/kv/inspect", &json!({"prompt": TEXT, "messages": messages}));
    assert_eq!(error_code(&both).0, 400);
    assert_eq!(error_code(&post(&addr, "/v1/kv/inspect", &json!({"messages": []}))).1, "messages");
}

#[test]
fn inspect_and_policy_check_refuse_bad_requests_clearly() {
    let small = Limits { kv_memory: 40_000, ..limits() };
    let (addr, _, _) = start_with(small, Duration::from_secs(5), |s| s);
    let inspect = |b: Value| error_code(&post(&addr, "/v1/kv/inspect", &b));
    let (s, p, _) = inspect(json!({"prompt": TEXT, "kv_policy": "h2o:heavy=oops"}));
    assert_eq!((s, p), (400, json!("kv_policy")));
    assert_eq!(inspect(json!({"kv_policy": "full"})).1, "prompt");
    assert_eq!(inspect(json!({"prompt": ""})).1, "prompt");
    assert_eq!(inspect(json!({"prompt": TEXT, "prefill": 100000})).1, "prefill");
    assert_eq!(inspect(json!({"prompt": TEXT, "trace": "yes"})).0, 400);
    assert_eq!(inspect(json!({"prompt": TEXT, "tracee": true})).0, 400, "unknown fields are refused");
    let long = "Once upon a time there was a dog. ".repeat(80);
    assert_eq!(inspect(json!({"prompt": long, "kv_policy": "h2o:heavy=8,recent=8"})).2, "context_length_exceeded");
    // the full cache of the text does not fit a 40 kB pool; H2O's 17 slots do
    assert_eq!(inspect(json!({"prompt": TEXT, "kv_policy": "full"})).2, "kv_memory_exceeded");
    assert_eq!(
        post(&addr, "/v1/kv/inspect", &json!({"prompt": TEXT, "kv_policy": "h2o:heavy=8,recent=8"})).status,
        200
    );
    assert_eq!(
        inspect(json!({"prompt": TEXT, "kv_policy": "h2o:heavy=8,recent=8", "retained_mass": true})).2,
        "kv_memory_exceeded"
    );
    // the policy check answers what a completion with that spec would get
    let ok = post(&addr, "/v1/kv/policy", &json!({"kv_policy": "h2o:heavy=8,recent=8"}));
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["budget_slots"], 16);
    let bad = post(&addr, "/v1/kv/policy", &json!({"kv_policy": "h2o:heavy=oops"}));
    let completion = post(&addr, "/v1/completions", &json!({"prompt": "Once", "kv_policy": "h2o:heavy=oops"}));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json(), completion.json());
}

#[test]
fn inspect_stops_at_the_request_timeout_and_frees_its_kv() {
    let http = HttpLimits { request_timeout: Some(Duration::from_millis(1)), ..HttpLimits::default() };
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(http));
    let r = post(&addr, "/v1/kv/inspect", &json!({"prompt": TEXT.repeat(3), "kv_policy": "h2o:heavy=8,recent=8"}));
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "request_timeout");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
}

/// A reply's usage says what its cache held and what the full cache would.
#[test]
fn usage_reports_final_and_full_kv_bytes() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s);
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "kv_policy": "h2o:heavy=8,recent=8"});
    let v = post(&addr, "/v1/completions", &body).json();
    let u = &v["usage"];
    // the last token is fed only when EOS followed it
    let last_unfed = u64::from(v["choices"][0]["finish_reason"] == "length");
    let fed = u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap() - last_unfed;
    // 5 layers × 4 KV heads × (K + V) × 8 dims × 4 bytes per token
    assert_eq!(u["kv_bytes_full"].as_u64().unwrap(), 5 * 4 * 2 * 8 * 4 * fed, "{u}");
    assert_eq!(u["kv_bytes_final"].as_u64().unwrap(), 5 * 4 * 2 * 8 * 4 * 17, "{u}");
}
