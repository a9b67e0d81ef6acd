//! A soak test driver: many concurrent clients against a running server
//! for a while, mixing well-formed requests with the abuse the server must
//! survive, and checking what it answers.
//!
//! Every client loops until the time is up, drawing one kind of request at
//! a time ([`Kind`]); each kind has one expected outcome (a status code, and
//! for greedy and beam requests the exact text a solo run gave before the
//! load started). Afterwards the driver waits for the server to go idle and
//! reads its `/metrics` (KV bytes in use must be back to 0) and, given the
//! server's PID, its peak resident memory (`VmHWM`).
//!
//! The prompts are four short stories260K-sized texts unless
//! [`Clients::prompt_file`] names a text: then four windows of it, each
//! cut to exactly [`Clients::prompt_tokens`] tokens by the server's
//! tokenizer and sent as token ids ([`crate::prompts`]). Greedy and
//! sampled requests draw their `kv_policy` from [`SoakConfig::policies`].
//!
//! Used by `kvslim loadtest --soak SECONDS` and by the short soak test in
//! `crates/server/tests/soak.rs`.

use crate::clients::Clients;
use crate::http_client;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the soak run does.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// The server and the clients; without a prompt file, the four
    /// built-in short prompts.
    pub clients: Clients,
    pub duration: Duration,
    /// Size declared by oversized requests (must exceed the server's
    /// `--max-body-bytes`).
    pub oversize_bytes: usize,
    /// Include clients that stall inside their headers (each waits for the
    /// server's header timeout, so keep that short).
    pub stalled: bool,
    pub seed: u64,
    /// `kv_policy` of greedy and sampled requests, one drawn per request
    /// (each greedy one checked against its solo run under that policy);
    /// [`DEFAULT_POLICIES`] unless given.
    pub policies: Vec<String>,
}

impl SoakConfig {
    /// A configuration with the defaults of `kvslim loadtest --soak`: 8
    /// clients, 48 tokens, the built-in prompts and [`DEFAULT_POLICIES`],
    /// no key, PID, stalled clients; oversized bodies declare 2 MiB.
    pub fn new(addr: impl Into<String>, duration: Duration) -> SoakConfig {
        SoakConfig {
            clients: Clients {
                addr: addr.into(),
                api_key: None,
                server_pid: None,
                count: 8,
                max_tokens: 48,
                prompt_file: None,
                prompt_tokens: None,
            },
            duration,
            oversize_bytes: 2 << 20,
            stalled: false,
            seed: 1,
            policies: DEFAULT_POLICIES.iter().map(|p| p.to_string()).collect(),
        }
    }
}

/// Splits a `;`-separated policy list (`"full;h2o:heavy=8,recent=8"`),
/// each entry trimmed; an empty list or an empty entry is an error.
pub fn parse_policy_list(s: &str) -> Result<Vec<String>, String> {
    if s.trim().is_empty() {
        return Err("the KV policy list is empty".into());
    }
    s.split(';')
        .enumerate()
        .map(|(i, p)| {
            let p = p.trim();
            if p.is_empty() {
                Err(format!("entry {} of the KV policy list `{s}` is empty", i + 1))
            } else {
                Ok(p.to_string())
            }
        })
        .collect()
}

/// The kinds of request the clients send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Streamed, temperature 0, under one of several policies: must equal
    /// the solo run's text.
    Greedy,
    /// Streamed, sampled (temperature 0.8, seeded): must complete.
    Sampled,
    /// Streamed, dropped after a few chunks (its KV must be freed).
    Cancelled,
    /// Beam search (not streamed): must equal the solo run's text.
    Beams,
    /// Broken JSON: 400.
    Malformed,
    /// A body over the server's limit: 413.
    Oversized,
    /// A `kv_policy` that does not exist: 400.
    UnknownPolicy,
    /// A prompt longer than the context: 400.
    BeyondContext,
    /// Headers never finished: 408.
    Stalled,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Greedy => "greedy",
            Kind::Sampled => "sampled",
            Kind::Cancelled => "cancelled",
            Kind::Beams => "beams",
            Kind::Malformed => "malformed",
            Kind::Oversized => "oversized",
            Kind::UnknownPolicy => "unknown_policy",
            Kind::BeyondContext => "beyond_context",
            Kind::Stalled => "stalled",
        }
    }

    /// Requests the server must answer with a completion.
    fn well_formed(self) -> bool {
        matches!(self, Kind::Greedy | Kind::Sampled | Kind::Beams | Kind::Cancelled)
    }
}

/// The built-in prompts (sized for stories260K).
pub const PROMPTS: [&str; 4] = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy"];
/// The policies greedy and sampled requests draw from by default.
pub const DEFAULT_POLICIES: [&str; 3] = ["full", "h2o:heavy=8,recent=8", "window:recent=16"];
/// Prompts cut from a `prompt_file`.
const FILE_PROMPTS: usize = 4;
const BEAMS: usize = 3;
/// How long a client waits for data from the server (a whole answer for
/// the non-streamed requests; more than the server's default
/// `--request-timeout` of 600 s, so that its 504 arrives first).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(900);

/// A soak prompt: a text, or token ids cut from a prompt file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    /// Window `index` of the prompt file, as token ids.
    Ids {
        index: usize,
        ids: Vec<u32>,
    },
}

impl Prompt {
    /// The `prompt` field of a completion request.
    pub fn json(&self) -> Value {
        match self {
            Prompt::Text(t) => json!(t),
            Prompt::Ids { ids, .. } => json!(ids),
        }
    }

    /// A short name for messages.
    pub fn label(&self) -> String {
        match self {
            Prompt::Text(t) => format!("{t:?}"),
            Prompt::Ids { index, ids } => format!("window {index} ({} tokens)", ids.len()),
        }
    }
}

/// A greedy answer every greedy request of its prompt and policy was
/// checked against: the solo run made before the load.
#[derive(Clone, Debug)]
pub struct GreedyReference {
    pub prompt: Prompt,
    pub policy: String,
    pub max_tokens: usize,
    pub text: String,
}

/// One request's outcome.
struct Outcome {
    kind: Kind,
    /// HTTP status, or 0 when no response came.
    status: u16,
    latency: f64,
    /// Why the outcome is not the expected one.
    failure: Option<String>,
}

/// The soak run's findings.
#[derive(Debug)]
pub struct SoakReport {
    pub json: Value,
    /// Requests whose outcome was not the expected one (first 20 reasons).
    pub failures: Vec<String>,
    pub failed: usize,
    /// KV bytes the server reported in use once idle after the run.
    pub kv_bytes_at_end: f64,
    /// The solo greedy runs every greedy answer was checked against, for
    /// checking them against the engine without the server.
    pub greedy_references: Vec<GreedyReference>,
}

impl SoakReport {
    /// Every request got its expected outcome and the KV came back.
    pub fn passed(&self) -> bool {
        self.failed == 0 && self.kv_bytes_at_end == 0.0
    }
}

/// What every client needs: references from the solo runs and the model's
/// context.
struct Shared {
    cfg: SoakConfig,
    prompts: Vec<Prompt>,
    /// Greedy text per (prompt, policy), from a solo run.
    greedy: Vec<Vec<String>>,
    /// Beam text per prompt, from a solo run.
    beams: Vec<String>,
    /// A prompt (token ids) one token longer than the context allows.
    too_long: Vec<u32>,
}

impl Shared {
    fn headers(&self) -> Vec<(&str, String)> {
        self.cfg.clients.auth().into_iter().map(|a| ("Authorization", a)).collect()
    }

    /// Sends `body` to `/v1/completions`; the answer is read from the stream.
    fn open(&self, body: &Value) -> std::io::Result<http_client::Streaming> {
        let h = self.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let addr = &self.cfg.clients.addr;
        http_client::open_with(addr, "POST", "/v1/completions", Some(&body.to_string()), CLIENT_TIMEOUT, &h)
    }

    fn post(&self, body: &Value) -> Result<http_client::Response, String> {
        let mut s = self.open(body).map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.body.read_to_end(&mut buf).map_err(|e| e.to_string())?;
        Ok(http_client::Response { status: s.status, headers: s.headers, body: buf })
    }

    fn get(&self, path: &str) -> Result<http_client::Response, String> {
        let h = self.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        http_client::request_with(&self.cfg.clients.addr, "GET", path, None, &h).map_err(|e| e.to_string())
    }

    fn greedy_body(&self, p: usize, pol: usize) -> Value {
        json!({"prompt": self.prompts[p].json(), "max_tokens": self.cfg.clients.max_tokens, "temperature": 0,
            "kv_policy": self.cfg.policies[pol]})
    }

    fn beam_body(&self, p: usize) -> Value {
        json!({"prompt": self.prompts[p].json(), "max_tokens": self.cfg.clients.max_tokens.min(24), "beams": BEAMS})
    }
}

/// The text of a non-streamed completion.
fn text_of(r: &http_client::Response) -> Result<String, String> {
    if r.status != 200 {
        return Err(format!("HTTP {}: {}", r.status, r.text()));
    }
    r.json()["choices"][0]["text"].as_str().map(str::to_string).ok_or_else(|| format!("no text in {}", r.text()))
}

/// Checks the configuration against the server (every policy accepted,
/// the prompts cut), then makes the solo runs (one request at a time,
/// before the load) for the references.
fn prepare(cfg: &SoakConfig) -> Result<Shared, String> {
    if cfg.policies.is_empty() {
        return Err("no KV policy to draw from: the policy list is empty".into());
    }
    if cfg.clients.prompt_file.is_some() != cfg.clients.prompt_tokens.is_some() {
        return Err("a prompt file and a prompt length (--prompt-file, --prompt-tokens) go together".into());
    }
    let mut sh = Shared {
        cfg: cfg.clone(),
        prompts: PROMPTS.iter().map(|p| Prompt::Text(p.to_string())).collect(),
        greedy: Vec::new(),
        beams: Vec::new(),
        too_long: Vec::new(),
    };
    let auth = cfg.clients.auth();
    let h: Vec<(&str, &str)> = auth.iter().map(|v| ("Authorization", v.as_str())).collect();
    for p in &cfg.policies {
        check_policy(&cfg.clients.addr, &h, p)?;
    }
    let ctx = crate::prompts::context_on(&cfg.clients.addr, &h)?;
    if let (Some(path), Some(n)) = (&cfg.clients.prompt_file, cfg.clients.prompt_tokens) {
        let w = crate::prompts::from_file_on(&cfg.clients.addr, &h, path, FILE_PROMPTS, n)?;
        sh.prompts = w.into_iter().enumerate().map(|(index, ids)| Prompt::Ids { index, ids }).collect();
    }
    let first_ids = match &sh.prompts[0] {
        Prompt::Ids { ids, .. } => ids.clone(),
        Prompt::Text(t) => crate::prompts::tokenize_on(&cfg.clients.addr, &h, t)?,
    };
    sh.too_long = first_ids.iter().copied().cycle().take(ctx + 1).collect();
    for p in 0..sh.prompts.len() {
        let row = (0..cfg.policies.len())
            .map(|pol| text_of(&sh.post(&sh.greedy_body(p, pol))?))
            .collect::<Result<_, String>>()
            .map_err(|e| format!("solo greedy run of {}: {e}", sh.prompts[p].label()))?;
        sh.greedy.push(row);
        let beams = text_of(&sh.post(&sh.beam_body(p))?)
            .map_err(|e| format!("solo beam run of {}: {e}", sh.prompts[p].label()))?;
        sh.beams.push(beams);
    }
    Ok(sh)
}

/// `POST /v1/kv/policy`: the server accepts `policy` as a request's
/// `kv_policy`, or the error says why not.
fn check_policy(addr: &str, headers: &[(&str, &str)], policy: &str) -> Result<(), String> {
    let body = json!({"kv_policy": policy}).to_string();
    let r = http_client::request_with(addr, "POST", "/v1/kv/policy", Some(&body), headers)
        .map_err(|e| format!("/v1/kv/policy: {e}"))?;
    if r.status == 200 {
        return Ok(());
    }
    let why = r.json()["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| r.text());
    Err(format!("the server refuses the KV policy `{policy}` (HTTP {}): {why}", r.status))
}

/// A client's random choices: SplitMix64, the stream of `kvslim_cache`'s
/// generator (a `--seed` draws the requests it always drew), kept here so
/// a load client needs no cache crate.
struct Draws(u64);

impl Draws {
    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Draws::below(0)");
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((u128::from(z ^ (z >> 31)) * n as u128) >> 64) as usize
    }
}

/// Draws the next kind: mostly well-formed traffic, a steady share of abuse.
fn draw(rng: &mut Draws, stalled: bool) -> Kind {
    let table: &[(Kind, usize)] = &[
        (Kind::Greedy, 30),
        (Kind::Sampled, 15),
        (Kind::Cancelled, 15),
        (Kind::Beams, 5),
        (Kind::Malformed, 8),
        (Kind::Oversized, 6),
        (Kind::UnknownPolicy, 8),
        (Kind::BeyondContext, 8),
        (Kind::Stalled, if stalled { 3 } else { 0 }),
    ];
    let total: usize = table.iter().map(|t| t.1).sum();
    let mut x = rng.below(total);
    for &(k, w) in table {
        if x < w {
            return k;
        }
        x -= w;
    }
    Kind::Greedy
}

/// Reads a stream to `[DONE]` and returns its text (choice 0), or why it
/// is not a complete, error-free stream; `stop_after` drops it after that
/// many chunks instead (cancellation).
fn read_stream(sh: &Shared, body: &Value, stop_after: Option<usize>) -> (u16, Result<String, String>) {
    let mut s = match sh.open(body) {
        Ok(s) => s,
        Err(e) => return (0, Err(format!("no response: {e}"))),
    };
    if s.status != 200 {
        let mut b = String::new();
        let _ = s.body.read_to_string(&mut b);
        return (s.status, Err(format!("HTTP {}: {b}", s.status)));
    }
    let mut text = String::new();
    let mut chunks = 0;
    let mut finished = false;
    loop {
        match s.next_event() {
            Ok(Some(d)) if d == "[DONE]" => break,
            Ok(Some(d)) => {
                let v: Value = match serde_json::from_str(&d) {
                    Ok(v) => v,
                    Err(e) => return (200, Err(format!("bad chunk {d}: {e}"))),
                };
                if let Some(e) = v.get("error") {
                    return (200, Err(format!("error chunk: {e}")));
                }
                text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
                finished |= !v["choices"][0]["finish_reason"].is_null();
                chunks += 1;
                if stop_after.is_some_and(|n| chunks >= n) {
                    return (200, Ok(text));
                }
            }
            Ok(None) => return (200, Err("stream ended without [DONE]".into())),
            Err(e) => return (200, Err(format!("stream broke: {e}"))),
        }
    }
    if !finished {
        return (200, Err("stream had no finish_reason".into()));
    }
    (200, Ok(text))
}

/// Sends raw bytes on a fresh connection and reads the status line of the
/// answer (0 when none came).
fn raw_status(sh: &Shared, head: &str, body: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect(&sh.cfg.clients.addr) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
    // the server may answer (and close) before the body is sent: a failed
    // write is expected then, the answer is still read
    let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

fn auth_line(sh: &Shared) -> String {
    sh.cfg.clients.auth().map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default()
}

/// Runs one request of `kind` and checks its outcome.
fn one(sh: &Shared, kind: Kind, rng: &mut Draws) -> Outcome {
    let start = Instant::now();
    let expect = |status: u16, want: u16| (status != want).then(|| format!("expected HTTP {want}, got {status}"));
    let (status, failure) = match kind {
        Kind::Greedy => {
            let (p, pol) = (rng.below(sh.prompts.len()), rng.below(sh.cfg.policies.len()));
            let mut body = sh.greedy_body(p, pol);
            body["stream"] = json!(true);
            match read_stream(sh, &body, None) {
                (s, Ok(t)) if t == sh.greedy[p][pol] => (s, None),
                (s, Ok(t)) => (
                    s,
                    Some(format!(
                        "greedy {} under {} differs from its solo run: {t:?} vs {:?}",
                        sh.prompts[p].label(),
                        sh.cfg.policies[pol],
                        sh.greedy[p][pol]
                    )),
                ),
                (s, Err(e)) => (s, Some(e)),
            }
        }
        Kind::Sampled => {
            let (p, pol) = (rng.below(sh.prompts.len()), rng.below(sh.cfg.policies.len()));
            let body = json!({"prompt": sh.prompts[p].json(), "max_tokens": sh.cfg.clients.max_tokens,
                "temperature": 0.8, "seed": rng.below(1 << 20), "stream": true, "kv_policy": sh.cfg.policies[pol]});
            let (s, r) = read_stream(sh, &body, None);
            (s, r.err())
        }
        Kind::Cancelled => {
            let body = json!({"prompt": sh.prompts[rng.below(sh.prompts.len())].json(), "max_tokens": 400,
                "temperature": 0.8, "seed": 7, "stream": true, "n": 1 + rng.below(3)});
            let (s, r) = read_stream(sh, &body, Some(1 + rng.below(4)));
            (s, r.err())
        }
        Kind::Beams => {
            let p = rng.below(sh.prompts.len());
            match sh.post(&sh.beam_body(p)) {
                Ok(r) => match text_of(&r) {
                    Ok(t) if t == sh.beams[p] => (r.status, None),
                    Ok(t) => (r.status, Some(format!("beams differ from the solo run: {t:?} vs {:?}", sh.beams[p]))),
                    Err(e) => (r.status, Some(e)),
                },
                Err(e) => (0, Some(format!("no response: {e}"))),
            }
        }
        Kind::Malformed => {
            let body = r#"{"prompt": "Once upon", "max_tokens": 8,,}"#;
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                auth_line(sh),
                body.len()
            );
            let s = raw_status(sh, &head, body.as_bytes());
            (s, expect(s, 400))
        }
        Kind::Oversized => {
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                auth_line(sh),
                sh.cfg.oversize_bytes
            );
            // a start of the body, not all of it: the server must answer anyway
            let s = raw_status(sh, &head, &vec![b' '; sh.cfg.oversize_bytes.min(8192)]);
            (s, expect(s, 413))
        }
        Kind::UnknownPolicy => {
            let r = sh.post(&json!({"prompt": PROMPTS[0], "max_tokens": 8, "kv_policy": "no-such-policy:x=1"}));
            let s = r.map_or(0, |r| r.status);
            (s, expect(s, 400))
        }
        Kind::BeyondContext => match sh.post(&json!({"prompt": sh.too_long, "max_tokens": 8})) {
            Ok(r) if r.status == 400 && r.json()["error"]["code"] == "context_length_exceeded" => (400, None),
            Ok(r) => (r.status, Some(format!("expected 400 context_length_exceeded, got {}: {}", r.status, r.text()))),
            Err(e) => (0, Some(format!("no response: {e}"))),
        },
        Kind::Stalled => {
            let s = raw_status(sh, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len", b"");
            (s, expect(s, 408))
        }
    };
    Outcome { kind, status, latency: start.elapsed().as_secs_f64(), failure }
}

/// The `p`-th percentile of ascending `sorted` (nearest rank; 0 when empty).
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((p / 100.0) * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)]
}

/// `VmHWM` (peak resident set) of a process, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmHWM:")
}

/// `VmRSS` (resident set now) of a process, in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmRSS:")
}

fn proc_status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// What a watcher saw every second during the load: the server's resident
/// memory, its KV bytes in use and running requests (largest values).
#[derive(Default)]
struct Watch {
    rss_max: Option<u64>,
    kv_max: f64,
    running_max: f64,
}

/// A `/metrics` value.
fn metric(sh: &Shared, name: &str) -> Option<f64> {
    let r = sh.get("/metrics").ok()?;
    r.text().lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Runs the soak (see the module doc) and reports; `Err` when the server
/// could not even give the solo references.
pub fn run(cfg: &SoakConfig) -> Result<SoakReport, String> {
    let sh = Arc::new(prepare(cfg)?);
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let rss_start = cfg.clients.server_pid.and_then(rss);
    let start = Instant::now();
    let end = start + cfg.duration;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (sh, done) = (sh.clone(), done.clone());
        std::thread::spawn(move || {
            let mut w = Watch::default();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(r) = sh.cfg.clients.server_pid.and_then(rss) {
                    w.rss_max = Some(w.rss_max.unwrap_or(0).max(r));
                }
                w.kv_max = w.kv_max.max(metric(&sh, "kvslim_kv_bytes_in_use").unwrap_or(0.0));
                w.running_max = w.running_max.max(metric(&sh, "kvslim_running_requests").unwrap_or(0.0));
                std::thread::sleep(Duration::from_secs(1));
            }
            w
        })
    };
    let threads: Vec<_> = (0..cfg.clients.count.max(1))
        .map(|c| {
            let (sh, outcomes) = (sh.clone(), outcomes.clone());
            std::thread::spawn(move || {
                let mut rng = Draws(sh.cfg.seed ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                while Instant::now() < end {
                    let kind = draw(&mut rng, sh.cfg.stalled);
                    let o = one(&sh, kind, &mut rng);
                    outcomes.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                }
            })
        })
        .collect();
    let panicked = threads.into_iter().map(|t| t.join()).filter(Result::is_err).count();
    let wall = start.elapsed().as_secs_f64();
    // the server goes idle once the cancelled streams are noticed
    let idle_by = Instant::now() + Duration::from_secs(120);
    while Instant::now() < idle_by
        && (metric(&sh, "kvslim_running_requests") != Some(0.0) || metric(&sh, "kvslim_queue_length") != Some(0.0))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let kv_end = metric(&sh, "kvslim_kv_bytes_in_use").unwrap_or(f64::NAN);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let watch = watcher.join().unwrap_or_default();
    let outcomes = outcomes.lock().unwrap_or_else(|e| e.into_inner());
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut failed_by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut lat: Vec<f64> = Vec::new();
    let mut lat_by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for o in outcomes.iter() {
        *by_kind.entry(o.kind.name()).or_default() += 1;
        let code = if o.status == 0 { "none".to_string() } else { o.status.to_string() };
        *by_status.entry(code).or_default() += 1;
        if let Some(f) = &o.failure {
            *failed_by_kind.entry(o.kind.name()).or_default() += 1;
            if failures.len() < 20 {
                failures.push(format!("{}: {f}", o.kind.name()));
            }
        }
        if o.kind.well_formed() && o.kind != Kind::Cancelled {
            lat.push(o.latency);
            lat_by_kind.entry(o.kind.name()).or_default().push(o.latency);
        }
    }
    lat.sort_by(f64::total_cmp);
    let per_kind: serde_json::Map<String, Value> = lat_by_kind
        .iter_mut()
        .map(|(k, v)| {
            v.sort_by(f64::total_cmp);
            (k.to_string(), json!({"p50_s": pct(v, 50.0), "p99_s": pct(v, 99.0)}))
        })
        .collect();
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count() + panicked;
    let json = json!({
        "clients": cfg.clients.count,
        "duration_s": wall,
        "requests": outcomes.len(),
        "requests_by_kind": by_kind,
        "responses_by_status": by_status,
        "unexpected_by_kind": failed_by_kind,
        "unexpected": failed,
        "latency_p50_s": pct(&lat, 50.0),
        "latency_p99_s": pct(&lat, 99.0),
        "latency_by_kind": per_kind,
        "kv_bytes_at_end": kv_end,
        "peak_rss_bytes": cfg.clients.server_pid.and_then(peak_rss),
        "rss_at_start_bytes": rss_start,
        "rss_at_end_bytes": cfg.clients.server_pid.and_then(rss),
        "rss_max_sampled_bytes": watch.rss_max,
        "kv_bytes_in_use_max_sampled": watch.kv_max,
        "running_requests_max_sampled": watch.running_max,
        "prompts": sh.prompts.iter().map(Prompt::label).collect::<Vec<_>>(),
        "policies": cfg.policies,
        "max_tokens": cfg.clients.max_tokens,
        "requests_timed_out_total": metric(&sh, "kvslim_requests_timed_out_total"),
        "requests_cancelled_total": metric(&sh, "kvslim_requests_cancelled_total"),
    });
    let greedy_references = (0..sh.prompts.len())
        .flat_map(|p| (0..cfg.policies.len()).map(move |pol| (p, pol)))
        .map(|(p, pol)| GreedyReference {
            prompt: sh.prompts[p].clone(),
            policy: cfg.policies[pol].clone(),
            max_tokens: cfg.clients.max_tokens,
            text: sh.greedy[p][pol].clone(),
        })
        .collect();
    Ok(SoakReport { json, failures, failed, kv_bytes_at_end: kv_end, greedy_references })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream `kvslim_cache::rng::SplitMix64` gives for client 3 of
    /// seed 1, so a seed draws the requests it drew with that generator.
    #[test]
    fn draws_follow_the_splitmix64_stream() {
        let mut r = Draws(1 ^ 3u64.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let got: Vec<usize> = [98usize, 5, 1 << 20, 3, 1, 7, 1000].iter().map(|&n| r.below(n)).collect();
        assert_eq!(got, [41, 3, 864730, 2, 0, 5, 12]);
    }

    #[test]
    fn policy_lists_split_trim_and_refuse_empty_entries() {
        assert_eq!(
            parse_policy_list(" full ; h2o:heavy=10%,recent=10%").unwrap(),
            ["full", "h2o:heavy=10%,recent=10%"]
        );
        assert_eq!(parse_policy_list("window:recent=16").unwrap(), ["window:recent=16"]);
        assert!(parse_policy_list("").unwrap_err().contains("empty"));
        assert!(parse_policy_list(" ; ").unwrap_err().contains("entry 1"));
        assert!(parse_policy_list("full;;window:recent=4").unwrap_err().contains("entry 2"));
        assert!(parse_policy_list("full;").unwrap_err().contains("entry 2"));
    }

    #[test]
    fn bad_configurations_fail_before_any_request() {
        // nothing listens on port 9 of this address: the checks that need no
        // server fail first, with their own message
        let mut cfg = SoakConfig::new("127.0.0.1:9", Duration::from_secs(1));
        cfg.policies.clear();
        let e = run(&cfg).unwrap_err();
        assert!(e.contains("policy list is empty"), "{e}");
        let mut cfg = SoakConfig::new("127.0.0.1:9", Duration::from_secs(1));
        cfg.clients.prompt_tokens = Some(64);
        let e = run(&cfg).unwrap_err();
        assert!(e.contains("go together"), "{e}");
        assert_eq!(Prompt::Ids { index: 2, ids: vec![1, 2, 3] }.json(), json!([1, 2, 3]));
        assert_eq!(Prompt::Ids { index: 2, ids: vec![1, 2, 3] }.label(), "window 2 (3 tokens)");
    }
}
