//! `kvslim serve`: the OpenAI-compatible HTTP server, and its web page at
//! `/` (chat, KV inspector, status).

use crate::common::{require_tokenizer, CliResult, ModelArgs, PolicyArgs};
use crate::draft::DraftArgs;
use kvslim_cache::size::parse_bytes;
use kvslim_server::{AppState, HttpLimits, Limits, ServeOptions, ServerConfig};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on. The default keeps the server on this machine;
    /// before `--host 0.0.0.0` (or any other address) set an API key: the
    /// server runs whatever it is sent.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    policy: PolicyArgs,
    /// KV memory pool shared by running requests (e.g. 2GiB, 512MiB; KB,
    /// MB, GB count in powers of 1000, KiB, MiB, GiB in powers of 1024).
    #[arg(long, default_value = "2GiB", value_parser = parse_bytes)]
    kv_memory: usize,
    /// Most sequences in one decode batch.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Most requests waiting for admission; more get 429.
    #[arg(long, default_value_t = 64)]
    queue_limit: usize,
    /// KV page size in tokens for `full` requests (and `compact=`/`page_score=`
    /// ones) whose policy names no `page=`: their K/V come from a page pool
    /// shared by all requests (copy-on-write prefix sharing, pages reserved
    /// by a worst-case rule). Token eviction stays on fixed slots unless it
    /// says `page=P`. 0 = fixed slots for everything. An explicit `page=` wins.
    #[arg(long, default_value_t = 16)]
    kv_page_size: usize,
    /// Entries of the prompt-prefix cache (LRU; 0 = off). A request whose
    /// prompt (and policy) was prefilled before forks that cache instead of
    /// prefilling; under `full` a prompt sharing a common prefix of at least
    /// a page with a cached one forks it cut back to that prefix. Paged
    /// policies only.
    #[arg(long, default_value_t = 16)]
    prefix_cache: usize,
    /// Prompt tokens prefilled per decode step while other requests are
    /// generating, for prompts not in mixed batches (--mixed-chunk). A long
    /// prompt's prefill runs a few layers at a time between decode steps,
    /// so running requests keep streaming (a 4K-token prompt on a 1.5B
    /// model otherwise stalls them for its whole prefill); the result is
    /// the same as one prefill. Smaller: smoother streams, later first
    /// tokens for new requests. With nothing generating a prefill runs to
    /// its end.
    #[arg(long, default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    prefill_chunk: usize,
    /// Most of the time prompts' prefills may take while other requests are
    /// generating (0 < share ≤ 1): after each prefill slice the running
    /// requests decode until prefills are back within this share. Higher:
    /// earlier first tokens for new requests; lower: faster streams for
    /// running ones. 1 = one decode step per slice.
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    prefill_share: f64,
    /// Mixed batches: while other requests are generating, a prompt whose
    /// policy keeps every token (`full`, any kv_dtype) is prefilled in
    /// chunks of this many tokens, each in the same forward pass as the
    /// running requests' next tokens, so their decode steps ride on the
    /// chunk's weight reads (vLLM's chunked prefill). More throughput and
    /// earlier first tokens; a running request's next token waits for a
    /// whole chunk (about 0.5 s for 128 tokens of a 1.5B model on 2 cores).
    /// The chunks change the prompt's numbers by rounding only. A prompt
    /// under a policy that chooses what to keep at prefill (H2O, SnapKV)
    /// must be seen whole: it joins a pass whole when it has at most 4×
    /// this many tokens, else it is prefilled in layer slices between
    /// decode steps (--prefill-chunk, --prefill-share), as every prompt is
    /// with 0 (off).
    #[arg(long, default_value_t = 128)]
    mixed_chunk: usize,
    /// Turn off speculative decoding. By default a greedy request decoding
    /// alone (no other request running, no log-probs) verifies n-gram
    /// drafts copied from its prompt and output in one pass — the same
    /// tokens, 2–3× faster on answers that copy their prompt (code edits),
    /// about the same speed elsewhere; only on models whose matrices all
    /// have integer products (quantized GGUF), where a pass reads the
    /// weights once.
    #[arg(long)]
    no_speculative: bool,
    /// With --draft-model, a lone greedy request's speculative passes take
    /// the draft model's drafts where nothing is copied.
    #[command(flatten)]
    draft: DraftArgs,
    /// Keep compressed contexts (`POST /v1/contexts`) in this folder as
    /// files (`ctx-….kvctx`, the format of `kvslim compress`): they are
    /// loaded again at start-up (a bad file is refused with a log line
    /// naming it) and a context id not in memory is looked for here, so
    /// replicas sharing the folder serve each other's contexts.
    #[arg(long, value_name = "DIR")]
    contexts_dir: Option<std::path::PathBuf>,
    /// Model name reported by the API (default: the --model value).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Largest request body accepted (e.g. 1MiB, 64KiB; units as for
    /// --kv-memory); larger ones get
    /// 413 before their body is read, so a client cannot make the server
    /// buffer (or tokenize) more than this.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    max_body_bytes: usize,
    /// Seconds a client has to send a request's headers, from when the server
    /// starts waiting for them (connection opened, or the previous response
    /// on a kept-alive connection sent); a client that stalls mid-request
    /// gets 408 and its connection is closed, an idle connection is closed.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers
    /// arrived; slower ones get 408 and their connection is closed.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    body_timeout: f64,
    /// Deadline of a request in seconds from its arrival (queueing included;
    /// 0 = none). Past it generation stops, the KV is freed at once and the
    /// client gets 504 (or an error chunk ending the stream) with code
    /// `request_timeout`.
    #[arg(long, default_value_t = 600.0, value_parser = parse_seconds)]
    request_timeout: f64,
    /// Connections served at once; one more gets 503 (code
    /// `too_many_connections`) and is closed. Keep it under the process's
    /// open-file limit (`ulimit -n`).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    /// (401 otherwise). Also read from the KVSLIM_API_KEY environment
    /// variable, which keeps the key out of the process list.
    #[arg(long)]
    api_key: Option<String>,
    /// Read the API key from this file (surrounding whitespace trimmed).
    #[arg(long, conflicts_with = "api_key")]
    api_key_file: Option<std::path::PathBuf>,
    /// On SIGTERM or SIGINT the server stops admitting (503, /health says
    /// draining) and lets running requests finish for up to this many
    /// seconds, then exits 0. A second signal exits at once.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    grace_period: f64,
}

/// A non-negative number of seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}`: expected a number of seconds ≥ 0")),
    }
}

/// The API key from --api-key, --api-key-file or KVSLIM_API_KEY (in that
/// order); an empty key counts as none.
fn api_key(a: &Args) -> Result<Option<String>, String> {
    let key = if let Some(k) = &a.api_key {
        Some(k.clone())
    } else if let Some(p) = &a.api_key_file {
        let k = std::fs::read_to_string(p).map_err(|e| format!("--api-key-file {}: {e}", p.display()))?;
        let k = k.trim().to_string();
        if k.is_empty() {
            return Err(format!("--api-key-file {}: the file is empty", p.display()));
        }
        Some(k)
    } else {
        std::env::var("KVSLIM_API_KEY").ok()
    };
    Ok(key.map(|k| k.trim().to_string()).filter(|k| !k.is_empty()))
}

pub fn run(a: Args) -> CliResult {
    if a.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    if a.max_connections == 0 {
        return Err("--max-connections must be at least 1".into());
    }
    if a.header_timeout == 0.0 || a.body_timeout == 0.0 {
        return Err("--header-timeout and --body-timeout must be more than 0".into());
    }
    let key = api_key(&a)?;
    if let Some(d) = &a.contexts_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("--contexts-dir {}: {e}", d.display()))?;
    }
    let (loaded, path) = a.model.load_with_path()?;
    require_tokenizer(&loaded.tokenizer)?;
    let tokenizer = loaded.tokenizer.expect("checked above");
    let draft = a.draft.load(&tokenizer, a.model.f32_activations)?;
    if draft.is_some() && a.no_speculative {
        return Err("--draft-model drafts for speculative passes, which --no-speculative turns off".into());
    }
    // a broken template does not stop the server: completions still work,
    // chat requests answer 400 with this message
    let chat = a.model.chat_format(&tokenizer, &path).map_err(|e| e.to_string());
    match &chat {
        Ok(kvslim_models::chat::ChatFormat::Template(t)) => {
            eprintln!("kvslim serve: chat template from {}", t.source())
        }
        Ok(_) => eprintln!("kvslim serve: the model has no chat template; chat uses plain `role: content` lines"),
        Err(e) => eprintln!("kvslim serve: warning: {e}; /v1/chat/completions will answer 400"),
    }
    let config = ServerConfig {
        policy: a.policy.spec.clone(),
        limits: Limits {
            kv_memory: a.kv_memory,
            max_batch: a.max_batch,
            queue_limit: a.queue_limit,
            kv_page_size: a.kv_page_size,
            prefix_cache: a.prefix_cache,
            prefill_chunk: a.prefill_chunk,
            prefill_share: a.prefill_share,
            mixed_chunk: a.mixed_chunk,
            speculative: !a.no_speculative,
            contexts_dir: a.contexts_dir.clone(),
            draft: draft.map(|d| kvslim_server::DraftModel { model: Arc::new(d.model), policy: d.policy }),
        },
        model_name: a.served_model_name.unwrap_or_else(|| a.model.model.clone()),
    };
    let http = HttpLimits {
        max_body_bytes: a.max_body_bytes,
        header_timeout: Duration::from_secs_f64(a.header_timeout),
        body_timeout: Duration::from_secs_f64(a.body_timeout),
        request_timeout: (a.request_timeout > 0.0).then(|| Duration::from_secs_f64(a.request_timeout)),
        max_connections: a.max_connections,
    };
    let auth = key.is_some();
    let state = AppState::new(Arc::new(loaded.model), Arc::new(tokenizer), config)
        .with_chat(chat)
        .with_http_limits(http)
        .with_api_key(key);
    let listener = std::net::TcpListener::bind((a.host.as_str(), a.port))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && !auth {
        eprintln!(
            "kvslim serve: warning: listening on {local} without an API key: anyone who can reach it can run the model (set --api-key or KVSLIM_API_KEY)"
        );
    }
    eprintln!(
        "kvslim serve: http://{} (policy {}, KV pool {} bytes, page size {}, prefix cache {}, prefill chunk {} (share {}), mixed chunk {}, max batch {}, queue limit {})",
        local,
        a.policy.spec,
        a.kv_memory,
        a.kv_page_size,
        a.prefix_cache,
        a.prefill_chunk,
        a.prefill_share,
        a.mixed_chunk,
        a.max_batch,
        a.queue_limit
    );
    eprintln!("kvslim serve: web page (chat, KV inspector, status) at http://{local}/");
    if auth {
        eprintln!("kvslim serve: API key required (Authorization: Bearer …) on every endpoint but /health");
    }
    let opts = ServeOptions { workers: 2, grace_period: Duration::from_secs_f64(a.grace_period), signals: true };
    kvslim_server::serve_with(listener, state, &opts)?;
    Ok(())
}

/// A share of the time in (0, 1].
fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a share of the time: give a number in (0, 1], e.g. 0.5")),
    }
}
