//! `kvslim perplexity`: teacher-forced NLL of a text or token list.

use crate::common::{require_tokenizer, CliResult, ModelArgs, Progress};
use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score (tokenized with the model's tokenizer, BOS as the tokenizer says).
    #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
    text: Option<PathBuf>,
    /// Comma-separated token ids to score instead of a text.
    #[arg(long, value_delimiter = ',')]
    tokens: Option<Vec<u32>>,
    /// Keep only the first N tokens.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Process the first N tokens as one prefill chunk (the rest one decode step at a time).
    #[arg(long, default_value_t = 0)]
    prefill: usize,
    /// KV cache policy (see README "Policies").
    #[arg(long, default_value = "full", value_parser = PolicySpec::parse)]
    policy: PolicySpec,
    /// Print one JSON object (`tokens`, `nll`, `ppl`, `kv_bytes_allocated`, …).
    #[arg(long)]
    json: bool,
    /// Include `token_ids` and per-token `logprobs` in the JSON.
    #[arg(long)]
    per_token: bool,
    /// Also run the full cache on the same tokens and report KL(full‖policy),
    /// top-1 agreement and the retained attention mass.
    #[arg(long)]
    compare_full: bool,
    /// Write the retained positions per layer and KV head after the last
    /// token: `{"layers": [{"kv_heads": [[pos, …], …]}, …]}`.
    #[arg(long, value_name = "FILE")]
    kept_out: Option<PathBuf>,
    /// Write one JSON line per eviction (step, layer, kv_head, victim_pos,
    /// victim_score, victim_age, margin) plus per-layer summary lines.
    #[arg(long, value_name = "FILE")]
    trace_out: Option<PathBuf>,
    /// With --trace-out, record only steps divisible by N.
    #[arg(long, default_value_t = 1, value_name = "N")]
    trace_every: u32,
}

pub fn run(a: Args) -> CliResult {
    let loaded = a.model.load()?;
    let mut ids = match (&a.text, &a.tokens) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            require_tokenizer(&loaded.tokenizer)?.encode(&text)?
        }
        (None, Some(t)) => t.clone(),
        (None, None) => return Err("pass --text FILE or --tokens 1,2,3".into()),
    };
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    let opts = PerplexityOptions {
        prefill: a.prefill,
        policy: a.policy.clone(),
        compare_full: a.compare_full,
        trace_every: a.trace_out.as_ref().map(|_| a.trace_every.max(1)),
    };
    let mut progress = Progress::new("perplexity");
    let r = perplexity(&loaded.model, &ids, &opts, |d, t| progress.update(d, t))?;
    if let Some(path) = &a.kept_out {
        let layers: Vec<_> = r.kept.iter().map(|heads| serde_json::json!({ "kv_heads": heads })).collect();
        write_file(path, &serde_json::to_string(&serde_json::json!({ "layers": layers }))?)?;
    }
    if let Some(path) = &a.trace_out {
        write_file(path, &trace_lines(&r.events, loaded.model.config.n_layers)?)?;
    }
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if a.per_token {
            v["token_ids"] = serde_json::json!(ids);
            v["logprobs"] = serde_json::json!(r.logprobs);
        }
        println!("{v}");
    } else {
        println!(
            "tokens {}  nll {:.4} nats  ppl {:.3}  KV {} bytes allocated (+{} metadata)  policy {}",
            r.tokens, r.nll, r.ppl, r.kv_bytes_allocated, r.kv_metadata_bytes, r.policy
        );
        if let Some(c) = &r.compare_full {
            println!(
                "vs full: nll {:.4}  KL {:.5}  top-1 agreement {:.2}%  retained attention mass mean {:.4} P1 {:.4} P5 {:.4}",
                c.full_nll,
                c.kl_mean,
                c.top1_agreement * 100.0,
                c.retained_mass.mean,
                c.retained_mass.p1,
                c.retained_mass.p5
            );
        }
    }
    Ok(())
}

fn write_file(path: &std::path::Path, text: &str) -> CliResult {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

/// Eviction events as JSON lines, then one summary line per layer.
fn trace_lines(events: &[kvslim_cache::policy::EvictionEvent], layers: usize) -> CliResult<String> {
    let mut out = String::new();
    for e in events {
        out.push_str(&serde_json::to_string(e)?);
        out.push('\n');
    }
    for l in 0..layers {
        let ev: Vec<_> = events.iter().filter(|e| e.layer == l).collect();
        let n = ev.len().max(1) as f64;
        let line = serde_json::json!({
            "summary": "layer",
            "layer": l,
            "evictions": ev.len(),
            "mean_victim_age": ev.iter().map(|e| e.victim_age as f64).sum::<f64>() / n,
            "mean_victim_score": ev.iter().map(|e| e.victim_score as f64).sum::<f64>() / n,
            "mean_margin": ev.iter().map(|e| e.margin as f64).sum::<f64>() / n,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    Ok(out)
}
