//! What admission and prefill work with besides the request: the model,
//! the server's shared state, the prefix cache and the lent prefill
//! buffers.

use super::pools::Pools;
use super::prefix_cache::PrefixCache;
use super::request::Limits;
use crate::metrics::Metrics;
use kvslim_models::{Model, Scratch, Tokenizer};

/// What admission works with besides the request.
pub(super) struct Ctx<'a> {
    pub model: &'a Model,
    pub tok: &'a Tokenizer,
    pub m: &'a Metrics,
    pub pools: &'a Pools,
    pub limits: &'a Limits,
    pub prefix: PrefixCache,
    /// The buffers of one prefill, lent to each request's prefill in turn:
    /// a running request keeps only its cache (its decode steps use the
    /// batch's scratch), so memory does not grow by a prompt's activations
    /// per request in flight.
    pub prefill: Scratch,
}

impl<'a> Ctx<'a> {
    pub fn new(model: &'a Model, tok: &'a Tokenizer, m: &'a Metrics, pools: &'a Pools, limits: &'a Limits) -> Self {
        let prefix = PrefixCache::new(limits.prefix_cache);
        Ctx { model, tok, m, pools, limits, prefix, prefill: Scratch::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{tiny_model, tokenizer};

    #[test]
    fn the_prefix_cache_follows_the_limits() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let on = Limits::default();
        assert!(Ctx::new(&model, &tok, &m, &pools, &on).prefix.enabled());
        let off = Limits { prefix_cache: 0, ..Limits::default() };
        assert!(!Ctx::new(&model, &tok, &m, &pools, &off).prefix.enabled());
    }
}
