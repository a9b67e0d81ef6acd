//! The server's page pools and what a request reserves from the KV memory
//! limit before it is admitted.

pub use kvslim_cache::accounting::worst_case_pages;
use kvslim_cache::policy::TokenPolicySpec;
use kvslim_cache::{KvDtype, PagePool, PolicySpec};
use kvslim_models::Model;
use std::sync::{Arc, Mutex};

/// The server's page pools, one per (page size, KV dtype), created on first
/// use; every paged request's cache draws from its pool, so clones (prefix
/// hits, beams) share pages and the counters span requests.
#[derive(Clone, Default)]
pub struct Pools {
    pools: Arc<Mutex<Vec<PagePool>>>,
}

impl Pools {
    /// The pool for this page size, dtype and head width (created if new).
    pub fn get(&self, page_size: usize, dtype: KvDtype, head_dim: usize) -> PagePool {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.iter().find(|p| p.fits(page_size, dtype, head_dim)) {
            return p.clone();
        }
        let p = PagePool::new(page_size, dtype, head_dim);
        pools.push(p.clone());
        p
    }

    /// Every pool created so far.
    pub fn all(&self) -> Vec<PagePool> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (pages in use, copy-on-write copies) summed over the pools.
    pub fn totals(&self) -> (usize, usize) {
        self.all().iter().map(|p| p.stats()).fold((0, 0), |(a, b), s| (a + s.pages_in_use, b + s.cow_copies))
    }
}

/// Gives `policy` the server's default page size when it names none and
/// paging costs it nothing: policies that keep every token (`full`, pure
/// CHAI), whose pages fill densely. Token eviction without compaction
/// stays on fixed slots by default, because its worst case in pages (holes
/// keeping pages alive) would reserve far more than its B + 1 slots; a
/// request that wants pages for it says `page=` (or `compact=` /
/// `page_score=`, which imply pages). `page_size` 0: never page by default.
pub fn apply_default_page(policy: &mut PolicySpec, page_size: usize) {
    if page_size > 0 && policy.storage.page_size.is_none() && matches!(policy.token, TokenPolicySpec::Full) {
        policy.storage.page_size = Some(page_size);
    }
}

/// KV bytes a sequence reserves: [`kvslim_cache::accounting::reservation`]
/// for `prompt_len + max_tokens` tokens (clipped to the context): fixed
/// slots exactly as allocated (rows in the spec's `kv_dtype`, positions and
/// scores; sliding-window layers no more than their window), paged stores
/// their worst-case pages ([`worst_case_pages`]).
/// Fails when the spec cannot be laid out for this model.
pub fn kv_bytes_for(
    model: &Model,
    policy: &PolicySpec,
    prompt_len: usize,
    max_tokens: usize,
) -> Result<usize, kvslim_cache::CacheError> {
    let max_len = (prompt_len + max_tokens).min(model.config.context_len);
    kvslim_cache::accounting::reservation(policy, &model.cache_shape(), max_len, prompt_len).map(|r| r.total())
}

/// K/V bytes of a `full` f32 cache holding `tokens` tokens (fixed slots,
/// sliding-window layers at most their window), 0 if it cannot be laid out.
pub fn full_kv_bytes(model: &Model, tokens: usize) -> usize {
    kvslim_cache::accounting::reservation(&PolicySpec::full(), &model.cache_shape(), tokens, tokens).map_or(0, |r| r.kv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::tiny_model;

    #[test]
    fn one_pool_per_page_size_dtype_and_head_width() {
        let pools = Pools::default();
        let a = pools.get(16, KvDtype::F32, 8);
        let b = pools.get(16, KvDtype::F32, 8);
        assert!(b.fits(16, KvDtype::F32, 8));
        assert_eq!(pools.all().len(), 1, "the same key gives the same pool");
        pools.get(8, KvDtype::F32, 8);
        pools.get(16, KvDtype::F32, 4);
        assert_eq!(pools.all().len(), 3);
        assert_eq!(pools.totals(), (0, 0));
        drop((a, b));
    }

    #[test]
    fn default_page_only_for_policies_keeping_every_token() {
        let mut full = PolicySpec::full();
        apply_default_page(&mut full, 16);
        assert_eq!(full.storage.page_size, Some(16));
        let mut off = PolicySpec::full();
        apply_default_page(&mut off, 0);
        assert_eq!(off.storage.page_size, None, "page size 0 never pages");
        let mut own = PolicySpec::parse("full:page=4").unwrap();
        apply_default_page(&mut own, 16);
        assert_eq!(own.storage.page_size, Some(4), "a page size the request names stays");
        let mut h2o = PolicySpec::parse("h2o:heavy=4,recent=4").unwrap();
        apply_default_page(&mut h2o, 16);
        assert_eq!(h2o.storage.page_size, None, "token eviction stays on fixed slots");
    }

    #[test]
    fn reservation_is_clipped_to_the_context() {
        let model = tiny_model();
        let ctx = model.config.context_len;
        let full = PolicySpec::full();
        let clipped = kv_bytes_for(&model, &full, 10, 10 * ctx).unwrap();
        assert_eq!(clipped, kv_bytes_for(&model, &full, 10, ctx - 10).unwrap());
        assert!(kv_bytes_for(&model, &full, 10, 5).unwrap() < clipped);
        // a fixed-slot `full` f32 reservation holds at least its K/V rows
        assert!(kv_bytes_for(&model, &full, 10, 5).unwrap() >= full_kv_bytes(&model, 15));
        assert!(full_kv_bytes(&model, 15) > full_kv_bytes(&model, 14));
    }
}
