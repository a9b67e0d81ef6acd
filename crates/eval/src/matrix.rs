//! The evaluation matrix: for one model, every task × policy family ×
//! budget, one [`ResultRow`] per cell, appended to `results.jsonl` as soon
//! as the cell finishes (see [`crate::results`]).
//!
//! What each task kind measures (metric names as in the rows):
//!
//! * `mc` / `hellaswag` — `acc`, `acc_norm` (log-likelihood per character),
//!   `acc_stderr`, `gold_logprob` (mean), and per item the chosen answer
//!   (`pick`, `pick_norm`: 0-based choice index, so a shift of bias can be
//!   told from a loss of skill); in the configured
//!   [`ScoreMode`], by default forked ([`score_items`]: the context once,
//!   each choice on a fork of its cache, 16 items batched; percentage
//!   budgets against context + the item's longest choice), or per choice
//!   ([`score_choices`], [`Scoring::PerChoice`]: percentage budgets against
//!   each choice's whole sequence). With an out directory, each finished
//!   block of items is kept in `partial.jsonl` until the cell's row is
//!   written, and a resumed run continues the cell from there.
//! * `ppl` — token-weighted `nll` and `ppl` over BOS-led windows, every
//!   token a decode step (or one prefill in [`ScoreMode::Prefill`]); with
//!   `compare_full`, `kl` = mean KL(full‖policy), `top1` = top-1
//!   agreement and `retained_mass` = mean attention mass the full cache
//!   puts on the kept tokens, `retained_mass_p1` / `_p5` its 1st and 5th
//!   percentiles over steps, layers and query heads (the `full` policy
//!   gets kl 0, top1 1, mass 1).
//!   Budgets resolve against each window. Every ppl cell also reports
//!   `kv_bytes_peak` (most K/V bytes of one window's cache at once); paged
//!   specs (`page=P`) add `pages_peak` (most pages of one window at once),
//!   `fragmentation` (allocated − live slots as % of allocated, mean over
//!   decode steps, token-weighted) and `bytes_moved_per_step` (bytes
//!   compaction copied / decode steps). With
//!   [`MatrixConfig::decisions_from`] (mode (a) for quantized KV), cells
//!   whose spec stores K/V in another dtype follow the eviction decisions
//!   of a reference run in that dtype and add `ref_ppl` (the reference's
//!   perplexity), `kl_ref` (KL(reference‖policy)) and `kept_differing`
//!   (kept sets that differed from the reference's, 0 by construction);
//!   the row records `decisions_from`.
//! * `gen` — greedy generation from each prompt under the policy, compared
//!   with the full cache's greedy output: `first_div` (mean first step
//!   where they differ, capped at the token limit), `prefix_frac` (mean
//!   identical-prefix fraction of the limit), `agree_frac` (positional
//!   agreement), `identical` (share of prompts with the same output).
//!   Budgets resolve against each prompt.
//! * RULER tasks (`passkey`, `niah_*`, `vt`, `cwe`; [`crate::tasks::ruler`])
//!   — greedy answer after each prompt; `acc` = share of items whose output
//!   holds every expected answer (with `acc_stderr`), `recall` = mean share
//!   of answers found, plus `acc_len{L}` and `acc_depth{D}` breakdowns.
//!
//! Timings: `wall` seconds for the cell, `per_item` and `items_per_s`; `gen` cells add
//! `ttft` (prompt prefill and first token) and `tpot` (seconds per later
//! token), means over prompts.

use crate::budget::{BudgetedPolicy, PolicySource};
use crate::forked::score_items;
use crate::metrics::{first_divergence, identical_prefix_fraction, positional_agreement};
use crate::results::{write_summaries, CellKey, PartialCell, PartialGroup, ResultRow, ResultsLog, Resumed};
use crate::score::{encode_item, predict, predict_norm, score_choices, Choice, McTally, ScoreMode, Scoring};
use crate::shard::{config_fingerprint, Shard, ShardManifest};
use crate::tasks::{answers_found, code, try_ruler_items, TaskData, TaskKind, TaskSpec};
use crate::{EvalError, Result};
use kvslim_engine::{
    generate, generate_shared, perplexity, Context, GenerateOptions, Generation, PerplexityOptions, SamplingParams,
};
use kvslim_models::{Model, Tokenizer};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    /// The model column of the results.
    pub model_label: String,
    /// Policy families, optionally with extras (`h2o:agg=max`); see
    /// [`BudgetedPolicy`]. `full` runs once per task with budget `-`.
    pub policies: Vec<String>,
    /// Budgets (`100%`, `20%`, `64`).
    pub budgets: Vec<String>,
    pub tasks: Vec<TaskSpec>,
    pub mode: ScoreMode,
    /// Multiple choice: forked and batched (default) or one session per choice.
    pub scoring: Scoring,
    /// Perplexity: also run the full cache and report KL / top-1.
    pub compare_full: bool,
    /// Perplexity, mode (a) for quantized KV: cells whose spec stores K/V
    /// in another dtype than this, and have a token policy that evicts
    /// (not `full`, no CHAI), keep exactly what a reference run with K/V
    /// in this dtype keeps. `None`: every policy decides on its own cache.
    pub decisions_from: Option<kvslim_cache::KvDtype>,
    /// Where `results.jsonl`, `.csv` and `.md` go; `None` keeps rows in memory.
    pub out_dir: Option<PathBuf>,
    /// Continue an existing `results.jsonl`, skipping finished cells.
    pub resume: bool,
    /// With `out_dir`, draw quality-vs-budget charts into `out_dir/plots`
    /// at the end ([`crate::plots::write_charts`]).
    pub charts: bool,
    /// Run only this shard's cells (round-robin over the canonical cell
    /// order; see [`crate::shard`]); rows are tagged with the shard and the
    /// run's fingerprint, and `out_dir` gets `shard.json`. `None`: every cell.
    pub shard: Option<Shard>,
    /// Generation tasks (RULER, LCC): the cells of a task that can share
    /// the prompt's prefill ([`kvslim_engine::generate_shared`]) run item
    /// by item together, one prefill per item instead of one per cell.
    /// Every generated token is the same as running the cells apart (the
    /// engine's tests check it bit for bit); only the timings change: each
    /// such cell's `wall` is an equal share of the group's.
    pub shared_prefill: bool,
}

impl MatrixConfig {
    /// The paper's grid: all six families at 100/40/20/10/5 %.
    pub fn new(model_label: &str, tasks: Vec<TaskSpec>) -> Self {
        MatrixConfig {
            model_label: model_label.into(),
            policies: ["full", "window", "sink", "heavy", "random", "h2o"].map(String::from).to_vec(),
            budgets: ["100%", "40%", "20%", "10%", "5%"].map(String::from).to_vec(),
            tasks,
            mode: ScoreMode::Decode,
            scoring: Scoring::Forked,
            compare_full: true,
            decisions_from: None,
            out_dir: None,
            resume: false,
            charts: true,
            shard: None,
            shared_prefill: true,
        }
    }
}

/// Progress of [`run_matrix`].
#[derive(Debug)]
pub enum MatrixEvent<'a> {
    /// A task's data is being loaded and tokenized.
    TaskLoading { task: &'a str },
    /// Cell `index` of `total` starts.
    CellStart { key: &'a CellKey, index: usize, total: usize },
    /// Already in `results.jsonl` (resume).
    CellSkipped { key: &'a CellKey, index: usize, total: usize },
    /// `done` of `total` items of the running cell are finished.
    Items { key: &'a CellKey, done: usize, total: usize },
    /// The cell's row, already written.
    CellDone { row: &'a ResultRow },
}

/// A task's items, tokenized once for all its cells.
enum Prepared {
    Mc(Vec<(Vec<u32>, Vec<Choice>, usize)>),
    Ppl(Vec<Vec<u32>>),
    Gen {
        prompts: Vec<(Vec<u32>, usize)>,
        reference: Option<Vec<Vec<u32>>>,
    },
    /// Context ids and the expected next line; max new tokens.
    Lcc(Vec<(Vec<u32>, String)>, usize),
    /// Prompt ids, expected answers, target length, depth, and for
    /// `niah_multiquery` the questions' ids (asked one at a time after the
    /// prompt, question i expecting answer i); max new tokens.
    Ruler(Vec<RulerPrepared>, usize),
}

impl Prepared {
    fn len(&self) -> usize {
        match self {
            Prepared::Mc(v) => v.len(),
            Prepared::Ppl(v) => v.len(),
            Prepared::Gen { prompts, .. } => prompts.len(),
            Prepared::Lcc(v, _) => v.len(),
            Prepared::Ruler(v, _) => v.len(),
        }
    }
}

type RulerPrepared = (Vec<u32>, Vec<String>, usize, f64, Vec<Vec<u32>>);

/// A context and the questions to ask after it, tokenized as the context
/// followed by each question would be: the context's ids are those every
/// `context + question` shares (a merge across the boundary moves the
/// boundary back), each question's the rest of its own.
fn split_questions(tok: &Tokenizer, context: &str, questions: &[String]) -> Result<(Vec<u32>, Vec<Vec<u32>>)> {
    let mut ctx = tok.encode(context)?;
    let whole: Vec<Vec<u32>> =
        questions.iter().map(|q| Ok(tok.encode(&format!("{context}{q}"))?)).collect::<Result<_>>()?;
    let shared =
        whole.iter().map(|w| w.iter().zip(&ctx).take_while(|(a, b)| a == b).count()).min().unwrap_or(ctx.len());
    ctx.truncate(shared);
    Ok((ctx, whole.into_iter().map(|w| w[shared..].to_vec()).collect()))
}

fn prepare(model: &Model, tok: &Tokenizer, task: &TaskSpec) -> Result<Prepared> {
    let data = task.load()?;
    let limit = task.limit.unwrap_or(usize::MAX);
    let ctx = model.config.context_len;
    Ok(match (data, &task.kind) {
        (TaskData::Mc(items), _) => Prepared::Mc(
            items
                .par_iter()
                .map(|it| encode_item(tok, it).map(|(c, ch)| (c, ch, it.gold)))
                .collect::<Result<Vec<_>>>()?,
        ),
        (TaskData::Ppl(text), TaskKind::Ppl { seq_len, .. }) => {
            let w = text.windows(tok, (*seq_len).min(ctx), task.limit)?;
            if w.is_empty() {
                return Err(EvalError::File { path: text.path.clone(), reason: "too short for one window".into() });
            }
            Prepared::Ppl(w)
        }
        (TaskData::Gen(prompts), TaskKind::Gen { max_tokens, .. }) => {
            let mut out = Vec::with_capacity(prompts.len());
            for p in prompts {
                let ids = tok.encode(&p.prompt)?;
                if ids.is_empty() || ids.len() >= ctx {
                    return Err(EvalError::Request(format!(
                        "gen prompt `{}` has {} tokens; the model's context is {ctx}",
                        p.prompt.chars().take(40).collect::<String>(),
                        ids.len()
                    )));
                }
                out.push((ids, p.max_tokens.unwrap_or(*max_tokens)));
            }
            Prepared::Gen { prompts: out, reference: None }
        }
        (TaskData::Lcc(items), TaskKind::Lcc { max_tokens, max_context, .. }) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, it) in items.iter().enumerate() {
                let ids = tok.encode(&it.context)?;
                if max_context.is_some_and(|t| ids.len() > t) {
                    continue;
                }
                if out.len() == limit {
                    break;
                }
                if ids.len() + max_tokens > ctx {
                    return Err(EvalError::Request(format!(
                        "lcc item {} has {} context tokens; with {max_tokens} new ones they exceed the model's context of {ctx}",
                        i + 1,
                        ids.len()
                    )));
                }
                out.push((ids, it.answer.clone()));
            }
            Prepared::Lcc(out, *max_tokens)
        }
        (TaskData::Ruler(cfg), TaskKind::Ruler { max_tokens, .. }) => {
            if let Some(&l) = cfg.lengths.iter().find(|&&l| l >= ctx) {
                return Err(EvalError::Request(format!(
                    "{} length {l} does not fit the model's context of {ctx} tokens",
                    cfg.task.name()
                )));
            }
            let count = |s: &str| tok.encode(s).map_or(usize::MAX, |v| v.len());
            let items = try_ruler_items(&cfg, &count)?;
            let mut out = Vec::new();
            for it in items.into_iter().take(limit) {
                let (ids, questions) = match it.questions.is_empty() {
                    true => (tok.encode(&it.prompt)?, Vec::new()),
                    false => split_questions(tok, &it.prompt, &it.questions)?,
                };
                out.push((ids, it.answers, it.target_len, it.depth, questions));
            }
            Prepared::Ruler(out, *max_tokens)
        }
        (d, k) => unreachable!("task data {d:?} for {k:?}"),
    })
}

/// Multiple-choice items scored together by [`score_items`]: their decode
/// steps share one batch (weights read once per step for all their forks).
const FORKED_BLOCK: usize = 16;

/// Items are run in parallel blocks of this many, reporting after each.
fn block_size() -> usize {
    (rayon::current_num_threads() * 2).max(4)
}

/// Runs blocks of items in parallel, calling `report(done)` between blocks.
fn par_blocks<T: Send>(n: usize, f: impl Fn(usize) -> Result<T> + Sync, report: impl FnMut(usize)) -> Result<Vec<T>> {
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

fn greedy(policy: kvslim_cache::PolicySpec, max_tokens: usize, tok: &Tokenizer) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling: SamplingParams::default(), policy, eos: tok.eos.clone() }
}

/// A generation task's prompts (RULER, LCC): each with the questions asked
/// after it one at a time (`niah_multiquery`; none: the prompt asks), the
/// token limit and whether a generation ends with its first line; `None`
/// for other tasks.
type GenerationItems<'a> = (Vec<(&'a [u32], &'a [Vec<u32>])>, usize, bool);

fn generation_items(prep: &Prepared) -> Option<GenerationItems<'_>> {
    match prep {
        Prepared::Ruler(items, n) => Some((items.iter().map(|it| (&it.0[..], &it.4[..])).collect(), *n, false)),
        Prepared::Lcc(items, n) => Some((items.iter().map(|it| (&it.0[..], &[][..])).collect(), *n, true)),
        _ => None,
    }
}

/// One item's greedy generations under each of `policies` (per policy,
/// one per question, or one when the prompt asks), sharing the prompt's
/// prefill where the policies can ([`kvslim_engine::prefill_shared`]);
/// with `first_line`, each stops once its first line is complete. With
/// questions (compress once, ask many), the prompt is a [`Context`]:
/// compressed once (budgets resolve against it), then each question runs
/// on a fork of it as decode steps (the policy scores and evicts as in any
/// decode step, but chose what the context keeps before any question was
/// known) and is answered greedily.
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
            !(first_line && tok.decode(&so_far[i]).is_ok_and(|s| code::first_line_done(&s)))
        })?;
        return Ok(gens.into_iter().map(|g| vec![g]).collect());
    }
    let specs: Vec<_> = opts.iter().map(|o| o.policy.clone()).collect();
    let contexts = Context::compress_each(model, &specs, ids)?;
    let mut out = Vec::with_capacity(opts.len());
    for (ctx, o) in contexts.iter().zip(&opts) {
        let answers = questions.iter().map(|q| ctx.generate(model, q, o, |_| true)).collect::<Result<_, _>>()?;
        out.push(answers);
    }
    Ok(out)
}

/// Every item of a generation task under each of `policies`, item by
/// item with one shared prefill per item: per policy, its generations in
/// item order, after the items `done` holds (from an interrupted run); each
/// finished block of items is kept in `keeper`.
fn shared_generations(
    model: &Model,
    tok: &Tokenizer,
    policies: &[&BudgetedPolicy],
    prep: &Prepared,
    (done, mut keeper): (Vec<Vec<Vec<Generation>>>, Option<&mut PartialGroup>),
    report: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<Vec<Generation>>>> {
    let (items, max_tokens, first_line) = generation_items(prep).expect("a generation task");
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

/// Runs one cell and fills the row's metrics, items and memory. A
/// multiple-choice cell starts after the items `resumed` holds (scored by
/// an interrupted run) and appends each finished block to `partial`.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    model: &Model,
    tok: &Tokenizer,
    policy: &BudgetedPolicy,
    prepared: &mut Prepared,
    cfg: &MatrixConfig,
    row: &mut ResultRow,
    (mut partial, resumed): (Option<&mut PartialCell>, Resumed),
    mut shared: Option<Vec<Vec<Generation>>>,
    report: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let total = prepared.len();
    // a generation task's outputs: from a shared run, else this cell's own
    let mut generations = |prep: &Prepared, report: &mut dyn FnMut(usize, usize)| -> Result<Vec<Vec<Generation>>> {
        if let Some(g) = shared.take() {
            return Ok(g);
        }
        let (items, max_tokens, first_line) = generation_items(prep).expect("a generation task");
        par_blocks(
            items.len(),
            |i| {
                let mut g = item_generations(model, tok, &[policy], items[i], max_tokens, first_line)?;
                Ok(g.pop().expect("one policy"))
            },
            |d| report(d, items.len()),
        )
    };
    let mut m = BTreeMap::new();
    let (mut kv, mut meta) = (0usize, 0usize);
    match prepared {
        Prepared::Mc(items) => {
            // blocks of items: forked blocks share their batched decode steps,
            // per-choice blocks run their items in parallel
            let block = match cfg.scoring {
                Scoring::Forked => FORKED_BLOCK,
                Scoring::PerChoice => block_size(),
            };
            let mut scored = resumed.scores;
            if !scored.is_empty() {
                report(scored.len(), total);
            }
            while scored.len() < items.len() {
                let block_start = Instant::now();
                let part = &items[scored.len()..(scored.len() + block).min(items.len())];
                let scores = match cfg.scoring {
                    Scoring::PerChoice => part
                        .par_iter()
                        .map(|(c, ch, _)| score_choices(model, policy, c, ch, cfg.mode))
                        .collect::<Result<Vec<_>>>()?,
                    Scoring::Forked => {
                        let views: Vec<(&[u32], &[Choice])> = part.iter().map(|(c, ch, _)| (&c[..], &ch[..])).collect();
                        score_items(model, policy, &views, cfg.mode)?
                    }
                };
                if let Some(p) = partial.as_deref_mut() {
                    p.append(scored.len(), &scores, block_start.elapsed().as_secs_f64())?;
                }
                scored.extend(scores);
                report(scored.len(), total);
            }
            let mut t = McTally::default();
            let n = items.len();
            let (mut acc, mut acc_norm) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let (mut pick, mut pick_norm) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let mut gold = Vec::with_capacity(n);
            for (s, it) in scored.iter().zip(items.iter()) {
                let (a, b) = t.add(it.2, s);
                acc.push(f64::from(u8::from(a)));
                acc_norm.push(f64::from(u8::from(b)));
                pick.push(predict(s) as f64);
                pick_norm.push(predict_norm(s) as f64);
                gold.push(s[it.2].logprob_sum);
                for c in s {
                    kv = kv.max(c.kv_bytes);
                    meta = meta.max(c.kv_metadata_bytes);
                }
            }
            m.insert("acc".into(), t.acc());
            m.insert("acc_norm".into(), t.acc_norm());
            m.insert("acc_stderr".into(), t.acc_stderr());
            m.insert("gold_logprob".into(), t.gold_logprob / t.items.max(1) as f64);
            row.per_item.insert("acc".into(), acc);
            row.per_item.insert("acc_norm".into(), acc_norm);
            row.per_item.insert("pick".into(), pick);
            row.per_item.insert("pick_norm".into(), pick_norm);
            row.per_item.insert("gold_logprob".into(), gold);
        }
        Prepared::Ppl(windows) => {
            // the plain full cache (no storage keys, no CHAI) is its own reference
            let is_full = policy.sample_spec()? == kvslim_cache::PolicySpec::full();
            let prefill = |n: usize| if cfg.mode == ScoreMode::Prefill { n } else { 0 };
            let follows = ppl_decisions_from(policy, cfg.decisions_from)?;
            row.key.decisions_from = follows.map(|d| d.to_string());
            let reps = par_blocks(
                windows.len(),
                |i| {
                    let w = &windows[i];
                    let mut o = PerplexityOptions::new(policy.spec_for(w.len())?);
                    o.prefill = prefill(w.len());
                    o.compare_full = cfg.compare_full && !is_full;
                    o.decisions_from = follows;
                    Ok(perplexity(model, w, &o, |_, _| {})?)
                },
                |d| report(d, total),
            )?;
            let mut paged = false;
            let (mut pages_peak, mut kv_peak, mut frag, mut moved, mut steps) = (0usize, 0usize, 0.0, 0u64, 0usize);
            let (mut ref_nll, mut kl_ref, mut differing) = (0.0, 0.0, 0usize);
            let mut step_ms = Vec::new();
            for r in &reps {
                kv_peak = kv_peak.max(r.kv_bytes_peak);
                step_ms.extend(r.decode_ms_median);
                if let Some(p) = &r.paged {
                    paged = true;
                    pages_peak = pages_peak.max(p.pages_peak);
                    frag += p.fragmentation_mean_pct * r.decode_steps as f64;
                    moved += p.bytes_moved;
                    steps += r.decode_steps;
                }
                if let Some(d) = &r.decisions {
                    let n = (r.tokens - 1) as f64;
                    ref_nll += d.reference_nll * n;
                    kl_ref += d.kl_vs_reference * n;
                    differing += d.kept_sets_differing;
                }
            }
            m.insert("kv_bytes_peak".into(), kv_peak as f64);
            if paged {
                m.insert("pages_peak".into(), pages_peak as f64);
                m.insert("fragmentation".into(), frag / steps.max(1) as f64);
                m.insert("bytes_moved_per_step".into(), moved as f64 / steps.max(1) as f64);
            }
            if !step_ms.is_empty() {
                // median over windows of each window's median decode step
                step_ms.sort_by(f64::total_cmp);
                row.timings.insert("step_ms".into(), step_ms[step_ms.len() / 2]);
            }
            if follows.is_some() {
                let toks: usize = reps.iter().map(|r| r.tokens - 1).sum();
                let t = toks.max(1) as f64;
                m.insert("ref_ppl".into(), (ref_nll / t).exp());
                m.insert("kl_ref".into(), kl_ref / t);
                m.insert("kept_differing".into(), differing as f64);
            }
            let (mut nll, mut toks, mut kl, mut top1, mut mass, mut cmp_toks) = (0.0, 0usize, 0.0, 0.0, 0.0, 0usize);
            let mut mass_samples: Vec<f64> = Vec::new();
            for r in &reps {
                let n = r.tokens - 1;
                nll += r.nll * n as f64;
                toks += n;
                kv = kv.max(r.kv_bytes_allocated);
                meta = meta.max(r.kv_metadata_bytes);
                if let Some(c) = &r.compare_full {
                    kl += c.kl_mean * n as f64;
                    top1 += c.top1_agreement * n as f64;
                    mass += c.retained_mass.mean * n as f64;
                    mass_samples.extend_from_slice(&c.retained_mass_samples);
                    cmp_toks += n;
                }
            }
            let nll = nll / toks.max(1) as f64;
            m.insert("nll".into(), nll);
            row.per_item.insert("nll".into(), reps.iter().map(|r| r.nll).collect());
            m.insert("ppl".into(), nll.exp());
            m.insert("tokens".into(), toks as f64);
            if is_full && cfg.compare_full {
                m.insert("kl".into(), 0.0);
                m.insert("top1".into(), 1.0);
                m.insert("retained_mass".into(), 1.0);
                m.insert("retained_mass_p1".into(), 1.0);
                m.insert("retained_mass_p5".into(), 1.0);
            } else if cmp_toks > 0 {
                let c = cmp_toks as f64;
                m.insert("kl".into(), kl / c);
                m.insert("top1".into(), top1 / c);
                m.insert("retained_mass".into(), mass / c);
                let pooled = kvslim_engine::Summary::of(&mut mass_samples);
                m.insert("retained_mass_p1".into(), pooled.p1);
                m.insert("retained_mass_p5".into(), pooled.p5);
            }
        }
        Prepared::Gen { prompts, reference } => {
            if reference.is_none() {
                let full = kvslim_cache::PolicySpec::full();
                let refs = par_blocks(
                    prompts.len(),
                    |i| {
                        Ok(generate(model, &prompts[i].0, &greedy(full.clone(), prompts[i].1, tok), |_| true)?
                            .token_ids)
                    },
                    |_| {},
                )?;
                *reference = Some(refs);
            }
            let refs = reference.as_ref().expect("set above");
            let gens = par_blocks(
                prompts.len(),
                |i| {
                    let (ids, n) = &prompts[i];
                    Ok(generate(model, ids, &greedy(policy.spec_for(ids.len())?, *n, tok), |_| true)?)
                },
                |d| report(d, total),
            )?;
            let (mut div, mut pre, mut agree, mut same) = (0.0, 0.0, 0.0, 0usize);
            for ((g, r), (_, n)) in gens.iter().zip(refs).zip(prompts.iter()) {
                let d = first_divergence(r, &g.token_ids);
                div += d.unwrap_or(*n).min(*n) as f64;
                pre += identical_prefix_fraction(r, &g.token_ids, *n);
                agree += positional_agreement(r, &g.token_ids, *n);
                same += usize::from(d.is_none());
                kv = kv.max(g.kv_bytes.kv);
                meta = meta.max(g.kv_bytes.metadata);
            }
            let k = gens.len().max(1) as f64;
            // latency: prompt prefill + first token, then per later token
            let ttft = gens.iter().map(|g| g.time_to_first_token_s).sum::<f64>() / k;
            let (dec_s, dec_n) =
                gens.iter().fold((0.0, 0usize), |(s, n), g| (s + g.decode_s, n + g.token_ids.len().saturating_sub(1)));
            row.timings.insert("ttft".into(), ttft);
            if dec_n > 0 {
                row.timings.insert("tpot".into(), dec_s / dec_n as f64);
            }
            m.insert("first_div".into(), div / k);
            m.insert("prefix_frac".into(), pre / k);
            m.insert("agree_frac".into(), agree / k);
            m.insert("identical".into(), same as f64 / k);
        }
        Prepared::Lcc(..) => {
            let gens = generations(prepared, report)?;
            let Prepared::Lcc(items, _) = &*prepared else { unreachable!() };
            let scored = gens
                .iter()
                .zip(items.iter())
                .map(|(g, (_, answer))| {
                    let g = &g[0];
                    let line = tok.decode(&g.token_ids)?;
                    Ok((code::score_line(code::first_line(&line), answer), g.kv_bytes))
                })
                .collect::<Result<Vec<_>>>()?;
            let (mut exact, mut sim) = (Vec::with_capacity(items.len()), Vec::with_capacity(items.len()));
            for ((hit, s), b) in &scored {
                kv = kv.max(b.kv);
                meta = meta.max(b.metadata);
                exact.push(f64::from(u8::from(*hit)));
                sim.push(*s);
            }
            let n = items.len().max(1) as f64;
            m.insert("exact".into(), exact.iter().sum::<f64>() / n);
            m.insert("edit_sim".into(), sim.iter().sum::<f64>() / n);
            row.per_item.insert("exact".into(), exact);
            row.per_item.insert("edit_sim".into(), sim);
        }
        Prepared::Ruler(..) => {
            let gens = generations(prepared, report)?;
            let Prepared::Ruler(items, _) = &*prepared else { unreachable!() };
            // per item: answers found, the largest KV bytes; with questions,
            // question i's generation is searched for answer i alone
            let found = gens
                .iter()
                .zip(items.iter())
                .map(|(g, it)| {
                    let kv = g.iter().map(|g| g.kv_bytes).max_by_key(|b| b.kv).unwrap_or_default();
                    let n = match it.4.is_empty() {
                        true => answers_found(&tok.decode(&g[0].token_ids)?, &it.1),
                        false => g
                            .iter()
                            .zip(&it.1)
                            .map(|(g, a)| Ok(answers_found(&tok.decode(&g.token_ids)?, std::slice::from_ref(a))))
                            .sum::<Result<usize>>()?,
                    };
                    Ok((n, kv))
                })
                .collect::<Result<Vec<_>>>()?;
            let Prepared::Ruler(items, _) = &*prepared else { unreachable!() };
            // an item counts when every expected answer is in the output
            let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            let (mut recall, mut hits) = (0.0, Vec::with_capacity(items.len()));
            for ((n_found, b), (_, answers, len, depth, _)) in found.iter().zip(items.iter()) {
                kv = kv.max(b.kv);
                meta = meta.max(b.metadata);
                let hit = *n_found == answers.len();
                recall += *n_found as f64 / answers.len().max(1) as f64;
                hits.push(f64::from(u8::from(hit)));
                for k in ["acc".to_string(), format!("acc_len{len}"), format!("acc_depth{depth}")] {
                    let e = by.entry(k).or_default();
                    e.0 += usize::from(hit);
                    e.1 += 1;
                }
            }
            for (k, (h, n)) in by {
                m.insert(k, h as f64 / n.max(1) as f64);
            }
            m.insert("recall".into(), recall / items.len().max(1) as f64);
            let (n, acc) = (hits.len().max(1) as f64, m.get("acc").copied().unwrap_or(0.0));
            m.insert("acc_stderr".into(), (acc * (1.0 - acc) / (n - 1.0).max(1.0)).sqrt());
            row.per_item.insert("acc".into(), hits);
        }
    }
    row.items = total;
    row.metrics = m;
    row.kv_bytes = kv as u64;
    row.kv_metadata_bytes = meta as u64;
    Ok(())
}

/// The dtype a ppl cell of `policy` follows the decisions of: `decisions_from`
/// when the policy evicts (not `full`), has no head sharing, and stores
/// K/V in another dtype; `None` otherwise (the cell runs as usual).
pub fn ppl_decisions_from(
    policy: &BudgetedPolicy,
    decisions_from: Option<kvslim_cache::KvDtype>,
) -> Result<Option<kvslim_cache::KvDtype>> {
    let Some(d) = decisions_from else { return Ok(None) };
    let spec = policy.sample_spec()?;
    let evicts = spec.token != kvslim_cache::policy::TokenPolicySpec::Full;
    Ok((evicts && spec.head.is_none() && spec.storage.kv_dtype != d).then_some(d))
}

/// Runs every cell of `cfg` on one model. Returns all rows, those of a
/// resumed log included. With `out_dir`, each row is appended to
/// `results.jsonl` as its cell ends, `results.csv` / `results.md` are
/// rewritten after every cell, and charts go to `plots/` at the end; a
/// multiple-choice cell in flight keeps its finished blocks in
/// `partial.jsonl` ([`PartialCell`]). Policies and budgets are checked before
/// anything runs. With [`MatrixConfig::shard`], only that shard's cells
/// run (and `shard.json` is written first); [`crate::shard::merge_shards`]
/// combines the shards.
pub fn run_matrix(
    model: &Model,
    tok: &Tokenizer,
    cfg: &MatrixConfig,
    mut progress: impl FnMut(MatrixEvent),
) -> Result<Vec<ResultRow>> {
    // every (policy, budget) pair, validated up front
    let mut cells: Vec<BudgetedPolicy> = Vec::new();
    for fam in &cfg.policies {
        // a tune file is one cell, at the budget it was tuned for
        if crate::budget::is_tuned(fam) {
            cells.push(BudgetedPolicy::tuned(fam)?);
            continue;
        }
        if BudgetedPolicy::new(fam, "100%")?.budget.is_none() {
            cells.push(BudgetedPolicy::new(fam, "-")?);
            continue;
        }
        if cfg.budgets.is_empty() {
            return Err(EvalError::Request(format!("policy `{fam}` needs at least one budget")));
        }
        for b in &cfg.budgets {
            cells.push(BudgetedPolicy::new(fam, b)?);
        }
    }
    for task in &cfg.tasks {
        task.check_readable()?;
    }
    // every cell's key, in canonical order (task-major)
    let keys: Vec<Vec<CellKey>> = cfg
        .tasks
        .iter()
        .map(|task| {
            let label = task.label();
            cells
                .iter()
                .map(|p| {
                    let follows = match task.kind {
                        TaskKind::Ppl { .. } => ppl_decisions_from(p, cfg.decisions_from)?,
                        _ => None,
                    };
                    Ok(CellKey {
                        model: cfg.model_label.clone(),
                        policy: p.family_label(),
                        budget: p.budget_label(),
                        task: label.clone(),
                        decisions_from: follows.map(|d| d.to_string()),
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;
    let run_id = cfg.shard.map(|shard| {
        let all: Vec<CellKey> = keys.iter().flatten().cloned().collect();
        let run = config_fingerprint(cfg, &all);
        (shard, ShardManifest::new(shard, &run, &all), run)
    });
    if let (Some((_, manifest, _)), Some(dir)) = (&run_id, &cfg.out_dir) {
        manifest.write(dir, cfg.resume)?;
    }
    let (mut log, mut rows) = match &cfg.out_dir {
        Some(dir) => {
            let (l, r) = ResultsLog::open(dir, cfg.resume)?;
            (Some(l), r)
        }
        None => (None, Vec::new()),
    };
    let done = crate::results::finished_keys(&rows);
    let total = match &run_id {
        Some((_, m, _)) => m.cells.len(),
        None => cfg.tasks.len() * cells.len(),
    };
    let mut index = 0;
    for (ti, (task, keys)) in cfg.tasks.iter().zip(&keys).enumerate() {
        let label = task.label();
        let mut prepared = None;
        let owned = |ci: usize| run_id.as_ref().is_none_or(|(shard, _, _)| shard.owns(ti * cells.len() + ci));
        // generations of cells run ahead together with an earlier cell of
        // this task (shared prefills), and each one's share of the wall time
        let mut ahead: BTreeMap<usize, (Vec<Vec<Generation>>, f64, usize)> = BTreeMap::new();
        for (ci, (p, key)) in cells.iter().zip(keys).enumerate() {
            if !owned(ci) {
                continue;
            }
            index += 1;
            if done.contains(key) {
                progress(MatrixEvent::CellSkipped { key, index, total });
                continue;
            }
            if prepared.is_none() {
                progress(MatrixEvent::TaskLoading { task: &label });
                prepared = Some(prepare(model, tok, task)?);
            }
            let prep = prepared.as_mut().expect("set above");
            progress(MatrixEvent::CellStart { key, index, total });
            let mut row = ResultRow::new(&key.model, &key.policy, &key.budget, &key.task);
            // a multiple-choice cell keeps its finished blocks until its row is written
            let (mut partial, resumed) = match (&cfg.out_dir, &*prep) {
                (Some(dir), Prepared::Mc(items)) => {
                    let (p, done) = PartialCell::open(dir, key, items.len(), cfg.resume)?;
                    (Some(p), done)
                }
                _ => (None, Resumed::default()),
            };
            let earlier_s = resumed.seconds;
            let start = Instant::now();
            let mut items = |d, t| progress(MatrixEvent::Items { key, done: d, total: t });
            // the task's remaining cells, when they can share their prompts' prefills
            let group: Vec<usize> = (ci..cells.len()).filter(|&j| owned(j) && !done.contains(&keys[j])).collect();
            if cfg.shared_prefill && !ahead.contains_key(&ci) && group.len() > 1 && generation_items(prep).is_some() {
                let policies: Vec<&BudgetedPolicy> = group.iter().map(|&j| &cells[j]).collect();
                // the group keeps its finished items until its generations are complete
                let mut partial = match &cfg.out_dir {
                    Some(dir) => {
                        let group_keys: Vec<CellKey> = group.iter().map(|&j| keys[j].clone()).collect();
                        Some(PartialGroup::open(dir, &group_keys, prep.len(), cfg.resume)?)
                    }
                    None => None,
                };
                let (done, earlier) = partial.as_mut().map_or((Vec::new(), 0.0), |(_, (d, s))| (std::mem::take(d), *s));
                let keeper = partial.as_mut().map(|(p, _)| p);
                let gens = shared_generations(model, tok, &policies, prep, (done, keeper), &mut items)?;
                if let Some((p, _)) = partial {
                    p.finish()?;
                }
                let share = (earlier + start.elapsed().as_secs_f64()) / group.len() as f64;
                ahead.extend(group.iter().zip(gens).map(|(&j, g)| (j, (g, share, group.len()))));
            }
            let shared = ahead.remove(&ci);
            let shared_wall = shared.as_ref().map(|s| (s.1, s.2));
            run_cell(model, tok, p, prep, cfg, &mut row, (partial.as_mut(), resumed), shared.map(|s| s.0), &mut items)?;
            // a resumed cell's wall time includes its earlier runs' blocks;
            // cells that shared their prefills take an equal share of the group's
            let wall = match shared_wall {
                Some((share, cells_sharing)) => {
                    row.timings.insert("shared_cells".into(), cells_sharing as f64);
                    share
                }
                None => earlier_s + start.elapsed().as_secs_f64(),
            };
            row.timings.insert("wall".into(), wall);
            row.timings.insert("per_item".into(), wall / row.items.max(1) as f64);
            row.timings.insert("items_per_s".into(), row.items as f64 / wall.max(1e-9));
            if let Some((shard, _, run)) = &run_id {
                row.shard = Some(shard.to_string());
                row.run = Some(run.clone());
            }
            if let Some(l) = log.as_mut() {
                l.append(&row)?;
            }
            if let Some(p) = partial {
                p.finish()?;
            }
            rows.push(row);
            if let Some(dir) = &cfg.out_dir {
                write_summaries(dir, &rows)?;
            }
            progress(MatrixEvent::CellDone { row: rows.last().expect("pushed") });
        }
    }
    if let Some(dir) = &cfg.out_dir {
        write_summaries(dir, &rows)?;
        if cfg.charts {
            crate::plots::write_charts(&dir.join("plots"), &rows)?;
        }
    }
    Ok(rows)
}
