//! The elbow rule that turns a layer's K-means error curve E(k) into its
//! cluster count k_l (docs/policies.md §2: automatic, with the curve saved so a person
//! can check it).
//!
//! Rule ("max-chord-distance"):
//! 1. Clean the curve: non-finite entries are dropped in favour of the
//!    previous value, then a running minimum makes it non-increasing (a
//!    larger k can only lower the optimal error; a rise is restart noise).
//! 2. Flat curve (E(1) − E(K) ≤ 1e-9·|E(1)| + 1e-12): every k explains the
//!    heads equally well → k = 1.
//! 3. Normalise both axes to [0, 1]: x = (k−1)/(K−1),
//!    y = (E(k) − E(K)) / (E(1) − E(K)). The chord from (1, E(1)) to
//!    (K, E(K)) becomes x + y = 1; a point's signed distance below it is
//!    s(k) = (1 − x − y)/√2.
//! 4. k = argmax s(k), ties (within 1e-12) → the smallest k (more sharing).
//!    If no point lies strictly below the chord (a straight or concave
//!    curve: each extra cluster keeps paying off) → k = K, i.e. no
//!    compression beyond what `max_k` already imposes.

/// Name of the rule, recorded in the plan file.
pub const ELBOW_RULE: &str = "max-chord-distance";

/// Tolerance on normalised chord distances (ties and "no elbow").
const SCORE_EPS: f64 = 1e-12;

/// The cleaned (finite, non-increasing) curve the rule works on.
pub fn monotone_curve(errors: &[f64]) -> Vec<f64> {
    let first = errors.iter().copied().find(|v| v.is_finite());
    let Some(mut run) = first else {
        return Vec::new();
    };
    errors
        .iter()
        .map(|&v| {
            if v.is_finite() && v < run {
                run = v;
            }
            run
        })
        .collect()
}

/// Normalised signed distance below the chord for each k (index k−1);
/// all zeros for a flat or too-short curve. For reports and plots.
pub fn elbow_scores(errors: &[f64]) -> Vec<f64> {
    let e = monotone_curve(errors);
    let kk = e.len();
    if kk < 3 || errors.len() != kk {
        return vec![0.0; errors.len()];
    }
    let (top, bot) = (e[0], e[kk - 1]);
    let span = top - bot;
    if span <= 1e-9 * top.abs() + 1e-12 {
        return vec![0.0; kk];
    }
    e.iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = i as f64 / (kk - 1) as f64;
            let y = (v - bot) / span;
            (1.0 - x - y) / std::f64::consts::SQRT_2
        })
        .collect()
}

/// The cluster count (1-based) at the elbow of `errors` (entry k−1 = E(k)),
/// by the rule in this module's docs. An empty or all-non-finite curve
/// gives 1.
pub fn choose_elbow(errors: &[f64]) -> usize {
    let e = monotone_curve(errors);
    let kk = e.len();
    if kk <= 1 {
        return 1;
    }
    let span = e[0] - e[kk - 1];
    if span <= 1e-9 * e[0].abs() + 1e-12 {
        return 1;
    }
    if kk == 2 {
        return 2;
    }
    let scores = elbow_scores(errors);
    let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if best <= SCORE_EPS {
        return kk;
    }
    scores.iter().position(|&s| s >= best - SCORE_EPS).map_or(kk, |i| i + 1)
}
