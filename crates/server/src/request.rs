//! Request bodies of `/v1/completions` and `/v1/chat/completions`: parsed,
//! validated and sized before anything is queued ([`admit`] then [`plan`]),
//! so every limit (prompt length, `max_tokens`, `n`, prompts per request,
//! stop strings, log-probs, the KV reservation) is enforced before the
//! scheduler allocates anything. [`check_body`] runs both steps on its own,
//! for the request-JSON fuzz target.

use crate::error::ApiError;
use crate::scheduler::{apply_default_page, kv_bytes_for, Event, Request, SubmitError};
use crate::AppState;
use axum::http::StatusCode;
use kvslim_cache::PolicySpec;
use kvslim_engine::context::{Context, Question};
use kvslim_engine::SamplingParams;
use kvslim_models::chat::{ChatFormat, ChatMessage};
use serde::Deserialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Fields shared by both endpoints.
#[derive(Deserialize, Default)]
pub(crate) struct Common {
    pub model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    pub stream: Option<bool>,
    n: Option<i64>,
    kv_policy: Option<String>,
    /// Extension: beam search with this many beams (greedy, not streamed).
    beams: Option<i64>,
    /// Extension: α in score = logprob / len^α for beam search (default 1).
    length_penalty: Option<f32>,
    /// Extension: continue this compressed context (`POST /v1/contexts`):
    /// the prompt (or the messages) is the question that follows it.
    context: Option<String>,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Option<Prompt>,
    echo: Option<bool>,
    /// An integer (0..=5); read by hand for a clear error on `true`.
    logprobs: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

impl Content {
    /// The message's text, its parts joined.
    fn text(self) -> String {
        match self {
            Content::Text(t) => t,
            Content::Parts(p) => p.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join(""),
        }
    }
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
    /// `true`/`false`; read by hand for a clear error on a number.
    logprobs: Option<Value>,
    top_logprobs: Option<i64>,
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
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(T, Common), ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object", None));
    }
    let bad = |e: serde_json::Error| ApiError::bad(format!("invalid request: {e}"), None);
    let common = Common::deserialize(&v).map_err(bad)?;
    Ok((T::deserialize(&v).map_err(bad)?, common))
}

/// Request ids (`cmpl-N`), also mixed into unseeded requests' seeds.
pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Most alternatives per token: OpenAI's limits (`logprobs` ≤ 5 on
/// completions, `top_logprobs` ≤ 20 on chat).
const MAX_COMPLETION_LOGPROBS: i64 = 5;
const MAX_CHAT_TOP_LOGPROBS: i64 = 20;
/// Most choices per prompt (`n`) and prompts per request; every choice is
/// its own sequence in the scheduler (and counts against its queue).
const MAX_N: i64 = 16;
const MAX_PROMPTS: usize = 64;
/// Most stop strings per request and bytes per stop string: each is
/// searched for after every token (OpenAI allows 4).
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

/// What a request asks for beyond text, after validation.
#[derive(Clone, Copy, Default)]
pub(crate) struct Extras {
    /// Return the prompt before the completion (completions only).
    pub echo: bool,
    /// Per-token log-probs with this many alternatives.
    pub logprobs: Option<usize>,
    /// Choices per prompt.
    pub n: usize,
}

/// One prompt of a request: its ids and the text `echo` returns for it
/// (the prompt as sent, or its decoding when sent as token ids).
pub(crate) struct PromptIn {
    pub ids: Vec<u32>,
    pub text: String,
}

/// Reads `logprobs` of `/v1/completions`: an integer 0..=5 (or null).
fn completion_logprobs_field(v: &Option<Value>) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(k) if (0..=MAX_COMPLETION_LOGPROBS).contains(&k) => Ok(Some(k as usize)),
            _ => Err(ApiError::bad(
                format!("logprobs must be an integer between 0 and {MAX_COMPLETION_LOGPROBS}, got {n}"),
                Some("logprobs"),
            )),
        },
        Some(o) => Err(ApiError::bad(
            format!("logprobs must be an integer between 0 and {MAX_COMPLETION_LOGPROBS} on /v1/completions, got {o} (`logprobs: true` with `top_logprobs` is the chat form)"),
            Some("logprobs"),
        )),
    }
}

/// Reads `logprobs` (bool) and `top_logprobs` (0..=20) of chat.
fn chat_logprobs_fields(logprobs: &Option<Value>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(o) => {
            return Err(ApiError::bad(
                format!("logprobs must be true or false on /v1/chat/completions, got {o} (the number of alternatives goes in top_logprobs)"),
                Some("logprobs"),
            ))
        }
    };
    match (on, top) {
        (_, Some(k)) if !(0..=MAX_CHAT_TOP_LOGPROBS).contains(&k) => Err(ApiError::bad(
            format!("top_logprobs must be between 0 and {MAX_CHAT_TOP_LOGPROBS}, got {k}"),
            Some("top_logprobs"),
        )),
        (false, Some(_)) => Err(ApiError::bad("top_logprobs needs `logprobs: true`", Some("top_logprobs"))),
        (false, None) => Ok(None),
        (true, k) => Ok(Some(k.unwrap_or(0) as usize)),
    }
}

/// Stop strings as sent (empty ones dropped): at most [`MAX_STOPS`] of at
/// most [`MAX_STOP_BYTES`] bytes.
fn check_stops(stop: &[String]) -> Result<(), ApiError> {
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad(format!("at most {MAX_STOPS} stop strings, got {}", stop.len()), Some("stop")));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad(
            format!("a stop string may have at most {MAX_STOP_BYTES} bytes, got one of {}", s.len()),
            Some("stop"),
        ));
    }
    Ok(())
}

/// A request body parsed and checked field by field (prompts tokenized),
/// not yet sized.
pub(crate) struct Admitted {
    kind: Kind,
    prompts: Vec<PromptIn>,
    common: Common,
    extras: Extras,
    /// `max_tokens` when the request gives none (None: the rest of the context).
    default_max: Option<usize>,
    /// Stop strings the endpoint adds (the chat template's end-of-turn).
    stops: Vec<String>,
    /// The context the prompts continue (`context`).
    context: Option<Arc<Context>>,
}

/// A request ready to queue: its sequences sized, its KV reserved on admission.
pub(crate) struct Plan {
    pub kind: Kind,
    pub prompts: Vec<PromptIn>,
    pub common: Common,
    pub extras: Extras,
    policy: PolicySpec,
    sampling: SamplingParams,
    stop: Vec<String>,
    beams: usize,
    length_penalty: f32,
    /// Per prompt: (max new tokens, KV bytes of one of its sequences).
    sizes: Vec<(usize, usize)>,
    /// The context every sequence forks (`context`).
    pub context: Option<Arc<Context>>,
}

/// Validates the shared fields and sizes every prompt's sequence (length,
/// KV reservation) before anything is queued or allocated per token.
pub(crate) fn plan(st: &AppState, a: Admitted) -> Result<Plan, ApiError> {
    let Admitted { kind, prompts, common: c, extras: x, default_max, stops: extra_stops, context } = a;
    let model = &st.model;
    let ctx = model.config.context_len;
    let beams = match c.beams {
        None => 1,
        Some(b) if (1..=16).contains(&b) => b as usize,
        Some(b) => return Err(ApiError::bad(format!("beams must be between 1 and 16, got {b}"), Some("beams"))),
    };
    if beams > 1 && c.stream == Some(true) {
        return Err(ApiError::bad("beam search results are not streamed; drop `stream` or `beams`", Some("stream")));
    }
    if beams > 1 && x.n > 1 {
        return Err(ApiError::bad("beam search returns one choice; drop `n` or `beams`", Some("n")));
    }
    if beams > 1 && x.logprobs.is_some() {
        return Err(ApiError::bad(
            "log-probs are not reported for beam search; drop `logprobs` or `beams`",
            Some("logprobs"),
        ));
    }
    let requested = c.max_tokens.or(c.max_completion_tokens);
    match requested {
        Some(0) if x.echo && beams == 1 => {}
        Some(0) if x.echo => {
            return Err(ApiError::bad("beam search needs max_tokens of at least 1", Some("max_tokens")))
        }
        Some(m) if m < 1 => {
            return Err(ApiError::bad(
                format!("max_tokens must be at least 1 (0 only with `echo`), got {m}"),
                Some("max_tokens"),
            ))
        }
        _ => {}
    }
    let policy = match &context {
        Some(_) if c.kv_policy.is_some() => {
            return Err(ApiError::bad(
                "kv_policy does not apply with `context`: the context's own policy keeps running",
                Some("kv_policy"),
            ))
        }
        Some(_) if beams > 1 || x.echo => {
            return Err(ApiError::bad("`context` takes neither `beams` nor `echo`", Some("context")))
        }
        Some(ctx) => ctx.policy().clone(),
        None => {
            let mut policy = parse_policy(st, c.kv_policy.as_deref())?;
            apply_default_page(&mut policy, st.scheduler.limits.kv_page_size);
            policy
        }
    };
    let seed = match c.seed {
        Some(s) => s as u64,
        None => NEXT_ID.load(Relaxed) ^ crate::now().wrapping_mul(0x9e37_79b9_7f4a_7c15),
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
    check_stops(&stop)?;
    stop.extend(extra_stops);
    let length_penalty = c.length_penalty.unwrap_or(1.0);
    if !length_penalty.is_finite() {
        return Err(ApiError::bad("length_penalty must be a finite number", Some("length_penalty")));
    }
    // beam search holds every live beam's cache plus the children forked at a reorder
    let copies = if beams > 1 { 2 * beams } else { 1 };
    let limit = st.scheduler.limits.kv_memory;
    // every prompt is checked before any sequence is queued
    let mut plans = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let prompt = &p.ids;
        if prompt.is_empty() {
            return Err(ApiError::bad("the prompt is empty", Some("prompt")));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= model.config.vocab_size) {
            return Err(ApiError::bad(format!("token id {bad} is outside the vocabulary"), Some("prompt")));
        }
        let only_echo = requested == Some(0);
        // a question follows its context's tokens (a bounded cache may run past the context)
        let before = context.as_ref().map_or(0, |c| if c.cache().bounded() { 0 } else { c.tokens().len() });
        if before + prompt.len() > ctx || (before + prompt.len() == ctx && !only_echo) {
            return Err(ApiError::bad(
                format!(
                    "the prompt has {} tokens (after {before} of its context) but the model's context is {ctx} tokens (at least one must be left to generate); shorten the prompt",
                    prompt.len()
                ),
                Some("prompt"),
            )
            .code("context_length_exceeded"));
        }
        let room = ctx - before - prompt.len();
        let max_tokens = match requested {
            Some(m) => (m as u64).min(room as u64) as usize,
            None => default_max.unwrap_or(room).min(room),
        };
        let kv_bytes = match &context {
            Some(c) => crate::contexts::store::fork_bytes(model, c, prompt.len() + max_tokens),
            None => kv_bytes_for(model, &policy, prompt.len(), max_tokens),
        }
        .map_err(|e| ApiError::bad(format!("kv_policy `{policy}`: {e}"), Some("kv_policy")))?
        .saturating_mul(copies);
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
        plans.push((max_tokens, kv_bytes));
    }
    Ok(Plan {
        kind,
        prompts,
        common: c,
        extras: x,
        policy,
        sampling,
        stop,
        beams,
        length_penalty,
        sizes: plans,
        context,
    })
}

/// A request's `kv_policy` (the server's default when absent): the policy
/// grammar of `--policy`, with the server's page size for `compact=` and
/// `page_score=` without `page=`, CHAI plans loaded; a bad spec is a 400
/// that quotes the grammar's message.
pub(crate) fn parse_policy(st: &AppState, spec: Option<&str>) -> Result<PolicySpec, ApiError> {
    match spec {
        None => Ok(st.default_policy.clone()),
        Some(p) => PolicySpec::parse_and_load_with_page(p, Some(st.scheduler.limits.kv_page_size).filter(|&n| n > 0))
            .map_err(|e| ApiError::bad(e.to_string(), Some("kv_policy"))),
    }
}

/// Queues one sequence per prompt and choice (prompt-major: choice `index`
/// = prompt × n + j). Choice j of a seeded request samples with seed + j,
/// so choice 0 is what the same request with n = 1 gives.
pub(crate) fn queue(st: &AppState, p: &Plan) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
    let (prompts, x) = (&p.prompts, p.extras);
    let deadline = st.http.request_timeout.map(|d| std::time::Instant::now() + d);
    let mut out = Vec::with_capacity(prompts.len() * x.n);
    for (prompt, &(max_tokens, kv_bytes)) in prompts.iter().zip(&p.sizes) {
        for j in 0..x.n {
            let (tx, rx) = unbounded_channel();
            let mut sampling = p.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(j as u64);
            let req = Request {
                prompt: prompt.ids.clone(),
                max_tokens,
                sampling,
                policy: p.policy.clone(),
                stop: p.stop.clone(),
                kv_bytes,
                beams: p.beams,
                length_penalty: p.length_penalty,
                logprobs: x.logprobs,
                prompt_logprobs: x.logprobs.filter(|_| x.echo),
                deadline,
                events: tx,
                context: p.context.clone(),
                compress: None,
            };
            match st.scheduler.submit(req) {
                Ok(()) => out.push(rx),
                // the sequences queued so far are cancelled as `out` drops
                Err(SubmitError::QueueFull) => {
                    return Err(ApiError {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        message: format!(
                            "the request queue is full ({} waiting); retry later",
                            st.scheduler.limits.queue_limit
                        ),
                        kind: "rate_limit_error",
                        param: None,
                        code: Some("queue_full"),
                    })
                }
                Err(SubmitError::Stopped) => {
                    return Err(ApiError {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        message: "the inference thread has stopped".into(),
                        kind: "server_error",
                        param: None,
                        code: None,
                    })
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn encode(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.tokenizer.encode(text).map_err(|e| ApiError::bad(format!("cannot tokenize the prompt: {e}"), Some("prompt")))
}

/// Which endpoint a request came to: `/v1/completions` or `/v1/chat/completions`.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    Completion,
    Chat,
}

/// `n` as sent (1..=16).
fn choices_per_prompt(c: &Common) -> Result<usize, ApiError> {
    match c.n {
        None => Ok(1),
        Some(n) if (1..=MAX_N).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::bad(format!("n must be between 1 and {MAX_N}, got {n}"), Some("n"))),
    }
}

/// `/v1/completions`: prompts (text, token ids, or lists of either),
/// `echo`, `logprobs`, `n`.
pub(crate) fn admit_completion(st: &AppState, body: &[u8]) -> Result<Admitted, ApiError> {
    let (b, common): (CompletionBody, Common) = parse(body)?;
    let context = common.context.as_deref().map(|id| crate::contexts::store::lookup(st, id)).transpose()?;
    let text = |t: String| -> Result<PromptIn, ApiError> {
        let ids = match &context {
            // a question after a context: its tokens continue the context's
            Some(ctx) => {
                let plain = ChatFormat::Plain;
                let chat = st.chat.as_ref().as_ref().unwrap_or(&plain);
                ctx.question_tokens(&st.tokenizer, chat, Question::Text(&t))
                    .map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?
            }
            None => encode(st, &t)?,
        };
        Ok(PromptIn { ids, text: t })
    };
    let ids = |ids: Vec<u32>| PromptIn { text: st.tokenizer.decode(&ids).unwrap_or_default(), ids };
    let prompts: Vec<PromptIn> = match b.prompt {
        None => return Err(ApiError::bad("`prompt` is required", Some("prompt"))),
        Some(Prompt::Text(t)) => vec![text(t)?],
        Some(Prompt::Tokens(t)) => vec![ids(t)],
        Some(_) if context.is_some() => {
            return Err(ApiError::bad(
                "with `context`, `prompt` is one string or one list of token ids",
                Some("prompt"),
            ))
        }
        Some(Prompt::Texts(v)) => {
            check_prompt_count(v.len())?;
            v.into_iter().map(text).collect::<Result<_, _>>()?
        }
        Some(Prompt::TokenLists(v)) => {
            check_prompt_count(v.len())?;
            v.into_iter().map(ids).collect()
        }
    };
    let extras = Extras {
        echo: b.echo.unwrap_or(false),
        logprobs: completion_logprobs_field(&b.logprobs)?,
        n: choices_per_prompt(&common)?,
    };
    Ok(Admitted { kind: Kind::Completion, prompts, common, extras, default_max: Some(16), stops: Vec::new(), context })
}

/// A prompt list's length, checked before any of its prompts is tokenized.
fn check_prompt_count(n: usize) -> Result<(), ApiError> {
    match n {
        0 => Err(ApiError::bad("`prompt` is an empty list", Some("prompt"))),
        n if n > MAX_PROMPTS => {
            Err(ApiError::bad(format!("at most {MAX_PROMPTS} prompts per request, got {n}"), Some("prompt")))
        }
        _ => Ok(()),
    }
}

/// `/v1/chat/completions`: the messages rendered by the model's chat
/// template (the prompt), `logprobs`/`top_logprobs`, `n`.
pub(crate) fn admit_chat(st: &AppState, body: &[u8]) -> Result<Admitted, ApiError> {
    let (b, common): (ChatBody, Common) = parse(body)?;
    let Some(messages) = b.messages.filter(|m| !m.is_empty()) else {
        return Err(ApiError::bad("`messages` must be a non-empty list", Some("messages")));
    };
    let extras = Extras {
        echo: false,
        logprobs: chat_logprobs_fields(&b.logprobs, b.top_logprobs)?,
        n: choices_per_prompt(&common)?,
    };
    let chat = st.chat.as_ref().as_ref().map_err(|e| ApiError::bad(e.clone(), Some("messages")))?;
    let context = common.context.as_deref().map(|id| crate::contexts::store::lookup(st, id)).transpose()?;
    let (ids, text) = match &context {
        // the turns after a context: the template continues its messages
        Some(ctx) => {
            let turns: Vec<ChatMessage> = messages
                .into_iter()
                .map(|m| ChatMessage::new(m.role, m.content.map(Content::text).unwrap_or_default()))
                .collect();
            let ids = ctx
                .question_tokens(&st.tokenizer, chat, Question::Messages(&turns))
                .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))?;
            let text = st.tokenizer.decode(&ids).unwrap_or_default();
            (ids, text)
        }
        None => {
            // the template sees each message as sent (tool_calls, name …), with
            // content parts joined into one string; `tools` keep their key order
            let raw: RawChat = serde_json::from_slice(body).unwrap_or_default();
            let msgs: Vec<Value> = messages
                .into_iter()
                .zip(raw.messages.unwrap_or_default())
                .map(|(m, mut rawm)| {
                    let content = m.content.map_or(Value::Null, |c| Value::String(c.text()));
                    if let Some(o) = rawm.as_object_mut() {
                        o.insert("role".into(), Value::String(m.role));
                        o.insert("content".into(), content);
                    }
                    rawm
                })
                .collect();
            let msgs = kvslim_models::chat::serde_to_value(&Value::Array(msgs));
            let tools = raw.tools.map(|t| t.0);
            let text = chat.render(msgs, tools).map_err(|e| ApiError::bad(e.to_string(), Some("messages")))?;
            let ids = chat
                .encode(&st.tokenizer, &text)
                .map_err(|e| ApiError::bad(format!("cannot tokenize the prompt: {e}"), Some("messages")))?;
            (ids, text)
        }
    };
    let stops = chat.stops();
    Ok(Admitted {
        kind: Kind::Chat,
        prompts: vec![PromptIn { ids, text }],
        common,
        extras,
        default_max: None,
        stops,
        context,
    })
}

/// The prompt ids a chat body's `messages` render to, exactly as
/// `/v1/chat/completions` builds them (template, generation prompt,
/// special tokens), for `/v1/kv/inspect`.
pub(crate) fn chat_prompt_ids(st: &AppState, body: &[u8]) -> Result<Vec<u32>, ApiError> {
    let mut a = admit_chat(st, body)?;
    Ok(a.prompts.pop().map(|p| p.ids).unwrap_or_default())
}

/// Admits and plans a request for `kind`'s endpoint: a body is accepted
/// here exactly when the endpoint would queue it. Returns the number of
/// sequences it would queue (prompts × `n`). Nothing is queued.
pub fn check_body(st: &AppState, kind: Kind, body: &[u8]) -> Result<usize, ApiError> {
    let admitted = match kind {
        Kind::Completion => admit_completion(st, body)?,
        Kind::Chat => admit_chat(st, body)?,
    };
    let p = plan(st, admitted)?;
    Ok(p.prompts.len() * p.extras.n)
}
