//! What can go wrong building or updating a sequence's cache. Each variant
//! names the layer, head, spec or plan involved; none is a panic.

use crate::store::CacheFull;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A write would exceed the capacity chosen at creation.
    #[error(transparent)]
    Full(#[from] CacheFull),
    /// A representative head's KV head no longer stores K.
    #[error("layer {layer} KV head {kv_head} has no keys (dropped by a head-sharing policy)")]
    MissingKeys { layer: usize, kv_head: usize },
    /// A shared page pool was made for another page size, dtype or head size.
    #[error("page pool (page={pool_page}, kv_dtype={pool_dtype}, head_dim={pool_head_dim}) does not fit `{spec}` with head_dim {head_dim}")]
    PoolMismatch { pool_page: usize, pool_dtype: String, pool_head_dim: usize, spec: String, head_dim: usize },
    /// The model's sliding-window pattern does not cover its layers.
    #[error("sliding window {window} with a pattern of {pattern} layers does not fit {layers} layers")]
    SlidingPattern { window: usize, pattern: usize, layers: usize },
    /// A CHAI plan does not fit the model (the message names the plan file).
    #[error("{0}")]
    HeadSharing(String),
    /// A spec still names a file nobody read (`tuned:file=…` straight from
    /// the parser); the message names the file.
    #[error("{0}")]
    NotLoaded(String),
    /// [`SequenceCache::truncate`](crate::SequenceCache::truncate) was asked
    /// for something the cache's state does not allow.
    #[error("cannot cut the cache back: {0}")]
    Truncate(String),
    /// Saving a cache, or restoring one from bytes, failed (the message
    /// says what does not fit).
    #[error("{0}")]
    Persist(String),
}
