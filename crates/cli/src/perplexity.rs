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
    let opts = PerplexityOptions { prefill: a.prefill, policy: a.policy.clone() };
    let mut progress = Progress::new("perplexity");
    let r = perplexity(&loaded.model, &ids, &opts, |d, t| progress.update(d, t))?;
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
    }
    Ok(())
}
