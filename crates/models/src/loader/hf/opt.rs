//! OPT: pre-LN LayerNorm blocks with learned positions (offset 2), separate
//! Q/K/V projections and a ReLU MLP (`fc1`/`fc2`). Post-LN OPT-350m and a
//! projected embedding width are refused.

use super::reader::Reader;
use super::{head, layers, ungated_config, Cfg, ConfigError, Sizes};
use crate::config::{Architecture, ModelConfig};
use crate::weights::{LayerWeights, Weights};
use crate::Result;

pub(super) fn config(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    let hidden = j.need(&["hidden_size"])?;
    let heads = j.need(&["num_attention_heads"])?;
    if j.bool("do_layer_norm_before") == Some(false) {
        return Err(ConfigError::Invalid(
            "OPT with do_layer_norm_before=false (post-LN, OPT-350m) is not supported".into(),
        ));
    }
    if j.usize(&["word_embed_proj_dim"]).is_some_and(|p| p != hidden) {
        return Err(ConfigError::Invalid("OPT with word_embed_proj_dim != hidden_size is not supported".into()));
    }
    let sizes = Sizes::usual(j, hidden, heads, "ffn_dim")?;
    let activation = j.activation("activation_function", "relu")?;
    Ok(ModelConfig {
        learned_positions: Some(2),
        tied_embeddings: j.bool("tie_word_embeddings").unwrap_or(true),
        ..ungated_config(j, Architecture::Opt, sizes, activation)
    })
}

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    let (d, f) = (c.hidden_size, c.ffn_size);
    let pre = if r.contains("model.decoder.embed_tokens.weight") { "model.decoder." } else { "decoder." };
    let layer = |l: usize| {
        let p = format!("{pre}layers.{l}");
        let att = |s: &str| r.linear(&format!("{p}.self_attn.{s}"), d, d);
        Ok(LayerWeights::pre_norm(
            r.norm(&format!("{p}.self_attn_layer_norm"), d)?,
            [att("q_proj")?, att("k_proj")?, att("v_proj")?],
            att("out_proj")?,
            r.norm(&format!("{p}.final_layer_norm"), d)?,
            None,
            [r.linear(&format!("{p}.fc1"), f, d)?, r.linear(&format!("{p}.fc2"), d, f)?],
        ))
    };
    Ok(Weights {
        layers: layers(c, layer)?,
        token_embedding: r.matrix(&format!("{pre}embed_tokens.weight"), c.vocab_size, d)?,
        position_embedding: Some(r.matrix(&format!("{pre}embed_positions.weight"), c.context_len + 2, d)?),
        final_norm: r.norm(&format!("{pre}final_layer_norm"), d)?,
        lm_head: head(r, c, "lm_head.weight")?,
    })
}
