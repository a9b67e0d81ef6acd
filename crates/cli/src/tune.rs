//! `kvslim tune`: search the policy space on calibration text and write the
//! best spec (`kvslim_eval::tune` holds the search; this parses flags,
//! shows progress and prints the tables).

use crate::common::{require_tokenizer, CalibrationText, CliResult, ModelArgs, Progress};
use kvslim_cache::policy::Budget;
use kvslim_cache::PolicySpec;
use kvslim_eval::tune::{
    check_disjoint, evaluation_windows, held_out, search_budget, search_for_target, tune_windows, BudgetSearch,
    CandidateRow, Grid, HeldOutRecord, HeldOutRow, ModelScorer, TuneConfig, TuneFile,
};
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(mut_arg("text", |a| a.help(
    "Calibration text. The tune windows are cut from its tokens starting at --skip-tokens (default: the second \
     half), so the first half can be evaluated as held-out text"
)))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    text: CalibrationText,
    /// Total slots per (layer, KV head) every candidate gets: `20%` of
    /// --seq-len or a slot count.
    #[arg(long, conflicts_with = "max_kl", required_unless_present = "max_kl")]
    budget: Option<Budget>,
    /// Quality target instead of a budget: the smallest of --budgets whose
    /// best policy has KL(full‖policy) ≤ X on the calibration windows.
    #[arg(long, value_name = "X")]
    max_kl: Option<f64>,
    /// Budgets tried, smallest first, with --max-kl.
    #[arg(long, value_delimiter = ',', default_value = "5%,10%,20%,40%")]
    budgets: Vec<Budget>,
    /// Tokens per window (BOS included); each window is a fresh sequence.
    #[arg(long, default_value_t = 512)]
    seq_len: usize,
    /// Calibration windows the finalists are scored on.
    #[arg(long, default_value_t = 8)]
    windows: usize,
    /// Where the tune windows start in the calibration text's tokens
    /// (default: half of its tokens).
    #[arg(long, value_name = "N")]
    skip_tokens: Option<usize>,
    /// Successive halving: keep the best 1/ETA per rung, ETA× the windows.
    #[arg(long, default_value_t = 3)]
    eta: usize,
    /// Candidate grid: `default` (baselines + H2O × 7 score families × sink
    /// 0/4 × 3 heavy/recent splits + paper H2O × sum/norm scores × the
    /// pyramid/ada allocators) or `tiny` (window, sink, H2O, H2O decay:0.9).
    #[arg(long, default_value = "default")]
    grid: Grid,
    /// After tuning, compare the chosen spec with window, sink, heavy,
    /// random and paper H2O at the same slots on the first --eval-windows
    /// windows of this text (as `ppl:FILE,seq_len=L,limit=K`). Refused when
    /// it is the calibration text and those windows overlap the tune windows.
    #[arg(long, value_name = "FILE")]
    eval_text: Option<PathBuf>,
    /// Held-out windows compared with --eval-text.
    #[arg(long, default_value_t = 8, value_name = "K")]
    eval_windows: usize,
    /// Write the result here (JSON; use it as `--policy tuned:file=FILE`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the result JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
    if a.eta < 2 {
        return Err("--eta must be at least 2".into());
    }
    if a.windows == 0 || a.eval_windows == 0 {
        return Err("--windows and --eval-windows must be at least 1".into());
    }
    if let Some(x) = a.max_kl {
        if !(x.is_finite() && x >= 0.0) {
            return Err(format!("--max-kl: `{x}` is not a KL ≥ 0").into());
        }
    }
    let (loaded, model_path) = a.model.load_with_path()?;
    let tok = require_tokenizer(&loaded.tokenizer)?;
    let cal = tune_windows(&a.text.path, tok, a.seq_len, a.skip_tokens, a.windows)?;
    // the held-out windows are checked before any tuning runs
    let eval = match &a.eval_text {
        None => None,
        Some(p) => {
            let e = evaluation_windows(p, tok, a.seq_len, a.eval_windows)?;
            check_disjoint(&cal, &e)?;
            Some(e)
        }
    };
    eprintln!(
        "tune: {} windows of {} tokens from {} (tokens {}..{} of {}), sha256 {}",
        cal.windows.len(),
        a.seq_len,
        cal.path.display(),
        cal.token_range.0,
        cal.token_range.1,
        cal.text_tokens,
        &cal.windows_sha256[..16]
    );
    let cfg = TuneConfig { seq_len: a.seq_len, windows: a.windows, eta: a.eta, grid: a.grid };
    let mut scorer = ModelScorer::new(&loaded.model, &cal.windows);
    let mut progress = Progress::new("tune", "runs");
    let (searches, chosen) = match (a.budget, a.max_kl) {
        (Some(b), _) => (vec![search_budget(b, &cfg, &mut scorer, |d, t| progress.update(d, t))?], 0),
        (None, Some(x)) => {
            let (runs, met) = search_for_target(&a.budgets, x, &cfg, &mut scorer, |_, d, t| progress.update(d, t))?;
            match met {
                Some(i) => (runs, i),
                None => {
                    if !a.json {
                        runs.iter().for_each(print_candidates);
                    }
                    let best =
                        runs.last().map(|r| (r.budget.clone(), r.candidates[0].spec.clone(), r.candidates[0].kl));
                    let (b, s, kl) = best.unwrap_or_default();
                    return Err(format!(
                        "no budget in --budgets meets --max-kl {x}: the largest, {b}, is best with `{s}` at KL {kl:.5}; add larger budgets"
                    )
                    .into());
                }
            }
        }
        (None, None) => return Err("pass --budget B or --max-kl X".into()),
    };
    let mut file = TuneFile::new(&model_path.display().to_string(), &cfg, cal, searches, chosen);
    file.max_kl = a.max_kl;
    if let Some(e) = eval {
        let spec = PolicySpec::parse(&file.spec)?;
        let mut p = Progress::new("held-out", "runs");
        let (rows, full_nll) = held_out(&loaded.model, &spec, file.budget_slots, &e, |d, t| p.update(d, t))?;
        file.held_out = Some(HeldOutRecord { text: e, full_nll, full_ppl: full_nll.exp(), rows });
    }
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&file)? + "\n")
            .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&file)?);
        return Ok(());
    }
    file.searches.iter().for_each(print_candidates);
    println!(
        "\nchosen at {} ({} slots of {} tokens): {}\n  calibration KL {:.5}  NLL {:.4} (full {:.4})  ppl {:.3} (full {:.3})  top-1 {:.2}%  KV {} bytes allocated",
        file.budget,
        file.budget_slots,
        file.seq_len,
        file.spec,
        file.kl,
        file.nll,
        file.full_nll,
        file.ppl,
        file.full_ppl,
        file.top1_agreement * 100.0,
        file.kv_bytes_allocated
    );
    if let Some(h) = &file.held_out {
        println!(
            "\nheld out: {} windows of {} (tokens {}..{}), full cache ppl {:.3}",
            h.text.windows.len(),
            h.text.path.display(),
            h.text.token_range.0,
            h.text.token_range.1,
            h.full_ppl
        );
        print_held_out(&h.rows);
    }
    if let Some(out) = &a.out {
        println!("\nwrote {} (use: --policy tuned:file={})", out.display(), out.display());
    }
    Ok(())
}

fn print_candidates(s: &BudgetSearch) {
    println!(
        "\nbudget {} = {} slots: {} candidates, {} window runs",
        s.budget,
        s.budget_slots,
        s.candidates.len(),
        s.candidates.iter().map(|c| c.windows).sum::<usize>()
    );
    println!("{:>4}  {:>3}  {:>8}  {:>7}  {:>8}  {:>6}  spec", "rank", "win", "KL", "NLL", "ppl", "top-1");
    for c in &s.candidates {
        print_row(c);
    }
}

fn print_row(c: &CandidateRow) {
    println!(
        "{:>4}  {:>3}  {:>8.5}  {:>7.4}  {:>8.3}  {:>5.1}%  {}",
        c.rank,
        c.windows,
        c.kl,
        c.nll,
        c.ppl,
        c.top1_agreement * 100.0,
        c.spec
    );
}

fn print_held_out(rows: &[HeldOutRow]) {
    println!("{:<7}  {:>8}  {:>7}  {:>8}  {:>6}  spec", "", "KL", "NLL", "ppl", "top-1");
    for r in rows {
        println!(
            "{:<7}  {:>8.5}  {:>7.4}  {:>8.3}  {:>5.1}%  {}",
            r.label,
            r.kl,
            r.nll,
            r.ppl,
            r.top1_agreement * 100.0,
            r.spec
        );
    }
}
