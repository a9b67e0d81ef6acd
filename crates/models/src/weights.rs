//! Model weights in a layout-neutral form: every loader fills these
//! structs, and the forward pass reads nothing else.

use kvslim_kernels::Matrix;

/// A norm's affine parameters (bias only for LayerNorm models).
#[derive(Debug)]
pub struct NormWeights {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// y = W x (+ b).
#[derive(Debug)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn new(weight: Matrix, bias: Option<Vec<f32>>) -> Self {
        Linear { weight, bias }
    }

    /// out[t] = W x[t] + b for `n` rows.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.weight.matmul(x, n, out);
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(o, bi)| *o += bi);
            }
        }
    }

    /// Like [`Linear::forward`], but every row is computed with the
    /// single-row (GEMV) arithmetic, bit-identical to `n` one-row calls.
    pub fn forward_rows(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.weight.matvec_many(x, n, out);
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(o, bi)| *o += bi);
            }
        }
    }

    pub fn out_dim(&self) -> usize {
        self.weight.rows()
    }
    pub fn in_dim(&self) -> usize {
        self.weight.cols()
    }
}

/// One transformer block.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: NormWeights,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub mlp_norm: NormWeights,
    /// Present for gated MLPs (SiLU-gated Llama family).
    pub gate: Option<Linear>,
    pub up: Linear,
    pub down: Linear,
    /// Per-head RMS norm weights (`head_dim`) for queries and keys
    /// ([`crate::config::BlockFeatures::qk_norm`]).
    pub q_norm: Option<NormWeights>,
    pub k_norm: Option<NormWeights>,
    /// Norms of the attention and MLP outputs before their residual adds
    /// ([`crate::config::BlockFeatures::post_norms`]).
    pub post_attn_norm: Option<NormWeights>,
    pub post_mlp_norm: Option<NormWeights>,
}

/// All weights of a model.
#[derive(Debug)]
pub struct Weights {
    pub token_embedding: Matrix,
    pub position_embedding: Option<Matrix>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: NormWeights,
    /// `None` when the output projection is tied to the token embedding.
    pub lm_head: Option<Linear>,
}

impl Weights {
    /// The output projection (tied or not).
    pub fn output(&self) -> &Matrix {
        self.lm_head.as_ref().map_or(&self.token_embedding, |l| &l.weight)
    }

    /// Every matrix with a label, for `kvslim info` and byte accounting.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut v = vec![&self.token_embedding];
        v.extend(self.position_embedding.as_ref());
        for l in &self.layers {
            v.extend([&l.q.weight, &l.k.weight, &l.v.weight, &l.o.weight, &l.up.weight, &l.down.weight]);
            v.extend(l.gate.as_ref().map(|g| &g.weight));
        }
        v.extend(self.lm_head.as_ref().map(|l| &l.weight));
        v
    }

    /// (parameters, bytes) over matrices, norms and biases.
    pub fn size(&self) -> (usize, usize) {
        let (mut params, mut bytes) = (0usize, 0usize);
        for m in self.matrices() {
            params += m.rows() * m.cols();
            bytes += m.nbytes();
        }
        let mut vec_params = self.final_norm.weight.len() + self.final_norm.bias.as_ref().map_or(0, Vec::len);
        for l in &self.layers {
            let extra = [&l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_mlp_norm];
            for n in [&l.attn_norm, &l.mlp_norm].into_iter().chain(extra.into_iter().flatten()) {
                vec_params += n.weight.len() + n.bias.as_ref().map_or(0, Vec::len);
            }
            for lin in [&l.q, &l.k, &l.v, &l.o, &l.up, &l.down].into_iter().chain(l.gate.as_ref()) {
                vec_params += lin.bias.as_ref().map_or(0, Vec::len);
            }
        }
        (params + vec_params, bytes + vec_params * 4)
    }
}
