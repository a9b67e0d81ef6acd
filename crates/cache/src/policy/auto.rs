//! `auto:budget=B`: the policy the measurements found best for the model at
//! the nearest measured kept share, at budget B (docs/policies.md §4).
//!
//! A row names a model (its architecture, layers and hidden size: the
//! model key), the kept share it was measured at, and the H2O variant that
//! won there: score family, sinks and the heavy part of the non-sink slots.
//! At budget B (resolved against the sequence, as every budget) the chosen
//! row's variant gets exactly B slots: S = min(sinks, B − 1) sinks, the rest
//! split heavy : recent by its fraction. A row whose winner was measured as
//! a budget family (an evaluation's cell) names that family, and B slots
//! give exactly the spec the evaluation ran at B ([`PolicyFamily::at`]):
//! `auto`'s cells are then the winner's, slot for slot. The rows are generated from the
//! results they cite (`auto_table.json`, by scripts/auto_table.py); models
//! without rows use the default rows, the best over the complete Qwen
//! rankings among the variants that need no per-model file. The cache resolves `auto` when
//! it is built ([`crate::effective_policy`]), where the model is known; until
//! then the spec stands for paper H2O at B, so everything that looks at a
//! spec before that (does it evict, its budget) sees an evicting policy.
//!
//! A cache compressed once and asked many questions later (a compressed
//! context) has its own rows ([`AutoUse::Context`]): there the prompt is
//! chosen before any question exists, so the table's rule ranks the
//! query-agnostic policies by the questions answered after compression.
//! A context resolves `auto` when it is compressed
//! ([`PolicySpec::for_context`]), and keeps the resolved spec.

use super::budget::PolicyFamily;
use super::spec::{Budget, PolicySpec};
use serde::Deserialize;
use std::sync::OnceLock;

/// What a cache is for, which decides the rows `auto` picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoUse {
    /// A request's own prompt, its question at the end: the rows ranked by
    /// held-out KL and needles found with the question in the prompt.
    Reply,
    /// A compressed context, its questions after compression: the rows
    /// ranked by those questions' answers (docs/policies.md §4).
    Context,
}

/// One measured choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoChoice {
    /// The model key ([`model_key`]); `*` for the default rows.
    pub model: &'static str,
    /// The use it was measured for.
    pub usage: AutoUse,
    /// The model as people call it.
    pub model_name: &'static str,
    /// The kept share (percent) it was measured at.
    pub share: f64,
    /// `score=` of the winner (`sum` for paper H2O's).
    pub score: &'static str,
    /// Sinks of the winner.
    pub sinks: usize,
    /// Heavy slots as a fraction of the non-sink slots.
    pub heavy: f64,
    /// The prompt's prefill (`prefill=` of the grammar, e.g. `snap:32`)
    /// when the winner compresses the prompt after its prefill; `None`:
    /// the prompt streams through the decode-time policy.
    pub prefill: Option<&'static str>,
    /// `alloc=` of the winner (`global`: one ranking over every layer
    /// and head), `None`: the same budget in every unit.
    pub alloc: Option<&'static str>,
    /// The winner as the budget family the evaluation ran
    /// (`h2o:recent_share=0.125,prefill=kvzap,alloc=global`), which then
    /// decides the split of B slots; `None`: a spec measured at one budget
    /// (a tune file's), split by the fields above.
    pub family: Option<&'static str>,
    /// Where the measurement is: the file and the table.
    pub evidence: &'static str,
}

impl AutoChoice {
    /// Whether the winner scores the prompt with the model's KVzap
    /// predictor (`prefill=kvzap`), which a model may lack: then the
    /// default rows of the use stand in.
    pub fn needs_kvzap(&self) -> bool {
        self.prefill.is_some_and(|p| p.split(':').next() == Some("kvzap"))
    }
}

/// The generated table: `python3 scripts/auto_table.py` writes it from the
/// committed results (its rule: docs/policies.md §4), so nothing here is
/// copied by hand; scripts/check_docs.py fails when it is stale.
const TABLE: &str = include_str!("auto_table.json");

/// The table's rows, parsed once.
fn table() -> &'static [AutoChoice] {
    #[derive(Deserialize)]
    struct Row<'a> {
        model: &'a str,
        model_name: &'a str,
        #[serde(rename = "use")]
        usage: AutoUse,
        share: f64,
        score: &'a str,
        sinks: usize,
        /// The winner's heavy slots and its non-sink slots: two integers,
        /// so the fraction is one exact division.
        heavy: (u32, u32),
        #[serde(borrow)]
        prefill: Option<&'a str>,
        #[serde(borrow)]
        alloc: Option<&'a str>,
        #[serde(borrow, default)]
        family: Option<&'a str>,
        evidence: &'a str,
    }
    #[derive(Deserialize)]
    struct Table<'a> {
        #[serde(borrow)]
        rows: Vec<Row<'a>>,
    }
    static ROWS: OnceLock<Vec<AutoChoice>> = OnceLock::new();
    ROWS.get_or_init(|| {
        let t: Table<'static> = serde_json::from_str(TABLE).expect("auto_table.json is scripts/auto_table.py's output");
        t.rows
            .into_iter()
            .map(|r| AutoChoice {
                model: r.model,
                model_name: r.model_name,
                usage: r.usage,
                share: r.share,
                score: r.score,
                sinks: r.sinks,
                heavy: f64::from(r.heavy.0) / f64::from(r.heavy.1),
                prefill: r.prefill,
                alloc: r.alloc,
                family: r.family,
                evidence: r.evidence,
            })
            .collect()
    })
}

/// The table as a slice (`CHOICES.iter()`, `for c in CHOICES`). The tuned
/// rows are `kvslim tune`'s winners, which beat window, sink, heavy, random
/// and paper H2O on held-out WikiText-2 KL at their budget
/// (docs/results/tuning.md); the others, and the default rows (`*`),
/// come from the Qwen rankings and compress-once results
/// (scripts/auto_table.py says which files make which rows).
#[derive(Clone, Copy, Debug)]
pub struct Choices;

/// `auto`'s rows, read from the generated table.
pub const CHOICES: Choices = Choices;

impl std::ops::Deref for Choices {
    type Target = [AutoChoice];
    fn deref(&self) -> &[AutoChoice] {
        table()
    }
}

impl IntoIterator for Choices {
    type Item = &'static AutoChoice;
    type IntoIter = std::slice::Iter<'static, AutoChoice>;
    fn into_iter(self) -> Self::IntoIter {
        table().iter()
    }
}

/// The key `auto` looks a model up by: architecture, layers and hidden
/// size (`qwen2:28x1536`), which tell the models of a family apart without
/// relying on file names.
pub fn model_key(architecture: &str, layers: usize, hidden: usize) -> String {
    format!("{}:{layers}x{hidden}", architecture.to_ascii_lowercase())
}

/// The row of `usage` for `model` (its rows, else the default rows) whose
/// share is nearest `share` percent (the larger share on a tie: more
/// memory, never less quality). Without a KVzap predictor
/// (`kvzap = false`) the model's rows that need one do not count.
pub fn choose(model: Option<&str>, share: f64, usage: AutoUse, kvzap: bool) -> &'static AutoChoice {
    rows_for(model, usage, kvzap)
        .into_iter()
        .min_by(|a, b| {
            let (da, db) = ((a.share - share).abs(), (b.share - share).abs());
            da.total_cmp(&db).then(b.share.total_cmp(&a.share))
        })
        .expect("each use has default rows that need no predictor")
}

/// The rows `auto` chooses among for `model` used as `usage`: its own,
/// else the default rows (without a KVzap predictor, the rows that need
/// none).
fn rows_for(model: Option<&str>, usage: AutoUse, kvzap: bool) -> Vec<&'static AutoChoice> {
    let usable = |c: &&AutoChoice| c.usage == usage && (kvzap || !c.needs_kvzap());
    let own: Vec<_> = CHOICES.iter().filter(|c| model.is_some_and(|m| m == c.model) && usable(c)).collect();
    if own.is_empty() {
        CHOICES.iter().filter(|c| c.model == "*" && usable(c)).collect()
    } else {
        own
    }
}

/// The kept shares (percent, largest first) that `model`'s rows for
/// `usage` were measured at: where `auto` is evidence rather than the
/// nearest row's.
pub fn measured_shares(model: Option<&str>, usage: AutoUse, kvzap: bool) -> Vec<f64> {
    let mut shares: Vec<f64> = rows_for(model, usage, kvzap).iter().map(|c| c.share).collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    shares.dedup();
    shares
}

/// `auto:budget=B` for a sequence of `base_len` tokens of `model` used as
/// `usage` (`kvzap`: whether the model has a KVzap predictor): the chosen
/// row's H2O variant with exactly B slots, and the row.
pub fn resolve(
    budget: Budget,
    model: Option<&str>,
    base_len: usize,
    usage: AutoUse,
    kvzap: bool,
) -> (PolicySpec, &'static AutoChoice) {
    let slots = budget.resolve(base_len).max(1);
    let share = match budget {
        Budget::Percent(p) => p,
        Budget::Slots(n) => 100.0 * n as f64 / base_len.max(1) as f64,
    };
    let row = choose(model, share, usage, kvzap);
    (resolve_row(slots, row), row)
}

/// `row`'s H2O variant with exactly `slots` (≥ 1) slots: its family's own
/// split where it names one, else its sinks and heavy fraction.
fn resolve_row(slots: usize, row: &AutoChoice) -> PolicySpec {
    if let Some(family) = row.family {
        let spec = PolicyFamily::parse(family).and_then(|f| f.at(slots));
        return spec.expect("the table's families are valid budget families");
    }
    let sinks = row.sinks.min(slots - 1);
    let rest = slots - sinks;
    let heavy = ((rest as f64 * row.heavy).round() as usize).min(rest);
    let mut spec = format!("h2o:heavy={heavy},recent={},sink={sinks},score={}", rest - heavy, row.score);
    for (key, value) in [("prefill", row.prefill), ("alloc", row.alloc)] {
        if let Some(v) = value {
            spec += &format!(",{key}={v}");
        }
    }
    PolicySpec::parse(&spec).expect("the table's rows are valid specs")
}

impl PolicySpec {
    /// The spec a compressed context runs: `auto` resolved from the
    /// context rows ([`AutoUse::Context`]) for `model` at the context's
    /// `len` tokens, its storage keys kept; any other spec as it is.
    /// `kvzap`: whether the model has a KVzap predictor.
    pub fn for_context(&self, model: Option<&str>, len: usize, kvzap: bool) -> PolicySpec {
        let Some(b) = self.auto else { return self.clone() };
        let (mut spec, _) = resolve(b, model, len, AutoUse::Context, kvzap);
        spec.storage = self.storage;
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_resolves_to_exactly_its_budget() {
        for c in CHOICES {
            assert!(c.heavy > 0.0 && c.heavy <= 1.0, "{c:?}");
            for (b, len) in [(Budget::Percent(c.share), 1024), (Budget::Percent(3.0), 100), (Budget::Slots(1), 50)] {
                let (spec, row) = resolve(b, Some(c.model), len, c.usage, true);
                assert_eq!(row.model, c.model);
                assert_eq!(spec.budget(len), Some(b.resolve(len).max(1)), "{c:?} at {b}");
            }
        }
    }

    #[test]
    fn rows_are_the_measured_specs_at_their_budget() {
        // SmolLM2 at 20% of a 1,024-token window: tune's h2o:heavy=150,recent=50,sink=4,score=norm,
        // with the prompt prefill its needle tasks chose (if any)
        let with_prefill = |tuned: &str, row: &AutoChoice| {
            let prefill = row.prefill.map_or(String::new(), |p| format!(",prefill={p}"));
            PolicySpec::parse(&format!("{tuned}{prefill}")).unwrap()
        };
        let (spec, row) = resolve(Budget::Percent(20.0), Some("llama:30x576"), 1024, AutoUse::Reply, false);
        assert_eq!(spec, with_prefill("h2o:heavy=150,recent=50,sink=4,score=norm", row));
        let (spec, row) = resolve(Budget::Percent(5.0), Some("gemma3:18x640"), 1024, AutoUse::Reply, false);
        assert_eq!(spec, with_prefill("h2o:heavy=38,recent=13,score=norm", row));
        // Qwen2.5-Coder-1.5B: one row, with SnapKV's prompt compression, at any share
        for p in [12.5, 20.0, 50.0] {
            let (spec, row) = resolve(Budget::Percent(p), Some("qwen2:28x1536"), 4096, AutoUse::Reply, false);
            let b = Budget::Percent(p).resolve(4096);
            let heavy = ((b - 4) as f64 * 0.5).round() as usize;
            let want = format!("h2o:heavy={heavy},recent={},sink=4,score=vnorm,prefill=snap:32", b - 4 - heavy);
            assert_eq!((spec.to_string(), row.share), (PolicySpec::parse(&want).unwrap().to_string(), 20.0));
        }
    }

    #[test]
    fn the_grammar_reads_and_writes_auto() {
        let p = PolicySpec::parse("auto:budget=20%").unwrap();
        assert_eq!((p.to_string(), p.auto), ("auto:budget=20%".to_string(), Some(Budget::Percent(20.0))));
        // until resolved it stands for paper H2O at the budget
        assert_eq!(p.budget(1000), PolicySpec::parse("h2o:heavy=10%,recent=10%").unwrap().budget(1000));
        assert_eq!(PolicySpec::parse("auto:budget=64").unwrap().budget(1000), Some(64));
        // its refusals: `spec::tests`
    }

    #[test]
    fn a_cache_resolves_auto_for_its_model() {
        use crate::{CacheShape, SequenceCache};
        let shape = |model: &str| CacheShape {
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            sliding_window: None,
            model: Some(model.into()),
            kvzap: false,
        };
        let bytes = |spec: &str, model: &str| {
            let c = SequenceCache::new(&PolicySpec::parse(spec).unwrap(), shape(model), 2048, 1024).unwrap();
            (c.policy().head_budget(0, 0), c.store().bytes())
        };
        let (smollm2, _) = resolve(Budget::Percent(20.0), Some("llama:30x576"), 1024, AutoUse::Reply, false);
        assert_eq!(smollm2.budget(1024), Some(150 + 50 + 4), "{smollm2}");
        assert_eq!(bytes("auto:budget=20%", "llama:30x576"), bytes(&smollm2.to_string(), "llama:30x576"));
        // a model without rows: the default row nearest 20%, at 20% of the 1,024-token base
        let (default, row) = resolve(Budget::Percent(20.0), Some("qwen3:28x1024"), 1024, AutoUse::Reply, false);
        assert_eq!(row.model, "*");
        assert_eq!(bytes("auto:budget=20%", "qwen3:28x1024"), bytes(&default.to_string(), "x"));
    }

    #[test]
    fn a_context_uses_its_own_rows_and_falls_back_without_a_predictor() {
        for usage in [AutoUse::Reply, AutoUse::Context] {
            let defaults = CHOICES.iter().filter(|c| c.model == "*" && c.usage == usage);
            assert!(defaults.clone().count() > 0 && defaults.clone().all(|c| !c.needs_kvzap()), "{usage:?}");
        }
        for c in CHOICES.iter().filter(|c| c.model != "*") {
            let own = choose(Some(c.model), c.share, c.usage, true);
            assert_eq!((own.model, own.usage), (c.model, c.usage));
            let without = choose(Some(c.model), c.share, c.usage, false);
            assert!(!without.needs_kvzap() && without.usage == c.usage);
            if c.needs_kvzap() {
                let (spec, _) = resolve(Budget::Percent(c.share), Some(c.model), 4096, c.usage, true);
                assert!(spec.to_string().contains("prefill=kvzap"), "{spec}");
            }
        }
    }

    #[test]
    fn a_context_resolves_auto_and_keeps_its_storage_keys() {
        let mut auto = PolicySpec::parse("auto:budget=25%").unwrap();
        auto.storage.page_size = Some(16);
        let row = choose(Some("qwen3:28x1024"), 25.0, AutoUse::Context, false);
        let spec = auto.for_context(Some("qwen3:28x1024"), 4096, false);
        assert_eq!((spec.auto, spec.storage.page_size, spec.budget(4096)), (None, Some(16), Some(1024)));
        if let Some(a) = row.alloc {
            assert!(spec.to_string().contains(&format!("alloc={a}")), "{spec}");
        }
        let plain = PolicySpec::parse("h2o:heavy=10,recent=10").unwrap();
        assert_eq!(plain.for_context(Some("qwen3:28x1024"), 4096, true), plain);
    }

    #[test]
    fn a_row_with_a_family_resolves_as_the_evaluation_ran_it() {
        // recent = round(F·B) for the family, whatever the heavy fraction's rounding would give
        let row = AutoChoice {
            model: "test:1x1",
            usage: AutoUse::Reply,
            model_name: "test",
            share: 12.5,
            score: "sum",
            sinks: 0,
            heavy: 7.0 / 8.0,
            prefill: Some("snap:32"),
            alloc: Some("global"),
            family: Some("h2o:recent_share=0.125,prefill=snap:32,alloc=global"),
            evidence: "-",
        };
        let family = PolicyFamily::parse(row.family.unwrap()).unwrap();
        for b in [1usize, 4, 12, 100, 511, 512, 516] {
            assert_eq!(resolve_row(b, &row).to_string(), family.at(b).unwrap().to_string(), "B = {b}");
        }
        // 12 · 1/8 = 1.5: the family rounds recent up, the heavy fraction would round heavy up
        let want = PolicySpec::parse("h2o:heavy=10,recent=2,prefill=snap:32,alloc=global").unwrap();
        assert_eq!(resolve_row(12, &row), want);
        assert_eq!(resolve_row(12, &AutoChoice { family: None, ..row }).budget(12), Some(12));
        assert_ne!(resolve_row(12, &AutoChoice { family: None, ..row }), want);
        // each row at its own share (a model's rows may name different families)
        for c in CHOICES.iter().filter(|c| c.family.is_some()) {
            let budget = Budget::Percent(c.share);
            let want = PolicyFamily::parse(c.family.unwrap()).unwrap().at(budget.resolve(4096)).unwrap();
            assert_eq!(resolve(budget, Some(c.model), 4096, c.usage, true).0, want, "{c:?}");
        }
    }

    #[test]
    fn nearest_share_of_the_models_rows_else_the_default() {
        let reply = |model, share| choose(model, share, AutoUse::Reply, false);
        assert_eq!(reply(Some("llama:30x576"), 25.0).share, 20.0);
        assert_eq!(reply(Some("llama:30x576"), 30.0).share, 40.0, "a tie takes the larger share");
        let defaults: Vec<f64> =
            CHOICES.iter().filter(|c| c.model == "*" && c.usage == AutoUse::Reply).map(|c| c.share).collect();
        let nearest =
            |share: f64| defaults.iter().copied().min_by(|a, b| (a - share).abs().total_cmp(&(b - share).abs()));
        let unknown = reply(Some("qwen3:28x1024"), 20.0);
        assert_eq!((unknown.model, Some(unknown.share)), ("*", nearest(20.0)));
        assert_eq!(Some(reply(None, 60.0).share), nearest(60.0));
        assert_eq!(model_key("Qwen2", 28, 1536), "qwen2:28x1536");
    }

    #[test]
    fn measured_shares_are_the_rows_auto_chooses_among() {
        let shares = |model, kvzap| measured_shares(model, AutoUse::Reply, kvzap);
        assert_eq!(shares(Some("llama:30x576"), false), [40.0, 20.0, 10.0, 5.0]);
        let defaults = shares(None, false);
        assert!(!defaults.is_empty() && defaults.windows(2).all(|w| w[0] > w[1]), "{defaults:?}");
        assert_eq!(shares(Some("qwen3:28x1024"), false), defaults, "an unknown model: the default rows");
        for model in [Some("llama:30x576"), Some("qwen2:24x896"), None] {
            for kvzap in [false, true] {
                for &p in &shares(model, kvzap) {
                    assert_eq!(choose(model, p, AutoUse::Reply, kvzap).share, p, "{model:?} at {p}%");
                }
            }
        }
    }
}
