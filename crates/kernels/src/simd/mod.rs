//! SIMD implementations of the [`DotKernels`] set.
//!
//! Each submodule implements [`DotIsa`] (its kernels) and, through
//! [`isa_entries`], [`Entries`] (their `#[target_feature]` entry points) for
//! its vector type. [`kernels`] wraps the entry points, once for every ISA,
//! in the safe function pointers of a [`DotKernels`], and hands the set out
//! only when the running CPU has every feature they enable.

use crate::dot::set::{DotKernels, Isa, GEMM_MR, GEMM_NR};
use crate::dtype::DType;
use crate::kvquant::set::{check_group_row, KvGroupKernels, KvRunFn};
use lanes::{KvIsa, KV_F16, KV_Q4, KV_Q8};

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod lanes;
#[cfg(any(target_arch = "aarch64", test))]
pub(crate) mod neon;
#[cfg(all(test, not(target_arch = "aarch64")))]
mod neon_mock;

/// One instruction set's kernels, written as `#[inline(always)]` bodies
/// without target features: the entry points of [`isa_entries`] call them
/// inside functions that have the ISA's features, so they (and the
/// intrinsics they call) are compiled with those. Lengths are element
/// counts (`n`) or whole blocks (`nb`) that both operands hold.
pub(crate) trait DotIsa: lanes::HalfLanes + Sized {
    /// The set's [`DotKernels::isa`].
    const ISA: Isa;
    /// Whether the running CPU has every feature the entry points enable.
    fn detected() -> bool;
    /// Σ w·x over `n` f16 (`BF` false) or bf16 (`BF` true) weights.
    #[inline(always)]
    unsafe fn dot_half<const BF: bool>(w: *const u16, x: *const f32, n: usize) -> f32 {
        lanes::dot::<Self, lanes::HalfRow<BF>, false>(w, x, n)
    }
    unsafe fn dot_q8_0(w: *const u8, x: *const f32, nb: usize) -> f32;
    /// Q4_0 (`MIN` false) or Q4_1 (`MIN` true).
    unsafe fn dot_q4<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32;
    /// Q5_0 (`MIN` false) or Q5_1 (`MIN` true).
    unsafe fn dot_q5<const MIN: bool>(w: *const u8, x: *const f32, nb: usize) -> f32;
    unsafe fn dot_q2_k(w: *const u8, x: *const f32, nb: usize) -> f32;
    unsafe fn dot_q3_k(w: *const u8, x: *const f32, nb: usize) -> f32;
    /// Q4_K (`FIVE` false) or Q5_K (`FIVE` true).
    unsafe fn dot_q45_k<const FIVE: bool>(w: *const u8, x: *const f32, nb: usize) -> f32;
    unsafe fn dot_q6_k(w: *const u8, x: *const f32, nb: usize) -> f32;
    /// `n` f16 (`BF` false) or bf16 (`BF` true) values at `s` (any
    /// alignment) to f32 at `o`, bit-identical to the scalar conversion.
    #[inline(always)]
    unsafe fn deq_half<const BF: bool>(s: *const u8, o: *mut f32, n: usize) {
        lanes::deq_half::<Self, BF>(s, o, n)
    }
    /// `nb` Q8_0 blocks at `s` to f32 at `o`; as the other dequantizers,
    /// bit-identical to [`crate::quant::dequantize`].
    unsafe fn deq_q8_0(s: *const u8, o: *mut f32, nb: usize);
    /// `nb` Q4_0 (`MIN` false) or Q4_1 (`MIN` true) blocks.
    unsafe fn deq_q4<const MIN: bool>(s: *const u8, o: *mut f32, nb: usize);
    /// `nb` blocks of another block format; false (nothing written) where
    /// the ISA leaves `dt` to the scalar code, as by default.
    #[inline(always)]
    unsafe fn deq_other(_dt: DType, _s: *const u8, _o: *mut f32, _nb: usize) -> bool {
        false
    }
    /// [`DotKernels::gemm_tile`]; by default the portable one.
    fn gemm_tile(w: &[f32], x: &[f32], nt: usize, out: &mut [[f32; GEMM_MR]; GEMM_NR]) {
        crate::dot::scalar::gemm_tile(w, x, nt, out)
    }
}

/// The entry points of an ISA (see [`isa_entries`]): the [`DotIsa`]
/// kernels and the lane-generic f32 loops of [`lanes`], each compiled with
/// the ISA's target features. Callers must have checked those features.
pub(crate) trait Entries {
    unsafe fn f32(w: *const f32, x: *const f32, n: usize) -> f32;
    unsafe fn axpy(a: f32, x: *const f32, y: *mut f32, n: usize);
    unsafe fn dot4x4(w: &[*const f32; 4], x: &[*const f32; 4], n: usize, out: &mut [[f32; 4]; 4]);
    unsafe fn half<const BF: bool>(w: *const u16, x: *const f32, n: usize) -> f32;
    /// Σ w·x over `nb` whole blocks of the block format `DType::ALL[T]`.
    unsafe fn blocks<const T: u8>(w: *const u8, x: *const f32, nb: usize) -> f32;
    unsafe fn deq_half<const BF: bool>(s: *const u8, o: *mut f32, n: usize);
    /// `nb` whole blocks of `dt` dequantized; false where the ISA has no
    /// kernel for `dt`.
    unsafe fn deq_blocks(dt: DType, s: *const u8, o: *mut f32, nb: usize) -> bool;
}

/// Implements [`Entries`] for `$isa`, every function under the attribute
/// `$tf` (the ISA's `target_feature`), the 4×4 tile in passes of `$c`
/// activation rows with (`$part` true) or without a vector tail step (see
/// [`lanes::dot4x4`]).
macro_rules! isa_entries {
    ($isa:ty, #[$tf:meta], dot4x4: $c:literal, $part:literal) => {
        impl $crate::simd::Entries for $isa {
            #[$tf]
            unsafe fn f32(w: *const f32, x: *const f32, n: usize) -> f32 {
                $crate::simd::lanes::dot::<$isa, $crate::simd::lanes::F32Row, false>(w, x, n)
            }
            #[$tf]
            unsafe fn axpy(a: f32, x: *const f32, y: *mut f32, n: usize) {
                $crate::simd::lanes::axpy::<$isa>(a, x, y, n)
            }
            #[$tf]
            unsafe fn dot4x4(w: &[*const f32; 4], x: &[*const f32; 4], n: usize, out: &mut [[f32; 4]; 4]) {
                $crate::simd::lanes::dot4x4::<$isa, $c, $part>(w, x, n, out)
            }
            #[$tf]
            unsafe fn half<const BF: bool>(w: *const u16, x: *const f32, n: usize) -> f32 {
                <$isa as $crate::simd::DotIsa>::dot_half::<BF>(w, x, n)
            }
            #[$tf]
            unsafe fn blocks<const T: u8>(w: *const u8, x: *const f32, nb: usize) -> f32 {
                $crate::simd::block_dot::<$isa, T>(w, x, nb)
            }
            #[$tf]
            unsafe fn deq_half<const BF: bool>(s: *const u8, o: *mut f32, n: usize) {
                <$isa as $crate::simd::DotIsa>::deq_half::<BF>(s, o, n)
            }
            #[$tf]
            unsafe fn deq_blocks(dt: $crate::dtype::DType, s: *const u8, o: *mut f32, nb: usize) -> bool {
                $crate::simd::deq_blocks::<$isa>(dt, s, o, nb)
            }
        }
    };
}
pub(crate) use isa_entries;

/// [`Entries::blocks`]: the [`DotIsa`] kernel of the format `DType::ALL[T]`.
#[inline(always)]
pub(crate) unsafe fn block_dot<I: DotIsa, const T: u8>(w: *const u8, x: *const f32, nb: usize) -> f32 {
    match DType::ALL[T as usize] {
        DType::Q8_0 => I::dot_q8_0(w, x, nb),
        DType::Q4_0 => I::dot_q4::<false>(w, x, nb),
        DType::Q4_1 => I::dot_q4::<true>(w, x, nb),
        DType::Q5_0 => I::dot_q5::<false>(w, x, nb),
        DType::Q5_1 => I::dot_q5::<true>(w, x, nb),
        DType::Q2_K => I::dot_q2_k(w, x, nb),
        DType::Q3_K => I::dot_q3_k(w, x, nb),
        DType::Q4_K => I::dot_q45_k::<false>(w, x, nb),
        DType::Q5_K => I::dot_q45_k::<true>(w, x, nb),
        _ => I::dot_q6_k(w, x, nb),
    }
}

/// [`Entries::deq_blocks`]: the [`DotIsa`] dequantizer of `dt`.
#[inline(always)]
pub(crate) unsafe fn deq_blocks<I: DotIsa>(dt: DType, s: *const u8, o: *mut f32, nb: usize) -> bool {
    match dt {
        DType::Q8_0 => I::deq_q8_0(s, o, nb),
        DType::Q4_0 => I::deq_q4::<false>(s, o, nb),
        DType::Q4_1 => I::deq_q4::<true>(s, o, nb),
        _ => return I::deq_other(dt, s, o, nb),
    }
    true
}

/// The kernel set of `I`, when the CPU has its features.
pub(crate) fn kernels<I: DotIsa + Entries>() -> Option<DotKernels> {
    I::detected().then(kernel_set::<I>)
}

/// The safe wrappers below around `I`'s entry points (call only after
/// `I::detected()`).
fn kernel_set<I: DotIsa + Entries>() -> DotKernels {
    DotKernels {
        isa: I::ISA,
        f32: dot_f32::<I>,
        f16: dot_half::<I, false>,
        bf16: dot_half::<I, true>,
        q8_0: dot_blocks::<I, { DType::Q8_0 as u8 }>,
        q4_0: dot_blocks::<I, { DType::Q4_0 as u8 }>,
        q4_1: dot_blocks::<I, { DType::Q4_1 as u8 }>,
        q5_0: dot_blocks::<I, { DType::Q5_0 as u8 }>,
        q5_1: dot_blocks::<I, { DType::Q5_1 as u8 }>,
        q2_k: dot_blocks::<I, { DType::Q2_K as u8 }>,
        q3_k: dot_blocks::<I, { DType::Q3_K as u8 }>,
        q4_k: dot_blocks::<I, { DType::Q4_K as u8 }>,
        q5_k: dot_blocks::<I, { DType::Q5_K as u8 }>,
        q6_k: dot_blocks::<I, { DType::Q6_K as u8 }>,
        axpy: axpy::<I>,
        dot4x4: dot4x4::<I>,
        gemm_tile: I::gemm_tile,
        dequantize: dequantize::<I>,
    }
}

// The safe wrappers of `kernel_set`: reachable only through the set, i.e.
// after the ISA's detection, and the lengths they pass never exceed either
// slice, which is all the entry points need.

fn dot_f32<I: Entries>(w: &[f32], x: &[f32]) -> f32 {
    // SAFETY: see above.
    unsafe { I::f32(w.as_ptr(), x.as_ptr(), w.len().min(x.len())) }
}

fn dot_half<I: Entries, const BF: bool>(w: &[u16], x: &[f32]) -> f32 {
    // SAFETY: see above.
    unsafe { I::half::<BF>(w.as_ptr(), x.as_ptr(), w.len().min(x.len())) }
}

fn dot_blocks<I: Entries, const T: u8>(w: &[u8], x: &[f32]) -> f32 {
    // SAFETY: see above; `nb` whole blocks of both.
    unsafe { I::blocks::<T>(w.as_ptr(), x.as_ptr(), whole_blocks(DType::ALL[T as usize], w.len(), x.len())) }
}

fn axpy<I: Entries>(a: f32, x: &[f32], y: &mut [f32]) {
    // SAFETY: see above.
    unsafe { I::axpy(a, x.as_ptr(), y.as_mut_ptr(), x.len().min(y.len())) }
}

fn dot4x4<I: Entries>(w: &[&[f32]; 4], x: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
    let n = w.iter().chain(x).map(|s| s.len()).min().unwrap_or(0);
    // SAFETY: see above; every slice holds `n` elements.
    unsafe { I::dot4x4(&w.map(|s| s.as_ptr()), &x.map(|s| s.as_ptr()), n, out) }
}

fn dequantize<I: Entries>(dt: DType, src: &[u8], out: &mut [f32]) {
    let (s, o, halves) = (src.as_ptr(), out.as_mut_ptr(), (src.len() / 2).min(out.len()));
    let nb = whole_blocks(dt, src.len(), out.len());
    // SAFETY: see above; `halves` values or `nb` whole blocks of both.
    match dt {
        DType::F16 => unsafe { I::deq_half::<false>(s, o, halves) },
        DType::BF16 => unsafe { I::deq_half::<true>(s, o, halves) },
        _ if dt != DType::F32 && unsafe { I::deq_blocks(dt, s, o, nb) } => {}
        _ => crate::quant::dequantize(dt, src, out),
    }
}

/// Whole blocks of `dt` covered by both `bytes` bytes and `elems` elements.
#[inline]
pub(crate) fn whole_blocks(dt: DType, bytes: usize, elems: usize) -> usize {
    (bytes / dt.block_bytes()).min(elems / dt.block_elems())
}

/// Group dot (`DOT`: `a` the queries, `b` one score per head, `b[h] =
/// a_h · row`) or group axpy (`a` one weight per head, `b` the outputs,
/// `b_h += a[h] · row`) on a coded row, heads in blocks of up to four.
/// Only installed by [`kv_group_kernels`], after the ISA's detection.
fn kv_group<I: KvIsa, const T: u8, const DOT: bool>(data: &[u8], scales: &[f32], a: &[f32], b: &mut [f32]) {
    let (g, rows) = if DOT { (b.len(), a.len()) } else { (a.len(), b.len()) };
    let d = rows.checked_div(g).unwrap_or(0);
    check_group_row(T, d, data.len(), scales.len());
    let mut h = 0;
    while h < g {
        let n = (g - h).min(4);
        let (ah, bh) = if DOT { (h * d, h) } else { (h, h * d) };
        let (s, a, o) = (scales.as_ptr(), a[ah..].as_ptr(), b[bh..].as_mut_ptr());
        // SAFETY: reachable only after the ISA's detection; the row's
        // sizes were checked for `d`; heads h..h + n exist in both slices.
        unsafe {
            match n {
                1 => I::row::<T, 1, DOT>((data.as_ptr(), s, a, d, o)),
                2 => I::row::<T, 2, DOT>((data.as_ptr(), s, a, d, o)),
                3 => I::row::<T, 3, DOT>((data.as_ptr(), s, a, d, o)),
                _ => I::row::<T, 4, DOT>((data.as_ptr(), s, a, d, o)),
            }
        }
        h += n;
    }
}

/// The group kernels of `I` (with `runs`, its run kernels: dots, axpys),
/// when the CPU has its features.
pub(crate) fn kv_group_kernels<I: KvIsa + DotIsa>(
    runs: Option<([KvRunFn; 3], [KvRunFn; 3])>,
) -> Option<KvGroupKernels> {
    I::detected().then(|| KvGroupKernels {
        isa: I::ISA,
        dot: [kv_group::<I, KV_F16, true>, kv_group::<I, KV_Q8, true>, kv_group::<I, KV_Q4, true>],
        axpy: [kv_group::<I, KV_F16, false>, kv_group::<I, KV_Q8, false>, kv_group::<I, KV_Q4, false>],
        dot_run: runs.map(|r| r.0),
        axpy_run: runs.map(|r| r.1),
    })
}
