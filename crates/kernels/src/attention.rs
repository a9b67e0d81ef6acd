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

    /// [`dot_group`](Self::dot_group) for the `n` slots `start..start + n`:
    /// `out[j·g + h]` (`out` is `n × g`), bit for bit the per-slot results.
    /// Storage with consecutive rows overrides it with the run kernels.
    #[inline]
    fn dot_group_run(&self, start: usize, n: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        dot_group_each(self, start, n, queries, buf, out);
    }

    /// `outs_h += Σ_j probs[j·g + h] · value(start + j)` over the `n` slots
    /// `start..start + n` in order (`probs` is `n × g`), as
    /// [`axpy_group`](Self::axpy_group) slot after slot.
    #[inline]
    fn axpy_group_run(&self, start: usize, n: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        axpy_group_each(self, start, n, probs, buf, outs);
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

/// [`SlotRows::dot_group_run`] slot by slot (the default, and what
/// storage without a run kernel falls back to).
#[inline]
pub fn dot_group_each<S: SlotRows + ?Sized>(
    rows: &S,
    start: usize,
    n: usize,
    queries: &[f32],
    buf: &mut [f32],
    out: &mut [f32],
) {
    let g = out.len() / n.max(1);
    for j in 0..n {
        rows.dot_group(start + j, queries, buf, &mut out[j * g..(j + 1) * g]);
    }
}

/// [`SlotRows::axpy_group_run`] slot by slot, skipping slots no head
/// attends to.
#[inline]
pub fn axpy_group_each<S: SlotRows + ?Sized>(
    rows: &S,
    start: usize,
    n: usize,
    probs: &[f32],
    buf: &mut [f32],
    outs: &mut [f32],
) {
    let g = probs.len() / n.max(1);
    for j in 0..n {
        let w = &probs[j * g..(j + 1) * g];
        if w.iter().any(|&x| x != 0.0) {
            rows.axpy_group(start + j, w, buf, outs);
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

/// Keys per tile of [`attend_causal_tiled`]: one packed panel of
/// [`pack_keys_tiled`].
pub const TILE_KEYS: usize = 64;

/// Packs `len = keys.len() / d` key rows for [`attend_causal_tiled`]:
/// panel `b` (keys `b·TILE_KEYS ..`) is `d × TILE_KEYS` floats, element
/// `(e, jj)` at `b·d·TILE_KEYS + e·TILE_KEYS + jj`, padded with zeros. The
/// transposed panels let the score micro-kernel broadcast query elements
/// against contiguous key columns (no horizontal sums).
pub fn pack_keys_tiled(keys: &[f32], d: usize, out: &mut Vec<f32>) {
    let len = keys.len() / d;
    out.clear();
    out.resize(len.div_ceil(TILE_KEYS) * d * TILE_KEYS, 0.0);
    for (j, k) in keys.chunks_exact(d).enumerate() {
        let panel = &mut out[(j / TILE_KEYS) * d * TILE_KEYS..];
        let jj = j % TILE_KEYS;
        for (e, &x) in k.iter().enumerate() {
            panel[e * TILE_KEYS + jj] = x;
        }
    }
}

/// One representative query head of [`attend_causal_tiled`].
#[derive(Clone, Copy)]
pub struct TiledRep<'a> {
    /// Query `t`'s row (`d` floats, RoPE applied, unscaled) at `t·q_stride`.
    pub queries: &'a [f32],
    pub q_stride: usize,
    /// Its KV head's keys, packed by [`pack_keys_tiled`].
    pub packed_keys: &'a [f32],
}

/// One output of [`attend_causal_tiled`]: representative `rep`'s
/// probabilities applied to `values` (`len × d`; a CHAI member uses its
/// own values), query `t`'s row written at `out_offset + t·out_stride`.
#[derive(Clone, Copy)]
pub struct TiledTarget<'a> {
    pub rep: usize,
    pub values: &'a [f32],
    pub out_offset: usize,
}

/// The queries of one [`attend_causal_tiled`] call: `n` consecutive
/// positions from `pos0`, on a layer with an optional sliding window.
#[derive(Clone, Copy, Debug)]
pub struct TiledQueries {
    pub pos0: u32,
    pub n: usize,
    pub window: Option<usize>,
}

/// Column aggregation for [`attend_causal_tiled`]: called once per query
/// row and live key tile with the `nreps × kb` probabilities (rep-major,
/// stride `kb = columns.len()`) and the tile's column scores to add into.
pub type ColumnAgg<'a> = &'a dyn Fn(&[f32], usize, &mut [f32]);

/// Per-call buffers of [`attend_causal_tiled`] (reused across calls).
#[derive(Default)]
pub struct TiledScratch {
    q: Vec<f32>,
    s: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    probs: Vec<f32>,
    live: Vec<bool>,
}

/// Tiled causal attention of a block of consecutive queries (prefill):
/// for every representative, score tiles `Q·Kᵀ` (query block ×
/// [`TILE_KEYS`] keys) from a register-blocked micro-kernel, the causal /
/// window mask by position (key tiles nobody in the block sees are
/// skipped), an online softmax (running max and sum per query row), and
/// `P·V` accumulated into every target of that representative; one pass.
///
/// With `columns = Some((scores, agg))` (`scores.len() == positions.len()`),
/// a second pass recomputes each live tile's normalised probabilities from
/// the stored per-row max and sum and adds them through `agg` into
/// `scores`, query rows in order, so the result depends on nothing but the
/// inputs. Equal to [`attend_group`] per query up to f32 rounding.
///
/// `positions` are the candidates' original positions (`len`); every query
/// must see at least one candidate (its own position).
#[allow(clippy::too_many_arguments)]
pub fn attend_causal_tiled(
    reps: &[TiledRep],
    targets: &[TiledTarget],
    positions: &[u32],
    queries: TiledQueries,
    d: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
    columns: Option<(&mut [f32], ColumnAgg)>,
    scratch: &mut TiledScratch,
) {
    let args = TiledArgs { reps, targets, positions, queries, d, scale, out, out_stride, columns, scratch };
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::dot::kernels().isa;
        if isa == "avx512" && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above)
            return unsafe { tiled_avx512(args) };
        }
        if (isa == "avx2" || isa == "avx512")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above)
            return unsafe { tiled_avx2(args) };
        }
    }
    tiled_impl::<false>(args)
}

/// The inputs of [`attend_causal_tiled`], passed on as one value to the
/// kernel compiled for each instruction set.
struct TiledArgs<'a, 'b> {
    reps: &'a [TiledRep<'b>],
    targets: &'a [TiledTarget<'b>],
    positions: &'a [u32],
    queries: TiledQueries,
    d: usize,
    scale: f32,
    out: &'a mut [f32],
    out_stride: usize,
    columns: Option<(&'a mut [f32], ColumnAgg<'a>)>,
    scratch: &'a mut TiledScratch,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiled_avx2(args: TiledArgs<'_, '_>) {
    tiled_impl::<true>(args)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tiled_avx512(args: TiledArgs<'_, '_>) {
    tiled_impl::<true>(args)
}

/// `a·b + c`, fused where the caller was compiled with FMA.
#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        c + a * b
    }
}

/// Query rows per micro-tile.
const TILE_ROWS: usize = 4;
/// Columns (keys, or value elements) per micro-tile.
const TILE_COLS: usize = 16;

/// `s[r][jj] = q_r · k_jj` for `q` (`nqp × d`, `nqp` a multiple of
/// [`TILE_ROWS`]) and one packed key panel (`d × TILE_KEYS`).
#[inline(always)]
fn score_tile<const FMA: bool>(q: &[f32], nqp: usize, panel: &[f32], d: usize, s: &mut [f32]) {
    let panel = &panel[..d * TILE_KEYS];
    for r0 in (0..nqp).step_by(TILE_ROWS) {
        let qb = &q[r0 * d..(r0 + TILE_ROWS) * d];
        for c0 in (0..TILE_KEYS).step_by(TILE_COLS) {
            let mut acc = [[0f32; TILE_COLS]; TILE_ROWS];
            for (e, krow) in panel.chunks_exact(TILE_KEYS).enumerate() {
                let k: &[f32; TILE_COLS] = krow[c0..c0 + TILE_COLS].try_into().unwrap();
                for (r, a) in acc.iter_mut().enumerate() {
                    let qv = qb[r * d + e];
                    for (x, &kv) in a.iter_mut().zip(k) {
                        *x = fma::<FMA>(qv, kv, *x);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                s[(r0 + r) * TILE_KEYS + c0..][..TILE_COLS].copy_from_slice(a);
            }
        }
    }
}

/// `out_r += Σ_j p[r][j] · v_j` for `R` query rows from `r0` and the `kbv`
/// value rows of one tile (`v`: `kbv × d`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pv_rows<const FMA: bool, const R: usize>(
    p: &[f32],
    r0: usize,
    kbv: usize,
    v: &[f32],
    d: usize,
    out: &mut [f32],
    out_offset: usize,
    out_stride: usize,
) {
    let v = &v[..kbv * d];
    let row_at = |r: usize| out_offset + (r0 + r) * out_stride;
    let mut c0 = 0;
    while c0 + TILE_COLS <= d {
        let mut acc = [[0f32; TILE_COLS]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            a.copy_from_slice(&out[row_at(r) + c0..][..TILE_COLS]);
        }
        for (j, vrow) in v.chunks_exact(d).enumerate() {
            let vv: &[f32; TILE_COLS] = vrow[c0..c0 + TILE_COLS].try_into().unwrap();
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = p[(r0 + r) * TILE_KEYS + j];
                for (x, &y) in a.iter_mut().zip(vv) {
                    *x = fma::<FMA>(pr, y, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            out[row_at(r) + c0..][..TILE_COLS].copy_from_slice(a);
        }
        c0 += TILE_COLS;
    }
    for c in c0..d {
        for r in 0..R {
            let o = &mut out[row_at(r) + c];
            for (j, vrow) in v.chunks_exact(d).enumerate() {
                *o = fma::<FMA>(p[(r0 + r) * TILE_KEYS + j], vrow[c], *o);
            }
        }
    }
}

/// Minimum and maximum of `positions`.
fn position_range(positions: &[u32]) -> (u32, u32) {
    positions.iter().fold((u32::MAX, 0), |(lo, hi), &p| (lo.min(p), hi.max(p)))
}

#[inline(always)]
fn tiled_impl<const FMA: bool>(args: TiledArgs<'_, '_>) {
    let TiledArgs { reps, targets, positions, queries, d, scale, out, out_stride, columns, scratch } = args;
    let TiledQueries { pos0, n: nq, window } = queries;
    let len = positions.len();
    let nreps = reps.len();
    let nqp = nq.next_multiple_of(TILE_ROWS);
    let nb = len.div_ceil(TILE_KEYS);
    let TiledScratch { q, s, m, l, alpha, probs, live } = scratch;
    q.clear();
    q.resize(nreps * nqp * d, 0.0);
    for (rep, qb) in reps.iter().zip(q.chunks_exact_mut(nqp * d)) {
        for (t, row) in qb.chunks_exact_mut(d).take(nq).enumerate() {
            row.copy_from_slice(&rep.queries[t * rep.q_stride..][..d]);
        }
    }
    s.resize(nqp * TILE_KEYS, 0.0);
    m.clear();
    m.resize(nreps * nq, f32::NEG_INFINITY);
    l.clear();
    l.resize(nreps * nq, 0.0);
    alpha.resize(nq, 0.0);
    // key tiles some query of the block sees
    let first = Visible::within(pos0, window).first;
    let last = pos0 + nq as u32 - 1;
    live.clear();
    live.extend(positions.chunks(TILE_KEYS).map(|c| {
        let (lo, hi) = position_range(c);
        lo <= last && hi >= first
    }));
    for t in targets {
        for r in 0..nq {
            out[t.out_offset + r * out_stride..][..d].fill(0.0);
        }
    }
    for (i, rep) in reps.iter().enumerate() {
        let qi = &q[i * nqp * d..(i + 1) * nqp * d];
        for b in (0..nb).filter(|&b| live[b]) {
            let j0 = b * TILE_KEYS;
            let kbv = TILE_KEYS.min(len - j0);
            let pos = &positions[j0..j0 + kbv];
            score_tile::<FMA>(qi, nqp, &rep.packed_keys[b * d * TILE_KEYS..], d, s);
            for r in 0..nq {
                let vis = Visible::within(pos0 + r as u32, window);
                let row = &mut s[r * TILE_KEYS..r * TILE_KEYS + kbv];
                let mut mx = f32::NEG_INFINITY;
                for (x, &p) in row.iter_mut().zip(pos) {
                    *x = if vis.contains(p) { *x * scale } else { f32::NEG_INFINITY };
                    mx = mx.max(*x);
                }
                let m_old = m[i * nq + r];
                let m_new = m_old.max(mx);
                if m_new == f32::NEG_INFINITY {
                    alpha[r] = 1.0;
                    row.fill(0.0);
                    continue;
                }
                alpha[r] = if m_old == f32::NEG_INFINITY { 0.0 } else { (m_old - m_new).exp() };
                let mut sum = 0f32;
                for x in row.iter_mut() {
                    *x = if *x == f32::NEG_INFINITY { 0.0 } else { (*x - m_new).exp() };
                    sum += *x;
                }
                l[i * nq + r] = l[i * nq + r] * alpha[r] + sum;
                m[i * nq + r] = m_new;
            }
            for t in targets.iter().filter(|t| t.rep == i) {
                for (r, &a) in alpha.iter().enumerate() {
                    if a != 1.0 {
                        out[t.out_offset + r * out_stride..][..d].iter_mut().for_each(|o| *o *= a);
                    }
                }
                let v = &t.values[j0 * d..];
                let mut r0 = 0;
                while r0 + TILE_ROWS <= nq {
                    pv_rows::<FMA, TILE_ROWS>(s, r0, kbv, v, d, out, t.out_offset, out_stride);
                    r0 += TILE_ROWS;
                }
                while r0 < nq {
                    pv_rows::<FMA, 1>(s, r0, kbv, v, d, out, t.out_offset, out_stride);
                    r0 += 1;
                }
            }
        }
    }
    for t in targets {
        for r in 0..nq {
            let inv = 1.0 / l[t.rep * nq + r];
            out[t.out_offset + r * out_stride..][..d].iter_mut().for_each(|o| *o *= inv);
        }
    }
    let Some((scores, agg)) = columns else { return };
    assert_eq!(scores.len(), len);
    for b in (0..nb).filter(|&b| live[b]) {
        let j0 = b * TILE_KEYS;
        let kbv = TILE_KEYS.min(len - j0);
        let pos = &positions[j0..j0 + kbv];
        probs.resize(nq * nreps * kbv, 0.0);
        for (i, rep) in reps.iter().enumerate() {
            score_tile::<FMA>(&q[i * nqp * d..(i + 1) * nqp * d], nqp, &rep.packed_keys[b * d * TILE_KEYS..], d, s);
            for r in 0..nq {
                let vis = Visible::within(pos0 + r as u32, window);
                let (mr, inv) = (m[i * nq + r], 1.0 / l[i * nq + r]);
                let dst = &mut probs[(r * nreps + i) * kbv..][..kbv];
                for ((x, &sc), &p) in dst.iter_mut().zip(&s[r * TILE_KEYS..]).zip(pos) {
                    *x = if vis.contains(p) { (sc * scale - mr).exp() * inv } else { 0.0 };
                }
            }
        }
        for r in 0..nq {
            agg(&probs[r * nreps * kbv..(r + 1) * nreps * kbv], nreps, &mut scores[j0..j0 + kbv]);
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

    /// The tiled prefill kernel against [`attend_group`] run per query
    /// (plus [`weighted_values`] for a member and per-row column sums):
    /// random data, odd head dims, windows, held slots in any order, and
    /// query counts / candidate counts across tile boundaries.
    #[test]
    fn tiled_prefill_matches_per_token_attention() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let cases = [
            (5, 0, 1, 0, None),
            (17, 3, 16, 0, None),
            (64, 70, 37, 5, None),
            (64, 130, 64, 20, Some(50)),
            (33, 0, 129, 0, Some(7)),
            (16, 64, 16, 64, Some(300)),
            (48, 200, 21, 300, Some(64)),
        ];
        for &(d, old, nq, extra, window) in &cases {
            // candidates: `old` held slots (positions scattered below p0), then
            // `extra` chunk tokens before this query block, then the block
            let p0 = (old * 2 + 3) as u32;
            let chunk = extra + nq;
            let len = old + chunk;
            let mut positions: Vec<u32> = (0..old as u32).map(|i| (i * 7 + 1) % p0).collect();
            positions.extend((0..chunk as u32).map(|t| p0 + t));
            let qpos0 = p0 + extra as u32;
            let visible_len = len; // queries see a prefix of candidates at most
            let scale = 0.3;
            let keys: Vec<Vec<f32>> = (0..2).map(|_| (0..len * d).map(|_| rnd() * 2.0).collect()).collect();
            let values: Vec<Vec<f32>> = (0..3).map(|_| (0..len * d).map(|_| rnd()).collect()).collect();
            let nreps = 2;
            let qd = 3 * d;
            let qs: Vec<f32> = (0..nq * qd).map(|_| rnd() * 2.0).collect();
            let packed: Vec<Vec<f32>> = keys
                .iter()
                .map(|k| {
                    let mut p = Vec::new();
                    pack_keys_tiled(k, d, &mut p);
                    p
                })
                .collect();
            // heads 0 and 1 are reps (keys 0, 1); head 2 is a member of rep 1 with values 2
            let reps: Vec<TiledRep> =
                (0..nreps).map(|h| TiledRep { queries: &qs[h * d..], q_stride: qd, packed_keys: &packed[h] }).collect();
            let targets: Vec<TiledTarget> =
                (0..3).map(|h| TiledTarget { rep: h.min(1), values: &values[h], out_offset: h * d }).collect();
            let mut out = vec![f32::NAN; nq * qd];
            let mut cols = vec![0f32; len];
            let agg = |p: &[f32], g: usize, sc: &mut [f32]| {
                let n = sc.len();
                for h in 0..g {
                    sc.iter_mut().zip(&p[h * n..(h + 1) * n]).for_each(|(s, x)| *s += x);
                }
            };
            let mut scratch = TiledScratch::default();
            attend_causal_tiled(
                &reps,
                &targets,
                &positions,
                TiledQueries { pos0: qpos0, n: nq, window },
                d,
                scale,
                &mut out,
                qd,
                Some((&mut cols, &agg)),
                &mut scratch,
            );
            // reference
            let mut ref_cols = vec![0f32; len];
            let mut probs = vec![0f32; nreps * visible_len];
            let mut ref_out = vec![0f32; nq * qd];
            for t in 0..nq {
                let vis = old + extra + t + 1;
                for h in 0..nreps {
                    attend_group(
                        &qs[t * qd + h * d..t * qd + (h + 1) * d],
                        &DenseRows { data: &keys[h][..vis * d], d },
                        &DenseRows { data: &values[h][..vis * d], d },
                        &positions[..vis],
                        Visible::within(qpos0 + t as u32, window),
                        d,
                        scale,
                        &mut probs[h * vis..(h + 1) * vis],
                        vis,
                        &mut ref_out[t * qd + h * d..t * qd + (h + 1) * d],
                    );
                }
                weighted_values(
                    &probs[vis..2 * vis],
                    &DenseRows { data: &values[2][..vis * d], d },
                    &mut ref_out[t * qd + 2 * d..t * qd + 3 * d],
                );
                agg(&probs[..nreps * vis], nreps, &mut ref_cols[..vis]);
            }
            let case = format!("d={d} old={old} nq={nq} extra={extra} window={window:?}");
            for (row, ref_row) in out.chunks_exact(d).zip(ref_out.chunks_exact(d)) {
                let norm = ref_row.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (a, b) in row.iter().zip(ref_row) {
                    assert!((a - b).abs() <= 1e-5 * norm.max(1e-3), "{case}: {a} vs {b} (row max {norm})");
                }
            }
            for (j, (a, b)) in cols.iter().zip(&ref_cols).enumerate() {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-6), "{case}: column {j}: {a} vs {b}");
            }
        }
    }
}
