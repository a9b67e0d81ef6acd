//! Offline calibration (docs/policies.md §2): accumulate per-window head features, build
//! each layer's K-means error curve, choose k at the elbow and fix the
//! `chai-static` membership.
//!
//! Choices, so the offline and online steps agree:
//! - Feature: per window and head, the same lower-triangle probe feature as
//!   the online step ([`super::online::probe_feature`] over the window's
//!   first `probe` tokens). A longer probe works too (any fixed length per
//!   layer); record it in the plan's `probe` and use the same online.
//! - Error curve: for every window, K-means over the layer's H head features
//!   for k = 1..=max_k (raw probabilities, Euclidean, as CHAI's reference
//!   script); E(k) is the mean of the windows' best inertias (the reference
//!   sums over samples; the mean has the same elbow and does not grow with
//!   the sample count).
//! - k: the elbow of E ([`super::elbow::choose_elbow`]), limited to `max_k`;
//!   the first `dense_layers` layers are forced to k = H.
//! - Static membership: average linkage on the cosine distances between the
//!   heads' MEAN features over all windows, cut into k clusters — the same
//!   clustering the online step applies to one request's probe, only on
//!   calibration data, so `chai-static` differs from `chai` in where the
//!   membership comes from and nothing else.
//!
//! Deterministic: K-means seeds derive from (config seed, layer, window
//! index), so the same windows in the same order give the same plan.

use super::elbow::{choose_elbow, ELBOW_RULE};
use super::kmeans::{derive_seed, kmeans};
use super::linkage::{average_linkage, clusters_from_labels, cosine_distances};
use super::plan::{ChaiPlan, LayerPlan, FEATURE_PROBE_LOWER_TRIANGLE};

/// Knobs of the offline step.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationConfig {
    /// Largest k searched (0 or ≥ H → H).
    pub max_k: usize,
    /// The first N layers are left dense (k = H): early layers are usually
    /// the most sensitive to head sharing.
    pub dense_layers: usize,
    /// K-means restarts per (window, k).
    pub restarts: usize,
    /// Base seed of every K-means run.
    pub seed: u64,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig { max_k: 0, dense_layers: 0, restarts: 10, seed: 0 }
    }
}

/// Running sums for one layer: error curve and per-head feature sums.
#[derive(Clone, Debug)]
pub struct LayerAccumulator {
    layer: usize,
    n_heads: usize,
    max_k: usize,
    restarts: usize,
    seed: u64,
    feat_len: Option<usize>,
    windows: usize,
    error_sum: Vec<f64>,
    feature_sum: Vec<Vec<f64>>,
}

impl LayerAccumulator {
    /// An empty accumulator for layer `layer` with `n_heads` heads.
    pub fn new(layer: usize, n_heads: usize, cfg: &CalibrationConfig) -> Self {
        let max_k = if cfg.max_k == 0 { n_heads } else { cfg.max_k.min(n_heads) };
        LayerAccumulator {
            layer,
            n_heads,
            max_k,
            restarts: cfg.restarts.max(1),
            seed: derive_seed(cfg.seed, layer as u64),
            feat_len: None,
            windows: 0,
            error_sum: vec![0.0; max_k],
            feature_sum: vec![Vec::new(); n_heads],
        }
    }

    /// Adds one calibration window: one feature row per head, all of the
    /// same length across heads and windows.
    pub fn add_window(&mut self, features: &[Vec<f32>]) -> Result<(), String> {
        let l = self.layer;
        if features.len() != self.n_heads {
            return Err(format!("layer {l}: {} head features, expected {}", features.len(), self.n_heads));
        }
        let len = features.first().map_or(0, Vec::len);
        if len == 0 {
            return Err(format!("layer {l}: empty head feature"));
        }
        if let Some(h) = features.iter().position(|f| f.len() != len) {
            return Err(format!("layer {l}: head {h} feature has {} values, head 0 has {len}", features[h].len()));
        }
        if let Some(expect) = self.feat_len {
            if expect != len {
                return Err(format!("layer {l}: feature length {len}, earlier windows had {expect}"));
            }
        }
        if features.iter().flatten().any(|v| !v.is_finite()) {
            return Err(format!("layer {l}: non-finite feature value"));
        }
        self.feat_len = Some(len);
        let seed = derive_seed(self.seed, self.windows as u64);
        for k in 1..=self.max_k {
            let (_, inertia) = kmeans(features, k, self.restarts, derive_seed(seed, k as u64));
            self.error_sum[k - 1] += inertia;
        }
        for (sum, f) in self.feature_sum.iter_mut().zip(features) {
            if sum.is_empty() {
                sum.resize(len, 0.0);
            }
            sum.iter_mut().zip(f).for_each(|(s, &v)| *s += f64::from(v));
        }
        self.windows += 1;
        Ok(())
    }

    /// Windows added so far.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// Mean error curve E(k), k = 1..=max_k (empty before any window).
    pub fn errors(&self) -> Vec<f64> {
        if self.windows == 0 {
            return Vec::new();
        }
        self.error_sum.iter().map(|s| s / self.windows as f64).collect()
    }

    /// Mean feature per head over the windows.
    pub fn mean_features(&self) -> Vec<Vec<f32>> {
        let w = self.windows.max(1) as f64;
        self.feature_sum.iter().map(|s| s.iter().map(|&v| (v / w) as f32).collect()).collect()
    }

    /// The layer's plan: k (elbow, or H for a dense layer), the curve, the
    /// elbow's own pick and the static membership. Errs without windows.
    pub fn finish(&self, dense: bool) -> Result<LayerPlan, String> {
        if self.windows == 0 {
            return Err(format!("layer {}: no calibration windows", self.layer));
        }
        let errors = self.errors();
        let elbow_k = choose_elbow(&errors);
        let k = if dense { self.n_heads } else { elbow_k };
        let dist = cosine_distances(&self.mean_features());
        let static_clusters = clusters_from_labels(&average_linkage(&dist, k));
        Ok(LayerPlan { k, errors, elbow_k: Some(elbow_k), static_clusters, ..LayerPlan::default() })
    }
}

/// What the plan records about the calibration run besides the curves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanMeta {
    pub model: String,
    pub probe: usize,
    pub samples: usize,
    pub seq_len: usize,
}

/// Accumulators for every layer of a model.
#[derive(Clone, Debug)]
pub struct Calibrator {
    cfg: CalibrationConfig,
    n_heads: usize,
    layers: Vec<LayerAccumulator>,
}

impl Calibrator {
    /// Empty accumulators for `n_layers` layers of `n_heads` heads.
    pub fn new(n_layers: usize, n_heads: usize, cfg: CalibrationConfig) -> Self {
        let layers = (0..n_layers).map(|l| LayerAccumulator::new(l, n_heads, &cfg)).collect();
        Calibrator { cfg, n_heads, layers }
    }

    /// Adds one window's head features for `layer`.
    pub fn add_window(&mut self, layer: usize, features: &[Vec<f32>]) -> Result<(), String> {
        let n = self.layers.len();
        self.layers
            .get_mut(layer)
            .ok_or_else(|| format!("layer {layer} out of range (model has {n})"))?
            .add_window(features)
    }

    /// The accumulator of one layer (curves so far, mean features).
    pub fn layer(&self, layer: usize) -> &LayerAccumulator {
        &self.layers[layer]
    }

    /// The plan for all layers; errs if a layer got no window.
    pub fn finish(&self, meta: PlanMeta) -> Result<ChaiPlan, String> {
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(l, acc)| acc.finish(l < self.cfg.dense_layers))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ChaiPlan {
            model: meta.model,
            n_heads: self.n_heads,
            probe: meta.probe,
            samples: meta.samples,
            seq_len: meta.seq_len,
            elbow_rule: ELBOW_RULE.to_string(),
            max_k: self.layers.first().map_or(self.n_heads, |a| a.max_k),
            dense_layers: self.cfg.dense_layers.min(self.layers.len()),
            restarts: self.cfg.restarts.max(1),
            seed: self.cfg.seed,
            feature: FEATURE_PROBE_LOWER_TRIANGLE.to_string(),
            group: 0,
            quality: None,
            layers,
        })
    }
}
