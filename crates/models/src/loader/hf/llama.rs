//! Llama-style blocks: RMS norms, rotary attention with separate
//! `q_proj`/`k_proj`/`v_proj`, a gated MLP. Llama, Mistral, Qwen2 and Qwen3
//! differ only in config flags and live here; Gemma 3 and Phi-3 reuse the
//! config reading and the block reader with their own [`Flavour`] and
//! [`Layout`].

use super::reader::Reader;
use super::{head, layers, rotary_dim, Cfg, ConfigError};
use crate::config::{Architecture, BlockFeatures, ModelConfig, NormKind, RopeConfig, SlidingWindow, SourceFormat};
use crate::weights::{LayerWeights, Linear, NormWeights, Weights};
use crate::Result;
use kvslim_kernels::rope::RopeLayout;

/// Which layers of `n_layers` are local (sliding-window) ones.
pub(super) type LocalLayers = fn(&Cfg, usize) -> Result<Option<Vec<bool>>, ConfigError>;

/// What a Llama-style family changes in the shared reading of `config.json`.
pub(super) struct Flavour {
    pub architecture: Architecture,
    /// The key naming the MLP activation, and the activation when absent.
    pub activation: (&'static str, &'static str),
    /// RoPE base when `config.json` gives none.
    pub rope_theta: f32,
    /// `tie_word_embeddings` when absent.
    pub tied: bool,
    /// Per layer, whether it uses the `sliding_window` (`None`: none does).
    pub local_layers: LocalLayers,
}

impl Flavour {
    /// The Llama defaults for `architecture`, windowed as `local_layers` says.
    pub(super) const fn plain(architecture: Architecture, local_layers: LocalLayers) -> Self {
        Flavour { architecture, activation: ("hidden_act", "silu"), rope_theta: 10000.0, tied: false, local_layers }
    }
}

fn no_window(_: &Cfg, _: usize) -> Result<Option<Vec<bool>>, ConfigError> {
    Ok(None)
}

/// Every layer sees only the last `sliding_window` keys (Mistral, Phi-3).
pub(super) fn all_local(_: &Cfg, n_layers: usize) -> Result<Option<Vec<bool>>, ConfigError> {
    Ok(Some(vec![true; n_layers]))
}

/// Qwen2/3 carry `sliding_window` but use it only with `use_sliding_window`.
fn local_if_enabled(j: &Cfg, n_layers: usize) -> Result<Option<Vec<bool>>, ConfigError> {
    Ok((j.bool("use_sliding_window") == Some(true)).then(|| vec![true; n_layers]))
}

pub(super) fn llama(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    config(j, &Flavour::plain(Architecture::Llama, no_window))
}

pub(super) fn mistral(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    config(j, &Flavour::plain(Architecture::Mistral, all_local))
}

pub(super) fn qwen2(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    config(j, &Flavour::plain(Architecture::Qwen2, local_if_enabled))
}

/// Qwen2 plus per-head RMS norms of queries and keys.
pub(super) fn qwen3(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    let mut c = config(j, &Flavour::plain(Architecture::Qwen3, local_if_enabled))?;
    c.features.qk_norm = true;
    Ok(c)
}

/// The `config.json` reading all Llama-style families share.
pub(super) fn config(j: &Cfg, f: &Flavour) -> Result<ModelConfig, ConfigError> {
    let hidden = j.need(&["hidden_size"])?;
    let heads = j.need(&["num_attention_heads"])?;
    let head_dim = j.usize(&["head_dim"]).unwrap_or(hidden / heads.max(1));
    let context = j.need(&["max_position_embeddings"])?;
    let n_layers = j.need(&["num_hidden_layers"])?;
    let window = j.usize(&["sliding_window"]).filter(|&w| w > 0 && w < context);
    let local_layers = (f.local_layers)(j, n_layers)?;
    let sliding_window = window.zip(local_layers).map(|(window, local_layers)| SlidingWindow {
        window,
        local_layers,
        local_rope_theta: None,
    });
    let (act_key, act_default) = f.activation;
    Ok(ModelConfig {
        architecture: f.architecture,
        format: SourceFormat::HfSafetensors,
        n_layers,
        n_heads: heads,
        n_kv_heads: j.usize(&["num_key_value_heads"]).unwrap_or(heads),
        head_dim,
        hidden_size: hidden,
        ffn_size: j.need(&["intermediate_size"])?,
        vocab_size: j.need(&["vocab_size"])?,
        context_len: context,
        norm: NormKind::Rms,
        norm_eps: j.f32(&["rms_norm_eps"]).unwrap_or(1e-6),
        activation: j.activation(act_key, act_default)?,
        gated_mlp: true,
        rope: Some(RopeConfig {
            theta: j.rope_f32(&["rope_theta"]).unwrap_or(f.rope_theta),
            rotary_dim: rotary_dim(head_dim, j.f32(&["partial_rotary_factor"]).unwrap_or(1.0)),
            layout: RopeLayout::HalfSplit,
        }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: j.bool("tie_word_embeddings").unwrap_or(f.tied),
        bos_token_id: j.bos(),
        eos_token_ids: j.eos(),
        features: BlockFeatures { sliding_window, ..Default::default() },
    })
}

/// How a Llama-style family stores a block's projections and norms.
pub(super) struct Layout {
    /// Q, K and V of the layer with prefix `p` (`p.self_attn.…`).
    pub qkv: fn(&Reader, &ModelConfig, &str) -> Result<[Linear; 3]>,
    /// The MLP's gate and up projections (`p.mlp.…`).
    pub gate_up: fn(&Reader, &ModelConfig, &str) -> Result<[Linear; 2]>,
    /// RMS norm weights are stored as `w` and applied as `1 + w` (Gemma).
    pub unit_offset_norms: bool,
}

/// Llama's own layout: one tensor per projection.
pub(super) const LAYOUT: Layout = Layout { qkv: separate_qkv, gate_up: separate_gate_up, unit_offset_norms: false };

fn separate_qkv(r: &Reader, c: &ModelConfig, p: &str) -> Result<[Linear; 3]> {
    let (d, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
    let att = |s: &str| format!("{p}.self_attn.{s}");
    Ok([r.linear(&att("q_proj"), qd, d)?, r.linear(&att("k_proj"), kvd, d)?, r.linear(&att("v_proj"), kvd, d)?])
}

fn separate_gate_up(r: &Reader, c: &ModelConfig, p: &str) -> Result<[Linear; 2]> {
    let (d, f) = (c.hidden_size, c.ffn_size);
    Ok([r.linear(&format!("{p}.mlp.gate_proj"), f, d)?, r.linear(&format!("{p}.mlp.up_proj"), f, d)?])
}

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    weights_in(r, c, &LAYOUT)
}

/// The weights of a Llama-style model stored as `layout` says.
pub(super) fn weights_in(r: &Reader, c: &ModelConfig, layout: &Layout) -> Result<Weights> {
    let d = c.hidden_size;
    Ok(Weights {
        layers: layers(c, |l| layer(r, c, layout, &format!("model.layers.{l}")))?,
        token_embedding: r.matrix("model.embed_tokens.weight", c.vocab_size, d)?,
        position_embedding: None,
        final_norm: layout.norm(r, "model.norm", d)?,
        lm_head: head(r, c, "lm_head.weight")?,
    })
}

impl Layout {
    fn norm(&self, r: &Reader, prefix: &str, dim: usize) -> Result<NormWeights> {
        let mut n = r.norm(prefix, dim)?;
        if self.unit_offset_norms {
            n.weight.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(n)
    }
}

/// One block: the Llama layout plus QK norms (Qwen3, Gemma 3) and sandwich
/// norms (Gemma 3: `post_attention_layernorm` is the norm *after*
/// attention there, `pre_feedforward_layernorm` the MLP's input norm).
fn layer(r: &Reader, c: &ModelConfig, layout: &Layout, p: &str) -> Result<LayerWeights> {
    let (d, f, hd) = (c.hidden_size, c.ffn_size, c.head_dim);
    let [q, k, v] = (layout.qkv)(r, c, p)?;
    let [gate, up] = (layout.gate_up)(r, c, p)?;
    let qk = |s: &str| -> Result<Option<NormWeights>> {
        if c.features.qk_norm {
            layout.norm(r, &format!("{p}.self_attn.{s}"), hd).map(Some)
        } else {
            Ok(None)
        }
    };
    let norm = |s: &str| layout.norm(r, &format!("{p}.{s}"), d);
    let post = c.features.post_norms;
    Ok(LayerWeights {
        attn_norm: norm("input_layernorm")?,
        q,
        k,
        v,
        o: r.linear(&format!("{p}.self_attn.o_proj"), d, c.q_dim())?,
        mlp_norm: norm(if post { "pre_feedforward_layernorm" } else { "post_attention_layernorm" })?,
        gate: Some(gate),
        up,
        down: r.linear(&format!("{p}.mlp.down_proj"), d, f)?,
        q_norm: qk("q_norm")?,
        k_norm: qk("k_norm")?,
        post_attn_norm: if post { Some(norm("post_attention_layernorm")?) } else { None },
        post_mlp_norm: if post { Some(norm("post_feedforward_layernorm")?) } else { None },
    })
}
