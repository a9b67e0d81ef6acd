//! Gemma 3: Llama-style blocks with QK norms, sandwich norms, RMS weights
//! stored as `w` and applied as `1 + w`, embeddings scaled by √hidden, and
//! interleaved local (sliding-window) and global layers, each kind with its
//! own RoPE base.

use super::llama::{self, Flavour, Layout};
use super::reader::Reader;
use super::{get_f32, Cfg, ConfigError};
use crate::config::{Architecture, ModelConfig};
use crate::weights::Weights;
use crate::Result;

const FLAVOUR: Flavour = Flavour {
    architecture: Architecture::Gemma3,
    activation: ("hidden_activation", "gelu_pytorch_tanh"),
    rope_theta: 1e6,
    tied: true,
    local_layers: layer_types,
};

pub(super) fn config(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    let mut c = llama::config(j, &FLAVOUR)?;
    let local_rope_theta = j
        .rope_parameters()
        .and_then(|r| r.get("sliding_attention"))
        .and_then(|r| get_f32(r, &["rope_theta"]))
        .or_else(|| j.f32(&["rope_local_base_freq"]))
        .unwrap_or(10_000.0);
    let f = &mut c.features;
    if let Some(w) = &mut f.sliding_window {
        w.local_rope_theta = Some(local_rope_theta);
    }
    f.qk_norm = true;
    f.post_norms = true;
    f.embedding_scale = Some((c.hidden_size as f32).sqrt());
    f.attention_scale = Some(1.0 / j.f32(&["query_pre_attn_scalar"]).unwrap_or(c.head_dim as f32).sqrt());
    Ok(c)
}

/// The local/global layer pattern: `layer_types` when given, else
/// `sliding_window_pattern` (every N-th layer global; 6 by default).
fn layer_types(j: &Cfg, n_layers: usize) -> Result<Option<Vec<bool>>, ConfigError> {
    if let Some(types) = j.get("layer_types").and_then(|t| t.as_array()) {
        let local: Option<Vec<bool>> = types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Some(true),
                Some("full_attention") => Some(false),
                _ => None,
            })
            .collect();
        return match local {
            Some(l) if l.len() == n_layers => Ok(Some(l)),
            _ => Err(ConfigError::Invalid(format!(
                "`layer_types` must list {n_layers} of \"sliding_attention\" / \"full_attention\""
            ))),
        };
    }
    let every = j.usize(&["sliding_window_pattern"]).unwrap_or(6).max(1);
    Ok(Some((0..n_layers).map(|l| (l + 1) % every != 0).collect()))
}

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    let layout = Layout { unit_offset_norms: true, ..llama::LAYOUT };
    llama::weights_in(r, c, &layout)
}
