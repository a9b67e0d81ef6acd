//! Score families: how a token's attention over time becomes the one f32
//! per slot that the lowest-score victim rule ranks (`score=` on `h2o` and
//! `heavy`). The victim rule, the recent window, sinks, storage and CHAI
//! are untouched by the choice; only the update of the slot scores after
//! each query and the ranking key read from them differ.
//!
//! | `score=` | slot score after a query with (aggregated) attention a | ranked by |
//! |---|---|---|
//! | `sum` (default, H2O) | s + a | s |
//! | `norm` | s + a | s / lifetime, lifetime = newest − pos + 1 (queries that saw it) |
//! | `decay:G` | G·s + a, G in [0, 1] | s |
//! | `tova` | a (the current query only; `decay:0`) | s |
//! | `vnorm` | s + a·‖v‖ (the slot's stored value row) | s |
//! | `persist:H[:T]` | last H hit bits, hit = mean attention ≥ T/len | number of hits |
//!
//! `sum`, `norm` and `vnorm` are column sums (a prefill chunk can add the
//! chunk's attention in any order; `vnorm` multiplies each slot's sum by
//! its ‖v‖, a per-slot factor); the others depend on the order of the
//! queries, so a prefill chunk applies them query by query
//! ([`ScoreRule::column_summable`]).
//!
//! `persist` keeps its history in the score itself: the slot's last H
//! steps as bits of an integer held exactly in the f32 (H ≤ 24, the f32
//! integer range), so no store layout carries extra per-slot state.

use super::ScoreAgg;
use std::fmt;

/// Most history bits an f32 holds exactly as an integer.
pub const MAX_PERSIST_WINDOW: u32 = 24;

/// How attention updates a slot's score, and how the score ranks victims.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ScoreRule {
    /// Accumulated attention (H2O).
    #[default]
    Sum,
    /// Accumulated attention divided by the token's lifetime (OpenVINO's
    /// NORM_SUM): removes the age bias that favours old tokens.
    Norm,
    /// Exponentially decayed accumulation: older attention counts less.
    Decay(f32),
    /// The current query's attention only (TOVA).
    Tova,
    /// Attention weighted by the norm of the slot's value row (VATP,
    /// CriticalKV): a token with a small V contributes little to the output
    /// however much it is attended.
    ValueNorm,
    /// Scissorhands-style persistence: how many of the last `window` steps
    /// gave the token a mean attention of at least `threshold / len`.
    Persist { window: u32, threshold: f32 },
}

impl ScoreRule {
    /// True when the update is a sum of the queries' attention, so a
    /// prefill chunk may add column sums in any order: plain (`sum`,
    /// `norm`) or times the slot's value norm (`vnorm`: Σ a·‖v‖ = ‖v‖·Σ a;
    /// see [`ScoreRule::needs_value_norms`]).
    pub fn column_summable(self) -> bool {
        matches!(self, ScoreRule::Sum | ScoreRule::Norm | ScoreRule::ValueNorm)
    }

    /// For a rule that depends on the order of the queries: how many of a
    /// prefill chunk's last queries decide the scores the chunk leaves
    /// (`tova` and `decay:0`: the last one overwrites; `persist:H`: the
    /// last H, earlier hits shift out). A prefill then runs the tiled
    /// kernel and replays only those queries, with the scores they would
    /// leave query by query. `None`: every query counts (`decay:G`, G > 0;
    /// the column sums need no replay).
    pub fn deciding_queries(self) -> Option<usize> {
        match self {
            ScoreRule::Tova => Some(1),
            ScoreRule::Decay(0.0) => Some(1),
            ScoreRule::Persist { window, .. } => Some(window as usize),
            _ => None,
        }
    }

    /// True when a prefill chunk must attend query by query to score: the
    /// rule depends on the order of every query
    /// ([`ScoreRule::deciding_queries`]).
    pub fn needs_every_query(self) -> bool {
        !self.column_summable() && self.deciding_queries().is_none()
    }

    /// True when the update reads the slots' value norms.
    pub fn needs_value_norms(self) -> bool {
        self == ScoreRule::ValueNorm
    }

    /// Applies one query's attention: `probs` is `group × len` (the rows
    /// reading these slots), `scores` the `len` slot scores, `value_norms`
    /// ‖v‖ per slot (read only by [`ScoreRule::ValueNorm`]; may be empty
    /// otherwise). Allocation-free.
    #[inline]
    pub fn update(self, agg: ScoreAgg, probs: &[f32], group: usize, scores: &mut [f32], value_norms: &[f32]) {
        let len = scores.len();
        match self {
            ScoreRule::Sum | ScoreRule::Norm => agg.accumulate(probs, group, scores),
            ScoreRule::Decay(g) => {
                scores.iter_mut().for_each(|s| *s *= g);
                agg.accumulate(probs, group, scores);
            }
            ScoreRule::Tova => {
                scores.fill(0.0);
                agg.accumulate(probs, group, scores);
            }
            ScoreRule::ValueNorm => {
                for (i, (s, &n)) in scores.iter_mut().zip(value_norms).enumerate() {
                    *s += agg.fold(probs, group, len, i) * n;
                }
            }
            ScoreRule::Persist { window, threshold } => {
                // a Sum over the group compares against the group's total
                let rows = match agg {
                    ScoreAgg::Sum => group as f32,
                    ScoreAgg::Max => 1.0,
                };
                let cut = threshold * rows / len as f32;
                let mask = (1u32 << window) - 1;
                for (i, s) in scores.iter_mut().enumerate() {
                    let hit = (agg.fold(probs, group, len, i) >= cut) as u32;
                    *s = ((((*s as u32) << 1) | hit) & mask) as f32;
                }
            }
        }
    }

    /// The ranking key of a slot holding `score` at position `pos` when the
    /// newest token is at `newest`: the victim has the lowest key.
    #[inline]
    pub fn key(self, score: f32, pos: u32, newest: u32) -> f32 {
        match self {
            ScoreRule::Norm => score / (newest.saturating_sub(pos) + 1) as f32,
            ScoreRule::Persist { .. } => (score as u32).count_ones() as f32,
            _ => score,
        }
    }
}

impl fmt::Display for ScoreRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScoreRule::Sum => f.write_str("sum"),
            ScoreRule::Norm => f.write_str("norm"),
            ScoreRule::Decay(g) => write!(f, "decay:{g}"),
            ScoreRule::Tova => f.write_str("tova"),
            ScoreRule::ValueNorm => f.write_str("vnorm"),
            ScoreRule::Persist { window, threshold } if *threshold == 1.0 => write!(f, "persist:{window}"),
            ScoreRule::Persist { window, threshold } => write!(f, "persist:{window}:{threshold}"),
        }
    }
}

impl std::str::FromStr for ScoreRule {
    type Err = String;
    /// `sum`, `norm`, `decay:G` (G in [0, 1]), `tova`, `vnorm` or
    /// `persist:H[:T]` (1 ≤ H ≤ 24, T > 0, default 1).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (family, arg) = match s.split_once(':') {
            Some((f, a)) => (f.trim(), Some(a.trim())),
            None => (s, None),
        };
        let no_arg = |rule: ScoreRule| match arg {
            None => Ok(rule),
            Some(a) => Err(format!("`{family}` takes no argument (got `{a}`)")),
        };
        match family {
            "sum" => no_arg(ScoreRule::Sum),
            "norm" => no_arg(ScoreRule::Norm),
            "tova" => no_arg(ScoreRule::Tova),
            "vnorm" => no_arg(ScoreRule::ValueNorm),
            "decay" => {
                let a = arg.ok_or("decay needs a factor: `decay:G` with G in [0, 1], e.g. decay:0.9")?;
                match a.parse::<f32>() {
                    Ok(g) if (0.0..=1.0).contains(&g) => Ok(ScoreRule::Decay(g)),
                    _ => Err(format!("decay: `{a}` is not a factor in [0, 1]")),
                }
            }
            "persist" => {
                let a = arg.ok_or("persist needs a history window: `persist:H[:T]`, e.g. persist:16")?;
                let (h, t) = match a.split_once(':') {
                    Some((h, t)) => (h.trim(), Some(t.trim())),
                    None => (a, None),
                };
                let window =
                    h.parse::<u32>().ok().filter(|w| (1..=MAX_PERSIST_WINDOW).contains(w)).ok_or_else(|| {
                        format!("persist: window `{h}` is not an integer in [1, {MAX_PERSIST_WINDOW}]")
                    })?;
                let threshold = match t {
                    None => 1.0,
                    Some(t) => t
                        .parse::<f32>()
                        .ok()
                        .filter(|x| x.is_finite() && *x > 0.0)
                        .ok_or_else(|| format!("persist: threshold `{t}` is not a number > 0"))?,
                };
                Ok(ScoreRule::Persist { window, threshold })
            }
            o => Err(format!("unknown score family `{o}`; known: sum, norm, decay:G, tova, vnorm, persist:H[:T]")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_refused;

    #[test]
    fn every_family_round_trips_and_bad_ones_name_the_problem() {
        for s in ["sum", "norm", "decay:0.9", "decay:0", "tova", "vnorm", "persist:16", "persist:8:0.5"] {
            let r: ScoreRule = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
        }
        let cases = [
            ("decay:-0.5", "decay: `-0.5`"),
            ("decay:1.5", "[0, 1]"),
            ("decay", "needs a factor"),
            ("mean", "unknown score family `mean`"),
            ("tova:3", "takes no argument"),
            ("persist:0", "window `0`"),
            ("persist:25", "window `25`"),
            ("persist:8:-1", "threshold `-1`"),
        ];
        assert_refused(str::parse::<ScoreRule>, &cases);
    }

    #[test]
    fn updates_and_keys_are_what_each_family_means() {
        // two query rows over three slots
        let probs = [0.5, 0.3, 0.2, 0.1, 0.6, 0.3];
        let run = |rule: ScoreRule, start: [f32; 3], norms: &[f32]| {
            let mut s = start;
            rule.update(ScoreAgg::Sum, &probs, 2, &mut s, norms);
            s
        };
        let close = |got: [f32; 3], want: [f32; 3]| {
            assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6), "{got:?} vs {want:?}")
        };
        close(run(ScoreRule::Sum, [1.0, 0.0, 0.0], &[]), [1.6, 0.9, 0.5]);
        close(run(ScoreRule::Decay(0.5), [1.0, 2.0, 0.0], &[]), [1.1, 1.9, 0.5]);
        close(run(ScoreRule::Tova, [9.0, 9.0, 9.0], &[]), [0.6, 0.9, 0.5]);
        close(run(ScoreRule::ValueNorm, [0.0; 3], &[2.0, 1.0, 0.0]), [1.2, 0.9, 0.0]);
        // hit = group total ≥ 2 · 1/3: only slot 1 (0.9); histories shift in
        // a window of 2 bits (slot 1's 0b11 stays 0b11, slot 0's 0b01 → 0b10)
        let p = ScoreRule::Persist { window: 2, threshold: 1.0 };
        assert_eq!(run(p, [1.0, 3.0, 0.0], &[]), [2.0, 3.0, 0.0]);
        assert_eq!(p.key(3.0, 0, 10), 2.0);
        assert_eq!(ScoreRule::Norm.key(3.0, 8, 10), 1.0, "lifetime 3");
        assert_eq!(ScoreRule::Sum.key(3.0, 8, 10), 3.0);
    }
}
