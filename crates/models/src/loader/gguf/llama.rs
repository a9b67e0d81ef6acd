//! `llama`: the reference the other GGUF architectures differ from. Its
//! converter permutes the q/k tensors so RoPE rotates adjacent pairs.

use super::arch::Arch;
use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

pub(super) const ARCH: Arch = Arch {
    name: "llama",
    architecture: Architecture::Llama,
    rope: RopeLayout::AdjacentPairs,
    qk_norm: false,
    gemma: None,
    fused: false,
    activation: Activation::Silu,
};
