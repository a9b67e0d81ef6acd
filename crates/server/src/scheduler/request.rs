//! What the scheduler is given: requests, validated and sized, and the
//! limits it runs under.

use super::events::Event;
use crate::contexts::store::CompressJob;
use kvslim_cache::PolicySpec;
use kvslim_engine::{Context, SamplingParams};
use kvslim_models::Model;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

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
    /// Prompt tokens a pass prefills together with the running sequences'
    /// decode steps (mixed batches: one weight read for both): a prompt
    /// whose policy keeps every token is cut into chunks of this size
    /// (which changes its numbers by rounding only), one under a policy
    /// that must see it whole runs whole when it is at most
    /// [`kvslim_engine::WHOLE_CHUNKS`] times this
    /// ([`kvslim_engine::Session::begin_feed_mixed`]). Other prompts, or
    /// all with 0, run in layer slices between decode steps
    /// (`prefill_chunk`, `prefill_share`).
    pub mixed_chunk: usize,
    /// A greedy request decoding alone (no other sequence running, no
    /// log-probs asked) runs n-gram speculative decoding: drafts copied
    /// from its prompt and output, verified in one pass, the same tokens
    /// as plain greedy decoding. Only where the model's verification pass
    /// reads the weights once for all its tokens (every matrix with integer
    /// products); elsewhere a pass would cost a step per token.
    pub speculative: bool,
    /// Where compressed contexts are saved and found again (`--contexts-dir`).
    pub contexts_dir: Option<std::path::PathBuf>,
    /// A draft model for the speculative passes (`--draft-model`): drafts
    /// copied from the context where it matches, else the draft model's.
    pub draft: Option<DraftModel>,
}

/// A smaller model with the served model's vocabulary, and the policy its
/// drafts run under (`None`: the request's).
#[derive(Clone)]
pub struct DraftModel {
    pub model: Arc<Model>,
    pub policy: Option<PolicySpec>,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.model.config;
        write!(f, "DraftModel({:?} {}x{}, policy {:?})", c.architecture, c.n_layers, c.hidden_size, self.policy)
    }
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
            mixed_chunk: 128,
            speculative: true,
            contexts_dir: None,
            draft: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Limits;

    #[test]
    fn default_limits_page_cache_and_pace_prefills() {
        let l = Limits::default();
        assert_eq!((l.kv_page_size, l.prefix_cache, l.prefill_chunk, l.mixed_chunk), (16, 16, 512, 128));
        assert!(l.prefill_share > 0.0 && l.prefill_share <= 1.0);
        assert!(l.queue_limit >= l.max_batch && l.speculative && l.contexts_dir.is_none());
    }
}
