//! `kvslim info`: what a checkpoint is.

use crate::common::{CliResult, ModelArgs};
use kvslim_cache::policy::auto::{self, AutoUse};
use kvslim_cache::policy::Budget;
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
    let loaded = a.model.load()?;
    let m = &loaded.model;
    let c = &m.config;
    let (params, bytes) = m.weights.size();
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for mat in m.weights.matrices() {
        *dtypes.entry(mat.dtype().to_string()).or_default() += 1;
    }
    let layer_kinds = layer_kinds(c);
    let f = &c.features;
    let mut features: Vec<String> = Vec::new();
    if f.qk_norm {
        features.push("per-head QK RMS norm".into());
    }
    if f.post_norms {
        features.push("post-attention/post-MLP norms".into());
    }
    if let Some(s) = f.embedding_scale {
        features.push(format!("embeddings ×{s}"));
    }
    if let Some(s) = f.attention_scale {
        features.push(format!("attention scale {s}"));
    }
    if a.json {
        let v = serde_json::json!({
            "config": c,
            "layer_kinds": layer_kinds,
            "parameters": params,
            "weight_bytes": bytes,
            "matrix_dtypes": dtypes,
            "tokenizer": loaded.tokenizer.as_ref().map(|t| serde_json::json!({
                "vocab_size": t.vocab_size(), "add_bos": t.add_bos, "bos": t.bos, "eos": t.eos,
                "chat_template": t.chat_template.is_some(),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows: Vec<(&str, String)> = vec![
        ("architecture", format!("{:?}", c.architecture)),
        ("format", format!("{:?}", c.format)),
        ("layers", c.n_layers.to_string()),
        ("layer kinds", layer_kinds.join("; ")),
        ("block features", if features.is_empty() { "none".into() } else { features.join(", ") }),
        ("heads", c.n_heads.to_string()),
        ("kv heads", format!("{} (group of {})", c.n_kv_heads, c.group_size())),
        ("head dim", c.head_dim.to_string()),
        ("hidden", c.hidden_size.to_string()),
        ("ffn", format!("{} ({})", c.ffn_size, if c.gated_mlp { "gated" } else { "plain" })),
        ("activation", format!("{:?}", c.activation)),
        ("norm", format!("{:?} eps={}", c.norm, c.norm_eps)),
        (
            "positions",
            match (&c.rope, c.learned_positions) {
                (Some(r), _) => format!("RoPE θ={} rotary_dim={} {:?}", r.theta, r.rotary_dim, r.layout),
                (None, Some(off)) => format!("learned (offset {off})"),
                _ => "none".into(),
            },
        ),
        ("vocab", c.vocab_size.to_string()),
        ("context", c.context_len.to_string()),
        ("tied embeddings", c.tied_embeddings.to_string()),
        ("parallel residual", c.parallel_residual.to_string()),
        ("matrix dtypes", dtypes.iter().map(|(k, v)| format!("{k}×{v}")).collect::<Vec<_>>().join(" ")),
        ("parameters", format!("{params} ({:.1} M)", params as f64 / 1e6)),
        ("weight bytes", format!("{bytes} ({:.1} MiB)", bytes as f64 / 1048576.0)),
        (
            "kv bytes/token",
            // what the cache allocates for one more token of the full f32
            // cache (`kvslim_cache::accounting` owns the rule: a sliding-
            // window layer stops growing at its window)
            {
                let per = |len: usize| {
                    kvslim_cache::accounting::reservation(&kvslim_cache::PolicySpec::full(), &m.cache_shape(), len, len)
                        .map(|r| r.kv)
                };
                let (one, two) = (per(1)?, per(2)?);
                match &f.sliding_window {
                    None => format!("{} (f32 K+V, all layers)", two - one),
                    Some(w) => format!(
                        "{} (f32 K+V, the {} global layers, once the {}-token window of the local layers is full; \
                         {} bytes at {} tokens)",
                        per(w.window + 2)? - per(w.window + 1)?,
                        w.local_layers.iter().filter(|&&l| !l).count(),
                        w.window,
                        per(c.context_len)?,
                        c.context_len
                    ),
                }
            },
        ),
        (
            "auto policy",
            // what `auto:budget=P%` resolves to for this model at 1,024 tokens,
            // at each share its rows were measured at
            auto_row(m, AutoUse::Reply, 1024),
        ),
        (
            "auto, contexts",
            // the same when a context is compressed once for many questions
            auto_row(m, AutoUse::Context, 4096),
        ),
        (
            "tokenizer",
            match &loaded.tokenizer {
                Some(t) => format!("{} tokens, add_bos={} bos={:?} eos={:?}", t.vocab_size(), t.add_bos, t.bos, t.eos),
                None => "none (pass --tokenizer)".into(),
            },
        ),
    ];
    for (k, v) in rows {
        println!("{k:>18}  {v}");
    }
    Ok(())
}

/// What `auto:budget=P%` becomes for `m` used as `usage` at `len` tokens,
/// at each share its rows were measured at, with the row it comes from.
fn auto_row(m: &kvslim_models::Model, usage: AutoUse, len: usize) -> String {
    let key = m.auto_key();
    let kvzap = m.has_kvzap();
    let shares = auto::measured_shares(Some(&key), usage, kvzap);
    let at = |&p: &f64| {
        let (spec, row) = auto::resolve(Budget::Percent(p), Some(&key), len, usage, kvzap);
        format!("{p}% → {spec} ({}, {})", row.model_name, row.evidence)
    };
    let predictor = if kvzap { ", KVzap predictor found" } else { ", no KVzap predictor" };
    format!("key {key}{predictor}; at {len} tokens: {}", shares.iter().map(at).collect::<Vec<_>>().join("; "))
}

/// Layers grouped by kind: `global × 3 (5, 11, 17)`, `local window 512,
/// RoPE θ=10000 × 15 (0-4, …)`.
fn layer_kinds(c: &kvslim_models::ModelConfig) -> Vec<String> {
    let Some(w) = &c.features.sliding_window else {
        return vec![format!("global × {}", c.n_layers)];
    };
    let list = |local: bool| -> Vec<usize> { (0..c.n_layers).filter(|&l| w.local_layers[l] == local).collect() };
    let ranges = |ls: &[usize]| -> String {
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        while i < ls.len() {
            let mut j = i;
            while j + 1 < ls.len() && ls[j + 1] == ls[j] + 1 {
                j += 1;
            }
            out.push(if i == j { ls[i].to_string() } else { format!("{}-{}", ls[i], ls[j]) });
            i = j + 1;
        }
        out.join(", ")
    };
    let theta = w.local_rope_theta.map(|t| format!(", RoPE θ={t}")).unwrap_or_default();
    let mut kinds = Vec::new();
    for (local, name) in [(true, format!("local (window {}{theta})", w.window)), (false, "global".to_string())] {
        let ls = list(local);
        if !ls.is_empty() {
            kinds.push(format!("{name} × {} ({})", ls.len(), ranges(&ls)));
        }
    }
    kinds
}
