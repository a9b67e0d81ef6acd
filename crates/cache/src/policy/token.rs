//! Token eviction with a fixed slot budget per (layer, KV head): H2O and the
//! baselines (window, sink, heavy-only, random) share one mechanism and
//! differ only in which slots are protected and how the victim is chosen.
//!
//! Decode step (docs/policies.md §1): the new token is already in the store as the
//! last occupied slot (the B+1-th, the candidate); attention over D_t has
//! run; scores are updated; if |D_t| > B exactly one victim outside the
//! protected set leaves, and the candidate moves into its slot.

use super::{CachePolicy, ScoreAgg, ScoreRule};
use super::{HeadId, PolicySlots};
use crate::rng::SplitMix64;
use std::collections::HashMap;

/// How the victim is chosen among unprotected slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimRule {
    /// Lowest score key ([`ScoreRule::key`]; the accumulated score under the
    /// default `sum`); ties → smaller original position (H2O, heavy).
    LowestScore,
    /// Smallest original position (window, sink).
    Oldest,
    /// Uniformly random, reproducible from the seed (per layer and KV head).
    Random { seed: u64 },
}

/// What leaves when the budget is exceeded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum EvictionUnit {
    /// One token per decode step (docs/policies.md §1).
    #[default]
    Token,
    /// A whole page of a paged store, scored from its tokens; pages holding
    /// a protected token (sink or recent window) are never chosen. Falls
    /// back to one token when every page is protected or the store is not
    /// paged.
    Page(PageScore),
}

/// How a page's score is folded from its live tokens' scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageScore {
    /// Σ scores: favours pages with many moderately attended tokens.
    Sum,
    /// max score: one hot token protects its whole page.
    Max,
    /// Σ of the m highest scores.
    TopM(usize),
}

impl PageScore {
    fn fold(self, sorted_desc: &[f32]) -> f32 {
        match self {
            PageScore::Sum => sorted_desc.iter().sum(),
            PageScore::Max => sorted_desc.first().copied().unwrap_or(0.0),
            PageScore::TopM(m) => sorted_desc.iter().take(m).sum(),
        }
    }
}

impl std::fmt::Display for PageScore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageScore::Sum => f.write_str("sum"),
            PageScore::Max => f.write_str("max"),
            PageScore::TopM(m) => write!(f, "topm:{m}"),
        }
    }
}

impl std::str::FromStr for PageScore {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sum" => Ok(PageScore::Sum),
            "max" => Ok(PageScore::Max),
            _ => match s.strip_prefix("topm:").map(str::parse::<usize>) {
                Some(Ok(m)) if m >= 1 => Ok(PageScore::TopM(m)),
                _ => Err(format!("`{s}` is not `sum`, `max` or `topm:M` with M ≥ 1")),
            },
        }
    }
}

/// One eviction, for `--trace-out`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EvictionEvent {
    /// Position of the token being decoded when the eviction happened.
    pub step: u32,
    pub layer: usize,
    pub kv_head: usize,
    pub victim_pos: u32,
    /// The victim's ranking key ([`ScoreRule::key`]: its accumulated score
    /// under H2O's `sum`).
    pub victim_score: f32,
    /// step − victim_pos.
    pub victim_age: u32,
    /// Lowest score still eligible for eviction after the step minus the
    /// victim's score (how close the decision was: ≥ 0 for token eviction;
    /// a page-evicted token may score above what stays).
    pub margin: f32,
}

/// H2O and the token-eviction baselines.
#[derive(Clone)]
pub struct TokenEviction {
    name: &'static str,
    budget: usize,
    recent: usize,
    sinks: usize,
    rule: VictimRule,
    agg: Option<ScoreAgg>,
    /// How attention becomes scores and scores rank victims.
    score: ScoreRule,
    prefill_chunk: Option<usize>,
    observation: Option<Observation>,
    rngs: HashMap<(usize, usize), SplitMix64>,
    /// Record events for steps that are multiples of this (0 = off).
    trace_every: u32,
    events: Vec<EvictionEvent>,
    eligible: Vec<(u32, usize)>,
    unit: EvictionUnit,
    /// Victims of the current step, in eviction order.
    victims: Vec<usize>,
    /// Page eviction workspace: (page, score, position, slot) per slot.
    by_page: Vec<(u32, f32, u32, usize)>,
    page_scores: Vec<f32>,
    /// Value-norm workspace (`score=vnorm`): one decoded row, ‖v‖ per slot.
    value_row: Vec<f32>,
    value_norms: Vec<f32>,
}

/// The random stream of one (layer, KV head): reproducible and independent
/// of the order in which heads are visited.
pub fn head_rng_seed(seed: u64, layer: usize, kv_head: usize) -> u64 {
    SplitMix64::new(seed ^ ((layer as u64) << 32 | kv_head as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).next_u64()
}

/// What a token-eviction policy keeps, in resolved slots: the one argument
/// of [`TokenEviction::new`]. Named fields, because four of them are slot
/// counts or options that a positional call would let one swap silently.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvictionConfig {
    /// Short name for reports (`h2o`, `window`, …).
    pub name: &'static str,
    /// B: total slots per (layer, KV head), at least 1.
    pub budget: usize,
    /// B_r: the most recent positions are protected (capped at `budget`).
    pub recent: usize,
    /// Positions below this are protected (StreamingLLM sinks).
    pub sinks: usize,
    /// How the victim is chosen among unprotected slots.
    pub rule: VictimRule,
    /// Score aggregation when the rule reads attention; `None` lets the
    /// forward pass skip handing probabilities over.
    pub agg: Option<ScoreAgg>,
    /// Streaming prefill in chunks of this many tokens (`None`: one chunk).
    pub prefill_chunk: Option<usize>,
    /// How a one-chunk prefill scores the prompt other than by every
    /// query's attention: SnapKV's window or expected attention (`None`:
    /// every query's attention, summed).
    pub observation: Option<Observation>,
}

/// How a one-chunk prefill scores the prompt's tokens when not by the
/// attention of every prompt query (docs/policies.md §1, prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// SnapKV: the attention of the chunk's last `window` queries, summed
    /// per candidate, then max-pooled over `pool` neighbouring positions
    /// (odd; 1 = no pooling), so a kept token keeps its neighbours' chance.
    Window { window: usize, pool: usize },
    /// Expected attention (kvpress's ExpectedAttentionPress): the attention
    /// that queries distributed as the chunk's (their mean and covariance,
    /// positions below `skip` left out, RoPE undone) would pay each
    /// candidate at the `future` positions after the chunk (the rotation
    /// averaged over them), softmax over the candidates from `skip` on,
    /// averaged over the group's query heads, times the candidate's ‖v‖.
    /// Query-agnostic: no question is needed, and no extra pass.
    Expected { future: usize, skip: usize },
    /// KVzip-style reconstruction: the prompt's tokens are fed again after
    /// it (teacher-forced, as if the model were repeating its context), in
    /// pieces of `chunk` tokens, each after a reconstruction instruction;
    /// a piece's repeat attends to the first sinks, its own piece of the
    /// prompt and itself, and each candidate of the piece scores the most
    /// attention any of its repeat queries, any query head of the group,
    /// paid it. The repeat tokens only score and never enter the cache.
    /// Query-agnostic; costs about one more prefill's projections, and
    /// attention linear in the prompt.
    Repeat { chunk: usize },
    /// KVzap-style: each chunk token scores exp(min(0, b + w·x̂)) per KV
    /// head, x̂ the layer's normalised input hidden state of the token and
    /// (w, b) the head's row of a predictor fitted to the log of KVzip's
    /// scores (`file`; `None`: the one kept for the model). Computed by the
    /// model during the one prefill: no probe, no attention needed.
    Kvzap { file: Option<&'static str> },
    /// ADAPTIVE_RKV-style (OpenVINO GenAI): every query's attention, summed
    /// as in a plain prefill; the highest-scoring candidates holding
    /// `mass_permille`/1000 of the chunk's attention mass rank first, and
    /// the budget left after them goes to the most diverse of the rest
    /// (keys least aligned with the mean unit key: lowest mean cosine
    /// similarity to the other candidates).
    Diverse { mass_permille: u16 },
}

impl TokenEviction {
    /// A policy keeping what `config` says; see [`EvictionConfig`].
    pub fn new(config: EvictionConfig) -> Self {
        let EvictionConfig { name, budget, recent, sinks, rule, agg, prefill_chunk, observation } = config;
        assert!(budget >= 1, "budget must be at least one slot");
        TokenEviction {
            name,
            budget,
            recent: recent.min(budget),
            sinks,
            rule,
            agg,
            score: ScoreRule::Sum,
            prefill_chunk,
            observation,
            rngs: HashMap::new(),
            trace_every: 0,
            events: Vec::new(),
            eligible: Vec::new(),
            unit: EvictionUnit::Token,
            victims: Vec::new(),
            by_page: Vec::new(),
            page_scores: Vec::new(),
            value_row: Vec::new(),
            value_norms: Vec::new(),
        }
    }

    /// Scores slots by `rule` instead of H2O's accumulated attention (only
    /// the lowest-score rule reads scores, so it changes nothing else).
    pub fn with_score(mut self, rule: ScoreRule) -> Self {
        self.score = rule;
        self
    }

    /// The random stream of (layer, KV head), created on first use.
    fn rng(&mut self, seed: u64, layer: usize, kv_head: usize) -> &mut SplitMix64 {
        self.rngs.entry((layer, kv_head)).or_insert_with(|| SplitMix64::new(head_rng_seed(seed, layer, kv_head)))
    }

    /// Evicts whole pages instead of single tokens (decode steps; the
    /// prompt is still selected token by token and packed into pages).
    pub fn with_unit(mut self, unit: EvictionUnit) -> Self {
        self.unit = unit;
        self
    }

    /// Picks the page to evict: the lowest folded score (window/sink: the
    /// oldest; random: a seeded draw) among pages without protected
    /// tokens. Fills `victims` with its slots, highest first (so evicting
    /// them in order never moves a later victim). False when every page
    /// is protected.
    fn page_victims(
        &mut self,
        layer: usize,
        kv_head: usize,
        slots: &PolicySlots<'_>,
        score: PageScore,
        newest: u32,
    ) -> bool {
        let from = self.recent_from(newest);
        self.by_page.clear();
        for (i, (&p, &s)) in slots.positions().iter().zip(slots.scores()).enumerate() {
            let Some(page) = slots.page_of(i) else { return false };
            self.by_page.push((page, self.score.key(s, p, newest), p, i));
        }
        // by page, scores descending inside a page
        self.by_page.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
        // (key, oldest position, page) of every unprotected page
        let mut best: Option<(f32, u32, u32)> = None;
        let mut candidates = 0u64;
        let mut start = 0;
        while start < self.by_page.len() {
            let page = self.by_page[start].0;
            let end = start + self.by_page[start..].iter().take_while(|e| e.0 == page).count();
            let group = &self.by_page[start..end];
            start = end;
            if group.iter().any(|e| !self.eligible(e.2, from)) {
                continue;
            }
            let oldest = group.iter().map(|e| e.2).min().unwrap_or(0);
            self.page_scores.clear();
            self.page_scores.extend(group.iter().map(|e| e.1));
            let key = match self.rule {
                VictimRule::LowestScore => score.fold(&self.page_scores),
                VictimRule::Oldest => oldest as f32,
                VictimRule::Random { .. } => 0.0,
            };
            candidates += 1;
            let better = match (self.rule, best) {
                (_, None) => true,
                (VictimRule::Random { seed }, Some(_)) => {
                    // reservoir sampling: the c-th candidate wins with probability 1/c
                    let rng = self.rng(seed, layer, kv_head);
                    rng.next_u64().is_multiple_of(candidates)
                }
                (_, Some((k, o, _))) => (key, oldest) < (k, o),
            };
            if better {
                best = Some((key, oldest, page));
            }
        }
        let Some((_, _, page)) = best else { return false };
        self.victims.clear();
        self.victims.extend(self.by_page.iter().filter(|e| e.0 == page).map(|e| e.3));
        self.victims.sort_unstable_by(|a, b| b.cmp(a));
        true
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// B_r, the protected recent window.
    pub fn recent(&self) -> usize {
        self.recent
    }

    /// Positions below this are protected sinks.
    pub fn sinks(&self) -> usize {
        self.sinks
    }

    /// Gives this unit another budget (an allocator's per-layer or per-head
    /// share, [`super::alloc`]); the recent window never exceeds it.
    pub fn set_budget(&mut self, budget: usize) {
        assert!(budget >= 1, "budget must be at least one slot");
        self.budget = budget;
        self.recent = self.recent.min(budget);
    }

    /// Protected: sinks, and the B_r largest positions (with every recent
    /// token resident, those are the positions ≥ newest + 1 − B_r).
    #[inline]
    fn eligible(&self, pos: u32, recent_from: u32) -> bool {
        (pos as usize) >= self.sinks && pos < recent_from
    }

    fn recent_from(&self, newest: u32) -> u32 {
        (newest + 1).saturating_sub(self.recent as u32)
    }

    /// Evicts one at a time among the survivors (`keep`: all of them):
    /// the same rule as decode.
    fn select_one_at_a_time(
        &mut self,
        head: HeadId,
        positions: &[u32],
        scores: &[f32],
        newest: u32,
        keep: &mut Vec<usize>,
    ) {
        let HeadId { layer, kv_head } = head;
        let mut pos: Vec<u32> = positions.to_vec();
        let mut sc: Vec<f32> = scores.to_vec();
        while keep.len() > self.budget {
            let Some(v) = self.victim(layer, kv_head, &pos, &sc, newest) else { break };
            keep.remove(v);
            pos.remove(v);
            sc.remove(v);
        }
    }

    /// [`TokenEviction::select_after_prefill`]'s choice without evicting one
    /// at a time (each eviction a scan and a shift of every survivor, so
    /// quadratic in the candidates: seconds per layer at 32K): the
    /// eligible candidates ordered by the victim rule's key, then position,
    /// then index (exactly the order in which [`TokenEviction::victim`]
    /// would pick them, since neither eligibility nor keys change while it
    /// evicts), the first `len − budget` of them dropped. False (nothing
    /// done) for random eviction and for a NaN key, whose comparisons the
    /// one-at-a-time scan resolves its own way.
    fn select_lowest_at_once(&self, positions: &[u32], scores: &[f32], newest: u32, keep: &mut Vec<usize>) -> bool {
        let from = self.recent_from(newest);
        let key = |i: usize, p: u32| match self.rule {
            VictimRule::LowestScore => Some(self.score.key(scores[i], p, newest)),
            VictimRule::Oldest => Some(0.0),
            VictimRule::Random { .. } => None,
        };
        let mut order = Vec::with_capacity(positions.len());
        for (i, &p) in positions.iter().enumerate().filter(|(_, &p)| self.eligible(p, from)) {
            match key(i, p) {
                Some(k) if !k.is_nan() => order.push((k, p, i)),
                _ => return false,
            }
        }
        let evict = (positions.len() - self.budget).min(order.len());
        if evict == 0 {
            return true;
        }
        // `partial_cmp` as the scan's tuple comparison (−0 equals +0)
        let by_rank = |a: &(f32, u32, usize), b: &(f32, u32, usize)| {
            a.0.partial_cmp(&b.0).expect("no NaN").then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
        };
        if evict < order.len() {
            order.select_nth_unstable_by(evict - 1, by_rank);
        }
        let mut dropped = vec![false; positions.len()];
        order[..evict].iter().for_each(|&(_, _, i)| dropped[i] = true);
        keep.retain(|&i| !dropped[i]);
        true
    }

    /// Picks one victim among `positions`/`scores` (None if nothing is eligible).
    fn victim(
        &mut self,
        layer: usize,
        kv_head: usize,
        positions: &[u32],
        scores: &[f32],
        newest: u32,
    ) -> Option<usize> {
        let from = self.recent_from(newest);
        match self.rule {
            VictimRule::LowestScore => {
                let mut best: Option<(f32, u32, usize)> = None;
                for (i, &p) in positions.iter().enumerate() {
                    if !self.eligible(p, from) {
                        continue;
                    }
                    let key = self.score.key(scores[i], p, newest);
                    best = match best {
                        Some(b) if (b.0, b.1) <= (key, p) => Some(b),
                        _ => Some((key, p, i)),
                    };
                }
                best.map(|b| b.2)
            }
            VictimRule::Oldest => positions
                .iter()
                .enumerate()
                .filter(|(_, &p)| self.eligible(p, from))
                .min_by_key(|(_, &p)| p)
                .map(|(i, _)| i),
            VictimRule::Random { seed } => {
                self.eligible.clear();
                for (i, &p) in positions.iter().enumerate() {
                    if self.eligible(p, from) {
                        self.eligible.push((p, i));
                    }
                }
                if self.eligible.is_empty() {
                    return None;
                }
                self.eligible.sort_unstable();
                let rng = self.rng(seed, layer, kv_head);
                let r = (rng.next_u64() % self.eligible.len() as u64) as usize;
                Some(self.eligible[r].1)
            }
        }
    }
}

impl CachePolicy for TokenEviction {
    fn name(&self) -> &str {
        self.name
    }

    fn clone_box(&self) -> Box<dyn CachePolicy> {
        Box::new(self.clone())
    }

    fn capacity(&self, _max_len: usize) -> usize {
        self.budget + 1
    }

    fn head_budget(&self, _layer: usize, _kv_head: usize) -> Option<usize> {
        Some(self.budget)
    }

    fn score_aggregation(&self) -> Option<ScoreAgg> {
        self.agg
    }

    fn score_rule(&self) -> ScoreRule {
        self.score
    }

    fn bounded(&self) -> bool {
        true
    }

    fn prefill_chunk(&self) -> Option<usize> {
        self.prefill_chunk
    }

    fn observation(&self) -> Option<Observation> {
        self.observation
    }

    fn after_decode_step(&mut self, head: HeadId, slots: &mut PolicySlots<'_>, probs: &[f32]) -> &[usize] {
        let HeadId { layer, kv_head } = head;
        let len = slots.len();
        self.victims.clear();
        if let Some(agg) = self.agg {
            if self.score.needs_value_norms() {
                slots.value_norms(&mut self.value_row, &mut self.value_norms);
            }
            self.score.update(agg, probs, probs.len() / len, slots.scores_mut(), &self.value_norms);
        }
        if len <= self.budget {
            return &self.victims;
        }
        let newest = slots.positions()[len - 1];
        let by_page = match self.unit {
            EvictionUnit::Page(score) => self.page_victims(layer, kv_head, slots, score, newest),
            EvictionUnit::Token => false,
        };
        let tracing = self.trace_every > 0 && newest.is_multiple_of(self.trace_every);
        let mut k = 0;
        loop {
            if !by_page {
                // one victim per step, but as many as it takes after an
                // allocator lowered the budget below what the head holds
                if slots.len() <= self.budget {
                    break;
                }
                let Some(v) = self.victim(layer, kv_head, slots.positions(), slots.scores(), newest) else { break };
                self.victims.push(v);
            } else if k == self.victims.len() {
                break;
            }
            let v = self.victims[k];
            k += 1;
            let victim_pos = slots.positions()[v];
            let victim_score = self.score.key(slots.scores()[v], victim_pos, newest);
            slots.evict(v);
            if tracing {
                let from = self.recent_from(newest);
                let lowest = slots
                    .positions()
                    .iter()
                    .zip(slots.scores())
                    .filter(|(&p, _)| self.eligible(p, from))
                    .map(|(&p, &s)| self.score.key(s, p, newest))
                    .fold(f32::INFINITY, f32::min);
                self.events.push(EvictionEvent {
                    step: newest,
                    layer,
                    kv_head,
                    victim_pos,
                    victim_score,
                    victim_age: newest - victim_pos,
                    margin: if lowest.is_finite() { lowest - victim_score } else { 0.0 },
                });
            }
        }
        &self.victims
    }

    fn select_after_prefill(&mut self, head: HeadId, positions: &[u32], scores: &[f32], keep: &mut Vec<usize>) {
        keep.clear();
        keep.extend(0..positions.len());
        if positions.len() <= self.budget {
            return;
        }
        let newest = positions.iter().copied().max().unwrap_or(0);
        if !self.select_lowest_at_once(positions, scores, newest, keep) {
            self.select_one_at_a_time(head, positions, scores, newest, keep);
        }
    }

    fn rolls_back_per_token(&self) -> bool {
        // random eviction draws from per-head RNG streams; a trace records events
        !matches!(self.rule, VictimRule::Random { .. }) && self.trace_every == 0
    }

    /// The budget (an allocator may have changed it) and every random
    /// stream drawn from so far, by (layer, KV head).
    fn save_state(&self, out: &mut Vec<u64>) -> Result<(), String> {
        let mut streams: Vec<_> = self.rngs.iter().collect();
        streams.sort_by_key(|(k, _)| **k);
        out.extend([self.budget as u64, self.recent as u64, streams.len() as u64]);
        for (&(l, h), rng) in streams {
            out.extend([l as u64, h as u64, rng.state()]);
        }
        Ok(())
    }

    fn load_state(&mut self, words: &mut &[u64]) -> Result<(), String> {
        let mut next = || super::take_word(words);
        let (budget, recent, n) = (next()? as usize, next()? as usize, next()?);
        if budget == 0 || recent > budget {
            return Err(format!("a saved budget of {budget} slots with {recent} recent ones"));
        }
        (self.budget, self.recent) = (budget, recent);
        self.rngs.clear();
        for _ in 0..n {
            let (l, h, state) = (next()? as usize, next()? as usize, next()?);
            self.rngs.insert((l, h), SplitMix64::from_state(state));
        }
        Ok(())
    }

    fn enable_trace(&mut self, every: u32) {
        self.trace_every = every.max(1);
    }

    fn take_events(&mut self) -> Vec<EvictionEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HeadSlots;

    /// docs/policies.md §1 worked example: B = 6 (3 heavy + 3 recent).
    #[test]
    fn spec_worked_example() {
        let mut h2o = TokenEviction::new(EvictionConfig {
            name: "h2o",
            budget: 6,
            recent: 3,
            sinks: 0,
            rule: VictimRule::LowestScore,
            agg: Some(ScoreAgg::Sum),
            prefill_chunk: None,
            observation: None,
        });
        let mut slots = HeadSlots::new(1, 7);
        for (p, s) in [(1, 2.4), (3, 1.7), (5, 1.2), (8, 0.3), (9, 0.2), (10, 0.0)] {
            let i = slots.push(p, &[0.0], &[0.0]).unwrap();
            slots.scores_mut()[i] = s;
        }
        slots.push(11, &[0.0], &[0.0]).unwrap();
        let probs = [0.20, 0.05, 0.02, 0.08, 0.15, 0.30, 0.20];
        h2o.enable_trace(1);
        h2o.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut slots), &probs);
        let mut kept: Vec<(u32, f32)> = slots.positions().iter().copied().zip(slots.scores().iter().copied()).collect();
        kept.sort_by_key(|k| k.0);
        let want = [(1, 2.60), (3, 1.75), (5, 1.22), (9, 0.35), (10, 0.30), (11, 0.20)];
        assert_eq!(kept.len(), 6);
        for ((p, s), (wp, ws)) in kept.iter().zip(want) {
            assert_eq!(*p, wp);
            assert!((s - ws).abs() < 1e-6, "pos {p}: {s} vs {ws}");
        }
        // the new token took the victim's slot (position 8 was in slot 3)
        assert_eq!(slots.positions()[3], 11);
        let ev = h2o.take_events();
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].victim_pos, ev[0].victim_age), (8, 3));
        assert!((ev[0].victim_score - 0.38).abs() < 1e-6);
        assert!((ev[0].margin - (1.22 - 0.38)).abs() < 1e-6);
    }

    /// The prefill's choice made at once equals evicting one at a time:
    /// scores with ties (±0 among them), shuffled positions, both
    /// deterministic rules, sinks and recent windows, several budgets.
    #[test]
    fn prefill_selection_at_once_matches_one_at_a_time() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for case in 0..200 {
            let n = 1 + next(300) as usize;
            let mut positions: Vec<u32> = (0..n as u32).map(|p| p * 2 + (case % 3)).collect();
            for i in (1..n).rev() {
                positions.swap(i, next(i as u64 + 1) as usize);
            }
            let scores: Vec<f32> = (0..n)
                .map(|_| match next(5) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => next(7) as f32 * 0.25,
                })
                .collect();
            let budget = 1 + next(n as u64 + 2) as usize;
            let recent = next(budget as u64 + 1) as usize;
            let sinks = next(4) as usize;
            let (rule, score) = match case % 3 {
                0 => (VictimRule::LowestScore, ScoreRule::Sum),
                1 => (VictimRule::LowestScore, ScoreRule::Norm),
                _ => (VictimRule::Oldest, ScoreRule::Sum),
            };
            let config = EvictionConfig {
                name: "h2o",
                budget,
                recent,
                sinks,
                rule,
                agg: Some(ScoreAgg::Sum),
                prefill_chunk: None,
                observation: None,
            };
            let mut p = TokenEviction::new(config).with_score(score);
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            p.select_after_prefill(HeadId::new(0, 0), &positions, &scores, &mut fast);
            let newest = positions.iter().copied().max().unwrap();
            slow.extend(0..n);
            if n > budget {
                p.select_one_at_a_time(HeadId::new(0, 0), &positions, &scores, newest, &mut slow);
            }
            assert_eq!(fast, slow, "case {case}: n={n} budget={budget} recent={recent} sinks={sinks}");
        }
    }

    #[test]
    fn ties_evict_the_smaller_position() {
        let mut h2o = TokenEviction::new(EvictionConfig {
            name: "h2o",
            budget: 2,
            recent: 1,
            sinks: 0,
            rule: VictimRule::LowestScore,
            agg: Some(ScoreAgg::Sum),
            prefill_chunk: None,
            observation: None,
        });
        let mut slots = HeadSlots::new(1, 3);
        for p in [4, 2, 7] {
            slots.push(p, &[0.0], &[0.0]).unwrap();
        }
        h2o.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut slots), &[0.25, 0.25, 0.5]);
        let mut kept = slots.positions().to_vec();
        kept.sort();
        assert_eq!(kept, vec![4, 7]);
    }

    #[test]
    fn sink_keeps_first_positions_and_window() {
        let mut sink = TokenEviction::new(EvictionConfig {
            name: "sink",
            budget: 4,
            recent: 2,
            sinks: 2,
            rule: VictimRule::Oldest,
            agg: None,
            prefill_chunk: None,
            observation: None,
        });
        let mut slots = HeadSlots::new(1, 5);
        for t in 0..20u32 {
            slots.push(t, &[0.0], &[0.0]).unwrap();
            let n = slots.len();
            sink.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut slots), &vec![1.0 / n as f32; n]);
        }
        let mut kept = slots.positions().to_vec();
        kept.sort();
        assert_eq!(kept, vec![0, 1, 18, 19]);
    }
}
