//! One KV budget, many policies at equal slots.
//!
//! A budget is a slot count (`64`) or a percentage of the evaluated
//! sequence (`20%`: the prompt for generation, the whole sequence for
//! teacher forcing and choice scoring). It is resolved to B slots per
//! (layer, KV head) for each sequence — `B = max(1, ⌊P% · base_len⌋)`, as
//! [`Budget::resolve`] does — and every family then gets exactly B slots.
//! The families, what each does with B (`window` → `recent=B`, `sink` → 4
//! sinks + `recent=B−4`, `h2o` → half heavy, half recent, …) and their
//! parameters belong to the policy grammar: see
//! [`kvslim_cache::policy::budget`]. This module pairs a family with a
//! budget and hands the session the spec for each sequence.

use crate::{EvalError, Result};
use kvslim_cache::policy::{Budget, PolicyFamily};
use kvslim_cache::PolicySpec;

/// Anything that yields the policy spec for a sequence of `base_len` tokens.
pub trait PolicySource: Sync {
    fn spec_for(&self, base_len: usize) -> Result<PolicySpec>;
}

impl PolicySource for PolicySpec {
    /// A fixed spec; its own percentages resolve against `base_len` in the
    /// session.
    fn spec_for(&self, _base_len: usize) -> Result<PolicySpec> {
        Ok(self.clone())
    }
}

/// A policy family at a budget: one cell of the evaluation matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetedPolicy {
    /// The family, its parameters and head sharing (plan loaded).
    pub family: PolicyFamily,
    /// `None` for `full` and CHAI alone.
    pub budget: Option<Budget>,
}

impl BudgetedPolicy {
    /// `family` (optionally with `:k=v,...` extras and `+chai:…`) at
    /// `budget` (`20%`, `64`; ignored, and may be anything, for `full`).
    /// Reads a CHAI plan here, once, and checks that the result builds for a
    /// long and a short sequence.
    pub fn new(family: &str, budget: &str) -> Result<Self> {
        let err = |reason: String| EvalError::Budget { family: family.into(), budget: budget.into(), reason };
        let mut f = PolicyFamily::parse(family).map_err(|e| err(e.reason))?;
        f.load_plans().map_err(|e| err(e.to_string()))?;
        let budget = f.budget(budget).map_err(err)?;
        let p = BudgetedPolicy { family: f, budget };
        for n in [1000, 3] {
            p.spec_for(n)?;
        }
        Ok(p)
    }

    /// B for a sequence of `base_len` tokens (`None` for `full`).
    pub fn slots(&self, base_len: usize) -> Option<usize> {
        self.budget.map(|b| b.resolve(base_len).max(1))
    }

    /// The budget as written in result files: `20%`, `64`, or `-` for full.
    pub fn budget_label(&self) -> String {
        self.budget.map_or_else(|| "-".to_string(), |b| b.to_string())
    }

    /// The family with its extras: `h2o`, `h2o:agg=max`, `h2o+chai:plan=p.json`,
    /// `chai:plan=p.json`.
    pub fn family_label(&self) -> String {
        self.family.to_string()
    }
}

impl PolicySource for BudgetedPolicy {
    fn spec_for(&self, base_len: usize) -> Result<PolicySpec> {
        Ok(self.family.at(self.slots(base_len).unwrap_or(1))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_gets_exactly_b_slots() {
        for fam in ["window", "sink", "heavy", "random", "h2o", "h2o:agg=max", "sink:sink=2", "random:seed=5"] {
            for budget in ["20%", "5%", "100%", "64", "1"] {
                let p = BudgetedPolicy::new(fam, budget).unwrap();
                for n in [1usize, 2, 7, 100, 1000, 4097] {
                    let spec = p.spec_for(n).unwrap();
                    let want = p.slots(n).unwrap();
                    assert_eq!(spec.budget(n), Some(want), "{fam} {budget} n={n}: {spec}");
                }
            }
        }
    }

    #[test]
    fn formulas() {
        let s = |f: &str, b: &str, n: usize| BudgetedPolicy::new(f, b).unwrap().spec_for(n).unwrap().to_string();
        assert_eq!(s("full", "20%", 1000), "full");
        assert_eq!(s("full", "anything", 10), "full");
        assert_eq!(s("window", "20%", 1000), "window:recent=200");
        assert_eq!(s("local", "20%", 1000), "window:recent=200");
        assert_eq!(s("sink", "20%", 1000), "sink:sink=4,recent=196");
        assert_eq!(s("sink", "3", 1000), "sink:sink=2,recent=1");
        assert_eq!(s("sink:sink=8", "20%", 1000), "sink:sink=8,recent=192");
        assert_eq!(s("heavy", "10%", 1000), "heavy:heavy=100");
        assert_eq!(s("random", "20%", 1000), "random:budget=200,recent=100,seed=0");
        assert_eq!(s("random:seed=3", "1", 1000), "random:budget=1,recent=0,seed=3");
        assert_eq!(s("h2o", "20%", 1000), "h2o:heavy=100,recent=100");
        assert_eq!(s("h2o", "21", 1000), "h2o:heavy=11,recent=10");
        assert_eq!(s("h2o:prefill=stream:16", "10%", 100), "h2o:heavy=5,recent=5,prefill=stream:16");
        // 100% keeps every token of the sequence
        assert_eq!(s("h2o", "100%", 37), "h2o:heavy=19,recent=18");
        let p = BudgetedPolicy::new("h2o:agg=max", "20%").unwrap();
        assert_eq!((p.family_label(), p.budget_label()), ("h2o:agg=max".to_string(), "20%".to_string()));
        assert_eq!(BudgetedPolicy::new("full", "x").unwrap().budget_label(), "-");
    }

    #[test]
    fn storage_keys_survive_budget_substitution() {
        let s = |f: &str, b: &str, n: usize| BudgetedPolicy::new(f, b).unwrap().spec_for(n).unwrap();
        let spec = s("h2o:page=16,compact=64,kv_dtype=q8", "20%", 1000);
        assert_eq!(spec.to_string(), "h2o:heavy=100,recent=100,page=16,compact=64,kv_dtype=q8");
        assert_eq!(spec.budget(1000), Some(200));
        assert_eq!((spec.storage.page_size, spec.storage.compact_every), (Some(16), Some(64)));
        assert_eq!(spec.storage.kv_dtype, kvslim_cache::KvDtype::Q8);
        let spec = s("random:seed=3,page=8,page_score=topm:4,kv_dtype=q4", "64", 1000);
        assert_eq!(spec.to_string(), "random:budget=64,recent=32,seed=3,page=8,page_score=topm:4,kv_dtype=q4");
        assert_eq!(
            s("sink:sink=2,page=8,kv_dtype=q4", "64", 1000).to_string(),
            "sink:sink=2,recent=62,page=8,kv_dtype=q4"
        );
        assert_eq!(s("window:kv_dtype=f16", "10%", 100).to_string(), "window:recent=10,kv_dtype=f16");
        // full keeps its storage keys and ignores the budget
        let p = BudgetedPolicy::new("full:page=16,kv_dtype=q8", "20%").unwrap();
        assert_eq!((p.budget_label(), p.family_label()), ("-".to_string(), "full:page=16,kv_dtype=q8".to_string()));
        assert_eq!(p.spec_for(1000).unwrap().to_string(), "full:page=16,kv_dtype=q8");
        // the label keeps the keys, so cells of different storage never collide
        let q = BudgetedPolicy::new("h2o:kv_dtype=q8", "20%").unwrap();
        assert_eq!(q.family_label(), "h2o:kv_dtype=q8");
        // bad storage keys are caught when the policy is made
        let e = BudgetedPolicy::new("h2o:compact=8", "20%").unwrap_err().to_string();
        assert!(e.contains("paged store"), "{e}");
    }

    #[test]
    fn head_sharing_composes_with_the_budget() {
        let plan = std::env::temp_dir().join(format!("kvslim-eval-plan-{}.json", std::process::id()));
        let layers: Vec<String> = (0..2).map(|_| r#"{"k": 2, "errors": [4, 3, 2, 1]}"#.to_string()).collect();
        std::fs::write(&plan, format!(r#"{{"layers": [{}]}}"#, layers.join(","))).unwrap();
        let chai = format!("chai:plan={}", plan.display());
        let p = BudgetedPolicy::new(&format!("h2o+{chai}"), "20%").unwrap();
        let spec = p.spec_for(1000).unwrap();
        assert_eq!(spec.budget(1000), Some(200));
        assert!(spec.head.is_some());
        assert_eq!(p.family_label(), format!("h2o+{chai}"));
        let alone = BudgetedPolicy::new(&chai, "20%").unwrap();
        assert_eq!((alone.budget_label(), alone.family_label()), ("-".to_string(), chai.clone()));
        let spec = alone.spec_for(1000).unwrap();
        assert!(spec.head.is_some() && spec.budget(1000).is_none());
        let e = BudgetedPolicy::new(&format!("{chai}+h2o"), "20%").unwrap_err().to_string();
        assert!(e.contains("token policy first"), "{e}");
        let e = BudgetedPolicy::new("h2o+window:recent=3", "20%").unwrap_err().to_string();
        assert!(e.contains("head policy"), "{e}");
        std::fs::remove_file(&plan).unwrap();
    }

    #[test]
    fn errors_name_family_budget_and_problem() {
        let cases = [
            ("fancy", "20%", "unknown policy family `fancy`"),
            ("h2o", "0%", "must be in (0, 100]"),
            ("h2o", "0", "at least 1 slot"),
            ("h2o", "abc", "not a slot count"),
            ("h2o:heavy=3", "20%", "`heavy` is set by the budget"),
            ("h2o:agg=mean", "20%", "agg"),
            ("sink:sink=x", "20%", "sink must be a slot count"),
        ];
        for (f, b, want) in cases {
            let e = BudgetedPolicy::new(f, b).unwrap_err().to_string();
            assert!(e.contains(want), "{f} {b}: {e}");
        }
    }
}
