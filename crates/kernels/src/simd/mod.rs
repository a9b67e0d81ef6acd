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

/// Number of whole 32-element blocks covered by both a block-format row of
/// `block_bytes`-byte blocks and the activations.
#[inline]
#[allow(dead_code)]
pub(crate) fn whole_blocks(w_len: usize, block_bytes: usize, x_len: usize) -> usize {
    (w_len / block_bytes).min(x_len / crate::quant::QK)
}
