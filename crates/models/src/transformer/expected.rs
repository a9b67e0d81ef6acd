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

/// `μ += x`, and `x·xᵀ` into the upper triangle of `Σ` (`hd × hd`, with
/// the diagonal): `x_i·x_j = x_j·x_i` exactly, so [`mirror_upper`] makes
/// the sums the full matrix's would be, for half the work.
fn add_moments(mu: &mut [f64], sigma: &mut [f64], x: &[f64]) {
    let hd = x.len();
    for i in 0..hd {
        mu[i] += x[i];
        let row = &mut sigma[i * hd + i..(i + 1) * hd];
        row.iter_mut().zip(&x[i..]).for_each(|(a, &b)| *a += x[i] * b);
    }
}

/// Copies the upper triangle of `sigma` (`hd × hd`) onto the lower.
fn mirror_upper(sigma: &mut [f64], hd: usize) {
    for i in 0..hd {
        for j in i + 1..hd {
            sigma[j * hd + i] = sigma[i * hd + j];
        }
    }
}

/// Keys whose expected logits are computed together: independent sums
/// side by side instead of one long chain of dependent additions.
const KEY_LANES: usize = 8;

/// `s·μ̃·k + s²/2·kᵀΣ̃k` for the keys at `batch` (rows of `keys`, `hd`
/// wide), pushed to `out`. Every sum runs in the order of a sequential
/// `Iterator::sum` from −0.0 (as the standard library's starts), one key
/// per lane, so each logit is bit-identical to its one-key computation.
fn expected_logits(
    batch: &[usize],
    keys: &[f32],
    hd: usize,
    (mu, sigma): (&[f64], &[f64]),
    (scale, s2): (f64, f64),
    out: &mut Vec<f64>,
) {
    let lanes = batch.len();
    // xs[e][k]: element e of key k
    let mut xs = vec![[0f64; KEY_LANES]; hd];
    for (k, &j) in batch.iter().enumerate() {
        for (e, &v) in keys[j * hd..(j + 1) * hd].iter().enumerate() {
            xs[e][k] = v as f64;
        }
    }
    let (mut mean, mut quad) = ([-0.0f64; KEY_LANES], [-0.0f64; KEY_LANES]);
    for i in 0..hd {
        // (Σ̃k)_i for every lane
        let mut sk = [-0.0f64; KEY_LANES];
        for (&a, x) in sigma[i * hd..(i + 1) * hd].iter().zip(&xs) {
            sk.iter_mut().zip(x).for_each(|(o, &b)| *o += a * b);
        }
        for k in 0..KEY_LANES {
            mean[k] += mu[i] * xs[i][k];
            quad[k] += sk[k] * xs[i][k];
        }
    }
    out.extend((0..lanes).map(|k| scale * mean[k] + s2 * quad[k]));
}

impl Model {
    /// Adds every candidate's expected attention to its scores, for
    /// component `comp` of layer `li` and the chunk of `n` queries at `p0`
    /// (positioned in `s.a.q`, RoPE tables of the run's `rope_rows` rows,
    /// the chunk's first, in `s.cos`/`s.sin`).
    pub(super) fn expected_scores(
        &self,
        li: usize,
        comp: &Component,
        s: &mut Scratch,
        (p0, n, scale, rope_rows): (usize, usize, f32, usize),
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
                        let at = (kind * rope_rows + t) * half;
                        cs.iter_mut().zip(&cos[at..at + half]).for_each(|(a, &b)| *a = b as f64);
                        sn.iter_mut().zip(&sin[at..at + half]).for_each(|(a, &b)| *a = -(b as f64));
                        rotate(rp, &mut x, &cs, &sn);
                    }
                    add_moments(&mut mu, &mut sigma, &x);
                }
                mirror_upper(&mut sigma, hd);
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
                let mut logits = Vec::with_capacity(scored.len());
                for batch in scored.chunks(KEY_LANES) {
                    expected_logits(batch, keys, hd, (&mu, &sigma), (scale as f64, s2), &mut logits);
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values with signs, zeros and magnitudes.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 29 == 0 {
                    0.0
                } else {
                    ((x >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 3.0
                }
            })
            .collect()
    }

    #[test]
    fn the_upper_triangle_mirrored_is_the_full_outer_sum_bit_for_bit() {
        let hd = 13;
        let (mut mu, mut sigma) = (vec![0f64; hd], vec![0f64; hd * hd]);
        let (mut mu_full, mut sigma_full) = (vec![0f64; hd], vec![0f64; hd * hd]);
        for t in 0..40 {
            let x = values(hd, t + 1);
            add_moments(&mut mu, &mut sigma, &x);
            for i in 0..hd {
                mu_full[i] += x[i];
                let row = &mut sigma_full[i * hd..(i + 1) * hd];
                row.iter_mut().zip(&x).for_each(|(a, &b)| *a += x[i] * b);
            }
        }
        mirror_upper(&mut sigma, hd);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&mu), bits(&mu_full));
        assert_eq!(bits(&sigma), bits(&sigma_full));
    }

    #[test]
    fn keys_side_by_side_give_each_key_alone_bit_for_bit() {
        let hd = 12;
        let n = 2 * KEY_LANES + 3; // two whole batches and a partial one
        let keys: Vec<f32> = values(n * hd, 7).into_iter().map(|v| v as f32).collect();
        let (mu, sigma) = (values(hd, 8), values(hd * hd, 9));
        let (scale, s2) = (0.125, 0.125 * 0.125 / 2.0);
        let scored: Vec<usize> = (0..n).rev().collect();
        let mut got = Vec::new();
        for batch in scored.chunks(KEY_LANES) {
            expected_logits(batch, &keys, hd, (&mu, &sigma), (scale, s2), &mut got);
        }
        // one key at a time, with the standard library's sums
        let want: Vec<f64> = scored
            .iter()
            .map(|&j| {
                let x: Vec<f64> = keys[j * hd..(j + 1) * hd].iter().map(|&v| v as f64).collect();
                let sk: Vec<f64> =
                    (0..hd).map(|i| sigma[i * hd..(i + 1) * hd].iter().zip(&x).map(|(a, b)| a * b).sum()).collect();
                let mean: f64 = mu.iter().zip(&x).map(|(a, b)| a * b).sum();
                let quad: f64 = sk.iter().zip(&x).map(|(a, b)| a * b).sum();
                scale * mean + s2 * quad
            })
            .collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }
}
