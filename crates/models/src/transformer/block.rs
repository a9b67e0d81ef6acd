//! The steps every entry point shares, written once: input checks,
//! embedding, RoPE tables, the attention inputs (norm → Q/K/V → QK norm →
//! RoPE), the rest of a block after attention (W_O, residuals, MLP) and the
//! logits.

use super::scratch::Activations;
use super::Model;
use crate::config::{ModelConfig, NormKind};
use crate::weights::{Linear, NormWeights};
use crate::{Error, Result};
use kvslim_cache::SequenceCache;
use kvslim_kernels::attention::MAX_HEAD_DIM;
use kvslim_kernels::ops::{layer_norm, rms_norm};

/// How a chunk's matrix products are computed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Products {
    /// One GEMM for all rows (prefill, batched decode).
    Gemm,
    /// Each row with the single-row (GEMV) arithmetic, so the results are
    /// bit-identical to one decode step per token.
    PerRow,
}

impl Products {
    fn linear(self, l: &Linear, x: &[f32], n: usize, out: &mut [f32]) {
        match self {
            Products::Gemm => l.forward(x, n, out),
            Products::PerRow => l.forward_rows(x, n, out),
        }
    }
}

pub(super) fn norm(kind: NormKind, w: &NormWeights, eps: f32, x: &[f32], out: &mut [f32]) {
    match kind {
        NormKind::Rms => rms_norm(x, &w.weight, eps, out),
        NormKind::Layer => layer_norm(x, &w.weight, w.bias.as_deref(), eps, out),
    }
}

pub(super) fn norm_rows(kind: NormKind, w: &NormWeights, eps: f32, x: &[f32], out: &mut [f32], dim: usize) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        norm(kind, w, eps, xr, or);
    }
}

/// Normalises `rows` in place (a sandwich norm of a block output; `tmp`
/// is a free buffer of the same size).
fn post_norm_rows(c: &ModelConfig, w: &NormWeights, rows: &mut [f32], tmp: &mut [f32]) {
    let len = rows.len();
    tmp[..len].copy_from_slice(rows);
    norm_rows(c.norm, w, c.norm_eps, &tmp[..len], rows, c.hidden_size);
}

impl Model {
    /// Checks `tokens` for the positions `cache.next_pos()..`: ids inside
    /// the vocabulary, and positions inside the context — except that a
    /// RoPE model may run past its trained context when the cache is
    /// bounded (StreamingLLM-style); learned position tables cannot.
    pub(super) fn check_input(&self, tokens: &[u32], cache: &SequenceCache) -> Result<()> {
        let c = &self.config;
        let (p0, n) = (cache.next_pos(), tokens.len());
        let past_context_ok = c.learned_positions.is_none() && cache.bounded();
        if p0 + n > c.context_len && !past_context_ok {
            return Err(Error::ContextOverflow { pos: p0 + n - 1, context: c.context_len });
        }
        match tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            Some(&id) => Err(Error::TokenOutOfRange { id, vocab: c.vocab_size }),
            None => Ok(()),
        }
    }

    /// Embeds `tokens` (row `t` at position `pos(t)`) into `x` (`[n, hidden]`): token
    /// rows, learned positions where the model has them (`tmp` holds one
    /// row), then the embedding scale (Gemma).
    pub(super) fn embed(&self, tokens: &[u32], pos: impl Fn(usize) -> usize, x: &mut [f32], tmp: &mut [f32]) {
        let (c, w) = (&self.config, &self.weights);
        let d = c.hidden_size;
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut x[t * d..(t + 1) * d];
            w.token_embedding.row_into(tok as usize, row);
            if let (Some(pe), Some(off)) = (&w.position_embedding, c.learned_positions) {
                let pos_row = &mut tmp[..d];
                pe.row_into(pos(t) + off, pos_row);
                row.iter_mut().zip(pos_row.iter()).for_each(|(a, b)| *a += b);
            }
            if let Some(scale) = c.features.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    /// RoPE tables of rows `0..n` at positions `pos(t)` for every RoPE
    /// kind: kind `k`'s row `t` starts at `(k·n + t)·rotary_dim/2`.
    pub(super) fn rope_tables(&self, n: usize, pos: impl Fn(usize) -> usize, cos: &mut [f32], sin: &mut [f32]) {
        for (k, rope) in self.ropes.iter().enumerate() {
            let half = rope.rotary_dim / 2;
            for t in 0..n {
                let at = (k * n + t) * half;
                rope.tables(pos(t) as u32, &mut cos[at..at + half], &mut sin[at..at + half]);
            }
        }
    }

    /// Layer `li`'s attention inputs for `n` rows: norm of `a.x`, then Q, K
    /// and V projections into `a.q`, `a.k`, `a.v` (not yet positioned).
    pub(super) fn project_qkv(&self, li: usize, a: &mut Activations, n: usize, products: Products) {
        let (c, lw) = (&self.config, &self.weights.layers[li]);
        norm_rows(c.norm, &lw.attn_norm, c.norm_eps, &a.x, &mut a.xn, c.hidden_size);
        products.linear(&lw.q, &a.xn, n, &mut a.q);
        products.linear(&lw.k, &a.xn, n, &mut a.k);
        products.linear(&lw.v, &a.xn, n, &mut a.v);
    }

    /// Layer `li`'s per-head QK norm (when the model has one), then RoPE
    /// with the layer's kind of tables, on `n` rows of queries and keys
    /// (tables from [`Model::rope_tables`] for the same `n`).
    pub(super) fn position_qk(&self, li: usize, q: &mut [f32], k: &mut [f32], n: usize, cos: &[f32], sin: &[f32]) {
        let c = &self.config;
        let lw = &self.weights.layers[li];
        let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            let mut buf = [0f32; MAX_HEAD_DIM];
            for (rows, w) in [(&mut q[..n * qd], qn), (&mut k[..n * kvd], kn)] {
                for h in rows.chunks_exact_mut(hd) {
                    buf[..hd].copy_from_slice(h);
                    rms_norm(&buf[..hd], &w.weight, c.norm_eps, h);
                }
            }
        }
        let kind = self.layer_rope[li];
        let Some(rope) = self.ropes.get(kind) else { return };
        let half = rope.rotary_dim / 2;
        for t in 0..n {
            let at = (kind * n + t) * half;
            let (cs, sn) = (&cos[at..at + half], &sin[at..at + half]);
            for h in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope.apply(h, cs, sn);
            }
            for h in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope.apply(h, cs, sn);
            }
        }
    }

    /// The rest of layer `li` after attention, for `n` rows of `a` (the
    /// attention output in `att`, which may be `a.att`'s contents moved
    /// elsewhere): W_O, the residual(s) and the MLP (sequential or
    /// GPT-NeoX's parallel residual), with optional sandwich norms.
    pub(super) fn output_and_mlp(
        &self,
        li: usize,
        a: &mut Activations,
        att: Option<&[f32]>,
        n: usize,
        products: Products,
    ) {
        let (c, lw) = (&self.config, &self.weights.layers[li]);
        let d = c.hidden_size;
        let Activations { x, xn, att: own_att, proj, gate, up, .. } = a;
        products.linear(&lw.o, att.unwrap_or(own_att), n, proj);
        if let Some(pn) = &lw.post_attn_norm {
            post_norm_rows(c, pn, proj, xn);
        }
        if c.parallel_residual {
            // x + attn(ln1 x) + mlp(ln2 x): the MLP reads the block input
            norm_rows(c.norm, &lw.mlp_norm, c.norm_eps, x, xn, d);
            x.iter_mut().zip(proj.iter()).for_each(|(a, p)| *a += p);
        } else {
            x.iter_mut().zip(proj.iter()).for_each(|(a, p)| *a += p);
            norm_rows(c.norm, &lw.mlp_norm, c.norm_eps, x, xn, d);
        }
        if let Some(g) = &lw.gate {
            products.linear(g, xn, n, gate);
            products.linear(&lw.up, xn, n, up);
            for (gv, uv) in gate.iter_mut().zip(up.iter()) {
                *gv = c.activation.apply(*gv) * uv;
            }
            products.linear(&lw.down, gate, n, proj);
        } else {
            products.linear(&lw.up, xn, n, up);
            up.iter_mut().for_each(|v| *v = c.activation.apply(*v));
            products.linear(&lw.down, up, n, proj);
        }
        if let Some(pn) = &lw.post_mlp_norm {
            post_norm_rows(c, pn, proj, xn);
        }
        x.iter_mut().zip(proj.iter()).for_each(|(a, p)| *a += p);
    }

    /// Final norm of `rows` rows of hidden states `x` and the output
    /// projection into `logits` (`xn` is a free buffer).
    pub(super) fn project_logits(
        &self,
        x: &[f32],
        xn: &mut [f32],
        rows: usize,
        logits: &mut [f32],
        products: Products,
    ) {
        let (c, w) = (&self.config, &self.weights);
        let d = c.hidden_size;
        norm_rows(c.norm, &w.final_norm, c.norm_eps, x, &mut xn[..rows * d], d);
        match products {
            Products::Gemm => w.output().matmul(&xn[..rows * d], rows, logits),
            Products::PerRow => w.output().matvec_many(&xn[..rows * d], rows, logits),
        }
    }
}
