//! What a kernel set is: the table [`super`] dispatches through and the
//! ISA modules (`crate::simd`) fill. Kept apart from the dispatcher so the
//! implementations depend on the table's shape, not on its selection.

use crate::dtype::DType;

/// `out[i][j] = w[i]·x[j]` over four weight rows `w` and four activation
/// rows `x` (see [`DotKernels::dot4x4`]).
pub type Dot4x4Fn = fn(&[&[f32]; 4], &[&[f32]; 4], &mut [[f32; 4]; 4]);

/// Weight rows per GEMM micro-tile: the row panel a [`GemmTileFn`] reads
/// is `cols × GEMM_MR` f32, element `(k, i)` at `k·GEMM_MR + i`.
pub const GEMM_MR: usize = 32;
/// Activation rows (tokens) per GEMM micro-tile: the token panel is
/// `cols × GEMM_NR` f32, element `(k, j)` at `k·GEMM_NR + j`.
pub const GEMM_NR: usize = 12;

/// GEMM micro-kernel over packed panels (see [`DotKernels::gemm_tile`]):
/// `(w, x, nt, out)`.
pub type GemmTileFn = fn(&[f32], &[f32], usize, &mut [[f32; GEMM_MR]; GEMM_NR]);

/// A row of a block format (its raw bytes) · x (see [`DotKernels`]).
pub type BlockDotFn = fn(&[u8], &[f32]) -> f32;

/// An instruction set with a kernel set (see [`DotKernels::isa`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The portable reference kernels.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C (8 f32 lanes).
    Avx2,
    /// x86_64 AVX-512F/BW/VL (16 f32 lanes).
    Avx512,
    /// aarch64 NEON (4 f32 lanes).
    Neon,
}

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// The lower-case name (`KVSLIM_SIMD`, `kvslim bench`).
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// The instruction set named `name` (any case).
    pub fn parse(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(name))
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Row-times-vector kernels for each storage type. `w` is the raw row (bytes
/// for the block formats); `x` the activations; both cover the same elements.
#[derive(Clone, Copy)]
pub struct DotKernels {
    /// The instruction set in use (shown by `kvslim bench`).
    pub isa: Isa,
    pub f32: fn(&[f32], &[f32]) -> f32,
    pub f16: fn(&[u16], &[f32]) -> f32,
    pub bf16: fn(&[u16], &[f32]) -> f32,
    pub q8_0: BlockDotFn,
    pub q4_0: BlockDotFn,
    pub q4_1: BlockDotFn,
    /// Q5_0 (22-byte blocks of 32).
    pub q5_0: BlockDotFn,
    /// Q5_1 (24-byte blocks of 32).
    pub q5_1: BlockDotFn,
    /// Q2_K (84-byte super-blocks of 256).
    pub q2_k: BlockDotFn,
    /// Q3_K (110-byte super-blocks of 256).
    pub q3_k: BlockDotFn,
    /// Q4_K (144-byte super-blocks of 256).
    pub q4_k: BlockDotFn,
    /// Q5_K (176-byte super-blocks of 256).
    pub q5_k: BlockDotFn,
    /// Q6_K (210-byte super-blocks of 256).
    pub q6_k: BlockDotFn,
    /// y += a·x
    pub axpy: fn(f32, &[f32], &mut [f32]),
    /// GEMM micro-tile: `out[i][j] = w[i]·x[j]` for four f32 weight rows and
    /// four activation rows (prefill). All eight slices cover the same
    /// elements; pass a row twice to compute fewer than four.
    pub dot4x4: Dot4x4Fn,
    /// Prefill GEMM micro-kernel on packed panels: `out[j][i] = Σ_k
    /// w[k·GEMM_MR + i] · x[k·GEMM_NR + j]` for the first `nt` tokens
    /// (`j < nt ≤ GEMM_NR`; later entries of `out` are unspecified), with
    /// `cols = w.len() / GEMM_MR` and `x.len() ≥ cols · GEMM_NR`. Both
    /// operands are read as contiguous streams and every weight vector
    /// feeds `nt` FMAs, so no horizontal sums are needed.
    pub gemm_tile: GemmTileFn,
    /// Dequantizes `out.len()` elements stored as the given type; the
    /// result is bit-identical to [`crate::quant::dequantize`].
    pub dequantize: fn(DType, &[u8], &mut [f32]),
}
