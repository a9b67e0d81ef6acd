//! A small LRU of prefilled prompts: a request with the same policy and
//! prompt (or, where extending is exact, a prompt starting with a cached
//! one) forks a stored cache instead of prefilling.

use kvslim_cache::policy::TokenPolicySpec;
use kvslim_cache::{KvDtype, PolicySpec, SequenceCache};
use std::collections::VecDeque;

/// A prefilled prompt kept for reuse: a clone of the request's cache right
/// after its prefill (paged K/V shared with it, copied on first write;
/// positions, scores and policy state are the clone's own) and the logits
/// of the prompt's last position.
struct PrefixEntry {
    spec: String,
    prompt: Vec<u32>,
    cache: SequenceCache,
    logits: Vec<f32>,
}

/// A small LRU of prefilled prompts (most recently used last). Only paged
/// caches are kept (a clone of fixed slots would copy them).
pub(super) struct PrefixCache {
    capacity: usize,
    entries: VecDeque<PrefixEntry>,
}

/// What a lookup found: a fork of the stored cache, the tokens it covers
/// and, when it covers the whole prompt, the logits to sample from.
pub(super) struct PrefixHit {
    pub cache: SequenceCache,
    pub reused: usize,
    pub logits: Option<Vec<f32>>,
}

/// Whether a cache of this policy can be cut back to a prefix and fed the
/// rest, giving what one prefill of the whole prompt gives (up to the
/// rounding of a different chunking): no eviction (`full`), no
/// head sharing (its clustering depends on the prefill), no compaction, no
/// quantized storage (a prefill attends to its own chunk's exact keys).
fn extendable(policy: &PolicySpec) -> bool {
    matches!(policy.token, TokenPolicySpec::Full)
        && policy.head.is_none()
        && policy.storage.compact_every.is_none()
        && policy.storage.page_score.is_none()
        && policy.storage.kv_dtype == KvDtype::F32
}

impl PrefixCache {
    /// An empty cache of `capacity` entries (`0`: off).
    pub fn new(capacity: usize) -> Self {
        PrefixCache { capacity, entries: VecDeque::new() }
    }

    /// Whether prompts are kept at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The most useful entry for `prompt` under `spec`: the same prompt (any
    /// policy), or — when the policy is [`extendable`] — the entry sharing
    /// the longest common prefix with it (at least a page), forked and cut
    /// back to that prefix (at least one prompt token is left to feed, for
    /// its logits).
    /// `capacity` is the slots the request needs; a stored cache built for
    /// fewer does not qualify.
    pub fn lookup(&mut self, spec: &str, policy: &PolicySpec, prompt: &[u32], capacity: usize) -> Option<PrefixHit> {
        let ext = extendable(policy);
        let min_shared = policy.storage.page_size.unwrap_or(1);
        let common = |e: &PrefixEntry| e.prompt.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let (best, reuse) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.spec == spec && e.cache.store().max_capacity() >= capacity)
            .filter_map(|(i, e)| match common(e) {
                n if n == prompt.len() && n == e.prompt.len() => Some((i, n)),
                // less than a page would share nothing but a page copied at once
                n if ext => Some((i, n.min(prompt.len() - 1))).filter(|&(_, r)| r >= min_shared),
                _ => None,
            })
            .max_by_key(|&(_, r)| r)?;
        let e = self.entries.remove(best).expect("index from the scan");
        // always a clone: a live request never shares a SequenceCache
        let mut cache = e.cache.clone();
        let whole = reuse == e.prompt.len() && reuse == prompt.len();
        if reuse < e.prompt.len() && cache.truncate(reuse).is_err() {
            self.entries.push_back(e);
            return None;
        }
        let hit = PrefixHit { cache, reused: reuse, logits: whole.then(|| e.logits.clone()) };
        self.entries.push_back(e);
        Some(hit)
    }

    /// Keeps a clone of a freshly prefilled `cache` for `prompt` under
    /// `spec`, replacing an entry for the same pair and dropping the least
    /// recently used one when full.
    pub fn insert(&mut self, spec: String, prompt: &[u32], cache: &SequenceCache, logits: &[f32]) {
        if self.capacity == 0 {
            return;
        }
        self.entries.retain(|e| !(e.spec == spec && e.prompt == prompt));
        while self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(PrefixEntry {
            spec,
            prompt: prompt.to_vec(),
            cache: cache.clone(),
            logits: logits.to_vec(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslim_cache::{CacheShape, PagePool};

    const PAGE: usize = 4;

    fn shape() -> CacheShape {
        CacheShape::plain(1, 1, 1, 4)
    }

    /// A paged cache of `policy` holding `tokens` positions 0.. in order, as
    /// a prefill of that many tokens leaves it.
    fn prefilled(policy: &PolicySpec, pool: &PagePool, tokens: usize, room: usize) -> SequenceCache {
        let mut c = SequenceCache::in_pool(policy, shape(), room, tokens, Some(pool)).unwrap();
        c.fill_for_timing(tokens, |k, v| {
            k.fill(1.0);
            v.fill(2.0);
        });
        c
    }

    fn setup(spec: &str) -> (PolicySpec, PagePool) {
        let policy = PolicySpec::parse(spec).unwrap();
        let pool = PagePool::new(PAGE, policy.storage.kv_dtype, 4);
        (policy, pool)
    }

    #[test]
    fn the_same_prompt_hits_whole_with_its_logits() {
        let (policy, pool) = setup("full:page=4");
        let mut lru = PrefixCache::new(2);
        let prompt: Vec<u32> = (0..10).collect();
        lru.insert("a".into(), &prompt, &prefilled(&policy, &pool, 10, 32), &[0.5, 1.5]);
        let hit = lru.lookup("a", &policy, &prompt, 32).expect("a hit");
        assert_eq!((hit.reused, hit.logits), (10, Some(vec![0.5, 1.5])));
        assert_eq!(hit.cache.next_pos(), 10);
        assert!(lru.lookup("b", &policy, &prompt, 32).is_none(), "another policy never matches");
        assert!(lru.lookup("a", &policy, &prompt, 33).is_none(), "a cache built for fewer slots does not qualify");
    }

    #[test]
    fn an_extendable_policy_forks_the_longest_common_prefix() {
        let (policy, pool) = setup("full:page=4");
        let mut lru = PrefixCache::new(4);
        let short: Vec<u32> = (0..6).collect();
        let long: Vec<u32> = (0..9).chain([50, 51]).collect();
        lru.insert("a".into(), &short, &prefilled(&policy, &pool, 6, 32), &[0.0]);
        lru.insert("a".into(), &long, &prefilled(&policy, &pool, 11, 32), &[0.0]);
        let prompt: Vec<u32> = (0..12).collect();
        let hit = lru.lookup("a", &policy, &prompt, 32).expect("a hit");
        assert_eq!(hit.reused, 9, "the longer shared prefix wins");
        assert_eq!(hit.cache.next_pos(), 9, "the fork is cut back to it");
        assert!(hit.logits.is_none(), "the rest of the prompt still has to be fed");
        // a prompt the cache covers whole keeps one token to feed
        let hit = lru.lookup("a", &policy, &long[..8], 32).expect("a hit");
        assert_eq!((hit.reused, hit.cache.next_pos()), (7, 7));
        // less than a page in common shares nothing
        assert!(lru.lookup("a", &policy, &[0, 1, 2, 99, 98], 32).is_none());
    }

    #[test]
    fn a_half_precision_policy_reuses_only_the_same_prompt() {
        let (policy, pool) = setup("full:page=4,kv_dtype=f16");
        let mut lru = PrefixCache::new(2);
        let prompt: Vec<u32> = (0..10).collect();
        lru.insert("q".into(), &prompt, &prefilled(&policy, &pool, 10, 32), &[0.0]);
        assert!(lru.lookup("q", &policy, &[prompt.as_slice(), &[7]].concat(), 32).is_none());
        assert_eq!(lru.lookup("q", &policy, &prompt, 32).map(|h| h.reused), Some(10));
    }

    #[test]
    fn the_least_recently_used_entry_leaves_first_and_frees_its_pages() {
        let (policy, pool) = setup("full:page=4");
        let mut lru = PrefixCache::new(2);
        let prompts: Vec<Vec<u32>> = (0..3u32).map(|p| (0..8).map(|t| p * 100 + t).collect()).collect();
        lru.insert("a".into(), &prompts[0], &prefilled(&policy, &pool, 8, 16), &[0.0]);
        // the request's own cache is gone: the entry alone holds its pages
        let one = pool.stats().pages_in_use;
        assert!(one > 0);
        lru.insert("a".into(), &prompts[1], &prefilled(&policy, &pool, 8, 16), &[0.0]);
        assert_eq!(pool.stats().pages_in_use, 2 * one);
        // a hit makes prompt 0 the most recently used; prompt 1 goes next
        drop(lru.lookup("a", &policy, &prompts[0], 8).expect("a hit"));
        lru.insert("a".into(), &prompts[2], &prefilled(&policy, &pool, 8, 16), &[0.0]);
        assert!(lru.lookup("a", &policy, &prompts[1], 8).is_none(), "evicted");
        assert!(lru.lookup("a", &policy, &prompts[0], 8).is_some());
        assert_eq!(pool.stats().pages_in_use, 2 * one, "the evicted entry's pages went back");
        // the same prompt again replaces its entry instead of adding one
        lru.insert("a".into(), &prompts[2], &prefilled(&policy, &pool, 8, 16), &[1.0]);
        assert_eq!(pool.stats().pages_in_use, 2 * one);
        assert_eq!(lru.lookup("a", &policy, &prompts[2], 8).and_then(|h| h.logits), Some(vec![1.0]));
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let (policy, pool) = setup("full:page=4");
        let mut lru = PrefixCache::new(0);
        assert!(!lru.enabled());
        let prompt: Vec<u32> = (0..8).collect();
        lru.insert("a".into(), &prompt, &prefilled(&policy, &pool, 8, 16), &[0.0]);
        assert!(lru.lookup("a", &policy, &prompt, 8).is_none());
        assert_eq!(pool.stats().pages_in_use, 0);
    }
}
