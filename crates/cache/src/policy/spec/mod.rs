//! The policy-spec grammar, shared by the CLI, the server, evaluation and
//! config files:
//!
//! ```text
//! full
//! window:recent=N                      recent tokens only ("local")
//! sink:sink=S,recent=N                 StreamingLLM: first S positions + window
//! heavy:heavy=N[,score=R]              heavy hitters only, no window
//! random:budget=N[,recent=R][,seed=S]  seeded random victims, window protected
//! h2o:heavy=N,recent=M[,agg=sum|max][,prefill=full|stream:C|snap:W[:K]|expect[:F]|kvzip[:C]|kvzap[:FILE]|rkv[:P]][,score=R][,alloc=A]
//! ```
//!
//! `alloc=A` spreads h2o's heavy slots over layers and KV heads under the
//! same total (see [`super::alloc`]): `pyramid[:R]` (PyramidKV: the top
//! layer gets R times the bottom layer's heavy slots, an arithmetic series
//! between), `ada[:F]` (AdaKV: a layer's heavy slots go to the heads whose
//! prompt attention needs them, each keeping at least ⌊F · heavy⌋),
//! `pyramid[:R]/ada[:F]`, or `global[:F]` (KVzip's one ranking over every
//! layer and head, each unit keeping at least ⌊F · heavy⌋; no floor by
//! default).
//!
//! `score=R` picks the score family the heavy hitters are ranked by (see
//! [`super::score`]): `sum` (H2O, the default), `norm`, `decay:G`, `tova`,
//! `vnorm`, `persist:H[:T]`. `sink=S` is accepted by every evicting family
//! (window, heavy, random, h2o; `sink` has it already): S more slots that
//! hold the first S positions, protected like StreamingLLM's sinks.
//!
//! ```text
//! chai:plan=FILE[,probe=5][,rep=first|medoid][,drift=T[:D]]
//!                                                 CHAI head sharing (online clusters;
//!                                                 drift: re-cluster every T tokens when a
//!                                                 member drifts past distance D)
//! chai-static:plan=FILE                          CHAI with the plan's fixed membership
//! TOKEN+chai:…                                   token eviction composed with head sharing
//! tuned:file=FILE                                the spec `kvslim tune` chose, read from its output
//! ```
//!
//! Storage keys, accepted by every token policy (write `full:…` to give
//! them to a pure head policy, e.g. `full:kv_dtype=q8+chai:plan=F`):
//!
//! ```text
//! page=P                  paged KV: pages of P tokens from a shared pool (default: fixed slots)
//! compact=N               repack live tokens into full pages every N decode steps (needs page)
//! page_score=sum|max|topm:M   evict whole pages scored this way (h2o, heavy, random; needs page; not with compact)
//! kv_dtype=f32|f16|q8|q4  storage type of K and V (q8: int8, scale per 32; q4: 4-bit, scale+min per 32)
//! ```
//!
//! Every budget is a slot count or `P%` of the evaluated sequence length
//! (the prompt for generation, the whole sequence for perplexity), turned
//! into slots once by [`PolicySpec::build`].
//!
//! What the grammar knows about each token family sits in one place: its
//! entry in `FAMILIES` (`family.rs`: names, keys, how they are read with their defaults
//! and checks, and how the family spends a budget of B slots, which
//! [`super::budget::PolicyFamily`] uses) and its arm of
//! `TokenPolicySpec::parts` (what `Display` writes and the
//! [`EvictionConfig`] it builds).
//!
//! Parsing never reads a file: a CHAI spec holds its plan's path, and
//! [`PolicySpec::load_plans`] (or [`PolicySpec::parse_and_load`]) reads it
//! in one explicit step, so a bad plan is reported once, naming the file,
//! and never per request or per sequence. `tuned:file=FILE` is loaded the
//! same way (see [`super::tuned`]): the spec names the file until
//! `load_plans` replaces it with the spec the file records.

use super::alloc::{Alloc, Allocated};
use super::chai::{Drift, HeadSharingSpec, RepRule};
use super::token::{EvictionConfig, EvictionUnit, Observation, PageScore, TokenEviction, VictimRule};
use super::tuned::{read_tuned_spec, LoadError, TunedRef};
use super::{CachePolicy, FullCache, ScoreAgg, ScoreRule};
use crate::store::StoreLayout;
use kvslim_kernels::kvquant::KvDtype;
use std::fmt;

mod family;
mod prefill;
pub use prefill::{PrefillMode, KVZIP_CHUNK};
#[cfg(test)]
mod tests;

pub(super) use family::{Family, Params, Spend, FAMILIES};

/// A budget: absolute slots or a fraction of the evaluated sequence length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Slots(usize),
    /// Percent in (0, 100].
    Percent(f64),
}

impl Budget {
    /// Slots for a sequence of `base_len` tokens: ⌊P% · len⌋, at least 1 for
    /// a non-zero percentage.
    pub fn resolve(self, base_len: usize) -> usize {
        match self {
            Budget::Slots(n) => n,
            Budget::Percent(p) => ((p / 100.0 * base_len as f64).floor() as usize).max(1),
        }
    }

    fn is_zero(self) -> bool {
        self == Budget::Slots(0)
    }
}

impl std::str::FromStr for Budget {
    type Err = String;
    /// `64` or `20%` (percent in (0, 100]); `0` is a valid slot count here
    /// (a part of a policy may be empty; the policy checks its total).
    fn from_str(v: &str) -> Result<Budget, String> {
        let v = v.trim();
        if let Some(p) = v.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| format!("`{v}` is not a percentage"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(format!("percentage `{v}` must be in (0, 100]"));
            }
            Ok(Budget::Percent(p))
        } else {
            v.parse().map(Budget::Slots).map_err(|_| format!("`{v}` is not a slot count or a percentage like 10%"))
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Slots(n) => write!(f, "{n}"),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Token-eviction part of a policy.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenPolicySpec {
    Full,
    /// `sink`: extra slots holding the first positions (0 = none), as in
    /// every family below.
    Window {
        recent: Budget,
        sink: Budget,
    },
    Sink {
        sink: Budget,
        recent: Budget,
    },
    /// `score`: how the heavy hitters are ranked, as in `H2o`.
    Heavy {
        heavy: Budget,
        sink: Budget,
        score: ScoreRule,
    },
    Random {
        budget: Budget,
        recent: Budget,
        seed: u64,
        sink: Budget,
    },
    H2o {
        heavy: Budget,
        recent: Budget,
        agg: ScoreAgg,
        prefill: PrefillMode,
        sink: Budget,
        score: ScoreRule,
        /// How the heavy slots are spread over layers and heads.
        alloc: Alloc,
    },
}

/// How a policy's K and V are stored: the layout, compaction, page-level
/// eviction and the storage type. Independent of which tokens stay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StorageSpec {
    /// Tokens per page; `None` = fixed slot arrays.
    pub page_size: Option<usize>,
    /// Repack live tokens into full pages every N decode steps.
    pub compact_every: Option<usize>,
    /// Evict whole pages scored this way instead of single tokens.
    pub page_score: Option<PageScore>,
    pub kv_dtype: KvDtype,
}

impl StorageSpec {
    /// The store layout this asks for.
    pub fn layout(&self) -> StoreLayout {
        StoreLayout { page_size: self.page_size, kv_dtype: self.kv_dtype }
    }

    /// Takes the storage keys out of a policy's parameters. `default_page`
    /// is the page size `compact`/`page_score` get when `page` is absent.
    fn take(p: &mut Params<'_>, evicts: bool, default_page: Option<usize>) -> Result<StorageSpec, String> {
        let positive = |key: &str, v: &str| {
            v.parse::<usize>().ok().filter(|&n| n >= 1).ok_or_else(|| format!("{key}: `{v}` is not an integer ≥ 1"))
        };
        let page_size = p.take("page").map(|v| positive("page", v)).transpose()?;
        let compact_every = p.take("compact").map(|v| positive("compact", v)).transpose()?;
        let page_score =
            p.take("page_score").map(|v| v.parse::<PageScore>().map_err(|e| format!("page_score: {e}"))).transpose()?;
        let kv_dtype =
            p.take("kv_dtype").map(|v| v.parse::<KvDtype>().map_err(|e| format!("kv_dtype: {e}"))).transpose()?;
        let page_size = match page_size {
            None if compact_every.is_some() || page_score.is_some() => default_page,
            p => p,
        };
        if page_size.is_none() && (compact_every.is_some() || page_score.is_some()) {
            return Err("`compact` and `page_score` need a paged store: add `page=P` (e.g. page=16)".into());
        }
        if compact_every.is_some() && page_score.is_some() {
            return Err("choose one: `compact=N` (token eviction, repacked) or `page_score=…` (page eviction)".into());
        }
        if !evicts && (compact_every.is_some() || page_score.is_some()) {
            return Err("`compact` and `page_score` only apply to a policy that evicts".into());
        }
        Ok(StorageSpec { page_size, compact_every, page_score, kv_dtype: kv_dtype.unwrap_or_default() })
    }

    fn is_default(&self) -> bool {
        *self == StorageSpec::default()
    }
}

impl fmt::Display for StorageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            self.page_size.map(|p| format!("page={p}")),
            self.compact_every.map(|n| format!("compact={n}")),
            self.page_score.map(|s| format!("page_score={s}")),
            (self.kv_dtype != KvDtype::F32).then(|| format!("kv_dtype={}", self.kv_dtype)),
        ];
        f.write_str(&parts.into_iter().flatten().collect::<Vec<_>>().join(","))
    }
}

/// This token policy in the terms every family shares.
struct Parts {
    /// The family's name as `Display` writes it (and reports show).
    name: &'static str,
    /// The parameters `Display` writes, in order (defaults left out where
    /// the grammar always did).
    shown: Vec<(&'static str, String)>,
    /// The eviction it builds, budgets unresolved; `None` keeps everything.
    evict: Option<Evict>,
}

/// An [`EvictionConfig`] whose budgets are still slot counts or
/// percentages, resolved against the base length in [`Evict::resolve`].
struct Evict {
    /// B is the sum of these.
    total: Vec<Budget>,
    recent: Budget,
    sinks: Budget,
    rule: VictimRule,
    agg: Option<ScoreAgg>,
    score: ScoreRule,
    prefill: PrefillMode,
    /// The heavy part (what an allocator moves) and how it is spread.
    heavy: Budget,
    alloc: Alloc,
}

impl Evict {
    /// B = Σ `total`, victims by `rule`, nothing protected, no scores, one
    /// prefill chunk; a family's arm overrides the rest.
    fn new(rule: VictimRule, total: Vec<Budget>) -> Self {
        let zero = Budget::Slots(0);
        Evict {
            total,
            recent: zero,
            sinks: zero,
            rule,
            agg: None,
            score: ScoreRule::Sum,
            prefill: PrefillMode::Full,
            heavy: zero,
            alloc: Alloc::default(),
        }
    }

    fn resolve(&self, name: &'static str, base_len: usize) -> EvictionConfig {
        let r = |b: Budget| b.resolve(base_len);
        let budget: usize = self.total.iter().map(|&b| r(b)).sum();
        let recent = match self.rule {
            // a random victim must always exist: the window stays below B
            VictimRule::Random { .. } => r(self.recent).min(budget.saturating_sub(1)),
            _ => r(self.recent),
        };
        EvictionConfig {
            name,
            budget,
            recent,
            sinks: r(self.sinks),
            rule: self.rule,
            agg: self.agg,
            prefill_chunk: match self.prefill {
                PrefillMode::Stream(c) => Some(c),
                _ => None,
            },
            observation: match self.prefill {
                PrefillMode::Snap { window, pool } => Some(Observation::Window { window, pool }),
                PrefillMode::Expect { future } => Some(Observation::Expected { future, skip: r(self.sinks) }),
                PrefillMode::Kvzip { chunk } => Some(Observation::Repeat { chunk }),
                PrefillMode::Kvzap { file } => Some(Observation::Kvzap { file }),
                PrefillMode::Rkv { mass_permille } => Some(Observation::Diverse { mass_permille }),
                _ => None,
            },
        }
    }
}

impl TokenPolicySpec {
    /// The one per-variant description: what `Display` writes and what
    /// `build` and `budget` resolve.
    fn parts(&self) -> Parts {
        use TokenPolicySpec::*;
        use VictimRule::{LowestScore, Oldest};
        let (name, mut shown, evict) = match *self {
            Full => ("full", vec![], None),
            Window { recent, sink } => (
                "window",
                vec![("recent", recent.to_string())],
                Some(Evict { recent, sinks: sink, ..Evict::new(Oldest, vec![recent, sink]) }),
            ),
            Sink { sink, recent } => (
                "sink",
                vec![("sink", sink.to_string()), ("recent", recent.to_string())],
                Some(Evict { recent, sinks: sink, ..Evict::new(Oldest, vec![sink, recent]) }),
            ),
            Heavy { heavy, sink, score } => (
                "heavy",
                vec![("heavy", heavy.to_string())],
                Some(Evict {
                    agg: Some(ScoreAgg::Sum),
                    sinks: sink,
                    score,
                    ..Evict::new(LowestScore, vec![heavy, sink])
                }),
            ),
            Random { budget, recent, seed, sink } => (
                "random",
                vec![("budget", budget.to_string()), ("recent", recent.to_string()), ("seed", seed.to_string())],
                Some(Evict { recent, sinks: sink, ..Evict::new(VictimRule::Random { seed }, vec![budget, sink]) }),
            ),
            H2o { heavy, recent, agg, prefill, sink, score, alloc } => {
                let mut shown = vec![("heavy", heavy.to_string()), ("recent", recent.to_string())];
                if agg == ScoreAgg::Max {
                    shown.push(("agg", "max".into()));
                }
                match prefill {
                    PrefillMode::Stream(c) => shown.push(("prefill", format!("stream:{c}"))),
                    PrefillMode::Snap { window, pool } => shown.push(("prefill", format!("snap:{window}:{pool}"))),
                    PrefillMode::Expect { future } => shown.push(("prefill", format!("expect:{future}"))),
                    PrefillMode::Kvzip { chunk: KVZIP_CHUNK } => shown.push(("prefill", "kvzip".into())),
                    PrefillMode::Kvzip { chunk } => shown.push(("prefill", format!("kvzip:{chunk}"))),
                    PrefillMode::Kvzap { file: None } => shown.push(("prefill", "kvzap".into())),
                    PrefillMode::Kvzap { file: Some(f) } => shown.push(("prefill", format!("kvzap:{f}"))),
                    PrefillMode::Rkv { mass_permille } => {
                        shown.push(("prefill", format!("rkv:{}", mass_permille as f64 / 1000.0)))
                    }
                    PrefillMode::Full => {}
                }
                (
                    "h2o",
                    shown,
                    Some(Evict {
                        recent,
                        sinks: sink,
                        agg: Some(agg),
                        score,
                        prefill,
                        heavy,
                        alloc,
                        ..Evict::new(LowestScore, vec![heavy, recent, sink])
                    }),
                )
            }
        };
        // the keys every family shares, written only when not the default
        match *self {
            Window { sink, .. } | Heavy { sink, .. } | Random { sink, .. } | H2o { sink, .. } if !sink.is_zero() => {
                shown.push(("sink", sink.to_string()))
            }
            _ => {}
        }
        match *self {
            Heavy { score, .. } | H2o { score, .. } if score != ScoreRule::Sum => {
                shown.push(("score", score.to_string()))
            }
            _ => {}
        }
        if let H2o { alloc, .. } = *self {
            if !alloc.is_uniform() {
                shown.push(("alloc", alloc.to_string()))
            }
        }
        Parts { name, shown, evict }
    }
}

/// A parsed policy specification: token eviction, optionally composed with
/// CHAI head sharing, and how the K/V are stored.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    pub token: TokenPolicySpec,
    pub head: Option<HeadSharingSpec>,
    pub storage: StorageSpec,
    /// `tuned:file=FILE` as parsed, before [`PolicySpec::load_plans`] read
    /// the file (then `None`, and the fields above are the file's spec).
    /// A cache refuses a spec that still has one.
    pub tuned: Option<TunedRef>,
    /// `auto:budget=B` as parsed ([`super::auto`]): the fields above hold
    /// paper H2O at B until the cache resolves it for its model.
    pub auto: Option<Budget>,
}

/// A policy string that could not be parsed (or whose plan could not be
/// loaded); the message names the problem.
#[derive(Debug, thiserror::Error)]
#[error("invalid policy spec '{spec}': {reason}")]
pub struct PolicySpecError {
    pub spec: String,
    pub reason: String,
}

/// Parses `chai:…` / `chai-static:…`; `None` when `text` is not a head
/// policy. Reads no file: the plan stays a path until loaded.
pub(super) fn parse_head_policy(text: &str) -> Option<Result<HeadSharingSpec, String>> {
    let (name, args) = text.split_once(':').unwrap_or((text, ""));
    let fixed = match name.trim() {
        "chai" => false,
        "chai-static" => true,
        _ => return None,
    };
    Some((|| {
        let mut p = Params::parse(name.trim(), args)?;
        let path = p.take("plan").ok_or_else(|| format!("`{name}` needs `plan=FILE` (made by `kvslim calibrate`)"))?;
        let probe = match p.take("probe") {
            None => 5,
            Some(_) if fixed => return Err("chai-static has no probe".into()),
            Some(v) => v
                .parse()
                .ok()
                .filter(|&n: &usize| n >= 2)
                .ok_or_else(|| format!("probe: `{v}` is not an integer ≥ 2"))?,
        };
        let rep = match p.take("rep") {
            None => RepRule::First,
            Some(_) if fixed => return Err("chai-static always uses the first head of each cluster".into()),
            Some(v) => v.parse().map_err(|_| format!("rep: `{v}` is not `first` or `medoid`"))?,
        };
        let drift = match p.take("drift") {
            None => None,
            Some(_) if fixed => return Err("chai-static keeps its membership: use `chai:plan=FILE,drift=T`".into()),
            Some(v) => Some(parse_drift(v)?),
        };
        p.finish(if fixed { "plan" } else { "plan, probe, rep, drift" })?;
        Ok(HeadSharingSpec { plan_path: path.to_string(), plan: None, probe, rep, fixed, drift })
    })())
}

/// `drift=T[:D]`: a check every T ≥ 1 tokens, re-clustering above cosine
/// distance D in (0, 2] (default [`Drift::DEFAULT_THRESHOLD`]).
fn parse_drift(v: &str) -> Result<Drift, String> {
    let (every, threshold) = v.split_once(':').map_or((v, None), |(a, b)| (a, Some(b)));
    let every = every
        .trim()
        .parse()
        .ok()
        .filter(|&n: &usize| n >= 1)
        .ok_or_else(|| format!("drift: `{every}` is not a check interval ≥ 1 token"))?;
    let threshold = match threshold {
        None => Drift::DEFAULT_THRESHOLD,
        Some(t) => t
            .trim()
            .parse()
            .ok()
            .filter(|d: &f64| *d > 0.0 && *d <= 2.0)
            .ok_or_else(|| format!("drift: threshold `{t}` is not a cosine distance in (0, 2]"))?,
    };
    Ok(Drift { every, threshold })
}

/// Runs `parse` on the parameters of `text` when it is a `name:k=v,…`
/// policy; `None` when it is another.
fn parse_named<'a, T>(
    text: &'a str,
    name: &'static str,
    parse: impl FnOnce(Params<'a>) -> Result<T, String>,
) -> Option<Result<T, String>> {
    let (n, args) = text.split_once(':').unwrap_or((text, ""));
    (n.trim() == name).then(|| Params::parse(name, args).and_then(parse))
}

/// Parses `auto:budget=B`; `None` when `text` is not `auto`.
fn parse_auto(text: &str) -> Option<Result<Budget, String>> {
    parse_named(text, "auto", |mut p| {
        let b = p.take("budget").ok_or("`auto` needs `budget=B` (slots, or P% of the sequence)")?;
        p.finish("budget")?;
        match b.parse::<Budget>()? {
            Budget::Slots(0) => Err("auto: a budget needs at least 1 slot".into()),
            b => Ok(b),
        }
    })
}

/// Half of `b` for paper H2O's split: the heavy part (`recent` false) gets
/// the larger half of a slot count; percentages split evenly.
fn half(b: Budget, recent: bool) -> Budget {
    match b {
        Budget::Slots(n) if recent => Budget::Slots(n / 2),
        Budget::Slots(n) => Budget::Slots(n - n / 2),
        Budget::Percent(p) => Budget::Percent(p / 2.0),
    }
}

/// Parses `tuned:file=FILE`; `None` when `text` is not a tuned policy.
/// Reads no file.
fn parse_tuned(text: &str, default_page: Option<usize>) -> Option<Result<TunedRef, String>> {
    parse_named(text, "tuned", |mut p| {
        let path = p.take("file").ok_or("`tuned` needs `file=FILE` (written by `kvslim tune --out`)")?;
        p.finish("file")?;
        Ok(TunedRef { path: path.to_string(), default_page })
    })
}

fn parse_token_policy(text: &str, default_page: Option<usize>) -> Result<(TokenPolicySpec, StorageSpec), String> {
    let (name, args) = text.split_once(':').unwrap_or((text, ""));
    let name = name.trim();
    let mut p = Params::parse(name, args)?;
    Family::named(name)?.spec(&mut p, None, default_page)
}

impl PolicySpec {
    /// The predictor file `prefill=kvzap[:FILE]` names (`Some(None)`: the
    /// one kept for the model's fingerprint); `None` for any other policy.
    pub fn kvzap(&self) -> Option<Option<&'static str>> {
        match self.token {
            TokenPolicySpec::H2o { prefill: PrefillMode::Kvzap { file }, .. } => Some(file),
            _ => None,
        }
    }

    /// The default: keep every token.
    pub fn full() -> Self {
        PolicySpec {
            token: TokenPolicySpec::Full,
            head: None,
            storage: StorageSpec::default(),
            tuned: None,
            auto: None,
        }
    }

    /// Parses the grammar above. Pure: a CHAI plan is only named here;
    /// call [`PolicySpec::load_plans`] before building a cache.
    pub fn parse(spec: &str) -> Result<Self, PolicySpecError> {
        Self::parse_with_page(spec, None)
    }

    /// [`PolicySpec::parse`] where `compact=`/`page_score=` without `page=`
    /// get `default_page` (a server whose pool has a page size).
    pub fn parse_with_page(spec: &str, default_page: Option<usize>) -> Result<Self, PolicySpecError> {
        let err = |reason: String| PolicySpecError { spec: spec.to_string(), reason };
        let parts: Vec<&str> = spec.split('+').map(str::trim).collect();
        if parts.len() > 2 {
            return Err(err("at most one `+` (token policy + head policy)".into()));
        }
        if let Some(auto) = parse_auto(parts[0]) {
            if parts.len() > 1 {
                return Err(err("`auto:budget=B` is a whole policy: nothing may follow `+`".into()));
            }
            let budget = auto.map_err(err)?;
            let (token, _) =
                parse_token_policy(&format!("h2o:heavy={},recent={}", half(budget, false), half(budget, true)), None)
                    .map_err(err)?;
            return Ok(PolicySpec { token, auto: Some(budget), ..PolicySpec::full() });
        }
        if let Some(tuned) = parse_tuned(parts[0], default_page) {
            if parts.len() > 1 {
                return Err(err("`tuned:file=FILE` is a whole policy: nothing may follow `+`".into()));
            }
            return Ok(PolicySpec { tuned: Some(tuned.map_err(err)?), ..PolicySpec::full() });
        }
        if let Some(head) = parse_head_policy(parts[0]) {
            if parts.len() > 1 {
                return Err(err("write the token policy first: `h2o:…+chai:…`".into()));
            }
            return Ok(PolicySpec {
                token: TokenPolicySpec::Full,
                head: Some(head.map_err(err)?),
                storage: StorageSpec::default(),
                tuned: None,
                auto: None,
            });
        }
        let (token, storage) = parse_token_policy(parts[0], default_page).map_err(err)?;
        let head = match parts.get(1) {
            None => None,
            Some(extra) => match parse_head_policy(extra) {
                Some(h) => Some(h.map_err(err)?),
                None => return Err(err(format!("`+{extra}`: only a head policy (chai, chai-static) can follow `+`"))),
            },
        };
        let spec = PolicySpec { token, head, storage, tuned: None, auto: None };
        spec.check_alloc().map_err(err)?;
        if spec.head.as_ref().is_some_and(|h| h.drift.is_some()) {
            return Err(err("drift: re-clustering ties KV heads anew, which needs their full slot sets; use `chai:…,drift=T` without a token policy".into()));
        }
        Ok(spec)
    }

    /// The allocator of the token policy (uniform unless `alloc=` is given).
    pub fn alloc(&self) -> Alloc {
        match self.token {
            TokenPolicySpec::H2o { alloc, .. } => alloc,
            _ => Alloc::default(),
        }
    }

    /// What an allocator cannot compose with: `ada` gives the KV heads of a
    /// layer different budgets, so it cannot keep heads tied by CHAI
    /// aligned, nor pick whole pages (which it would count against a share
    /// a token at a time).
    pub(super) fn check_alloc(&self) -> Result<(), String> {
        if self.alloc().global {
            if self.head.is_some() {
                return Err("alloc: `global` gives each KV head its own budget and cannot compose with chai (heads tied by a cluster must keep the same slots)".into());
            }
            if self.storage.page_score.is_some() {
                return Err("alloc: `global` keeps tokens, not pages; it does not take page_score".into());
            }
        }
        if self.alloc().ada.is_some() {
            if self.head.is_some() {
                return Err("alloc: `ada` gives each KV head its own budget and cannot compose with chai (heads tied by a cluster must keep the same slots); use `alloc=pyramid`".into());
            }
            if self.storage.page_score.is_some() {
                return Err(
                    "alloc: `ada` evicts token by token within each head's share; it does not take page_score".into()
                );
            }
        }
        Ok(())
    }

    /// The loading step parsing leaves out: reads the file a `tuned:` spec
    /// names and becomes the spec it records, then reads the CHAI plan a
    /// head policy names (nothing for a token policy alone; a loaded plan is
    /// not read again). The error names the file.
    pub fn load_plans(&mut self) -> Result<(), LoadError> {
        if let Some(t) = self.tuned.take() {
            let bad = |reason: String| LoadError::Tuned { path: t.path.clone(), reason };
            let text = read_tuned_spec(&t.path)?;
            let resolved = PolicySpec::parse_with_page(&text, t.default_page).map_err(|e| bad(e.to_string()))?;
            if resolved.tuned.is_some() {
                return Err(bad(format!("records `{text}`, another tune file; record the spec itself")));
            }
            *self = resolved;
        }
        match &mut self.head {
            Some(h) => Ok(h.load_plan()?),
            None => Ok(()),
        }
    }

    /// [`PolicySpec::parse`] then [`PolicySpec::load_plans`]: a spec from
    /// user input, ready to build caches (the CLI's `--policy`).
    pub fn parse_and_load(spec: &str) -> Result<Self, PolicySpecError> {
        Self::parse_and_load_with_page(spec, None)
    }

    /// [`PolicySpec::parse_with_page`] then [`PolicySpec::load_plans`] (a
    /// server request's `kv_policy`); errors quote `spec` and the file.
    pub fn parse_and_load_with_page(spec: &str, default_page: Option<usize>) -> Result<Self, PolicySpecError> {
        let mut p = Self::parse_with_page(spec, default_page)?;
        p.load_plans().map_err(|e| PolicySpecError { spec: spec.to_string(), reason: e.to_string() })?;
        Ok(p)
    }

    /// Total slot budget B for a sequence of `base_len` tokens (`None` for full).
    pub fn budget(&self, base_len: usize) -> Option<usize> {
        let Parts { name, evict, .. } = self.token.parts();
        evict.map(|e| e.resolve(name, base_len).budget)
    }

    /// Instantiates the per-sequence policy state; percentages are resolved
    /// against `base_len` here, once.
    /// One budget for every (layer, KV head): an allocator (`alloc=`) is
    /// left out, since it needs the model's shape; see
    /// [`PolicySpec::build_for`].
    pub fn build(&self, base_len: usize) -> Box<dyn CachePolicy> {
        match self.token_eviction(base_len) {
            None => Box::new(FullCache),
            Some((t, _, _)) => Box::new(t),
        }
    }

    /// [`PolicySpec::build`] for a model of `layers` layers and `kv_heads`
    /// KV heads: with `alloc=`, each layer and head gets its share of the
    /// heavy slots ([`Allocated`]).
    pub fn build_for(&self, base_len: usize, layers: usize, kv_heads: usize) -> Box<dyn CachePolicy> {
        match self.token_eviction(base_len) {
            None => Box::new(FullCache),
            Some((t, heavy, alloc)) if !alloc.is_uniform() => {
                Box::new(Allocated::new(t, heavy, alloc, layers, kv_heads.max(1)))
            }
            Some((t, _, _)) => Box::new(t),
        }
    }

    /// The uniform token policy, its resolved heavy slots and allocator.
    fn token_eviction(&self, base_len: usize) -> Option<(TokenEviction, usize, Alloc)> {
        let Parts { name, evict, .. } = self.token.parts();
        let e = evict?;
        let unit = self.storage.page_score.map_or(EvictionUnit::Token, EvictionUnit::Page);
        let t = TokenEviction::new(e.resolve(name, base_len)).with_unit(unit).with_score(e.score);
        Some((t, e.heavy.resolve(base_len), e.alloc))
    }
}

impl std::str::FromStr for PolicySpec {
    type Err = PolicySpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicySpec::parse(s)
    }
}

impl fmt::Display for HeadSharingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.fixed {
            write!(f, "chai-static:plan={}", self.plan_path)
        } else {
            write!(f, "chai:plan={},probe={},rep={}", self.plan_path, self.probe, self.rep)?;
            match self.drift {
                Some(d) => write!(f, ",drift={}:{}", d.every, d.threshold),
                None => Ok(()),
            }
        }
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(b) = self.auto {
            return write!(f, "auto:budget={b}");
        }
        if let Some(t) = &self.tuned {
            return write!(f, "tuned:file={}", t.path);
        }
        let storage = &self.storage;
        match (&self.token, &self.head, storage.is_default()) {
            (TokenPolicySpec::Full, Some(h), true) => return write!(f, "{h}"),
            (t, _, true) => write!(f, "{t}")?,
            (TokenPolicySpec::Full, _, false) => write!(f, "full:{storage}")?,
            (t, _, false) => write!(f, "{t},{storage}")?,
        }
        match &self.head {
            Some(h) => write!(f, "+{h}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for TokenPolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Parts { name, shown, .. } = self.parts();
        f.write_str(name)?;
        for (i, (k, v)) in shown.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { ':' } else { ',' })?;
        }
        Ok(())
    }
}
