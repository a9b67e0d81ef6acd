//! The OpenAI-compatible HTTP API.
//!
//! * Bodies are parsed by hand from bytes so malformed JSON gets OpenAI's
//!   error shape (`{"error": {"message", "type", "param", "code"}}`).
//! * Unknown fields are ignored, as OpenAI does.
//! * `max_tokens` must be ≥ 1; larger than what the context leaves
//!   (context − prompt tokens) is clipped to it (finish_reason `length`).
//!   Defaults: 16 for completions (OpenAI's default), the rest of the
//!   context for chat.
//! * `kv_policy` (extension) takes the policy grammar of `--policy`.
//! * `usage.kv_bytes_allocated` is the request's KV reservation;
//!   `usage.prompt_tokens_reused` the prompt tokens taken from the prefix
//!   cache.
//! * A `full` policy without `page=` gets the server's `--kv-page-size`, and
//!   `compact=`/`page_score=` imply it; token eviction otherwise stays on
//!   fixed slots (see `scheduler::apply_default_page`).

use crate::scheduler::{apply_default_page, kv_bytes_for, Event, Finish, Request, SubmitError};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use kvslim_cache::PolicySpec;
use kvslim_engine::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// An error response in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }
    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Fields shared by both endpoints.
#[derive(Deserialize, Default)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    stream: Option<bool>,
    n: Option<i64>,
    kv_policy: Option<String>,
    /// Extension: beam search with this many beams (greedy, not streamed).
    beams: Option<i64>,
    /// Extension: α in score = logprob / len^α for beam search (default 1).
    length_penalty: Option<f32>,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Option<Prompt>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Option<Vec<Message>>,
}

/// The chat fields the template sees as sent: whole message objects and
/// `tools` with their key order (for `tojson`).
#[derive(Deserialize, Default)]
struct RawChat {
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    tools: Option<kvslim_models::chat::JsonValue>,
}

/// The endpoint's own fields and the shared ones, from one JSON object.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<(T, Common), ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object", None));
    }
    let bad = |e: serde_json::Error| ApiError::bad(format!("invalid request: {e}"), None);
    let common = Common::deserialize(&v).map_err(bad)?;
    Ok((T::deserialize(&v).map_err(bad)?, common))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Validates the shared fields and queues the request.
fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    c: &Common,
    default_max: Option<usize>,
    extra_stops: Vec<String>,
) -> Result<(UnboundedReceiver<Event>, usize, usize), ApiError> {
    let model = &st.model;
    let ctx = model.config.context_len;
    if c.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n = 1 is supported", Some("n")));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty", Some("prompt")));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= model.config.vocab_size) {
        return Err(ApiError::bad(format!("token id {bad} is outside the vocabulary"), Some("prompt")));
    }
    if prompt.len() >= ctx {
        return Err(ApiError::bad(
            format!(
                "the prompt has {} tokens but the model's context is {ctx} tokens (at least one must be left to generate); shorten the prompt",
                prompt.len()
            ),
            Some("prompt"),
        )
        .code("context_length_exceeded"));
    }
    let room = ctx - prompt.len();
    let max_tokens = match c.max_tokens.or(c.max_completion_tokens) {
        Some(m) if m < 1 => {
            return Err(ApiError::bad(format!("max_tokens must be at least 1, got {m}"), Some("max_tokens")))
        }
        Some(m) => (m as u64).min(room as u64) as usize,
        None => default_max.unwrap_or(room).min(room),
    };
    let mut policy = match &c.kv_policy {
        None => st.default_policy.clone(),
        Some(p) => PolicySpec::parse_and_load_with_page(p, Some(st.scheduler.limits.kv_page_size).filter(|&n| n > 0))
            .map_err(|e| ApiError::bad(e.to_string(), Some("kv_policy")))?,
    };
    apply_default_page(&mut policy, st.scheduler.limits.kv_page_size);
    let seed = match c.seed {
        Some(s) => s as u64,
        None => NEXT_ID.load(Relaxed) ^ now().wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let sampling =
        SamplingParams { temperature: c.temperature.unwrap_or(1.0), top_k: 0, top_p: c.top_p.unwrap_or(1.0), seed };
    sampling.validate().map_err(|e| ApiError::bad(e, None))?;
    let mut stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    stop.retain(|s| !s.is_empty());
    stop.extend(extra_stops);
    let beams = match c.beams {
        None => 1,
        Some(b) if (1..=16).contains(&b) => b as usize,
        Some(b) => return Err(ApiError::bad(format!("beams must be between 1 and 16, got {b}"), Some("beams"))),
    };
    if beams > 1 && c.stream == Some(true) {
        return Err(ApiError::bad("beam search results are not streamed; drop `stream` or `beams`", Some("stream")));
    }
    let length_penalty = c.length_penalty.unwrap_or(1.0);
    if !length_penalty.is_finite() {
        return Err(ApiError::bad("length_penalty must be a finite number", Some("length_penalty")));
    }
    // beam search holds every live beam's cache plus the children forked at a reorder
    let copies = if beams > 1 { 2 * beams } else { 1 };
    let kv_bytes = kv_bytes_for(model, &policy, prompt.len(), max_tokens)
        .map_err(|e| ApiError::bad(format!("kv_policy `{policy}`: {e}"), Some("kv_policy")))?
        .saturating_mul(copies);
    let limit = st.scheduler.limits.kv_memory;
    if kv_bytes > limit {
        return Err(ApiError::bad(
            format!(
                "this request needs {kv_bytes} bytes of KV cache (policy `{policy}`, {} prompt + {max_tokens} new tokens) but the server's whole KV pool is {limit} bytes; lower max_tokens or use a bounded kv_policy (paged: with page_score=… or compact=N)",
                prompt.len()
            ),
            Some("max_tokens"),
        )
        .code("kv_memory_exceeded"));
    }
    let (tx, rx) = unbounded_channel();
    let prompt_len = prompt.len();
    let req = Request { prompt, max_tokens, sampling, policy, stop, kv_bytes, beams, length_penalty, events: tx };
    match st.scheduler.submit(req) {
        Ok(()) => Ok((rx, prompt_len, kv_bytes)),
        Err(SubmitError::QueueFull) => Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("the request queue is full ({} waiting); retry later", st.scheduler.limits.queue_limit),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }),
        Err(SubmitError::Stopped) => Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the inference thread has stopped".into(),
            kind: "server_error",
            param: None,
            code: None,
        }),
    }
}

fn encode(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.tokenizer.encode(text).map_err(|e| ApiError::bad(format!("cannot tokenize the prompt: {e}"), Some("prompt")))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

pub async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    let (b, common): (CompletionBody, Common) = match parse(&body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let prompt = match b.prompt {
        None => return ApiError::bad("`prompt` is required", Some("prompt")).into_response(),
        Some(Prompt::Text(t)) => encode(&st, &t),
        Some(Prompt::Texts(v)) if v.len() == 1 => encode(&st, &v[0]),
        Some(Prompt::Texts(_)) => Err(ApiError::bad("only one prompt per request is supported", Some("prompt"))),
        Some(Prompt::Tokens(ids)) => Ok(ids),
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    respond(st, Kind::Completion, prompt, common, Some(16), Vec::new()).await
}

pub async fn chat_completions(State(st): State<AppState>, body: Bytes) -> Response {
    let (b, common): (ChatBody, Common) = match parse(&body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Some(messages) = b.messages.filter(|m| !m.is_empty()) else {
        return ApiError::bad("`messages` must be a non-empty list", Some("messages")).into_response();
    };
    let chat = match st.chat.as_ref() {
        Ok(c) => c,
        Err(e) => return ApiError::bad(e.clone(), Some("messages")).into_response(),
    };
    // the template sees each message as sent (tool_calls, name …), with
    // content parts joined into one string; `tools` keep their key order
    let raw: RawChat = serde_json::from_slice(&body).unwrap_or_default();
    let msgs: Vec<Value> = messages
        .into_iter()
        .zip(raw.messages.unwrap_or_default())
        .map(|(m, mut rawm)| {
            let content = match m.content {
                None => Value::Null,
                Some(Content::Text(t)) => Value::String(t),
                Some(Content::Parts(p)) => {
                    Value::String(p.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join(""))
                }
            };
            if let Some(o) = rawm.as_object_mut() {
                o.insert("role".into(), Value::String(m.role));
                o.insert("content".into(), content);
            }
            rawm
        })
        .collect();
    let msgs = kvslim_models::chat::serde_to_value(&Value::Array(msgs));
    let tools = raw.tools.map(|t| t.0);
    let text = match chat.render(msgs, tools) {
        Ok(t) => t,
        Err(e) => return ApiError::bad(e.to_string(), Some("messages")).into_response(),
    };
    let prompt = match chat.encode(&st.tokenizer, &text) {
        Ok(p) => p,
        Err(e) => return ApiError::bad(format!("cannot tokenize the prompt: {e}"), Some("messages")).into_response(),
    };
    let stops = chat.stops();
    respond(st, Kind::Chat, prompt, common, None, stops).await
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "kv_bytes_allocated": f.kv_bytes,
        "prompt_tokens_reused": f.prompt_tokens_reused,
    })
}

async fn respond(
    st: AppState,
    kind: Kind,
    prompt: Vec<u32>,
    c: Common,
    default_max: Option<usize>,
    stops: Vec<String>,
) -> Response {
    let (mut rx, prompt_len, kv_bytes) = match submit(&st, prompt, &c, default_max, stops) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let n = NEXT_ID.fetch_add(1, Relaxed);
    let (id, object) = match kind {
        Kind::Completion => (format!("cmpl-{n}"), "text_completion"),
        Kind::Chat => (format!("chatcmpl-{n}"), "chat.completion"),
    };
    let model = c.model.clone().unwrap_or_else(|| st.model_name.clone());
    let created = now();
    if !c.stream.unwrap_or(false) {
        let mut text = String::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text(t) => text.push_str(&t),
                Event::Error(e) => {
                    return ApiError {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: e,
                        kind: "server_error",
                        param: None,
                        code: None,
                    }
                    .into_response()
                }
                Event::Done(f) => {
                    let choice = match kind {
                        Kind::Completion => {
                            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": f.reason})
                        }
                        Kind::Chat => json!({
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "logprobs": null,
                            "finish_reason": f.reason,
                        }),
                    };
                    let body = json!({
                        "id": id, "object": object, "created": created, "model": model,
                        "choices": [choice],
                        "usage": usage(&f),
                    });
                    return Json(body).into_response();
                }
            }
        }
        return ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the request ended without a result".into(),
            kind: "server_error",
            param: None,
            code: None,
        }
        .into_response();
    }
    let chunk_object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let chunk = move |delta: Option<&str>, finish: Option<&str>, usage: Option<Value>, first: bool| -> SseEvent {
        let choice = match kind {
            Kind::Completion => {
                json!({"index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut v = json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": [choice]});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        SseEvent::default().data(v.to_string())
    };
    // state: 0 = before the first chunk, 1 = streaming, 3 = finished
    let events = stream::unfold((rx, 0u8), move |(mut rx, state)| {
        let chunk = chunk.clone();
        async move {
            if state >= 2 {
                return None;
            }
            if state == 0 && kind == Kind::Chat {
                return Some((chunk(Some(""), None, None, true), (rx, 1)));
            }
            match rx.recv().await {
                Some(Event::Text(t)) => Some((chunk(Some(&t), None, None, false), (rx, 1))),
                Some(Event::Done(f)) => {
                    let u = usage(&f);
                    let last = chunk(if kind == Kind::Chat { None } else { Some("") }, Some(f.reason), Some(u), false);
                    Some((last, (rx, 3)))
                }
                Some(Event::Error(e)) => {
                    let err = json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                    Some((SseEvent::default().data(err.to_string()), (rx, 3)))
                }
                None => None,
            }
        }
    });
    // after Done/Error (state 3) comes the terminating [DONE]
    let events = stream::unfold((Box::pin(events), false), |(mut s, ended)| async move {
        use futures_util::StreamExt;
        if ended {
            return None;
        }
        match s.next().await {
            Some(ev) => Some((ev, (s, false))),
            None => Some((SseEvent::default().data("[DONE]"), (s, true))),
        }
    });
    let _ = (prompt_len, kv_bytes);
    sse(events).into_response()
}

fn sse(events: impl Stream<Item = SseEvent> + Send + 'static) -> impl IntoResponse {
    use futures_util::StreamExt;
    Sse::new(events.map(Ok::<_, Infallible>))
}

pub async fn models(State(st): State<AppState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_name,
            "object": "model",
            "created": st.started,
            "owned_by": "kvslim",
            "context_length": st.model.config.context_len,
        }],
    }))
    .into_response()
}

pub async fn health(State(st): State<AppState>) -> Response {
    Json(json!({"status": "ok", "model": st.model_name})).into_response()
}

pub async fn metrics(State(st): State<AppState>) -> Response {
    let m = &st.scheduler.metrics;
    let (pages, cow) = st.scheduler.pools.totals();
    m.kv_pages_in_use.store(pages, Relaxed);
    m.kv_cow_copies_total.store(cow, Relaxed);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.render()).into_response()
}

pub async fn not_found() -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".into(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
    .into_response()
}
