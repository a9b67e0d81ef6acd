//! `kvslim generate`: sample a continuation and stream it.

use crate::common::{require_tokenizer, CliResult, ModelArgs};
use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions, SamplingParams};
use kvslim_models::tokenizer::StreamDecoder;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long, short = 'p')]
    prompt: String,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// RNG seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV cache policy (see README "Policies"), e.g. `full`.
    #[arg(long, default_value = "full", value_parser = PolicySpec::parse)]
    policy: PolicySpec,
    /// Print one JSON object (`text`, `token_ids`, timings, KV bytes) instead of streaming.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
    let loaded = a.model.load()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let prompt = tok.encode(&a.prompt)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed },
        policy: a.policy.clone(),
        eos: tok.eos.clone(),
    };
    let mut stream = StreamDecoder::new();
    let mut out = std::io::stdout().lock();
    if !a.json {
        write!(out, "{}", a.prompt)?;
        out.flush()?;
    }
    let g = generate(&loaded.model, &prompt, &opts, |id| {
        if !a.json {
            if let Ok(piece) = stream.push(tok, id) {
                let _ = write!(out, "{piece}");
                let _ = out.flush();
            }
        }
        true
    })?;
    let text = tok.decode(&g.token_ids)?;
    let tps = if g.decode_s > 0.0 { (g.token_ids.len().saturating_sub(1)) as f64 / g.decode_s } else { 0.0 };
    if a.json {
        let v = serde_json::json!({
            "text": text,
            "token_ids": g.token_ids,
            "prompt_token_ids": prompt,
            "prompt_tokens": g.prompt_tokens,
            "completion_tokens": g.token_ids.len(),
            "stop_reason": g.stop,
            "policy": a.policy.to_string(),
            "time_to_first_token_s": g.time_to_first_token_s,
            "decode_tok_s": tps,
            "kv_bytes_allocated": g.kv_bytes.kv,
            "kv_metadata_bytes": g.kv_bytes.metadata,
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        eprintln!(
            "[{} prompt + {} generated tokens, first token {:.0} ms, {:.1} tok/s, KV {:.2} MiB allocated, policy {}]",
            g.prompt_tokens,
            g.token_ids.len(),
            g.time_to_first_token_s * 1e3,
            tps,
            g.kv_bytes.kv as f64 / 1048576.0,
            a.policy
        );
    }
    Ok(())
}
