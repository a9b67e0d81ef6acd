//! Integer products for the block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! the K-quants Q4_K, Q5_K and Q6_K: the activations are quantized to 8 bits
//! per block of 32 (one f32 scale per block, as GGML's Q8 activations) and
//! every product of a 32-column weight block with an activation block is an
//! exact integer sum (AVX-512 VNNI `vpdpbusd`: 64 unsigned × signed byte
//! products per instruction), scaled once per block (twice for Q6_K, whose
//! scales cover 16 columns). That replaces dequantizing every weight to f32,
//! which is what bounds the f32 path on a small quantized model.
//!
//! The weights are repacked once, at load, into panels of [`PANEL_ROWS`]
//! rows. Per block of 32 columns a panel block holds a header (the 16 rows'
//! scales and minimums), the quants interleaved so that one 64-byte load
//! holds four consecutive quants of each of the 16 rows — one row per 32-bit
//! lane, so the sums come out as a vector of 16 rows with no horizontal
//! reduction — and, for the 5-bit formats, bit planes (Q6_K: its high bits
//! as 2-bit "crumbs" beside the nibbles, see `crumb_at`). The K-quants
//! keep their super-block's f16 `d` (and `dmin`) once per 256 columns, in a
//! super-block header before its 8 blocks, as the file does: a decode step
//! is bound by the bytes it streams, so the panels should be no larger than
//! the file's blocks.
//!
//! | format | super-block header (16 rows) | block header (16 rows) | quants | high bits | bits per weight (file) |
//! |---|---|---|---|---|---|
//! | Q8_0 | — | 64 B: f16 `d` | 512 B: `q + 128` | — | 9.0 (8.5) |
//! | Q4_0, Q4_1 | — | 64 B: f16 `d`, f16 `m` | 256 B nibbles | — | 5.0 (4.5, 5.0) |
//! | Q5_0, Q5_1 | — | 64 B: f16 `d`, f16 `m` | 256 B nibbles | bit 4 | 6.0 (5.5, 6.0) |
//! | Q4_K | 64 B: f16 `d`, `dmin` | 32 B: u8 `sc`, `m` | 256 B nibbles | — | 4.625 (4.5) |
//! | Q5_K | 64 B: f16 `d`, `dmin` | 32 B: u8 `sc`, `m` | 256 B nibbles | bit 4 | 5.625 (5.5) |
//! | Q6_K | 32 B: f16 `d` | 32 B: i8 `sc` of both halves | 256 B nibbles | bits 4, 5 as crumbs | 6.5625 (6.5625) |
//!
//! Nibble byte `4j + b` of lane `i` holds column `4j + b` (low nibble) and
//! `16 + 4j + b` (high nibble); bit plane `p` is 8 little-endian `u64`
//! masks, mask `c / 4` bit `4i + c % 4` being bit `4 + p` of column `c`'s
//! quant, so a masked byte add restores it. A K-quant block's header holds
//! its 6-bit scale and minimum as a byte each (Q6_K: its two 8-bit scales),
//! and the kernels form `d·sc` and `−dmin·m` with the super-block's `d` and
//! `dmin` (exact f32 products, as GGML's dequantizer forms them); every bit
//! of the file's super-block header is there, so [`unpack_row`] restores
//! the file's bytes exactly and [`dequantize_row`] is GGML's dequantization
//! bit for bit. The high bits cost what the file's own fifth and sixth
//! bits cost; Q6_K's panels are exactly the file's size, and the K-quants'
//! byte-wide 6-bit scales are Q4_K's remaining 1.028× (Q5_K 1.023×).
//!
//! Every output is computed lane by lane with the same operations whatever
//! the number of tokens, so a product over `n` tokens equals `n` single-token
//! products bit for bit, and the portable [`scalar_tile`] equals the SIMD
//! kernel bit for bit (the integer sums are exact; each block then adds
//! `isum · (d · dx)` and `m · sx` with fused multiply-adds, in that order;
//! Q6_K adds `(isum_h − 32·Σx_h) · (d_h · dx)` for its halves `h` = 0, 1,
//! with `Σx_h` the activation quants' exact sum over the half).

use crate::dtype::DType;
use crate::f16::f16_to_f32;
use crate::quant::QK;
use std::sync::OnceLock;

pub(crate) mod layout;
mod pack;

use layout::{block_at, block_bytes, header_bytes, quant_at, K_MIN_OFFSET, K_SCALE_OFFSET, MIN_OFFSET};
pub use layout::{packed_len, supports, Activations, Tile, TileFn, PANEL_ROWS, TILE_TOKENS};
pub use pack::{dequantize_row, pack, unpack_row};

fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

impl Activations {
    /// Quantizes the `n × cols` row-major `x` for a product with `dtype`
    /// weights, reusing this value's buffers (with AVX-512 when the integer
    /// micro-kernel is in use; the result is the same bit for bit). The half
    /// sums only Q6_K reads are computed for Q6_K alone.
    pub fn quantize(&mut self, dtype: DType, x: &[f32], n: usize, cols: usize) {
        let blocks = cols / QK;
        self.cols = cols;
        self.q.resize(n * cols, 0);
        self.d.resize(n * blocks, 0.0);
        self.s.resize(n * blocks, 0.0);
        let x = &x[..n * cols];
        #[cfg(target_arch = "x86_64")]
        let simd = vnni_tile().is_some();
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        if simd {
            #[cfg(target_arch = "x86_64")]
            crate::simd::avx512::int8_quantize(x, &mut self.q, &mut self.d, &mut self.s);
        } else {
            quantize_blocks(x, &mut self.q, &mut self.d, &mut self.s);
        }
        if dtype == DType::Q6_K {
            self.h.resize(2 * n * blocks, 0);
            half_sums(&self.q, &mut self.h);
        }
    }
}

/// The sums of every 16 quants of `q` (integers: exact in any order).
fn half_sums(q: &[i8], h: &mut [i32]) {
    for (qh, h) in q.chunks_exact(QK / 2).zip(h) {
        *h = qh.iter().map(|&v| v as i32).sum();
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

/// Row `i`'s two header values for a panel block: the scale and the
/// minimum (Q6_K: the scales of the two halves), from the block `blk` and
/// the header `dh` holding its `d` (its own, or its super-block's).
#[inline]
fn scale_min(dtype: DType, blk: &[u8], dh: &[u8], i: usize) -> (f32, f32) {
    let d = half(dh, 2 * i);
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            let dmin = half(dh, MIN_OFFSET + 2 * i);
            (d * blk[K_SCALE_OFFSET + i] as f32, -dmin * blk[K_MIN_OFFSET + i] as f32)
        }
        DType::Q6_K => {
            let s = |at: usize| d * (blk[at + i] as i8) as f32;
            (s(K_SCALE_OFFSET), s(K_MIN_OFFSET))
        }
        DType::Q4_1 | DType::Q5_1 => (d, half(dh, MIN_OFFSET + 2 * i)),
        DType::Q4_0 => (d, d * -8.0),
        DType::Q5_0 => (d, d * -16.0),
        _ => (d, d * -128.0),
    }
}

/// The portable micro-kernel: the arithmetic every SIMD version reproduces
/// bit for bit.
pub fn scalar_tile(dtype: DType, panel: &[u8], x: &Activations, t0: usize, nt: usize, out: &mut Tile) {
    let (blocks, bb, hb, cols) = (x.blocks(), block_bytes(dtype), header_bytes(dtype), x.cols);
    for (j, o) in out.iter_mut().enumerate().take(nt) {
        let t = t0 + j;
        let xq = &x.q[t * cols..(t + 1) * cols];
        for (i, acc) in o.iter_mut().enumerate() {
            let mut sum = 0f32;
            for b in 0..blocks {
                let (at, dh) = block_at(dtype, b);
                let blk = &panel[at..at + bb];
                let (d, m) = scale_min(dtype, blk, &panel[dh..], i);
                let xb = &xq[b * QK..(b + 1) * QK];
                let mut isum = [0i32; 2];
                for (k, &xk) in xb.iter().enumerate() {
                    isum[k / 16] += quant_at(dtype, &blk[hb..], i, k) as i32 * xk as i32;
                }
                let at = t * blocks + b;
                let xd = x.d[at];
                if dtype == DType::Q6_K {
                    let (h0, h1) = (x.h[2 * at], x.h[2 * at + 1]);
                    sum = ((isum[0] - 32 * h0) as f32).mul_add(d * xd, sum);
                    sum = ((isum[1] - 32 * h1) as f32).mul_add(m * xd, sum);
                } else {
                    sum = ((isum[0] + isum[1]) as f32).mul_add(d * xd, sum);
                    sum = m.mul_add(x.s[at], sum);
                }
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
        if off || crate::dot::kernels().isa != crate::dot::Isa::Avx512 {
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

    const DTYPES: [DType; 8] =
        [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

    /// Columns of the test shapes: `c` blocks of 32, or of 256 for the
    /// K-quants.
    fn cols_of(dt: DType, c: usize) -> usize {
        c * dt.block_elems()
    }

    /// Deterministic bytes (any bytes are a valid block of these formats).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    /// Byte offsets of a stored block's f16 scales (`d`, and `m` or `dmin`).
    fn f16_fields(dt: DType) -> &'static [usize] {
        match dt {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => &[0],
        }
    }

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

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Packs `raw` (`rows × cols` of `dt`) and checks that every row
    /// unpacks to its bytes and dequantizes to `dequantize`'s values, bit
    /// for bit; returns the panels.
    fn packed_rows_match(dt: DType, rows: usize, cols: usize, raw: &[u8]) -> Vec<u8> {
        let mut packed = vec![0u8; packed_len(dt, rows, cols)];
        pack(dt, rows, cols, raw, &mut packed);
        let rb = dt.bytes_for(cols);
        let mut back = vec![0u8; rb];
        for r in 0..rows {
            unpack_row(dt, &packed, cols, r, &mut back);
            assert_eq!(back, raw[r * rb..(r + 1) * rb], "{dt} {rows}x{cols} row {r}");
            let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
            dequantize(dt, &raw[r * rb..(r + 1) * rb], &mut want);
            dequantize_row(dt, &packed, cols, r, &mut got);
            assert_eq!(bits(&want), bits(&got), "{dt} {rows}x{cols} row {r}");
        }
        packed
    }

    #[test]
    fn panels_keep_every_row_bit_for_bit() {
        for dt in DTYPES {
            for (rows, c) in [(1, 1), (17, 2), (40, 3)] {
                let cols = cols_of(dt, c);
                packed_rows_match(dt, rows, cols, &quantize(dt, &values(rows * cols, 3)));
            }
        }
    }

    /// Random bytes are valid blocks of every format: pack → unpack gives
    /// them back, `dequantize_row` equals `dequantize` bit for bit, and
    /// `set_products(F32)` restores the original bytes, with extreme f16
    /// scales (zero, ±subnormal, ±max, ±inf, NaN) in some blocks.
    #[test]
    fn random_blocks_survive_pack_and_set_products() {
        let extremes = [0x0000u16, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e01, 0x3c00];
        for dt in DTYPES {
            for (rows, c) in [(3, 1), (19, 2), (33, 5)] {
                let cols = cols_of(dt, c);
                let mut raw = bytes(dt.bytes_for(cols) * rows, 17 + rows as u64);
                for (b, blk) in raw.chunks_exact_mut(dt.block_bytes()).enumerate() {
                    for (f, &at) in f16_fields(dt).iter().enumerate() {
                        if (b + f) % 3 != 0 {
                            let v = extremes[(b * 7 + f) % extremes.len()];
                            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                let packed = packed_rows_match(dt, rows, cols, &raw);
                let mut m = Matrix::from_bytes_with(dt, rows, cols, &raw, Products::Int8).unwrap();
                assert_eq!((m.products(), m.nbytes()), (Products::Int8, packed.len()));
                m.set_products(Products::F32);
                assert_eq!(m.products(), Products::F32);
                let mut f = vec![0f32; rows * cols];
                dequantize(dt, &raw, &mut f);
                assert_eq!(bits(&m.to_f32()), bits(&f), "{dt} {rows}x{cols}");
                m.set_products(Products::Int8);
                assert_eq!(bits(&m.to_f32()), bits(&f), "{dt} {rows}x{cols}");
            }
        }
    }

    /// Bits per weight of the panels of `dt` (the module doc's table).
    fn panel_bits(dt: DType) -> f64 {
        match dt {
            DType::Q8_0 => 9.0,
            DType::Q4_0 | DType::Q4_1 => 5.0,
            DType::Q5_0 | DType::Q5_1 => 6.0,
            DType::Q4_K => 4.625,
            DType::Q5_K => 5.625,
            DType::Q6_K => 6.5625,
            _ => unreachable!("{dt} has no panels"),
        }
    }

    /// Bytes per weight of the panels against the file's.
    #[test]
    fn panel_sizes_are_as_documented() {
        let (rows, cols) = (64, 1024);
        for dt in DTYPES {
            let bits = packed_len(dt, rows, cols) as f64 * 8.0 / (rows * cols) as f64;
            assert_eq!(bits, panel_bits(dt), "{dt}");
        }
    }

    #[test]
    fn activations_round_trip_within_half_a_step() {
        let x = values(3 * 64, 5);
        let mut a = Activations::default();
        a.quantize(DType::Q8_0, &x, 3, 64);
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
        a.quantize(DType::Q8_0, &[0.0; 32], 1, 32);
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
        a.quantize(DType::Q8_0, &x, 40, QK);
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
        for (dt, random) in DTYPES.into_iter().flat_map(|dt| [(dt, false), (dt, true)]) {
            // 37 rows: two full panels and one padded
            let (rows, cols, n) = (37, if dt.is_k_quant() { 512 } else { 160 }, 19);
            let raw = if random {
                // every quant and integer scale, finite f16 scales (2^-14..2)
                let mut raw = bytes(dt.bytes_for(cols) * rows, 23);
                for blk in raw.chunks_exact_mut(dt.block_bytes()) {
                    for &at in f16_fields(dt) {
                        blk[at + 1] = (blk[at + 1] & 0x83) | 0x04 | (blk[at] & 0x38);
                    }
                }
                raw
            } else {
                quantize(dt, &values(rows * cols, 7))
            };
            let mut packed = vec![0u8; packed_len(dt, rows, cols)];
            pack(dt, rows, cols, &raw, &mut packed);
            let mut x = values(n * cols, 9);
            x[5] = 1e6;
            x[40] = -3e-8;
            let mut a = Activations::default();
            a.quantize(dt, &x, n, cols);
            let pl = packed_len(dt, PANEL_ROWS, cols);
            for (g, panel) in packed.chunks_exact(pl).enumerate() {
                for t0 in [0, 3, 8, 16] {
                    for nt in 1..=TILE_TOKENS.min(n - t0) {
                        let (mut want, mut got) =
                            ([[0f32; PANEL_ROWS]; TILE_TOKENS], [[1f32; PANEL_ROWS]; TILE_TOKENS]);
                        scalar_tile(dt, panel, &a, t0, nt, &mut want);
                        vnni(dt, panel, &a, t0, nt, &mut got);
                        for j in 0..nt {
                            let bits = |v: &[f32; PANEL_ROWS]| v.map(f32::to_bits);
                            assert_eq!(bits(&got[j]), bits(&want[j]), "{dt} panel {g} t0={t0} nt={nt} token {j}");
                        }
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
            for (rows, c, n) in [(5, 2, 3), (37, 3, 13), (600, 8, 9)] {
                let cols = if dt.is_k_quant() { c * 256 } else { c * 32 };
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
                a.quantize(dt, &x, n, cols);
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
