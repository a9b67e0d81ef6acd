//! Admission: the queue of waiting requests, who gets in (batch room, KV
//! bytes reserved), and what a request starts as: a fork of a cached
//! prompt, a prefill to run, a question on a context, or a beam search.

use super::beams::run_beams;
use super::ctx::Ctx;
use super::events::Event;
use super::prefill::Prefilling;
use super::request::{Limits, Request};
use super::sequence::Running;
use crate::contexts::store::ContextStore;
use crate::metrics::Metrics;
use kvslim_cache::policy::TokenPolicySpec;
use kvslim_engine::{Context, Session};
use kvslim_models::Logits;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Requests waiting for admission, in arrival order.
#[derive(Default)]
pub(super) struct Queue {
    waiting: VecDeque<Request>,
}

impl Queue {
    pub fn push(&mut self, req: Request) {
        self.waiting.push_back(req);
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Drops the requests whose client left or whose deadline passed.
    pub fn prune(&mut self, m: &Metrics, now: Instant) {
        self.waiting.retain(|r| {
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
    }

    /// The first request, out of the queue with its KV bytes reserved, when
    /// the batch (of `running` sequences) has room and the bytes fit (unused
    /// contexts give way when memory is short). [`admit`] keeps the
    /// reservation or gives it back.
    pub fn next(&mut self, running: usize, limits: &Limits, m: &Metrics, contexts: &ContextStore) -> Option<Request> {
        if running >= limits.max_batch {
            return None;
        }
        let front = self.waiting.front()?;
        if !contexts.reserve(m, limits.kv_memory, front.kv_bytes) {
            return None;
        }
        m.queued.fetch_sub(1, Relaxed);
        self.waiting.pop_front()
    }
}

/// What admission made of a request.
pub(super) enum Admitted<'m> {
    /// Finished or failed already (beam search, `max_tokens` 0, an error).
    Gone,
    /// Its first token sampled (a cached prompt): it joins the batch.
    Running(Running<'m>),
    /// Its prompt is to be prefilled, a slice per step.
    Prefill(Prefilling<'m>),
}

/// Builds a request's cache (or forks a cached prefix of its prompt) and
/// starts its prefill, or samples its first token when the whole prompt
/// was cached. Its KV bytes are already reserved (released by
/// [`Running::release`], or here on failure).
pub(super) fn admit<'m>(cx: &mut Ctx<'m>, mut req: Request) -> Admitted<'m> {
    let (model, tok, m) = (cx.model, cx.tok, cx.m);
    if let Some(ctx) = req.context.take() {
        return admit_question(cx, req, &ctx);
    }
    let n = req.prompt.len();
    let ctx_len = model.config.context_len;
    let max_len = (n + req.max_tokens).min(ctx_len);
    let paged = req.policy.storage.page_size;
    let pool = paged.map(|p| cx.pools.get(p, req.policy.storage.kv_dtype, model.config.head_dim));
    let caching = paged.is_some() && cx.prefix.enabled() && req.beams <= 1 && req.compress.is_none();
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
        r.release(m);
        return Admitted::Gone;
    }
    match cached_logits {
        Some(logits) => {
            r.req.prompt = prompt;
            r.start(tok, m, &logits).map_or(Admitted::Gone, Admitted::Running)
        }
        None => {
            // the prompt's prefill gets the lent buffers until it is done
            std::mem::swap(&mut r.session.scratch, &mut cx.prefill);
            let want = if r.req.prompt_logprobs.is_some() { Logits::All } else { Logits::Last };
            let rest = &prompt[reused..];
            let chunk = cx.limits.mixed_chunk;
            let mixed = if chunk > 0 { r.session.begin_feed_mixed(rest, want, chunk) } else { None };
            let (feed, mixed) = match mixed {
                Some(feed) => (feed, true),
                None => (r.session.begin_feed(rest.to_vec(), want), false),
            };
            r.req.prompt = prompt;
            Admitted::Prefill(Prefilling { r, feed, caching, spec, mixed })
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
            r.start(tok, m, &logits).map_or(Admitted::Gone, Admitted::Running)
        }
        Err(e) => {
            m.kv_bytes_in_use.fetch_sub(req.kv_bytes, Relaxed);
            let _ = req.events.send(Event::Error(format!("cannot continue the context: {e}")));
            Admitted::Gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::pools::Pools;
    use crate::scheduler::prefill::{finish_prefill, prefill_slice, Slice};
    use crate::scheduler::testing::{events, outcome, request, tiny_model, tokenizer};
    use kvslim_cache::PolicySpec;
    use std::time::Duration;

    #[test]
    fn the_queue_drops_requests_whose_client_left_or_whose_deadline_passed() {
        let m = Metrics::default();
        let mut q = Queue::default();
        let (gone, rx) = request(vec![1], 4);
        drop(rx);
        let (mut late, mut late_rx) = request(vec![1], 4);
        let now = Instant::now();
        late.deadline = Some(now);
        let (mut alive, _alive_rx) = request(vec![1], 4);
        alive.deadline = Some(now + Duration::from_secs(60));
        [gone, late, alive].into_iter().for_each(|r| q.push(r));
        m.queued.store(3, Relaxed);
        q.prune(&m, now);
        assert_eq!(q.waiting.len(), 1);
        assert_eq!(m.queued.load(Relaxed), 1);
        assert_eq!(m.requests_cancelled_total.load(Relaxed), 1);
        assert_eq!(m.requests_timed_out_total.load(Relaxed), 1);
        assert!(matches!(events(&mut late_rx).as_slice(), [Event::TimedOut(0)]));
    }

    #[test]
    fn requests_enter_in_order_while_the_batch_has_room_and_their_bytes_fit() {
        let (m, contexts) = (Metrics::default(), ContextStore::new(None));
        let limits = Limits { kv_memory: 2500, max_batch: 3, ..Limits::default() };
        let mut q = Queue::default();
        let mut rxs = Vec::new();
        for p in 0..3 {
            let (req, rx) = request(vec![1, p], 4);
            q.push(req);
            rxs.push(rx);
        }
        m.queued.store(3, Relaxed);
        assert!(q.next(3, &limits, &m, &contexts).is_none(), "the batch is full");
        assert_eq!(q.next(0, &limits, &m, &contexts).map(|r| r.prompt), Some(vec![1, 0]));
        assert_eq!(q.next(1, &limits, &m, &contexts).map(|r| r.prompt), Some(vec![1, 1]));
        assert!(q.next(2, &limits, &m, &contexts).is_none(), "1000 more bytes do not fit in 2500");
        assert_eq!((m.kv_bytes_in_use.load(Relaxed), m.queued.load(Relaxed)), (2000, 1));
        m.kv_bytes_in_use.fetch_sub(1000, Relaxed);
        assert_eq!(q.next(1, &limits, &m, &contexts).map(|r| r.prompt), Some(vec![1, 2]));
        assert!(q.is_empty());
    }

    #[test]
    fn a_prompt_prefilled_before_starts_at_once_from_the_prefix_cache() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let limits = Limits::default();
        let mut cx = Ctx::new(&model, &tok, &m, &pools, &limits);
        let paged = PolicySpec::parse("full:page=4").unwrap();
        let prompt = vec![1, 11, 12, 13, 14, 15];
        let (mut first, mut rx1) = request(prompt.clone(), 3);
        first.policy = paged.clone();
        let Admitted::Prefill(mut p) = admit(&mut cx, first) else { panic!("a fresh prompt is prefilled") };
        assert!(matches!(prefill_slice(&mut cx, &mut p, usize::MAX), Slice::Done(_)));
        let r1 = finish_prefill(&mut cx, p).expect("running");
        let (mut again, mut rx2) = request(prompt.clone(), 3);
        again.policy = paged;
        let Admitted::Running(r2) = admit(&mut cx, again) else { panic!("a cached prompt starts at once") };
        assert_eq!((r2.reused, r2.out.generated()), (prompt.len(), r1.out.generated()));
        assert_eq!(m.prefix_hits_total.load(Relaxed), 1);
        assert_eq!(m.prompt_tokens_total.load(Relaxed), prompt.len() as u64, "only the first prompt was fed");
        assert_eq!(outcome(&events(&mut rx1)), outcome(&events(&mut rx2)));
    }

    #[test]
    fn a_beam_search_runs_whole_at_admission() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let limits = Limits::default();
        let mut cx = Ctx::new(&model, &tok, &m, &pools, &limits);
        let (mut req, mut rx) = request(vec![1, 11, 12], 4);
        req.beams = 2;
        m.kv_bytes_in_use.store(req.kv_bytes, Relaxed);
        assert!(matches!(admit(&mut cx, req), Admitted::Gone));
        assert!(outcome(&events(&mut rx)).1.is_some(), "done");
        assert_eq!(m.kv_bytes_in_use.load(Relaxed), 0, "its reservation went back");
    }
}
