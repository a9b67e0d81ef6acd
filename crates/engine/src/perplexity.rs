//! Teacher-forced perplexity: every token is fed, and the log-probability
//! the model gave to the true next token is recorded. Optionally a
//! full-cache run of the same tokens goes alongside (`compare_full`) to
//! measure what the policy changed: KL(full‖policy), top-1 agreement and
//! the attention mass the full cache would have put outside D_t.

use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::policy::EvictionEvent;
use kvslim_cache::PolicySpec;
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::{Logits, Model, Trace};
use serde::Serialize;

/// How to run the sequence.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// The first `prefill` tokens go through one prefill chunk; the rest one
    /// decode step at a time (0 or 1 = all decode steps).
    pub prefill: usize,
    pub policy: PolicySpec,
    /// Run the full cache alongside and report divergence.
    pub compare_full: bool,
    /// Record eviction events at steps divisible by this (None = off).
    pub trace_every: Option<u32>,
}

impl PerplexityOptions {
    pub fn new(policy: PolicySpec) -> Self {
        PerplexityOptions { prefill: 0, policy, compare_full: false, trace_every: None }
    }
}

/// Mean and low percentiles of a distribution.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub p1: f64,
    pub p5: f64,
    pub count: usize,
}

impl Summary {
    pub fn of(values: &mut [f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        let pct = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
        Summary {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p1: pct(0.01),
            p5: pct(0.05),
            count: values.len(),
        }
    }
}

/// Divergence from the full cache on the same tokens.
#[derive(Clone, Debug, Serialize)]
pub struct FullComparison {
    /// Mean KL(full ‖ policy) of the next-token distributions, nats.
    pub kl_mean: f64,
    /// Fraction of positions where both runs rank the same token first.
    pub top1_agreement: f64,
    /// Retained attention mass 1 − m_t over decode steps and query heads.
    pub retained_mass: Summary,
    pub retained_mass_per_layer: Vec<Summary>,
    /// Every (step, layer, query head) retained mass, for pooling across runs.
    #[serde(skip)]
    pub retained_mass_samples: Vec<f64>,
    /// Mean NLL of the full cache on the same tokens.
    pub full_nll: f64,
}

/// Result of a perplexity run (the CLI's `--json` object).
#[derive(Clone, Debug, Serialize)]
pub struct PerplexityReport {
    /// Number of tokens in the sequence.
    pub tokens: usize,
    /// Mean negative log-likelihood in nats over the `tokens - 1` predictions.
    pub nll: f64,
    pub ppl: f64,
    pub kv_bytes_allocated: usize,
    pub kv_metadata_bytes: usize,
    pub policy: String,
    /// Slot budget per (layer, KV head), when the policy has one.
    pub budget_slots: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare_full: Option<FullComparison>,
    /// CHAI policies: per layer, the clusters (sorted query-head lists,
    /// ordered by first head) and their representatives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chai_clusters: Option<Vec<kvslim_cache::policy::chai::LayerClustersReport>>,
    /// `logprobs[i] = ln p(ids[i+1] | ids[..=i])`.
    #[serde(skip)]
    pub logprobs: Vec<f64>,
    /// Retained positions per layer and KV head after the last token.
    #[serde(skip)]
    pub kept: Vec<Vec<Vec<u32>>>,
    /// Eviction events (when tracing).
    #[serde(skip)]
    pub events: Vec<EvictionEvent>,
}

fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lse = |l: &[f32]| {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        l.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m
    };
    let (lp, lq) = (lse(p_logits), lse(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(a, b)| {
            let la = *a as f64 - lp;
            la.exp() * (la - (*b as f64 - lq))
        })
        .sum()
}

/// Runs teacher forcing over `ids`; `progress(done, total)` is called as
/// tokens are processed.
pub fn perplexity(
    model: &Model,
    ids: &[u32],
    opts: &PerplexityOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    let n = ids.len();
    if n < 2 {
        return Err(EngineError::Request(format!("perplexity needs at least 2 tokens, got {n}")));
    }
    let bounded = opts.policy.build(n).bounded() && model.config.learned_positions.is_none();
    if n > model.config.context_len && !bounded {
        return Err(EngineError::Request(format!(
            "{n} tokens exceed the model's context of {} (only a bounded policy on a RoPE model may go past it); use --max-tokens",
            model.config.context_len
        )));
    }
    if opts.compare_full && n > model.config.context_len {
        return Err(EngineError::Request(format!(
            "--compare-full runs the full cache, which cannot go past the context of {} tokens",
            model.config.context_len
        )));
    }
    if opts.prefill > n {
        return Err(EngineError::Request(format!("--prefill {} is longer than the {n} tokens", opts.prefill)));
    }
    let v = model.config.vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= v) {
        return Err(kvslim_models::Error::TokenOutOfRange { id, vocab: v }.into());
    }
    let mut s = Session::new(model, &opts.policy, n, n)?;
    if let Some(every) = opts.trace_every {
        s.cache.policy.enable_trace(every);
    }
    let mut full = if opts.compare_full { Some(Session::new(model, &PolicySpec::full(), n, n)?) } else { None };
    let mut cmp = CompareAcc::new(model.config.n_layers);
    let mut logprobs = Vec::with_capacity(n - 1);
    let mut fed = 0;
    if opts.prefill > 1 {
        let p = opts.prefill;
        let logits = s.feed(&ids[..p], Logits::All)?;
        for i in 0..p.min(n - 1) {
            logprobs.push(log_softmax_at(&logits[i * v..(i + 1) * v], ids[i + 1] as usize));
        }
        if let Some(f) = full.as_mut() {
            let fl = f.feed(&ids[..p], Logits::All)?.to_vec();
            let logits = s.scratch.logits();
            for i in 0..p.min(n - 1) {
                cmp.logits(&fl[i * v..(i + 1) * v], &logits[i * v..(i + 1) * v], ids[i + 1] as usize);
            }
        }
        fed = p;
        progress(fed, n);
    }
    // the last token predicts nothing, so it is not fed
    for i in fed..n - 1 {
        if let Some(f) = full.as_mut() {
            f.scratch.trace = Some(Trace::default());
            s.scratch.trace = Some(Trace::default());
            f.feed(&ids[i..i + 1], Logits::Last)?;
        }
        let logits = s.feed(&ids[i..i + 1], Logits::Last)?;
        logprobs.push(log_softmax_at(logits, ids[i + 1] as usize));
        if let Some(f) = full.as_mut() {
            cmp.logits(f.scratch.logits(), s.scratch.logits(), ids[i + 1] as usize);
            let (ft, pt) = (f.scratch.trace.take().expect("set above"), s.scratch.trace.take().expect("set above"));
            cmp.mass(model, &ft, &pt);
        }
        if i % 16 == 0 {
            progress(i + 1, n);
        }
    }
    progress(n, n);
    let nll = -logprobs.iter().sum::<f64>() / logprobs.len() as f64;
    let bytes = s.kv_bytes();
    Ok(PerplexityReport {
        tokens: n,
        nll,
        ppl: nll.exp(),
        kv_bytes_allocated: bytes.kv,
        kv_metadata_bytes: bytes.metadata,
        policy: opts.policy.to_string(),
        budget_slots: opts.policy.budget(n),
        compare_full: full.is_some().then(|| cmp.finish()),
        chai_clusters: s.cache.heads.as_ref().map(|h| h.report()),
        logprobs,
        kept: s.cache.store.kept_positions(),
        events: s.cache.policy.take_events(),
    })
}

/// Accumulates the full-cache comparison.
struct CompareAcc {
    kl: Vec<f64>,
    agree: usize,
    full_nll: Vec<f64>,
    mass: Vec<Vec<f64>>,
}

impl CompareAcc {
    fn new(layers: usize) -> Self {
        CompareAcc { kl: Vec::new(), agree: 0, full_nll: Vec::new(), mass: vec![Vec::new(); layers] }
    }

    fn logits(&mut self, full: &[f32], policy: &[f32], target: usize) {
        self.kl.push(kl(full, policy).max(0.0));
        if crate::sampling::argmax(full) == crate::sampling::argmax(policy) {
            self.agree += 1;
        }
        self.full_nll.push(-log_softmax_at(full, target));
    }

    /// Retained mass Σ_{i∈D_t} a^full_{t,i} per layer and query head.
    fn mass(&mut self, model: &Model, full: &Trace, policy: &Trace) {
        let c = &model.config;
        let g = c.group_size();
        for (l, acc) in self.mass.iter_mut().enumerate() {
            let attn = &full.attn[l];
            let ctx = full.ctx;
            for h in 0..c.n_heads {
                let row = &attn[h * ctx..(h + 1) * ctx];
                let kept = &policy.candidates[l][h / g];
                acc.push(kept.iter().map(|&p| row[p as usize] as f64).sum::<f64>().min(1.0));
            }
        }
    }

    fn finish(mut self) -> FullComparison {
        let n = self.kl.len().max(1) as f64;
        let mut all: Vec<f64> = self.mass.iter().flatten().copied().collect();
        FullComparison {
            kl_mean: self.kl.iter().sum::<f64>() / n,
            top1_agreement: self.agree as f64 / n,
            retained_mass: Summary::of(&mut all),
            retained_mass_samples: all,
            retained_mass_per_layer: self.mass.iter_mut().map(|m| Summary::of(m)).collect(),
            full_nll: self.full_nll.iter().sum::<f64>() / self.full_nll.len().max(1) as f64,
        }
    }
}
