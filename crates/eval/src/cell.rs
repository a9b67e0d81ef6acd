//! One cell in flight (a task's items under one policy at one budget), and
//! the machinery tasks run their items with: parallel blocks of items, and
//! greedy generations that share a prompt's prefill across the cells of a
//! task. The matrix makes the cells ([`crate::matrix`]); each task kind
//! runs and scores them ([`crate::tasks::Prepared::run`]).

use crate::budget::BudgetedPolicy;
use crate::budget::PolicySource;
use crate::error::Result;
use crate::results::{PartialCell, PartialGroup, ResultRow, Resumed};
use crate::score::{ScoreMode, Scoring};
use kvslim_cache::KvDtype;
use kvslim_engine::{generate_shared, Context, GenerateOptions, Generation, SamplingParams};
use kvslim_models::{Model, Tokenizer};
use rayon::prelude::*;
use std::time::Instant;

/// A generation task's prompts: each with the questions asked after it one
/// at a time (none: the prompt asks), the token limit, and whether a
/// generation ends with its first line.
pub type GenerationItems<'a> = (Vec<(&'a [u32], &'a [Vec<u32>])>, usize, bool);

/// What the run's configuration tells every cell's task
/// ([`crate::MatrixConfig`] has the same fields).
#[derive(Clone, Copy, Debug, Default)]
pub struct CellOptions {
    /// How multiple-choice and perplexity sequences go through the model.
    pub mode: ScoreMode,
    /// How a multiple-choice item's choices are run.
    pub scoring: Scoring,
    /// Perplexity cells also compare each policy with the full cache.
    pub compare_full: bool,
    /// Perplexity cells under a quantized KV follow the eviction decisions
    /// of this dtype's run (mode (a)).
    pub decisions_from: Option<KvDtype>,
}

/// What a task's [`crate::tasks::Prepared::run`] runs one cell with and
/// fills.
pub struct Cell<'a> {
    pub model: &'a Model,
    pub tok: &'a Tokenizer,
    pub policy: &'a BudgetedPolicy,
    pub options: CellOptions,
    pub row: &'a mut ResultRow,
    /// A journaled cell's store for its finished blocks.
    pub partial: Option<&'a mut PartialCell>,
    /// A journaled cell's blocks from an interrupted run.
    pub resumed: Resumed,
    /// Reports `(done, total)` items.
    pub report: &'a mut dyn FnMut(usize, usize),
    /// This cell's generations, run ahead with other cells sharing their
    /// prefills.
    pub(crate) shared: Option<Vec<Vec<Generation>>>,
}

impl Cell<'_> {
    /// A generation task's outputs per item (one per question, or one):
    /// from a shared run, else this cell's own.
    pub fn generations(&mut self, (items, max_tokens, first_line): GenerationItems) -> Result<Vec<Vec<Generation>>> {
        if let Some(g) = self.shared.take() {
            return Ok(g);
        }
        let (model, tok, policy) = (self.model, self.tok, self.policy);
        par_blocks(
            items.len(),
            |i| {
                let mut g = item_generations(model, tok, &[policy], items[i], max_tokens, first_line)?;
                Ok(g.pop().expect("one policy"))
            },
            |d| (self.report)(d, items.len()),
        )
    }
}

/// Items are run in parallel blocks of this many, reporting after each.
pub fn block_size() -> usize {
    (rayon::current_num_threads() * 2).max(4)
}

/// Runs blocks of items in parallel, calling `report(done)` between blocks.
pub fn par_blocks<T: Send>(
    n: usize,
    f: impl Fn(usize) -> Result<T> + Sync,
    report: impl FnMut(usize),
) -> Result<Vec<T>> {
    par_blocks_after(Vec::new(), n, f, |_, _, _| Ok(()), report)
}

/// [`par_blocks`] for items `done.len()..n` after the `done` ones, calling
/// `keep(start, block, seconds)` with each finished block before `report`.
fn par_blocks_after<T: Send>(
    mut done: Vec<T>,
    n: usize,
    f: impl Fn(usize) -> Result<T> + Sync,
    mut keep: impl FnMut(usize, &[T], f64) -> Result<()>,
    mut report: impl FnMut(usize),
) -> Result<Vec<T>> {
    if !done.is_empty() {
        report(done.len());
    }
    let b = block_size();
    while done.len() < n {
        let (start, began) = (done.len(), Instant::now());
        let end = (start + b).min(n);
        let part: Vec<T> = (start..end).into_par_iter().map(&f).collect::<Result<_>>()?;
        keep(start, &part, began.elapsed().as_secs_f64())?;
        done.extend(part);
        report(end);
    }
    Ok(done)
}

/// Whether a continuation already holds its whole first line (a newline
/// after some text): generation can stop there.
pub fn first_line_done(generated: &str) -> bool {
    generated.trim_start_matches(['\n', '\r']).contains('\n')
}

/// Greedy decoding under `policy`, at most `max_tokens` new tokens.
pub fn greedy(policy: kvslim_cache::PolicySpec, max_tokens: usize, tok: &Tokenizer) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling: SamplingParams::default(), policy, eos: tok.eos.clone() }
}

/// One item's greedy generations under each of `policies` (per policy,
/// one per question, or one when the prompt asks), sharing the prompt's
/// prefill where the policies can ([`kvslim_engine::prefill_shared`]);
/// with `first_line`, each stops once its first line is complete. With
/// questions (compress once, ask many), the prompt is a [`Context`]:
/// compressed once (budgets resolve against it), then each question runs
/// on a fork of it as decode steps (the policy scores and evicts as in any
/// decode step, but chose what the context keeps before any question was
/// known) and is answered greedily, every fork of every policy decoded in
/// lockstep ([`Context::answer_each`]). Cells decode together and equal
/// their solo runs bit for bit.
fn item_generations(
    model: &Model,
    tok: &Tokenizer,
    policies: &[&BudgetedPolicy],
    (ids, questions): (&[u32], &[Vec<u32>]),
    max_tokens: usize,
    first_line: bool,
) -> Result<Vec<Vec<Generation>>> {
    let opts =
        policies.iter().map(|p| Ok(greedy(p.spec_for(ids.len())?, max_tokens, tok))).collect::<Result<Vec<_>>>()?;
    if questions.is_empty() {
        let mut so_far = vec![Vec::new(); opts.len()];
        let gens = generate_shared(model, ids, &opts, |i, t| {
            so_far[i].push(t);
            !(first_line && tok.decode(&so_far[i]).is_ok_and(|s| first_line_done(&s)))
        })?;
        return Ok(gens.into_iter().map(|g| vec![g]).collect());
    }
    let specs: Vec<_> = opts.iter().map(|o| o.policy.clone()).collect();
    let contexts = Context::compress_each(model, &specs, ids)?;
    // every policy's every question on its own fork, decoded in lockstep
    let asks: Vec<_> =
        contexts.iter().zip(&opts).flat_map(|(ctx, o)| questions.iter().map(move |q| (ctx, &q[..], o))).collect();
    let mut answers = Context::answer_each(model, &asks)?.into_iter();
    Ok(opts.iter().map(|_| answers.by_ref().take(questions.len()).collect()).collect())
}

/// Every item of a generation task under each of `policies`, item by
/// item with one shared prefill per item: per policy, its generations in
/// item order, after the items `done` holds (from an interrupted run); each
/// finished block of items is kept in `keeper`.
pub(crate) fn shared_generations(
    model: &Model,
    tok: &Tokenizer,
    policies: &[&BudgetedPolicy],
    (items, max_tokens, first_line): GenerationItems,
    (done, mut keeper): (Vec<Vec<Vec<Generation>>>, Option<&mut PartialGroup>),
    report: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<Vec<Generation>>>> {
    let per_item = par_blocks_after(
        done,
        items.len(),
        |i| item_generations(model, tok, policies, items[i], max_tokens, first_line),
        |start, block, seconds| keeper.as_mut().map_or(Ok(()), |p| p.append(start, block, seconds)),
        |d| report(d, items.len()),
    )?;
    let mut per_policy: Vec<Vec<Vec<Generation>>> = vec![Vec::with_capacity(items.len()); policies.len()];
    for gens in per_item {
        for (p, g) in per_policy.iter_mut().zip(gens) {
            p.push(g);
        }
    }
    Ok(per_policy)
}

#[cfg(test)]
mod tests {
    use super::first_line_done;

    #[test]
    fn a_first_line_is_done_at_a_newline_after_text() {
        assert!(!first_line_done("\n  retu"));
        assert!(first_line_done("\n  return x\n"));
        assert!(!first_line_done("\n\r\n"));
    }
}
