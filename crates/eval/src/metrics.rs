//! Comparisons of a policy's outputs with the full cache's: next-token
//! distributions (KL, top-1) and greedy generations (first divergence),
//! plus the passkey check.
//!
//! KL is [`kvslim_kernels::ops::kl_divergence`], the one the perplexity
//! engine uses.

pub use kvslim_kernels::ops::kl_divergence;

/// Index of the largest logit (first on ties).
pub fn top1(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// Whether both rows rank the same token first.
pub fn top1_agree(a: &[f32], b: &[f32]) -> bool {
    top1(a) == top1(b)
}

/// Mean KL(full ‖ policy) and top-1 agreement over rows of `vocab` logits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogitComparison {
    pub rows: usize,
    pub kl_sum: f64,
    pub agree: usize,
}

impl LogitComparison {
    /// Adds every row of two `[rows, vocab]` blocks.
    pub fn add_rows(&mut self, full: &[f32], policy: &[f32], vocab: usize) {
        assert_eq!(full.len(), policy.len());
        for (f, p) in full.chunks_exact(vocab).zip(policy.chunks_exact(vocab)) {
            self.kl_sum += kl_divergence(f, p);
            self.agree += usize::from(top1_agree(f, p));
            self.rows += 1;
        }
    }

    pub fn kl_mean(&self) -> f64 {
        self.kl_sum / self.rows.max(1) as f64
    }

    pub fn top1_agreement(&self) -> f64 {
        self.agree as f64 / self.rows.max(1) as f64
    }
}

/// The first index where two token sequences differ; when one is a prefix
/// of the other, the shorter one's length; `None` when they are identical.
pub fn first_divergence(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() == b.len() => None,
        None => Some(a.len().min(b.len())),
    }
}

/// Fraction of the first `n` tokens before the sequences diverge:
/// min(first divergence, n) / n (1 when identical over `n`).
pub fn identical_prefix_fraction(reference: &[u32], other: &[u32], n: usize) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let d = first_divergence(reference, other).unwrap_or(usize::MAX);
    d.min(n) as f64 / n as f64
}

/// Fraction of positions i < n where both sequences have the same token
/// (a missing token counts as a mismatch).
pub fn positional_agreement(reference: &[u32], other: &[u32], n: usize) -> f64 {
    if n == 0 {
        return 1.0;
    }
    (0..n).filter(|&i| matches!((reference.get(i), other.get(i)), (Some(x), Some(y)) if x == y)).count() as f64
        / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_on_hand_made_rows() {
        let p = [0f32, 0.0];
        assert_eq!(kl_divergence(&p, &p), 0.0);
        // p = (1/2, 1/2), q = (e²/(1+e²)... ) via logits (0, 2)
        let q = [0f32, 2.0];
        let q1 = 1.0 / (1.0 + 2f64.exp());
        let q2 = 1.0 - q1;
        let want = 0.5 * (0.5 / q1).ln() + 0.5 * (0.5 / q2).ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-9);
        // shifting logits does not change the distribution
        assert!((kl_divergence(&[10.0, 10.0], &[3.0, 5.0]) - want).abs() < 1e-9);
        // a zero-probability token in p contributes nothing
        assert!(kl_divergence(&[0.0, f32::NEG_INFINITY], &[0.0, 0.0]) - 2f64.ln() < 1e-9);
        let mut c = LogitComparison::default();
        c.add_rows(&[0.0, 0.0, 1.0, 0.0], &[0.0, 2.0, 3.0, 0.0], 2);
        assert_eq!(c.rows, 2);
        assert_eq!(c.agree, 1); // row 0: top1 0 vs 1; row 1: 0 vs 0
        let (p1, q1) = (1.0 / (1.0 + (-1f64).exp()), 1.0 / (1.0 + (-3f64).exp()));
        let row1 = p1 * (p1 / q1).ln() + (1.0 - p1) * ((1.0 - p1) / (1.0 - q1)).ln();
        assert!((c.kl_mean() - (want + row1) / 2.0).abs() < 1e-9);
        assert_eq!(c.top1_agreement(), 0.5);
        assert!(top1_agree(&[1.0, 3.0, 3.0], &[0.0, 1.0, 0.5]));
    }

    #[test]
    fn divergence_of_greedy_sequences() {
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_divergence(&[1, 2, 3], &[1, 2]), Some(2));
        assert_eq!(first_divergence(&[], &[]), None);
        assert_eq!(identical_prefix_fraction(&[1, 2, 3, 4], &[1, 2, 9, 4], 4), 0.5);
        assert_eq!(identical_prefix_fraction(&[1, 2, 3, 4], &[1, 2, 3, 4], 2), 1.0);
        assert_eq!(positional_agreement(&[1, 2, 3, 4], &[1, 2, 9, 4], 4), 0.75);
        assert_eq!(positional_agreement(&[1, 2, 3, 4], &[1, 2], 4), 0.5);
    }
}
