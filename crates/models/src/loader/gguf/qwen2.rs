//! `qwen2`: llama with q/k/v biases (read wherever the file has them) and
//! NEOX RoPE (rotate halves).

use super::arch::Arch;
use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

pub(super) const ARCH: Arch = Arch {
    name: "qwen2",
    architecture: Architecture::Qwen2,
    rope: RopeLayout::HalfSplit,
    qk_norm: false,
    gemma: None,
    fused: false,
    activation: Activation::Silu,
};
