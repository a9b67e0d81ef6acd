//! `kvslim tune` end to end on stories260K: the search runs, the file it
//! writes is a policy every `--policy` accepts, and bad inputs are refused
//! with the file or flag named.

mod common;

use common::{kvslim, perplexity_args, stories, stories_text};
use std::path::PathBuf;
use std::process::Output;

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "kvslim failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    assert!(!o.status.success(), "kvslim should have failed: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn paths() -> (String, String) {
    (stories(), stories_text())
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvslim-cli-tune-{name}-{}.json", std::process::id()))
}

/// A tiny search: 4 candidates, 128-token windows, 3 calibration windows.
fn tiny<'a>(m: &'a str, text: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "tune",
        "--model",
        m,
        "--text",
        text,
        "--grid",
        "tiny",
        "--seq-len",
        "128",
        "--windows",
        "3",
        "--threads",
        "1",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn tune_writes_a_spec_that_perplexity_accepts() {
    let (m, text) = paths();
    let out = tmp("ok");
    let o = out.display().to_string();
    let args = tiny(&m, &text, &["--budget", "20%", "--eval-text", &text, "--eval-windows", "2", "--out", &o]);
    let printed = ok(&kvslim(&args));
    assert!(printed.contains("rank") && printed.contains("held out") && printed.contains("tuned:file="), "{printed}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["kind"], "kvslim-tune");
    assert_eq!(
        (v["budget"].as_str(), v["budget_slots"].as_u64(), v["seq_len"].as_u64()),
        (Some("20%"), Some(25), Some(128))
    );
    let spec = v["spec"].as_str().unwrap().to_string();
    let cands = v["searches"][0]["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 4);
    assert_eq!(cands[0]["spec"].as_str().unwrap(), spec, "the winner is the first row");
    assert_eq!(cands[0]["windows"], 3);
    for c in cands {
        assert!(c["kl"].as_f64().unwrap() >= 0.0, "{c}");
    }
    // the winner's KL is the lowest among the finalists
    let finalists: Vec<f64> = cands.iter().filter(|c| c["windows"] == 3).map(|c| c["kl"].as_f64().unwrap()).collect();
    assert!(finalists.iter().all(|&k| k >= v["kl"].as_f64().unwrap()));
    for key in ["nll", "ppl", "top1_agreement", "full_nll"] {
        assert!(v[key].as_f64().unwrap().is_finite(), "{key}");
    }
    assert!(v["kv_bytes_allocated"].as_u64().unwrap() > 0);
    // calibration: the second half of the text, hashed; held out: its start
    let cal = &v["calibration"];
    let (start, end) = (cal["token_range"][0].as_u64().unwrap(), cal["token_range"][1].as_u64().unwrap());
    assert_eq!(start, cal["text_tokens"].as_u64().unwrap() / 2);
    assert_eq!(end - start, 3 * 127);
    assert_eq!(cal["windows_sha256"].as_str().unwrap().len(), 64);
    assert!(cal["path"].as_str().unwrap().ends_with("tinystories_val.txt"));
    let held = &v["held_out"];
    assert_eq!(held["text"]["token_range"][1].as_u64().unwrap(), 2 * 127);
    let labels: Vec<&str> = held["rows"].as_array().unwrap().iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["tuned", "window", "sink", "heavy", "random", "h2o"]);

    // the file is a policy wherever a spec is accepted
    let policy = format!("tuned:file={o}");
    let r = ok(&kvslim(&perplexity_args(&m, &text, "128", &["--policy", &policy, "--json"])));
    let r: serde_json::Value = serde_json::from_str(&r).unwrap();
    assert_eq!(r["policy"].as_str().unwrap(), spec);
    assert_eq!(r["budget_slots"], v["budget_slots"]);
    let tuned_row = &held["rows"][0];
    assert_eq!(tuned_row["spec"].as_str().unwrap(), spec);

    // the evaluation matrix: one cell at the tuned budget, on exactly the
    // held-out windows (`ppl:…,seq_len=128,limit=2` cuts the same tokens)
    let dir = std::env::temp_dir().join(format!("kvslim-cli-tune-eval-{}", std::process::id()));
    let task = format!("ppl:{text},seq_len=128");
    let d = dir.display().to_string();
    ok(&kvslim(&[
        "eval",
        "--model",
        &m,
        "--policies",
        &format!("window;{policy}"),
        "--budgets",
        "20%,10%",
        "--tasks",
        &task,
        "--limit",
        "2",
        "--threads",
        "1",
        "--out",
        &d,
    ]));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cells: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["policy"].as_str().unwrap(), r["budget"].as_str().unwrap())).collect();
    assert_eq!(cells, [("window", "20%"), ("window", "10%"), (policy.as_str(), "20%")]);
    let t = &rows[2]["metrics"];
    let w = &rows[0]["metrics"];
    for (key, held_key) in [("kl", "kl"), ("nll", "nll")] {
        let (a, b) = (t[key].as_f64().unwrap(), tuned_row[held_key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "matrix {key} {a} vs tune's held-out {b}");
        let (a, b) = (w[key].as_f64().unwrap(), held["rows"][1][held_key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "window {key} {a} vs {b}");
    }
    // at another sequence length the recorded slots would not be 20%: refused
    std::fs::remove_dir_all(&dir).unwrap();
    let e = err(&kvslim(&[
        "eval",
        "--model",
        &m,
        "--policies",
        &policy,
        "--tasks",
        &format!("ppl:{text},seq_len=256"),
        "--limit",
        "1",
        "--out",
        &d,
    ]));
    assert!(e.contains("tuned for 128-token sequences"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn a_quality_target_picks_the_smallest_budget_that_meets_it() {
    let (m, text) = paths();
    // every policy meets a huge target: the smallest budget wins
    let v: serde_json::Value =
        serde_json::from_str(&ok(&kvslim(&tiny(&m, &text, &["--max-kl", "100", "--budgets", "20%,10%", "--json"]))))
            .unwrap();
    assert_eq!((v["budget"].as_str(), v["max_kl"].as_f64()), (Some("10%"), Some(100.0)));
    assert_eq!(v["searches"].as_array().unwrap().len(), 1);
    // none meets an impossible one
    let e = err(&kvslim(&tiny(&m, &text, &["--max-kl", "0", "--budgets", "5%"])));
    assert!(e.contains("no budget in --budgets meets --max-kl 0"), "{e}");
}

#[test]
fn bad_tune_inputs_are_refused_clearly() {
    let (m, text) = paths();
    // evaluation windows that overlap the tune windows on the same file
    let e = err(&kvslim(&tiny(
        &m,
        &text,
        &["--budget", "20%", "--skip-tokens", "100", "--eval-text", &text, "--eval-windows", "2"],
    )));
    assert!(e.contains("overlap") && e.contains("tuning must never read evaluation text"), "{e}");
    // a calibration text too short for the windows asked for
    let e = err(&kvslim(&tiny(&m, &text, &["--budget", "20%", "--skip-tokens", "100000000"])));
    assert!(e.contains("tinystories_val.txt") && e.contains("windows of 128 tokens"), "{e}");
    let e = err(&kvslim(&tiny(&m, "/no/such/calibration.txt", &["--budget", "20%"])));
    assert!(e.contains("/no/such/calibration.txt"), "{e}");
    let e = err(&kvslim(&tiny(&m, &text, &[])));
    assert!(e.contains("--budget"), "{e}");
    let e = err(&kvslim(&tiny(&m, &text, &["--budget", "0%"])));
    assert!(e.contains("(0, 100]"), "{e}");
    let e = err(&kvslim(&tiny(&m, &text, &["--budget", "20%", "--max-kl", "0.1"])));
    assert!(e.contains("cannot be used with"), "{e}");
    let e = err(&kvslim(&["tune", "--model", &m, "--text", &text, "--budget", "20%", "--grid", "huge"]));
    assert!(e.contains("grid `huge`"), "{e}");
    // a policy naming a missing or foreign file
    let ppl = |policy: &str| kvslim(&perplexity_args(&m, &text, "16", &["--policy", policy]));
    let e = err(&ppl("tuned:file=/no/such/tune.json"));
    assert!(e.contains("tuned policy file /no/such/tune.json: cannot read"), "{e}");
    let plan = tmp("plan");
    std::fs::write(&plan, r#"{"layers": []}"#).unwrap();
    let e = err(&ppl(&format!("tuned:file={}", plan.display())));
    assert!(e.contains(&plan.display().to_string()) && e.contains("kvslim-tune"), "{e}");
    std::fs::remove_file(&plan).unwrap();
}
