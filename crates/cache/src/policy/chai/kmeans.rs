//! Seeded, deterministic K-means (greedy k-means++ seeding, Lloyd
//! iterations, best of several restarts) for CHAI's offline error curves
//! E_l(k) (docs/policies.md §2, offline step).

pub use crate::rng::SplitMix64;

/// Derives an independent seed from `seed` and a `salt` (layer, window, k…),
/// so that sub-computations do not share random streams.
pub fn derive_seed(seed: u64, salt: u64) -> u64 {
    let mut g = SplitMix64::new(seed ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    g.next_u64()
}

/// Most Lloyd iterations per restart (scikit-learn's default too).
pub const MAX_ITER: usize = 300;

/// Points as one row-major f64 block.
struct Data {
    m: usize,
    d: usize,
    x: Vec<f64>,
}

impl Data {
    fn new(points: &[Vec<f32>]) -> Self {
        let m = points.len();
        let d = points.first().map_or(0, Vec::len);
        let mut x = Vec::with_capacity(m * d);
        for (i, p) in points.iter().enumerate() {
            assert!(p.len() == d, "kmeans: point {i} has {} coordinates, point 0 has {d}", p.len());
            x.extend(p.iter().map(|&v| f64::from(v)));
        }
        Data { m, d, x }
    }

    #[inline]
    fn row(&self, i: usize) -> &[f64] {
        &self.x[i * self.d..(i + 1) * self.d]
    }
}

#[inline]
fn d2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Greedy k-means++: each new centre is the best (lowest resulting
/// potential) of `2 + ⌊ln k⌋` candidates drawn with probability ∝ D².
fn seed_centers(data: &Data, k: usize, rng: &mut SplitMix64) -> Vec<f64> {
    let (m, d) = (data.m, data.d);
    let mut centers = Vec::with_capacity(k * d);
    let first = rng.below(m);
    centers.extend_from_slice(data.row(first));
    let mut closest: Vec<f64> = (0..m).map(|i| d2(data.row(i), data.row(first))).collect();
    let mut pot: f64 = closest.iter().sum();
    let trials = 2 + (k as f64).ln().floor() as usize;
    let mut cand_closest = vec![0.0; m];
    for _ in 1..k {
        if pot.is_nan() || pot <= 0.0 {
            // Every point sits on a centre already: any point will do.
            let i = rng.below(m);
            centers.extend_from_slice(data.row(i));
            continue;
        }
        let mut best: Option<(usize, f64, Vec<f64>)> = None;
        for _ in 0..trials {
            let r = rng.next_f64() * pot;
            let mut acc = 0.0;
            let mut idx = None;
            for (i, &c) in closest.iter().enumerate() {
                acc += c;
                if acc > r {
                    idx = Some(i);
                    break;
                }
            }
            // Rounding can leave r ≥ the running sum: take the last point
            // that still has mass.
            let idx = idx.unwrap_or_else(|| closest.iter().rposition(|&c| c > 0.0).unwrap_or(m - 1));
            let row = data.row(idx);
            let mut new_pot = 0.0;
            for (i, cc) in cand_closest.iter_mut().enumerate() {
                *cc = closest[i].min(d2(data.row(i), row));
                new_pot += *cc;
            }
            if best.as_ref().is_none_or(|b| new_pot < b.1) {
                best = Some((idx, new_pot, cand_closest.clone()));
            }
        }
        let (idx, new_pot, new_closest) = best.expect("at least one trial");
        centers.extend_from_slice(data.row(idx));
        closest = new_closest;
        pot = new_pot;
    }
    centers
}

/// Nearest centre per point (ties → lowest centre index) and its squared
/// distance.
fn assign(data: &Data, centers: &[f64], k: usize, labels: &mut [usize], dist: &mut [f64]) {
    let d = data.d;
    for i in 0..data.m {
        let row = data.row(i);
        let mut best = (f64::INFINITY, 0usize);
        for c in 0..k {
            let v = d2(row, &centers[c * d..(c + 1) * d]);
            if v < best.0 {
                best = (v, c);
            }
        }
        labels[i] = best.1;
        dist[i] = best.0;
    }
}

/// Cluster means from labels; returns counts. Empty clusters keep their old
/// centre.
fn means(data: &Data, labels: &[usize], k: usize, centers: &mut [f64]) -> Vec<usize> {
    let d = data.d;
    let mut sums = vec![0.0; k * d];
    let mut counts = vec![0usize; k];
    for (i, &l) in labels.iter().enumerate() {
        counts[l] += 1;
        sums[l * d..(l + 1) * d].iter_mut().zip(data.row(i)).for_each(|(s, x)| *s += x);
    }
    for c in 0..k {
        if counts[c] > 0 {
            let inv = 1.0 / counts[c] as f64;
            for (dst, s) in centers[c * d..(c + 1) * d].iter_mut().zip(&sums[c * d..(c + 1) * d]) {
                *dst = s * inv;
            }
        }
    }
    counts
}

/// Lloyd iterations from `centers`; returns labels and the within-cluster
/// sum of squares of the final partition (about its means).
fn lloyd(data: &Data, mut centers: Vec<f64>, k: usize) -> (Vec<usize>, f64) {
    let m = data.m;
    let mut labels = vec![0usize; m];
    let mut dist = vec![0.0; m];
    assign(data, &centers, k, &mut labels, &mut dist);
    let mut new_labels = vec![0usize; m];
    for _ in 0..MAX_ITER {
        let mut counts = means(data, &labels, k, &mut centers);
        // Empty cluster → move it onto the point farthest from its centre
        // (ties → lowest index) among clusters that can spare one.
        if counts.contains(&0) {
            let mut order: Vec<usize> = (0..m).collect();
            order.sort_by(|&a, &b| dist[b].total_cmp(&dist[a]).then(a.cmp(&b)));
            let mut next = 0;
            for c in 0..k {
                if counts[c] != 0 {
                    continue;
                }
                while next < m && !(counts[labels[order[next]]] > 1 && dist[order[next]] > 0.0) {
                    next += 1;
                }
                if next == m {
                    break;
                }
                let p = order[next];
                next += 1;
                counts[labels[p]] -= 1;
                labels[p] = c;
                counts[c] = 1;
            }
            means(data, &labels, k, &mut centers);
        }
        assign(data, &centers, k, &mut new_labels, &mut dist);
        if new_labels == labels {
            break;
        }
        std::mem::swap(&mut labels, &mut new_labels);
    }
    means(data, &labels, k, &mut centers);
    let d = data.d;
    let inertia = (0..m).map(|i| d2(data.row(i), &centers[labels[i] * d..(labels[i] + 1) * d])).sum();
    (labels, inertia)
}

/// Renumbers labels in order of first appearance (item 0 gets label 0).
fn relabel(labels: &[usize]) -> Vec<usize> {
    let mut map: Vec<(usize, usize)> = Vec::new();
    labels
        .iter()
        .map(|&l| match map.iter().find(|(from, _)| *from == l) {
            Some(&(_, to)) => to,
            None => {
                let to = map.len();
                map.push((l, to));
                to
            }
        })
        .collect()
}

/// K-means on `points` (all of one length) into `k` clusters: greedy
/// k-means++ seeding, Lloyd iterations to convergence (at most
/// [`MAX_ITER`]), best inertia over `restarts` runs (≥ 1; the first of equal
/// ones wins). Returns labels (numbered by first appearance) and the
/// inertia Σ‖x − mean(cluster(x))‖².
///
/// Deterministic: the same `(points, k, restarts, seed)` always gives the
/// same result. `k` is clamped to at least 1; `k ≥ #points` puts every point
/// in its own cluster (inertia 0). Computation is in f64.
pub fn kmeans(points: &[Vec<f32>], k: usize, restarts: usize, seed: u64) -> (Vec<usize>, f64) {
    let data = Data::new(points);
    let m = data.m;
    if m == 0 {
        return (Vec::new(), 0.0);
    }
    let k = k.max(1);
    if k >= m {
        return ((0..m).collect(), 0.0);
    }
    if k == 1 {
        let (labels, inertia) = lloyd(&data, data.row(0).to_vec(), 1);
        return (labels, inertia);
    }
    let mut rng = SplitMix64::new(seed);
    let mut best: Option<(Vec<usize>, f64)> = None;
    for _ in 0..restarts.max(1) {
        let centers = seed_centers(&data, k, &mut rng);
        let (labels, inertia) = lloyd(&data, centers, k);
        if best.as_ref().is_none_or(|b| inertia < b.1) {
            best = Some((labels, inertia));
        }
    }
    let (labels, inertia) = best.expect("at least one restart");
    (relabel(&labels), inertia)
}

/// The K-means error curve: best inertia for k = 1..=max_k (entry k−1 is
/// E(k)), each k with its own seed derived from `seed`. Why: CHAI picks the
/// per-layer cluster count at the elbow of this curve.
pub fn error_curve(points: &[Vec<f32>], max_k: usize, restarts: usize, seed: u64) -> Vec<f64> {
    (1..=max_k).map(|k| kmeans(points, k, restarts, derive_seed(seed, k as u64)).1).collect()
}
