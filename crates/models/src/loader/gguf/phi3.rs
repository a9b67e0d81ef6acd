//! `phi3`: fused `attn_qkv` and gate/up `ffn_up` tensors, NEOX RoPE, an
//! optional sliding window.

use super::arch::Arch;
use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

pub(super) const ARCH: Arch = Arch {
    name: "phi3",
    architecture: Architecture::Phi3,
    rope: RopeLayout::HalfSplit,
    qk_norm: false,
    gemma: None,
    fused: true,
    activation: Activation::Silu,
};
