//! AVX-512 kernels (x86_64, 16 × f32 lanes), with masked loads for tails.
//!
//! Needs AVX-512F/BW/VL (masked 16-bit loads) plus the AVX2, FMA and F16C
//! features every AVX-512 CPU also has. Measured on Zen 4 (which executes
//! 512-bit operations on 256-bit units) the wider kernels win where they
//! save instructions: the Q4 formats (a 16-entry `vpermps` lookup replaces
//! mask/subtract/convert), Q8_0, f16, short f32 dots (attention) and the
//! 4×4 GEMM tile (32 registers hold 16 accumulators). bf16 rows and
//! dequantization keep the AVX2 code, which measured as fast or faster.
//!
//! Of the Q5 and K-quant formats only Q4_K has a 512-bit kernel (the same
//! 16-entry table lookup as Q4_0/Q4_1): `dotbench --kernels` measured it at
//! 7.6 GB/s against 4.4 for the AVX2 kernel (one shared machine, one run).
//! The others reuse the AVX2 kernels: 512-bit versions were not written or
//! measured yet (Q5_K could use a 32-entry `vpermt2ps` table; Q6_K's 64
//! values per group fit no single permute).

use crate::dot::set::{Isa, GEMM_MR, GEMM_NR};
use crate::dtype::DType;
use crate::simd::avx2::{self, Avx2};
use crate::simd::lanes::{self, HalfLanes, HalfRow};
use crate::simd::DotIsa;
use std::arch::x86_64::*;

// ---- helpers --------------------------------------------------------------

/// Mask of the low `n` lanes (`n < 16`).
#[inline(always)]
fn tail_mask(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

// ---- float rows -------------------------------------------------------------

/// The 16-lane AVX-512 vector of [`F32Lanes`]; tails use masked loads.
#[derive(Clone, Copy)]
pub(crate) struct Avx512;

lanes::f32_lanes!(Avx512, __m512, 16, splat: _mm512_set1_ps, load: _mm512_loadu_ps, store: _mm512_storeu_ps,
    fma: |a, b, c| _mm512_fmadd_ps(a, b, c), add: _mm512_add_ps, mul: _mm512_mul_ps, reduce: _mm512_reduce_add_ps,
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> __m512 {
        _mm512_maskz_loadu_ps(tail_mask(n), p)
    },
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: __m512) {
        _mm512_mask_storeu_ps(p, tail_mask(n), v)
    }
);

impl HalfLanes for Avx512 {
    #[inline(always)]
    unsafe fn half<const BF: bool>(p: *const u16) -> __m512 {
        half16::<BF>(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn half_part<const BF: bool>(p: *const u16, n: usize) -> __m512 {
        half16::<BF>(_mm256_maskz_loadu_epi16(tail_mask(n), p as *const i16))
    }
}

// 4×4 tile in one pass: 16 zmm accumulators, and each load feeds four FMAs.
crate::simd::isa_entries!(Avx512, #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")], dot4x4: 4, true);

/// 16 f16 (`BF` false) or bf16 (`BF` true) values as f32.
#[inline(always)]
unsafe fn half16<const BF: bool>(v: __m256i) -> __m512 {
    if BF {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    } else {
        _mm512_cvtph_ps(v)
    }
}

// ---- block formats ------------------------------------------------------------

/// Σ q·x over one Q8_0 block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q8_block(q: *const u8, x: *const f32) -> __m512 {
    let (q0, q1) = (Avx512::i8s(q), Avx512::i8s(q.add(16)));
    let a = _mm512_mul_ps(q0, _mm512_loadu_ps(x));
    _mm512_fmadd_ps(q1, _mm512_loadu_ps(x.add(16)), a)
}

/// The 32 nibbles of a Q4 block at `q` looked up in `table` (16 f32, one
/// per nibble value): elements 0–15 (low nibbles) and 16–31 (high nibbles).
/// `vpermps` reads only the low 4 bits of each index, so the low nibbles
/// need no mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn nibbles(q: *const u8, table: __m512) -> (__m512, __m512) {
    let r = _mm512_cvtepu8_epi32(_mm_loadu_si128(q as *const __m128i));
    (_mm512_permutexvar_ps(r, table), _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(r), table))
}

/// f32 values `base`, `base`+1, …, `base`+15.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn ramp(base: f32) -> __m512 {
    _mm512_add_ps(
        _mm512_set1_ps(base),
        _mm512_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0),
    )
}

/// The 16 values a Q4 block's nibbles stand for: d·(q−8) for Q4_0 (`MIN`
/// false; `q` is the ramp from −8), d·q + m for Q4_1 (`MIN` true).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q4_table<const MIN: bool>(p: *const u8, q: __m512) -> __m512 {
    if MIN {
        let (d, m) = avx2::scale_min::<Avx512>(p);
        _mm512_fmadd_ps(d, q, m)
    } else {
        _mm512_mul_ps(avx2::scale1::<Avx512>(p), q)
    }
}

/// Q4_K as a table lookup, like the Q4 kernels: each group's 16 possible
/// weights u·dl + off are built with one FMA, then the nibbles select them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_q4_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
    const BB: usize = 144;
    let q = ramp(0.0);
    let mut acc = [_mm512_setzero_ps(); 4];
    for b in 0..nb {
        let p = w.add(b * BB);
        avx2::prefetch_block(p, BB);
        let (dl, off) = avx2::k4_scales(p);
        let xb = x.add(b * 256);
        for c in 0..4 {
            let t_lo = _mm512_fmadd_ps(q, _mm512_set1_ps(dl[2 * c]), _mm512_set1_ps(off[2 * c]));
            let t_hi = _mm512_fmadd_ps(q, _mm512_set1_ps(dl[2 * c + 1]), _mm512_set1_ps(off[2 * c + 1]));
            let qs = p.add(16 + 32 * c);
            let r0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs as *const __m128i));
            let r1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(16) as *const __m128i));
            let xc = xb.add(64 * c);
            // vpermps reads only the low 4 bits of each index
            acc[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(r0, t_lo), _mm512_loadu_ps(xc), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(r1, t_lo), _mm512_loadu_ps(xc.add(16)), acc[1]);
            let (h0, h1) = (_mm512_srli_epi32::<4>(r0), _mm512_srli_epi32::<4>(r1));
            acc[2] = _mm512_fmadd_ps(_mm512_permutexvar_ps(h0, t_hi), _mm512_loadu_ps(xc.add(32)), acc[2]);
            acc[3] = _mm512_fmadd_ps(_mm512_permutexvar_ps(h1, t_hi), _mm512_loadu_ps(xc.add(48)), acc[3]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
}

// ---- packed-panel GEMM micro-kernel -------------------------------------------

/// 32 weight rows (two zmm) × `NT` tokens (≤ 12) of accumulators: at 12
/// tokens, 24 of the 32 zmm registers. Each step over `k` loads the two
/// weight vectors once and broadcasts each token's activation, so a load
/// feeds on average two FMAs, against one in a dot-product tile, and the
/// sums come out as whole vectors of 16 rows (no horizontal reductions).
/// Ragged token counts round up to 4 or 8 so short tails waste little.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn gemm_tile_impl<const NT: usize>(
    w: *const f32,
    x: *const f32,
    cols: usize,
    out: &mut [[f32; GEMM_MR]; GEMM_NR],
) {
    lanes::gemm_block::<Avx512, NT>(w, x, cols, 0, 0, out)
}

// ---- the kernel set --------------------------------------------------------

impl DotIsa for Avx512 {
    const ISA: Isa = Isa::Avx512;

    fn detected() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && Avx2::detected()
    }

    /// bf16: the AVX2 kernel, measured faster on Zen 4 (the 512-bit one
    /// spends more on widening).
    #[inline(always)]
    unsafe fn dot_half<const BF: bool>(w: *const u16, x: *const f32, n: usize) -> f32 {
        if BF {
            Avx2::dot_half::<true>(w, x, n)
        } else {
            lanes::dot::<Avx512, HalfRow<false>, false>(w, x, n)
        }
    }

    #[inline(always)]
    unsafe fn dot_q8_0(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let sum = avx2::dot_d_blocks::<Avx512>(
            (w, x, nb),
            34,
            #[inline(always)]
            |p0, p1| {
                avx2::prefetch(p0);
                avx2::prefetch(p1);
            },
            #[inline(always)]
            |q, x| q8_block(q, x),
        );
        _mm512_reduce_add_ps(sum)
    }

    /// Q4_0 (`MIN` false) and Q4_1 (`MIN` true) as a table lookup: the block's
    /// 16 possible values are built once, then each nibble selects its
    /// dequantized weight, so the product is exactly dequantize-then-dot.
    #[inline(always)]
    unsafe fn dot_q4<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        // block bytes and where the nibbles start: f16 d (Q4_0), f16 d and m (Q4_1)
        let (bb, head) = if MIN { (20, 4) } else { (18, 2) };
        let q = ramp(if MIN { 0.0 } else { -8.0 });
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut b = 0;
        while b + 2 <= nb {
            let (p0, p1) = (w.add(b * bb), w.add((b + 1) * bb));
            avx2::prefetch(p0);
            let (lo0, hi0) = nibbles(p0.add(head), q4_table::<MIN>(p0, q));
            let (lo1, hi1) = nibbles(p1.add(head), q4_table::<MIN>(p1, q));
            let xb = x.add(b * 32);
            for (k, v) in [lo0, hi0, lo1, hi1].into_iter().enumerate() {
                acc[k] = _mm512_fmadd_ps(v, _mm512_loadu_ps(xb.add(16 * k)), acc[k]);
            }
            b += 2;
        }
        if b < nb {
            let p = w.add(b * bb);
            let (lo, hi) = nibbles(p.add(head), q4_table::<MIN>(p, q));
            let xb = x.add(b * 32);
            for (k, v) in [lo, hi].into_iter().enumerate() {
                acc[k] = _mm512_fmadd_ps(v, _mm512_loadu_ps(xb.add(16 * k)), acc[k]);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
    }

    // Q5 and K-quants but Q4_K: the AVX2 kernels (see the module comment)

    #[inline(always)]
    unsafe fn dot_q5<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        Avx2::dot_q5::<MIN>(w, x, nb)
    }

    #[inline(always)]
    unsafe fn dot_q2_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        Avx2::dot_q2_k(w, x, nb)
    }

    #[inline(always)]
    unsafe fn dot_q3_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        Avx2::dot_q3_k(w, x, nb)
    }

    #[inline(always)]
    unsafe fn dot_q45_k<const FIVE: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        if FIVE {
            Avx2::dot_q45_k::<true>(w, x, nb)
        } else {
            dot_q4_k(w, x, nb)
        }
    }

    #[inline(always)]
    unsafe fn dot_q6_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        Avx2::dot_q6_k(w, x, nb)
    }

    // dequantization: the AVX2 code (see the module comment)

    #[inline(always)]
    unsafe fn deq_half<const BF: bool>(s: *const u8, o: *mut f32, n: usize) {
        Avx2::deq_half::<BF>(s, o, n)
    }

    #[inline(always)]
    unsafe fn deq_q8_0(s: *const u8, o: *mut f32, nb: usize) {
        Avx2::deq_q8_0(s, o, nb)
    }

    #[inline(always)]
    unsafe fn deq_q4<const MIN: bool>(s: *const u8, o: *mut f32, nb: usize) {
        Avx2::deq_q4::<MIN>(s, o, nb)
    }

    #[inline(always)]
    unsafe fn deq_other(dt: DType, s: *const u8, o: *mut f32, nb: usize) -> bool {
        Avx2::deq_other(dt, s, o, nb)
    }

    fn gemm_tile(w: &[f32], x: &[f32], nt: usize, out: &mut [[f32; GEMM_MR]; GEMM_NR]) {
        let cols = (w.len() / GEMM_MR).min(x.len() / GEMM_NR);
        // SAFETY: see the note above the wrappers; the kernel reads
        // cols·GEMM_MR weights and cols·GEMM_NR activations.
        unsafe {
            match nt {
                0 => {}
                1..=4 => gemm_tile_impl::<4>(w.as_ptr(), x.as_ptr(), cols, out),
                5..=8 => gemm_tile_impl::<8>(w.as_ptr(), x.as_ptr(), cols, out),
                _ => gemm_tile_impl::<GEMM_NR>(w.as_ptr(), x.as_ptr(), cols, out),
            }
        }
    }
}

// ---- KV cache rows: group dot / axpy on coded rows -----------------------
//
// The 16-lane versions of the AVX2 group kernels (see there): a scale
// group of 32 is two vectors; tails (`d % 16`) use the scalar element
// decode. For f16 rows one `vcvtph2ps` converts 16 elements.

use crate::simd::lanes::{kv_elem, kv_load, KvLanes, KV_F16, KV_Q4, KV_Q8};

impl KvLanes for Avx512 {
    #[inline(always)]
    unsafe fn i8s(p: *const u8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
    }
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(avx2::nibble_bytes(_mm_loadl_epi64(p.cast()))))
    }
}

lanes::kv_isa!(Avx512, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");

/// The AVX-512 KV group kernels, when the CPU has every feature they use.
pub(crate) fn kv_group_kernels() -> Option<crate::kvquant::set::KvGroupKernels> {
    crate::simd::kv_group_kernels::<Avx512>(Some((
        [kv_dot_run::<KV_F16>, kv_dot_run::<KV_Q8>, kv_dot_run::<KV_Q4>],
        [kv_axpy_run::<KV_F16>, kv_axpy_run::<KV_Q8>, kv_axpy_run::<KV_Q4>],
    )))
}

// ---- runs of consecutive coded rows ----------------------------------------
//
// The same per-row arithmetic as `lanes::kv_dot` / `lanes::kv_axpy`, bit for
// bit, with less work per row: scores sum 16 rows' accumulators at once
// (a transposed reduction that pairs lanes as `_mm512_reduce_add_ps` does),
// and weighted sums keep each 16-column slice of every head's output in a
// register across the run instead of loading and storing it per row.

/// Rows per reduction of [`kv_dot_run`].
const RUN: usize = 16;

/// Lane `j` of the result is the sum of `v[j]`'s lanes, added in the order
/// of `_mm512_reduce_add_ps`: (i, i+8), then (i, i+4), (i, i+2), (i, i+1).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn transpose_sum16(v: &[__m512; RUN]) -> __m512 {
    let pair =
        |a: __m512, b: __m512| _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
    let t: [__m512; 8] = std::array::from_fn(|k| pair(v[2 * k], v[2 * k + 1]));
    let quad =
        |a: __m512, b: __m512| _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
    let u: [__m512; 4] = std::array::from_fn(|m| quad(t[2 * m], t[2 * m + 1]));
    let w0 = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u[0], u[1]), _mm512_shuffle_ps::<0xEE>(u[0], u[1]));
    let w1 = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u[2], u[3]), _mm512_shuffle_ps::<0xEE>(u[2], u[3]));
    let z = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(w0, w1), _mm512_shuffle_ps::<0xDD>(w0, w1));
    // lane 4k + l holds row 4l + k
    let rows = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(rows, z)
}

/// `f::<K, N>(args)` with the const `N` = `n` from 1 to 8 (more counts as
/// 8): each count of heads or tokens gets its own unrolled kernel.
macro_rules! up_to_8 {
    ($n:expr, $f:ident::<$k:ident>($($arg:expr),*)) => {
        match $n {
            1 => $f::<$k, 1>($($arg),*),
            2 => $f::<$k, 2>($($arg),*),
            3 => $f::<$k, 3>($($arg),*),
            4 => $f::<$k, 4>($($arg),*),
            5 => $f::<$k, 5>($($arg),*),
            6 => $f::<$k, 6>($($arg),*),
            7 => $f::<$k, 7>($($arg),*),
            _ => $f::<$k, 8>($($arg),*),
        }
    };
}

/// The operands of a run kernel: `n` rows (codes at `data`, side values
/// at `scales`, `stride` bytes and `spr` values apart), `g` heads of width
/// `d`, the queries or weights `a` and the outputs `out`, both from the
/// first head the call computes.
#[derive(Clone, Copy)]
struct RunArgs {
    data: *const u8,
    stride: usize,
    scales: *const f32,
    spr: usize,
    n: usize,
    g: usize,
    d: usize,
    a: *const f32,
    out: *mut f32,
}

impl RunArgs {
    /// Row `j`'s codes and side values.
    #[inline(always)]
    unsafe fn row(self, j: usize) -> (*const u8, *const f32) {
        (self.data.add(j * self.stride), self.scales.add(j * self.spr))
    }
}

/// Scores of `n ≤ 16` rows for `N` heads (`a` the queries):
/// `out[j·g + h]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn kv_dot_run_impl<const T: u8, const N: usize>(r: RunArgs) {
    let (d, q) = (r.d, r.a);
    let full = d / 16 * 16;
    let mut accs = [[_mm512_setzero_ps(); RUN]; N];
    // SAFETY: the caller checked n rows of `stride` bytes / `spr` side
    // values and N query rows of d.
    unsafe {
        for j in 0..r.n {
            let (rd, rs) = r.row(j);
            let mut acc = [_mm512_setzero_ps(); N];
            let mut i = 0;
            while i < full {
                let k = kv_load::<Avx512, T>(rd, rs, i);
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(k, _mm512_loadu_ps(q.add(h * d + i)), *a);
                }
                i += 16;
            }
            for (slot, a) in accs.iter_mut().zip(acc) {
                slot[j] = a;
            }
        }
        for (h, a) in accs.iter().enumerate() {
            let mut sums = [0f32; RUN];
            _mm512_storeu_ps(sums.as_mut_ptr(), transpose_sum16(a));
            for (j, &sum) in sums.iter().enumerate().take(r.n) {
                let (rd, rs) = r.row(j);
                let mut s = sum;
                for e in full..d {
                    s += kv_elem::<T>(rd, rs, e) * *q.add(h * d + e);
                }
                *r.out.add(j * r.g + h) = s;
            }
        }
    }
}

/// `outs_h += Σ_j p[j·g + h] · row_j` for `N` heads over `n` rows (`a` the
/// weights `p`), in row order (zero weights included: `0·v` adds nothing
/// to a finite sum).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn kv_axpy_run_impl<const T: u8, const N: usize>(r: RunArgs) {
    let (d, p, out) = (r.d, r.a, r.out);
    let full = d / 16 * 16;
    // SAFETY: as in `kv_dot_run_impl`; `out` holds N rows of d.
    unsafe {
        let mut i = 0;
        while i < full {
            let mut acc: [__m512; N] = std::array::from_fn(|h| _mm512_loadu_ps(out.add(h * d + i)));
            for j in 0..r.n {
                let (rd, rs) = r.row(j);
                let v = kv_load::<Avx512, T>(rd, rs, i);
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(j * r.g + h)), v, *a);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(h * d + i), *a);
            }
            i += 16;
        }
        for j in 0..r.n {
            let (rd, rs) = r.row(j);
            for e in full..d {
                let v = kv_elem::<T>(rd, rs, e);
                for h in 0..N {
                    *out.add(h * d + e) += *p.add(j * r.g + h) * v;
                }
            }
        }
    }
}

/// Scores of a run of rows (see `crate::kvquant::KvRunFn`).
fn kv_dot_run<const T: u8>(codes: &[u8], stride: usize, scales: &[f32], spr: usize, queries: &[f32], out: &mut [f32]) {
    let (n, g, d) =
        crate::kvquant::set::check_run(T, codes.len(), stride, scales.len(), spr, queries.len(), out.len(), true);
    for r0 in (0..n).step_by(RUN) {
        let (data, scales) = (codes.as_ptr().wrapping_add(r0 * stride), scales.as_ptr().wrapping_add(r0 * spr));
        let mut h = 0;
        while h < g {
            // up to 8 heads per pass over the rows, so a group of 6 (Qwen2.5)
            // converts each f16 or quantized row once, not once per 4 heads
            let m = (g - h).min(8);
            let (a, out) = (queries[h * d..].as_ptr(), out[r0 * g + h..].as_mut_ptr());
            let r = RunArgs { data, stride, scales, spr, n: (n - r0).min(RUN), g, d, a, out };
            // SAFETY: reachable only after AVX-512 detection; `check_run`
            // bounded every row, query and output read or written.
            unsafe { up_to_8!(m, kv_dot_run_impl::<T>(r)) }
            h += m;
        }
    }
}

/// Weighted sums over a run of rows (see `crate::kvquant::KvRunFn`).
fn kv_axpy_run<const T: u8>(codes: &[u8], stride: usize, scales: &[f32], spr: usize, probs: &[f32], outs: &mut [f32]) {
    let (n, g, d) =
        crate::kvquant::set::check_run(T, codes.len(), stride, scales.len(), spr, probs.len(), outs.len(), false);
    let (data, scales) = (codes.as_ptr(), scales.as_ptr());
    let mut h = 0;
    while h < g {
        let m = (g - h).min(8);
        let (a, out) = (probs[h..].as_ptr(), outs[h * d..].as_mut_ptr());
        let r = RunArgs { data, stride, scales, spr, n, g, d, a, out };
        // SAFETY: as in `kv_dot_run`.
        unsafe { up_to_8!(m, kv_axpy_run_impl::<T>(r)) }
        h += m;
    }
}

// ---- integer products on repacked block weights (VNNI) -------------------

use crate::int8::layout::{self, Activations, Tile, TILE_TOKENS};

/// The VNNI micro-kernel of [`crate::int8`], when the CPU has AVX-512 VNNI
/// besides the features of this module.
pub(crate) fn int8_tile() -> Option<layout::TileFn> {
    (Avx512::detected() && is_x86_feature_detected!("avx512vnni")).then_some(int8_tile_dispatch as layout::TileFn)
}

fn int8_tile_dispatch(dtype: DType, panel: &[u8], x: &Activations, t0: usize, nt: usize, out: &mut Tile) {
    let (q, d, s, h, cols) = x.parts();
    let blocks = cols / crate::quant::QK;
    assert!(panel.len() >= layout::panel_bytes(dtype, cols), "int8 panel too short");
    assert!(nt <= TILE_TOKENS && (t0 + nt) * cols <= q.len() && (t0 + nt) * blocks <= d.len().min(s.len()));
    // only Q6_K reads the half sums (and only for it are they computed)
    assert!(dtype != DType::Q6_K || 2 * (t0 + nt) * blocks <= h.len(), "Q6_K needs the activations' half sums");
    let p = Int8Args {
        panel: panel.as_ptr(),
        blocks,
        q: q.as_ptr(),
        d: d.as_ptr(),
        s: s.as_ptr(),
        h: h.as_ptr(),
        cols,
        t0,
    };
    // SAFETY: reachable only through `int8_tile`, after feature detection;
    // the asserts above bound every read.
    unsafe {
        match dtype {
            _ if nt == 0 => {}
            DType::Q8_0 => int8_nt::<{ DType::Q8_0 as u8 }>(p, nt, out),
            DType::Q4_0 => int8_nt::<{ DType::Q4_0 as u8 }>(p, nt, out),
            DType::Q4_1 => int8_nt::<{ DType::Q4_1 as u8 }>(p, nt, out),
            DType::Q5_0 => int8_nt::<{ DType::Q5_0 as u8 }>(p, nt, out),
            DType::Q5_1 => int8_nt::<{ DType::Q5_1 as u8 }>(p, nt, out),
            DType::Q4_K => int8_nt::<{ DType::Q4_K as u8 }>(p, nt, out),
            DType::Q5_K => int8_nt::<{ DType::Q5_K as u8 }>(p, nt, out),
            DType::Q6_K => int8_nt::<{ DType::Q6_K as u8 }>(p, nt, out),
            _ => unreachable!("{dtype} has no integer path"),
        }
    }
}

/// Tiles of at least this many tokens prefetch the weights ahead: their
/// integer sums take long enough per block that the hardware prefetcher
/// alone leaves the stream from memory idle between blocks (a decode step's
/// one token streams at the memory's rate without help).
const PREFETCH_MIN_TOKENS: usize = 3;
/// How far ahead (bytes) the weights are prefetched.
const PREFETCH_AHEAD: usize = 4096;

/// Prefetches the cache lines `PREFETCH_AHEAD` bytes after a block of
/// `len` bytes at `blk` (addresses past the matrix are harmless: a
/// prefetch never faults).
#[inline(always)]
unsafe fn prefetch_block(blk: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PREFETCH_AHEAD + off) as *const i8);
        off += 64;
    }
}

#[derive(Clone, Copy)]
struct Int8Args {
    panel: *const u8,
    blocks: usize,
    q: *const i8,
    d: *const f32,
    s: *const f32,
    h: *const i32,
    cols: usize,
    t0: usize,
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn int8_nt<const KIND: u8>(p: Int8Args, nt: usize, out: &mut Tile) {
    up_to_8!(nt, int8_impl::<KIND>(p, out))
}

/// 16 rows (one per lane) × `NT` tokens. Per block: the integer sums of
/// 32 products per (row, token) with `vpdpbusd` (the 4-bit quants are split
/// into low and high nibbles, the 5-bit formats' bit planes added back
/// with masked byte adds, Q6_K's crumbs joined by a bitwise select, each
/// lane's four bytes against four broadcast activation bytes),
/// then `acc = isum·(d·dx) + acc` and `acc = m·sx + acc` (Q6_K: per half
/// `acc = (isum_h − 32·Σx_h)·(d_h·dx) + acc`), exactly as
/// `int8::scalar_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn int8_impl<const KIND: u8, const NT: usize>(p: Int8Args, out: &mut Tile) {
    let dtype = DType::ALL[KIND as usize];
    let (hb, planes) = (layout::header_bytes(dtype), layout::planes(dtype));
    let split = dtype == DType::Q6_K;
    let low = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); NT];
    let k_quant = dtype.is_k_quant();
    let (mut d, mut neg_dmin) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for b in 0..p.blocks {
        // the block, and the header holding its f16 `d` (a K-quant's
        // super-block header, converted once per 8 blocks)
        let (at, dh) = layout::block_at(dtype, b);
        let (blk, dh) = (p.panel.add(at), p.panel.add(dh));
        if NT >= PREFETCH_MIN_TOKENS {
            prefetch_block(blk, layout::block_bytes(dtype));
        }
        let f16_at = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(dh.add(at) as *const __m256i));
        if !k_quant || b % 8 == 0 {
            d = f16_at(0);
            if matches!(dtype, DType::Q4_K | DType::Q5_K) {
                let sign = _mm512_set1_epi32(i32::MIN);
                let dmin = _mm512_castps_si512(f16_at(layout::MIN_OFFSET));
                neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(dmin, sign));
            }
        }
        let bytes_at = |at: usize| _mm_loadu_si128(blk.add(at) as *const __m128i);
        let (d, m) = match dtype {
            DType::Q4_K | DType::Q5_K => {
                // d·sc and −dmin·m, as `int8::scale_min`
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes_at(layout::K_SCALE_OFFSET)));
                let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes_at(layout::K_MIN_OFFSET)));
                (_mm512_mul_ps(d, sc), _mm512_mul_ps(neg_dmin, mn))
            }
            DType::Q6_K => {
                let s0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes_at(layout::K_SCALE_OFFSET)));
                let s1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes_at(layout::K_MIN_OFFSET)));
                (_mm512_mul_ps(d, s0), _mm512_mul_ps(d, s1))
            }
            DType::Q4_1 | DType::Q5_1 => (d, f16_at(layout::MIN_OFFSET)),
            DType::Q4_0 => (d, _mm512_mul_ps(d, _mm512_set1_ps(-8.0))),
            DType::Q5_0 => (d, _mm512_mul_ps(d, _mm512_set1_ps(-16.0))),
            _ => (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0))),
        };
        let quants = blk.add(hb);
        // Integer sums in independent chains: a decode step (one or two
        // tokens) would otherwise wait on `vpdpbusd`'s latency once per
        // 64 bytes of weights. Exact integers: the order does not matter.
        let chains = if NT <= 2 { 2 } else { 1 };
        let mut lo_sums = [[_mm512_setzero_si512(); NT]; 2];
        let mut hi_sums = [[_mm512_setzero_si512(); NT]; 2];
        let xat = |t: usize, k: usize| -> __m512i {
            let at = p.q.add((p.t0 + t) * p.cols + b * 32 + k) as *const i32;
            _mm512_set1_epi32(at.read_unaligned())
        };
        if dtype == DType::Q8_0 {
            for j in 0..8 {
                let w = _mm512_loadu_si512(quants.add(64 * j) as *const __m512i);
                let c = j % chains;
                for (t, s) in lo_sums[c].iter_mut().enumerate() {
                    *s = _mm512_dpbusd_epi32(*s, w, xat(t, 4 * j));
                }
            }
        } else if split {
            // Q6_K: per pair of nibble vectors one crumb vector; each 2-bit
            // field shifted to bits 4–5 and masked, then `(nibble & 0x0f) |
            // field` in one ternary-logic select (int8::layout::crumb_at)
            let m30 = _mm512_set1_epi8(0x30);
            for v in 0..2 {
                let cr = _mm512_loadu_si512(quants.add(layout::NIBBLES + 64 * v) as *const __m512i);
                let fields = [
                    _mm512_and_si512(_mm512_slli_epi16(cr, 4), m30),
                    _mm512_and_si512(_mm512_slli_epi16(cr, 2), m30),
                    _mm512_and_si512(cr, m30),
                    _mm512_and_si512(_mm512_srli_epi16(cr, 2), m30),
                ];
                for half in 0..2 {
                    let j = 2 * v + half;
                    let w = _mm512_loadu_si512(quants.add(64 * j) as *const __m512i);
                    // (a & c) | b
                    let lo = _mm512_ternarylogic_epi32(w, fields[2 * half], low, 0xEC);
                    let hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), fields[2 * half + 1], low, 0xEC);
                    let c = j % chains;
                    for t in 0..NT {
                        lo_sums[c][t] = _mm512_dpbusd_epi32(lo_sums[c][t], lo, xat(t, 4 * j));
                        hi_sums[c][t] = _mm512_dpbusd_epi32(hi_sums[c][t], hi, xat(t, 16 + 4 * j));
                    }
                }
            }
        } else {
            let mask = |plane: usize, j: usize| -> __mmask64 {
                let at = quants.add(layout::NIBBLES + plane * layout::PLANE + 8 * j) as *const u64;
                _cvtu64_mask64(at.read_unaligned())
            };
            for j in 0..4 {
                let w = _mm512_loadu_si512(quants.add(64 * j) as *const __m512i);
                let mut lo = _mm512_and_si512(w, low);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
                for plane in 0..planes {
                    let bit = _mm512_set1_epi8(16 << plane);
                    lo = _mm512_mask_add_epi8(lo, mask(plane, j), lo, bit);
                    hi = _mm512_mask_add_epi8(hi, mask(plane, 4 + j), hi, bit);
                }
                let c = j % chains;
                for t in 0..NT {
                    lo_sums[c][t] = _mm512_dpbusd_epi32(lo_sums[c][t], lo, xat(t, 4 * j));
                    // more tokens: fewer registers (Q6_K keeps its halves apart)
                    let s = if split || NT <= 2 { &mut hi_sums[c][t] } else { &mut lo_sums[c][t] };
                    *s = _mm512_dpbusd_epi32(*s, hi, xat(t, 16 + 4 * j));
                }
            }
        }
        let mut isum = [_mm512_setzero_si512(); NT];
        let mut isum_hi = [_mm512_setzero_si512(); NT];
        for t in 0..NT {
            isum[t] = _mm512_add_epi32(lo_sums[0][t], lo_sums[1][t]);
            isum_hi[t] = _mm512_add_epi32(hi_sums[0][t], hi_sums[1][t]);
            if !split {
                isum[t] = _mm512_add_epi32(isum[t], isum_hi[t]);
            }
        }
        for (t, a) in acc.iter_mut().enumerate() {
            let at = (p.t0 + t) * p.blocks + b;
            let dx = _mm512_set1_ps(*p.d.add(at));
            if split {
                let h0 = _mm512_set1_epi32(32 * *p.h.add(2 * at));
                let h1 = _mm512_set1_epi32(32 * *p.h.add(2 * at + 1));
                let s0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], h0));
                let s1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum_hi[t], h1));
                *a = _mm512_fmadd_ps(s0, _mm512_mul_ps(d, dx), *a);
                *a = _mm512_fmadd_ps(s1, _mm512_mul_ps(m, dx), *a);
            } else {
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), *a);
                *a = _mm512_fmadd_ps(m, _mm512_set1_ps(*p.s.add(at)), *a);
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// `int8::quantize_blocks` with 512-bit vectors, bit for bit (the maximum
/// is exact in any order, the scale and products are the same IEEE
/// operations, `vcvtps2dq` rounds ties to even).
pub(crate) fn int8_quantize(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.len() / 32;
    assert!(q.len() >= blocks * 32 && d.len() >= blocks && s.len() >= blocks);
    assert!(int8_tile().is_some(), "int8_quantize needs the features of int8_tile");
    // SAFETY: features checked above; every block index is below `blocks`.
    unsafe { int8_quantize_impl(x.as_ptr(), blocks, q.as_mut_ptr(), d.as_mut_ptr(), s.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn int8_quantize_impl(x: *const f32, blocks: usize, q: *mut i8, d: *mut f32, s: *mut f32) {
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    for b in 0..blocks {
        let v0 = _mm512_loadu_ps(x.add(32 * b));
        let v1 = _mm512_loadu_ps(x.add(32 * b + 16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let scale = amax / 127.0;
        let inv = _mm512_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let r0 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
        let r1 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))));
        _mm_storeu_si128(q.add(32 * b) as *mut __m128i, _mm512_cvtepi32_epi8(r0));
        _mm_storeu_si128(q.add(32 * b + 16) as *mut __m128i, _mm512_cvtepi32_epi8(r1));
        *d.add(b) = scale;
        *s.add(b) = scale * _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1)) as f32;
    }
}
