//! Group kernels for coded KV rows: one row (or a run of rows) read once
//! for all query heads of its group, converted in registers; the portable
//! set here, the SIMD sets in `simd/`, picked once per process.

use super::set::KvGroupKernels;
use super::KvDtype;
use crate::dot::Isa;

/// `n` consecutive coded rows: `codes` and `scales` start at the first,
/// rows are `stride` bytes and `spr` side values apart.
#[derive(Clone, Copy, Debug)]
pub struct KvRun<'a> {
    pub codes: &'a [u8],
    pub stride: usize,
    pub scales: &'a [f32],
    pub spr: usize,
    pub n: usize,
}

/// Portable group kernels: one fused per-row pass per head ([`KvDtype::dot`]
/// / [`KvDtype::axpy`]); the reference the SIMD sets are tested against.
fn scalar_dot<const K: u8>(data: &[u8], scales: &[f32], queries: &[f32], out: &mut [f32]) {
    let dt = [KvDtype::F16, KvDtype::Q8, KvDtype::Q4][K as usize];
    let d = queries.len().checked_div(out.len()).unwrap_or(0);
    let (data, scales) = (&data[..dt.data_bytes(d)], &scales[..dt.scale_count(d)]);
    for (h, o) in out.iter_mut().enumerate() {
        *o = dt.dot(data, scales, &queries[h * d..(h + 1) * d]);
    }
}

fn scalar_axpy<const K: u8>(data: &[u8], scales: &[f32], probs: &[f32], outs: &mut [f32]) {
    let dt = [KvDtype::F16, KvDtype::Q8, KvDtype::Q4][K as usize];
    let d = outs.len().checked_div(probs.len()).unwrap_or(0);
    let (data, scales) = (&data[..dt.data_bytes(d)], &scales[..dt.scale_count(d)]);
    for (h, &p) in probs.iter().enumerate() {
        dt.axpy(p, data, scales, &mut outs[h * d..(h + 1) * d]);
    }
}

impl KvGroupKernels {
    pub const SCALAR: KvGroupKernels = KvGroupKernels {
        isa: Isa::Scalar,
        dot: [scalar_dot::<0>, scalar_dot::<1>, scalar_dot::<2>],
        axpy: [scalar_axpy::<0>, scalar_axpy::<1>, scalar_axpy::<2>],
        dot_run: None,
        axpy_run: None,
    };

    /// The set for the instruction set `isa` (scalar, AVX2, AVX-512), if
    /// this CPU has it; others (NEON) have none, and callers fall back to
    /// scalar.
    pub fn for_isa(isa: Isa) -> Option<KvGroupKernels> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => crate::simd::avx512::kv_group_kernels(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => crate::simd::kv_group_kernels::<crate::simd::avx2::Avx2>(None),
            Isa::Scalar => Some(Self::SCALAR),
            _ => None,
        }
    }
}

static GROUP_KERNELS: std::sync::OnceLock<KvGroupKernels> = std::sync::OnceLock::new();

/// The group kernels matching [`crate::dot::kernels`] (so `KVSLIM_SIMD`
/// selects both), scalar where no SIMD set exists.
pub fn group_kernels() -> &'static KvGroupKernels {
    GROUP_KERNELS.get_or_init(|| KvGroupKernels::for_isa(crate::dot::kernels().isa).unwrap_or(KvGroupKernels::SCALAR))
}

impl KvDtype {
    /// `out[h] = queries_h · decode(row)` for `g = out.len()` query heads
    /// (`queries` is `g × d`), reading the row once. F32 uses
    /// [`crate::dot::dot`] per head (bit-identical to the dense path); the
    /// coded types use [`group_kernels`].
    #[inline]
    pub fn dot_group(self, data: &[u8], scales: &[f32], queries: &[f32], out: &mut [f32]) {
        self.group::<true>(data, scales, queries, out)
    }

    /// `outs_h += probs[h] · decode(row)` for `g = probs.len()` heads
    /// (`outs` is `g × d`), reading the row once. F32 skips zero weights
    /// and uses [`crate::dot::axpy`], like the dense path.
    #[inline]
    pub fn axpy_group(self, data: &[u8], scales: &[f32], probs: &[f32], outs: &mut [f32]) {
        self.group::<false>(data, scales, probs, outs)
    }

    /// [`KvDtype::dot_group`] (`DOT`: `a` the queries, `b` the scores) or
    /// [`KvDtype::axpy_group`] (`a` the weights, `b` the outputs).
    #[inline]
    fn group<const DOT: bool>(self, data: &[u8], scales: &[f32], a: &[f32], b: &mut [f32]) {
        let (heads, width) = if DOT { (b.len(), a.len()) } else { (a.len(), b.len()) };
        let d = width.checked_div(heads).unwrap_or(0);
        self.check(d, data.len(), scales.len());
        match self {
            KvDtype::F32 if DOT => {
                for (h, o) in b.iter_mut().enumerate() {
                    *o = self.dot(data, scales, &a[h * d..(h + 1) * d]);
                }
            }
            KvDtype::F32 => {
                for (h, &p) in a.iter().enumerate() {
                    if p != 0.0 {
                        self.axpy(p, data, scales, &mut b[h * d..(h + 1) * d]);
                    }
                }
            }
            _ => {
                let k = group_kernels();
                (if DOT { k.dot } else { k.axpy })[self as usize - 1](data, scales, a, b)
            }
        }
    }

    /// [`KvDtype::dot_group`] for the rows of a run: `out[j·g + h]` (`out`
    /// is `n × g`). Bit for bit the per-row results; the run kernels only
    /// do less work per row.
    pub fn dot_group_run(self, run: KvRun<'_>, queries: &[f32], out: &mut [f32]) {
        self.group_run::<true>(run, queries, out)
    }

    /// [`KvDtype::axpy_group`] for the rows of a run (`probs` is `n × g`),
    /// rows in order.
    pub fn axpy_group_run(self, run: KvRun<'_>, probs: &[f32], outs: &mut [f32]) {
        self.group_run::<false>(run, probs, outs)
    }

    /// A run through the set's run kernels (`DOT`: scores, else weighted
    /// sums; coded types, when the set has them) or row by row.
    fn group_run<const DOT: bool>(self, run: KvRun<'_>, a: &[f32], b: &mut [f32]) {
        let KvRun { codes, stride, scales, spr, n } = run;
        // dot: a = g·d queries, b = n·g scores; axpy: a = n·g weights, b = g·d outputs
        let (scores, width) = if DOT { (b.len(), a.len()) } else { (a.len(), b.len()) };
        let g = scores.checked_div(n).unwrap_or(0);
        let d = width.checked_div(g).unwrap_or(0);
        let row = self.data_bytes(d);
        let codes = &codes[..n.saturating_sub(1) * stride + if n > 0 { row } else { 0 }];
        let kernels = if DOT { group_kernels().dot_run } else { group_kernels().axpy_run };
        match kernels {
            Some(run) if self != KvDtype::F32 && n > 0 => run[self as usize - 1](codes, stride, scales, spr, a, b),
            _ => {
                for j in 0..n {
                    let (c, sc) = (&codes[j * stride..j * stride + row], &scales[j * spr..]);
                    if DOT {
                        self.dot_group(c, sc, a, &mut b[j * g..(j + 1) * g]);
                    } else {
                        self.axpy_group(c, sc, &a[j * g..(j + 1) * g], b);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvquant::tests::{dec, enc};
    use crate::test_util::Rng;

    /// Every group kernel set (scalar, AVX2, AVX-512 where present) against
    /// decode-then-f32 on random rows, for every dtype, odd head dims and
    /// group sizes that exercise the blocks of four heads.
    #[test]
    fn group_kernels_match_decode_then_f32() {
        let mut rng = Rng(0x2545_f491);
        let mut rnd = move || rng.unit() * 2.0;
        let sets: Vec<KvGroupKernels> =
            [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter_map(KvGroupKernels::for_isa).collect();
        for d in [1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63, 64, 65, 100, 128, 130, 256] {
            for g in [1, 2, 3, 4, 5, 7, 9] {
                let x: Vec<f32> = (0..d).map(|_| rnd()).collect();
                let q: Vec<f32> = (0..g * d).map(|_| rnd()).collect();
                let p: Vec<f32> = (0..g).map(|_| rnd().abs()).collect();
                let base: Vec<f32> = (0..g * d).map(|_| rnd()).collect();
                for k in KvDtype::ALL {
                    let (buf, sc) = enc(k, &x);
                    let y = dec(k, &buf, &sc, d);
                    let mut want_axpy = base.clone();
                    for h in 0..g {
                        crate::dot::axpy(p[h], &y, &mut want_axpy[h * d..(h + 1) * d]);
                    }
                    let mut runs: Vec<(&str, Vec<f32>, Vec<f32>)> = Vec::new();
                    let (mut o, mut a) = (vec![0f32; g], base.clone());
                    k.dot_group(buf.bytes(), &sc, &q, &mut o);
                    k.axpy_group(buf.bytes(), &sc, &p, &mut a);
                    runs.push(("dispatch", o, a));
                    if k != KvDtype::F32 {
                        for set in &sets {
                            let (mut o, mut a) = (vec![0f32; g], base.clone());
                            (set.dot[k as usize - 1])(buf.bytes(), &sc, &q, &mut o);
                            (set.axpy[k as usize - 1])(buf.bytes(), &sc, &p, &mut a);
                            runs.push((set.isa.name(), o, a));
                        }
                    }
                    for (isa, o, a) in runs {
                        for h in 0..g {
                            let qh = &q[h * d..(h + 1) * d];
                            let want = crate::dot::dot(qh, &y);
                            let mag: f32 = y.iter().zip(qh).map(|(u, v)| (u * v).abs()).sum();
                            assert!((o[h] - want).abs() <= 1e-5 * mag.max(1e-6), "{isa} {k} dot d={d} g={g} h={h}");
                            if k == KvDtype::F32 {
                                assert_eq!(o[h].to_bits(), want.to_bits(), "f32 group dot not bit-identical");
                            }
                        }
                        for (i, (&u, &w)) in a.iter().zip(&want_axpy).enumerate() {
                            let tol = 1e-5 * (base[i].abs() + (p[i / d] * y[i % d]).abs()).max(1e-6);
                            assert!((u - w).abs() <= tol, "{isa} {k} axpy d={d} g={g} i={i}: {u} vs {w}");
                        }
                    }
                }
            }
        }
    }

    /// Run kernels equal the per-row group kernels bit for bit: every coded
    /// type, head counts across the 8-head splits (Qwen2.5's 6 among them),
    /// widths with and without a 16-element tail, runs across the 16-row
    /// reduction, rows further apart than their size.
    #[test]
    fn run_kernels_equal_per_row_kernels_bit_for_bit() {
        let mut rng = Rng(99);
        let mut rnd = |n: usize| rng.vec(n, 1.5);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for dt in [KvDtype::F16, KvDtype::Q8, KvDtype::Q4] {
            for d in [64usize, 80, 256] {
                for g in [1usize, 3, 5, 6, 9] {
                    for n in [1usize, 5, 16, 17, 40] {
                        let (rb, spr) = (dt.data_bytes(d), dt.scale_count(d));
                        let stride = rb + 8;
                        let (mut codes, mut scales) = (vec![0u8; n * stride], vec![0f32; n * spr]);
                        for j in 0..n {
                            dt.encode(
                                &rnd(d),
                                &mut codes[j * stride..j * stride + rb],
                                &mut scales[j * spr..(j + 1) * spr],
                            );
                        }
                        let (queries, mut probs) = (rnd(g * d), rnd(n * g));
                        probs[0] = 0.0;
                        let (mut run, mut rows) = (vec![0f32; n * g], vec![0f32; n * g]);
                        let kv = KvRun { codes: &codes, stride, scales: &scales, spr, n };
                        dt.dot_group_run(kv, &queries, &mut run);
                        let start = rnd(g * d);
                        let (mut run_out, mut rows_out) = (start.clone(), start.clone());
                        dt.axpy_group_run(kv, &probs, &mut run_out);
                        for j in 0..n {
                            let (c, sc) = (&codes[j * stride..j * stride + rb], &scales[j * spr..(j + 1) * spr]);
                            dt.dot_group(c, sc, &queries, &mut rows[j * g..(j + 1) * g]);
                            let w = &probs[j * g..(j + 1) * g];
                            // the per-row path with every weight applied
                            for (h, &p) in w.iter().enumerate() {
                                let mut one = vec![0f32; d];
                                one.copy_from_slice(&rows_out[h * d..(h + 1) * d]);
                                dt.axpy_group(c, sc, &[p], &mut one);
                                rows_out[h * d..(h + 1) * d].copy_from_slice(&one);
                            }
                        }
                        let what = format!("{dt:?} d={d} g={g} n={n}");
                        assert_eq!(bits(&run), bits(&rows), "scores {what}");
                        assert_eq!(bits(&run_out), bits(&rows_out), "sums {what}");
                    }
                }
            }
        }
    }
}
