//! Offline CHAI calibration: run calibration windows dense, collect every
//! head's probe attention feature per layer, and let the clustering module
//! turn them into a plan (error curves, elbow k per layer, static
//! membership).

use crate::session::Session;
use crate::{EngineError, Result, Setting};
use kvslim_cache::policy::chai::{
    cluster_by_kv_groups, CalibrationConfig, Calibrator, ChaiPlan, HeadSharingSpec, LayerPlan, PlanMeta, QualityRecord,
    RepRule,
};
use kvslim_cache::PolicySpec;
use kvslim_models::{Logits, Model, Trace};
use std::sync::Arc;

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

/// The text tokens of `ids` as a tokenizer encoded them: without `bos`
/// (the tokenizer's prepended BOS) at their head.
pub fn text_tokens(ids: &[u32], bos: Option<u32>) -> &[u32] {
    &ids[usize::from(bos.is_some() && ids.first() == bos.as_ref())..]
}

/// Where the second half of `n` text tokens (a prepended BOS not counted:
/// [`text_tokens`]) starts. Calibration reads from there (`kvslim tune`'s windows by default, `kvslim calibrate --max-kl`'s
/// quality windows), so the first half stays free for evaluation, which
/// reads from token 0.
pub fn second_half_start(n: usize) -> usize {
    n / 2
}

/// A window: `bos`, if any, then `part`.
fn window(bos: Option<u32>, part: &[u32]) -> Vec<u32> {
    let mut w = Vec::with_capacity(part.len() + 1);
    w.extend(bos);
    w.extend_from_slice(part);
    w
}

/// Cuts `body` (text tokens, no BOS) into consecutive windows of `seq_len`
/// tokens from its start, as evaluation's `ppl:` task and `kvslim tune`
/// read them; with `bos`, each window is BOS + `seq_len − 1` body tokens,
/// so every window starts like a document. Only full windows are
/// returned, except that a body too short for one gives a single shorter
/// window (when it holds at least 2 tokens with BOS). At most
/// `max_windows` windows.
pub fn token_windows(body: &[u32], seq_len: usize, bos: Option<u32>, max_windows: Option<usize>) -> Vec<Vec<u32>> {
    let per = seq_len.max(2) - usize::from(bos.is_some());
    let mut out: Vec<Vec<u32>> =
        body.chunks_exact(per).take(max_windows.unwrap_or(usize::MAX)).map(|p| window(bos, p)).collect();
    if out.is_empty() && max_windows != Some(0) {
        let w = window(bos, body);
        if w.len() >= 2 {
            out.push(w);
        }
    }
    out
}

/// Cuts an encoded calibration text into at most `samples` windows of
/// `seq_len` tokens, spread evenly over the text. `seq_len` counts the BOS,
/// as every window length does (`kvslim tune`, evaluation's
/// `ppl:FILE,seq_len=L`, the model's context): each window is a fresh
/// sequence, `bos` (the tokenizer's prepended BOS, then also stripped from
/// the head of `ids`) and `seq_len − 1` text tokens, or `seq_len` text
/// tokens without one. Fewer windows come back when the text holds fewer.
pub fn calibration_windows(ids: &[u32], bos: Option<u32>, samples: usize, seq_len: usize) -> Result<Vec<Vec<u32>>> {
    let lead = usize::from(bos.is_some());
    let per = seq_len.saturating_sub(lead);
    if per == 0 {
        return Err(EngineError::Request(format!(
            "the calibration window length must be at least {} (BOS included)",
            lead + 1
        )));
    }
    let body = text_tokens(ids, bos);
    let available = body.len() / per;
    if available == 0 {
        return Err(EngineError::Request(format!(
            "the text has {} tokens, fewer than one window of {seq_len} (BOS included)",
            body.len()
        )));
    }
    let n = samples.min(available).max(1);
    Ok((0..n)
        .map(|i| {
            let start = i * available / n * per;
            window(bos, &body[start..start + per])
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
    progress: impl FnMut(usize, usize),
) -> Result<ChaiPlan> {
    Ok(probe_features(model, windows, opts, progress)?.1)
}

/// [`calibrate`], also returning the accumulated features (mean probe
/// feature per head, for [`calibrate_quality`]'s static membership).
pub fn probe_features(
    model: &Model,
    windows: &[Vec<u32>],
    opts: &CalibrateOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Calibrator, ChaiPlan)> {
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
    let plan = cal
        .finish(PlanMeta { model: opts.model_name.clone(), probe: p, samples: usable.len(), seq_len: opts.seq_len })
        .map_err(EngineError::Request)?;
    Ok((cal, plan))
}

/// Chooses every layer's GQA-aware sharing (`kv_keep`, how many KV heads
/// keep K) by measured quality instead of the elbow (issue: CHAI that keeps
/// quality). Each layer is shared alone at every `kv_keep` and its
/// KL(full‖shared) measured on `windows` (teacher forcing, one prefill
/// each); then KV heads are freed in order of least KL per freed head
/// while the summed single-layer KLs stay within `max_kl`, and the combined
/// plan is measured: when interactions push it over the budget, the longest
/// prefix of that order that measures within it is kept (and when they
/// leave room, a longer one). Layers where sharing costs too much stay
/// dense. One plan per budget in `max_kls`, all from one set of single-layer
/// measurements. The static membership of shared layers comes from the
/// mean probe features in `cal`.
///
/// `progress(done, total)` counts measured plans.
pub fn calibrate_quality(
    model: &Model,
    cal: &Calibrator,
    mut plan: ChaiPlan,
    windows: &[Vec<u32>],
    max_kls: &[f64],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<ChaiPlan>> {
    let c = &model.config;
    let (n_layers, n_heads, n_kv) = (c.n_layers, c.n_heads, c.n_kv_heads);
    if let Some(bad) = max_kls.iter().find(|k| !(k.is_finite() && **k >= 0.0)) {
        return Err(EngineError::setting(
            Setting::MaxKl,
            "",
            format!(" must be a finite non-negative number, got {bad}"),
        ));
    }
    if n_kv < 2 {
        return Err(EngineError::Request(format!(
            "the model has {n_kv} KV head per layer: sharing scores cannot free any K (every layer keeps its one KV head)"
        )));
    }
    if windows.is_empty() || windows.iter().any(|w| w.len() < plan.probe + 1) {
        return Err(EngineError::Request(format!(
            "quality calibration needs windows longer than the {}-token probe",
            plan.probe
        )));
    }
    let group = n_heads / n_kv;
    plan.group = group;
    // every layer dense to start from (the elbow's error curves stay as a record)
    for lp in &mut plan.layers {
        (lp.k, lp.kv_keep, lp.static_clusters, lp.static_representatives) =
            (n_heads, None, (0..n_heads).map(|h| vec![h]).collect(), Vec::new());
    }
    let full: Vec<Vec<f32>> = windows
        .iter()
        .map(|w| Ok(Session::new(model, &PolicySpec::full(), w.len(), w.len())?.feed(w, Logits::All)?.to_vec()))
        .collect::<Result<_>>()?;
    let total = n_layers * (n_kv - 1) + 8 * max_kls.len();
    let mut done = 0;
    let mut measure = |p: &ChaiPlan| -> Result<f64> {
        let r = mean_kl(model, p, windows, &full);
        done += 1;
        progress(done.min(total), total);
        r
    };
    // KL of every layer alone at every kv_keep (index keep − 1; dense = 0)
    let mut single = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let mut kls = Vec::with_capacity(n_kv - 1);
        for keep in 1..n_kv {
            let mut p = plan.clone();
            share_layer(&mut p.layers[l], keep, group, cal, l);
            kls.push(measure(&p)?);
        }
        plan.layers[l].kl_by_kv_keep = kls.clone();
        single.push(kls);
    }
    // greedy order: the next step is the layer move with the least KL per freed KV head
    let kl_at = |l: usize, keep: usize| if keep >= n_kv { 0.0 } else { single[l][keep - 1] };
    let mut keep_now = vec![n_kv; n_layers];
    let mut order: Vec<(usize, usize, f64)> = Vec::new(); // (layer, keep, predicted KL after the step)
    let mut predicted = 0.0;
    loop {
        let mut best: Option<(f64, usize, usize)> = None;
        for (l, &cur) in keep_now.iter().enumerate() {
            for keep in 1..cur {
                let rate = (kl_at(l, keep) - kl_at(l, cur)) / (cur - keep) as f64;
                if best.is_none_or(|b| rate < b.0) {
                    best = Some((rate, l, keep));
                }
            }
        }
        let Some((_, l, keep)) = best else { break };
        predicted += kl_at(l, keep) - kl_at(l, keep_now[l]);
        keep_now[l] = keep;
        order.push((l, keep, predicted));
    }
    let plan_of = |steps: usize| {
        let mut p = plan.clone();
        for &(l, keep, _) in &order[..steps] {
            share_layer(&mut p.layers[l], keep, group, cal, l);
        }
        p
    };
    let mut plans = Vec::with_capacity(max_kls.len());
    for &max_kl in max_kls {
        // the longest prefix of the order whose combined plan measures
        // within the budget (taken as monotone in the prefix): start where
        // the summed single-layer KLs reach the budget, grow by doubling
        // while it holds, then bisect between the last prefix within and
        // the first over (`over`)
        let (mut lo, mut measured, mut over) = (0, 0.0, order.len() + 1);
        let mut next = order.iter().take_while(|s| s.2 <= max_kl).count().max(1).min(order.len());
        while next > lo && next < over {
            let m = measure(&plan_of(next))?;
            if m <= max_kl {
                (lo, measured) = (next, m);
                next = if over > order.len() { (2 * next).min(order.len()) } else { (lo + over) / 2 };
            } else {
                over = next;
                next = (lo + over) / 2;
            }
        }
        let mut chosen = plan_of(lo);
        chosen.quality = Some(QualityRecord {
            max_kl,
            measured_kl: measured,
            predicted_kl: order[..lo].last().map_or(0.0, |s| s.2),
            kv_heads_freed: chosen.layers.iter().map(|lp| n_kv - lp.kv_keep.unwrap_or(n_kv)).sum(),
            windows: windows.len(),
            seq_len: windows.iter().map(Vec::len).max().unwrap_or(0),
        });
        plans.push(chosen);
    }
    progress(total, total);
    Ok(plans)
}

/// Sets layer `l` to GQA-aware sharing with `keep` KV heads; its static
/// membership is that sharing applied to the mean calibration features.
fn share_layer(lp: &mut LayerPlan, keep: usize, group: usize, cal: &Calibrator, l: usize) {
    let hc = cluster_by_kv_groups(&cal.layer(l).mean_features(), group, keep);
    lp.k = hc.k();
    lp.kv_keep = Some(keep);
    lp.static_clusters = hc.clusters;
    lp.static_representatives = hc.representatives;
}

/// Mean KL(full‖plan) per predicted token over `windows` (teacher forcing,
/// one prefill each; `full` holds the full cache's logits per window).
fn mean_kl(model: &Model, plan: &ChaiPlan, windows: &[Vec<u32>], full: &[Vec<f32>]) -> Result<f64> {
    let v = model.config.vocab_size;
    let mut spec = PolicySpec::full();
    spec.head = Some(HeadSharingSpec {
        plan_path: "(calibration)".into(),
        plan: Some(Arc::new(plan.clone())),
        probe: plan.probe,
        rep: RepRule::First,
        fixed: false,
        drift: None,
    });
    let (mut sum, mut rows) = (0.0, 0usize);
    for (w, f) in windows.iter().zip(full) {
        let mut s = Session::new(model, &spec, w.len(), w.len())?;
        let logits = s.feed(w, Logits::All)?;
        // the last position predicts nothing in the window
        for r in 0..w.len() - 1 {
            sum += kvslim_kernels::ops::kl_divergence(&f[r * v..(r + 1) * v], &logits[r * v..(r + 1) * v]);
            rows += 1;
        }
    }
    Ok(sum / rows.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::calibration_windows;

    #[test]
    fn windows_are_spread_led_by_bos_and_count_it() {
        let ids: Vec<u32> = std::iter::once(1).chain(100..120).collect();
        let w = calibration_windows(&ids, Some(1), 2, 6).unwrap();
        assert_eq!(w, vec![vec![1, 100, 101, 102, 103, 104], vec![1, 110, 111, 112, 113, 114]]);
        // no BOS: the text starts at once; fewer windows than asked when it is short
        let w = calibration_windows(&ids[1..], None, 9, 8).unwrap();
        assert_eq!(w, vec![(100..108).collect::<Vec<u32>>(), (108..116).collect()]);
        assert!(calibration_windows(&ids, Some(1), 4, 22).is_err());
        assert!(calibration_windows(&ids, None, 4, 0).is_err());
        assert!(calibration_windows(&ids, Some(1), 4, 1).is_err(), "a BOS alone is no window");
    }
}
