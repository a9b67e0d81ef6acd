//! The load generator (`kvslim loadtest`): concurrent streaming clients
//! share a fixed number of requests; the report gives throughput, latency,
//! time to first token and stall percentiles, and what a watcher saw on the
//! server's `/metrics` and resident memory meanwhile.

use crate::clients::Clients;
use crate::http_client;
use crate::soak::{pct, peak_rss, rss};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a load run sends, and where.
pub struct LoadConfig {
    /// The server, the clients and their prompt file; without one, every
    /// request sends `prompt`.
    pub clients: Clients,
    /// The path before `/v1/completions` (a balancer's prefix, or empty).
    pub prefix: String,
    /// Total requests over all clients.
    pub requests: usize,
    /// The prompt text, unless `prompt_file` is given.
    pub prompt: String,
    /// `kv_policy` sent with each request (default: the server's).
    pub kv_policy: Option<String>,
    /// Poll `/metrics` every 100 ms for the peaks of the report.
    pub watch_metrics: bool,
    /// How long a client waits for each read.
    pub timeout: Duration,
}

/// The outcome of [`run`].
pub struct LoadReport {
    /// Everything measured, as one JSON object.
    pub json: Value,
    /// Why each failed request failed, in the order they ended.
    pub errors: Vec<String>,
    summary: String,
}

impl LoadReport {
    /// The report for a reader: a few lines, each ending in a newline.
    pub fn summary(&self) -> &str {
        &self.summary
    }
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
        let v: Value =
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

/// A `/metrics` value.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The largest values a watcher saw during the run: on `/metrics`, and
/// the server's resident memory (`VmRSS`, with `server_pid`).
#[derive(Default)]
struct Peaks {
    kv_bytes: f64,
    running: f64,
    batch: f64,
    rss: Option<u64>,
}

/// The request bodies: one per prompt window cut from the prompt file, or
/// the one prompt text.
fn bodies(cfg: &LoadConfig, headers: &[(&str, &str)]) -> Result<Vec<String>, String> {
    let c = &cfg.clients;
    let prompts: Vec<Value> = match (&c.prompt_file, c.prompt_tokens) {
        (Some(file), Some(n)) => crate::prompts::from_file_on(&c.addr, headers, file, cfg.requests, n)?
            .into_iter()
            .map(|ids| json!(ids))
            .collect(),
        _ => vec![json!(cfg.prompt)],
    };
    Ok(prompts
        .iter()
        .map(|p| {
            let mut body =
                json!({"prompt": p, "max_tokens": c.max_tokens, "temperature": 0.8, "seed": 1, "stream": true});
            if let Some(p) = &cfg.kv_policy {
                body["kv_policy"] = json!(p);
            }
            body.to_string()
        })
        .collect())
}

/// Sends `cfg.requests` requests from `cfg.clients.count` clients and measures
/// them. Failed requests are in the report; only preparing the prompts
/// fails the run.
pub fn run(cfg: &LoadConfig) -> Result<LoadReport, String> {
    let (addr, auth) = (&cfg.clients.addr, cfg.clients.auth());
    let path = format!("{}/v1/completions", cfg.prefix);
    let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
    let bodies = Arc::new(bodies(cfg, &headers)?);
    let timeout = cfg.timeout;
    let next = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (addr, auth, done) = (addr.clone(), auth.clone(), done.clone());
        let (watch, pid) = (cfg.watch_metrics, cfg.clients.server_pid);
        std::thread::spawn(move || {
            let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
            let mut p = Peaks::default();
            while (watch || pid.is_some()) && !done.load(Ordering::Relaxed) {
                if let Some(r) = pid.and_then(rss) {
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
    let threads: Vec<_> = (0..cfg.clients.count.min(cfg.requests))
        .map(|_| {
            let (next, samples, errors) = (next.clone(), samples.clone(), errors.clone());
            let (addr, path, bodies, total) = (addr.clone(), path.clone(), bodies.clone(), cfg.requests);
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
    let watched = cfg.watch_metrics;
    let json = json!({
        "clients": cfg.clients.count,
        "requests": cfg.requests,
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
        "prompt_tokens_each": cfg.clients.prompt_tokens,
        "kv_policy": cfg.kv_policy,
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
        "peak_rss_bytes": cfg.clients.server_pid.and_then(peak_rss),
        "rss_max_sampled_bytes": peaks.rss,
    });
    let mut summary = String::new();
    // writing to a String cannot fail
    let _ = writeln!(
        summary,
        "{} clients, {} requests: {} ok, {} errors in {:.2} s — {:.1} req/s, {:.0} tok/s; latency p50 {:.0} ms p99 {:.0} ms; TTFT p50 {:.0} ms p99 {:.0} ms",
        cfg.clients.count,
        cfg.requests,
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
    let _ = writeln!(
        summary,
        "prompt tokens {prompt_tokens} ({prompt_reused} from the prefix cache): {:.0} prefilled tok/s, {:.0} tok/s prompt + generated",
        prefilled as f64 / wall,
        (prefilled + tokens) as f64 / wall
    );
    if watched {
        let _ = writeln!(
            summary,
            "peak KV bytes in use {:.0}, peak running requests {:.0}, peak batch {:.0}",
            peaks.kv_bytes, peaks.running, peaks.batch
        );
    }
    if !by_kind.is_empty() {
        let _ = writeln!(summary, "errors by kind: {}", json["errors_by_kind"]);
    }
    Ok(LoadReport { json, errors: errors.iter().map(|e| e.to_string()).collect(), summary })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_reads_one_exposition_line() {
        let text = "# HELP x\nkvslim_kv_bytes_in_use 4096\nkvslim_kv_bytes_in_use_peak 9\nkvslim_batch_size 3.5\n";
        assert_eq!(metric(text, "kvslim_kv_bytes_in_use"), Some(4096.0));
        assert_eq!(metric(text, "kvslim_batch_size"), Some(3.5));
        assert_eq!(metric(text, "kvslim_running_requests"), None);
    }

    #[test]
    fn failures_count_by_kind() {
        assert_eq!(Failure::Status(502, String::new()).kind(), "http_502");
        assert_eq!(Failure::Cut("x".into()).to_string(), "stream cut off: x");
    }
}
