//! The token families of the grammar: one entry each in [`FAMILIES`] (names,
//! keys, how they are read with their defaults and checks, and how the
//! family spends a budget of B slots), and the `k=v` reader they share.

use super::{Budget, PrefillMode, StorageSpec, TokenPolicySpec, KVZIP_CHUNK};
use crate::policy::alloc::Alloc;
use crate::policy::{ScoreAgg, ScoreRule};

/// A budget of B slots handed to a family's reader instead of its budget
/// keys (a budget family, see [`super::budget::PolicyFamily`]).
#[derive(Clone, Copy, Debug)]
pub(in crate::policy) struct Spend {
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
pub(in crate::policy) struct Family {
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
pub(in crate::policy) static FAMILIES: &[Family] = &[
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
        keys: &["heavy", "recent", "agg", "prefill", "sink", "score", "alloc", "recent_share"],
        budget_keys: &["heavy", "recent"],
        fixed: None,
        evicts: true,
        protects_all: false,
        read: |p, at| {
            let (sink, at) = p.sinks(at)?;
            // half heavy, half recent, as the H2O paper, unless the family
            // sets the recent window's share (KVzip keeps no window)
            let share = match (p.take("recent_share"), at) {
                (None, _) => None,
                (Some(_), None) => {
                    return Err("recent_share splits a budget family's slots; a spec writes heavy= and recent=".into())
                }
                (Some(v), Some(_)) => match v.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => Some(f),
                    _ => return Err(format!("recent_share: `{v}` is not a share in [0, 1]")),
                },
            };
            let recent_of = |b: usize| share.map_or(b / 2, |f| ((b as f64 * f).round() as usize).min(b));
            let heavy = p.budget_or("heavy", at.map(|a| a.b - recent_of(a.b)))?;
            let recent = p.budget_or("recent", at.map(|a| recent_of(a.b)))?;
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
                return Err(format!("prefill=snap sums the observation window's attention; it needs score=sum, norm or vnorm, not score={score}"));
            }
            let once = match prefill {
                PrefillMode::Expect { .. } => Some("expect"),
                PrefillMode::Kvzip { .. } => Some("kvzip"),
                PrefillMode::Kvzap { .. } => Some("kvzap"),
                PrefillMode::Rkv { .. } => Some("rkv"),
                _ => None,
            };
            if let (Some(mode), false) = (once, matches!(score, ScoreRule::Sum | ScoreRule::Norm)) {
                return Err(format!("prefill={mode} scores the prompt once, then decode steps add attention; it needs score=sum or score=norm, not score={score}"));
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
/// `expect[:F]` (F future positions, default 512 as kvpress), `kvzip[:C]`
/// (the repeat in pieces of C ≥ 1 tokens, default [`KVZIP_CHUNK`]),
/// `kvzap[:FILE]` (a predictor file; without one, the model's own) or
/// `rkv[:P]` (attention-mass share P in (0, 1], default 0.9 as OpenVINO).
fn parse_prefill(s: &str) -> Result<PrefillMode, String> {
    let bad = || {
        format!("prefill: `{s}` is not `full`, `stream:C` (C ≥ 1), `snap:W[:K]` (W ≥ 1, K odd), `expect[:F]` (F ≥ 1), `kvzip[:C]` (C ≥ 1), `kvzap[:FILE]` or `rkv[:P]` (0 < P ≤ 1)")
    };
    if s == "kvzip" {
        return Ok(PrefillMode::Kvzip { chunk: KVZIP_CHUNK });
    }
    if let Some(c) = s.strip_prefix("kvzip:") {
        return match c.parse::<usize>() {
            Ok(chunk) if chunk >= 1 => Ok(PrefillMode::Kvzip { chunk }),
            _ => Err(bad()),
        };
    }
    if s == "kvzap" {
        return Ok(PrefillMode::Kvzap { file: None });
    }
    if let Some(f) = s.strip_prefix("kvzap:") {
        return match f.trim() {
            "" => {
                Err(format!("prefill: `{s}` names no file: write `kvzap` (the model's own predictor) or `kvzap:FILE`"))
            }
            f => Ok(PrefillMode::Kvzap { file: Some(intern(f)) }),
        };
    }
    if s == "rkv" {
        return Ok(PrefillMode::Rkv { mass_permille: 900 });
    }
    if let Some(p) = s.strip_prefix("rkv:") {
        return match p.parse::<f64>() {
            // thousandths, so the spec stays exact and comparable
            Ok(p) if p > 0.0 && p <= 1.0 && (p * 1000.0 - (p * 1000.0).round()).abs() < 1e-6 => {
                Ok(PrefillMode::Rkv { mass_permille: (p * 1000.0).round() as u16 })
            }
            _ => Err(bad()),
        };
    }
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

/// A predictor path as a `&'static str`, so [`PrefillMode`] stays `Copy`:
/// each distinct path is leaked once and reused (a server parsing the same
/// spec per request allocates nothing more).
fn intern(path: &str) -> &'static str {
    static PATHS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut paths = PATHS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&p) = paths.iter().find(|&&p| p == path) {
        return p;
    }
    let p: &'static str = Box::leak(path.to_string().into_boxed_str());
    paths.push(p);
    p
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
    pub(in crate::policy) fn named(name: &str) -> Result<&'static Family, String> {
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
    pub(in crate::policy) fn spec(
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

/// `k=v` pairs of one policy, consumed as they are read so leftovers can be
/// reported as unknown parameters.
pub(in crate::policy) struct Params<'a> {
    /// The policy's name as written, for messages.
    pub policy: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    /// Splits `k=v,k=v` (empty parts skipped).
    pub(in crate::policy) fn parse(policy: &'a str, args: &'a str) -> Result<Self, String> {
        Self::from_parts(policy, args.split(',').map(str::trim).filter(|p| !p.is_empty()))
    }

    /// From `k=v` parts already split; a key may appear once.
    pub(in crate::policy) fn from_parts(policy: &'a str, parts: impl Iterator<Item = &'a str>) -> Result<Self, String> {
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

    pub(in crate::policy) fn take(&mut self, key: &str) -> Option<&'a str> {
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

    pub(super) fn finish(self, allowed: &str) -> Result<(), String> {
        match self.pairs.first() {
            Some((k, _)) => Err(format!("unknown parameter `{k}` for `{}` (allowed: {allowed})", self.policy)),
            None => Ok(()),
        }
    }
}
