//! Autoregressive generation: prefill the prompt in one chunk, then one
//! decode step per token until EOS or the token limit.

use crate::sampling::{Sampler, SamplingParams};
use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::{KvBytes, PolicySpec};
use kvslim_models::{Logits, Model};
use std::time::Instant;

/// What to generate and how.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub policy: PolicySpec,
    /// Token ids that end generation (not included in the output).
    pub eos: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    MaxTokens,
    /// The callback asked to stop (client gone, stop string seen).
    Cancelled,
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated ids only (prompt excluded, EOS excluded).
    pub token_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub stop: StopReason,
    /// Prompt prefill time including the first sampled token.
    pub time_to_first_token_s: f64,
    /// Time of all decode steps after the first token.
    pub decode_s: f64,
    pub kv_bytes: KvBytes,
}

/// Checks the prompt against the context and opens its session; returns
/// the session and how many new tokens may follow (a bounded cache may
/// continue past the trained context on RoPE models). Shared by plain,
/// beam and speculative generation.
pub(crate) fn start_session<'m>(
    model: &'m Model,
    prompt: &[u32],
    policy: &PolicySpec,
    max_tokens: usize,
) -> Result<(Session<'m>, usize)> {
    if prompt.is_empty() {
        return Err(EngineError::Request("the prompt is empty (and the tokenizer adds no BOS)".into()));
    }
    let ctx = model.config.context_len;
    if prompt.len() >= ctx {
        return Err(EngineError::Request(format!(
            "the prompt has {} tokens but the model's context is {ctx}; shorten it",
            prompt.len()
        )));
    }
    let session = Session::new(model, policy, prompt.len() + max_tokens, prompt.len())?;
    let max_new = if session.cache.policy().bounded() && model.config.learned_positions.is_none() {
        max_tokens
    } else {
        max_tokens.min(ctx - prompt.len())
    };
    Ok((session, max_new))
}

/// Generates from `prompt`; `on_token` sees each new id as it is produced
/// and returns `false` to stop early.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    opts.sampling.validate().map_err(EngineError::Request)?;
    let (mut session, max_new) = start_session(model, prompt, &opts.policy, opts.max_tokens)?;
    let mut sampler = Sampler::new(opts.sampling.clone());
    let start = Instant::now();
    let mut next = sampler.sample(session.feed(prompt, Logits::Last)?);
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut out = Vec::with_capacity(max_new);
    let mut stop = StopReason::MaxTokens;
    while out.len() < max_new {
        if opts.eos.contains(&next) {
            stop = StopReason::Eos;
            break;
        }
        out.push(next);
        if !on_token(next) {
            stop = StopReason::Cancelled;
            break;
        }
        if out.len() == max_new {
            break;
        }
        next = sampler.sample(session.feed(&[next], Logits::Last)?);
    }
    Ok(Generation {
        token_ids: out,
        prompt_tokens: prompt.len(),
        stop,
        time_to_first_token_s: ttft,
        decode_s: decode_start.elapsed().as_secs_f64(),
        kv_bytes: session.kv_bytes(),
    })
}
