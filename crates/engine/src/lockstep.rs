//! Several generations decoded together: per step each running one feeds
//! one token (a forced one, such as a question's on a context's fork, or
//! the one it sampled), and all of them go through one
//! [`Model::forward_batch_exact`], which reads every weight once for the
//! step and leaves each sequence bit-identical to its own decode step. So
//! an evaluation's cells, or a context's questions under several policies,
//! cost one pass over the weights per step instead of one per generation.

use crate::generation::{take_token, Generation, StopReason};
use crate::sampling::{Sampler, SamplingParams};
use crate::session::Session;
use crate::Result;
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::Logits;
use std::time::Instant;

/// One generation in a lockstep run, on a session it borrows.
pub(crate) struct Lockstep<'a, 'm> {
    session: &'a mut Session<'m>,
    sampler: Sampler,
    eos: Vec<u32>,
    /// Fed one decode step each before the first sample (a question).
    forced: Vec<u32>,
    fed: usize,
    /// The sampled id not yet taken into `out` (nor fed).
    next: Option<u32>,
    max_new: usize,
    /// Seconds to the first sampled token (what came before, plus the
    /// lockstep's time until it sampled).
    ttft: f64,
    out: Vec<u32>,
    stop: Option<StopReason>,
    decode_s: f64,
}

impl<'a, 'm> Lockstep<'a, 'm> {
    /// A generation whose first token is sampled from `logits` (its
    /// prefill's, which took `ttft` seconds so far); at most `max_new`
    /// tokens.
    pub fn after_logits(
        session: &'a mut Session<'m>,
        sampling: SamplingParams,
        eos: Vec<u32>,
        logits: &[f32],
        (max_new, ttft): (usize, f64),
    ) -> Self {
        let start = Instant::now();
        let mut sampler = Sampler::new(sampling);
        let next = Some(sampler.sample(logits));
        let ttft = ttft + start.elapsed().as_secs_f64();
        Lockstep {
            session,
            sampler,
            eos,
            forced: Vec::new(),
            fed: 0,
            next,
            max_new,
            ttft,
            out: Vec::new(),
            stop: None,
            decode_s: 0.0,
        }
    }

    /// A generation that first feeds `forced` (non-empty), one decode step
    /// per token, and samples its first token from the last one's logits.
    pub fn after_tokens(
        session: &'a mut Session<'m>,
        sampling: SamplingParams,
        eos: Vec<u32>,
        forced: Vec<u32>,
        max_new: usize,
    ) -> Self {
        debug_assert!(!forced.is_empty(), "a forced feed needs a token");
        let sampler = Sampler::new(sampling);
        Lockstep {
            session,
            sampler,
            eos,
            forced,
            fed: 0,
            next: None,
            max_new,
            ttft: 0.0,
            out: Vec::new(),
            stop: None,
            decode_s: 0.0,
        }
    }

    /// The finished generation; `prompt_tokens` as the caller counts them.
    pub fn into_generation(self, prompt_tokens: usize) -> Generation {
        Generation {
            kv_bytes: self.session.kv_bytes(),
            token_ids: self.out,
            prompt_tokens,
            stop: self.stop.unwrap_or(StopReason::MaxTokens),
            time_to_first_token_s: self.ttft,
            decode_s: self.decode_s,
        }
    }

    /// The token this one feeds in the next step, or `None` once it stops
    /// (taking its sampled token into the output first, as a solo decode
    /// does: `on_token` sees it and may stop it).
    fn step_token(&mut self, on_token: &mut impl FnMut(u32) -> bool) -> Option<u32> {
        if self.fed < self.forced.len() {
            self.fed += 1;
            return Some(self.forced[self.fed - 1]);
        }
        if self.out.len() >= self.max_new {
            self.stop = Some(StopReason::MaxTokens);
            return None;
        }
        let t = self.next.take().expect("sampled after the forced tokens");
        self.stop = take_token(t, &self.eos, &mut self.out, on_token);
        if self.stop.is_none() && self.out.len() == self.max_new {
            self.stop = Some(StopReason::MaxTokens);
        }
        self.stop.is_none().then_some(t)
    }

    /// Whether the token just fed gives the logits to sample from (the
    /// forced tokens are all in).
    fn samples(&self) -> bool {
        self.fed >= self.forced.len()
    }

    /// Keeps `next`, sampled from the logits of the token just fed; the
    /// first sample after forced tokens ends the time to the first token.
    fn sampled(&mut self, next: u32, since: &Instant) {
        if self.out.is_empty() && self.next.is_none() && !self.forced.is_empty() {
            self.ttft += since.elapsed().as_secs_f64();
        }
        self.next = Some(next);
    }
}

/// Runs every one of `runs` until each stops, as each would alone (bit for
/// bit). `on_token(i, id)` sees run `i`'s ids and returns `false` to stop
/// it. A lone running generation, and a cache still collecting a CHAI
/// probe (it records every head), step alone.
pub(crate) fn run(runs: &mut [Lockstep<'_, '_>], mut on_token: impl FnMut(usize, u32) -> bool) -> Result<()> {
    let Some(model) = runs.first().map(|r| r.session.model) else { return Ok(()) };
    let start = Instant::now();
    let mut batch = BatchScratch::new();
    let mut fed: Vec<(usize, u32)> = Vec::with_capacity(runs.len());
    loop {
        fed.clear();
        for (i, r) in runs.iter_mut().enumerate().filter(|(_, r)| r.stop.is_none()) {
            match r.step_token(&mut |t| on_token(i, t)) {
                Some(t) => fed.push((i, t)),
                None => r.decode_s = start.elapsed().as_secs_f64(),
            }
        }
        if fed.is_empty() {
            return Ok(());
        }
        let lone = fed.len() == 1;
        let mut together = Vec::with_capacity(fed.len());
        for &(i, t) in &fed {
            let r = &mut runs[i];
            if lone || r.session.cache.collecting_probe() {
                // a forced token that is not the last needs no logits
                let samples = r.samples();
                let logits = r.session.feed(&[t], if samples { Logits::Last } else { Logits::None })?;
                let next = samples.then(|| r.sampler.sample(logits));
                if let Some(next) = next {
                    r.sampled(next, &start);
                }
            } else {
                together.push((i, t));
            }
        }
        if together.is_empty() {
            continue;
        }
        // `together` is in run order: one pass pairs each with its run
        let mut pending = together.iter().peekable();
        let mut items: Vec<BatchItem<'_>> = runs
            .iter_mut()
            .enumerate()
            .filter_map(|(i, r)| {
                let &(_, token) = pending.next_if(|(j, _)| *j == i)?;
                Some(BatchItem { token, cache: &mut r.session.cache })
            })
            .collect();
        model.forward_batch_exact(&mut items, &mut batch)?;
        drop(items);
        for (k, &(i, _)) in together.iter().enumerate() {
            let r = &mut runs[i];
            if r.samples() {
                let next = r.sampler.sample(batch.logits(k));
                r.sampled(next, &start);
            }
        }
    }
}
