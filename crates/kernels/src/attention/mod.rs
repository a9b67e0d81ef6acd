//! Attention of one query-head group over the slots of one KV head.
//!
//! Slots may be in any order (eviction overwrites in place); positions come
//! from slot metadata, and a slot whose position is later than the query's
//! is masked (causality during prefill). The softmax probabilities are left
//! in the caller's buffer so an eviction policy can read them.
//!
//! The kernels read K and V through [`SlotRows`], so one loop serves a
//! contiguous f32 slot array ([`DenseRows`]), quantized rows and paged
//! storage alike; the storage decides how slot `i` is found and decoded.
//! Three kernels, one file each: the one-pass decode kernel
//! ([`attend_group`], here), split decode over chunks of slots (`split.rs`,
//! flash-decoding) and tiled causal prefill (`tiled.rs`).

use crate::dot::{axpy, dot};
use crate::ops::exp_score;
use std::ops::Range;

mod split;
mod tiled;

pub use split::{chunk_factors, chunk_scores, chunk_values, merge_chunks, SplitLayout, SPLIT_SLOTS};
pub use tiled::{
    attend_causal_tiled, pack_keys_tiled, ColumnAgg, TiledQueries, TiledRep, TiledScratch, TiledTarget, TILE_KEYS,
};

/// Row access for attention: slot `i`'s key (or value) as f32. Storage
/// that already holds f32 returns its own memory; quantized or f16 storage
/// decodes into `buf` (`d` floats) and returns that.
pub trait SlotRows: Sync {
    fn row<'a>(&'a self, slot: usize, buf: &'a mut [f32]) -> &'a [f32];

    /// Hints that `slot` is read soon. Storage whose rows are scattered
    /// (pages are separate allocations, so the hardware prefetcher loses
    /// the stream at every page) issues a software prefetch; contiguous
    /// storage needs nothing.
    #[inline]
    fn prefetch(&self, _slot: usize) {}

    /// `out[h] = queries_h · key(slot)` for the `g = out.len()` query heads
    /// of a group (`queries` is `g × d`, `d = buf.len()`), reading the row
    /// once. The default reads the row as f32 ([`row`](Self::row)); coded
    /// storage overrides it to dot straight on its codes.
    #[inline]
    fn dot_group(&self, slot: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        let d = buf.len();
        dot_group_f32(self.row(slot, buf), &queries[..out.len() * d], out);
    }

    /// [`dot_group`](Self::dot_group) for the `n` slots `start..start + n`:
    /// `out[j·g + h]` (`out` is `n × g`), bit for bit the per-slot results.
    /// Storage with consecutive rows overrides it with the run kernels.
    #[inline]
    fn dot_group_run(&self, start: usize, n: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        group_each::<true, _>(self, start..start + n, queries, buf, out);
    }

    /// `outs_h += Σ_j probs[j·g + h] · value(start + j)` over the `n` slots
    /// `start..start + n` in order (`probs` is `n × g`), as
    /// [`axpy_group`](Self::axpy_group) slot after slot.
    #[inline]
    fn axpy_group_run(&self, start: usize, n: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        group_each::<false, _>(self, start..start + n, probs, buf, outs);
    }

    /// `outs_h += probs[h] · value(slot)` for `g = probs.len()` heads
    /// (`outs` is `g × d`, `d = buf.len()`), reading the row once; coded
    /// storage overrides it to accumulate straight from its codes.
    #[inline]
    fn axpy_group(&self, slot: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        let d = buf.len();
        axpy_group_f32(self.row(slot, buf), probs, &mut outs[..probs.len() * d]);
    }
}

/// [`SlotRows::dot_group_run`] (`DOT`: `a` the queries, `b` the scores)
/// or [`SlotRows::axpy_group_run`] (`a` the weights, `b` the outputs)
/// slot by slot: the default, and what storage without a run kernel falls
/// back to. Weighted sums skip the slots no head attends to.
#[inline]
pub fn group_each<const DOT: bool, S: SlotRows + ?Sized>(
    rows: &S,
    slots: Range<usize>,
    a: &[f32],
    buf: &mut [f32],
    b: &mut [f32],
) {
    let g = if DOT { b.len() } else { a.len() } / slots.len().max(1);
    for (j, slot) in slots.enumerate() {
        if DOT {
            rows.dot_group(slot, a, buf, &mut b[j * g..(j + 1) * g]);
        } else {
            let w = &a[j * g..(j + 1) * g];
            if w.iter().any(|&x| x != 0.0) {
                rows.axpy_group(slot, w, buf, b);
            }
        }
    }
}

/// [`SlotRows::dot_group`] on an f32 row: one [`dot`] per head, so f32
/// scores are bit-identical to a per-head loop.
#[inline]
pub fn dot_group_f32(k: &[f32], queries: &[f32], out: &mut [f32]) {
    let d = k.len();
    for (o, q) in out.iter_mut().zip(queries.chunks_exact(d)) {
        *o = dot(q, k);
    }
}

/// [`SlotRows::axpy_group`] on an f32 row: one [`axpy`] per head with a
/// non-zero weight.
#[inline]
pub fn axpy_group_f32(v: &[f32], probs: &[f32], outs: &mut [f32]) {
    for (&p, o) in probs.iter().zip(outs.chunks_exact_mut(v.len())) {
        if p != 0.0 {
            axpy(p, v, o);
        }
    }
}

/// How many slots ahead the kernel prefetches.
const PREFETCH_AHEAD: usize = 16;

/// Software prefetch of the cache lines of `bytes` bytes from `ptr` (x86-64;
/// a no-op elsewhere).
#[inline]
pub fn prefetch_bytes(ptr: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetch never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch(ptr.wrapping_add(off).cast::<i8>(), std::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, bytes);
}

/// Contiguous f32 rows of width `d` (`len × d`).
#[derive(Clone, Copy)]
pub struct DenseRows<'a> {
    pub data: &'a [f32],
    pub d: usize,
}

impl SlotRows for DenseRows<'_> {
    #[inline]
    fn row<'a>(&'a self, slot: usize, _buf: &'a mut [f32]) -> &'a [f32] {
        &self.data[slot * self.d..(slot + 1) * self.d]
    }
}

/// The original positions one query may attend to: causal (nothing after
/// the query) and, on a sliding-window layer, nothing `window` or more
/// tokens before it (a query at `p` sees `p + 1 − window ..= p`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Visible {
    pub first: u32,
    pub last: u32,
}

impl Visible {
    /// Every position up to and including the query's.
    pub fn causal(query_pos: u32) -> Self {
        Visible { first: 0, last: query_pos }
    }

    /// Causal, limited to the last `window` positions when a window is given.
    pub fn within(query_pos: u32, window: Option<usize>) -> Self {
        let first = window.map_or(0, |w| (query_pos as u64 + 1).saturating_sub(w as u64) as u32);
        Visible { first, last: query_pos }
    }

    #[inline]
    pub fn contains(self, pos: u32) -> bool {
        pos >= self.first && pos <= self.last
    }
}

/// Widest head this kernel decodes on the stack.
pub const MAX_HEAD_DIM: usize = 512;

/// Computes attention for `g` query heads sharing one KV head.
///
/// Each slot's key and value row is read (decoded) once for the whole
/// group; per head, the dot products, softmax and value accumulation run
/// in slot order, so the result does not depend on the storage layout.
///
/// * `queries`: `g × d` (RoPE already applied)
/// * `keys`, `values`: the slots' rows (`len` of them)
/// * `positions`: `len` original positions; slots outside `visible` get 0
/// * `probs`: output probabilities, query head h's row at `h × stride`
///   (`stride ≥ len`, so callers can keep rows at a fixed capacity)
/// * `out`: `g × d` attention outputs
#[allow(clippy::too_many_arguments)]
pub fn attend_group<K: SlotRows + ?Sized, V: SlotRows + ?Sized>(
    queries: &[f32],
    keys: &K,
    values: &V,
    positions: &[u32],
    visible: Visible,
    d: usize,
    scale: f32,
    probs: &mut [f32],
    stride: usize,
    out: &mut [f32],
) {
    assert!(d <= MAX_HEAD_DIM, "head_dim {d} exceeds {MAX_HEAD_DIM}");
    let len = positions.len();
    let g = queries.len() / d;
    assert!(stride >= len && probs.len() >= (g - 1) * stride + len && out.len() >= g * d);
    let mut buf = [0f32; MAX_HEAD_DIM];
    for (i, &pos) in positions.iter().enumerate() {
        if i + PREFETCH_AHEAD < len {
            keys.prefetch(i + PREFETCH_AHEAD);
        }
        if visible.contains(pos) {
            let k = keys.row(i, &mut buf[..d]);
            for h in 0..g {
                probs[h * stride + i] = dot(&queries[h * d..(h + 1) * d], k) * scale;
            }
        } else {
            (0..g).for_each(|h| probs[h * stride + i] = f32::NEG_INFINITY);
        }
    }
    for h in 0..g {
        let p = &mut probs[h * stride..h * stride + len];
        let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for pi in p.iter_mut() {
            *pi = if *pi == f32::NEG_INFINITY { 0.0 } else { exp_score(*pi - max) };
            sum += *pi;
        }
        let inv = 1.0 / sum;
        p.iter_mut().for_each(|pi| *pi *= inv);
        out[h * d..(h + 1) * d].fill(0.0);
    }
    for i in 0..len {
        if i + PREFETCH_AHEAD < len {
            values.prefetch(i + PREFETCH_AHEAD);
        }
        if (0..g).all(|h| probs[h * stride + i] == 0.0) {
            continue;
        }
        let v = values.row(i, &mut buf[..d]);
        for h in 0..g {
            let pi = probs[h * stride + i];
            if pi != 0.0 {
                axpy(pi, v, &mut out[h * d..(h + 1) * d]);
            }
        }
    }
}

/// out = Σ_i probs[i] · values[i] (a head applying another head's
/// attention probabilities to its own values: CHAI members).
pub fn weighted_values<V: SlotRows + ?Sized>(probs: &[f32], values: &V, out: &mut [f32]) {
    let d = out.len();
    assert!(d <= MAX_HEAD_DIM, "head_dim {d} exceeds {MAX_HEAD_DIM}");
    let mut buf = [0f32; MAX_HEAD_DIM];
    out.fill(0.0);
    for (i, &p) in probs.iter().enumerate() {
        if i + PREFETCH_AHEAD < probs.len() {
            values.prefetch(i + PREFETCH_AHEAD);
        }
        if p != 0.0 {
            values.axpy_group(i, std::slice::from_ref(&p), &mut buf[..d], out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_order_does_not_matter_and_mask_applies() {
        let d = 4;
        let k: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let v: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.11).cos()).collect();
        let q = vec![0.3, -0.2, 0.5, 0.1, 0.2, 0.2, -0.4, 0.9];
        // the two query heads of `q` over three slots: (probabilities, outputs)
        let attend = |k: &[f32], v: &[f32], positions: &[u32], visible: Visible| {
            let (mut p, mut o) = (vec![0.0; 6], vec![0.0; 8]);
            let (keys, values) = (DenseRows { data: k, d }, DenseRows { data: v, d });
            attend_group(&q, &keys, &values, positions, visible, d, 0.5, &mut p, 3, &mut o);
            (p, o)
        };
        let (p1, o1) = attend(&k, &v, &[0, 1, 2], Visible::causal(2));
        // permute slots: 2,0,1
        let perm = [2usize, 0, 1];
        let k2: Vec<f32> = perm.iter().flat_map(|&s| k[s * d..(s + 1) * d].to_vec()).collect();
        let v2: Vec<f32> = perm.iter().flat_map(|&s| v[s * d..(s + 1) * d].to_vec()).collect();
        let (p2, o2) = attend(&k2, &v2, &[2, 0, 1], Visible::causal(2));
        for (a, b) in o1.iter().zip(&o2) {
            assert!((a - b).abs() < 1e-6);
        }
        assert!((p1[2] - p2[0]).abs() < 1e-7);
        // causal mask: query at position 1 ignores slot with position 2
        let (p1, _) = attend(&k, &v, &[0, 1, 2], Visible::causal(1));
        assert_eq!(p1[2], 0.0);
        assert!((p1[0] + p1[1] - 1.0).abs() < 1e-6);
        // sliding window of 2: query at position 2 sees positions 1 and 2 only
        let (p1, _) = attend(&k, &v, &[0, 1, 2], Visible::within(2, Some(2)));
        assert_eq!(p1[0], 0.0);
        assert!((p1[1] + p1[2] - 1.0).abs() < 1e-6);
        assert_eq!(Visible::within(0, Some(4)), Visible::causal(0));
    }

    /// A group of query heads in one call (rows read once, probabilities at
    /// a stride) gives exactly what one call per head gives.
    #[test]
    fn a_group_call_equals_one_call_per_head() {
        let (d, len, g, stride) = (8, 5, 3, 7);
        let k: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let v: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.11).cos()).collect();
        let q: Vec<f32> = (0..g * d).map(|i| (i as f32 * 0.23).cos()).collect();
        let (keys, values) = (DenseRows { data: &k, d }, DenseRows { data: &v, d });
        let pos = [0, 4, 1, 3, 2];
        let (mut pg, mut og) = (vec![9.0; g * stride], vec![0.0; g * d]);
        attend_group(&q, &keys, &values, &pos, Visible::causal(3), d, 0.3, &mut pg, stride, &mut og);
        for h in 0..g {
            let (mut p, mut o) = (vec![0.0; len], vec![0.0; d]);
            attend_group(&q[h * d..(h + 1) * d], &keys, &values, &pos, Visible::causal(3), d, 0.3, &mut p, len, &mut o);
            assert_eq!(p, pg[h * stride..h * stride + len], "head {h}");
            assert_eq!(o, og[h * d..(h + 1) * d], "head {h}");
            assert!(pg[h * stride + len..(h + 1) * stride].iter().all(|&x| x == 9.0), "stride gap untouched");
        }
    }
}
