//! The CHAI plan file: per-layer cluster counts k_l chosen offline, with the
//! error curves they were chosen from (so a person can check the elbow) and
//! the fixed membership for `chai-static` (docs/policies.md §2).
//!
//! JSON layout (fields in this order; `layers` in layer order):
//! ```json
//! {"model": "...", "n_heads": 9, "probe": 5, "samples": 64, "seq_len": 256,
//!  "elbow_rule": "max-chord-distance", "max_k": 9, "dense_layers": 2,
//!  "restarts": 10, "seed": 0, "feature": "probe-lower-triangle",
//!  "layers": [{"k": 3, "errors": [E(1), E(2), ...], "elbow_k": 3,
//!              "static_clusters": [[0, 2], [1], ...]}, ...]}
//! ```
//! Plans chosen by a quality target (`kvslim calibrate --max-kl`) add
//! `"group"` (query heads per KV head), `"quality"` (budget and measured KL)
//! and per layer `"kv_keep"` (GQA-aware sharing), `"kl_by_kv_keep"` and
//! `"static_representatives"`.
//! Only `layers` with each layer's `k` and `errors` are required on load;
//! the other fields default (0 / empty: unknown) so a hand-written plan works.

use super::linkage::canonicalize;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Feature name recorded in plans made by [`super::calibrate`].
pub const FEATURE_PROBE_LOWER_TRIANGLE: &str = "probe-lower-triangle";

fn default_probe() -> usize {
    5
}

/// A whole model's CHAI plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChaiPlan {
    /// Model the plan was calibrated on (informational).
    #[serde(default)]
    pub model: String,
    /// Query heads per layer; 0 = not recorded (then not checked).
    #[serde(default)]
    pub n_heads: usize,
    /// Probe length in tokens for the online step (features are its
    /// lower-triangle attention probabilities).
    #[serde(default = "default_probe")]
    pub probe: usize,
    /// Calibration windows (texts) the error curves average over.
    #[serde(default)]
    pub samples: usize,
    /// Tokens per calibration window.
    #[serde(default)]
    pub seq_len: usize,
    /// Elbow rule that chose each k (see [`super::elbow`]).
    #[serde(default)]
    pub elbow_rule: String,
    /// Largest k searched (0 = n_heads).
    #[serde(default)]
    pub max_k: usize,
    /// The first `dense_layers` layers were forced to k = n_heads.
    #[serde(default)]
    pub dense_layers: usize,
    /// K-means restarts per (window, k).
    #[serde(default)]
    pub restarts: usize,
    /// Seed of the K-means runs.
    #[serde(default)]
    pub seed: u64,
    /// Which head feature the curves were computed from.
    #[serde(default)]
    pub feature: String,
    /// Query heads per KV head when the plan uses `kv_keep` (0 = not recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub group: usize,
    /// Present when the per-layer sharing was chosen by a quality target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityRecord>,
    /// One entry per layer, in layer order.
    pub layers: Vec<LayerPlan>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One layer's part of the plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerPlan {
    /// Cluster count used online (k = n_heads: layer left dense).
    pub k: usize,
    /// Mean K-means error E(k) for k = 1..=errors.len().
    pub errors: Vec<f64>,
    /// What the elbow rule picked before `dense_layers` forcing (absent in
    /// hand-written plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elbow_k: Option<usize>,
    /// `chai-static` membership: k canonical clusters of head indices (empty
    /// when not calibrated).
    #[serde(default)]
    pub static_clusters: Vec<Vec<usize>>,
    /// Representative of each static cluster (same order); empty → the
    /// cluster's first head.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_representatives: Vec<usize>,
    /// GQA-aware sharing ([`super::online::cluster_by_kv_groups`]): keep K
    /// for this many KV heads; query heads of the others use their most
    /// similar kept head's scores. `k` must then be `kv_keep × group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_keep: Option<usize>,
    /// KL(full‖this layer alone shared) on the calibration windows for
    /// `kv_keep` = 1, 2, … (index `keep − 1`), when calibrated by quality.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kl_by_kv_keep: Vec<f64>,
}

/// What `kvslim calibrate --max-kl` measured (recorded in the plan).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QualityRecord {
    /// The error budget: mean KL(full‖plan) per token, nats.
    pub max_kl: f64,
    /// KL of the chosen plan, measured on the calibration windows.
    pub measured_kl: f64,
    /// Sum of the chosen layers' single-layer KLs (the selection's estimate).
    pub predicted_kl: f64,
    /// KV heads whose K the plan frees, over all layers.
    pub kv_heads_freed: usize,
    /// Calibration windows and their length the KLs were measured on.
    pub windows: usize,
    pub seq_len: usize,
}

/// Why a plan could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("CHAI plan {}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("CHAI plan {}: cannot write: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("CHAI plan {}: invalid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("CHAI plan {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

impl ChaiPlan {
    /// Parses a plan from JSON text and checks its internal consistency
    /// (not yet against a model: see [`ChaiPlan::validate`]).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let plan: ChaiPlan = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
        plan.check()?;
        Ok(plan)
    }

    /// Pretty JSON (field order as documented in the module).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serialises")
    }

    /// Reads and self-checks a plan file.
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PlanError::Read { path: path.to_path_buf(), source })?;
        let plan: ChaiPlan =
            serde_json::from_str(&text).map_err(|source| PlanError::Json { path: path.to_path_buf(), source })?;
        plan.check().map_err(|reason| PlanError::Invalid { path: path.to_path_buf(), reason })?;
        Ok(plan)
    }

    /// [`ChaiPlan::load`], then [`ChaiPlan::validate`] against the model.
    pub fn load_for_model(path: &Path, n_layers: usize, n_heads: usize) -> Result<Self, PlanError> {
        let plan = Self::load(path)?;
        plan.validate(n_layers, n_heads).map_err(|reason| PlanError::Invalid { path: path.to_path_buf(), reason })?;
        Ok(plan)
    }

    /// Writes the plan as pretty JSON (with a trailing newline).
    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        let mut text = self.to_json();
        text.push('\n');
        std::fs::write(path, text).map_err(|source| PlanError::Write { path: path.to_path_buf(), source })
    }

    /// Consistency that needs no model: k ≥ 1, finite non-negative errors,
    /// static clusters (when present) a partition into exactly k clusters in
    /// canonical form, and, when `n_heads` is recorded, every k and every
    /// head index within it.
    pub fn check(&self) -> Result<(), String> {
        if self.probe == 0 {
            return Err("probe must be at least 1 token".into());
        }
        if self.layers.is_empty() {
            return Err("plan has no layers".into());
        }
        for (l, lp) in self.layers.iter().enumerate() {
            if lp.k == 0 {
                return Err(format!("layer {l}: k must be at least 1"));
            }
            if self.n_heads != 0 && lp.k > self.n_heads {
                return Err(format!("layer {l}: k = {} exceeds n_heads = {}", lp.k, self.n_heads));
            }
            if let Some(i) = lp.errors.iter().position(|e| !e.is_finite() || *e < 0.0) {
                return Err(format!("layer {l}: errors[{i}] = {} is not a finite non-negative number", lp.errors[i]));
            }
            if let Some(keep) = lp.kv_keep {
                if keep == 0 {
                    return Err(format!("layer {l}: kv_keep must be at least 1"));
                }
                if self.group != 0 && lp.k != keep * self.group {
                    return Err(format!(
                        "layer {l}: kv_keep = {keep} keeps {} query heads (group {}), but k = {}",
                        keep * self.group,
                        self.group,
                        lp.k
                    ));
                }
            }
            if !lp.static_representatives.is_empty() {
                let ok = lp.static_representatives.len() == lp.static_clusters.len()
                    && lp.static_clusters.iter().zip(&lp.static_representatives).all(|(c, r)| c.contains(r));
                if !ok {
                    return Err(format!(
                        "layer {l}: static_representatives must name one member of each static cluster"
                    ));
                }
            }
            if !lp.static_clusters.is_empty() {
                check_partition(&lp.static_clusters, lp.k).map_err(|e| format!("layer {l}: static_clusters {e}"))?;
                let n: usize = lp.static_clusters.iter().map(Vec::len).sum();
                if self.n_heads != 0 && n != self.n_heads {
                    return Err(format!(
                        "layer {l}: static_clusters cover {n} heads, plan has n_heads = {}",
                        self.n_heads
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether this plan fits a model with `n_layers` layers of `n_heads`
    /// query heads: layer count, recorded head count, every k in
    /// `1..=n_heads`, error curves no longer than n_heads, static clusters
    /// covering exactly heads `0..n_heads`.
    pub fn validate(&self, n_layers: usize, n_heads: usize) -> Result<(), String> {
        if self.layers.len() != n_layers {
            return Err(format!("plan has {} layers, the model has {n_layers}", self.layers.len()));
        }
        if self.n_heads != 0 && self.n_heads != n_heads {
            return Err(format!("plan was made for {} heads per layer, the model has {n_heads}", self.n_heads));
        }
        self.check()?;
        for (l, lp) in self.layers.iter().enumerate() {
            if lp.k > n_heads {
                return Err(format!("layer {l}: k = {} exceeds the model's {n_heads} heads", lp.k));
            }
            if lp.errors.len() > n_heads {
                return Err(format!("layer {l}: {} error values for a model with {n_heads} heads", lp.errors.len()));
            }
            if !lp.static_clusters.is_empty() {
                let n: usize = lp.static_clusters.iter().map(Vec::len).sum();
                if n != n_heads {
                    return Err(format!("layer {l}: static_clusters cover {n} heads, the model has {n_heads}"));
                }
            }
        }
        Ok(())
    }

    /// True when layer `l` keeps all heads (no sharing, full K cache).
    pub fn is_dense(&self, layer: usize, n_heads: usize) -> bool {
        self.layers[layer].k >= n_heads
    }

    /// Whether every layer carries a `chai-static` membership.
    pub fn has_static(&self) -> bool {
        self.layers.iter().all(|l| !l.static_clusters.is_empty())
    }
}

/// `clusters` must be k non-empty clusters in canonical form that together
/// hold each of `0..n` exactly once.
fn check_partition(clusters: &[Vec<usize>], k: usize) -> Result<(), String> {
    if clusters.len() != k {
        return Err(format!("has {} clusters, k = {k}", clusters.len()));
    }
    if clusters.iter().any(Vec::is_empty) {
        return Err("contain an empty cluster".into());
    }
    if canonicalize(clusters.to_vec()) != clusters {
        return Err("are not in canonical form (sorted heads, clusters ordered by first head)".into());
    }
    let n: usize = clusters.iter().map(Vec::len).sum();
    let mut seen = vec![false; n];
    for &h in clusters.iter().flatten() {
        if h >= n || seen[h] {
            return Err(format!("do not cover heads 0..{n} exactly once (head {h})"));
        }
        seen[h] = true;
    }
    Ok(())
}
