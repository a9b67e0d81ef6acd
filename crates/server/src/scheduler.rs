//! The inference loop, on a dedicated thread: continuous batching over
//! independent sequences.
//!
//! Each iteration takes new requests from the channel, drops queued ones
//! whose client left, admits queued requests in order while their KV bytes
//! fit the pool and the batch has room (prefill + first token at
//! admission), then runs one batched decode step ([`Model::forward_batch`])
//! over every running sequence and samples each one's next token with its
//! own sampler. Finished or cancelled sequences leave between steps and
//! their KV memory returns to the pool at once.

use crate::metrics::Metrics;
use kvslim_cache::PolicySpec;
use kvslim_engine::{Sampler, SamplingParams, Session};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{Logits, Model, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// New text (already cut at stop strings, complete UTF-8).
    Text(String),
    Done(Finish),
    /// The request failed after it was accepted.
    Error(String),
}

/// End of a request.
#[derive(Debug, Clone)]
pub struct Finish {
    /// `stop` (EOS or stop string) or `length` (max_tokens / context).
    pub reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub kv_bytes: usize,
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
    pub events: UnboundedSender<Event>,
}

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct Limits {
    pub kv_memory: usize,
    pub max_batch: usize,
    pub queue_limit: usize,
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

/// KV bytes a sequence allocates: per layer and KV head, `capacity` slots
/// of f32 K and V plus a u32 position and an f32 score. Bounded policies
/// hold their budget + 1 slots; `full` holds prompt + max_tokens (clipped
/// to the context).
pub fn kv_bytes_for(model: &Model, policy: &PolicySpec, prompt_len: usize, max_tokens: usize) -> usize {
    let c = &model.config;
    let max_len = (prompt_len + max_tokens).min(c.context_len);
    let capacity = policy.build(prompt_len).capacity(max_len);
    c.n_layers * c.n_kv_heads * capacity * (2 * c.head_dim * 4 + 8)
}

/// Starts the scheduler thread.
pub fn spawn(model: Arc<Model>, tokenizer: Arc<Tokenizer>, limits: Limits) -> SchedulerHandle {
    let (tx, rx) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    metrics.kv_bytes_limit.store(limits.kv_memory, Relaxed);
    let m = metrics.clone();
    let l = limits.clone();
    std::thread::Builder::new()
        .name("kvslim-scheduler".into())
        .spawn(move || run(&model, &tokenizer, &l, &m, rx))
        .expect("spawn scheduler thread");
    SchedulerHandle { tx, metrics, limits }
}

/// A sequence in the running batch.
struct Running<'m> {
    session: Session<'m>,
    sampler: Sampler,
    req: Request,
    /// Token to feed at the next decode step.
    next: u32,
    generated: Vec<u32>,
    /// Bytes of decoded text already sent.
    sent: usize,
    finished: Option<&'static str>,
    cancelled: bool,
}

fn run(model: &Model, tok: &Tokenizer, limits: &Limits, m: &Metrics, rx: mpsc::Receiver<Request>) {
    let mut waiting: VecDeque<Request> = VecDeque::new();
    let mut running: Vec<Running<'_>> = Vec::new();
    let mut scratch = BatchScratch::new();
    let mut window = (Instant::now(), 0u64);
    loop {
        // intake: block only when there is nothing to do
        if running.is_empty() && waiting.is_empty() {
            match rx.recv() {
                Ok(r) => waiting.push_back(r),
                Err(_) => return,
            }
        }
        while let Ok(r) = rx.try_recv() {
            waiting.push_back(r);
        }
        waiting.retain(|r| {
            let alive = !r.events.is_closed();
            if !alive {
                m.queued.fetch_sub(1, Relaxed);
                m.requests_cancelled_total.fetch_add(1, Relaxed);
            }
            alive
        });
        // admission, in arrival order, while memory and batch room last
        while running.len() < limits.max_batch {
            let in_use = m.kv_bytes_in_use.load(Relaxed);
            match waiting.front() {
                Some(r) if in_use + r.kv_bytes <= limits.kv_memory => {}
                _ => break,
            }
            let req = waiting.pop_front().expect("checked above");
            m.queued.fetch_sub(1, Relaxed);
            if let Some(r) = admit(model, tok, m, req) {
                running.push(r);
            }
        }
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
        // one batched decode step over every live sequence
        if !running.is_empty() {
            let mut items: Vec<BatchItem<'_>> =
                running.iter_mut().map(|r| BatchItem { token: r.next, cache: &mut r.session.cache }).collect();
            let result = model.forward_batch(&mut items, &mut scratch);
            drop(items);
            m.decode_steps_total.fetch_add(1, Relaxed);
            m.last_batch_size.store(running.len(), Relaxed);
            match result {
                Ok(()) => {
                    for (i, r) in running.iter_mut().enumerate() {
                        let id = r.sampler.sample(scratch.logits(i));
                        on_token(tok, m, r, id);
                    }
                }
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
        running.retain_mut(|r| {
            if r.finished.is_none() && !r.cancelled {
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
        } else if running.is_empty() && waiting.is_empty() {
            m.set_tokens_per_second(0.0);
        }
    }
}

/// Prefills a request and samples its first token; `None` when it already
/// finished (or failed).
fn admit<'m>(model: &'m Model, tok: &Tokenizer, m: &Metrics, req: Request) -> Option<Running<'m>> {
    let n = req.prompt.len();
    let session = match Session::new(model, &req.policy, n + req.max_tokens, n) {
        Ok(s) => s,
        Err(e) => {
            let _ = req.events.send(Event::Error(format!("cannot build the KV cache: {e}")));
            return None;
        }
    };
    m.kv_bytes_in_use.fetch_add(req.kv_bytes, Relaxed);
    let mut r = Running {
        session,
        sampler: Sampler::new(req.sampling.clone()),
        req,
        next: 0,
        generated: Vec::new(),
        sent: 0,
        finished: None,
        cancelled: false,
    };
    m.prompt_tokens_total.fetch_add(n as u64, Relaxed);
    if r.req.beams > 1 {
        run_beams(model, tok, m, &mut r);
        release(m, &mut r);
        return None;
    }
    let prompt = std::mem::take(&mut r.req.prompt);
    let first = match r.session.feed(&prompt, Logits::Last) {
        Ok(logits) => r.sampler.sample(logits),
        Err(e) => {
            let _ = r.req.events.send(Event::Error(format!("prefill failed: {e}")));
            r.cancelled = true;
            release(m, &mut r);
            return None;
        }
    };
    r.req.prompt = prompt;
    on_token(tok, m, &mut r, first);
    if r.finished.is_some() || r.cancelled {
        release(m, &mut r);
        return None;
    }
    Some(r)
}

/// Beam search for one request, run to completion on the scheduler thread
/// (other sequences wait meanwhile): the best hypothesis goes through the
/// same stop-string and length handling as sampled tokens.
fn run_beams(model: &Model, tok: &Tokenizer, m: &Metrics, r: &mut Running<'_>) {
    let opts = kvslim_engine::BeamOptions {
        beams: r.req.beams,
        max_tokens: r.req.max_tokens,
        length_penalty: r.req.length_penalty,
        early_stopping: true,
        policy: r.req.policy.clone(),
        eos: tok.eos.clone(),
        keep_caches: false,
    };
    match kvslim_engine::beam_search(model, &r.req.prompt, &opts) {
        Ok(hyps) => {
            let Some(best) = hyps.into_iter().next() else {
                r.finished = Some("length");
                return;
            };
            for &id in &best.token_ids {
                on_token(tok, m, r, id);
                if r.finished.is_some() {
                    return;
                }
            }
            r.finished = Some(if best.eos { "stop" } else { "length" });
            flush(tok, r, None);
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
    let store = &r.session.cache.store;
    let pos = r.session.cache.next_pos;
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
        }));
    }
}

/// Handles a sampled token: EOS, text with stop strings, max_tokens.
fn on_token(tok: &Tokenizer, m: &Metrics, r: &mut Running<'_>, id: u32) {
    if tok.is_eos(id) {
        r.finished = Some("stop");
        flush(tok, r, None);
        return;
    }
    r.generated.push(id);
    r.next = id;
    m.generated_tokens_total.fetch_add(1, Relaxed);
    let text = tok.decode(&r.generated).unwrap_or_default();
    let done_by_length = r.generated.len() >= r.req.max_tokens;
    if text.len() < r.sent || !text.is_char_boundary(r.sent) {
        if done_by_length {
            r.finished = Some("length");
        }
        return;
    }
    // earliest complete stop string in the unsent text (and a little before
    // it, in case a stop string straddles the boundary)
    let mut search = r.sent.saturating_sub(r.req.stop.iter().map(String::len).max().unwrap_or(0));
    while !text.is_char_boundary(search) {
        search -= 1;
    }
    let hit = r.req.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text[search..].find(s.as_str())).min();
    if let Some(at) = hit {
        let end = (search + at).max(r.sent);
        send(r, &text[r.sent..end]);
        r.sent = end;
        r.finished = Some("stop");
        return;
    }
    if done_by_length {
        r.finished = Some("length");
        flush(tok, r, Some(text));
        return;
    }
    if text.ends_with('\u{fffd}') {
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
        send(r, &text[r.sent..end]);
        r.sent = end;
    }
}

/// Sends whatever text is left unsent.
fn flush(tok: &Tokenizer, r: &mut Running<'_>, text: Option<String>) {
    let text = text.unwrap_or_else(|| tok.decode(&r.generated).unwrap_or_default());
    if text.len() > r.sent && text.is_char_boundary(r.sent) {
        let piece = text[r.sent..].to_string();
        send(r, &piece);
        r.sent = text.len();
    }
}

fn send(r: &mut Running<'_>, piece: &str) {
    if piece.is_empty() {
        return;
    }
    if r.req.events.send(Event::Text(piece.to_string())).is_err() {
        r.cancelled = true;
    }
}
