//! Model weights in a layout-neutral form: every loader fills these
//! structs, and the forward pass reads nothing else.

use crate::config::ModelConfig;
use crate::{Error, Result};
use kvslim_kernels::{Matrix, Products};

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

impl LayerWeights {
    /// A classic pre-norm block: no QK norms or sandwich norms; `gate` for
    /// gated MLPs (Llama family), `None` for GPT-2, OPT and GPT-NeoX.
    pub fn pre_norm(
        attn_norm: NormWeights,
        [q, k, v]: [Linear; 3],
        o: Linear,
        mlp_norm: NormWeights,
        gate: Option<Linear>,
        [up, down]: [Linear; 2],
    ) -> LayerWeights {
        LayerWeights {
            attn_norm,
            q,
            k,
            v,
            o,
            mlp_norm,
            gate,
            up,
            down,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_mlp_norm: None,
        }
    }

    /// [`Weights::check_against`] for layer `i`.
    fn check_against(&self, i: usize, c: &ModelConfig) -> Result<()> {
        let (d, f) = (c.hidden_size, c.ffn_size);
        let projections = [
            ("q", &self.q, (c.q_dim(), d)),
            ("k", &self.k, (c.kv_dim(), d)),
            ("v", &self.v, (c.kv_dim(), d)),
            ("o", &self.o, (d, c.q_dim())),
            ("up", &self.up, (f, d)),
            ("down", &self.down, (d, f)),
        ];
        for (name, lin, want) in projections.into_iter().chain(self.gate.as_ref().map(|g| ("gate", g, (f, d)))) {
            check_dims(&format!("layer {i} {name}"), &lin.weight, want)?;
        }
        match (&self.gate, c.gated_mlp) {
            (Some(_), true) | (None, false) => {}
            (Some(_), false) => {
                return Err(mismatch(format!("layer {i} has an MLP gate but the config says gated_mlp = false")))
            }
            (None, true) => return Err(Error::MissingTensor(format!("layer {i} gate (the config says gated_mlp)"))),
        }
        let feat = &c.features;
        let optional = [
            ("q_norm", self.q_norm.as_ref(), feat.qk_norm, c.head_dim),
            ("k_norm", self.k_norm.as_ref(), feat.qk_norm, c.head_dim),
            ("post_attn_norm", self.post_attn_norm.as_ref(), feat.post_norms, d),
            ("post_mlp_norm", self.post_mlp_norm.as_ref(), feat.post_norms, d),
        ];
        for (name, w, wanted, len) in optional {
            match (w, wanted) {
                (Some(w), true) if w.weight.len() == len => {}
                (Some(w), true) => {
                    return Err(Error::ShapeMismatch {
                        name: format!("layer {i} {name}"),
                        expected: vec![len],
                        got: vec![w.weight.len()],
                    })
                }
                (None, false) => {}
                (Some(_), false) => {
                    return Err(mismatch(format!("layer {i} has {name} weights but the config does not use them")))
                }
                (None, true) => return Err(Error::MissingTensor(format!("layer {i} {name}"))),
            }
        }
        Ok(())
    }
}

/// A matrix of the wrong shape, named `name` in the error.
fn check_dims(name: &str, m: &Matrix, want: (usize, usize)) -> Result<()> {
    let got = (m.rows(), m.cols());
    if got == want {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { name: name.into(), expected: vec![want.0, want.1], got: vec![got.0, got.1] })
    }
}

/// Weights and config disagree on whether a tensor exists.
fn mismatch(reason: impl Into<String>) -> Error {
    Error::InvalidModel(reason.into())
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
    /// Switches every weight matrix to `products` (see
    /// [`kvslim_kernels::Products`]): `F32` for results that equal the
    /// dequantized model's to f32 rounding (parity tests), `Int8` for speed.
    pub fn set_products(&mut self, products: Products) {
        let linears = self.layers.iter_mut().flat_map(|l| {
            [
                Some(&mut l.q),
                Some(&mut l.k),
                Some(&mut l.v),
                Some(&mut l.o),
                l.gate.as_mut(),
                Some(&mut l.up),
                Some(&mut l.down),
            ]
        });
        for lin in linears.flatten().chain(self.lm_head.as_mut()) {
            lin.weight.set_products(products);
        }
        self.token_embedding.set_products(products);
    }

    /// Checks that these weights are the ones `c` describes: every matrix
    /// has the shape the config implies, and every optional tensor (MLP
    /// gate, untied output head, learned positions, QK and sandwich norms)
    /// is present exactly when the config's flag asks for it. The forward
    /// pass reads the flags and the weights; after this check the two
    /// cannot disagree, so a loader bug is a load error naming the tensor
    /// instead of a wrong answer or a panic.
    pub fn check_against(&self, c: &ModelConfig) -> Result<()> {
        check_dims("token_embedding", &self.token_embedding, (c.vocab_size, c.hidden_size))?;
        check_dims("output", self.output(), (c.vocab_size, c.hidden_size))?;
        if self.lm_head.is_none() != c.tied_embeddings {
            let (has, says) = if c.tied_embeddings { ("a separate", "tied") } else { ("no", "untied") };
            return Err(mismatch(format!(
                "the weights have {has} output head but the config says the embeddings are {says} \
                 (tied_embeddings = {})",
                c.tied_embeddings
            )));
        }
        match (&self.position_embedding, c.learned_positions) {
            (Some(pe), Some(offset)) => {
                check_dims("position_embedding", pe, (c.context_len + offset, c.hidden_size))?;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(mismatch("the weights have learned position embeddings but the config uses none"))
            }
            (None, Some(_)) => return Err(Error::MissingTensor("position_embedding".into())),
        }
        if self.layers.len() != c.n_layers {
            return Err(Error::ShapeMismatch {
                name: "layers".into(),
                expected: vec![c.n_layers],
                got: vec![self.layers.len()],
            });
        }
        for (i, l) in self.layers.iter().enumerate() {
            l.check_against(i, c)?;
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Architecture, BlockFeatures, NormKind, SourceFormat};
    use crate::transformer::Model;
    use kvslim_kernels::ops::Activation;

    const D: usize = 8;
    const F: usize = 16;
    const V: usize = 12;

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            format: SourceFormat::HfSafetensors,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            hidden_size: D,
            ffn_size: F,
            vocab_size: V,
            context_len: 32,
            norm: NormKind::Rms,
            norm_eps: 1e-5,
            activation: Activation::Silu,
            gated_mlp: true,
            rope: None,
            learned_positions: None,
            parallel_residual: false,
            tied_embeddings: true,
            bos_token_id: None,
            eos_token_ids: vec![],
            features: BlockFeatures::default(),
        }
    }

    fn linear(rows: usize, cols: usize) -> Linear {
        Linear::new(Matrix::from_f32(rows, cols, &vec![0.01; rows * cols]).unwrap(), None)
    }

    fn norm(len: usize) -> NormWeights {
        NormWeights { weight: vec![1.0; len], bias: None }
    }

    /// Weights matching [`config`]: gated MLP, tied output.
    fn weights() -> Weights {
        let layer = || {
            LayerWeights::pre_norm(
                norm(D),
                [linear(8, D), linear(4, D), linear(4, D)],
                linear(D, 8),
                norm(D),
                Some(linear(F, D)),
                [linear(F, D), linear(D, F)],
            )
        };
        Weights {
            token_embedding: linear(V, D).weight,
            position_embedding: None,
            layers: vec![layer(), layer()],
            final_norm: norm(D),
            lm_head: None,
        }
    }

    /// The error `check_against` gives, also through `Model::new` (an
    /// error there, never a panic).
    fn error(w: Weights, c: ModelConfig) -> String {
        let e = w.check_against(&c).expect_err("a mismatch").to_string();
        let through_model = Model::new(c, w).err().expect("Model::new refuses it too").to_string();
        assert_eq!(e, through_model);
        e
    }

    #[test]
    fn consistent_weights_pass() {
        assert!(weights().check_against(&config()).is_ok());
        let mut w = weights();
        w.lm_head = Some(linear(V, D));
        assert!(w.check_against(&ModelConfig { tied_embeddings: false, ..config() }).is_ok());
    }

    #[test]
    fn gate_present_iff_gated_mlp() {
        let e = error(weights(), ModelConfig { gated_mlp: false, ..config() });
        assert!(e.contains("layer 0 has an MLP gate") && e.contains("gated_mlp = false"), "{e}");
        let mut w = weights();
        w.layers[1].gate = None;
        let e = error(w, config());
        assert!(e.contains("`layer 1 gate") && e.contains("missing"), "{e}");
    }

    #[test]
    fn output_tied_iff_tied_embeddings() {
        let e = error(weights(), ModelConfig { tied_embeddings: false, ..config() });
        assert!(e.contains("no output head") && e.contains("untied"), "{e}");
        let mut w = weights();
        w.lm_head = Some(linear(V, D));
        let e = error(w, config());
        assert!(e.contains("a separate output head") && e.contains("tied_embeddings = true"), "{e}");
    }

    #[test]
    fn learned_positions_need_their_table() {
        let e = error(weights(), ModelConfig { learned_positions: Some(2), ..config() });
        assert!(e.contains("position_embedding") && e.contains("missing"), "{e}");
        let mut w = weights();
        w.position_embedding = Some(linear(32, D).weight);
        let e = error(w, ModelConfig { learned_positions: Some(2), ..config() });
        assert!(e.contains("position_embedding") && e.contains("[34, 8]"), "{e}");
        let mut w = weights();
        w.position_embedding = Some(linear(32, D).weight);
        let e = error(w, config());
        assert!(e.contains("learned position embeddings"), "{e}");
    }

    #[test]
    fn shapes_and_block_features_are_checked() {
        let mut w = weights();
        w.layers[0].k = linear(8, D);
        let e = error(w, config());
        assert!(e.contains("layer 0 k") && e.contains("[4, 8]"), "{e}");
        let mut w = weights();
        w.layers.pop();
        assert!(error(w, config()).contains("`layers`"));
        let qk = ModelConfig { features: BlockFeatures { qk_norm: true, ..Default::default() }, ..config() };
        let e = error(weights(), qk);
        assert!(e.contains("layer 0 q_norm") && e.contains("missing"), "{e}");
        let mut w = weights();
        w.layers[0].post_mlp_norm = Some(norm(D));
        let e = error(w, config());
        assert!(e.contains("post_mlp_norm weights but the config does not use them"), "{e}");
    }
}
