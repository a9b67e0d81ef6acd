//! The inference loop, on a dedicated thread: continuous batching over
//! independent sequences.
//!
//! Each iteration takes new requests from the channel, drops queued ones
//! whose client left, admits queued requests in order while their KV bytes
//! fit the pool and the batch has room, prefills their prompts one at a
//! time (while others decode, a slice of layers per iteration within
//! [`Limits::prefill_share`] of the time; the first token when the prompt
//! is done), then runs one batched decode step ([`Model::forward_batch`])
//! over every running sequence and samples each one's next token with its
//! own sampler. A greedy sequence decoding alone runs a speculative pass
//! instead ([`Limits::speculative`]). Finished or cancelled sequences leave
//! between steps and their KV memory returns to the pool at once.
//!
//! Paged requests draw from one [`PagePool`] per (page size, KV dtype)
//! ([`Pools`]) and reserve [`worst_case_pages`]; a small LRU of prefilled
//! prompts lets a request with the same policy and prompt (or, where
//! extending is exact, a prompt starting with a cached one) fork that cache
//! instead of prefilling.

use crate::contexts::{CompressJob, ContextStore};
use crate::metrics::Metrics;
pub use kvslim_cache::accounting::worst_case_pages;
use kvslim_cache::policy::TokenPolicySpec;
use kvslim_cache::{KvDtype, PagePool, PolicySpec, SequenceCache};
use kvslim_engine::{
    Context, DraftLength, Feed, NgramDrafter, Sampler, SamplingParams, Session, Speculator, Verification,
};
use kvslim_models::tokenizer::StreamDecoder;
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{Logits, Model, Scratch, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// Log-probs of the prompt's tokens after the first (`echo` with
    /// `logprobs`), from the request's own prefill; sent once, before any
    /// text.
    Prompt(Vec<TokenLogprob>),
    /// New text (already cut at stop strings, complete UTF-8) and, when the
    /// request asked for log-probs, the generated tokens that start in it
    /// (a token whose bytes do not complete a character yet travels with
    /// the text that completes it; the EOS that ends a request comes with
    /// the last piece, possibly with empty text).
    Text(String, Vec<TokenLogprob>),
    Done(Finish),
    /// The request failed after it was accepted.
    Error(String),
    /// The request passed its deadline ([`Request::deadline`]) after this
    /// many generated tokens; it was stopped and its KV freed.
    TimedOut(usize),
    /// A context was made and stored (`POST /v1/contexts`): its report.
    Context(serde_json::Value),
}

/// End of a request.
#[derive(Debug, Clone)]
pub struct Finish {
    /// `stop` (EOS or stop string) or `length` (max_tokens / context).
    pub reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub kv_bytes: usize,
    /// Prompt tokens taken from the prefix cache instead of prefilled.
    pub prompt_tokens_reused: usize,
    /// K/V bytes the sequence's cache held at its end.
    pub kv_bytes_final: usize,
    /// K/V bytes a `full` f32 cache of the same tokens would hold (what the
    /// policy saved is measured against it).
    pub kv_bytes_full: usize,
}

/// One token's log-probability and the most likely alternatives at its
/// position. Log-probs are the log-softmax of the model's raw logits,
/// computed in f64 ([`kvslim_kernels::ops::log_sum_exp`], the same
/// arithmetic as `kvslim perplexity`), so sampling settings (temperature,
/// top-p) never change them, as in OpenAI's API.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
    /// The `k` most likely ids and their log-probs, most likely first
    /// (equal logits: lower id first).
    pub top: Vec<(u32, f64)>,
}

/// The log-prob of `id` in one row of logits and the row's `k` most
/// likely ids (one pass for the normaliser, one for the top `k`).
pub fn token_logprob(row: &[f32], id: u32, k: usize) -> TokenLogprob {
    let lse = kvslim_kernels::ops::log_sum_exp(row);
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &v) in row.iter().enumerate() {
            // NaN never enters; ties keep the earlier (lower) id ahead
            if v.is_nan() || (top.len() == k && v <= top[k - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, t)| t >= v);
            top.insert(at, (i as u32, v));
            top.truncate(k);
        }
    }
    TokenLogprob {
        id,
        logprob: row[id as usize] as f64 - lse,
        top: top.into_iter().map(|(i, v)| (i, v as f64 - lse)).collect(),
    }
}

/// A validated request, ready for admission.
pub struct Request {
    pub prompt: Vec<u32>,
    /// Already clipped to what the context allows.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub policy: PolicySpec,
    pub stop: Vec<String>,
    /// KV bytes the request will allocate (known before admission).
    pub kv_bytes: usize,
    /// Beam search when > 1 (greedy; run to completion at admission).
    pub beams: usize,
    pub length_penalty: f32,
    /// Report each generated token's log-prob with this many alternatives
    /// (`None`: no log-probs; not with beams).
    pub logprobs: Option<usize>,
    /// Report the prompt's log-probs (`echo` + `logprobs`) with this many
    /// alternatives: the prompt is prefilled with every position's logits,
    /// so it skips the prefix-cache lookup (it still fills the cache).
    pub prompt_logprobs: Option<usize>,
    /// When the request must be done (`--request-timeout` from its
    /// arrival): past it, a queued request leaves the queue and a running
    /// one stops between decode steps, freeing its KV (a beam search runs
    /// to completion at admission and is not interrupted).
    pub deadline: Option<Instant>,
    pub events: UnboundedSender<Event>,
    /// Continue this compressed context: `prompt` is the question, fed
    /// into a fork of it as decode steps ([`kvslim_engine::Context::ask`]).
    pub context: Option<Arc<Context>>,
    /// Make a context of `prompt` instead of generating (`POST /v1/contexts`).
    pub compress: Option<Box<CompressJob>>,
}

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct Limits {
    pub kv_memory: usize,
    pub max_batch: usize,
    pub queue_limit: usize,
    /// Page size given to requests whose policy names none (`0`: fixed slots).
    pub kv_page_size: usize,
    /// Entries of the prompt-prefix cache (`0`: off).
    pub prefix_cache: usize,
    /// Prompt tokens a step prefills while other sequences decode (a long
    /// prompt's prefill runs a few layers per step, so the running batch
    /// keeps decoding; the result is the same as one prefill).
    pub prefill_chunk: usize,
    /// Most of the time prefills may take while other sequences decode
    /// (0–1]: after a slice the batch decodes until prefills are back
    /// within this share. 1: a prefill slice after every decode step.
    pub prefill_share: f64,
    /// A greedy request decoding alone (no other sequence running, no
    /// log-probs asked) runs n-gram speculative decoding: drafts copied
    /// from its prompt and output, verified in one pass, the same tokens
    /// as plain greedy decoding. Only where the model's verification pass
    /// reads the weights once for all its tokens (every matrix with integer
    /// products); elsewhere a pass would cost a step per token.
    pub speculative: bool,
    /// Where compressed contexts are saved and found again (`--contexts-dir`).
    pub contexts_dir: Option<std::path::PathBuf>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            kv_memory: 2 << 30,
            max_batch: 16,
            queue_limit: 64,
            kv_page_size: 16,
            prefix_cache: 16,
            prefill_chunk: 512,
            prefill_share: 0.5,
            speculative: true,
            contexts_dir: None,
        }
    }
}

/// The server's page pools, one per (page size, KV dtype), created on first
/// use; every paged request's cache draws from its pool, so clones (prefix
/// hits, beams) share pages and the counters span requests.
#[derive(Clone, Default)]
pub struct Pools {
    pools: Arc<Mutex<Vec<PagePool>>>,
}

impl Pools {
    /// The pool for this page size, dtype and head width (created if new).
    pub fn get(&self, page_size: usize, dtype: KvDtype, head_dim: usize) -> PagePool {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.iter().find(|p| p.fits(page_size, dtype, head_dim)) {
            return p.clone();
        }
        let p = PagePool::new(page_size, dtype, head_dim);
        pools.push(p.clone());
        p
    }

    /// Every pool created so far.
    pub fn all(&self) -> Vec<PagePool> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (pages in use, copy-on-write copies) summed over the pools.
    pub fn totals(&self) -> (usize, usize) {
        self.all().iter().map(|p| p.stats()).fold((0, 0), |(a, b), s| (a + s.pages_in_use, b + s.cow_copies))
    }
}

/// Why a request was not queued.
#[derive(Debug)]
pub enum SubmitError {
    QueueFull,
    Stopped,
}

/// The HTTP side's handle on the scheduler thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Request>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub pools: Pools,
    /// The compressed contexts (`/v1/contexts`).
    pub contexts: ContextStore,
}

impl SchedulerHandle {
    /// Queues a request, or refuses it when the queue is at its limit.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
        let m = &self.metrics;
        let queued = m.queued.fetch_add(1, Relaxed);
        if queued >= self.limits.queue_limit {
            m.queued.fetch_sub(1, Relaxed);
            m.requests_rejected_total.fetch_add(1, Relaxed);
            return Err(SubmitError::QueueFull);
        }
        if self.tx.send(req).is_err() {
            m.queued.fetch_sub(1, Relaxed);
            return Err(SubmitError::Stopped);
        }
        m.requests_total.fetch_add(1, Relaxed);
        Ok(())
    }
}

/// Gives `policy` the server's default page size when it names none and
/// paging costs it nothing: policies that keep every token (`full`, pure
/// CHAI), whose pages fill densely. Token eviction without compaction
/// stays on fixed slots by default, because its worst case in pages (holes
/// keeping pages alive) would reserve far more than its B + 1 slots; a
/// request that wants pages for it says `page=` (or `compact=` /
/// `page_score=`, which imply pages). `page_size` 0: never page by default.
pub fn apply_default_page(policy: &mut PolicySpec, page_size: usize) {
    if page_size > 0 && policy.storage.page_size.is_none() && matches!(policy.token, TokenPolicySpec::Full) {
        policy.storage.page_size = Some(page_size);
    }
}

/// KV bytes a sequence reserves: [`kvslim_cache::accounting::reservation`]
/// for `prompt_len + max_tokens` tokens (clipped to the context): fixed
/// slots exactly as allocated (rows in the spec's `kv_dtype`, positions and
/// scores; sliding-window layers no more than their window), paged stores
/// their worst-case pages ([`worst_case_pages`]).
/// Fails when the spec cannot be laid out for this model.
pub fn kv_bytes_for(
    model: &Model,
    policy: &PolicySpec,
    prompt_len: usize,
    max_tokens: usize,
) -> Result<usize, kvslim_cache::CacheError> {
    let max_len = (prompt_len + max_tokens).min(model.config.context_len);
    kvslim_cache::accounting::reservation(policy, &model.cache_shape(), max_len, prompt_len).map(|r| r.total())
}

/// K/V bytes of a `full` f32 cache holding `tokens` tokens (fixed slots,
/// sliding-window layers at most their window), 0 if it cannot be laid out.
pub fn full_kv_bytes(model: &Model, tokens: usize) -> usize {
    kvslim_cache::accounting::reservation(&PolicySpec::full(), &model.cache_shape(), tokens, tokens).map_or(0, |r| r.kv)
}

/// Starts the scheduler thread.
pub fn spawn(model: Arc<Model>, tokenizer: Arc<Tokenizer>, limits: Limits) -> SchedulerHandle {
    let (tx, rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    metrics.kv_bytes_limit.store(limits.kv_memory, Relaxed);
    let m = metrics.clone();
    let l = limits.clone();
    let pools = Pools::default();
    let p = pools.clone();
    let contexts = ContextStore::new(limits.contexts_dir.clone());
    let c = contexts.clone();
    std::thread::Builder::new()
        .name("kvslim-scheduler".into())
        .spawn(move || {
            // the loop runs on a worker of a pool of its own (as many
            // threads as the global pool): its parallel products then start
            // at once instead of waking a pool for each, and a loop idling
            // on its queue holds no worker another server needs (tests
            // start several in one process)
            let threads = rayon::current_num_threads();
            match rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("kvslim-worker-{i}"))
                .build()
            {
                Ok(pool) => pool.install(|| run(&model, &tokenizer, &l, &m, (&p, &c), rx)),
                Err(_) => run(&model, &tokenizer, &l, &m, (&p, &c), rx),
            }
        })
        .expect("spawn scheduler thread");
    SchedulerHandle { tx, metrics, limits, pools, contexts }
}

/// A prefilled prompt kept for reuse: a clone of the request's cache right
/// after its prefill (paged K/V shared with it, copied on first write;
/// positions, scores and policy state are the clone's own) and the logits
/// of the prompt's last position.
struct PrefixEntry {
    spec: String,
    prompt: Vec<u32>,
    cache: SequenceCache,
    logits: Vec<f32>,
}

/// A small LRU of prefilled prompts (most recently used last). Only paged
/// caches are kept (a clone of fixed slots would copy them).
struct PrefixCache {
    capacity: usize,
    entries: VecDeque<PrefixEntry>,
}

/// What a lookup found: a fork of the stored cache, the tokens it covers
/// and, when it covers the whole prompt, the logits to sample from.
struct PrefixHit {
    cache: SequenceCache,
    reused: usize,
    logits: Option<Vec<f32>>,
}

/// Whether a cache of this policy can be cut back to a prefix and fed the
/// rest, giving what one prefill of the whole prompt gives (up to the
/// rounding of a different chunking): no eviction (`full`), no
/// head sharing (its clustering depends on the prefill), no compaction, no
/// quantized storage (a prefill attends to its own chunk's exact keys).
fn extendable(policy: &PolicySpec) -> bool {
    matches!(policy.token, TokenPolicySpec::Full)
        && policy.head.is_none()
        && policy.storage.compact_every.is_none()
        && policy.storage.page_score.is_none()
        && policy.storage.kv_dtype == KvDtype::F32
}

impl PrefixCache {
    /// The most useful entry for `prompt` under `spec`: the same prompt (any
    /// policy), or — when the policy is [`extendable`] — the entry sharing
    /// the longest common prefix with it (at least a page), forked and cut
    /// back to that prefix (at least one prompt token is left to feed, for
    /// its logits).
    /// `capacity` is the slots the request needs; a stored cache built for
    /// fewer does not qualify.
    fn lookup(&mut self, spec: &str, policy: &PolicySpec, prompt: &[u32], capacity: usize) -> Option<PrefixHit> {
        let ext = extendable(policy);
        let min_shared = policy.storage.page_size.unwrap_or(1);
        let common = |e: &PrefixEntry| e.prompt.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let (best, reuse) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.spec == spec && e.cache.store().max_capacity() >= capacity)
            .filter_map(|(i, e)| match common(e) {
                n if n == prompt.len() && n == e.prompt.len() => Some((i, n)),
                // less than a page would share nothing but a page copied at once
                n if ext => Some((i, n.min(prompt.len() - 1))).filter(|&(_, r)| r >= min_shared),
                _ => None,
            })
            .max_by_key(|&(_, r)| r)?;
        let e = self.entries.remove(best).expect("index from the scan");
        // always a clone: a live request never shares a SequenceCache
        let mut cache = e.cache.clone();
        let whole = reuse == e.prompt.len() && reuse == prompt.len();
        if reuse < e.prompt.len() && cache.truncate(reuse).is_err() {
            self.entries.push_back(e);
            return None;
        }
        let hit = PrefixHit { cache, reused: reuse, logits: whole.then(|| e.logits.clone()) };
        self.entries.push_back(e);
        Some(hit)
    }

    fn insert(&mut self, spec: String, prompt: &[u32], cache: &SequenceCache, logits: &[f32]) {
        if self.capacity == 0 {
            return;
        }
        self.entries.retain(|e| !(e.spec == spec && e.prompt == prompt));
        while self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(PrefixEntry {
            spec,
            prompt: prompt.to_vec(),
            cache: cache.clone(),
            logits: logits.to_vec(),
        });
    }
}

/// A sequence in the running batch.
struct Running<'m> {
    session: Session<'m>,
    sampler: Sampler,
    req: Request,
    /// Token to feed at the next decode step.
    next: u32,
    generated: Vec<u32>,
    /// The generated text so far (complete UTF-8 only), decoded token by
    /// token without re-decoding the whole output each step.
    text: String,
    stream: StreamDecoder,
    /// Bytes of `text` already sent.
    sent: usize,
    finished: Option<&'static str>,
    cancelled: bool,
    /// Stopped at its deadline (the client was told; no `Done` follows).
    timed_out: bool,
    /// Prompt tokens that came from the prefix cache.
    reused: usize,
    /// Log-probs of generated tokens not sent yet, each with the byte
    /// offset in `text` where its piece starts.
    pending: VecDeque<(usize, TokenLogprob)>,
    /// Speculative decoding's state, from its first speculative step on.
    spec: Option<Box<Speculation>>,
}

/// A request's speculative decoding: the drafter follows its context
/// (prompt and output) across steps, speculative or batched.
struct Speculation {
    speculator: Speculator,
    drafter: NgramDrafter,
    /// The prompt and the output so far.
    context: Vec<u32>,
    /// The tokens the last pass committed.
    committed: Vec<u32>,
}

/// What admission works with besides the request.
struct Ctx<'a> {
    model: &'a Model,
    tok: &'a Tokenizer,
    m: &'a Metrics,
    pools: &'a Pools,
    limits: &'a Limits,
    prefix: PrefixCache,
    /// The buffers of one prefill, lent to each request's prefill in turn:
    /// a running request keeps only its cache (its decode steps use the
    /// batch's scratch), so memory does not grow by a prompt's activations
    /// per request in flight.
    prefill: Scratch,
}

fn run(
    model: &Model,
    tok: &Tokenizer,
    limits: &Limits,
    m: &Metrics,
    (pools, contexts): (&Pools, &ContextStore),
    rx: mpsc::Receiver<Request>,
) {
    let mut cx = Ctx {
        model,
        tok,
        m,
        pools,
        limits,
        prefix: PrefixCache { capacity: limits.prefix_cache, entries: VecDeque::new() },
        prefill: Scratch::new(),
    };
    let mut waiting: VecDeque<Request> = VecDeque::new();
    let mut running: Vec<Running<'_>> = Vec::new();
    let mut scratch = BatchScratch::new();
    // a speculative pass's buffers, lent to the sequence that runs it
    let mut spec_scratch = Scratch::new();
    let speculate = limits.speculative && Verification::Auto.resolve(model) == Verification::Fast;
    let mut window = (Instant::now(), 0u64);
    // the one request whose prompt is being prefilled, a slice per step
    let mut prefilling: Option<Prefilling<'_>> = None;
    // seconds the running batch is to decode before the next prefill slice
    let mut decode_owed = 0.0f64;
    loop {
        // intake: block only when there is nothing to do
        if running.is_empty() && waiting.is_empty() && prefilling.is_none() {
            // idle: give recycled pages and the prefill buffers back (the
            // prefix cache keeps its own)
            pools.all().iter().for_each(PagePool::trim);
            cx.prefill = Scratch::new();
            spec_scratch = Scratch::new();
            match rx.recv() {
                Ok(r) => waiting.push_back(r),
                Err(_) => return,
            }
        }
        while let Ok(r) = rx.try_recv() {
            waiting.push_back(r);
        }
        let now = Instant::now();
        waiting.retain(|r| {
            if r.events.is_closed() {
                m.queued.fetch_sub(1, Relaxed);
                m.requests_cancelled_total.fetch_add(1, Relaxed);
                return false;
            }
            if r.deadline.is_some_and(|d| now >= d) {
                m.queued.fetch_sub(1, Relaxed);
                m.requests_timed_out_total.fetch_add(1, Relaxed);
                let _ = r.events.send(Event::TimedOut(0));
                return false;
            }
            true
        });
        // admission and prefill, in arrival order, while memory and batch
        // room last: with nothing decoding a prefill runs to its end;
        // otherwise a step runs about `prefill_chunk` tokens' worth of
        // prefill layers, and the next slice waits until the running
        // sequences have decoded for long enough that prefills take at
        // most `prefill_share` of the time
        if running.is_empty() {
            decode_owed = 0.0;
        }
        let mut spent = 0usize;
        while decode_owed <= 0.0 {
            let cap = if running.is_empty() { usize::MAX } else { limits.prefill_chunk.max(1) * model.config.n_layers };
            if spent >= cap {
                break;
            }
            if prefilling.is_none() {
                if running.len() >= limits.max_batch {
                    break;
                }
                match waiting.front() {
                    // reserved here; `admit` keeps it or gives it back
                    // unused contexts give way when memory is short
                    Some(r) if contexts.reserve(m, limits.kv_memory, r.kv_bytes) => {}
                    _ => break,
                }
                let req = waiting.pop_front().expect("checked above");
                m.queued.fetch_sub(1, Relaxed);
                match admit(&mut cx, req) {
                    Admitted::Gone => {}
                    Admitted::Running(r) => running.push(r),
                    Admitted::Prefill(p) => prefilling = Some(p),
                }
                continue;
            }
            let p = prefilling.as_mut().expect("checked above");
            let slice = if running.is_empty() { usize::MAX } else { cap - spent };
            let (started, shared) = (Instant::now(), !running.is_empty());
            let outcome = prefill_slice(&mut cx, p, slice);
            if shared {
                let share = limits.prefill_share.clamp(0.01, 1.0);
                decode_owed += started.elapsed().as_secs_f64() * (1.0 - share) / share;
            }
            match outcome {
                Slice::Ran(used) => spent = spent.saturating_add(used.max(1)),
                Slice::Done(used) => {
                    spent = spent.saturating_add(used.max(1));
                    let p = prefilling.take().expect("checked above");
                    if let Some(r) = finish_prefill(&mut cx, p) {
                        running.push(r);
                    }
                }
                Slice::Stopped => prefilling = None,
            }
        }
        m.prefilling.store(usize::from(prefilling.is_some()), Relaxed);
        // clients that left free their KV before the step
        running.retain_mut(|r| {
            if r.req.events.is_closed() {
                r.cancelled = true;
                release(m, r);
                return false;
            }
            true
        });
        m.running.store(running.len(), Relaxed);
        // one batched decode step over every live sequence, or a
        // speculative pass for a greedy sequence decoding alone
        if !running.is_empty() {
            let started = Instant::now();
            let result = if speculate && running.len() == 1 && speculates(&running[0]) {
                speculative_step(model, tok, m, &mut running[0], &mut spec_scratch)
            } else {
                batched_step(model, tok, m, &mut running, &mut scratch)
            };
            // decoding pays off what prefills took; with no prefill to
            // come it saves no credit for later ones
            decode_owed = if prefilling.is_some() || !waiting.is_empty() {
                (decode_owed - started.elapsed().as_secs_f64()).max(0.0)
            } else {
                0.0
            };
            m.decode_steps_total.fetch_add(1, Relaxed);
            if prefilling.is_some() {
                m.decode_steps_during_prefill_total.fetch_add(1, Relaxed);
            }
            m.last_batch_size.store(running.len(), Relaxed);
            match result {
                Ok(()) => {}
                Err(e) => {
                    // should not happen (positions and capacities are checked
                    // at admission); fail the batch rather than the server
                    for r in running.iter_mut() {
                        let _ = r.req.events.send(Event::Error(format!("decode failed: {e}")));
                        r.cancelled = true;
                    }
                }
            }
        }
        // sequences past their deadline stop here (their KV freed below)
        let now = Instant::now();
        for r in running.iter_mut() {
            if r.finished.is_none() && !r.cancelled && r.req.deadline.is_some_and(|d| now >= d) {
                let _ = r.req.events.send(Event::TimedOut(r.generated.len()));
                m.requests_timed_out_total.fetch_add(1, Relaxed);
                r.timed_out = true;
            }
        }
        running.retain_mut(|r| {
            if r.finished.is_none() && !r.cancelled && !r.timed_out {
                return true;
            }
            release(m, r);
            false
        });
        m.running.store(running.len(), Relaxed);
        let elapsed = window.0.elapsed().as_secs_f64();
        if elapsed >= 1.0 {
            let total = m.generated_tokens_total.load(Relaxed);
            m.set_tokens_per_second((total - window.1) as f64 / elapsed);
            window = (Instant::now(), total);
        } else if running.is_empty() && waiting.is_empty() && prefilling.is_none() {
            m.set_tokens_per_second(0.0);
        }
    }
}

/// One batched decode step over `running`, each sequence's next token
/// sampled with its own sampler.
fn batched_step(
    model: &Model,
    tok: &Tokenizer,
    m: &Metrics,
    running: &mut [Running<'_>],
    scratch: &mut BatchScratch,
) -> Result<(), String> {
    let mut items: Vec<BatchItem<'_>> =
        running.iter_mut().map(|r| BatchItem { token: r.next, cache: &mut r.session.cache }).collect();
    model.forward_batch(&mut items, scratch).map_err(|e| e.to_string())?;
    drop(items);
    for (i, r) in running.iter_mut().enumerate() {
        let row = scratch.logits(i);
        let id = r.sampler.sample(row);
        let lp = r.req.logprobs.map(|k| token_logprob(row, id, k));
        on_token(tok, m, r, id, lp);
    }
    Ok(())
}

/// Whether a sequence decoding alone runs speculative passes: greedy, no
/// log-probs, a beam of one, and at least two tokens still to go.
fn speculates(r: &Running<'_>) -> bool {
    r.req.sampling.temperature == 0.0
        && r.req.logprobs.is_none()
        && r.req.beams <= 1
        && r.req.max_tokens.saturating_sub(r.generated.len()) >= 2
}

/// One speculative pass for `r` ([`Speculator::step`]): its committed
/// tokens go out one by one, as a batched step's would, until one ends the
/// request. `scratch` is lent to its session for the pass.
fn speculative_step(
    model: &Model,
    tok: &Tokenizer,
    m: &Metrics,
    r: &mut Running<'_>,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let mut spec = r.spec.take().unwrap_or_else(|| {
        Box::new(Speculation {
            speculator: Speculator::new(model, DraftLength::default(), Verification::Auto),
            drafter: NgramDrafter::default(),
            context: r.req.prompt.clone(),
            committed: Vec::new(),
        })
    });
    // the output since its last pass (batched steps included)
    let seen = spec.context.len() - r.req.prompt.len();
    spec.context.extend_from_slice(&r.generated[seen..]);
    let left = r.req.max_tokens - r.generated.len();
    let before = spec.speculator.stats;
    std::mem::swap(&mut r.session.scratch, scratch);
    let result = spec.speculator.step(model, &mut r.session, &mut spec.drafter, &spec.context, left);
    std::mem::swap(&mut r.session.scratch, scratch);
    let committed = result.map_err(|e| e.to_string())?;
    spec.committed.clear();
    spec.committed.extend_from_slice(committed);
    let after = spec.speculator.stats;
    m.speculative_passes_total.fetch_add(1, Relaxed);
    m.draft_tokens_total.fetch_add((after.drafted - before.drafted) as u64, Relaxed);
    m.draft_tokens_accepted_total.fetch_add((after.accepted - before.accepted) as u64, Relaxed);
    for &id in &spec.committed {
        on_token(tok, m, r, id, None);
        if r.finished.is_some() {
            break;
        }
    }
    r.spec = Some(spec);
    Ok(())
}

/// Builds a request's cache (or forks a cached prefix of its prompt) and
/// starts its prefill, or samples its first token when the whole prompt
/// was cached. Its KV bytes are already reserved (released by [`release`],
/// or here on failure).
fn admit<'m>(cx: &mut Ctx<'m>, mut req: Request) -> Admitted<'m> {
    let (model, tok, m) = (cx.model, cx.tok, cx.m);
    if let Some(ctx) = req.context.take() {
        return admit_question(cx, req, &ctx);
    }
    let n = req.prompt.len();
    let ctx_len = model.config.context_len;
    let max_len = (n + req.max_tokens).min(ctx_len);
    let paged = req.policy.storage.page_size;
    let pool = paged.map(|p| cx.pools.get(p, req.policy.storage.kv_dtype, model.config.head_dim));
    let caching = paged.is_some() && cx.prefix.capacity > 0 && req.beams <= 1 && req.compress.is_none();
    // a paged `full` cache gets room for the whole context (pages, positions
    // and scores all grow on demand; nothing is allocated for it up front),
    // so a cached prompt can serve later requests with more max_tokens
    let cap_len = if caching && matches!(req.policy.token, TokenPolicySpec::Full) { ctx_len } else { max_len };
    let spec = req.policy.to_string();
    // prompt log-probs need every position's logits: a fresh prefill
    let hit = if caching && req.prompt_logprobs.is_none() {
        let need = req.policy.build(n).capacity(max_len);
        cx.prefix.lookup(&spec, &req.policy, &req.prompt, need)
    } else {
        None
    };
    let (session, reused, cached_logits) = match hit {
        Some(h) => (Session::with_cache(model, h.cache), h.reused, h.logits),
        None => match Session::in_pool(model, &req.policy, cap_len, n, pool.as_ref()) {
            Ok(s) => (s, 0, None),
            Err(e) => {
                m.kv_bytes_in_use.fetch_sub(req.kv_bytes, Relaxed);
                let _ = req.events.send(Event::Error(format!("cannot build the KV cache: {e}")));
                return Admitted::Gone;
            }
        },
    };
    if reused > 0 {
        m.prefix_hits_total.fetch_add(1, Relaxed);
        m.prefix_tokens_reused_total.fetch_add(reused as u64, Relaxed);
    }
    let prompt = std::mem::take(&mut req.prompt);
    let mut r = Running::new(session, req, reused);
    m.prompt_tokens_total.fetch_add((n - reused) as u64, Relaxed);
    if r.req.beams > 1 {
        r.req.prompt = prompt;
        run_beams(model, tok, m, cx.pools, &mut r);
        release(m, &mut r);
        return Admitted::Gone;
    }
    match cached_logits {
        Some(logits) => {
            r.req.prompt = prompt;
            start(tok, m, r, &logits).map_or(Admitted::Gone, Admitted::Running)
        }
        None => {
            // the prompt's prefill gets the lent buffers until it is done
            std::mem::swap(&mut r.session.scratch, &mut cx.prefill);
            let want = if r.req.prompt_logprobs.is_some() { Logits::All } else { Logits::Last };
            let feed = r.session.begin_feed(prompt[reused..].to_vec(), want);
            r.req.prompt = prompt;
            Admitted::Prefill(Prefilling { r, feed, caching, spec })
        }
    }
}

impl<'m> Running<'m> {
    /// A sequence about to start (its prompt fed or about to be).
    fn new(session: Session<'m>, req: Request, reused: usize) -> Self {
        Running {
            session,
            sampler: Sampler::new(req.sampling.clone()),
            req,
            next: 0,
            generated: Vec::new(),
            text: String::new(),
            stream: StreamDecoder::new(),
            sent: 0,
            finished: None,
            cancelled: false,
            timed_out: false,
            reused,
            pending: VecDeque::new(),
            spec: None,
        }
    }
}

/// A question on a compressed context: a fork of it (paged K/V shared)
/// fed the question as decode steps, exactly as [`Context::ask`] does for
/// the CLI and Python, then sampled like any request. The context's
/// tokens count as reused prompt tokens.
fn admit_question<'m>(cx: &mut Ctx<'m>, req: Request, ctx: &Context) -> Admitted<'m> {
    let (model, tok, m) = (cx.model, cx.tok, cx.m);
    m.context_requests_total.fetch_add(1, Relaxed);
    match ctx.ask(model, &req.prompt, req.max_tokens) {
        Ok((session, logits)) => {
            m.prompt_tokens_total.fetch_add(req.prompt.len() as u64, Relaxed);
            let r = Running::new(session, req, ctx.tokens().len());
            start(tok, m, r, &logits).map_or(Admitted::Gone, Admitted::Running)
        }
        Err(e) => {
            m.kv_bytes_in_use.fetch_sub(req.kv_bytes, Relaxed);
            let _ = req.events.send(Event::Error(format!("cannot continue the context: {e}")));
            Admitted::Gone
        }
    }
}

/// A finished prefill of `POST /v1/contexts`: the cache becomes a stored
/// context (its own bytes reserved, the request's reservation returned).
fn store_context(cx: &mut Ctx<'_>, mut r: Running<'_>, job: Box<CompressJob>) {
    release(cx.m, &mut r);
    let Running { session, req, .. } = r;
    let result = Context::from_prefilled(cx.model, req.policy, req.prompt, session.cache)
        .map_err(|e| e.to_string())
        .and_then(|ctx| {
            let seconds = job.started.elapsed().as_secs_f64();
            let ctx = ctx.with_meta(job.meta);
            job.store.insert(cx.m, cx.limits.kv_memory, job.id, ctx, seconds).map_err(|e| e.to_string())
        });
    let _ = req.events.send(match result {
        Ok(v) => Event::Context(v),
        Err(e) => Event::Error(e),
    });
}

/// What admission made of a request.
enum Admitted<'m> {
    /// Finished or failed already (beam search, `max_tokens` 0, an error).
    Gone,
    /// Its first token sampled (a cached prompt): it joins the batch.
    Running(Running<'m>),
    /// Its prompt is to be prefilled, a slice per step.
    Prefill(Prefilling<'m>),
}

/// A request whose prompt is being prefilled ([`prefill_slice`]).
struct Prefilling<'m> {
    r: Running<'m>,
    feed: Feed,
    /// Whether the prefilled prompt goes into the prefix cache.
    caching: bool,
    spec: String,
}

/// What one slice of a prefill did.
enum Slice {
    /// Ran this many token-layers; more to come.
    Ran(usize),
    /// Ran this many token-layers and finished the prompt.
    Done(usize),
    /// The request left (client gone, deadline, error): its KV is freed.
    Stopped,
}

/// Runs about `budget` token-layers of a request's prefill (whole layers,
/// at least one), unless its client left or its deadline passed.
fn prefill_slice(cx: &mut Ctx<'_>, p: &mut Prefilling<'_>, budget: usize) -> Slice {
    let m = cx.m;
    let stop = if p.r.req.events.is_closed() {
        p.r.cancelled = true;
        true
    } else if p.r.req.deadline.is_some_and(|d| Instant::now() >= d) {
        let _ = p.r.req.events.send(Event::TimedOut(0));
        m.requests_timed_out_total.fetch_add(1, Relaxed);
        true
    } else {
        false
    };
    let ran = if stop { None } else { Some(p.r.session.feed_some(&mut p.feed, budget)) };
    match ran {
        Some(Ok((done, used))) => {
            m.prefill_slices_total.fetch_add(1, Relaxed);
            return if done { Slice::Done(used) } else { Slice::Ran(used) };
        }
        Some(Err(e)) => {
            let _ = p.r.req.events.send(Event::Error(format!("prefill failed: {e}")));
            p.r.cancelled = true;
        }
        None => {}
    }
    std::mem::swap(&mut p.r.session.scratch, &mut cx.prefill);
    release(m, &mut p.r);
    Slice::Stopped
}

/// A finished prefill: the lent buffers go back, the prompt into the
/// prefix cache, its log-probs (when asked for) to the client, and the
/// first token is sampled.
fn finish_prefill<'m>(cx: &mut Ctx<'m>, p: Prefilling<'m>) -> Option<Running<'m>> {
    let Prefilling { mut r, feed, caching, spec } = p;
    let logits = r.session.fed_logits(&feed);
    let v = cx.model.config.vocab_size;
    let last = logits[logits.len() - v..].to_vec();
    if let Some(k) = r.req.prompt_logprobs {
        // every position of the prompt (fed whole: no prefix-cache hit)
        let prompt = &r.req.prompt;
        let scored: Vec<TokenLogprob> =
            prompt[1..].iter().enumerate().map(|(i, &t)| token_logprob(&logits[i * v..(i + 1) * v], t, k)).collect();
        if r.req.events.send(Event::Prompt(scored)).is_err() {
            r.cancelled = true;
        }
    }
    drop(feed);
    std::mem::swap(&mut r.session.scratch, &mut cx.prefill);
    if let Some(job) = r.req.compress.take() {
        store_context(cx, r, job);
        return None;
    }
    if caching {
        cx.prefix.insert(spec, &r.req.prompt, &r.session.cache, &last);
    }
    start(cx.tok, cx.m, r, &last)
}

/// Samples a request's first token from its prompt's last logits; `None`
/// when that already ends it (its KV then freed).
fn start<'m>(tok: &Tokenizer, m: &Metrics, mut r: Running<'m>, logits: &[f32]) -> Option<Running<'m>> {
    if r.req.max_tokens == 0 || r.cancelled {
        // `echo` with max_tokens 0: the prompt (and its log-probs) is all
        if !r.cancelled {
            r.finished = Some("length");
        }
        release(m, &mut r);
        return None;
    }
    let first = r.sampler.sample(logits);
    let lp = r.req.logprobs.map(|k| token_logprob(logits, first, k));
    on_token(tok, m, &mut r, first, lp);
    if r.finished.is_some() || r.cancelled {
        release(m, &mut r);
        return None;
    }
    Some(r)
}

/// Beam search for one request, run to completion on the scheduler thread
/// (other sequences wait meanwhile): the best hypothesis goes through the
/// same stop-string and length handling as sampled tokens. The beams draw
/// their (shared, copy-on-write) pages from the server's pool, so they show
/// in its page metrics.
fn run_beams(model: &Model, tok: &Tokenizer, m: &Metrics, pools: &Pools, r: &mut Running<'_>) {
    let opts = kvslim_engine::BeamOptions {
        beams: r.req.beams,
        max_tokens: r.req.max_tokens,
        length_penalty: r.req.length_penalty,
        early_stopping: true,
        policy: r.req.policy.clone(),
        eos: tok.eos.clone(),
        keep_caches: false,
    };
    let spec = kvslim_engine::beam::beam_policy(&opts.policy);
    let page = spec.storage.page_size.expect("beam_policy pages every spec");
    let pool = pools.get(page, spec.storage.kv_dtype, model.config.head_dim);
    let storage = kvslim_engine::beam::BeamStorage { as_specified: false, pool: Some(&pool) };
    match kvslim_engine::beam::beam_search_in(model, &r.req.prompt, &opts, storage, None) {
        Ok(hyps) => {
            let Some(best) = hyps.into_iter().next() else {
                r.finished = Some("length");
                return;
            };
            for &id in &best.token_ids {
                on_token(tok, m, r, id, None);
                if r.finished.is_some() {
                    return;
                }
            }
            r.finished = Some(if best.eos { "stop" } else { "length" });
            flush(tok, r);
        }
        Err(e) => {
            let _ = r.req.events.send(Event::Error(format!("beam search failed: {e}")));
            r.cancelled = true;
        }
    }
}

/// Frees a sequence's KV reservation and reports its end.
fn release(m: &Metrics, r: &mut Running<'_>) {
    m.kv_bytes_in_use.fetch_sub(r.req.kv_bytes, Relaxed);
    let store = &r.session.cache.store();
    let pos = r.session.cache.next_pos();
    let mut evicted = 0u64;
    for l in 0..store.layers() {
        for h in 0..store.kv_heads() {
            evicted += pos.saturating_sub(store.head(l, h).len()) as u64;
        }
    }
    m.evicted_slots_total.fetch_add(evicted, Relaxed);
    if r.cancelled {
        m.requests_cancelled_total.fetch_add(1, Relaxed);
    }
    if let Some(reason) = r.finished {
        let _ = r.req.events.send(Event::Done(Finish {
            reason,
            prompt_tokens: r.req.prompt.len(),
            completion_tokens: r.generated.len(),
            kv_bytes: r.req.kv_bytes,
            prompt_tokens_reused: r.reused,
            kv_bytes_final: r.session.kv_bytes().kv,
            kv_bytes_full: full_kv_bytes(r.session.model, pos),
        }));
    }
}

/// Handles a sampled token (and its log-prob, when asked for): EOS, text
/// with stop strings, max_tokens.
fn on_token(tok: &Tokenizer, m: &Metrics, r: &mut Running<'_>, id: u32, lp: Option<TokenLogprob>) {
    if let Some(lp) = lp {
        r.pending.push_back((r.text.len(), lp));
    }
    if tok.is_eos(id) {
        r.finished = Some("stop");
        flush(tok, r);
        return;
    }
    r.generated.push(id);
    r.next = id;
    m.generated_tokens_total.fetch_add(1, Relaxed);
    let piece = r.stream.push(tok, id).unwrap_or_default();
    r.text.push_str(&piece);
    let done_by_length = r.generated.len() >= r.req.max_tokens;
    // earliest complete stop string in the unsent text (and a little before
    // it, in case a stop string straddles the boundary)
    let text = &r.text;
    let mut search = r.sent.saturating_sub(r.req.stop.iter().map(String::len).max().unwrap_or(0));
    while !text.is_char_boundary(search) {
        search -= 1;
    }
    let hit = r.req.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text[search..].find(s.as_str())).min();
    if let Some(at) = hit {
        let end = (search + at).max(r.sent);
        let piece = text[r.sent..end].to_string();
        send(r, &piece, end);
        r.sent = end;
        // tokens starting inside the stop string are not reported
        r.pending.clear();
        r.finished = Some("stop");
        return;
    }
    if done_by_length {
        r.finished = Some("length");
        flush(tok, r);
        return;
    }
    // hold back a tail that could be the start of a stop string
    let hold = r
        .req
        .stop
        .iter()
        .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k])))
        .max()
        .unwrap_or(0);
    let end = text.len() - hold;
    if end > r.sent {
        let piece = text[r.sent..end].to_string();
        send(r, &piece, end);
        r.sent = end;
    }
}

/// Sends whatever text is left unsent: the whole output decoded once, so
/// bytes of a character the stream still held back come out too; every
/// pending log-prob goes with it.
fn flush(tok: &Tokenizer, r: &mut Running<'_>) {
    let text = tok.decode(&r.generated).unwrap_or_default();
    let piece = if text.len() > r.sent && text.is_char_boundary(r.sent) {
        let p = text[r.sent..].to_string();
        r.sent = text.len();
        p
    } else {
        String::new()
    };
    send(r, &piece, usize::MAX);
}

/// Sends a piece of text with the pending log-probs of tokens starting
/// before byte `end` of the output (nothing when both are empty).
fn send(r: &mut Running<'_>, piece: &str, end: usize) {
    let mut lps = Vec::new();
    while r.pending.front().is_some_and(|(start, _)| *start < end) {
        lps.push(r.pending.pop_front().expect("checked").1);
    }
    if piece.is_empty() && lps.is_empty() {
        return;
    }
    if r.req.events.send(Event::Text(piece.to_string(), lps)).is_err() {
        r.cancelled = true;
    }
}
