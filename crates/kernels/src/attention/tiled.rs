//! Tiled causal attention for prefill: score tiles from a register-blocked
//! micro-kernel, an online softmax, and `P·V` into every target.

use super::Visible;
use crate::ops::exp_score;

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
    /// Per key tile, its lowest and highest position.
    spans: Vec<(u32, u32)>,
    /// First-pass probabilities kept for the column pass: per (rep, key
    /// tile, query row) the tile's `exp(s − m)` under the running max `m`
    /// of that moment (`tile_max`), so the column pass rescales them
    /// instead of computing the scores again.
    kept: Vec<f32>,
    tile_max: Vec<f32>,
    /// Tests: always compute the column pass's scores again.
    #[cfg(test)]
    recompute: bool,
}

/// Most bytes [`TiledScratch`] keeps of first-pass probabilities for the
/// column pass (per worker); above it the column pass recomputes its score
/// tiles, which costs a third more attention at 64K keys (`dotbench
/// --tiled`). 16 queries × 6 heads (one Qwen2.5-Coder-1.5B KV head) × 170K
/// keys fit; a long prompt's own K and V are far larger.
const KEPT_MAX_BYTES: usize = 64 << 20;

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
        if isa == crate::dot::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above)
            return unsafe { tiled_avx512(args) };
        }
        if (isa == crate::dot::Isa::Avx2 || isa == crate::dot::Isa::Avx512)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above)
            return unsafe { tiled_avx2(args) };
        }
    }
    tiled_impl::<false, NARROW>(args)
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
    tiled_impl::<true, NARROW>(args)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tiled_avx512(args: TiledArgs<'_, '_>) {
    tiled_impl::<true, WIDE>(args)
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
/// Columns (keys, or value elements) per micro-tile where the registers
/// are 256 bits: 4 rows × 16 columns are 8 accumulators.
const NARROW: usize = 16;
/// Columns per micro-tile with AVX-512: 4 rows × 32 columns are 8
/// accumulators, enough independent FMAs to hide their latency (with 16
/// columns, 4 chains kept the FMA units half idle; 64 columns spilled).
/// 1.25–1.4× the attention at 4K–64K keys (`dotbench --tiled`).
const WIDE: usize = 32;

/// `s[r][jj] = q_r · k_jj` for `q` (`nqp × d`, `nqp` a multiple of
/// [`TILE_ROWS`]) and one packed key panel (`d × TILE_KEYS`), `W` keys per
/// micro-tile; each score is summed over `e` in order whatever `W` is.
#[inline(always)]
fn score_tile<const FMA: bool, const W: usize>(q: &[f32], nqp: usize, panel: &[f32], d: usize, s: &mut [f32]) {
    let panel = &panel[..d * TILE_KEYS];
    for r0 in (0..nqp).step_by(TILE_ROWS) {
        let qb = &q[r0 * d..(r0 + TILE_ROWS) * d];
        for c0 in (0..TILE_KEYS).step_by(W) {
            let mut acc = [[0f32; W]; TILE_ROWS];
            for (e, krow) in panel.chunks_exact(TILE_KEYS).enumerate() {
                let k: &[f32; W] = krow[c0..c0 + W].try_into().unwrap();
                for (r, a) in acc.iter_mut().enumerate() {
                    let qv = qb[r * d + e];
                    for (x, &kv) in a.iter_mut().zip(k) {
                        *x = fma::<FMA>(qv, kv, *x);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                s[(r0 + r) * TILE_KEYS + c0..][..W].copy_from_slice(a);
            }
        }
    }
}

/// `out_r += Σ_j p[r][j] · v_j` for `R` query rows from `r0` and the `kbv`
/// value rows of one tile (`v`: `kbv × d`): `W` columns at a time, then
/// [`NARROW`], then one by one; each element sums over `j` in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pv_rows<const FMA: bool, const R: usize, const W: usize>(
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
    let mut c0 = pv_cols::<FMA, R, W>(p, r0, v, d, out, (out_offset, out_stride), 0);
    if W != NARROW {
        c0 = pv_cols::<FMA, R, NARROW>(p, r0, v, d, out, (out_offset, out_stride), c0);
    }
    let row_at = |r: usize| out_offset + (r0 + r) * out_stride;
    for c in c0..d {
        for r in 0..R {
            let o = &mut out[row_at(r) + c];
            for (j, vrow) in v.chunks_exact(d).enumerate() {
                *o = fma::<FMA>(p[(r0 + r) * TILE_KEYS + j], vrow[c], *o);
            }
        }
    }
}

/// [`pv_rows`]'s columns `c0..` in micro-tiles of `W` while whole ones
/// fit; returns the first column left.
#[inline(always)]
fn pv_cols<const FMA: bool, const R: usize, const W: usize>(
    p: &[f32],
    r0: usize,
    v: &[f32],
    d: usize,
    out: &mut [f32],
    (out_offset, out_stride): (usize, usize),
    mut c0: usize,
) -> usize {
    let row_at = |r: usize| out_offset + (r0 + r) * out_stride;
    while c0 + W <= d {
        let mut acc = [[0f32; W]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            a.copy_from_slice(&out[row_at(r) + c0..][..W]);
        }
        for (j, vrow) in v.chunks_exact(d).enumerate() {
            let vv: &[f32; W] = vrow[c0..c0 + W].try_into().unwrap();
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = p[(r0 + r) * TILE_KEYS + j];
                for (x, &y) in a.iter_mut().zip(vv) {
                    *x = fma::<FMA>(pr, y, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            out[row_at(r) + c0..][..W].copy_from_slice(a);
        }
        c0 += W;
    }
    c0
}

/// Minimum and maximum of `positions`.
fn position_range(positions: &[u32]) -> (u32, u32) {
    positions.iter().fold((u32::MAX, 0), |(lo, hi), &p| (lo.min(p), hi.max(p)))
}

#[inline(always)]
fn tiled_impl<const FMA: bool, const W: usize>(args: TiledArgs<'_, '_>) {
    let TiledArgs { reps, targets, positions, queries, d, scale, out, out_stride, columns, scratch } = args;
    let TiledQueries { pos0, n: nq, window } = queries;
    let len = positions.len();
    let nreps = reps.len();
    let nqp = nq.next_multiple_of(TILE_ROWS);
    let nb = len.div_ceil(TILE_KEYS);
    #[cfg(test)]
    let recompute = scratch.recompute;
    #[cfg(not(test))]
    let recompute = false;
    let TiledScratch { q, s, m, l, alpha, probs, spans, kept, tile_max, .. } = scratch;
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
    spans.clear();
    spans.extend(positions.chunks(TILE_KEYS).map(position_range));
    let live = |b: usize| spans[b].0 <= last && spans[b].1 >= first;
    for t in targets {
        for r in 0..nq {
            out[t.out_offset + r * out_stride..][..d].fill(0.0);
        }
    }
    // keep the first pass's probabilities for the column pass when they fit
    let keep = columns.is_some() && !recompute && nreps * nb * nq * TILE_KEYS * 4 <= KEPT_MAX_BYTES;
    if keep {
        kept.resize(nreps * nb * nq * TILE_KEYS, 0.0);
        tile_max.resize(nreps * nb * nq, 0.0);
    }
    // tile by tile, every representative in turn: a tile's keys and values
    // are read once per block of queries, not once per representative
    // (representatives mostly share a KV head, and a long prompt's K and V,
    // with the column pass's kept probabilities beside them, do not stay
    // in cache from one representative to the next); each (rep, row)
    // still sees the tiles in order, so every result is the same
    for b in (0..nb).filter(|&b| live(b)) {
        let j0 = b * TILE_KEYS;
        let kbv = TILE_KEYS.min(len - j0);
        let pos = &positions[j0..j0 + kbv];
        for (i, rep) in reps.iter().enumerate() {
            let qi = &q[i * nqp * d..(i + 1) * nqp * d];
            score_tile::<FMA, W>(qi, nqp, &rep.packed_keys[b * d * TILE_KEYS..], d, s);
            for r in 0..nq {
                let vis = Visible::within(pos0 + r as u32, window);
                let row = &mut s[r * TILE_KEYS..r * TILE_KEYS + kbv];
                let (lo, hi) = spans[b];
                let mx = if vis.first <= lo && hi <= vis.last {
                    scale_max(row, scale)
                } else {
                    let mut mx = f32::NEG_INFINITY;
                    for (x, &p) in row.iter_mut().zip(pos) {
                        *x = if vis.contains(p) { *x * scale } else { f32::NEG_INFINITY };
                        mx = mx.max(*x);
                    }
                    mx
                };
                let m_old = m[i * nq + r];
                let m_new = m_old.max(mx);
                if m_new == f32::NEG_INFINITY {
                    alpha[r] = 1.0;
                    row.fill(0.0);
                    if keep {
                        tile_max[(i * nb + b) * nq + r] = f32::NEG_INFINITY;
                    }
                    continue;
                }
                alpha[r] = if m_old == f32::NEG_INFINITY { 0.0 } else { exp_score(m_old - m_new) };
                for x in row.iter_mut() {
                    *x = if *x == f32::NEG_INFINITY { 0.0 } else { exp_score(*x - m_new) };
                }
                let sum = lane_sum(row);
                l[i * nq + r] = l[i * nq + r] * alpha[r] + sum;
                m[i * nq + r] = m_new;
                if keep {
                    let at = (i * nb + b) * nq + r;
                    kept[at * TILE_KEYS..][..kbv].copy_from_slice(row);
                    tile_max[at] = m_new;
                }
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
                    pv_rows::<FMA, TILE_ROWS, W>(s, r0, kbv, v, d, out, t.out_offset, out_stride);
                    r0 += TILE_ROWS;
                }
                while r0 < nq {
                    pv_rows::<FMA, 1, W>(s, r0, kbv, v, d, out, t.out_offset, out_stride);
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
    for b in (0..nb).filter(|&b| live(b)) {
        let j0 = b * TILE_KEYS;
        let kbv = TILE_KEYS.min(len - j0);
        probs.resize(nq * nreps * kbv, 0.0);
        if keep {
            // p = exp(s − m_tile) · exp(m_tile − m) / l (0 where masked)
            for i in 0..nreps {
                for r in 0..nq {
                    let at = (i * nb + b) * nq + r;
                    let f = exp_score(tile_max[at] - m[i * nq + r]) / l[i * nq + r];
                    let dst = &mut probs[(r * nreps + i) * kbv..][..kbv];
                    dst.iter_mut().zip(&kept[at * TILE_KEYS..]).for_each(|(x, &e)| *x = e * f);
                }
            }
        } else {
            recompute_probs::<FMA, W>(
                reps,
                &*q,
                nqp,
                d,
                b,
                positions,
                j0,
                kbv,
                (pos0, nq, window),
                scale,
                (&*m, &*l),
                s,
                probs,
            );
        }
        for r in 0..nq {
            agg(&probs[r * nreps * kbv..(r + 1) * nreps * kbv], nreps, &mut scores[j0..j0 + kbv]);
        }
    }
}

/// The column pass's probabilities of key tile `b` (keys `j0 .. j0 + kbv`)
/// computed again from the scores and the final per-row max and sum, when
/// the first pass's were too many to keep. Inlined into the caller, like
/// every generic helper of the kernel, so that it is compiled for the
/// caller's instruction set: out of line, `mul_add` would be a libm call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recompute_probs<const FMA: bool, const W: usize>(
    reps: &[TiledRep],
    q: &[f32],
    nqp: usize,
    d: usize,
    b: usize,
    positions: &[u32],
    j0: usize,
    kbv: usize,
    (pos0, nq, window): (u32, usize, Option<usize>),
    scale: f32,
    (m, l): (&[f32], &[f32]),
    s: &mut [f32],
    probs: &mut [f32],
) {
    let (pos, nreps) = (&positions[j0..j0 + kbv], reps.len());
    for (i, rep) in reps.iter().enumerate() {
        score_tile::<FMA, W>(&q[i * nqp * d..(i + 1) * nqp * d], nqp, &rep.packed_keys[b * d * TILE_KEYS..], d, s);
        for r in 0..nq {
            let vis = Visible::within(pos0 + r as u32, window);
            let (mr, inv) = (m[i * nq + r], 1.0 / l[i * nq + r]);
            let dst = &mut probs[(r * nreps + i) * kbv..][..kbv];
            for ((x, &sc), &p) in dst.iter_mut().zip(&s[r * TILE_KEYS..]).zip(pos) {
                *x = if vis.contains(p) { exp_score(sc * scale - mr) * inv } else { 0.0 };
            }
        }
    }
}

/// Scales a score row that its query sees whole and returns its maximum:
/// in 16 interleaved lanes, so the loop vectorizes (the maximum is the
/// same in any order; a NaN is skipped, as `f32::max` skips it).
#[inline(always)]
fn scale_max(row: &mut [f32], scale: f32) -> f32 {
    let pick = |a: f32, x: f32| if x > a { x } else { a };
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *x *= scale;
            *a = pick(*a, *x);
        }
    }
    for (a, x) in acc.iter_mut().zip(chunks.into_remainder()) {
        *x *= scale;
        *a = pick(*a, *x);
    }
    acc.into_iter().fold(f32::NEG_INFINITY, pick)
}

/// Σ x in 16 interleaved partial sums (so the loop vectorizes), then
/// added in lane order: deterministic, not the sequential sum's rounding.
#[inline(always)]
fn lane_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        acc.iter_mut().zip(c).for_each(|(a, &v)| *a += v);
    }
    acc.iter_mut().zip(chunks.remainder()).for_each(|(a, &v)| *a += v);
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend_group, weighted_values, DenseRows};
    use crate::test_util::Rng;

    /// The tiled prefill kernel against [`attend_group`] run per query
    /// (plus [`weighted_values`] for a member and per-row column sums):
    /// random data, odd head dims, windows, held slots in any order, and
    /// query counts / candidate counts across tile boundaries.
    #[test]
    fn tiled_prefill_matches_per_token_attention() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut rnd = move || rng.unit();
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
            let agg = |p: &[f32], g: usize, sc: &mut [f32]| {
                let n = sc.len();
                for h in 0..g {
                    sc.iter_mut().zip(&p[h * n..(h + 1) * n]).for_each(|(s, x)| *s += x);
                }
            };
            for recompute in [false, true] {
                let mut out = vec![f32::NAN; nq * qd];
                let mut cols = vec![0f32; len];
                let mut scratch = TiledScratch { recompute, ..TiledScratch::default() };
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
                let case = format!("d={d} old={old} nq={nq} extra={extra} window={window:?} recompute={recompute}");
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
}
