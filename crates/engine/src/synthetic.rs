//! Random-weight models of named shapes, so speed can be measured on
//! models larger than the CPU caches without downloading anything.

use crate::sampling::Rng;
use crate::{EngineError, Result};
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::{ops::Activation, DType, Matrix};
use kvslim_models::config::{Architecture, ModelConfig, NormKind, RopeConfig, SourceFormat};
use kvslim_models::weights::{LayerWeights, Linear, NormWeights, Weights};
use kvslim_models::Model;
use rayon::prelude::*;

/// A named model shape for synthetic benchmarks.
pub struct Shape {
    pub name: &'static str,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub description: &'static str,
}

/// The shapes `kvslim bench --synthetic` knows.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "llama-350m",
        layers: 24,
        hidden: 1024,
        ffn: 2816,
        heads: 16,
        kv_heads: 16,
        vocab: 32000,
        description: "Llama-style, ~370M parameters",
    },
    Shape {
        name: "llama-1b",
        layers: 22,
        hidden: 2048,
        ffn: 5632,
        heads: 32,
        kv_heads: 4,
        vocab: 32000,
        description: "TinyLlama-1.1B shape, GQA 32/4",
    },
    Shape {
        name: "smollm2-135m",
        layers: 30,
        hidden: 576,
        ffn: 1536,
        heads: 9,
        kv_heads: 3,
        vocab: 49152,
        description: "SmolLM2-135M shape, GQA 9/3, tied",
    },
];

/// Builds a model of shape `name` with random weights stored as `dtype`.
pub fn build(name: &str, dtype: DType, seed: u64) -> Result<Model> {
    let sh = SHAPES.iter().find(|s| s.name == name).ok_or_else(|| {
        let known: Vec<_> = SHAPES.iter().map(|s| format!("{} ({})", s.name, s.description)).collect();
        EngineError::Request(format!("unknown synthetic shape `{name}`; known: {}", known.join(", ")))
    })?;
    let (layers, d, ffn, heads, kv_heads, vocab) = (sh.layers, sh.hidden, sh.ffn, sh.heads, sh.kv_heads, sh.vocab);
    let head_dim = d / heads;
    let tied = name.starts_with("smollm2");
    let config = ModelConfig {
        tied_embeddings: tied,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        ..llama_config(layers, d, ffn, heads, kv_heads, head_dim, vocab)
    };
    random_model(config, dtype, seed, 1.0)
}

/// A Llama-style configuration (RMSNorm, SiLU-gated MLP, half-split RoPE,
/// 4,096 positions, untied, no special tokens) for synthetic and test
/// models; adjust fields with struct update syntax.
pub fn llama_config(
    layers: usize,
    hidden: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        format: SourceFormat::HfSafetensors,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim,
        hidden_size: hidden,
        ffn_size: ffn,
        vocab_size: vocab,
        context_len: 4096,
        norm: NormKind::Rms,
        norm_eps: 1e-5,
        activation: Activation::Silu,
        gated_mlp: true,
        rope: Some(RopeConfig { theta: 10000.0, rotary_dim: head_dim, layout: RopeLayout::HalfSplit }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        features: Default::default(),
    }
}

/// A model of any Llama-style `config` with random weights stored as
/// `dtype`; `qk_gain` scales Q and K projections (larger = peakier
/// attention, useful for policy tests).
pub fn random_model(config: ModelConfig, dtype: DType, seed: u64, qk_gain: f32) -> Result<Model> {
    let (layers, d, ffn, heads, kv_heads, vocab) =
        (config.n_layers, config.hidden_size, config.ffn_size, config.n_heads, config.n_kv_heads, config.vocab_size);
    let head_dim = config.head_dim;
    let tied = config.tied_embeddings;
    let matrix_scaled = |rows: usize, cols: usize, salt: u64, gain: f32| -> Result<Matrix> {
        let mut rng = Rng::new(seed ^ salt.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let scale = gain / (cols as f32).sqrt();
        let data: Vec<f32> = (0..rows * cols).map(|_| (rng.next_f32() * 2.0 - 1.0) * scale).collect();
        Matrix::quantized(dtype, rows, cols, &data).map_err(|e| EngineError::Model(e.into()))
    };
    let matrix = |rows, cols, salt| matrix_scaled(rows, cols, salt, 1.0);
    let lin = |rows, cols, salt| matrix(rows, cols, salt).map(|m| Linear::new(m, None));
    let lin_qk = |rows, cols, salt| matrix_scaled(rows, cols, salt, qk_gain).map(|m| Linear::new(m, None));
    let ones = || NormWeights { weight: vec![1.0; d], bias: None };
    let layer_weights: Result<Vec<LayerWeights>> = (0..layers)
        .into_par_iter()
        .map(|l| {
            let s = 100 + l as u64 * 10;
            Ok(LayerWeights::pre_norm(
                ones(),
                [
                    lin_qk(heads * head_dim, d, s)?,
                    lin_qk(kv_heads * head_dim, d, s + 1)?,
                    lin(kv_heads * head_dim, d, s + 2)?,
                ],
                lin(d, heads * head_dim, s + 3)?,
                ones(),
                Some(lin(ffn, d, s + 4)?),
                [lin(ffn, d, s + 5)?, lin(d, ffn, s + 6)?],
            ))
        })
        .collect();
    let weights = Weights {
        token_embedding: matrix(vocab, d, 1)?,
        position_embedding: None,
        layers: layer_weights?,
        final_norm: ones(),
        lm_head: if tied { None } else { Some(lin(vocab, d, 2)?) },
    };
    Ok(Model::new(config, weights)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_wider_than_the_attention_kernel_is_an_error() {
        let wide = llama_config(1, 1024, 64, 1, 1, 1024, 16);
        let e = random_model(wide, DType::F32, 1, 1.0).err().expect("head_dim 1024 is refused").to_string();
        assert!(e.contains("head_dim 1024 exceeds"), "{e}");
        assert!(random_model(llama_config(1, 64, 64, 1, 1, 64, 16), DType::F32, 1, 1.0).is_ok());
    }
}
