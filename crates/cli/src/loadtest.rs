//! `kvslim loadtest`: concurrent streaming clients against a running
//! `kvslim serve`, over plain TCP; reports throughput and latency
//! percentiles. With `--soak SECONDS` it runs the soak driver instead
//! ([`kvslim_loadtest::soak`]): normal traffic mixed with cancellations and
//! abuse, every answer checked. `--prompt-file`/`--prompt-tokens` send
//! prompts of an exact token count cut from a text
//! ([`kvslim_loadtest::prompts`]) in both modes.

use crate::common::CliResult;
use kvslim_loadtest::http_client;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Body size declared by the soak's oversized requests; must exceed the
    /// server's --max-body-bytes.
    #[arg(long, default_value = "2MiB", value_parser = kvslim_server::parse_bytes)]
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

/// `--soak`: runs [`kvslim_loadtest::soak::run`] and prints its report.
fn soak(a: &Args, secs: f64) -> CliResult {
    let (addr, prefix) = http_client::split_url(&a.url)?;
    if !prefix.is_empty() {
        return Err("--soak needs a server URL without a path".into());
    }
    let cfg = kvslim_loadtest::soak::SoakConfig {
        addr,
        clients: a.clients,
        duration: Duration::from_secs_f64(secs),
        api_key: a.api_key.clone().or_else(|| std::env::var("KVSLIM_API_KEY").ok()).filter(|k| !k.is_empty()),
        server_pid: a.server_pid,
        oversize_bytes: a.oversize_bytes,
        stalled: a.stalled,
        max_tokens: a.max_tokens,
        seed: a.seed,
        prompt_file: a.prompt_file.clone(),
        prompt_tokens: a.prompt_tokens,
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

/// Why a request failed, as the load report counts it.
enum Failure {
    /// No connection or no response head (e.g. a replica gone before the request).
    Connect(String),
    /// An HTTP error status (a balancer's 502, a server's 4xx/5xx).
    Status(u16, String),
    /// The stream carried an error chunk.
    StreamError(String),
    /// The stream broke off before `[DONE]` (e.g. the server died mid-answer).
    Cut(String),
}

impl Failure {
    /// The report's key for this kind of failure.
    fn kind(&self) -> String {
        match self {
            Failure::Connect(_) => "connect".into(),
            Failure::Status(code, _) => format!("http_{code}"),
            Failure::StreamError(_) => "stream_error".into(),
            Failure::Cut(_) => "stream_cut".into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connect: {e}"),
            Failure::Status(code, body) => write!(f, "HTTP {code}: {body}"),
            Failure::StreamError(e) => write!(f, "stream error: {e}"),
            Failure::Cut(e) => write!(f, "stream cut off: {e}"),
        }
    }
}

struct Sample {
    latency: f64,
    ttft: f64,
    /// Longest wait between two chunks of the stream after the first: how
    /// long the request stalled while the server did other work (another
    /// request's prefill).
    stall: f64,
    tokens: usize,
    /// `usage.prompt_tokens` and `usage.prompt_tokens_reused` (taken from
    /// the prefix cache, not prefilled).
    prompt_tokens: usize,
    prompt_reused: usize,
}

fn one(addr: &str, path: &str, body: &str, auth: Option<&str>, timeout: Duration) -> Result<Sample, Failure> {
    let start = Instant::now();
    let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
    let mut s = http_client::open_with(addr, "POST", path, Some(body), timeout, &headers)
        .map_err(|e| Failure::Connect(e.to_string()))?;
    if s.status != 200 {
        let mut b = String::new();
        let _ = std::io::Read::read_to_string(&mut s.body, &mut b);
        return Err(Failure::Status(s.status, b));
    }
    let mut ttft = None;
    let (mut tokens, mut prompt_tokens, mut prompt_reused) = (0, 0, 0);
    let (mut done, mut last, mut stall) = (false, None::<Instant>, 0f64);
    while let Some(data) = s.next_event().map_err(|e| Failure::Cut(e.to_string()))? {
        if data == "[DONE]" {
            done = true;
            break;
        }
        let now = Instant::now();
        if let Some(t) = last {
            stall = stall.max(now.duration_since(t).as_secs_f64());
        }
        last = Some(now);
        ttft.get_or_insert_with(|| start.elapsed().as_secs_f64());
        let v: serde_json::Value =
            serde_json::from_str(&data).map_err(|e| Failure::StreamError(format!("bad chunk {data}: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(Failure::StreamError(e.to_string()));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n as usize;
            prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            prompt_reused = v["usage"]["prompt_tokens_reused"].as_u64().unwrap_or(0) as usize;
        }
    }
    if !done {
        return Err(Failure::Cut("the stream ended without [DONE]".into()));
    }
    Ok(Sample {
        latency: start.elapsed().as_secs_f64(),
        ttft: ttft.unwrap_or(0.0),
        stall,
        tokens,
        prompt_tokens,
        prompt_reused,
    })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A `/metrics` value.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The largest values a watcher saw during the run: on `/metrics`, and
/// the server's resident memory (`VmRSS`, with `--server-pid`).
#[derive(Default)]
struct Peaks {
    kv_bytes: f64,
    running: f64,
    batch: f64,
    rss: Option<u64>,
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
    let path = format!("{prefix}/v1/completions");
    let auth = a
        .api_key
        .clone()
        .or_else(|| std::env::var("KVSLIM_API_KEY").ok())
        .filter(|k| !k.is_empty())
        .map(|k| format!("Bearer {k}"));
    if a.watch_metrics && !prefix.is_empty() {
        return Err("--watch-metrics needs a server URL without a path (it reads /metrics)".into());
    }
    let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
    let prompts: Vec<serde_json::Value> = match (&a.prompt_file, a.prompt_tokens) {
        (Some(file), Some(n)) => {
            if !prefix.is_empty() {
                return Err("--prompt-file needs a server URL without a path (it calls /tokenize)".into());
            }
            kvslim_loadtest::prompts::from_file_on(&addr, &headers, file, a.requests, n)?
                .into_iter()
                .map(|ids| json!(ids))
                .collect()
        }
        _ => vec![json!(a.prompt)],
    };
    let bodies: Vec<String> = prompts
        .iter()
        .map(|p| {
            let mut body =
                json!({"prompt": p, "max_tokens": a.max_tokens, "temperature": 0.8, "seed": 1, "stream": true});
            if let Some(p) = &a.kv_policy {
                body["kv_policy"] = json!(p);
            }
            body.to_string()
        })
        .collect();
    let bodies = Arc::new(bodies);
    let timeout = Duration::from_secs_f64(a.timeout);
    let next = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (addr, auth, done) = (addr.clone(), auth.clone(), done.clone());
        let (watch, pid) = (a.watch_metrics, a.server_pid);
        std::thread::spawn(move || {
            let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
            let mut p = Peaks::default();
            while (watch || pid.is_some()) && !done.load(Ordering::Relaxed) {
                if let Some(r) = pid.and_then(kvslim_loadtest::soak::rss) {
                    p.rss = Some(p.rss.unwrap_or(0).max(r));
                }
                let text = match watch {
                    true => http_client::request_with(&addr, "GET", "/metrics", None, &headers).map(|r| r.text()),
                    false => Ok(String::new()),
                };
                if let Ok(t) = text {
                    p.kv_bytes = p.kv_bytes.max(metric(&t, "kvslim_kv_bytes_in_use").unwrap_or(0.0));
                    p.running = p.running.max(metric(&t, "kvslim_running_requests").unwrap_or(0.0));
                    p.batch = p.batch.max(metric(&t, "kvslim_batch_size").unwrap_or(0.0));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            p
        })
    };
    let start = Instant::now();
    let threads: Vec<_> = (0..a.clients.min(a.requests))
        .map(|_| {
            let (next, samples, errors) = (next.clone(), samples.clone(), errors.clone());
            let (addr, path, bodies, total) = (addr.clone(), path.clone(), bodies.clone(), a.requests);
            let auth = auth.clone();
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                match one(&addr, &path, &bodies[i % bodies.len()], auth.as_deref(), timeout) {
                    Ok(s) => samples.lock().expect("no panics hold it").push(s),
                    Err(e) => errors.lock().expect("no panics hold it").push(e),
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let wall = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let peaks = watcher.join().unwrap_or_default();
    let samples = samples.lock().expect("threads joined");
    let errors = errors.lock().expect("threads joined");
    let mut lat: Vec<f64> = samples.iter().map(|s| s.latency).collect();
    let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
    let mut stall: Vec<f64> = samples.iter().map(|s| s.stall).collect();
    lat.sort_by(f64::total_cmp);
    ttft.sort_by(f64::total_cmp);
    stall.sort_by(f64::total_cmp);
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let prompt_tokens: usize = samples.iter().map(|s| s.prompt_tokens).sum();
    let prompt_reused: usize = samples.iter().map(|s| s.prompt_reused).sum();
    let prefilled = prompt_tokens - prompt_reused.min(prompt_tokens);
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for e in errors.iter() {
        *by_kind.entry(e.kind()).or_default() += 1;
    }
    let watched = a.watch_metrics;
    let report = json!({
        "clients": a.clients,
        "requests": a.requests,
        "ok": samples.len(),
        "errors": errors.len(),
        "errors_by_kind": by_kind,
        "wall_s": wall,
        "requests_per_s": samples.len() as f64 / wall,
        "tokens": tokens,
        "tokens_per_s": tokens as f64 / wall,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_reused": prompt_reused,
        "prompt_tokens_per_s": prefilled as f64 / wall,
        "total_tokens_per_s": (prefilled + tokens) as f64 / wall,
        "prompt_tokens_each": a.prompt_tokens,
        "kv_policy": a.kv_policy,
        "latency_p50_s": pct(&lat, 50.0),
        "latency_p99_s": pct(&lat, 99.0),
        "ttft_p50_s": pct(&ttft, 50.0),
        "ttft_p99_s": pct(&ttft, 99.0),
        "ttft_max_s": ttft.last().copied().unwrap_or(0.0),
        "stall_p50_s": pct(&stall, 50.0),
        "stall_max_s": stall.last().copied().unwrap_or(0.0),
        "peak_kv_bytes_in_use": watched.then_some(peaks.kv_bytes),
        "peak_running_requests": watched.then_some(peaks.running),
        "peak_batch_size": watched.then_some(peaks.batch),
        "peak_rss_bytes": a.server_pid.and_then(kvslim_loadtest::soak::peak_rss),
        "rss_max_sampled_bytes": peaks.rss,
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "{} clients, {} requests: {} ok, {} errors in {:.2} s — {:.1} req/s, {:.0} tok/s; latency p50 {:.0} ms p99 {:.0} ms; TTFT p50 {:.0} ms p99 {:.0} ms",
            a.clients,
            a.requests,
            samples.len(),
            errors.len(),
            wall,
            samples.len() as f64 / wall,
            tokens as f64 / wall,
            pct(&lat, 50.0) * 1e3,
            pct(&lat, 99.0) * 1e3,
            pct(&ttft, 50.0) * 1e3,
            pct(&ttft, 99.0) * 1e3
        );
        println!(
            "prompt tokens {prompt_tokens} ({prompt_reused} from the prefix cache): {:.0} prefilled tok/s, {:.0} tok/s prompt + generated",
            prefilled as f64 / wall,
            (prefilled + tokens) as f64 / wall
        );
        if watched {
            println!(
                "peak KV bytes in use {:.0}, peak running requests {:.0}, peak batch {:.0}",
                peaks.kv_bytes, peaks.running, peaks.batch
            );
        }
        if !by_kind.is_empty() {
            println!("errors by kind: {}", serde_json::to_string(&by_kind)?);
        }
    }
    for e in errors.iter().take(5) {
        eprintln!("error: {e}");
    }
    if !errors.is_empty() {
        return Err(format!("{} of {} requests failed", errors.len(), a.requests).into());
    }
    Ok(())
}
