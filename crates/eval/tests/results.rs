//! Result files: append, resume after an interrupted write, CSV and
//! markdown summaries.

use kvslim_eval::results::{finished_cells, read_rows, to_csv, to_markdown, write_summaries};
use kvslim_eval::{CellKey, ResultRow, ResultsLog};
use std::path::PathBuf;
mod common;

use common::TempDir;

fn row(policy: &str, budget: &str, task: &str, acc: f64) -> ResultRow {
    let mut r = ResultRow::new("stories260K", policy, budget, task).metric("acc", acc).metric("acc_norm", acc / 2.0);
    r.items = 10;
    r.kv_bytes = 1024;
    r.timings.insert("wall".into(), 0.5);
    r
}

fn key(policy: &str, budget: &str, task: &str) -> CellKey {
    CellKey {
        model: "stories260K".into(),
        policy: policy.into(),
        budget: budget.into(),
        task: task.into(),
        decisions_from: None,
    }
}

#[test]
fn resume_after_an_interrupted_write() {
    let dir = TempDir::new("resume");
    let (a, b, c) = (
        row("full", "-", "mc:copa.jsonl", 0.5),
        row("h2o", "20%", "mc:copa.jsonl", 0.4),
        row("h2o", "10%", "mc:copa.jsonl", 0.3),
    );
    {
        let mut log = ResultsLog::create(&dir.0).unwrap();
        log.append(&a).unwrap();
        log.append(&b).unwrap();
    }
    // a fresh run refuses to overwrite
    let e = ResultsLog::create(&dir.0).err().expect("must refuse").to_string();
    assert!(e.contains("already holds results"), "{e}");
    // simulate a crash in the middle of writing the third row
    let path = dir.0.join(ResultsLog::FILE);
    let full_line = serde_json::to_string(&c).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&full_line.as_bytes()[..full_line.len() / 2]);
    std::fs::write(&path, &bytes).unwrap();

    let done = finished_cells(&dir.0).unwrap();
    assert_eq!(done.len(), 2);
    assert!(done.contains(&key("full", "-", "mc:copa.jsonl")) && done.contains(&key("h2o", "20%", "mc:copa.jsonl")));
    assert!(read_rows(&path).unwrap().truncated_bytes > 0);

    let (mut log, rows) = ResultsLog::resume(&dir.0).unwrap();
    assert_eq!(rows, vec![a.clone(), b.clone()]);
    log.append(&c).unwrap();
    drop(log);
    let back = read_rows(&path).unwrap();
    assert_eq!(back.truncated_bytes, 0);
    assert_eq!(back.rows, vec![a.clone(), b.clone(), c.clone()]);

    // a complete last row that lost only its newline is kept, and the newline restored
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.trim_end()).unwrap();
    let (mut log, rows) = ResultsLog::resume(&dir.0).unwrap();
    assert_eq!(rows.len(), 3);
    log.append(&row("window", "20%", "mc:copa.jsonl", 0.2)).unwrap();
    drop(log);
    assert_eq!(read_rows(&path).unwrap().rows.len(), 4);

    // a broken line in the middle is an error naming the line
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.insert_str(0, "{\"model\": \n");
    std::fs::write(&path, text).unwrap();
    let e = read_rows(&path).unwrap_err().to_string();
    assert!(e.contains("results.jsonl:1: not a result row"), "{e}");
}

#[test]
fn resume_of_a_missing_log_starts_empty_and_nan_survives() {
    let dir = TempDir::new("fresh");
    let (mut log, rows) = ResultsLog::open(&dir.0, true).unwrap();
    assert!(rows.is_empty());
    let r = row("h2o", "5%", "ppl:wiki.test.raw", f64::NAN);
    log.append(&r).unwrap();
    let back = read_rows(log.path()).unwrap();
    assert!(back.rows[0].metrics["acc"].is_nan());
    assert_eq!(back.rows[0], r);
    assert_eq!(back.rows[0].kvslim_version, env!("CARGO_PKG_VERSION"));
    assert!(!back.rows[0].git_commit.is_empty());
}

#[test]
fn csv_and_markdown_content() {
    let mut rows = vec![
        row("full", "-", "mc:copa.jsonl", 0.55),
        row("h2o", "20%", "mc:copa.jsonl", 0.5),
        row("h2o", "100%", "mc:copa.jsonl", 0.55),
        row("window", "20%", "mc:copa.jsonl", 0.25),
        row("h2o", "20%", "mc:copa.jsonl", 0.45), // a re-run replaces the earlier row
        row("h2o", "20%", "ppl:wiki,1.raw", 0.1),
    ];
    rows[5].metrics.clear();
    rows[5].metrics.insert("ppl".into(), 12.3456);
    let csv = to_csv(&rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "model,policy,budget,task,items,acc,acc_norm,ppl,kv_bytes,kv_metadata_bytes,time_wall,kvslim_version,git_commit"
    );
    assert_eq!(lines.len(), 1 + 5);
    assert!(lines[1].starts_with("stories260K,full,-,mc:copa.jsonl,10,0.55,0.275,,1024,0,0.5,"), "{}", lines[1]);
    assert!(lines[2].starts_with("stories260K,h2o,20%,mc:copa.jsonl,10,0.45,0.225,"), "{}", lines[2]);
    assert!(lines[5].starts_with("stories260K,h2o,20%,\"ppl:wiki,1.raw\",10,,,12.3456,"), "{}", lines[5]);

    let md = to_markdown(&rows);
    let acc_table = "## mc:copa.jsonl — acc (stories260K, 10 items)\n\n\
| policy | 100% | 20% |\n\
|---|---:|---:|\n\
| full | 0.5500 | 0.5500 |\n\
| h2o | 0.5500 | 0.4500 |\n\
| window |  | 0.2500 |\n";
    assert!(md.contains(acc_table), "{md}");
    assert!(md.contains("## mc:copa.jsonl — acc_norm (stories260K, 10 items)"));
    assert!(
        md.contains(
            "## ppl:wiki,1.raw — ppl (stories260K, 10 items)\n\n| policy | 20% |\n|---|---:|\n| h2o | 12.35 |\n"
        ),
        "{md}"
    );

    let dir = TempDir::new("summaries");
    std::fs::create_dir_all(&dir.0).unwrap();
    write_summaries(&dir.0, &rows).unwrap();
    assert_eq!(std::fs::read_to_string(dir.0.join("results.csv")).unwrap(), csv);
    assert_eq!(std::fs::read_to_string(dir.0.join("results.md")).unwrap(), md);
}

/// Only blocks of the same cell that continue one another from item 0 are
/// resumed; a truncated line, another cell's blocks or a changed item count
/// end what is taken, and the file keeps just what was taken.
#[test]
fn partial_cell_takes_only_its_own_contiguous_blocks() {
    use kvslim_eval::results::PartialCell;
    use kvslim_eval::ChoiceScore;
    let dir = TempDir::new("partial");
    std::fs::create_dir_all(&dir.0).unwrap();
    let score = |lp: f64| ChoiceScore {
        logprob_sum: lp,
        n_tokens: 3,
        n_chars: 11,
        greedy: false,
        kv_bytes: 4096,
        kv_metadata_bytes: 64,
    };
    let item = |lp: f64| vec![score(lp), score(lp - 1.0)];
    let (k, other) = (key("h2o", "20%", "mc:copa"), key("h2o", "10%", "mc:copa"));
    // an awkward value that must come back bit for bit
    let awkward = -12.345_678_901_234_567_f64 / 3.0;
    let (mut p, done) = PartialCell::open(&dir.0, &k, 5, true).unwrap();
    assert!(done.scores.is_empty());
    p.append(0, &[item(awkward), item(-2.0)], 1.5).unwrap();
    p.append(2, &[item(-3.0)], 0.25).unwrap();
    drop(p);
    let (_, done) = PartialCell::open(&dir.0, &k, 5, true).unwrap();
    assert_eq!(done.scores, vec![item(awkward), item(-2.0), item(-3.0)]);
    assert_eq!(done.scores[0][0].logprob_sum.to_bits(), awkward.to_bits());
    assert_eq!(done.seconds, 1.75, "the blocks' seconds add up");
    // another cell, or the same cell with another item count, takes nothing
    assert!(PartialCell::open(&dir.0, &k, 6, true).unwrap().1.scores.is_empty());
    let (mut p, _) = PartialCell::open(&dir.0, &k, 5, true).unwrap();
    p.append(0, &[item(-1.0)], 1.0).unwrap();
    drop(p);
    assert!(PartialCell::open(&dir.0, &other, 5, true).unwrap().1.scores.is_empty());
    // a block that does not continue (gap) or a truncated line ends it
    let (mut p, _) = PartialCell::open(&dir.0, &k, 5, false).unwrap();
    p.append(0, &[item(-1.0)], 1.0).unwrap();
    p.append(2, &[item(-5.0)], 1.0).unwrap();
    drop(p);
    assert_eq!(PartialCell::open(&dir.0, &k, 5, true).unwrap().1.scores, vec![item(-1.0)]);
    let path = dir.0.join(PartialCell::FILE);
    let mut text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 1, "rewritten with what was taken");
    text.push_str("{\"key\":{\"model\":\"stories");
    std::fs::write(&path, text).unwrap();
    let (p, done) = PartialCell::open(&dir.0, &k, 5, true).unwrap();
    assert_eq!(done.scores, vec![item(-1.0)]);
    // without resume it starts empty; finishing removes the file
    drop(p);
    let (p, done) = PartialCell::open(&dir.0, &k, 5, false).unwrap();
    assert!(done.scores.is_empty());
    p.finish().unwrap();
    assert!(!path.exists());
}

/// Rows read from result files already published write back byte for byte
/// (the cell key is flattened into the row): a JSON line per row, and the
/// CSV made from them. One merged run, and shards whose rows carry `shard`
/// and `run`; `decisions_from` (in no published row) keeps its place after
/// `task`.
#[test]
fn published_result_files_round_trip_byte_for_byte() {
    let mut r = ResultRow::new("m", "h2o", "64", "ppl");
    r.key.decisions_from = Some("f32".into());
    let line = serde_json::to_string(&r).unwrap();
    assert!(
        line.starts_with(r#"{"model":"m","policy":"h2o","budget":"64","task":"ppl","decisions_from":"f32","items":0,"#),
        "{line}"
    );
    assert_eq!(serde_json::to_string(&serde_json::from_str::<ResultRow>(&line).unwrap()).unwrap(), line);
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    for dir in ["ruler/merged", "qwen/r4k-a/shard-0", "whole/smollm2-whole-shard-9"] {
        let dir = docs.join(dir);
        let text = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
        let mut rows = Vec::new();
        for line in text.lines() {
            let row: ResultRow = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&row).unwrap(), line, "{}", dir.display());
            rows.push(row);
        }
        assert_eq!(to_csv(&rows), std::fs::read_to_string(dir.join("results.csv")).unwrap(), "{}", dir.display());
    }
}
