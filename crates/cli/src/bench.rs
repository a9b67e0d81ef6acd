//! `kvslim bench`: prefill/decode speed against the bandwidth bound.

use crate::common::{CliResult, ModelArgs};
use kvslim_cache::size::parse_bytes;
use kvslim_cache::PolicySpec;
use kvslim_engine::bench::{
    measure_read_bandwidth, run as run_bench, step_time, verify_time, BenchOptions, BenchReport, StepTimePoint,
    VerifyPoint,
};
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
    /// KV cache policy; repeat to compare several in a context sweep.
    #[arg(long = "policy", default_value = "full", value_parser = PolicySpec::parse_and_load)]
    policies: Vec<PolicySpec>,
    /// Instead of prefill/decode throughput, time one decode step at each of
    /// these context lengths (e.g. 512,1024,2048,4096,8192) for every
    /// --policy: the crossover where eviction pays.
    #[arg(long, value_delimiter = ',')]
    context_sweep: Option<Vec<usize>>,
    /// Instead of throughput, time a speculative verification pass over
    /// chunks of these many tokens (e.g. 1,2,4,8: one target pass checking
    /// chunk − 1 drafts) against one decode step, at --prompt-len tokens of
    /// context, for the first --policy: the price of a pass that
    /// speculative decoding divides by the tokens it accepts.
    #[arg(long, value_delimiter = ',')]
    verify_chunks: Option<Vec<usize>>,
    /// Decode steps timed per sweep point.
    #[arg(long, default_value_t = 16)]
    sweep_steps: usize,
    /// Instead of throughput, measure each --policy's peak KV bytes (and
    /// pages) over a prompt of --prompt-len tokens plus --gen-len greedy
    /// tokens, and how many such sequences fit this much KV memory
    /// (e.g. 64MiB; KB, MB, GB count in powers of 1000, KiB, MiB, GiB in
    /// powers of 1024). Uses --prompt-file text when given.
    #[arg(long)]
    kv_memory: Option<String>,
    /// Text whose first --prompt-len tokens are the prompt (capacity mode);
    /// random tokens otherwise.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
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
    if let Some(mem) = &a.kv_memory {
        return capacity_table(&a, mem);
    }
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
    if let Some(contexts) = &a.context_sweep {
        return sweep(&model, &name, &a, contexts, &counts);
    }
    if let Some(chunks) = &a.verify_chunks {
        return verify_sweep(&model, &name, &a, chunks, &counts);
    }
    let opts = BenchOptions {
        prompt_len: a.prompt_len,
        gen_len: a.gen_len,
        repeats: a.repeats,
        policy: a.policies.first().cloned().unwrap_or_else(PolicySpec::full),
    };
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
    if emit_json(&rows, &a)? {
        return Ok(());
    }
    print_table(
        "| model | threads | isa | weights MiB | KV read MiB | prefill tok/s | decode tok/s | ms/token | read GB/s | bound tok/s | of bound |",
        &rows,
        |r| {
            format!(
                "{} | {} | {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.0}%",
                r.model,
                r.threads,
                r.isa,
                mib(r.weight_bytes),
                mib(r.kv_read_bytes),
                r.prefill_tok_s,
                r.decode_tok_s,
                r.decode_ms_per_token,
                r.bandwidth_gb_s,
                r.bound_tok_s,
                r.fraction_of_bound * 100.0
            )
        },
    );
    Ok(())
}

/// Bytes in MiB.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1048576.0
}

/// Prints `rows` as a Markdown table: the `header` line (`| a | b |`), its
/// rule, then a line a row with the `cells` it formats (`x | y`).
fn print_table<T>(header: &str, rows: &[T], cells: impl Fn(&T) -> String) {
    println!("{header}");
    println!("|{}", "---|".repeat(header.matches('|').count() - 1));
    for r in rows {
        println!("| {} |", cells(r));
    }
}

fn sweep(model: &kvslim_models::Model, name: &str, a: &Args, contexts: &[usize], counts: &[usize]) -> CliResult {
    let mut rows: Vec<StepTimePoint> = Vec::new();
    for &t in counts {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t.max(1)).build()?;
        for policy in &a.policies {
            for &ctx in contexts {
                if ctx == 0 {
                    return Err("context lengths must be ≥ 1".into());
                }
                let p = pool.install(|| step_time(model, name, policy, ctx, a.sweep_steps.max(1)))?;
                eprintln!("{} threads {} context {}: {:.2} ms/step", p.policy, t, ctx, p.step_ms_median);
                rows.push(p);
            }
        }
    }
    if emit_json(&rows, a)? {
        return Ok(());
    }
    print_table("| model | policy | threads | context | slots | step ms (median) | KV MiB allocated |", &rows, |r| {
        format!(
            "{} | {} | {} | {} | {} | {:.2} | {:.1}",
            r.model,
            r.policy,
            r.threads,
            r.context,
            r.slots,
            r.step_ms_median,
            mib(r.kv_bytes_allocated)
        )
    });
    Ok(())
}

/// `--verify-chunks`: verification pass time per chunk size against one
/// decode step.
fn verify_sweep(model: &kvslim_models::Model, name: &str, a: &Args, chunks: &[usize], counts: &[usize]) -> CliResult {
    if chunks.contains(&0) {
        return Err("--verify-chunks: chunk sizes must be ≥ 1".into());
    }
    let policy = a.policies.first().cloned().unwrap_or_else(PolicySpec::full);
    let mut rows: Vec<VerifyPoint> = Vec::new();
    for &t in counts {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t.max(1)).build()?;
        let points = pool.install(|| verify_time(model, name, &policy, a.prompt_len, chunks, a.repeats.max(3)))?;
        eprintln!("measured {t} thread(s)");
        rows.extend(points);
    }
    if emit_json(&rows, a)? {
        return Ok(());
    }
    print_table(
        "| model | policy | threads | context | chunk | pass ms | decode step ms | pass / step | ms per token |",
        &rows,
        |r| {
            format!(
                "{} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2}",
                r.model,
                r.policy,
                r.threads,
                r.context,
                r.chunk,
                r.pass_ms_median,
                r.step_ms_median,
                r.ratio,
                r.pass_ms_median / r.chunk as f64
            )
        },
    );
    Ok(())
}

/// `--kv-memory`: per-policy peak KV bytes over a generation and the
/// batch that fits.
fn capacity_table(a: &Args, mem: &str) -> CliResult {
    let kv_memory = parse_bytes(mem)?;
    let loaded = a.model.load()?;
    let model = &loaded.model;
    let prompt: Vec<u32> = match &a.prompt_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let ids = crate::common::require_tokenizer(&loaded.tokenizer)?.encode(&text)?;
            if ids.len() < a.prompt_len {
                return Err(format!(
                    "{} has {} tokens, fewer than --prompt-len {}",
                    path.display(),
                    ids.len(),
                    a.prompt_len
                )
                .into());
            }
            ids[..a.prompt_len].to_vec()
        }
        None => {
            let mut rng = kvslim_engine::sampling::Rng::new(7);
            (0..a.prompt_len).map(|_| (rng.next_u64() % model.config.vocab_size as u64) as u32).collect()
        }
    };
    let mut rows = Vec::new();
    for policy in &a.policies {
        let r = kvslim_engine::bench::capacity(model, &a.model.model, policy, &prompt, a.gen_len, kv_memory as u64)?;
        eprintln!(
            "{}: peak {:.2} MiB, max batch {}",
            r.policy,
            mib(r.peak_kv_bytes + r.peak_metadata_bytes),
            r.max_batch
        );
        rows.push(r);
    }
    if emit_json(&rows, a)? {
        return Ok(());
    }
    print_table(
        &format!(
            "| policy | prompt + gen | peak KV MiB | metadata KiB | reserved MiB | peak pages | moved B/step | decode tok/s | max batch in {mem} |"
        ),
        &rows,
        |r| {
            format!(
                "`{}` | {} + {} | {:.2} | {:.1} | {:.2} | {} | {:.0} | {:.1} | {}",
                r.policy,
                r.prompt_len,
                r.gen_len,
                mib(r.peak_kv_bytes),
                r.peak_metadata_bytes as f64 / 1024.0,
                mib(r.reserved_bytes),
                r.peak_pages.map_or("-".to_string(), |p| p.to_string()),
                r.bytes_moved_per_step,
                r.decode_tok_s,
                r.max_batch
            )
        },
    );
    Ok(())
}

/// Writes `rows` to `--out` when given, and prints them as JSON with
/// `--json` (true: nothing else to print).
fn emit_json<T: serde::Serialize>(rows: &[T], a: &Args) -> CliResult<bool> {
    let json = serde_json::to_string_pretty(rows)?;
    if let Some(p) = &a.out {
        std::fs::write(p, &json).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if a.json {
        println!("{json}");
    }
    Ok(a.json)
}
