//! The server over real HTTP on a loopback port (stories260K): completions
//! and chat, streaming and not, per-request policies against solo runs,
//! and the fault cases (each its own test).

use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions, SamplingParams};
use kvslim_loadtest::http_client::{self, Response};
use kvslim_models::LoadedModel;
use kvslim_server::Limits;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
mod common;

use common::{metric, start, stories, stream};

fn default_limits() -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 16, queue_limit: 64, ..Limits::default() }
}

fn post(addr: &str, path: &str, body: &Value) -> Response {
    http_client::request(addr, "POST", path, Some(&body.to_string())).unwrap()
}

fn solo_text(m: &LoadedModel, prompt: &str, policy: &str, max_tokens: usize) -> String {
    let tok = m.tokenizer.as_ref().unwrap();
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        policy: PolicySpec::parse(policy).unwrap(),
        eos: tok.eos.clone(),
    };
    let g = generate(&m.model, &tok.encode(prompt).unwrap(), &opts, |_| true).unwrap();
    tok.decode(&g.token_ids).unwrap()
}

fn assert_error(r: &Response, status: u16, needle: &str) {
    assert_eq!(r.status, status, "body: {}", r.text());
    let v = r.json();
    let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("no OpenAI error shape: {}", r.text()));
    assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
    assert!(v["error"]["type"].is_string());
}

fn still_serves(addr: &str) {
    let r = post(addr, "/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 5);
}

#[test]
fn completion_streaming_and_not_match_solo() {
    let addr = start(default_limits());
    let m = stories();
    let want = solo_text(&m, "Once upon a time", "full", 40);
    let body = json!({"model": "x", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "some_unknown_field": [1, 2]});
    let r = post(&addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 5);
    assert_eq!(u["completion_tokens"], 40);
    assert_eq!(u["total_tokens"], 45);
    // full policy, paged (default page 16): ⌈45 / 16⌉ = 3 pages × 2 (K, V) ×
    // 5 layers × 4 KV heads × 512 bytes (16 rows of 8 f32)
    assert_eq!(u["kv_bytes_allocated"], 3 * 2 * 5 * 4 * 512);
    assert_eq!(u["prompt_tokens_reused"], 0);

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&addr, "/v1/completions", &sb);
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, want);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["completion_tokens"], 40);
    // the same prompt again: forked from the prefix cache
    assert_eq!(last["usage"]["prompt_tokens_reused"], 5);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));

    // stop strings cut the text (the stop string itself is not returned)
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": ["girl"]}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &want[..want.find("girl").unwrap()]);

    // GET endpoints
    let r = http_client::request(&addr, "GET", "/v1/models", None).unwrap();
    assert_eq!(r.json()["data"][0]["id"], "stories260k");
    assert_eq!(http_client::request(&addr, "GET", "/health", None).unwrap().status, 200);
    let metrics = http_client::request(&addr, "GET", "/metrics", None).unwrap().text();
    for name in [
        "kvslim_queue_length",
        "kvslim_running_requests",
        "kvslim_generated_tokens_total",
        "kvslim_tokens_per_second",
        "kvslim_kv_bytes_in_use",
        "kvslim_evicted_slots_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[test]
fn chat_streaming_and_not() {
    let addr = start(default_limits());
    let body = json!({"messages": [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": [{"type": "text", "text": "Once upon a time"}]}], "max_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 3});
    let r = post(&addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert!(v["usage"]["kv_bytes_allocated"].as_u64().unwrap() > 0);
    // same seed, same text, streamed
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&addr, "/v1/chat/completions", &sb);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
}

#[test]
fn eight_concurrent_requests_with_different_policies_equal_solo() {
    let addr = start(Limits { kv_memory: 64 << 20, max_batch: 8, queue_limit: 64, ..Limits::default() });
    let m = stories();
    let policies = ["full", "window:recent=16", "h2o:heavy=8,recent=8", "sink:sink=4,recent=12"];
    let prompts = [
        "Once upon a time",
        "Lily and Ben",
        "The dog was",
        "One day, a bird",
        "Tom had a ball",
        "Mom said",
        "The sun",
        "A girl",
    ];
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let addr = addr.clone();
            let (prompt, policy) = (prompts[i], policies[i % 4]);
            std::thread::spawn(move || {
                let body = json!({"prompt": prompt, "max_tokens": 48, "temperature": 0, "kv_policy": policy, "stream": i % 2 == 1});
                if i % 2 == 1 {
                    stream(&addr, "/v1/completions", &body)
                        .iter()
                        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
                        .collect::<String>()
                } else {
                    let r = post(&addr, "/v1/completions", &body);
                    assert_eq!(r.status, 200, "{}", r.text());
                    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                }
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        assert_eq!(got, solo_text(&m, prompts[i], policies[i % 4], 48), "request {i} ({})", policies[i % 4]);
    }
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
}

#[test]
fn malformed_json_is_400() {
    let addr = start(default_limits());
    let r = http_client::request(&addr, "POST", "/v1/completions", Some("{\"prompt\": \"hi\", ")).unwrap();
    assert_error(&r, 400, "invalid JSON");
    let r = http_client::request(&addr, "POST", "/v1/chat/completions", Some("[1, 2]")).unwrap();
    assert_error(&r, 400, "JSON object");
    let r = post(&addr, "/v1/completions", &json!({"prompt": 5}));
    assert_error(&r, 400, "invalid request");
    still_serves(&addr);
}

/// The score families and budget allocators (`alloc=`) reach the server
/// through `kv_policy`: a request under each gets what an in-process
/// generation under the same spec gets (the prompt is longer than the
/// budget, so prefill and decode evict, and ada splits each layer in
/// prefill), and bad specs are 400s naming the parameter.
#[test]
fn score_families_and_allocators_work_through_kv_policy() {
    let addr = start(default_limits());
    let m = stories();
    let prompt =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.";
    for policy in [
        "h2o:heavy=8,recent=8,score=tova",
        "h2o:heavy=8,recent=8,sink=2,score=decay:0.9",
        "h2o:heavy=8,recent=8,score=norm",
        "h2o:heavy=8,recent=8,score=vnorm,page=16",
        "heavy:heavy=16,sink=4,score=persist:8",
        "h2o:heavy=8,recent=8,alloc=pyramid",
        "h2o:heavy=8,recent=8,alloc=ada:0.2",
        "h2o:heavy=8,recent=8,alloc=pyramid:0.5/ada,page=16",
    ] {
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "kv_policy": policy});
        let r = post(&addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{policy}: {}", r.text());
        assert_eq!(r.json()["choices"][0]["text"].as_str().unwrap(), solo_text(&m, prompt, policy, 24), "{policy}");
    }
    for (policy, needle) in [
        ("h2o:heavy=oops", "h2o:heavy=oops"),
        ("h2o:heavy=8,recent=8,score=decay:-0.5", "decay: `-0.5`"),
        ("h2o:heavy=8,recent=8,score=fancy", "unknown score family `fancy`"),
        ("h2o:heavy=8,recent=8,alloc=pyramid:0", "alloc: pyramid ratio `0` must be in (0, 1]"),
        ("h2o:heavy=8,recent=8,alloc=fancy", "alloc: unknown allocator `fancy`"),
        ("h2o:heavy=8,recent=8,alloc=ada:1.5", "alloc: ada floor `1.5`"),
    ] {
        let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "kv_policy": policy}));
        assert_error(&r, 400, needle);
        assert_eq!(r.json()["error"]["param"], "kv_policy");
    }
    still_serves(&addr);
}

/// A `kvslim tune` result reaches the server as `kv_policy:
/// "tuned:file=PATH"`: the request runs the spec the file records, and a
/// missing or foreign file is a 400 naming the path.
#[test]
fn tuned_files_work_through_kv_policy() {
    let addr = start(default_limits());
    let m = stories();
    let dir = std::env::temp_dir();
    let tuned = dir.join(format!("kvslim-server-tuned-{}.json", std::process::id()));
    let spec = "h2o:heavy=6,recent=10,sink=2,score=decay:0.9";
    std::fs::write(&tuned, json!({"kind": "kvslim-tune", "spec": spec, "kl": 0.01}).to_string()).unwrap();
    let prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
    let policy = format!("tuned:file={}", tuned.display());
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "kv_policy": policy}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["text"].as_str().unwrap(), solo_text(&m, prompt, spec, 24));
    let foreign = dir.join(format!("kvslim-server-not-tuned-{}.json", std::process::id()));
    std::fs::write(&foreign, r#"{"layers": []}"#).unwrap();
    for (path, needle) in
        [("/no/such/tuned.json".to_string(), "cannot read"), (foreign.display().to_string(), "kvslim-tune")]
    {
        let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "kv_policy": format!("tuned:file={path}")}));
        assert_error(&r, 400, &path);
        assert_error(&r, 400, needle);
    }
    std::fs::remove_file(&tuned).unwrap();
    std::fs::remove_file(&foreign).unwrap();
    still_serves(&addr);
}

#[test]
fn negative_max_tokens_is_400() {
    let addr = start(default_limits());
    let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": -3}));
    assert_error(&r, 400, "max_tokens");
    let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 0}));
    assert_error(&r, 400, "max_tokens");
    still_serves(&addr);
}

#[test]
fn huge_max_tokens_is_clipped_to_the_context() {
    let addr = start(default_limits());
    let r = post(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 1_000_000_000_000i64, "temperature": 0, "kv_policy": "window:recent=32"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens"], 5);
    assert!(u["completion_tokens"].as_u64().unwrap() <= 512 - 5);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
}

#[test]
fn request_bigger_than_the_kv_pool_is_400() {
    // the pool holds one full-context sequence (paged: 32 pages × 2 × 20 ×
    // 512 = 655,360 bytes) but not two
    let addr = start(Limits { kv_memory: 800_000, max_batch: 4, queue_limit: 8, ..Limits::default() });
    let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 500, "kv_policy": "full"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let addr = start(Limits { kv_memory: 100_000, max_batch: 4, queue_limit: 8, ..Limits::default() });
    let r = post(&addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 500}));
    assert_error(&r, 400, "KV pool");
    let ask =
        |policy: &str| post(&addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 500, "kv_policy": policy}));
    // a bounded policy with page eviction fits (3 pages per head: 61,440 bytes)
    let r = ask("h2o:heavy=8,recent=8,page_score=sum");
    assert_eq!(r.status, 200, "{}", r.text());
    // token eviction in pages is bounded by the page cap: 3 pages per head
    // for 17 slots of 16-token pages (fits), 7 for 65 slots (does not)
    let r = ask("h2o:heavy=8,recent=8,page=16");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = ask("h2o:heavy=32,recent=32,page=16");
    assert_error(&r, 400, "KV pool");
    // by default it stays on fixed slots and holds its 17 slots only
    let r = ask("h2o:heavy=8,recent=8");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["kv_bytes_allocated"], 17 * 5 * 4 * 72);
    // an int8 cache reserves int8 rows (codes + one f32 scale per 32 values),
    // within 1.5× of what the sequence really allocates at its peak
    let q8 = "h2o:heavy=8,recent=8,kv_dtype=q8";
    let r = ask(q8);
    assert_eq!(r.status, 200, "{}", r.text());
    let reserved = r.json()["usage"]["kv_bytes_allocated"].as_u64().unwrap() as usize;
    let m = stories();
    let spec = PolicySpec::parse(q8).unwrap();
    let mut s = kvslim_engine::Session::new(&m.model, &spec, 503, 3).unwrap();
    let mut peak = 0;
    for t in 0..60u32 {
        s.feed(&[1 + t % 200], kvslim_models::Logits::Last).unwrap();
        let b = s.kv_bytes();
        peak = peak.max(b.kv + b.metadata);
    }
    assert!(reserved >= peak && reserved as f64 <= 1.5 * peak as f64, "reserved {reserved}, peak {peak}");
    assert!(reserved * 2 < 17 * 5 * 4 * 72, "q8 reserves less than half of f32: {reserved}");
}

#[test]
fn prompt_beyond_context_is_400() {
    let addr = start(default_limits());
    let ids: Vec<u32> = (0..600).map(|i| 300 + (i % 100)).collect();
    let r = post(&addr, "/v1/completions", &json!({"prompt": ids, "max_tokens": 4}));
    assert_error(&r, 400, "context");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let text = "Once upon a time there was a big dog. ".repeat(60);
    let r = post(&addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": text}]}));
    assert_error(&r, 400, "context");
    still_serves(&addr);
}

#[test]
fn client_disconnect_mid_stream_frees_kv() {
    let addr = start(default_limits());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0.8, "stream": true});
    let mut s =
        http_client::open(&addr, "POST", "/v1/completions", Some(&body.to_string()), Duration::from_secs(30)).unwrap();
    assert_eq!(s.status, 200);
    for _ in 0..3 {
        assert!(s.next_event().unwrap().is_some());
    }
    drop(s);
    let t = Instant::now();
    loop {
        let (kv, running) = (metric(&addr, "kvslim_kv_bytes_in_use"), metric(&addr, "kvslim_running_requests"));
        if kv == 0.0 && running == 0.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "KV not freed after the client left: {kv} bytes, {running} running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric(&addr, "kvslim_generated_tokens_total") < 500.0, "generation stopped early");
    assert_eq!(metric(&addr, "kvslim_requests_cancelled_total"), 1.0);
    still_serves(&addr);
}

#[test]
fn burst_beyond_queue_limit_gets_429_and_server_keeps_serving() {
    let addr = start(Limits { kv_memory: 64 << 20, max_batch: 1, queue_limit: 2, ..Limits::default() });
    let handles: Vec<_> = (0..12)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                post(
                    &addr,
                    "/v1/completions",
                    &json!({"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0.8}),
                )
            })
        })
        .collect();
    let responses: Vec<Response> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = responses.iter().filter(|r| r.status == 200).count();
    let limited: Vec<&Response> = responses.iter().filter(|r| r.status == 429).collect();
    assert_eq!(ok + limited.len(), 12, "only 200 or 429: {:?}", responses.iter().map(|r| r.status).collect::<Vec<_>>());
    assert!(!limited.is_empty(), "a burst of 12 against a queue of 2 must be refused in part");
    assert!(ok >= 1);
    assert_error(limited[0], 429, "queue");
    assert_eq!(limited[0].json()["error"]["code"], "queue_full");
    still_serves(&addr);
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
    assert_eq!(metric(&addr, "kvslim_queue_length"), 0.0);
}

#[test]
fn beam_search_extension_equals_engine_beam_search() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let prompt = "Once upon a time";
    let opts = kvslim_engine::BeamOptions {
        beams: 3,
        max_tokens: 20,
        length_penalty: 1.0,
        early_stopping: true,
        policy: PolicySpec::parse("h2o:heavy=8,recent=8").unwrap(),
        eos: tok.eos.clone(),
        keep_caches: false,
    };
    let best = kvslim_engine::beam_search(&m.model, &tok.encode(prompt).unwrap(), &opts).unwrap().remove(0);
    let want = tok.decode(&best.token_ids).unwrap();
    let addr = start(default_limits());
    let body = json!({"prompt": prompt, "max_tokens": 20, "beams": 3, "kv_policy": "h2o:heavy=8,recent=8"});
    let r = post(&addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want);
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap() as usize, best.token_ids.len());
    // streaming beams and out-of-range beam counts are refused; the server keeps serving
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    assert_error(&post(&addr, "/v1/completions", &streamed), 400, "not streamed");
    assert_error(&post(&addr, "/v1/completions", &json!({"prompt": prompt, "beams": 0})), 400, "beams");
    still_serves(&addr);
}
