//! Fork-and-batch scoring (`kvslim_eval::forked`) against the per-choice
//! path it replaces (`score_choices`, one session per choice, every token
//! its own solo step), on real COPA and PIQA items with stories260K.

use kvslim_cache::PolicySpec;
use kvslim_eval::forked::score_items;
use kvslim_eval::score::encode_item;
use kvslim_eval::tasks::load_mc_jsonl;
use kvslim_eval::{score_choices, BudgetedPolicy, Choice, ChoiceScore, PolicySource, ScoreMode};
mod common;

use common::{data, stories};

type Items = Vec<(Vec<u32>, Vec<Choice>)>;

fn items(file: &str, n: usize) -> Items {
    let m = stories();
    let tok = m.tokenizer.as_ref().unwrap();
    let items = load_mc_jsonl(&data(file), None).unwrap();
    items.iter().take(n).map(|it| encode_item(tok, it).unwrap()).collect()
}

fn views(items: &Items) -> Vec<(&[u32], &[Choice])> {
    items.iter().map(|(c, ch)| (&c[..], &ch[..])).collect()
}

/// Asserts two item lists of scores agree to `tol` in log-likelihood and
/// exactly in everything else but KV bytes.
fn assert_close(what: &str, a: &[Vec<ChoiceScore>], b: &[Vec<ChoiceScore>], tol: f64) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f64;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what} item {i}");
        for (s, t) in x.iter().zip(y) {
            let d = (s.logprob_sum - t.logprob_sum).abs();
            worst = worst.max(d);
            assert!(d <= tol, "{what} item {i}: {} vs {} (Δ {d:e})", s.logprob_sum, t.logprob_sum);
            assert_eq!((s.n_tokens, s.n_chars), (t.n_tokens, t.n_chars), "{what} item {i}");
        }
    }
    worst
}

fn per_choice<P: PolicySource + ?Sized>(items: &Items, p: &P, mode: ScoreMode) -> Vec<Vec<ChoiceScore>> {
    let m = stories();
    items.iter().map(|(c, ch)| score_choices(&m.model, p, c, ch, mode).unwrap()).collect()
}

#[test]
fn full_cache_matches_the_per_choice_path_in_every_mode() {
    let m = stories();
    let it = items("piqa/piqa_llmfoundry.jsonl", 12);
    let full = PolicySpec::full();
    let reference = per_choice(&it, &full, ScoreMode::Decode);
    for mode in [ScoreMode::Decode, ScoreMode::PrefillContext, ScoreMode::Prefill] {
        let fast = score_items(&m.model, &full, &views(&it), mode).unwrap();
        let worst = assert_close(&format!("full {mode:?}"), &fast, &reference, 1e-4);
        eprintln!("full, {mode:?}: largest |Δ log-likelihood| {worst:e}");
        // the full cache keeps every token of the longest sequence
        for (s, (c, ch)) in fast.iter().zip(&it) {
            let longest = ch.iter().map(|c| c.ids.len()).max().unwrap();
            assert!(s.iter().all(|x| x.kv_bytes >= (c.len() + longest - 1) * m.model.config.kv_dim() * 2 * 4));
        }
    }
}

#[test]
fn evicting_policies_match_the_per_choice_path_with_absolute_budgets() {
    let m = stories();
    let it = items("copa/copa.jsonl", 16);
    // small absolute budgets evict within every COPA item (13–30 tokens)
    for spec in ["h2o:heavy=4,recent=4", "window:recent=6", "h2o:heavy=3,recent=3,sink=1,score=norm"] {
        let p = PolicySpec::parse(spec).unwrap();
        for mode in [ScoreMode::Decode, ScoreMode::PrefillContext] {
            let fast = score_items(&m.model, &p, &views(&it), mode).unwrap();
            let reference = per_choice(&it, &p, mode);
            let worst = assert_close(&format!("{spec} {mode:?}"), &fast, &reference, 1e-4);
            eprintln!("{spec}, {mode:?}: largest |Δ log-likelihood| {worst:e}");
            // and the policy did change the scores
            let full = per_choice(&it, &PolicySpec::full(), mode);
            assert!(fast.iter().zip(&full).any(|(a, b)| (a[0].logprob_sum - b[0].logprob_sum).abs() > 1e-3));
        }
    }
}

#[test]
fn percentage_budgets_resolve_against_the_longest_choice() {
    let m = stories();
    let it = items("copa/copa.jsonl", 16);
    let p = BudgetedPolicy::new("h2o", "20%").unwrap();
    let fast = score_items(&m.model, &p, &views(&it), ScoreMode::Decode).unwrap();
    // the per-choice path with every choice at the budget of context + longest choice
    let reference: Vec<Vec<ChoiceScore>> = it
        .iter()
        .map(|(c, ch)| {
            let longest = ch.iter().map(|x| x.ids.len()).max().unwrap();
            let spec = p.spec_for(c.len() + longest).unwrap();
            score_choices(&m.model, &spec, c, ch, ScoreMode::Decode).unwrap()
        })
        .collect();
    assert_close("h2o 20%", &fast, &reference, 1e-4);
    let differ = it.iter().filter(|(_, ch)| ch[0].ids.len() != ch[1].ids.len()).count();
    assert!(differ > 0, "some items have choices of different lengths");
}

#[test]
fn bad_items_are_errors() {
    let m = stories();
    let it = items("copa/copa.jsonl", 1);
    let (ctx, ch) = (&it[0].0[..], &it[0].1[..]);
    let full = PolicySpec::full();
    assert!(score_items(&m.model, &full, &[(&[][..], ch)], ScoreMode::Decode).is_err());
    let empty = [Choice { ids: vec![], n_chars: 0 }];
    assert!(score_items(&m.model, &full, &[(ctx, &empty[..])], ScoreMode::Decode).is_err());
    let long = [Choice { ids: vec![5; m.model.config.context_len], n_chars: 1 }];
    let e = score_items(&m.model, &full, &[(ctx, &long[..])], ScoreMode::Decode).unwrap_err().to_string();
    assert!(e.contains("does not fit"), "{e}");
}

#[test]
fn online_chai_probes_close_between_tokens_in_context_and_in_forks() {
    let m = stories();
    let it = items("copa/copa.jsonl", 8);
    let plan = std::env::temp_dir().join(format!("kvslim-forked-plan-{}.json", std::process::id()));
    let layers: Vec<String> =
        (0..m.model.config.n_layers).map(|_| r#"{"k": 2, "errors": [4, 3, 2, 1]}"#.into()).collect();
    std::fs::write(&plan, format!(r#"{{"layers": [{}]}}"#, layers.join(","))).unwrap();
    // probe=5 closes inside every context; probe=24 inside some continuations
    for extra in ["probe=5", "probe=24"] {
        for base in ["", "h2o:heavy=4,recent=4+"] {
            let spec = format!("{base}chai:plan={},{extra}", plan.display());
            let p = PolicySpec::parse_and_load(&spec).unwrap();
            for mode in [ScoreMode::Decode, ScoreMode::PrefillContext] {
                let fast = score_items(&m.model, &p, &views(&it), mode).unwrap();
                let reference = per_choice(&it, &p, mode);
                let worst = assert_close(&format!("{spec} {mode:?}"), &fast, &reference, 1e-4);
                eprintln!("{base}chai {extra}, {mode:?}: largest |Δ log-likelihood| {worst:e}");
            }
        }
    }
    std::fs::remove_file(&plan).unwrap();
}

#[test]
fn prefill_mode_prefills_contexts_and_continuations() {
    let m = stories();
    let it = items("copa/copa.jsonl", 8);
    let p = PolicySpec::parse("h2o:heavy=4,recent=4").unwrap();
    let fast = score_items(&m.model, &p, &views(&it), ScoreMode::Prefill).unwrap();
    // a context prefill then a continuation prefill: what Session::feed gives for the two chunks
    for ((ctx, ch), scores) in it.iter().zip(&fast) {
        for (c, s) in ch.iter().zip(scores) {
            let mut sess =
                kvslim_engine::Session::new(&m.model, &p, ctx.len() + c.ids.len(), ctx.len() + c.ids.len()).unwrap();
            let first = kvslim_kernels::ops::log_softmax_at(
                sess.feed(ctx, kvslim_models::Logits::Last).unwrap(),
                c.ids[0] as usize,
            );
            let n = c.ids.len() - 1;
            let v = m.model.config.vocab_size;
            let rest: f64 = if n == 0 {
                0.0
            } else {
                let l = sess.feed(&c.ids[..n], kvslim_models::Logits::All).unwrap();
                (0..n).map(|j| kvslim_kernels::ops::log_softmax_at(&l[j * v..(j + 1) * v], c.ids[j + 1] as usize)).sum()
            };
            assert!((s.logprob_sum - (first + rest)).abs() < 1e-9, "{} vs {}", s.logprob_sum, first + rest);
        }
    }
}
