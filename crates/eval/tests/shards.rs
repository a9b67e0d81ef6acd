//! Sharded evaluation on the 260K-parameter TinyStories model: three shards
//! plus a merge give the unsharded run's results; the merge refuses
//! missing, duplicate, unfinished and foreign shards.

use kvslim_eval::results::read_rows;
use kvslim_eval::{
    merge_shards, run_matrix, EvalError, MatrixConfig, MergeOptions, ResultRow, ResultsLog, Setting, Shard,
    ShardManifest, TaskSpec,
};
use std::path::Path;
mod common;

use common::{stories, task_on, TempDir};

/// Merge options: with plots, without, and a partial merge.
const CHARTS: MergeOptions = MergeOptions { charts: true, partial: false, replace: false };
const PLAIN: MergeOptions = MergeOptions { charts: false, partial: false, replace: false };
const PARTIAL: MergeOptions = MergeOptions { charts: false, partial: true, replace: false };
const REPLACE: MergeOptions = MergeOptions { charts: false, partial: false, replace: true };

fn config(budgets: &[&str]) -> MatrixConfig {
    let specs = [
        task_on("ppl", "tinystories/tinystories_val.txt", "seq_len=64,limit=2"),
        task_on("mc", "copa/copa.jsonl", "limit=4"),
    ];
    let tasks: Vec<TaskSpec> = specs.iter().map(|s| TaskSpec::parse(s).unwrap()).collect();
    let mut cfg = MatrixConfig::new("stories260K", tasks);
    cfg.policies = ["full", "window", "h2o"].map(String::from).to_vec();
    cfg.budgets = budgets.iter().map(|b| b.to_string()).collect();
    cfg
}

/// Splits a CSV line into fields, keeping quoted fields (with commas) whole.
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `results.csv` without its `time_*` columns (wall-clock seconds differ
/// between any two runs).
fn csv_without_timings(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let rows: Vec<Vec<String>> = text.lines().map(fields).collect();
    let keep: Vec<usize> = (0..rows[0].len()).filter(|&i| !rows[0][i].starts_with("time_")).collect();
    assert!(keep.len() < rows[0].len(), "expected time_ columns: {:?}", rows[0]);
    rows.iter().map(|r| keep.iter().map(|&i| r[i].as_str()).collect::<Vec<_>>().join(",") + "\n").collect()
}

fn without_timings(mut r: ResultRow) -> ResultRow {
    r.timings.clear();
    r.unix_time = 0;
    r
}

/// Full-precision perplexity metrics of the same cell were seen to differ
/// in the last bit or two between runs (1.8454001581758759 vs
/// 1.845400158175876), also with one worker thread, and not only between
/// sharded and unsharded runs; the cause (in the engine, below the shard
/// logic, which runs each cell exactly as the unsharded run does) is not
/// tracked down yet. So: `results.md` byte-identical, floats in the CSV and
/// JSONL to a relative 1e-12, everything else byte-identical.
fn close(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn three_shards_merge_to_the_unsharded_results() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let tmp = TempDir::new("shards");
    let _ = std::fs::remove_dir_all(&tmp.0);

    let mut cfg = config(&["100%", "50%"]);
    cfg.out_dir = Some(tmp.0.join("whole"));
    let whole = run_matrix(&m.model, tok, &cfg, |_| {}).unwrap();
    assert_eq!(whole.len(), 2 * 5);

    let shard_dir = |i: usize| tmp.0.join(format!("shard{i}"));
    let mut sizes = Vec::new();
    for index in 0..3 {
        let mut c = config(&["100%", "50%"]);
        c.shard = Some(Shard { index, count: 3 });
        c.out_dir = Some(shard_dir(index));
        c.charts = false;
        let rows = run_matrix(&m.model, tok, &c, |_| {}).unwrap();
        let tag = format!("{index}/3");
        assert!(rows.iter().all(|r| r.shard.as_deref() == Some(tag.as_str()) && r.run.is_some()));
        let manifest = ShardManifest::read(&shard_dir(index)).unwrap();
        assert_eq!((manifest.shard.as_str(), manifest.total_cells), (tag.as_str(), 10));
        assert!(manifest.cells.iter().all(|c| c.n % 3 == index));
        sizes.push(rows.len());
    }
    assert_eq!(sizes, [4, 3, 3], "round-robin over 10 cells");

    // shards in any order
    let merged_dir = tmp.0.join("merged");
    let merged = merge_shards(&[shard_dir(2), shard_dir(0), shard_dir(1)], &merged_dir, CHARTS).unwrap().rows;
    assert_eq!(merged.len(), whole.len());
    assert!(merged.iter().all(|r| r.shard.is_none() && r.run.is_none()));

    let a = tmp.0.join("whole");
    // results.md holds no timings: byte-identical
    assert_eq!(
        std::fs::read_to_string(merged_dir.join("results.md")).unwrap(),
        std::fs::read_to_string(a.join("results.md")).unwrap()
    );
    // results.csv: the same columns and rows, in the same order, every
    // non-float field byte-identical, floats equal to 1e-12 (see `close`)
    let (cx, cy) = (csv_without_timings(&merged_dir.join("results.csv")), csv_without_timings(&a.join("results.csv")));
    let (lx, ly): (Vec<&str>, Vec<&str>) = (cx.lines().collect(), cy.lines().collect());
    assert_eq!((lx[0], lx.len()), (ly[0], ly.len()));
    for (x, y) in lx.iter().zip(&ly) {
        for (fx, fy) in fields(x).iter().zip(fields(y)) {
            match (fx.parse::<f64>(), fy.parse::<f64>()) {
                (Ok(u), Ok(v)) if fx.contains('.') => assert!(close(u, v), "{x}\n{y}"),
                _ => assert_eq!(*fx, fy, "{x}\n{y}"),
            }
        }
    }
    // results.jsonl: the same rows in the same order (timings and unix_time aside), no shard tags
    let read = |d: &Path| read_rows(&d.join(ResultsLog::FILE)).unwrap().rows;
    let (x, y) = (read(&merged_dir), read(&a));
    assert_eq!(x.len(), y.len());
    for (u, v) in x.into_iter().map(without_timings).zip(y.into_iter().map(without_timings)) {
        assert_eq!(u.key, v.key);
        assert_eq!((u.items, u.kv_bytes, u.kv_metadata_bytes), (v.items, v.kv_bytes, v.kv_metadata_bytes));
        assert_eq!(u.metrics.keys().collect::<Vec<_>>(), v.metrics.keys().collect::<Vec<_>>());
        assert!(u.metrics.iter().zip(&v.metrics).all(|(a, b)| close(*a.1, *b.1)), "{u:?}\n{v:?}");
    }
    let jsonl = std::fs::read_to_string(merged_dir.join(ResultsLog::FILE)).unwrap();
    assert!(!jsonl.contains("\"shard\"") && !jsonl.contains("\"run\""), "{jsonl}");
    // the quality charts are redrawn from the merged rows, identically
    let svg = "mc_copa.jsonl_limit_4__stories260K__acc.svg";
    assert_eq!(
        std::fs::read(merged_dir.join("plots").join(svg)).unwrap(),
        std::fs::read(a.join("plots").join(svg)).unwrap()
    );

    // a merged directory is not overwritten, unless replaced
    let err = merge_shards(&[shard_dir(0), shard_dir(1), shard_dir(2)], &merged_dir, PLAIN).unwrap_err();
    let EvalError::Setting(s) = &err else { panic!("{err}") };
    assert_eq!(s.setting, Setting::Replace, "{err}");
    let err = s.message("--replace", " ");
    assert!(err.contains("already holds results; merge with --replace to overwrite them"), "{err}");
    let md = std::fs::read_to_string(a.join("results.md")).unwrap();
    // a refused replacing merge (a shard missing) leaves the old files in place
    let err = merge_shards(&[shard_dir(0), shard_dir(1)], &merged_dir, REPLACE).unwrap_err().to_string();
    assert!(err.contains("missing shard 2/3"), "{err}");
    assert_eq!(std::fs::read_to_string(merged_dir.join("results.md")).unwrap(), md);
    assert!(merged_dir.join("plots").join(svg).exists());
    // a replacing merge writes what a fresh one does: the same rows, and no plots/ left from before
    std::fs::write(merged_dir.join("results.md"), "stale").unwrap();
    let again = merge_shards(&[shard_dir(0), shard_dir(1), shard_dir(2)], &merged_dir, REPLACE).unwrap();
    assert_eq!(again.rows.len(), whole.len());
    assert_eq!(std::fs::read_to_string(merged_dir.join("results.md")).unwrap(), md);
    assert_eq!(read(&merged_dir).len(), whole.len());
    assert!(!merged_dir.join("plots").exists() && !merged_dir.join(".merge-staging").exists());

    // errors
    let fresh = |name: &str| tmp.0.join(name);
    let err = merge_shards(&[shard_dir(0), shard_dir(2)], &fresh("e1"), PLAIN).unwrap_err().to_string();
    assert!(err.contains("missing shard 1/3"), "{err}");
    let err = merge_shards(&[shard_dir(0), shard_dir(1), shard_dir(1)], &fresh("e2"), PLAIN).unwrap_err().to_string();
    assert!(err.contains("shard 1/3 given twice"), "{err}");
    let err = merge_shards(&[shard_dir(0), a.clone(), shard_dir(2)], &fresh("e3"), PLAIN).unwrap_err().to_string();
    assert!(err.contains("shard.json"), "an unsharded run is no shard: {err}");
    // a shard of another configuration (other budgets)
    let mut other = config(&["100%", "25%"]);
    other.shard = Some(Shard { index: 1, count: 3 });
    other.out_dir = Some(fresh("other1"));
    other.charts = false;
    run_matrix(&m.model, tok, &other, |_| {}).unwrap();
    let err =
        merge_shards(&[shard_dir(0), fresh("other1"), shard_dir(2)], &fresh("e4"), PLAIN).unwrap_err().to_string();
    assert!(err.contains("different runs"), "{err}");
    // an unfinished shard: its log lost its last cell
    let cut = fresh("cut2");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::copy(shard_dir(2).join(ShardManifest::FILE), cut.join(ShardManifest::FILE)).unwrap();
    let log = std::fs::read_to_string(shard_dir(2).join(ResultsLog::FILE)).unwrap();
    let keep: Vec<&str> = log.lines().take(2).collect();
    std::fs::write(cut.join(ResultsLog::FILE), keep.join("\n") + "\n").unwrap();
    let err = merge_shards(&[shard_dir(0), shard_dir(1), cut.clone()], &fresh("e5"), PLAIN).unwrap_err().to_string();
    assert!(err.contains("shard 2/3 is not finished: 2 of its 3 cells are done"), "{err}");
    // a partial merge takes the finished cells of the shards it is given, in run order
    let part = merge_shards(&[cut.clone(), shard_dir(0)], &fresh("part"), PARTIAL).unwrap();
    assert_eq!((part.rows.len(), part.total_cells), (4 + 2, 10));
    assert_eq!(part.missing_shards, ["1/3"]);
    let whole_keys: Vec<_> = whole.iter().map(|r| &r.key).collect();
    let order: Vec<usize> =
        part.rows.iter().map(|r| whole_keys.iter().position(|k| *k == &r.key).expect("a cell of the run")).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "run order: {order:?}");
    assert!(order.iter().all(|n| n % 3 == 0 || n % 3 == 2));
    let md = std::fs::read_to_string(fresh("part").join("results.md")).unwrap();
    assert!(md.contains("6 of its 10 cells are finished; shards not given: 1/3"), "{md}");
    assert_eq!(read_rows(&fresh("part").join(ResultsLog::FILE)).unwrap().rows.len(), 6);
    // a partial merge still refuses shards of another run
    let err = merge_shards(&[shard_dir(0), fresh("other1")], &fresh("e6"), PARTIAL).unwrap_err().to_string();
    assert!(err.contains("different runs"), "{err}");
    // nothing was written by a refused merge
    for e in ["e1", "e2", "e3", "e4", "e5", "e6"] {
        assert!(!fresh(e).exists(), "{e}");
    }

    // resuming the cut shard runs just the missing cell, then the merge succeeds
    let mut c = config(&["100%", "50%"]);
    c.shard = Some(Shard { index: 2, count: 3 });
    c.out_dir = Some(cut.clone());
    c.resume = true;
    c.charts = false;
    let mut started = 0;
    run_matrix(&m.model, tok, &c, |e| {
        if let kvslim_eval::MatrixEvent::CellStart { .. } = e {
            started += 1
        }
    })
    .unwrap();
    assert_eq!(started, 1);
    merge_shards(&[shard_dir(0), shard_dir(1), cut.clone()], &fresh("ok2"), PLAIN).unwrap();
    assert_eq!(
        std::fs::read_to_string(fresh("ok2").join("results.md")).unwrap(),
        std::fs::read_to_string(a.join("results.md")).unwrap()
    );
    // resuming a shard directory as another shard is refused
    c.shard = Some(Shard { index: 1, count: 3 });
    let err = run_matrix(&m.model, tok, &c, |_| {}).unwrap_err().to_string();
    assert!(err.contains("holds shard 2/3"), "{err}");
}
