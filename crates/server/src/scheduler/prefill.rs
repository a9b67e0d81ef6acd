//! Prefills while other sequences decode: a prompt whose policy keeps
//! every token runs a chunk per pass together with their decode steps
//! ([`mixed_step`], [`Limits::mixed_chunk`]); any other is fed a few layers
//! at a time between them ([`prefill_slice`]), paced so that prefills take
//! at most [`Limits::prefill_share`] of the time. A finished prompt goes
//! into the prefix cache (or becomes a stored context) and samples its
//! first token.

use super::ctx::Ctx;
use super::decode::{batched_step, sample_batch};
use super::events::Event;
use super::events::{token_logprob, TokenLogprob};
use super::request::Limits;
use super::sequence::Running;
use crate::contexts::store::CompressJob;
use kvslim_engine::{Context, Feed};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// A request whose prompt is being prefilled ([`prefill_slice`]).
pub(super) struct Prefilling<'m> {
    pub r: Running<'m>,
    pub feed: Feed,
    /// Whether the prefilled prompt goes into the prefix cache.
    pub caching: bool,
    pub spec: String,
    /// Fed in chunks that share their passes with decode steps ([`mixed_step`]).
    pub mixed: bool,
}

/// What one slice of a prefill did.
pub(super) enum Slice {
    /// Ran this many token-layers; more to come.
    Ran(usize),
    /// Ran this many token-layers and finished the prompt.
    Done(usize),
    /// The request left (client gone, deadline, error): its KV is freed.
    Stopped,
}

/// Runs about `budget` token-layers of a request's prefill (whole layers,
/// at least one), unless its client left or its deadline passed.
pub(super) fn prefill_slice(cx: &mut Ctx<'_>, p: &mut Prefilling<'_>, budget: usize) -> Slice {
    let ran = if leaving(p, cx.m) { None } else { Some(p.r.session.feed_some(&mut p.feed, budget)) };
    match ran {
        Some(Ok((done, used))) => {
            cx.m.prefill_slices_total.fetch_add(1, Relaxed);
            if done {
                Slice::Done(used)
            } else {
                Slice::Ran(used)
            }
        }
        Some(Err(e)) => failed(cx, p, e),
        None => stop(cx, p),
    }
}

/// One pass of a mixed batch: the next chunk of `p`'s prompt and a decode
/// step for each of `running`, sampled as [`batched_step`] samples. A
/// request whose prefill leaves or fails stops, and the others still take
/// their step. The slice's token-layers are not counted (nothing paces a
/// mixed batch: its decode steps advance with every chunk).
pub(super) fn mixed_step(
    cx: &mut Ctx<'_>,
    p: &mut Prefilling<'_>,
    running: &mut [Running<'_>],
    batch: &mut BatchScratch,
) -> (Slice, Result<(), String>) {
    let (model, tok, m) = (cx.model, cx.tok, cx.m);
    if leaving(p, m) {
        return (stop(cx, p), batched_step(model, tok, m, running, batch));
    }
    let mut items: Vec<BatchItem<'_>> =
        running.iter_mut().map(|r| BatchItem { token: r.next, cache: &mut r.session.cache }).collect();
    let ran = p.r.session.feed_mixed(&mut p.feed, &mut items, batch);
    drop(items);
    match ran {
        Ok(done) => {
            m.prefill_slices_total.fetch_add(1, Relaxed);
            m.mixed_passes_total.fetch_add(1, Relaxed);
            sample_batch(tok, m, running, batch);
            (if done { Slice::Done(0) } else { Slice::Ran(0) }, Ok(()))
        }
        // every input is checked before anything runs: the others step alone
        Err(e) => (failed(cx, p, e), batched_step(model, tok, m, running, batch)),
    }
}

/// Whether the request's client left or its deadline passed (reported).
fn leaving(p: &mut Prefilling<'_>, m: &crate::metrics::Metrics) -> bool {
    if p.r.req.events.is_closed() {
        p.r.cancelled = true;
        return true;
    }
    if p.r.req.deadline.is_some_and(|d| Instant::now() >= d) {
        let _ = p.r.req.events.send(Event::TimedOut(0));
        m.requests_timed_out_total.fetch_add(1, Relaxed);
        return true;
    }
    false
}

/// A prefill that failed: the client is told, the request stops.
fn failed(cx: &mut Ctx<'_>, p: &mut Prefilling<'_>, e: impl std::fmt::Display) -> Slice {
    let _ = p.r.req.events.send(Event::Error(format!("prefill failed: {e}")));
    p.r.cancelled = true;
    stop(cx, p)
}

/// A stopped prefill gives the lent buffers back and frees its KV.
fn stop(cx: &mut Ctx<'_>, p: &mut Prefilling<'_>) -> Slice {
    std::mem::swap(&mut p.r.session.scratch, &mut cx.prefill);
    p.r.release(cx.m);
    Slice::Stopped
}

/// A finished prefill: the lent buffers go back, the prompt into the
/// prefix cache, its log-probs (when asked for) to the client, and the
/// first token is sampled.
pub(super) fn finish_prefill<'m>(cx: &mut Ctx<'m>, p: Prefilling<'m>) -> Option<Running<'m>> {
    let Prefilling { mut r, feed, caching, spec, .. } = p;
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
    r.start(cx.tok, cx.m, &last)
}

/// A finished prefill of `POST /v1/contexts`: the cache becomes a stored
/// context (its own bytes reserved, the request's reservation returned).
fn store_context(cx: &mut Ctx<'_>, mut r: Running<'_>, job: Box<CompressJob>) {
    r.release(cx.m);
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

/// How much prefill a loop iteration may run: with nothing decoding, a
/// prefill runs to its end; otherwise about `prefill_chunk` tokens' worth
/// of layers, and the next slice waits until the running sequences have
/// decoded for long enough that prefills take at most `prefill_share` of
/// the time.
pub(super) struct Pacing {
    /// Token-layers a step may prefill while others decode.
    chunk: usize,
    share: f64,
    /// Token-layers prefilled in this iteration.
    spent: usize,
    /// Seconds the running batch is to decode before the next slice.
    owed: f64,
}

impl Pacing {
    pub fn new(limits: &Limits, layers: usize) -> Self {
        let share = limits.prefill_share.clamp(0.01, 1.0);
        Pacing { chunk: limits.prefill_chunk.max(1) * layers, share, spent: 0, owed: 0.0 }
    }

    /// A new iteration; with nothing decoding, nothing is owed.
    pub fn begin(&mut self, decoding: bool) {
        if !decoding {
            self.owed = 0.0;
        }
        self.spent = 0;
    }

    /// The token-layers the next slice may run, or `None` when the
    /// iteration's prefill is over (its chunk spent, or decoding owed).
    pub fn budget(&self, decoding: bool) -> Option<usize> {
        if self.owed > 0.0 {
            return None;
        }
        if !decoding {
            return Some(usize::MAX);
        }
        (self.spent < self.chunk).then(|| self.chunk - self.spent)
    }

    /// A slice took `seconds` (ran `used` token-layers, `None` when it
    /// stopped the request); while others decode, they are owed the
    /// decoding time that keeps prefills within their share.
    pub fn sliced(&mut self, seconds: f64, used: Option<usize>, decoding: bool) {
        if decoding {
            self.owed += seconds * (1.0 - self.share) / self.share;
        }
        if let Some(used) = used {
            self.spent = self.spent.saturating_add(used.max(1));
        }
    }

    /// A decode step took `seconds`: it pays off what prefills took; with
    /// no prefill to come it saves no credit for later ones.
    pub fn decoded(&mut self, seconds: f64, prefill_waiting: bool) {
        self.owed = if prefill_waiting { (self.owed - seconds).max(0.0) } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::scheduler::admission::{admit, Admitted};
    use crate::scheduler::testing::{greedy, request, tiny_model, tokenizer};
    use crate::scheduler::Pools;

    #[test]
    fn alone_a_prefill_runs_to_its_end() {
        let mut p = Pacing::new(&Limits { prefill_chunk: 4, ..Limits::default() }, 2);
        p.begin(false);
        p.sliced(1.0, Some(1000), false);
        assert_eq!(p.budget(false), Some(usize::MAX));
    }

    #[test]
    fn beside_a_batch_a_step_prefills_a_chunk_of_token_layers() {
        let mut p = Pacing::new(&Limits { prefill_chunk: 4, prefill_share: 1.0, ..Limits::default() }, 2);
        p.begin(true);
        assert_eq!(p.budget(true), Some(8));
        p.sliced(0.5, Some(5), true);
        assert_eq!(p.budget(true), Some(3), "share 1: nothing owed");
        p.sliced(0.5, Some(3), true);
        assert_eq!(p.budget(true), None);
        p.begin(true);
        assert_eq!(p.budget(true), Some(8), "a new iteration, a new chunk");
    }

    #[test]
    fn decoding_pays_off_the_time_prefills_took() {
        let mut p = Pacing::new(&Limits { prefill_share: 0.25, ..Limits::default() }, 2);
        p.begin(true);
        p.sliced(0.1, None, true);
        // 0.1 s of prefill at a quarter of the time: 0.3 s of decoding
        assert!((p.owed - 0.3).abs() < 1e-12);
        p.decoded(0.2, true);
        assert_eq!(p.budget(true), None);
        p.decoded(0.2, true);
        assert!(p.budget(true).is_some());
        p.sliced(0.1, Some(1), true);
        p.decoded(0.0, false);
        assert!(p.budget(true).is_some(), "no prefill waiting: nothing owed");
        p.sliced(0.1, Some(1), true);
        p.begin(false);
        assert!(p.budget(false).is_some(), "nothing decoding: nothing owed");
    }

    #[test]
    fn a_prefill_in_slices_samples_the_greedy_first_token() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let limits = Limits::default();
        let mut cx = Ctx::new(&model, &tok, &m, &pools, &limits);
        let prompt: Vec<u32> = (0..12).map(|i| 10 + i % 5).collect();
        let (req, _rx) = request(prompt.clone(), 2);
        let Admitted::Prefill(mut p) = admit(&mut cx, req) else { panic!("prefilled") };
        // a token-layer's budget runs one whole layer at a time
        let mut slices = 1;
        while let Slice::Ran(_) = prefill_slice(&mut cx, &mut p, 1) {
            slices += 1;
        }
        assert_eq!(slices, model.config.n_layers);
        assert_eq!(m.prefill_slices_total.load(Relaxed), slices as u64);
        let r = finish_prefill(&mut cx, p).expect("running");
        assert_eq!(r.out.generated()[0], greedy(&model, &prompt, 1)[0]);
    }

    #[test]
    fn a_client_leaving_mid_prefill_frees_its_kv() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let limits = Limits::default();
        let mut cx = Ctx::new(&model, &tok, &m, &pools, &limits);
        let (req, rx) = request(vec![1, 11, 12, 13], 2);
        m.kv_bytes_in_use.store(req.kv_bytes, Relaxed);
        let Admitted::Prefill(mut p) = admit(&mut cx, req) else { panic!("prefilled") };
        assert!(matches!(prefill_slice(&mut cx, &mut p, 1), Slice::Ran(_)));
        drop(rx);
        assert!(matches!(prefill_slice(&mut cx, &mut p, 1), Slice::Stopped));
        assert_eq!(m.kv_bytes_in_use.load(Relaxed), 0);
        assert_eq!(m.requests_cancelled_total.load(Relaxed), 1);
    }
}
