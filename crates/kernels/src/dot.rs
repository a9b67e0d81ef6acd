//! Fused dequantize-dot products: one weight row (in its stored type) times
//! an f32 activation vector. These are the inner loops of GEMV and GEMM.
//!
//! The best implementation for the running CPU is chosen once
//! ([`kernels`]): AVX-512 or AVX2+FMA+F16C on x86_64, NEON on aarch64
//! (`crate::simd`), else the scalar versions ([`scalar`]), which are the reference
//! every SIMD version is tested against. `KVSLIM_SIMD=scalar|avx2|avx512|neon`
//! forces a level the CPU has. Activations stay f32 here: the SIMD kernels
//! only reorder the f32 sums, so results agree with the reference to
//! rounding. (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and Q4_K/Q5_K/Q6_K matrices use the
//! integer products of [`crate::int8`] instead when the CPU has AVX-512
//! VNNI; see
//! [`crate::matrix::Products`].)
//!
//! Measured throughput (`cargo run --release -p kvslim-kernels --example
//! dotbench`) is recorded in `docs/results/speed.md`.

use crate::dtype::DType;
use std::sync::OnceLock;

pub mod scalar;
pub(crate) mod set;

pub use set::{BlockDotFn, Dot4x4Fn, DotKernels, GemmTileFn, Isa, GEMM_MR, GEMM_NR};

impl DotKernels {
    /// The portable reference kernels.
    pub const SCALAR: DotKernels = DotKernels {
        isa: Isa::Scalar,
        f32: scalar::dot_f32,
        f16: scalar::dot_f16,
        bf16: scalar::dot_bf16,
        q8_0: scalar::dot_q8_0,
        q4_0: scalar::dot_q4::<false>,
        q4_1: scalar::dot_q4::<true>,
        q5_0: scalar::dot_blocks_of::<{ DType::Q5_0 as u8 }>,
        q5_1: scalar::dot_blocks_of::<{ DType::Q5_1 as u8 }>,
        q2_k: scalar::dot_blocks_of::<{ DType::Q2_K as u8 }>,
        q3_k: scalar::dot_blocks_of::<{ DType::Q3_K as u8 }>,
        q4_k: scalar::dot_blocks_of::<{ DType::Q4_K as u8 }>,
        q5_k: scalar::dot_blocks_of::<{ DType::Q5_K as u8 }>,
        q6_k: scalar::dot_blocks_of::<{ DType::Q6_K as u8 }>,
        axpy: scalar::axpy,
        dot4x4: scalar::dot4x4,
        gemm_tile: scalar::gemm_tile,
        dequantize: crate::quant::dequantize,
    };
}

static KERNELS: OnceLock<DotKernels> = OnceLock::new();

/// The kernels for this CPU, detected on first use: the fastest set the CPU
/// supports. The environment variable `KVSLIM_SIMD` (`scalar`, `avx2`,
/// `avx512`, `neon`) forces a level; a level the CPU lacks is ignored.
pub fn kernels() -> &'static DotKernels {
    KERNELS
        .get_or_init(|| std::env::var("KVSLIM_SIMD").ok().and_then(|name| by_isa(name.trim())).unwrap_or_else(detect))
}

/// Every kernel set this CPU can run, slowest (the scalar reference) first.
pub fn available() -> Vec<DotKernels> {
    #[allow(unused_mut)]
    let mut v = vec![DotKernels::SCALAR];
    #[cfg(target_arch = "x86_64")]
    {
        v.extend(crate::simd::kernels::<crate::simd::avx2::Avx2>());
        v.extend(crate::simd::kernels::<crate::simd::avx512::Avx512>());
    }
    #[cfg(target_arch = "aarch64")]
    v.extend(crate::simd::kernels::<crate::simd::neon::Neon>());
    v
}

/// The kernel set named `isa` (see [`DotKernels::isa`]), if this CPU has it.
pub fn by_isa(isa: &str) -> Option<DotKernels> {
    let isa = Isa::parse(isa)?;
    available().into_iter().find(|k| k.isa == isa)
}

/// The preferred kernel set for this CPU.
fn detect() -> DotKernels {
    // `available` lists the sets in increasing order of speed
    *available().last().expect("scalar is always available")
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
        DType::Q5_0 => (k.q5_0)(row, x),
        DType::Q5_1 => (k.q5_1)(row, x),
        DType::Q2_K => (k.q2_k)(row, x),
        DType::Q3_K => (k.q3_k)(row, x),
        DType::Q4_K => (k.q4_k)(row, x),
        DType::Q5_K => (k.q5_k)(row, x),
        DType::Q6_K => (k.q6_k)(row, x),
    }
}

/// Reinterprets aligned bytes as f32 (the matrix storage guarantees alignment).
#[inline]
pub(crate) fn bytemuck_f32(b: &[u8]) -> &[f32] {
    assert!((b.as_ptr() as usize).is_multiple_of(4) && b.len().is_multiple_of(4));
    // SAFETY: alignment and length checked above; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) }
}

/// Reinterprets aligned bytes as u16.
#[inline]
pub(crate) fn bytemuck_u16(b: &[u8]) -> &[u16] {
    assert!((b.as_ptr() as usize).is_multiple_of(2) && b.len().is_multiple_of(2));
    // SAFETY: alignment and length checked above; every bit pattern is a valid u16.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u16, b.len() / 2) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16::{bf16_to_f32, f16_to_f32};
    use crate::quant::{dequantize, quantize};
    use crate::test_util::Rng;

    /// Every kernel set to check: those this CPU runs, plus, off aarch64, the
    /// NEON kernels over scalar stand-ins of the intrinsics.
    fn test_sets() -> Vec<DotKernels> {
        #[allow(unused_mut)]
        let mut v = available();
        #[cfg(not(target_arch = "aarch64"))]
        v.extend(crate::simd::kernels::<crate::simd::neon::Neon>());
        v
    }

    /// Copies `bytes` to offset `off` of a 64-byte aligned buffer (rows of
    /// a matrix start at any multiple of the block size).
    fn placed(bytes: &[u8], off: usize) -> (Vec<u64>, std::ops::Range<usize>) {
        let mut v = vec![0u64; (bytes.len() + off).div_ceil(8) + 1];
        // SAFETY: v has room for off + bytes.len() bytes
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (v.as_mut_ptr() as *mut u8).add(off), bytes.len()) };
        (v, off..off + bytes.len())
    }

    fn as_bytes(v: &[u64]) -> &[u8] {
        // SAFETY: plain integers viewed as bytes
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8) }
    }

    /// (Σ w·x, Σ |w·x|) in f64 over the dequantized row.
    fn reference(dt: DType, bytes: &[u8], x: &[f32]) -> (f64, f64) {
        let mut deq = vec![0f32; x.len()];
        dequantize(dt, bytes, &mut deq);
        deq.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, v)| {
            let p = *w as f64 * *v as f64;
            (s + p, a + p.abs())
        })
    }

    const DTYPES: [DType; 13] = DType::ALL;

    /// Where each block format keeps its f16 fields (scale, minimum).
    fn half_fields(dt: DType) -> &'static [usize] {
        match dt {
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::Q6_K => &[208],
            DType::F32 | DType::F16 | DType::BF16 => &[],
        }
    }

    /// `nb` blocks of random bytes (every quant and packed-scale bit pattern
    /// is valid) whose f16 fields hold finite values of either sign, from
    /// 2^-14 to 4 in magnitude, or zero.
    fn random_blocks(rng: &mut Rng, dt: DType, nb: usize) -> Vec<u8> {
        let bb = dt.block_bytes();
        let mut v: Vec<u8> = (0..nb * bb).map(|_| rng.next() as u8).collect();
        for b in 0..nb {
            for &at in half_fields(dt) {
                let r = rng.next();
                let h = if r.is_multiple_of(16) {
                    0
                } else {
                    // exponent 1..=17 (2^-14 .. 2^2), any mantissa and sign
                    (((r >> 8) % 17 + 1) << 10) as u16 | (r >> 32) as u16 & 0x83ff
                };
                v[b * bb + at..b * bb + at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        v
    }

    /// `k` dequantizes `row` to exactly `deq` (writing nothing past it) and
    /// its dot with `x` is within rounding of `want` (Σ w·x in f64; `mag`
    /// is Σ |w·x|).
    fn check_set(k: &DotKernels, dt: DType, row: &[u8], x: &[f32], deq: &[f32], (want, mag): (f64, f64), case: &str) {
        let n = x.len();
        let mut got = vec![f32::NAN; n + 1];
        (k.dequantize)(dt, row, &mut got[..n]);
        assert!(got[..n].iter().zip(deq).all(|(a, b)| a.to_bits() == b.to_bits()), "{} dequantize {dt} {case}", k.isa);
        assert!(got[n].is_nan(), "{} dequantize wrote past the end", k.isa);
        let got = dot_row(k, dt, row, x) as f64;
        let tol = 2e-6 * mag * (n as f64).sqrt().max(4.0) + 1e-30;
        assert!((got - want).abs() <= tol, "{} {dt} {case}: {got} vs {want} (tol {tol})", k.isa);
    }

    /// Every kernel set on random blocks of every block format: all quant
    /// and scale bit patterns, rows of 1..40 blocks at unaligned offsets.
    /// Dequantization must be bit-identical to the scalar reference; dots
    /// agree with dequantize-then-dot in f64 within rounding.
    #[test]
    fn every_kernel_set_matches_reference_on_random_blocks() {
        let mut rng = Rng(0xdead_beef_1234_5678);
        for dt in DTYPES.into_iter().filter(|d| d.block_elems() > 1) {
            for nb in [1usize, 2, 3, 4, 5, 7, 8, 13, 40] {
                let n = nb * dt.block_elems();
                let bytes = random_blocks(&mut rng, dt, nb);
                let x = rng.vec(n, 1.0);
                let (want, mag) = reference(dt, &bytes, &x);
                let mut deq = vec![0f32; n];
                dequantize(dt, &bytes, &mut deq);
                for off in [0usize, 1, 2, 3] {
                    let (buf, range) = placed(&bytes, off);
                    let row = &as_bytes(&buf)[range];
                    for k in &test_sets() {
                        check_set(k, dt, row, &x, &deq, (want, mag), &format!("nb={nb} off={off}"));
                    }
                }
            }
        }
    }

    /// Every kernel set the CPU has agrees with dequantize-then-dot in f64,
    /// within a tolerance relative to Σ|w·x|, on many lengths (odd tails for
    /// the float types, 1..n whole blocks for the block formats).
    #[test]
    fn every_kernel_set_matches_reference() {
        let sets = test_sets();
        assert_eq!(sets[0].isa, Isa::Scalar);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let float_lens: Vec<usize> = (1..=70).chain([95, 96, 97, 127, 128, 129, 255, 576, 1000, 1536, 4097]).collect();
        let block_counts: Vec<usize> = (1..=9).chain([16, 17, 48, 128]).collect();
        for dt in DTYPES {
            let block_lens: Vec<usize> = block_counts.iter().map(|b| b * dt.block_elems()).collect();
            let lens = if dt.block_elems() == 1 { &float_lens } else { &block_lens };
            for &n in lens {
                // a few magnitudes so the block scales vary
                let scale = [1.0, 1e-3, 40.0][n % 3];
                let w = rng.vec(n, scale);
                let x = rng.vec(n, 1.0);
                let bytes = quantize(dt, &w);
                let (want, mag) = reference(dt, &bytes, &x);
                let off = if dt.block_elems() == 1 { 0 } else { 2 * (n % 3) };
                let (buf, range) = placed(&bytes, off);
                let row = &as_bytes(&buf)[range];
                let mut deq = vec![0f32; n];
                dequantize(dt, &bytes, &mut deq);
                for k in &sets {
                    check_set(k, dt, row, &x, &deq, (want, mag), &format!("n={n}"));
                }
            }
        }
    }

    /// Half-precision conversion parity on arbitrary bit patterns:
    /// subnormals, signed zeros, large exponents.
    #[test]
    fn half_conversions_match_on_all_bit_patterns() {
        // every f16 and bf16 value, one element at a time (the tail paths)
        // and as 16-element rows (the vector paths)
        let one = [1f32; 16];
        for k in test_sets() {
            for h in 0..=u16::MAX {
                for (f, conv, kind) in
                    [(k.f16, f16_to_f32 as fn(u16) -> f32, "f16"), (k.bf16, bf16_to_f32 as fn(u16) -> f32, "bf16")]
                {
                    let (got, want) = (f(&[h], &one[..1]), conv(h));
                    assert!(
                        got == want || (got.is_nan() && want.is_nan()),
                        "{} {kind} {h:#06x}: {got} vs {want}",
                        k.isa
                    );
                    let mut row = [0u16; 16];
                    row[h as usize % 16] = h;
                    let got = f(&row, &one);
                    assert!(got == want || (got.is_nan() && want.is_nan()), "{} {kind} {h:#06x} in a row", k.isa);
                }
            }
        }
        let mut rng = Rng(12345);
        for n in [1usize, 7, 16, 33, 65, 300] {
            let f16: Vec<u16> = (0..n)
                .map(|_| {
                    let h = rng.next() as u16;
                    // no inf/nan: exponent field below 0x1f
                    if h & 0x7c00 == 0x7c00 {
                        h & !0x4000
                    } else {
                        h
                    }
                })
                .collect();
            // bf16 with exponents near 1 so products stay finite
            let bf16: Vec<u16> = (0..n)
                .map(|_| {
                    let h = rng.next() as u16;
                    (h & 0x807f) | ((0x70 + (h >> 8) % 32) << 7)
                })
                .collect();
            let x = rng.vec(n, 1.0);
            for (w, conv, kind) in
                [(&f16, f16_to_f32 as fn(u16) -> f32, "f16"), (&bf16, bf16_to_f32 as fn(u16) -> f32, "bf16")]
            {
                let (want, mag) = w.iter().zip(&x).fold((0f64, 0f64), |(s, a), (h, v)| {
                    let p = conv(*h) as f64 * *v as f64;
                    (s + p, a + p.abs())
                });
                for k in test_sets() {
                    let f = if kind == "f16" { k.f16 } else { k.bf16 };
                    let got = f(w, &x) as f64;
                    assert!((got - want).abs() <= 1e-5 * mag + 1e-30, "{} {kind} n={n}: {got} vs {want}", k.isa);
                }
            }
        }
    }

    #[test]
    fn every_axpy_matches_reference() {
        let mut rng = Rng(777);
        for n in (0..=70).chain([127, 129, 1000]) {
            let x = rng.vec(n, 2.0);
            let y0 = rng.vec(n, 2.0);
            // a longer y: only the first n elements may change
            let mut y0_long = y0.clone();
            y0_long.push(42.0);
            let a = rng.unit() * 3.0;
            for k in test_sets() {
                let mut y = y0_long.clone();
                (k.axpy)(a, &x, &mut y);
                for i in 0..n {
                    let want = y0[i] as f64 + a as f64 * x[i] as f64;
                    let tol = 2.5e-7 * (y0[i].abs() as f64 + (a * x[i]).abs() as f64);
                    assert!((y[i] as f64 - want).abs() <= tol, "{} axpy n={n} i={i}", k.isa);
                }
                assert_eq!(y[n], 42.0, "{} axpy wrote past n", k.isa);
            }
        }
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let mut y = vec![1.0; 37];
        axpy(0.5, &x, &mut y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, 1.0 + 0.5 * i as f32);
        }
    }

    #[test]
    fn every_gemm_tile_matches_reference() {
        let mut rng = Rng(4242);
        for n in (0..=40).chain([63, 64, 65, 100, 257, 1024]) {
            let w: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n, 1.0)).collect();
            let x: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n, 3.0)).collect();
            let wr = [&w[0][..], &w[1][..], &w[2][..], &w[3][..]];
            // a repeated activation row, as matmul passes at the edges
            let xr = [&x[0][..], &x[1][..], &x[2][..], &x[2][..]];
            for k in test_sets() {
                let mut out = [[f32::NAN; 4]; 4];
                (k.dot4x4)(&wr, &xr, &mut out);
                for i in 0..4 {
                    for j in 0..4 {
                        let (want, mag) = wr[i].iter().zip(xr[j]).fold((0f64, 0f64), |(s, a), (p, q)| {
                            let v = *p as f64 * *q as f64;
                            (s + v, a + v.abs())
                        });
                        let got = out[i][j] as f64;
                        assert!(
                            (got - want).abs() <= 2e-6 * mag * (n as f64).sqrt().max(4.0),
                            "{} dot4x4 n={n} [{i}][{j}]: {got} vs {want}",
                            k.isa
                        );
                    }
                }
            }
        }
    }

    /// Every set's packed-panel GEMM micro-kernel against an f64 product,
    /// for every token count (1..=12) and a few panel lengths.
    #[test]
    fn every_gemm_micro_kernel_matches_reference() {
        let mut rng = Rng(4242);
        for k in test_sets() {
            for cols in [1usize, 7, 64, 577] {
                let w = rng.vec(cols * GEMM_MR, 1.0);
                let x = rng.vec(cols * GEMM_NR, 1.0);
                for nt in 1..=GEMM_NR {
                    let mut out = [[f32::NAN; GEMM_MR]; GEMM_NR];
                    (k.gemm_tile)(&w, &x, nt, &mut out);
                    for (j, oj) in out.iter().enumerate().take(nt) {
                        for (i, &got) in oj.iter().enumerate() {
                            let (want, mag) = (0..cols).fold((0f64, 0f64), |(s, a), c| {
                                let v = w[c * GEMM_MR + i] as f64 * x[c * GEMM_NR + j] as f64;
                                (s + v, a + v.abs())
                            });
                            assert!(
                                (got as f64 - want).abs() <= 2e-6 * mag * (cols as f64).sqrt().max(4.0),
                                "{} gemm_tile cols={cols} nt={nt} [{j}][{i}]: {got} vs {want}",
                                k.isa
                            );
                        }
                    }
                }
            }
        }
    }

    /// matmul (tiles, row blocks, column blocks) and matvec against an f64
    /// product of the dequantized matrix, on shapes that leave every kind of
    /// edge: rows not a multiple of 4 or 16, token counts 2..9, long rows.
    #[test]
    fn matmul_and_matvec_match_reference_on_ragged_shapes() {
        use crate::matrix::{Matrix, Products};
        let mut rng = Rng(31337);
        for (dt, rows, cols) in [
            (DType::F32, 19, 37),
            (DType::F32, 33, 1100),
            (DType::F16, 5, 71),
            (DType::BF16, 18, 64),
            (DType::Q8_0, 21, 1088),
            (DType::Q4_0, 35, 96),
            (DType::Q4_1, 17, 160),
            (DType::Q5_0, 7, 96),
            (DType::Q4_K, 13, 512),
            (DType::Q6_K, 9, 768),
            (DType::Q2_K, 6, 256),
        ] {
            let m = Matrix::quantized_with(dt, rows, cols, &rng.vec(rows * cols, 1.0), Products::F32).unwrap();
            let w = m.to_f32();
            for n in [1usize, 2, 3, 4, 5, 9] {
                let x = rng.vec(n * cols, 1.0);
                let mut out = vec![f32::NAN; n * rows];
                m.matmul(&x, n, &mut out);
                let mut mv = vec![f32::NAN; rows];
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    m.matvec(xt, &mut mv);
                    for r in 0..rows {
                        let (want, mag) =
                            w[r * cols..(r + 1) * cols].iter().zip(xt).fold((0f64, 0f64), |(s, a), (p, q)| {
                                let v = *p as f64 * *q as f64;
                                (s + v, a + v.abs())
                            });
                        let tol = 2e-6 * mag * (cols as f64).sqrt();
                        let got = out[t * rows + r] as f64;
                        assert!(
                            (got - want).abs() <= tol,
                            "{dt} {rows}x{cols} n={n} gemm t={t} r={r}: {got} vs {want}"
                        );
                        let got = mv[r] as f64;
                        assert!((got - want).abs() <= tol, "{dt} {rows}x{cols} gemv r={r}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn forced_level_and_detection() {
        let sets = available();
        assert_eq!(by_isa("scalar").unwrap().isa, Isa::Scalar);
        assert!(by_isa("no-such-isa").is_none());
        // the detected set is the last (fastest) available one unless forced
        if std::env::var("KVSLIM_SIMD").is_err() {
            assert_eq!(kernels().isa, sets.last().unwrap().isa);
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            assert!(sets.iter().any(|k| k.isa == Isa::Avx2));
        }
    }
}
