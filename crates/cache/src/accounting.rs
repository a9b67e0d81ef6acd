//! KV byte accounting in one place: what a sequence's store may allocate,
//! computed from the spec and the model's cache shape before anything is
//! allocated. The server admits requests by it and `bench --kv-memory`
//! reports it; `crates/engine/tests/kv_accounting.rs` checks that it bounds
//! the measured peak of every policy × layout × dtype, and by how much.
//!
//! * Fixed slots: per layer and KV head, the layer's capacity (B + 1 for a
//!   budget B, `max_len` for `full`, at most the window on a sliding-window
//!   layer) × (K row + V row in the spec's `kv_dtype`, scales included)
//!   plus a u32 position and an f32 score per slot. This is what the store
//!   allocates at creation, exactly. Online CHAI allocates every K before
//!   its probe ends, so its peak includes them; `chai-static` frees the K no
//!   representative reads at creation, so this over-counts it by those rows.
//! * Paged: per layer and KV head, [`worst_case_pages`] pages of K and of V
//!   (a head never references more than its [`page_cap`]: token eviction
//!   repacks before its holes would take it further).
//!   Page tables and per-slot metadata grow with the live tokens and are
//!   not reserved (they are small next to the pages).

use crate::policy::{PolicySpec, TokenPolicySpec};
use crate::store::paged::page_cap;
use crate::{effective_policy, CacheShape};

/// Bytes one slot's position and score take (u32 + f32).
pub const SLOT_METADATA_BYTES: usize = 8;

/// What a sequence may allocate at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvReservation {
    /// K and V rows (or pages).
    pub kv: usize,
    /// Positions and scores (fixed slots).
    pub metadata: usize,
}

impl KvReservation {
    pub fn total(&self) -> usize {
        self.kv.saturating_add(self.metadata)
    }
}

/// The most bytes a sequence of at most `max_len` tokens may hold under
/// `spec` (percent budgets resolve against `base_len`), following the rules
/// in the module docs.
pub fn reservation(
    spec: &PolicySpec,
    shape: &CacheShape,
    max_len: usize,
    base_len: usize,
) -> Result<KvReservation, crate::CacheError> {
    let policy = effective_policy(spec, shape, base_len)?;
    let dtype = spec.storage.kv_dtype;
    let row = dtype.row_bytes(shape.head_dim);
    let mut out = KvReservation::default();
    for layer in 0..shape.layers {
        let capacity = policy.layer_capacity(layer, max_len);
        // saturating: an absurd budget (`heavy=2^63`) reserves "too much",
        // which admission refuses, instead of wrapping to a small number
        let bytes = |rows: usize, per_row: usize| rows.saturating_mul(per_row).saturating_mul(shape.kv_heads);
        let (kv, metadata) = match worst_case_pages(spec, capacity, max_len) {
            Some(pages) => (bytes(2 * pages, spec.storage.page_size.unwrap_or(1).saturating_mul(row)), 0),
            None => (bytes(capacity.saturating_mul(2), row), bytes(capacity, SLOT_METADATA_BYTES)),
        };
        out.kv = out.kv.saturating_add(kv);
        out.metadata = out.metadata.saturating_add(metadata);
    }
    Ok(out)
}

/// Worst-case pages one (layer, KV head) of a paged sequence holds at once
/// (K or V each; `None` for fixed slots). With P the page size, C the
/// layer's capacity (B + 1) and L = `max_len`:
///
/// * `full` → ⌈min(L, C)/P⌉;
/// * page eviction (`page_score`) → ⌈C/P⌉ + 1;
/// * token eviction → the head's [`page_cap`] (it repacks before holes
///   would take it further), and with `compact=N` no more than
///   ⌈(C+N)/P⌉ + 1.
///
/// Every bound is also capped by ⌈L/P⌉ + 1.
pub fn worst_case_pages(policy: &PolicySpec, capacity: usize, max_len: usize) -> Option<usize> {
    let p = policy.storage.page_size?;
    let all = max_len.div_ceil(p);
    let pages = if matches!(policy.token, TokenPolicySpec::Full) {
        all.min(capacity.div_ceil(p))
    } else if policy.storage.page_score.is_some() {
        capacity.div_ceil(p) + 1
    } else {
        let cap = page_cap(capacity, p);
        match policy.storage.compact_every {
            Some(n) => cap.min(capacity.saturating_add(n).div_ceil(p) + 1),
            None => cap,
        }
    };
    Some(pages.min(all + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SequenceCache;

    fn shape() -> CacheShape {
        CacheShape::plain(2, 4, 2, 64)
    }

    /// For fixed slots the reservation is exactly what the store allocates.
    #[test]
    fn fixed_slots_reserve_exactly_what_the_store_allocates() {
        for spec in ["full", "h2o:heavy=8,recent=8", "window:recent=5,kv_dtype=q8", "sink:sink=2,recent=6,kv_dtype=q4"]
        {
            let spec = PolicySpec::parse(spec).unwrap();
            for sliding in [None, Some((6, vec![true, false]))] {
                let shape = CacheShape { sliding_window: sliding, ..shape() };
                let r = reservation(&spec, &shape, 100, 100).unwrap();
                let b = SequenceCache::new(&spec, shape.clone(), 100, 100).unwrap().store().bytes();
                assert_eq!((r.kv, r.metadata), (b.kv, b.metadata), "{spec}");
            }
        }
    }

    /// The q8 row is codes plus scales, not an f32 row: a q8 H2O request
    /// reserves about a quarter of the f32 bytes.
    #[test]
    fn quantized_rows_reserve_their_own_size() {
        let f32 = reservation(&PolicySpec::parse("h2o:heavy=8,recent=8").unwrap(), &shape(), 100, 100).unwrap();
        let q8 =
            reservation(&PolicySpec::parse("h2o:heavy=8,recent=8,kv_dtype=q8").unwrap(), &shape(), 100, 100).unwrap();
        assert!(q8.kv * 3 < f32.kv, "{q8:?} vs {f32:?}");
    }
}
