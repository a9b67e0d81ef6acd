//! NEON kernels (aarch64, 4 × f32 lanes).
//!
//! Uses only intrinsics stable since Rust 1.59. Half-precision weights are
//! widened with integer operations (no `float16x4_t`), exactly like the
//! scalar conversion: subnormals, infinities and NaNs included.
//!
//! On other architectures the module is compiled for tests only, over the
//! scalar stand-ins of `neon_mock`, so the kernels' logic (lane order,
//! nibble layout, tails) is checked by the x86 test suite too.

#[cfg(not(target_arch = "aarch64"))]
use super::neon_mock::*;
use crate::dot::set::Isa;
use crate::f16::f16_to_f32;
use crate::simd::lanes;
use crate::simd::DotIsa;
#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
use std::ptr;

// ---- helpers --------------------------------------------------------------

/// Reads the little-endian f16 at `p` (any alignment) as f32.
#[inline(always)]
unsafe fn half_at(p: *const u8) -> f32 {
    f16_to_f32(u16::from_le(ptr::read_unaligned(p as *const u16)))
}

/// Four binary16 values (zero-extended to u32 lanes) as f32, exactly.
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn f16x4(h: uint32x4_t) -> float32x4_t {
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let em = vandq_u32(h, vdupq_n_u32(0x7fff));
    let shifted = vshlq_n_u32::<13>(em);
    // finite values (subnormals too): rebias the exponent by multiplying
    // with 2^112; the product is exact
    let finite = vreinterpretq_u32_f32(vmulq_f32(
        vreinterpretq_f32_u32(shifted),
        vreinterpretq_f32_u32(vdupq_n_u32(0x7780_0000)),
    ));
    // infinities and NaNs: maximal exponent, mantissa kept
    let special = vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000));
    let is_special = vcgeq_u32(em, vdupq_n_u32(0x7c00));
    vreinterpretq_f32_u32(vorrq_u32(sign, vbslq_u32(is_special, special, finite)))
}

/// Four bfloat16 values (zero-extended to u32 lanes) as f32.
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn bf16x4(h: uint32x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vshlq_n_u32::<16>(h))
}

// ---- float rows -------------------------------------------------------------

/// The 4-lane NEON vector of [`F32Lanes`] (on other architectures, the
/// scalar stand-ins of `neon_mock`).
#[derive(Clone, Copy)]
pub(crate) struct Neon;

lanes::f32_lanes!(Neon, float32x4_t, 4, splat: vdupq_n_f32, load: vld1q_f32, store: vst1q_f32,
    fma: |a, b, c| vfmaq_f32(c, a, b), add: vaddq_f32, mul: vmulq_f32, reduce: vaddvq_f32);

// 4×4 tile in one pass: 16 accumulators of the 32 vector registers; each
// load feeds four FMAs.
lanes::int_lanes!(Neon, uint8x16_t, bytes: vld1q_u8, splat: |v| vdupq_n_u8(v), and: vandq_u8, or: vorrq_u8, shl: vshlq_n_u8,
    shr: vshrq_n_u8);

impl lanes::HalfLanes for Neon {
    /// Any alignment (`dequantize` reads f16 bytes from anywhere).
    #[inline(always)]
    unsafe fn half<const BF: bool>(p: *const u16) -> float32x4_t {
        let h = vmovl_u16(vld1_u16(ptr::read_unaligned(p.cast::<[u16; 4]>()).as_ptr()));
        if BF {
            bf16x4(h)
        } else {
            f16x4(h)
        }
    }
}

crate::simd::isa_entries!(Neon, #[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))], dot4x4: 4, false);

// ---- block formats ------------------------------------------------------------

/// 16 signed or unsigned bytes, widened exactly to four f32 vectors.
trait Bytes16: Copy {
    unsafe fn widen(self) -> [float32x4_t; 4];
}

/// Implements [`Bytes16`] for `$t` with its widening intrinsics (low and
/// high halves, 8 to 16 and 16 to 32 bits, then to f32).
macro_rules! bytes16 {
    ($t:ty, $low8:ident, $wide8:ident, $high8:ident, $low16:ident, $wide16:ident, $high16:ident, $cvt:ident) => {
        impl Bytes16 for $t {
            #[inline(always)]
            unsafe fn widen(self) -> [float32x4_t; 4] {
                let (lo, hi) = ($wide8($low8(self)), $high8(self));
                [$cvt($wide16($low16(lo))), $cvt($high16(lo)), $cvt($wide16($low16(hi))), $cvt($high16(hi))]
            }
        }
    };
}
bytes16!(int8x16_t, vget_low_s8, vmovl_s8, vmovl_high_s8, vget_low_s16, vmovl_s16, vmovl_high_s16, vcvtq_f32_s32);
bytes16!(uint8x16_t, vget_low_u8, vmovl_u8, vmovl_high_u8, vget_low_u16, vmovl_u16, vmovl_high_u16, vcvtq_f32_u32);

/// Σ q·x over 16 bytes `q` and 16 activations at `x`, as a vector of
/// partial sums.
#[inline(always)]
unsafe fn dot_bytes(q: impl Bytes16, x: *const f32) -> float32x4_t {
    let f = q.widen();
    let a = vfmaq_f32(vmulq_f32(f[0], vld1q_f32(x)), f[1], vld1q_f32(x.add(4)));
    let b = vfmaq_f32(vmulq_f32(f[2], vld1q_f32(x.add(8))), f[3], vld1q_f32(x.add(12)));
    vaddq_f32(a, b)
}

/// Σ of 16 activations at `x`, as a vector of partial sums.
#[inline(always)]
unsafe fn sum16(x: *const f32) -> float32x4_t {
    vaddq_f32(vaddq_f32(vld1q_f32(x), vld1q_f32(x.add(4))), vaddq_f32(vld1q_f32(x.add(8)), vld1q_f32(x.add(12))))
}

/// (Σ q·x, Σ x) over 16 bytes `q` and 16 activations at `x`.
#[inline(always)]
unsafe fn dot_sum(q: impl Bytes16, x: *const f32) -> (float32x4_t, float32x4_t) {
    (dot_bytes(q, x), sum16(x))
}

/// `d` times 16 bytes, stored to `out` (16 f32).
#[inline(always)]
unsafe fn scaled_bytes(q: impl Bytes16, d: f32, out: *mut f32) {
    store16(out, q.widen().map(|v| vmulq_n_f32(v, d)));
}

/// The loop of the 32-element block formats (Q8_0, Q4_0/Q4_1, Q5_0/Q5_1;
/// `bb`-byte blocks starting with the f16 scale d): `quants(p)` gives the
/// block's 16 low-half and 16 high-half quants as stored. The signed
/// formats (`MIN` false) subtract `BIAS` and add d·Σ q·x into two
/// alternating accumulators (two independent FMA chains); the formats with
/// a minimum (`MIN`: f16 m after d) dot the unsigned quants and add m·Σx
/// into a third. Returns (the first two summed, the third).
#[inline(always)]
unsafe fn dot_blocks32<const MIN: bool, const BIAS: i8>(
    (w, x, nb): (*const u8, *const f32, usize),
    bb: usize,
    quants: impl Fn(*const u8) -> (uint8x16_t, uint8x16_t),
) -> (float32x4_t, float32x4_t) {
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut accm = vdupq_n_f32(0.0);
    for b in 0..nb {
        let (p, xb) = (w.add(b * bb), x.add(b * 32));
        let (lo, hi) = quants(p);
        let s = if MIN {
            let ((s0, x0), (s1, x1)) = (dot_sum(lo, xb), dot_sum(hi, xb.add(16)));
            accm = vfmaq_n_f32(accm, vaddq_f32(x0, x1), half_at(p.add(2)));
            vaddq_f32(s0, s1)
        } else {
            let signed =
                |q| if BIAS == 0 { vreinterpretq_s8_u8(q) } else { vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(BIAS)) };
            vaddq_f32(dot_bytes(signed(lo), xb), dot_bytes(signed(hi), xb.add(16)))
        };
        acc[b % 2] = vfmaq_n_f32(acc[b % 2], s, half_at(p));
    }
    (vaddq_f32(acc[0], acc[1]), accm)
}

// ---- Q5 and K-quant formats ---------------------------------------------------
//
// Each kernel unpacks 16 quants at a time into a byte vector (the stored
// integer, with the bias of the signed formats already subtracted), widens
// it to f32 and dots it with 16 activations into a vector of partial sums;
// one FMA per group of 16 or 32 then scales those by the group's d·s into
// an accumulator. The formats with minimums add (−dmin·m)·Σx per group into
// a separate accumulator, as Q4_1 does. The group scales of a super-block
// are computed once into small arrays, each product d·s rounded as the
// scalar code rounds it. Only the order of the f32 sums differs from
// dequantize-then-dot.

/// Little-endian u32 at `p` (any alignment).
#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    u32::from_le(ptr::read_unaligned(p as *const u32))
}

/// Four little-endian u32 as 16 bytes, lowest byte first.
#[inline(always)]
fn bytes16(w: [u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (c, v) in b.chunks_exact_mut(4).zip(w) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Bit i of each byte lane i % 8: selects one bit of a replicated byte.
const LANE_BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// 0x10 in byte lane i (< 16) where bit i of `h` is set, else 0.
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn fifth_bits(h: u16, lane_bits: uint8x16_t) -> uint8x16_t {
    let rep = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
    vandq_u8(vtstq_u8(rep, lane_bits), vdupq_n_u8(0x10))
}

/// Sum of four accumulators.
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
fn hsum4(a: [float32x4_t; 4]) -> f32 {
    vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])))
}

/// Group scales d·s and offsets −dmin·m of the Q4_K/Q5_K super-block at
/// `p` (which starts with d, dmin and the 12 packed scale bytes).
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
unsafe fn k4_scales(p: *const u8) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (half_at(p), half_at(p.add(2)));
    // the 6-bit scales and mins of groups 0-3 and 4-7, one byte each
    // (see quant::k4_scale_min), unpacked four at a time
    let (w0, w1, w2) = (rd32(p.add(4)), rd32(p.add(8)), rd32(p.add(12)));
    let sm = bytes16([
        w0 & 0x3f3f_3f3f,
        (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4),
        w1 & 0x3f3f_3f3f,
        ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4),
    ]);
    let f = vld1q_u8(sm.as_ptr()).widen();
    let mut out = [[0f32; 8]; 2];
    vst1q_f32(out[0].as_mut_ptr(), vmulq_n_f32(f[0], d));
    vst1q_f32(out[0].as_mut_ptr().add(4), vmulq_n_f32(f[1], d));
    // −(dmin·m) is (−dmin)·m exactly
    vst1q_f32(out[1].as_mut_ptr(), vmulq_n_f32(f[2], -dmin));
    vst1q_f32(out[1].as_mut_ptr().add(4), vmulq_n_f32(f[3], -dmin));
    (out[0], out[1])
}

// ---- dequantization -------------------------------------------------------------

/// Stores four f32 vectors at `o`.
#[inline]
#[cfg_attr(target_arch = "aarch64", target_feature(enable = "neon"))]
unsafe fn store16(o: *mut f32, f: [float32x4_t; 4]) {
    vst1q_f32(o, f[0]);
    vst1q_f32(o.add(4), f[1]);
    vst1q_f32(o.add(8), f[2]);
    vst1q_f32(o.add(12), f[3]);
}

// ---- the kernel set --------------------------------------------------------

impl DotIsa for Neon {
    const ISA: Isa = Isa::Neon;

    /// NEON is part of the aarch64 baseline; elsewhere this module is only
    /// built for tests, on scalar stand-ins.
    fn detected() -> bool {
        #[cfg(target_arch = "aarch64")]
        return std::arch::is_aarch64_feature_detected!("neon");
        #[cfg(not(target_arch = "aarch64"))]
        true
    }

    /// In NEON's order: the tail (below 16) in zero-padded steps of 8.
    #[inline(always)]
    unsafe fn dot_half<const BF: bool>(w: *const u16, x: *const f32, n: usize) -> f32 {
        lanes::dot::<Neon, lanes::HalfRow<BF>, true>(w, x, n)
    }

    #[inline(always)]
    unsafe fn dot_q8_0(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let (s, _) = dot_blocks32::<false, 0>(
            (w, x, nb),
            34,
            #[inline(always)]
            |p| (vld1q_u8(p.add(2)), vld1q_u8(p.add(18))),
        );
        vaddvq_f32(s)
    }

    /// Q4_0 (`MIN` false: value d·(q−8)) and Q4_1 (`MIN` true: d·q + m):
    /// element j is the low nibble of byte j, element j + 16 its high one.
    #[inline(always)]
    unsafe fn dot_q4<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let (bb, head) = if MIN { (20, 4) } else { (18, 2) };
        let (s, m) = dot_blocks32::<MIN, 8>(
            (w, x, nb),
            bb,
            #[inline(always)]
            |p| {
                let v = vld1q_u8(p.add(head));
                (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v))
            },
        );
        vaddvq_f32(vaddq_f32(s, m))
    }

    /// Q5_0 (`MIN` false: value d·(q − 16)) and Q5_1 (`MIN` true: d·q + m);
    /// the nibbles as Q4's, and the fifth bit of element j is bit j of the
    /// u32 qh before them.
    #[inline(always)]
    unsafe fn dot_q5<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let (bb, head) = if MIN { (24, 8) } else { (22, 6) };
        let lane_bits = vld1q_u8(LANE_BITS.as_ptr());
        let (s, m) = dot_blocks32::<MIN, 16>(
            (w, x, nb),
            bb,
            #[inline(always)]
            |p| {
                let (qh, v) = (rd32(p.add(head - 4)), vld1q_u8(p.add(head)));
                let lo = vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), fifth_bits(qh as u16, lane_bits));
                (lo, vorrq_u8(vshrq_n_u8::<4>(v), fifth_bits((qh >> 16) as u16, lane_bits)))
            },
        );
        vaddvq_f32(vaddq_f32(s, m))
    }

    /// Q2_K: element 128h + 32j + l is bits 2j..2j+1 of quant byte 32h + l;
    /// group e / 16 has scale d·(s & 15) and offset −dmin·(s >> 4).
    #[inline(always)]
    unsafe fn dot_q2_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        const BB: usize = 84;
        let m3 = vdupq_n_u8(3);
        let m4 = vdupq_n_u8(0x0f);
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut accm = vdupq_n_f32(0.0);
        for b in 0..nb {
            let p = w.add(b * BB);
            let xb = x.add(b * 256);
            let (d, dmin) = (half_at(p.add(80)), half_at(p.add(82)));
            let sc = vld1q_u8(p);
            let (mut dl, mut off) = ([0f32; 16], [0f32; 16]);
            scaled_bytes(vandq_u8(sc, m4), d, dl.as_mut_ptr());
            // −(dmin·m) is (−dmin)·m exactly
            scaled_bytes(vshrq_n_u8::<4>(sc), -dmin, off.as_mut_ptr());
            for h in 0..2 {
                // bytes l < 16 (group 8h + 2j) and l ≥ 16 (group 8h + 2j + 1)
                let mut q0 = vld1q_u8(p.add(16 + 32 * h));
                let mut q1 = vld1q_u8(p.add(32 + 32 * h));
                for (j, a) in acc.iter_mut().enumerate() {
                    let g = 8 * h + 2 * j;
                    let xg = xb.add(128 * h + 32 * j);
                    let (s0, x0) = dot_sum(vandq_u8(q0, m3), xg);
                    let (s1, x1) = dot_sum(vandq_u8(q1, m3), xg.add(16));
                    *a = vfmaq_n_f32(vfmaq_n_f32(*a, s0, dl[g]), s1, dl[g + 1]);
                    accm = vfmaq_n_f32(vfmaq_n_f32(accm, x0, off[g]), x1, off[g + 1]);
                    q0 = vshrq_n_u8::<2>(q0);
                    q1 = vshrq_n_u8::<2>(q1);
                }
            }
        }
        hsum4(acc) + vaddvq_f32(accm)
    }

    /// Q3_K: as Q2_K's layout, plus a high bit 4h + j in hmask byte l (a clear
    /// bit subtracts 4); group e / 16 has scale d·(s − 32).
    #[inline(always)]
    unsafe fn dot_q3_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        const BB: usize = 110;
        let m3 = vdupq_n_u8(3);
        let one = vdupq_n_u8(1);
        let four = vdupq_n_s8(4);
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nb {
            let p = w.add(b * BB);
            let xb = x.add(b * 256);
            let d = half_at(p.add(108));
            // the 16 6-bit scales (see quant::q3_k_scale), four at a time
            let (a0, a1, a2) = (rd32(p.add(96)), rd32(p.add(100)), rd32(p.add(104)));
            let (k4, k2) = (0x0f0f_0f0f, 0x0303_0303);
            let s = bytes16([
                (a0 & k4) | ((a2 & k2) << 4),
                (a1 & k4) | (((a2 >> 2) & k2) << 4),
                ((a0 >> 4) & k4) | (((a2 >> 4) & k2) << 4),
                ((a1 >> 4) & k4) | (((a2 >> 6) & k2) << 4),
            ]);
            let mut dl = [0f32; 16];
            // below 64, so the bytes read the same signed
            scaled_bytes(vsubq_s8(vld1q_s8(s.as_ptr() as *const i8), vdupq_n_s8(32)), d, dl.as_mut_ptr());
            for lh in 0..2 {
                // elements l = 16·lh .. 16·lh + 15 of every 32-element run
                let mut hm = vld1q_u8(p.add(16 * lh));
                for h in 0..2 {
                    let mut q = vld1q_u8(p.add(32 + 32 * h + 16 * lh));
                    for (j, a) in acc.iter_mut().enumerate() {
                        // low bits 2j, high bit 4h + j (both consumed in order)
                        let u = vorrq_u8(vandq_u8(q, m3), vshlq_n_u8::<2>(vandq_u8(hm, one)));
                        let s = dot_bytes(vsubq_s8(vreinterpretq_s8_u8(u), four), xb.add(128 * h + 32 * j + 16 * lh));
                        *a = vfmaq_n_f32(*a, s, dl[8 * h + 2 * j + lh]);
                        q = vshrq_n_u8::<2>(q);
                        hm = vshrq_n_u8::<1>(hm);
                    }
                }
            }
        }
        hsum4(acc)
    }

    /// Q4_K (`FIVE` false) or Q5_K (`FIVE` true): chunk c of 64 elements reads
    /// 32 nibble bytes; low nibbles are group 2c, high nibbles group 2c + 1;
    /// Q5_K's fifth bit of element 32g + l is bit g of qh byte l.
    #[inline(always)]
    unsafe fn dot_q45_k<const FIVE: bool>(w: *const u8, x: *const f32, nb: usize) -> f32 {
        let (bb, qs_at): (usize, usize) = if FIVE { (176, 48) } else { (144, 16) };
        let m4 = vdupq_n_u8(0x0f);
        let one = vdupq_n_u8(1);
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut accm = [vdupq_n_f32(0.0); 2];
        for b in 0..nb {
            let p = w.add(b * bb);
            let xb = x.add(b * 256);
            let (dl, off) = k4_scales(p);
            // qh bytes l < 16 and l ≥ 16, shifted right once per group
            let mut qh = if FIVE { [vld1q_u8(p.add(16)), vld1q_u8(p.add(32))] } else { [vdupq_n_u8(0); 2] };
            for c in 0..4 {
                let q = p.add(qs_at + 32 * c);
                let xc = xb.add(64 * c);
                for (i, qh) in qh.iter_mut().enumerate() {
                    let v = vld1q_u8(q.add(16 * i));
                    let mut lo = vandq_u8(v, m4);
                    let mut hi = vshrq_n_u8::<4>(v);
                    if FIVE {
                        lo = vorrq_u8(lo, vshlq_n_u8::<4>(vandq_u8(*qh, one)));
                        hi = vorrq_u8(hi, vshlq_n_u8::<3>(vandq_u8(*qh, vdupq_n_u8(2))));
                        *qh = vshrq_n_u8::<2>(*qh);
                    }
                    let (s0, x0) = dot_sum(lo, xc.add(16 * i));
                    let (s1, x1) = dot_sum(hi, xc.add(32 + 16 * i));
                    acc[2 * i] = vfmaq_n_f32(acc[2 * i], s0, dl[2 * c]);
                    acc[2 * i + 1] = vfmaq_n_f32(acc[2 * i + 1], s1, dl[2 * c + 1]);
                    accm[i] = vfmaq_n_f32(vfmaq_n_f32(accm[i], x0, off[2 * c]), x1, off[2 * c + 1]);
                }
            }
        }
        hsum4(acc) + vaddvq_f32(vaddq_f32(accm[0], accm[1]))
    }

    /// Q6_K: element 128h + 32k + l is nibble k / 2 of ql byte
    /// 64h + 32(k % 2) + l with bits 2k..2k+1 of qh byte 32h + l above it;
    /// group e / 16 has scale d·s (signed), and the quant a bias of 32.
    #[inline(always)]
    unsafe fn dot_q6_k(w: *const u8, x: *const f32, nb: usize) -> f32 {
        const BB: usize = 210;
        let bias = vdupq_n_s8(32);
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nb {
            let p = w.add(b * BB);
            let xb = x.add(b * 256);
            let mut dl = [0f32; 16];
            scaled_bytes(vld1q_s8(p.add(192) as *const i8), half_at(p.add(208)), dl.as_mut_ptr());
            for h in 0..2 {
                for lh in 0..2 {
                    let u = lanes::q6_quants::<Neon>(p, h, 16 * lh);
                    for (k, (a, uk)) in acc.iter_mut().zip(u).enumerate() {
                        let s = dot_bytes(vsubq_s8(vreinterpretq_s8_u8(uk), bias), xb.add(128 * h + 32 * k + 16 * lh));
                        *a = vfmaq_n_f32(*a, s, dl[8 * h + 2 * k + lh]);
                    }
                }
            }
        }
        hsum4(acc)
    }

    #[inline(always)]
    unsafe fn deq_q8_0(s: *const u8, o: *mut f32, nb: usize) {
        for b in 0..nb {
            let p = s.add(b * 34);
            let d = half_at(p);
            for h in 0..2 {
                let f = vld1q_s8(p.add(2 + 16 * h) as *const i8).widen();
                store16(o.add(b * 32 + 16 * h), f.map(|v| vmulq_n_f32(v, d)));
            }
        }
    }

    /// Q4_0 (`MIN` false: d·(q−8)) or Q4_1 (`MIN` true: d·q + m, rounded as
    /// the scalar code: product, then sum).
    #[inline(always)]
    unsafe fn deq_q4<const MIN: bool>(s: *const u8, o: *mut f32, nb: usize) {
        let bb: usize = if MIN { 20 } else { 18 };
        let qoff: usize = if MIN { 4 } else { 2 };
        let mask = vdupq_n_u8(0x0f);
        for b in 0..nb {
            let p = s.add(b * bb);
            let d = half_at(p);
            let v = vld1q_u8(p.add(qoff));
            let halves = [vandq_u8(v, mask), vshrq_n_u8::<4>(v)];
            for (h, q) in halves.into_iter().enumerate() {
                let f = if MIN {
                    let m = vdupq_n_f32(half_at(p.add(2)));
                    let f = q.widen();
                    [
                        vaddq_f32(vmulq_n_f32(f[0], d), m),
                        vaddq_f32(vmulq_n_f32(f[1], d), m),
                        vaddq_f32(vmulq_n_f32(f[2], d), m),
                        vaddq_f32(vmulq_n_f32(f[3], d), m),
                    ]
                } else {
                    let f = vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(8)).widen();
                    [vmulq_n_f32(f[0], d), vmulq_n_f32(f[1], d), vmulq_n_f32(f[2], d), vmulq_n_f32(f[3], d)]
                };
                store16(o.add(b * 32 + 16 * h), f);
            }
        }
    }
}
