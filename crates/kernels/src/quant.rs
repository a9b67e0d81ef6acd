//! Scalar reference code for the GGML block formats: dequantize and quantize.
//! The SIMD dot kernels in [`crate::dot`] are tested against these.
//!
//! Dequantization follows GGML's formulas operation for operation (products
//! and sums in the same order, no fused multiply-add), so it reproduces the
//! f32 values llama.cpp and gguf-py compute bit for bit; the GGUF fixture
//! test (`crates/models/tests/gguf_fixture_tensors.rs`) checks that on
//! every tensor of llama.cpp-made files. The K-quant block layouts are
//! documented on the per-block functions below.

use crate::dtype::DType;
use crate::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Block size of the 32-element formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
pub const QK: usize = 32;

/// Super-block size of the K-quant formats (Q2_K … Q6_K).
pub const QK_K: usize = 256;

#[inline]
fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Dequantizes `out.len()` elements stored as `dtype` in `bytes`.
/// `bytes` must hold exactly `dtype.bytes_for(out.len())` bytes.
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), dtype.bytes_for(out.len()));
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(34)) {
                let d = half_at(b, 0);
                for (oi, &q) in o.iter_mut().zip(&b[2..34]) {
                    *oi = d * (q as i8) as f32;
                }
            }
        }
        DType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(18)) {
                let d = half_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = d * ((q & 0x0f) as i32 - 8) as f32;
                    o[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        DType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(20)) {
                let d = half_at(b, 0);
                let m = half_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = d * (q & 0x0f) as f32 + m;
                    o[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
        }
        DType::Q5_0 => blocks(bytes, out, 22, QK, deq_q5_0),
        DType::Q5_1 => blocks(bytes, out, 24, QK, deq_q5_1),
        DType::Q2_K => blocks(bytes, out, 84, QK_K, deq_q2_k),
        DType::Q3_K => blocks(bytes, out, 110, QK_K, deq_q3_k),
        DType::Q4_K => blocks(bytes, out, 144, QK_K, deq_q4_k),
        DType::Q5_K => blocks(bytes, out, 176, QK_K, deq_q5_k),
        DType::Q6_K => blocks(bytes, out, 210, QK_K, deq_q6_k),
    }
}

/// Applies a per-block dequantizer to every whole block of `bytes` and `out`.
#[inline]
fn blocks(bytes: &[u8], out: &mut [f32], bb: usize, be: usize, f: fn(&[u8], &mut [f32])) {
    for (o, b) in out.chunks_exact_mut(be).zip(bytes.chunks_exact(bb)) {
        f(b, o);
    }
}

/// Dequantizes one block of `dtype` (`dtype.block_bytes()` bytes in `b`)
/// into `out[..dtype.block_elems()]`, for the block formats with more than
/// one element per block. Used by the fused dot kernels, which dequantize a
/// block into a stack buffer and dot it.
#[inline]
pub(crate) fn dequantize_block(dtype: DType, b: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q5_0 => deq_q5_0(b, out),
        DType::Q5_1 => deq_q5_1(b, out),
        DType::Q2_K => deq_q2_k(b, out),
        DType::Q3_K => deq_q3_k(b, out),
        DType::Q4_K => deq_q4_k(b, out),
        DType::Q5_K => deq_q5_k(b, out),
        DType::Q6_K => deq_q6_k(b, out),
        _ => dequantize(dtype, b, &mut out[..dtype.block_elems()]),
    }
}

/// Q5_0 block (22 bytes): f16 d, u32 qh (bit j = fifth bit of element j),
/// 16 bytes of nibbles (element j low, j+16 high). x = d·(q − 16).
fn deq_q5_0(b: &[u8], o: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let q = b[6 + j];
        let lo = (q & 0x0f) as i32 | (((qh >> j) & 1) << 4) as i32;
        let hi = (q >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
        o[j] = d * (lo - 16) as f32;
        o[j + 16] = d * (hi - 16) as f32;
    }
}

/// Q5_1 block (24 bytes): f16 d, f16 m, u32 qh, 16 bytes of nibbles.
/// x = d·q + m.
fn deq_q5_1(b: &[u8], o: &mut [f32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let q = b[8 + j];
        let lo = (q & 0x0f) as u32 | (((qh >> j) & 1) << 4);
        let hi = (q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        o[j] = d * lo as f32 + m;
        o[j + 16] = d * hi as f32 + m;
    }
}

/// Q2_K super-block (84 bytes): 16 scale bytes (group g: scale in the low
/// nibble, min in the high), 64 bytes of 2-bit quants, f16 d, f16 dmin.
/// Element e = 128h + 32j + l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of
/// quant byte 32h + l and belongs to group e / 16. x = d·s·q − dmin·m,
/// rounded as (d·s)·q − (dmin·m).
fn deq_q2_k(b: &[u8], o: &mut [f32]) {
    let d = half_at(b, 80);
    let dmin = half_at(b, 82);
    let (sc, qs) = (&b[0..16], &b[16..80]);
    for (g, og) in o[..QK_K].chunks_exact_mut(16).enumerate() {
        let dl = d * (sc[g] & 0x0f) as f32;
        let ml = dmin * (sc[g] >> 4) as f32;
        let (h, j, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, v) in og.iter_mut().enumerate() {
            let q = (qs[32 * h + l0 + l] >> (2 * j)) & 3;
            *v = dl * q as f32 - ml;
        }
    }
}

/// The 6-bit scale of group `g` (< 16) of a Q3_K super-block, without the
/// offset of 32: low 4 bits in nibble `g / 8` of byte `g % 8`, high 2 bits
/// in bits 2·(g / 4) of byte 8 + g % 4.
#[inline]
pub(crate) fn q3_k_scale(sc: &[u8], g: usize) -> u8 {
    let lo = (sc[g % 8] >> (4 * (g / 8))) & 0x0f;
    let hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    lo | (hi << 4)
}

/// Q3_K super-block (110 bytes): 32 bytes hmask, 64 bytes of low 2-bit
/// quants, 12 bytes of packed 6-bit scales, f16 d. Element
/// e = 128h + 32j + l: low bits 2j..2j+1 of byte 32h + l, high bit 4h + j of
/// hmask byte l; a clear high bit subtracts 4. x = (d·(s − 32))·q.
fn deq_q3_k(b: &[u8], o: &mut [f32]) {
    let (hm, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half_at(b, 108);
    for (g, og) in o[..QK_K].chunks_exact_mut(16).enumerate() {
        let dl = d * (q3_k_scale(sc, g) as i32 - 32) as f32;
        let (h, j, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, v) in og.iter_mut().enumerate() {
            let lo = ((qs[32 * h + l0 + l] >> (2 * j)) & 3) as i32;
            let high = (hm[l0 + l] >> (4 * h + j)) & 1;
            let q = lo - if high != 0 { 0 } else { 4 };
            *v = dl * q as f32;
        }
    }
}

/// Scale and min (6 bits each) of group `j` (< 8) of a Q4_K/Q5_K
/// super-block from its 12 packed bytes: groups 0–3 use the low 6 bits of
/// bytes j and j+4; groups 4–7 take the nibbles of byte j+4 and the top 2
/// bits of bytes j−4 and j.
#[inline]
pub(crate) fn k4_scale_min(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        ((sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
    }
}

/// Q4_K super-block (144 bytes): f16 d, f16 dmin, 12 scale bytes, 128
/// bytes of nibbles. Chunk c < 4 of 64 elements: byte 32c + l holds element
/// 64c + l (low nibble, group 2c) and 64c + 32 + l (high, group 2c+1).
/// x = (d·s)·q − (dmin·m).
fn deq_q4_k(b: &[u8], o: &mut [f32]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let (sc, qs) = (&b[4..16], &b[16..144]);
    for (g, og) in o[..QK_K].chunks_exact_mut(32).enumerate() {
        let (s, m) = k4_scale_min(sc, g);
        let (dl, ml) = (d * s as f32, dmin * m as f32);
        let q = &qs[32 * (g / 2)..32 * (g / 2) + 32];
        let shift = 4 * (g % 2);
        for (v, &q) in og.iter_mut().zip(q) {
            *v = dl * ((q >> shift) & 0x0f) as f32 - ml;
        }
    }
}

/// Q5_K super-block (176 bytes): as Q4_K, plus 32 bytes qh after the
/// scales: bit g of qh byte l is the fifth bit of element 32g + l.
fn deq_q5_k(b: &[u8], o: &mut [f32]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let (sc, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (g, og) in o[..QK_K].chunks_exact_mut(32).enumerate() {
        let (s, m) = k4_scale_min(sc, g);
        let (dl, ml) = (d * s as f32, dmin * m as f32);
        let q = &qs[32 * (g / 2)..32 * (g / 2) + 32];
        let shift = 4 * (g % 2);
        for (l, v) in og.iter_mut().enumerate() {
            let v5 = ((q[l] >> shift) & 0x0f) | (((qh[l] >> g) & 1) << 4);
            *v = dl * v5 as f32 - ml;
        }
    }
}

/// Q6_K super-block (210 bytes): 128 bytes ql (low nibbles), 64 bytes qh
/// (2 high bits each), 16 i8 scales, f16 d. Element e = 128h + 32k + l
/// (k < 4): low nibble of ql byte 64h + 32(k % 2) + l (high nibble when
/// k ≥ 2), high bits 2k..2k+1 of qh byte 32h + l, scale e / 16.
/// x = (d·s)·(q − 32).
fn deq_q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    for (g, og) in o[..QK_K].chunks_exact_mut(16).enumerate() {
        let dl = d * (sc[g] as i8) as f32;
        let (h, k, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, v) in og.iter_mut().enumerate() {
            let lo = (ql[64 * h + 32 * (k % 2) + l0 + l] >> (4 * (k / 2))) & 0x0f;
            let hi = (qh[32 * h + l0 + l] >> (2 * k)) & 3;
            let q = (lo | (hi << 4)) as i32 - 32;
            *v = dl * q as f32;
        }
    }
}

/// Quantizes `x` into `dtype` (the same rounding rules as GGML's reference
/// quantizers). Used for synthetic benchmark models and tests.
pub fn quantize(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.bytes_for(x.len()));
    match dtype {
        DType::F32 => x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => x.iter().for_each(|v| out.extend_from_slice(&f32_to_f16(*v).to_le_bytes())),
        DType::BF16 => x.iter().for_each(|v| out.extend_from_slice(&f32_to_bf16(*v).to_le_bytes())),
        DType::Q8_0 => {
            for blk in x.chunks_exact(QK) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        DType::Q4_0 => {
            for blk in x.chunks_exact(QK) {
                // signed value of largest magnitude maps to -8
                let max = blk.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((blk[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let q1 = ((blk[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        DType::Q4_1 => {
            for blk in x.chunks_exact(QK) {
                let min = blk.iter().cloned().fold(f32::INFINITY, f32::min);
                let max = blk.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                out.extend_from_slice(&f32_to_f16(min).to_le_bytes());
                for j in 0..16 {
                    let q0 = (((blk[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    let q1 = (((blk[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        DType::Q5_0 => x.chunks_exact(QK).for_each(|b| quantize_q5::<false>(b, &mut out)),
        DType::Q5_1 => x.chunks_exact(QK).for_each(|b| quantize_q5::<true>(b, &mut out)),
        DType::Q2_K => x.chunks_exact(QK_K).for_each(|b| quantize_q2_k(b, &mut out)),
        DType::Q3_K => x.chunks_exact(QK_K).for_each(|b| quantize_q3_k(b, &mut out)),
        DType::Q4_K => x.chunks_exact(QK_K).for_each(|b| quantize_q45_k::<false>(b, &mut out)),
        DType::Q5_K => x.chunks_exact(QK_K).for_each(|b| quantize_q45_k::<true>(b, &mut out)),
        DType::Q6_K => x.chunks_exact(QK_K).for_each(|b| quantize_q6_k(b, &mut out)),
    }
    out
}

// ---- quantizers of the Q5 and K formats -------------------------------------
//
// Simple round-to-nearest quantizers (no search for the scale that
// minimises the error, unlike llama.cpp's): they exist to build synthetic
// models and test data, and only promise blocks that dequantize back within
// about one quantization step. Non-finite inputs never panic (`as` casts
// saturate, NaN becomes 0).

/// `v` rounded through f16, as stored.
fn f16_round(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// `1 / v`, or 0 for 0 (an all-zero group).
fn inv(v: f32) -> f32 {
    if v != 0.0 {
        1.0 / v
    } else {
        0.0
    }
}

/// `round(v)` clamped to `lo..=hi` (NaN gives 0 before clamping).
fn rclamp(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// `(min(0, min x), max x)` of a group: a K-quant minimum is subtracted
/// (stored as a non-negative offset), so ranges always include 0.
fn range0(x: &[f32]) -> (f32, f32) {
    x.iter().fold((0f32, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// The element of largest magnitude, with its sign.
fn signed_amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a })
}

/// Q5_0 (`MIN` false: the signed extreme maps to −16) or Q5_1 (`MIN` true:
/// min..max over 31 steps).
fn quantize_q5<const MIN: bool>(b: &[f32], out: &mut Vec<u8>) {
    let mut q = [0u8; QK];
    if MIN {
        let min = b.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = f16_round((max - min) / 31.0);
        let m = f16_round(min);
        out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        out.extend_from_slice(&f32_to_f16(m).to_le_bytes());
        let id = inv(d);
        for (qi, &v) in q.iter_mut().zip(b) {
            *qi = rclamp((v - m) * id, 0, 31) as u8;
        }
    } else {
        let d = f16_round(signed_amax(b) / -16.0);
        out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        let id = inv(d);
        for (qi, &v) in q.iter_mut().zip(b) {
            *qi = (rclamp(v * id, -16, 15) + 16) as u8;
        }
    }
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v >> 4) as u32) << j;
    }
    out.extend_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        out.push((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    }
}

/// Integer scales for per-group `vals` (all ≥ 0) under one super-scale of
/// `levels` steps: returns the f16-rounded super-scale and each group's
/// integer multiple, rounded up when `up` (so a group's range still fits).
fn sub_scales<const N: usize>(vals: &[f32; N], levels: f32, up: bool) -> (f32, [i32; N]) {
    let max = vals.iter().cloned().fold(0f32, f32::max);
    let d = f16_round(max / levels);
    let id = inv(d);
    let mut s = [0i32; N];
    for (si, &v) in s.iter_mut().zip(vals) {
        let r = v * id;
        *si = ((if up { r.ceil() } else { r.round() }) as i32).clamp(0, levels as i32);
    }
    (d, s)
}

/// Q2_K: 16 groups of 16, each with range min(0, min)..max over 3 steps.
fn quantize_q2_k(b: &[f32], out: &mut Vec<u8>) {
    let mut scale = [0f32; 16];
    let mut negmin = [0f32; 16];
    for (g, x) in b.chunks_exact(16).enumerate() {
        let (lo, hi) = range0(x);
        scale[g] = (hi - lo) / 3.0;
        negmin[g] = -lo;
    }
    let (d, sc) = sub_scales(&scale, 15.0, true);
    let (dmin, m) = sub_scales(&negmin, 15.0, false);
    let mut qs = [0u8; 64];
    for (g, x) in b.chunks_exact(16).enumerate() {
        let (dl, ml) = (d * sc[g] as f32, dmin * m[g] as f32);
        let (h, j, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, &v) in x.iter().enumerate() {
            let q = rclamp((v + ml) * inv(dl), 0, 3) as u8;
            qs[32 * h + l0 + l] |= q << (2 * j);
        }
    }
    out.extend((0..16).map(|g| sc[g] as u8 | ((m[g] as u8) << 4)));
    out.extend_from_slice(&qs);
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    out.extend_from_slice(&f32_to_f16(dmin).to_le_bytes());
}

/// Signed scales of the 16 groups of 16 of `b` (each the value one quant
/// step stands for, with the group's signed extreme at the quant `qmin`)
/// folded into integer multiples `-smax..smax-1` of one super-scale d,
/// rounded away from zero so a group's extremes still fit.
fn signed_sub_scales(b: &[f32], qmin: f32, smax: i32) -> (f32, [i32; 16]) {
    let mut scale = [0f32; 16];
    for (g, x) in b.chunks_exact(16).enumerate() {
        scale[g] = signed_amax(x) / qmin;
    }
    let big = signed_amax(&scale);
    let d = f16_round(big / -(smax as f32));
    let id = inv(d);
    let mut s = [0i32; 16];
    for (si, &v) in s.iter_mut().zip(&scale) {
        let r = v * id;
        let r = if r < 0.0 { r.floor() } else { r.ceil() };
        *si = (r as i32).clamp(-smax, smax - 1);
    }
    (d, s)
}

/// Q3_K: 16 groups of 16, each group's signed extreme mapped to −4.
fn quantize_q3_k(b: &[f32], out: &mut Vec<u8>) {
    let (d, sc) = signed_sub_scales(b, -4.0, 32);
    let mut hm = [0u8; 32];
    let mut qs = [0u8; 64];
    let mut packed = [0u8; 12];
    for (g, x) in b.chunks_exact(16).enumerate() {
        let s6 = (sc[g] + 32) as u8;
        packed[g % 8] |= (s6 & 0x0f) << (4 * (g / 8));
        packed[8 + g % 4] |= (s6 >> 4) << (2 * (g / 4));
        let id = inv(d * sc[g] as f32);
        let (h, j, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, &v) in x.iter().enumerate() {
            let u = (rclamp(v * id, -4, 3) + 4) as u8;
            qs[32 * h + l0 + l] |= (u & 3) << (2 * j);
            hm[l0 + l] |= (u >> 2) << (4 * h + j);
        }
    }
    out.extend_from_slice(&hm);
    out.extend_from_slice(&qs);
    out.extend_from_slice(&packed);
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
}

/// Q4_K (`FIVE` false, 15 steps) or Q5_K (`FIVE` true, 31 steps): 8 groups
/// of 32, each with range min(0, min)..max.
fn quantize_q45_k<const FIVE: bool>(b: &[f32], out: &mut Vec<u8>) {
    let nmax = if FIVE { 31 } else { 15 };
    let mut scale = [0f32; 8];
    let mut negmin = [0f32; 8];
    for (g, x) in b.chunks_exact(32).enumerate() {
        let (lo, hi) = range0(x);
        scale[g] = (hi - lo) / nmax as f32;
        negmin[g] = -lo;
    }
    let (d, sc) = sub_scales(&scale, 63.0, true);
    let (dmin, m) = sub_scales(&negmin, 63.0, false);
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (s, mm) = (sc[j] as u8, m[j] as u8);
        if j < 4 {
            packed[j] |= s;
            packed[j + 4] |= mm;
        } else {
            packed[j + 4] = (s & 0x0f) | ((mm & 0x0f) << 4);
            packed[j - 4] |= (s >> 4) << 6;
            packed[j] |= (mm >> 4) << 6;
        }
    }
    let mut qh = [0u8; 32];
    let mut qs = [0u8; 128];
    for (g, x) in b.chunks_exact(32).enumerate() {
        let (dl, ml) = (d * sc[g] as f32, dmin * m[g] as f32);
        let id = inv(dl);
        for (l, &v) in x.iter().enumerate() {
            let q = rclamp((v + ml) * id, 0, nmax) as u8;
            qs[32 * (g / 2) + l] |= (q & 0x0f) << (4 * (g % 2));
            qh[l] |= (q >> 4) << g;
        }
    }
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    out.extend_from_slice(&f32_to_f16(dmin).to_le_bytes());
    out.extend_from_slice(&packed);
    if FIVE {
        out.extend_from_slice(&qh);
    }
    out.extend_from_slice(&qs);
}

/// Q6_K: 16 groups of 16, each group's signed extreme mapped to −32, with
/// i8 group scales.
fn quantize_q6_k(b: &[f32], out: &mut Vec<u8>) {
    let (d, sc) = signed_sub_scales(b, -32.0, 128);
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (g, x) in b.chunks_exact(16).enumerate() {
        let id = inv(d * sc[g] as f32);
        let (h, k, l0) = (g / 8, (g % 8) / 2, (g % 2) * 16);
        for (l, &v) in x.iter().enumerate() {
            let u = (rclamp(v * id, -32, 31) + 32) as u8;
            ql[64 * h + 32 * (k % 2) + l0 + l] |= (u & 0x0f) << (4 * (k / 2));
            qh[32 * h + l0 + l] |= (u >> 4) << (2 * k);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as i8 as u8));
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
    }

    /// The largest dequantization error of `dt` on [`ramp`].
    fn max_error(dt: DType) -> f32 {
        match dt {
            DType::F32 => 0.0,
            DType::F16 => 2e-3,
            DType::BF16 => 2e-2,
            DType::Q8_0 => 0.03,
            DType::Q4_0 => 0.4,
            DType::Q4_1 | DType::Q5_0 => 0.2,
            DType::Q2_K => 1.1,
            DType::Q3_K => 0.8,
            DType::Q4_K => 0.25,
            DType::Q5_K => 0.12,
            DType::Q5_1 | DType::Q6_K => 0.1,
        }
    }

    #[test]
    fn quantize_dequantize_error_is_bounded() {
        let x = ramp(256);
        for dt in DType::ALL {
            let tol = max_error(dt);
            let q = quantize(dt, &x);
            assert_eq!(q.len(), dt.bytes_for(x.len()));
            let mut y = vec![0.0; x.len()];
            dequantize(dt, &q, &mut y);
            let err = x.iter().zip(&y).fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(err <= tol, "{dt}: max error {err} > {tol}");
        }
    }

    /// The quantizers never panic and always produce whole blocks, on
    /// zeros, constants, tiny and huge magnitudes and non-finite values;
    /// on finite data of moderate size the error stays within a fraction of
    /// the block's magnitude.
    #[test]
    fn quantizers_handle_any_input() {
        let n = 512;
        let inputs: Vec<Vec<f32>> = vec![
            vec![0.0; n],
            vec![1.5; n],
            vec![-7.0; n],
            ramp(n).iter().map(|v| v * 1e-2).collect(),
            ramp(n).iter().map(|v| v * 1e3).collect(),
            (0..n).map(|i| if i % 17 == 0 { 5.0 } else { 0.01 * i as f32 }).collect(),
            // below here: no accuracy promise (f16 scales underflow or overflow)
            ramp(n).iter().map(|v| v * 1e-7).collect(),
            (0..n).map(|i| [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0][i % 4]).collect(),
            (0..n).map(|i| if i % 3 == 0 { 1e30 } else { -1e30 }).collect(),
        ];
        for dt in DType::ALL {
            for (k, x) in inputs.iter().enumerate() {
                let q = quantize(dt, x);
                assert_eq!(q.len(), dt.bytes_for(n), "{dt} input {k}");
                let mut y = vec![0.0; n];
                dequantize(dt, &q, &mut y);
                if k < 6 && dt.block_elems() > 1 {
                    for (bx, by) in x.chunks(dt.block_elems()).zip(y.chunks(dt.block_elems())) {
                        let amax = bx.iter().fold(0f32, |a, v| a.max(v.abs()));
                        let err = bx.iter().zip(by).fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                        // Q2_K: 4 levels per group; the others are finer. The
                        // signed-extreme formats may clamp the opposite extreme
                        // by one step.
                        let frac = if dt == DType::Q2_K { 0.55 } else { 0.3 };
                        assert!(err <= frac * amax + 1e-30, "{dt} input {k}: error {err} vs block amax {amax}");
                    }
                }
            }
        }
    }

    /// One block of each new format built by hand, bit by bit, following
    /// ggml-common.h's structs, with the values GGML's formulas give.
    #[test]
    fn hand_built_blocks_match_ggml_layouts() {
        let one = crate::f16::f32_to_f16(1.0).to_le_bytes();
        let half = crate::f16::f32_to_f16(0.5).to_le_bytes();
        let deq = |dt: DType, b: &[u8]| {
            let mut y = vec![f32::NAN; dt.block_elems()];
            dequantize(dt, b, &mut y);
            y
        };

        // Q5_0: element 3 low nibble 5 + fifth bit (qh bit 3) -> 21 - 16 = 5;
        // element 19 high nibble 2 + qh bit 19 -> 18 - 16 = 2; others -16
        let mut b = vec![0u8; 22];
        b[0..2].copy_from_slice(&one);
        b[2..6].copy_from_slice(&((1u32 << 3) | (1 << 19)).to_le_bytes());
        b[6 + 3] = 0x25;
        let y = deq(DType::Q5_0, &b);
        assert_eq!((y[3], y[19], y[0], y[16]), (5.0, 2.0, -16.0, -16.0));

        // Q5_1: d = 0.5, m = 1, element 31 = nibble 15 + bit 31 -> 31
        let mut b = vec![0u8; 24];
        b[0..2].copy_from_slice(&half);
        b[2..4].copy_from_slice(&one);
        b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
        b[8 + 15] = 0xf0;
        let y = deq(DType::Q5_1, &b);
        assert_eq!((y[31], y[0]), (0.5 * 31.0 + 1.0, 1.0));

        // Q4_K: group 5 scale = 0b10_0011 (nibble 3 in byte 9, top bits in
        // byte 1), min = 0b01_0010 (nibble 2 in byte 9, top bits in byte 5);
        // element 32*5 + 7 = high nibble of qs byte 32*2 + 7
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&one);
        b[2..4].copy_from_slice(&half);
        b[4 + 9] = 0x23;
        b[4 + 1] = 0b10 << 6;
        b[4 + 5] = 0b01 << 6;
        b[16 + 64 + 7] = 0x90;
        let y = deq(DType::Q4_K, &b);
        assert_eq!(y[5 * 32 + 7], 35.0 * 9.0 - 0.5 * 18.0);
        assert_eq!(y[5 * 32], -0.5 * 18.0);
        assert_eq!(y[4 * 32 + 7], 0.0);

        // Q5_K: same scales; fifth bit of element 32*5 + 7 is bit 5 of qh[7]
        let mut b5 = vec![0u8; 176];
        b5[..16].copy_from_slice(&b[..16]);
        b5[16 + 7] = 1 << 5;
        b5[48..].copy_from_slice(&b[16..]);
        let y = deq(DType::Q5_K, &b5);
        assert_eq!(y[5 * 32 + 7], 35.0 * 25.0 - 0.5 * 18.0);

        // Q6_K: element 128 + 64 + 3 (h 1, k 2): high nibble of ql[64 + 3],
        // bits 4..5 of qh[32 + 3], scale 12
        let mut b = vec![0u8; 210];
        b[64 + 3] = 0xa0;
        b[128 + 32 + 3] = 0b11 << 4;
        b[192 + 12] = (-3i8) as u8;
        b[208..210].copy_from_slice(&one);
        let y = deq(DType::Q6_K, &b);
        assert_eq!(y[128 + 64 + 3], -3.0 * ((0x30 | 0xa) - 32) as f32);
        assert_eq!(y[0], 0.0); // scale 0

        // Q3_K: group 13 (h 1, j 2, l >= 16) scale: low nibble = high half
        // of byte 5, top bits = bits 6..7 of byte 9 -> 0b01_0111 = 23 - 32;
        // element 128 + 64 + 16 + 1: bits 4..5 of qs[32 + 17], hmask bit 6 of byte 17
        let mut b = vec![0u8; 110];
        b[96 + 5] = 0x70;
        b[96 + 9] = 0b01 << 6;
        b[32 + 32 + 17] = 0b10 << 4;
        b[17] = 1 << 6;
        b[108..110].copy_from_slice(&one);
        let y = deq(DType::Q3_K, &b);
        assert_eq!(y[128 + 64 + 17], (23 - 32) as f32 * 2.0);
        assert_eq!(y[128 + 64 + 18], (23 - 32) as f32 * -4.0);

        // Q2_K: group 6 (h 0, j 3, l < 16): scale 3, min 2; element 96 + 5
        // is bits 6..7 of qs[5]
        let mut b = vec![0u8; 84];
        b[6] = 0x23;
        b[16 + 5] = 0b11 << 6;
        b[80..82].copy_from_slice(&one);
        b[82..84].copy_from_slice(&half);
        let y = deq(DType::Q2_K, &b);
        assert_eq!(y[96 + 5], 3.0 * 3.0 - 0.5 * 2.0);
        assert_eq!(y[96 + 4], -1.0);
    }

    #[test]
    fn q4_0_nibble_layout_matches_ggml() {
        // element j in the low nibble, element j+16 in the high nibble
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&crate::f16::f32_to_f16(1.0).to_le_bytes());
        b[2] = 0x9f; // low 15 -> 7, high 9 -> 1
        let mut y = vec![0.0; 32];
        dequantize(DType::Q4_0, &b, &mut y);
        assert_eq!(y[0], 7.0);
        assert_eq!(y[16], 1.0);
        assert_eq!(y[1], -8.0);
    }
}
