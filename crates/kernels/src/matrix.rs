//! A weight matrix kept in its stored type, with the two products a
//! transformer needs: GEMV for single-token decode and GEMM for prefill.

use crate::dot::{bytemuck_f32, dot_row, kernels, DotKernels, GEMM_MR, GEMM_NR};
use crate::dtype::DType;
use crate::int8::{self, Activations, PANEL_ROWS, TILE_TOKENS};
use crate::quant::dequantize;
use crate::KernelError;
use rayon::prelude::*;

/// Work (rows × cols) below which a product runs on the calling thread:
/// rayon's fork/join costs more than it saves on tiny matrices.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// How a matrix's products treat the activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// Weights dequantized to f32 (in registers or panels), f32 activations.
    F32,
    /// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and Q4_K/Q5_K/Q6_K only
    /// ([`int8::supports`]): weights repacked into 16-row panels, activations
    /// quantized to 8 bits per block of 32, exact integer block sums
    /// (`crate::int8`; what llama.cpp does for these formats).
    Int8,
}

impl Products {
    /// What [`Matrix::from_bytes`] uses for `dtype` on this CPU: `Int8` for
    /// the formats that have it when the CPU has AVX-512 VNNI (unless
    /// `KVSLIM_INT8=0`), else `F32`.
    pub fn preferred(dtype: DType) -> Products {
        if int8::supports(dtype) && int8::tile_kernel().is_some() {
            Products::Int8
        } else {
            Products::F32
        }
    }
}

/// Bytes of a transparent huge page (x86-64 and most aarch64 kernels).
const HUGE_PAGE: usize = 2 << 20;

/// A matrix's bytes (and the buffer `kvslim bench` measures the read
/// bandwidth on, so that its bound is for the same pages): zeroed and
/// 64-byte aligned. A decode step streams every weight once, and the CPU's
/// prefetchers stop at page boundaries: a buffer of a megabyte or more is
/// aligned to a huge page (2 MiB), rounded up to whole ones where that
/// adds at most an eighth, and on Linux asks for transparent huge pages
/// before its memory is first touched, where the system allows them
/// (`/sys/kernel/mm/transparent_hugepage/enabled` set to `madvise` or
/// `always`; otherwise, or elsewhere, the pages are ordinary ones).
pub struct Lines {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: `Lines` owns its allocation like a `Vec<u8>`.
unsafe impl Send for Lines {}
// SAFETY: shared access only reads.
unsafe impl Sync for Lines {}

impl Lines {
    /// At least `bytes` zeroed bytes.
    pub fn zeroed(bytes: usize) -> Self {
        let huge = bytes >= HUGE_PAGE / 2;
        let align = if huge { HUGE_PAGE } else { 64 };
        // a partly covered last huge page is backed by small pages: round up
        // to whole huge pages where that adds at most an eighth
        let whole = bytes.next_multiple_of(HUGE_PAGE);
        let size = if huge && (whole - bytes) * 8 <= bytes { whole } else { bytes.max(64).next_multiple_of(64) };
        let layout = std::alloc::Layout::from_size_align(size, align).expect("a matrix's size fits a layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        #[cfg(target_os = "linux")]
        if align == HUGE_PAGE {
            // SAFETY: the range is this allocation; the advice changes how it
            // is backed, never its contents. A refusal is harmless.
            unsafe { libc::madvise(raw as *mut libc::c_void, layout.size(), libc::MADV_HUGEPAGE) };
        }
        // SAFETY: `raw` holds `layout.size()` writable bytes.
        unsafe { std::ptr::write_bytes(raw, 0, layout.size()) };
        Lines { ptr, layout }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A `rows × cols` weight matrix (rows = output features), 64-byte aligned:
/// row-major in its stored type, or repacked into integer panels.
pub struct Matrix {
    rows: usize,
    cols: usize,
    dtype: DType,
    row_bytes: usize,
    products: Products,
    lines: Lines,
    len: usize,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({}x{} {})", self.rows, self.cols, self.dtype)
    }
}

impl Matrix {
    /// Builds a matrix from raw little-endian bytes in `dtype`'s layout,
    /// with this CPU's preferred products ([`Products::preferred`]).
    pub fn from_bytes(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        Self::from_bytes_with(dtype, rows, cols, bytes, Products::preferred(dtype))
    }

    /// As [`Matrix::from_bytes`] with the products chosen (`Int8` falls back
    /// to `F32` for formats without an integer path).
    pub fn from_bytes_with(
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        products: Products,
    ) -> Result<Self, KernelError> {
        if !cols.is_multiple_of(dtype.block_elems()) {
            return Err(KernelError::BlockAlignment { dtype, block: dtype.block_elems(), cols });
        }
        let row_bytes = dtype.bytes_for(cols);
        let expected = row_bytes * rows;
        if bytes.len() != expected {
            return Err(KernelError::ByteLength { dtype, rows, cols, expected, got: bytes.len() });
        }
        let products = if int8::supports(dtype) { products } else { Products::F32 };
        let len = match products {
            Products::F32 => expected,
            Products::Int8 => int8::packed_len(dtype, rows, cols),
        };
        let mut lines = Lines::zeroed(len);
        let dst = &mut lines.bytes_mut()[..len];
        match products {
            Products::F32 => dst.copy_from_slice(bytes),
            Products::Int8 => int8::pack(dtype, rows, cols, bytes, dst),
        }
        Ok(Matrix { rows, cols, dtype, row_bytes, products, lines, len })
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

    /// As [`Matrix::quantized`] with the products chosen.
    pub fn quantized_with(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[f32],
        products: Products,
    ) -> Result<Self, KernelError> {
        Self::from_bytes_with(dtype, rows, cols, &crate::quant::quantize(dtype, data), products)
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
    /// The products this matrix computes with.
    pub fn products(&self) -> Products {
        self.products
    }

    /// Switches to `products` (a no-op for formats without an integer
    /// path): repacks the same stored weights, bit for bit.
    pub fn set_products(&mut self, products: Products) {
        if self.products == products || !int8::supports(self.dtype) {
            return;
        }
        let mut raw = vec![0u8; self.row_bytes * self.rows];
        for (r, row) in raw.chunks_exact_mut(self.row_bytes.max(1)).enumerate().take(self.rows) {
            match self.products {
                Products::F32 => row.copy_from_slice(&self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]),
                Products::Int8 => int8::unpack_row(self.dtype, self.bytes(), self.cols, r, row),
            }
        }
        *self = Self::from_bytes_with(self.dtype, self.rows, self.cols, &raw, products)
            .expect("the shape was valid when this matrix was built");
    }
    /// Bytes of weight data (what a GEMV streams from memory).
    pub fn nbytes(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
        &self.lines.bytes()[..self.len]
    }

    /// Dequantizes row `r` into `out` (embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match self.products {
            Products::F32 => {
                let raw = &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes];
                dequantize(self.dtype, raw, &mut out[..self.cols])
            }
            Products::Int8 => int8::dequantize_row(self.dtype, self.bytes(), self.cols, r, out),
        }
    }

    /// The whole matrix as f32 (tests, conversions).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = vec![0f32; self.rows * self.cols];
        for (r, row) in v.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows) {
            self.row_into(r, row);
        }
        v
    }

    /// out[r] = W[r,:]·x. Threaded over rows when the matrix is large.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "matvec input length");
        assert_eq!(out.len(), self.rows, "matvec output length");
        if self.products == Products::Int8 {
            return self.int8_products(x, 1, out);
        }
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
        if self.products_done(x, n, out, "matvec_many") {
            return;
        }
        let k = kernels();
        let (dt, rb, cols) = (self.dtype, self.row_bytes, self.cols);
        let bytes = self.bytes();
        self.row_products(n, self.rows * cols, out, |_: &mut (), r, o| {
            let row = &bytes[r * rb..(r + 1) * rb];
            for (t, v) in o.iter_mut().enumerate() {
                *v = dot_row(k, dt, row, &x[t * cols..(t + 1) * cols]);
            }
        });
    }

    /// What [`Matrix::matvec_many`] and [`Matrix::matmul`] (`what`) share:
    /// the shapes of `x` and `out` for `n` tokens are checked, and the
    /// integer path, when it is on, or one `matvec` for a single token
    /// computes the whole product (true).
    fn products_done(&self, x: &[f32], n: usize, out: &mut [f32], what: &str) -> bool {
        assert_eq!(x.len(), n * self.cols, "{what} input length");
        assert_eq!(out.len(), n * self.rows, "{what} output length");
        if self.products == Products::Int8 {
            self.int8_products(x, n, out);
        } else if n == 1 {
            self.matvec(x, out);
        } else {
            return false;
        }
        true
    }

    /// Fills `out[t, r]` (`n` tokens × `rows`) from `row(state, r, o)`,
    /// which writes weight row `r`'s `n` products into `o`: rows outer,
    /// tokens inner, so each weight row is read once; threaded over row
    /// chunks (one `state` per worker) when `work` is large.
    fn row_products<S: Default>(
        &self,
        n: usize,
        work: usize,
        out: &mut [f32],
        row: impl Fn(&mut S, usize, &mut [f32]) + Sync,
    ) {
        let rows = self.rows;
        // [rows, n]: one contiguous run per weight row
        let mut transposed = vec![0f32; rows * n];
        if work < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
            let mut state = S::default();
            transposed.chunks_mut(n).enumerate().for_each(|(r, o)| row(&mut state, r, o));
        } else {
            let chunk = (rows / (rayon::current_num_threads() * 4)).max(16);
            transposed.par_chunks_mut(chunk * n).enumerate().for_each_init(S::default, |state, (c, o)| {
                for (i, orow) in o.chunks_mut(n).enumerate() {
                    row(state, c * chunk + i, orow);
                }
            });
        }
        for (r, tr) in transposed.chunks_exact(n).enumerate() {
            for (t, &v) in tr.iter().enumerate() {
                out[t * rows + r] = v;
            }
        }
    }

    /// out[t, r] = W[r,:]·x[t,:] for `n` input rows (prefill).
    ///
    /// A packed-panel GEMM: the activations are transposed once into
    /// panels of [`GEMM_NR`] tokens (`cols × GEMM_NR`, token-minor); each
    /// task takes [`GEMM_MR`] weight rows, dequantizes them once into a
    /// `cols × GEMM_MR` panel (about 74 KiB at 576 columns, so it stays in
    /// L2 while every token panel passes over it) and runs the
    /// [`DotKernels::gemm_tile`] micro-kernel per token panel, which
    /// broadcasts activations against whole vectors of weight rows and so
    /// needs no horizontal sums or transposes. Results are the f32 products
    /// summed over `k` in order, so they agree with the row dots to rounding.
    /// Threaded over row panels when the product is large.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        if self.products_done(x, n, out, "matmul") {
            return;
        }
        let (rows, cols) = (self.rows, self.cols);
        if rows == 0 || cols == 0 {
            out.fill(0.0);
            return;
        }
        if n < FEW_TOKENS {
            return self.matmul_few(x, n, out);
        }
        let k = kernels();
        let xp = pack_tokens(x, n, cols);
        let bytes = self.bytes();
        let (rb, dt) = (self.row_bytes, self.dtype);
        let out_ptr = SyncPtr(out.as_mut_ptr());
        let work = |p: usize| {
            let r0 = p * GEMM_MR;
            let nr = (rows - r0).min(GEMM_MR);
            let panel = pack_rows(k, dt, &bytes[r0 * rb..(r0 + nr) * rb], nr, cols);
            let mut tile = [[0f32; GEMM_MR]; GEMM_NR];
            for (g, xg) in xp.chunks_exact(cols * GEMM_NR).enumerate() {
                let t0 = g * GEMM_NR;
                let nt = (n - t0).min(GEMM_NR);
                (k.gemm_tile)(&panel, xg, nt, &mut tile);
                for (j, tr) in tile.iter().enumerate().take(nt) {
                    // SAFETY: token t0 + j < n and rows r0..r0 + nr < rows, so
                    // the write is inside `out`; tasks own disjoint row ranges.
                    unsafe {
                        let dst = out_ptr.at((t0 + j) * rows + r0);
                        std::ptr::copy_nonoverlapping(tr.as_ptr(), dst, nr);
                    }
                }
            }
        };
        let panels = rows.div_ceil(GEMM_MR);
        if rows * cols * n < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
            (0..panels).for_each(work);
        } else {
            (0..panels).into_par_iter().for_each(work);
        }
    }
}

impl Matrix {
    /// `out[t, r]` by the integer micro-kernel (equal to `n` single-token
    /// products bit for bit): the activations quantized
    /// once (into a per-thread buffer, so decode allocates nothing), then
    /// per 16-row panel every tile of [`TILE_TOKENS`] tokens; threaded over
    /// panels when the product is large.
    fn int8_products(&self, x: &[f32], n: usize, out: &mut [f32]) {
        thread_local! {
            static SCRATCH: std::cell::Cell<Activations> = std::cell::Cell::new(Activations::default());
        }
        let (rows, cols, dt) = (self.rows, self.cols, self.dtype);
        if rows == 0 || cols == 0 {
            out.fill(0.0);
            return;
        }
        // taken, not borrowed: a nested product on this thread (rayon work
        // stealing) finds an empty buffer instead of a conflict
        let mut acts = SCRATCH.with(|s| s.take());
        acts.quantize(dt, x, n, cols);
        let tile = int8::tile_kernel().or_else(int8::vnni_tile).unwrap_or(int8::scalar_tile);
        let panel_len = int8::packed_len(dt, PANEL_ROWS, cols);
        let bytes = self.bytes();
        let out_ptr = SyncPtr(out.as_mut_ptr());
        let acts_ref = &acts;
        let work = |g: usize| {
            let panel = &bytes[g * panel_len..(g + 1) * panel_len];
            let (r0, nr) = (g * PANEL_ROWS, (rows - g * PANEL_ROWS).min(PANEL_ROWS));
            let mut o = [[0f32; PANEL_ROWS]; TILE_TOKENS];
            for t0 in (0..n).step_by(TILE_TOKENS) {
                let nt = (n - t0).min(TILE_TOKENS);
                tile(dt, panel, acts_ref, t0, nt, &mut o);
                for (j, v) in o.iter().enumerate().take(nt) {
                    // SAFETY: token t0 + j < n and rows r0..r0 + nr ≤ rows, so
                    // the write is inside `out`; tasks own disjoint row ranges.
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out_ptr.at((t0 + j) * rows + r0), nr) };
                }
            }
        };
        let groups = rows.div_ceil(PANEL_ROWS);
        let threads = rayon::current_num_threads();
        if rows * cols * n < PARALLEL_MIN_WORK || threads == 1 {
            (0..groups).for_each(work);
        } else {
            let min_len = (groups / (threads * 4)).max(1);
            (0..groups).into_par_iter().with_min_len(min_len).for_each(work);
        }
        SCRATCH.with(|s| s.set(acts));
    }
}

/// Below this many tokens [`Matrix::matmul`] dequantizes each weight row
/// once and runs one f32 dot per token ([`Matrix::matmul_few`]): packing
/// panels for the GEMM tile costs more than it saves on a few tokens (a
/// speculative verification chunk, a short prompt).
pub const FEW_TOKENS: usize = GEMM_NR;

impl Matrix {
    /// `matmul` for a few tokens: per weight row, one dequantization into
    /// f32 and `n` f32 dot products against it (rows threaded when large).
    /// Agrees with the row dots to rounding.
    fn matmul_few(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let k = kernels();
        let (dt, rb, cols) = (self.dtype, self.row_bytes, self.cols);
        let bytes = self.bytes();
        self.row_products(n, self.rows * cols * n, out, |buf: &mut Vec<f32>, r, o| {
            let raw = &bytes[r * rb..(r + 1) * rb];
            let w: &[f32] = if dt == DType::F32 {
                bytemuck_f32(raw)
            } else {
                buf.resize(cols, 0.0);
                (k.dequantize)(dt, raw, buf);
                buf
            };
            for (t, v) in o.iter_mut().enumerate() {
                *v = (k.f32)(w, &x[t * cols..(t + 1) * cols]);
            }
        });
    }
}

/// A raw output pointer shared by GEMM tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: only used by `Matrix::matmul`, whose tasks write disjoint ranges.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The pointer `i` elements on (a method, so closures capture the
    /// whole `Sync` wrapper rather than its raw field).
    #[inline]
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// The `n × cols` activations as panels of [`GEMM_NR`] tokens, each
/// `cols × GEMM_NR` with the tokens of one column adjacent; tokens past `n`
/// in the last panel are zero.
fn pack_tokens(x: &[f32], n: usize, cols: usize) -> Vec<f32> {
    let groups = n.div_ceil(GEMM_NR);
    let mut xp = vec![0f32; groups * cols * GEMM_NR];
    let pack = |(g, pg): (usize, &mut [f32])| {
        for (j, xt) in x.chunks_exact(cols).skip(g * GEMM_NR).take(GEMM_NR).enumerate() {
            for (c, &v) in xt.iter().enumerate() {
                pg[c * GEMM_NR + j] = v;
            }
        }
    };
    // a few percent of a prefill product when done on one thread
    if n * cols < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
        xp.chunks_exact_mut(cols * GEMM_NR).enumerate().for_each(pack);
    } else {
        xp.par_chunks_exact_mut(cols * GEMM_NR).enumerate().for_each(pack);
    }
    xp
}

/// The `nr` (≤ [`GEMM_MR`]) weight rows in `raw` dequantized into one
/// `cols × GEMM_MR` panel (the rows of one column adjacent; rows past `nr`
/// zero). Each row is dequantized into an L1-sized buffer first and then
/// scattered, so the bulk dequantizers of every type apply unchanged.
fn pack_rows(k: &DotKernels, dt: DType, raw: &[u8], nr: usize, cols: usize) -> Vec<f32> {
    let mut panel = vec![0f32; cols * GEMM_MR];
    let mut row = vec![0f32; if dt == DType::F32 { 0 } else { cols }];
    let rb = raw.len() / nr;
    for (i, r) in raw.chunks_exact(rb).enumerate() {
        let w: &[f32] = if dt == DType::F32 {
            bytemuck_f32(r)
        } else {
            (k.dequantize)(dt, r, &mut row);
            &row
        };
        for (c, &v) in w.iter().enumerate() {
            panel[c * GEMM_MR + i] = v;
        }
    }
    panel
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
            for ((rows, cols), products) in [(300, 128), (1024, 256)].into_iter().zip([Products::F32, Products::Int8]) {
                let m = Matrix::quantized_with(dt, rows, cols, &data(rows, cols), products).unwrap();
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
            let m = Matrix::quantized_with(dt, rows, cols, &data(rows, cols), Products::F32).unwrap();
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

    /// The packed-panel GEMM on every weight type against a naive f32
    /// product of the dequantized weights: row counts off the 32-row panel
    /// (1, 31, 33, 70), token counts off the 12-token panel, and a product
    /// large enough to take the threaded path.
    #[test]
    fn matmul_matches_naive_on_every_dtype_and_ragged_shapes() {
        for dt in DType::ALL {
            let cols = if dt.is_k_quant() { 512 } else { 96 };
            for (rows, ns) in [(1, &[2usize, 3][..]), (31, &[13]), (33, &[12, 25]), (70, &[5, 37])] {
                let m = Matrix::quantized_with(dt, rows, cols, &data(rows, cols), Products::F32).unwrap();
                let w = m.to_f32();
                for &n in ns {
                    let x: Vec<f32> = (0..n * cols).map(|i| ((i * 13 % 37) as f32 - 18.0) / 17.0).collect();
                    let mut out = vec![f32::NAN; n * rows];
                    m.matmul(&x, n, &mut out);
                    for t in 0..n {
                        for r in 0..rows {
                            let (want, mag) = (0..cols).fold((0f64, 0f64), |(s, a), c| {
                                let v = w[r * cols + c] as f64 * x[t * cols + c] as f64;
                                (s + v, a + v.abs())
                            });
                            let got = out[t * rows + r] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * mag.max(1.0),
                                "{dt} {rows}x{cols} n={n} [{t}][{r}]: {got} vs {want}"
                            );
                        }
                    }
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
