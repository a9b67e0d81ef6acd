//! Rotary position embedding. Two pair layouts exist in the wild:
//! Hugging Face / GPT-NeoX rotate (x[i], x[i + r/2]) ("half split"); GGUF
//! and llama2.c store Q/K rows permuted so that RoPE rotates adjacent pairs
//! (x[2i], x[2i+1]). Partial rotary (GPT-NeoX) rotates only the first
//! `rotary_dim` dimensions of each head.

/// Which dimensions form a rotation pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    HalfSplit,
    AdjacentPairs,
}

/// Precomputed inverse frequencies for one model.
#[derive(Clone, Debug)]
pub struct Rope {
    pub layout: RopeLayout,
    pub rotary_dim: usize,
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(theta: f32, rotary_dim: usize, layout: RopeLayout) -> Self {
        // as transformers: 1 / theta^(2i / dim), computed in f32
        let inv_freq = (0..rotary_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32)).collect();
        Rope { layout, rotary_dim, inv_freq }
    }

    /// Rounds the inverse frequencies to bfloat16, as transformers does when
    /// a model is cast to bf16 (the `inv_freq` buffer is cast with the
    /// weights), so bf16 checkpoints reproduce its positions exactly.
    pub fn with_bf16_frequencies(mut self) -> Self {
        use crate::f16::{bf16_to_f32, f32_to_bf16};
        self.inv_freq.iter_mut().for_each(|f| *f = bf16_to_f32(f32_to_bf16(*f)));
        self
    }

    /// Fills cos/sin tables (rotary_dim / 2 each) for one position; shared
    /// by every head and layer of that token.
    pub fn tables(&self, pos: u32, cos: &mut [f32], sin: &mut [f32]) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            cos[i] = angle.cos() as f32;
            sin[i] = angle.sin() as f32;
        }
    }

    /// Rotates one head vector in place with precomputed tables.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        match self.layout {
            RopeLayout::HalfSplit => {
                for i in 0..half {
                    let (a, b) = (x[i], x[i + half]);
                    x[i] = a * cos[i] - b * sin[i];
                    x[i + half] = b * cos[i] + a * sin[i];
                }
            }
            RopeLayout::AdjacentPairs => {
                for i in 0..half {
                    let (a, b) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = a * cos[i] - b * sin[i];
                    x[2 * i + 1] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_agree_after_permutation() {
        let d = 8;
        let x: Vec<f32> = (0..d).map(|i| i as f32 + 1.0).collect();
        // adjacent layout of the same vector: interleave the two halves
        let mut adj: Vec<f32> = (0..d / 2).flat_map(|i| [x[i], x[i + d / 2]]).collect();
        let mut half = x.clone();
        let (mut c, mut s) = (vec![0.0; d / 2], vec![0.0; d / 2]);
        for (rope_layout, v) in [(RopeLayout::HalfSplit, &mut half), (RopeLayout::AdjacentPairs, &mut adj)] {
            let r = Rope::new(10000.0, d, rope_layout);
            r.tables(7, &mut c, &mut s);
            r.apply(v, &c, &s);
        }
        for i in 0..d / 2 {
            assert!((half[i] - adj[2 * i]).abs() < 1e-6);
            assert!((half[i + d / 2] - adj[2 * i + 1]).abs() < 1e-6);
        }
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let r = Rope::new(10000.0, 4, RopeLayout::HalfSplit);
        let (mut c, mut s) = (vec![0.0; 2], vec![0.0; 2]);
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        r.tables(0, &mut c, &mut s);
        r.apply(&mut x, &c, &s);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        r.tables(13, &mut c, &mut s);
        r.apply(&mut x, &c, &s);
        let n: f32 = x[..4].iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        assert_eq!(&x[4..], &[5.0, 6.0]); // partial rotary leaves the tail
    }
}
