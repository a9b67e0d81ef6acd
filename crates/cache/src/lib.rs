//! KV cache for one sequence: storage ([`store`]) and the policy that
//! decides which slot to evict ([`policy`]). Storage owns slots; a policy
//! only reads attention probabilities and picks victims through
//! [`store::HeadSlots`]' small API. The attention math lives in
//! `kvslim-kernels`.

pub mod policy;
pub mod rng;
pub mod store;

pub use policy::{CachePolicy, PolicySpec, PolicySpecError, ScoreAgg};
pub use store::{HeadSlots, KvBytes, KvStore};

/// The model dimensions a cache is laid out for.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// A sequence's KV store together with its policy state: the one object the
/// forward pass writes keys into and reports attention to.
pub struct SequenceCache {
    pub store: KvStore,
    pub policy: Box<dyn CachePolicy>,
    /// CHAI head sharing, when the spec composes it.
    pub heads: Option<policy::chai::HeadSharing>,
    /// Original position of the next token (tokens seen so far; unlike the
    /// slot count, it keeps growing when tokens are evicted).
    pub next_pos: usize,
}

impl Clone for SequenceCache {
    /// A full copy: KV slots, positions, scores, policy state (RNG streams
    /// included) and CHAI state travel together, so the clone continues
    /// exactly as the original would.
    fn clone(&self) -> Self {
        SequenceCache {
            store: self.store.clone(),
            policy: self.policy.clone_box(),
            heads: self.heads.clone(),
            next_pos: self.next_pos,
        }
    }
}

impl SequenceCache {
    /// Builds the cache for a sequence of at most `max_len` tokens.
    /// Budgets given as percentages resolve against `base_len` (the prompt
    /// for generation, the whole sequence for perplexity). Fails when a
    /// CHAI plan does not fit the model.
    pub fn new(spec: &PolicySpec, shape: CacheShape, max_len: usize, base_len: usize) -> Result<Self, String> {
        let policy = spec.build(base_len);
        let mut store = KvStore::new(shape.layers, shape.kv_heads, shape.head_dim, policy.capacity(max_len));
        let heads = match &spec.head {
            None => None,
            Some(h) => {
                let mut sharing = policy::chai::HeadSharing::new(h.clone(), shape.layers, shape.heads, shape.kv_heads)?;
                if h.fixed {
                    sharing.finish(&mut store);
                }
                Some(sharing)
            }
        };
        Ok(SequenceCache { store, policy, heads, next_pos: 0 })
    }

    /// Tokens currently held in layer 0's first head (all heads hold the same
    /// count under every policy).
    pub fn len(&self) -> usize {
        self.store.head(0, 0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
