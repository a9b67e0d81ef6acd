//! KV cache for one sequence: storage ([`store`]) and the policy that
//! decides which slot to evict ([`policy`]). Storage owns slots — in fixed
//! arrays or pages of a shared [`PagePool`], as f32, f16, int8 or 4-bit
//! rows — and shows every layout to policies and the attention kernel in
//! the same slot order; a policy only reads attention probabilities and
//! picks victims through [`store::HeadSlots`]' small API. The attention
//! math lives in `kvslim-kernels`.

pub mod accounting;
pub mod policy;
pub mod rng;
pub mod store;

pub use kvslim_kernels::kvquant::KvDtype;
pub use policy::{CachePolicy, PolicySpec, PolicySpecError, ScoreAgg};
pub use store::{HeadSlots, KvBytes, KvStore, PageCounts, PagePool, PoolStats, StoreLayout};

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
    /// Repack pages every this many decode steps (paged stores).
    compact_every: Option<usize>,
    steps_since_compact: usize,
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
            heads: self.heads.clone(),
            next_pos: self.next_pos,
            compact_every: self.compact_every,
            steps_since_compact: self.steps_since_compact,
        }
    }
}

/// The policy a sequence of `shape` runs under `spec`: the spec's token
/// policy, wrapped for sliding-window layers when the model has them.
pub fn effective_policy(
    spec: &PolicySpec,
    shape: &CacheShape,
    base_len: usize,
) -> Result<Box<dyn CachePolicy>, String> {
    let policy = spec.build(base_len);
    let Some((window, local)) = &shape.sliding_window else { return Ok(policy) };
    if local.len() != shape.layers || *window == 0 {
        return Err(format!(
            "sliding window {window} with a pattern of {} layers does not fit {} layers",
            local.len(),
            shape.layers
        ));
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
    pub fn new(spec: &PolicySpec, shape: CacheShape, max_len: usize, base_len: usize) -> Result<Self, String> {
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
    ) -> Result<Self, String> {
        let layout = spec.storage.layout();
        let pool = match (layout.page_size, pool) {
            (Some(p), Some(pool)) if !pool.fits(p, layout.kv_dtype, shape.head_dim) => {
                return Err(format!(
                    "page pool (page={}, kv_dtype={}, head_dim={}) does not fit `{spec}` with head_dim {}",
                    pool.page_size(),
                    pool.dtype(),
                    pool.head_dim(),
                    shape.head_dim
                ))
            }
            (Some(_), pool) => pool,
            (None, _) => None,
        };
        let policy = effective_policy(spec, &shape, base_len)?;
        let capacities: Vec<usize> = (0..shape.layers).map(|l| policy.layer_capacity(l, max_len)).collect();
        let mut store = KvStore::with_layer_capacities(&capacities, shape.kv_heads, shape.head_dim, layout, pool);
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
        Ok(SequenceCache {
            store,
            policy,
            heads,
            next_pos: 0,
            compact_every: spec.storage.compact_every,
            steps_since_compact: 0,
        })
    }

    /// Cuts the sequence back to its first `len` tokens, as if only they had
    /// been fed: possible only while no token was evicted or reordered
    /// (every head holds positions `0..` in order, as under `full`) and no
    /// head sharing was set up from later tokens. Paged K/V beyond `len`
    /// are released; pages shared with a clone stay shared. Used to fork a
    /// cached prompt at the prefix two prompts have in common.
    pub fn truncate(&mut self, len: usize) -> Result<(), String> {
        if self.heads.is_some() {
            return Err("a cache with head sharing cannot be cut back".into());
        }
        if len > self.next_pos {
            return Err(format!("cannot cut a cache of {} tokens back to {len}", self.next_pos));
        }
        for l in 0..self.store.layers() {
            for h in 0..self.store.kv_heads() {
                let p = self.store.head(l, h).positions();
                if p.len() != self.next_pos || p.iter().enumerate().any(|(i, &q)| q as usize != i) {
                    return Err(format!(
                        "layer {l} KV head {h} no longer holds positions 0..{} in order",
                        self.next_pos
                    ));
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

    /// Records that `n` tokens were appended (a decode step or a prefill
    /// chunk): compacts the pages when the interval has passed, and
    /// clusters CHAI heads once the probe's last token is in.
    pub fn advance(&mut self, n: usize) {
        self.next_pos += n;
        if let Some(every) = self.compact_every {
            self.steps_since_compact += n;
            if self.steps_since_compact >= every {
                self.store.compact();
                self.steps_since_compact = 0;
            }
        }
        if let Some(h) = self.heads.as_mut() {
            if h.collecting_probe() && self.next_pos >= h.probe_len() {
                h.finish(&mut self.store);
            }
        }
    }

    /// Tokens currently held in layer 0's first head (every head holds the
    /// same count under token eviction; page eviction removes a page's live
    /// tokens, which may differ per head).
    pub fn len(&self) -> usize {
        self.store.head(0, 0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_of(spec: &str, n: u32) -> SequenceCache {
        let shape = CacheShape { layers: 2, heads: 2, kv_heads: 1, head_dim: 4, sliding_window: None };
        let mut c = SequenceCache::new(&PolicySpec::parse(spec).unwrap(), shape, 64, 64).unwrap();
        for p in 0..n {
            for l in 0..2 {
                c.store.head_mut(l, 0).push(p, &[p as f32; 4], &[-(p as f32); 4]).unwrap();
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
        assert_eq!(fork.next_pos, 6);
        let h = fork.store.head(1, 0);
        assert_eq!(h.positions(), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(h.decoded_values(), (0..6).flat_map(|p| [-(p as f32); 4]).collect::<Vec<_>>());
        assert_eq!(h.page_counts().unwrap().pages, 2, "pages past the prefix are released");
        assert_eq!(original.store.head(1, 0).len(), 10, "the original keeps its tokens");
        assert!(fork.truncate(7).is_err(), "cannot grow");
        // after an eviction the slots are no longer the positions in order
        let mut evicted = cache_of("full", 5);
        evicted.store.head_mut(0, 0).evict(1);
        assert!(evicted.truncate(2).unwrap_err().contains("positions"));
    }
}
