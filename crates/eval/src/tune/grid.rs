//! The candidates: the baselines and the default and tiny grids, every
//! one holding exactly B slots per (layer, KV head).

use kvslim_cache::policy::PolicyFamily;
use kvslim_cache::PolicySpec;

/// Which candidates to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// Baselines + H2O × 7 score families × sinks {0, 4} × heavy share {¼, ½, ¾}.
    Default,
    /// `window`, `sink`, paper H2O and H2O with `score=decay:0.9`: for tests
    /// and quick looks.
    Tiny,
}

parse_names! { Grid, "grid": "default" => Grid::Default, "tiny" => Grid::Tiny }

/// The score families the default grid tries on H2O.
pub const SCORE_FAMILIES: [&str; 7] = ["sum", "norm", "decay:0.9", "decay:0.98", "tova", "vnorm", "persist:16"];

/// The baselines every comparison includes, as budget families at B slots
/// ([`PolicyFamily::at`] owns each split): the recent window, StreamingLLM
/// (4 sinks; only above 4 slots, where it differs from the window), heavy
/// hitters alone, random eviction, and H2O as published (half heavy, half
/// recent, `score=sum`).
pub fn baselines(b: usize) -> Vec<(String, PolicySpec)> {
    let families: &[&str] =
        if b > 4 { &["window", "sink", "heavy", "random", "h2o"] } else { &["window", "heavy", "random", "h2o"] };
    families
        .iter()
        .map(|&f| {
            let spec = PolicyFamily::parse(f).and_then(|p| p.at(b)).expect("baseline families are valid");
            (f.to_string(), spec)
        })
        .collect()
}

/// Every candidate for B slots per (layer, KV head), each exactly B slots,
/// without duplicates (small B makes some splits coincide), baselines first.
pub fn candidate_grid(b: usize, grid: Grid) -> Vec<PolicySpec> {
    let b = b.max(1);
    let mut out: Vec<PolicySpec> = Vec::new();
    let mut push = |s: PolicySpec| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for (_, s) in baselines(b) {
        if grid == Grid::Tiny
            && matches!(
                s.token,
                kvslim_cache::policy::TokenPolicySpec::Heavy { .. }
                    | kvslim_cache::policy::TokenPolicySpec::Random { .. }
            )
        {
            continue;
        }
        push(s);
    }
    let (scores, sinks, shares): (&[&str], &[usize], &[(usize, usize)]) = match grid {
        Grid::Default => (&SCORE_FAMILIES, &[0, 4], &[(1, 4), (1, 2), (3, 4)]),
        Grid::Tiny => (&["decay:0.9"], &[0], &[(1, 2)]),
    };
    for &score in scores {
        for &sink in sinks {
            if sink > 0 && b < 2 * sink + 2 {
                continue;
            }
            let rest = b - sink;
            for &(num, den) in shares {
                // heavy share of what the sinks leave, rounded; the recent window gets the rest
                let heavy = ((rest * num + den / 2) / den).clamp(1, rest);
                let recent = rest - heavy;
                let mut s = format!("h2o:heavy={heavy},recent={recent}");
                if sink > 0 {
                    s.push_str(&format!(",sink={sink}"));
                }
                if score != "sum" {
                    s.push_str(&format!(",score={score}"));
                }
                push(PolicySpec::parse(&s).expect("grid specs are valid"));
            }
        }
    }
    if grid == Grid::Default && b >= 4 {
        // the layer/head allocators on the paper split, with plain and age-normalised scores
        for score in ["", ",score=norm"] {
            for alloc in ["pyramid", "ada"] {
                let s = format!("h2o:heavy={},recent={}{score},alloc={alloc}", b - b / 2, b / 2);
                push(PolicySpec::parse(&s).expect("grid specs are valid"));
            }
        }
    }
    out
}
