//! Cosine distances between head features, average-linkage (UPGMA)
//! agglomerative clustering, the canonical cluster form and the choice of a
//! representative head per cluster (docs/policies.md §2, online step).

use serde::{Deserialize, Serialize};

/// Relative tolerance under which two linkage distances count as a tie.
///
/// Average distances of merged clusters can be computed in different orders
/// (Lance–Williams update here, a direct mean in a reference); rounding then
/// differs in the last bits. Treating values within this tolerance as equal
/// makes the tie rule below hold whatever the summation order.
pub const TIE_RTOL: f64 = 1e-12;
/// Absolute part of the tie tolerance (for distances at or near zero).
pub const TIE_ATOL: f64 = 1e-15;

/// `1 − cos(x_i, x_j)` for every pair of feature rows, in f64.
///
/// Why f64: the linkage compares averages of these values, and f32 rounding
/// would create spurious ties/flips between near-equal heads.
///
/// Conventions (so the result never holds NaN):
/// - the diagonal is exactly 0 and the matrix exactly symmetric
///   (`d[j][i]` is a copy of `d[i][j]`);
/// - rounding is clamped into `[0, 2]`;
/// - a zero (or non-finite-norm) vector has similarity 0 to every other
///   vector, i.e. distance 1 ("unrelated"), except that two zero vectors are
///   identical (distance 0);
/// - rows shorter than the longest are read as if padded with zeros.
pub fn cosine_distances(features: &[Vec<f32>]) -> Vec<Vec<f64>> {
    let n = features.len();
    let norms: Vec<f64> =
        features.iter().map(|f| f.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()).collect();
    let zero: Vec<bool> = norms.iter().map(|&s| !(s.is_finite() && s > 0.0)).collect();
    let mut d = vec![vec![0.0f64; n]; n];
    for i in 0..n {
        for j in i + 1..n {
            let v = match (zero[i], zero[j]) {
                (true, true) => 0.0,
                (true, false) | (false, true) => 1.0,
                (false, false) => {
                    let dot: f64 =
                        features[i].iter().zip(&features[j]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    let v = 1.0 - dot / (norms[i] * norms[j]);
                    if v.is_nan() {
                        1.0
                    } else {
                        v.clamp(0.0, 2.0)
                    }
                }
            };
            d[i][j] = v;
            d[j][i] = v;
        }
    }
    d
}

/// Reads a distance, treating NaN as +∞ (a pair that must never be preferred).
#[inline]
fn clean(v: f64) -> f64 {
    if v.is_nan() {
        f64::INFINITY
    } else {
        v
    }
}

/// True when `v` ties with the minimum `m` under [`TIE_RTOL`]/[`TIE_ATOL`].
#[inline]
pub(crate) fn ties_with_min(v: f64, m: f64) -> bool {
    v <= m + TIE_RTOL * m.abs() + TIE_ATOL
}

/// Average-linkage (UPGMA) agglomerative clustering of `n` items given their
/// `n × n` distance matrix, cut into `k` clusters. Returns a label per item
/// in canonical numbering: label `c` is the c-th cluster when clusters are
/// ordered by their smallest member (so item 0 always has label 0).
///
/// Why our own: CHAI's online step runs per request and per layer on a few
/// dozen heads; O(n³) with n ≤ 64 is microseconds and needs no dependency.
///
/// Rule: start from singletons; repeatedly merge the two clusters A, B whose
/// average pairwise distance `Σ_{a∈A,b∈B} d(a,b) / (|A||B|)` is smallest,
/// until `k` clusters remain. Each cluster is identified by its smallest
/// member; among pairs whose distance ties with the minimum (within
/// [`TIE_RTOL`]·m + [`TIE_ATOL`]) the lexicographically smallest
/// (min(A), min(B)) pair with min(A) < min(B) is merged. Cluster distances
/// are kept with the Lance–Williams update
/// `d(C, A∪B) = (|A| d(C,A) + |B| d(C,B)) / (|A| + |B|)`. Only the upper
/// triangle (`dist[i][j]`, i < j) is read; NaN counts as +∞.
///
/// `k` is clamped to `1..=n` (k = 0 behaves as 1). Panics if a row is
/// shorter than `n`.
pub fn average_linkage(dist: &[Vec<f64>], k: usize) -> Vec<usize> {
    let n = dist.len();
    if n == 0 {
        return Vec::new();
    }
    for (i, row) in dist.iter().enumerate() {
        assert!(row.len() >= n, "average_linkage: distance row {i} has {} entries, need {n}", row.len());
    }
    let k = k.clamp(1, n);
    // Slot s holds the cluster whose smallest member is s (when active).
    let mut d: Vec<Vec<f64>> = (0..n).map(|i| (0..n).map(|j| clean(dist[i.min(j)][i.max(j)])).collect()).collect();
    let mut size = vec![1usize; n];
    let mut active = vec![true; n];
    let mut parent: Vec<usize> = (0..n).collect(); // item → slot it was merged into
    let mut clusters = n;
    while clusters > k {
        let mut m = f64::INFINITY;
        for i in 0..n {
            if !active[i] {
                continue;
            }
            for j in i + 1..n {
                if active[j] && d[i][j] < m {
                    m = d[i][j];
                }
            }
        }
        let mut pick = None;
        'outer: for i in 0..n {
            if !active[i] {
                continue;
            }
            for j in i + 1..n {
                // With every distance infinite, m = ∞ and the first pair wins.
                if active[j] && ties_with_min(d[i][j], m) {
                    pick = Some((i, j));
                    break 'outer;
                }
            }
        }
        let (a, b) = pick.expect("at least two active clusters");
        let (na, nb) = (size[a] as f64, size[b] as f64);
        for c in 0..n {
            if active[c] && c != a && c != b {
                let v = (na * d[c][a] + nb * d[c][b]) / (na + nb);
                d[c][a] = v;
                d[a][c] = v;
            }
        }
        size[a] += size[b];
        active[b] = false;
        parent[b] = a;
        clusters -= 1;
    }
    // Resolve each item to its slot, then number slots in increasing order.
    let mut slot_label = vec![usize::MAX; n];
    let mut next = 0;
    for (s, &act) in active.iter().enumerate() {
        if act {
            slot_label[s] = next;
            next += 1;
        }
    }
    (0..n)
        .map(|mut i| {
            while parent[i] != i {
                i = parent[i];
            }
            slot_label[i]
        })
        .collect()
}

/// Canonical form of a partition: clusters as sorted member lists, ordered by
/// their first (smallest) member. Labels may be any numbering. Why: plans,
/// tests and reports compare partitions by value, independent of labels.
pub fn clusters_from_labels(labels: &[usize]) -> Vec<Vec<usize>> {
    let mut by_label: Vec<(usize, Vec<usize>)> = Vec::new();
    for (item, &l) in labels.iter().enumerate() {
        match by_label.iter_mut().find(|(lab, _)| *lab == l) {
            Some((_, members)) => members.push(item),
            None => by_label.push((l, vec![item])),
        }
    }
    // Items are visited in increasing order, so each list is sorted and the
    // lists are already ordered by first member.
    by_label.into_iter().map(|(_, m)| m).collect()
}

/// Puts any list of clusters into canonical form (sorted members, clusters
/// ordered by first member; empty clusters dropped).
pub fn canonicalize(mut clusters: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    clusters.retain(|c| !c.is_empty());
    for c in clusters.iter_mut() {
        c.sort_unstable();
    }
    clusters.sort_by_key(|c| c[0]);
    clusters
}

/// Label per item (index of its cluster) from a canonical cluster list over
/// items `0..n`. Items missing from every cluster get `usize::MAX`.
pub fn labels_from_clusters(clusters: &[Vec<usize>], n: usize) -> Vec<usize> {
    let mut labels = vec![usize::MAX; n];
    for (c, members) in clusters.iter().enumerate() {
        for &h in members {
            if h < n {
                labels[h] = c;
            }
        }
    }
    labels
}

/// How each cluster's representative head is chosen (docs/policies.md §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepRule {
    /// Lowest head index in the cluster, as CHAI's reference code.
    #[default]
    First,
    /// The member with the smallest summed distance to the cluster's members
    /// (ties → lowest index): a real head closest to the cluster's centre.
    Medoid,
}

impl RepRule {
    /// Name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            RepRule::First => "first",
            RepRule::Medoid => "medoid",
        }
    }
}

impl std::fmt::Display for RepRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RepRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "first" => Ok(RepRule::First),
            "medoid" => Ok(RepRule::Medoid),
            other => Err(format!("unknown representative rule `{other}` (expected `first` or `medoid`)")),
        }
    }
}

/// The medoid of one cluster: the member h minimising `Σ_{j∈cluster} d(h,j)`
/// (summed over members in increasing order, self included), ties → lowest
/// index. Panics on an empty cluster.
pub fn medoid(cluster: &[usize], dist: &[Vec<f64>]) -> usize {
    let mut members = cluster.to_vec();
    members.sort_unstable();
    let mut best = (f64::INFINITY, usize::MAX);
    for &h in &members {
        let s: f64 = members.iter().map(|&j| clean(dist[h][j])).sum();
        if best.1 == usize::MAX || s < best.0 {
            best = (s, h);
        }
    }
    assert!(best.1 != usize::MAX, "medoid of an empty cluster");
    best.1
}

/// Representative per cluster, in cluster order. `dist` is only read for
/// [`RepRule::Medoid`]. Panics on an empty cluster.
pub fn representatives(clusters: &[Vec<usize>], dist: &[Vec<f64>], rule: RepRule) -> Vec<usize> {
    clusters
        .iter()
        .map(|c| match rule {
            RepRule::First => *c.iter().min().expect("empty cluster"),
            RepRule::Medoid => medoid(c, dist),
        })
        .collect()
}
