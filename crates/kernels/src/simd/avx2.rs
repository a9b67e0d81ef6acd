//! AVX2 + FMA + F16C kernels (x86_64, 8 × f32 lanes).
//!
//! Float rows run four independent accumulators over 32 elements per step;
//! the remaining `n % 8` elements are copied into a zero-padded stack buffer
//! and finished with one more vector step. Block formats process two blocks
//! per step into two accumulators so the per-block `acc += d·Σ` FMAs do not
//! form a single latency chain. Also here: the 4×4 GEMM tile (two 4×2
//! passes, to fit 16 registers) and bit-exact row dequantization.
//!
//! Some functions are `pub(super)` so the AVX-512 set can reuse them; it
//! only does so after checking that AVX2, FMA and F16C are present too.

use crate::dot::set::{Isa, GEMM_MR, GEMM_NR};
use crate::dtype::DType;
use crate::f16::f16_to_f32;
use crate::simd::lanes::{self, F32Lanes, HalfLanes};
use crate::simd::DotIsa;
use std::arch::x86_64::*;
use std::ptr;

// ---- helpers --------------------------------------------------------------

/// How far ahead, in bytes, the Q4 kernels (both sets) and the AVX-512 Q8_0
/// kernel prefetch their weight row. Measured on Zen 4 with weights from
/// DRAM: 2 KiB ahead raised the AVX-512 block kernels by 15–30 % (the
/// hardware prefetchers alone leave them short), was neutral to slightly
/// positive for the AVX2 Q4 kernels, and cost the AVX2 Q8_0 and every float
/// kernel, which therefore do not prefetch. Prefetches never fault, so
/// running past the end of the row or matrix is harmless.
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// Prefetches the weight byte `PREFETCH_AHEAD` after `p` into L1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Reads a little-endian u16 at any alignment.
#[inline(always)]
pub(super) unsafe fn rd16(p: *const u8) -> u16 {
    u16::from_le(ptr::read_unaligned(p as *const u16))
}

/// The two f16 packed in `h` (the first in the low half) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x2(h: u32) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 values at `p0` and `p1`, each broadcast to the lanes of `L`.
#[inline(always)]
pub(super) unsafe fn scales2<L: F32Lanes>(p0: *const u8, p1: *const u8) -> (L::V, L::V) {
    let (a, b) = f16x2(rd16(p0) as u32 | (rd16(p1) as u32) << 16);
    (L::splat(a), L::splat(b))
}

/// The f16 value at `p`, broadcast.
#[inline(always)]
pub(super) unsafe fn scale1<L: F32Lanes>(p: *const u8) -> L::V {
    L::splat(f16x2(rd16(p) as u32).0)
}

/// d and m of the Q4_1 block at `p` (its first two f16), broadcast.
#[inline(always)]
pub(super) unsafe fn scale_min<L: F32Lanes>(p: *const u8) -> (L::V, L::V) {
    let (d, m) = f16x2(rd32(p));
    (L::splat(d), L::splat(m))
}

/// Loads 8 i8 at `p` widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

// ---- float rows -------------------------------------------------------------

/// The 8-lane AVX2 vector of [`F32Lanes`](super::lanes::F32Lanes).
#[derive(Clone, Copy)]
pub(crate) struct Avx2;

lanes::f32_lanes!(Avx2, __m256, 8, splat: _mm256_set1_ps, load: _mm256_loadu_ps, store: _mm256_storeu_ps,
    fma: |a, b, c| _mm256_fmadd_ps(a, b, c), add: _mm256_add_ps, mul: _mm256_mul_ps, reduce: hsum);

lanes::int_lanes!(Avx2, __m256i, bytes: u8x8, splat: |v| _mm256_set1_epi32(v as i32), and: _mm256_and_si256, or: _mm256_or_si256,
    shl: _mm256_slli_epi32, shr: _mm256_srli_epi32);

impl HalfLanes for Avx2 {
    /// bf16 is the top half of an f32.
    #[inline(always)]
    unsafe fn half<const BF: bool>(p: *const u16) -> __m256 {
        let v = _mm_loadu_si128(p as *const __m128i);
        if BF {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
        } else {
            _mm256_cvtph_ps(v)
        }
    }
}

// 4×4 tile: two passes of 4 × 2: eight accumulators plus four weight and
// two activation registers fit the 16 ymm registers, and each weight load
// feeds two FMAs.
crate::simd::isa_entries!(Avx2, #[target_feature(enable = "avx2,fma,f16c")], dot4x4: 2, false);

// ---- block formats ------------------------------------------------------------

/// Σ q·x over one Q8_0 block (quants at `q`, 32 activations at `x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_block(q: *const u8, x: *const f32) -> __m256 {
    let a = _mm256_mul_ps(i8x8(q), _mm256_loadu_ps(x));
    let a = _mm256_fmadd_ps(i8x8(q.add(8)), _mm256_loadu_ps(x.add(8)), a);
    let b = _mm256_mul_ps(i8x8(q.add(16)), _mm256_loadu_ps(x.add(16)));
    let b = _mm256_fmadd_ps(i8x8(q.add(24)), _mm256_loadu_ps(x.add(24)), b);
    _mm256_add_ps(a, b)
}

/// The 32 nibbles of a Q4 block at `q` as four vectors of i32 lanes:
/// elements 0–7, 8–15 (low nibbles) and 16–23, 24–31 (high nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(q: *const u8) -> [__m256i; 4] {
    let m = _mm256_set1_epi32(0x0f);
    let r0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q as *const __m128i));
    let r1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8) as *const __m128i));
    [_mm256_and_si256(r0, m), _mm256_and_si256(r1, m), _mm256_srli_epi32::<4>(r0), _mm256_srli_epi32::<4>(r1)]
}

/// Σ (q−8)·x over one Q4_0 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_block(q: *const u8, x: *const f32) -> __m256 {
    let [n0, n1, n2, n3] = nibbles(q);
    let e = _mm256_set1_epi32(8);
    let f0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(n0, e));
    let f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(n1, e));
    let f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(n2, e));
    let f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(n3, e));
    let a = _mm256_mul_ps(f0, _mm256_loadu_ps(x));
    let a = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x.add(8)), a);
    let b = _mm256_mul_ps(f2, _mm256_loadu_ps(x.add(16)));
    let b = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x.add(24)), b);
    _mm256_add_ps(a, b)
}

/// Σ w·x over `nb` blocks of `bb` bytes that hold an f16 scale d and 32
/// quants (Q8_0, Q4_0), with `L`'s lanes: d times `sum(quants,
/// activations)`, two blocks a step into alternating accumulators (two
/// independent FMA chains), `fetch(p0, p1)` first for each pair; returns
/// the two accumulators summed.
#[inline(always)]
pub(super) unsafe fn dot_d_blocks<L: F32Lanes>(
    (w, x, nb): (*const u8, *const f32, usize),
    bb: usize,
    fetch: impl Fn(*const u8, *const u8),
    sum: impl Fn(*const u8, *const f32) -> L::V,
) -> L::V {
    let mut acc = [L::zero(); 2];
    let mut b = 0;
    while b + 2 <= nb {
        let (p0, p1) = (w.add(b * bb), w.add((b + 1) * bb));
        fetch(p0, p1);
        let (d0, d1) = scales2::<L>(p0, p1);
        acc[0] = L::fma(d0, sum(p0.add(2), x.add(b * 32)), acc[0]);
        acc[1] = L::fma(d1, sum(p1.add(2), x.add(b * 32 + 32)), acc[1]);
        b += 2;
    }
    if b < nb {
        let p = w.add(b * bb);
        acc[0] = L::fma(scale1::<L>(p), sum(p.add(2), x.add(b * 32)), acc[0]);
    }
    L::add(acc[0], acc[1])
}

/// (Σ q·x, Σ x) over one Q4_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_block(q: *const u8, x: *const f32) -> (__m256, __m256) {
    let [n0, n1, n2, n3] = nibbles(q);
    let (x0, x1) = (_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)));
    let (x2, x3) = (_mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24)));
    let a = _mm256_mul_ps(_mm256_cvtepi32_ps(n0), x0);
    let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n1), x1, a);
    let b = _mm256_mul_ps(_mm256_cvtepi32_ps(n2), x2);
    let b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n3), x3, b);
    let xs = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
    (_mm256_add_ps(a, b), xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(w: *const u8, x: *const f32, nb: usize) -> f32 {
    const BB: usize = 20;
    // Σ d·q·x of even and odd blocks, then Σ m·x of even and odd blocks
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut b = 0;
    while b + 2 <= nb {
        let (p0, p1) = (w.add(b * BB), w.add((b + 1) * BB));
        prefetch(p0);
        let (d0, m0) = scale_min::<Avx2>(p0);
        let (d1, m1) = scale_min::<Avx2>(p1);
        let (s0, x0) = q4_1_block(p0.add(4), x.add(b * 32));
        let (s1, x1) = q4_1_block(p1.add(4), x.add(b * 32 + 32));
        acc[0] = _mm256_fmadd_ps(d0, s0, acc[0]);
        acc[1] = _mm256_fmadd_ps(d1, s1, acc[1]);
        acc[2] = _mm256_fmadd_ps(m0, x0, acc[2]);
        acc[3] = _mm256_fmadd_ps(m1, x1, acc[3]);
        b += 2;
    }
    if b < nb {
        let p = w.add(b * BB);
        let (d, m) = scale_min::<Avx2>(p);
        let (s, xs) = q4_1_block(p.add(4), x.add(b * 32));
        acc[0] = _mm256_fmadd_ps(d, s, acc[0]);
        acc[2] = _mm256_fmadd_ps(m, xs, acc[2]);
    }
    hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
}

// ---- Q5 and K-quant formats -------------------------------------------------
//
// Every kernel turns 8 quants at a time into i32 lanes u (unsigned), forms
// the weights as u·dl + off with one FMA (dl the group's scale, off its
// offset: −dmin·m for the formats with minimums, −16·d, −32·dl or −4·dl for
// the signed ones, whose quants are stored with a bias) and multiplies them
// into an accumulator with a second FMA. The group scales of a super-block
// are computed once, as scalars, into small arrays that the loop broadcasts
// from. Weights are the dequantized ones up to one rounding (the fused
// u·dl + off), so the dot agrees with dequantize-then-dot to rounding.

/// 8 bytes at `p` zero-extended to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8x8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// `acc + (u·dl + off)·x` over 8 lanes (x at `x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma_q(u: __m256i, dl: f32, off: f32, x: *const f32, acc: __m256) -> __m256 {
    let w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_set1_ps(dl), _mm256_set1_ps(off));
    _mm256_fmadd_ps(w, _mm256_loadu_ps(x), acc)
}

/// Logical right shift of every lane by `n` (a loop constant once unrolled).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shr(v: __m256i, n: i32) -> __m256i {
    _mm256_srl_epi32(v, _mm_cvtsi32_si128(n))
}

/// Prefetches the lines of a `bytes`-long super-block `PREFETCH_AHEAD`
/// bytes after `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_block(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        prefetch(p.wrapping_add(o));
        o += 64;
    }
}

/// `d` times the 8 unsigned bytes of `b` (little-endian), stored to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_bytes(b: u64, d: f32, out: *mut f32) {
    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(b as i64)));
    _mm256_storeu_ps(out, _mm256_mul_ps(v, _mm256_set1_ps(d)));
}

/// `d` times (the 8 signed bytes at `p` minus `bias`), stored to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_i8(p: *const u8, bias: i32, d: f32, out: *mut f32) {
    let v = _mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)), _mm256_set1_epi32(bias));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d)));
}

/// Little-endian u32 at `p` (any alignment).
#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    u32::from_le(ptr::read_unaligned(p as *const u32))
}

/// Group scales d·s and offsets −dmin·m of the Q4_K/Q5_K super-block at
/// `p` (which starts with d, dmin and the 12 packed scale bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_scales(p: *const u8) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = f16x2(rd32(p));
    // the 6-bit scales and mins of groups 0-3 and 4-7, one byte each
    // (see quant::k4_scale_min), unpacked four at a time
    let (w0, w1, w2) = (rd32(p.add(4)), rd32(p.add(8)), rd32(p.add(12)));
    let s_lo = w0 & 0x3f3f_3f3f;
    let s_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let m_lo = w1 & 0x3f3f_3f3f;
    let m_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    let (mut dl, mut off) = ([0f32; 8], [0f32; 8]);
    // −(dmin·m) is (−dmin)·m exactly
    scaled_bytes(s_lo as u64 | (s_hi as u64) << 32, d, dl.as_mut_ptr());
    scaled_bytes(m_lo as u64 | (m_hi as u64) << 32, -dmin, off.as_mut_ptr());
    (dl, off)
}

/// The loop of the K-quant kernels: each super-block `p` of `dt` (its
/// lines prefetched ahead) with its 256 activations `xb`; `block(p, xb,
/// acc)` adds the super-block's products into the eight accumulators.
#[inline(always)]
unsafe fn k_quant_dot(
    (w, x, nb): (*const u8, *const f32, usize),
    dt: DType,
    block: unsafe fn(*const u8, *const f32, &mut [__m256; 8]),
) -> f32 {
    let bb = dt.block_bytes();
    let mut acc = [_mm256_setzero_ps(); 8];
    for b in 0..nb {
        let p = w.add(b * bb);
        prefetch_block(p, bb);
        block(p, x.add(b * 256), &mut acc);
    }
    hsum8(&acc)
}

/// Q2_K: element 128h + 32j + l is bits 2j of byte 32h + l; group e/16
/// has scale d·(s & 15) and offset −dmin·(s >> 4).
#[inline(always)]
unsafe fn q2_k_block(p: *const u8, xb: *const f32, acc: &mut [__m256; 8]) {
    let m3 = _mm256_set1_epi32(3);
    let (d, dmin) = f16x2(rd32(p.add(80)));
    let (lo, hi) = (ptr::read_unaligned(p as *const u64), ptr::read_unaligned(p.add(8) as *const u64));
    let k4 = 0x0f0f_0f0f_0f0f_0f0f;
    let (mut dl, mut off) = ([0f32; 16], [0f32; 16]);
    scaled_bytes(lo & k4, d, dl.as_mut_ptr());
    scaled_bytes(hi & k4, d, dl.as_mut_ptr().add(8));
    // −(dmin·m) is (−dmin)·m exactly
    scaled_bytes((lo >> 4) & k4, -dmin, off.as_mut_ptr());
    scaled_bytes((hi >> 4) & k4, -dmin, off.as_mut_ptr().add(8));
    for h in 0..2 {
        for lc in 0..4 {
            let r = u8x8(p.add(16 + 32 * h + 8 * lc));
            for j in 0..4 {
                let g = 8 * h + 2 * j + lc / 2;
                let u = _mm256_and_si256(shr(r, 2 * j as i32), m3);
                let a = &mut acc[2 * j + (lc & 1)];
                *a = fma_q(u, dl[g], off[g], xb.add(128 * h + 32 * j + 8 * lc), *a);
            }
        }
    }
}

/// Q3_K: as Q2_K's layout plus a high bit 4h + j in hmask byte l; group
/// scale d·(s − 32), offset −4 times that (u = low | high << 2 is q + 4).
#[inline(always)]
unsafe fn q3_k_block(p: *const u8, xb: *const f32, acc: &mut [__m256; 8]) {
    let m3 = _mm256_set1_epi32(3);
    let four = _mm256_set1_epi32(4);
    let d = f16_to_f32(rd16(p.add(108)));
    // the 16 6-bit scales (see quant::q3_k_scale), four at a time
    let (a0, a1, a2) = (rd32(p.add(96)), rd32(p.add(100)), rd32(p.add(104)));
    let k4 = 0x0f0f_0f0f;
    let k2 = 0x0303_0303;
    let s = [
        (a0 & k4) | ((a2 & k2) << 4),
        (a1 & k4) | (((a2 >> 2) & k2) << 4),
        ((a0 >> 4) & k4) | (((a2 >> 4) & k2) << 4),
        ((a1 >> 4) & k4) | (((a2 >> 6) & k2) << 4),
    ];
    let sb = [s[0] as u64 | (s[1] as u64) << 32, s[2] as u64 | (s[3] as u64) << 32];
    let (mut dl, mut off) = ([0f32; 16], [0f32; 16]);
    // −4·dl is exact; the bytes are below 64, so signed = unsigned
    scaled_i8(sb.as_ptr() as *const u8, 32, d, dl.as_mut_ptr());
    scaled_i8((sb.as_ptr() as *const u8).add(8), 32, d, dl.as_mut_ptr().add(8));
    scaled_i8(sb.as_ptr() as *const u8, 32, -4.0 * d, off.as_mut_ptr());
    scaled_i8((sb.as_ptr() as *const u8).add(8), 32, -4.0 * d, off.as_mut_ptr().add(8));
    for lc in 0..4 {
        let hm = u8x8(p.add(8 * lc));
        for h in 0..2 {
            let r = u8x8(p.add(32 + 32 * h + 8 * lc));
            for j in 0..4 {
                let g = 8 * h + 2 * j + lc / 2;
                let lo = _mm256_and_si256(shr(r, 2 * j as i32), m3);
                // bit 4h + j of hmask moved to bit 2
                let hi = _mm256_and_si256(_mm256_slli_epi32::<2>(shr(hm, (4 * h + j) as i32)), four);
                let a = &mut acc[2 * j + h];
                *a = fma_q(_mm256_or_si256(lo, hi), dl[g], off[g], xb.add(128 * h + 32 * j + 8 * lc), *a);
            }
        }
    }
}

/// Q4_K (`FIVE` false) or Q5_K (`FIVE` true): chunk c of 64 elements reads
/// 32 nibble bytes; low nibbles are group 2c, high nibbles group 2c + 1;
/// Q5_K's fifth bit of element 32g + l is bit g of qh byte l.
#[inline(always)]
unsafe fn q45_k_block<const FIVE: bool>(p: *const u8, xb: *const f32, acc: &mut [__m256; 8]) {
    let qs_at = if FIVE { 48 } else { 16 };
    let m4 = _mm256_set1_epi32(0x0f);
    let b4 = _mm256_set1_epi32(0x10);
    let (dl, off) = k4_scales(p);
    for c in 0..4 {
        let q = p.add(qs_at + 32 * c);
        for k in 0..4 {
            let r = u8x8(q.add(8 * k));
            let mut lo = _mm256_and_si256(r, m4);
            let mut hi = _mm256_srli_epi32::<4>(r);
            if FIVE {
                let h = shr(u8x8(p.add(16 + 8 * k)), 2 * c as i32);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32::<4>(h), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32::<3>(h), b4));
            }
            let xc = xb.add(64 * c + 8 * k);
            // four accumulators: eight would spill (16 ymm registers)
            let a = 2 * (k & 1);
            acc[a] = fma_q(lo, dl[2 * c], off[2 * c], xc, acc[a]);
            acc[a + 1] = fma_q(hi, dl[2 * c + 1], off[2 * c + 1], xc.add(32), acc[a + 1]);
        }
    }
}

/// Q6_K: element 128h + 32k + l: nibble k / 2 of ql byte 64h + 32(k % 2) + l,
/// bits 2k of qh byte 32h + l; group e/16 scale d·s, offset −32 times that.
#[inline(always)]
unsafe fn q6_k_block(p: *const u8, xb: *const f32, acc: &mut [__m256; 8]) {
    let d = f16_to_f32(rd16(p.add(208)));
    let (mut dl, mut off) = ([0f32; 16], [0f32; 16]);
    scaled_i8(p.add(192), 0, d, dl.as_mut_ptr());
    scaled_i8(p.add(200), 0, d, dl.as_mut_ptr().add(8));
    // −32·dl is exact
    scaled_i8(p.add(192), 0, -32.0 * d, off.as_mut_ptr());
    scaled_i8(p.add(200), 0, -32.0 * d, off.as_mut_ptr().add(8));
    for h in 0..2 {
        for lc in 0..4 {
            let u = lanes::q6_quants::<Avx2>(p, h, 8 * lc);
            for (k, uk) in u.iter().enumerate() {
                let g = 8 * h + 2 * k + lc / 2;
                let a = &mut acc[k];
                *a = fma_q(*uk, dl[g], off[g], xb.add(128 * h + 32 * k + 8 * lc), *a);
            }
        }
    }
}
/// Sum of eight accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum8(a: &[__m256; 8]) -> f32 {
    let s0 = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    let s1 = _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7]));
    hsum(_mm256_add_ps(s0, s1))
}

// ---- packed-panel GEMM micro-kernel -------------------------------------------

/// 16 of the panel's 32 weight rows (two ymm) × `NT` tokens starting at
/// token `j0`: at 6 tokens, 12 accumulators plus two weight vectors and a
/// broadcast fill the 16 ymm registers. Writes `out[j0 + j][half..half+16]`
/// for `j < NT` while `j0 + j < GEMM_NR`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_tile_impl<const NT: usize>(
    w: *const f32,
    x: *const f32,
    cols: usize,
    half: usize,
    j0: usize,
    out: &mut [[f32; GEMM_MR]; GEMM_NR],
) {
    // callers keep j0 + NT ≤ GEMM_NR, so every read stays in this k's tokens
    lanes::gemm_block::<Avx2, NT>(w, x, cols, half, j0, out)
}

// ---- dequantization: Q5 and K-quant formats ------------------------------------
//
// Bit-identical to `quant::dequantize`: the per-group scales are the same
// scalar f32 expressions as there, and each element is formed with the
// same sequence of roundings (a product, then a separate add or subtract;
// never a fused multiply-add). Only the integer unpacking is vectorised,
// 8 elements at a time into i32 lanes, which is exact.

/// Bits `shift..shift + width` of the 8 bytes at `p`, as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits8(p: *const u8, shift: i32, mask: i32) -> __m256i {
    _mm256_and_si256(shr(u8x8(p), shift), _mm256_set1_epi32(mask))
}

/// Bit `first + lane` of `word` in each lane `lane` < 8, as 0 or 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn word_bits(word: u32, first: i32) -> __m256i {
    let idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first));
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word as i32), idx), _mm256_set1_epi32(1))
}

/// Stores `dl·q − ml` (`ml` `None`: `dl·q`) for 8 integer lanes at `o`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_scaled(o: *mut f32, q: __m256i, dl: f32, ml: Option<f32>) {
    let v = _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_cvtepi32_ps(q));
    let v = match ml {
        Some(m) => _mm256_sub_ps(v, _mm256_set1_ps(m)),
        None => v,
    };
    _mm256_storeu_ps(o, v);
}

/// Q5_0 (`MIN` false: d·(q − 16)) or Q5_1 (`MIN` true: d·q + m).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deq_q5_block<const MIN: bool>(b: &[u8], o: *mut f32) {
    let head = if MIN { 4 } else { 2 };
    let p = b.as_ptr();
    let (d, m) = if MIN { scale_min::<Avx2>(p) } else { (scale1::<Avx2>(p), _mm256_setzero_ps()) };
    let qh = rd32(p.add(head));
    let qs = p.add(head + 4);
    for e0 in [0usize, 8] {
        let lo = _mm256_or_si256(bits8(qs.add(e0), 0, 0x0f), _mm256_slli_epi32::<4>(word_bits(qh, e0 as i32)));
        let hi = _mm256_or_si256(bits8(qs.add(e0), 4, 0x0f), _mm256_slli_epi32::<4>(word_bits(qh, 16 + e0 as i32)));
        for (k, q) in [(e0, lo), (e0 + 16, hi)] {
            let v = if MIN {
                _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m)
            } else {
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16))))
            };
            _mm256_storeu_ps(o.add(k), v);
        }
    }
}

/// f16 at byte `at` of `b` (as `quant`'s scalar code reads it).
#[inline]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The 256 elements of a super-block of 16 groups of 16 (Q2_K, Q3_K,
/// Q6_K) stored to `o`: group g's scale and offset `scale(g)` (as
/// [`store_scaled`] takes them) times the quants `quants(h, j, l)` of its
/// elements 128h + 32j + l .. l + 8 (j = (g mod 8) / 2; l = 16 (g mod 2),
/// then 8 more).
#[inline(always)]
unsafe fn deq_groups16(
    o: *mut f32,
    scale: impl Fn(usize) -> (f32, Option<f32>),
    quants: impl Fn(usize, usize, usize) -> __m256i,
) {
    for g in 0..16 {
        let (dl, ml) = scale(g);
        let (h, j, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for half8 in [0, 8] {
            store_scaled(o.add(16 * g + half8), quants(h, j, l0 + half8), dl, ml);
        }
    }
}

/// Q2_K: x = (d·s)·q − (dmin·m) per group of 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deq_q2_k_block(b: &[u8], o: *mut f32) {
    let (d, dmin) = (half(b, 80), half(b, 82));
    let qs = b.as_ptr().add(16);
    deq_groups16(
        o,
        #[inline(always)]
        |g| (d * (b[g] & 0x0f) as f32, Some(dmin * (b[g] >> 4) as f32)),
        #[inline(always)]
        |h, j, l| bits8(qs.add(32 * h + l), 2 * j as i32, 3),
    );
}

/// Q3_K: x = (d·(s − 32))·(lo − 4·(1 − high)) per group of 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deq_q3_k_block(b: &[u8], o: *mut f32) {
    let d = half(b, 108);
    let (hm, qs) = (b.as_ptr(), b.as_ptr().add(32));
    deq_groups16(
        o,
        #[inline(always)]
        |g| (d * (crate::quant::q3_k_scale(&b[96..108], g) as i32 - 32) as f32, None),
        #[inline(always)]
        |h, j, l| {
            let lo = bits8(qs.add(32 * h + l), 2 * j as i32, 3);
            let high = bits8(hm.add(l), (4 * h + j) as i32, 1);
            // lo − 4 + 4·high: subtracts 4 exactly when the high bit is clear
            _mm256_add_epi32(_mm256_sub_epi32(lo, _mm256_set1_epi32(4)), _mm256_slli_epi32::<2>(high))
        },
    );
}

/// Q4_K (`FIVE` false) or Q5_K (`FIVE` true): x = (d·s)·q − (dmin·m) per
/// group of 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deq_q45_k_block<const FIVE: bool>(b: &[u8], o: *mut f32) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let sc = &b[4..16];
    let qh = b.as_ptr().add(16);
    let qs = b.as_ptr().add(if FIVE { 48 } else { 16 });
    for g in 0..8 {
        let (sv, mv) = crate::quant::k4_scale_min(sc, g);
        let (dl, ml) = (d * sv as f32, dmin * mv as f32);
        let shift = 4 * (g % 2) as i32;
        for l in (0..32).step_by(8) {
            let mut q = bits8(qs.add(32 * (g / 2) + l), shift, 0x0f);
            if FIVE {
                q = _mm256_or_si256(q, _mm256_slli_epi32::<4>(bits8(qh.add(l), g as i32, 1)));
            }
            store_scaled(o.add(32 * g + l), q, dl, Some(ml));
        }
    }
}

/// Q6_K: x = (d·s)·(q − 32) per group of 16 (group g's quants: nibble
/// k / 2 of ql byte 64h + 32(k mod 2) + l, bits 2k of qh byte 32h + l,
/// k = (g mod 8) / 2).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deq_q6_k_block(b: &[u8], o: *mut f32) {
    let d = half(b, 208);
    deq_groups16(
        o,
        #[inline(always)]
        |g| (d * (b[192 + g] as i8) as f32, None),
        #[inline(always)]
        |h, k, l| {
            let lo = bits8(b.as_ptr().add(64 * h + 32 * (k % 2) + l), 4 * (k / 2) as i32, 0x0f);
            let hi = bits8(b.as_ptr().add(128 + 32 * h + l), 2 * k as i32, 3);
            _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)), _mm256_set1_epi32(32))
        },
    );
}

// ---- the kernel set --------------------------------------------------------

impl DotIsa for Avx2 {
    const ISA: Isa = Isa::Avx2;

    fn detected() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    #[inline(always)]
    unsafe fn dot_q8_0(w: *const u8, x: *const f32, nb: usize) -> f32 {
        hsum(dot_d_blocks::<Avx2>(
            (w, x, nb),
            34,
            |_, _| {},
            #[inline(always)]
            |q, x| q8_block(q, x),
        ))
    }

    /// Q4_0 prefetches (the nibble unpacking leaves the loads time to land).
    #[inline(always)]
    unsafe fn dot_q4<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        if MIN {
            dot_q4_1(w, x, nb)
        } else {
            hsum(dot_d_blocks::<Avx2>(
                (w, x, nb),
                18,
                #[inline(always)]
                |p0, _| prefetch(p0),
                #[inline(always)]
                |q, x| q4_0_block(q, x),
            ))
        }
    }

    /// Q5_0 (`MIN` false: u·d − 16d) or Q5_1 (`MIN` true: u·d + m), one
    /// 32-element block per step into four accumulators.
    #[inline(always)]
    unsafe fn dot_q5<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let (bb, head) = if MIN { (24, 8) } else { (22, 6) };
        let m4 = _mm256_set1_epi32(0x0f);
        let one = _mm256_set1_epi32(1);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let p = w.add(b * bb);
            prefetch(p);
            let d = f16_to_f32(rd16(p));
            let off = if MIN { f16_to_f32(rd16(p.add(2))) } else { -16.0 * d };
            let qh = _mm256_set1_epi32(ptr::read_unaligned(p.add(head - 4) as *const i32));
            let q = p.add(head);
            let (r0, r1) = (u8x8(q), u8x8(q.add(8)));
            let nib = [
                _mm256_and_si256(r0, m4),
                _mm256_and_si256(r1, m4),
                _mm256_srli_epi32::<4>(r0),
                _mm256_srli_epi32::<4>(r1),
            ];
            let xb = x.add(b * 32);
            for (k, nk) in nib.iter().enumerate() {
                // fifth bit of element 8k + lane is bit 8k + lane of qh
                let idx = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * k as i32));
                let hb = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(qh, idx), one));
                acc[k] = fma_q(_mm256_or_si256(*nk, hb), d, off, xb.add(8 * k), acc[k]);
            }
        }
        hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
    }

    #[inline(always)]
    unsafe fn dot_q2_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        k_quant_dot((w, x, nb), DType::Q2_K, q2_k_block)
    }

    #[inline(always)]
    unsafe fn dot_q3_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        k_quant_dot((w, x, nb), DType::Q3_K, q3_k_block)
    }

    #[inline(always)]
    unsafe fn dot_q45_k<const FIVE: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        k_quant_dot((w, x, nb), if FIVE { DType::Q5_K } else { DType::Q4_K }, q45_k_block::<FIVE>)
    }

    #[inline(always)]
    unsafe fn dot_q6_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        k_quant_dot((w, x, nb), DType::Q6_K, q6_k_block)
    }

    #[inline(always)]
    unsafe fn deq_q8_0(s: *const u8, o: *mut f32, nb: usize) {
        for b in 0..nb {
            let p = s.add(b * 34);
            let d = scale1::<Avx2>(p);
            for k in 0..4 {
                _mm256_storeu_ps(o.add(b * 32 + k * 8), _mm256_mul_ps(d, i8x8(p.add(2 + k * 8))));
            }
        }
    }

    /// Q4_0 (`MIN` false: d·(q−8)) or Q4_1 (`MIN` true: d·q + m, rounded as
    /// the scalar code: product, then sum).
    #[inline(always)]
    unsafe fn deq_q4<const MIN: bool>(s: *const u8, o: *mut f32, nb: usize) {
        let bb = if MIN { 20 } else { 18 };
        let eight = _mm256_set1_epi32(8);
        for b in 0..nb {
            let p = s.add(b * bb);
            let ob = o.add(b * 32);
            if MIN {
                let (d, m) = scale_min::<Avx2>(p);
                let q = nibbles(p.add(4));
                for (k, v) in q.iter().enumerate() {
                    let f = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(*v)), m);
                    _mm256_storeu_ps(ob.add(k * 8), f);
                }
            } else {
                let d = scale1::<Avx2>(p);
                let q = nibbles(p.add(2));
                for (k, v) in q.iter().enumerate() {
                    let f = _mm256_cvtepi32_ps(_mm256_sub_epi32(*v, eight));
                    _mm256_storeu_ps(ob.add(k * 8), _mm256_mul_ps(d, f));
                }
            }
        }
    }

    /// Q5_0/Q5_1 and the K-quants, a block at a time.
    #[inline(always)]
    unsafe fn deq_other(dt: DType, s: *const u8, o: *mut f32, nb: usize) -> bool {
        let (bb, be) = (dt.block_bytes(), dt.block_elems());
        for b in 0..nb {
            let (blk, o) = (std::slice::from_raw_parts(s.add(b * bb), bb), o.add(b * be));
            match dt {
                DType::Q5_0 => deq_q5_block::<false>(blk, o),
                DType::Q5_1 => deq_q5_block::<true>(blk, o),
                DType::Q2_K => deq_q2_k_block(blk, o),
                DType::Q3_K => deq_q3_k_block(blk, o),
                DType::Q4_K => deq_q45_k_block::<false>(blk, o),
                DType::Q5_K => deq_q45_k_block::<true>(blk, o),
                DType::Q6_K => deq_q6_k_block(blk, o),
                _ => return false,
            }
        }
        true
    }

    fn gemm_tile(w: &[f32], x: &[f32], nt: usize, out: &mut [[f32; GEMM_MR]; GEMM_NR]) {
        let cols = (w.len() / GEMM_MR).min(x.len() / GEMM_NR);
        let nt = nt.min(GEMM_NR);
        // SAFETY: see the note above the wrappers; the kernel reads
        // cols·GEMM_MR weights and cols·GEMM_NR activations.
        unsafe {
            for half in [0, 16] {
                let mut j = 0;
                while j < nt {
                    if nt - j > 3 {
                        gemm_tile_impl::<6>(w.as_ptr().add(half), x.as_ptr().add(j), cols, half, j, out);
                    } else {
                        gemm_tile_impl::<3>(w.as_ptr().add(half), x.as_ptr().add(j), cols, half, j, out);
                    }
                    j += if nt - j > 3 { 6 } else { 3 };
                }
            }
        }
    }
}

// ---- KV cache rows: group dot / axpy on coded rows -----------------------
//
// Attention reads each cached K (V) row once for the `g` query heads that
// share its KV head. These kernels convert 8 stored elements (f16, int8 ×
// group scale, or 4-bit × scale + min) to f32 in registers and use them for
// every head of a block of up to four heads, so the row is never written
// out as f32 (the decode-then-dot path wrote and re-read `d` floats a row).

impl lanes::KvLanes for Avx2 {
    #[inline(always)]
    unsafe fn i8s(p: *const u8) -> __m256 {
        i8x8(p)
    }
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256 {
        let b = _mm_cvtsi32_si128(ptr::read_unaligned(p.cast::<i32>()));
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibble_bytes(b)))
    }
}

/// The nibbles of the low 8 bytes of `v` as 16 bytes, element order: as
/// u16 lanes b, (b & 15) | (b << 4 & 0xf00) puts the low then the high
/// nibble into consecutive bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nibble_bytes(v: __m128i) -> __m128i {
    let b = _mm_cvtepu8_epi16(v);
    _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x0f)), _mm_and_si128(_mm_slli_epi16::<4>(b), _mm_set1_epi16(0x0f00)))
}

lanes::kv_isa!(Avx2, "avx2,fma,f16c");
