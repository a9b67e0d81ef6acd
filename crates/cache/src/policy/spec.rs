//! The policy-spec grammar, shared by the CLI, the server, evaluation and
//! config files:
//!
//! ```text
//! full
//! window:recent=N                      recent tokens only ("local")
//! sink:sink=S,recent=N                 StreamingLLM: first S positions + window
//! heavy:heavy=N[,score=R]              heavy hitters only, no window
//! random:budget=N[,recent=R][,seed=S]  seeded random victims, window protected
//! h2o:heavy=N,recent=M[,agg=sum|max][,prefill=full|stream:C|snap:W[:K]|expect[:F]][,score=R][,alloc=A]
//! ```
//!
//! `alloc=A` spreads h2o's heavy slots over layers and KV heads under the
//! same total (see [`super::alloc`]): `pyramid[:R]` (PyramidKV: the top
//! layer gets R times the bottom layer's heavy slots, an arithmetic series
//! between), `ada[:F]` (AdaKV: a layer's heavy slots go to the heads whose
//! prompt attention needs them, each keeping at least ⌊F · heavy⌋), or
//! `pyramid[:R]/ada[:F]`.
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
//! entry in `FAMILIES` (names, keys, how they are read with their defaults
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

/// How H2O treats a prompt longer than its budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillMode {
    /// Full causal attention over the prompt, then keep recent + top heavy.
    Full,
    /// Chunks of C tokens, eviction after each chunk.
    Stream(usize),
    /// SnapKV: one chunk; only the last `window` prompt queries score the
    /// prompt's tokens (an observation window), the scores max-pooled over
    /// `pool` neighbouring positions, then keep recent + top heavy.
    Snap { window: usize, pool: usize },
    /// Expected attention: one chunk; every prompt token scored by the
    /// attention the prompt's query distribution would pay it over the
    /// next `future` positions (query-agnostic), then keep recent + top heavy.
    Expect { future: usize },
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
        let mut parts = Vec::new();
        if let Some(p) = self.page_size {
            parts.push(format!("page={p}"));
        }
        if let Some(n) = self.compact_every {
            parts.push(format!("compact={n}"));
        }
        if let Some(s) = self.page_score {
            parts.push(format!("page_score={s}"));
        }
        if self.kv_dtype != KvDtype::F32 {
            parts.push(format!("kv_dtype={}", self.kv_dtype));
        }
        f.write_str(&parts.join(","))
    }
}

/// A budget of B slots handed to a family's reader instead of its budget
/// keys (a budget family, see [`super::budget::PolicyFamily`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Spend {
    /// B, at least 1.
    pub b: usize,
    /// The family's absolute slot count that does not follow B (`sink`'s
    /// S, see [`Family::fixed`]); unused by other families.
    pub fixed: usize,
}

/// Everything the grammar knows about one token family, so a new family is
/// one entry here, one variant of [`TokenPolicySpec`] and one arm of
/// `TokenPolicySpec::parts`.
#[derive(Debug)]
pub(super) struct Family {
    /// The name `Display` writes, then accepted aliases.
    pub names: &'static [&'static str],
    /// The family's own keys (storage keys come on top).
    keys: &'static [&'static str],
    /// The keys a budget family fills from B (so they must not be written).
    pub budget_keys: &'static [&'static str],
    /// A key only a budget family takes: an absolute slot count that stays
    /// put while B follows the sequence, and its default (`sink`: S = 4).
    pub fixed: Option<(&'static str, usize)>,
    /// False for `full`: no eviction, so no `compact` or `page_score`.
    evicts: bool,
    /// Every slot but the token leaving the window is protected, so page
    /// eviction would have no page to pick.
    protects_all: bool,
    /// Reads the family's keys, their defaults and checks. With a
    /// [`Spend`], the budget keys are not read but are B's split: the one
    /// place the family's budget substitution is written.
    read: fn(&mut Params<'_>, Option<Spend>) -> Result<TokenPolicySpec, String>,
}

/// The token families, in the order error messages list them.
pub(super) static FAMILIES: &[Family] = &[
    Family {
        names: &["full"],
        keys: &[],
        budget_keys: &[],
        fixed: None,
        evicts: false,
        protects_all: false,
        read: |_, _| Ok(TokenPolicySpec::Full),
    },
    Family {
        names: &["window", "local"],
        keys: &["recent", "sink"],
        budget_keys: &["recent"],
        fixed: None,
        evicts: true,
        protects_all: true,
        read: |p, at| {
            let (sink, at) = p.sinks(at)?;
            Ok(TokenPolicySpec::Window { recent: p.all_of_b("recent", at, "window needs recent ≥ 1")?, sink })
        },
    },
    Family {
        names: &["sink"],
        keys: &["sink", "recent"],
        budget_keys: &["recent"],
        fixed: Some(("sink", 4)),
        evicts: true,
        protects_all: true,
        read: |p, at| {
            // S sinks (at most B − 1, so the new token has a place), the rest recent
            let split = at.map(|a| (a.fixed.min(a.b - 1), a.b - a.fixed.min(a.b - 1)));
            let sink = p.budget_or("sink", split.map(|s| s.0))?;
            let recent = p.budget_or("recent", split.map(|s| s.1))?;
            nonzero(recent, "sink needs recent ≥ 1 (the new token must have a place)")?;
            Ok(TokenPolicySpec::Sink { sink, recent })
        },
    },
    Family {
        names: &["heavy"],
        keys: &["heavy", "sink", "score"],
        budget_keys: &["heavy"],
        fixed: None,
        evicts: true,
        protects_all: false,
        read: |p, at| {
            let (sink, at) = p.sinks(at)?;
            let heavy = p.all_of_b("heavy", at, "heavy needs heavy ≥ 1")?;
            Ok(TokenPolicySpec::Heavy { heavy, sink, score: p.score()? })
        },
    },
    Family {
        names: &["random"],
        keys: &["budget", "recent", "seed", "sink"],
        budget_keys: &["budget", "recent"],
        fixed: None,
        evicts: true,
        protects_all: false,
        read: |p, at| {
            let (sink, at) = p.sinks(at)?;
            let budget = p.all_of_b("budget", at, "random needs budget ≥ 1")?;
            let recent = match at {
                Some(a) => Budget::Slots(a.b / 2),
                None => p.budget("recent")?.unwrap_or(Budget::Slots(0)),
            };
            let seed = match p.take("seed") {
                Some(s) => s.parse().map_err(|_| format!("seed: `{s}` is not an unsigned integer"))?,
                None => 0,
            };
            if let (Budget::Slots(b), Budget::Slots(r)) = (budget, recent) {
                if r >= b {
                    return Err(format!("random: recent ({r}) must be smaller than budget ({b})"));
                }
            }
            Ok(TokenPolicySpec::Random { budget, recent, seed, sink })
        },
    },
    Family {
        names: &["h2o"],
        keys: &["heavy", "recent", "agg", "prefill", "sink", "score", "alloc"],
        budget_keys: &["heavy", "recent"],
        fixed: None,
        evicts: true,
        protects_all: false,
        read: |p, at| {
            let (sink, at) = p.sinks(at)?;
            // half heavy, half recent, as the H2O paper
            let heavy = p.budget_or("heavy", at.map(|a| a.b - a.b / 2))?;
            let recent = p.budget_or("recent", at.map(|a| a.b / 2))?;
            let agg = match p.take("agg") {
                None | Some("sum") => ScoreAgg::Sum,
                Some("max") => ScoreAgg::Max,
                Some(o) => return Err(format!("agg: `{o}` is not `sum` or `max`")),
            };
            let prefill = match p.take("prefill") {
                None | Some("full") => PrefillMode::Full,
                Some(s) => parse_prefill(s)?,
            };
            if heavy.is_zero() && recent.is_zero() {
                return Err("h2o needs heavy + recent ≥ 1".into());
            }
            let score = p.score()?;
            if matches!(prefill, PrefillMode::Snap { .. }) && !score.column_summable() {
                return Err(format!("prefill=snap sums the observation window's attention; it needs score=sum or score=norm, not score={score}"));
            }
            if matches!(prefill, PrefillMode::Expect { .. }) && !score.column_summable() {
                return Err(format!("prefill=expect scores the prompt once, then decode steps add attention; it needs score=sum or score=norm, not score={score}"));
            }
            let alloc = match p.take("alloc") {
                None => Alloc::default(),
                Some(v) => v.parse().map_err(|e| format!("alloc: {e}"))?,
            };
            Ok(TokenPolicySpec::H2o { heavy, recent, agg, prefill, sink, score, alloc })
        },
    },
];

/// `stream:C`, `snap:W[:K]` (K odd, default 7: SnapKV's pooling kernel)
/// or `expect[:F]` (F future positions, default 512 as kvpress).
fn parse_prefill(s: &str) -> Result<PrefillMode, String> {
    let bad = || {
        format!("prefill: `{s}` is not `full`, `stream:C` (C ≥ 1), `snap:W[:K]` (W ≥ 1, K odd) or `expect[:F]` (F ≥ 1)")
    };
    if s == "expect" {
        return Ok(PrefillMode::Expect { future: 512 });
    }
    if let Some(f) = s.strip_prefix("expect:") {
        return match f.parse::<usize>() {
            Ok(f) if f > 0 => Ok(PrefillMode::Expect { future: f }),
            _ => Err(bad()),
        };
    }
    if let Some(c) = s.strip_prefix("stream:") {
        return match c.parse::<usize>() {
            Ok(c) if c > 0 => Ok(PrefillMode::Stream(c)),
            _ => Err(bad()),
        };
    }
    let rest = s.strip_prefix("snap:").ok_or_else(bad)?;
    let (w, k) = match rest.split_once(':') {
        Some((w, k)) => (w.parse::<usize>().map_err(|_| bad())?, k.parse::<usize>().map_err(|_| bad())?),
        None => (rest.parse::<usize>().map_err(|_| bad())?, 7),
    };
    if w == 0 || k % 2 == 0 {
        return Err(bad());
    }
    Ok(PrefillMode::Snap { window: w, pool: k })
}

fn nonzero(b: Budget, why: &str) -> Result<(), String> {
    if b.is_zero() {
        Err(why.to_string())
    } else {
        Ok(())
    }
}

const HEAD_POLICIES: &str = "chai, chai-static, tuned";
const STORAGE_KEYS: [&str; 4] = ["page", "compact", "page_score", "kv_dtype"];

impl Family {
    /// The family called `name` (or an alias); the error lists the known ones.
    pub(super) fn named(name: &str) -> Result<&'static Family, String> {
        let known = || FAMILIES.iter().map(|f| f.names[0]).chain([HEAD_POLICIES]).collect::<Vec<_>>().join(", ");
        match name {
            "" => Err(format!("empty policy name; known policies: {}", known())),
            _ => FAMILIES
                .iter()
                .find(|f| f.names.contains(&name))
                .ok_or_else(|| format!("unknown policy `{name}`; known policies: {}", known())),
        }
    }

    /// Reads a token policy from its parameters (`at`: a budget family
    /// spending B slots): storage keys, then the family's own keys.
    pub(super) fn spec(
        &self,
        p: &mut Params<'_>,
        at: Option<Spend>,
        default_page: Option<usize>,
    ) -> Result<(TokenPolicySpec, StorageSpec), String> {
        let storage = StorageSpec::take(p, self.evicts, default_page)?;
        if storage.page_score.is_some() && self.protects_all {
            return Err(format!(
                "`{}` protects every slot but the token leaving the window, so there is no page to evict: \
                 page_score needs heavy-hitter slots (h2o, heavy, random)",
                p.policy
            ));
        }
        if let Some((k, _)) = p.pairs.iter().find(|(k, _)| !self.keys.contains(k)) {
            let allowed = match self.evicts {
                true => self.keys.iter().chain(&STORAGE_KEYS).copied().collect::<Vec<_>>().join(", "),
                false => "page, kv_dtype".to_string(),
            };
            return Err(format!("unknown parameter `{k}` for `{}` (allowed: {allowed})", p.policy));
        }
        Ok(((self.read)(p, at)?, storage))
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

/// Parses `tuned:file=FILE`; `None` when `text` is not a tuned policy.
/// Reads no file.
fn parse_tuned(text: &str, default_page: Option<usize>) -> Option<Result<TunedRef, String>> {
    let (name, args) = text.split_once(':').unwrap_or((text, ""));
    if name.trim() != "tuned" {
        return None;
    }
    Some((|| {
        let mut p = Params::parse("tuned", args)?;
        let path = p.take("file").ok_or("`tuned` needs `file=FILE` (written by `kvslim tune --out`)")?;
        p.finish("file")?;
        Ok(TunedRef { path: path.to_string(), default_page })
    })())
}

/// `k=v` pairs of one policy, consumed as they are read so leftovers can be
/// reported as unknown parameters.
pub(super) struct Params<'a> {
    /// The policy's name as written, for messages.
    pub policy: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    /// Splits `k=v,k=v` (empty parts skipped).
    pub(super) fn parse(policy: &'a str, args: &'a str) -> Result<Self, String> {
        Self::from_parts(policy, args.split(',').map(str::trim).filter(|p| !p.is_empty()))
    }

    /// From `k=v` parts already split; a key may appear once.
    pub(super) fn from_parts(policy: &'a str, parts: impl Iterator<Item = &'a str>) -> Result<Self, String> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for part in parts {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("`{part}` is not key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if pairs.iter().any(|(pk, _)| *pk == k) {
                return Err(format!("parameter `{k}` given twice"));
            }
            pairs.push((k, v));
        }
        Ok(Params { policy, pairs })
    }

    pub(super) fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.pairs.iter().position(|(k, _)| *k == key)?;
        Some(self.pairs.remove(i).1)
    }

    fn budget(&mut self, key: &str) -> Result<Option<Budget>, String> {
        self.take(key).map(|v| v.parse::<Budget>().map_err(|e| format!("{key}: {e}"))).transpose()
    }

    /// The required budget key `key`, or `share` slots of a budget family's
    /// B (then the key is not read).
    fn budget_or(&mut self, key: &str, share: Option<usize>) -> Result<Budget, String> {
        match share {
            Some(n) => Ok(Budget::Slots(n)),
            None => self.budget(key)?.ok_or_else(|| format!("`{}` needs `{key}=`", self.policy)),
        }
    }

    /// The one budget key of a family that B fills whole (`window`'s
    /// recent, `heavy`, `random`'s budget), at least one slot (`why`).
    fn all_of_b(&mut self, key: &str, at: Option<Spend>, why: &str) -> Result<Budget, String> {
        let b = self.budget_or(key, at.map(|a| a.b))?;
        nonzero(b, why)?;
        Ok(b)
    }

    /// The `sink=S` every evicting family accepts (0 when absent), and the
    /// budget family's spend left for the family's own keys: S slots of B
    /// (at most B − 1, so the rest keeps at least one slot) go to the sinks.
    fn sinks(&mut self, at: Option<Spend>) -> Result<(Budget, Option<Spend>), String> {
        let sink = self.budget("sink")?.unwrap_or(Budget::Slots(0));
        match (at, sink) {
            (None, _) => Ok((sink, None)),
            (Some(a), Budget::Slots(s)) => {
                let s = s.min(a.b - 1);
                Ok((Budget::Slots(s), Some(Spend { b: a.b - s, ..a })))
            }
            (Some(_), Budget::Percent(_)) => {
                Err("sink: a budget family needs a slot count (the budget is split per sequence)".into())
            }
        }
    }

    /// The `score=` family of `h2o` and `heavy` ([`ScoreRule`]; `sum` when absent).
    fn score(&mut self) -> Result<ScoreRule, String> {
        match self.take("score") {
            None => Ok(ScoreRule::Sum),
            Some(v) => v.parse().map_err(|e| format!("score: {e}")),
        }
    }

    fn finish(self, allowed: &str) -> Result<(), String> {
        match self.pairs.first() {
            Some((k, _)) => Err(format!("unknown parameter `{k}` for `{}` (allowed: {allowed})", self.policy)),
            None => Ok(()),
        }
    }
}

fn parse_token_policy(text: &str, default_page: Option<usize>) -> Result<(TokenPolicySpec, StorageSpec), String> {
    let (name, args) = text.split_once(':').unwrap_or((text, ""));
    let name = name.trim();
    let mut p = Params::parse(name, args)?;
    Family::named(name)?.spec(&mut p, None, default_page)
}

impl PolicySpec {
    /// The default: keep every token.
    pub fn full() -> Self {
        PolicySpec { token: TokenPolicySpec::Full, head: None, storage: StorageSpec::default(), tuned: None }
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
        let spec = PolicySpec { token, head, storage, tuned: None };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_policy_and_round_trips() {
        for s in [
            "full",
            "window:recent=64",
            "sink:sink=4,recent=60",
            "heavy:heavy=32",
            "random:budget=64,recent=16,seed=7",
            "h2o:heavy=32,recent=32",
            "h2o:heavy=10%,recent=10%,agg=max,prefill=stream:16",
            "h2o:heavy=10%,recent=10%,prefill=snap:32:7",
            "h2o:heavy=8,recent=8,prefill=snap:16:1,score=norm",
            "full:page=16,kv_dtype=q8",
            "h2o:heavy=32,recent=32,page=8,compact=64,kv_dtype=q4",
            "random:budget=64,recent=16,seed=7,page=16,page_score=topm:4",
            "h2o:heavy=32,recent=32,page=32,page_score=max,kv_dtype=f16",
            "h2o:heavy=32,recent=32,score=norm",
            "h2o:heavy=32,recent=32,score=decay:0.9",
            "h2o:heavy=32,recent=32,agg=max,score=tova",
            "h2o:heavy=32,recent=32,score=vnorm,page=16",
            "h2o:heavy=32,recent=32,score=persist:16",
            "h2o:heavy=10%,recent=10%,sink=4,score=persist:8:0.5",
            "heavy:heavy=32,sink=2,score=tova",
            "window:recent=60,sink=4",
            "random:budget=64,recent=16,seed=7,sink=4",
            "h2o:heavy=8,recent=8,sink=4,score=decay:0.5+chai:plan=p.json",
            "h2o:heavy=32,recent=32,alloc=pyramid:0.5",
            "h2o:heavy=10%,recent=10%,score=norm,alloc=ada:0.2",
            "h2o:heavy=32,recent=32,alloc=pyramid:0.25/ada:0",
            "h2o:heavy=32,recent=32,page=16,alloc=ada:0.2",
            "h2o:heavy=8,recent=8,alloc=pyramid:0.5+chai:plan=p.json",
            "chai:plan=p.json,probe=5,rep=first,drift=64:0.5",
        ] {
            let p = PolicySpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(PolicySpec::parse(&p.to_string()).unwrap(), p, "{s}");
        }
        assert_eq!(PolicySpec::parse(" full ").unwrap(), PolicySpec::full());
    }

    #[test]
    fn percentages_resolve_once_against_the_base_length() {
        let p = PolicySpec::parse("h2o:heavy=10%,recent=10%").unwrap();
        assert_eq!(p.budget(1000), Some(200)); // 20% total, not 20% extra heavy
        assert_eq!(p.build(1000).capacity(5000), 201);
        assert_eq!(PolicySpec::parse("window:recent=1%").unwrap().budget(10), Some(1));
    }

    #[test]
    fn bad_specs_name_the_problem() {
        let cases = [
            ("fancy:x=1", "unknown policy `fancy`"),
            ("full:x=1", "unknown parameter `x`"),
            ("h2o:heavy=32", "needs `recent=`"),
            ("h2o:heavy=32,recent=x", "not a slot count"),
            ("h2o:heavy=32,recent=0%", "must be in (0, 100]"),
            ("h2o:heavy=1,recent=1,agg=mean", "agg"),
            ("h2o:heavy=1,recent=1,prefill=stream:0", "prefill"),
            ("h2o:heavy=1,recent=1,prefill=snap:0", "snap:W[:K]"),
            ("h2o:heavy=1,recent=1,prefill=snap:8:4", "K odd"),
            ("h2o:heavy=1,recent=1,prefill=snap:8,score=tova", "needs score=sum or score=norm"),
            ("h2o:heavy=1,heavy=2,recent=1", "given twice"),
            ("h2o:heavy=0,recent=0", "≥ 1"),
            ("random:budget=8,recent=8", "smaller than budget"),
            ("window:recent", "not key=value"),
            ("", "empty policy name"),
            ("h2o:heavy=1,recent=1+foo", "only a head policy"),
            ("chai:probe=5", "needs `plan=FILE`"),
            ("chai-static:plan=x.json,probe=5", "no probe"),
            ("chai:plan=x.json,drift=0", "drift: `0` is not a check interval"),
            ("chai:plan=x.json,drift=8:3", "drift: threshold `3`"),
            ("chai-static:plan=x.json,drift=8", "chai-static keeps its membership"),
            ("h2o:heavy=1,recent=1+chai:plan=x.json,drift=8", "drift: re-clustering"),
            ("h2o:heavy=1,recent=1,compact=8", "need a paged store"),
            ("h2o:heavy=1,recent=1,page=0", "page: `0`"),
            ("h2o:heavy=1,recent=1,page=8,compact=8,page_score=sum", "choose one"),
            ("h2o:heavy=1,recent=1,page=8,page_score=mean", "page_score"),
            ("h2o:heavy=1,recent=1,kv_dtype=q3", "kv_dtype"),
            ("full:page=8,compact=4", "only apply to a policy that evicts"),
            ("sink:sink=4,recent=60,page=16,page_score=sum", "no page to evict"),
            ("chai:plan=x.json+h2o:heavy=1,recent=1", "token policy first"),
            ("h2o:heavy=1,recent=1,score=decay:-0.5", "score: decay: `-0.5` is not a factor in [0, 1]"),
            ("h2o:heavy=1,recent=1,score=fancy", "score: unknown score family `fancy`"),
            ("heavy:heavy=1,score=persist:30", "score: persist: window `30`"),
            ("h2o:heavy=1,recent=1,sink=x", "sink: `x`"),
            ("window:recent=4,score=tova", "unknown parameter `score`"),
            ("random:budget=4,score=tova", "unknown parameter `score`"),
            ("h2o:heavy=1,recent=1,alloc=pyramid:0", "alloc: pyramid ratio `0` must be in (0, 1]"),
            ("h2o:heavy=1,recent=1,alloc=ada:2", "alloc: ada floor `2` must be in [0, 1]"),
            ("h2o:heavy=1,recent=1,alloc=fancy", "alloc: unknown allocator `fancy`"),
            ("h2o:heavy=1,recent=1,alloc=ada+chai:plan=p.json", "cannot compose with chai"),
            ("h2o:heavy=1,recent=1,page=8,page_score=max,alloc=ada", "does not take page_score"),
            ("heavy:heavy=4,alloc=pyramid", "unknown parameter `alloc`"),
            ("window:recent=4,alloc=ada", "unknown parameter `alloc`"),
        ];
        for (spec, want) in cases {
            let e = PolicySpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec:?}: {e}");
        }
    }

    #[test]
    fn parsing_reads_no_file_and_loading_names_it() {
        let text = "h2o:heavy=1,recent=1+chai:plan=/no/such/plan.json";
        let mut p = PolicySpec::parse(text).unwrap();
        assert!(p.head.as_ref().is_some_and(|h| h.plan.is_none()));
        assert_eq!(PolicySpec::parse(&p.to_string()).unwrap(), p, "round-trips unloaded");
        let e = p.load_plans().unwrap_err().to_string();
        assert!(e.contains("/no/such/plan.json"), "{e}");
        let e = PolicySpec::parse_and_load(text).unwrap_err().to_string();
        assert!(e.contains(text) && e.contains("cannot read"), "{e}");
        // a spec that skipped loading is refused where a cache would use it
        let h = PolicySpec::parse("chai:plan=/no/such/plan.json").unwrap().head.unwrap();
        let e = crate::policy::chai::HeadSharing::new(h, 2, 4, 2).err().unwrap();
        assert!(e.contains("/no/such/plan.json") && e.contains("not loaded"), "{e}");
        // a bad plan file is named too
        let bad = std::env::temp_dir().join(format!("kvslim-spec-bad-plan-{}.json", std::process::id()));
        std::fs::write(&bad, "{not json").unwrap();
        let e = PolicySpec::parse_and_load(&format!("chai-static:plan={}", bad.display())).unwrap_err().to_string();
        assert!(e.contains(&bad.display().to_string()) && e.contains("invalid JSON"), "{e}");
        std::fs::remove_file(&bad).unwrap();
    }

    #[test]
    fn eviction_configs_are_what_each_family_means() {
        let cfg = |s: &str| {
            let t = PolicySpec::parse(s).unwrap().token;
            let Parts { name, evict, .. } = t.parts();
            evict.map(|e| e.resolve(name, 1000))
        };
        assert_eq!(cfg("full"), None);
        let c = cfg("sink:sink=4,recent=60").unwrap();
        assert_eq!((c.name, c.budget, c.recent, c.sinks, c.rule), ("sink", 64, 60, 4, VictimRule::Oldest));
        let c = cfg("random:budget=8,recent=50%,seed=3").unwrap();
        assert_eq!((c.budget, c.recent, c.rule), (8, 7, VictimRule::Random { seed: 3 }), "B_r < B");
        let c = cfg("h2o:heavy=10%,recent=5,agg=max,prefill=stream:16").unwrap();
        assert_eq!((c.budget, c.recent, c.agg, c.prefill_chunk), (105, 5, Some(ScoreAgg::Max), Some(16)));
        let c = cfg("heavy:heavy=32").unwrap();
        assert_eq!((c.budget, c.recent, c.rule, c.agg), (32, 0, VictimRule::LowestScore, Some(ScoreAgg::Sum)));
        // sinks are extra slots protecting the first positions, in every family
        for (spec, budget, recent) in [
            ("window:recent=60,sink=4", 64, 60),
            ("heavy:heavy=30,sink=4", 34, 0),
            ("random:budget=60,recent=20,sink=4", 64, 20),
            ("h2o:heavy=30,recent=30,sink=4", 64, 30),
        ] {
            let c = cfg(spec).unwrap();
            assert_eq!((c.budget, c.recent, c.sinks), (budget, recent, 4), "{spec}");
        }
        // the score family reaches the built policy; `sum` is today's H2O
        let rule = |s: &str| PolicySpec::parse(s).unwrap().build(1000).score_rule();
        assert_eq!(rule("h2o:heavy=4,recent=4"), ScoreRule::Sum);
        assert_eq!(rule("h2o:heavy=4,recent=4,score=sum"), ScoreRule::Sum);
        assert_eq!(rule("h2o:heavy=4,recent=4,score=decay:0.25"), ScoreRule::Decay(0.25));
        assert_eq!(rule("heavy:heavy=4,score=persist:12:2"), ScoreRule::Persist { window: 12, threshold: 2.0 });
        assert_eq!(
            PolicySpec::parse("h2o:heavy=4,recent=4,score=sum").unwrap(),
            PolicySpec::parse("h2o:heavy=4,recent=4").unwrap()
        );
    }

    /// Σ over layers and KV heads of the per-head budgets is the plain
    /// spec's; layers (pyramid) and heads (ada) get different shares; the
    /// store is allocated per layer at its own capacity.
    #[test]
    fn allocators_keep_the_total_budget() {
        let (layers, kv) = (30, 3);
        let total = |p: &dyn CachePolicy| -> usize {
            (0..layers).flat_map(|l| (0..kv).map(move |h| (l, h))).map(|(l, h)| p.head_budget(l, h).unwrap()).sum()
        };
        for text in ["h2o:heavy=102,recent=102", "h2o:heavy=10%,recent=10%,sink=4", "h2o:heavy=51,recent=51,agg=max"] {
            let plain = PolicySpec::parse(text).unwrap();
            let b = plain.budget(1024).unwrap();
            for alloc in ["pyramid", "pyramid:0.5", "pyramid:1", "ada", "ada:0", "pyramid:0.1/ada:0.5"] {
                let spec = PolicySpec::parse(&format!("{text},alloc={alloc}")).unwrap();
                assert_eq!(spec.budget(1024), Some(b), "the average per-head budget is unchanged");
                let p = spec.build_for(1024, layers, kv);
                assert_eq!(total(p.as_ref()), b * layers * kv, "{text},alloc={alloc}");
            }
        }
        let spec = PolicySpec::parse("h2o:heavy=100,recent=20,alloc=pyramid:0.25").unwrap();
        let p = spec.build_for(1000, 2, 3);
        assert_eq!((p.head_budget(0, 2), p.head_budget(1, 0)), (Some(180), Some(60)), "160 + 20 and 40 + 20");
        assert_eq!((p.layer_capacity(0, 1000), p.layer_capacity(1, 1000)), (181, 61));
        // ada: each head is allocated for the most it can win, 3·100 − 2·20
        let p = PolicySpec::parse("h2o:heavy=100,recent=20,alloc=ada:0.2").unwrap().build_for(1000, 2, 3);
        assert_eq!(p.layer_capacity(0, 1000), 20 + 260 + 1);
        assert_eq!(p.head_budget(0, 0), Some(120), "the uniform budget until the layer first overflows");
        // without a model shape (`build`), the plain policy
        assert_eq!(spec.build(1000).capacity(1000), 121);
    }

    #[test]
    fn a_default_page_size_serves_compact_and_page_score_only() {
        let p = PolicySpec::parse_with_page("h2o:heavy=1,recent=1,compact=8", Some(16)).unwrap();
        assert_eq!((p.storage.page_size, p.storage.compact_every), (Some(16), Some(8)));
        let p = PolicySpec::parse_with_page("h2o:heavy=1,recent=1,page=4,page_score=max", Some(16)).unwrap();
        assert_eq!(p.storage.page_size, Some(4), "an explicit page wins");
        assert_eq!(PolicySpec::parse_with_page("h2o:heavy=1,recent=1", Some(16)).unwrap().storage.page_size, None);
        assert!(PolicySpec::parse_with_page("h2o:heavy=1,recent=1,compact=8", None).is_err());
    }
}
