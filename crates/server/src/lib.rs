//! `kvslim serve`: an OpenAI-compatible HTTP server (axum + tokio) in front
//! of a continuous-batching scheduler that runs on its own thread.
//!
//! * [`guard`]: body-size and slow-client limits, the API key, and the
//!   draining state of a graceful shutdown (middleware in front of every
//!   route); [`serve_with`] runs the connection loop that enforces the
//!   header timeout and drains on SIGTERM/SIGINT or [`guard::Shutdown::drain`].
//! * [`scheduler`]: admission by KV memory, batched decode, per-request
//!   policy, sampling, stop strings and cancellation.
//! * [`api`]: `/v1/completions`, `/v1/chat/completions` (SSE streaming,
//!   log-probs, `echo`, several prompts and `n`), `/v1/models`, `/health`,
//!   `/metrics`, and vLLM's `/tokenize`, `/detokenize`, `/tokenizer_info`
//!   (what lm-evaluation-harness's `remote` tokenizer backend calls).
//! * [`error`]: error responses in OpenAI's shape, and reading a body as
//!   JSON, for every handler.
//! * [`request`]: request bodies parsed, validated and sized (every limit
//!   checked) before the scheduler sees them; [`request::check_body`] is
//!   the request-JSON fuzz target.
//! * [`contexts`]: compressed contexts, `POST/GET /v1/contexts`, `GET/DELETE
//!   /v1/contexts/{id}`, and `"context": ID` on the completion endpoints
//!   (a document compressed once, asked on forks sharing its pages; saved in
//!   `--contexts-dir`).
//! * [`inspect`]: `POST /v1/kv/inspect`, the positions a policy keeps for a
//!   text per layer and KV head (what `kvslim perplexity --kept-out` writes).
//! * [`web`]: the web page at `/` (chat, KV inspector, status), embedded
//!   in the binary.
//!
//! The clients (HTTP helpers for the tests, the soak driver) are in
//! `kvslim-loadtest`.

pub mod api;
pub mod chat;
pub mod contexts;
pub mod error;
pub mod guard;
pub mod inspect;
pub mod metrics;
pub mod request;
pub mod scheduler;
pub mod web;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use kvslim_cache::PolicySpec;
use kvslim_models::{Model, Tokenizer};
use std::sync::Arc;
use std::time::Duration;

pub use guard::{HttpLimits, Shutdown};
pub use scheduler::{DraftModel, Limits, SchedulerHandle};

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Policy for requests without `kv_policy`.
    pub policy: PolicySpec,
    pub limits: Limits,
    /// Name reported by `/v1/models` and in responses.
    pub model_name: String,
}

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub scheduler: SchedulerHandle,
    pub default_policy: PolicySpec,
    pub model_name: String,
    /// The chat format, or why the model's template could not be loaded
    /// (then chat requests answer 400 with that message).
    pub chat: Arc<Result<chat::ChatFormat, String>>,
    pub started: u64,
    /// Body size, slow-client and per-request time limits.
    pub http: HttpLimits,
    /// With a key, every endpoint but `/health` requires
    /// `Authorization: Bearer KEY`.
    pub api_key: Option<Arc<str>>,
    /// Draining state; [`Shutdown::drain`] starts a graceful shutdown.
    pub shutdown: Shutdown,
    /// `/v1/kv/inspect` runs one at a time (each takes every core).
    pub inspect_slot: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// Starts the scheduler thread for `model`.
    pub fn new(model: Arc<Model>, tokenizer: Arc<Tokenizer>, config: ServerConfig) -> Self {
        let scheduler = scheduler::spawn(model.clone(), tokenizer.clone(), config.limits.clone());
        if let Some(dir) = &config.limits.contexts_dir {
            let l = &config.limits;
            let (s, m) = (&scheduler, &scheduler.metrics);
            let (loaded, refused) = s.contexts.load_dir(&model, &s.pools, m, l.kv_memory, l.kv_page_size);
            eprintln!("kvslim serve: {loaded} contexts loaded from {}, {refused} refused", dir.display());
        }
        let chat = Arc::new(
            chat::ChatFormat::for_tokenizer(&tokenizer, None, "the model's tokenizer").map_err(|e| e.to_string()),
        );
        let started = now();
        AppState {
            model,
            tokenizer,
            scheduler,
            default_policy: config.policy,
            model_name: config.model_name,
            chat,
            started,
            http: HttpLimits::default(),
            api_key: None,
            shutdown: Shutdown::default(),
            inspect_slot: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// Replaces the default [`HttpLimits`].
    pub fn with_http_limits(mut self, http: HttpLimits) -> Self {
        self.http = http;
        self
    }

    /// Requires `Authorization: Bearer KEY` on every endpoint but `/health`
    /// (`None` or an empty key: no authentication).
    pub fn with_api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key.filter(|k| !k.is_empty()).map(Arc::from);
        self
    }
}

impl AppState {
    /// Replaces the chat format (the CLI loads it with the model's
    /// `tokenizer_config.json` and file name, for exact token strings and
    /// error messages that name the file).
    pub fn with_chat(mut self, chat: Result<chat::ChatFormat, String>) -> Self {
        self.chat = Arc::new(chat);
        self
    }
}

/// The HTTP routes, behind the [`guard`] layers (API key, draining, body
/// limits; outermost first).
pub fn router(state: AppState) -> Router {
    use axum::middleware::from_fn_with_state;
    Router::new()
        .route("/", get(web::index))
        .route("/web/{file}", get(web::asset))
        .route("/v1/kv/inspect", post(inspect::inspect))
        .route("/v1/kv/policy", post(inspect::check_policy))
        .route("/v1/contexts", post(contexts::create).get(contexts::list))
        .route("/v1/contexts/{id}", get(contexts::read).delete(contexts::delete))
        .route("/v1/completions", post(api::completions))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/models", get(api::models))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/tokenizer_info", get(api::tokenizer_info))
        .route("/health", get(api::health))
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        // bodies are read (and limited) by `guard::read_body`
        .layer(DefaultBodyLimit::disable())
        .layer(from_fn_with_state(state.clone(), guard::read_body))
        .layer(from_fn_with_state(state.clone(), guard::drain))
        .layer(from_fn_with_state(state.clone(), guard::auth))
        .with_state(state)
}

/// How [`serve_with`] runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Tokio worker threads for the HTTP side (inference has its own thread).
    pub workers: usize,
    /// Once draining, how long admitted requests may still run before the
    /// server returns anyway.
    pub grace_period: Duration,
    /// Drain on SIGTERM or SIGINT (a second one exits at once, status 1).
    pub signals: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { workers: 2, grace_period: Duration::from_secs(30), signals: false }
    }
}

/// Serves on an already bound listener until `state.shutdown` is drained
/// (blocking; builds its own tokio runtime with `workers` threads, no
/// signal handling).
pub fn serve_blocking(listener: std::net::TcpListener, state: AppState, workers: usize) -> std::io::Result<()> {
    serve_with(listener, state, &ServeOptions { workers, ..ServeOptions::default() })
}

/// Serves on an already bound listener (blocking, own tokio runtime) and
/// returns after a graceful shutdown: once draining starts (a signal when
/// `opts.signals`, or [`Shutdown::drain`]) new requests get 503 while the
/// admitted ones finish, up to `opts.grace_period`.
pub fn serve_with(listener: std::net::TcpListener, state: AppState, opts: &ServeOptions) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(opts.workers.max(1)).enable_all().build()?;
    let result = rt.block_on(conn::serve(listener, state, opts.clone()));
    // connections still open past the grace period are dropped, not awaited
    rt.shutdown_timeout(Duration::from_millis(100));
    result
}

mod conn;

/// Seconds since the Unix epoch (`created` of responses and contexts).
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
