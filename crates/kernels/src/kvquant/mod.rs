//! Per-row codecs for the KV cache's stored keys and values.
//!
//! One row is one token's key (or value) for one KV head: `d` = head_dim
//! floats. The cache stores each row as [`KvDtype::data_bytes`] bytes of codes
//! plus [`KvDtype::scale_count`] f32 side values ("scales"). The two belong
//! together: when a slot moves, its scales must move with it, or the row
//! decodes to garbage.
//!
//! Formats:
//! * `F32` — the values themselves, little-endian; `dot`/`axpy` go through
//!   [`crate::dot::dot`]/[`crate::dot::axpy`] so results are bit-identical to
//!   the dense attention path.
//! * `F16` — IEEE binary16, round-to-nearest-even.
//! * `Q8` — symmetric per group of [`KV_GROUP`]: `scale = max|x| / 127`,
//!   `code = round(x / scale)` as i8 in `-127..=127`.
//! * `Q4` — asymmetric per group of [`KV_GROUP`]: `scale = (max - min) / 15`,
//!   `code = round((x - min) / scale)` in `0..=15`, two codes a byte (element
//!   `2i` in the low nibble, `2i + 1` in the high one); scales stored as
//!   `[s0, m0, s1, m1, ...]`.
//!
//! Every row is padded to a multiple of 4 bytes so rows packed back to back in
//! an f32-aligned buffer stay 4-byte aligned (padding is written as zeros).
//!
//! Non-finite inputs never panic. F32 stores them as is; F16 maps them to
//! half infinities/NaN. Q8/Q4 compute each group's range over its finite
//! values only; `±inf` then saturates to the group's extreme code and NaN
//! encodes as code 0 (Q8: 0.0, Q4: the group minimum). A group with no finite
//! value decodes to zeros. Q4 groups whose range overflows f32 fall back to
//! `max/15 - min/15` as the scale.
//!
//! Encode, decode, dot and axpy allocate nothing; the quantized inner loops
//! work on fixed 32-element chunks with 8 partial sums so LLVM vectorises them.

use crate::f16::{f16_to_f32, f32_to_f16};

pub(crate) mod format;
mod group;
pub(crate) mod set;

pub use format::{KvDtype, KV_GROUP};
pub use group::{group_kernels, KvRun};
pub use set::{KvGroupFn, KvGroupKernels, KvRunFn};

const G: usize = KV_GROUP;

/// Element types a row's bytes can be viewed as: every bit pattern is a
/// valid value.
trait Plain {}
impl Plain for f32 {}
impl Plain for u16 {}

/// Views little-endian bytes as `&[T]` when aligned (and the target is
/// little-endian); `None` means the caller must use the byte-wise fallback.
#[inline]
fn view<T: Plain>(data: &[u8]) -> Option<&[T]> {
    // SAFETY: every bit pattern is a valid `T`; align_to only hands out the
    // correctly aligned middle part.
    let (pre, mid, post) = unsafe { data.align_to::<T>() };
    (cfg!(target_endian = "little") && pre.is_empty() && post.is_empty()).then_some(mid)
}

/// `src` stored as little-endian f32 bytes in `data`.
fn put_f32s(src: &[f32], data: &mut [u8]) {
    // SAFETY: as in `view`; any f32 written is a valid byte pattern.
    let (pre, mid, post) = unsafe { data.align_to_mut::<f32>() };
    if cfg!(target_endian = "little") && pre.is_empty() && post.is_empty() {
        mid.copy_from_slice(src);
    } else {
        for (c, &x) in data.chunks_exact_mut(4).zip(src) {
            c.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Q8 decode, one group at a time: code × scale (exact conversion, one
/// multiply, so every path gives the same bits).
fn q8_decode_scalar(codes: &[u8], scales: &[f32], out: &mut [f32]) {
    for ((og, cg), &s) in out.chunks_mut(G).zip(codes.chunks(G)).zip(scales) {
        for (o, &c) in og.iter_mut().zip(cg) {
            *o = c as i8 as f32 * s;
        }
    }
}

/// [`q8_decode_scalar`] with AVX2: 8 codes widened to i32, converted and
/// scaled per instruction (the baseline x86-64 target has no byte-to-float
/// widening, so the scalar loop does not vectorise well). Decoded KV rows
/// are on the attention path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q8_decode_avx2(codes: &[u8], scales: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let d = out.len();
    for (g, &s) in scales.iter().enumerate() {
        let start = g * G;
        let end = (start + G).min(d);
        if end - start < G {
            q8_decode_scalar(&codes[start..end], &scales[g..=g], &mut out[start..end]);
            continue;
        }
        let sv = _mm256_set1_ps(s);
        for k in (start..end).step_by(8) {
            // SAFETY: k + 8 ≤ end ≤ d = codes.len() = out.len(); unaligned loads/stores.
            unsafe {
                let b = _mm_loadl_epi64(codes.as_ptr().add(k).cast());
                let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                _mm256_storeu_ps(out.as_mut_ptr().add(k), _mm256_mul_ps(f, sv));
            }
        }
    }
}

/// `Σ c[i]·q[i]` over a full group, with 8 partial sums so it vectorises.
#[inline]
fn dot32(c: &[f32; G], q: &[f32; G]) -> f32 {
    let mut acc = [0f32; 8];
    for (cc, qc) in c.chunks_exact(8).zip(q.chunks_exact(8)) {
        for ((a, &x), &y) in acc.iter_mut().zip(cc).zip(qc) {
            *a += x * y;
        }
    }
    acc.iter().sum()
}

/// `Σ q[i]` over a full group, with 8 partial sums so it vectorises.
#[inline]
fn sum32(q: &[f32; G]) -> f32 {
    let mut acc = [0f32; 8];
    for qc in q.chunks_exact(8) {
        for (a, &y) in acc.iter_mut().zip(qc) {
            *a += y;
        }
    }
    acc.iter().sum()
}

/// The query chunk of one group as a fixed array; the short last group is
/// zero-padded (zeros contribute nothing to the sums).
#[inline]
fn q_group(qg: &[f32]) -> [f32; G] {
    let mut b = [0f32; G];
    b[..qg.len()].copy_from_slice(qg);
    b
}

/// Q8 codes of one group (`len ≤ 32` bytes) as f32, zero-padded.
#[inline]
fn unpack_q8(codes: &[u8]) -> [f32; G] {
    let mut c = [0f32; G];
    for (o, &b) in c.iter_mut().zip(codes) {
        *o = b as i8 as f32;
    }
    c
}

/// Q4 codes of one group (`len` elements, `ceil(len/2)` bytes) as f32,
/// zero-padded.
#[inline]
fn unpack_q4(bytes: &[u8]) -> [f32; G] {
    let mut c = [0f32; G];
    for (pair, &b) in c.chunks_exact_mut(2).zip(bytes) {
        pair[0] = (b & 0x0f) as f32;
        pair[1] = (b >> 4) as f32;
    }
    c
}

/// Min and max over the finite values of `x`; `(0, 0)` when there are none.
#[inline]
fn finite_range(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v.is_finite() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo > hi {
        (0.0, 0.0)
    } else {
        (lo, hi)
    }
}

impl KvDtype {
    /// Panics unless the buffers have the sizes this dtype needs for `d`.
    #[inline]
    fn check(self, d: usize, data: usize, scales: usize) {
        assert_eq!(data, self.data_bytes(d), "{self} row of {d} needs {} data bytes", self.data_bytes(d));
        assert_eq!(scales, self.scale_count(d), "{self} row of {d} needs {} scales", self.scale_count(d));
    }

    /// Quantizes `src` (len d) into `data` (len `data_bytes(d)`) and `scales`
    /// (len `scale_count(d)`); padding bytes are zeroed. Panics only on
    /// length mismatches; see the module docs for non-finite inputs.
    pub fn encode(self, src: &[f32], data: &mut [u8], scales: &mut [f32]) {
        let d = src.len();
        self.check(d, data.len(), scales.len());
        match self {
            KvDtype::F32 => put_f32s(src, data),
            KvDtype::F16 => {
                for (c, &x) in data.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f32_to_f16(x).to_le_bytes());
                }
                data[2 * d..].fill(0);
            }
            KvDtype::Q8 => {
                for ((xg, cg), s) in src.chunks(G).zip(data.chunks_mut(G)).zip(scales.iter_mut()) {
                    let amax = xg.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
                    let scale = amax / 127.0;
                    *s = scale;
                    for (c, &x) in cg.iter_mut().zip(xg) {
                        // NaN → 0 via the saturating cast; ±inf clamps.
                        let q = if scale > 0.0 { (x / scale).round().clamp(-127.0, 127.0) } else { 0.0 };
                        *c = q as i8 as u8;
                    }
                }
                data[d..].fill(0);
            }
            KvDtype::Q4 => {
                for ((xg, bg), sm) in src.chunks(G).zip(data.chunks_mut(G / 2)).zip(scales.chunks_exact_mut(2)) {
                    let (min, max) = finite_range(xg);
                    let mut scale = (max - min) / 15.0;
                    if !scale.is_finite() {
                        scale = max / 15.0 - min / 15.0;
                    }
                    sm[0] = scale;
                    sm[1] = min;
                    let code = |x: f32| -> u8 {
                        if scale > 0.0 {
                            // NaN → 0 via the saturating cast; ±inf clamps.
                            ((x - min) / scale).round().clamp(0.0, 15.0) as u8
                        } else {
                            0
                        }
                    };
                    for (b, pair) in bg.iter_mut().zip(xg.chunks(2)) {
                        let lo = code(pair[0]);
                        let hi = pair.get(1).map_or(0, |&x| code(x));
                        *b = lo | (hi << 4);
                    }
                }
                data[d.div_ceil(2)..].fill(0);
            }
        }
    }

    /// Inverse of [`encode`](Self::encode) into `out` (len d). F32 is exact;
    /// the others return the quantized values.
    pub fn decode(self, data: &[u8], scales: &[f32], out: &mut [f32]) {
        let d = out.len();
        self.check(d, data.len(), scales.len());
        match self {
            KvDtype::F32 => match view::<f32>(data) {
                Some(row) => out.copy_from_slice(row),
                None => {
                    for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
            },
            KvDtype::F16 => match view::<u16>(&data[..2 * d]) {
                Some(w) => crate::f16::f16_slice_to_f32(w, out),
                None => {
                    for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                        *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                    }
                }
            },
            KvDtype::Q8 => {
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 was just detected; lengths were checked above.
                    unsafe { q8_decode_avx2(&data[..d], scales, out) };
                    return;
                }
                q8_decode_scalar(&data[..d], scales, out);
            }
            KvDtype::Q4 => {
                for ((og, bg), sm) in out.chunks_mut(G).zip(data.chunks(G / 2)).zip(scales.chunks_exact(2)) {
                    let (s, m) = (sm[0], sm[1]);
                    let c = unpack_q4(bg);
                    for (o, &ci) in og.iter_mut().zip(&c) {
                        *o = m + s * ci;
                    }
                }
            }
        }
    }

    /// `dot(decode(row), q)` without materialising the row (q len d): the
    /// attention score of one cached key. F32 is bit-identical to
    /// [`crate::dot::dot`] on an aligned row.
    pub fn dot(self, data: &[u8], scales: &[f32], q: &[f32]) -> f32 {
        let d = q.len();
        self.check(d, data.len(), scales.len());
        match self {
            KvDtype::F32 => match view::<f32>(data) {
                Some(row) => crate::dot::dot(q, row),
                None => {
                    data.chunks_exact(4).zip(q).map(|(c, &y)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * y).sum()
                }
            },
            KvDtype::F16 => match view::<u16>(&data[..2 * d]) {
                Some(w) => (crate::dot::kernels().f16)(w, q),
                None => {
                    data.chunks_exact(2).zip(q).map(|(c, &y)| f16_to_f32(u16::from_le_bytes([c[0], c[1]])) * y).sum()
                }
            },
            KvDtype::Q8 => {
                let mut s = 0f32;
                for ((qg, cg), &sc) in q.chunks(G).zip(data.chunks(G)).zip(scales) {
                    s += sc * dot32(&unpack_q8(&cg[..qg.len()]), &q_group(qg));
                }
                s
            }
            KvDtype::Q4 => {
                let mut s = 0f32;
                for ((qg, bg), sm) in q.chunks(G).zip(data.chunks(G / 2)).zip(scales.chunks_exact(2)) {
                    let qb = q_group(qg);
                    // codes past the row's end are zero nibbles; qb is zero there too
                    let c = unpack_q4(bg);
                    s += sm[0] * dot32(&c, &qb) + sm[1] * sum32(&qb);
                }
                s
            }
        }
    }

    /// `out += a * decode(row)` without materialising the row: accumulates
    /// one cached value weighted by its attention probability. F32 calls
    /// [`crate::dot::axpy`], matching the dense path bit for bit.
    pub fn axpy(self, a: f32, data: &[u8], scales: &[f32], out: &mut [f32]) {
        let d = out.len();
        self.check(d, data.len(), scales.len());
        match self {
            KvDtype::F32 => match view::<f32>(data) {
                Some(row) => crate::dot::axpy(a, row, out),
                None => {
                    for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                        *o += a * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
            },
            KvDtype::F16 => {
                for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                    *o += a * f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            KvDtype::Q8 => {
                for ((og, cg), &s) in out.chunks_mut(G).zip(data.chunks(G)).zip(scales) {
                    let as_ = a * s;
                    let c = unpack_q8(&cg[..og.len()]);
                    for (o, &ci) in og.iter_mut().zip(&c) {
                        *o += as_ * ci;
                    }
                }
            }
            KvDtype::Q4 => {
                for ((og, bg), sm) in out.chunks_mut(G).zip(data.chunks(G / 2)).zip(scales.chunks_exact(2)) {
                    let (as_, am) = (a * sm[0], a * sm[1]);
                    let c = unpack_q4(bg);
                    for (o, &ci) in og.iter_mut().zip(&c) {
                        *o += as_ * ci + am;
                    }
                }
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    const DS: [usize; 6] = [1, 7, 32, 33, 64, 128];

    /// Deterministic, sign-varying, non-periodic-ish test data.
    fn data(d: usize, seed: f32) -> Vec<f32> {
        (0..d).map(|i| (i as f32 * 0.37 + seed).sin() * 2.5 + (i as f32 * 1.3 + seed).cos() * 0.7).collect()
    }

    /// A 4-byte-aligned byte buffer of `n` bytes (backed by u32s).
    pub(super) struct Aligned(Vec<u32>, usize);
    impl Aligned {
        fn new(n: usize) -> Self {
            Aligned(vec![0; n.div_ceil(4)], n)
        }
        pub(super) fn bytes(&self) -> &[u8] {
            // SAFETY: u32 storage viewed as bytes, within its length.
            unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.1) }
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            // SAFETY: as above; every byte pattern is a valid u32.
            unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, self.1) }
        }
    }

    pub(super) fn enc(k: KvDtype, x: &[f32]) -> (Aligned, Vec<f32>) {
        let mut buf = Aligned::new(k.data_bytes(x.len()));
        let mut sc = vec![0f32; k.scale_count(x.len())];
        k.encode(x, buf.bytes_mut(), &mut sc);
        (buf, sc)
    }

    pub(super) fn dec(k: KvDtype, buf: &Aligned, sc: &[f32], d: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; d];
        k.decode(buf.bytes(), sc, &mut out);
        out
    }

    #[test]
    fn kvquant_round_trip() {
        for d in DS {
            let x = data(d, 0.3);
            for k in KvDtype::ALL {
                let (buf, sc) = enc(k, &x);
                let y = dec(k, &buf, &sc, d);
                // the side values are exactly the documented ones (so other code may rely on them)
                for (g, xg) in x.chunks(KV_GROUP).enumerate() {
                    let (lo, hi) = xg.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                    let amax = lo.abs().max(hi.abs());
                    match k {
                        KvDtype::Q8 => assert_eq!(sc[g], amax / 127.0, "q8 scale d={d} g={g}"),
                        KvDtype::Q4 => assert_eq!((sc[2 * g], sc[2 * g + 1]), ((hi - lo) / 15.0, lo), "q4 d={d} g={g}"),
                        _ => {}
                    }
                }
                for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                    let err = (a - b).abs();
                    match k {
                        KvDtype::F32 => assert_eq!(a.to_bits(), b.to_bits(), "f32 d={d} i={i}"),
                        KvDtype::F16 => assert!(err <= 1e-3 * a.abs(), "f16 d={d} i={i}: {a} vs {b}"),
                        KvDtype::Q8 => {
                            let s = sc[i / KV_GROUP];
                            assert!(s > 0.0);
                            assert!(err <= s / 2.0 + 1e-6, "q8 d={d} i={i}: {a} vs {b}, scale {s}");
                        }
                        KvDtype::Q4 => {
                            let s = sc[2 * (i / KV_GROUP)];
                            let group_len = (d - i / KV_GROUP * KV_GROUP).min(KV_GROUP);
                            assert!(group_len == 1 || s > 0.0, "q4 d={d} i={i}: non-constant group has scale 0");
                            assert!(err <= s / 2.0 + 1e-6, "q4 d={d} i={i}: {a} vs {b}, scale {s}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn kvquant_dot_axpy_match_decode() {
        for d in DS {
            let x = data(d, 1.1);
            let q = data(d, 4.2);
            let a = 0.73f32;
            for k in KvDtype::ALL {
                let (buf, sc) = enc(k, &x);
                let y = dec(k, &buf, &sc, d);

                let want = crate::dot::dot(&y, &q);
                let got = k.dot(buf.bytes(), &sc, &q);
                let mag: f32 = y.iter().zip(&q).map(|(u, v)| (u * v).abs()).sum();
                assert!((got - want).abs() <= 1e-4 * mag.max(1e-6), "{k} dot d={d}: {got} vs {want}");
                if k == KvDtype::F32 {
                    assert_eq!(got.to_bits(), crate::dot::dot(&q, &x).to_bits(), "f32 dot not bit-identical");
                }

                let base = data(d, 7.7);
                let mut want = base.clone();
                for (w, &v) in want.iter_mut().zip(&y) {
                    *w += a * v;
                }
                let mut got = base.clone();
                k.axpy(a, buf.bytes(), &sc, &mut got);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let tol = 1e-4 * (base[i].abs() + (a * y[i]).abs()).max(1e-6);
                    assert!((g - w).abs() <= tol, "{k} axpy d={d} i={i}: {g} vs {w}");
                }
                if k == KvDtype::F32 {
                    let mut dense = base.clone();
                    crate::dot::axpy(a, &x, &mut dense);
                    assert!(got.iter().zip(&dense).all(|(u, v)| u.to_bits() == v.to_bits()));
                }
            }
        }
    }

    #[test]
    fn kvquant_sizes() {
        for d in (0..=130).chain([256, 1000]) {
            for k in KvDtype::ALL {
                assert_eq!(k.data_bytes(d) % 4, 0, "{k} d={d}");
            }
            assert_eq!(KvDtype::F32.data_bytes(d), 4 * d);
            assert!(KvDtype::F16.data_bytes(d) >= 2 * d && KvDtype::F16.data_bytes(d) < 2 * d + 4);
            assert!(KvDtype::Q8.data_bytes(d) >= d && KvDtype::Q8.data_bytes(d) < d + 4);
            assert!(KvDtype::Q4.data_bytes(d) >= d.div_ceil(2) && KvDtype::Q4.data_bytes(d) < d.div_ceil(2) + 4);
            assert_eq!(KvDtype::F32.scale_count(d), 0);
            assert_eq!(KvDtype::F16.scale_count(d), 0);
            assert_eq!(KvDtype::Q8.scale_count(d), d.div_ceil(32));
            assert_eq!(KvDtype::Q4.scale_count(d), 2 * d.div_ceil(32));
        }
        assert_eq!(KvDtype::Q4.data_bytes(7), 4);
        assert_eq!(KvDtype::F16.data_bytes(1), 4);
        assert_eq!(KvDtype::Q8.scale_count(33), 2);
    }

    #[test]
    fn kvquant_constant_and_zero_rows() {
        for d in DS {
            let zero = vec![0f32; d];
            for k in KvDtype::ALL {
                let (buf, sc) = enc(k, &zero);
                assert!(dec(k, &buf, &sc, d).iter().all(|&v| v.to_bits() == 0), "{k} zero d={d}");
                assert_eq!(k.dot(buf.bytes(), &sc, &data(d, 0.5)), 0.0);
            }
            for c in [1.5f32, -3.25, 1e-3] {
                let row = vec![c; d];
                let (buf, sc) = enc(KvDtype::Q4, &row);
                assert!(dec(KvDtype::Q4, &buf, &sc, d).iter().all(|&v| v == c), "q4 constant {c} d={d}");
                // Q8 with a constant row is within the usual bound
                let (buf, sc) = enc(KvDtype::Q8, &row);
                assert!(dec(KvDtype::Q8, &buf, &sc, d).iter().all(|&v| (v - c).abs() <= sc[0] / 2.0 + 1e-6));
            }
        }
    }

    #[test]
    fn kvquant_scales_travel_with_slot() {
        for d in [32, 64, 128] {
            let a = data(d, 0.1);
            let b: Vec<f32> = data(d, 2.9).iter().map(|v| v * 10.0).collect();
            for k in [KvDtype::Q8, KvDtype::Q4] {
                let (buf_a, sc_a) = enc(k, &a);
                let (_, sc_b) = enc(k, &b);
                let right = dec(k, &buf_a, &sc_a, d);
                let wrong = dec(k, &buf_a, &sc_b, d);
                let diff: f32 = right.iter().zip(&wrong).map(|(u, v)| (u - v).abs()).sum();
                assert!(diff > 1.0, "{k} decoding with another row's scales changed nothing");
                let q = data(d, 3.3);
                assert_ne!(k.dot(buf_a.bytes(), &sc_a, &q), k.dot(buf_a.bytes(), &sc_b, &q));
            }
        }
    }

    #[test]
    fn kvquant_non_finite_inputs_do_not_panic() {
        let mut x = data(40, 0.9);
        x[0] = f32::NAN;
        x[3] = f32::INFINITY;
        x[5] = f32::NEG_INFINITY;
        x[35] = f32::NAN;
        for k in KvDtype::ALL {
            let (buf, sc) = enc(k, &x);
            let y = dec(k, &buf, &sc, x.len());
            let mut out = vec![0f32; x.len()];
            k.axpy(1.0, buf.bytes(), &sc, &mut out);
            let _ = k.dot(buf.bytes(), &sc, &x);
            if matches!(k, KvDtype::Q8 | KvDtype::Q4) {
                assert!(sc.iter().all(|s| s.is_finite()), "{k} scales {sc:?}");
                assert!(y.iter().all(|v| v.is_finite()), "{k} decoded {y:?}");
                // untouched finite values keep their accuracy
                let s = sc[0]; // first group's scale for both Q8 and Q4
                assert!((y[1] - x[1]).abs() <= s / 2.0 + 1e-6);
            }
        }
        // all-NaN group decodes to zeros
        let nan = vec![f32::NAN; 8];
        for k in [KvDtype::Q8, KvDtype::Q4] {
            let (buf, sc) = enc(k, &nan);
            assert!(dec(k, &buf, &sc, 8).iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn kvquant_misaligned_f32_fallback() {
        let d = 9;
        let x = data(d, 0.4);
        let q = data(d, 1.8);
        let mut store = vec![0u8; 4 * d + 1];
        let bytes = &mut store[1..];
        let mut sc: [f32; 0] = [];
        // may or may not be aligned depending on the allocator; both paths must agree
        KvDtype::F32.encode(&x, bytes, &mut sc);
        let mut y = vec![0f32; d];
        KvDtype::F32.decode(bytes, &sc, &mut y);
        assert_eq!(x, y);
        let dot = KvDtype::F32.dot(bytes, &sc, &q);
        assert!((dot - crate::dot::dot(&x, &q)).abs() <= 1e-5);
    }

    #[test]
    fn kvquant_from_str() {
        for k in KvDtype::ALL {
            assert_eq!(k.to_string().parse::<KvDtype>(), Ok(k));
            assert_eq!(k.name().to_uppercase().parse::<KvDtype>(), Ok(k));
        }
        assert_eq!(KvDtype::default(), KvDtype::F32);
        let err = "q5".parse::<KvDtype>().unwrap_err();
        assert!(err.contains("'q5'"), "{err}");
        for name in ["f32", "f16", "q8", "q4"] {
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn q8_decode_paths_agree_bit_for_bit() {
        for d in [7, 32, 40, 64, 128] {
            let src: Vec<f32> = (0..d).map(|i| (i as f32 * 0.71).sin() * 3.0).collect();
            let mut data = vec![0u8; KvDtype::Q8.data_bytes(d)];
            let mut scales = vec![0f32; KvDtype::Q8.scale_count(d)];
            KvDtype::Q8.encode(&src, &mut data, &mut scales);
            let (mut a, mut b) = (vec![0f32; d], vec![0f32; d]);
            KvDtype::Q8.decode(&data, &scales, &mut a);
            q8_decode_scalar(&data[..d], &scales, &mut b);
            assert_eq!(a, b, "d = {d}");
        }
    }
}
