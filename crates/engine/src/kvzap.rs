//! KVzap-style calibration (`kvslim calibrate --kvzap`): training pairs
//! from KVzip-style prefills that evict nothing, then per (layer, KV head)
//! a closed-form ridge regression of ln(KVzip score + ε) on the layer's
//! normalised input hidden state, in f64 (normal equations, Cholesky).
//! The ridge strength is picked per unit on held-out windows; the fit
//! quality on them goes into the file. Deterministic: the same model and
//! windows give the same bytes.

use crate::calibrate::{calibration_windows, second_half_start};
use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::policy::spec::KVZIP_CHUNK;
use kvslim_cache::PolicySpec;
use kvslim_models::kvzap::{KvzapMeta, KvzapPredictor, KVZAP_KIND};
use kvslim_models::{Logits, Model};
use rayon::prelude::*;

/// The target's ε: ln(score + ε), so a score of 0 is finite.
pub const KVZAP_EPS: f64 = 1e-6;

/// Ridge strengths tried, as multiples of the mean diagonal of the
/// features' Gram matrix; each unit keeps the one with the lowest held-out
/// squared error. It reaches 10: with 10⁻¹ as its largest, most of the
/// 0.5B's units chose the largest.
pub const RIDGE_GRID: [f64; 7] = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// One window's training pairs.
#[derive(Clone, Debug)]
pub struct Pairs {
    /// Tokens in the window.
    pub n: usize,
    /// Per layer, the normalised input hidden states `[n, hidden]`.
    pub hidden: Vec<Vec<f32>>,
    /// Per layer, per KV head, each token's KVzip score `[n]`, by position.
    pub scores: Vec<Vec<Vec<f32>>>,
}

impl Pairs {
    /// The pairs as raw little-endian f32, for fitting other predictors
    /// offline (`calibrate --kvzap --dump-pairs`): per layer the hidden
    /// states `[n, hidden]`, then per layer and KV head the scores `[n]`.
    pub fn write_raw(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut put = |v: &[f32]| -> std::io::Result<()> {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            out.write_all(&bytes)
        };
        for h in &self.hidden {
            put(h)?;
        }
        for layer in &self.scores {
            for head in layer {
                put(head)?;
            }
        }
        Ok(())
    }
}

/// Runs `window` under the KVzip-style prefill with room for every token
/// (`h2o:heavy=n,recent=1,prefill=kvzip`: nothing is evicted, so every
/// token keeps the score the repeat probe gave it) and records each layer's
/// normalised hidden states with each token's score per KV head.
pub fn collect_pairs(model: &Model, window: &[u32]) -> Result<Pairs> {
    let n = window.len();
    if n < 2 {
        return Err(EngineError::Request("a KVzap calibration window needs at least 2 tokens".into()));
    }
    let spec = PolicySpec::parse(&format!("h2o:heavy={n},recent=1,prefill=kvzip"))
        .map_err(|e| EngineError::Request(e.to_string()))?;
    let mut s = Session::new(model, &spec, n, n)?;
    s.scratch.hidden_tap = Some(Vec::new());
    s.feed(window, Logits::None)?;
    let hidden = s.scratch.hidden_tap.take().unwrap_or_default();
    let c = &model.config;
    if hidden.len() != c.n_layers {
        return Err(EngineError::Request(format!("recorded {} layers of {}", hidden.len(), c.n_layers)));
    }
    let store = s.cache.store();
    let mut scores = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let mut per_head = Vec::with_capacity(c.n_kv_heads);
        for kv in 0..c.n_kv_heads {
            let head = store.head(l, kv);
            if head.len() != n {
                return Err(EngineError::Request(format!("layer {l} KV head {kv} kept {} of {n} tokens", head.len())));
            }
            let mut by_pos = vec![0f32; n];
            for (&p, &sc) in head.positions().iter().zip(head.scores()) {
                by_pos[p as usize] = sc;
            }
            per_head.push(by_pos);
        }
        scores.push(per_head);
    }
    Ok(Pairs { n, hidden, scores })
}

/// The calibration windows of several texts (`(label, token ids)`, each as
/// its tokenizer encoded it): `total` windows of `seq_len` tokens shared
/// out evenly, text `t` giving every `texts.len()`-th one from `t` on, each
/// text's own drawn from its second half (the first half stays free for
/// evaluation) and spread over it. One text gives exactly
/// [`calibration_windows`] of its second half. An error names a text too
/// short for its share.
pub fn mixed_windows(
    texts: &[(String, Vec<u32>)],
    bos: Option<u32>,
    total: usize,
    seq_len: usize,
) -> Result<Vec<Vec<u32>>> {
    let k = texts.len();
    if k == 0 {
        return Err(EngineError::Request("no calibration text".into()));
    }
    let mut per_text = Vec::with_capacity(k);
    for (t, (label, ids)) in texts.iter().enumerate() {
        let want = (total + k - 1 - t) / k;
        if want == 0 {
            per_text.push(Vec::new().into_iter());
            continue;
        }
        let windows = calibration_windows(&ids[second_half_start(ids.len())..], bos, want, seq_len)
            .map_err(|e| EngineError::Request(format!("{label}: {e}")))?;
        if windows.len() < want {
            return Err(EngineError::Request(format!(
                "the second half of {label} holds only {} windows of {seq_len} tokens, fewer than the {want} it should give",
                windows.len()
            )));
        }
        per_text.push(windows.into_iter());
    }
    Ok((0..total).filter_map(|i| per_text[i % k].next()).collect())
}

/// The normal equations of one layer: Σ x̃x̃ᵀ (x̃ = [1, x̂], upper triangle)
/// and Σ x̃·y per KV head, y = ln(score + ε).
#[derive(Clone, Debug)]
struct LayerSums {
    p: usize,
    gram: Vec<f64>,
    /// `kv_heads × p`.
    rhs: Vec<f64>,
    rows: usize,
}

impl LayerSums {
    fn new(d: usize, kv_heads: usize) -> Self {
        let p = d + 1;
        LayerSums { p, gram: vec![0.0; p * p], rhs: vec![0.0; kv_heads * p], rows: 0 }
    }

    /// Adds `n` rows: hidden states `x` (`n × d`) and per head `scores`.
    fn add(&mut self, x: &[f32], scores: &[Vec<f32>], n: usize) {
        let p = self.p;
        const BLOCK: usize = 64;
        let mut xb = vec![0f64; BLOCK * p];
        for b0 in (0..n).step_by(BLOCK) {
            let rows = BLOCK.min(n - b0);
            for r in 0..rows {
                let row = &mut xb[r * p..(r + 1) * p];
                row[0] = 1.0;
                row[1..]
                    .iter_mut()
                    .zip(&x[(b0 + r) * (p - 1)..(b0 + r + 1) * (p - 1)])
                    .for_each(|(a, &v)| *a = v as f64);
            }
            for i in 0..p {
                let g = &mut self.gram[i * p + i..(i + 1) * p];
                for r in 0..rows {
                    let row = &xb[r * p..(r + 1) * p];
                    let a = row[i];
                    g.iter_mut().zip(&row[i..]).for_each(|(s, &v)| *s += a * v);
                }
            }
            for (h, sc) in scores.iter().enumerate() {
                let rhs = &mut self.rhs[h * p..(h + 1) * p];
                for r in 0..rows {
                    let y = target(sc[b0 + r]);
                    rhs.iter_mut().zip(&xb[r * p..(r + 1) * p]).for_each(|(s, &v)| *s += y * v);
                }
            }
        }
        self.rows += n;
    }

    /// Ridge solutions for strength `alpha` (times the mean diagonal of the
    /// features' Gram matrix; the bias is not penalised): per KV head, p values.
    fn solve(&self, alpha: f64, kv_heads: usize) -> Result<Vec<Vec<f64>>> {
        let p = self.p;
        let mean_diag = (1..p).map(|i| self.gram[i * p + i]).sum::<f64>() / (p - 1).max(1) as f64;
        let lambda = alpha * mean_diag.max(f64::MIN_POSITIVE);
        // the full symmetric matrix from the upper triangle, plus the ridge
        let mut a = vec![0f64; p * p];
        for i in 0..p {
            for j in i..p {
                a[i * p + j] = self.gram[i * p + j];
                a[j * p + i] = self.gram[i * p + j];
            }
            if i > 0 {
                a[i * p + i] += lambda;
            }
        }
        let l = cholesky(&mut a, p).ok_or_else(|| {
            EngineError::Request("the calibration's normal equations are singular: use more or longer windows".into())
        })?;
        Ok((0..kv_heads).map(|h| cholesky_solve(l, p, &self.rhs[h * p..(h + 1) * p])).collect())
    }
}

fn target(score: f32) -> f64 {
    (score as f64 + KVZAP_EPS).ln()
}

/// In-place Cholesky A = L·Lᵀ (lower triangle of `a`); `None` when A is
/// not positive definite.
fn cholesky(a: &mut [f64], p: usize) -> Option<&[f64]> {
    for j in 0..p {
        let d = a[j * p + j] - a[j * p..j * p + j].iter().map(|x| x * x).sum::<f64>();
        if d <= 0.0 || !d.is_finite() {
            return None;
        }
        let ljj = d.sqrt();
        a[j * p + j] = ljj;
        for i in j + 1..p {
            let s: f64 = a[i * p..i * p + j].iter().zip(&a[j * p..j * p + j]).map(|(x, y)| x * y).sum();
            a[i * p + j] = (a[i * p + j] - s) / ljj;
        }
    }
    Some(a)
}

/// Solves L·Lᵀ·w = b.
fn cholesky_solve(l: &[f64], p: usize, b: &[f64]) -> Vec<f64> {
    let mut y = vec![0f64; p];
    for i in 0..p {
        let s: f64 = (0..i).map(|k| l[i * p + k] * y[k]).sum();
        y[i] = (b[i] - s) / l[i * p + i];
    }
    let mut w = vec![0f64; p];
    for i in (0..p).rev() {
        let s: f64 = (i + 1..p).map(|k| l[k * p + i] * w[k]).sum();
        w[i] = (y[i] - s) / l[i * p + i];
    }
    w
}

/// How the predictor was made, for its header.
#[derive(Clone, Debug)]
pub struct KvzapOptions {
    /// What the windows were cut from (a path, for the header).
    pub text: String,
    pub seq_len: usize,
}

/// The fit's quality on held-out windows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KvzapQuality {
    pub held_out_windows: usize,
    /// Per unit Spearman correlation of predicted and true scores, averaged
    /// over units and windows; and the lowest unit's.
    pub spearman_mean: f64,
    pub spearman_min: f64,
    /// R² of ln(score + ε), averaged over units.
    pub r2_mean: f64,
    /// KVzip's global selection (one threshold over every layer, head and
    /// token) at 12.5% and 25% kept: the share of the true kept set the
    /// predicted scores keep too, averaged over windows.
    pub global_overlap_12_5: f64,
    pub global_overlap_25: f64,
    /// The same per unit (its own top share), averaged over units and windows.
    pub unit_overlap_12_5: f64,
    pub unit_overlap_25: f64,
}

/// Fits the predictor: the normal equations of every `train` window, a
/// ridge solution per unit for each strength of [`RIDGE_GRID`], the one
/// with the lowest squared error on `held_out` kept (the first strength
/// without held-out windows), and its quality there. `progress(done,
/// total)` counts layers solved.
pub fn fit_kvzap(
    model: &Model,
    train: &[Pairs],
    held_out: &[Pairs],
    opts: &KvzapOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<(KvzapPredictor, KvzapQuality)> {
    let c = &model.config;
    let (layers, kvh, d) = (c.n_layers, c.n_kv_heads, c.hidden_size);
    if train.is_empty() {
        return Err(EngineError::Request("no calibration windows to fit on".into()));
    }
    let mut sums: Vec<LayerSums> = (0..layers).map(|_| LayerSums::new(d, kvh)).collect();
    sums.par_iter_mut().enumerate().for_each(|(l, s)| {
        for w in train {
            s.add(&w.hidden[l], &w.scores[l], w.n);
        }
    });
    let p = d + 1;
    let mut weights = vec![0f32; layers * kvh * p];
    let mut ridge = vec![0f64; layers * kvh];
    for (l, s) in sums.iter().enumerate() {
        let solutions: Vec<Vec<Vec<f64>>> =
            RIDGE_GRID.par_iter().map(|&a| s.solve(a, kvh)).collect::<Result<Vec<_>>>()?;
        for h in 0..kvh {
            let err = |w: &[f64]| -> f64 {
                held_out
                    .iter()
                    .map(|pw| {
                        (0..pw.n)
                            .map(|t| {
                                let pred = predict_f64(w, &pw.hidden[l][t * d..(t + 1) * d]);
                                (pred - target(pw.scores[l][h][t])).powi(2)
                            })
                            .sum::<f64>()
                    })
                    .sum()
            };
            let mut best = 0;
            if !held_out.is_empty() {
                let errs: Vec<f64> = solutions.iter().map(|sol| err(&sol[h])).collect();
                for (i, e) in errs.iter().enumerate() {
                    if *e < errs[best] {
                        best = i;
                    }
                }
            }
            ridge[l * kvh + h] = RIDGE_GRID[best];
            let at = (l * kvh + h) * p;
            weights[at..at + p].iter_mut().zip(&solutions[best][h]).for_each(|(o, &v)| *o = v as f32);
        }
        progress(l + 1, layers);
    }
    let tokens: usize = train.iter().map(|w| w.n).sum();
    let mut predictor = KvzapPredictor {
        meta: KvzapMeta {
            kind: KVZAP_KIND.into(),
            model: model.fingerprint(),
            layers,
            kv_heads: kvh,
            hidden: d,
            eps: KVZAP_EPS,
            calibration: serde_json::json!({
                "text": opts.text,
                "windows": train.len(),
                "held_out_windows": held_out.len(),
                "seq_len": opts.seq_len,
                "tokens": tokens,
                "scores": format!("KVzip-style prefill (h2o:heavy=n,recent=1,prefill=kvzip), probe in pieces of {KVZIP_CHUNK} tokens, nothing evicted"),
                "features": "the layer's attention-norm output",
                "ridge_grid": RIDGE_GRID,
                "ridge": ridge,
            }),
            quality: serde_json::Value::Null,
        },
        weights,
    };
    let quality = kvzap_quality(&predictor, held_out);
    predictor.meta.quality = serde_json::to_value(&quality).unwrap_or_default();
    Ok((predictor, quality))
}

fn predict_f64(w: &[f64], x: &[f32]) -> f64 {
    w[1..].iter().zip(x).fold(w[0], |acc, (&a, &v)| acc + a * v as f64)
}

/// Ranks of `v` (average ranks for ties), 0-based.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b)));
    let mut r = vec![0f64; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0;
        (i..=j).for_each(|k| r[idx[k]] = avg);
        i = j + 1;
    }
    r
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        0.0
    } else {
        cov / (va * vb).sqrt()
    }
}

/// The indices of the `k` largest of `v` (ties: the lower index).
fn top(v: &[f64], k: usize) -> Vec<bool> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    let mut keep = vec![false; v.len()];
    idx.iter().take(k).for_each(|&i| keep[i] = true);
    keep
}

fn overlap(truth: &[f64], pred: &[f64], share: f64) -> f64 {
    let k = ((share * truth.len() as f64).floor() as usize).max(1);
    let (t, p) = (top(truth, k), top(pred, k));
    t.iter().zip(&p).filter(|(a, b)| **a && **b).count() as f64 / k as f64
}

/// The quality of `predictor` on `windows` (zeros without any).
pub fn kvzap_quality(predictor: &KvzapPredictor, windows: &[Pairs]) -> KvzapQuality {
    let m = &predictor.meta;
    let (layers, kvh, d) = (m.layers, m.kv_heads, m.hidden);
    let (mut sp, mut sp_min, mut r2, mut units) = (0.0, f64::INFINITY, 0.0, 0usize);
    let (mut g12, mut g25, mut u12, mut u25) = (0.0, 0.0, 0.0, 0.0);
    for w in windows {
        let (mut all_t, mut all_p) = (Vec::new(), Vec::new());
        for l in 0..layers {
            for h in 0..kvh {
                let truth: Vec<f64> = w.scores[l][h].iter().map(|&s| target(s)).collect();
                let pred: Vec<f64> =
                    (0..w.n).map(|t| predictor.predict(l, h, &w.hidden[l][t * d..(t + 1) * d])).collect();
                let s = pearson(&ranks(&truth), &ranks(&pred));
                sp += s;
                sp_min = f64::min(sp_min, s);
                let mt = truth.iter().sum::<f64>() / truth.len() as f64;
                let ss_tot: f64 = truth.iter().map(|y| (y - mt).powi(2)).sum();
                let ss_res: f64 = truth.iter().zip(&pred).map(|(y, p)| (y - p).powi(2)).sum();
                r2 += if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 };
                u12 += overlap(&truth, &pred, 0.125);
                u25 += overlap(&truth, &pred, 0.25);
                units += 1;
                all_t.extend(truth);
                // the policy's score is exp(min(pred, 0)): rank by that
                all_p.extend(pred.iter().map(|p| p.min(0.0)));
            }
        }
        g12 += overlap(&all_t, &all_p, 0.125);
        g25 += overlap(&all_t, &all_p, 0.25);
    }
    let (u, n) = (units.max(1) as f64, windows.len().max(1) as f64);
    let r = |x: f64| (x * 1e4).round() / 1e4;
    KvzapQuality {
        held_out_windows: windows.len(),
        spearman_mean: r(sp / u),
        spearman_min: r(if units == 0 { 0.0 } else { sp_min }),
        r2_mean: r(r2 / u),
        global_overlap_12_5: r(g12 / n),
        global_overlap_25: r(g25 / n),
        unit_overlap_12_5: r(u12 / u),
        unit_overlap_25: r(u25 / u),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_small_system() {
        // A = [[4, 2], [2, 3]], b = [2, 5] → w = [-0.5, 2]
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let l = cholesky(&mut a, 2).unwrap().to_vec();
        let w = cholesky_solve(&l, 2, &[2.0, 5.0]);
        assert!((w[0] + 0.5).abs() < 1e-12 && (w[1] - 2.0).abs() < 1e-12, "{w:?}");
        assert!(cholesky(&mut [0.0, 0.0, 0.0, 0.0], 2).is_none());
    }

    #[test]
    fn mixed_windows_alternate_texts_from_their_second_halves() {
        let a: Vec<u32> = (0..100).collect();
        let b: Vec<u32> = (1000..1060).collect();
        let texts = [("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
        let w = mixed_windows(&texts, None, 5, 10).unwrap();
        assert_eq!(w.len(), 5);
        for (i, win) in w.iter().enumerate() {
            let (src, half) = if i % 2 == 0 { (&a, 50) } else { (&b, 1030) };
            assert!(win.len() == 10 && win.iter().all(|t| src.contains(t) && *t >= half), "window {i}: {win:?}");
        }
        // three from a, two from b, none twice
        let mut all: Vec<u32> = w.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 50);
        // one text: its second half's calibration windows
        let one = mixed_windows(&texts[..1], None, 4, 10).unwrap();
        assert_eq!(one, calibration_windows(&a[50..], None, 4, 10).unwrap());
        // a text too short for its share is named
        let e = mixed_windows(&texts, None, 9, 10).unwrap_err().to_string();
        assert!(e.contains("second half of b") && e.contains("only 3 windows"), "{e}");
    }

    #[test]
    fn raw_pairs_are_hidden_states_then_scores_little_endian() {
        let p = Pairs { n: 2, hidden: vec![vec![1.0, 2.0, 3.0, 4.0]], scores: vec![vec![vec![0.5, 0.25]]] };
        let mut out = Vec::new();
        p.write_raw(&mut out).unwrap();
        let got: Vec<f32> = out.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0, 0.5, 0.25]);
    }

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 2.0]), vec![2.5, 0.0, 2.5, 1.0]);
    }

    #[test]
    fn a_linear_target_is_recovered() {
        // y = ln(score + eps) = 0.5 − 2·x0 + x1 exactly: the fit finds it
        let (d, n) = (2usize, 200usize);
        let mut s = LayerSums::new(d, 1);
        let mut x = Vec::new();
        let mut sc = Vec::new();
        for t in 0..n {
            let (a, b) = ((t % 7) as f32 * 0.3 - 1.0, (t % 11) as f32 * 0.2 - 1.0);
            x.extend([a, b]);
            let y = 0.5 - 2.0 * a as f64 + b as f64 - 3.0;
            sc.push((y.exp() - KVZAP_EPS) as f32);
        }
        s.add(&x, &[sc], n);
        let w = &s.solve(1e-9, 1).unwrap()[0];
        assert!((w[0] + 2.5).abs() < 1e-3 && (w[1] + 2.0).abs() < 1e-3 && (w[2] - 1.0).abs() < 1e-3, "{w:?}");
    }
}
