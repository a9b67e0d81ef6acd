//! Generation tasks with shared prefills (the kvpress protocol): a matrix
//! whose RULER and LCC cells share each prompt's prefill gives every cell
//! the same outputs, scores and KV bytes as running the cells apart.

use kvslim_eval::{run_matrix, MatrixConfig, ResultRow, TaskSpec};
mod common;

use common::stories;

fn run(tasks: &[String], shared_prefill: bool) -> Vec<ResultRow> {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let tasks: Vec<TaskSpec> = tasks.iter().map(|s| TaskSpec::parse(s).unwrap()).collect();
    let mut cfg = MatrixConfig::new("stories260K", tasks);
    // tiled and every-query prefills, one that cannot share (streamed)
    cfg.policies =
        ["full", "h2o", "h2o:prefill=snap:8", "window", "sink", "h2o:agg=max,score=tova", "h2o:prefill=stream:16"]
            .map(String::from)
            .to_vec();
    cfg.budgets = ["50%", "20%"].map(String::from).to_vec();
    cfg.charts = false;
    cfg.shared_prefill = shared_prefill;
    run_matrix(&m.model, tok, &cfg, |_| {}).unwrap()
}

#[test]
fn shared_prefills_change_no_result() {
    let dir = std::env::temp_dir().join(format!("kvslim-shared-prefill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let items = dir.join("items.jsonl");
    let lines = [
        serde_json::json!({"context": "Once upon a time, there was a little girl named Lily. She had a big red ball.\n", "answer": "She liked to play."}),
        serde_json::json!({"context": "Tom had a red ball. Tom and Sue played in the park all day long.\n", "answer": "Tom had a red ball."}),
    ];
    std::fs::write(&items, lines.iter().map(|l| l.to_string() + "\n").collect::<String>()).unwrap();
    let tasks = [
        "passkey:lengths=120,depths=0.5,per_cell=2".to_string(),
        "vt:lengths=150,depths=0.5,per_cell=1".to_string(),
        "niah_multiquery:lengths=150,depths=0.5,per_cell=1".to_string(),
        format!("lcc:{},max_tokens=12", items.display()),
    ];
    let apart = run(&tasks, false);
    let together = run(&tasks, true);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(apart.len(), 4 * (1 + 6 * 2));
    assert_eq!(apart.len(), together.len());
    for (a, t) in apart.iter().zip(&together) {
        let what = format!("{} {} {}", a.key.policy, a.key.budget, a.key.task);
        assert_eq!(a.key, t.key);
        assert_eq!(a.metrics, t.metrics, "{what}");
        assert_eq!(a.per_item, t.per_item, "{what}");
        assert_eq!((a.kv_bytes, a.kv_metadata_bytes), (t.kv_bytes, t.kv_metadata_bytes), "{what}");
        assert!(!a.timings.contains_key("shared_cells"), "{what}");
    }
    // a task's cells ran together, item by item
    for t in &together {
        assert_eq!(t.timings.get("shared_cells"), Some(&13.0), "{} {} {}", t.key.policy, t.key.budget, t.key.task);
    }
}

/// Compress once, ask many (`niah_multiquery`): under the full cache each
/// question, asked on a fork of the context's cache, finds what asking the
/// whole prompt (context + that question) at once finds; every policy's
/// row counts its questions.
#[test]
fn multiquery_forks_the_context_once_per_question() {
    use kvslim_engine::{generate, GenerateOptions, SamplingParams};
    use kvslim_eval::tasks::{answers_found, ruler_items, RulerConfig, RulerTask};
    // SmolLM2-135M finds some of the needles (TinyStories' 260K model none)
    let m = kvslim_models::load_model(
        &common::shared_dir().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let spec = "niah_multiquery:lengths=200,depths=0.5,per_cell=2";
    let mut cfg = MatrixConfig::new("smollm2", vec![TaskSpec::parse(spec).unwrap()]);
    cfg.policies =
        ["full", "h2o", "h2o:prefill=snap:8", "h2o:prefill=expect:64", "h2o:prefill=kvzip"].map(String::from).to_vec();
    cfg.budgets = vec!["50%".into()];
    cfg.charts = false;
    let rows = run_matrix(&m.model, tok, &cfg, |_| {}).unwrap();
    assert_eq!(rows.len(), 5);
    for r in &rows {
        assert_eq!(r.items, 2, "{}", r.key.policy);
        assert!((0.0..=1.0).contains(&r.metrics["recall"]), "{}", r.key.policy);
    }
    // the full cache, asked the whole prompt per question
    let count = |s: &str| tok.encode(s).unwrap().len();
    let rc = RulerConfig {
        lengths: vec![200],
        depths: vec![0.5],
        per_cell: 2,
        ..RulerConfig::new(RulerTask::NiahMultiQuery)
    };
    let (mut found, mut asked) = (0, 0);
    for it in ruler_items(&rc, &count) {
        for (q, a) in it.questions.iter().zip(&it.answers) {
            let ids = tok.encode(&format!("{}{q}", it.prompt)).unwrap();
            let opts = GenerateOptions {
                max_tokens: 16,
                sampling: SamplingParams::default(),
                policy: kvslim_cache::PolicySpec::full(),
                eos: tok.eos.clone(),
            };
            let g = generate(&m.model, &ids, &opts, |_| true).unwrap();
            found += answers_found(&tok.decode(&g.token_ids).unwrap(), std::slice::from_ref(a));
            asked += 1;
        }
    }
    assert_eq!(asked, 8);
    assert!(found > 0, "the test needs a model that answers some questions");
    assert_eq!(rows[0].metrics["recall"], found as f64 / asked as f64);
}

/// A shared group keeps its finished blocks of items in
/// `partial-shared.jsonl`: a run cut off mid-group resumes after them (what
/// the file holds is used, not run again) and ends with the rows an
/// uninterrupted run writes.
#[test]
fn a_cut_off_shared_group_resumes_from_its_finished_items() {
    use kvslim_eval::results::PartialGroup;
    use kvslim_eval::MatrixEvent;
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let root = std::env::temp_dir().join(format!("kvslim-shared-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let items = root.join("items.jsonl");
    let text = std::fs::read_to_string(common::shared_dir().join("data/tinystories/tinystories_val.txt")).unwrap();
    let lines: String = text
        .split("\n\n")
        .filter(|p| p.len() > 200)
        .take(9)
        .map(|p| {
            let cut = p.char_indices().nth(150).map_or(p.len(), |(i, _)| i);
            serde_json::json!({"context": &p[..cut], "answer": &p[cut..]}).to_string() + "\n"
        })
        .collect();
    std::fs::write(&items, lines).unwrap();
    let config = |dir: &std::path::Path, resume: bool| {
        let mut cfg = MatrixConfig::new(
            "stories260K",
            vec![TaskSpec::parse(&format!("lcc:{},max_tokens=12", items.display())).unwrap()],
        );
        cfg.policies = ["full", "h2o", "h2o:prefill=snap:8"].map(String::from).to_vec();
        cfg.budgets = vec!["50%".into()];
        cfg.charts = false;
        cfg.out_dir = Some(dir.to_path_buf());
        cfg.resume = resume;
        cfg
    };
    // the whole run, keeping a copy of the group's file after its first block
    let (first, saved) = (root.join("first"), root.join("saved.jsonl"));
    std::fs::create_dir_all(&first).unwrap();
    let whole = run_matrix(&m.model, tok, &config(&first, false), |e| {
        if let MatrixEvent::Items { done, total, .. } = e {
            if done < total && !saved.exists() {
                std::fs::copy(first.join(PartialGroup::FILE), &saved).unwrap();
            }
        }
    })
    .unwrap();
    assert!(!first.join(PartialGroup::FILE).exists(), "a finished group leaves no partial file");
    let block: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&saved).unwrap().lines().next().unwrap()).unwrap();
    let kept = block["gens"].as_array().unwrap().len();
    assert!(kept > 0 && kept < 9, "{kept} items in the first block");
    // resumed from the copy: the same rows, and the run starts past the kept items
    let resume = |name: &str, file: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(PartialGroup::FILE), file).unwrap();
        let mut first_report = None;
        let rows = run_matrix(&m.model, tok, &config(&dir, true), |e| {
            if let MatrixEvent::Items { done, .. } = e {
                first_report.get_or_insert(done);
            }
        })
        .unwrap();
        (rows, first_report)
    };
    let file = std::fs::read_to_string(&saved).unwrap();
    let (rows, first_report) = resume("resumed", &file);
    assert_eq!(first_report, Some(kept), "the resumed run reports the kept items first");
    assert_eq!(rows.len(), whole.len());
    for (a, b) in whole.iter().zip(&rows) {
        assert_eq!(a.key, b.key);
        assert_eq!(a.metrics, b.metrics, "{}", a.key.policy);
        assert_eq!(a.per_item, b.per_item, "{}", a.key.policy);
    }
    // what the file holds is what counts: item 0 answered nothing there
    let mut blank: serde_json::Value = block.clone();
    for g in blank["gens"][0].as_array_mut().unwrap() {
        g[0]["token_ids"] = serde_json::json!([]);
    }
    let (rows, _) = resume("blanked", &(blank.to_string() + "\n"));
    for (a, b) in whole.iter().zip(&rows) {
        let (x, y) = (&a.per_item["edit_sim"], &b.per_item["edit_sim"]);
        assert_eq!(y[0], 0.0, "{}: item 0 came from the file", a.key.policy);
        assert_eq!(x[1..], y[1..], "{}: the other items", a.key.policy);
    }
    assert!(whole.iter().any(|r| r.per_item["edit_sim"][0] > 0.0), "item 0's real answers are not all empty");
    let _ = std::fs::remove_dir_all(&root);
}
