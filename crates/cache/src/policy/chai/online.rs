//! CHAI's online step (SPEC §2): after a short probe with ordinary
//! attention, cluster the heads of each layer by their attention pattern and
//! pick one representative per cluster.

use super::linkage::{average_linkage, canonicalize, clusters_from_labels, cosine_distances, representatives, RepRule};
use serde::{Deserialize, Serialize};

/// Number of values in a probe feature: the causal lower triangle of a
/// `probe × probe` attention matrix (probe = 5 → 15).
pub const fn probe_feature_len(probe: usize) -> usize {
    probe * (probe + 1) / 2
}

/// One head's probe feature: row t of its causal attention probabilities
/// contributes its first t+1 entries, rows concatenated in order. Why only
/// the lower triangle: the masked upper entries are 0 for every head and
/// would only dilute the cosine distance.
///
/// Rows may be longer than t+1 (e.g. rows of a full square matrix); extra
/// entries are ignored. Panics if row t has fewer than t+1 entries.
pub fn probe_feature<R: AsRef<[f32]>>(probs_rows: &[R]) -> Vec<f32> {
    let mut out = Vec::with_capacity(probe_feature_len(probs_rows.len()));
    for (t, row) in probs_rows.iter().enumerate() {
        let row = row.as_ref();
        assert!(row.len() > t, "probe_feature: row {t} has {} entries, need {}", row.len(), t + 1);
        out.extend_from_slice(&row[..=t]);
    }
    out
}

/// [`probe_feature`] for a head whose probabilities are one row-major
/// block with `stride` entries per row (`stride ≥ probe`), as attention maps
/// are usually stored.
pub fn probe_feature_strided(probs: &[f32], probe: usize, stride: usize) -> Vec<f32> {
    assert!(stride >= probe, "probe_feature_strided: stride {stride} < probe {probe}");
    let mut out = Vec::with_capacity(probe_feature_len(probe));
    for t in 0..probe {
        out.extend_from_slice(&probs[t * stride..t * stride + t + 1]);
    }
    out
}

/// A layer's head grouping for one request: who shares whose q·k scores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadClusters {
    /// Canonical clusters: sorted head lists, ordered by first head.
    pub clusters: Vec<Vec<usize>>,
    /// Per head: the representative head whose scores it uses (itself for a
    /// representative).
    pub representative_of: Vec<usize>,
    /// Per cluster (same order as `clusters`): its representative head.
    pub representatives: Vec<usize>,
}

impl HeadClusters {
    /// Every head its own cluster (dense layer, nothing shared).
    pub fn singletons(n_heads: usize) -> Self {
        let all: Vec<usize> = (0..n_heads).collect();
        HeadClusters {
            clusters: all.iter().map(|&h| vec![h]).collect(),
            representative_of: all.clone(),
            representatives: all,
        }
    }

    /// Grouping from a given membership (e.g. a `chai-static` plan). `dist`
    /// (head × head) is read only for [`RepRule::Medoid`]. The clusters are
    /// put into canonical form and must cover heads `0..n` exactly once;
    /// panics otherwise.
    pub fn from_clusters(clusters: Vec<Vec<usize>>, dist: &[Vec<f64>], rule: RepRule) -> Self {
        let clusters = canonicalize(clusters);
        let n: usize = clusters.iter().map(Vec::len).sum();
        let reps = representatives(&clusters, dist, rule);
        let mut representative_of = vec![usize::MAX; n];
        for (c, members) in clusters.iter().enumerate() {
            for &h in members {
                assert!(h < n && representative_of[h] == usize::MAX, "clusters must cover heads 0..{n} exactly once");
                representative_of[h] = reps[c];
            }
        }
        HeadClusters { clusters, representative_of, representatives: reps }
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.representative_of.len()
    }

    /// Number of clusters (= representative heads = K heads kept).
    pub fn k(&self) -> usize {
        self.clusters.len()
    }

    /// True for a head that computes its own scores.
    pub fn is_representative(&self, head: usize) -> bool {
        self.representative_of[head] == head
    }

    /// Per KV head (GQA, `group` query heads per KV head): whether some
    /// representative reads its K. A KV head's K may only be dropped when
    /// this is false (SPEC §2).
    pub fn kv_heads_used(&self, group: usize) -> Vec<bool> {
        let group = group.max(1);
        let mut used = vec![false; self.n_heads().div_ceil(group)];
        for &r in &self.representatives {
            used[r / group] = true;
        }
        used
    }
}

/// Clusters one layer's heads from their probe features (one row per head):
/// cosine distances, average linkage into `k` clusters, representative by
/// `rep`. `k` is clamped to `1..=n` (k ≥ n → every head its own cluster,
/// k ≤ 1 → one cluster). Deterministic.
pub fn cluster_heads(features: &[Vec<f32>], k: usize, rep: RepRule) -> HeadClusters {
    let n = features.len();
    if n == 0 {
        return HeadClusters::singletons(0);
    }
    if k >= n {
        return HeadClusters::singletons(n);
    }
    let dist = cosine_distances(features);
    let clusters = clusters_from_labels(&average_linkage(&dist, k));
    HeadClusters::from_clusters(clusters, &dist, rep)
}
