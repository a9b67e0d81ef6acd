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
//!
//! A `kvslim tune` result (`tuned:file=FILE`) is a cell too, but not a
//! family: its spec was measured at one budget for one sequence length, so
//! it is one cell at that budget (labelled with it, next to the baselines
//! at the same budget), run as recorded, and refused for sequences whose
//! budget would resolve to other slots (no silent comparison at unequal
//! slots).

use crate::error::{EvalError, Result, Setting};
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
    /// The family, its parameters and head sharing (plan loaded); `full`
    /// for a tuned cell.
    pub family: PolicyFamily,
    /// `None` for `full` and CHAI alone; a tuned cell's recorded budget.
    pub budget: Option<Budget>,
    /// `tuned:file=FILE`: the recorded spec, run as is.
    pub tuned: Option<TunedCell>,
    /// The `auto` family: `auto:budget=B` with B slots per sequence, which
    /// the cache resolves for the model (`family` is then unused).
    pub auto: bool,
}

/// A `tuned:file=FILE` cell: the spec `kvslim tune` chose and what it was
/// chosen for.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedCell {
    /// `tuned:file=FILE` as written (the results' policy label).
    pub label: String,
    pub spec: PolicySpec,
    pub budget_slots: usize,
    pub seq_len: usize,
}

/// Whether `family` names a tune file (`tuned:file=…`), so the matrix makes
/// one cell of it at its own budget.
pub fn is_tuned(family: &str) -> bool {
    PolicySpec::parse(family).is_ok_and(|p| p.tuned.is_some())
}

impl BudgetedPolicy {
    /// `family` (optionally with `:k=v,...` extras and `+chai:…`) at
    /// `budget` (`20%`, `64`; ignored, and may be anything, for `full`).
    /// Reads a CHAI plan here, once, and checks that the result builds for a
    /// long and a short sequence.
    pub fn new(family: &str, budget: &str) -> Result<Self> {
        let err = |reason: String| EvalError::Budget { family: family.into(), budget: budget.into(), reason };
        if is_tuned(family) {
            return Self::tuned(family);
        }
        if family.trim() == "auto" {
            let b: Budget = budget.parse().map_err(err)?;
            if b == Budget::Slots(0) {
                return Err(err("a budget needs at least 1 slot".into()));
            }
            return Ok(BudgetedPolicy {
                family: PolicyFamily::parse("full")?,
                budget: Some(b),
                tuned: None,
                auto: true,
            });
        }
        let mut f = PolicyFamily::parse(family).map_err(|e| err(e.reason))?;
        f.load_plans().map_err(|e| err(e.to_string()))?;
        let budget = f.budget(budget).map_err(err)?;
        let p = BudgetedPolicy { family: f, budget, tuned: None, auto: false };
        for n in [1000, 3] {
            p.spec_for(n)?;
        }
        Ok(p)
    }

    /// The cell of a `tuned:file=FILE` policy: the spec the file records
    /// (read through the grammar's loader, errors naming the file), at the
    /// budget it records.
    pub fn tuned(text: &str) -> Result<Self> {
        let err = |reason: String| EvalError::Budget { family: text.into(), budget: "-".into(), reason };
        let mut spec = PolicySpec::parse(text)?;
        let path = spec.tuned.as_ref().map(|t| t.path.clone()).ok_or_else(|| err("not `tuned:file=FILE`".into()))?;
        spec.load_plans().map_err(|e| err(e.to_string()))?;
        let bad = |what: &str| err(format!("tune file {path}: no `{what}` (written by an older or other tool?)"));
        let raw: serde_json::Value = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .ok_or_else(|| bad("JSON"))?;
        let budget: Budget = raw["budget"].as_str().ok_or_else(|| bad("budget"))?.parse().map_err(err)?;
        let seq_len = raw["seq_len"].as_u64().ok_or_else(|| bad("seq_len"))? as usize;
        let budget_slots =
            spec.budget(seq_len).ok_or_else(|| err(format!("tune file {path}: `{spec}` has no budget")))?;
        Ok(BudgetedPolicy {
            family: PolicyFamily::parse("full")?,
            budget: Some(budget),
            tuned: Some(TunedCell { label: text.trim().to_string(), spec, budget_slots, seq_len }),
            auto: false,
        })
    }

    /// The spec's kind, for questions that do not depend on the length
    /// (is it the full cache, does it evict, head sharing, dtype): a tuned
    /// cell's recorded spec, a family's at 1,000 tokens.
    pub fn sample_spec(&self) -> Result<PolicySpec> {
        match &self.tuned {
            Some(t) => Ok(t.spec.clone()),
            None => self.spec_for(1000),
        }
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
        match &self.tuned {
            Some(t) => t.label.clone(),
            None if self.auto => "auto".into(),
            None => self.family.to_string(),
        }
    }
}

impl PolicySource for BudgetedPolicy {
    fn spec_for(&self, base_len: usize) -> Result<PolicySpec> {
        if let Some(t) = &self.tuned {
            let want = self.slots(base_len).unwrap_or(t.budget_slots);
            if want != t.budget_slots {
                let before = format!(
                    "budget `{}` for `{}`: tuned for {}-token sequences ({} slots); a {base_len}-token sequence would get \
                     {want} at this budget: evaluate it on `ppl:FILE,seq_len={}` or tune with ",
                    self.budget_label(),
                    t.label,
                    t.seq_len,
                    t.budget_slots,
                    t.seq_len
                );
                return Err(EvalError::setting(Setting::SeqLen, Some(base_len as u64), before, ""));
            }
            return Ok(t.spec.clone());
        }
        if self.auto {
            return Ok(PolicySpec::parse(&format!("auto:budget={}", self.slots(base_len).unwrap_or(1)))?);
        }
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
    fn a_tune_file_is_one_cell_at_its_budget_and_length() {
        let path = std::env::temp_dir().join(format!("kvslim-eval-tuned-{}.json", std::process::id()));
        let body = r#"{"kind": "kvslim-tune", "spec": "h2o:heavy=26,recent=76,score=decay:0.98", "budget": "20%", "seq_len": 512}"#;
        std::fs::write(&path, body).unwrap();
        let text = format!("tuned:file={}", path.display());
        assert!(is_tuned(&text) && !is_tuned("h2o") && !is_tuned("tuned"));
        // whatever budget the matrix passes, the cell is the file's
        let p = BudgetedPolicy::new(&text, "10%").unwrap();
        assert_eq!((p.family_label(), p.budget_label()), (text.clone(), "20%".to_string()));
        for n in [510, 512, 514] {
            assert_eq!(p.spec_for(n).unwrap().to_string(), "h2o:heavy=26,recent=76,score=decay:0.98");
        }
        let e = p.spec_for(1024).unwrap_err().to_string();
        assert!(e.contains("tuned for 512-token sequences (102 slots)") && e.contains("seq_len=512"), "{e}");
        // bad files are named
        std::fs::write(&path, r#"{"kind": "kvslim-tune", "spec": "window:recent=8"}"#).unwrap();
        let e = BudgetedPolicy::new(&text, "-").unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains("no `budget`"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = BudgetedPolicy::new(&text, "-").unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains("cannot read"), "{e}");
    }

    #[test]
    fn auto_is_a_family_the_cache_resolves() {
        let p = BudgetedPolicy::new("auto", "20%").unwrap();
        assert_eq!((p.family_label(), p.budget_label()), ("auto".to_string(), "20%".to_string()));
        let spec = p.spec_for(1000).unwrap();
        assert_eq!((spec.to_string(), spec.budget(1000)), ("auto:budget=200".to_string(), Some(200)));
        assert!(BudgetedPolicy::new("auto", "0").is_err());
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
