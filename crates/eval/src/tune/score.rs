//! Scoring a candidate on one window: KL, NLL and top-1 agreement against
//! the full cache, teacher forced.

use crate::error::{EvalError, Result};
use crate::metrics::{kl_divergence, top1_agree};
use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions, Session};
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::{Logits, Model};
use serde::Serialize;

/// What one candidate did on one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WindowScore {
    /// Predicted tokens (window length − 1).
    pub rows: usize,
    /// Sums over those tokens.
    pub nll_sum: f64,
    pub kl_sum: f64,
    pub top1_sum: f64,
    /// The full cache's NLL sum on the same tokens.
    pub full_nll_sum: f64,
    pub kv_bytes_allocated: usize,
}

impl WindowScore {
    pub(super) fn add(&mut self, o: &WindowScore) {
        self.rows += o.rows;
        self.nll_sum += o.nll_sum;
        self.kl_sum += o.kl_sum;
        self.top1_sum += o.top1_sum;
        self.full_nll_sum += o.full_nll_sum;
        self.kv_bytes_allocated = self.kv_bytes_allocated.max(o.kv_bytes_allocated);
    }
    fn mean(&self, sum: f64) -> f64 {
        if self.rows == 0 {
            f64::NAN
        } else {
            sum / self.rows as f64
        }
    }
    pub fn kl(&self) -> f64 {
        self.mean(self.kl_sum)
    }
    pub fn nll(&self) -> f64 {
        self.mean(self.nll_sum)
    }
}

/// Scores a candidate on one calibration window; the search only sees this,
/// so it can be tested without a model.
pub trait WindowScorer {
    fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore>;
}

/// The real scorer: teacher forcing, every token a decode step, against
/// the full cache. The full cache's logits of one window are kept while the
/// search scores every candidate on it (the search goes window by window),
/// so each window's full run happens once, not once per candidate: half the
/// work of [`score_window`], which runs both. Memory: one window's logits,
/// (L − 1) × vocab floats.
pub struct ModelScorer<'a> {
    model: &'a Model,
    windows: &'a [Vec<u32>],
    full: Option<FullWindow>,
}

/// The full cache's logits (one row per predicted token) on one window.
struct FullWindow {
    window: usize,
    logits: Vec<f32>,
    nll_sum: f64,
}

impl<'a> ModelScorer<'a> {
    pub fn new(model: &'a Model, windows: &'a [Vec<u32>]) -> Self {
        ModelScorer { model, windows, full: None }
    }

    fn full(&mut self, window: usize) -> Result<&FullWindow> {
        if self.full.as_ref().is_none_or(|f| f.window != window) {
            self.full = None;
            let ids = &self.windows[window];
            let v = self.model.config.vocab_size;
            let mut s = Session::new(self.model, &PolicySpec::full(), ids.len(), ids.len())?;
            let mut logits = Vec::with_capacity((ids.len() - 1) * v);
            let mut nll_sum = 0.0;
            for i in 0..ids.len() - 1 {
                let row = s.feed(&ids[i..=i], Logits::Last)?;
                nll_sum -= log_softmax_at(row, ids[i + 1] as usize);
                logits.extend_from_slice(row);
            }
            self.full = Some(FullWindow { window, logits, nll_sum });
        }
        Ok(self.full.as_ref().expect("set above"))
    }
}

impl WindowScorer for ModelScorer<'_> {
    fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore> {
        let (model, ids) = (self.model, &self.windows[window]);
        check_window(model, ids)?;
        let v = model.config.vocab_size;
        let full = self.full(window)?;
        let mut s = Session::new(model, spec, ids.len(), ids.len())?;
        let rows = ids.len() - 1;
        let mut out = WindowScore { rows, full_nll_sum: full.nll_sum, ..WindowScore::default() };
        for i in 0..rows {
            let row = s.feed(&ids[i..=i], Logits::Last)?;
            let f = &full.logits[i * v..(i + 1) * v];
            out.nll_sum -= log_softmax_at(row, ids[i + 1] as usize);
            out.kl_sum += kl_divergence(f, row);
            out.top1_sum += f64::from(u8::from(top1_agree(f, row)));
        }
        out.kv_bytes_allocated = s.kv_bytes().kv;
        Ok(out)
    }
}

/// What the engine's perplexity checks before it runs, for windows scored
/// here directly: at least 2 tokens, within the model's context and vocab.
fn check_window(model: &Model, ids: &[u32]) -> Result<()> {
    let c = &model.config;
    if ids.len() < 2 || ids.len() > c.context_len {
        return Err(EvalError::Request(format!(
            "tune: a window of {} tokens does not fit: needs 2..={} (the model's context)",
            ids.len(),
            c.context_len
        )));
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
        return Err(kvslim_models::Error::TokenOutOfRange { id, vocab: c.vocab_size }.into());
    }
    Ok(())
}

/// One teacher-forced run of `spec` on `ids`, compared with the full cache.
pub fn score_window(model: &Model, spec: &PolicySpec, ids: &[u32]) -> Result<WindowScore> {
    let opts = PerplexityOptions { compare_full: true, ..PerplexityOptions::new(spec.clone()) };
    let r = perplexity(model, ids, &opts, |_, _| {})?;
    let c = r.compare_full.as_ref().expect("compare_full was asked for");
    let rows = r.tokens.saturating_sub(1);
    let n = rows as f64;
    Ok(WindowScore {
        rows,
        nll_sum: r.nll * n,
        kl_sum: c.kl_mean * n,
        top1_sum: c.top1_agreement * n,
        full_nll_sum: c.full_nll * n,
        kv_bytes_allocated: r.kv_bytes_allocated,
    })
}
