//! SIMD implementations of the [`DotKernels`](crate::dot::DotKernels) set.
//!
//! Each submodule exposes `kernels() -> Option<DotKernels>`, which returns
//! `Some` only when the running CPU has every feature the module's
//! `#[target_feature]` functions need. The safe function pointers inside the
//! returned set call those functions; they are private to their module, so
//! the detection check is the only way to obtain them.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod lanes;
#[cfg(any(target_arch = "aarch64", test))]
pub(crate) mod neon;
#[cfg(all(test, not(target_arch = "aarch64")))]
mod neon_mock;

/// Whole 256-element super-blocks of `bb` bytes covered by a row and `x`.
#[inline]
#[allow(dead_code)]
pub(crate) fn super_blocks(w_len: usize, bb: usize, x_len: usize) -> usize {
    (w_len / bb).min(x_len / crate::quant::QK_K)
}

/// Shortest length of the eight slices of a 4×4 tile.
#[allow(dead_code)]
pub(crate) fn tile_len(w: &[&[f32]; 4], x: &[&[f32]; 4]) -> usize {
    w.iter().chain(x).map(|s| s.len()).min().unwrap_or(0)
}

/// The safe wrappers of an ISA's unsafe kernels, one line each:
/// `vis name: kind => implementation;`, where kind is how the length is
/// found: `elems(T)` (rows of `T` and f32, the shorter length), `blocks(BB)`
/// (whole 32-element blocks of `BB` bytes), `super_blocks(BB)` (whole
/// 256-element super-blocks), `axpy` or `tile` (the 4×4 GEMM tile).
///
/// Use it only in an ISA module whose `kernels()` checks every feature the
/// implementations enable: the wrappers are reachable only through the set
/// it returns, and the lengths passed never exceed either slice.
macro_rules! safe_kernels {
    ($($vis:vis $name:ident: $kind:ident $(($arg:tt))? => $imp:expr;)*) => {$(
        $crate::simd::safe_kernels!(@ $vis $name $kind ($($arg)?) $imp);
    )*};
    (@ $vis:vis $name:ident elems ($t:ty) $imp:expr) => {
        $vis fn $name(w: &[$t], x: &[f32]) -> f32 {
            let n = w.len().min(x.len());
            // SAFETY: see `safe_kernels`.
            unsafe { $imp(w.as_ptr(), x.as_ptr(), n) }
        }
    };
    (@ $vis:vis $name:ident blocks ($bb:expr) $imp:expr) => {
        $vis fn $name(w: &[u8], x: &[f32]) -> f32 {
            let nb = $crate::simd::whole_blocks(w.len(), $bb, x.len());
            // SAFETY: see `safe_kernels`.
            unsafe { $imp(w.as_ptr(), x.as_ptr(), nb) }
        }
    };
    (@ $vis:vis $name:ident super_blocks ($bb:expr) $imp:expr) => {
        $vis fn $name(w: &[u8], x: &[f32]) -> f32 {
            let nb = $crate::simd::super_blocks(w.len(), $bb, x.len());
            // SAFETY: see `safe_kernels`.
            unsafe { $imp(w.as_ptr(), x.as_ptr(), nb) }
        }
    };
    (@ $vis:vis $name:ident axpy () $imp:expr) => {
        $vis fn $name(a: f32, x: &[f32], y: &mut [f32]) {
            let n = x.len().min(y.len());
            // SAFETY: see `safe_kernels`.
            unsafe { $imp(a, x.as_ptr(), y.as_mut_ptr(), n) }
        }
    };
    (@ $vis:vis $name:ident tile () $imp:expr) => {
        $vis fn $name(w: &[&[f32]; 4], x: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
            let n = $crate::simd::tile_len(w, x);
            // SAFETY: see `safe_kernels`.
            unsafe { $imp(&w.map(|s| s.as_ptr()), &x.map(|s| s.as_ptr()), n, out) }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use safe_kernels;

/// Number of whole 32-element blocks covered by both a block-format row of
/// `block_bytes`-byte blocks and the activations.
#[inline]
#[allow(dead_code)]
pub(crate) fn whole_blocks(w_len: usize, block_bytes: usize, x_len: usize) -> usize {
    (w_len / block_bytes).min(x_len / crate::quant::QK)
}
