//! Hugging Face model directories: `config.json` (transformers-4 style with
//! top-level `rope_theta`, or transformers-5 style with `rope_parameters`),
//! safetensors weights (single or sharded) and `tokenizer.json`.
//!
//! Each architecture family has its own file: how it reads `config.json`
//! into a [`ModelConfig`] and how its tensor names map onto [`Weights`]; the
//! forward pass is shared. [`REGISTRY`] ties the names `config.json` uses to
//! those two functions, so adding an architecture is one file and one line.

mod gemma3;
mod gpt2;
mod llama;
mod neox;
mod opt;
mod phi3;
mod reader;

use super::safetensors::SafetensorsFiles;
use super::LoadedModel;
use crate::config::{Architecture, ModelConfig, NormKind, SourceFormat};
use crate::transformer::Model;
use crate::weights::{LayerWeights, Linear, Weights};
use crate::{Error, Result};
use kvslim_kernels::ops::Activation;
use reader::Reader;
use serde_json::Value;
use std::path::Path;

/// One Hugging Face architecture: the names `config.json` gives it and the
/// functions that read its config and weights.
struct Entry {
    /// The transformers class in `architectures[0]`.
    class: &'static str,
    /// `model_type`, used when `architectures` is absent.
    model_type: &'static str,
    config: fn(&Cfg) -> Result<ModelConfig, ConfigError>,
    weights: fn(&Reader, &ModelConfig) -> Result<Weights>,
}

/// Every architecture the HF loader reads, in the order error messages list them.
const REGISTRY: &[Entry] = &[
    Entry { class: "LlamaForCausalLM", model_type: "llama", config: llama::llama, weights: llama::weights },
    Entry { class: "MistralForCausalLM", model_type: "mistral", config: llama::mistral, weights: llama::weights },
    Entry { class: "Qwen2ForCausalLM", model_type: "qwen2", config: llama::qwen2, weights: llama::weights },
    Entry { class: "Qwen3ForCausalLM", model_type: "qwen3", config: llama::qwen3, weights: llama::weights },
    Entry { class: "Gemma3ForCausalLM", model_type: "gemma3_text", config: gemma3::config, weights: gemma3::weights },
    Entry { class: "Phi3ForCausalLM", model_type: "phi3", config: phi3::config, weights: phi3::weights },
    Entry { class: "GPT2LMHeadModel", model_type: "gpt2", config: gpt2::config, weights: gpt2::weights },
    Entry { class: "OPTForCausalLM", model_type: "opt", config: opt::config, weights: opt::weights },
    Entry { class: "GPTNeoXForCausalLM", model_type: "gpt_neox", config: neox::config, weights: neox::weights },
];

/// The transformers classes this loader reads (for error messages).
pub fn supported_classes() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|e| e.class)
}

/// Loads a Hugging Face directory.
pub fn load(dir: &Path) -> Result<LoadedModel> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let json: Value =
        serde_json::from_slice(&text).map_err(|e| Error::format(&cfg_path, format!("invalid JSON: {e}")))?;
    let (entry, config) = parse_config(&json).map_err(|reason| match reason {
        ConfigError::Unknown(a) => Error::UnknownArchitecture(a),
        ConfigError::Invalid(r) => Error::format(&cfg_path, r),
    })?;
    let files = SafetensorsFiles::open_dir(dir)?;
    let weights = (entry.weights)(&Reader::new(&files), &config)?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        Some(crate::tokenizer::hf::load(&tok_path, config.bos_token_id, config.eos_token_ids.clone())?)
    } else {
        None
    };
    Ok(LoadedModel { model: Model::new(config, weights)?, tokenizer })
}

/// Why `config.json` cannot be used.
enum ConfigError {
    Unknown(String),
    Invalid(String),
}

/// `config.json` with the lookups every family needs: several spellings of
/// one key, and RoPE fields wherever transformers 4 or 5 put them.
struct Cfg<'a>(&'a Value);

impl Cfg<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }
    fn usize(&self, keys: &[&str]) -> Option<usize> {
        get_usize(self.0, keys)
    }
    fn f32(&self, keys: &[&str]) -> Option<f32> {
        get_f32(self.0, keys)
    }
    fn bool(&self, key: &str) -> Option<bool> {
        self.0.get(key).and_then(Value::as_bool)
    }
    /// A required size, under its first spelling in the error.
    fn need(&self, keys: &[&str]) -> Result<usize, ConfigError> {
        self.usize(keys).ok_or_else(|| ConfigError::Invalid(format!("config.json lacks `{}`", keys[0])))
    }
    /// The activation named by `key` (`default` when absent).
    fn activation(&self, key: &str, default: &str) -> Result<Activation, ConfigError> {
        let name = self.0.get(key).and_then(Value::as_str).unwrap_or(default);
        Activation::from_hf(name).ok_or_else(|| ConfigError::Invalid(format!("activation `{name}` is not supported")))
    }
    /// transformers 5's `rope_parameters`, when present.
    fn rope_parameters(&self) -> Option<&Value> {
        self.0.get("rope_parameters")
    }
    /// The RoPE parameters of global layers: transformers 5 nests Gemma 3's
    /// per layer type, `{"full_attention": {…}, "sliding_attention": {…}}`.
    fn global_rope(&self) -> Option<&Value> {
        let r = self.rope_parameters();
        r.and_then(|r| r.get("full_attention")).or(r)
    }
    /// A RoPE field from `rope_parameters`, else from the top level.
    fn rope_f32(&self, keys: &[&str]) -> Option<f32> {
        self.global_rope().and_then(|r| get_f32(r, keys)).or_else(|| self.f32(keys))
    }
    fn bos(&self) -> Option<u32> {
        self.0.get("bos_token_id").and_then(Value::as_u64).map(|v| v as u32)
    }
    fn eos(&self) -> Vec<u32> {
        match self.0.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
            _ => Vec::new(),
        }
    }
}

fn get_usize(j: &Value, keys: &[&str]) -> Option<usize> {
    keys.iter().find_map(|k| j.get(*k).and_then(Value::as_u64)).map(|v| v as usize)
}
fn get_f32(j: &Value, keys: &[&str]) -> Option<f32> {
    keys.iter().find_map(|k| j.get(*k).and_then(Value::as_f64)).map(|v| v as f32)
}

/// Finds the architecture's [`Entry`] and translates `config.json` into a
/// [`ModelConfig`], refusing what no family supports.
fn parse_config(j: &Value) -> Result<(&'static Entry, ModelConfig), ConfigError> {
    let arch_name = j
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| j.get("model_type").and_then(Value::as_str))
        .ok_or_else(|| ConfigError::Invalid("config.json has neither `architectures` nor `model_type`".into()))?;
    let entry = REGISTRY
        .iter()
        .find(|e| e.class == arch_name || e.model_type == arch_name)
        .ok_or_else(|| ConfigError::Unknown(arch_name.to_string()))?;
    let cfg = Cfg(j);
    refuse_unsupported(&cfg)?;
    let config = (entry.config)(&cfg)?;
    config.validate().map_err(ConfigError::Invalid)?;
    // bounds that keep the loader's size arithmetic (q_dim, 3·q_dim, context + 2) far from overflow
    let caps = [
        ("head_dim", config.head_dim, 1 << 20),
        ("n_heads", config.n_heads, 1 << 20),
        ("ffn_size", config.ffn_size, 1 << 32),
        ("context_len", config.context_len, 1 << 40),
    ];
    if let Some((name, v, _)) = caps.iter().find(|(_, v, cap)| v > cap) {
        return Err(ConfigError::Invalid(format!("implausible {name} {v}")));
    }
    Ok((entry, config))
}

/// Settings that change the arithmetic in ways no family implements (RoPE
/// scaling, logit soft-capping): refused rather than silently ignored.
fn refuse_unsupported(j: &Cfg) -> Result<(), ConfigError> {
    if let Some(scaling) = j.get("rope_scaling").filter(|v| !v.is_null()) {
        let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(Value::as_str);
        if kind != Some("default") {
            return Err(ConfigError::Invalid(format!("rope_scaling {scaling} is not supported")));
        }
    }
    let nested = [j.global_rope(), j.rope_parameters().and_then(|r| r.get("sliding_attention"))];
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
    Ok(())
}

/// Rotary dimensions for a fraction of `head_dim` (rounded down to even).
fn rotary_dim(head_dim: usize, fraction: f32) -> usize {
    ((head_dim as f32 * fraction) as usize) & !1
}

/// The output projection `name` [vocab, hidden], or `None` when the config
/// ties it to the token embedding (a tied checkpoint may still carry a
/// copy of the head; it is ignored).
fn head(r: &Reader, c: &ModelConfig, name: &str) -> Result<Option<Linear>> {
    if c.tied_embeddings {
        Ok(None)
    } else {
        Ok(Some(Linear::new(r.matrix(name, c.vocab_size, c.hidden_size)?, None)))
    }
}

/// The sizes of a model with as many KV heads as query heads.
struct Sizes {
    n_layers: usize,
    hidden: usize,
    heads: usize,
    ffn: usize,
    vocab: usize,
    context: usize,
}

impl Sizes {
    /// The sizes under the usual HF keys (`num_hidden_layers`,
    /// `vocab_size`, `max_position_embeddings`; the MLP's width under
    /// `ffn_key`), read in that order after `hidden` and `heads`.
    fn usual(j: &Cfg, hidden: usize, heads: usize, ffn_key: &str) -> Result<Sizes, ConfigError> {
        Ok(Sizes {
            n_layers: j.need(&["num_hidden_layers"])?,
            hidden,
            heads,
            ffn: j.need(&[ffn_key])?,
            vocab: j.need(&["vocab_size"])?,
            context: j.need(&["max_position_embeddings"])?,
        })
    }
}

/// A LayerNorm model with an ungated MLP, untied, without RoPE, learned
/// positions or parallel residuals (GPT-2, OPT and GPT-NeoX start here
/// and set what differs).
fn ungated_config(j: &Cfg, architecture: Architecture, s: Sizes, activation: Activation) -> ModelConfig {
    ModelConfig {
        architecture,
        format: SourceFormat::HfSafetensors,
        n_layers: s.n_layers,
        n_heads: s.heads,
        n_kv_heads: s.heads,
        head_dim: s.hidden / s.heads.max(1),
        hidden_size: s.hidden,
        ffn_size: s.ffn,
        vocab_size: s.vocab,
        context_len: s.context,
        norm: NormKind::Layer,
        norm_eps: 1e-5,
        activation,
        gated_mlp: false,
        rope: None,
        learned_positions: None,
        parallel_residual: false,
        tied_embeddings: false,
        bos_token_id: j.bos(),
        eos_token_ids: j.eos(),
        features: Default::default(),
    }
}

/// Every layer of the model, read by `layer(index)`.
fn layers(c: &ModelConfig, layer: impl Fn(usize) -> Result<LayerWeights>) -> Result<Vec<LayerWeights>> {
    (0..c.n_layers).map(layer).collect()
}
