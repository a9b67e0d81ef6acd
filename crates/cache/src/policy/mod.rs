//! Cache policies: which tokens stay in a sequence's KV store.
//!
//! A policy never touches K/V arrays directly: it reads attention
//! probabilities and slot metadata, and picks victims through
//! [`PolicySlots`] (read positions and scores, add to scores, evict).
//! [`SequenceCache`](crate::SequenceCache) calls it; the model never does.
//! The policy-spec grammar
//! in [`spec`] is the one parser shared by the CLI, server, evaluation and
//! config files; [`budget`] is the same grammar with the budget left open,
//! so evaluation can give every family the same B slots per sequence.

pub mod alloc;
pub mod auto;
pub mod budget;
pub mod chai;
pub mod follow;
pub mod score;
pub mod sliding;
pub mod spec;
pub mod token;
pub mod tuned;

#[cfg(test)]
mod h2o_behaviour;

pub use alloc::{Alloc, Allocated};
pub use budget::PolicyFamily;
pub use follow::{FollowDecisions, KeptSets, SharedKeptSets};
pub use score::ScoreRule;
pub use sliding::SlidingWindowLayers;
pub use spec::{Budget, PolicySpec, PolicySpecError, TokenPolicySpec};
pub use token::{EvictionConfig, EvictionEvent, EvictionUnit, Observation, PageScore, TokenEviction, VictimRule};
pub use tuned::{LoadError, TunedRef};

use crate::store::HeadSlots;

/// How the attention of a KV head's query-head group is folded into one
/// score per slot (docs/policies.md §1 step 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreAgg {
    /// Σ over the group's query heads (the default).
    Sum,
    /// max over the group's query heads.
    Max,
}

impl ScoreAgg {
    /// `scores[i] += agg_h probs[h * len + i]` for a `group × len` block.
    #[inline]
    pub fn accumulate(self, probs: &[f32], group: usize, scores: &mut [f32]) {
        let len = scores.len();
        match self {
            ScoreAgg::Sum => {
                for h in 0..group {
                    let row = &probs[h * len..(h + 1) * len];
                    scores.iter_mut().zip(row).for_each(|(s, p)| *s += p);
                }
            }
            ScoreAgg::Max => {
                for (i, s) in scores.iter_mut().enumerate() {
                    let mut m = 0f32;
                    for h in 0..group {
                        m = m.max(probs[h * len + i]);
                    }
                    *s += m;
                }
            }
        }
    }

    /// The group's attention to slot `i` folded into one value (Σ or max
    /// over the `group` rows of a `group × len` block).
    #[inline]
    pub fn fold(self, probs: &[f32], group: usize, len: usize, i: usize) -> f32 {
        let col = (0..group).map(|h| probs[h * len + i]);
        match self {
            ScoreAgg::Sum => col.sum(),
            ScoreAgg::Max => col.fold(0f32, f32::max),
        }
    }
}

/// One (layer, KV head) of a cache, as the policies address it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeadId {
    pub layer: usize,
    pub kv_head: usize,
}

impl HeadId {
    pub const fn new(layer: usize, kv_head: usize) -> HeadId {
        HeadId { layer, kv_head }
    }
}

/// What a policy may see of and do to one (layer, KV head)'s slots during a
/// decode step: read positions and scores, add attention to the scores,
/// and evict. Nothing else of [`HeadSlots`] (K/V rows, pushes, pages) is
/// reachable through it.
pub struct PolicySlots<'a> {
    slots: &'a mut HeadSlots,
}

impl<'a> PolicySlots<'a> {
    pub fn new(slots: &'a mut HeadSlots) -> Self {
        PolicySlots { slots }
    }
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
    /// Original positions, in slot order.
    pub fn positions(&self) -> &[u32] {
        self.slots.positions()
    }
    /// Accumulated scores, in slot order.
    pub fn scores(&self) -> &[f32] {
        self.slots.scores()
    }
    /// Scores to accumulate attention into.
    pub fn scores_mut(&mut self) -> &mut [f32] {
        self.slots.scores_mut()
    }
    /// The page holding `slot` (`None` for fixed slots).
    pub fn page_of(&self, slot: usize) -> Option<u32> {
        self.slots.page_of(slot)
    }
    /// ‖v‖ of every occupied slot's stored value row, in slot order, into
    /// `norms` (`row` is a `head_dim` scratch for decoding coded rows): the
    /// one thing of the V data a policy may read, for value-weighted
    /// scores. Allocation-free once the buffers have grown.
    pub fn value_norms(&self, row: &mut Vec<f32>, norms: &mut Vec<f32>) {
        use kvslim_kernels::attention::SlotRows;
        row.resize(self.slots.head_dim(), 0.0);
        let rows = self.slots.value_rows();
        norms.clear();
        for slot in 0..self.slots.len() {
            let v = rows.row(slot, row);
            norms.push(v.iter().map(|x| x * x).sum::<f32>().sqrt());
        }
    }
    /// Evicts `slot` ([`HeadSlots::evict`]: the last slot moves into its place).
    pub fn evict(&mut self, slot: usize) {
        self.slots.evict(slot)
    }
}

/// What the cache tells a policy, and what it lets a policy do.
pub trait CachePolicy: Send + Sync {
    /// Short name for reports (`full`, `h2o`, …).
    fn name(&self) -> &str;

    /// A copy of the policy's whole per-sequence state (RNG streams, trace,
    /// everything), so a forked sequence (a beam) evolves exactly as the
    /// original would have from this point.
    fn clone_box(&self) -> Box<dyn CachePolicy>;

    /// Slots to allocate per (layer, KV head) for a sequence of at most
    /// `max_len` tokens. Budgeted policies return budget + 1 (one candidate).
    fn capacity(&self, max_len: usize) -> usize;

    /// Slots to allocate for layer `layer`'s heads (sliding-window layers
    /// need fewer; see [`SlidingWindowLayers`]).
    fn layer_capacity(&self, _layer: usize, max_len: usize) -> usize {
        self.capacity(max_len)
    }

    /// The most slots (layer, KV head) holds before the policy evicts
    /// (`None`: only the store's capacity limits it). Below the capacity
    /// when an allocator gives heads of one layer different shares inside
    /// rows allocated at the layer's largest ([`alloc`]).
    fn head_budget(&self, _layer: usize, _kv_head: usize) -> Option<usize> {
        None
    }

    /// True when the policy must see every KV head of `layer` before any of
    /// them evicts, because it has not yet split the layer's slots among
    /// its heads and a head now has `candidates` (more than the layer's
    /// per-head budget). The cache then calls [`CachePolicy::decide_layer`]
    /// once with every head's candidates.
    fn layer_decision_pending(&self, _layer: usize, _candidates: usize) -> bool {
        false
    }

    /// Splits `layer`'s slots among its KV heads from their candidates
    /// (`heads[h]`: positions and scores of head h), once ([`alloc`]'s `ada`).
    fn decide_layer(&mut self, _layer: usize, _heads: &[(&[u32], &[f32])]) {}

    /// True until the budgets of every (layer, KV head) are set from one
    /// ranking over all of them ([`alloc`]'s `global`): until then no head
    /// evicts, and the cache calls [`CachePolicy::decide_global`] when it
    /// advances past its first forward call.
    fn global_decision_pending(&self) -> bool {
        false
    }

    /// Sets every (layer, KV head)'s budget from all their candidates
    /// (`units[layer · kv_heads + kv_head]`: positions and scores), once.
    fn decide_global(&mut self, _units: &[(&[u32], &[f32])]) {}

    /// True when the policy keeps a fixed number of slots whatever the
    /// sequence length.
    fn bounded(&self) -> bool {
        false
    }

    /// The score aggregation when the policy needs attention probabilities;
    /// `None` lets the forward pass skip handing them over.
    fn score_aggregation(&self) -> Option<ScoreAgg> {
        None
    }

    /// How the scores are updated from attention (see [`ScoreRule`]); a
    /// rule that is not a column sum makes prefill apply it query by query.
    fn score_rule(&self) -> ScoreRule {
        ScoreRule::Sum
    }

    /// Streaming prefill: the prompt is fed in chunks of this many tokens.
    fn prefill_chunk(&self) -> Option<usize> {
        None
    }

    /// How a one-chunk prefill scores the prompt, when not by every query's
    /// attention (SnapKV's window, expected attention).
    fn observation(&self) -> Option<token::Observation> {
        None
    }

    /// Called once per decode step, per layer and KV head, after attention
    /// over the candidate set D_t (the new token is the last occupied slot).
    /// `probs` is `rows × slots.len()`: the group's query heads (or, under
    /// CHAI, the representatives reading these slots). The policy evicts
    /// from `slots` itself and returns the victims in the order it evicted
    /// them (each index as it was at its own eviction), so KV heads that
    /// must stay aligned can replay the same evictions. Token eviction
    /// returns at most one victim; page eviction a whole page's slots.
    fn after_decode_step(&mut self, _head: HeadId, _slots: &mut PolicySlots<'_>, _probs: &[f32]) -> &[usize] {
        &[]
    }

    /// Called after a prefill chunk, per layer and KV head, with every
    /// candidate (the slots held before the chunk, then the chunk's tokens):
    /// their positions and scores (column sums of the chunk's attention
    /// added). Fills `keep` with the candidate indices to retain.
    fn select_after_prefill(&mut self, _head: HeadId, positions: &[u32], _scores: &[f32], keep: &mut Vec<usize>) {
        keep.clear();
        keep.extend(0..positions.len());
    }

    /// True when a decode step changes no policy state besides its scratch
    /// (no random draws, no trace), so an undo journal can return the cache
    /// to the state after any one token of a verification pass by restoring
    /// slots alone ([`crate::SequenceCache::rollback_to`]); layer decisions
    /// are tracked by the cache. False (the safe default) makes speculative
    /// decoding roll back to the pass's start and replay the accepted tokens.
    fn rolls_back_per_token(&self) -> bool {
        false
    }

    /// Starts recording eviction events for steps divisible by `every`
    /// (policies that never evict ignore it).
    fn enable_trace(&mut self, _every: u32) {}

    /// Eviction events recorded so far (diagnostics; empty unless enabled).
    fn take_events(&mut self) -> Vec<EvictionEvent> {
        Vec::new()
    }

    /// Appends the state that steps changed and a policy built afresh from
    /// its spec would not have (per-head budgets an allocator decided,
    /// random streams), for a saved context. Stateless policies write
    /// nothing; `Err` says why this policy cannot be saved.
    fn save_state(&self, _out: &mut Vec<u64>) -> Result<(), String> {
        Ok(())
    }

    /// Restores what [`CachePolicy::save_state`] wrote, taking its words
    /// from the front of `words`; `Err` when they do not fit.
    fn load_state(&mut self, _words: &mut &[u64]) -> Result<(), String> {
        Ok(())
    }
}

/// The next saved policy-state word (see [`CachePolicy::load_state`]).
pub(crate) fn take_word(words: &mut &[u64]) -> Result<u64, String> {
    let (&w, rest) = words.split_first().ok_or("the saved policy state ends early")?;
    *words = rest;
    Ok(w)
}

/// The `full` policy: keep everything.
#[derive(Clone, Copy)]
pub struct FullCache;

impl CachePolicy for FullCache {
    fn name(&self) -> &str {
        "full"
    }
    fn clone_box(&self) -> Box<dyn CachePolicy> {
        Box::new(*self)
    }
    fn capacity(&self, max_len: usize) -> usize {
        max_len
    }
    fn rolls_back_per_token(&self) -> bool {
        true
    }
}
