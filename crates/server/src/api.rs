//! The OpenAI-compatible HTTP API.
//!
//! * Bodies are parsed by hand from bytes so malformed JSON gets OpenAI's
//!   error shape (`{"error": {"message", "type", "param", "code"}}`).
//! * Unknown fields are ignored, as OpenAI does.
//! * `max_tokens` must be ≥ 1 (0 with `echo`: the prompt is scored, nothing
//!   generated); larger than what the context leaves (context − prompt
//!   tokens) is clipped to it (finish_reason `length`). Defaults: 16 for
//!   completions (OpenAI's default), the rest of the context for chat.
//! * Log-probs (`logprobs: N` ≤ 5 on completions; `logprobs: true` +
//!   `top_logprobs: N` ≤ 20 on chat) are the log-softmax of the raw logits
//!   in f64 under the request's own `kv_policy`: temperature and top-p
//!   never change them. With `echo` the prompt's tokens are scored by the
//!   request's prefill (every position's logits from one
//!   [`kvslim_engine::Session::feed`], as `kvslim perplexity --prefill N`
//!   does), the first one `null`. A completion's `top_logprobs` also holds
//!   the chosen token (so up to N + 1 entries, as OpenAI); `text_offset`
//!   counts characters of the choice's `text` from each token's bytes. A
//!   request ended by EOS lists the EOS token last (its text is not in
//!   `text`), so `echo` + `max_tokens: 1` always has prompt + 1 entries.
//! * `prompt` may be a list (strings or token-id lists) and `n` (≤ 16)
//!   asks for several samples per prompt: choice `index` = prompt × n + j;
//!   a seeded request samples choice j with seed + j. Streams interleave
//!   the choices' chunks; `usage` (prompt tokens once per prompt) rides on
//!   the last finish chunk.
//! * `kv_policy` (extension) takes the policy grammar of `--policy`.
//! * `usage.kv_bytes_allocated` is the request's KV reservation;
//!   `usage.kv_bytes_final` what its caches held at the end and
//!   `usage.kv_bytes_full` what a full f32 cache of the same tokens would
//!   hold; `usage.prompt_tokens_reused` the prompt tokens taken from the
//!   prefix cache.
//! * A `full` policy without `page=` gets the server's `--kv-page-size`, and
//!   `compact=`/`page_score=` imply it; token eviction otherwise stays on
//!   fixed slots (see `scheduler::apply_default_page`).

use crate::error::{json_body, reply, required, ApiError};
use crate::request::{admit_chat, admit_completion, encode, plan, queue, Extras, Kind, Plan, PromptIn, NEXT_ID};
use crate::scheduler::{Event, Finish, TokenLogprob};
use crate::{now, AppState};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

pub async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    match admit_completion(&st, &body).and_then(|a| plan(&st, a)) {
        Ok(p) => respond(st, p).await,
        Err(e) => e.into_response(),
    }
}

pub async fn chat_completions(State(st): State<AppState>, body: Bytes) -> Response {
    match admit_chat(&st, &body).and_then(|a| plan(&st, a)) {
        Ok(p) => respond(st, p).await,
        Err(e) => e.into_response(),
    }
}

/// Usage summed over a request's choices: prompt tokens (and those reused)
/// once per prompt, completion tokens and KV bytes over every choice.
fn usage(fs: &[&Finish], n: usize) -> Value {
    let per_prompt = |f: fn(&Finish) -> usize| fs.iter().step_by(n.max(1)).map(|x| f(x)).sum::<usize>();
    let prompt = per_prompt(|f| f.prompt_tokens);
    let completion: usize = fs.iter().map(|f| f.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "kv_bytes_allocated": fs.iter().map(|f| f.kv_bytes).sum::<usize>(),
        "prompt_tokens_reused": per_prompt(|f| f.prompt_tokens_reused),
        "kv_bytes_final": fs.iter().map(|f| f.kv_bytes_final).sum::<usize>(),
        "kv_bytes_full": fs.iter().map(|f| f.kv_bytes_full).sum::<usize>(),
    })
}

/// A token as OpenAI shows it: its text when its bytes are UTF-8, else
/// `bytes:\xNN…` (the form OpenAI's completions use for partial
/// characters); `bytes` are always given alongside in chat.
fn token_string(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::from("bytes:");
            for b in bytes {
                s.push_str(&format!("\\x{b:02x}"));
            }
            s
        }
    }
}

/// Renders log-probs in a response's shapes, keeping the running text
/// offset of one choice across streamed chunks.
struct LogprobWriter<'a> {
    tok: &'a kvslim_models::Tokenizer,
    /// Alternatives asked for (`top` entries beyond it are never listed).
    k: usize,
    /// Characters of text before the next token.
    offset: usize,
}

impl LogprobWriter<'_> {
    /// (display string, bytes) of a token, and the characters it adds to
    /// the text (a special token adds none; a token that ends inside a
    /// character counts the characters it starts).
    fn token(&self, id: u32) -> (String, Vec<u8>, usize) {
        let tb = self
            .tok
            .token_bytes(id)
            .unwrap_or(kvslim_models::tokenizer::TokenBytes { bytes: Vec::new(), special: true });
        let chars = if tb.special { 0 } else { tb.bytes.iter().filter(|&&b| (b & 0xc0) != 0x80).count() };
        (token_string(&tb.bytes), tb.bytes, chars)
    }

    /// `choices[i].logprobs` of a completion: `tokens`, `token_logprobs`,
    /// `top_logprobs` ({token: logprob}, the chosen token included as OpenAI
    /// does) and `text_offset` (characters into the choice's `text`).
    /// `first_prompt` is the echoed prompt's first token (its log-prob is
    /// null: nothing predicts it).
    fn completion(&mut self, first_prompt: Option<u32>, lps: &[TokenLogprob]) -> Value {
        let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        if let Some(id) = first_prompt {
            let (s, _, chars) = self.token(id);
            tokens.push(json!(s));
            logprobs.push(Value::Null);
            tops.push(Value::Null);
            offsets.push(json!(self.offset));
            self.offset += chars;
        }
        for lp in lps {
            let (s, _, chars) = self.token(lp.id);
            let mut top = serde_json::Map::new();
            for &(id, l) in lp.top.iter().take(self.k) {
                top.insert(self.token(id).0, json!(l));
            }
            top.entry(s.clone()).or_insert(json!(lp.logprob));
            tokens.push(json!(s));
            logprobs.push(json!(lp.logprob));
            tops.push(Value::Object(top));
            offsets.push(json!(self.offset));
            self.offset += chars;
        }
        json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
    }

    /// `choices[i].logprobs` of a chat completion: `content` entries
    /// `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
    fn chat(&mut self, lps: &[TokenLogprob]) -> Value {
        let content: Vec<Value> = lps
            .iter()
            .map(|lp| {
                let (s, b, _) = self.token(lp.id);
                let top: Vec<Value> = lp
                    .top
                    .iter()
                    .take(self.k)
                    .map(|&(id, l)| {
                        let (s, b, _) = self.token(id);
                        json!({"token": s, "logprob": l, "bytes": b})
                    })
                    .collect();
                json!({"token": s, "logprob": lp.logprob, "bytes": b, "top_logprobs": top})
            })
            .collect();
        json!({"content": content, "refusal": null})
    }
}

/// What a request past its deadline is told (504 when not streamed; the
/// error chunk of a stream).
fn timed_out(st: &AppState, generated: usize) -> ApiError {
    let secs = st.http.request_timeout.map_or(0.0, |d| d.as_secs_f64());
    ApiError {
        status: StatusCode::GATEWAY_TIMEOUT,
        message: format!(
            "the request ran past the server's request timeout of {secs} s (--request-timeout) after {generated} generated tokens and was stopped; lower max_tokens or retry"
        ),
        kind: "server_error",
        param: None,
        code: Some("request_timeout"),
    }
}

fn server_error(message: String) -> Response {
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message, kind: "server_error", param: None, code: None }
        .into_response()
}

/// What one choice gathered (non-streaming).
#[derive(Default)]
struct Gathered {
    text: String,
    prompt: Option<Vec<TokenLogprob>>,
    tokens: Vec<TokenLogprob>,
    finish: Option<Finish>,
}

async fn respond(st: AppState, plan: Plan) -> Response {
    let rxs = match queue(&st, &plan) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let Plan { kind, prompts, common: c, extras: x, .. } = plan;
    let n = NEXT_ID.fetch_add(1, Relaxed);
    let (id, object) = match kind {
        Kind::Completion => (format!("cmpl-{n}"), "text_completion"),
        Kind::Chat => (format!("chatcmpl-{n}"), "chat.completion"),
    };
    let model = c.model.clone().unwrap_or_else(|| st.model_name.clone());
    let created = now();
    if !c.stream.unwrap_or(false) {
        let mut got: Vec<Gathered> = Vec::with_capacity(rxs.len());
        for mut rx in rxs {
            let mut g = Gathered::default();
            while let Some(ev) = rx.recv().await {
                match ev {
                    Event::Prompt(p) => g.prompt = Some(p),
                    Event::Text(t, lps) => {
                        g.text.push_str(&t);
                        g.tokens.extend(lps);
                    }
                    Event::Error(e) => return server_error(e),
                    Event::TimedOut(n) => return timed_out(&st, n).into_response(),
                    // only `POST /v1/contexts` makes contexts
                    Event::Context(_) => {}
                    Event::Done(f) => {
                        g.finish = Some(f);
                        break;
                    }
                }
            }
            if g.finish.is_none() {
                return server_error("the request ended without a result".into());
            }
            got.push(g);
        }
        let mut choices = Vec::with_capacity(got.len());
        for (i, g) in got.iter().enumerate() {
            let p = &prompts[i / x.n];
            let f = g.finish.as_ref().expect("checked above");
            let mut w = LogprobWriter { tok: &st.tokenizer, k: x.logprobs.unwrap_or(0), offset: 0 };
            let choice = match kind {
                Kind::Completion => {
                    let logprobs = match x.logprobs {
                        None => Value::Null,
                        Some(_) => {
                            let mut all = g.prompt.clone().unwrap_or_default();
                            all.extend(g.tokens.iter().cloned());
                            w.completion(x.echo.then(|| p.ids[0]), &all)
                        }
                    };
                    let text = if x.echo { format!("{}{}", p.text, g.text) } else { g.text.clone() };
                    json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": f.reason})
                }
                Kind::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": g.text},
                    "logprobs": if x.logprobs.is_some() { w.chat(&g.tokens) } else { Value::Null },
                    "finish_reason": f.reason,
                }),
            };
            choices.push(choice);
        }
        let finishes: Vec<&Finish> = got.iter().filter_map(|g| g.finish.as_ref()).collect();
        let body = json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": choices,
            "usage": usage(&finishes, x.n),
        });
        return Json(body).into_response();
    }
    let chunk_object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let head = json!({"id": id, "object": chunk_object, "created": created, "model": model});
    let total = rxs.len();
    let merged = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) }).map(move |e| (i, e)).boxed()
    }));
    let mut s = Streamer {
        timeout: st.http.request_timeout,
        tok: st.tokenizer.clone(),
        kind,
        x,
        head,
        prompts,
        writers: (0..total).map(|_| (false, 0usize)).collect(),
        finishes: vec![None; total],
        queue: std::collections::VecDeque::new(),
        ended: false,
    };
    if kind == Kind::Chat {
        for i in 0..total {
            let mut d = serde_json::Map::new();
            d.insert("role".into(), json!("assistant"));
            d.insert("content".into(), json!(""));
            s.push(json!({"index": i, "delta": d, "logprobs": null, "finish_reason": null}), None);
        }
    }
    let events = stream::unfold((merged, s), |(mut merged, mut s)| async move {
        loop {
            if let Some(ev) = s.queue.pop_front() {
                return Some((ev, (merged, s)));
            }
            if s.ended {
                return None;
            }
            match merged.next().await {
                Some((i, ev)) => s.on_event(i, ev),
                None => {
                    s.queue.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                }
            }
        }
    });
    sse(events).into_response()
}

/// Turns a streamed request's events (every choice's, interleaved) into
/// SSE chunks: each chunk is one choice's piece with its `index` and, when
/// asked, its tokens' log-probs; `usage` (summed) rides on the finish
/// chunk of the choice that ends last; an error ends the stream.
struct Streamer {
    /// `--request-timeout`, for the message of a timed-out stream.
    timeout: Option<std::time::Duration>,
    tok: Arc<kvslim_models::Tokenizer>,
    kind: Kind,
    x: Extras,
    head: Value,
    prompts: Vec<PromptIn>,
    /// Per choice: whether the echo went out, and the text offset so far.
    writers: Vec<(bool, usize)>,
    finishes: Vec<Option<Finish>>,
    queue: std::collections::VecDeque<SseEvent>,
    ended: bool,
}

impl Streamer {
    fn push(&mut self, choice: Value, usage: Option<Value>) {
        let mut v = self.head.clone();
        v["choices"] = json!([choice]);
        if let Some(u) = usage {
            v["usage"] = u;
        }
        self.queue.push_back(SseEvent::default().data(v.to_string()));
    }

    /// Log-probs of tokens for choice `i` in this endpoint's chunk shape
    /// (`first_prompt`: the echoed prompt's first token, completions only).
    fn logprobs(&mut self, i: usize, first_prompt: Option<u32>, lps: &[TokenLogprob]) -> Value {
        if self.x.logprobs.is_none() {
            return Value::Null;
        }
        let mut w = LogprobWriter { tok: &self.tok, k: self.x.logprobs.unwrap_or(0), offset: self.writers[i].1 };
        let v = match self.kind {
            Kind::Completion => w.completion(first_prompt, lps),
            Kind::Chat => w.chat(lps),
        };
        self.writers[i].1 = w.offset;
        v
    }

    /// The echoed prompt of choice `i` (with its log-probs when given),
    /// once, before anything else of that choice.
    fn echo(&mut self, i: usize, prompt_lps: Option<&[TokenLogprob]>) {
        if !self.x.echo || self.writers[i].0 {
            return;
        }
        self.writers[i].0 = true;
        let p = i / self.x.n;
        let first = self.prompts[p].ids[0];
        let logprobs = self.logprobs(i, Some(first), prompt_lps.unwrap_or(&[]));
        let text = self.prompts[p].text.clone();
        self.push(json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": null}), None);
    }

    fn on_event(&mut self, i: usize, ev: Event) {
        match ev {
            Event::Prompt(lps) => self.echo(i, Some(&lps)),
            Event::Text(t, lps) => {
                self.echo(i, None);
                let logprobs = self.logprobs(i, None, &lps);
                let choice = match self.kind {
                    Kind::Completion => json!({"index": i, "text": t, "logprobs": logprobs, "finish_reason": null}),
                    Kind::Chat => {
                        json!({"index": i, "delta": {"content": t}, "logprobs": logprobs, "finish_reason": null})
                    }
                };
                self.push(choice, None);
            }
            Event::Done(f) => {
                self.echo(i, None);
                let reason = f.reason;
                self.finishes[i] = Some(f);
                let all: Vec<&Finish> = self.finishes.iter().flatten().collect();
                let usage = (all.len() == self.finishes.len()).then(|| usage(&all, self.x.n));
                let choice = match self.kind {
                    Kind::Completion => json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason}),
                    Kind::Chat => json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason}),
                };
                self.push(choice, usage);
            }
            Event::Error(e) => {
                let err = json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                self.queue.push_back(SseEvent::default().data(err.to_string()));
                self.queue.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
            }
            Event::TimedOut(n) => {
                let secs = self.timeout.map_or(0.0, |d| d.as_secs_f64());
                let msg = format!("the request ran past the server's request timeout of {secs} s (--request-timeout) after {n} generated tokens and was stopped");
                let err = json!({"error": {"message": msg, "type": "server_error", "param": null, "code": "request_timeout"}});
                self.queue.push_back(SseEvent::default().data(err.to_string()));
                self.queue.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
            }
            Event::Context(_) => {}
        }
    }
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

/// `GET /health`: 200 `{"status": "ok"}`, or 503 `{"status": "draining"}`
/// once a graceful shutdown started (load balancers stop sending traffic).
/// Never needs the API key.
pub async fn health(State(st): State<AppState>) -> Response {
    if st.shutdown.is_draining() {
        let body = json!({"status": "draining", "model": st.model_name, "in_flight": st.shutdown.in_flight()});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
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

/// `POST /tokenize` body (vLLM's shape, which lm-evaluation-harness's
/// `remote` tokenizer backend calls).
#[derive(Deserialize)]
struct TokenizeBody {
    prompt: Option<String>,
    add_special_tokens: Option<bool>,
}

/// `POST /tokenize`: `{"prompt", "add_special_tokens"}` → `{"tokens",
/// "count", "max_model_len"}`. The ids are what `/v1/completions` would
/// run for that prompt (`add_special_tokens`, default true, keeps the BOS
/// the model's tokenizer adds; false drops it), so a client that tokenizes
/// here and sends token ids scores exactly what it measured.
pub async fn tokenize(State(st): State<AppState>, body: Bytes) -> Response {
    reply(tokenized(&st, &body))
}

fn tokenized(st: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let b: TokenizeBody = json_body(body)?;
    let text = required(b.prompt, "prompt")?;
    let mut ids = encode(st, &text)?;
    let tok = &st.tokenizer;
    let bos_text = tok.bos.and_then(|b| tok.token_text(b));
    // without special tokens, unless the text itself starts with BOS's text
    if b.add_special_tokens == Some(false) && !bos_text.is_some_and(|t| text.starts_with(&t)) {
        tok.strip_bos(&mut ids);
    }
    Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": st.model.config.context_len}))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Option<Vec<u32>>,
}

/// `POST /detokenize`: `{"tokens"}` → `{"prompt"}` (special tokens skipped).
pub async fn detokenize(State(st): State<AppState>, body: Bytes) -> Response {
    reply(detokenized(&st, &body))
}

fn detokenized(st: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let ids = required(json_body::<DetokenizeBody>(body)?.tokens, "tokens")?;
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= st.model.config.vocab_size) {
        return Err(ApiError::bad(format!("token id {bad} is outside the vocabulary"), Some("tokens")));
    }
    let text = st.tokenizer.decode(&ids).map_err(|e| ApiError::bad(format!("cannot decode: {e}"), Some("tokens")))?;
    Ok(json!({"prompt": text}))
}

/// `GET /tokenizer_info`: the special tokens (as text) and the chat
/// template, the facts lm-evaluation-harness's `remote` tokenizer reads.
pub async fn tokenizer_info(State(st): State<AppState>) -> Response {
    let tok = &st.tokenizer;
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i));
    Json(json!({
        "tokenizer_class": "kvslim",
        "eos_token": text(tok.eos.first().copied()),
        "bos_token": text(tok.bos),
        "pad_token": null,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
        "model_max_length": st.model.config.context_len,
        "max_model_len": st.model.config.context_len,
    }))
    .into_response()
}
