//! Compressed contexts in the server: a document prefilled once under a
//! policy (`POST /v1/contexts`, run by the scheduler in slices like any
//! prompt), kept in memory and optionally in `--contexts-dir`, and asked
//! by `/v1/completions` and `/v1/chat/completions` with `"context": ID`.
//!
//! * Every context is paged in the server's pools (a policy without
//!   `page=` gets `--kv-page-size`), so concurrent questions on one
//!   context share its pages copy-on-write: N questions hold one copy of
//!   the context plus N tails. A context's bytes are reserved from the
//!   same KV memory limit as requests; a question reserves only its tail
//!   ([`fork_bytes`]).
//! * Contexts no request is using are evicted least recently used first
//!   when a new context or request needs the memory; with a directory
//!   they stay on disk and come back on demand (also a context another
//!   replica sharing the directory made).
//! * Files are [`Context::save`]'s format; a bad file is refused with a
//!   log line naming it, and the server still starts.

pub mod store;

use crate::error::{json_body, reply, ApiError};
use crate::scheduler::events::Event;
use crate::scheduler::pools::kv_bytes_for;
use crate::scheduler::request::Request;
use crate::scheduler::SubmitError;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kvslim_engine::context::Framing;
use kvslim_engine::SamplingParams;
use kvslim_models::chat::{ChatFormat, ChatMessage};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use store::{not_found, CompressJob};
use tokio::sync::mpsc::unbounded_channel;

/// A new context's id: `ctx-` and 16 hex digits.
fn new_id() -> String {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = crate::request::NEXT_ID.fetch_add(1, Relaxed);
    let mut rng = kvslim_cache::rng::SplitMix64::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    format!("ctx-{:016x}", rng.next_u64())
}

#[derive(Deserialize)]
struct CreateBody {
    text: Option<String>,
    messages: Option<Vec<MessageIn>>,
    kv_policy: Option<String>,
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: String,
}

/// `POST /v1/contexts`: `{"text" | "messages", "kv_policy"}` → the new
/// context's `id`, `tokens`, `kv_bytes`, `kv_bytes_full`, `seconds`.
pub async fn create(State(st): State<AppState>, body: Bytes) -> Response {
    let job = match plan_create(&st, &body) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let (req, mut rx) = job;
    if let Err(e) = st.scheduler.submit(req) {
        let message = match e {
            SubmitError::QueueFull => "the request queue is full; retry later",
            SubmitError::Stopped => "the inference thread has stopped",
        };
        return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, ..ApiError::bad(message, None) }.into_response();
    }
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Context(v) => return reply(Ok(v)),
            Event::Error(e) => {
                return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, ..ApiError::bad(e, None) }.into_response()
            }
            Event::TimedOut(_) => {
                return ApiError { status: StatusCode::GATEWAY_TIMEOUT, ..ApiError::bad("compression timed out", None) }
                    .into_response()
            }
            _ => {}
        }
    }
    ApiError { status: StatusCode::SERVICE_UNAVAILABLE, ..ApiError::bad("the inference thread has stopped", None) }
        .into_response()
}

/// The request that prefills a new context, and where its result comes.
fn plan_create(st: &AppState, body: &[u8]) -> Result<(Request, tokio::sync::mpsc::UnboundedReceiver<Event>), ApiError> {
    let b: CreateBody = json_body(body)?;
    let mut policy = crate::request::parse_policy(st, b.kv_policy.as_deref())?;
    let page = st.scheduler.limits.kv_page_size;
    if page > 0 && policy.storage.page_size.is_none() {
        policy.storage.page_size = Some(page);
    }
    if policy.head.is_some() {
        return Err(ApiError::bad("CHAI head sharing cannot make a context yet", Some("kv_policy")));
    }
    let framing = match (b.text, b.messages) {
        (Some(t), None) if !t.is_empty() => Framing::Text(t),
        (None, Some(m)) if !m.is_empty() => {
            Framing::Chat(m.into_iter().map(|m| ChatMessage::new(m.role, m.content)).collect())
        }
        _ => return Err(ApiError::bad("give either a non-empty `text` or a non-empty `messages` list", Some("text"))),
    };
    let plain = ChatFormat::Plain;
    let chat = match (&framing, st.chat.as_ref()) {
        (_, Ok(c)) => c,
        (Framing::Text(_), Err(_)) => &plain,
        (Framing::Chat(_), Err(e)) => return Err(ApiError::bad(e.clone(), Some("messages"))),
    };
    let tokens = framing.encode(&st.tokenizer, chat).map_err(|e| ApiError::bad(e.to_string(), Some("text")))?;
    let ctx_len = st.model.config.context_len;
    if tokens.is_empty() || tokens.len() >= ctx_len {
        return Err(ApiError::bad(
            format!("the context has {} tokens; the model's context is {ctx_len}", tokens.len()),
            Some("text"),
        )
        .code("context_length_exceeded"));
    }
    let policy = st.model.context_policy(&policy, tokens.len());
    let kv_bytes = kv_bytes_for(&st.model, &policy, tokens.len(), 0)
        .map_err(|e| ApiError::bad(format!("kv_policy `{policy}`: {e}"), Some("kv_policy")))?;
    if kv_bytes > st.scheduler.limits.kv_memory {
        return Err(ApiError::bad(
            format!(
                "compressing this text needs {kv_bytes} bytes of KV cache, more than the server's {}",
                st.scheduler.limits.kv_memory
            ),
            Some("text"),
        )
        .code("kv_memory_exceeded"));
    }
    let (tx, rx) = unbounded_channel();
    let req = Request {
        prompt: tokens,
        max_tokens: 0,
        sampling: SamplingParams::default(),
        policy,
        stop: Vec::new(),
        kv_bytes,
        beams: 1,
        length_penalty: 1.0,
        logprobs: None,
        prompt_logprobs: None,
        deadline: st.http.request_timeout.map(|d| Instant::now() + d),
        events: tx,
        context: None,
        compress: Some(Box::new(CompressJob {
            id: new_id(),
            meta: framing.meta(),
            store: st.scheduler.contexts.clone(),
            started: Instant::now(),
        })),
    };
    Ok((req, rx))
}

/// `GET /v1/contexts`.
pub async fn list(State(st): State<AppState>) -> Response {
    reply(Ok(json!({ "object": "list", "data": st.scheduler.contexts.list() })))
}

/// `GET /v1/contexts/{id}`.
pub async fn read(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    match st.scheduler.contexts.describe(&id) {
        Some(v) => reply(Ok(v)),
        None => not_found(&id).into_response(),
    }
}

/// `DELETE /v1/contexts/{id}`.
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    if st.scheduler.contexts.remove(&st.scheduler.metrics, &id) {
        reply(Ok(json!({ "id": id, "object": "context", "deleted": true })))
    } else {
        not_found(&id).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::store::valid_id;
    use super::*;

    #[test]
    fn ids_are_hex_and_nothing_else_reaches_the_disk() {
        let id = new_id();
        assert!(valid_id(&id), "{id}");
        for bad in ["ctx-", "ctx-../../etc/passwd", "ctx-12g4", "ctx-a/b", "other-1234", "ctx-"] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert_ne!(new_id(), new_id());
    }
}
