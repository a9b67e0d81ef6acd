//! Integer products for the 32-element block formats Q4_0, Q4_1 and Q8_0:
//! the activations are quantized to 8 bits per block of 32 (one f32 scale
//! per block, as GGML's Q8 activations) and every product of a weight block
//! with an activation block is an exact integer sum (AVX-512 VNNI
//! `vpdpbusd`: 64 unsigned × signed byte products per instruction), scaled
//! once per block. That replaces dequantizing every weight to f32, which is
//! what bounds the f32 path on a small quantized model.
//!
//! The weights are repacked once, at load, into panels of [`PANEL_ROWS`]
//! rows: per block of 32 columns a 64-byte header (the 16 rows' f16 scales
//! `d`, then their f16 minimums `m` for Q4_1) and the quants interleaved so
//! that one 64-byte load holds four consecutive quants of each of the 16
//! rows — one row per 32-bit lane, so the sums come out as a vector of 16
//! rows with no horizontal reduction. The panel keeps the stored precision
//! (4-bit quants stay 4-bit) and takes the same bytes as the original rows
//! (Q4_0: 11% more, its header has room for the unused minimums).
//!
//! Every output is computed lane by lane with the same operations whatever
//! the number of tokens, so a product over `n` tokens equals `n` single-token
//! products bit for bit, and the portable [`scalar_tile`] equals the SIMD
//! kernel bit for bit (the integer sums are exact; each block then adds
//! `isum · (d · dx)` and `m · sx` with fused multiply-adds, in that order).

use crate::dtype::DType;
use crate::f16::f16_to_f32;
use crate::quant::QK;
use std::sync::OnceLock;

/// Weight rows per panel: one per 32-bit lane of a 512-bit vector.
pub const PANEL_ROWS: usize = 16;
/// Tokens per micro-tile: 8 integer and 8 f32 accumulators, 16 of the 32
/// vector registers.
pub const TILE_TOKENS: usize = 8;
/// Bytes of a panel block's header: 16 f16 scales, then 16 f16 minimums;
/// the quants follow it.
pub(crate) const HEADER: usize = 64;
/// Offset of the minimums inside a panel block's header.
pub(crate) const MIN_OFFSET: usize = 32;

/// Whether `dtype` has an integer path.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Bytes of one panel block (16 rows × 32 columns): the header, then a
/// byte (Q8_0) or a nibble (Q4_x) per quant.
pub(crate) fn block_bytes(dtype: DType) -> usize {
    HEADER + if dtype == DType::Q8_0 { PANEL_ROWS * QK } else { PANEL_ROWS * QK / 2 }
}

/// Bytes of a `rows × cols` matrix in panel layout (rows padded to 16).
pub fn packed_len(dtype: DType, rows: usize, cols: usize) -> usize {
    rows.div_ceil(PANEL_ROWS) * (cols / QK) * block_bytes(dtype)
}

/// Bytes of one stored block of 32 in the original row layout.
fn raw_block_bytes(dtype: DType) -> usize {
    dtype.bytes_for(QK)
}

/// Repacks `rows` rows in the original block layout (`raw`) into panels
/// written to `out` (`packed_len` bytes; padding rows are zero).
pub fn pack(dtype: DType, rows: usize, cols: usize, raw: &[u8], out: &mut [u8]) {
    debug_assert!(supports(dtype));
    let (blocks, rb, bb) = (cols / QK, raw_block_bytes(dtype), block_bytes(dtype));
    out.fill(0);
    for r in 0..rows {
        let (g, i) = (r / PANEL_ROWS, r % PANEL_ROWS);
        for b in 0..blocks {
            let src = &raw[(r * blocks + b) * rb..(r * blocks + b + 1) * rb];
            let dst = &mut out[(g * blocks + b) * bb..(g * blocks + b + 1) * bb];
            dst[2 * i..2 * i + 2].copy_from_slice(&src[0..2]);
            match dtype {
                DType::Q4_1 => {
                    dst[MIN_OFFSET + 2 * i..MIN_OFFSET + 2 * i + 2].copy_from_slice(&src[2..4]);
                    spread_nibbles(&src[4..20], i, &mut dst[HEADER..]);
                }
                DType::Q4_0 => spread_nibbles(&src[2..18], i, &mut dst[HEADER..]),
                _ => {
                    for (k, &q) in src[2..34].iter().enumerate() {
                        // unsigned for vpdpbusd: q + 128
                        dst[HEADER + (k / 4) * 64 + 4 * i + k % 4] = q ^ 0x80;
                    }
                }
            }
        }
    }
}

/// Lane `i` of load `j` holds nibble bytes `4j..4j + 4` (low nibbles are
/// columns `4j..4j + 4`, high nibbles columns `16 + 4j..`).
fn spread_nibbles(nibbles: &[u8], i: usize, quants: &mut [u8]) {
    for (k, &q) in nibbles.iter().enumerate() {
        quants[(k / 4) * 64 + 4 * i + k % 4] = q;
    }
}

/// Writes row `r`'s original block bytes (as stored in the file) into `raw`.
pub fn unpack_row(dtype: DType, packed: &[u8], cols: usize, r: usize, raw: &mut [u8]) {
    let (blocks, rb, bb) = (cols / QK, raw_block_bytes(dtype), block_bytes(dtype));
    let (g, i) = (r / PANEL_ROWS, r % PANEL_ROWS);
    for b in 0..blocks {
        let at = (g * blocks + b) * bb;
        unpack_block(dtype, &packed[at..at + bb], i, &mut raw[b * rb..(b + 1) * rb]);
    }
}

/// Row `i`'s original block (`dst`) from one panel block (`src`).
fn unpack_block(dtype: DType, src: &[u8], i: usize, dst: &mut [u8]) {
    dst[0..2].copy_from_slice(&src[2 * i..2 * i + 2]);
    let quants = &src[HEADER..];
    let gather = |k: usize| quants[(k / 4) * 64 + 4 * i + k % 4];
    match dtype {
        DType::Q4_1 => {
            dst[2..4].copy_from_slice(&src[MIN_OFFSET + 2 * i..MIN_OFFSET + 2 * i + 2]);
            (0..16).for_each(|k| dst[4 + k] = gather(k));
        }
        DType::Q4_0 => (0..16).for_each(|k| dst[2 + k] = gather(k)),
        _ => (0..32).for_each(|k| dst[2 + k] = gather(k) ^ 0x80),
    }
}

/// Dequantizes row `r` of a panel matrix into `out` (`cols` values), bit
/// for bit as [`crate::quant::dequantize`] of the original row.
pub fn dequantize_row(dtype: DType, packed: &[u8], cols: usize, r: usize, out: &mut [f32]) {
    let blocks = cols / QK;
    let mut raw = [0u8; 34];
    let rb = raw_block_bytes(dtype);
    let (g, i) = (r / PANEL_ROWS, r % PANEL_ROWS);
    let bb = block_bytes(dtype);
    for (b, o) in out[..cols].chunks_exact_mut(QK).enumerate() {
        let at = (g * blocks + b) * bb;
        unpack_block(dtype, &packed[at..at + bb], i, &mut raw[..rb]);
        crate::quant::dequantize(dtype, &raw[..rb], o);
    }
}

/// `n` activation rows quantized to 8 bits per block of 32: `q` (n × cols),
/// per block the scale `d` (`x ≈ d · q`) and `s = d · Σ q` (for the
/// weights' minimums), both n × blocks.
#[derive(Default)]
pub struct Activations {
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl Activations {
    /// Quantizes the `n × cols` row-major `x`, reusing this value's buffers
    /// (with AVX-512 when the integer micro-kernel is in use; the result is
    /// the same bit for bit).
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        let blocks = cols / QK;
        self.cols = cols;
        self.q.resize(n * cols, 0);
        self.d.resize(n * blocks, 0.0);
        self.s.resize(n * blocks, 0.0);
        let x = &x[..n * cols];
        #[cfg(target_arch = "x86_64")]
        if vnni_tile().is_some() {
            return crate::simd::avx512::int8_quantize(x, &mut self.q, &mut self.d, &mut self.s);
        }
        quantize_blocks(x, &mut self.q, &mut self.d, &mut self.s);
    }

    fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Raw parts for the SIMD kernels: (quants, scales, sums, cols).
    pub(crate) fn parts(&self) -> (&[i8], &[f32], &[f32], usize) {
        (&self.q, &self.d, &self.s, self.cols)
    }
}

/// The portable activation quantizer, per block of 32: `d = amax / 127`,
/// `q = round_ties_even(x / d)` (as `x · (1 / d)`, clamped to ±127), `s = d ·
/// Σ q`. A zero block gets `d = 0` and zero quants. Non-finite activations
/// give unspecified (but bounded) quants.
pub fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), d), s) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d).zip(s) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            sum += *q as i32;
        }
        *d = scale;
        *s = scale * sum as f32;
    }
}

/// Micro-kernel: rows `16g..16g + 16` (the panel `panel`, all blocks of one
/// row group) times tokens `t0..t0 + nt` (`nt ≤ TILE_TOKENS`) of `x`;
/// `out[j][i]` = row `i` · token `t0 + j`.
pub type TileFn = fn(DType, &[u8], &Activations, usize, usize, &mut [[f32; PANEL_ROWS]; TILE_TOKENS]);

/// The portable micro-kernel: the arithmetic every SIMD version reproduces
/// bit for bit.
pub fn scalar_tile(
    dtype: DType,
    panel: &[u8],
    x: &Activations,
    t0: usize,
    nt: usize,
    out: &mut [[f32; PANEL_ROWS]; TILE_TOKENS],
) {
    let (blocks, bb, cols) = (x.blocks(), block_bytes(dtype), x.cols);
    for (j, o) in out.iter_mut().enumerate().take(nt) {
        let t = t0 + j;
        let xq = &x.q[t * cols..(t + 1) * cols];
        for (i, acc) in o.iter_mut().enumerate() {
            let mut sum = 0f32;
            for b in 0..blocks {
                let blk = &panel[b * bb..(b + 1) * bb];
                let d = f16_to_f32(u16::from_le_bytes([blk[2 * i], blk[2 * i + 1]]));
                let m = match dtype {
                    DType::Q4_1 => {
                        f16_to_f32(u16::from_le_bytes([blk[MIN_OFFSET + 2 * i], blk[MIN_OFFSET + 2 * i + 1]]))
                    }
                    DType::Q4_0 => d * -8.0,
                    _ => d * -128.0,
                };
                let quants = &blk[HEADER..];
                let xb = &xq[b * QK..(b + 1) * QK];
                let mut isum = 0i32;
                for k in 0..QK {
                    let w = match dtype {
                        DType::Q8_0 => quants[(k / 4) * 64 + 4 * i + k % 4],
                        _ => {
                            let kk = k % 16;
                            let byte = quants[(kk / 4) * 64 + 4 * i + kk % 4];
                            if k < 16 {
                                byte & 0x0f
                            } else {
                                byte >> 4
                            }
                        }
                    };
                    isum += w as i32 * xb[k] as i32;
                }
                let (xd, xs) = (x.d[t * blocks + b], x.s[t * blocks + b]);
                sum = (isum as f32).mul_add(d * xd, sum);
                sum = m.mul_add(xs, sum);
            }
            *acc = sum;
        }
    }
}

/// The fastest micro-kernel this CPU has, if the integer path is enabled:
/// AVX-512 VNNI, unless `KVSLIM_INT8=0` or `KVSLIM_SIMD` asks for a lower
/// level. `None` keeps the f32 path (weights dequantized, f32 activations).
pub fn tile_kernel() -> Option<TileFn> {
    static TILE: OnceLock<Option<TileFn>> = OnceLock::new();
    *TILE.get_or_init(|| {
        let off = std::env::var("KVSLIM_INT8").is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false"));
        if off || crate::dot::kernels().isa != "avx512" {
            return None;
        }
        vnni_tile()
    })
}

/// The VNNI micro-kernel when the CPU has it (tests compare it with
/// [`scalar_tile`] directly). Detected once: every product asks.
pub fn vnni_tile() -> Option<TileFn> {
    static VNNI: OnceLock<Option<TileFn>> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            crate::simd::avx512::int8_tile()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{Matrix, Products};
    use crate::quant::{dequantize, quantize};

    const DTYPES: [DType; 3] = [DType::Q4_0, DType::Q4_1, DType::Q8_0];

    /// Deterministic values with a spread of magnitudes and signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * if s & 1 == 0 { 4.0 } else { 0.25 }
            })
            .collect()
    }

    #[test]
    fn panels_keep_every_row_bit_for_bit() {
        for dt in DTYPES {
            for (rows, cols) in [(1, 32), (17, 64), (40, 96)] {
                let raw = quantize(dt, &values(rows * cols, 3));
                let mut packed = vec![0u8; packed_len(dt, rows, cols)];
                pack(dt, rows, cols, &raw, &mut packed);
                let rb = dt.bytes_for(cols);
                let mut back = vec![0u8; rb];
                for r in 0..rows {
                    unpack_row(dt, &packed, cols, r, &mut back);
                    assert_eq!(back, raw[r * rb..(r + 1) * rb], "{dt} row {r}");
                    let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
                    dequantize(dt, &raw[r * rb..(r + 1) * rb], &mut want);
                    dequantize_row(dt, &packed, cols, r, &mut got);
                    assert_eq!(want, got, "{dt} row {r}");
                }
            }
        }
    }

    #[test]
    fn activations_round_trip_within_half_a_step() {
        let x = values(3 * 64, 5);
        let mut a = Activations::default();
        a.quantize(&x, 3, 64);
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let d = a.d[b];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((d - amax / 127.0).abs() <= 1e-7 * amax.max(1.0));
            let mut sum = 0i32;
            for (k, &v) in xb.iter().enumerate() {
                let q = a.q[b * QK + k];
                assert!((v - d * q as f32).abs() <= 0.5 * d * (1.0 + 1e-5), "block {b} [{k}]");
                sum += q as i32;
            }
            assert_eq!(a.s[b], d * sum as f32);
        }
        // an all-zero block has a zero scale and zero quants
        a.quantize(&[0.0; 32], 1, 32);
        assert_eq!((a.d[0], a.s[0], a.q.iter().all(|&q| q == 0)), (0.0, 0.0, true));
    }

    /// The SIMD activation quantizer is the scalar one, bit for bit
    /// (including ties: values at exactly half a step).
    #[test]
    fn simd_quantizer_equals_scalar() {
        if vnni_tile().is_none() {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
            return;
        }
        let mut x = values(40 * QK, 21);
        // a block whose steps land on exact ties: amax 127 → d = 1
        for (k, v) in x[..QK].iter_mut().enumerate() {
            *v = k as f32 - 15.5;
        }
        x[QK - 1] = 127.0;
        x[2 * QK..3 * QK].fill(0.0);
        let mut a = Activations::default();
        a.quantize(&x, 40, QK);
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; 40], vec![0f32; 40]);
        quantize_blocks(&x, &mut q, &mut d, &mut s);
        assert_eq!(a.q, q);
        assert_eq!(
            a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            a.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // ties go to even: -15.5 → -16, 0.5 → 0, 1.5 → 2
        assert_eq!((q[0], q[15], q[16], q[17]), (-16, 0, 0, 2));
    }

    /// The SIMD micro-kernel is the scalar one, bit for bit, on every
    /// format and token count (extreme activations included).
    #[test]
    fn vnni_tile_equals_scalar_tile_bit_for_bit() {
        let Some(vnni) = vnni_tile() else {
            eprintln!("no AVX-512 VNNI on this CPU: nothing to compare");
            return;
        };
        for dt in DTYPES {
            let (rows, cols, n) = (16, 160, 11);
            let raw = quantize(dt, &values(rows * cols, 7));
            let mut packed = vec![0u8; packed_len(dt, rows, cols)];
            pack(dt, rows, cols, &raw, &mut packed);
            let mut x = values(n * cols, 9);
            x[5] = 1e6;
            x[40] = -3e-8;
            let mut a = Activations::default();
            a.quantize(&x, n, cols);
            for t0 in [0, 3] {
                for nt in 1..=TILE_TOKENS {
                    let (mut want, mut got) = ([[0f32; PANEL_ROWS]; TILE_TOKENS], [[1f32; PANEL_ROWS]; TILE_TOKENS]);
                    scalar_tile(dt, &packed, &a, t0, nt, &mut want);
                    vnni(dt, &packed, &a, t0, nt, &mut got);
                    for j in 0..nt {
                        let bits = |v: &[f32; PANEL_ROWS]| v.map(f32::to_bits);
                        assert_eq!(bits(&got[j]), bits(&want[j]), "{dt} t0={t0} nt={nt} token {j}");
                    }
                }
            }
        }
    }

    /// Integer products over `n` tokens: equal to `n` single-token products
    /// bit for bit, equal to the exact product of the quantized operands to
    /// f32 rounding, and within the activation quantization's error of the
    /// f32 product; ragged row counts and the threaded path included.
    #[test]
    fn integer_products_match_references() {
        for dt in DTYPES {
            for (rows, cols, n) in [(5, 64, 3), (37, 96, 13), (600, 256, 9)] {
                let raw = quantize(dt, &values(rows * cols, 11));
                let m = Matrix::from_bytes_with(dt, rows, cols, &raw, Products::Int8).unwrap();
                assert_eq!(m.products(), Products::Int8);
                let w = m.to_f32();
                let x = values(n * cols, 13);
                let mut out = vec![f32::NAN; n * rows];
                m.matmul(&x, n, &mut out);
                let mut many = vec![f32::NAN; n * rows];
                m.matvec_many(&x, n, &mut many);
                let mut a = Activations::default();
                a.quantize(&x, n, cols);
                for t in 0..n {
                    let mut one = vec![f32::NAN; rows];
                    m.matvec(&x[t * cols..(t + 1) * cols], &mut one);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&out[t * rows..(t + 1) * rows]), bits(&one), "{dt} token {t}");
                    assert_eq!(bits(&many[t * rows..(t + 1) * rows]), bits(&one), "{dt} token {t}");
                    for r in 0..rows {
                        let got = out[t * rows + r] as f64;
                        // exact product of the quantized operands (f64)
                        let (mut exact, mut mag, mut full) = (0f64, 0f64, 0f64);
                        for c in 0..cols {
                            let b = t * (cols / QK) + c / QK;
                            let xq = a.d[b] as f64 * a.q[t * cols + c] as f64;
                            exact += w[r * cols + c] as f64 * xq;
                            mag += (w[r * cols + c] as f64 * xq).abs();
                            full += w[r * cols + c] as f64 * x[t * cols + c] as f64;
                        }
                        assert!((got - exact).abs() <= 1e-5 * mag.max(1e-3), "{dt} [{t}][{r}]: {got} vs {exact}");
                        // each activation moves by at most half a step (amax/254)
                        let bound: f64 = (0..cols)
                            .map(|c| {
                                let xb = &x[t * cols + c / QK * QK..t * cols + c / QK * QK + QK];
                                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                (w[r * cols + c] as f64).abs() * amax / 254.0
                            })
                            .sum();
                        assert!((got - full).abs() <= bound * 1.01 + 1e-5 * mag, "{dt} [{t}][{r}]");
                    }
                }
            }
        }
    }
}
