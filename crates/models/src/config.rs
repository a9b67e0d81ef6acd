//! One configuration type for every supported checkpoint format and
//! architecture. Loaders translate their metadata into it; the forward pass
//! reads only this.

use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;
use serde::Serialize;

/// The architecture families kvslim runs. They differ only in the flags of
/// [`ModelConfig`]; there is one forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
    Gpt2,
    Opt,
    GptNeoX,
}

/// Normalisation used by the blocks and the final norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum NormKind {
    Rms,
    Layer,
}

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RopeConfig {
    pub theta: f32,
    /// Dimensions rotated per head (head_dim, or less with partial rotary).
    pub rotary_dim: usize,
    #[serde(serialize_with = "ser_layout")]
    pub layout: RopeLayout,
}

fn ser_layout<S: serde::Serializer>(l: &RopeLayout, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match l {
        RopeLayout::HalfSplit => "half-split",
        RopeLayout::AdjacentPairs => "adjacent-pairs",
    })
}

fn ser_act<S: serde::Serializer>(a: &Activation, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{a:?}").to_lowercase())
}

/// Sliding-window attention: on a *local* layer a query at position `p`
/// attends only to positions `p + 1 − window ..= p` (itself and the
/// `window − 1` tokens before it), so that layer's cache never needs more
/// than `window` slots whatever the policy; *global* layers see everything
/// the policy keeps. Mistral makes every layer local; Gemma 3 interleaves
/// local and global layers, each kind with its own RoPE base.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlidingWindow {
    /// Keys visible to one query on a local layer, the query included.
    pub window: usize,
    /// Per layer: true when the layer is local (windowed).
    pub local_layers: Vec<bool>,
    /// RoPE base of the local layers when it differs from the global one.
    pub local_rope_theta: Option<f32>,
}

impl SlidingWindow {
    /// The window of layer `layer`, `None` for a global layer.
    pub fn of_layer(&self, layer: usize) -> Option<usize> {
        self.local_layers.get(layer).copied().unwrap_or(false).then_some(self.window)
    }
}

/// Block features beyond the classic pre-norm transformer. Each is read by
/// the forward pass and checked against the weights at load
/// ([`crate::weights::Weights::check_against`]), so config and tensors
/// cannot disagree.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BlockFeatures {
    /// Per-head RMS norm of queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// A norm after attention and after the MLP, before each residual add
    /// (Gemma 2/3 "sandwich" norms).
    pub post_norms: bool,
    /// Token embeddings are multiplied by this (Gemma: √hidden_size).
    pub embedding_scale: Option<f32>,
    /// Attention logit scale when not 1/√head_dim (Gemma's
    /// `query_pre_attn_scalar`).
    pub attention_scale: Option<f32>,
    /// Sliding-window layers, when the model has any.
    pub sliding_window: Option<SlidingWindow>,
}

/// Where a model came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SourceFormat {
    HfSafetensors,
    Gguf,
    Llama2c,
}

/// The shape and structure of a decoder-only transformer.
#[derive(Clone, Debug, Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub format: SourceFormat,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub hidden_size: usize,
    pub ffn_size: usize,
    pub vocab_size: usize,
    pub context_len: usize,
    pub norm: NormKind,
    pub norm_eps: f32,
    #[serde(serialize_with = "ser_act")]
    pub activation: Activation,
    /// Gated MLP (act(gate)·up → down) instead of up → act → down; the
    /// layers carry a gate exactly when this is set
    /// ([`crate::weights::Weights::check_against`]).
    pub gated_mlp: bool,
    pub rope: Option<RopeConfig>,
    /// Learned absolute positions with this row offset (OPT: 2, GPT-2: 0).
    pub learned_positions: Option<usize>,
    /// GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x) instead of sequential residuals.
    pub parallel_residual: bool,
    /// The output projection is the token embedding (no separate
    /// `lm_head` in the weights, checked at load).
    pub tied_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// QK norms, sandwich norms, embedding scale, sliding windows.
    pub features: BlockFeatures,
}

impl ModelConfig {
    /// Query heads per KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// The attention logit scale (default 1/√head_dim).
    pub fn attention_scale(&self) -> f32 {
        self.features.attention_scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }
    /// The sliding window of layer `layer` (`None`: global attention).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.features.sliding_window.as_ref().and_then(|w| w.of_layer(layer))
    }

    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("hidden_size", self.hidden_size),
            ("ffn_size", self.ffn_size),
            ("vocab_size", self.vocab_size),
            ("context_len", self.context_len),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!("n_heads ({}) is not a multiple of n_kv_heads ({})", self.n_heads, self.n_kv_heads));
        }
        if let Some(r) = &self.rope {
            if r.rotary_dim > self.head_dim || r.rotary_dim % 2 != 0 {
                return Err(format!("rotary_dim {} invalid for head_dim {}", r.rotary_dim, self.head_dim));
            }
        }
        if let Some(w) = &self.features.sliding_window {
            if w.window == 0 {
                return Err("sliding window must be positive".into());
            }
            if w.local_layers.len() != self.n_layers {
                return Err(format!(
                    "sliding-window layer pattern has {} entries for {} layers",
                    w.local_layers.len(),
                    self.n_layers
                ));
            }
        }
        if self.n_layers > 4096 || self.hidden_size > 1 << 20 || self.vocab_size > 1 << 24 {
            return Err("implausible model dimensions".into());
        }
        Ok(())
    }
}
