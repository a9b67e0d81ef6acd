//! Fused dequantize-dot products: one weight row (in its stored type) times
//! an f32 activation vector. These are the inner loops of GEMV and GEMM.
//!
//! The best implementation for the running CPU is chosen once
//! ([`kernels`]); the scalar versions are the reference every SIMD version
//! is tested against.

use crate::dtype::DType;
use crate::f16::{bf16_to_f32, f16_to_f32};
use crate::quant::QK;
use std::sync::OnceLock;

/// Row-times-vector kernels for each storage type. `w` is the raw row (bytes
/// for the block formats); `x` the activations; both cover the same elements.
#[derive(Clone, Copy)]
pub struct DotKernels {
    /// Name of the instruction set in use (shown by `kvslim bench`).
    pub isa: &'static str,
    pub f32: fn(&[f32], &[f32]) -> f32,
    pub f16: fn(&[u16], &[f32]) -> f32,
    pub bf16: fn(&[u16], &[f32]) -> f32,
    pub q8_0: fn(&[u8], &[f32]) -> f32,
    pub q4_0: fn(&[u8], &[f32]) -> f32,
    pub q4_1: fn(&[u8], &[f32]) -> f32,
    /// y += a·x
    pub axpy: fn(f32, &[f32], &mut [f32]),
}

impl DotKernels {
    /// The portable reference kernels.
    pub const SCALAR: DotKernels = DotKernels {
        isa: "scalar",
        f32: scalar::dot_f32,
        f16: scalar::dot_f16,
        bf16: scalar::dot_bf16,
        q8_0: scalar::dot_q8_0,
        q4_0: scalar::dot_q4_0,
        q4_1: scalar::dot_q4_1,
        axpy: scalar::axpy,
    };
}

static KERNELS: OnceLock<DotKernels> = OnceLock::new();

/// The kernels for this CPU, detected on first use. Setting the environment
/// variable `KVSLIM_SIMD=scalar` forces the reference kernels.
pub fn kernels() -> &'static DotKernels {
    KERNELS.get_or_init(|| {
        if std::env::var("KVSLIM_SIMD").as_deref() == Ok("scalar") {
            return DotKernels::SCALAR;
        }
        detect()
    })
}

fn detect() -> DotKernels {
    DotKernels::SCALAR
}

/// Dot product of two f32 slices with the detected kernel.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    (kernels().f32)(a, b)
}

/// y += a·x with the detected kernel.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    (kernels().axpy)(a, x, y)
}

/// Dispatches a row dot by storage type.
#[inline]
pub fn dot_row(k: &DotKernels, dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    match dtype {
        DType::F32 => (k.f32)(bytemuck_f32(row), x),
        DType::F16 => (k.f16)(bytemuck_u16(row), x),
        DType::BF16 => (k.bf16)(bytemuck_u16(row), x),
        DType::Q8_0 => (k.q8_0)(row, x),
        DType::Q4_0 => (k.q4_0)(row, x),
        DType::Q4_1 => (k.q4_1)(row, x),
    }
}

/// Reinterprets aligned bytes as f32 (the matrix storage guarantees alignment).
#[inline]
pub(crate) fn bytemuck_f32(b: &[u8]) -> &[f32] {
    assert!(b.as_ptr() as usize % 4 == 0 && b.len() % 4 == 0);
    // SAFETY: alignment and length checked above; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) }
}

/// Reinterprets aligned bytes as u16.
#[inline]
pub(crate) fn bytemuck_u16(b: &[u8]) -> &[u16] {
    assert!(b.as_ptr() as usize % 2 == 0 && b.len() % 2 == 0);
    // SAFETY: alignment and length checked above; every bit pattern is a valid u16.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u16, b.len() / 2) }
}

/// Portable reference kernels.
pub mod scalar {
    use super::*;

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        // 8 partial sums: lets the compiler vectorise and bounds the error growth
        let mut acc = [0f32; 8];
        let n = a.len().min(b.len());
        let (a8, b8) = (&a[..n / 8 * 8], &b[..n / 8 * 8]);
        for (ca, cb) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
            for i in 0..8 {
                acc[i] += ca[i] * cb[i];
            }
        }
        let mut s: f32 = acc.iter().sum();
        for i in n / 8 * 8..n {
            s += a[i] * b[i];
        }
        s
    }

    pub fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
        w.iter().zip(x).map(|(&h, &v)| f16_to_f32(h) * v).sum()
    }

    pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
        w.iter().zip(x).map(|(&h, &v)| bf16_to_f32(h) * v).sum()
    }

    fn scale(b: &[u8], at: usize) -> f32 {
        f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
    }

    pub fn dot_q8_0(w: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xb) in w.chunks_exact(34).zip(x.chunks_exact(QK)) {
            let mut acc = 0f32;
            for (q, v) in b[2..].iter().zip(xb) {
                acc += (*q as i8) as f32 * v;
            }
            s += scale(b, 0) * acc;
        }
        s
    }

    pub fn dot_q4_0(w: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xb) in w.chunks_exact(18).zip(x.chunks_exact(QK)) {
            let mut acc = 0f32;
            for j in 0..16 {
                let q = b[2 + j];
                acc += ((q & 0x0f) as i32 - 8) as f32 * xb[j];
                acc += ((q >> 4) as i32 - 8) as f32 * xb[j + 16];
            }
            s += scale(b, 0) * acc;
        }
        s
    }

    pub fn dot_q4_1(w: &[u8], x: &[f32]) -> f32 {
        let mut s = 0f32;
        for (b, xb) in w.chunks_exact(20).zip(x.chunks_exact(QK)) {
            let mut acc = 0f32;
            let mut xsum = 0f32;
            for j in 0..16 {
                let q = b[4 + j];
                acc += (q & 0x0f) as f32 * xb[j];
                acc += (q >> 4) as f32 * xb[j + 16];
                xsum += xb[j] + xb[j + 16];
            }
            s += scale(b, 0) * acc + scale(b, 2) * xsum;
        }
        s
    }

    pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * xi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, quantize};

    /// Every kernel set agrees with dequantize-then-dot in f64.
    #[test]
    fn detected_kernels_match_reference() {
        let k = kernels();
        for n in [32usize, 64, 96, 576, 1536] {
            let w: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 50.0)
                .collect();
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 104729 % 97) as f32 - 48.0) / 30.0)
                .collect();
            for dt in [
                DType::F32,
                DType::F16,
                DType::BF16,
                DType::Q8_0,
                DType::Q4_0,
                DType::Q4_1,
            ] {
                let bytes = quantize(dt, &w);
                let mut deq = vec![0f32; n];
                dequantize(dt, &bytes, &mut deq);
                let want: f64 = deq.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                // copy into aligned storage as the matrix does
                let aligned: Vec<u32> = {
                    let mut v = vec![0u32; bytes.len().div_ceil(4)];
                    // SAFETY: v has at least bytes.len() bytes
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            v.as_mut_ptr() as *mut u8,
                            bytes.len(),
                        )
                    };
                    v
                };
                // SAFETY: aligned holds bytes.len() initialised bytes
                let row = unsafe {
                    std::slice::from_raw_parts(aligned.as_ptr() as *const u8, bytes.len())
                };
                for kset in [&DotKernels::SCALAR, k] {
                    let got = dot_row(kset, dt, row, &x) as f64;
                    let tol = 1e-4 * (1.0 + want.abs()) + 1e-5 * n as f64;
                    assert!(
                        (got - want).abs() <= tol,
                        "{} {dt} n={n}: {got} vs {want}",
                        kset.isa
                    );
                }
            }
        }
    }

    #[test]
    fn axpy_matches() {
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let mut y = vec![1.0; 37];
        axpy(0.5, &x, &mut y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, 1.0 + 0.5 * i as f32);
        }
    }
}
