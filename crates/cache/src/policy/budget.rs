//! Budget families: a policy with its budget left open, so several policies
//! can be compared at equal slots (evaluation) while the budget follows
//! each sequence.
//!
//! A family is the policy grammar with the budget keys left out
//! (`h2o:agg=max`, `sink:sink=2,page=8`, `h2o+chai:plan=F`). For a
//! resolved budget of B slots per (layer, KV head), every family gets
//! exactly B:
//!
//! | family | spec for B slots |
//! |---|---|
//! | `full` | `full` (the budget is ignored) |
//! | `window` (`local`) | `window:recent=B` |
//! | `sink` | `sink:sink=S,recent=B−S`, S = min(4, B−1) (`sink:sink=N` sets the 4) |
//! | `heavy` | `heavy:heavy=B` |
//! | `random` | `random:budget=B,recent=⌊B/2⌋` |
//! | `h2o` | `h2o:heavy=B−⌊B/2⌋,recent=⌊B/2⌋` (half heavy, half recent, as the H2O paper); `h2o:recent_share=F`: recent = round(F·B) |
//!
//! Because S is absolute while B follows the sequence, a percentage budget
//! cannot be one fixed spec: [`PolicyFamily::at`] builds the typed spec for
//! each B with the family's own reader (its entry in the grammar's family
//! table, where the split above is written), so a family and its budget
//! substitution are defined once. Other parameters pass through
//! (`h2o:agg=max`, `h2o:prefill=stream:16`, `random:seed=3`,
//! `h2o:score=tova`, storage keys). `sink=S` on a family other than `sink`
//! takes S of the B slots (at most B − 1) and splits the rest as above
//! (`h2o:sink=4` at 64: 4 sinks, 30 heavy, 30 recent).
//!
//! Head sharing composes: `h2o+chai:plan=FILE` gets the budgeted token
//! policy plus CHAI, and `chai:plan=FILE` / `chai-static:plan=FILE` alone
//! ignore the budget like `full`. As with [`PolicySpec`], parsing reads no
//! file: [`PolicyFamily::load_plans`] does, once.

use super::chai::{HeadSharingSpec, PlanError};
use super::spec::{parse_head_policy, Budget, Family, Params, PolicySpec, PolicySpecError, Spend, FAMILIES};
use std::fmt;

/// A policy family whose budget is filled in per sequence; see the module
/// docs for what each family does with B slots.
#[derive(Clone, Debug)]
pub struct PolicyFamily {
    family: &'static Family,
    /// The family's other parameters as written (trimmed `k=v` parts, the
    /// fixed key taken out), passed to every spec.
    extra: Vec<String>,
    /// The family's fixed slot count (`sink`'s S); unused by the others.
    fixed: usize,
    /// Head sharing, and its text as written (the label keeps it verbatim).
    head: Option<(String, HeadSharingSpec)>,
}

impl PartialEq for PolicyFamily {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.family, o.family) && self.extra == o.extra && self.fixed == o.fixed && self.head == o.head
    }
}

impl PolicyFamily {
    /// Parses a family (see the module docs) and checks that its
    /// parameters make a valid spec. Pure: a CHAI plan is only named.
    pub fn parse(text: &str) -> Result<Self, PolicySpecError> {
        let err = |reason: String| PolicySpecError { spec: text.to_string(), reason };
        let (token_part, head_text) = match text.trim().split_once('+') {
            Some((t, h)) => (t.trim(), Some(h.trim())),
            None => (text.trim(), None),
        };
        let head_of = |h: &str| -> Result<(String, HeadSharingSpec), String> {
            if h.contains('+') {
                return Err("at most one `+` (token policy + head policy)".into());
            }
            match parse_head_policy(h) {
                Some(spec) => Ok((h.to_string(), spec?)),
                None => Err(format!("`{h}` is not a head policy (chai, chai-static)")),
            }
        };
        if parse_head_policy(token_part).is_some() {
            if head_text.is_some() {
                return Err(err("write the token policy first: `h2o+chai:…`".into()));
            }
            let head = Some(head_of(token_part).map_err(err)?);
            return Ok(PolicyFamily { family: &FAMILIES[0], extra: Vec::new(), fixed: 0, head });
        }
        let head = head_text.map(head_of).transpose().map_err(err)?;
        let (name, args) = token_part.split_once(':').unwrap_or((token_part, ""));
        let family = Family::named(name.trim()).map_err(|_| {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.names[0]).collect();
            let hint = if name.contains(',') { " (families are separated by `;`, e.g. `full;h2o`)" } else { "" };
            err(format!("unknown policy family `{}`{hint}; known: {}", name.trim(), known.join(", ")))
        })?;
        let mut extra = Vec::new();
        let mut fixed = family.fixed.map_or(0, |(_, default)| default);
        for a in args.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let key = a.split('=').next().unwrap_or("").trim();
            if family.budget_keys.contains(&key) {
                return Err(err(format!("`{key}` is set by the budget; leave it out of the family")));
            }
            match family.fixed {
                Some((k, _)) if k == key => {
                    fixed = a[a.find('=').map_or(a.len(), |i| i + 1)..]
                        .trim()
                        .parse()
                        .map_err(|_| err(format!("`{a}`: {k} must be a slot count")))?;
                }
                _ => extra.push(a.to_string()),
            }
        }
        let p = PolicyFamily { family, extra, fixed, head };
        // a family's reader accepts every B ≥ 1 once it accepts one: only
        // the budget keys depend on B, and each split leaves them valid
        p.at(1).map_err(|e| err(e.reason))?;
        Ok(p)
    }

    /// Reads the CHAI plan the family names, once (see
    /// [`PolicySpec::load_plans`]); the error names the file.
    pub fn load_plans(&mut self) -> Result<(), PlanError> {
        match &mut self.head {
            Some((_, h)) => h.load_plan(),
            None => Ok(()),
        }
    }

    /// False for `full` and a head policy alone: they keep every token, so
    /// a budget means nothing to them.
    pub fn is_budgeted(&self) -> bool {
        !self.family.budget_keys.is_empty()
    }

    /// The budget written as `64` or `20%` for this family: `None`, whatever
    /// `text` says, when the family ignores budgets; at least one slot.
    pub fn budget(&self, text: &str) -> Result<Option<Budget>, String> {
        if !self.is_budgeted() {
            return Ok(None);
        }
        match text.parse::<Budget>()? {
            Budget::Slots(0) => Err("a budget needs at least 1 slot".into()),
            b => Ok(Some(b)),
        }
    }

    /// The spec for a budget of B = `slots` (at least 1; ignored by an
    /// unbudgeted family), built directly as typed values.
    pub fn at(&self, slots: usize) -> Result<PolicySpec, PolicySpecError> {
        let err = |reason: String| PolicySpecError { spec: self.to_string(), reason };
        let mut p = Params::from_parts(self.family.names[0], self.extra.iter().map(String::as_str)).map_err(err)?;
        let spend = Spend { b: slots.max(1), fixed: self.fixed };
        let (token, storage) = self.family.spec(&mut p, Some(spend), None).map_err(err)?;
        let spec =
            PolicySpec { token, head: self.head.as_ref().map(|(_, h)| h.clone()), storage, tuned: None, auto: None };
        spec.check_alloc().map_err(err)?;
        Ok(spec)
    }
}

impl fmt::Display for PolicyFamily {
    /// The family as result files name it: the canonical family name, a
    /// non-default fixed key first, the other parameters and the head
    /// policy as written (`h2o:agg=max`, `sink:sink=2`, `h2o+chai:plan=p.json`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut extra = self.extra.clone();
        if let Some((k, default)) = self.family.fixed {
            if self.fixed != default {
                extra.insert(0, format!("{k}={}", self.fixed));
            }
        }
        let name = self.family.names[0];
        let token = if extra.is_empty() { name.to_string() } else { format!("{name}:{}", extra.join(",")) };
        match &self.head {
            Some((h, _)) if token == "full" => f.write_str(h),
            Some((h, _)) => write!(f, "{token}+{h}"),
            None => f.write_str(&token),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_spends_slot_and_percentage_budgets_as_documented() {
        // (family, budget, the base length it resolves against, the spec it gets)
        let cases = [
            ("full", "64", 1000, "full"),
            ("full", "20%", 1000, "full"),
            ("full:page=16,kv_dtype=q8", "20%", 1000, "full:page=16,kv_dtype=q8"),
            ("window", "64", 1000, "window:recent=64"),
            ("window", "20%", 1000, "window:recent=200"),
            ("local", "20%", 1000, "window:recent=200"),
            ("sink", "64", 1000, "sink:sink=4,recent=60"),
            ("sink", "20%", 1000, "sink:sink=4,recent=196"),
            ("sink", "3", 1000, "sink:sink=2,recent=1"),
            ("sink", "1", 1000, "sink:sink=0,recent=1"),
            ("sink:sink=8", "20%", 1000, "sink:sink=8,recent=192"),
            ("heavy", "64", 1000, "heavy:heavy=64"),
            ("heavy", "10%", 1000, "heavy:heavy=100"),
            ("random", "64", 1000, "random:budget=64,recent=32,seed=0"),
            ("random", "20%", 1000, "random:budget=200,recent=100,seed=0"),
            ("random:seed=3", "1", 1000, "random:budget=1,recent=0,seed=3"),
            ("h2o", "21", 1000, "h2o:heavy=11,recent=10"),
            ("h2o", "20%", 1000, "h2o:heavy=100,recent=100"),
            ("h2o", "100%", 37, "h2o:heavy=19,recent=18"),
            ("h2o:agg=max,prefill=stream:16", "10%", 100, "h2o:heavy=5,recent=5,agg=max,prefill=stream:16"),
            ("h2o:score=tova", "20%", 1000, "h2o:heavy=100,recent=100,score=tova"),
            ("h2o:recent_share=0.125,prefill=kvzip", "64", 1000, "h2o:heavy=56,recent=8,prefill=kvzip"),
            ("h2o:recent_share=0.125,prefill=kvzip", "25%", 1000, "h2o:heavy=219,recent=31,prefill=kvzip"),
            ("h2o:recent_share=0", "10", 1000, "h2o:heavy=10,recent=0"),
            ("h2o:agg=max,score=decay:0.9", "64", 1000, "h2o:heavy=32,recent=32,agg=max,score=decay:0.9"),
            ("heavy:score=persist:16", "10%", 1000, "heavy:heavy=100,score=persist:16"),
            ("h2o:sink=4,score=norm", "64", 1000, "h2o:heavy=30,recent=30,sink=4,score=norm"),
            ("h2o:sink=4,score=norm", "3", 1000, "h2o:heavy=1,recent=0,sink=2,score=norm"),
            ("window:sink=4", "64", 1000, "window:recent=60,sink=4"),
            ("h2o:alloc=pyramid:0.5", "20%", 1000, "h2o:heavy=100,recent=100,alloc=pyramid:0.5"),
            ("h2o:score=norm,alloc=ada:0.2", "64", 1000, "h2o:heavy=32,recent=32,score=norm,alloc=ada:0.2"),
            ("random:sink=4", "64", 1000, "random:budget=60,recent=30,seed=0,sink=4"),
            (
                "h2o:page=16,compact=64,kv_dtype=q8",
                "20%",
                1000,
                "h2o:heavy=100,recent=100,page=16,compact=64,kv_dtype=q8",
            ),
        ];
        for (family, budget, n, want) in cases {
            let f = PolicyFamily::parse(family).unwrap_or_else(|e| panic!("{family}: {e}"));
            let b = f.budget(budget).unwrap().map_or(1, |b| b.resolve(n));
            assert_eq!(f.at(b).unwrap().to_string(), want, "{family} at {budget} of {n}");
        }
    }

    #[test]
    fn every_budget_is_exactly_b_slots() {
        for fam in [
            "window",
            "sink",
            "heavy",
            "random",
            "h2o",
            "sink:sink=2",
            "random:seed=5",
            "h2o:score=vnorm",
            "h2o:sink=4,score=persist:8",
            "heavy:sink=2",
            "window:sink=4",
            "random:sink=3",
        ] {
            let f = PolicyFamily::parse(fam).unwrap();
            for b in [1, 2, 3, 7, 64, 1000] {
                assert_eq!(f.at(b).unwrap().budget(1000), Some(b), "{fam} B={b}");
            }
        }
    }

    #[test]
    fn labels_keep_what_was_written() {
        for (written, label) in [
            ("h2o:agg=max", "h2o:agg=max"),
            ("local", "window"),
            ("sink:sink=4", "sink"),
            ("sink:page=8,sink=2", "sink:sink=2,page=8"),
            ("full:page=16,kv_dtype=q8", "full:page=16,kv_dtype=q8"),
            ("h2o + chai:plan=p.json", "h2o+chai:plan=p.json"),
            ("chai:plan=p.json", "chai:plan=p.json"),
        ] {
            assert_eq!(PolicyFamily::parse(written).unwrap().to_string(), label, "{written}");
        }
    }

    #[test]
    fn budgets_and_bad_families_name_the_problem() {
        let f = PolicyFamily::parse("h2o").unwrap();
        assert_eq!(f.budget("20%").unwrap(), Some(Budget::Percent(20.0)));
        assert!(f.budget("0").unwrap_err().contains("at least 1 slot"));
        assert!(f.budget("0%").unwrap_err().contains("(0, 100]"));
        assert_eq!(PolicyFamily::parse("full").unwrap().budget("anything").unwrap(), None);
        let err = |family: &str| PolicyFamily::parse(family).unwrap_err().to_string();
        assert!(err("fancy").contains("unknown policy family `fancy`"));
        assert!(err("full,h2o").contains("separated by `;`"));
        assert!(!err("fancy").contains("separated by"));
        assert!(err("h2o:heavy=3").contains("`heavy` is set by the budget"));
        assert!(err("window:recent=3").contains("`recent` is set by the budget"));
        assert!(err("h2o:recent_share=1.5").contains("recent_share: `1.5` is not a share in [0, 1]"));
        assert!(err("h2o:agg=mean").contains("agg"));
        assert!(err("sink:sink=x").contains("sink must be a slot count"));
        assert!(err("h2o:compact=8").contains("paged store"));
        assert!(err("h2o:x=1").contains("unknown parameter `x`"));
        assert!(err("h2o:score=decay:-1").contains("score: decay: `-1`"));
        assert!(err("h2o:score=mean").contains("score: unknown score family `mean`"));
        assert!(err("h2o:sink=10%").contains("sink: a budget family needs a slot count"));
        assert!(err("chai:plan=p.json+h2o").contains("token policy first"));
        assert!(err("h2o+window:recent=3").contains("head policy"));
        assert!(err("h2o:alloc=pyramid:2").contains("alloc: pyramid ratio `2` must be in (0, 1]"));
        assert!(err("h2o:alloc=ada+chai:plan=p.json").contains("cannot compose with chai"));
        assert!(err("h2o+chai:plan=a+chai:plan=b").contains("at most one `+`"));
    }

    #[test]
    fn parsing_reads_no_plan_and_loading_names_the_file() {
        let mut f = PolicyFamily::parse("h2o+chai:plan=/no/such/family-plan.json").unwrap();
        let spec = f.at(10).unwrap();
        assert!(spec.head.as_ref().is_some_and(|h| h.plan.is_none()));
        let e = f.load_plans().unwrap_err().to_string();
        assert!(e.contains("/no/such/family-plan.json"), "{e}");
    }
}
