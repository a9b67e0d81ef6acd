//! The search without a model (a table of KL per window), the grid, and
//! the windows.

use super::halving::survivors;
use super::windows::cut;
use super::*;
use std::collections::HashMap;
use std::path::Path;

/// KL per candidate per window from a table; counts calls.
struct Fake {
    kl: HashMap<String, Vec<f64>>,
    calls: Vec<(String, usize)>,
}

impl WindowScorer for Fake {
    fn score(&mut self, spec: &PolicySpec, window: usize) -> Result<WindowScore> {
        let s = spec.to_string();
        self.calls.push((s.clone(), window));
        let kl = self.kl[&s][window];
        Ok(WindowScore {
            rows: 10,
            nll_sum: 10.0 * (1.0 + kl),
            kl_sum: 10.0 * kl,
            top1_sum: 9.0,
            full_nll_sum: 10.0,
            kv_bytes_allocated: 64,
        })
    }
}

fn specs(n: usize) -> Vec<PolicySpec> {
    (1..=n).map(|i| PolicySpec::parse(&format!("window:recent={i}")).unwrap()).collect()
}

#[test]
fn rungs_grow_by_eta_and_end_at_all_windows() {
    assert_eq!(rung_sizes(8, 3), vec![1, 3, 8]);
    assert_eq!(rung_sizes(9, 3), vec![1, 3, 9]);
    assert_eq!(rung_sizes(1, 3), vec![1]);
    assert_eq!(rung_sizes(4, 2), vec![1, 2, 4]);
    assert_eq!(rung_sizes(0, 3), Vec::<usize>::new());
    assert_eq!(survivors(46, 3, 3), vec![46, 16, 6]);
    // 46 on 1 window, 16 on 2 more, 6 on 5 more
    assert_eq!(planned_evaluations(46, 8, 3), 46 + 16 * 2 + 6 * 5);
}

#[test]
fn halving_keeps_the_best_third_and_finds_the_winner() {
    let c = specs(9);
    // candidate i's KL on window w: the last candidate is best on average,
    // the second looks best on window 0 only
    let mut kl = HashMap::new();
    for (i, s) in c.iter().enumerate() {
        let v: Vec<f64> = (0..3)
            .map(|w| match (i, w) {
                (1, 0) => 0.01,
                (1, _) => 0.9,
                (8, _) => 0.05,
                _ => 0.5 + i as f64 * 0.01,
            })
            .collect();
        kl.insert(s.to_string(), v);
    }
    let mut f = Fake { kl, calls: Vec::new() };
    let mut last = (0, 0);
    let rows = successive_halving(&c, 3, 3, &mut f, |d, t| last = (d, t)).unwrap();
    assert_eq!(rows[0].spec, "window:recent=9", "the winner over all windows");
    assert_eq!(rows[0].windows, 3);
    assert!((rows[0].kl - 0.05).abs() < 1e-12);
    // 9 on window 0, then the best 3 on windows 1 and 2: 9 + 3·2 calls, never twice
    assert_eq!(f.calls.len(), 9 + 6);
    let mut uniq = f.calls.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), f.calls.len());
    assert_eq!(last, (15, 15));
    // the early leader was kept, then lost on the longer rung
    assert_eq!(rows[1].spec, "window:recent=1");
    let r2 = rows.iter().find(|r| r.spec == "window:recent=2").unwrap();
    assert_eq!((r2.windows, r2.rank), (3, 3));
    // those eliminated after one window come last, ranked by their KL
    assert!(rows[3..].iter().all(|r| r.windows == 1));
    assert!(rows[3..].windows(2).all(|p| p[0].kl <= p[1].kl));
    assert_eq!(rows.iter().map(|r| r.rank).collect::<Vec<_>>(), (1..=9).collect::<Vec<_>>());
}

#[test]
fn ties_break_by_nll_then_grid_order() {
    let c = specs(3);
    let kl = c.iter().map(|s| (s.to_string(), vec![0.1])).collect();
    let mut f = Fake { kl, calls: Vec::new() };
    let rows = successive_halving(&c, 1, 3, &mut f, |_, _| {}).unwrap();
    let got: Vec<&str> = rows.iter().map(|r| r.spec.as_str()).collect();
    assert_eq!(got, ["window:recent=1", "window:recent=2", "window:recent=3"]);
    assert!(successive_halving(&[], 1, 3, &mut f, |_, _| {}).is_err());
}

#[test]
fn quality_target_picks_the_smallest_budget_that_meets_it() {
    // the fake's KL falls with the budget: window:recent=B has KL 1/B
    struct ByBudget;
    impl WindowScorer for ByBudget {
        fn score(&mut self, spec: &PolicySpec, _w: usize) -> Result<WindowScore> {
            let b = spec.budget(100).unwrap() as f64;
            Ok(WindowScore { rows: 1, kl_sum: 1.0 / b, ..WindowScore::default() })
        }
    }
    let cfg = TuneConfig { seq_len: 100, windows: 2, eta: 3, grid: Grid::Tiny };
    let budgets: Vec<Budget> = ["40%", "5%", "10%", "20%"].iter().map(|b| b.parse().unwrap()).collect();
    let (runs, met) = search_for_target(&budgets, 0.08, &cfg, &mut ByBudget, |_, _, _| {}).unwrap();
    // 5 → 0.2, 10 → 0.1, 20 → 0.05 ≤ 0.08: stops there, ascending
    assert_eq!(runs.iter().map(|r| r.budget_slots).collect::<Vec<_>>(), vec![5, 10, 20]);
    assert_eq!(met, Some(2));
    let (runs, met) = search_for_target(&budgets, 0.001, &cfg, &mut ByBudget, |_, _, _| {}).unwrap();
    assert_eq!((runs.len(), met), (4, None));
}

#[test]
fn every_candidate_holds_exactly_b_slots() {
    for b in [1, 3, 8, 10, 51, 102, 205] {
        for grid in [Grid::Default, Grid::Tiny] {
            let g = candidate_grid(b, grid);
            for s in &g {
                assert_eq!(s.budget(1000), Some(b), "{s} at B={b}");
                assert_eq!(PolicySpec::parse(&s.to_string()).unwrap(), *s);
            }
            let mut names: Vec<String> = g.iter().map(|s| s.to_string()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), g.len(), "no duplicates at B={b}");
        }
    }
    let g = candidate_grid(102, Grid::Default);
    // 5 baselines + 7 families × 2 sink settings × 3 splits, less the paper H2O
    // counted twice, + 2 allocators × 2 score families
    assert_eq!(g.len(), 5 + 7 * 2 * 3 - 1 + 4);
    let names: Vec<String> = g.iter().map(|s| s.to_string()).collect();
    for want in [
        "window:recent=102",
        "sink:sink=4,recent=98",
        "heavy:heavy=102",
        "random:budget=102,recent=51,seed=0",
        "h2o:heavy=51,recent=51",
        "h2o:heavy=26,recent=76,score=decay:0.9",
        "h2o:heavy=74,recent=24,sink=4,score=persist:16",
        "h2o:heavy=51,recent=51,alloc=pyramid:0.25",
        "h2o:heavy=51,recent=51,score=norm,alloc=ada:0.2",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert_eq!(candidate_grid(102, Grid::Tiny).len(), 4);
}

#[test]
fn tune_and_eval_windows_never_overlap() {
    let path = std::env::temp_dir().join(format!("kvslim-tune-split-{}.txt", std::process::id()));
    std::fs::write(&path, "x").unwrap();
    let w = |start: usize, end: usize| TextWindows {
        path: path.clone(),
        seq_len: 4,
        token_range: (start, end),
        text_tokens: 100,
        windows_sha256: String::new(),
        windows: Vec::new(),
    };
    // the default split: eval windows from token 0, tune from the second half
    check_disjoint(&w(50, 80), &w(0, 48)).unwrap();
    check_disjoint(&w(50, 80), &w(0, 50)).unwrap();
    let e = check_disjoint(&w(50, 80), &w(0, 51)).unwrap_err();
    let crate::EvalError::Setting(s) = &e else { panic!("{e}") };
    assert_eq!((s.setting, s.value), (crate::Setting::SkipTokens, Some(51)), "{e}");
    assert!(
        s.message("--skip-tokens", " ").contains("overlap")
            && s.message("--skip-tokens", " ").contains("(--skip-tokens 51)"),
        "{e}"
    );
    // another file may overlap in token numbers
    let mut other = w(0, 60);
    other.path = std::env::temp_dir().join("kvslim-tune-other.txt");
    check_disjoint(&w(50, 80), &other).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn windows_are_cut_from_the_offset_and_hashed() {
    let body: Vec<u32> = (0..100).collect();
    let p = Path::new("t.txt");
    let t = cut(p, &body, Some(1000), 5, 50, 3).unwrap();
    assert_eq!(t.token_range, (50, 62));
    assert_eq!(t.windows, vec![vec![1000, 50, 51, 52, 53], vec![1000, 54, 55, 56, 57], vec![1000, 58, 59, 60, 61]]);
    assert_eq!(t.windows_sha256.len(), 64);
    assert_ne!(t.windows_sha256, cut(p, &body, Some(1000), 5, 51, 3).unwrap().windows_sha256);
    let e = cut(p, &body, None, 10, 95, 1).unwrap_err().to_string();
    assert!(e.contains("t.txt") && e.contains("need 10 tokens") && e.contains("has 5"), "{e}");
}
