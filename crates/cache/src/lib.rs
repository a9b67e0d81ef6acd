//! KV cache for one sequence: storage ([`store`]) and the policy that
//! decides which slot to evict ([`policy`]). Storage owns slots — in fixed
//! arrays or pages of a shared [`PagePool`], as f32, f16, int8 or 4-bit
//! rows — and shows every layout to policies and the attention kernel in
//! the same slot order; a policy only reads attention probabilities and
//! picks victims through [`PolicySlots`]. [`SequenceCache`] ties a store
//! to its policy and CHAI state and is the only place that changes slots,
//! scores and positions: a model computes attention over its read views
//! and reports back through its per-step methods. The attention math lives
//! in `kvslim-kernels`.

pub mod accounting;
pub mod error;
pub mod policy;
pub mod rng;
mod sequence;
pub mod size;
pub mod store;
#[cfg(test)]
mod testing;

pub use error::CacheError;
pub use kvslim_kernels::kvquant::KvDtype;
pub use policy::{CachePolicy, HeadId, PolicySlots, PolicySpec, PolicySpecError, ScoreAgg};
pub use sequence::{
    effective_policy, repeat_attention_into, AttentionScores, CacheShape, PrefillCandidates, PrefillKernel, ScoringKey,
    SequenceCache,
};
pub use store::{HeadSlots, KvBytes, KvStore, PageCounts, PagePool, PoolStats, StoreLayout};
