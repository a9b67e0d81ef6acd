//! Scoring and the matrix on the real 260K-parameter TinyStories model.
//! Kept small: the whole file runs in a few seconds.

use kvslim_cache::PolicySpec;
use kvslim_engine::{perplexity, PerplexityOptions};
use kvslim_eval::results::read_rows;
use kvslim_eval::score::{encode_item, predict, predict_norm, Choice};
use kvslim_eval::tasks::{load_mc_jsonl, McItem};
use kvslim_eval::{
    run_matrix, score_choices, BudgetedPolicy, MatrixConfig, MatrixEvent, McTally, ResultsLog, ScoreMode, TaskSpec,
};
use kvslim_models::LoadedModel;
mod common;

use common::{data, shared_dir, stories, task_on, TempDir};

/// The model, a two-choice story item (the sensible ending first) and the
/// item's context and choices as the model's tokens.
fn story() -> (LoadedModel, McItem, Vec<u32>, Vec<Choice>) {
    let ctx = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. \
One day, she saw a big dog. The dog was very friendly and wanted to play with Lily. Lily was happy and";
    let endings = ["they played together all day.".into(), "quantum spreadsheets exploded vertically.".into()];
    let item = McItem::from_parts(ctx, " ", &endings, 0);
    let m = stories();
    let (ctx, choices) = encode_item(m.tokenizer.as_ref().unwrap(), &item).unwrap();
    (m, item, ctx, choices)
}

#[test]
fn modes_agree_under_the_full_cache_and_match_perplexity() {
    let (m, item, ctx, choices) = story();
    assert_eq!(ctx[0], 1, "BOS");
    let full = PolicySpec::full();
    let dec = score_choices(&m.model, &full, &ctx, &choices, ScoreMode::Decode).unwrap();
    let pre = score_choices(&m.model, &full, &ctx, &choices, ScoreMode::Prefill).unwrap();
    let pc = score_choices(&m.model, &full, &ctx, &choices, ScoreMode::PrefillContext).unwrap();
    for i in 0..2 {
        assert_eq!(dec[i].n_tokens, choices[i].ids.len());
        assert_eq!(dec[i].n_chars, item.continuations[i].chars().count());
        assert!((dec[i].logprob_sum - pre[i].logprob_sum).abs() < 1e-3, "{dec:?} {pre:?}");
        assert!((dec[i].logprob_sum - pc[i].logprob_sum).abs() < 1e-3, "{dec:?} {pc:?}");
        // the engine's teacher forcing gives the same per-token log-probs
        let seq: Vec<u32> = ctx.iter().chain(&choices[i].ids).copied().collect();
        let r = perplexity(&m.model, &seq, &PerplexityOptions::new(full.clone()), |_, _| {}).unwrap();
        let want: f64 = r.logprobs[ctx.len() - 1..].iter().sum();
        assert!((dec[i].logprob_sum - want).abs() < 1e-6, "{} vs {want}", dec[i].logprob_sum);
    }
    // the sensible ending is the likelier one, raw and per character
    assert!(dec[0].logprob_sum > dec[1].logprob_sum, "{dec:?}");
    assert_eq!((predict(&dec), predict_norm(&dec)), (0, 0));
    assert!(score_choices(&m.model, &full, &[], &choices, ScoreMode::Decode).is_err());
}

#[test]
fn full_budget_matches_full_and_small_budgets_change_scores() {
    let (m, _, ctx, choices) = story();
    let full = score_choices(&m.model, &PolicySpec::full(), &ctx, &choices, ScoreMode::Decode).unwrap();
    for fam in ["window", "sink", "heavy", "random", "h2o"] {
        let p = BudgetedPolicy::new(fam, "100%").unwrap();
        let s = score_choices(&m.model, &p, &ctx, &choices, ScoreMode::Decode).unwrap();
        for (a, b) in s.iter().zip(&full) {
            assert!((a.logprob_sum - b.logprob_sum).abs() < 1e-9, "{fam} 100%: {} vs {}", a.logprob_sum, b.logprob_sum);
        }
        let small = BudgetedPolicy::new(fam, "10%").unwrap();
        let s = score_choices(&m.model, &small, &ctx, &choices, ScoreMode::Decode).unwrap();
        assert!(s[0].logprob_sum != full[0].logprob_sum, "{fam} 10% should differ from full");
        assert!(s[0].kv_bytes < full[0].kv_bytes, "{fam} 10% holds fewer slots");
    }
}

#[test]
fn smoke_accuracy_on_real_items() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let dir = shared_dir().join("data");
    let copa = load_mc_jsonl(&dir.join("copa/copa.jsonl"), None).unwrap();
    let hs = load_mc_jsonl(&dir.join("hellaswag/hellaswag_small_llmfoundry.jsonl"), None).unwrap();
    for (name, items) in [("copa", &copa[..40]), ("hellaswag_small", &hs[..])] {
        for policy in ["full", "h2o"] {
            let p = BudgetedPolicy::new(policy, "20%").unwrap();
            let mut t = McTally::default();
            for it in items {
                let (ctx, ch) = encode_item(tok, it).unwrap();
                t.add(it.gold, &score_choices(&m.model, &p, &ctx, &ch, ScoreMode::Decode).unwrap());
            }
            eprintln!(
                "stories260K {name} ({} items) {policy}: acc {:.3} acc_norm {:.3}",
                t.items,
                t.acc(),
                t.acc_norm()
            );
            assert!((0.0..=1.0).contains(&t.acc()) && t.items == items.len());
        }
    }
}

#[test]
fn matrix_end_to_end_and_resume() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let tmp = TempDir::new("matrix");
    std::fs::create_dir_all(&tmp.0).unwrap();
    let prompts = tmp.0.join("prompts.txt");
    std::fs::write(&prompts, "Once upon a time\nTom and Sue went to the park. They saw\n").unwrap();
    // the 6-line format (the real file is checked in tests/data.rs; decoding it takes a while)
    let hellaswag = tmp.0.join("hs.txt");
    std::fs::write(
        &hellaswag,
        "Lily went to the park. she\n1\nate a car.\nplayed on the swing.\nflew to the moon.\nwas a spoon.\n\
         Tom had a red ball. He\n0\nthrew it to his dog.\nmelted into soup.\nsang to the sun.\nis a tree.\n",
    )
    .unwrap();
    let specs = [
        task_on("ppl", "tinystories/tinystories_val.txt", "seq_len=64,limit=2"),
        task_on("mc", "copa/copa.jsonl", "limit=6"),
        format!("hellaswag:{}", hellaswag.display()),
        format!("gen:{},max_tokens=24", prompts.display()),
        "passkey:lengths=96,depths=0,1,per_cell=1".to_string(),
    ];
    let tasks: Vec<TaskSpec> = specs.iter().map(|s| TaskSpec::parse(s).unwrap()).collect();
    let out = tmp.0.join("run");
    let mut cfg = MatrixConfig::new("stories260K", tasks);
    cfg.policies = ["full", "window", "h2o"].map(String::from).to_vec();
    cfg.budgets = ["100%", "50%"].map(String::from).to_vec();
    cfg.out_dir = Some(out.clone());
    let mut events = (0, 0, 0);
    let rows = run_matrix(&m.model, tok, &cfg, |e| match e {
        MatrixEvent::CellStart { .. } => events.0 += 1,
        MatrixEvent::CellDone { .. } => events.1 += 1,
        MatrixEvent::CellSkipped { .. } => events.2 += 1,
        _ => {}
    })
    .unwrap();
    assert_eq!(rows.len(), 5 * 5);
    assert_eq!(events, (25, 25, 0));
    let get = |task: &str, policy: &str, budget: &str| {
        rows.iter()
            .find(|r| r.key.task.starts_with(task) && r.key.policy == policy && r.key.budget == budget)
            .unwrap_or_else(|| panic!("{task} {policy} {budget}"))
    };
    for r in &rows {
        eprintln!("{:<45} {:<7} {:>5} {:?}", r.key.task, r.key.policy, r.key.budget, r.metrics);
    }
    // at 100% nothing is evicted where the budget is relative to the whole
    // scored sequence: every metric equals the full cache's. (Generation
    // resolves budgets against the prompt, so its new tokens do evict.)
    for task in ["ppl:", "mc:", "hellaswag:"] {
        let f = get(task, "full", "-");
        for p in ["window", "h2o"] {
            let r = get(task, p, "100%");
            for (k, v) in &f.metrics {
                // kv_bytes_peak is memory, not quality: B + 1 slots vs the whole sequence
                if k != "kl" && k != "retained_mass" && k != "kv_bytes_peak" {
                    assert!((r.metrics[k] - v).abs() < 1e-6, "{task} {p} 100% {k}: {} vs {v}", r.metrics[k]);
                }
            }
        }
    }
    let ppl = get("ppl:", "h2o", "50%");
    assert!(ppl.metrics["kl"] >= 0.0 && ppl.metrics["top1"] <= 1.0 && ppl.metrics["ppl"] > 1.0);
    let (p1, p5, mean) =
        (ppl.metrics["retained_mass_p1"], ppl.metrics["retained_mass_p5"], ppl.metrics["retained_mass"]);
    assert!(0.0 <= p1 && p1 <= p5 && p5 <= mean && mean <= 1.0, "{p1} {p5} {mean}");
    assert_eq!(get("gen:", "full", "-").metrics["identical"], 1.0);
    let gen = get("gen:", "full", "-");
    assert!(gen.timings["ttft"] > 0.0 && gen.timings["tpot"] > 0.0, "{:?}", gen.timings);
    assert!(get("mc:", "window", "50%").kv_bytes < get("mc:", "full", "-").kv_bytes);
    for f in [
        "results.jsonl",
        "results.csv",
        "results.md",
        "plots/mc_copa.jsonl_limit_6__stories260K__acc.png",
        "plots/mc_copa.jsonl_limit_6__stories260K__kv_bytes.svg",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        md.contains("— acc_norm (stories260K, 6 items)")
            && md.contains("hs.txt — acc (stories260K, 2 items)")
            && md.contains("— ppl (stories260K, 2 items)"),
        "{md}"
    );

    // resume: every cell is skipped and nothing is appended
    let before = std::fs::read(out.join(ResultsLog::FILE)).unwrap();
    cfg.resume = true;
    let mut skipped = 0;
    let again = run_matrix(&m.model, tok, &cfg, |e| {
        if let MatrixEvent::CellSkipped { .. } = e {
            skipped += 1
        }
    })
    .unwrap();
    assert_eq!((skipped, again.len()), (25, 25));
    assert_eq!(std::fs::read(out.join(ResultsLog::FILE)).unwrap(), before);
    assert_eq!(read_rows(&out.join(ResultsLog::FILE)).unwrap().rows.len(), 25);
    // without resume the existing log is refused
    cfg.resume = false;
    assert!(run_matrix(&m.model, tok, &cfg, |_| {}).is_err());
}

/// `ppl:FILE,prompt=P`: each window's first P tokens are a prompt the
/// policy compresses in its prefill; only the continuation's predictions
/// count, so SnapKV's compression shows in KL, and a prompt too long for
/// the windows is refused before anything runs.
#[test]
fn a_compressed_prompts_continuation_is_what_ppl_prompt_scores() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let run = |prompt: usize| {
        let task = task_on("ppl", "tinystories/tinystories_val.txt", &format!("seq_len=64,limit=2,prompt={prompt}"));
        let mut cfg = MatrixConfig::new("stories260K", vec![TaskSpec::parse(&task).unwrap()]);
        cfg.policies = ["full", "h2o:prefill=snap:8"].map(String::from).to_vec();
        cfg.budgets = vec!["25%".into()];
        run_matrix(&m.model, tok, &cfg, |_| {})
    };
    let rows = run(48).unwrap();
    let (full, snap) = (&rows[0].metrics, &rows[1].metrics);
    assert_eq!((full["tokens"], snap["tokens"]), (30.0, 30.0), "2 windows × (63 − 48) predictions");
    assert!(full["kl"] == 0.0 && snap["kl"] > 0.0, "{full:?} {snap:?}");
    let e = run(63).unwrap_err().to_string();
    assert!(e.contains("prompt=63 leaves no continuation"), "{e}");
}

/// A missing task file stops the run before it writes anything, naming the
/// file, even when other tasks come first.
#[test]
fn a_missing_task_file_fails_before_the_output_is_made() {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let tmp = TempDir::new("missing");
    let tasks = [task_on("mc", "copa/copa.jsonl", "limit=4"), "mc:/nonexistent/items.jsonl".to_string()];
    let mut c = MatrixConfig::new("stories260K", tasks.iter().map(|t| TaskSpec::parse(t).unwrap()).collect());
    c.policies = vec!["full".to_string()];
    c.out_dir = Some(tmp.0.join("out"));
    let e = run_matrix(&m.model, tok, &c, |_| {}).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/items.jsonl") && e.contains("cannot read"), "{e}");
    assert!(!tmp.0.join("out").exists());
    c.tasks = vec![TaskSpec::parse(&format!("mc:{}", shared_dir().join("data").display())).unwrap()];
    let e = run_matrix(&m.model, tok, &c, |_| {}).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
}

/// A multiple-choice cell cut off midway (here: a panic after its first
/// block of 16 items) resumes after that block, and its row equals an
/// uninterrupted run's bit for bit; the partial file is gone afterwards.
#[test]
fn an_interrupted_multiple_choice_cell_resumes_after_its_last_block() {
    use kvslim_eval::results::PartialCell;
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let tmp = TempDir::new("partial");
    let task = TaskSpec::parse(&task_on("mc", "copa/copa.jsonl", "limit=40")).unwrap();
    let config = |dir: &str| {
        let mut c = MatrixConfig::new("stories260K", vec![task.clone()]);
        c.policies = vec!["h2o".to_string()];
        c.budgets = vec!["50%".to_string()];
        c.out_dir = Some(tmp.0.join(dir));
        c.charts = false;
        c
    };
    let whole = run_matrix(&m.model, tok, &config("whole"), |_| {}).unwrap();
    assert!(!tmp.0.join("whole").join(PartialCell::FILE).exists());

    let mut cut = config("cut");
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_matrix(&m.model, tok, &cut, |e| {
            if let MatrixEvent::Items { done, .. } = e {
                assert!(done < 16, "interrupted after the first block");
            }
        })
    }));
    assert!(crashed.is_err());
    let partial = std::fs::read_to_string(tmp.0.join("cut").join(PartialCell::FILE)).unwrap();
    assert_eq!(partial.lines().count(), 1, "one finished block");
    assert_eq!(read_rows(&tmp.0.join("cut").join(ResultsLog::FILE)).unwrap().rows.len(), 0);

    // the kept block is what a resumed cell uses: a copy whose block says
    // choice 0 wins every item scores those items by choice 0
    let tampered = tmp.0.join("tampered");
    std::fs::create_dir_all(&tampered).unwrap();
    let mut block: serde_json::Value = serde_json::from_str(partial.trim()).unwrap();
    for item in block["scores"].as_array_mut().unwrap() {
        for (c, choice) in item.as_array_mut().unwrap().iter_mut().enumerate() {
            choice["logprob_sum"] = serde_json::json!(if c == 0 { 0.0 } else { -1000.0 });
        }
    }
    // and its time counts in the cell's wall time
    block["seconds"] = serde_json::json!(1000.0);
    std::fs::write(tampered.join(PartialCell::FILE), format!("{block}\n")).unwrap();
    let mut t = config("tampered");
    t.resume = true;
    let from_block = run_matrix(&m.model, tok, &t, |_| {}).unwrap();
    let golds: Vec<usize> = load_mc_jsonl(&data("copa/copa.jsonl"), None).unwrap().iter().map(|i| i.gold).collect();
    let by_choice0: Vec<f64> = golds[..16].iter().map(|&g| f64::from(u8::from(g == 0))).collect();
    assert_eq!(from_block[0].per_item["acc"][..16], by_choice0[..]);
    assert_ne!(whole[0].per_item["acc"][..16], by_choice0[..], "the test needs the model to differ from 'always 0'");
    assert_eq!(from_block[0].per_item["acc"][16..], whole[0].per_item["acc"][16..]);
    // the recorded pick is the chosen choice: 0 in the tampered block, and
    // wherever it equals the gold, the item counts as correct
    assert!(from_block[0].per_item["pick"][..16].iter().all(|&p| p == 0.0));
    for (metric, picks) in [("acc", "pick"), ("acc_norm", "pick_norm")] {
        let (hits, picks) = (&whole[0].per_item[metric], &whole[0].per_item[picks]);
        assert_eq!(picks.len(), 40);
        for ((&hit, &pick), &gold) in hits.iter().zip(picks).zip(&golds) {
            assert_eq!(hit == 1.0, pick == gold as f64, "{metric}: pick {pick}, gold {gold}");
        }
    }
    let wall = from_block[0].timings["wall"];
    assert!((1000.0..1060.0).contains(&wall), "wall {wall}");

    cut.resume = true;
    let mut reported = Vec::new();
    let resumed = run_matrix(&m.model, tok, &cut, |e| {
        if let MatrixEvent::Items { done, .. } = e {
            reported.push(done)
        }
    })
    .unwrap();
    assert_eq!(reported, [16, 32, 40], "starts after the kept block");
    assert!(!tmp.0.join("cut").join(PartialCell::FILE).exists());
    let (a, b) = (&whole[0], &resumed[0]);
    assert_eq!((a.items, b.items), (40, 40));
    assert_eq!(a.per_item, b.per_item);
    for (k, v) in &a.metrics {
        assert_eq!(v.to_bits(), b.metrics[k].to_bits(), "{k}: {v} vs {}", b.metrics[k]);
    }
}

/// The speed grid's bytes per sequence are measured after the context is
/// held, so a paged store (which allocates as tokens arrive) is not
/// counted as empty: paged `full` holds as many K/V bytes as fixed slots.
#[test]
fn speed_grid_counts_paged_bytes() {
    use kvslim_eval::speed::{measure, SpeedGrid};
    let m = stories();
    let families = ["full".to_string(), "full:page=16".to_string()];
    let budgets = ["100%".to_string()];
    let grid = SpeedGrid {
        model_label: "stories260K",
        families: &families,
        budgets: &budgets,
        contexts: &[64],
        mem_limit: Some(1 << 20),
        steps: 2,
    };
    let rows = measure(&m.model, &grid, |_| {}).unwrap();
    assert_eq!(rows.len(), 2);
    let (fixed, paged) = (&rows[0], &rows[1]);
    assert!(paged.bytes_per_sequence > 0 && paged.max_batch < Some(1 << 20), "{paged:?}");
    let kv = |r: &kvslim_eval::speed::SpeedRow| r.bytes_per_sequence;
    // same K/V (64 tokens fill 4 pages of 16 exactly); metadata differs
    assert!(kv(paged) >= kv(fixed) * 9 / 10 && kv(paged) <= kv(fixed) * 11 / 10, "{} vs {}", kv(paged), kv(fixed));
}

/// The tuner's scorer (full cache run once per window, kept across
/// candidates) measures what `kvslim perplexity --compare-full` measures.
#[test]
fn the_tune_scorer_matches_perplexity_compare_full() {
    use kvslim_eval::tune::{score_window, tune_windows, ModelScorer, WindowScorer};
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let text = shared_dir().join("data/tinystories/tinystories_val.txt");
    let cal = tune_windows(&text, tok, 96, None, 2).unwrap();
    assert!(cal.windows.iter().all(|w| w.len() == 96 && w[0] == 1), "BOS + 95 body tokens");
    let mut scorer = ModelScorer::new(&m.model, &cal.windows);
    for w in [0, 1, 0] {
        for spec in ["h2o:heavy=10,recent=9,score=decay:0.9", "window:recent=19", "sink:sink=4,recent=15"] {
            let spec = PolicySpec::parse(spec).unwrap();
            let a = scorer.score(&spec, w).unwrap();
            let b = score_window(&m.model, &spec, &cal.windows[w]).unwrap();
            assert_eq!((a.rows, a.kv_bytes_allocated), (b.rows, b.kv_bytes_allocated), "{spec}");
            for (x, y, what) in [
                (a.nll_sum, b.nll_sum, "nll"),
                (a.kl_sum, b.kl_sum, "kl"),
                (a.top1_sum, b.top1_sum, "top1"),
                (a.full_nll_sum, b.full_nll_sum, "full nll"),
            ] {
                assert!((x - y).abs() < 1e-6 * (1.0 + y.abs()), "{spec} window {w} {what}: {x} vs {y}");
            }
        }
    }
}
