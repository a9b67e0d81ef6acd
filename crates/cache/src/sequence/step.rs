//! The per-step operations of [`SequenceCache`]: a decode step (append,
//! after-attention: the policy scores and evicts, tied KV heads replay it,
//! CHAI's probe is recorded) and a prefill chunk (gather the candidates,
//! commit the policy's choice). The model calls them around its attention.

use super::SequenceCache;
use crate::error::CacheError;
use crate::policy::{HeadId, Observation, PolicySlots, ScoreAgg, ScoreRule};
use std::ops::Range;

impl SequenceCache {
    /// Appends one token's keys and values at `pos` to every KV head of
    /// `layer` (`keys`/`values`: one `head_dim` row per KV head).
    pub fn append(&mut self, layer: usize, pos: usize, keys: &[f32], values: &[f32]) -> Result<(), CacheError> {
        let d = self.store.head(layer, 0).head_dim();
        for kv in 0..self.store.kv_heads() {
            let r = kv * d;
            if self.store.head_mut(layer, kv).push(pos as u32, &keys[r..r + d], &values[r..r + d]).is_none() {
                return Err(self.store.full_error(layer, kv).into());
            }
        }
        Ok(())
    }

    /// Fails when a representative's KV head of `layer` has no keys (they
    /// were dropped by head sharing): attention could not read them.
    pub fn check_keys(&self, layer: usize) -> Result<(), CacheError> {
        let lh = self.layer_heads(layer);
        let group = lh.representative_of.len() / self.store.kv_heads();
        match lh.reps.iter().find(|&&r| !self.store.head(layer, r / group).has_keys()) {
            Some(&r) => Err(CacheError::MissingKeys { layer, kv_head: r / group }),
            None => Ok(()),
        }
    }

    /// Records a decode step's attention at `pos` into CHAI's probe while
    /// it is collected: `probs` holds each query head's row at `h · stride`
    /// over its KV head's slots (a member reads its representative's row).
    pub fn record_decode_probe(&mut self, layer: usize, pos: usize, probs: &[f32], stride: usize) {
        let Some(sharing) = self.sharing.as_mut().filter(|h| h.recording()) else { return };
        let lh = sharing.layer(layer).unwrap_or(&self.dense).clone();
        let g = lh.representative_of.len() / self.store.kv_heads();
        for (h, &r) in lh.representative_of.iter().enumerate() {
            let positions = self.store.head(layer, r / g).positions();
            sharing.record_probe(layer, h, pos, positions, &probs[r * stride..r * stride + positions.len()]);
        }
    }

    /// Records one query head's attention at `pos` over `positions` into
    /// CHAI's probe while it is collected (prefill chunks).
    pub fn record_probe(&mut self, layer: usize, head: usize, pos: usize, positions: &[u32], probs: &[f32]) {
        if let Some(sharing) = self.sharing.as_mut() {
            sharing.record_probe(layer, head, pos, positions, probs);
        }
    }

    /// After a decode step's attention in `layer` (`probs`: representative
    /// `r`'s probabilities over its KV head's slots at `r · stride`): the
    /// token policy scores and evicts once per component of aligned KV
    /// heads, reading the component's representatives, and every other KV
    /// head of the component replays the same evictions.
    pub fn after_decode_attention(&mut self, layer: usize, probs: &[f32], stride: usize) {
        let deciding = self.policy.layer_decision_pending(layer, self.store.head(layer, 0).len());
        if deciding {
            // the layer overflows for the first time: an allocator splits it
            // among its heads from every head's candidates (this step's
            // attention not yet added), before any head evicts
            let heads: Vec<(&[u32], &[f32])> =
                self.store.layer(layer).iter().map(|h| (h.positions(), h.scores())).collect();
            self.policy.decide_layer(layer, &heads);
            if let Some(cp) = self.checkpoint.as_mut() {
                cp.decided_layer = true;
            }
        }
        self.evict_after_decode(layer, probs, stride);
        if deciding {
            self.fit_heads_to_budgets(layer);
        }
    }

    /// A paged head's capacity follows its share once an allocator has
    /// split the layer (its pages then follow too); see
    /// [`crate::store::HeadSlots::limit_capacity`].
    fn fit_heads_to_budgets(&mut self, layer: usize) {
        for kv in 0..self.store.kv_heads() {
            if let Some(b) = self.policy.head_budget(layer, kv) {
                let head = self.store.head_mut(layer, kv);
                head.limit_capacity((b + 1).min(head.capacity()));
            }
        }
    }

    /// `alloc=global`: one ranking over every (layer, KV head) sets their
    /// budgets; each head then keeps what its own policy picks within its
    /// budget (the prefill's rule) and gives back the slots beyond it.
    pub(super) fn decide_globally(&mut self) {
        let (layers, kv_heads) = (self.store.layers(), self.store.kv_heads());
        let units: Vec<(&[u32], &[f32])> = (0..layers)
            .flat_map(|l| (0..kv_heads).map(move |kv| (l, kv)))
            .map(|(l, kv)| (self.store.head(l, kv).positions(), self.store.head(l, kv).scores()))
            .collect();
        self.policy.decide_global(&units);
        let mut keep = Vec::new();
        for l in 0..layers {
            for kv in 0..kv_heads {
                let head = self.store.head(l, kv);
                self.policy.select_after_prefill(HeadId::new(l, kv), head.positions(), head.scores(), &mut keep);
                self.store.head_mut(l, kv).retain_slots(&keep);
            }
        }
        self.shrink_heads_to_budgets();
    }

    /// Cuts every head's storage to its budget's slots (`alloc=global`,
    /// after its ranking or when a decided cache is loaded).
    pub(super) fn shrink_heads_to_budgets(&mut self) {
        for l in 0..self.store.layers() {
            for kv in 0..self.store.kv_heads() {
                if let Some(b) = self.policy.head_budget(l, kv) {
                    let head = self.store.head_mut(l, kv);
                    head.shrink_to((b + 1).min(head.capacity()).max(head.len()));
                }
            }
        }
    }

    fn evict_after_decode(&mut self, layer: usize, probs: &[f32], stride: usize) {
        let lh = self.sharing.as_ref().and_then(|h| h.layer(layer)).unwrap_or(&self.dense);
        for comp in &lh.components {
            let len = self.store.head(layer, comp.leader).len();
            let rows = &mut self.component_probs;
            rows.resize(comp.reps.len() * len, 0.0);
            for (i, &r) in comp.reps.iter().enumerate() {
                rows[i * len..(i + 1) * len].copy_from_slice(&probs[r * stride..r * stride + len]);
            }
            let mut view = PolicySlots::new(self.store.head_mut(layer, comp.leader));
            let victims = self.policy.after_decode_step(HeadId::new(layer, comp.leader), &mut view, rows);
            for &kv in comp.kv_heads.iter().filter(|&&kv| kv != comp.leader) {
                let head = self.store.head_mut(layer, kv);
                victims.iter().for_each(|&v| head.evict(v));
            }
        }
    }

    /// Fills `cand` with component `component` of `layer`'s candidates for
    /// a chunk of `n` tokens at positions `p0..`: the slots held now, then
    /// the chunk's tokens (`keys`/`values`: `n` rows of every KV head's
    /// `head_dim` floats). K and V are decoded to f32 per KV head of the
    /// component; scores start as the held scores (0 for the chunk). The
    /// last `repeat` of the `n` rows are a KVzip repeat probe
    /// ([`SequenceCache::repeat_probe`]): the model attends with them and
    /// adds their scores, and [`SequenceCache::commit_candidates`] drops
    /// them (their positions here are placeholders).
    #[allow(clippy::too_many_arguments)]
    pub fn gather_candidates(
        &self,
        layer: usize,
        component: usize,
        p0: usize,
        keys: &[f32],
        values: &[f32],
        repeat: usize,
        cand: &mut PrefillCandidates,
    ) -> Result<(), CacheError> {
        let lh = self.layer_heads(layer);
        let comp = &lh.components[component];
        let kv_heads = self.store.kv_heads();
        let d = self.store.head(layer, 0).head_dim();
        let kvd = kv_heads * d;
        let n = values.len() / kvd;
        let leader = self.store.head(layer, comp.leader);
        cand.held = leader.len();
        cand.positions.clear();
        cand.positions.extend_from_slice(leader.positions());
        cand.positions.extend((0..n).map(|t| (p0 + t) as u32));
        cand.scores.clear();
        cand.scores.extend_from_slice(leader.scores());
        cand.scores.resize(cand.held + n, 0.0);
        cand.keys.resize(kv_heads, Vec::new());
        cand.values.resize(kv_heads, Vec::new());
        for &kv in &comp.kv_heads {
            let head = self.store.head(layer, kv);
            let (ck, cv) = (&mut cand.keys[kv], &mut cand.values[kv]);
            ck.clear();
            if head.gather_keys(ck) {
                (0..n).for_each(|t| ck.extend_from_slice(&keys[t * kvd + kv * d..t * kvd + (kv + 1) * d]));
            }
            cv.clear();
            head.gather_values(cv);
            (0..n).for_each(|t| cv.extend_from_slice(&values[t * kvd + kv * d..t * kvd + (kv + 1) * d]));
        }
        cand.scoring = self.score_aggregation().map(|a| (a, self.score_rule()));
        cand.observation = self.policy.observation().filter(|_| cand.scoring.is_some());
        assert!(
            repeat == 0 || (matches!(cand.observation, Some(Observation::Repeat { .. })) && repeat < n),
            "repeat rows are for a KVzip policy's chunk"
        );
        cand.repeat = repeat;
        cand.columns.clear();
        cand.value_norms.clear();
        if let Some((_, rule)) = cand.scoring {
            if rule.column_summable() {
                cand.columns.resize(cand.held + n, 0.0);
            }
            if rule.needs_value_norms() {
                let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
                cand.value_norms.extend(cand.values[comp.leader].chunks_exact(d).map(norm));
            }
        }
        let group = lh.representative_of.len() / kv_heads;
        match comp.reps.iter().find(|&&r| cand.keys[r / group].is_empty()) {
            Some(&r) => Err(CacheError::MissingKeys { layer, kv_head: r / group }),
            None => Ok(()),
        }
    }

    /// After the chunk's attention over `cand` (column sums added to its
    /// scores): the policy picks what stays, and every KV head of the
    /// component absorbs the same choice. The store never holds more than
    /// the policy's capacity.
    pub fn commit_candidates(
        &mut self,
        layer: usize,
        component: usize,
        cand: &mut PrefillCandidates,
    ) -> Result<(), CacheError> {
        if !cand.columns.is_empty() {
            // `vnorm`: each query's attention times the slot's ‖v‖, summed
            // (then pooled, as SnapKV pools the scores it keeps)
            cand.columns.iter_mut().zip(&cand.value_norms).for_each(|(c, n)| *c *= n);
            if let Some(Observation::Window { pool, .. }) = cand.observation {
                cand.pool_columns(pool);
            }
            cand.scores.iter_mut().zip(&cand.columns).for_each(|(sc, p)| *sc += p);
            cand.columns.clear();
        }
        let d = self.store.head(layer, 0).head_dim();
        if cand.repeat > 0 {
            cand.drop_repeat_rows(d);
        }
        if let Some(Observation::Diverse { mass_permille }) = cand.observation {
            let leader = self.layer_heads(layer).components[component].leader;
            cand.rank_by_mass_then_diversity(f64::from(mass_permille) / 1000.0, leader, d);
        }
        if !self.policy.layer_decision_pending(layer, cand.positions.len()) {
            return self.select_and_absorb(layer, component, cand);
        }
        // an allocator splits this layer among its heads from every head's
        // scored candidates: hold each component's back (moved, not copied)
        // until the last one is in, then decide and commit them all
        self.pending.push(std::mem::take(cand));
        if self.pending.len() < self.layer_heads(layer).components.len() {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        let heads: Vec<(&[u32], &[f32])> = pending.iter().map(|c| (&c.positions[..], &c.scores[..])).collect();
        self.policy.decide_layer(layer, &heads);
        for (ci, c) in pending.iter_mut().enumerate() {
            self.select_and_absorb(layer, ci, c)?;
        }
        self.fit_heads_to_budgets(layer);
        // the reused buffers go back to the caller's scratch
        if let Some(c) = pending.pop() {
            *cand = c;
        }
        Ok(())
    }

    /// The policy's choice among `cand`, absorbed by every KV head of the
    /// component.
    fn select_and_absorb(
        &mut self,
        layer: usize,
        component: usize,
        cand: &mut PrefillCandidates,
    ) -> Result<(), CacheError> {
        let lh = self.sharing.as_ref().and_then(|h| h.layer(layer)).unwrap_or(&self.dense);
        let comp = &lh.components[component];
        let head = HeadId::new(layer, comp.leader);
        self.policy.select_after_prefill(head, &cand.positions, &cand.scores, &mut cand.keep);
        let d = self.store.head(layer, 0).head_dim();
        let old = cand.held;
        for &kv in &comp.kv_heads {
            let chunk_keys = if cand.keys[kv].is_empty() { &[][..] } else { &cand.keys[kv][old * d..] };
            let head = self.store.head_mut(layer, kv);
            let ok = head.absorb_chunk(
                &cand.keep,
                &cand.scores,
                chunk_keys,
                &cand.values[kv][old * d..],
                &cand.positions[old..],
            );
            if !ok {
                return Err(self.store.full_error(layer, kv).into());
            }
        }
        Ok(())
    }
}

/// One component's prefill candidates: the slots held before the chunk,
/// then the chunk's tokens. The cache fills it
/// ([`SequenceCache::gather_candidates`]), the model attends over it and
/// adds column sums to its scores, and the cache commits the policy's
/// choice ([`SequenceCache::commit_candidates`]). Reused across chunks.
#[derive(Default)]
pub struct PrefillCandidates {
    held: usize,
    positions: Vec<u32>,
    scores: Vec<f32>,
    /// Per KV head of the component: K (empty when dropped) and V, f32.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    keep: Vec<usize>,
    /// How the policy folds attention into scores (`None`: it does not).
    scoring: Option<(ScoreAgg, ScoreRule)>,
    /// Column sums of a summable rule, added to the scores at commit.
    columns: Vec<f32>,
    /// ‖v‖ of the leader's candidates, for rules that weight by it.
    value_norms: Vec<f32>,
    /// SnapKV: only the chunk's last queries score, their sums max-pooled.
    observation: Option<Observation>,
    /// KVzip: how many of the chunk's last rows are its repeat probe. Only
    /// they score, each candidate by the most attention any repeat row of
    /// its piece (any query head of the group) paid it: the model folds
    /// their rows with [`repeat_attention_into`] and adds each piece's
    /// maximum with [`PrefillCandidates::add_column_sums`]
    /// ([`PrefillCandidates::observe_query`] ignores a KVzip chunk's rows);
    /// then they leave. 0: not a KVzip chunk.
    repeat: usize,
    /// Pooling workspace: candidate indices by position, pooled sums.
    by_position: Vec<usize>,
    pooled: Vec<f32>,
}

impl PrefillCandidates {
    /// Candidates that were slots before the chunk.
    pub fn held(&self) -> usize {
        self.held
    }
    /// Original positions of every candidate.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }
    /// The policy's score aggregation when every chunk query's attention
    /// counts (`None`: no scoring, or only an observation window's).
    pub fn score_aggregation(&self) -> Option<ScoreAgg> {
        let every_query = matches!(self.observation, None | Some(Observation::Diverse { .. }));
        self.scoring.filter(|_| every_query).map(|(a, _)| a)
    }

    /// How many of the chunk's last queries score the candidates when not
    /// every query does: SnapKV's window, or the last queries an
    /// order-dependent rule's scores depend on
    /// ([`ScoreRule::deciding_queries`]: TOVA's last query). The model
    /// reports each of them with [`PrefillCandidates::observe_query`]
    /// after the tiled kernel (`None`: every query or none).
    pub fn observation_queries(&self) -> Option<usize> {
        let n = self.positions.len() - self.held;
        match self.observation {
            Some(Observation::Window { window, .. }) => Some(window.min(n)),
            _ => self.scoring_rule_replay().map(|w| w.min(n)),
        }
    }

    /// The deciding queries of an order-dependent score rule that scores
    /// this chunk by its queries' attention (not by expected attention, a
    /// predictor or a repeat probe).
    fn scoring_rule_replay(&self) -> Option<usize> {
        let (_, rule) = self.scoring?;
        let by_queries = self.repeat == 0 && self.expected_attention().is_none() && self.kvzap().is_none();
        if rule.column_summable() || !by_queries || self.score_aggregation().is_none() {
            return None;
        }
        rule.deciding_queries()
    }

    /// The aggregation of column sums that every query of the chunk adds to
    /// the candidates' scores, where the rule is a sum (the tiled kernel's
    /// second pass; `None` for order-dependent rules, replayed instead).
    pub fn column_sum_aggregation(&self) -> Option<ScoreAgg> {
        self.score_aggregation().filter(|_| self.scoring.is_some_and(|(_, rule)| rule.column_summable()))
    }

    /// Expected attention: the future positions to average the rotation
    /// over and the first positions left out (sinks); the model adds each
    /// candidate's expected attention to its scores with
    /// [`PrefillCandidates::add_column_sums`] (`None`: not this mode).
    pub fn expected_attention(&self) -> Option<(usize, usize)> {
        match self.observation {
            Some(Observation::Expected { future, skip }) => Some((future, skip)),
            _ => None,
        }
    }

    /// KVzap: the predictor file (`Some(None)`: the model's own); the
    /// model adds each chunk token's predicted score with
    /// [`PrefillCandidates::add_column_sums`] (`None`: not this mode).
    pub fn kvzap(&self) -> Option<Option<&'static str>> {
        match self.observation {
            Some(Observation::Kvzap { file }) => Some(file),
            _ => None,
        }
    }

    /// Drops the repeat probe's candidates (the chunk's last rows) before
    /// the policy chooses: they only scored.
    fn drop_repeat_rows(&mut self, d: usize) {
        let len = self.positions.len() - self.repeat;
        self.positions.truncate(len);
        self.scores.truncate(len);
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            rows.truncate(len * d);
        }
        self.value_norms.truncate(len);
        self.repeat = 0;
    }

    /// ADAPTIVE_RKV's ranking, written into the scores so that the
    /// policy's lowest-score rule keeps it: the candidates with the highest
    /// attention scores, taken until they hold `mass` of the total, score
    /// 2 + their attention (their order kept); every other candidate scores
    /// its diversity, 1 − its key's mean cosine similarity to the others'
    /// (in [0, 2]; the KV head `leader`'s keys). So the budget holds the
    /// mass first and fills up with the keys least like the rest.
    fn rank_by_mass_then_diversity(&mut self, mass: f64, leader: usize, d: usize) {
        let n = self.positions.len();
        let keys = &self.keys[leader];
        if n < 2 || keys.is_empty() {
            return;
        }
        fn unit(k: &[f32]) -> impl Iterator<Item = f64> + '_ {
            let norm = k.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
            k.iter().map(move |&x| if norm > 0.0 { f64::from(x) / norm } else { 0.0 })
        }
        // the mean unit key: a key's mean cosine similarity to all n is its dot with it
        let mut mean = vec![0f64; d];
        for k in keys.chunks_exact(d) {
            mean.iter_mut().zip(unit(k)).for_each(|(m, x)| *m += x / n as f64);
        }
        let total: f64 = self.scores.iter().map(|&s| f64::from(s)).sum();
        let mut order: Vec<usize> = (0..n).collect();
        let positions = &self.positions;
        order.sort_by(|&a, &b| self.scores[b].total_cmp(&self.scores[a]).then(positions[b].cmp(&positions[a])));
        let mut in_mass = vec![false; n];
        let mut held = 0.0;
        for &i in &order {
            if held >= mass * total {
                break;
            }
            in_mass[i] = true;
            held += f64::from(self.scores[i]);
        }
        for (i, k) in keys.chunks_exact(d).enumerate() {
            self.scores[i] = if in_mass[i] {
                2.0 + self.scores[i]
            } else {
                // self-similarity (1) left out of the mean over the others
                let to_all: f64 = unit(k).zip(&mean).map(|(x, m)| x * m).sum();
                (1.0 - (n as f64 * to_all - 1.0) / (n - 1) as f64) as f32
            };
        }
    }

    /// How the policy folds a query head group's attention (also for
    /// expected attention's group average).
    pub fn aggregation(&self) -> Option<ScoreAgg> {
        self.scoring.map(|(a, _)| a)
    }

    /// Max-pools the column sums over `k` neighbouring candidates by position.
    fn pool_columns(&mut self, k: usize) {
        let half = k / 2;
        let n = self.columns.len();
        self.by_position.clear();
        self.by_position.extend(0..n);
        let positions = &self.positions;
        self.by_position.sort_by_key(|&i| positions[i]);
        self.pooled.clear();
        self.pooled.resize(n, 0.0);
        for (r, &i) in self.by_position.iter().enumerate() {
            let window = &self.by_position[r.saturating_sub(half)..(r + half + 1).min(n)];
            self.pooled[i] = window.iter().map(|&j| self.columns[j]).fold(f32::NEG_INFINITY, f32::max);
        }
        std::mem::swap(&mut self.columns, &mut self.pooled);
    }

    /// True when the policy's score rule depends on the order of every
    /// query (`decay:G`, G > 0): the chunk must be attended query by query
    /// and each query reported with [`PrefillCandidates::observe_query`].
    /// Otherwise the rule is a plain column sum, added in any blocking
    /// ([`PrefillCandidates::add_column_sums`]), or depends on the last
    /// few queries only ([`PrefillCandidates::observation_queries`]).
    pub fn needs_every_query(&self) -> bool {
        self.scoring.is_some_and(|(_, rule)| rule.needs_every_query())
    }

    /// Reports one chunk query's attention over the first `visible`
    /// candidates (`probs`: `group × visible`, the rows reading them): a
    /// summable rule adds it to the column sums, any other rule updates
    /// the visible candidates' scores now, as a decode step would.
    pub fn observe_query(&mut self, visible: usize, probs: &[f32], group: usize) {
        let Some((agg, rule)) = self.scoring else { return };
        if self.repeat > 0 {
            // the prompt's rows do not score, and the model folds the probe's
            return;
        }
        if self.expected_attention().is_some() || self.kvzap().is_some() {
            // scored by the query distribution or the predictor instead
            // (the model adds it)
            return;
        }
        if let Some(w) = self.observation_queries() {
            // chunk query t sees held + t + 1 candidates; only the last w count
            let (t, n) = (visible - self.held - 1, self.positions.len() - self.held);
            if t + w < n {
                return;
            }
        }
        if rule.column_summable() {
            agg.accumulate(&probs[..group * visible], group, &mut self.columns[..visible]);
        } else {
            // no rule that reads value norms is order-dependent
            rule.update(agg, &probs[..group * visible], group, &mut self.scores[..visible], &[]);
        }
    }

    /// Adds column sums computed elsewhere (the tiled kernel's, one block
    /// of queries at a time, in block order; expected attention's; a
    /// predictor's) to the chunk's column sums, which the commit weights by
    /// each candidate's ‖v‖ under `vnorm` and adds to the scores (a rule
    /// that is no sum takes them into its scores directly). So `sum`,
    /// `norm` and `vnorm` share one tiled pass in a shared prefill.
    pub fn add_column_sums(&mut self, sums: &[f32]) {
        let into = if self.columns.is_empty() { &mut self.scores } else { &mut self.columns };
        into.iter_mut().zip(sums).for_each(|(c, p)| *c += p);
    }
    /// What decides the scores a chunk's attention adds to these
    /// candidates: the aggregation, the rule (`sum`, `norm` and `vnorm`
    /// add the same column sums, `vnorm` weights them at the commit) and
    /// the observation (SnapKV's window, expected attention…). `None`: the policy
    /// does not score. Caches sharing a prefill whose candidates have equal
    /// keys get equal scores from it ([`PrefillCandidates::attention_scores`]).
    pub fn scoring_key(&self) -> Option<ScoringKey> {
        let (agg, rule) = self.scoring?;
        // ADAPTIVE_RKV re-ranks plain column sums when it commits
        let observation = self.observation.filter(|o| !matches!(o, Observation::Diverse { .. }));
        // plain column sums are shared by `sum`, `norm` and `vnorm`
        Some(ScoringKey { agg, rule: (!rule.column_summable()).then_some(rule), observation })
    }

    /// The scores and column sums the chunk's attention has added so far:
    /// computed once for one cache of a shared prefill and loaded into the
    /// others with the same [`PrefillCandidates::scoring_key`] by
    /// [`PrefillCandidates::load_attention_scores`], instead of attending again.
    pub fn attention_scores(&self) -> AttentionScores {
        AttentionScores { scores: self.scores.clone(), columns: self.columns.clone() }
    }

    /// Replaces the candidates' scores and column sums by another cache's
    /// ([`PrefillCandidates::attention_scores`]): valid when both gathered
    /// the same candidates from empty caches and have the same scoring key.
    pub fn load_attention_scores(&mut self, from: &AttentionScores) {
        assert_eq!(from.scores.len(), self.scores.len(), "attention scores of other candidates");
        assert_eq!(from.columns.len(), self.columns.len(), "column sums of other candidates");
        self.scores.copy_from_slice(&from.scores);
        self.columns.copy_from_slice(&from.columns);
    }

    /// What one piece of a KVzip probe attends to, as candidates of their
    /// own in `piece_view`: the first `sinks` candidates, the piece's
    /// `piece` (its part of the prompt), then the probe rows `own` placed
    /// at positions `own_pos0..` (the repeat follows the prompt). Held
    /// count: sinks and piece, so probe row j sees them and the rows up to
    /// it, as a chunk's row j sees the held slots. Keys and values of
    /// `kv_heads` only; nothing scores.
    pub fn gather_probe_piece(
        &self,
        (sinks, piece, own): (usize, Range<usize>, Range<usize>),
        own_pos0: u32,
        kv_heads: &[usize],
        piece_view: &mut PrefillCandidates,
    ) {
        let v = piece_view;
        let rows = || (0..sinks).chain(piece.clone()).chain(own.clone());
        v.held = sinks + piece.len();
        v.positions.clear();
        v.positions.extend(rows().take(v.held).map(|i| self.positions[i]));
        v.positions.extend((0..own.len() as u32).map(|j| own_pos0 + j));
        v.keys.resize(self.keys.len(), Vec::new());
        v.values.resize(self.values.len(), Vec::new());
        for &kv in kv_heads {
            for (src, dst) in [(&self.keys[kv], &mut v.keys[kv]), (&self.values[kv], &mut v.values[kv])] {
                dst.clear();
                if !src.is_empty() {
                    let d = src.len() / self.positions.len();
                    rows().for_each(|i| dst.extend_from_slice(&src[i * d..(i + 1) * d]));
                }
            }
        }
        v.scores.clear();
        v.scores.resize(v.positions.len(), 0.0);
        (v.scoring, v.observation, v.repeat) = (None, None, 0);
        v.columns.clear();
        v.value_norms.clear();
    }

    /// KV head `kv`'s candidate keys (`len × head_dim`; empty when it has none).
    pub fn keys(&self, kv: usize) -> &[f32] {
        &self.keys[kv]
    }
    /// KV head `kv`'s candidate values (`len × head_dim`).
    pub fn values(&self, kv: usize) -> &[f32] {
        &self.values[kv]
    }
}

/// KVzip's fold of one repeat query (`probs`: `group × len`, the group's
/// rows): `scores[i] = max(scores[i], max over the group of probs[·][i])`.
/// A maximum, so blocks of queries may be folded in any order and merged
/// by their elementwise maximum.
pub fn repeat_attention_into(probs: &[f32], group: usize, scores: &mut [f32]) {
    let len = scores.len();
    for h in 0..group {
        scores.iter_mut().zip(&probs[h * len..(h + 1) * len]).for_each(|(s, &p)| *s = s.max(p));
    }
}

/// See [`PrefillCandidates::scoring_key`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoringKey {
    agg: ScoreAgg,
    /// `None` for the rules that add plain column sums (`sum`, `norm`, `vnorm`).
    rule: Option<ScoreRule>,
    observation: Option<Observation>,
}

/// See [`PrefillCandidates::attention_scores`].
#[derive(Clone, Debug)]
pub struct AttentionScores {
    scores: Vec<f32>,
    columns: Vec<f32>,
}

#[cfg(test)]
#[path = "step_tests.rs"]
mod step_tests;
