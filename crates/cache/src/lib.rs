//! KV cache for one sequence: storage ([`store`]) and the policy that
//! decides which slot to evict ([`policy`]). Storage owns slots; a policy
//! only reads attention probabilities and picks victims through
//! [`store::HeadSlots`]' small API. The attention math lives in
//! `kvslim-kernels`.

pub mod policy;
pub mod store;

pub use policy::{CachePolicy, PolicySpec, PolicySpecError, ScoreAgg};
pub use store::{HeadSlots, KvBytes, KvStore};

/// A sequence's KV store together with its policy state: the one object the
/// forward pass writes keys into and reports attention to.
pub struct SequenceCache {
    pub store: KvStore,
    pub policy: Box<dyn CachePolicy>,
    /// Original position of the next token (tokens seen so far; unlike the
    /// slot count, it keeps growing when tokens are evicted).
    pub next_pos: usize,
}

impl SequenceCache {
    /// Builds the cache for a sequence of at most `max_len` tokens.
    /// Budgets given as percentages resolve against `base_len` (the prompt
    /// for generation, the whole sequence for perplexity).
    pub fn new(
        spec: &PolicySpec,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        base_len: usize,
    ) -> Self {
        let policy = spec.build(base_len);
        let store = KvStore::new(layers, kv_heads, head_dim, policy.capacity(max_len));
        SequenceCache { store, policy, next_pos: 0 }
    }

    /// Tokens currently held in layer 0's first head (all heads hold the same
    /// count under every policy).
    pub fn len(&self) -> usize {
        self.store.head(0, 0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the sequence but keeps the allocation.
    pub fn reset(&mut self, spec: &PolicySpec, base_len: usize) {
        self.store.clear();
        self.policy = spec.build(base_len);
        self.next_pos = 0;
    }
}
