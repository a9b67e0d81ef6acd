//! Memory and speed beside quality: for every policy family × budget, the
//! decode step time at several context lengths (the crossover where
//! eviction pays), the allocated KV bytes of one sequence, and how many
//! such sequences fit a KV memory limit.

use crate::budget::{BudgetedPolicy, PolicySource};
use crate::chart::Chart;
use crate::error::{EvalError, Result};
use kvslim_engine::bench::step_time;
use kvslim_models::Model;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One (policy, budget, context) measurement.
#[derive(Clone, Debug, Serialize)]
pub struct SpeedRow {
    pub model: String,
    pub policy: String,
    pub budget: String,
    pub spec: String,
    pub context: usize,
    /// Slots attended per (layer, KV head) at the step.
    pub slots: usize,
    /// Median decode step time (ms) = time per output token at this context.
    pub step_ms: f64,
    /// Allocated K/V plus metadata bytes of one sequence of `context` tokens
    /// (measured after its steps, so a paged store counts its pages).
    pub bytes_per_sequence: usize,
    /// Sequences of this length that fit `--mem-limit` (None without a limit).
    pub max_batch: Option<usize>,
}

/// What [`measure`] sweeps.
pub struct SpeedGrid<'a> {
    pub model_label: &'a str,
    pub families: &'a [String],
    pub budgets: &'a [String],
    pub contexts: &'a [usize],
    /// KV memory limit for the max-batch column.
    pub mem_limit: Option<u64>,
    /// Decode steps timed per point.
    pub steps: usize,
}

/// Measures every family × budget at every context length.
pub fn measure(model: &Model, grid: &SpeedGrid, mut progress: impl FnMut(&SpeedRow)) -> Result<Vec<SpeedRow>> {
    let SpeedGrid { model_label, families, budgets, contexts, mem_limit, steps } = *grid;
    let mut rows = Vec::new();
    for fam in families {
        let fam_budgets: Vec<&str> =
            if fam.trim() == "full" { vec!["-"] } else { budgets.iter().map(String::as_str).collect() };
        for b in fam_budgets {
            let policy = BudgetedPolicy::new(fam, b)?;
            for &ctx in contexts.iter() {
                let spec = policy.spec_for(ctx)?;
                let p = step_time(model, model_label, &spec, ctx, steps)?;
                let per_seq = p.kv_bytes_allocated + p.kv_metadata_bytes;
                let row = SpeedRow {
                    model: model_label.to_string(),
                    policy: policy.family_label(),
                    budget: policy.budget_label(),
                    spec: spec.to_string(),
                    context: ctx,
                    slots: p.slots,
                    step_ms: p.step_ms_median,
                    bytes_per_sequence: per_seq,
                    max_batch: mem_limit.map(|m| (m / per_seq.max(1) as u64) as usize),
                };
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Writes `speed.jsonl`, `speed.md` and two charts (step time vs context,
/// bytes per sequence vs context) into `dir`.
pub fn write_outputs(dir: &Path, rows: &[SpeedRow]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir.join("plots")).map_err(|e| EvalError::io(dir, e))?;
    let mut jsonl = String::new();
    for r in rows {
        jsonl.push_str(&serde_json::to_string(r).map_err(|e| EvalError::Request(e.to_string()))?);
        jsonl.push('\n');
    }
    let p = dir.join("speed.jsonl");
    std::fs::write(&p, jsonl).map_err(|e| EvalError::io(&p, e))?;
    let mut md = String::from(
        "# Memory and speed\n\n| policy | budget | context | slots | step ms | KV+metadata bytes / sequence | max batch |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {} | {} |\n",
            r.policy,
            r.budget,
            r.context,
            r.slots,
            r.step_ms,
            r.bytes_per_sequence,
            r.max_batch.map_or("-".to_string(), |b| b.to_string())
        ));
    }
    let p = dir.join("speed.md");
    std::fs::write(&p, md).map_err(|e| EvalError::io(&p, e))?;
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.policy.clone(), r.budget.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let series = |f: &dyn Fn(&SpeedRow) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        keys.iter()
            .map(|(p, b)| {
                let name = if b == "-" { p.clone() } else { format!("{p} {b}") };
                let pts = rows
                    .iter()
                    .filter(|r| &r.policy == p && &r.budget == b)
                    .map(|r| (r.context as f64, f(r)))
                    .collect();
                (name, pts)
            })
            .collect()
    };
    let mut written = Vec::new();
    let charts = [
        ("step_time_vs_context", "decode step time (ms)", series(&|r| r.step_ms)),
        ("kv_bytes_vs_context", "KV + metadata MiB per sequence", series(&|r| r.bytes_per_sequence as f64 / 1048576.0)),
    ];
    for (name, ylabel, ser) in charts {
        let mut chart = Chart::new(name.replace('_', " ")).x_label("context (tokens)").y_label(ylabel).log_x(true);
        for (n, pts) in ser {
            chart = chart.series(n, pts);
        }
        for ext in ["png", "svg"] {
            let p = dir.join("plots").join(format!("{name}.{ext}"));
            chart.save(&p).map_err(|e| EvalError::io(&p, e))?;
            written.push(p);
        }
    }
    Ok(written)
}
