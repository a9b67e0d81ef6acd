//! Paired comparisons of a policy against a reference (the full cache, or
//! `auto` at the same budget) on the same items: the mean per-item
//! difference with a 95% paired bootstrap interval (the items resampled
//! with replacement, 2,000 times from a fixed seed, so the interval is
//! reproducible; percentiles 2.5 and 97.5 of the resampled means). Pairing
//! removes the items' shared difficulty, so differences far smaller than
//! either accuracy's standard error can be resolved; the bootstrap needs
//! no normality of 0/1 differences.

/// A policy's per-item values minus the reference's on the same items.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    pub n: usize,
    /// Mean of (policy − reference).
    pub diff: f64,
    /// Standard error of that mean (the resampled means' spread).
    pub stderr: f64,
    /// 95% confidence interval of the mean difference.
    pub lo: f64,
    pub hi: f64,
}

impl Paired {
    /// The interval excludes 0: the difference is significant at 5%.
    pub fn significant(&self) -> bool {
        self.lo > 0.0 || self.hi < 0.0
    }
}

/// Resamples of the bootstrap.
const RESAMPLES: usize = 2000;
/// Its fixed seed: the same items give the same interval.
const SEED: u64 = 0x5EED_B007;

/// The paired difference `policy − reference`, item by item; `None` when
/// the lists differ in length (not the same items) or hold fewer than two.
pub fn paired(policy: &[f64], reference: &[f64]) -> Option<Paired> {
    let n = policy.len();
    if n != reference.len() || n < 2 {
        return None;
    }
    let d: Vec<f64> = policy.iter().zip(reference).map(|(a, b)| a - b).collect();
    let mean = d.iter().sum::<f64>() / n as f64;
    let mut rng = kvslim_cache::rng::SplitMix64::new(SEED);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| d[(rng.next_u64() % n as u64) as usize]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let spread = means.iter().map(|m| (m - mean) * (m - mean)).sum::<f64>() / (RESAMPLES - 1) as f64;
    let at = |q: f64| means[((q * RESAMPLES as f64) as usize).min(RESAMPLES - 1)];
    Some(Paired { n, diff: mean, stderr: spread.sqrt(), lo: at(0.025), hi: at(0.975) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_intervals_are_reproducible_and_honest() {
        // the same difference on every item: no spread, the interval is that point
        let p = paired(&[1.0, 1.0, 1.0, 1.0], &[0.0, 0.0, 0.0, 0.0]).unwrap();
        assert_eq!((p.diff, p.lo, p.hi, p.stderr), (1.0, 1.0, 1.0, 0.0));
        // differences 1, 0, 0, −1, 1: mean 0.2, the interval holds it and 0
        let (a, b) = ([1.0, 1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0, 0.0]);
        let p = paired(&a, &b).unwrap();
        assert!((p.diff - 0.2).abs() < 1e-12);
        assert!(p.lo < 0.0 && p.hi > 0.2 && p.hi <= 1.0 && p.lo >= -1.0, "{p:?}");
        assert!(!p.significant());
        assert_eq!(paired(&a, &b), Some(p), "same items, same interval");
        // the resampled means' spread is near the plug-in standard error
        let plug_in = (0.56f64 / 5.0).sqrt();
        assert!((p.stderr - plug_in).abs() < 0.15 * plug_in, "{} vs {plug_in}", p.stderr);
        // 40 of 50 items kept by one policy and lost by the other: significant
        let better: Vec<f64> = (0..50).map(|i| f64::from(i < 45)).collect();
        let worse: Vec<f64> = (0..50).map(|i| f64::from(i < 5)).collect();
        let p = paired(&worse, &better).unwrap();
        assert!(p.significant() && p.hi < 0.0, "{p:?}");
        assert!(paired(&[1.0], &[0.0]).is_none());
        assert!(paired(&[1.0, 0.0], &[0.0]).is_none());
    }
}
