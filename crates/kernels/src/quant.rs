//! Scalar reference code for the GGML block formats: dequantize and quantize.
//! The SIMD dot kernels in [`crate::dot`] are tested against these.

use crate::dtype::DType;
use crate::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Block size shared by every quantized format.
pub const QK: usize = 32;

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
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
    }

    #[test]
    fn quantize_dequantize_error_is_bounded() {
        let x = ramp(256);
        for (dt, tol) in [
            (DType::F32, 0.0),
            (DType::F16, 2e-3),
            (DType::BF16, 2e-2),
            (DType::Q8_0, 0.03),
            (DType::Q4_0, 0.4),
            (DType::Q4_1, 0.2),
        ] {
            let q = quantize(dt, &x);
            assert_eq!(q.len(), dt.bytes_for(x.len()));
            let mut y = vec![0.0; x.len()];
            dequantize(dt, &q, &mut y);
            let err = x.iter().zip(&y).fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(err <= tol, "{dt}: max error {err} > {tol}");
        }
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
