//! Successive halving over the candidates, window by window.

use super::{WindowScore, WindowScorer};
use crate::error::{EvalError, Result};
use kvslim_cache::PolicySpec;
use serde::Serialize;

/// A candidate after the search: how far it got and what it measured on
/// the windows it saw.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRow {
    pub spec: String,
    /// Windows it was scored on (the last rung it reached).
    pub windows: usize,
    /// 1-based rank: finalists first by KL, then those that left earlier
    /// (later rung first, then KL).
    pub rank: usize,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
    #[serde(skip)]
    pub total: WindowScore,
}

/// The windows each rung scores: 1, η, η², … capped at `n`, ending at `n`.
pub fn rung_sizes(n: usize, eta: usize) -> Vec<usize> {
    let eta = eta.max(2);
    let mut out = Vec::new();
    let mut w = 1;
    while out.last() != Some(&n) && n > 0 {
        out.push(w.min(n));
        w = w.saturating_mul(eta);
    }
    out
}

/// How many candidates each rung keeps: all of them on the first, then ⌈k/η⌉.
pub(super) fn survivors(candidates: usize, rungs: usize, eta: usize) -> Vec<usize> {
    let mut k = candidates;
    let mut out = Vec::with_capacity(rungs);
    for r in 0..rungs {
        if r > 0 {
            k = k.div_ceil(eta.max(2)).max(1);
        }
        out.push(k);
    }
    out
}

/// Window evaluations the whole search will run (for a progress bar).
pub fn planned_evaluations(candidates: usize, n_windows: usize, eta: usize) -> usize {
    let sizes = rung_sizes(n_windows, eta);
    let keep = survivors(candidates, sizes.len(), eta);
    let mut prev = 0;
    sizes
        .iter()
        .zip(&keep)
        .map(|(&w, &k)| {
            let new = (w - prev) * k;
            prev = w;
            new
        })
        .sum()
}

/// KL, then NLL, then grid order: a total order for ranking.
fn by_objective(a: &(usize, WindowScore), b: &(usize, WindowScore)) -> std::cmp::Ordering {
    a.1.kl().total_cmp(&b.1.kl()).then(a.1.nll().total_cmp(&b.1.nll())).then(a.0.cmp(&b.0))
}

/// Successive halving over `candidates` on `n_windows` windows (see the
/// module docs); `progress(done, total)` counts window evaluations. Rows
/// come back ranked, the winner first.
pub fn successive_halving(
    candidates: &[PolicySpec],
    n_windows: usize,
    eta: usize,
    scorer: &mut dyn WindowScorer,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<CandidateRow>> {
    if candidates.is_empty() || n_windows == 0 {
        return Err(EvalError::Request("tune: nothing to search (no candidates or no windows)".into()));
    }
    let sizes = rung_sizes(n_windows, eta);
    let keep = survivors(candidates.len(), sizes.len(), eta);
    let total_evals = planned_evaluations(candidates.len(), n_windows, eta);
    let mut totals = vec![WindowScore::default(); candidates.len()];
    let mut seen = vec![0usize; candidates.len()];
    let mut reached = vec![0usize; candidates.len()];
    let mut alive: Vec<usize> = (0..candidates.len()).collect();
    let mut done = 0;
    progress(0, total_evals);
    for (rung, (&w, &k)) in sizes.iter().zip(&keep).enumerate() {
        // the best k of the previous rung go on
        if alive.len() > k {
            let mut ranked: Vec<(usize, WindowScore)> = alive.iter().map(|&i| (i, totals[i])).collect();
            ranked.sort_by(by_objective);
            alive = ranked.into_iter().take(k).map(|(i, _)| i).collect();
            alive.sort_unstable();
        }
        // window by window, so a scorer can keep one window's reference
        // run for all candidates (every survivor has seen the same windows)
        let from = alive.iter().map(|&i| seen[i]).min().unwrap_or(w);
        for win in from..w {
            for &i in &alive {
                if seen[i] <= win {
                    totals[i].add(&scorer.score(&candidates[i], win)?);
                    done += 1;
                    progress(done, total_evals);
                }
            }
        }
        for &i in &alive {
            seen[i] = w;
            reached[i] = rung;
        }
    }
    let mut order: Vec<(usize, WindowScore)> = (0..candidates.len()).map(|i| (i, totals[i])).collect();
    order.sort_by(|a, b| reached[b.0].cmp(&reached[a.0]).then(by_objective(a, b)));
    Ok(order
        .into_iter()
        .enumerate()
        .map(|(rank, (i, t))| CandidateRow {
            spec: candidates[i].to_string(),
            windows: seen[i],
            rank: rank + 1,
            kl: t.kl(),
            nll: t.nll(),
            ppl: t.nll().exp(),
            top1_agreement: if t.rows == 0 { f64::NAN } else { t.top1_sum / t.rows as f64 },
            kv_bytes_allocated: t.kv_bytes_allocated,
            total: t,
        })
        .collect())
}
