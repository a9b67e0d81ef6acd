//! Fast multiple-choice scoring: an item's context runs once and every
//! choice continues a fork of its cache (slots, scores and policy state
//! cloned; paged K/V shared until written, as beams do), and the tokens of
//! a whole block of items run through [`Model::forward_steps_batch`]
//! together: every token is still its own decode step for its sequence
//! (the policy acts at each), but each weight matrix is read once, in one
//! GEMM, for all of them.
//!
//! What it computes is [`crate::score::score_choices`]'s, with two
//! differences, both documented where the matrix uses it:
//!
//! * **budgets**: a fork shares its context's cache, so one budget serves
//!   all of an item's choices: percentage budgets resolve against the
//!   context plus the item's *longest* continuation (the per-choice path
//!   resolves against each choice's own sequence); absolute budgets are the
//!   same. A context cut on the left to fit the model's context is cut for
//!   the longest continuation too.
//! * **the full cache** (plain `full`, nothing evicted or clustered) gives
//!   the same log-likelihoods in every mode up to rounding, so it always
//!   takes the batched decode steps.
//!
//! Modes: [`ScoreMode::Decode`] runs contexts and continuations as batched
//! decode steps; [`ScoreMode::PrefillContext`] prefills each context (the
//! policy's prefill rule decides what stays) and batches the
//! continuations; [`ScoreMode::Prefill`] prefills both, one chunk each.
//!
//! Rounding: GEMMs where a solo decode step uses GEMVs, so log-likelihoods
//! match the per-choice path to about 1e-5, not bitwise.

use crate::budget::PolicySource;
use crate::error::{EvalError, Result};
use crate::score::{Choice, ChoiceScore, ScoreMode};
use kvslim_cache::{PolicySpec, SequenceCache};
use kvslim_engine::sampling::argmax;
use kvslim_engine::Session;
use kvslim_kernels::ops::log_softmax_at;
use kvslim_models::transformer::{BatchScratch, StepsItem};
use kvslim_models::{Logits, Model, Scratch};

/// Rows (tokens over all sequences) per batched call: big enough for
/// efficient GEMMs, small enough for the logits of every row
/// (`rows × vocab` floats) to stay modest.
const MAX_ROWS: usize = 256;

/// A continuation's log-likelihood so far.
#[derive(Clone, Copy)]
struct Tally {
    logprob_sum: f64,
    /// Every token so far was the model's top-1.
    greedy: bool,
}

impl Tally {
    const EMPTY: Tally = Tally { logprob_sum: 0.0, greedy: true };

    /// Scores `target` against the logits row that predicts it.
    fn take(&mut self, row: &[f32], target: u32) {
        self.logprob_sum += log_softmax_at(row, target as usize);
        self.greedy &= argmax(row) == target;
    }
}

/// Tokens to run on one cache as decode steps.
struct Job<'a> {
    cache: &'a mut SequenceCache,
    tokens: &'a [u32],
    want: Logits,
}

/// Scores every item's choices (`items[i] = (context ids, choices)`),
/// returning each item's scores in choice order. See the module doc for
/// how budgets resolve and how it rounds.
pub fn score_items<P: PolicySource + ?Sized>(
    model: &Model,
    policy: &P,
    items: &[(&[u32], &[Choice])],
    mode: ScoreMode,
) -> Result<Vec<Vec<ChoiceScore>>> {
    let max = model.config.context_len;
    let v = model.config.vocab_size;
    // per item: the context as run (cut on the left) and its cache
    let mut caches = Vec::with_capacity(items.len());
    let mut contexts = Vec::with_capacity(items.len());
    let mut all_full = true;
    for &(context, choices) in items {
        if context.is_empty() {
            return Err(EvalError::Request("scoring needs a non-empty context (BOS at least)".into()));
        }
        if choices.iter().any(|c| c.ids.is_empty()) {
            return Err(EvalError::Request("a continuation has no tokens".into()));
        }
        let longest = choices.iter().map(|c| c.ids.len()).max().unwrap_or(0);
        if longest >= max {
            return Err(EvalError::Request(format!(
                "a continuation of {longest} tokens does not fit the model's context of {max}"
            )));
        }
        let keep = context.len().min(max - longest);
        let context = &context[context.len() - keep..];
        let n = context.len() + longest;
        let spec = policy.spec_for(n)?;
        all_full &= spec == PolicySpec::full();
        caches.push(model.new_cache(&spec, n, n)?);
        contexts.push(context);
    }
    let mode = if all_full { ScoreMode::Decode } else { mode };
    let mut scratch = BatchScratch::new();
    // the context's last logits predict every choice's first token
    let mut first_rows = vec![0.0f32; items.len() * v];
    if mode == ScoreMode::Decode {
        let mut jobs: Vec<Job<'_>> =
            caches.iter_mut().zip(&contexts).map(|(cache, tokens)| Job { cache, tokens, want: Logits::Last }).collect();
        run_steps(model, &mut jobs, &mut scratch, |i, _, row| first_rows[i * v..(i + 1) * v].copy_from_slice(row))?;
    } else {
        caches = prefill_each(model, caches, &contexts, Logits::Last, |i, _, row| {
            first_rows[i * v..(i + 1) * v].copy_from_slice(row)
        })?;
    }
    // one fork per choice; the last choice takes the item's cache itself
    let mut forks = Vec::new();
    let mut owners = Vec::new();
    let mut tallies = Vec::new();
    for (i, cache) in caches.into_iter().enumerate() {
        let choices = items[i].1;
        let mut cache = Some(cache);
        for (k, c) in choices.iter().enumerate() {
            forks.push(if k + 1 == choices.len() { cache.take() } else { cache.clone() }.expect("taken once, last"));
            owners.push((i, c));
            let mut t = Tally::EMPTY;
            t.take(&first_rows[i * v..(i + 1) * v], c.ids[0]);
            tallies.push(t);
        }
    }
    // each continuation but its last token: the logits of token j predict j + 1
    let conts: Vec<&[u32]> = owners.iter().map(|(_, c)| &c.ids[..c.ids.len() - 1]).collect();
    let mut on_row = |k: usize, j: usize, row: &[f32]| tallies[k].take(row, owners[k].1.ids[j + 1]);
    if mode == ScoreMode::Prefill {
        forks = prefill_each(model, forks, &conts, Logits::All, on_row)?;
    } else {
        let mut jobs: Vec<Job<'_>> =
            forks.iter_mut().zip(&conts).map(|(cache, tokens)| Job { cache, tokens, want: Logits::All }).collect();
        run_steps(model, &mut jobs, &mut scratch, &mut on_row)?;
    }
    let mut out: Vec<Vec<ChoiceScore>> = items.iter().map(|(_, c)| Vec::with_capacity(c.len())).collect();
    for ((cache, (i, c)), t) in forks.iter().zip(&owners).zip(&tallies) {
        let bytes = cache.store().bytes();
        out[*i].push(ChoiceScore {
            logprob_sum: t.logprob_sum,
            n_tokens: c.ids.len(),
            n_chars: c.n_chars,
            greedy: t.greedy,
            kv_bytes: bytes.kv,
            kv_metadata_bytes: bytes.metadata,
        });
    }
    Ok(out)
}

/// Runs every job's tokens as decode steps, batched over jobs in calls of
/// about [`MAX_ROWS`] rows; `on_row(job, j, logits)` gets the logits of
/// token `j` of a job for each row it wants. A cache still collecting a
/// CHAI probe first runs alone, token by token, until the probe closes.
fn run_steps(
    model: &Model,
    jobs: &mut [Job<'_>],
    scratch: &mut BatchScratch,
    mut on_row: impl FnMut(usize, usize, &[f32]),
) -> Result<()> {
    let wants = |want: Logits, j: usize, n: usize| want == Logits::All || (want == Logits::Last && j + 1 == n);
    // done[k]: tokens of job k already run
    let mut done = vec![0usize; jobs.len()];
    let mut solo = Scratch::new();
    for (k, job) in jobs.iter_mut().enumerate() {
        while done[k] < job.tokens.len() && job.cache.collecting_probe() {
            let j = done[k];
            model.forward(&job.tokens[j..j + 1], job.cache, &mut solo, Logits::Last)?;
            if wants(job.want, j, job.tokens.len()) {
                on_row(k, j, solo.logits());
            }
            done[k] += 1;
        }
    }
    let mut start = 0;
    while start < jobs.len() {
        // the next group: jobs until about MAX_ROWS rows
        let mut end = start;
        let mut rows = 0;
        while end < jobs.len() && (rows == 0 || rows + jobs[end].tokens.len() - done[end] <= MAX_ROWS) {
            rows += jobs[end].tokens.len() - done[end];
            end += 1;
        }
        let mut batch: Vec<StepsItem<'_>> = jobs[start..end]
            .iter_mut()
            .zip(&done[start..end])
            .filter(|(job, &d)| d < job.tokens.len())
            .map(|(job, &d)| StepsItem { tokens: &job.tokens[d..], cache: &mut *job.cache, want: job.want })
            .collect();
        model.forward_steps_batch(&mut batch, scratch)?;
        drop(batch);
        let mut r = 0;
        for k in start..end {
            let n = jobs[k].tokens.len();
            for j in done[k]..n {
                if wants(jobs[k].want, j, n) {
                    on_row(k, j, scratch.logits(r));
                    r += 1;
                }
            }
        }
        start = end;
    }
    Ok(())
}

/// Runs each sequence's tokens as one prefill (a session feeds the
/// policy's prefill chunks and CHAI's probe as generation does);
/// `on_row(i, j, logits)` as in [`run_steps`].
fn prefill_each(
    model: &Model,
    caches: Vec<SequenceCache>,
    tokens: &[&[u32]],
    want: Logits,
    mut on_row: impl FnMut(usize, usize, &[f32]),
) -> Result<Vec<SequenceCache>> {
    let v = model.config.vocab_size;
    let mut out = Vec::with_capacity(caches.len());
    for (i, (cache, toks)) in caches.into_iter().zip(tokens).enumerate() {
        let mut s = Session::with_cache(model, cache);
        if !toks.is_empty() {
            let logits = s.feed(toks, want)?;
            match want {
                Logits::All => (0..toks.len()).for_each(|j| on_row(i, j, &logits[j * v..(j + 1) * v])),
                Logits::Last => on_row(i, toks.len() - 1, &logits[..v]),
                Logits::None => {}
            }
        }
        out.push(s.cache);
    }
    Ok(out)
}
