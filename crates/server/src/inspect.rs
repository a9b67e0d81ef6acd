//! `POST /v1/kv/inspect`: which positions a policy keeps for a text, per
//! layer and KV head, for the web page's KV inspector.
//!
//! The text runs through [`kvslim_engine::perplexity`], the code behind
//! `kvslim perplexity --kept-out/--trace-out`, so `kept` is exactly what
//! `kvslim perplexity --text FILE --policy SPEC [--prefill N] --kept-out K`
//! writes for the same text: the same tokenization (BOS as the tokenizer
//! says), teacher forcing, the first `prefill` tokens as one chunk and the
//! rest one decode step each, the last token not fed (it predicts nothing).
//!
//! Bounded like the generation endpoints: the body limit of the guard
//! layers, at most the model's context, the run's KV reserved from the
//! server's pool before it starts (400 when it could never fit, waiting
//! while the pool is busy), the request timeout (the run stops at its next
//! decode step; a prefill chunk runs whole), one run at a time, and a
//! client that leaves stops its run the same way.

use crate::error::{json_body, reply, required, ApiError};
use crate::request::{chat_prompt_ids, encode, parse_policy};
use crate::scheduler::{full_kv_bytes, kv_bytes_for};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use kvslim_cache::PolicySpec;
use kvslim_engine::perplexity::Stop;
use kvslim_engine::{perplexity, PerplexityOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The request body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InspectBody {
    prompt: Option<String>,
    /// Instead of `prompt`: chat messages, rendered and tokenized as
    /// `/v1/chat/completions` does (the KV a conversation's prompt takes).
    messages: Option<Value>,
    kv_policy: Option<String>,
    /// `kvslim perplexity --prefill N`: the first N tokens as one chunk.
    #[serde(default)]
    prefill: usize,
    /// Return every eviction with the step it happened at.
    #[serde(default)]
    trace: bool,
    /// Also run the full cache alongside for the retained attention mass
    /// per layer (`--compare-full`; twice the work).
    #[serde(default)]
    retained_mass: bool,
}

/// Sets its flag when dropped: the handler's future is dropped when the
/// client goes away, and the run sees the flag between tokens.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// Gives a KV reservation back to the pool when dropped.
struct Reserved {
    st: AppState,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.st.scheduler.metrics.kv_bytes_in_use.fetch_sub(self.bytes, Relaxed);
    }
}

fn server_error(status: StatusCode, message: String, code: Option<&'static str>) -> ApiError {
    ApiError { status, message, kind: "server_error", param: None, code }
}

/// A token as the strip shows it: its bytes as text (invalid UTF-8 of a
/// byte-fallback piece replaced), special tokens by their name.
fn token_text(st: &AppState, id: u32) -> String {
    match st.tokenizer.token_bytes(id) {
        Some(t) => String::from_utf8_lossy(&t.bytes).into_owned(),
        None => format!("<{id}>"),
    }
}

/// `POST /v1/kv/policy` body.
#[derive(Deserialize)]
struct PolicyBody {
    kv_policy: Option<String>,
}

/// `POST /v1/kv/policy`: checks a `kv_policy` exactly as a completion
/// request would (the web page shows the grammar's error as one types),
/// without running anything: `{"policy": canonical spec, "budget_slots"}`
/// for a 1000-token sequence, or the 400 a request with it would get.
pub async fn check_policy(State(st): State<AppState>, body: Bytes) -> Response {
    reply(json_body::<PolicyBody>(&body).and_then(|b| {
        let p = parse_policy(&st, Some(&required(b.kv_policy, "kv_policy")?))?;
        Ok(json!({"policy": p.to_string(), "budget_slots": p.budget(1000)}))
    }))
}

pub async fn inspect(State(st): State<AppState>, body: Bytes) -> Response {
    reply(run(st, &body).await)
}

async fn run(st: AppState, body: &[u8]) -> Result<Value, ApiError> {
    let arrived = Instant::now();
    let b: InspectBody = json_body(body)?;
    let ids = match (b.prompt.filter(|p| !p.is_empty()), &b.messages) {
        (Some(prompt), None) => encode(&st, &prompt)?,
        (None, Some(_)) => chat_prompt_ids(&st, body)?,
        (Some(_), Some(_)) => return Err(ApiError::bad("send `prompt` or `messages`, not both", Some("messages"))),
        (None, None) => {
            return Err(ApiError::bad("`prompt` (a non-empty string) or `messages` is required", Some("prompt")))
        }
    };
    let model = st.model.clone();
    let (n, ctx) = (ids.len(), model.config.context_len);
    if n < 2 {
        return Err(ApiError::bad(format!("the prompt has {n} token(s); inspecting needs at least 2"), Some("prompt")));
    }
    if n > ctx {
        return Err(ApiError::bad(
            format!("the prompt has {n} tokens but the model's context is {ctx} tokens; shorten it"),
            Some("prompt"),
        )
        .code("context_length_exceeded"));
    }
    if b.prefill > n {
        return Err(ApiError::bad(
            format!("prefill {} is longer than the prompt's {n} tokens", b.prefill),
            Some("prefill"),
        ));
    }
    // the grammar and page default of the other endpoints; no default page
    // for `full` (perplexity runs unpaged fixed slots unless `page=` says)
    let policy = parse_policy(&st, b.kv_policy.as_deref())?;
    let shape_err =
        |e: kvslim_cache::CacheError| ApiError::bad(format!("kv_policy `{policy}`: {e}"), Some("kv_policy"));
    let mut need = kv_bytes_for(&model, &policy, n, 0).map_err(shape_err)?;
    if b.retained_mass {
        need += kv_bytes_for(&model, &PolicySpec::full(), n, 0).map_err(shape_err)?;
    }
    let limit = st.scheduler.limits.kv_memory;
    if need > limit {
        return Err(ApiError::bad(
            format!("inspecting {n} tokens under `{policy}` needs {need} bytes of KV cache but the server's whole KV pool is {limit} bytes; shorten the text"),
            Some("prompt"),
        )
        .code("kv_memory_exceeded"));
    }
    let deadline = st.http.request_timeout.map(|d| arrived + d);
    let past = |what: &str| {
        let secs = st.http.request_timeout.map_or(0.0, |d| d.as_secs_f64());
        server_error(
            StatusCode::GATEWAY_TIMEOUT,
            format!("the request ran past the server's request timeout of {secs} s (--request-timeout) {what}"),
            Some("request_timeout"),
        )
    };
    // one run at a time (it takes every core), then room in the KV pool
    let permit = match deadline {
        None => st.inspect_slot.clone().acquire_owned().await,
        Some(d) => match tokio::time::timeout_at(d.into(), st.inspect_slot.clone().acquire_owned()).await {
            Ok(p) => p,
            Err(_) => return Err(past("while waiting for another inspection to finish")),
        },
    }
    .map_err(|_| server_error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping".into(), None))?;
    while !st.scheduler.metrics.try_reserve_kv(need, limit) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(past("while waiting for room in the KV pool"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reserved = Reserved { st: st.clone(), bytes: need };
    let cancel = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    let opts = PerplexityOptions {
        prefill: b.prefill,
        compare_full: b.retained_mass,
        trace_every: b.trace.then_some(1),
        stop: Stop { deadline, cancelled: Some(cancel) },
        ..PerplexityOptions::new(policy.clone())
    };
    let run_ids = ids.clone();
    let started = Instant::now();
    let joined = tokio::task::spawn_blocking(move || {
        // the reservation and the slot last as long as the run, even when
        // the client left and the handler is gone
        let _held = (reserved, permit);
        let report = perplexity(&model, &run_ids, &opts, |_, _| {})?;
        // the trace lists decode-step evictions only: the kept sets right
        // after the prefill chunk (the same run cut after it) are where a
        // replay starts
        let after_prefill = if opts.trace_every.is_some() && opts.prefill > 1 {
            let cut = &run_ids[..(opts.prefill + 1).min(run_ids.len())];
            let o = PerplexityOptions { compare_full: false, trace_every: None, ..opts.clone() };
            Some(perplexity(&model, cut, &o, |_, _| {})?.kept)
        } else {
            None
        };
        Ok::<_, kvslim_engine::EngineError>((report, after_prefill))
    })
    .await;
    let (report, after_prefill) = match joined {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if deadline.is_some_and(|d| Instant::now() >= d) => return Err(past(&format!("({e})"))),
        Ok(Err(e)) => return Err(ApiError::bad(e.to_string(), None)),
        Err(e) => {
            return Err(server_error(StatusCode::INTERNAL_SERVER_ERROR, format!("the inspection failed: {e}"), None))
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let by_layer =
        |sets: &[Vec<Vec<u32>>]| json!({"layers": sets.iter().map(|h| json!({"kv_heads": h})).collect::<Vec<_>>()});
    let scores = json!({"layers": report.kept_scores.iter().map(|h| json!({"kv_heads": h})).collect::<Vec<_>>()});
    let config = &st.model.config;
    let kinds: Option<Vec<&str>> = config
        .features
        .sliding_window
        .as_ref()
        .map(|w| w.local_layers.iter().map(|&l| if l { "local" } else { "global" }).collect());
    let retained = report.compare_full.as_ref().map(|c| {
        json!({
            "mean": c.retained_mass.mean,
            "per_layer": c.retained_mass_per_layer.iter().map(|s| s.mean).collect::<Vec<_>>(),
        })
    });
    let trace = b.trace.then(|| {
        report
            .events
            .iter()
            .map(|e| json!([e.step, e.layer, e.kv_head, e.victim_pos, e.victim_score]))
            .collect::<Vec<_>>()
    });
    Ok(json!({
        "object": "kv.inspection",
        "model": st.model_name,
        "policy": report.policy,
        "tokens": ids.iter().map(|&id| token_text(&st, id)).collect::<Vec<_>>(),
        "token_ids": ids,
        // a prefill of the whole text feeds its last token too
        "fed": (n - 1).max(b.prefill),
        "prefill": b.prefill,
        "n_layers": config.n_layers,
        "n_kv_heads": config.n_kv_heads,
        "n_heads": config.n_heads,
        "layer_kinds": kinds,
        "kept": by_layer(&report.kept),
        "scores": scores,
        "kv_bytes": report.kv_bytes_allocated,
        "kv_bytes_full": full_kv_bytes(&st.model, n),
        "budget_slots": report.budget_slots,
        "nll": report.nll,
        "ppl": report.ppl,
        "retained_mass": retained,
        "trace_fields": b.trace.then_some(["step", "layer", "kv_head", "victim_pos", "victim_score"]),
        "trace": trace,
        "prefill_kept": after_prefill.as_deref().map(by_layer),
        "seconds": seconds,
    }))
}
