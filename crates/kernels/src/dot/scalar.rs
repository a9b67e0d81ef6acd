//! Portable reference kernels: the scalar set of [`super::DotKernels`],
//! which every SIMD set is tested against.

use super::set::{GEMM_MR, GEMM_NR};
use crate::dtype::DType;
use crate::f16::{bf16_to_f32, f16_to_f32};
use crate::quant::QK;

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

/// Q4_0 (`MIN` false: d·(q − 8)) or Q4_1 (`MIN` true: d·q + m) row · x.
pub fn dot_q4<const MIN: bool>(w: &[u8], x: &[f32]) -> f32 {
    let (bb, head, bias) = if MIN { (20, 4, 0) } else { (18, 2, 8) };
    let mut s = 0f32;
    for (b, xb) in w.chunks_exact(bb).zip(x.chunks_exact(QK)) {
        let (mut acc, mut xsum) = (0f32, 0f32);
        for j in 0..16 {
            let q = b[head + j];
            acc += ((q & 0x0f) as i32 - bias) as f32 * xb[j];
            acc += ((q >> 4) as i32 - bias) as f32 * xb[j + 16];
            xsum += xb[j] + xb[j + 16];
        }
        s += if MIN { scale(b, 0) * acc + scale(b, 2) * xsum } else { scale(b, 0) * acc };
    }
    s
}

/// Σ w·x over the whole blocks of a Q5 or K-quant row: each block is
/// dequantized (exactly as [`crate::quant::dequantize`]) into a stack
/// buffer and dotted with 8 partial sums, so the result is
/// dequantize-then-dot up to the order of the f32 additions.
fn dot_blocks(dt: DType, w: &[u8], x: &[f32]) -> f32 {
    let (bb, be) = (dt.block_bytes(), dt.block_elems());
    let mut buf = [0f32; crate::quant::QK_K];
    let mut s = 0f32;
    for (b, xb) in w.chunks_exact(bb).zip(x.chunks_exact(be)) {
        crate::quant::dequantize_block(dt, b, &mut buf);
        s += dot_f32(&buf[..be], xb);
    }
    s
}

/// A Q5 or K-quant row (of the format `DType::ALL[T]`) · x.
pub fn dot_blocks_of<const T: u8>(w: &[u8], x: &[f32]) -> f32 {
    dot_blocks(DType::ALL[T as usize], w, x)
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

pub fn dot4x4(w: &[&[f32]; 4], x: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
    for (o, wi) in out.iter_mut().zip(w) {
        for (oj, xj) in o.iter_mut().zip(x) {
            *oj = dot_f32(wi, xj);
        }
    }
}

/// Reference GEMM micro-kernel (see [`super::DotKernels::gemm_tile`]).
pub fn gemm_tile(w: &[f32], x: &[f32], nt: usize, out: &mut [[f32; GEMM_MR]; GEMM_NR]) {
    let nt = nt.min(GEMM_NR);
    for o in out.iter_mut().take(nt) {
        *o = [0.0; GEMM_MR];
    }
    for (wk, xk) in w.chunks_exact(GEMM_MR).zip(x.chunks_exact(GEMM_NR)) {
        for (o, &xv) in out.iter_mut().zip(xk).take(nt) {
            for (oi, &wv) in o.iter_mut().zip(wk) {
                *oi += wv * xv;
            }
        }
    }
}
