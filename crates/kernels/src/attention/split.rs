//! Split decode attention (flash-decoding): the slots in chunks of
//! [`SPLIT_SLOTS`] scored and summed independently (any thread), then
//! merged by the log-sum-exp rule in chunk order.

use super::{SlotRows, Visible, MAX_HEAD_DIM};
use crate::ops::exp_score;

/// Slots per run of [`SlotRows::dot_group_run`] / `axpy_group_run` in the
/// split decode kernel (one page of the paged store).
const RUN_SLOTS: usize = 16;

/// Hints the run after the one starting at `r0` (slots before `end`).
#[inline]
fn prefetch_next_run<R: SlotRows + ?Sized>(rows: &R, r0: usize, end: usize) {
    (r0 + RUN_SLOTS..end).take(RUN_SLOTS).for_each(|i| rows.prefetch(i));
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
/// read once for the whole group, 16 slots at a time through
/// [`SlotRows::dot_group_run`] (coded rows never decode to memory). Chunks are independent, so they run on
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
    for r0 in (start..end).step_by(RUN_SLOTS) {
        let n = (end - r0).min(RUN_SLOTS);
        prefetch_next_run(keys, r0, end);
        let rows = &mut e[(r0 - start) * g..(r0 - start + n) * g];
        keys.dot_group_run(r0, n, &queries[..g * d], &mut buf[..d], rows);
        for (row, &pos) in rows.chunks_exact_mut(g).zip(&positions[r0..r0 + n]) {
            if visible.contains(pos) {
                row.iter_mut().for_each(|x| *x *= scale);
            } else {
                row.fill(f32::NEG_INFINITY);
            }
        }
    }
    let e = &mut e[..(end - start) * g];
    max[..g].fill(f32::NEG_INFINITY);
    for row in e.chunks_exact(g) {
        max[..g].iter_mut().zip(row).for_each(|(m, &x)| *m = m.max(x));
    }
    exp_rows(e, &max[..g]);
    // per head in slot order (the heads' chains interleave)
    sum[..g].fill(0.0);
    for row in e.chunks_exact(g) {
        sum[..g].iter_mut().zip(row).for_each(|(s, &x)| *s += x);
    }
}

/// Longest run of the repeated maxima in [`exp_rows`].
const PATTERN: usize = 64;

/// `x ← exp(x − max[h])` over slot-major rows of `g = max.len()` (0 where
/// x is −∞), as one contiguous loop over runs of whole rows against the
/// maxima repeated, so it vectorizes though g is rarely a lane count; with
/// the widest vectors the CPU has (no fused multiply-add in
/// [`exp_score`], so every ISA gives the same bits).
fn exp_rows(e: &mut [f32], max: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::dot::kernels().isa;
        if isa == crate::dot::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above)
            return unsafe { exp_rows_avx512(e, max) };
        }
        if isa != crate::dot::Isa::Scalar && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above)
            return unsafe { exp_rows_avx2(e, max) };
        }
    }
    exp_rows_impl(e, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn exp_rows_avx512(e: &mut [f32], max: &[f32]) {
    exp_rows_impl(e, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_rows_avx2(e: &mut [f32], max: &[f32]) {
    exp_rows_impl(e, max)
}

#[inline(always)]
fn exp_rows_impl(e: &mut [f32], max: &[f32]) {
    let g = max.len();
    if g > PATTERN {
        for row in e.chunks_exact_mut(g) {
            row.iter_mut().zip(max).for_each(|(x, &m)| *x = exp_masked(*x, m));
        }
        return;
    }
    let run = g * (PATTERN / g);
    let mut pattern = [0f32; PATTERN];
    pattern[..run].iter_mut().enumerate().for_each(|(i, p)| *p = max[i % g]);
    for part in e.chunks_mut(run) {
        part.iter_mut().zip(&pattern).for_each(|(x, &m)| *x = exp_masked(*x, m));
    }
}

/// e^(x − m), 0 for a masked score.
#[inline(always)]
fn exp_masked(x: f32, m: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        0.0
    } else {
        exp_score(x - m)
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
    let factor = |mc: f32| exp_masked(mc, m);
    let total: f32 = (0..nch).map(|c| layout.parts(&blocks[c * bl..])).map(|(_, mc, s, _)| factor(mc[h]) * s[h]).sum();
    let inv = 1.0 / total;
    for c in 0..nch {
        let (_, mc, s, _) = layout.parts_mut(&mut blocks[c * bl..]);
        s[h] = factor(mc[h]) * inv;
    }
}

/// Pass 2 of one chunk: normalises its weights in place (`p_i = e_i·f_c`)
/// and accumulates `Σ p_i·v_i` per head, reading each V row once for the
/// group, 16 slots at a time ([`SlotRows::axpy_group_run`]).
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
    for r0 in (start..end).step_by(RUN_SLOTS) {
        let n = (end - r0).min(RUN_SLOTS);
        prefetch_next_run(values, r0, end);
        let w = &mut e[(r0 - start) * g..(r0 - start + n) * g];
        for row in w.chunks_exact_mut(g) {
            row.iter_mut().zip(f.iter()).for_each(|(x, &f)| *x *= f);
        }
        values.axpy_group_run(r0, n, w, &mut buf[..d], acc);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend_group, DenseRows};

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

    /// The dispatched (widest-vector) exponential pass gives the portable
    /// scalar code's bits, for group sizes that are and are not lane counts
    /// and with masked (−∞) scores; and equals exp to f32 accuracy.
    #[test]
    fn exp_rows_is_the_same_on_every_isa() {
        for g in [1, 3, 6, 8, 16, 70] {
            let scores: Vec<f32> = (0..37 * g)
                .map(|i| if i % 11 == 3 { f32::NEG_INFINITY } else { ((i * 7919) % 1000) as f32 * -0.09 })
                .collect();
            let max: Vec<f32> = (0..g).map(|h| (h as f32) * -0.5).collect();
            let (mut fast, mut portable) = (scores.clone(), scores.clone());
            exp_rows(&mut fast, &max);
            exp_rows_impl(&mut portable, &max);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&portable), "g = {g}");
            for (i, (&x, &e)) in scores.iter().zip(&fast).enumerate() {
                // exactly 0 below −87 (and for masked scores), by design
                let z = x - max[i % g];
                let want = if z < -87.0 { 0.0 } else { f64::from(z).exp() };
                assert!((f64::from(e) - want).abs() <= 2e-7 * want, "g = {g}, slot {i}: {e} vs {want}");
            }
        }
    }
}
