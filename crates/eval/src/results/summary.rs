//! `results.csv` and `results.md`, rewritten from all rows after every cell.

use super::{CellKey, ResultRow};
use crate::error::{EvalError, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Keeps the last row of each cell, in first-appearance order.
fn dedup(rows: &[ResultRow]) -> Vec<&ResultRow> {
    let mut order: Vec<CellKey> = Vec::new();
    let mut last: BTreeMap<CellKey, &ResultRow> = BTreeMap::new();
    for r in rows {
        let k = r.key.clone();
        if last.insert(k.clone(), r).is_none() {
            order.push(k);
        }
    }
    order.iter().map(|k| last[k]).collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

/// Every row (the last one per cell) as CSV: identity columns (plus
/// `decisions_from` when some row followed a reference's decisions; empty
/// for the policy's own), `items`,
/// one column per metric (sorted union; empty when absent or not finite),
/// `kv_bytes`, `kv_metadata_bytes`, one `time_*` column per timing,
/// version and commit.
pub fn to_csv(rows: &[ResultRow]) -> String {
    let rows = dedup(rows);
    let metrics: BTreeSet<&str> = rows.iter().flat_map(|r| r.metrics.keys().map(String::as_str)).collect();
    let timings: BTreeSet<&str> = rows.iter().flat_map(|r| r.timings.keys().map(String::as_str)).collect();
    let follows = rows.iter().any(|r| r.key.decisions_from.is_some());
    let mut head: Vec<String> = ["model", "policy", "budget", "task"].iter().map(|s| s.to_string()).collect();
    if follows {
        head.push("decisions_from".into());
    }
    head.push("items".into());
    head.extend(metrics.iter().map(|m| m.to_string()));
    head.extend(["kv_bytes".to_string(), "kv_metadata_bytes".to_string()]);
    head.extend(timings.iter().map(|t| format!("time_{t}")));
    head.extend(["kvslim_version".to_string(), "git_commit".to_string()]);
    let mut out = head.iter().map(|h| csv_field(h)).collect::<Vec<_>>().join(",");
    out.push('\n');
    for r in rows {
        let mut f =
            vec![csv_field(&r.key.model), csv_field(&r.key.policy), csv_field(&r.key.budget), csv_field(&r.key.task)];
        if follows {
            f.push(csv_field(r.key.decisions_from.as_deref().unwrap_or("")));
        }
        f.push(r.items.to_string());
        f.extend(metrics.iter().map(|m| r.metrics.get(*m).map_or(String::new(), |v| num(*v))));
        f.push(r.kv_bytes.to_string());
        f.push(r.kv_metadata_bytes.to_string());
        f.extend(timings.iter().map(|t| r.timings.get(*t).map_or(String::new(), |v| num(*v))));
        f.push(csv_field(&r.kvslim_version));
        f.push(csv_field(&r.git_commit));
        out.push_str(&f.join(","));
        out.push('\n');
    }
    out
}

/// Budget columns: percentages from large to small, then slot counts from
/// large to small, then anything else in first-appearance order. `-` (a
/// policy that ignores budgets) is not a column.
fn budget_order(budgets: &[&str]) -> Vec<String> {
    let mut pct: Vec<(f64, &str)> = Vec::new();
    let mut slots: Vec<(u64, &str)> = Vec::new();
    let mut other: Vec<&str> = Vec::new();
    for &b in budgets {
        if b == "-" || pct.iter().any(|p| p.1 == b) || slots.iter().any(|s| s.1 == b) || other.contains(&b) {
            continue;
        }
        if let Some(p) = b.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) {
            pct.push((p, b));
        } else if let Ok(n) = b.parse::<u64>() {
            slots.push((n, b));
        } else {
            other.push(b);
        }
    }
    pct.sort_by(|a, b| b.0.total_cmp(&a.0));
    slots.sort_by_key(|s| std::cmp::Reverse(s.0));
    pct.iter().map(|p| p.1).chain(slots.iter().map(|s| s.1)).chain(other).map(String::from).collect()
}

fn cell(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Markdown: per (task, model) in first-appearance order, a table for each
/// [`crate::tasks::headline_metrics`] entry present; rows are policies (first-appearance
/// order), columns budgets (percentages large to small, then slot counts); a policy run without a
/// budget (`-`, e.g. `full`) shows its one value in every column.
pub fn to_markdown(rows: &[ResultRow]) -> String {
    let rows = dedup(rows);
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in &rows {
        if !groups.contains(&(r.key.task.as_str(), r.key.model.as_str())) {
            groups.push((&r.key.task, &r.key.model));
        }
    }
    let mut out = String::from("# Results\n");
    for (task, model) in groups {
        let g: Vec<&&ResultRow> = rows.iter().filter(|r| r.key.task == task && r.key.model == model).collect();
        let budgets = budget_order(&g.iter().map(|r| r.key.budget.as_str()).collect::<Vec<_>>());
        let budgets = if budgets.is_empty() { vec!["-".to_string()] } else { budgets };
        let mut policies: Vec<String> = Vec::new();
        for r in &g {
            if !policies.contains(&r.policy_label()) {
                policies.push(r.policy_label());
            }
        }
        let items = g.iter().map(|r| r.items).max().unwrap_or(0);
        for metric in crate::tasks::headline_metrics() {
            if !g.iter().any(|r| r.metrics.contains_key(metric)) {
                continue;
            }
            out.push_str(&format!("\n## {} — {} ({}, {} items)\n\n", md_escape(task), metric, md_escape(model), items));
            out.push_str("| policy |");
            for b in &budgets {
                out.push_str(&format!(" {} |", md_escape(b)));
            }
            out.push_str("\n|---|");
            out.push_str(&"---:|".repeat(budgets.len()));
            out.push('\n');
            for p in &policies {
                out.push_str(&format!("| {} |", md_escape(p)));
                let unbudgeted = g.iter().find(|r| r.policy_label() == *p && r.key.budget == "-");
                for b in &budgets {
                    let r = g.iter().find(|r| r.policy_label() == *p && r.key.budget == *b).or(unbudgeted);
                    let v = r.and_then(|r| {
                        let v = cell(*r.metrics.get(metric)?);
                        // accuracy with its standard error
                        Some(match (metric, r.metrics.get("acc_stderr")) {
                            ("acc", Some(se)) => format!("{v} ± {}", cell(*se)),
                            _ => v,
                        })
                    });
                    out.push_str(&format!(" {} |", v.unwrap_or_default()));
                }
                out.push('\n');
            }
        }
        paired_tables(&mut out, task, model, &g, &budgets, &policies);
    }
    out
}

/// Per-item metrics compared in pairs.
const PAIRED_METRICS: &[&str] = &["acc", "acc_norm", "nll"];

/// For each [`PAIRED_METRICS`] entry with per-item values: a table of each
/// policy's mean difference from the plain full cache on the same items,
/// and one of `auto`'s difference from each other policy at the same
/// budget, each with its paired 95% bootstrap interval (`*`: the interval
/// excludes 0).
fn paired_tables(
    out: &mut String,
    task: &str,
    model: &str,
    g: &[&&ResultRow],
    budgets: &[String],
    policies: &[String],
) {
    let at = |p: &str, b: &str| {
        let unbudgeted = g.iter().find(|r| r.policy_label() == p && r.key.budget == "-");
        g.iter().find(|r| r.policy_label() == p && r.key.budget == b).or(unbudgeted).copied()
    };
    let full = g.iter().find(|r| r.key.policy == "full" && r.key.budget == "-" && r.key.decisions_from.is_none());
    let auto = policies.iter().find(|p| p.split(':').next() == Some("auto"));
    for &metric in PAIRED_METRICS {
        let items = |r: &ResultRow| r.per_item.get(metric).map(Vec::len);
        if let Some(base) = full.and_then(|f| f.per_item.get(metric)) {
            let label = full.map(|f| f.policy_label()).unwrap_or_default();
            let others: Vec<&String> = policies.iter().filter(|p| **p != label).collect();
            let heading = format!("{} — {metric} − full, paired 95% CI ({}, {} items)", task, model, base.len());
            paired_table(out, &heading, &others, budgets, |p, b| {
                crate::paired::paired(at(p, b)?.per_item.get(metric)?, base)
            });
        }
        let Some(auto) = auto else { continue };
        let others: Vec<&String> = policies.iter().filter(|p| *p != auto).collect();
        let n = budgets.iter().find_map(|b| items(at(auto, b)?)).unwrap_or(0);
        if n == 0 || others.is_empty() {
            continue;
        }
        let heading = format!("{} — {metric}: `{auto}` − policy, paired 95% CI ({}, {} items)", task, model, n);
        paired_table(out, &heading, &others, budgets, |p, b| {
            crate::paired::paired(at(auto, b)?.per_item.get(metric)?, at(p, b)?.per_item.get(metric)?)
        });
    }
}

/// One paired table: a row per policy, a column per budget.
fn paired_table(
    out: &mut String,
    heading: &str,
    rows: &[&String],
    budgets: &[String],
    cell: impl Fn(&str, &str) -> Option<crate::paired::Paired>,
) {
    out.push_str(&format!("\n## {}\n\n| policy |", md_escape(heading)));
    for b in budgets {
        out.push_str(&format!(" {} |", md_escape(b)));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(budgets.len()));
    out.push('\n');
    for p in rows {
        out.push_str(&format!("| {} |", md_escape(p)));
        for b in budgets {
            let v = cell(p, b).map_or(String::new(), |d| {
                let star = if d.significant() { " *" } else { "" };
                format!("{:+.4} [{:+.4}, {:+.4}]{star}", d.diff, d.lo, d.hi)
            });
            out.push_str(&format!(" {v} |"));
        }
        out.push('\n');
    }
    out.push_str("\n`*`: the interval excludes 0 (significant at 5%).\n");
}

/// Writes `results.csv` and `results.md` into `dir`.
pub fn write_summaries(dir: &Path, rows: &[ResultRow]) -> Result<()> {
    write_summaries_noted(dir, rows, None)
}

/// [`write_summaries`] with a paragraph under `results.md`'s title (what
/// the rows are, e.g. a partial merge).
pub fn write_summaries_noted(dir: &Path, rows: &[ResultRow], note: Option<&str>) -> Result<()> {
    let mut md = to_markdown(rows);
    if let Some(note) = note {
        let title_end = md.find('\n').map_or(md.len(), |i| i + 1);
        md.insert_str(title_end, &format!("\n{note}\n"));
    }
    for (name, text) in [("results.csv", to_csv(rows)), ("results.md", md)] {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| EvalError::io(&p, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_sort_large_to_small() {
        assert_eq!(
            budget_order(&["20%", "-", "5%", "100%", "64", "128", "20%", "x"]),
            ["100%", "20%", "5%", "128", "64", "x"]
        );
    }

    #[test]
    fn csv_quotes_when_needed() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(num(f64::NAN), "");
        assert_eq!(cell(0.51234), "0.5123");
        assert_eq!(cell(12.345), "12.35");
    }

    #[test]
    fn markdown_shows_stderr_and_paired_differences_against_full() {
        let row = |policy: &str, budget: &str, acc: &[f64]| {
            let mut r = ResultRow::new("m", policy, budget, "mc:x")
                .metric("acc", acc.iter().sum::<f64>() / acc.len() as f64)
                .metric("acc_stderr", 0.05);
            r.per_item.insert("acc".into(), acc.to_vec());
            r
        };
        let full: Vec<f64> = (0..40).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
        // h2o 20% loses 8 of full's correct items: significant; window loses one, gains one: not
        let mut worse = full.clone();
        (0..16).step_by(2).for_each(|i| worse[i] = 0.0);
        let mut same = full.clone();
        (same[0], same[1]) = (0.0, 1.0);
        let md = to_markdown(&[row("full", "-", &full), row("h2o", "20%", &worse), row("window", "20%", &same)]);
        assert!(md.contains("| full | 0.5000 ± 0.0500 |"), "{md}");
        assert!(md.contains("## mc:x — acc − full, paired 95% CI (m, 40 items)"), "{md}");
        let line = |p: &str| md.lines().rfind(|l| l.starts_with(&format!("| {p} |"))).unwrap().to_string();
        assert!(line("h2o").starts_with("| h2o | -0.2000 [") && line("h2o").ends_with("* |"), "{md}");
        assert!(line("window").starts_with("| window | +0.0000 [") && !line("window").contains('*'), "{md}");

        // with `auto` in the run: its difference from every other policy at the same budget
        let md = to_markdown(&[
            row("full", "-", &full),
            row("h2o", "20%", &worse),
            row("window", "20%", &same),
            row("auto", "20%", &full),
        ]);
        assert!(md.contains("## mc:x — acc: `auto` − policy, paired 95% CI (m, 40 items)"), "{md}");
        let auto_table = &md[md.find("`auto").unwrap()..];
        let row_of = |p: &str| auto_table.lines().find(|l| l.starts_with(&format!("| {p} |"))).unwrap().to_string();
        assert!(row_of("h2o").starts_with("| h2o | +0.2000 [") && row_of("h2o").ends_with("* |"), "{md}");
        assert!(row_of("window").starts_with("| window | +0.0000 [") && !row_of("window").contains('*'), "{md}");
        assert!(row_of("full").starts_with("| full | +0.0000 [+0.0000, +0.0000]"), "{md}");
    }
}
