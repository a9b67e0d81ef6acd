//! `kvslim eval`: the policy × budget × task matrix on one model, whole or
//! one shard of it (`--shard I/N`), and `kvslim eval merge` of the shards.

use crate::common::{require_tokenizer, CliResult, ModelArgs, Progress};
use kvslim_eval::{run_matrix, MatrixConfig, MatrixEvent, ScoreMode, Scoring, Shard, TaskSpec};
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<EvalCommand>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Policy families separated by `;` (full, window, sink, heavy, random,
    /// h2o; extras such as `h2o:agg=max`; `h2o+chai:plan=F`). Each budget is
    /// substituted into each family at equal slots (docs/policies.md).
    /// Storage keys pass through unchanged (grammar: `kvslim_cache::policy::spec`):
    /// `page=P`, `compact=N`, `page_score=sum|max|topm:M`,
    /// `kv_dtype=f32|f16|q8|q4`, e.g. `h2o:page=16,compact=64;h2o:kv_dtype=q8;full:kv_dtype=q8`.
    /// Paged ppl cells report `pages_peak`, `fragmentation` and
    /// `bytes_moved_per_step`; every ppl cell `kv_bytes_peak`.
    /// `tuned:file=FILE` (from `kvslim tune --out`) is one cell at the
    /// budget the file records, for sequences of the length it was tuned on.
    #[arg(long, default_value = "full;window;sink;heavy;random;h2o")]
    policies: String,
    /// Budgets: percentages of each sequence or slot counts.
    #[arg(long, value_delimiter = ',', default_value = "100%,40%,20%,10%,5%")]
    budgets: Vec<String>,
    /// Tasks separated by `;`: `ppl:FILE[,seq_len=N]`, `mc:FILE`,
    /// `hellaswag:FILE`, `gen:FILE[,max_tokens=N]`, and the RULER-style
    /// long-context tasks made locally from a seed, `passkey`, `niah_single`,
    /// `niah_multikey`, `niah_multivalue`, `vt` (variable tracking), `cwe`
    /// (common words), each `[:lengths=…,depths=…,per_cell=N,seed=S,max_tokens=N]`,
    /// each with optional `,limit=N`.
    #[arg(long, required = true)]
    tasks: Option<String>,
    /// Items per task (windows for ppl) when the task spec sets no limit.
    #[arg(long)]
    limit: Option<usize>,
    /// Window length of `ppl:` tasks whose spec sets no `seq_len=`.
    #[arg(long)]
    seq_len: Option<usize>,
    /// How sequences are fed: `decode` (policy active at every token), `prefill-context`, `prefill`.
    #[arg(long, default_value = "decode")]
    mode: ScoreMode,
    /// Multiple-choice scoring: `forked` runs an item's context once and
    /// each choice on a fork of its cache, the tokens of 16 items as
    /// decode steps sharing one GEMM per weight (percentage budgets
    /// resolve against context + the item's longest choice; the plain full
    /// cache, the same in every mode up to rounding, always runs this
    /// way); `per-choice` runs context + choice once per choice
    /// (percentage budgets against each choice's own sequence).
    #[arg(long, default_value = "forked")]
    scoring: Scoring,
    /// Skip the full-cache comparison (KL, top-1, retained mass) of ppl tasks.
    #[arg(long)]
    no_compare_full: bool,
    /// Mode (a) for quantized KV in ppl tasks: a cell whose policy evicts
    /// and stores K/V in another dtype (e.g. `h2o:kv_dtype=q8`) keeps
    /// exactly the tokens the same policy keeps with K/V in DTYPE (f32 or
    /// f16), run alongside: quantization error alone. Such rows record
    /// `decisions_from` and add `ref_ppl`, `kl_ref`, `kept_differing`.
    /// Without it (mode (b)) policies decide on their own quantized cache.
    /// Cells of `full`, CHAI, or the same dtype run as usual.
    #[arg(long, value_name = "DTYPE")]
    decisions_from: Option<String>,
    /// Output directory: results.jsonl (one line per finished cell), results.csv, results.md, plots/.
    #[arg(long, default_value = "eval-out")]
    out: PathBuf,
    /// Continue an interrupted run in --out, skipping finished cells; a
    /// multiple-choice cell cut off midway continues after its last
    /// finished block of 16 items (kept in partial.jsonl).
    #[arg(long)]
    resume: bool,
    /// Also time decode steps at these context lengths for every policy and
    /// budget (speed.jsonl, speed.md, plots/step_time_vs_context.*).
    #[arg(long, value_delimiter = ',')]
    contexts: Option<Vec<usize>>,
    /// KV memory limit (e.g. 2GiB; KB, MB, GB count in powers of 1000,
    /// KiB, MiB, GiB in powers of 1024): report how many sequences of each
    /// context length fit it under each policy.
    #[arg(long, value_parser = kvslim_cache::size::parse_bytes)]
    mem_limit: Option<usize>,
    /// Decode steps timed per speed point.
    #[arg(long, default_value_t = 8)]
    speed_steps: usize,
    /// Run only shard I of N (0-based, `0/4` … `3/4`): the matrix's cells in
    /// their canonical order (task, policy, budget) are dealt round-robin,
    /// cell k to shard k mod N, so the N shards together run every cell once.
    /// Give each shard its own --out and otherwise the same flags; its rows
    /// are tagged with the shard and the run's configuration fingerprint,
    /// and --out gets shard.json. Combine with `kvslim eval merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Run every cell of a generation task (RULER, LCC) on its own. By
    /// default the cells that can share a prompt's prefill (one chunk,
    /// no CHAI: full, window, sink, H2O, SnapKV, the allocators, ...)
    /// run item by item together, one prefill per item for all of them
    /// (the kvpress protocol); outputs are identical, only time changes.
    #[arg(long)]
    no_shared_prefill: bool,
}

#[derive(clap::Subcommand)]
enum EvalCommand {
    /// Merge the out directories of all shards of one `--shard` run into the
    /// results.jsonl/csv/md (and plots/) an unsharded run writes, rows in the
    /// same order. Refuses shards of different runs, duplicate or missing
    /// shards, and unfinished shards (`--partial` takes what is finished).
    /// A merge is run again into the same --out with `--replace`.
    Merge(MergeArgs),
}

#[derive(clap::Args)]
struct MergeArgs {
    /// Directory for the merged results (must not hold results yet, unless --replace).
    #[arg(long)]
    out: PathBuf,
    /// Replace the merged results --out already holds: run a merge again
    /// (after a failed shard was resumed, or a job re-run into the same
    /// folder). The new files are written beside the old ones first, so a
    /// merge that fails leaves the old ones in place.
    #[arg(long)]
    replace: bool,
    /// Skip drawing plots/ from the merged rows.
    #[arg(long)]
    no_charts: bool,
    /// Merge the cells finished so far, leaving out missing shards and
    /// cells still running, to look at a long run midway (results.md says
    /// how many cells it holds).
    #[arg(long)]
    partial: bool,
    /// The shards' out directories, one per shard, in any order.
    #[arg(required = true, value_name = "SHARD_DIR")]
    shards: Vec<PathBuf>,
}

fn merge(a: MergeArgs) -> CliResult {
    let opts = kvslim_eval::MergeOptions { charts: !a.no_charts, partial: a.partial, replace: a.replace };
    let merged = kvslim_eval::merge_shards(&a.shards, &a.out, opts)?;
    eprintln!(
        "merged {} shards: {}; results in {}/results.jsonl, .csv, .md{}",
        a.shards.len(),
        merged.coverage(),
        a.out.display(),
        if a.no_charts { "" } else { " and plots/" }
    );
    Ok(())
}

pub fn run(a: Args) -> CliResult {
    if let Some(EvalCommand::Merge(m)) = a.command {
        return merge(m);
    }
    let shard = a.shard.as_deref().map(|s| s.parse::<Shard>().map_err(|e| format!("--shard: {e}"))).transpose()?;
    if shard.is_some() && a.contexts.is_some() {
        return Err("--shard with --contexts: run the speed grid in its own, unsharded run".into());
    }
    let task_list = a.tasks.as_deref().ok_or("--tasks is required")?;
    let loaded = a.model.load()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let mut tasks = Vec::new();
    for t in task_list.split(';').map(str::trim).filter(|t| !t.is_empty()) {
        tasks.push(TaskSpec::parse_with_defaults(t, a.limit, a.seq_len)?);
    }
    if tasks.is_empty() {
        return Err("--tasks names no task".into());
    }
    let mem_limit = a.mem_limit.map(|b| b as u64);
    if mem_limit.is_some() && a.contexts.is_none() {
        return Err("--mem-limit needs --contexts (the sequence lengths to size batches for)".into());
    }
    let mut cfg = MatrixConfig::new(&a.model.model, tasks);
    cfg.policies = a.policies.split(';').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    cfg.budgets = a.budgets.clone();
    cfg.mode = a.mode;
    cfg.scoring = a.scoring;
    cfg.compare_full = !a.no_compare_full;
    cfg.decisions_from = a
        .decisions_from
        .as_deref()
        .map(|d| d.parse::<kvslim_cache::KvDtype>().map_err(|e| format!("--decisions-from: {e}")))
        .transpose()?;
    cfg.out_dir = Some(a.out.clone());
    cfg.resume = a.resume;
    cfg.shard = shard;
    cfg.shared_prefill = !a.no_shared_prefill;
    // a shard draws no charts: `kvslim eval merge` draws them from all rows
    cfg.charts = shard.is_none();
    let mut progress = Progress::new("eval", "items");
    let rows = run_matrix(&loaded.model, tok, &cfg, |ev| match ev {
        MatrixEvent::TaskLoading { task } => eprintln!("loading {task} …"),
        MatrixEvent::CellStart { key, index, total } => {
            let follows = key.decisions_from.as_ref().map_or(String::new(), |d| format!(" [decisions from {d}]"));
            eprintln!("[{index}/{total}] {} {} {}{follows}", key.task, key.policy, key.budget)
        }
        MatrixEvent::CellSkipped { key, index, total } => {
            eprintln!("[{index}/{total}] {} {} {} (done, skipped)", key.task, key.policy, key.budget)
        }
        MatrixEvent::Items { done, total, .. } => progress.update(done, total),
        MatrixEvent::CellDone { row } => {
            let t = |k: &str| row.timings.get(k).copied().unwrap_or(0.0);
            eprintln!("  {} items in {:.1} s ({:.2} items/s)", row.items, t("wall"), t("items_per_s"))
        }
    })?;
    if let Some(contexts) = &a.contexts {
        let grid = kvslim_eval::speed::SpeedGrid {
            model_label: &a.model.model,
            families: &cfg.policies,
            budgets: &cfg.budgets,
            contexts,
            mem_limit,
            steps: a.speed_steps.max(1),
        };
        let rows = kvslim_eval::speed::measure(&loaded.model, &grid, |r| {
            eprintln!(
                "speed {} {} context {}: {:.2} ms/step, {} bytes/sequence",
                r.policy, r.budget, r.context, r.step_ms, r.bytes_per_sequence
            )
        })?;
        kvslim_eval::speed::write_outputs(&a.out, &rows)?;
    }
    match shard {
        Some(s) => eprintln!(
            "shard {s}: {} cells; results in {}/results.jsonl, .csv, .md, shard.json (combine with `kvslim eval merge`)",
            rows.len(),
            a.out.display()
        ),
        None => eprintln!("{} cells; results in {}/results.jsonl, .csv, .md and plots/", rows.len(), a.out.display()),
    }
    Ok(())
}
