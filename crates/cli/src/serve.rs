//! `kvslim serve`: the OpenAI-compatible HTTP server.

use crate::common::{require_tokenizer, CliResult, ModelArgs};
use kvslim_cache::PolicySpec;
use kvslim_server::{parse_bytes, AppState, Limits, ServerConfig};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Default KV cache policy for requests without `kv_policy`.
    #[arg(long, default_value = "full", value_parser = PolicySpec::parse_and_load)]
    policy: PolicySpec,
    /// KV memory pool shared by running requests (e.g. 2GiB, 512MiB).
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
    /// Model name reported by the API (default: the --model value).
    #[arg(long)]
    served_model_name: Option<String>,
}

pub fn run(a: Args) -> CliResult {
    if a.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    let (loaded, path) = a.model.load_with_path()?;
    require_tokenizer(&loaded.tokenizer)?;
    let tokenizer = loaded.tokenizer.expect("checked above");
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
        policy: a.policy.clone(),
        limits: Limits {
            kv_memory: a.kv_memory,
            max_batch: a.max_batch,
            queue_limit: a.queue_limit,
            kv_page_size: a.kv_page_size,
            prefix_cache: a.prefix_cache,
        },
        model_name: a.served_model_name.unwrap_or_else(|| a.model.model.clone()),
    };
    let state = AppState::new(Arc::new(loaded.model), Arc::new(tokenizer), config).with_chat(chat);
    let listener = std::net::TcpListener::bind((a.host.as_str(), a.port))?;
    eprintln!(
        "kvslim serve: http://{} (policy {}, KV pool {} bytes, page size {}, prefix cache {}, max batch {}, queue limit {})",
        listener.local_addr()?,
        a.policy,
        a.kv_memory,
        a.kv_page_size,
        a.prefix_cache,
        a.max_batch,
        a.queue_limit
    );
    kvslim_server::serve_blocking(listener, state, 2)?;
    Ok(())
}
