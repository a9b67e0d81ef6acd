//! Teacher-forced perplexity: every token is fed, and the log-probability
//! the model gave to the true next token is recorded.

use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::PolicySpec;
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::{Logits, Model};
use serde::Serialize;

/// How to run the sequence.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// The first `prefill` tokens go through one prefill chunk; the rest one
    /// decode step at a time (0 or 1 = all decode steps).
    pub prefill: usize,
    pub policy: PolicySpec,
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
    /// `logprobs[i] = ln p(ids[i+1] | ids[..=i])`.
    #[serde(skip)]
    pub logprobs: Vec<f64>,
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
    if opts.prefill > n {
        return Err(EngineError::Request(format!("--prefill {} is longer than the {n} tokens", opts.prefill)));
    }
    let v = model.config.vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= v) {
        return Err(kvslim_models::Error::TokenOutOfRange { id, vocab: v }.into());
    }
    let mut s = Session::new(model, &opts.policy, n, n);
    let mut logprobs = Vec::with_capacity(n - 1);
    let mut fed = 0;
    if opts.prefill > 1 {
        let p = opts.prefill;
        let logits = s.feed(&ids[..p], Logits::All)?;
        for i in 0..p.min(n - 1) {
            logprobs.push(log_softmax_at(&logits[i * v..(i + 1) * v], ids[i + 1] as usize));
        }
        fed = p;
        progress(fed, n);
    }
    // the last token predicts nothing, so it is not fed
    for i in fed..n - 1 {
        let logits = s.feed(&ids[i..i + 1], Logits::Last)?;
        logprobs.push(log_softmax_at(logits, ids[i + 1] as usize));
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
        logprobs,
    })
}
