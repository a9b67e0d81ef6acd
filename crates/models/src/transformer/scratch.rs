//! Reusable buffers of the forward pass. Everything is sized on the first
//! call and kept (shrinking keeps the capacity), so steady-state decode
//! steps do not allocate.

use super::trace::Trace;
use crate::config::ModelConfig;
use kvslim_cache::PrefillCandidates;
use kvslim_kernels::attention::{SplitLayout, SPLIT_SLOTS};

/// The activations of `n` rows (tokens or sequences) through one block.
#[derive(Default)]
pub(super) struct Activations {
    pub x: Vec<f32>,
    pub xn: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    pub proj: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
}

impl Activations {
    fn ensure(&mut self, c: &ModelConfig, n: usize) {
        let sizes = [
            (&mut self.x, n * c.hidden_size),
            (&mut self.xn, n * c.hidden_size),
            (&mut self.q, n * c.q_dim()),
            (&mut self.k, n * c.kv_dim()),
            (&mut self.v, n * c.kv_dim()),
            (&mut self.att, n * c.q_dim()),
            (&mut self.proj, n * c.hidden_size),
            (&mut self.gate, n * c.ffn_size),
            (&mut self.up, n * c.ffn_size),
        ];
        for (buf, len) in sizes {
            buf.resize(len, 0.0);
        }
    }
}

/// Reusable buffers for one sequence's forward calls.
#[derive(Default)]
pub struct Scratch {
    pub(super) a: Activations,
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// Attention probabilities: query head `h`'s row at `h · slots`.
    pub(super) probs: Vec<f32>,
    /// Decode attention's per-chunk partial states (see [`SplitLayout`]):
    /// KV head × chunk blocks.
    pub(super) split: Vec<f32>,
    pub(super) logits: Vec<f32>,
    /// Prefill: one component's candidates (held slots, then the chunk).
    pub(super) cand: PrefillCandidates,
    /// KVzip's probe: what one of its pieces attends to.
    pub(super) probe_view: PrefillCandidates,
    /// Candidate keys per KV head packed for the tiled prefill kernel.
    pub(super) packed_keys: Vec<Vec<f32>>,
    /// [`Model::forward_sequential`](super::Model::forward_sequential):
    /// the chunk's projections and attention outputs, `[n, …]`.
    pub(super) rows: Activations,
    /// Set to `Some(Trace::default())` to record the next forward call.
    pub trace: Option<Trace>,
    /// Set to `Some(Vec::new())` to collect, per layer of every prefill
    /// chunk, the chunk's normalised input hidden states `[n, hidden]` (the
    /// attention norm's output, the chunk's own rows only: no KVzip probe
    /// rows), what a KVzap predictor reads. Unlike a trace it records
    /// nothing else and leaves the kernels as they are.
    pub hidden_tap: Option<Vec<Vec<f32>>>,
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sizes buffers for `n` tokens and `slots` cache slots.
    pub(super) fn ensure(&mut self, c: &ModelConfig, n: usize, slots: usize, logit_rows: usize) {
        self.a.ensure(c, n);
        let kinds =
            if c.features.sliding_window.as_ref().is_some_and(|w| w.local_rope_theta.is_some()) { 2 } else { 1 };
        let rot = c.rope.map_or(0, |r| r.rotary_dim / 2) * kinds;
        let sizes = [
            (&mut self.cos, n * rot),
            (&mut self.sin, n * rot),
            (&mut self.probs, c.n_heads * slots),
            (&mut self.split, c.n_kv_heads * slots.div_ceil(SPLIT_SLOTS).max(1) * split_layout(c).block_len()),
            (&mut self.logits, logit_rows * c.vocab_size),
        ];
        for (buf, len) in sizes {
            buf.resize(len, 0.0);
        }
        self.packed_keys.resize(c.n_kv_heads, Vec::new());
    }

    /// Logits of the last forward call: `[rows, vocab]`.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// The chunk-state layout of split decode attention for this model.
pub(super) fn split_layout(c: &ModelConfig) -> SplitLayout {
    SplitLayout { g: c.group_size(), d: c.head_dim }
}

/// Reusable buffers for batched decode steps: the batch's activations
/// (`[n, …]`, one row per sequence) and one attention scratch per sequence.
#[derive(Default)]
pub struct BatchScratch {
    pub(super) a: Activations,
    pub(super) logits: Vec<f32>,
    pub(super) vocab: usize,
    pub(super) seqs: Vec<Scratch>,
    /// [`Model::forward_steps_batch`](super::Model::forward_steps_batch):
    /// the hidden states of the rows that get logits.
    pub(super) picked: Vec<f32>,
}

impl BatchScratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sizes the batch's buffers for `n` rows and `logit_rows` rows of logits.
    pub(super) fn ensure(&mut self, c: &ModelConfig, n: usize, logit_rows: usize) {
        self.a.ensure(c, n);
        self.logits.resize(logit_rows * c.vocab_size, 0.0);
        self.vocab = c.vocab_size;
        if self.seqs.len() < n {
            self.seqs.resize_with(n, Scratch::new);
        }
    }

    /// Logits of item `i` of the last [`Model::forward_batch`](super::Model::forward_batch) call.
    pub fn logits(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}
