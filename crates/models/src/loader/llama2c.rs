//! llama2.c checkpoints (legacy v0 format): a header of seven i32
//! (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
//! a negative vocab_size means an unshared classifier follows), then f32
//! tensors in a fixed order. The tokenizer is a separate `tokenizer.bin`,
//! looked for beside the checkpoint.

use super::LoadedModel;
use crate::config::{Architecture, ModelConfig, NormKind, RopeConfig, SourceFormat};
use crate::transformer::Model;
use crate::weights::{LayerWeights, Linear, NormWeights, Weights};
use crate::{Error, Result};
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::Matrix;
use std::path::{Path, PathBuf};

/// Loads a llama2.c `.bin` and, when found beside it, its tokenizer
/// (`tokenizer.bin`, or the single `tok*.bin` in the same directory).
pub fn load(path: &Path) -> Result<LoadedModel> {
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let (config, weights) = parse(path, &data)?;
    let tokenizer = match find_tokenizer(path) {
        Some(p) => {
            let t = crate::tokenizer::scored::load_llama2c(&p)?;
            if t.vocab_size() != config.vocab_size {
                return Err(Error::format(
                    &p,
                    format!(
                        "llama2.c tokenizer has {} tokens but the vocabulary of {} has {} (truncated file, or the wrong tokenizer)",
                        t.vocab_size(),
                        path.display(),
                        config.vocab_size
                    ),
                ));
            }
            Some(t)
        }
        None => None,
    };
    Ok(LoadedModel { model: Model::new(config, weights)?, tokenizer })
}

fn find_tokenizer(model: &Path) -> Option<PathBuf> {
    let dir = model.parent()?;
    let named = dir.join("tokenizer.bin");
    if named.exists() {
        return Some(named);
    }
    let mut cands: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "bin")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tok"))
        })
        .collect();
    cands.sort();
    (cands.len() == 1).then(|| cands.remove(0))
}

/// Parses the checkpoint bytes.
pub fn parse(path: &Path, data: &[u8]) -> Result<(ModelConfig, Weights)> {
    let bad = |why: String| Error::format(path, format!("not a llama2.c checkpoint: {why}"));
    if data.len() < 28 {
        return Err(bad(format!("{} bytes is shorter than the 28-byte header", data.len())));
    }
    let h: Vec<i32> = data[..28].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let (dim, hidden, n_layers, n_heads, n_kv_heads, vocab_raw, seq_len) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    if [dim, hidden, n_layers, n_heads, n_kv_heads, seq_len].iter().any(|v| *v <= 0) || vocab_raw == 0 {
        return Err(bad(format!("header has non-positive sizes {h:?}")));
    }
    let shared = vocab_raw > 0;
    let [dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len] =
        [dim, hidden, n_layers, n_heads, n_kv_heads, vocab_raw, seq_len].map(|v| v.unsigned_abs() as usize);
    if dim % n_heads != 0 {
        return Err(bad(format!("dim {dim} is not divisible by n_heads {n_heads}")));
    }
    let head_dim = dim / n_heads;
    let config = ModelConfig {
        architecture: Architecture::Llama,
        format: SourceFormat::Llama2c,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        hidden_size: dim,
        ffn_size: hidden,
        vocab_size: vocab,
        context_len: seq_len,
        norm: NormKind::Rms,
        norm_eps: 1e-5,
        activation: Activation::Silu,
        gated_mlp: true,
        rope: Some(RopeConfig { theta: 10000.0, rotary_dim: head_dim, layout: RopeLayout::AdjacentPairs }),
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: shared,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        features: Default::default(),
    };
    config.validate().map_err(bad)?;
    let kv_dim = config.kv_dim();
    // total floats, checked before reading anything
    // (checked: a lying header must not overflow into a small count)
    let need = (|| {
        let mul = |a: usize, b: usize| a.checked_mul(b);
        let per_layer = [dim, mul(dim, dim)?, mul(2 * kv_dim, dim)?, mul(dim, dim)?, dim, mul(3, mul(hidden, dim)?)?]
            .into_iter()
            .try_fold(0usize, usize::checked_add)?;
        let embed = mul(vocab, dim)?;
        [embed, mul(n_layers, per_layer)?, dim, mul(seq_len, head_dim)?, if shared { 0 } else { embed }]
            .into_iter()
            .try_fold(0usize, usize::checked_add)
    })();
    let have = (data.len() - 28) / 4;
    if need.is_none_or(|need| have < need) {
        let need = need.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
        return Err(bad(format!(
            "header describes {need} floats of weights but the file holds {have} (truncated, or the header lies)"
        )));
    }
    let floats = |at: usize, n: usize| -> Vec<f32> {
        data[28 + at * 4..28 + (at + n) * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    };
    let mut at = 0usize;
    let mut take = |n: usize| {
        let v = floats(at, n);
        at += n;
        v
    };
    let embed = take(vocab * dim);
    let rms_att = take(n_layers * dim);
    let wq = take(n_layers * dim * dim);
    let wk = take(n_layers * kv_dim * dim);
    let wv = take(n_layers * kv_dim * dim);
    let wo = take(n_layers * dim * dim);
    let rms_ffn = take(n_layers * dim);
    let w1 = take(n_layers * hidden * dim);
    let w2 = take(n_layers * dim * hidden);
    let w3 = take(n_layers * hidden * dim);
    let rms_final = take(dim);
    let _freq_cis = take(seq_len * head_dim); // real and imaginary halves, unused
    let wcls = if shared { None } else { Some(take(vocab * dim)) };
    let mat = |src: &[f32], l: usize, rows: usize, cols: usize| -> Result<Matrix> {
        Ok(Matrix::from_f32(rows, cols, &src[l * rows * cols..(l + 1) * rows * cols])?)
    };
    let norm = |src: &[f32], l: usize| NormWeights { weight: src[l * dim..(l + 1) * dim].to_vec(), bias: None };
    let mut layers = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        layers.push(LayerWeights::pre_norm(
            norm(&rms_att, l),
            [
                Linear::new(mat(&wq, l, dim, dim)?, None),
                Linear::new(mat(&wk, l, kv_dim, dim)?, None),
                Linear::new(mat(&wv, l, kv_dim, dim)?, None),
            ],
            Linear::new(mat(&wo, l, dim, dim)?, None),
            norm(&rms_ffn, l),
            Some(Linear::new(mat(&w1, l, hidden, dim)?, None)),
            [Linear::new(mat(&w3, l, hidden, dim)?, None), Linear::new(mat(&w2, l, dim, hidden)?, None)],
        ));
    }
    let weights = Weights {
        token_embedding: Matrix::from_f32(vocab, dim, &embed)?,
        position_embedding: None,
        layers,
        final_norm: NormWeights { weight: rms_final, bias: None },
        lm_head: wcls.map(|w| Matrix::from_f32(vocab, dim, &w).map(|m| Linear::new(m, None))).transpose()?,
    };
    Ok((config, weights))
}
