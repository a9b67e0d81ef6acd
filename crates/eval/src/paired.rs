//! Paired comparisons of a policy against the full cache on the same
//! items: the mean per-item difference with a 95% confidence interval from
//! the differences' own spread (a paired t-interval, normal quantile above
//! 30 items). Pairing removes the items' shared difficulty, so differences
//! far smaller than either accuracy's standard error can be resolved.

/// A policy's per-item values minus the reference's on the same items.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    pub n: usize,
    /// Mean of (policy − reference).
    pub diff: f64,
    /// Standard error of that mean.
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

/// Two-sided 97.5% quantile of Student's t with `df` degrees of freedom
/// (table to 30, then the normal 1.96).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if (1..=30).contains(&df) {
        T[df - 1]
    } else {
        1.96
    }
}

/// The paired difference `policy − reference`, item by item; `None` when
/// the lists differ in length (not the same items) or hold fewer than two.
pub fn paired(policy: &[f64], reference: &[f64]) -> Option<Paired> {
    let n = policy.len();
    if n != reference.len() || n < 2 {
        return None;
    }
    let d: Vec<f64> = policy.iter().zip(reference).map(|(a, b)| a - b).collect();
    let mean = d.iter().sum::<f64>() / n as f64;
    let var = d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    let stderr = (var / n as f64).sqrt();
    let h = t975(n - 1) * stderr;
    Some(Paired { n, diff: mean, stderr, lo: mean - h, hi: mean + h })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_interval() {
        // differences 1, 0, 0, −1, 1: mean 0.2, sd² = (0.64+0.04+0.04+1.44+0.64)/4 = 0.7
        let p = paired(&[1.0, 1.0, 0.0, 0.0, 1.0], &[0.0, 1.0, 0.0, 1.0, 0.0]).unwrap();
        assert!((p.diff - 0.2).abs() < 1e-12);
        assert!((p.stderr - (0.7f64 / 5.0).sqrt()).abs() < 1e-12);
        assert!((p.hi - (0.2 + 2.776 * (0.14f64).sqrt())).abs() < 1e-9);
        assert!(!p.significant());
        // the same shift on every item is significant however small
        let base: Vec<f64> = (0..100).map(|i| (i as f64).sin()).collect();
        let shifted: Vec<f64> = base.iter().enumerate().map(|(i, b)| b - 0.01 - 1e-4 * (i % 3) as f64).collect();
        let p = paired(&shifted, &base).unwrap();
        assert!(p.significant() && p.hi < 0.0, "{p:?}");
        assert!(paired(&[1.0], &[0.0]).is_none());
        assert!(paired(&[1.0, 0.0], &[0.0]).is_none());
    }
}
