//! Element-wise and row-wise operations: norms, activations, softmax.

/// RMSNorm: out = x / sqrt(mean(x²) + eps) · w (Llama family).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// LayerNorm with affine weight and optional bias (GPT-2, OPT, GPT-NeoX).
pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|v| *v as f64).sum::<f64>() / n;
    let var = x.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for (i, o) in out.iter_mut().enumerate() {
        let y = ((x[i] as f64 - mean) * inv) as f32 * w[i];
        *o = y + b.map_or(0.0, |b| b[i]);
    }
}

/// Numerically stable softmax in place; returns the maximum logit.
pub fn softmax(x: &mut [f32]) -> f32 {
    let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
    max
}

/// log-softmax value of one entry, computed stably in f64.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f64 {
    logits[i] as f64 - log_sum_exp(logits)
}

/// ln Σ exp(logits), stably in f64: the normaliser of [`log_softmax_at`],
/// exposed so a caller needing several entries of one row (top-k
/// log-probs) computes it once and gets bit-identical values.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    logits.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln() + max
}

/// Activation functions used by the supported MLPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// Exact GELU via erf (`gelu`).
    GeluErf,
    Relu,
}

impl Activation {
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                let x64 = x as f64;
                let c = (2.0 / std::f64::consts::PI).sqrt();
                (0.5 * x64 * (1.0 + (c * (x64 + 0.044715 * x64.powi(3))).tanh())) as f32
            }
            Activation::GeluErf => {
                let x64 = x as f64;
                (0.5 * x64 * (1.0 + erf(x64 / std::f64::consts::SQRT_2))) as f32
            }
            Activation::Relu => x.max(0.0),
        }
    }

    /// Parses a Hugging Face `hidden_act` / `activation_function` name.
    pub fn from_hf(name: &str) -> Option<Activation> {
        Some(match name {
            "silu" | "swish" => Activation::Silu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::GeluErf,
            "relu" => Activation::Relu,
            _ => return None,
        })
    }
}

/// Error function, |error| < 1.2e-7 (Chebyshev fit of erfc, Numerical Recipes §6.2).
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let ans = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - ans
    } else {
        ans - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_known_values() {
        for (x, want) in [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (-2.0, -0.995_322_265_0)] {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x})");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_is_stable() {
        let mut x = vec![1000.0, 1001.0, 999.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn norms() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let mut o = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut o);
        let rms = (30.0f32 / 4.0).sqrt();
        assert!((o[3] - 4.0 / rms).abs() < 1e-6);
        layer_norm(&x, &[1.0; 4], Some(&[1.0; 4]), 0.0, &mut o);
        assert!((o.iter().sum::<f32>() - 4.0).abs() < 1e-5);
    }

    #[test]
    fn log_softmax_matches_definition() {
        let l = [0.5f32, -1.0, 2.0];
        let z: f64 = l.iter().map(|v| (*v as f64).exp()).sum();
        assert!((log_softmax_at(&l, 2) - (2.0 - z.ln())).abs() < 1e-12);
    }
}
