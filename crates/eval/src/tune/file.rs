//! The file `kvslim tune --out` writes.

use super::{rung_sizes, BudgetSearch, HeldOutRow, TextWindows, TuneConfig};
use kvslim_cache::policy::tuned::TUNE_FILE_KIND;
use serde::Serialize;

/// The file `kvslim tune --out` writes; `tuned:file=PATH` reads its `kind`
/// and `spec` ([`kvslim_cache::policy::tuned`]), the rest is the record of
/// how it was chosen.
#[derive(Clone, Debug, Serialize)]
pub struct TuneFile {
    pub kind: &'static str,
    pub version: u32,
    /// The chosen policy, in the one grammar, for `seq_len`-token sequences.
    pub spec: String,
    pub objective: &'static str,
    pub model: String,
    pub budget: String,
    pub budget_slots: usize,
    pub seq_len: usize,
    pub kl: f64,
    pub nll: f64,
    pub ppl: f64,
    pub top1_agreement: f64,
    pub kv_bytes_allocated: usize,
    pub full_nll: f64,
    pub full_ppl: f64,
    /// `--max-kl`: the target and whether the chosen budget met it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
    pub calibration: TextWindows,
    pub search: SearchRecord,
    /// Every budget searched (one unless `--max-kl`), every candidate.
    pub searches: Vec<BudgetSearch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutRecord>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SearchRecord {
    pub method: &'static str,
    pub eta: usize,
    pub rungs: Vec<usize>,
    pub grid: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct HeldOutRecord {
    pub text: TextWindows,
    pub full_nll: f64,
    pub full_ppl: f64,
    pub rows: Vec<HeldOutRow>,
}

/// The objective, as the file states it.
pub const OBJECTIVE: &str = "mean KL(full||policy) per predicted token over the calibration windows (teacher forced, every token a decode step); ties by NLL";

impl TuneFile {
    /// The record of `search` (whose first candidate is the chosen one).
    pub fn new(
        model: &str,
        cfg: &TuneConfig,
        calibration: TextWindows,
        searches: Vec<BudgetSearch>,
        chosen: usize,
    ) -> Self {
        let s = &searches[chosen];
        let best = &s.candidates[0];
        let full_nll = best.total.full_nll_sum / best.total.rows as f64;
        TuneFile {
            kind: TUNE_FILE_KIND,
            version: 1,
            spec: best.spec.clone(),
            objective: OBJECTIVE,
            model: model.to_string(),
            budget: s.budget.clone(),
            budget_slots: s.budget_slots,
            seq_len: cfg.seq_len,
            kl: best.kl,
            nll: best.nll,
            ppl: best.ppl,
            top1_agreement: best.top1_agreement,
            kv_bytes_allocated: best.kv_bytes_allocated,
            full_nll,
            full_ppl: full_nll.exp(),
            max_kl: None,
            calibration,
            search: SearchRecord {
                method: "successive halving",
                eta: cfg.eta,
                rungs: rung_sizes(cfg.windows, cfg.eta),
                grid: format!("{:?}", cfg.grid).to_lowercase(),
            },
            searches,
            held_out: None,
        }
    }
}
