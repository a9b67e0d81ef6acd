//! [`SequenceCache`]: one sequence's KV store together with its policy
//! and CHAI state, and the per-step operations that keep them consistent.
//! The model computes attention over the read views it gets here and
//! reports back; only this type changes slots, scores and positions.
//!
//! A decode step of layer `l`: [`SequenceCache::append`] the token's K/V
//! (one row per KV head), attend over [`SequenceCache::layer`] with the
//! head structure of [`SequenceCache::layer_heads`], then
//! [`SequenceCache::after_decode_attention`] with the probabilities (the
//! policy scores and evicts; KV heads tied by CHAI replay the evictions).
//! A prefill chunk: [`SequenceCache::gather_candidates`] per component,
//! attend over the [`PrefillCandidates`] adding column sums to their
//! scores, then [`SequenceCache::commit_candidates`]. After the layers,
//! [`SequenceCache::advance`].

mod persist;
mod step;

pub use step::{repeat_attention_into, AttentionScores, PrefillCandidates, ScoringKey};

use crate::error::CacheError;
use crate::policy::auto::AutoUse;
use crate::policy::chai::{HeadSharing, LayerHeads};
use crate::policy::{self, CachePolicy, EvictionEvent, PolicySpec, ScoreAgg, SharedKeptSets};
use crate::store::{HeadSlots, KvStore, PagePool};

/// The model dimensions a cache is laid out for.
#[derive(Clone, Debug)]
pub struct CacheShape {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding-window layers: the window and, per layer, whether it is
    /// local ([`policy::SlidingWindowLayers`]).
    pub sliding_window: Option<(usize, Vec<bool>)>,
    /// The model's key ([`policy::auto::model_key`]), which `auto:budget=B`
    /// looks its measured choices up by (`None`: the default rows).
    pub model: Option<String>,
    /// Whether the model's own KVzap predictor is found and fits it: the
    /// model's `auto` rows that score with one count only then.
    pub kvzap: bool,
}

impl CacheShape {
    /// A shape with no sliding-window layers, no model key (`auto`'s
    /// default rows) and no KVzap predictor.
    pub fn plain(layers: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        CacheShape { layers, heads, kv_heads, head_dim, sliding_window: None, model: None, kvzap: false }
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// How a one-chunk prefill computes its attention output: the tiled kernel
/// (column sums, SnapKV's window, TOVA's last query and no scores at all),
/// or query by query with the decode kernel (a score rule that depends on
/// the order of every query,
/// [`crate::policy::ScoreRule::needs_every_query`]). The two round
/// differently, so only caches of the same kernel can share a prefill's
/// hidden states ([`SequenceCache::shared_prefill_kernel`]); the model
/// may also let tiled caches join a KVzip run, whose prompt rows are the
/// tiled kernel's, where its products do not depend on the rows beside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    Tiled,
    EveryQuery,
    /// The tiled kernel over the prompt followed by its KVzip repeat probe
    /// in pieces of `chunk` ([`SequenceCache::repeat_probe`]): the chunk
    /// has more rows.
    Repeat {
        chunk: usize,
    },
}

/// A sequence's KV store together with its policy state: the one object the
/// forward pass writes keys into and reports attention to.
pub struct SequenceCache {
    store: KvStore,
    policy: Box<dyn CachePolicy>,
    /// CHAI head sharing, when the spec composes it.
    sharing: Option<HeadSharing>,
    /// Head structure of a layer without head sharing (or before clustering).
    dense: LayerHeads,
    /// Original position of the next token (tokens seen so far; unlike the
    /// slot count, it keeps growing when tokens are evicted).
    next_pos: usize,
    /// Repack pages every this many decode steps (paged stores).
    compact_every: Option<usize>,
    steps_since_compact: usize,
    /// The probability rows of one component's representatives, handed to
    /// the policy (reused: decode steps do not allocate).
    component_probs: Vec<f32>,
    /// Prefill candidates of a layer's heads held back until every head's
    /// are in, for a policy that splits the layer among its heads
    /// ([`CachePolicy::layer_decision_pending`]); empty otherwise.
    pending: Vec<PrefillCandidates>,
    /// The policy state and counters at a checkpoint (the heads keep their
    /// own undo journals); `None` outside one.
    checkpoint: Option<Checkpoint>,
}

/// What [`SequenceCache::rollback`] restores besides the heads.
struct Checkpoint {
    policy: Box<dyn CachePolicy>,
    next_pos: usize,
    steps_since_compact: usize,
    /// The policy split a layer among its heads since (a decision that
    /// returning to a single token would have to undo).
    decided_layer: bool,
}

impl Clone for SequenceCache {
    /// A full copy: KV slots, positions, scores, policy state (RNG streams
    /// included) and CHAI state travel together, so the clone continues
    /// exactly as the original would. Paged K/V are shared, not copied:
    /// the first write into a shared page copies that page.
    fn clone(&self) -> Self {
        SequenceCache {
            store: self.store.clone(),
            policy: self.policy.clone_box(),
            sharing: self.sharing.clone(),
            dense: self.dense.clone(),
            next_pos: self.next_pos,
            compact_every: self.compact_every,
            steps_since_compact: self.steps_since_compact,
            component_probs: Vec::new(),
            pending: Vec::new(),
            checkpoint: None,
        }
    }
}

/// The policy a sequence of `shape` runs under `spec`: the spec's token
/// policy, wrapped for sliding-window layers when the model has them.
pub fn effective_policy(
    spec: &PolicySpec,
    shape: &CacheShape,
    base_len: usize,
) -> Result<Box<dyn CachePolicy>, CacheError> {
    if let Some(t) = &spec.tuned {
        return Err(CacheError::NotLoaded(format!(
            "tuned policy file {} was not loaded (call PolicySpec::load_plans after parsing)",
            t.path
        )));
    }
    if let Some(b) = spec.auto {
        // a context resolves its own rows first
        let (resolved, _) = policy::auto::resolve(b, shape.model.as_deref(), base_len, AutoUse::Reply, shape.kvzap);
        return effective_policy(&resolved, shape, base_len);
    }
    let policy = spec.build_for(base_len, shape.layers, shape.kv_heads);
    let Some((window, local)) = &shape.sliding_window else { return Ok(policy) };
    if local.len() != shape.layers || *window == 0 {
        return Err(CacheError::SlidingPattern { window: *window, pattern: local.len(), layers: shape.layers });
    }
    Ok(if local.iter().any(|&l| l) {
        Box::new(policy::SlidingWindowLayers::new(policy, *window, local.clone()))
    } else {
        policy
    })
}

impl SequenceCache {
    /// Builds the cache for a sequence of at most `max_len` tokens.
    /// Budgets given as percentages resolve against `base_len` (the prompt
    /// for generation, the whole sequence for perplexity). Fails when a
    /// CHAI plan does not fit the model.
    pub fn new(spec: &PolicySpec, shape: CacheShape, max_len: usize, base_len: usize) -> Result<Self, CacheError> {
        Self::in_pool(spec, shape, max_len, base_len, None)
    }

    /// As [`SequenceCache::new`], drawing pages from a shared `pool` (a
    /// server's, so prefix sharing and accounting span requests). The pool
    /// must match the spec's page size and KV dtype.
    pub fn in_pool(
        spec: &PolicySpec,
        shape: CacheShape,
        max_len: usize,
        base_len: usize,
        pool: Option<&PagePool>,
    ) -> Result<Self, CacheError> {
        let layout = spec.storage.layout();
        let pool = match (layout.page_size, pool) {
            (Some(p), Some(pool)) if !pool.fits(p, layout.kv_dtype, shape.head_dim) => {
                return Err(CacheError::PoolMismatch {
                    pool_page: pool.page_size(),
                    pool_dtype: pool.dtype().to_string(),
                    pool_head_dim: pool.head_dim(),
                    spec: spec.to_string(),
                    head_dim: shape.head_dim,
                })
            }
            (Some(_), pool) => pool,
            (None, _) => None,
        };
        let policy = effective_policy(spec, &shape, base_len)?;
        let capacities: Vec<usize> = (0..shape.layers).map(|l| policy.layer_capacity(l, max_len)).collect();
        let mut store = KvStore::with_layer_capacities(&capacities, shape.kv_heads, shape.head_dim, layout, pool);
        let sharing = match &spec.head {
            None => None,
            Some(h) => {
                let mut sharing = HeadSharing::new(h.clone(), shape.layers, shape.heads, shape.kv_heads)
                    .map_err(CacheError::HeadSharing)?;
                if h.fixed {
                    sharing.finish(&mut store);
                }
                Some(sharing)
            }
        };
        Ok(SequenceCache {
            store,
            policy,
            sharing,
            dense: LayerHeads::dense(shape.heads, shape.kv_heads),
            next_pos: 0,
            compact_every: spec.storage.compact_every,
            steps_since_compact: 0,
            component_probs: Vec::new(),
            pending: Vec::new(),
            checkpoint: None,
        })
    }

    // ---- read views ----

    /// Original position of the next token: how many tokens the sequence
    /// has seen (evicted ones included).
    pub fn next_pos(&self) -> usize {
        self.next_pos
    }

    /// The slots, read-only (attention kernels, reports, tests).
    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// One layer's slots per KV head: what attention reads.
    pub fn layer(&self, layer: usize) -> &[HeadSlots] {
        self.store.layer(layer)
    }

    /// The policy, read-only (its name, whether it is bounded, …).
    pub fn policy(&self) -> &dyn CachePolicy {
        self.policy.as_ref()
    }

    /// CHAI state, when the spec composes head sharing.
    pub fn head_sharing(&self) -> Option<&HeadSharing> {
        self.sharing.as_ref()
    }

    /// Which query head uses whose scores in `layer`, and which KV heads
    /// stay aligned: CHAI's clusters once formed, else every head its own.
    pub fn layer_heads(&self, layer: usize) -> &LayerHeads {
        self.sharing.as_ref().and_then(|h| h.layer(layer)).unwrap_or(&self.dense)
    }

    /// Slots of the largest layer (scratch sizing).
    pub fn max_capacity(&self) -> usize {
        self.store.max_capacity()
    }

    /// The policy keeps a fixed number of slots whatever the length (a
    /// RoPE model may then run past its trained context).
    pub fn bounded(&self) -> bool {
        self.policy.bounded()
    }

    /// How attention is folded into scores, when the policy wants it.
    pub fn score_aggregation(&self) -> Option<ScoreAgg> {
        self.policy.score_aggregation()
    }

    /// How attention updates the scores ([`policy::ScoreRule`]): prefill
    /// applies a rule that is not a column sum query by query.
    pub fn score_rule(&self) -> policy::ScoreRule {
        self.policy.score_rule()
    }

    /// Streaming prefill: feed the prompt in chunks of this many tokens.
    pub fn prefill_chunk(&self) -> Option<usize> {
        self.policy.prefill_chunk()
    }

    /// Whether a prompt may be prefilled in chunks of any size at only a
    /// rounding's cost: the policy keeps every token, scores nothing and
    /// probes nothing, so more chunks change no choice (a server then runs
    /// the chunks in the same passes as other sequences' decode steps).
    pub fn prefill_chunkable(&self) -> bool {
        !self.bounded()
            && self.sharing.is_none()
            && self.policy.score_aggregation().is_none()
            && self.policy.observation().is_none()
            && self.policy.prefill_chunk().is_none()
    }

    /// Whether this cache can share a prompt's prefill with others (the
    /// kvpress protocol: one prefill, then each policy compresses its own
    /// copy), and with which kernel. A prompt fed to an empty cache as one
    /// chunk attends over the whole prompt before the policy chooses what
    /// stays, so its hidden states, K and V do not depend on the policy;
    /// only the scores and the choice do. `None` where that does not hold:
    /// the cache already holds tokens, the policy streams the prompt in
    /// chunks, or CHAI head sharing (its probe and clusters change the
    /// kernel per head).
    pub fn shared_prefill_kernel(&self) -> Option<PrefillKernel> {
        if self.next_pos != 0 || self.sharing.is_some() || self.policy.prefill_chunk().is_some() {
            return None;
        }
        if let Some(chunk) = self.repeat_probe() {
            return Some(PrefillKernel::Repeat { chunk });
        }
        let every_query = self.policy.score_aggregation().is_some() && self.policy.score_rule().needs_every_query();
        Some(if every_query { PrefillKernel::EveryQuery } else { PrefillKernel::Tiled })
    }

    /// KVzip-style prefill (`prefill=kvzip[:C]`): a prefill chunk of two or
    /// more tokens is followed by a repeat probe, the chunk's tokens fed
    /// again after it in pieces of C (the value returned), whose queries
    /// score the chunk and whose keys and values never enter the cache.
    /// The model appends the probe's rows, tells
    /// [`SequenceCache::gather_candidates`] how many there are and adds
    /// each piece's scores itself.
    pub fn repeat_probe(&self) -> Option<usize> {
        match self.policy.observation() {
            Some(policy::Observation::Repeat { chunk }) if self.policy.score_aggregation().is_some() => Some(chunk),
            _ => None,
        }
    }

    /// Online CHAI wants every head's attention this token: it is still
    /// collecting its probe, or a drift check step is due (`drift=`). The
    /// model then runs token by token and records every head's row.
    pub fn collecting_probe(&self) -> bool {
        self.sharing.as_ref().is_some_and(|h| h.recording())
    }

    /// Tokens still to feed before the probe is complete (0 when not
    /// probing): a prefill chunk must end there so clustering happens
    /// between two tokens.
    pub fn probe_remaining(&self) -> usize {
        match &self.sharing {
            Some(h) if h.collecting_probe() => h.probe_len().saturating_sub(self.next_pos),
            _ => 0,
        }
    }

    /// Tokens currently held in layer 0's first head (every head holds the
    /// same count under uniform token eviction; page eviction removes a
    /// page's live tokens, and `alloc=` gives layers and heads different
    /// budgets, so counts may differ per head).
    pub fn len(&self) -> usize {
        self.store.head(0, 0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // ---- between steps ----

    /// Records that `n` tokens were appended (a decode step or a prefill
    /// chunk): compacts the pages when the interval has passed, and
    /// clusters CHAI heads once the probe's last token is in.
    pub fn advance(&mut self, n: usize) {
        self.next_pos += n;
        if self.policy.global_decision_pending() {
            self.decide_globally();
        }
        if let Some(every) = self.compact_every {
            self.steps_since_compact += n;
            if self.steps_since_compact >= every {
                self.store.compact();
                self.steps_since_compact = 0;
            }
        }
        if let Some(h) = self.sharing.as_mut() {
            if h.collecting_probe() && self.next_pos >= h.probe_len() {
                h.finish(&mut self.store);
            } else {
                h.after_tokens(n);
            }
        }
    }

    /// Whether, after `n` more tokens are fed, [`SequenceCache::truncate`]
    /// can cut this cache back to any length from now on and leave exactly
    /// the state those tokens alone would have made: no head sharing, no
    /// accumulated scores (the cut tokens' attention would stay added to the
    /// kept slots' scores and change later evictions), every head still
    /// holds every token fed (nothing was evicted), and `n` more tokens
    /// leave a slot free in every head (a token policy evicts only once its
    /// heads are full). Speculative decoding then rolls rejected drafts back
    /// by cutting instead of journal and replay.
    pub fn rewindable_after(&self, n: usize) -> bool {
        self.sharing.is_none()
            && self.policy.score_aggregation().is_none()
            && (0..self.store.layers()).all(|l| {
                self.store.layer(l).iter().enumerate().all(|(kv, h)| {
                    let holds = self.policy.head_budget(l, kv).map_or(h.capacity(), |b| (b + 1).min(h.capacity()));
                    h.len() == self.next_pos && self.next_pos + n < holds
                })
            })
    }

    /// Starts an undo journal, so that [`SequenceCache::rollback`] can
    /// return to this moment bit for bit (slots, K/V rows, positions,
    /// scores, policy state): speculative decoding verifies drafts after a
    /// checkpoint instead of copying the cache. Every head saves a row only
    /// when it is about to be overwritten (an eviction moves one row per
    /// step), plus its positions and scores, and the policy's state is
    /// cloned (small). Returns false, and starts nothing, where a journal
    /// does not apply: paged stores (whose clone already shares its pages),
    /// CHAI head sharing, a pending prefill.
    pub fn checkpoint(&mut self) -> bool {
        if self.sharing.is_some() || !self.pending.is_empty() || self.store.head(0, 0).page_size().is_some() {
            return false;
        }
        for l in 0..self.store.layers() {
            for h in self.store.layer_mut(l) {
                h.checkpoint();
            }
        }
        self.checkpoint = Some(Checkpoint {
            policy: self.policy.clone_box(),
            next_pos: self.next_pos,
            steps_since_compact: self.steps_since_compact,
            decided_layer: false,
        });
        true
    }

    /// Keeps every change since [`SequenceCache::checkpoint`].
    pub fn commit(&mut self) {
        if self.checkpoint.take().is_some() {
            (0..self.store.layers()).for_each(|l| self.store.layer_mut(l).iter_mut().for_each(HeadSlots::commit));
        }
    }

    /// Returns to the state at [`SequenceCache::checkpoint`], as if the
    /// tokens fed since had never been. Panics without a checkpoint.
    pub fn rollback(&mut self) {
        let cp = self.checkpoint.take().expect("rollback without a checkpoint");
        (0..self.store.layers()).for_each(|l| self.store.layer_mut(l).iter_mut().for_each(HeadSlots::rollback));
        self.policy = cp.policy;
        self.next_pos = cp.next_pos;
        self.steps_since_compact = cp.steps_since_compact;
    }

    /// Returns to the state just after the first `tokens` tokens fed since
    /// [`SequenceCache::checkpoint`], bit for bit as if only they had been
    /// fed, and ends the journal: what speculative decoding needs after a
    /// pass whose later drafts were rejected, without replaying the accepted
    /// ones. Every head returns to its mark before push number `tokens`
    /// (the state after the previous token's eviction). Possible when the
    /// policy's state does not move with decode steps
    /// ([`CachePolicy::rolls_back_per_token`]) and no layer was split among
    /// its heads since; otherwise returns false and changes nothing (the
    /// journal stays open for [`SequenceCache::rollback`]).
    pub fn rollback_to(&mut self, tokens: usize) -> bool {
        let Some(cp) = self.checkpoint.as_ref() else { return false };
        let fed = self.next_pos - cp.next_pos;
        let heads_ok =
            (0..self.store.layers()).all(|l| self.store.layer(l).iter().all(|h| h.pushes_since_checkpoint() == fed));
        if tokens > fed || cp.decided_layer || !self.policy.rolls_back_per_token() || !heads_ok {
            return false;
        }
        if tokens == fed {
            self.commit();
            return true;
        }
        let cp = self.checkpoint.take().expect("checked above");
        (0..self.store.layers()).for_each(|l| self.store.layer_mut(l).iter_mut().for_each(|h| h.rollback_to(tokens)));
        self.policy = cp.policy;
        self.next_pos = cp.next_pos + tokens;
        self.steps_since_compact = cp.steps_since_compact;
        true
    }

    /// Cuts the sequence back to its first `len` tokens, as if only they had
    /// been fed: possible only while no token was evicted or reordered
    /// (every head holds positions `0..` in order, as under `full`) and no
    /// head sharing was set up from later tokens. Paged K/V beyond `len`
    /// are released; pages shared with a clone stay shared. Used to fork a
    /// cached prompt at the prefix two prompts have in common.
    pub fn truncate(&mut self, len: usize) -> Result<(), CacheError> {
        if self.sharing.is_some() {
            return Err(CacheError::Truncate("a cache with head sharing cannot be cut back".into()));
        }
        if len > self.next_pos {
            return Err(CacheError::Truncate(format!("a cache of {} tokens cannot grow to {len}", self.next_pos)));
        }
        for l in 0..self.store.layers() {
            for h in 0..self.store.kv_heads() {
                let p = self.store.head(l, h).positions();
                if p.len() != self.next_pos || p.iter().enumerate().any(|(i, &q)| q as usize != i) {
                    return Err(CacheError::Truncate(format!(
                        "layer {l} KV head {h} no longer holds positions 0..{} in order",
                        self.next_pos
                    )));
                }
            }
        }
        let keep: Vec<usize> = (0..len).collect();
        for l in 0..self.store.layers() {
            self.store.layer_mut(l).iter_mut().for_each(|h| h.retain_slots(&keep));
        }
        self.next_pos = len;
        Ok(())
    }

    /// Gives every head room for `max_len` tokens in all, as a cache made
    /// for that length would have (a no-op for bounded policies, whose
    /// capacity does not depend on it): a fork of a compressed context
    /// grows to hold its question and answer.
    pub fn reserve(&mut self, max_len: usize) {
        for l in 0..self.store.layers() {
            let cap = self.policy.layer_capacity(l, max_len);
            for (kv, h) in self.store.layer_mut(l).iter_mut().enumerate() {
                // a head with a share of its own (an allocator's) needs no more
                h.reserve(self.policy.head_budget(l, kv).map_or(cap, |b| cap.min(b + 1)));
            }
        }
    }

    /// Replaces the policy by one that keeps exactly the positions another
    /// run keeps (`kept`, updated by that run after each step; `reference`
    /// is its policy, whose capacity and prefill chunking this one copies).
    /// Used to measure a quantized cache's error alone.
    pub fn follow_decisions(&mut self, kept: SharedKeptSets, reference: &dyn CachePolicy, max_len: usize) {
        self.policy = Box::new(policy::FollowDecisions::mirroring(kept, reference, max_len));
    }

    /// Starts recording the policy's eviction events for steps divisible by `every`.
    pub fn enable_policy_trace(&mut self, every: u32) {
        self.policy.enable_trace(every);
    }

    /// The eviction events recorded so far.
    pub fn take_policy_events(&mut self) -> Vec<EvictionEvent> {
        self.policy.take_events()
    }

    /// Pretends `context` tokens were fed, for timing decode steps without
    /// an O(n²) prefill: every head gets the positions its policy would
    /// hold (the last `capacity − 1`, one slot left for the next token)
    /// with rows from `fill(key, value)`, called head by head in position
    /// order. Only valid on a fresh cache.
    pub fn fill_for_timing(&mut self, context: usize, mut fill: impl FnMut(&mut [f32], &mut [f32])) {
        let d = self.store.head(0, 0).head_dim();
        let (mut k, mut v) = (vec![0f32; d], vec![0f32; d]);
        for l in 0..self.store.layers() {
            for h in 0..self.store.kv_heads() {
                // an allocator's head may have rows beyond its budget
                let room = self.policy.head_budget(l, h).unwrap_or(usize::MAX);
                let head = self.store.head_mut(l, h);
                let held = context.min(head.capacity().saturating_sub(1)).min(room);
                for p in context - held..context {
                    fill(&mut k, &mut v);
                    head.push(p as u32, &k, &v).expect("within capacity");
                }
            }
        }
        self.next_pos = context;
    }
}

#[cfg(feature = "fault-injection")]
impl SequenceCache {
    /// The scores of (layer, KV head), writable: only for tests that corrupt
    /// a cache on purpose to prove their checks catch it.
    pub fn scores_mut_for_fault_injection(&mut self, layer: usize, kv_head: usize) -> &mut [f32] {
        self.store.head_mut(layer, kv_head).scores_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn cache_of(spec: &str, n: u32) -> SequenceCache {
        let shape = CacheShape::plain(2, 2, 1, 4);
        let mut c = SequenceCache::new(&PolicySpec::parse(spec).unwrap(), shape, 64, 64).unwrap();
        for p in 0..n {
            for l in 0..2 {
                c.append(l, p as usize, &[p as f32; 4], &[-(p as f32); 4]).unwrap();
            }
            c.advance(1);
        }
        c
    }

    #[test]
    fn truncate_cuts_a_fork_back_to_a_prefix() {
        let original = cache_of("full:page=4", 10);
        let mut fork = original.clone();
        fork.truncate(6).unwrap();
        assert_eq!(fork.next_pos(), 6);
        let h = fork.store().head(1, 0);
        assert_eq!(h.positions(), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(h.decoded_values(), (0..6).flat_map(|p| [-(p as f32); 4]).collect::<Vec<_>>());
        assert_eq!(h.page_counts().unwrap().pages, 2, "pages past the prefix are released");
        assert_eq!(original.store().head(1, 0).len(), 10, "the original keeps its tokens");
        assert!(fork.truncate(7).is_err(), "cannot grow");
        // after an eviction the slots are no longer the positions in order
        let mut evicted = cache_of("full", 5);
        evicted.store.head_mut(0, 0).evict(1);
        assert!(evicted.truncate(2).unwrap_err().to_string().contains("positions"));
    }
}
