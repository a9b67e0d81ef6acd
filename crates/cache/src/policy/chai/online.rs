//! CHAI's online step (docs/policies.md §2): after a short probe with ordinary
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

    /// Grouping with the representative of each cluster given: `clusters`
    /// as `(representative, members)` pairs (members include the
    /// representative). Put into canonical order; panics unless the clusters
    /// cover heads `0..n` exactly once and each holds its representative.
    pub fn with_representatives(clusters: Vec<(usize, Vec<usize>)>) -> Self {
        let mut pairs: Vec<(usize, Vec<usize>)> = clusters
            .into_iter()
            .map(|(r, mut m)| {
                m.sort_unstable();
                assert!(m.contains(&r), "representative {r} is not in its cluster {m:?}");
                (r, m)
            })
            .collect();
        pairs.sort_by_key(|(_, m)| m[0]);
        let n: usize = pairs.iter().map(|(_, m)| m.len()).sum();
        let mut representative_of = vec![usize::MAX; n];
        for (r, members) in &pairs {
            for &h in members {
                assert!(h < n && representative_of[h] == usize::MAX, "clusters must cover heads 0..{n} exactly once");
                representative_of[h] = *r;
            }
        }
        let (representatives, clusters) = pairs.into_iter().unzip();
        HeadClusters { clusters, representative_of, representatives }
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
    /// this is false (docs/policies.md §2).
    pub fn kv_heads_used(&self, group: usize) -> Vec<bool> {
        let group = group.max(1);
        let mut used = vec![false; self.n_heads().div_ceil(group)];
        for &r in &self.representatives {
            used[r / group] = true;
        }
        used
    }
}

/// Subsets of KV heads searched exhaustively by [`cluster_by_kv_groups`];
/// above this it adds kept KV heads greedily.
const EXHAUSTIVE_KV_SUBSETS: usize = 4096;

/// GQA-aware head sharing: keep K for `keep` of the layer's KV heads (each
/// serving `group` query heads) and let every query head of the others use
/// the scores of its most similar kept query head (cosine distance of the
/// probe features). Kept query heads are their own representatives, so
/// they lose nothing; a dropped KV head's K is freed, which plain k-clusters
/// only achieve when no representative happens to fall into its group.
///
/// The kept set minimises the summed distance of the moved heads to their
/// representatives, over every subset when there are at most
/// [`EXHAUSTIVE_KV_SUBSETS`] (first in lexicographic order on ties), greedily
/// otherwise. `keep ≥ n_kv` → every head its own cluster. Deterministic.
pub fn cluster_by_kv_groups(features: &[Vec<f32>], group: usize, keep: usize) -> HeadClusters {
    let n = features.len();
    let group = group.max(1);
    let n_kv = n / group;
    if keep >= n_kv || n == 0 {
        return HeadClusters::singletons(n);
    }
    let keep = keep.max(1);
    let dist = cosine_distances(features);
    // nearest kept head of `h` (ties → lowest index) and its distance
    let nearest = |h: usize, kept: &[usize]| -> (usize, f64) {
        let mut best = (usize::MAX, f64::INFINITY);
        for &kv in kept {
            for (r, &d) in dist[h].iter().enumerate().skip(kv * group).take(group) {
                let d = if d.is_nan() { f64::INFINITY } else { d };
                if best.0 == usize::MAX || d < best.1 {
                    best = (r, d);
                }
            }
        }
        best
    };
    let cost =
        |kept: &[usize]| -> f64 { (0..n).filter(|h| !kept.contains(&(h / group))).map(|h| nearest(h, kept).1).sum() };
    let kept = if binomial(n_kv, keep) <= EXHAUSTIVE_KV_SUBSETS {
        let mut best: (f64, Vec<usize>) = (f64::INFINITY, Vec::new());
        let mut subset: Vec<usize> = (0..keep).collect();
        loop {
            let c = cost(&subset);
            if best.1.is_empty() || c < best.0 {
                best = (c, subset.clone());
            }
            if !next_combination(&mut subset, n_kv) {
                break best.1;
            }
        }
    } else {
        let mut kept: Vec<usize> = Vec::with_capacity(keep);
        while kept.len() < keep {
            let add = (0..n_kv)
                .filter(|kv| !kept.contains(kv))
                .map(|kv| {
                    let mut trial = kept.clone();
                    trial.push(kv);
                    (cost(&trial), kv)
                })
                .fold((f64::INFINITY, usize::MAX), |b, c| if b.1 == usize::MAX || c.0 < b.0 { c } else { b });
            kept.push(add.1);
        }
        kept.sort_unstable();
        kept
    };
    let mut clusters: Vec<(usize, Vec<usize>)> =
        kept.iter().flat_map(|&kv| (kv * group..(kv + 1) * group).map(|r| (r, vec![r]))).collect();
    for h in (0..n).filter(|h| !kept.contains(&(h / group))) {
        let r = nearest(h, &kept).0;
        clusters.iter_mut().find(|(rep, _)| *rep == r).expect("a kept head").1.push(h);
    }
    HeadClusters::with_representatives(clusters)
}

/// `n` choose `k`, saturating.
fn binomial(n: usize, k: usize) -> usize {
    (0..k.min(n - k)).fold(1usize, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Advances `c` (ascending, values < n) to the next combination in
/// lexicographic order; false after the last.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    for i in (0..k).rev() {
        if c[i] < n - k + i {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            return true;
        }
    }
    false
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64 as Rng;

    fn random_features(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| (0..len).map(|_| rng.next_f64() as f32).collect()).collect()
    }

    /// Summed distance of the moved heads to their nearest kept head,
    /// written independently of the code under test.
    fn brute_cost(dist: &[Vec<f64>], group: usize, kept: &[usize]) -> f64 {
        let n = dist.len();
        let kept_heads: Vec<usize> = (0..n).filter(|h| kept.contains(&(h / group))).collect();
        (0..n)
            .filter(|h| !kept_heads.contains(h))
            .map(|h| kept_heads.iter().map(|&r| dist[h][r]).fold(f64::INFINITY, f64::min))
            .sum()
    }

    #[test]
    fn kv_groups_keep_the_central_kv_head_and_move_the_rest_to_their_nearest() {
        // 6 heads over 3 KV heads (group 2): heads 2 and 3 (KV 1) look like
        // heads 0/1 and 4/5 respectively, so keeping KV 1 costs least
        let f = |a: f32, b: f32| vec![a, b, 0.0];
        let features = vec![f(1.0, 0.1), f(1.0, 0.2), f(1.0, 0.15), f(0.1, 1.0), f(0.2, 1.0), f(0.15, 1.0)];
        let hc = cluster_by_kv_groups(&features, 2, 1);
        assert_eq!(hc.representatives, vec![2, 3]);
        assert_eq!(hc.clusters, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert_eq!(hc.representative_of, vec![2, 2, 2, 3, 3, 3]);
        assert_eq!(hc.kv_heads_used(2), vec![false, true, false]);
        // keeping every KV head is the dense layer
        assert_eq!(cluster_by_kv_groups(&features, 2, 3), HeadClusters::singletons(6));
    }

    #[test]
    fn kv_group_choice_is_the_cheapest_subset() {
        for (seed, (n_kv, group, keep)) in
            [(3, 3, 1), (3, 3, 2), (4, 2, 2), (8, 1, 3), (5, 2, 3), (6, 4, 1)].into_iter().enumerate()
        {
            let features = random_features(n_kv * group, 15, seed as u64 + 7);
            let hc = cluster_by_kv_groups(&features, group, keep);
            let dist = cosine_distances(&features);
            let kept: Vec<usize> =
                hc.kv_heads_used(group).iter().enumerate().filter(|(_, u)| **u).map(|(k, _)| k).collect();
            assert_eq!(kept.len(), keep);
            assert_eq!(hc.k(), keep * group, "every kept head is its own representative");
            // no other subset is cheaper
            let mut c: Vec<usize> = (0..keep).collect();
            let best = brute_cost(&dist, group, &kept);
            loop {
                assert!(brute_cost(&dist, group, &c) >= best - 1e-12, "{c:?} beats {kept:?}");
                if !next_combination(&mut c, n_kv) {
                    break;
                }
            }
            for (h, &r) in hc.representative_of.iter().enumerate() {
                assert!(kept.contains(&(r / group)));
                if kept.contains(&(h / group)) {
                    assert_eq!(r, h);
                } else {
                    let nearest = (0..n_kv * group)
                        .filter(|x| kept.contains(&(x / group)))
                        .map(|x| dist[h][x])
                        .fold(f64::INFINITY, f64::min);
                    assert_eq!(dist[h][r], nearest);
                }
            }
        }
    }

    #[test]
    fn many_kv_heads_are_chosen_greedily_but_still_keep_exactly_keep() {
        // 16 KV heads choose 8 = 12,870 subsets: the greedy path
        assert!(binomial(16, 8) > EXHAUSTIVE_KV_SUBSETS && binomial(16, 2) <= EXHAUSTIVE_KV_SUBSETS);
        let features = random_features(16, 10, 3);
        let hc = cluster_by_kv_groups(&features, 1, 8);
        assert_eq!(hc.k(), 8);
        assert_eq!(hc.kv_heads_used(1).iter().filter(|u| **u).count(), 8);
        assert_eq!(hc, cluster_by_kv_groups(&features, 1, 8), "deterministic");
    }

    #[test]
    fn combinations_run_in_lexicographic_order() {
        let mut c = vec![0, 1];
        let mut all = vec![c.clone()];
        while next_combination(&mut c, 4) {
            all.push(c.clone());
        }
        assert_eq!(all, vec![vec![0, 1], vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3], vec![2, 3]]);
        assert_eq!((binomial(9, 3), binomial(3, 3), binomial(5, 0)), (84, 1, 1));
    }
}
