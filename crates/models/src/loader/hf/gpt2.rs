//! GPT-2: LayerNorm blocks with learned absolute positions, an ungated MLP,
//! `Conv1D` weights stored [in, out] with Q/K/V fused in `c_attn`, and the
//! output tied to the token embedding.

use super::reader::Reader;
use super::{layers, ungated_config, Cfg, ConfigError, Sizes};
use crate::config::{Architecture, ModelConfig};
use crate::weights::{LayerWeights, Linear, Weights};
use crate::{Error, Result};
use kvslim_kernels::Matrix;

pub(super) fn config(j: &Cfg) -> Result<ModelConfig, ConfigError> {
    let hidden = j.need(&["n_embd", "hidden_size"])?;
    let heads = j.need(&["n_head", "num_attention_heads"])?;
    let sizes = Sizes {
        n_layers: j.need(&["n_layer", "num_hidden_layers"])?,
        hidden,
        heads,
        ffn: j.usize(&["n_inner"]).unwrap_or(hidden.saturating_mul(4)),
        vocab: j.need(&["vocab_size"])?,
        context: j.need(&["n_positions", "max_position_embeddings"])?,
    };
    let activation = j.activation("activation_function", "gelu_new")?;
    Ok(ModelConfig {
        norm_eps: j.f32(&["layer_norm_epsilon"]).unwrap_or(1e-5),
        learned_positions: Some(0),
        tied_embeddings: true,
        ..ungated_config(j, Architecture::Gpt2, sizes, activation)
    })
}

pub(super) fn weights(r: &Reader, c: &ModelConfig) -> Result<Weights> {
    let (d, f) = (c.hidden_size, c.ffn_size);
    let pre = if r.contains("transformer.wte.weight") { "transformer." } else { "" };
    let one = |name: &str, i: usize, o: usize| -> Result<Linear> {
        conv1d(r, name, i, o, 1)?.pop().ok_or_else(|| Error::MissingTensor(name.into()))
    };
    let layer = |l: usize| {
        let p = format!("{pre}h.{l}");
        let qkv: [Linear; 3] = conv1d(r, &format!("{p}.attn.c_attn"), d, 3 * d, 3)?
            .try_into()
            .unwrap_or_else(|_| unreachable!("three parts requested"));
        Ok(LayerWeights::pre_norm(
            r.norm(&format!("{p}.ln_1"), d)?,
            qkv,
            one(&format!("{p}.attn.c_proj"), d, d)?,
            r.norm(&format!("{p}.ln_2"), d)?,
            None,
            [one(&format!("{p}.mlp.c_fc"), d, f)?, one(&format!("{p}.mlp.c_proj"), f, d)?],
        ))
    };
    Ok(Weights {
        layers: layers(c, layer)?,
        token_embedding: r.matrix(&format!("{pre}wte.weight"), c.vocab_size, d)?,
        position_embedding: Some(r.matrix(&format!("{pre}wpe.weight"), c.context_len, d)?),
        final_norm: r.norm(&format!("{pre}ln_f"), d)?,
        lm_head: None,
    })
}

/// A `Conv1D` weight stored [in, out]: transposed to [out, in] and split
/// into `parts` row groups (fused QKV).
fn conv1d(r: &Reader, prefix: &str, inp: usize, out: usize, parts: usize) -> Result<Vec<Linear>> {
    let (t, dt) = r.raw(&format!("{prefix}.weight"), &[inp, out])?;
    let es = dt.block_bytes();
    let mut tr = vec![0u8; t.bytes.len()];
    for i in 0..inp {
        for o in 0..out {
            let src = (i * out + o) * es;
            let dst = (o * inp + i) * es;
            tr[dst..dst + es].copy_from_slice(&t.bytes[src..src + es]);
        }
    }
    let bias = r.opt_vector(&format!("{prefix}.bias"), out)?;
    let rows = out / parts;
    (0..parts)
        .map(|p| {
            let bytes = &tr[p * rows * inp * es..(p + 1) * rows * inp * es];
            Ok(Linear::new(
                Matrix::from_bytes(dt, rows, inp, bytes)?,
                bias.as_ref().map(|b| b[p * rows..(p + 1) * rows].to_vec()),
            ))
        })
        .collect()
}
