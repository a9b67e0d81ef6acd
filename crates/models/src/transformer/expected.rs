//! Expected attention (`prefill=expect:F`, docs/policies.md §1 prefill):
//! a query-agnostic score for every prefill candidate. The chunk's queries
//! of a head, with RoPE undone, are summarised by their mean μ and
//! covariance Σ; a future query at position P is modelled as R_P q, with
//! R_P averaged over the next F positions (R̄). For a Gaussian query,
//! E[exp(s·q·k)] = exp(s·μ̃·k + s²·kᵀΣ̃k / 2) with μ̃ = R̄μ, Σ̃ = R̄ΣR̄ᵀ and
//! s the attention scale; its softmax over the candidates, averaged (or
//! maxed) over the KV head's query heads and times ‖v‖, is the score.
//! As NVIDIA kvpress's ExpectedAttentionPress, but from the queries
//! themselves (biases and QK norms included) rather than the hidden
//! states through W_q.

use super::scratch::Scratch;
use super::Model;
use kvslim_cache::policy::chai::Component;
use kvslim_cache::ScoreAgg;
use kvslim_kernels::rope::{Rope, RopeLayout};
use rayon::prelude::*;

/// The rotation pairs of a head of `d` dimensions under `rope`.
fn pairs(rope: &Rope) -> impl Iterator<Item = (usize, usize)> + '_ {
    let half = rope.rotary_dim / 2;
    (0..half).map(move |i| match rope.layout {
        RopeLayout::HalfSplit => (i, i + half),
        RopeLayout::AdjacentPairs => (2 * i, 2 * i + 1),
    })
}

/// `x ← R x` for the block rotation with per-pair cosines `c`, sines `s`.
fn rotate(rope: &Rope, x: &mut [f64], c: &[f64], s: &[f64]) {
    for (i, (a, b)) in pairs(rope).enumerate() {
        let (xa, xb) = (x[a], x[b]);
        x[a] = c[i] * xa - s[i] * xb;
        x[b] = s[i] * xa + c[i] * xb;
    }
}

impl Model {
    /// Adds every candidate's expected attention to its scores, for
    /// component `comp` of layer `li` and the chunk of `n` queries at `p0`
    /// (positioned in `s.a.q`, RoPE tables of the chunk in `s.cos`/`s.sin`).
    pub(super) fn expected_scores(
        &self,
        li: usize,
        comp: &Component,
        s: &mut Scratch,
        (p0, n, scale): (usize, usize, f32),
        (future, skip): (usize, usize),
    ) {
        let c = &self.config;
        let (hd, qd) = (c.head_dim, c.q_dim());
        let g = c.group_size();
        let kind = self.layer_rope[li];
        let rope = self.ropes.get(kind);
        let half = rope.map_or(0, |r| r.rotary_dim / 2);
        // R̄: the rotation averaged over the future positions
        let (mut cbar, mut sbar) = (vec![0f64; half], vec![0f64; half]);
        if let Some(r) = rope {
            let (mut cs, mut sn) = (vec![0f32; half], vec![0f32; half]);
            for p in p0 + n..p0 + n + future {
                r.tables(p as u32, &mut cs, &mut sn);
                cbar.iter_mut().zip(&cs).for_each(|(a, &b)| *a += b as f64);
                sbar.iter_mut().zip(&sn).for_each(|(a, &b)| *a += b as f64);
            }
            cbar.iter_mut().chain(sbar.iter_mut()).for_each(|x| *x /= future as f64);
        }
        let cand = &s.cand;
        let positions = cand.positions();
        let scored: Vec<usize> = (0..positions.len()).filter(|&j| positions[j] as usize >= skip).collect();
        let first = skip.saturating_sub(p0).min(n);
        let (q, cos, sin) = (&s.a.q, &s.cos, &s.sin);
        let s2 = (scale as f64) * (scale as f64) / 2.0;
        // per representative: softmax of the expected logits over `scored`
        let rows: Vec<Vec<f64>> = comp
            .reps
            .par_iter()
            .map(|&r| {
                let (mut mu, mut sigma) = (vec![0f64; hd], vec![0f64; hd * hd]);
                let mut x = vec![0f64; hd];
                let (mut cs, mut sn) = (vec![0f64; half], vec![0f64; half]);
                for t in first..n {
                    x.iter_mut().zip(&q[t * qd + r * hd..t * qd + (r + 1) * hd]).for_each(|(a, &b)| *a = b as f64);
                    if let Some(rp) = rope {
                        // undo the rotation at p0 + t: rotate by its negative angle
                        let at = (kind * n + t) * half;
                        cs.iter_mut().zip(&cos[at..at + half]).for_each(|(a, &b)| *a = b as f64);
                        sn.iter_mut().zip(&sin[at..at + half]).for_each(|(a, &b)| *a = -(b as f64));
                        rotate(rp, &mut x, &cs, &sn);
                    }
                    for i in 0..hd {
                        mu[i] += x[i];
                        let row = &mut sigma[i * hd..(i + 1) * hd];
                        row.iter_mut().zip(&x).for_each(|(a, &b)| *a += x[i] * b);
                    }
                }
                let m = (n - first).max(1) as f64;
                mu.iter_mut().for_each(|v| *v /= m);
                for i in 0..hd {
                    for j in 0..hd {
                        sigma[i * hd + j] = sigma[i * hd + j] / m - mu[i] * mu[j];
                    }
                }
                if let Some(rp) = rope {
                    rotate(rp, &mut mu, &cbar, &sbar);
                    // Σ̃ = R̄ Σ R̄ᵀ: rotate every column, then every row
                    let mut col = vec![0f64; hd];
                    for j in 0..hd {
                        (0..hd).for_each(|i| col[i] = sigma[i * hd + j]);
                        rotate(rp, &mut col, &cbar, &sbar);
                        (0..hd).for_each(|i| sigma[i * hd + j] = col[i]);
                    }
                    for row in sigma.chunks_exact_mut(hd) {
                        rotate(rp, row, &cbar, &sbar);
                    }
                }
                let keys = cand.keys(r / g);
                // (x is reused for the key, in f64)
                let mut sk = vec![0f64; hd];
                let logits: Vec<f64> = scored
                    .iter()
                    .map(|&j| {
                        x.iter_mut().zip(&keys[j * hd..(j + 1) * hd]).for_each(|(a, &b)| *a = b as f64);
                        for (i, o) in sk.iter_mut().enumerate() {
                            *o = sigma[i * hd..(i + 1) * hd].iter().zip(&x).map(|(a, b)| a * b).sum();
                        }
                        let mean: f64 = mu.iter().zip(&x).map(|(a, b)| a * b).sum();
                        let quad: f64 = sk.iter().zip(&x).map(|(a, b)| a * b).sum();
                        scale as f64 * mean + s2 * quad
                    })
                    .collect();
                let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let z: f64 = e.iter().sum();
                e.into_iter().map(|v| v / z).collect()
            })
            .collect();
        let agg = cand.aggregation().unwrap_or(ScoreAgg::Sum);
        let values = cand.values(comp.leader);
        let mut add = vec![0f32; positions.len()];
        for (i, &j) in scored.iter().enumerate() {
            let col = rows.iter().map(|row| row[i]);
            let a = match agg {
                ScoreAgg::Sum => col.sum::<f64>() / rows.len() as f64,
                ScoreAgg::Max => col.fold(0.0, f64::max),
            };
            let norm = values[j * hd..(j + 1) * hd].iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt();
            add[j] = (a * norm) as f32;
        }
        s.cand.add_column_sums(&add);
    }
}
