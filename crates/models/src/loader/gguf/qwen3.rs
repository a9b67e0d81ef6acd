//! `qwen3`: per-head RMS norm of q and k before RoPE, NEOX RoPE.

use super::arch::Arch;
use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

pub(super) const ARCH: Arch = Arch {
    name: "qwen3",
    architecture: Architecture::Qwen3,
    rope: RopeLayout::HalfSplit,
    qk_norm: true,
    gemma: None,
    fused: false,
    activation: Activation::Silu,
};
