//! Quality-vs-budget charts from result rows: per task, model and headline
//! metric, one line per policy over the budget (log x axis); a policy run
//! without a budget (`full`) is drawn flat across the budget range.

use crate::chart::Chart;
use crate::error::{EvalError, Result};
use crate::results::ResultRow;
use std::path::{Path, PathBuf};

/// A budget label as a number on the x axis: `20%` → 20 (percent axis),
/// `64` → 64 (slot axis).
fn budget_x(b: &str) -> Option<(f64, bool)> {
    match b.strip_suffix('%') {
        Some(p) => p.parse().ok().map(|v| (v, true)),
        None => b.parse().ok().map(|v| (v, false)),
    }
}

/// A file-name-safe version of `s`.
fn slug(s: &str) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    out.truncate(80);
    out
}

/// A per-row quantity to draw against the budget (`None`: not measured).
type RowValue = dyn Fn(&ResultRow) -> Option<f64>;

/// Charts for every (task, model, headline metric) with at least one
/// budgeted point, named `TASK__MODEL__METRIC` (file-name safe). When a
/// group mixes percentage and slot budgets, only the percentages are drawn.
pub fn charts(rows: &[ResultRow]) -> Vec<(String, Chart)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.key.task.as_str(), r.key.model.as_str())) {
            groups.push((&r.key.task, &r.key.model));
        }
    }
    let mut out = Vec::new();
    for (task, model) in groups {
        let g: Vec<&ResultRow> = rows.iter().filter(|r| r.key.task == task && r.key.model == model).collect();
        let percent = g.iter().any(|r| budget_x(&r.key.budget).is_some_and(|(_, p)| p));
        let xs: Vec<f64> =
            g.iter().filter_map(|r| budget_x(&r.key.budget)).filter(|&(_, p)| p == percent).map(|(x, _)| x).collect();
        if xs.is_empty() {
            continue;
        }
        let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let mut policies: Vec<&str> = Vec::new();
        for r in &g {
            if !policies.contains(&r.key.policy.as_str()) {
                policies.push(&r.key.policy);
            }
        }
        for metric in crate::tasks::headline_metrics() {
            if !g.iter().any(|r| r.metrics.contains_key(metric)) {
                continue;
            }
            let mut chart = Chart::new(format!("{task} - {metric}"))
                .x_label(if percent { "KV budget (% of sequence)" } else { "KV budget (slots)" })
                .y_label(format!("{metric} ({model})"))
                .log_x(true);
            for p in &policies {
                let mut pts: Vec<(f64, f64)> = Vec::new();
                for r in g.iter().filter(|r| r.key.policy == *p) {
                    let Some(&v) = r.metrics.get(metric) else { continue };
                    match budget_x(&r.key.budget) {
                        Some((x, is_pct)) if is_pct == percent => pts.push((x, v)),
                        Some(_) => {}
                        None if r.key.budget == "-" => pts.extend([(lo, v), (hi, v)]),
                        None => {}
                    }
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                pts.dedup_by(|a, b| a.0 == b.0);
                if !pts.is_empty() {
                    chart = chart.series(*p, pts);
                }
            }
            out.push((format!("{}__{}__{}", slug(task), slug(model), slug(metric)), chart));
        }
        // the seed's other two curves: physical memory and time per token
        // against the budget (peak allocated bytes when measured, so pages
        // kept alive by holes count)
        let memory = |r: &ResultRow| {
            let b = r.metrics.get("kv_bytes_peak").copied().unwrap_or(r.kv_bytes as f64);
            (b > 0.0).then_some(b / 1048576.0)
        };
        let time = |r: &ResultRow| r.timings.get("step_ms").copied();
        let curves: [(&str, String, &RowValue); 2] = [
            ("kv_bytes", format!("KV MiB per sequence, peak ({model})"), &memory),
            ("step_ms", format!("decode ms per token ({model})"), &time),
        ];
        for (name, y_label, value) in curves {
            let mut chart = Chart::new(format!("{task} - {name}"))
                .x_label(if percent { "KV budget (% of sequence)" } else { "KV budget (slots)" })
                .y_label(y_label)
                .log_x(true);
            let mut any = false;
            for p in &policies {
                let mut pts: Vec<(f64, f64)> = Vec::new();
                for r in g.iter().filter(|r| r.key.policy == *p) {
                    let Some(v) = value(r) else { continue };
                    match budget_x(&r.key.budget) {
                        Some((x, is_pct)) if is_pct == percent => pts.push((x, v)),
                        None if r.key.budget == "-" => pts.extend([(lo, v), (hi, v)]),
                        _ => {}
                    }
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                pts.dedup_by(|a, b| a.0 == b.0);
                if !pts.is_empty() {
                    any = true;
                    chart = chart.series(*p, pts);
                }
            }
            if any {
                out.push((format!("{}__{}__{name}", slug(task), slug(model)), chart));
            }
        }
        out.extend(breakdown_charts(task, model, &g));
    }
    out
}

/// Long-context tasks: accuracy against the prompt length (`acc_len{L}`,
/// log x) and against the needle depth (`acc_depth{D}`), one line per
/// policy and budget.
fn breakdown_charts(task: &str, model: &str, g: &[&ResultRow]) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    for (prefix, x_label, log, name) in [
        ("acc_len", "prompt length (tokens)", true, "acc_by_length"),
        ("acc_depth", "needle depth (0 = start, 1 = end)", false, "acc_by_depth"),
    ] {
        let mut chart = Chart::new(format!("{task} - accuracy by {}", if log { "length" } else { "depth" }))
            .x_label(x_label)
            .y_label(format!("acc ({model})"))
            .log_x(log);
        let mut any = false;
        for r in g {
            let mut pts: Vec<(f64, f64)> = r
                .metrics
                .iter()
                .filter_map(|(k, &v)| Some((k.strip_prefix(prefix)?.parse::<f64>().ok()?, v)))
                .collect();
            // one depth (or length) says nothing about the trend
            if pts.len() < 2 {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label =
                if r.key.budget == "-" { r.policy_label() } else { format!("{} {}", r.policy_label(), r.key.budget) };
            chart = chart.series(label, pts);
            any = true;
        }
        if any {
            out.push((format!("{}__{}__{name}", slug(task), slug(model)), chart));
        }
    }
    out
}

/// Writes every chart of [`charts`] as `DIR/NAME.png` and `DIR/NAME.svg`;
/// returns the PNG paths.
pub fn write_charts(dir: &Path, rows: &[ResultRow]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| EvalError::io(dir, e))?;
    let mut written = Vec::new();
    for (name, chart) in charts(rows) {
        for ext in ["png", "svg"] {
            let p = dir.join(format!("{name}.{ext}"));
            chart.save(&p).map_err(|e| EvalError::io(&p, e))?;
            if ext == "png" {
                written.push(p);
            }
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, budget: &str, acc: f64) -> ResultRow {
        ResultRow::new("m", policy, budget, "mc:copa.jsonl").metric("acc", acc)
    }

    #[test]
    fn one_chart_per_metric_with_full_drawn_flat() {
        let rows = vec![
            row("full", "-", 0.6),
            row("h2o", "100%", 0.6),
            row("h2o", "20%", 0.5),
            row("h2o", "5%", 0.4),
            row("window", "20%", 0.3),
            row("window", "64", 0.1), // slot budget in a percent group: left out
        ];
        let c = charts(&rows);
        assert_eq!(c.len(), 1);
        let (name, chart) = &c[0];
        assert_eq!(name, "mc_copa.jsonl__m__acc");
        assert!(chart.log_x);
        let s: Vec<(&str, &Vec<(f64, f64)>)> = chart.series.iter().map(|s| (s.name.as_str(), &s.points)).collect();
        assert_eq!(s[0], ("full", &vec![(5.0, 0.6), (100.0, 0.6)]));
        assert_eq!(s[1], ("h2o", &vec![(5.0, 0.4), (20.0, 0.5), (100.0, 0.6)]));
        assert_eq!(s[2], ("window", &vec![(20.0, 0.3)]));
        assert!(charts(&[row("full", "-", 0.6)]).is_empty());
    }

    #[test]
    fn long_context_rows_get_accuracy_by_length_and_depth() {
        let ruler = |policy: &str, budget: &str, accs: [f64; 2]| {
            ResultRow::new("m", policy, budget, "niah_single")
                .metric("acc", (accs[0] + accs[1]) / 2.0)
                .metric("acc_len1024", accs[0])
                .metric("acc_len4096", accs[1])
                .metric("acc_depth0.5", accs[0])
        };
        let c = charts(&[ruler("full", "-", [1.0, 0.5]), ruler("h2o", "20%", [0.5, 0.0])]);
        let by_len = &c.iter().find(|(n, _)| n.ends_with("acc_by_length")).expect("length chart").1;
        let s: Vec<(&str, &Vec<(f64, f64)>)> = by_len.series.iter().map(|s| (s.name.as_str(), &s.points)).collect();
        assert_eq!(
            s,
            [("full", &vec![(1024.0, 1.0), (4096.0, 0.5)]), ("h2o 20%", &vec![(1024.0, 0.5), (4096.0, 0.0)])]
        );
        // a single depth draws no depth chart
        assert!(!c.iter().any(|(n, _)| n.ends_with("acc_by_depth")));
    }
}
