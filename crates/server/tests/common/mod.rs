//! Helpers shared by the server tests: the stories260K and SmolLM2 models
//! from `../shared`, a server on a free port, reading `/metrics` and SSE
//! streams, and requests sent straight to a scheduler.
#![allow(dead_code)] // each test crate uses its own subset

use kvslim_cache::PolicySpec;
use kvslim_engine::SamplingParams;
use kvslim_loadtest::http_client;
use kvslim_models::chat::ChatFormat;
use kvslim_models::{load_model, LoadedModel};
use kvslim_server::scheduler::{Event, Request};
use kvslim_server::{AppState, Limits, ServerConfig};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

#[path = "../../../../testing/shared_dir.rs"]
mod shared_dir;
pub use shared_dir::shared;

pub fn stories() -> LoadedModel {
    load_model(&shared().join("models/stories260K/stories260K.bin")).expect("load stories260K")
}

/// SmolLM2-135M-Instruct in Q4_1 (integer products: a verification pass
/// reads the weights once).
pub fn smollm2() -> LoadedModel {
    load_model(&shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")).expect("load SmolLM2")
}

/// Greedy sampling.
pub fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
}

/// A greedy request for a scheduler (no HTTP), reserving 1 MiB, and its
/// events.
pub fn scheduler_request(
    prompt: Vec<u32>,
    max_tokens: usize,
    policy: &PolicySpec,
) -> (Request, UnboundedReceiver<Event>) {
    let (tx, rx) = unbounded_channel();
    let req = Request {
        prompt,
        max_tokens,
        sampling: greedy(),
        policy: policy.clone(),
        stop: Vec::new(),
        kv_bytes: 1 << 20,
        beams: 1,
        length_penalty: 1.0,
        logprobs: None,
        prompt_logprobs: None,
        deadline: None,
        events: tx,
        context: None,
        compress: None,
    };
    (req, rx)
}

/// What a scheduler request streamed, once it is done: its text and the
/// ids of its reported log-probs.
pub fn streamed(mut rx: UnboundedReceiver<Event>) -> (String, Vec<u32>) {
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Text(t, lps) => {
                text.push_str(&t);
                ids.extend(lps.iter().map(|l| l.id));
            }
            Event::Done(_) => return (text, ids),
            other => panic!("unexpected event {other:?}"),
        }
    }
    panic!("the scheduler dropped the request")
}

/// Starts a stories260K server on a free loopback port; returns `host:port`.
pub fn start(limits: Limits) -> String {
    start_with_chat(limits, None)
}

/// [`start`] with a chat format in place of the model's own (stories260K
/// has no template: the plain fallback).
pub fn start_with_chat(limits: Limits, chat: Option<Result<ChatFormat, String>>) -> String {
    let m = stories();
    let config = ServerConfig { policy: PolicySpec::full(), limits, model_name: "stories260k".into() };
    let mut state = AppState::new(Arc::new(m.model), Arc::new(m.tokenizer.expect("tokenizer")), config);
    if let Some(c) = chat {
        state = state.with_chat(c);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || kvslim_server::serve_blocking(listener, state, 2));
    addr
}

/// A stories260K server whose state `setup` adjusts (limits, API key),
/// served with `grace` for draining: its address, its shutdown handle and
/// the serving thread (which returns once drained).
pub fn start_with(
    limits: Limits,
    grace: std::time::Duration,
    setup: impl FnOnce(AppState) -> AppState,
) -> (String, kvslim_server::Shutdown, std::thread::JoinHandle<std::io::Result<()>>) {
    let m = stories();
    let config = ServerConfig { policy: PolicySpec::full(), limits, model_name: "stories260k".into() };
    let state = setup(AppState::new(Arc::new(m.model), Arc::new(m.tokenizer.expect("tokenizer")), config));
    let shutdown = state.shutdown.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let opts = kvslim_server::ServeOptions { workers: 2, grace_period: grace, signals: false };
    let thread = std::thread::spawn(move || kvslim_server::serve_with(listener, state, &opts));
    (addr, shutdown, thread)
}

/// The value of a `/metrics` line.
pub fn metric(addr: &str, name: &str) -> f64 {
    let r = http_client::request(addr, "GET", "/metrics", None).unwrap();
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// Collects an SSE stream's `data:` payloads up to `[DONE]`.
pub fn stream(addr: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut s = http_client::open(addr, "POST", path, Some(&body.to_string()), Duration::from_secs(60)).unwrap();
    assert_eq!(s.status, 200);
    assert!(s
        .headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v.starts_with("text/event-stream")));
    let mut out = Vec::new();
    while let Some(d) = s.next_event().unwrap() {
        if d == "[DONE]" {
            return out;
        }
        out.push(serde_json::from_str(&d).unwrap());
    }
    panic!("stream ended without [DONE]");
}
