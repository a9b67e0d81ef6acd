//! A weight matrix kept in its stored type, with the two products a
//! transformer needs: GEMV for single-token decode and GEMM for prefill.

use crate::dot::{bytemuck_f32, dot_row, kernels};
use crate::dtype::DType;
use crate::quant::dequantize;
use crate::KernelError;
use rayon::prelude::*;

/// Work (rows × cols) below which a product runs on the calling thread:
/// rayon's fork/join costs more than it saves on tiny matrices.
const PARALLEL_MIN_WORK: usize = 1 << 16;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// Row-major `rows × cols` matrix (rows = output features), 64-byte aligned.
pub struct Matrix {
    rows: usize,
    cols: usize,
    dtype: DType,
    row_bytes: usize,
    lines: Vec<CacheLine>,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({}x{} {})", self.rows, self.cols, self.dtype)
    }
}

impl Matrix {
    /// Builds a matrix from raw little-endian bytes in `dtype`'s layout.
    pub fn from_bytes(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        if !cols.is_multiple_of(dtype.block_elems()) {
            return Err(KernelError::BlockAlignment { dtype, block: dtype.block_elems(), cols });
        }
        let row_bytes = dtype.bytes_for(cols);
        let expected = row_bytes * rows;
        if bytes.len() != expected {
            return Err(KernelError::ByteLength { dtype, rows, cols, expected, got: bytes.len() });
        }
        let mut lines = vec![CacheLine([0; 64]); expected.div_ceil(64)];
        // SAFETY: `lines` owns at least `expected` bytes; CacheLine is plain bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, expected) };
        dst.copy_from_slice(bytes);
        Ok(Matrix { rows, cols, dtype, row_bytes, lines })
    }

    /// Builds an f32 matrix.
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Self, KernelError> {
        // SAFETY: viewing f32s as their bytes is always valid.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 4) };
        Self::from_bytes(DType::F32, rows, cols, bytes)
    }

    /// Quantizes f32 data into `dtype` (synthetic models, tests).
    pub fn quantized(dtype: DType, rows: usize, cols: usize, data: &[f32]) -> Result<Self, KernelError> {
        Self::from_bytes(dtype, rows, cols, &crate::quant::quantize(dtype, data))
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Bytes of weight data (what a GEMV streams from memory).
    pub fn nbytes(&self) -> usize {
        self.row_bytes * self.rows
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `lines` holds at least row_bytes*rows initialised bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.row_bytes * self.rows) }
    }

    /// Raw bytes of row `r`.
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Dequantizes row `r` into `out` (embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        dequantize(self.dtype, self.row_bytes(r), &mut out[..self.cols]);
    }

    /// The whole matrix as f32 (tests, conversions).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = vec![0f32; self.rows * self.cols];
        dequantize(self.dtype, self.bytes(), &mut v);
        v
    }

    /// out[r] = W[r,:]·x. Threaded over rows when the matrix is large.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "matvec input length");
        assert_eq!(out.len(), self.rows, "matvec output length");
        let k = kernels();
        let (dt, rb) = (self.dtype, self.row_bytes);
        let bytes = self.bytes();
        let row_fn = |(r, o): (usize, &mut f32)| *o = dot_row(k, dt, &bytes[r * rb..(r + 1) * rb], x);
        if self.rows * self.cols < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
            out.iter_mut().enumerate().for_each(row_fn);
        } else {
            let chunk = (self.rows / (rayon::current_num_threads() * 4)).max(16);
            out.par_chunks_mut(chunk).enumerate().for_each(|(c, o)| {
                let base = c * chunk;
                for (i, v) in o.iter_mut().enumerate() {
                    *v = dot_row(k, dt, &bytes[(base + i) * rb..(base + i + 1) * rb], x);
                }
            });
        }
    }

    /// out[t, r] = W[r,:]·x[t,:] for `n` input rows, each product computed
    /// by exactly the arithmetic of [`Matrix::matvec`], so the result equals
    /// `n` separate `matvec` calls bit for bit, while each weight row is
    /// read from memory once (rows outer, tokens inner). Used to verify
    /// speculative drafts with the numerics of single-token decode.
    pub fn matvec_many(&self, x: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "matvec_many input length");
        assert_eq!(out.len(), n * self.rows, "matvec_many output length");
        if n == 1 {
            return self.matvec(x, out);
        }
        let k = kernels();
        let (dt, rb, cols, rows) = (self.dtype, self.row_bytes, self.cols, self.rows);
        let bytes = self.bytes();
        // [rows, n]: one contiguous run per weight row
        let mut transposed = vec![0f32; rows * n];
        let per_row = |r: usize, o: &mut [f32]| {
            let row = &bytes[r * rb..(r + 1) * rb];
            for (t, v) in o.iter_mut().enumerate() {
                *v = dot_row(k, dt, row, &x[t * cols..(t + 1) * cols]);
            }
        };
        if rows * cols < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
            transposed.chunks_mut(n).enumerate().for_each(|(r, o)| per_row(r, o));
        } else {
            let chunk = (rows / (rayon::current_num_threads() * 4)).max(16);
            transposed.par_chunks_mut(chunk * n).enumerate().for_each(|(c, o)| {
                for (i, orow) in o.chunks_mut(n).enumerate() {
                    per_row(c * chunk + i, orow);
                }
            });
        }
        for (r, tr) in transposed.chunks_exact(n).enumerate() {
            for (t, &v) in tr.iter().enumerate() {
                out[t * rows + r] = v;
            }
        }
    }

    /// out[t, r] = W[r,:]·x[t,:] for `n` input rows (prefill). Weight rows
    /// are dequantized once per block of rows and reused for every token;
    /// the products run as 4-row × 4-token register tiles.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "matmul input length");
        assert_eq!(out.len(), n * self.rows, "matmul output length");
        if n == 1 {
            return self.matvec(x, out);
        }
        // rows per task: their f32 copy (16 × cols × 4 bytes) and a group of
        // four token rows stay in L2 while the tiles pass over them
        const ROW_BLOCK: usize = 16;
        let (rows, cols) = (self.rows, self.cols);
        let mut transposed = vec![0f32; rows * n];
        let k = kernels();
        let bytes = self.bytes();
        let rb = self.row_bytes;
        let work = |(b, tb): (usize, &mut [f32])| {
            let r0 = b * ROW_BLOCK;
            let nr = tb.len() / n;
            let raw = &bytes[r0 * rb..(r0 + nr) * rb];
            let deq;
            let w: &[f32] = if self.dtype == DType::F32 {
                bytemuck_f32(raw)
            } else {
                let mut v = vec![0f32; nr * cols];
                (k.dequantize)(self.dtype, raw, &mut v);
                deq = v;
                &deq
            };
            let row = |i: usize| &w[i.min(nr - 1) * cols..][..cols];
            let tok = |t: usize| &x[t.min(n - 1) * cols..][..cols];
            let mut tile = [[0f32; 4]; 4];
            for t in (0..n).step_by(4) {
                let xs = [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)];
                let m = (n - t).min(4);
                for i in (0..nr).step_by(4) {
                    let ws = [row(i), row(i + 1), row(i + 2), row(i + 3)];
                    (k.dot4x4)(&ws, &xs, &mut tile);
                    for (a, tr) in tile.iter().enumerate().take(nr - i) {
                        tb[(i + a) * n + t..][..m].copy_from_slice(&tr[..m]);
                    }
                }
            }
        };
        if rows * cols * n < PARALLEL_MIN_WORK {
            transposed.chunks_mut(ROW_BLOCK * n).enumerate().for_each(work);
        } else {
            transposed.par_chunks_mut(ROW_BLOCK * n).enumerate().for_each(work);
        }
        for (t, o) in out.chunks_exact_mut(rows).enumerate() {
            for (r, v) in o.iter_mut().enumerate() {
                *v = transposed[r * n + t];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols).map(|i| ((i * 31 % 113) as f32 - 56.0) / 40.0).collect()
    }

    #[test]
    fn matvec_many_equals_separate_matvecs_bit_for_bit() {
        for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_1] {
            // the large shape takes the threaded path
            for (rows, cols) in [(300, 128), (1024, 256)] {
                let m = Matrix::quantized(dt, rows, cols, &data(rows, cols)).unwrap();
                let n = 5;
                let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7 % 29) as f32 - 14.0) / 9.0).collect();
                let mut many = vec![0f32; n * rows];
                m.matvec_many(&x, n, &mut many);
                for t in 0..n {
                    let mut one = vec![0f32; rows];
                    m.matvec(&x[t * cols..(t + 1) * cols], &mut one);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&many[t * rows..(t + 1) * rows]), bits(&one), "{dt} token {t}");
                }
            }
        }
    }

    #[test]
    fn matvec_and_matmul_agree_with_naive() {
        for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_1] {
            let (rows, cols, n) = (300, 128, 5);
            let m = Matrix::quantized(dt, rows, cols, &data(rows, cols)).unwrap();
            let w = m.to_f32();
            let x: Vec<f32> = (0..n * cols).map(|i| ((i % 17) as f32 - 8.0) / 9.0).collect();
            let mut out = vec![0f32; n * rows];
            m.matmul(&x, n, &mut out);
            for t in 0..n {
                let mut mv = vec![0f32; rows];
                m.matvec(&x[t * cols..(t + 1) * cols], &mut mv);
                for r in 0..rows {
                    let want: f32 = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c]).sum();
                    assert!((out[t * rows + r] - want).abs() < 1e-3, "{dt} gemm");
                    assert!((mv[r] - want).abs() < 1e-3, "{dt} gemv");
                }
            }
        }
    }

    #[test]
    fn wrong_byte_length_is_an_error() {
        let e = Matrix::from_bytes(DType::Q8_0, 2, 32, &[0u8; 67]).unwrap_err();
        assert!(e.to_string().contains("needs 68 bytes"), "{e}");
        let e = Matrix::from_bytes(DType::Q4_0, 1, 20, &[0u8; 18]).unwrap_err();
        assert!(e.to_string().contains("multiple of 32"), "{e}");
    }
}
