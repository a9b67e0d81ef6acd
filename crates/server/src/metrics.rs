//! Counters and gauges shared by the scheduler and the HTTP layer, rendered
//! as Prometheus text by `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

#[derive(Default)]
pub struct Metrics {
    /// Requests waiting for admission (in the channel or the queue).
    pub queued: AtomicUsize,
    /// Sequences in the running batch.
    pub running: AtomicUsize,
    /// KV bytes reserved by running sequences.
    pub kv_bytes_in_use: AtomicUsize,
    pub kv_bytes_limit: AtomicUsize,
    pub requests_total: AtomicU64,
    pub requests_rejected_total: AtomicU64,
    pub requests_cancelled_total: AtomicU64,
    /// Requests stopped at their deadline (`--request-timeout`).
    pub requests_timed_out_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub generated_tokens_total: AtomicU64,
    /// Token slots evicted by policies (summed over layers and KV heads).
    pub evicted_slots_total: AtomicU64,
    pub decode_steps_total: AtomicU64,
    /// Decode steps run while a prompt's prefill was part-way (a long
    /// prompt does not stall the running batch).
    pub decode_steps_during_prefill_total: AtomicU64,
    /// Speculative passes run for greedy requests decoding alone.
    pub speculative_passes_total: AtomicU64,
    /// Draft tokens those passes verified, and how many were accepted.
    pub draft_tokens_total: AtomicU64,
    pub draft_tokens_accepted_total: AtomicU64,
    /// Slices prefills ran in (one per step a prefill ran in).
    pub prefill_slices_total: AtomicU64,
    /// Passes that ran a prompt chunk with the running sequences' decode steps.
    pub mixed_passes_total: AtomicU64,
    /// Requests whose prompt is being prefilled (0 or 1).
    pub prefilling: AtomicUsize,
    /// Generated tokens per second over the last measurement window (f64 bits).
    pub tokens_per_second: AtomicU64,
    /// Size of the last decode batch.
    pub last_batch_size: AtomicUsize,
    /// Requests that started from a cached prompt prefix.
    pub prefix_hits_total: AtomicU64,
    /// Prompt tokens taken from the prefix cache instead of prefilled.
    pub prefix_tokens_reused_total: AtomicU64,
    /// Pages held in the server's page pools (requests and prefix cache),
    /// refreshed when rendered.
    pub kv_pages_in_use: AtomicUsize,
    /// Shared pages copied on first write, over all pools.
    pub kv_cow_copies_total: AtomicUsize,
    /// Compressed contexts held in memory, and the KV bytes reserved for them.
    pub contexts: AtomicUsize,
    pub context_bytes: AtomicUsize,
    /// Unused contexts evicted to make room (they stay on disk with `--contexts-dir`).
    pub contexts_evicted_total: AtomicU64,
    /// Questions answered on a fork of a context.
    pub context_requests_total: AtomicU64,
}

impl Metrics {
    /// Adds `bytes` to the KV in use when the total stays within `limit`
    /// (one atomic step, so the scheduler and `/v1/kv/inspect`, which admit
    /// from the same pool on different threads, never overcommit it).
    pub fn try_reserve_kv(&self, bytes: usize, limit: usize) -> bool {
        self.kv_bytes_in_use
            .fetch_update(Relaxed, Relaxed, |used| used.checked_add(bytes).filter(|&t| t <= limit))
            .is_ok()
    }

    pub fn set_tokens_per_second(&self, v: f64) {
        self.tokens_per_second.store(v.to_bits(), Relaxed);
    }

    pub fn render(&self) -> String {
        // (name, type, help, value), in the order they are rendered; one
        // layout for every row (some help lines are too long for one line)
        #[rustfmt::skip]
        let rows = [
            (
                "kvslim_queue_length",
                "gauge",
                "Requests waiting for admission.",
                self.queued.text(),
            ),
            (
                "kvslim_running_requests",
                "gauge",
                "Sequences in the running batch.",
                self.running.text(),
            ),
            (
                "kvslim_kv_bytes_in_use",
                "gauge",
                "KV cache bytes reserved by running sequences.",
                self.kv_bytes_in_use.text(),
            ),
            (
                "kvslim_kv_bytes_limit",
                "gauge",
                "KV memory pool size.",
                self.kv_bytes_limit.text(),
            ),
            (
                "kvslim_requests_total",
                "counter",
                "Requests accepted.",
                self.requests_total.text(),
            ),
            (
                "kvslim_requests_rejected_total",
                "counter",
                "Requests refused (queue full).",
                self.requests_rejected_total.text(),
            ),
            (
                "kvslim_requests_cancelled_total",
                "counter",
                "Requests whose client went away.",
                self.requests_cancelled_total.text(),
            ),
            (
                "kvslim_requests_timed_out_total",
                "counter",
                "Requests stopped at their deadline (--request-timeout).",
                self.requests_timed_out_total.text(),
            ),
            (
                "kvslim_prompt_tokens_total",
                "counter",
                "Prompt tokens prefilled (prefix-cache reuse excluded).",
                self.prompt_tokens_total.text(),
            ),
            (
                "kvslim_generated_tokens_total",
                "counter",
                "Tokens generated.",
                self.generated_tokens_total.text(),
            ),
            (
                "kvslim_evicted_slots_total",
                "counter",
                "KV slots evicted by the cache policies (per layer and KV head).",
                self.evicted_slots_total.text(),
            ),
            (
                "kvslim_decode_steps_total",
                "counter",
                "Batched decode steps run.",
                self.decode_steps_total.text(),
            ),
            (
                "kvslim_decode_steps_during_prefill_total",
                "counter",
                "Decode steps run while a prompt's prefill was part-way (--prefill-chunk).",
                self.decode_steps_during_prefill_total.text(),
            ),
            (
                "kvslim_speculative_passes_total",
                "counter",
                "Speculative passes (drafts verified in one pass) run for greedy requests decoding alone.",
                self.speculative_passes_total.text(),
            ),
            (
                "kvslim_draft_tokens_total",
                "counter",
                "Draft tokens verified by speculative passes.",
                self.draft_tokens_total.text(),
            ),
            (
                "kvslim_draft_tokens_accepted_total",
                "counter",
                "Draft tokens accepted (each one a decode step saved).",
                self.draft_tokens_accepted_total.text(),
            ),
            (
                "kvslim_prefill_slices_total",
                "counter",
                "Slices the prompts' prefills ran in.",
                self.prefill_slices_total.text(),
            ),
            (
                "kvslim_mixed_passes_total",
                "counter",
                "Passes that ran a prompt chunk together with the running requests' decode steps (--mixed-chunk).",
                self.mixed_passes_total.text(),
            ),
            (
                "kvslim_prefilling_requests",
                "gauge",
                "Requests whose prompt is being prefilled.",
                self.prefilling.text(),
            ),
            (
                "kvslim_tokens_per_second",
                "gauge",
                "Generated tokens per second (last window of about a second).",
                format!("{:.3}", f64::from_bits(self.tokens_per_second.load(Relaxed))),
            ),
            (
                "kvslim_batch_size",
                "gauge",
                "Size of the last decode batch.",
                self.last_batch_size.text(),
            ),
            (
                "kvslim_prefix_hits_total",
                "counter",
                "Requests that reused a cached prompt prefix.",
                self.prefix_hits_total.text(),
            ),
            (
                "kvslim_prefix_tokens_reused_total",
                "counter",
                "Prompt tokens taken from the prefix cache instead of prefilled.",
                self.prefix_tokens_reused_total.text(),
            ),
            (
                "kvslim_kv_pages_in_use",
                "gauge",
                "KV pages held in the page pools (running requests and the prefix cache; K and V pages each count).",
                self.kv_pages_in_use.text(),
            ),
            (
                "kvslim_kv_cow_copies_total",
                "counter",
                "Shared KV pages copied on their first write (copy-on-write).",
                self.kv_cow_copies_total.text(),
            ),
            (
                "kvslim_contexts",
                "gauge",
                "Compressed contexts held in memory (/v1/contexts).",
                self.contexts.text(),
            ),
            (
                "kvslim_context_kv_bytes",
                "gauge",
                "KV bytes reserved for compressed contexts (part of kvslim_kv_bytes_in_use; their forks reserve only their tails).",
                self.context_bytes.text(),
            ),
            (
                "kvslim_contexts_evicted_total",
                "counter",
                "Unused contexts evicted from memory to make room.",
                self.contexts_evicted_total.text(),
            ),
            (
                "kvslim_context_requests_total",
                "counter",
                "Requests answered on a fork of a compressed context.",
                self.context_requests_total.text(),
            ),
        ];
        let mut s = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        s
    }
}

/// A counter or gauge read for `/metrics`.
trait Text {
    fn text(&self) -> String;
}

impl Text for AtomicUsize {
    fn text(&self) -> String {
        self.load(Relaxed).to_string()
    }
}

impl Text for AtomicU64 {
    fn text(&self) -> String {
        self.load(Relaxed).to_string()
    }
}
