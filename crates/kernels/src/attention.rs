//! Attention of one query-head group over the slots of one KV head.
//!
//! Slots may be in any order (eviction overwrites in place); positions come
//! from slot metadata, and a slot whose position is later than the query's
//! is masked (causality during prefill). The softmax probabilities are left
//! in the caller's buffer so an eviction policy can read them.
//!
//! The kernel reads K and V through [`SlotRows`], so one loop serves a
//! contiguous f32 slot array ([`DenseRows`]), quantized rows and paged
//! storage alike; the storage decides how slot `i` is found and decoded.

use crate::dot::{axpy, dot};

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

    /// `outs_h += probs[h] · value(slot)` for `g = probs.len()` heads
    /// (`outs` is `g × d`, `d = buf.len()`), reading the row once; coded
    /// storage overrides it to accumulate straight from its codes.
    #[inline]
    fn axpy_group(&self, slot: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        let d = buf.len();
        axpy_group_f32(self.row(slot, buf), probs, &mut outs[..probs.len() * d]);
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
            *pi = if *pi == f32::NEG_INFINITY { 0.0 } else { (*pi - max).exp() };
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

/// Slots per chunk of split decode attention ([`attend_chunk`]).
///
/// The chunk boundaries are multiples of this constant whatever the thread
/// count, so the split (and the f32 summation order it implies) is the
/// same on one thread as on many: results never depend on the threads.
/// 256 slots of a 64-wide head are 64 KiB of f32 K+V per KV head, enough
/// work per task to hide scheduling, and 2,048 tokens give 8 tasks per KV
/// head to balance over the cores.
pub const SPLIT_SLOTS: usize = 256;

/// The layout of one chunk's partial state in a caller-owned block of
/// `block_len()` floats: slot-major unnormalised weights (`SPLIT_SLOTS ×
/// g`), then per head the chunk's max score, Σ exp, and Σ exp·v (`g × d`).
#[derive(Clone, Copy, Debug)]
pub struct SplitLayout {
    pub g: usize,
    pub d: usize,
}

impl SplitLayout {
    pub fn block_len(self) -> usize {
        self.g * (SPLIT_SLOTS + 2 + self.d)
    }

    fn parts(self, b: &[f32]) -> (&[f32], &[f32], &[f32], &[f32]) {
        let (e, r) = b.split_at(SPLIT_SLOTS * self.g);
        let (m, r) = r.split_at(self.g);
        let (s, r) = r.split_at(self.g);
        (e, m, s, &r[..self.g * self.d])
    }

    #[allow(clippy::type_complexity)]
    fn parts_mut(self, b: &mut [f32]) -> (&mut [f32], &mut [f32], &mut [f32], &mut [f32]) {
        let (e, r) = b.split_at_mut(SPLIT_SLOTS * self.g);
        let (m, r) = r.split_at_mut(self.g);
        let (s, r) = r.split_at_mut(self.g);
        (e, m, s, &mut r[..self.g * self.d])
    }
}

/// Pass 1 of one chunk of split decode attention (flash-decoding): for
/// the slots `chunk × SPLIT_SLOTS ..` (at most [`SPLIT_SLOTS`], clipped to
/// `positions.len()`) and the `g` query heads of `queries`, stores in
/// `block` (see [`SplitLayout`]) per head the chunk's max score `m`, the
/// weights `e_i = exp(s_i − m)` and `Σ e_i` (slot order). Each K row is
/// read once for the whole group through [`SlotRows::dot_group`] (coded
/// rows never decode to memory). Chunks are independent, so they run on
/// any threads. Allocates nothing.
#[allow(clippy::too_many_arguments)]
pub fn chunk_scores<K: SlotRows + ?Sized>(
    queries: &[f32],
    keys: &K,
    positions: &[u32],
    chunk: usize,
    visible: Visible,
    scale: f32,
    layout: SplitLayout,
    block: &mut [f32],
) {
    let SplitLayout { g, d } = layout;
    assert!(d <= MAX_HEAD_DIM, "head_dim {d} exceeds {MAX_HEAD_DIM}");
    assert!(queries.len() >= g * d);
    let (start, end) = chunk_range(chunk, positions.len());
    let (e, max, sum, _) = layout.parts_mut(block);
    let mut buf = [0f32; MAX_HEAD_DIM];
    for (j, &pos) in positions[start..end].iter().enumerate() {
        let i = start + j;
        if i + PREFETCH_AHEAD < end {
            keys.prefetch(i + PREFETCH_AHEAD);
        }
        let row = &mut e[j * g..(j + 1) * g];
        if visible.contains(pos) {
            keys.dot_group(i, &queries[..g * d], &mut buf[..d], row);
            row.iter_mut().for_each(|x| *x *= scale);
        } else {
            row.fill(f32::NEG_INFINITY);
        }
    }
    let e = &mut e[..(end - start) * g];
    for h in 0..g {
        let m = e.iter().skip(h).step_by(g).fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut s = 0f32;
        for x in e.iter_mut().skip(h).step_by(g) {
            *x = if *x == f32::NEG_INFINITY { 0.0 } else { (*x - m).exp() };
            s += *x;
        }
        (max[h], sum[h]) = (m, s);
    }
}

/// Slots `start..end` of chunk `chunk` of `len`.
fn chunk_range(chunk: usize, len: usize) -> (usize, usize) {
    let start = (chunk * SPLIT_SLOTS).min(len);
    (start, (start + SPLIT_SLOTS).min(len))
}

/// Between the passes, for query head `h` of one KV head's `len` slots
/// (`len.div_ceil(SPLIT_SLOTS)` blocks): the log-sum-exp rule. With `M =
/// max m_c` and `S = Σ_c exp(m_c − M)·Σe_c` (chunk order), each chunk's
/// `Σe` is replaced by its factor `f_c = exp(m_c − M)/S`, so `e_i·f_c` is
/// the final normalised probability. With one chunk `f = 1/Σe`: exactly
/// the one-pass kernel ([`attend_group`]).
pub fn chunk_factors(blocks: &mut [f32], layout: SplitLayout, len: usize, h: usize) {
    let bl = layout.block_len();
    let nch = len.div_ceil(SPLIT_SLOTS);
    let m = (0..nch).fold(f32::NEG_INFINITY, |m, c| m.max(layout.parts(&blocks[c * bl..]).1[h]));
    let factor = |mc: f32| if mc == f32::NEG_INFINITY { 0.0 } else { (mc - m).exp() };
    let total: f32 = (0..nch).map(|c| layout.parts(&blocks[c * bl..])).map(|(_, mc, s, _)| factor(mc[h]) * s[h]).sum();
    let inv = 1.0 / total;
    for c in 0..nch {
        let (_, mc, s, _) = layout.parts_mut(&mut blocks[c * bl..]);
        s[h] = factor(mc[h]) * inv;
    }
}

/// Pass 2 of one chunk: normalises its weights in place (`p_i = e_i·f_c`)
/// and accumulates `Σ p_i·v_i` per head, reading each V row once for the
/// group ([`SlotRows::axpy_group`]) and skipping rows no head attends to.
pub fn chunk_values<V: SlotRows + ?Sized>(
    values: &V,
    len: usize,
    chunk: usize,
    layout: SplitLayout,
    block: &mut [f32],
) {
    let SplitLayout { g, d } = layout;
    let (start, end) = chunk_range(chunk, len);
    let (e, _, f, acc) = layout.parts_mut(block);
    let mut buf = [0f32; MAX_HEAD_DIM];
    acc.fill(0.0);
    for (j, w) in e[..(end - start) * g].chunks_exact_mut(g).enumerate() {
        let i = start + j;
        if i + PREFETCH_AHEAD < end {
            values.prefetch(i + PREFETCH_AHEAD);
        }
        w.iter_mut().zip(f.iter()).for_each(|(x, &f)| *x *= f);
        if w.iter().all(|&x| x == 0.0) {
            continue;
        }
        values.axpy_group(i, w, &mut buf[..d], acc);
    }
}

/// Final step for query head `h`: `out = Σ_c acc_c` in chunk order and the
/// probabilities (`len`) copied out for the eviction policy. The chunk
/// boundaries are fixed, so the result is the same whatever threads ran
/// the passes.
pub fn merge_chunks(blocks: &[f32], layout: SplitLayout, len: usize, h: usize, probs: &mut [f32], out: &mut [f32]) {
    let SplitLayout { g, d } = layout;
    let bl = layout.block_len();
    out[..d].fill(0.0);
    for c in 0..len.div_ceil(SPLIT_SLOTS) {
        let (e, _, _, acc) = layout.parts(&blocks[c * bl..]);
        let (start, end) = chunk_range(c, len);
        // 0 + x is exact, so one chunk gives the one-pass kernel's result
        out[..d].iter_mut().zip(&acc[h * d..(h + 1) * d]).for_each(|(o, &a)| *o += a);
        for (p, &x) in probs[start..end].iter_mut().zip(e.iter().skip(h).step_by(g)) {
            *p = x;
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
        let (mut p1, mut o1) = (vec![0.0; 6], vec![0.0; 8]);
        attend_group(
            &q,
            &DenseRows { data: &k, d },
            &DenseRows { data: &v, d },
            &[0, 1, 2],
            Visible::causal(2),
            d,
            0.5,
            &mut p1,
            3,
            &mut o1,
        );
        // permute slots: 2,0,1
        let perm = [2usize, 0, 1];
        let k2: Vec<f32> = perm.iter().flat_map(|&s| k[s * d..(s + 1) * d].to_vec()).collect();
        let v2: Vec<f32> = perm.iter().flat_map(|&s| v[s * d..(s + 1) * d].to_vec()).collect();
        let (mut p2, mut o2) = (vec![0.0; 6], vec![0.0; 8]);
        attend_group(
            &q,
            &DenseRows { data: &k2, d },
            &DenseRows { data: &v2, d },
            &[2, 0, 1],
            Visible::causal(2),
            d,
            0.5,
            &mut p2,
            3,
            &mut o2,
        );
        for (a, b) in o1.iter().zip(&o2) {
            assert!((a - b).abs() < 1e-6);
        }
        assert!((p1[2] - p2[0]).abs() < 1e-7);
        // causal mask: query at position 1 ignores slot with position 2
        attend_group(
            &q,
            &DenseRows { data: &k, d },
            &DenseRows { data: &v, d },
            &[0, 1, 2],
            Visible::causal(1),
            d,
            0.5,
            &mut p1,
            3,
            &mut o1,
        );
        assert_eq!(p1[2], 0.0);
        assert!((p1[0] + p1[1] - 1.0).abs() < 1e-6);
        // sliding window of 2: query at position 2 sees positions 1 and 2 only
        attend_group(
            &q,
            &DenseRows { data: &k, d },
            &DenseRows { data: &v, d },
            &[0, 1, 2],
            Visible::within(2, Some(2)),
            d,
            0.5,
            &mut p1,
            3,
            &mut o1,
        );
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

    /// Split attention (chunks merged by log-sum-exp) equals the one-pass
    /// kernel to rounding, over several chunks, odd head dims, permuted
    /// positions and a window that masks whole chunks.
    #[test]
    fn split_chunks_merge_to_the_one_pass_result() {
        for (d, len, g, window) in
            [(7, 700, 3, None), (64, 2 * SPLIT_SLOTS, 2, Some(300)), (33, 100, 1, None), (16, 200, 4, Some(150))]
        {
            let k: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let v: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.11).cos()).collect();
            let q: Vec<f32> = (0..g * d).map(|i| (i as f32 * 0.23).cos() * 2.0).collect();
            let pos: Vec<u32> = (0..len as u32).map(|i| (i * 7919) % len as u32).collect();
            let (keys, values) = (DenseRows { data: &k, d }, DenseRows { data: &v, d });
            let vis = Visible::within(len as u32 - 1, window);
            let (mut pw, mut ow) = (vec![0.0; g * len], vec![0.0; g * d]);
            attend_group(&q, &keys, &values, &pos, vis, d, 0.3, &mut pw, len, &mut ow);
            let layout = SplitLayout { g, d };
            let nch = len.div_ceil(SPLIT_SLOTS);
            let mut blocks = vec![f32::NAN; nch * layout.block_len()];
            for (c, b) in blocks.chunks_mut(layout.block_len()).enumerate() {
                chunk_scores(&q, &keys, &pos, c, vis, 0.3, layout, b);
            }
            (0..g).for_each(|h| chunk_factors(&mut blocks, layout, len, h));
            for (c, b) in blocks.chunks_mut(layout.block_len()).enumerate() {
                chunk_values(&values, len, c, layout, b);
            }
            let (mut p, mut o) = (vec![0.0; g * len], vec![0.0; g * d]);
            for h in 0..g {
                merge_chunks(&blocks, layout, len, h, &mut p[h * len..(h + 1) * len], &mut o[h * d..(h + 1) * d]);
                let total: f32 = p[h * len..(h + 1) * len].iter().sum();
                assert!((total - 1.0).abs() < 1e-5, "probabilities sum to {total}");
            }
            for (a, b) in p.iter().zip(&pw) {
                assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "prob {a} vs {b}");
                assert_eq!(*a == 0.0, *b == 0.0, "masked slots stay exactly 0");
            }
            for (a, b) in o.iter().zip(&ow) {
                assert!((a - b).abs() <= 1e-5, "out {a} vs {b}");
            }
            if nch == 1 {
                assert_eq!((p, o), (pw, ow), "one chunk is the one-pass kernel bit for bit");
            }
        }
    }
}
