//! The description each GGUF architecture file (`llama.rs`, `qwen2.rs`, …)
//! fills in and [`super::build`] reads.

use crate::config::Architecture;
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;

/// What sets one GGUF architecture apart from `llama` (each has its file:
/// `llama.rs`, `qwen2.rs`, …); the rest of the translation is shared.
pub(super) struct Arch {
    /// `general.architecture`, also the prefix of its metadata keys.
    pub name: &'static str,
    pub architecture: Architecture,
    /// How RoPE pairs dimensions: `llama` converters permute q/k so pairs
    /// are adjacent; the others keep the original order (rotate halves).
    pub rope: RopeLayout,
    /// Per-head RMS norm of q and k before RoPE.
    pub qk_norm: bool,
    /// Gemma's extras: norms after attention and MLP, embeddings × √d, and
    /// sliding-window defaults.
    pub gemma: Option<Gemma>,
    /// q/k/v in one `attn_qkv` tensor and gate/up in one `ffn_up`.
    pub fused: bool,
    pub activation: Activation,
}

/// Gemma 3's defaults for sliding-window layers.
pub(super) struct Gemma {
    /// Without `attention.sliding_window_pattern`, every this-many-th layer is global.
    pub global_every: usize,
    /// The RoPE base of local layers without `rope.freq_base_swa`.
    pub local_rope_base: f32,
}
