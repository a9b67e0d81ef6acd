//! Budget allocation across layers and KV heads under one total budget
//! (`alloc=` on `h2o`).
//!
//! Plain H2O gives every (layer, KV head) the same B = heavy + recent +
//! sinks slots. An allocator moves the *heavy* part between units and keeps
//! the total, Σ over layers and KV heads, exactly what the plain spec
//! allocates; the recent window and the sinks stay as written in every
//! unit, because they are the part every head needs whatever its attention
//! looks like (the newest tokens, the attention sinks).
//!
//! * `pyramid[:R]` (PyramidKV): layer l's heavy slots follow an arithmetic
//!   series from the bottom layer to the top one, the top getting R times
//!   the bottom's (R in (0, 1], default [`DEFAULT_PYRAMID_RATIO`]); the
//!   series' mean is the written heavy count, so the sum is unchanged.
//!   Lower layers attend broadly and need more; upper layers concentrate
//!   on a few tokens. Decided when the policy is built; each layer's store
//!   is allocated once at its own capacity.
//! * `ada[:F]` (AdaKV): within a layer, the kv_heads × heavy slots go to the
//!   heads whose attention needs them. Once, when the layer first has more
//!   candidates than its budget (the prompt's chunk in prefill, or the
//!   first decode step that overflows), every head's eligible candidates
//!   (not recent, not sinks) are ranked by their score key; each head keeps
//!   its top ⌊F · heavy⌋ (the floor, F in [0, 1], default
//!   [`DEFAULT_ADA_FLOOR`]), and the layer's remaining heavy slots go to the
//!   best of everything else across the layer's heads (ties: larger
//!   position, then lower head). A head's share is its floor plus what it
//!   won; slots no candidate claims (a short prompt) are dealt round-robin
//!   from head 0. From then on each head evicts within its own fixed share.
//! * `pyramid:R/ada:F`: the pyramid sets each layer's heavy count, ada splits
//!   it among the layer's heads.
//! * `global` (KVzip's selection): every layer's and head's eligible
//!   candidates are ranked together and the `layers · kv_heads · heavy`
//!   heavy slots go to the best of them, wherever they are; no floor
//!   (`global:F`: each unit first keeps its top ⌊F · heavy⌋, as ada's
//!   floor, and the rest go to the best of everything else). Once,
//!   after the first forward call (the whole prompt, unless `prefill=stream`
//!   cuts it into chunks). KVzip-style scores need it: on real text most
//!   tokens score high in the few layers that copy and low elsewhere, so a
//!   uniform share loses what those layers hold (docs/contexts.md).
//!   Until the decision every head may hold the whole prompt, so the store
//!   is allocated for it; the decision then cuts each head's fixed slot
//!   arrays down to its share (pages follow the share anyway).
//!
//! Per-head capacity under `ada`: a head's share is not known when the
//! store is allocated (before the prompt), so each head of a layer is
//! given the most slots a head can win, recent + sinks + kv_heads · heavy −
//! (kv_heads − 1) · floor + 1, and the policy's per-head budget is what
//! limits it. With fixed slot arrays those rows are allocated up front, so
//! an `ada` cache *allocates* more bytes than plain H2O while *holding* the
//! same total of tokens (the byte reports say so, exactly); with a paged
//! store (`page=P`) only the pages of live tokens are allocated, so the
//! bytes follow each head's actual share.
//!
//! An allocator is a wrapper of one [`TokenEviction`] per (layer, KV head),
//! each with its unit's budget: the eviction rule, scores, recent window,
//! sinks and prefill are exactly H2O's, only the budget differs per unit.

use super::token::{EvictionEvent, Observation, TokenEviction};
use super::{CachePolicy, HeadId, PolicySlots, ScoreAgg, ScoreRule};
use std::fmt;

/// Default top-to-bottom heavy ratio of `pyramid`: the top layer keeps a
/// quarter of the bottom layer's heavy slots.
pub const DEFAULT_PYRAMID_RATIO: f64 = 0.25;

/// Default floor of `ada`: a head keeps a fifth of its uniform heavy share
/// whatever the other heads need (AdaKV's safeguard).
pub const DEFAULT_ADA_FLOOR: f64 = 0.2;

/// How a policy's heavy slots are spread over layers and heads
/// (`alloc=`); the default is uniform (every unit the same).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Alloc {
    /// PyramidKV: top-layer heavy / bottom-layer heavy, in (0, 1].
    pub pyramid: Option<f64>,
    /// AdaKV: the floor, the fraction of a head's uniform heavy share it
    /// keeps regardless, in [0, 1].
    pub ada: Option<f64>,
    /// KVzip: one ranking over every layer and head.
    pub global: bool,
    /// `global:F`: the part of its uniform heavy share every unit keeps
    /// before the ranking over all units (0: KVzip's, no floor).
    pub global_floor: f64,
}

impl Alloc {
    /// Every unit gets the written budget.
    pub fn is_uniform(&self) -> bool {
        self.pyramid.is_none() && self.ada.is_none() && !self.global
    }

    /// Heavy slots per KV head of every layer (before `ada` splits a
    /// layer's total among its heads).
    pub fn layer_heavy(&self, heavy: usize, layers: usize) -> Vec<usize> {
        match self.pyramid {
            Some(r) => pyramid_heavy(heavy, layers, r),
            None => vec![heavy; layers],
        }
    }
}

impl fmt::Display for Alloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            self.pyramid.map(|r| format!("pyramid:{r}")),
            self.ada.map(|a| format!("ada:{a}")),
            self.global.then(|| match self.global_floor {
                f if f > 0.0 => format!("global:{f}"),
                _ => "global".to_string(),
            }),
        ];
        let parts: Vec<_> = parts.into_iter().flatten().collect();
        f.write_str(&if parts.is_empty() { "uniform".to_string() } else { parts.join("/") })
    }
}

impl std::str::FromStr for Alloc {
    type Err = String;
    /// `uniform`, `pyramid[:R]`, `ada[:F]` or both joined by `/`
    /// (`pyramid:0.5/ada:0.2`), or `global`.
    fn from_str(s: &str) -> Result<Alloc, String> {
        let mut a = Alloc::default();
        for part in s.split('/').map(str::trim) {
            let (name, arg) = match part.split_once(':') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (part, None),
            };
            let number = |what: &str| -> Result<Option<f64>, String> {
                arg.map(|v| v.parse::<f64>().map_err(|_| format!("{name} {what} `{v}` is not a number"))).transpose()
            };
            match name {
                "uniform" if arg.is_none() && s.trim() == "uniform" => {}
                "pyramid" => {
                    if a.pyramid.is_some() {
                        return Err("`pyramid` given twice".into());
                    }
                    let r = number("ratio")?.unwrap_or(DEFAULT_PYRAMID_RATIO);
                    if !(r > 0.0 && r <= 1.0) {
                        return Err(format!(
                            "pyramid ratio `{r}` must be in (0, 1] (top-layer / bottom-layer heavy slots)"
                        ));
                    }
                    a.pyramid = Some(r);
                }
                "ada" => {
                    if a.ada.is_some() {
                        return Err("`ada` given twice".into());
                    }
                    let f = number("floor")?.unwrap_or(DEFAULT_ADA_FLOOR);
                    if !(0.0..=1.0).contains(&f) {
                        return Err(format!(
                            "ada floor `{f}` must be in [0, 1] (a head's guaranteed share of its heavy slots)"
                        ));
                    }
                    a.ada = Some(f);
                }
                "global" => {
                    if a.global {
                        return Err("`global` given twice".into());
                    }
                    let f = number("floor")?.unwrap_or(0.0);
                    if !(0.0..=1.0).contains(&f) {
                        return Err(format!(
                            "global floor `{f}` must be in [0, 1] (a unit's guaranteed share of its heavy slots)"
                        ));
                    }
                    a.global = true;
                    a.global_floor = f;
                }
                _ => {
                    return Err(format!(
                        "unknown allocator `{part}` (known: uniform, pyramid[:R], ada[:F], pyramid[:R]/ada[:F], \
                         global[:F])"
                    ))
                }
            }
        }
        if a.global && (a.pyramid.is_some() || a.ada.is_some()) {
            return Err("`global` ranks every layer and head together; it does not combine with pyramid or ada".into());
        }
        Ok(a)
    }
}

/// PyramidKV's layer split: heavy slots per layer on an arithmetic series
/// from the bottom layer (2H / (1 + R)) to the top (R times that), in
/// integers that sum to exactly `layers · heavy` (floors, then the missing
/// slots to the largest fractional parts, ties to the lower layer).
pub fn pyramid_heavy(heavy: usize, layers: usize, ratio: f64) -> Vec<usize> {
    if layers <= 1 || heavy == 0 {
        return vec![heavy; layers];
    }
    let total = heavy * layers;
    let bottom = 2.0 * heavy as f64 / (1.0 + ratio);
    let step = (ratio * bottom - bottom) / (layers - 1) as f64;
    let ideal: Vec<f64> = (0..layers).map(|l| (bottom + step * l as f64).max(0.0)).collect();
    let mut out: Vec<usize> = ideal.iter().map(|x| x.floor() as usize).collect();
    let frac = |l: usize| ideal[l] - ideal[l].floor();
    let mut order: Vec<usize> = (0..layers).collect();
    order.sort_by(|&a, &b| frac(b).total_cmp(&frac(a)).then(a.cmp(&b)));
    let sum: usize = out.iter().sum();
    if sum < total {
        order.iter().cycle().take(total - sum).for_each(|&l| out[l] += 1);
    } else {
        // rounding pushed a floor over the integer: take back from the
        // smallest fractional parts (never happens with exact arithmetic)
        let mut excess = sum - total;
        for &l in order.iter().rev() {
            if excess > 0 && out[l] > 0 {
                out[l] -= 1;
                excess -= 1;
            }
        }
    }
    out
}

/// A `global` unit's budget before the ranking: no limit (the store's
/// capacity, the whole prompt, is the real one).
const UNDECIDED: usize = usize::MAX / 2;

/// What a head keeps whatever the others need: ⌊F · heavy⌋ slots.
pub fn ada_floor(heavy: usize, floor: f64) -> usize {
    ((floor * heavy as f64).floor() as usize).min(heavy)
}

/// The most heavy slots one head of a layer can win.
pub fn ada_max_share(heavy: usize, floor: f64, kv_heads: usize) -> usize {
    kv_heads * heavy - (kv_heads - 1) * ada_floor(heavy, floor)
}

/// What the allocator needs of the token policy to rank candidates.
#[derive(Clone, Copy, Debug)]
pub struct Ranking {
    pub recent: usize,
    pub sinks: usize,
    pub score: ScoreRule,
}

/// AdaKV's split of a layer's `kv_heads · heavy` heavy slots (see the
/// module docs). `heads[h]` holds head h's candidates (positions, scores);
/// returns each head's heavy share, summing to `heads.len() · heavy`.
pub fn ada_shares(heavy: usize, floor: f64, rank: Ranking, heads: &[(&[u32], &[f32])]) -> Vec<usize> {
    let kv = heads.len();
    let f = ada_floor(heavy, floor);
    // (key, position, head) of every candidate past its head's floor
    let mut contest: Vec<(f32, u32, usize)> = Vec::new();
    let mut eligible: Vec<(f32, u32)> = Vec::new();
    for (h, (positions, scores)) in heads.iter().enumerate() {
        let newest = positions.iter().copied().max().unwrap_or(0);
        let recent_from = (newest + 1).saturating_sub(rank.recent as u32);
        eligible.clear();
        for (&p, &s) in positions.iter().zip(scores.iter()) {
            if (p as usize) >= rank.sinks && p < recent_from {
                eligible.push((rank.score.key(s, p, newest), p));
            }
        }
        // best first: higher key, then the later position (the one the
        // lowest-score rule would keep on a tie)
        eligible.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        contest.extend(eligible.iter().skip(f).map(|&(k, p)| (k, p, h)));
    }
    contest.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let pool = kv * (heavy - f);
    let mut shares = vec![f; kv];
    for &(_, _, h) in contest.iter().take(pool) {
        shares[h] += 1;
    }
    let left = pool - contest.len().min(pool);
    for (h, s) in shares.iter_mut().enumerate() {
        *s += left / kv + usize::from(h < left % kv);
    }
    shares
}

/// H2O with its heavy slots allocated per layer and head (see the module
/// docs): one [`TokenEviction`] per (layer, KV head), each with its own
/// budget.
#[derive(Clone)]
pub struct Allocated {
    kv_heads: usize,
    /// Unit (layer, KV head) at `layer · kv_heads + head`.
    units: Vec<TokenEviction>,
    /// Heavy slots per head of each layer (pyramid's, or the written H).
    layer_heavy: Vec<usize>,
    /// Recent window and sinks: every head keeps them.
    rank: Ranking,
    /// AdaKV's floor, when heads share a layer's heavy slots by need.
    ada: Option<f64>,
    /// Per layer: ada's shares are set (decided once).
    decided: Vec<bool>,
    /// `global`: whether every unit's share is set yet.
    global: Option<bool>,
    /// `global:F`'s floor (0 without one).
    global_floor: f64,
}

impl Allocated {
    /// `base` is the plain policy (its budget = heavy + recent + sinks);
    /// `heavy` its heavy part.
    pub fn new(base: TokenEviction, heavy: usize, alloc: Alloc, layers: usize, kv_heads: usize) -> Self {
        let rank = Ranking { recent: base.recent(), sinks: base.sinks(), score: base.score_rule() };
        let layer_heavy = alloc.layer_heavy(heavy, layers);
        let units = layer_heavy
            .iter()
            .flat_map(|&h| {
                // `global`: nothing leaves before the ranking over all units
                let budget = if alloc.global { UNDECIDED } else { (rank.recent + rank.sinks + h).max(1) };
                let mut unit = base.clone();
                unit.set_budget(budget);
                (0..kv_heads).map(move |_| unit.clone())
            })
            .collect();
        let global = alloc.global.then_some(false);
        Allocated {
            kv_heads,
            units,
            layer_heavy,
            rank,
            ada: alloc.ada,
            decided: vec![false; layers],
            global,
            global_floor: alloc.global_floor,
        }
    }

    fn unit(&mut self, layer: usize, kv_head: usize) -> &mut TokenEviction {
        &mut self.units[layer * self.kv_heads + kv_head]
    }

    /// Each head's budget (heavy share + recent + sinks) of every layer.
    pub fn budgets(&self) -> Vec<Vec<usize>> {
        self.units.chunks(self.kv_heads).map(|l| l.iter().map(TokenEviction::budget).collect()).collect()
    }
}

impl CachePolicy for Allocated {
    fn name(&self) -> &str {
        self.units[0].name()
    }

    fn clone_box(&self) -> Box<dyn CachePolicy> {
        Box::new(self.clone())
    }

    fn capacity(&self, max_len: usize) -> usize {
        (0..self.layer_heavy.len()).map(|l| self.layer_capacity(l, max_len)).max().unwrap_or(1)
    }

    fn layer_capacity(&self, layer: usize, max_len: usize) -> usize {
        match self.global {
            // a unit may win every token of the prompt
            Some(false) => return max_len.max(1) + 1,
            Some(true) => {
                let units = &self.units[layer * self.kv_heads..(layer + 1) * self.kv_heads];
                return units.iter().map(TokenEviction::budget).max().unwrap_or(1) + 1;
            }
            None => {}
        }
        let h = self.layer_heavy[layer];
        let heavy = match self.ada {
            Some(f) => ada_max_share(h, f, self.kv_heads),
            None => h,
        };
        (self.rank.recent + self.rank.sinks + heavy).max(1) + 1
    }

    fn head_budget(&self, layer: usize, kv_head: usize) -> Option<usize> {
        Some(self.units[layer * self.kv_heads + kv_head].budget())
    }

    fn bounded(&self) -> bool {
        true
    }

    fn score_aggregation(&self) -> Option<ScoreAgg> {
        self.units[0].score_aggregation()
    }

    fn score_rule(&self) -> ScoreRule {
        self.rank.score
    }

    fn prefill_chunk(&self) -> Option<usize> {
        self.units[0].prefill_chunk()
    }

    fn observation(&self) -> Option<Observation> {
        self.units[0].observation()
    }

    fn layer_decision_pending(&self, layer: usize, candidates: usize) -> bool {
        self.ada.is_some()
            && !self.decided[layer]
            && candidates > self.rank.recent + self.rank.sinks + self.layer_heavy[layer]
    }

    fn save_state(&self, out: &mut Vec<u64>) -> Result<(), String> {
        out.extend(self.decided.iter().map(|&d| u64::from(d)));
        out.extend(self.global.map(u64::from));
        self.units.iter().try_for_each(|u| u.save_state(out))
    }

    fn load_state(&mut self, words: &mut &[u64]) -> Result<(), String> {
        for d in self.decided.iter_mut() {
            *d = super::take_word(words)? != 0;
        }
        if let Some(g) = self.global.as_mut() {
            *g = super::take_word(words)? != 0;
        }
        self.units.iter_mut().try_for_each(|u| u.load_state(words))
    }

    fn global_decision_pending(&self) -> bool {
        self.global == Some(false)
    }

    fn decide_global(&mut self, units: &[(&[u32], &[f32])]) {
        if !self.global_decision_pending() {
            return;
        }
        // uniform heavy per unit (pyramid does not combine with global)
        let shares = ada_shares(self.layer_heavy[0], self.global_floor, self.rank, units);
        let fixed = self.rank.recent + self.rank.sinks;
        for (unit, share) in self.units.iter_mut().zip(shares) {
            unit.set_budget((fixed + share).max(1));
        }
        self.global = Some(true);
    }

    fn decide_layer(&mut self, layer: usize, heads: &[(&[u32], &[f32])]) {
        let Some(floor) = self.ada else { return };
        let shares = ada_shares(self.layer_heavy[layer], floor, self.rank, heads);
        let fixed = self.rank.recent + self.rank.sinks;
        for (h, share) in shares.into_iter().enumerate() {
            self.unit(layer, h).set_budget((fixed + share).max(1));
        }
        self.decided[layer] = true;
    }

    fn after_decode_step(&mut self, head: HeadId, slots: &mut PolicySlots<'_>, probs: &[f32]) -> &[usize] {
        let kv = self.kv_heads;
        self.units[head.layer * kv + head.kv_head].after_decode_step(head, slots, probs)
    }

    fn select_after_prefill(&mut self, head: HeadId, positions: &[u32], scores: &[f32], keep: &mut Vec<usize>) {
        self.unit(head.layer, head.kv_head).select_after_prefill(head, positions, scores, keep)
    }

    fn rolls_back_per_token(&self) -> bool {
        self.units.iter().all(|u| u.rolls_back_per_token())
    }

    fn enable_trace(&mut self, every: u32) {
        self.units.iter_mut().for_each(|u| u.enable_trace(every));
    }

    fn take_events(&mut self) -> Vec<EvictionEvent> {
        let mut events: Vec<EvictionEvent> = self.units.iter_mut().flat_map(|u| u.take_events()).collect();
        // one unit records in step order; merged, they read as one policy's
        events.sort_by_key(|e| (e.step, e.layer, e.kv_head));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_refused;

    #[test]
    fn pyramid_keeps_the_total_and_slopes_down() {
        for (heavy, layers, r) in [(102, 30, 0.25), (51, 5, 0.5), (7, 3, 1.0), (1, 30, 0.1), (64, 2, 0.2), (3, 1, 0.5)]
        {
            let h = pyramid_heavy(heavy, layers, r);
            assert_eq!(h.len(), layers);
            assert_eq!(h.iter().sum::<usize>(), heavy * layers, "{heavy} {layers} {r}: {h:?}");
            assert!(h.windows(2).all(|w| w[0] + 1 >= w[1]), "non-increasing up to rounding: {h:?}");
        }
        assert_eq!(pyramid_heavy(100, 2, 0.25), vec![160, 40]);
        assert_eq!(pyramid_heavy(10, 3, 1.0), vec![10, 10, 10]);
        // 2·10/1.5 = 13.33, 10, 6.67: floors 13, 10, 6, the missing slot to 6.67
        assert_eq!(pyramid_heavy(10, 3, 0.5), vec![13, 10, 7]);
    }

    /// `global` is ada's contest over every (layer, KV head) with no floor:
    /// the heavy slots of all units go to the best candidates anywhere.
    #[test]
    fn global_gives_every_units_heavy_slots_to_the_best_candidates_anywhere() {
        let mut p = crate::PolicySpec::parse("h2o:heavy=3,recent=1,alloc=global").unwrap().build_for(8, 2, 2);
        assert_eq!(p.head_budget(1, 1), Some(UNDECIDED), "no unit evicts before the ranking");
        let pos: Vec<u32> = (0..8).collect();
        let hot = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.0];
        let cold = [0.01; 8];
        // layer 1 head 0 holds everything that matters: 7 eligible, all hot
        p.decide_global(&[(&pos, &cold), (&pos, &cold), (&pos, &hot), (&pos, &cold)]);
        let budgets: Vec<_> =
            (0..2).flat_map(|l| (0..2).map(move |h| (l, h))).map(|(l, h)| p.head_budget(l, h)).collect();
        // recent 1 each; of the 12 heavy slots the hot unit wins its 7
        // eligible tokens, the 5 left go to the cold units' ties (latest
        // position first, then the lower unit)
        assert_eq!(budgets.iter().map(|b| b.unwrap()).sum::<usize>(), 4 * 4);
        assert_eq!(budgets[2], Some(8), "{budgets:?}");
        assert!(!p.global_decision_pending());
    }

    /// `global:F` keeps every unit's top ⌊F · heavy⌋ first: the cold units
    /// hold their floor, the hot one wins what is left.
    #[test]
    fn a_global_floor_keeps_each_units_best_before_the_ranking() {
        let pos: Vec<u32> = (0..8).collect();
        let hot = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.0];
        let cold = [0.01; 8];
        let units: [(&[u32], &[f32]); 4] = [(&pos, &cold), (&pos, &cold), (&pos, &hot), (&pos, &cold)];
        let budgets = |spec: &str| {
            let mut p = crate::PolicySpec::parse(spec).unwrap().build_for(8, 2, 2);
            p.decide_global(&units);
            (0..4).map(|u| p.head_budget(u / 2, u % 2).unwrap()).collect::<Vec<_>>()
        };
        // heavy 4 per unit, recent 1: floor ⌊0.5·4⌋ = 2 each, the hot unit
        // wins its other 5 eligible tokens, the 3 left go to the cold ties
        let floored = budgets("h2o:heavy=4,recent=1,alloc=global:0.5");
        assert_eq!(floored.iter().sum::<usize>(), 4 * 5);
        assert_eq!(floored[2], 1 + 7, "{floored:?}");
        let (recent, floor) = (1, 2);
        assert!(floored.iter().all(|&b| b >= recent + floor), "every unit keeps its floor: {floored:?}");
        assert_eq!(budgets("h2o:heavy=4,recent=1,alloc=global:1"), vec![5; 4], "floor 1 is uniform");
        assert_eq!(budgets("h2o:heavy=4,recent=1,alloc=global:0"), budgets("h2o:heavy=4,recent=1,alloc=global"));
    }

    #[test]
    fn ada_gives_the_layers_heavy_slots_to_the_heads_that_need_them() {
        let rank = Ranking { recent: 1, sinks: 0, score: ScoreRule::Sum };
        // head 0's old tokens all score high, head 1's low; position 5 is recent
        let pos: Vec<u32> = (0..6).collect();
        let hi = [0.9, 0.8, 0.7, 0.6, 0.5, 0.0];
        let lo = [0.05, 0.04, 0.03, 0.02, 0.01, 0.0];
        let shares = ada_shares(3, 0.0, rank, &[(&pos, &hi), (&pos, &lo)]);
        assert_eq!(shares, vec![5, 1], "all of head 0's five eligible, then head 1's best");
        let shares = ada_shares(3, 0.7, rank, &[(&pos, &hi), (&pos, &lo)]);
        assert_eq!(shares, vec![4, 2], "the floor keeps ⌊0.7·3⌋ = 2 for head 1");
        let shares = ada_shares(3, 1.0, rank, &[(&pos, &hi), (&pos, &lo)]);
        assert_eq!(shares, vec![3, 3], "floor 1 is uniform");
        // a short prompt leaves slots unclaimed: dealt round-robin
        let short: Vec<u32> = (0..2).collect();
        let shares = ada_shares(3, 0.0, rank, &[(&short, &[0.5, 0.0]), (&short, &[0.5, 0.0]), (&short, &[0.5, 0.0])]);
        assert_eq!(shares.iter().sum::<usize>(), 9);
        assert_eq!(shares, vec![3, 3, 3]);
        assert_eq!(ada_max_share(3, 0.5, 2), 5);
    }

    #[test]
    fn allocators_parse_and_name_bad_parameters() {
        let a: Alloc = "pyramid".parse().unwrap();
        assert_eq!(a, Alloc { pyramid: Some(DEFAULT_PYRAMID_RATIO), ..Alloc::default() });
        let g: Alloc = "global".parse().unwrap();
        assert!(g.global && !g.is_uniform() && g.to_string() == "global");
        let g: Alloc = "global:0.25".parse().unwrap();
        assert!(g.global && g.global_floor == 0.25 && g.to_string() == "global:0.25");
        assert_eq!("global:0".parse::<Alloc>().unwrap().to_string(), "global");
        let a: Alloc = "pyramid:0.5/ada:0.1".parse().unwrap();
        assert_eq!(a.to_string(), "pyramid:0.5/ada:0.1");
        assert_eq!(a.to_string().parse::<Alloc>().unwrap(), a);
        assert!("uniform".parse::<Alloc>().unwrap().is_uniform());
        let cases = [
            ("pyramid:0", "pyramid ratio `0` must be in (0, 1]"),
            ("pyramid:1.5", "pyramid ratio `1.5`"),
            ("pyramid:x", "pyramid ratio `x` is not a number"),
            ("ada:-0.1", "ada floor `-0.1` must be in [0, 1]"),
            ("fancy", "unknown allocator `fancy`"),
            ("ada/ada", "`ada` given twice"),
            ("global:1.5", "global floor `1.5` must be in [0, 1]"),
            ("global/global", "`global` given twice"),
            ("uniform/ada", "unknown allocator `uniform`"),
        ];
        assert_refused(str::parse::<Alloc>, &cases);
    }
}
