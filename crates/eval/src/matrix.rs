//! The evaluation matrix: for one model, every task × policy family ×
//! budget, one [`ResultRow`] per cell, appended to `results.jsonl` as soon
//! as the cell finishes (see [`crate::results`]). What a cell measures is
//! its task kind's ([`crate::tasks`]; the metrics are listed in each kind's
//! module); this module only runs the cells, sharing prompt prefills
//! across a generation task's cells ([`MatrixConfig::shared_prefill`]).
//!
//! Timings: `wall` seconds for the cell, `per_item` and `items_per_s`; `gen` cells add
//! `ttft` (prompt prefill and first token) and `tpot` (seconds per later
//! token), means over prompts.

use crate::budget::BudgetedPolicy;
use crate::cell::{self, Cell, CellOptions};
use crate::error::{EvalError, Result};
use crate::results::{write_summaries, CellKey, PartialCell, PartialGroup, ResultRow, ResultsLog, Resumed};
use crate::score::{ScoreMode, Scoring};
use crate::shard::{Shard, ShardManifest};
use crate::tasks::TaskSpec;
use kvslim_engine::Generation;
use kvslim_models::{Model, Tokenizer};
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
    /// Identifies a run's configuration: a hash of everything that decides its
    /// cells and their values (model label, policies, budgets, task specs,
    /// scoring mode and scoring, full-cache comparison, decisions-from dtype, kvslim version
    /// and commit) and of its cell list. Not the shard, out directory, resume or
    /// charts. Shards of one run share it; [`crate::merge_shards`] refuses to mix others.
    pub fn fingerprint(&self, cells: &[CellKey]) -> String {
        let mut s = format!(
            "model={:?}\npolicies={:?}\nbudgets={:?}\ntasks={:?}\nmode={:?}\nscoring={:?}\ncompare_full={}\n\
             decisions_from={:?}\nversion={}\ncommit={}\n",
            self.model_label,
            self.policies,
            self.budgets,
            self.tasks,
            self.mode,
            self.scoring,
            self.compare_full,
            self.decisions_from.map(|d| d.to_string()),
            env!("CARGO_PKG_VERSION"),
            crate::results::git_commit(),
        );
        for c in cells {
            s.push_str(&format!("cell={c:?}\n"));
        }
        format!("{:016x}", fnv1a(s.as_bytes()))
    }

    /// What every cell's task reads of this configuration.
    pub fn cell_options(&self) -> CellOptions {
        CellOptions {
            mode: self.mode,
            scoring: self.scoring,
            compare_full: self.compare_full,
            decisions_from: self.decisions_from,
        }
    }

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

/// 64-bit FNV-1a: stable across platforms and Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
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
                    let follows = task.kind.decisions_from(p, cfg.decisions_from)?;
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
        let run = cfg.fingerprint(&all);
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
                prepared = Some(task.kind.prepare(model, tok, task.limit)?);
            }
            let prep = prepared.as_mut().expect("set above");
            progress(MatrixEvent::CellStart { key, index, total });
            let mut row = ResultRow::new(&key.model, &key.policy, &key.budget, &key.task);
            // a multiple-choice cell keeps its finished blocks until its row is written
            let (mut partial, resumed) = match &cfg.out_dir {
                Some(dir) if prep.journaled() => {
                    let (p, done) = PartialCell::open(dir, key, prep.items(), cfg.resume)?;
                    (Some(p), done)
                }
                _ => (None, Resumed::default()),
            };
            let earlier_s = resumed.seconds;
            let start = Instant::now();
            let mut items = |d, t| progress(MatrixEvent::Items { key, done: d, total: t });
            // the task's remaining cells, when they can share their prompts' prefills
            let group: Vec<usize> = (ci..cells.len()).filter(|&j| owned(j) && !done.contains(&keys[j])).collect();
            let generation = prep.generation().filter(|_| cfg.shared_prefill && group.len() > 1);
            if let Some(generation) = generation.filter(|_| !ahead.contains_key(&ci)) {
                let policies: Vec<&BudgetedPolicy> = group.iter().map(|&j| &cells[j]).collect();
                // the group keeps its finished items until its generations are complete
                let mut partial = match &cfg.out_dir {
                    Some(dir) => {
                        let group_keys: Vec<CellKey> = group.iter().map(|&j| keys[j].clone()).collect();
                        Some(PartialGroup::open(dir, &group_keys, prep.items(), cfg.resume)?)
                    }
                    None => None,
                };
                let (done, earlier) = partial.as_mut().map_or((Vec::new(), 0.0), |(_, (d, s))| (std::mem::take(d), *s));
                let keeper = partial.as_mut().map(|(p, _)| p);
                let gens = cell::shared_generations(model, tok, &policies, generation, (done, keeper), &mut items)?;
                if let Some((p, _)) = partial {
                    p.finish()?;
                }
                let share = (earlier + start.elapsed().as_secs_f64()) / group.len() as f64;
                ahead.extend(group.iter().zip(gens).map(|(&j, g)| (j, (g, share, group.len()))));
            }
            let shared = ahead.remove(&ci);
            let shared_wall = shared.as_ref().map(|s| (s.1, s.2));
            let mut cell = Cell {
                model,
                tok,
                policy: p,
                options: cfg.cell_options(),
                row: &mut row,
                partial: partial.as_mut(),
                resumed,
                report: &mut items,
                shared: shared.map(|s| s.0),
            };
            let peak = prep.run(&mut cell)?;
            row.items = prep.items();
            row.kv_bytes = peak.kv as u64;
            row.kv_metadata_bytes = peak.metadata as u64;
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
