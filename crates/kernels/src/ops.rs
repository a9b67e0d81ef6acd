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

/// The sum of `x` as a read-bandwidth probe reads it: 64 independent
/// partial sums, enough additions in flight that a pass over a buffer
/// larger than the caches is limited by memory, not by add latency (even
/// with SSE2 only). A tail shorter than 64 values is not read. `kvslim
/// bench` and `dotbench` measure the machine's bandwidth with it.
pub fn streaming_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 64];
    for v in x.chunks_exact(64) {
        for i in 0..64 {
            acc[i] += v[i];
        }
    }
    acc.iter().sum()
}

/// log-softmax value of one entry, computed stably in f64.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f64 {
    logits[i] as f64 - log_sum_exp(logits)
}

/// Defines `pub fn $name` running `$lanes` (an `#[inline(always)]` loop
/// written over independent lanes) compiled for the widest vectors the CPU
/// has. Rust forms no fused multiply-adds on its own, so every copy gives
/// the baseline's bits.
macro_rules! widest_vectors {
    ($(#[$m:meta])* pub fn $name:ident($($a:ident: $t:ty),*) -> $r:ty = $lanes:ident) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($a: $t),*) -> $r {
                    $lanes($($a),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($a: $t),*) -> $r {
                    $lanes($($a),*)
                }
                // SAFETY: each copy runs only where its one feature is present.
                if is_x86_feature_detected!("avx512f") {
                    return unsafe { avx512($($a),*) };
                }
                if is_x86_feature_detected!("avx2") {
                    return unsafe { avx2($($a),*) };
                }
            }
            $lanes($($a),*)
        }
    };
}

widest_vectors! {
    /// ln Σ exp(logits), stably: the normaliser of [`log_softmax_at`],
    /// exposed so a caller needing several entries of one row (top-k
    /// log-probs) computes it once and gets bit-identical values. Each term
    /// is [`exp_nonpositive`] in f64 (within a few ulps of libm's `exp`),
    /// summed in f64: scoring takes one of these per predicted token over
    /// the whole vocabulary, where a scalar libm `exp` per entry cost
    /// 0.28 ms on SmolLM2's 49,152 logits (`dotbench --softmax`).
    pub fn log_sum_exp(logits: &[f32]) -> f64 = log_sum_exp_lanes
}

widest_vectors! {
    /// KL(p ‖ q) in nats between the softmax distributions of two logit
    /// rows of equal length (the full cache's and a policy's), in f64 with
    /// [`exp_nonpositive`] terms; never negative (rounding is clamped at 0).
    /// Panics if the rows differ in length.
    pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 = kl_divergence_lanes
}

const LANES: usize = 16;

#[inline(always)]
fn kl_divergence_lanes(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    assert_eq!(p_logits.len(), q_logits.len(), "logit rows differ in length");
    let (lp, lq) = (log_sum_exp_lanes(p_logits), log_sum_exp_lanes(q_logits));
    let term = |a: f32, b: f32| {
        let la = a as f64 - lp;
        let p = exp_nonpositive(la);
        // p = 0 (a = −∞ or negligible) adds nothing, even where q is −∞
        if p == 0.0 {
            0.0
        } else {
            p * (la - (b as f64 - lq))
        }
    };
    let mut lane_sum = [0f64; LANES];
    let (pc, qc) = (p_logits.chunks_exact(LANES), q_logits.chunks_exact(LANES));
    let tail: f64 = pc.remainder().iter().zip(qc.remainder()).map(|(a, b)| term(*a, *b)).sum();
    for (p, q) in pc.zip(qc) {
        for ((s, a), b) in lane_sum.iter_mut().zip(p).zip(q) {
            *s += term(*a, *b);
        }
    }
    (lane_sum.iter().sum::<f64>() + tail).max(0.0)
}

#[inline(always)]
fn log_sum_exp_lanes(logits: &[f32]) -> f64 {
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks.clone() {
        for (m, v) in lane_max.iter_mut().zip(c) {
            *m = if *v > *m { *v } else { *m };
        }
    }
    let max = tail.iter().chain(&lane_max).cloned().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // every entry −∞ or NaN: the lane sums below would not see a NaN
        return if logits.iter().any(|v| v.is_nan()) { f64::NAN } else { f64::NEG_INFINITY };
    }
    let max = max as f64;
    let mut lane_sum = [0f64; LANES];
    for c in chunks {
        for (s, v) in lane_sum.iter_mut().zip(c) {
            *s += exp_nonpositive(*v as f64 - max);
        }
    }
    let sum = lane_sum.iter().sum::<f64>() + tail.iter().map(|v| exp_nonpositive(*v as f64 - max)).sum::<f64>();
    sum.ln() + max
}

/// The body of [`exp_nonpositive`] and [`exp_score`]: `x` clamped at
/// `floor`, split as n·ln2 + r (`ln2_hi + ln2_lo`, n rounded by adding
/// `round`), e^r by Horner's rule over the Taylor coefficients
/// `c[0..=degree]`, and 2^n written into the exponent bits (the float, its
/// signed and unsigned integer types, exponent bias, mantissa bits); 0
/// below `floor`.
macro_rules! exp_by_reduction {
    ($x:ident, floor: $floor:literal, ($log2e:ident, $ln2_hi:ident, $ln2_lo:ident, $round:ident),
     taylor: $c:ident[$degree:literal], bits: ($float:ty, $int:ty, $uint:ty, $bias:literal, $mantissa:literal)) => {{
        let xc = if $x < $floor { $floor } else { $x };
        let t = xc * $log2e + $round;
        let n = t - $round;
        let ni = (t.to_bits() as $int).wrapping_sub($round.to_bits() as $int);
        let r = (xc - n * $ln2_hi) - n * $ln2_lo;
        let mut p = $c[$degree];
        for &c in $c[..$degree].iter().rev() {
            p = p * r + c;
        }
        let scale = <$float>::from_bits((ni.wrapping_add($bias) << $mantissa) as $uint);
        if $x < $floor {
            0.0
        } else {
            p * scale
        }
    }};
}

/// e^x for x ≤ 0 in f64 without a libm call, branch-free so loops over it
/// vectorize: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-12 Taylor
/// polynomial (truncation below 2e-16), 2^n put into the exponent bits.
/// Within a few ulps of the exact value; below −708 (e^x < 3.3e-308) it
/// returns 0; NaN in, NaN out (so a NaN logit makes [`log_sum_exp`] NaN,
/// as the maximum ignores it).
#[inline(always)]
pub fn exp_nonpositive(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for every |n| < 2^20
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    // adding 1.5·2^52 rounds to an integer, held in the low mantissa bits
    const ROUND: f64 = 6_755_399_441_055_744.0;
    const C: [f64; 13] = {
        let mut c = [1.0; 13];
        let mut k = 1;
        while k < 13 {
            c[k] = c[k - 1] / k as f64;
            k += 1;
        }
        c
    };
    exp_by_reduction!(x, floor: -708.0, (LOG2E, LN2_HI, LN2_LO, ROUND), taylor: C[12], bits: (f64, i64, u64, 1023, 52))
}

/// e^x for an attention score minus its row's maximum (x ≤ 0), in f32
/// without a libm call: softmax spends most of its time here (one
/// exponential per query and key). Branch-free plain arithmetic (no fused
/// multiply-add, so the result is the same on every CPU and in every lane),
/// so loops over it vectorize even for baseline x86-64 and lanes agree with
/// the scalar tail bit for bit. x = n·ln2 + r with |r| ≤ ln2/2, e^r by its
/// degree-7 Taylor polynomial, 2^n put into the exponent bits. Within 2e-7
/// relative of the exact value; below −87 (e^x < 1.7e-38, nothing next to
/// the row maximum's 1) and at −∞ it returns exactly 0, never a subnormal.
#[inline(always)]
pub fn exp_score(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2^8
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // adding 1.5·2^23 rounds to an integer, held in the low mantissa bits
    const ROUND: f32 = 12_582_912.0;
    const C: [f32; 8] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];
    exp_by_reduction!(x, floor: -87.0, (LOG2E, LN2_HI, LN2_LO, ROUND), taylor: C[7], bits: (f32, i32, u32, 127, 23))
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

    #[test]
    fn kl_divergence_matches_f64_reference() {
        let p: Vec<f32> = (0..5003u32).map(|i| ((i * 7919 % 1000) as f32 / 100.0).cos() * 6.0).collect();
        let mut q: Vec<f32> = p.iter().enumerate().map(|(i, v)| v + ((i % 13) as f32 - 6.0) * 0.05).collect();
        let lse = |l: &[f32]| {
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            l.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m
        };
        let (lp, lq) = (lse(&p), lse(&q));
        let want: f64 =
            p.iter().zip(&q).map(|(a, b)| (*a as f64 - lp).exp() * ((*a as f64 - lp) - (*b as f64 - lq))).sum();
        assert!(want > 1e-3);
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-12, "{} vs {want}", kl_divergence(&p, &q));
        assert_eq!(kl_divergence(&p, &p), 0.0);
        // rows that differ by rounding only: KL stays at their true, tiny value
        let nudged: Vec<f32> =
            p.iter().enumerate().map(|(i, v)| if i % 3 == 0 { v + v.abs() * 1e-7 } else { *v }).collect();
        let tiny: f64 = {
            let ln = lse(&nudged);
            p.iter().zip(&nudged).map(|(a, b)| (*a as f64 - lp).exp() * ((*a as f64 - lp) - (*b as f64 - ln))).sum()
        };
        assert!((kl_divergence(&p, &nudged) - tiny.max(0.0)).abs() < 1e-14, "{} vs {tiny}", kl_divergence(&p, &nudged));
        // a token impossible under both adds nothing
        q[7] = f32::NEG_INFINITY;
        let mut p2 = p.clone();
        p2[7] = f32::NEG_INFINITY;
        assert!(kl_divergence(&p2, &q).is_finite());
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 3]), f64::NEG_INFINITY);
        assert!(log_sum_exp(&[f32::NAN, f32::NEG_INFINITY]).is_nan());
    }

    #[test]
    fn exp_nonpositive_is_accurate_over_its_range() {
        let mut worst = 0f64;
        for i in 0..7_079_000 {
            let x = -(i as f64) * 1e-4 - (i % 7) as f64 * 1.3e-6;
            let want = x.exp();
            worst = worst.max(((exp_nonpositive(x) - want) / want).abs());
        }
        assert!(worst < 1e-15, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(-800.0), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }

    #[test]
    fn exp_score_is_accurate_over_its_range() {
        let mut worst = 0f64;
        for i in 0..8_800_000 {
            let x = -(i as f32) * 1e-5 - (i % 7) as f32 * 1.3e-7;
            let want = f64::from(x).exp();
            let got = f64::from(exp_score(x));
            if x >= -87.0 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                assert_eq!(got, 0.0, "{x}");
            }
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(exp_score(0.0), 1.0);
        assert_eq!(exp_score(f32::NEG_INFINITY), 0.0);
        assert!(exp_score(-86.9) >= f32::MIN_POSITIVE, "no subnormals");
    }

    #[test]
    fn log_sum_exp_matches_f64_reference_on_a_vocabulary_row() {
        // a vocabulary-sized row with a spread like real logits, and a tail
        // that is not a multiple of the lane count
        let row: Vec<f32> = (0..49_157u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) as f32 / 65536.0).sin() * 12.0 - 3.0)
            .collect();
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let want = row.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln() + max;
        assert!((log_sum_exp(&row) - want).abs() < 1e-12, "{} vs {want}", log_sum_exp(&row));
        // the wide copies the CPU dispatches to give the baseline's bits
        assert_eq!(log_sum_exp(&row).to_bits(), log_sum_exp_lanes(&row).to_bits());
        for n in [1, 15, 16, 17] {
            let short = &row[..n];
            let m = short.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let w = short.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m;
            assert!((log_sum_exp(short) - w).abs() < 1e-12, "n = {n}");
        }
        let mut bad = row.clone();
        bad[40_000] = f32::NAN;
        assert!(log_sum_exp(&bad).is_nan());
    }
}
