//! `gemma3`: QK norm, norms after attention and MLP, GeGLU (tanh),
//! embeddings × √d, sliding-window layers with their own RoPE base, NEOX
//! RoPE.

use super::arch::{Arch, Gemma};
use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

pub(super) const ARCH: Arch = Arch {
    name: "gemma3",
    architecture: Architecture::Gemma3,
    rope: RopeLayout::HalfSplit,
    qk_norm: true,
    gemma: Some(Gemma {
        // files without `gemma3.attention.sliding_window_pattern` (every
        // real one) make every 6th layer global, as llama.cpp does
        global_every: 6,
        // the RoPE base on local layers when the file does not say
        local_rope_base: 10_000.0,
    }),
    fused: false,
    activation: Activation::GeluTanh,
};
