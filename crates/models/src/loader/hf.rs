//! Hugging Face model directories: `config.json` (transformers-4 style with
//! top-level `rope_theta`, or transformers-5 style with `rope_parameters`),
//! safetensors weights (single or sharded) and `tokenizer.json`.
//!
//! Each architecture is a tensor-name mapping onto [`Weights`]; the forward
//! pass is shared.

use super::safetensors::{RawTensor, SafetensorsFiles};
use super::LoadedModel;
use crate::config::{Architecture, BlockFeatures, ModelConfig, NormKind, RopeConfig, SlidingWindow, SourceFormat};
use crate::transformer::Model;
use crate::weights::{LayerWeights, Linear, NormWeights, Weights};
use crate::{Error, Result};
use kvslim_kernels::ops::Activation;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::Matrix;
use serde_json::Value;
use std::path::Path;

/// Loads a Hugging Face directory.
pub fn load(dir: &Path) -> Result<LoadedModel> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let json: Value =
        serde_json::from_slice(&text).map_err(|e| Error::format(&cfg_path, format!("invalid JSON: {e}")))?;
    let config = parse_config(&json).map_err(|reason| match reason {
        ConfigError::Unknown(a) => Error::UnknownArchitecture(a),
        ConfigError::Invalid(r) => Error::format(&cfg_path, r),
    })?;
    let files = SafetensorsFiles::open_dir(dir)?;
    let weights = map_weights(&config, &files)?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        Some(crate::tokenizer::hf::load(&tok_path, config.bos_token_id, config.eos_token_ids.clone())?)
    } else {
        None
    };
    Ok(LoadedModel { model: Model::new(config, weights)?, tokenizer })
}

enum ConfigError {
    Unknown(String),
    Invalid(String),
}

fn get_usize(j: &Value, keys: &[&str]) -> Option<usize> {
    keys.iter().find_map(|k| j.get(*k).and_then(Value::as_u64)).map(|v| v as usize)
}
fn get_f32(j: &Value, keys: &[&str]) -> Option<f32> {
    keys.iter().find_map(|k| j.get(*k).and_then(Value::as_f64)).map(|v| v as f32)
}
fn get_bool(j: &Value, key: &str) -> Option<bool> {
    j.get(key).and_then(Value::as_bool)
}
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => Vec::new(),
    }
}

/// Translates `config.json` into a [`ModelConfig`].
fn parse_config(j: &Value) -> Result<ModelConfig, ConfigError> {
    let arch_name = j
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| j.get("model_type").and_then(Value::as_str))
        .ok_or_else(|| ConfigError::Invalid("config.json has neither `architectures` nor `model_type`".into()))?;
    let architecture = match arch_name {
        "LlamaForCausalLM" | "llama" => Architecture::Llama,
        "MistralForCausalLM" | "mistral" => Architecture::Mistral,
        "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
        "Qwen3ForCausalLM" | "qwen3" => Architecture::Qwen3,
        "Gemma3ForCausalLM" | "gemma3_text" => Architecture::Gemma3,
        "Phi3ForCausalLM" | "phi3" => Architecture::Phi3,
        "GPT2LMHeadModel" | "gpt2" => Architecture::Gpt2,
        "OPTForCausalLM" | "opt" => Architecture::Opt,
        "GPTNeoXForCausalLM" | "gpt_neox" => Architecture::GptNeoX,
        other => return Err(ConfigError::Unknown(other.to_string())),
    };
    let need = |keys: &[&str]| {
        get_usize(j, keys).ok_or_else(|| ConfigError::Invalid(format!("config.json lacks `{}`", keys[0])))
    };
    let rope_params = j.get("rope_parameters");
    // transformers 5 nests Gemma 3's per layer type: {"full_attention": {…}, "sliding_attention": {…}}
    let global_rope = rope_params.and_then(|r| r.get("full_attention")).or(rope_params);
    let rope_field = |keys: &[&str]| global_rope.and_then(|r| get_f32(r, keys)).or_else(|| get_f32(j, keys));
    if let Some(scaling) = j.get("rope_scaling").filter(|v| !v.is_null()) {
        let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(Value::as_str);
        if kind != Some("default") {
            return Err(ConfigError::Invalid(format!("rope_scaling {scaling} is not supported")));
        }
    }
    let nested = [global_rope, rope_params.and_then(|r| r.get("sliding_attention"))];
    for kind in nested.into_iter().flatten().filter_map(|r| r.get("rope_type")).filter_map(Value::as_str) {
        if kind != "default" {
            return Err(ConfigError::Invalid(format!("rope_type `{kind}` is not supported")));
        }
    }
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if j.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ConfigError::Invalid(format!("`{key}` (Gemma 2 style logit soft-capping) is not supported")));
        }
    }
    let act = |key: &str, default: &str| {
        let name = j.get(key).and_then(Value::as_str).unwrap_or(default);
        Activation::from_hf(name).ok_or_else(|| ConfigError::Invalid(format!("activation `{name}` is not supported")))
    };
    let bos = j.get("bos_token_id").and_then(Value::as_u64).map(|v| v as u32);
    let eos = token_ids(j.get("eos_token_id"));
    let cfg = match architecture {
        Architecture::Llama
        | Architecture::Mistral
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Gemma3
        | Architecture::Phi3 => {
            let hidden = need(&["hidden_size"])?;
            let heads = need(&["num_attention_heads"])?;
            let head_dim = get_usize(j, &["head_dim"]).unwrap_or(hidden / heads.max(1));
            let context = need(&["max_position_embeddings"])?;
            let n_layers = need(&["num_hidden_layers"])?;
            let gemma = architecture == Architecture::Gemma3;
            let window = get_usize(j, &["sliding_window"]).filter(|&w| w > 0 && w < context);
            // Mistral and Phi-3: every layer sees only the last
            // `sliding_window` keys (Qwen2/3 carry the key too, but use it
            // only with use_sliding_window); Gemma 3 interleaves
            let local_layers = match architecture {
                Architecture::Mistral | Architecture::Phi3 => Some(vec![true; n_layers]),
                Architecture::Qwen2 | Architecture::Qwen3 if get_bool(j, "use_sliding_window") == Some(true) => {
                    Some(vec![true; n_layers])
                }
                Architecture::Gemma3 => Some(gemma3_layer_types(j, n_layers)?),
                _ => None,
            };
            let local_rope_theta = gemma.then(|| {
                rope_params
                    .and_then(|r| r.get("sliding_attention"))
                    .and_then(|r| get_f32(r, &["rope_theta"]))
                    .or_else(|| get_f32(j, &["rope_local_base_freq"]))
                    .unwrap_or(10_000.0)
            });
            let sliding_window = window.zip(local_layers).map(|(window, local_layers)| SlidingWindow {
                window,
                local_layers,
                local_rope_theta,
            });
            let rotary_fraction = get_f32(j, &["partial_rotary_factor"]).unwrap_or(1.0);
            let rotary_dim = ((head_dim as f32 * rotary_fraction) as usize) & !1;
            let features = BlockFeatures {
                qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
                post_norms: gemma,
                embedding_scale: gemma.then(|| (hidden as f32).sqrt()),
                attention_scale: if gemma {
                    Some(1.0 / get_f32(j, &["query_pre_attn_scalar"]).unwrap_or(head_dim as f32).sqrt())
                } else {
                    None
                },
                sliding_window,
            };
            ModelConfig {
                architecture,
                format: SourceFormat::HfSafetensors,
                n_layers,
                n_heads: heads,
                n_kv_heads: get_usize(j, &["num_key_value_heads"]).unwrap_or(heads),
                head_dim,
                hidden_size: hidden,
                ffn_size: need(&["intermediate_size"])?,
                vocab_size: need(&["vocab_size"])?,
                context_len: context,
                norm: NormKind::Rms,
                norm_eps: get_f32(j, &["rms_norm_eps"]).unwrap_or(1e-6),
                activation: if gemma {
                    act("hidden_activation", "gelu_pytorch_tanh")?
                } else {
                    act("hidden_act", "silu")?
                },
                gated_mlp: true,
                rope: Some(RopeConfig {
                    theta: rope_field(&["rope_theta"]).unwrap_or(if gemma { 1e6 } else { 10000.0 }),
                    rotary_dim,
                    layout: RopeLayout::HalfSplit,
                }),
                learned_positions: None,
                parallel_residual: false,
                tied_embeddings: get_bool(j, "tie_word_embeddings").unwrap_or(gemma),
                bos_token_id: bos,
                eos_token_ids: eos,
                features,
            }
        }
        Architecture::Gpt2 => {
            let hidden = need(&["n_embd", "hidden_size"])?;
            let heads = need(&["n_head", "num_attention_heads"])?;
            ModelConfig {
                architecture,
                format: SourceFormat::HfSafetensors,
                n_layers: need(&["n_layer", "num_hidden_layers"])?,
                n_heads: heads,
                n_kv_heads: heads,
                head_dim: hidden / heads.max(1),
                hidden_size: hidden,
                ffn_size: get_usize(j, &["n_inner"]).unwrap_or(hidden.saturating_mul(4)),
                vocab_size: need(&["vocab_size"])?,
                context_len: need(&["n_positions", "max_position_embeddings"])?,
                norm: NormKind::Layer,
                norm_eps: get_f32(j, &["layer_norm_epsilon"]).unwrap_or(1e-5),
                activation: act("activation_function", "gelu_new")?,
                gated_mlp: false,
                rope: None,
                learned_positions: Some(0),
                parallel_residual: false,
                tied_embeddings: true,
                bos_token_id: bos,
                eos_token_ids: eos,
                features: Default::default(),
            }
        }
        Architecture::Opt => {
            let hidden = need(&["hidden_size"])?;
            let heads = need(&["num_attention_heads"])?;
            if get_bool(j, "do_layer_norm_before") == Some(false) {
                return Err(ConfigError::Invalid(
                    "OPT with do_layer_norm_before=false (post-LN, OPT-350m) is not supported".into(),
                ));
            }
            if get_usize(j, &["word_embed_proj_dim"]).is_some_and(|p| p != hidden) {
                return Err(ConfigError::Invalid(
                    "OPT with word_embed_proj_dim != hidden_size is not supported".into(),
                ));
            }
            ModelConfig {
                architecture,
                format: SourceFormat::HfSafetensors,
                n_layers: need(&["num_hidden_layers"])?,
                n_heads: heads,
                n_kv_heads: heads,
                head_dim: hidden / heads.max(1),
                hidden_size: hidden,
                ffn_size: need(&["ffn_dim"])?,
                vocab_size: need(&["vocab_size"])?,
                context_len: need(&["max_position_embeddings"])?,
                norm: NormKind::Layer,
                norm_eps: 1e-5,
                activation: act("activation_function", "relu")?,
                gated_mlp: false,
                rope: None,
                learned_positions: Some(2),
                parallel_residual: false,
                tied_embeddings: get_bool(j, "tie_word_embeddings").unwrap_or(true),
                bos_token_id: bos,
                eos_token_ids: eos,
                features: Default::default(),
            }
        }
        Architecture::GptNeoX => {
            let hidden = need(&["hidden_size"])?;
            let heads = need(&["num_attention_heads"])?;
            let head_dim = hidden / heads.max(1);
            let pct = rope_field(&["partial_rotary_factor", "rotary_pct"]).unwrap_or(1.0);
            let rotary_dim = ((head_dim as f32 * pct) as usize) & !1;
            ModelConfig {
                architecture,
                format: SourceFormat::HfSafetensors,
                n_layers: need(&["num_hidden_layers"])?,
                n_heads: heads,
                n_kv_heads: heads,
                head_dim,
                hidden_size: hidden,
                ffn_size: need(&["intermediate_size"])?,
                vocab_size: need(&["vocab_size"])?,
                context_len: need(&["max_position_embeddings"])?,
                norm: NormKind::Layer,
                norm_eps: get_f32(j, &["layer_norm_eps"]).unwrap_or(1e-5),
                activation: act("hidden_act", "gelu")?,
                gated_mlp: false,
                rope: Some(RopeConfig {
                    theta: rope_field(&["rope_theta", "rotary_emb_base"]).unwrap_or(10000.0),
                    rotary_dim,
                    layout: RopeLayout::HalfSplit,
                }),
                learned_positions: None,
                parallel_residual: get_bool(j, "use_parallel_residual").unwrap_or(true),
                tied_embeddings: get_bool(j, "tie_word_embeddings").unwrap_or(false),
                bos_token_id: bos,
                eos_token_ids: eos,
                features: Default::default(),
            }
        }
    };
    cfg.validate().map_err(ConfigError::Invalid)?;
    // bounds that keep the loader's size arithmetic (q_dim, 3·q_dim, context + 2) far from overflow
    let caps = [
        ("head_dim", cfg.head_dim, 1 << 20),
        ("n_heads", cfg.n_heads, 1 << 20),
        ("ffn_size", cfg.ffn_size, 1 << 32),
        ("context_len", cfg.context_len, 1 << 40),
    ];
    if let Some((name, v, _)) = caps.iter().find(|(_, v, cap)| v > cap) {
        return Err(ConfigError::Invalid(format!("implausible {name} {v}")));
    }
    Ok(cfg)
}

/// Gemma 3's local/global layer pattern: `layer_types` when given, else
/// `sliding_window_pattern` (every N-th layer global; 6 by default).
fn gemma3_layer_types(j: &Value, n_layers: usize) -> Result<Vec<bool>, ConfigError> {
    if let Some(types) = j.get("layer_types").and_then(Value::as_array) {
        let local: Option<Vec<bool>> = types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Some(true),
                Some("full_attention") => Some(false),
                _ => None,
            })
            .collect();
        return match local {
            Some(l) if l.len() == n_layers => Ok(l),
            _ => Err(ConfigError::Invalid(format!(
                "`layer_types` must list {n_layers} of \"sliding_attention\" / \"full_attention\""
            ))),
        };
    }
    let every = get_usize(j, &["sliding_window_pattern"]).unwrap_or(6).max(1);
    Ok((0..n_layers).map(|l| (l + 1) % every != 0).collect())
}

/// Reads tensors by name, checking shapes.
struct Reader<'a> {
    files: &'a SafetensorsFiles,
}

impl Reader<'_> {
    fn raw(&self, name: &str, shape: &[usize]) -> Result<RawTensor<'_>> {
        let t = self.files.get(name)?;
        if t.shape != shape {
            return Err(Error::ShapeMismatch { name: name.into(), expected: shape.to_vec(), got: t.shape.to_vec() });
        }
        if t.dtype.weight_dtype().is_none() {
            return Err(Error::UnsupportedTensorType {
                path: self.files.path_of(name).unwrap_or(self.files.path()).into(),
                name: name.into(),
                dtype: format!("{:?}", t.dtype),
            });
        }
        Ok(t)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.raw(name, &[len])?.to_f32()
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.files.contains(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.raw(name, &[rows, cols])?;
        let dt = t.dtype.weight_dtype().expect("checked in raw");
        Ok(Matrix::from_bytes(dt, rows, cols, t.bytes)?)
    }

    /// `prefix.weight` [out, in] and optional `prefix.bias`.
    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear::new(
            self.matrix(&format!("{prefix}.weight"), out, inp)?,
            self.opt_vector(&format!("{prefix}.bias"), out)?,
        ))
    }

    /// A norm; Gemma stores RMS weights as `w` and applies `1 + w`.
    fn gemma_aware_norm(&self, c: &ModelConfig, prefix: &str, dim: usize) -> Result<NormWeights> {
        let mut n = self.norm(prefix, dim)?;
        if c.architecture == Architecture::Gemma3 {
            n.weight.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(n)
    }

    /// A fused projection `prefix.weight` of `Σ parts` rows split into one
    /// [`Linear`] per part (Phi-3's `qkv_proj` and `gate_up_proj`).
    fn split_rows<const N: usize>(&self, prefix: &str, parts: &[usize; N], inp: usize) -> Result<[Linear; N]> {
        let total: usize = parts.iter().sum();
        let t = self.raw(&format!("{prefix}.weight"), &[total, inp])?;
        let dt = t.dtype.weight_dtype().expect("checked in raw");
        let bias = self.opt_vector(&format!("{prefix}.bias"), total)?;
        let row_bytes = dt.bytes_for(inp);
        let mut first = 0;
        let mut out = Vec::with_capacity(N);
        for &rows in parts {
            let bytes = &t.bytes[first * row_bytes..(first + rows) * row_bytes];
            let b = bias.as_ref().map(|b| b[first..first + rows].to_vec());
            out.push(Linear::new(Matrix::from_bytes(dt, rows, inp, bytes)?, b));
            first += rows;
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one Linear per part")))
    }

    fn norm(&self, prefix: &str, dim: usize) -> Result<NormWeights> {
        Ok(NormWeights {
            weight: self.vector(&format!("{prefix}.weight"), dim)?,
            bias: self.opt_vector(&format!("{prefix}.bias"), dim)?,
        })
    }

    /// GPT-2 `Conv1D` weight stored [in, out]: transposed to [out, in] and
    /// split into row groups (fused QKV).
    fn conv1d(&self, prefix: &str, inp: usize, out: usize, parts: usize) -> Result<Vec<Linear>> {
        let t = self.raw(&format!("{prefix}.weight"), &[inp, out])?;
        let dt = t.dtype.weight_dtype().expect("checked in raw");
        let es = dt.block_bytes();
        let mut tr = vec![0u8; t.bytes.len()];
        for i in 0..inp {
            for o in 0..out {
                let src = (i * out + o) * es;
                let dst = (o * inp + i) * es;
                tr[dst..dst + es].copy_from_slice(&t.bytes[src..src + es]);
            }
        }
        let bias = self.opt_vector(&format!("{prefix}.bias"), out)?;
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

    /// GPT-NeoX fused `query_key_value` [H·3·Dh, D], rows grouped per head
    /// as (q, k, v): regrouped into three [H·Dh, D] projections.
    fn neox_qkv(&self, prefix: &str, heads: usize, head_dim: usize, hidden: usize) -> Result<[Linear; 3]> {
        let t = self.raw(&format!("{prefix}.weight"), &[3 * heads * head_dim, hidden])?;
        let dt = t.dtype.weight_dtype().expect("checked in raw");
        let row_bytes = dt.bytes_for(hidden);
        let bias = self.opt_vector(&format!("{prefix}.bias"), 3 * heads * head_dim)?;
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
}

/// One block of Qwen3, Gemma 3 or Phi-3: the Llama layout plus QK norms
/// (Qwen3, Gemma 3), sandwich norms (Gemma 3: `post_attention_layernorm`
/// is the norm *after* attention there, `pre_feedforward_layernorm` the
/// MLP's input norm), fused `qkv_proj`/`gate_up_proj` (Phi-3).
fn modern_layer(r: &Reader, c: &ModelConfig, p: &str) -> Result<LayerWeights> {
    let (d, f, hd) = (c.hidden_size, c.ffn_size, c.head_dim);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let att = |s: &str| format!("{p}.self_attn.{s}");
    let mlp = |s: &str| format!("{p}.mlp.{s}");
    let (q, k, v) = if c.architecture == Architecture::Phi3 {
        let [q, k, v] = r.split_rows(&att("qkv_proj"), &[qd, kvd, kvd], d)?;
        (q, k, v)
    } else {
        (r.linear(&att("q_proj"), qd, d)?, r.linear(&att("k_proj"), kvd, d)?, r.linear(&att("v_proj"), kvd, d)?)
    };
    let (gate, up) = if c.architecture == Architecture::Phi3 {
        let [g, u] = r.split_rows(&mlp("gate_up_proj"), &[f, f], d)?;
        (g, u)
    } else {
        (r.linear(&mlp("gate_proj"), f, d)?, r.linear(&mlp("up_proj"), f, d)?)
    };
    let qk = |s: &str| -> Result<Option<NormWeights>> {
        if c.features.qk_norm {
            r.gemma_aware_norm(c, &att(s), hd).map(Some)
        } else {
            Ok(None)
        }
    };
    let norm = |s: &str| r.gemma_aware_norm(c, &format!("{p}.{s}"), d);
    let post = c.features.post_norms;
    Ok(LayerWeights {
        attn_norm: norm("input_layernorm")?,
        q,
        k,
        v,
        o: r.linear(&att("o_proj"), d, qd)?,
        mlp_norm: norm(if post { "pre_feedforward_layernorm" } else { "post_attention_layernorm" })?,
        gate: Some(gate),
        up,
        down: r.linear(&mlp("down_proj"), d, f)?,
        q_norm: qk("q_norm")?,
        k_norm: qk("k_norm")?,
        post_attn_norm: if post { Some(norm("post_attention_layernorm")?) } else { None },
        post_mlp_norm: if post { Some(norm("post_feedforward_layernorm")?) } else { None },
    })
}

fn map_weights(c: &ModelConfig, files: &SafetensorsFiles) -> Result<Weights> {
    let r = Reader { files };
    let (d, f, v) = (c.hidden_size, c.ffn_size, c.vocab_size);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let mut layers = Vec::with_capacity(c.n_layers);
    // tied checkpoints may still carry a copy of the head; it is ignored
    let untied_head = |name: &str| -> Result<Option<Linear>> {
        if c.tied_embeddings {
            Ok(None)
        } else {
            Ok(Some(Linear::new(r.matrix(name, v, d)?, None)))
        }
    };
    let weights = match c.architecture {
        Architecture::Qwen3 | Architecture::Gemma3 | Architecture::Phi3 => {
            for l in 0..c.n_layers {
                layers.push(modern_layer(&r, c, &format!("model.layers.{l}"))?);
            }
            Weights {
                token_embedding: r.matrix("model.embed_tokens.weight", v, d)?,
                position_embedding: None,
                layers,
                final_norm: r.gemma_aware_norm(c, "model.norm", d)?,
                lm_head: untied_head("lm_head.weight")?,
            }
        }
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 => {
            for l in 0..c.n_layers {
                let p = format!("model.layers.{l}");
                layers.push(LayerWeights {
                    attn_norm: r.norm(&format!("{p}.input_layernorm"), d)?,
                    q: r.linear(&format!("{p}.self_attn.q_proj"), qd, d)?,
                    k: r.linear(&format!("{p}.self_attn.k_proj"), kvd, d)?,
                    v: r.linear(&format!("{p}.self_attn.v_proj"), kvd, d)?,
                    o: r.linear(&format!("{p}.self_attn.o_proj"), d, qd)?,
                    mlp_norm: r.norm(&format!("{p}.post_attention_layernorm"), d)?,
                    gate: Some(r.linear(&format!("{p}.mlp.gate_proj"), f, d)?),
                    up: r.linear(&format!("{p}.mlp.up_proj"), f, d)?,
                    down: r.linear(&format!("{p}.mlp.down_proj"), d, f)?,
                    q_norm: None,
                    k_norm: None,
                    post_attn_norm: None,
                    post_mlp_norm: None,
                });
            }
            Weights {
                token_embedding: r.matrix("model.embed_tokens.weight", v, d)?,
                position_embedding: None,
                layers,
                final_norm: r.norm("model.norm", d)?,
                lm_head: untied_head("lm_head.weight")?,
            }
        }
        Architecture::Gpt2 => {
            let pre = if files.contains("transformer.wte.weight") { "transformer." } else { "" };
            for l in 0..c.n_layers {
                let p = format!("{pre}h.{l}");
                let mut qkv = r.conv1d(&format!("{p}.attn.c_attn"), d, 3 * d, 3)?.into_iter();
                let (q, k, vv) = (qkv.next(), qkv.next(), qkv.next());
                let (Some(q), Some(k), Some(vv)) = (q, k, vv) else { unreachable!("three parts requested") };
                let take1 = |name: &str, i: usize, o: usize| -> Result<Linear> {
                    r.conv1d(name, i, o, 1)?.pop().ok_or_else(|| Error::MissingTensor(name.into()))
                };
                layers.push(LayerWeights {
                    attn_norm: r.norm(&format!("{p}.ln_1"), d)?,
                    q,
                    k,
                    v: vv,
                    o: take1(&format!("{p}.attn.c_proj"), d, d)?,
                    mlp_norm: r.norm(&format!("{p}.ln_2"), d)?,
                    gate: None,
                    up: take1(&format!("{p}.mlp.c_fc"), d, f)?,
                    down: take1(&format!("{p}.mlp.c_proj"), f, d)?,
                    q_norm: None,
                    k_norm: None,
                    post_attn_norm: None,
                    post_mlp_norm: None,
                });
            }
            Weights {
                token_embedding: r.matrix(&format!("{pre}wte.weight"), v, d)?,
                position_embedding: Some(r.matrix(&format!("{pre}wpe.weight"), c.context_len, d)?),
                layers,
                final_norm: r.norm(&format!("{pre}ln_f"), d)?,
                lm_head: None,
            }
        }
        Architecture::Opt => {
            let pre = if files.contains("model.decoder.embed_tokens.weight") { "model.decoder." } else { "decoder." };
            for l in 0..c.n_layers {
                let p = format!("{pre}layers.{l}");
                layers.push(LayerWeights {
                    attn_norm: r.norm(&format!("{p}.self_attn_layer_norm"), d)?,
                    q: r.linear(&format!("{p}.self_attn.q_proj"), d, d)?,
                    k: r.linear(&format!("{p}.self_attn.k_proj"), d, d)?,
                    v: r.linear(&format!("{p}.self_attn.v_proj"), d, d)?,
                    o: r.linear(&format!("{p}.self_attn.out_proj"), d, d)?,
                    mlp_norm: r.norm(&format!("{p}.final_layer_norm"), d)?,
                    gate: None,
                    up: r.linear(&format!("{p}.fc1"), f, d)?,
                    down: r.linear(&format!("{p}.fc2"), d, f)?,
                    q_norm: None,
                    k_norm: None,
                    post_attn_norm: None,
                    post_mlp_norm: None,
                });
            }
            Weights {
                token_embedding: r.matrix(&format!("{pre}embed_tokens.weight"), v, d)?,
                position_embedding: Some(r.matrix(&format!("{pre}embed_positions.weight"), c.context_len + 2, d)?),
                layers,
                final_norm: r.norm(&format!("{pre}final_layer_norm"), d)?,
                lm_head: untied_head("lm_head.weight")?,
            }
        }
        Architecture::GptNeoX => {
            for l in 0..c.n_layers {
                let p = format!("gpt_neox.layers.{l}");
                let [q, k, vv] = r.neox_qkv(&format!("{p}.attention.query_key_value"), c.n_heads, c.head_dim, d)?;
                layers.push(LayerWeights {
                    attn_norm: r.norm(&format!("{p}.input_layernorm"), d)?,
                    q,
                    k,
                    v: vv,
                    o: r.linear(&format!("{p}.attention.dense"), d, d)?,
                    mlp_norm: r.norm(&format!("{p}.post_attention_layernorm"), d)?,
                    gate: None,
                    up: r.linear(&format!("{p}.mlp.dense_h_to_4h"), f, d)?,
                    down: r.linear(&format!("{p}.mlp.dense_4h_to_h"), d, f)?,
                    q_norm: None,
                    k_norm: None,
                    post_attn_norm: None,
                    post_mlp_norm: None,
                });
            }
            Weights {
                token_embedding: r.matrix("gpt_neox.embed_in.weight", v, d)?,
                position_embedding: None,
                layers,
                final_norm: r.norm("gpt_neox.final_layer_norm", d)?,
                lm_head: untied_head("embed_out.weight")?,
            }
        }
    };
    Ok(weights)
}
