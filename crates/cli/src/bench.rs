//! `kvslim bench`: prefill/decode speed against the bandwidth bound.

use crate::common::{CliResult, ModelArgs};
use kvslim_cache::PolicySpec;
use kvslim_engine::bench::{measure_read_bandwidth, run as run_bench, BenchOptions, BenchReport};
use kvslim_kernels::DType;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Use random weights of a named shape instead of --model
    /// (llama-350m, llama-1b, smollm2-135m).
    #[arg(long)]
    synthetic: Option<String>,
    /// Storage type of the synthetic weights (f32, f16, bf16, q8_0, q4_0, q4_1).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Thread counts to measure side by side, e.g. `1,2` (`--threads N` measures only N).
    #[arg(long = "thread-counts", value_delimiter = ',', default_value = "1,2", conflicts_with = "threads")]
    thread_counts: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 64)]
    gen_len: usize,
    /// Repeats per measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// KV cache policy.
    #[arg(long, default_value = "full", value_parser = PolicySpec::parse)]
    policy: PolicySpec,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON rows to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: Args) -> CliResult {
    let counts = match a.model.threads {
        Some(t) => vec![t],
        None => a.thread_counts.clone(),
    };
    let model_args = ModelArgs { threads: None, ..a.model.clone() };
    let (model, name) = match &a.synthetic {
        Some(shape) => {
            let dt = DType::parse(&a.dtype).ok_or_else(|| format!("unknown dtype `{}`", a.dtype))?;
            eprintln!("building synthetic {shape} in {dt} …");
            (kvslim_engine::synthetic::build(shape, dt, 1)?, format!("synthetic {shape} {dt}"))
        }
        None => {
            let loaded = model_args.load()?;
            (loaded.model, a.model.model.clone())
        }
    };
    let opts =
        BenchOptions { prompt_len: a.prompt_len, gen_len: a.gen_len, repeats: a.repeats, policy: a.policy.clone() };
    let mut rows: Vec<BenchReport> = Vec::new();
    for &t in &counts {
        if t == 0 {
            return Err("thread counts must be ≥ 1".into());
        }
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build()?;
        let row = pool.install(|| {
            let bw = measure_read_bandwidth(1 << 30);
            run_bench(&model, &name, &opts, bw)
        })?;
        if !a.json {
            eprintln!("measured {t} thread(s)");
        }
        rows.push(row);
    }
    let json = serde_json::to_string_pretty(&rows)?;
    if let Some(p) = &a.out {
        std::fs::write(p, &json).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if a.json {
        println!("{json}");
        return Ok(());
    }
    println!(
        "| model | threads | isa | weights MiB | prefill tok/s | decode tok/s | ms/token | read GB/s | bound tok/s | of bound |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.0}% |",
            r.model,
            r.threads,
            r.isa,
            r.weight_bytes as f64 / 1048576.0,
            r.prefill_tok_s,
            r.decode_tok_s,
            r.decode_ms_per_token,
            r.bandwidth_gb_s,
            r.bound_tok_s,
            r.fraction_of_bound * 100.0
        );
    }
    Ok(())
}
