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
        format!("lcc:{},max_tokens=12", items.display()),
    ];
    let apart = run(&tasks, false);
    let together = run(&tasks, true);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(apart.len(), 3 * (1 + 6 * 2));
    assert_eq!(apart.len(), together.len());
    for (a, t) in apart.iter().zip(&together) {
        let what = format!("{} {} {}", a.policy, a.budget, a.task);
        assert_eq!((&a.policy, &a.budget, &a.task), (&t.policy, &t.budget, &t.task));
        assert_eq!(a.metrics, t.metrics, "{what}");
        assert_eq!(a.per_item, t.per_item, "{what}");
        assert_eq!((a.kv_bytes, a.kv_metadata_bytes), (t.kv_bytes, t.kv_metadata_bytes), "{what}");
        assert!(!a.timings.contains_key("shared_cells"), "{what}");
    }
    // a task's cells ran together, item by item
    for t in &together {
        assert_eq!(t.timings.get("shared_cells"), Some(&13.0), "{} {} {}", t.policy, t.budget, t.task);
    }
}
