//! `kvslim tune`: choose a KV policy for a model by measurement on
//! calibration text, at a fixed total budget or for a quality target.
//!
//! **Objective.** Candidates are ranked by the mean KL(full‖policy) per
//! predicted token over the calibration windows (teacher forced, every
//! token a decode step, [`kvslim_engine::perplexity`] with the full cache
//! alongside), ties broken by NLL, then by grid order. KL rather than NLL
//! because it measures what a policy changes against the model it
//! approximates, on every token, whatever the text's own difficulty; NLL,
//! perplexity and top-1 agreement are reported beside it.
//!
//! **Space.** Every candidate holds the same B slots per (layer, KV head)
//! (B = the budget resolved against the window length, as
//! [`Budget::resolve`]): the baselines (`window`, `sink`, `heavy`,
//! `random`, the paper's H2O half/half) and H2O with each score family,
//! with and without 4 sinks, at three heavy/recent splits
//! ([`candidate_grid`]).
//!
//! **Search.** Successive halving ([`successive_halving`]): every candidate
//! is scored on the first window, the best 1/η go on to η times as many
//! windows, and so on until the survivors have seen all of them (a
//! candidate's windows are never scored twice). Cheap candidates that are
//! clearly bad on one window leave early; the finalists are compared on the
//! whole calibration set.
//!
//! **Held-out text.** Tuning never reads evaluation windows: the tune
//! windows are cut from the calibration text starting at a token offset
//! (default: the second half of its tokens, [`tune_windows`]), and an
//! evaluation on the same file is refused unless its windows (the first K,
//! as `ppl:FILE,seq_len=L,limit=K` takes them) lie entirely before that
//! offset ([`check_disjoint`]).

use crate::error::Result;
use kvslim_cache::policy::Budget;
use kvslim_cache::PolicySpec;
use kvslim_models::Model;
use serde::Serialize;

mod file;
mod grid;
mod halving;
mod score;
#[cfg(test)]
mod tests;
mod windows;

pub use file::{HeldOutRecord, SearchRecord, TuneFile, OBJECTIVE};
pub use grid::{baselines, candidate_grid, Grid, SCORE_FAMILIES};
pub use halving::{planned_evaluations, rung_sizes, successive_halving, CandidateRow};
pub use score::{score_window, ModelScorer, WindowScore, WindowScorer};
pub use windows::{check_disjoint, evaluation_windows, tune_windows, TextWindows};

/// How to tune.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    pub seq_len: usize,
    /// Windows the finalists are scored on.
    pub windows: usize,
    /// Successive halving's η (keep 1/η per rung, η× windows).
    pub eta: usize,
    pub grid: Grid,
}

/// One budget's search.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetSearch {
    pub budget: String,
    pub budget_slots: usize,
    pub candidates: Vec<CandidateRow>,
}

/// Runs the search at `budget` on `windows` (resolved against `seq_len`).
pub fn search_budget(
    budget: Budget,
    cfg: &TuneConfig,
    scorer: &mut dyn WindowScorer,
    progress: impl FnMut(usize, usize),
) -> Result<BudgetSearch> {
    let b = budget.resolve(cfg.seq_len).max(1);
    let cands = candidate_grid(b, cfg.grid);
    let rows = successive_halving(&cands, cfg.windows, cfg.eta, scorer, progress)?;
    Ok(BudgetSearch { budget: budget.to_string(), budget_slots: b, candidates: rows })
}

/// For a quality target: the searches from the smallest budget up, stopping
/// at the first whose winner's KL is at most `max_kl`. Returns every search
/// run and the index of the one that met the target (`None`: none did).
pub fn search_for_target(
    budgets: &[Budget],
    max_kl: f64,
    cfg: &TuneConfig,
    scorer: &mut dyn WindowScorer,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<(Vec<BudgetSearch>, Option<usize>)> {
    let mut sorted: Vec<Budget> = budgets.to_vec();
    sorted.sort_by_key(|b| b.resolve(cfg.seq_len));
    let mut out = Vec::new();
    for b in sorted {
        let label = b.to_string();
        let s = search_budget(b, cfg, scorer, |d, t| progress(&label, d, t))?;
        let met = s.candidates[0].kl <= max_kl;
        out.push(s);
        if met {
            let i = out.len() - 1;
            return Ok((out, Some(i)));
        }
    }
    Ok((out, None))
}

/// One row of a held-out comparison.
#[derive(Clone, Debug, Serialize)]
pub struct HeldOutRow {
    pub label: String,
    pub spec: String,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
}

/// The tuned spec against the baselines at the same B on windows tuning did
/// not see; `progress(done, total)` counts window evaluations.
pub fn held_out(
    model: &Model,
    tuned: &PolicySpec,
    budget_slots: usize,
    eval: &TextWindows,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Vec<HeldOutRow>, f64)> {
    let mut specs = vec![("tuned".to_string(), tuned.clone())];
    specs.extend(baselines(budget_slots));
    let total = specs.len() * eval.windows.len();
    let mut scorer = ModelScorer::new(model, &eval.windows);
    let mut totals = vec![WindowScore::default(); specs.len()];
    let mut done = 0;
    for w in 0..eval.windows.len() {
        for (t, (_, spec)) in totals.iter_mut().zip(&specs) {
            t.add(&scorer.score(spec, w)?);
            done += 1;
            progress(done, total);
        }
    }
    let full_nll = totals[0].full_nll_sum / totals[0].rows as f64;
    let rows = specs
        .into_iter()
        .zip(&totals)
        .map(|((label, spec), t)| HeldOutRow {
            label,
            spec: spec.to_string(),
            kl: t.kl(),
            nll: t.nll(),
            ppl: t.nll().exp(),
            top1_agreement: t.top1_sum / t.rows as f64,
            kv_bytes_allocated: t.kv_bytes_allocated,
        })
        .collect();
    Ok((rows, full_nll))
}
