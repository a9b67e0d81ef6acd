//! The policy-spec grammar, shared by the CLI, the server, evaluation and
//! config files:
//!
//! ```text
//! full
//! window:recent=N                      recent tokens only ("local")
//! sink:sink=S,recent=N                 StreamingLLM: first S positions + window
//! heavy:heavy=N                        heavy hitters only, no window
//! random:budget=N[,recent=R][,seed=S]  seeded random victims, window protected
//! h2o:heavy=N,recent=M[,agg=sum|max][,prefill=full|stream:C]
//! chai:plan=FILE[,probe=5][,rep=first|medoid]   CHAI head sharing (online clusters)
//! chai-static:plan=FILE                          CHAI with the plan's fixed membership
//! TOKEN+chai:…                                   token eviction composed with head sharing
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

use super::chai::{ChaiPlan, HeadSharingSpec, RepRule};
use super::token::{EvictionUnit, PageScore, TokenEviction, VictimRule};
use super::{CachePolicy, FullCache, ScoreAgg};
use crate::store::StoreLayout;
use kvslim_kernels::kvquant::KvDtype;
use std::fmt;
use std::sync::Arc;

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

    fn parse(v: &str) -> Result<Budget, String> {
        if let Some(p) = v.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| format!("`{v}` is not a percentage"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(format!("percentage `{v}` must be in (0, 100]"));
            }
            Ok(Budget::Percent(p))
        } else {
            v.trim()
                .parse()
                .map(Budget::Slots)
                .map_err(|_| format!("`{v}` is not a slot count or a percentage like 10%"))
        }
    }

    fn is_zero(self) -> bool {
        self == Budget::Slots(0)
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
}

/// Token-eviction part of a policy.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenPolicySpec {
    Full,
    Window { recent: Budget },
    Sink { sink: Budget, recent: Budget },
    Heavy { heavy: Budget },
    Random { budget: Budget, recent: Budget, seed: u64 },
    H2o { heavy: Budget, recent: Budget, agg: ScoreAgg, prefill: PrefillMode },
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

/// A parsed policy specification: token eviction, optionally composed with
/// CHAI head sharing, and how the K/V are stored.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    pub token: TokenPolicySpec,
    pub head: Option<HeadSharingSpec>,
    pub storage: StorageSpec,
}

/// A policy string that could not be parsed; the message names the problem.
#[derive(Debug, thiserror::Error)]
#[error("invalid policy spec '{spec}': {reason}")]
pub struct PolicySpecError {
    pub spec: String,
    pub reason: String,
}

const KNOWN: &str = "full, window, sink, heavy, random, h2o, chai, chai-static";

/// Parses `chai:…` / `chai-static:…`; `None` when `text` is not a head policy.
fn parse_head_policy(text: &str) -> Option<Result<HeadSharingSpec, String>> {
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
        p.finish(if fixed { "plan" } else { "plan, probe, rep" })?;
        let plan = ChaiPlan::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
        Ok(HeadSharingSpec { plan_path: path.to_string(), plan: Arc::new(plan), probe, rep, fixed })
    })())
}

/// `k=v` pairs of one policy, consumed as they are read so leftovers can be
/// reported as unknown parameters.
struct Params<'a> {
    policy: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn parse(policy: &'a str, args: &'a str) -> Result<Self, String> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for part in args.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("`{part}` is not key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if pairs.iter().any(|(pk, _)| *pk == k) {
                return Err(format!("parameter `{k}` given twice"));
            }
            pairs.push((k, v));
        }
        Ok(Params { policy, pairs })
    }

    fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.pairs.iter().position(|(k, _)| *k == key)?;
        Some(self.pairs.remove(i).1)
    }

    fn budget(&mut self, key: &str) -> Result<Option<Budget>, String> {
        self.take(key).map(|v| Budget::parse(v).map_err(|e| format!("{key}: {e}"))).transpose()
    }

    fn required_budget(&mut self, key: &str) -> Result<Budget, String> {
        self.budget(key)?.ok_or_else(|| format!("`{}` needs `{key}=`", self.policy))
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
    let storage = StorageSpec::take(&mut p, name != "full", default_page)?;
    if storage.page_score.is_some() && matches!(name, "window" | "local" | "sink") {
        return Err(format!(
            "`{name}` protects every slot but the token leaving the window, so there is no page to evict: \
             page_score needs heavy-hitter slots (h2o, heavy, random)"
        ));
    }
    const STORAGE_KEYS: &str = "page, compact, page_score, kv_dtype";
    let spec = match name {
        "full" => {
            p.finish("page, kv_dtype")?;
            TokenPolicySpec::Full
        }
        "window" | "local" => {
            let recent = p.required_budget("recent")?;
            p.finish(&format!("{}, {STORAGE_KEYS}", "recent"))?;
            if recent.is_zero() {
                return Err("window needs recent ≥ 1".into());
            }
            TokenPolicySpec::Window { recent }
        }
        "sink" => {
            let sink = p.required_budget("sink")?;
            let recent = p.required_budget("recent")?;
            p.finish(&format!("{}, {STORAGE_KEYS}", "sink, recent"))?;
            if recent.is_zero() {
                return Err("sink needs recent ≥ 1 (the new token must have a place)".into());
            }
            TokenPolicySpec::Sink { sink, recent }
        }
        "heavy" => {
            let heavy = p.required_budget("heavy")?;
            p.finish(&format!("{}, {STORAGE_KEYS}", "heavy"))?;
            if heavy.is_zero() {
                return Err("heavy needs heavy ≥ 1".into());
            }
            TokenPolicySpec::Heavy { heavy }
        }
        "random" => {
            let budget = p.required_budget("budget")?;
            let recent = p.budget("recent")?.unwrap_or(Budget::Slots(0));
            let seed = match p.take("seed") {
                Some(s) => s.parse().map_err(|_| format!("seed: `{s}` is not an unsigned integer"))?,
                None => 0,
            };
            p.finish(&format!("{}, {STORAGE_KEYS}", "budget, recent, seed"))?;
            if budget.is_zero() {
                return Err("random needs budget ≥ 1".into());
            }
            if let (Budget::Slots(b), Budget::Slots(r)) = (budget, recent) {
                if r >= b {
                    return Err(format!("random: recent ({r}) must be smaller than budget ({b})"));
                }
            }
            TokenPolicySpec::Random { budget, recent, seed }
        }
        "h2o" => {
            let heavy = p.required_budget("heavy")?;
            let recent = p.required_budget("recent")?;
            let agg = match p.take("agg") {
                None | Some("sum") => ScoreAgg::Sum,
                Some("max") => ScoreAgg::Max,
                Some(o) => return Err(format!("agg: `{o}` is not `sum` or `max`")),
            };
            let prefill = match p.take("prefill") {
                None | Some("full") => PrefillMode::Full,
                Some(s) => match s.strip_prefix("stream:").map(str::parse::<usize>) {
                    Some(Ok(c)) if c > 0 => PrefillMode::Stream(c),
                    _ => return Err(format!("prefill: `{s}` is not `full` or `stream:C` with C ≥ 1")),
                },
            };
            p.finish(&format!("{}, {STORAGE_KEYS}", "heavy, recent, agg, prefill"))?;
            if heavy.is_zero() && recent.is_zero() {
                return Err("h2o needs heavy + recent ≥ 1".into());
            }
            TokenPolicySpec::H2o { heavy, recent, agg, prefill }
        }
        "" => return Err(format!("empty policy name; known policies: {KNOWN}")),
        other => return Err(format!("unknown policy `{other}`; known policies: {KNOWN}")),
    };
    Ok((spec, storage))
}

impl PolicySpec {
    /// The default: keep every token.
    pub fn full() -> Self {
        PolicySpec { token: TokenPolicySpec::Full, head: None, storage: StorageSpec::default() }
    }

    /// Parses the grammar above.
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
        if let Some(head) = parse_head_policy(parts[0]) {
            if parts.len() > 1 {
                return Err(err("write the token policy first: `h2o:…+chai:…`".into()));
            }
            return Ok(PolicySpec {
                token: TokenPolicySpec::Full,
                head: Some(head.map_err(err)?),
                storage: StorageSpec::default(),
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
        Ok(PolicySpec { token, head, storage })
    }

    /// Total slot budget B for a sequence of `base_len` tokens (`None` for full).
    pub fn budget(&self, base_len: usize) -> Option<usize> {
        use TokenPolicySpec::*;
        Some(match self.token {
            Full => return None,
            Window { recent } => recent.resolve(base_len),
            Sink { sink, recent } => sink.resolve(base_len) + recent.resolve(base_len),
            Heavy { heavy } => heavy.resolve(base_len),
            Random { budget, .. } => budget.resolve(base_len),
            H2o { heavy, recent, .. } => heavy.resolve(base_len) + recent.resolve(base_len),
        })
    }

    /// Instantiates the per-sequence policy state; percentages are resolved
    /// against `base_len` here, once.
    pub fn build(&self, base_len: usize) -> Box<dyn CachePolicy> {
        use TokenPolicySpec::*;
        let r = |b: Budget| b.resolve(base_len);
        let unit = self.storage.page_score.map_or(EvictionUnit::Token, EvictionUnit::Page);
        let token = |t: TokenEviction| -> Box<dyn CachePolicy> { Box::new(t.with_unit(unit)) };
        match self.token {
            Full => Box::new(FullCache),
            Window { recent } => {
                token(TokenEviction::new("window", r(recent), r(recent), 0, VictimRule::Oldest, None, None))
            }
            Sink { sink, recent } => token(TokenEviction::new(
                "sink",
                r(sink) + r(recent),
                r(recent),
                r(sink),
                VictimRule::Oldest,
                None,
                None,
            )),
            Heavy { heavy } => {
                token(TokenEviction::new("heavy", r(heavy), 0, 0, VictimRule::LowestScore, Some(ScoreAgg::Sum), None))
            }
            Random { budget, recent, seed } => {
                let (b, rr) = (r(budget), r(recent).min(r(budget).saturating_sub(1)));
                token(TokenEviction::new("random", b, rr, 0, VictimRule::Random { seed }, None, None))
            }
            H2o { heavy, recent, agg, prefill } => token(TokenEviction::new(
                "h2o",
                r(heavy) + r(recent),
                r(recent),
                0,
                VictimRule::LowestScore,
                Some(agg),
                match prefill {
                    PrefillMode::Full => None,
                    PrefillMode::Stream(c) => Some(c),
                },
            )),
        }
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
            write!(f, "chai:plan={},probe={},rep={}", self.plan_path, self.probe, self.rep)
        }
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        use TokenPolicySpec::*;
        match self {
            Full => f.write_str("full"),
            Window { recent } => write!(f, "window:recent={recent}"),
            Sink { sink, recent } => write!(f, "sink:sink={sink},recent={recent}"),
            Heavy { heavy } => write!(f, "heavy:heavy={heavy}"),
            Random { budget, recent, seed } => write!(f, "random:budget={budget},recent={recent},seed={seed}"),
            H2o { heavy, recent, agg, prefill } => {
                write!(f, "h2o:heavy={heavy},recent={recent}")?;
                if *agg == ScoreAgg::Max {
                    f.write_str(",agg=max")?;
                }
                if let PrefillMode::Stream(c) = prefill {
                    write!(f, ",prefill=stream:{c}")?;
                }
                Ok(())
            }
        }
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
            "full:page=16,kv_dtype=q8",
            "h2o:heavy=32,recent=32,page=8,compact=64,kv_dtype=q4",
            "random:budget=64,recent=16,seed=7,page=16,page_score=topm:4",
            "h2o:heavy=32,recent=32,page=32,page_score=max,kv_dtype=f16",
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
            ("h2o:heavy=1,heavy=2,recent=1", "given twice"),
            ("h2o:heavy=0,recent=0", "≥ 1"),
            ("random:budget=8,recent=8", "smaller than budget"),
            ("window:recent", "not key=value"),
            ("", "empty policy name"),
            ("h2o:heavy=1,recent=1+foo", "only a head policy"),
            ("chai:probe=5", "needs `plan=FILE`"),
            ("chai:plan=/no/such/plan.json", "/no/such/plan.json"),
            ("chai-static:plan=x.json,probe=5", "no probe"),
            ("h2o:heavy=1,recent=1,compact=8", "need a paged store"),
            ("h2o:heavy=1,recent=1,page=0", "page: `0`"),
            ("h2o:heavy=1,recent=1,page=8,compact=8,page_score=sum", "choose one"),
            ("h2o:heavy=1,recent=1,page=8,page_score=mean", "page_score"),
            ("h2o:heavy=1,recent=1,kv_dtype=q3", "kv_dtype"),
            ("full:page=8,compact=4", "only apply to a policy that evicts"),
            ("sink:sink=4,recent=60,page=16,page_score=sum", "no page to evict"),
            ("chai:plan=x.json+h2o:heavy=1,recent=1", "token policy first"),
        ];
        for (spec, want) in cases {
            let e = PolicySpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec:?}: {e}");
        }
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
