//! The inference loop, on a dedicated thread: continuous batching over
//! independent sequences.
//!
//! Each iteration takes new requests from the channel, drops queued ones
//! whose client left, admits queued requests in order while their KV bytes
//! fit the pool and the batch has room, prefills their prompts one at a
//! time (while others decode, a slice of layers per iteration within
//! [`Limits::prefill_share`] of the time; the first token when the prompt
//! is done), then runs one batched decode step
//! ([`kvslim_models::Model::forward_batch`]) over every running sequence
//! and samples each one's next token with its own sampler. A greedy sequence decoding alone runs a speculative pass
//! instead ([`Limits::speculative`]). Finished or cancelled sequences leave
//! between steps and their KV memory returns to the pool at once.
//!
//! Paged requests draw from one [`kvslim_cache::PagePool`] per (page size,
//! KV dtype) ([`Pools`]) and reserve [`worst_case_pages`]; a small LRU of prefilled
//! prompts lets a request with the same policy and prompt (or, where
//! extending is exact, a prompt starting with a cached one) fork that cache
//! instead of prefilling.
//!
//! The parts: `run` is the loop; `admission` the queue and what a request
//! starts as; `prefill` the slices and their pacing; `decode` the batched
//! step and `speculation` the speculative pass; `beams` beam search;
//! `sequence` a running request; `streaming` its text (stop strings,
//! UTF-8); `prefix_cache` the LRU of prefilled prompts; `ctx` what
//! admission and prefill share; `pools` the page pools and KV
//! reservations; `request` what the scheduler is given; `events` what a
//! request's handler hears. Each part imports only the ones it needs, so
//! the parts form no import circle.

mod admission;
mod beams;
mod ctx;
mod decode;
pub(crate) mod events;
pub(crate) mod pools;
mod prefill;
mod prefix_cache;
pub(crate) mod request;
mod run;
mod sequence;
mod speculation;
mod streaming;
#[cfg(test)]
mod testing;

use crate::contexts::store::ContextStore;
use crate::metrics::Metrics;
pub use events::{token_logprob, Event, Finish, TokenLogprob};
use kvslim_models::{Model, Tokenizer};
pub use pools::{apply_default_page, full_kv_bytes, kv_bytes_for, worst_case_pages, Pools};
pub use request::{DraftModel, Limits, Request};
use run::run;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    use super::*;
    use testing::request;

    fn handle(queue_limit: usize) -> (SchedulerHandle, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel();
        let limits = Limits { queue_limit, ..Limits::default() };
        let metrics = Arc::new(Metrics::default());
        (SchedulerHandle { tx, metrics, limits, pools: Pools::default(), contexts: ContextStore::new(None) }, rx)
    }

    #[test]
    fn submit_refuses_past_the_queue_limit() {
        let (h, rx) = handle(2);
        let mut keep = Vec::new();
        for _ in 0..3 {
            let (req, events) = request(vec![1], 1);
            keep.push(events);
            let _ = h.submit(req);
        }
        let (req, _events) = request(vec![1], 1);
        assert!(matches!(h.submit(req), Err(SubmitError::QueueFull)));
        let m = &h.metrics;
        assert_eq!((m.queued.load(Relaxed), m.requests_total.load(Relaxed)), (2, 2));
        assert_eq!(m.requests_rejected_total.load(Relaxed), 2);
        assert_eq!(rx.try_iter().count(), 2);
    }

    #[test]
    fn submit_to_a_stopped_scheduler_fails_without_queueing() {
        let (h, rx) = handle(2);
        drop(rx);
        let (req, _events) = request(vec![1], 1);
        assert!(matches!(h.submit(req), Err(SubmitError::Stopped)));
        assert_eq!((h.metrics.queued.load(Relaxed), h.metrics.requests_total.load(Relaxed)), (0, 0));
    }
}
