//! Offline CHAI calibration: run calibration windows dense, collect every
//! head's probe attention feature per layer, and let the clustering module
//! turn them into a plan (error curves, elbow k per layer, static
//! membership).

use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::policy::chai::{CalibrationConfig, Calibrator, ChaiPlan, PlanMeta};
use kvslim_cache::PolicySpec;
use kvslim_models::{Logits, Model, Trace};

/// Calibration settings.
#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    /// Tokens per window whose attention is the head feature (the online
    /// probe length; 5 in the paper).
    pub probe: usize,
    pub config: CalibrationConfig,
    pub model_name: String,
    pub seq_len: usize,
}

/// Cuts an encoded calibration text into at most `samples` windows of
/// `seq_len` tokens, spread evenly over the text; each window is a fresh
/// sequence led by `bos` (the tokenizer's BOS when it adds one, which is
/// then also stripped from the head of `ids`). Fewer windows come back when
/// the text holds fewer.
pub fn calibration_windows(ids: &[u32], bos: Option<u32>, samples: usize, seq_len: usize) -> Result<Vec<Vec<u32>>> {
    if seq_len == 0 {
        return Err(EngineError::Request("the calibration window length must be at least 1".into()));
    }
    let lead: Vec<u32> = bos.into_iter().collect();
    let body = &ids[usize::from(bos.is_some() && ids.first() == bos.as_ref())..];
    let available = body.len() / seq_len;
    if available == 0 {
        return Err(EngineError::Request(format!(
            "the text has {} tokens, fewer than one window of {seq_len}",
            body.len()
        )));
    }
    let n = samples.min(available).max(1);
    Ok((0..n)
        .map(|i| {
            let start = i * available / n * seq_len;
            lead.iter().chain(&body[start..start + seq_len]).copied().collect()
        })
        .collect())
}

/// Runs the first `probe` tokens of every window dense and builds the plan.
/// The feature of a head is its causal attention over the probe (the
/// lower triangle), exactly what online CHAI clusters on.
pub fn calibrate(
    model: &Model,
    windows: &[Vec<u32>],
    opts: &CalibrateOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ChaiPlan> {
    let c = &model.config;
    let p = opts.probe;
    if p < 2 {
        return Err(EngineError::Request("the probe needs at least 2 tokens".into()));
    }
    let usable: Vec<&Vec<u32>> = windows.iter().filter(|w| w.len() >= p).collect();
    if usable.is_empty() {
        return Err(EngineError::Request(format!("no calibration window has the {p} tokens the probe needs")));
    }
    let mut cal = Calibrator::new(c.n_layers, c.n_heads, opts.config.clone());
    for (i, w) in usable.iter().enumerate() {
        let mut s = Session::new(model, &PolicySpec::full(), p, p)?;
        s.scratch.trace = Some(Trace::default());
        s.feed(&w[..p], Logits::None)?;
        let trace = s.scratch.trace.take().expect("set above");
        for (l, attn) in trace.attn.iter().enumerate() {
            // attn is [heads, p, ctx = p]
            let feats: Vec<Vec<f32>> = (0..c.n_heads)
                .map(|h| kvslim_cache::policy::chai::probe_feature_strided(&attn[h * p * p..(h + 1) * p * p], p, p))
                .collect();
            cal.add_window(l, &feats).map_err(EngineError::Request)?;
        }
        progress(i + 1, usable.len());
    }
    cal.finish(PlanMeta { model: opts.model_name.clone(), probe: p, samples: usable.len(), seq_len: opts.seq_len })
        .map_err(EngineError::Request)
}

#[cfg(test)]
mod tests {
    use super::calibration_windows;

    #[test]
    fn windows_are_spread_and_led_by_bos() {
        let ids: Vec<u32> = std::iter::once(1).chain(100..120).collect();
        let w = calibration_windows(&ids, Some(1), 2, 5).unwrap();
        assert_eq!(w, vec![vec![1, 100, 101, 102, 103, 104], vec![1, 110, 111, 112, 113, 114]]);
        // no BOS: the text starts at once; fewer windows than asked when it is short
        let w = calibration_windows(&ids[1..], None, 9, 8).unwrap();
        assert_eq!(w, vec![(100..108).collect::<Vec<u32>>(), (108..116).collect()]);
        assert!(calibration_windows(&ids, Some(1), 4, 21).is_err());
        assert!(calibration_windows(&ids, None, 4, 0).is_err());
    }
}
