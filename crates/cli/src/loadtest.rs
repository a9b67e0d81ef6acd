//! `kvslim loadtest`: concurrent streaming clients against a running
//! `kvslim serve`, over plain TCP ([`kvslim_loadtest::load`]); reports
//! throughput and latency percentiles. With `--soak SECONDS` it runs the
//! soak driver instead
//! ([`kvslim_loadtest::soak`]): normal traffic mixed with cancellations and
//! abuse, every answer checked. `--prompt-file`/`--prompt-tokens` send
//! prompts of an exact token count cut from a text
//! ([`kvslim_loadtest::prompts`]) in both modes.

use crate::common::CliResult;
use kvslim_loadtest::clients::Clients;
use kvslim_loadtest::{http_client, load};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Total requests over all clients.
    #[arg(long, default_value_t = 256)]
    requests: usize,
    /// Tokens per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Prompt text.
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Cut the prompts from this text instead of --prompt: windows spread
    /// over it, each exactly --prompt-tokens tokens by the server's
    /// tokenizer (`/tokenize`), sent as token ids. One window per request
    /// (distinct prompts, so no request reuses another's prefix); with
    /// --soak, 4 windows.
    #[arg(long, requires = "prompt_tokens", conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// Tokens per prompt cut from --prompt-file (must leave a token of the
    /// server's context).
    #[arg(long, requires = "prompt_file")]
    prompt_tokens: Option<usize>,
    /// `kv_policy` sent with each request (default: the server's).
    #[arg(long)]
    kv_policy: Option<String>,
    /// Soak: the `kv_policy` mix of greedy and sampled requests, `;`-separated
    /// (each request draws one; every one must be accepted by the server).
    /// Default: `full;h2o:heavy=8,recent=8;window:recent=16`.
    #[arg(long, value_parser = parse_policies, requires = "soak")]
    kv_policies: Option<PolicyList>,
    /// Poll the server's /metrics every 100 ms during the run and report
    /// the largest KV bytes in use, running requests and decode batch seen
    /// (not through a balancer: it would spread the polls over replicas).
    #[arg(long, conflicts_with = "soak")]
    watch_metrics: bool,
    /// Seconds a client waits for data from the server (each read; a queued
    /// stream waits this long for its first chunk). The soak waits 900.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Soak mode: for this many seconds every client loops over a mix of
    /// greedy (checked against solo runs made first), sampled, cancelled and
    /// beam requests and malformed, oversized, unknown-policy and
    /// beyond-context ones (each must get its status code); then waits for
    /// the server to go idle and checks its KV bytes are back to 0. Fails
    /// on any unexpected answer. --requests and --prompt are not used.
    #[arg(long, value_name = "SECONDS")]
    soak: Option<f64>,
    /// The server's process ID: its peak resident memory (VmHWM from /proc;
    /// for a server started just before, that is often the moment its
    /// weights were loaded) and its largest resident memory sampled during
    /// the run (VmRSS every 100 ms; the soak: every second) go in the report.
    #[arg(long)]
    server_pid: Option<u32>,
    /// API key sent as `Authorization: Bearer` (also KVSLIM_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Body size declared by the soak's oversized requests (units as for
    /// --max-body-bytes); must exceed the server's --max-body-bytes.
    #[arg(long, default_value = "2MiB", value_parser = kvslim_cache::size::parse_bytes)]
    oversize_bytes: usize,
    /// Soak: also send clients that stall in their headers (each waits for
    /// the server's --header-timeout, so keep that short).
    #[arg(long)]
    stalled: bool,
    /// Soak: seed of the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `--kv-policies`: one argument holding a `;`-separated list.
#[derive(Clone, Debug)]
struct PolicyList(Vec<String>);

fn parse_policies(s: &str) -> Result<PolicyList, String> {
    kvslim_loadtest::soak::parse_policy_list(s).map(PolicyList)
}

/// The server at `addr` and the clients of `a` (the key from `--api-key`
/// or `KVSLIM_API_KEY`).
fn clients(a: &Args, addr: String) -> Clients {
    Clients {
        addr,
        api_key: a.api_key.clone().or_else(|| std::env::var("KVSLIM_API_KEY").ok()).filter(|k| !k.is_empty()),
        server_pid: a.server_pid,
        count: a.clients,
        max_tokens: a.max_tokens,
        prompt_file: a.prompt_file.clone(),
        prompt_tokens: a.prompt_tokens,
    }
}

/// `--soak`: runs [`kvslim_loadtest::soak::run`] and prints its report.
fn soak(a: &Args, secs: f64) -> CliResult {
    let (addr, prefix) = http_client::split_url(&a.url)?;
    if !prefix.is_empty() {
        return Err("--soak needs a server URL without a path".into());
    }
    let cfg = kvslim_loadtest::soak::SoakConfig {
        clients: clients(a, addr),
        duration: Duration::from_secs_f64(secs),
        oversize_bytes: a.oversize_bytes,
        stalled: a.stalled,
        seed: a.seed,
        policies: a
            .kv_policies
            .clone()
            .map(|l| l.0)
            .unwrap_or_else(|| kvslim_loadtest::soak::DEFAULT_POLICIES.iter().map(|p| p.to_string()).collect()),
    };
    let report = kvslim_loadtest::soak::run(&cfg)?;
    if a.json {
        println!("{}", report.json);
    } else {
        println!("{}", serde_json::to_string_pretty(&report.json)?);
    }
    for f in &report.failures {
        eprintln!("unexpected: {f}");
    }
    if !report.passed() {
        return Err(format!(
            "soak failed: {} unexpected answers, KV bytes at end {}",
            report.failed, report.kv_bytes_at_end
        )
        .into());
    }
    Ok(())
}

pub fn run(a: Args) -> CliResult {
    if a.clients == 0 || a.requests == 0 {
        return Err("--clients and --requests must be at least 1".into());
    }
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        return Err("--timeout must be a positive number of seconds".into());
    }
    if let Some(secs) = a.soak {
        return soak(&a, secs);
    }
    let (addr, prefix) = http_client::split_url(&a.url)?;
    if a.watch_metrics && !prefix.is_empty() {
        return Err("--watch-metrics needs a server URL without a path (it reads /metrics)".into());
    }
    if a.prompt_file.is_some() && a.prompt_tokens.is_some() && !prefix.is_empty() {
        return Err("--prompt-file needs a server URL without a path (it calls /tokenize)".into());
    }
    let report = load::run(&load::LoadConfig {
        clients: clients(&a, addr),
        prefix,
        requests: a.requests,
        prompt: a.prompt,
        kv_policy: a.kv_policy,
        watch_metrics: a.watch_metrics,
        timeout: Duration::from_secs_f64(a.timeout),
    })?;
    if a.json {
        println!("{}", report.json);
    } else {
        print!("{}", report.summary());
    }
    for e in report.errors.iter().take(5) {
        eprintln!("error: {e}");
    }
    if !report.errors.is_empty() {
        return Err(format!("{} of {} requests failed", report.errors.len(), a.requests).into());
    }
    Ok(())
}
