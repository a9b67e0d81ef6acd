//! Paged KV in the server (stories260K: 5 layers, 4 KV heads, head_dim 8,
//! page = 16 tokens = 512 bytes in f32): copy-on-write prefix sharing
//! between requests, prefix reuse only where it is exact, storage keys in
//! `kv_policy`, and admission by worst-case pages.

use kvslim_cache::{KvDtype, PagePool};
use kvslim_loadtest::http_client::{self, Response};
use kvslim_server::Limits;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
mod common;

use common::{metric, stories};

const LAYERS: usize = 5;
const KV_HEADS: usize = 4;

/// A stories260K server (its shape is what the page arithmetic below assumes).
fn start(limits: Limits) -> String {
    let c = stories().model.config;
    assert_eq!((c.n_layers, c.n_kv_heads, c.head_dim), (LAYERS, KV_HEADS, 8));
    common::start(limits)
}

fn limits(kv_page_size: usize, prefix_cache: usize) -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 8, queue_limit: 64, kv_page_size, prefix_cache, ..Limits::default() }
}

fn post(addr: &str, body: &Value) -> Response {
    http_client::request(addr, "POST", "/v1/completions", Some(&body.to_string())).unwrap()
}

/// A prompt of `n` token ids (BOS first).
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    std::iter::once(1).chain((1..n as u32).map(|i| 300 + (i * 7 + salt) % 200)).collect()
}

/// (text, completion_tokens, prompt_tokens_reused) of a completion.
fn complete(addr: &str, body: Value) -> (String, u64, u64) {
    let r = post(addr, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let u = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        u["completion_tokens"].as_u64().unwrap(),
        u["prompt_tokens_reused"].as_u64().unwrap(),
    )
}

fn body(p: &[u32], max_tokens: usize, temperature: f32, seed: u64, policy: &str) -> Value {
    json!({"prompt": p, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "kv_policy": policy})
}

/// Each request alone on a fresh server without the prefix cache.
fn alone(b: &Value) -> String {
    let addr = start(limits(16, 0));
    let (text, _, reused) = complete(&addr, b.clone());
    assert_eq!(reused, 0);
    assert_eq!(metric(&addr, "kvslim_kv_cow_copies_total"), 0.0, "nothing is shared without the prefix cache");
    text
}

#[test]
fn same_prompt_then_diverging_equals_alone_and_copies_the_tail_page_once_per_request() {
    let addr = start(limits(16, 16));
    // 21 tokens: the tail page (tokens 16..21) is shared and copied once per
    // request that writes into it, K and V, in every layer and KV head
    let per_request = 2 * LAYERS * KV_HEADS;
    for (n, expect_cow) in [(21usize, per_request), (32, 0)] {
        let p = prompt(n, n as u32);
        let cow0 = metric(&addr, "kvslim_kv_cow_copies_total");
        let hits0 = metric(&addr, "kvslim_prefix_hits_total");
        let a = body(&p, 24, 0.9, 1, "full");
        let b = body(&p, 30, 0.9, 2, "full");
        let (ta, _, ra) = complete(&addr, a.clone());
        let (tb, _, rb) = complete(&addr, b.clone());
        assert_eq!((ra, rb), (0, n as u64), "the second request forks the first one's prompt");
        assert_ne!(ta, tb, "different seeds should diverge");
        assert_eq!(ta, alone(&a), "first request (n = {n}) differs from its solo run");
        assert_eq!(tb, alone(&b), "forked request (n = {n}) differs from its solo run");
        assert_eq!(metric(&addr, "kvslim_prefix_hits_total") - hits0, 1.0);
        let cow = metric(&addr, "kvslim_kv_cow_copies_total") - cow0;
        assert_eq!(cow, (2 * expect_cow) as f64, "copy-on-write copies for a {n}-token prompt, two requests");
    }
    assert_eq!(metric(&addr, "kvslim_prefix_tokens_reused_total"), 53.0);
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
    // the prefix cache keeps its entries' pages (and nothing else)
    let pages = metric(&addr, "kvslim_kv_pages_in_use");
    assert_eq!(pages, (2 * LAYERS * KV_HEADS * (2 + 2)) as f64, "two entries of 2 pages, K and V, per head");
}

#[test]
fn concurrent_forks_equal_alone() {
    let addr = start(limits(16, 16));
    let p = prompt(21, 5);
    // prime the cache, then three forks decoding in one batch
    complete(&addr, body(&p, 2, 0.0, 0, "full"));
    let bodies: Vec<Value> = (0..3).map(|s| body(&p, 40, 0.8, 10 + s, "full")).collect();
    let handles: Vec<_> = bodies
        .iter()
        .cloned()
        .map(|b| {
            let addr = addr.clone();
            std::thread::spawn(move || complete(&addr, b))
        })
        .collect();
    let got: Vec<(String, u64, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (b, (text, _, reused)) in bodies.iter().zip(&got) {
        assert_eq!(*reused, 21);
        assert_eq!(text, &alone(b));
    }
}

/// Two prompts with a common start (a shared system prompt, say) then
/// different endings: under `full` the second forks the first's cache cut
/// back to the common prefix, and still produces what it produces alone.
#[test]
fn a_common_prefix_of_different_prompts_is_shared_under_full() {
    let addr = start(limits(16, 16));
    let system = prompt(21, 5);
    let with = |salt: u32, n: usize| {
        let mut p = system.clone();
        p.extend(prompt(n + 1, salt).into_iter().skip(1));
        p
    };
    let (a, b) = (with(1, 10), with(2, 12));
    assert_eq!(a.iter().zip(&b).take_while(|(x, y)| x == y).count(), 21, "prompts differ right after the prefix");
    complete(&addr, body(&a, 4, 0.0, 0, "full"));
    let bb = body(&b, 30, 0.0, 0, "full");
    let (text, _, reused) = complete(&addr, bb.clone());
    assert_eq!(reused, 21, "the common prefix is reused");
    assert_eq!(text, alone(&bb));
    // a prompt that is a strict prefix of a cached one: all but its last token reused
    let c = body(&a[..27], 20, 0.0, 0, "full");
    let (text, _, reused) = complete(&addr, c.clone());
    assert_eq!(reused, 26);
    assert_eq!(text, alone(&c));
    // less than a page in common is not worth a fork
    let (_, _, reused) = complete(&addr, body(&prompt(40, 77), 4, 0.0, 0, "full"));
    assert_eq!(reused, 0);
    // under h2o only identical prompts are reused
    complete(&addr, body(&a, 4, 0.0, 0, "h2o:heavy=8,recent=8,page=16"));
    let (_, _, reused) = complete(&addr, body(&b, 4, 0.0, 0, "h2o:heavy=8,recent=8,page=16"));
    assert_eq!(reused, 0);
}

#[test]
fn strict_prefix_is_reused_under_full_but_not_under_h2o() {
    let addr = start(limits(16, 16));
    let short = prompt(21, 3);
    let mut long = short.clone();
    long.extend(prompt(12, 9).into_iter().skip(1));
    // full: the longer prompt extends the cached one, same greedy tokens
    complete(&addr, body(&short, 4, 0.0, 0, "full"));
    let b = body(&long, 40, 0.0, 0, "full");
    let (text, n, reused) = complete(&addr, b.clone());
    assert_eq!(n, 40);
    assert_eq!(reused, 21);
    assert_eq!(text, alone(&b));
    assert_eq!(metric(&addr, "kvslim_prefix_hits_total"), 1.0);
    // h2o: a strict prefix is not reused (eviction saw a different prompt)
    let policy = "h2o:heavy=8,recent=8,page=16";
    complete(&addr, body(&short, 4, 0.0, 0, policy));
    let b = body(&long, 40, 0.0, 0, policy);
    let (text, _, reused) = complete(&addr, b.clone());
    assert_eq!(reused, 0);
    assert_eq!(metric(&addr, "kvslim_prefix_hits_total"), 1.0, "no hit for a strict prefix under h2o");
    let want = alone(&b);
    assert_eq!(text, want);
    // ... but the identical prompt is
    let (text, _, reused) = complete(&addr, b);
    assert_eq!(reused, long.len() as u64);
    assert_eq!(metric(&addr, "kvslim_prefix_hits_total"), 2.0);
    assert_eq!(text, want);
    // another policy string never matches
    let (_, _, reused) = complete(&addr, body(&long, 4, 0.0, 0, "h2o:heavy=8,recent=9,page=16"));
    assert_eq!(reused, 0);
}

#[test]
fn storage_keys_in_kv_policy() {
    let addr = start(limits(16, 16));
    for policy in [
        "h2o:heavy=8,recent=8,page=8,compact=16,kv_dtype=q8",
        "h2o:heavy=8,recent=8,page=8,page_score=max",
        "h2o:heavy=8,recent=8,page_score=topm:2",
        "window:recent=16,kv_dtype=f16",
        "full:page=4",
    ] {
        let (text, n, _) = complete(&addr, body(&prompt(30, 1), 20, 0.0, 0, policy));
        assert_eq!(n, 20, "{policy}");
        assert!(!text.is_empty(), "{policy}");
    }
    for (policy, needle) in [
        ("h2o:heavy=8,recent=8,page=0", "page"),
        ("h2o:heavy=8,recent=8,kv_dtype=q3", "kv_dtype"),
        ("h2o:heavy=8,recent=8,page=8,compact=4,page_score=sum", "choose one"),
    ] {
        let r = post(&addr, &body(&prompt(10, 1), 4, 0.0, 0, policy));
        assert_eq!(r.status, 400, "{policy}: {}", r.text());
        let v = r.json();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{policy}: {msg:?} should mention {needle:?}");
        assert_eq!(v["error"]["param"], "kv_policy");
    }
}

#[test]
fn paged_reservation_follows_the_worst_case_page_rule() {
    let page_bytes = PagePool::new(16, KvDtype::F32, 8).stats().page_bytes;
    assert_eq!(page_bytes, 512);
    let addr = start(limits(16, 0));
    // prompt 10 + 90 new = 100 tokens; h2o B + 1 = 17
    for (policy, pages) in [
        ("full", 7),                                  // ⌈100/16⌉
        ("h2o:heavy=8,recent=8,page_score=sum", 3),   // ⌈17/16⌉ + 1
        ("h2o:heavy=8,recent=8,compact=16", 3),       // min(cap 3, ⌈33/16⌉ + 1)
        ("h2o:heavy=8,recent=8,page=16", 3),          // page cap: m = ⌈17/16⌉ = 2, max(m + 1, ⌊3m/2⌋)
        ("h2o:heavy=2,recent=2,page=16", 2),          // page cap: m = 1, m + 1
        ("h2o:heavy=8,recent=8,page=4,compact=8", 7), // min(cap 7 (m = 5), ⌈25/4⌉ + 1), pages of 4
    ] {
        let r = post(&addr, &body(&prompt(10, 2), 90, 0.0, 0, policy));
        assert_eq!(r.status, 200, "{}", r.text());
        let page = if policy.contains("page=4") { 4 } else { 16 };
        let want = pages * 2 * LAYERS * KV_HEADS * PagePool::new(page, KvDtype::F32, 8).stats().page_bytes;
        assert_eq!(r.json()["usage"]["kv_bytes_allocated"], want, "{policy}");
    }
}

#[test]
fn paged_admission_by_kv_memory() {
    let per_page = 2 * LAYERS * KV_HEADS * 512; // 20,480 bytes
                                                // room for 4 pages per head: a page-evicting h2o request (3) fits, a
                                                // compacting one (3) fits, token eviction at 65 slots (page cap 7) does not
    let addr = start(Limits {
        kv_memory: 4 * per_page,
        max_batch: 4,
        queue_limit: 8,
        kv_page_size: 16,
        prefix_cache: 16,
        ..Limits::default()
    });
    let p = prompt(10, 4);
    for policy in ["h2o:heavy=8,recent=8,page_score=sum", "h2o:heavy=8,recent=8,compact=16"] {
        let (_, n, _) = complete(&addr, body(&p, 400, 0.0, 0, policy));
        assert_eq!(n, 400, "{policy}");
    }
    let r = post(&addr, &body(&p, 400, 0.0, 0, "h2o:heavy=32,recent=32,page=16"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "kv_memory_exceeded");

    // two page-evicting requests (3 pages each) do not fit 4 at once: the
    // second waits in the queue until the first leaves
    let a = json!({"prompt": p, "max_tokens": 450, "temperature": 0.8, "stream": true, "kv_policy": "h2o:heavy=8,recent=8,page_score=sum"});
    let mut s =
        http_client::open(&addr, "POST", "/v1/completions", Some(&a.to_string()), Duration::from_secs(30)).unwrap();
    assert_eq!(s.status, 200);
    s.next_event().unwrap().expect("first chunk");
    let addr2 = addr.clone();
    let second = std::thread::spawn(move || {
        complete(&addr2, body(&prompt(10, 4), 8, 0.0, 0, "h2o:heavy=8,recent=8,page_score=sum"))
    });
    let t0 = Instant::now();
    let mut queued = false;
    while t0.elapsed() < Duration::from_secs(10) {
        if metric(&addr, "kvslim_queue_length") == 1.0 && metric(&addr, "kvslim_running_requests") == 1.0 {
            queued = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(metric(&addr, "kvslim_kv_bytes_in_use") <= (4 * per_page) as f64);
    drop(s); // the first client leaves; its pages and reservation return
    let (_, n, _) = second.join().unwrap();
    assert_eq!(n, 8);
    assert!(queued, "the second request never waited in the queue");
}
