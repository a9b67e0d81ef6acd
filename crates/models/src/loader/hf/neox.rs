//! GPT-NeoX (Pythia): LayerNorm blocks with parallel residuals by default,
//! partial rotary embeddings, an ungated MLP, and Q/K/V fused per head in
//! `query_key_value`.

use super::reader::Reader;
use super::{head, layers, rotary_dim, ungated_config, Cfg, ConfigError, Sizes};
use crate::config::{Architecture, ModelConfig, RopeConfig};
use crate::weights::{LayerWeights, Linear, Weights};
use crate::Result;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::Matrix;

pub(super) fn config(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    let hidden = j.need(&["hidden_size"])?;
    let heads = j.need(&["num_attention_heads"])?;
    let head_dim = hidden / heads.max(1);
    let sizes = Sizes::usual(j, hidden, heads, "intermediate_size")?;
    let activation = j.activation("hidden_act", "gelu")?;
    Ok(ModelConfig {
        norm_eps: j.f32(&["layer_norm_eps"]).unwrap_or(1e-5),
        rope: Some(RopeConfig {
            theta: j.rope_f32(&["rope_theta", "rotary_emb_base"]).unwrap_or(10000.0),
            rotary_dim: rotary_dim(head_dim, j.rope_f32(&["partial_rotary_factor", "rotary_pct"]).unwrap_or(1.0)),
            layout: RopeLayout::HalfSplit,
        }),
        parallel_residual: j.bool("use_parallel_residual").unwrap_or(true),
        tied_embeddings: j.bool("tie_word_embeddings").unwrap_or(false),
        ..ungated_config(j, Architecture::GptNeoX, sizes, activation)
    })
}

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    let (d, f) = (c.hidden_size, c.ffn_size);
    let layer = |l: usize| {
        let p = format!("gpt_neox.layers.{l}");
        Ok(LayerWeights::pre_norm(
            r.norm(&format!("{p}.input_layernorm"), d)?,
            fused_qkv(r, &format!("{p}.attention.query_key_value"), c.n_heads, c.head_dim, d)?,
            r.linear(&format!("{p}.attention.dense"), d, d)?,
            r.norm(&format!("{p}.post_attention_layernorm"), d)?,
            None,
            [r.linear(&format!("{p}.mlp.dense_h_to_4h"), f, d)?, r.linear(&format!("{p}.mlp.dense_4h_to_h"), d, f)?],
        ))
    };
    Ok(Weights {
        layers: layers(c, layer)?,
        token_embedding: r.matrix("gpt_neox.embed_in.weight", c.vocab_size, d)?,
        position_embedding: None,
        final_norm: r.norm("gpt_neox.final_layer_norm", d)?,
        lm_head: head(r, c, "embed_out.weight")?,
    })
}

/// The fused `query_key_value` [H·3·Dh, D], rows grouped per head as
/// (q, k, v): regrouped into three [H·Dh, D] projections.
fn fused_qkv(r: &Reader, prefix: &str, heads: usize, head_dim: usize, hidden: usize) -> Result<[Linear; 3]> {
    let (t, dt) = r.raw(&format!("{prefix}.weight"), &[3 * heads * head_dim, hidden])?;
    let row_bytes = dt.bytes_for(hidden);
    let bias = r.opt_vector(&format!("{prefix}.bias"), 3 * heads * head_dim)?;
    let part = |which: usize| -> Result<Linear> {
        let mut bytes = Vec::with_capacity(heads * head_dim * row_bytes);
        let mut b = bias.as_ref().map(|_| Vec::with_capacity(heads * head_dim));
        for h in 0..heads {
            let r0 = (h * 3 + which) * head_dim;
            bytes.extend_from_slice(&t.bytes[r0 * row_bytes..(r0 + head_dim) * row_bytes]);
            if let (Some(b), Some(src)) = (b.as_mut(), bias.as_ref()) {
                b.extend_from_slice(&src[r0..r0 + head_dim]);
            }
        }
        Ok(Linear::new(Matrix::from_bytes(dt, heads * head_dim, hidden, &bytes)?, b))
    };
    Ok([part(0)?, part(1)?, part(2)?])
}
