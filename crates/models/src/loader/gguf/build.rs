//! GGUF metadata and tensors → [`ModelConfig`] and [`Weights`], shared by
//! every architecture; what sets one apart is its [`Arch`] entry.

use super::arch::Arch;
use super::{gemma3, llama, phi3, qwen2, qwen3, GgufFile, TensorInfo, Value};
use crate::config::{BlockFeatures, ModelConfig, NormKind, RopeConfig, SlidingWindow, SourceFormat};
use crate::weights::{LayerWeights, Linear, NormWeights, Weights};
use crate::{Error, Result};
use kvslim_kernels::Matrix;

/// The GGUF architectures kvslim maps onto its forward pass, written once.
const ARCHITECTURES: &[&Arch] = &[&llama::ARCH, &qwen2::ARCH, &qwen3::ARCH, &gemma3::ARCH, &phi3::ARCH];

/// The `general.architecture` names [`build`] reads (for error messages).
pub fn supported_architectures() -> impl Iterator<Item = &'static str> {
    ARCHITECTURES.iter().map(|a| a.name)
}

/// Translates a parsed file's metadata and tensors into a config and
/// weights, for the architecture `general.architecture` names.
pub fn build(f: &GgufFile) -> Result<(ModelConfig, Weights)> {
    let md = &f.metadata;
    let path = f.path();
    let arch_name = md
        .str("general.architecture")?
        .ok_or_else(|| Error::format(path, "metadata key `general.architecture` is missing"))?;
    let arch = ARCHITECTURES
        .iter()
        .find(|a| a.name == arch_name)
        .ok_or_else(|| Error::UnknownArchitecture(format!("gguf {arch_name}")))?;
    let architecture = arch.architecture;
    let a = arch_name;
    let key = |k: &str| format!("{a}.{k}");
    let required = |k: &str| -> Result<usize> {
        let k = key(k);
        md.usize(&k)?.ok_or_else(|| Error::format(path, format!("metadata key `{k}` is missing")))
    };
    let n_layers = required("block_count")?;
    let hidden = required("embedding_length")?;
    let ffn = required("feed_forward_length")?;
    let n_heads = required("attention.head_count")?;
    let context_len = required("context_length")?;
    let n_kv_heads = md.usize(&key("attention.head_count_kv"))?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 {
        return Err(Error::format(path, "attention head counts must be positive"));
    }
    let head_dim = match md.usize(&key("attention.key_length"))? {
        Some(k) => k,
        None => {
            if !hidden.is_multiple_of(n_heads) {
                return Err(Error::format(
                    path,
                    format!("embedding_length {hidden} is not a multiple of head_count {n_heads}"),
                ));
            }
            hidden / n_heads
        }
    };
    if let Some(vl) = md.usize(&key("attention.value_length"))? {
        if vl != head_dim {
            return Err(Error::format(
                path,
                format!("attention.value_length {vl} differs from key_length {head_dim}: not supported"),
            ));
        }
    }
    let rotary_dim = md.usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
    let theta = md.f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
    let norm_eps = md.f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
    if let Some(kind) = md.str(&key("rope.scaling.type"))? {
        let factor = md.f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
        if kind != "none" && factor != 1.0 {
            return Err(Error::format(path, format!("RoPE scaling `{kind}` (factor {factor}) is not supported")));
        }
    }
    for t in ["rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"] {
        if f.tensor(t).is_some() {
            return Err(Error::format(
                path,
                format!("per-dimension RoPE frequency factors (`{t}`, Llama 3.1 / Phi-3 long-context style) are not supported"),
            ));
        }
    }
    let gemma = arch.gemma.is_some();
    let sliding_window = match md.usize(&key("attention.sliding_window"))? {
        None | Some(0) => None,
        Some(window) => {
            let local_layers = match md.array(&key("attention.sliding_window_pattern"))? {
                Some(pattern) => {
                    let flags: Option<Vec<bool>> = pattern.iter().map(Value::as_bool).collect();
                    match flags {
                        Some(f) if f.len() == n_layers => f,
                        _ => {
                            return Err(Error::format(
                                path,
                                format!(
                                    "`{}` must hold one bool per layer ({n_layers})",
                                    key("attention.sliding_window_pattern")
                                ),
                            ))
                        }
                    }
                }
                None => match &arch.gemma {
                    Some(g) => (0..n_layers).map(|l| l % g.global_every < g.global_every - 1).collect(),
                    None => vec![true; n_layers],
                },
            };
            let local_rope_theta = match &arch.gemma {
                Some(g) => Some(md.f32(&key("rope.freq_base_swa"))?.unwrap_or(g.local_rope_base)),
                None => None,
            };
            Some(SlidingWindow { window, local_layers, local_rope_theta })
        }
    };
    let qk_norm = arch.qk_norm;
    let features = BlockFeatures {
        qk_norm,
        post_norms: gemma,
        embedding_scale: gemma.then(|| (hidden as f32).sqrt()),
        attention_scale: None,
        sliding_window,
    };
    let layout = arch.rope;

    let tensor =
        |name: &str| -> Result<&TensorInfo> { f.tensor(name).ok_or_else(|| Error::MissingTensor(name.to_string())) };
    let embd = tensor("token_embd.weight")?;
    let vocab_size = match embd.dims.as_slice() {
        [_, rows] => *rows,
        _ => 0,
    };
    let mut config = ModelConfig {
        architecture,
        format: SourceFormat::Gguf,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        hidden_size: hidden,
        ffn_size: ffn,
        vocab_size,
        context_len,
        norm: NormKind::Rms,
        norm_eps,
        activation: arch.activation,
        gated_mlp: true,
        rope: Some(RopeConfig { theta, rotary_dim, layout }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: f.tensor("output.weight").is_none(),
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        features,
    };
    config.validate().map_err(|why| Error::format(path, format!("invalid {a} config: {why}")))?;

    // a matrix of `rows × cols`, or rows `first..first + rows` of a fused one
    let matrix_rows = |name: &str, total_rows: usize, first: usize, rows: usize, cols: usize| -> Result<Matrix> {
        let t = tensor(name)?;
        if t.dims != [cols, total_rows] {
            return Err(Error::ShapeMismatch {
                name: format!("{name} (GGUF ne order: columns, rows)"),
                expected: vec![cols, total_rows],
                got: t.dims.clone(),
            });
        }
        if !cols.is_multiple_of(t.dtype.block_elems()) {
            return Err(Error::format(
                path,
                format!(
                    "tensor `{name}`: rows of {cols} are not whole {} blocks of {}",
                    t.dtype,
                    t.dtype.block_elems()
                ),
            ));
        }
        let rb = t.dtype.bytes_for(cols);
        let bytes = &f.data(t)[first * rb..(first + rows) * rb];
        Matrix::from_bytes(t.dtype, rows, cols, bytes).map_err(|e| Error::format(path, format!("tensor `{name}`: {e}")))
    };
    let matrix = |name: &str, rows: usize, cols: usize| matrix_rows(name, rows, 0, rows, cols);
    let vector = |name: &str, len: usize| -> Result<Vec<f32>> {
        let t = tensor(name)?;
        if t.dims != [len] {
            return Err(Error::ShapeMismatch { name: name.to_string(), expected: vec![len], got: t.dims.clone() });
        }
        let mut w = vec![0f32; len];
        kvslim_kernels::quant::dequantize(t.dtype, f.data(t), &mut w);
        Ok(w)
    };
    let norm_of =
        |name: &str, len: usize| -> Result<NormWeights> { Ok(NormWeights { weight: vector(name, len)?, bias: None }) };
    let optional_bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if f.tensor(name).is_some() {
            vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    };

    let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
    let token_embedding = matrix("token_embd.weight", vocab_size, hidden)?;
    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let b = |s: &str| format!("blk.{i}.{s}.bias");
        let lin = |s: &str, rows, cols| -> Result<Linear> {
            Ok(Linear::new(matrix(&n(s), rows, cols)?, optional_bias(&b(s), rows)?))
        };
        let (q, k, v) = if arch.fused {
            let total = q_dim + 2 * kv_dim;
            let part = |first, rows| -> Result<Linear> {
                Ok(Linear::new(matrix_rows(&n("attn_qkv"), total, first, rows, hidden)?, None))
            };
            (part(0, q_dim)?, part(q_dim, kv_dim)?, part(q_dim + kv_dim, kv_dim)?)
        } else {
            (lin("attn_q", q_dim, hidden)?, lin("attn_k", kv_dim, hidden)?, lin("attn_v", kv_dim, hidden)?)
        };
        let (gate, up) = if arch.fused {
            let part = |first| -> Result<Linear> {
                Ok(Linear::new(matrix_rows(&n("ffn_up"), 2 * ffn, first, ffn, hidden)?, None))
            };
            (part(0)?, part(ffn)?)
        } else {
            (lin("ffn_gate", ffn, hidden)?, lin("ffn_up", ffn, hidden)?)
        };
        let pair = |on: bool, a: &str, b: &str, len| -> Result<(Option<NormWeights>, Option<NormWeights>)> {
            Ok(if on { (Some(norm_of(&n(a), len)?), Some(norm_of(&n(b), len)?)) } else { (None, None) })
        };
        let (q_norm, k_norm) = pair(qk_norm, "attn_q_norm", "attn_k_norm", head_dim)?;
        let (post_attn_norm, post_mlp_norm) = pair(gemma, "post_attention_norm", "post_ffw_norm", hidden)?;
        layers.push(LayerWeights {
            attn_norm: norm_of(&n("attn_norm"), hidden)?,
            q,
            k,
            v,
            o: lin("attn_output", hidden, q_dim)?,
            mlp_norm: norm_of(&n("ffn_norm"), hidden)?,
            gate: Some(gate),
            up,
            down: lin("ffn_down", hidden, ffn)?,
            q_norm,
            k_norm,
            post_attn_norm,
            post_mlp_norm,
        });
    }
    let final_norm = norm_of("output_norm.weight", hidden)?;
    let lm_head = if config.tied_embeddings {
        None
    } else {
        Some(Linear::new(matrix("output.weight", vocab_size, hidden)?, None))
    };

    // special tokens
    let token_id = |key: &str| -> Result<Option<u32>> {
        match md.usize(key)? {
            None => Ok(None),
            Some(id) if id < vocab_size => Ok(Some(id as u32)),
            Some(id) => {
                Err(Error::format(path, format!("`{key}` = {id} is outside the vocabulary of {vocab_size} tokens")))
            }
        }
    };
    config.bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(key)? {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
    }

    Ok((config, Weights { token_embedding, position_embedding: None, layers, final_norm, lm_head }))
}
