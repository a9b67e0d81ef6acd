//! `kvslim perplexity`: teacher-forced NLL of a text or token list.
//!
//! `--policy` takes the whole policy grammar (`kvslim_cache::policy::spec`),
//! storage keys included: `page=P`, `compact=N`, `page_score=sum|max|topm:M`,
//! `kv_dtype=f32|f16|q8|q4`. Paged specs report page statistics; a
//! quantized spec can follow the eviction decisions of a reference dtype
//! (`--decisions-from`, mode (a)) instead of deciding on its own quantized
//! cache (mode (b), the default).

use crate::common::{require_tokenizer, CliResult, ModelArgs, PolicyArgs, Progress};
use kvslim_cache::KvDtype;
use kvslim_engine::{perplexity, PerplexityOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
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
    /// Count only the predictions after the --prefill chunk: the
    /// continuation of a prompt the policy compressed (`prefill=snap`,
    /// `kvzap`, `kvzip`), whose own predictions are the full cache's.
    #[arg(long, requires = "prefill")]
    after_prefill: bool,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Mode (a) for a quantized KV policy: run the same policy with K/V in
    /// this dtype (f32 or f16) alongside, and keep in the quantized cache
    /// exactly the tokens that run keeps, so the result measures the
    /// quantization error alone. Without it (mode (b)) the policy decides on
    /// its own quantized cache, which includes the feedback of quantized
    /// attention on eviction. Not with CHAI, nor when the policy's
    /// kv_dtype is already this one.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    decisions_from: Option<KvDtype>,
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
        after_prefill: a.after_prefill,
        policy: a.policy.spec.clone(),
        compare_full: a.compare_full,
        trace_every: a.trace_out.as_ref().map(|_| a.trace_every.max(1)),
        decisions_from: a.decisions_from,
        stop: Default::default(),
    };
    opts.check_decisions_from()?;
    let mut progress = Progress::new("perplexity", "tok");
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
        if let Some(ms) = r.decode_ms_median {
            println!("decode steps {}  median {:.3} ms/step  KV peak {} bytes", r.decode_steps, ms, r.kv_bytes_peak);
        }
        if let Some(p) = &r.paged {
            println!(
                "pages (of {} tokens): peak {} final {}  KV bytes peak {} final {}  fragmentation {} slots ({:.1}% of allocated; mean {:.1}% over steps)  moved {:.1} bytes/step ({} total)  shared {}  copy-on-write {}",
                p.page_size,
                p.pages_peak,
                p.pages_final,
                p.kv_bytes_peak,
                p.kv_bytes_final,
                p.fragmentation_slots,
                p.fragmentation_pct,
                p.fragmentation_mean_pct,
                p.bytes_moved_per_step,
                p.bytes_moved,
                p.shared_pages,
                p.cow_copies
            );
        }
        if let Some(d) = &r.decisions {
            println!(
                "decisions from {}: reference nll {:.4} ppl {:.3}  KL(reference‖this) {:.6}  top-1 agreement {:.2}%  kept sets differing {}/{}",
                d.reference_kv_dtype,
                d.reference_nll,
                d.reference_ppl,
                d.kl_vs_reference,
                d.top1_vs_reference * 100.0,
                d.kept_sets_differing,
                d.kept_sets_checked
            );
        }
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

fn parse_dtype(s: &str) -> Result<KvDtype, String> {
    s.parse::<KvDtype>().map_err(|e| e.to_string())
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
