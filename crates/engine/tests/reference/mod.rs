//! Obviously-correct f64 reference implementations of the token-eviction
//! policies (docs/policies.md §1): one layer, one KV head, plain loops, sort-based
//! recent window. The optimized engine is compared against these step by
//! step.
#![allow(dead_code)]

/// Victim rule, as in the spec grammar.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    LowestScore,
    Oldest,
    Random { seed: u64 },
}

/// Score family (what `score=` selects), written out independently of
/// the engine's `ScoreRule`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RefScore {
    /// score += attention (H2O).
    Sum,
    /// score += attention; ranked by score / (newest − pos + 1).
    Norm,
    /// score = g · score + attention.
    Decay(f64),
    /// score = attention of the current query.
    Tova,
    /// score += attention · ‖v‖.
    VNorm,
    /// The last `window` steps as bits (1 = the group's mean attention was
    /// ≥ threshold / visible); ranked by the number of ones.
    Persist { window: u32, threshold: f64 },
}

/// Policy parameters in slots.
#[derive(Clone, Copy, Debug)]
pub struct RefPolicy {
    /// None = `full` (never evict).
    pub budget: Option<usize>,
    pub recent: usize,
    pub sinks: usize,
    pub rule: Rule,
    /// None = no scoring; Some(false) = sum, Some(true) = max.
    pub agg_max: Option<bool>,
    pub score: RefScore,
    /// SnapKV prefill: (observation window, pooling kernel).
    pub observe: Option<(usize, usize)>,
    /// Expected-attention prefill.
    pub expect: Option<RefExpect>,
    /// KVzip prefill: the chunk's repeat rows score it, in pieces of this
    /// many prompt tokens (see [`RefHead::prefill_candidates_repeat`]).
    pub kvzip: Option<usize>,
    /// ADAPTIVE_RKV prefill: the attention-mass share ranked first (see
    /// [`RefHead::mass_then_diversity`]).
    pub rkv: Option<f64>,
}

/// Expected attention's parameters and the model's RoPE (over the whole
/// head).
#[derive(Clone, Copy, Debug)]
pub struct RefExpect {
    pub future: usize,
    /// Positions below this are left out (the sinks).
    pub skip: usize,
    pub theta: f64,
    /// Pairs (i, i + d/2) (Hugging Face), else (2i, 2i + 1) (GGUF, llama2.c).
    pub half_split: bool,
}

/// The d × d RoPE rotation whose pair i turns by the angle whose
/// (cos, sin) `cos_sin` gives for the pair's frequency.
fn rotation(d: usize, e: &RefExpect, cos_sin: impl Fn(f64) -> (f64, f64)) -> Vec<Vec<f64>> {
    let mut r = vec![vec![0.0; d]; d];
    for i in 0..d / 2 {
        let f = e.theta.powf(-((2 * i) as f64) / d as f64);
        let (c, s) = cos_sin(f);
        let (a, b) = if e.half_split { (i, i + d / 2) } else { (2 * i, 2 * i + 1) };
        r[a][a] = c;
        r[a][b] = -s;
        r[b][a] = s;
        r[b][b] = c;
    }
    r
}

fn mat_vec(m: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
    m.iter().map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn mat_mul(a: &[Vec<f64>], b: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = b[0].len();
    a.iter().map(|row| (0..n).map(|j| row.iter().zip(b).map(|(x, brow)| x * brow[j]).sum()).collect()).collect()
}

fn transpose(a: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..a[0].len()).map(|j| a.iter().map(|row| row[j]).collect()).collect()
}

#[derive(Clone, Debug)]
pub struct Slot {
    pub pos: u32,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub score: f64,
}

/// One (layer, KV head) under a policy.
/// One chunk token for the reference: (position, queries `g × d`, key, value).
pub type RefToken = (u32, Vec<f64>, Vec<f64>, Vec<f64>);

pub struct RefHead {
    pub d: usize,
    pub g: usize,
    pub slots: Vec<Slot>,
    rng: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RefHead {
    pub fn new(d: usize, g: usize, policy: &RefPolicy, layer: usize, kv_head: usize) -> Self {
        let rng = match policy.rule {
            Rule::Random { seed } => kvslim_cache::policy::token::head_rng_seed(seed, layer, kv_head),
            _ => 0,
        };
        RefHead { d, g, slots: Vec::new(), rng }
    }

    /// Softmax attention of `g` queries (`g × d`) at position `qpos` over
    /// `cands`, causal by position; returns `g` rows of probabilities.
    fn attend(&self, q: &[f64], qpos: u32, cands: &[Slot]) -> Vec<Vec<f64>> {
        let scale = 1.0 / (self.d as f64).sqrt();
        (0..self.g)
            .map(|h| {
                let qh = &q[h * self.d..(h + 1) * self.d];
                let logits: Vec<Option<f64>> = cands
                    .iter()
                    .map(|c| (c.pos <= qpos).then(|| qh.iter().zip(&c.k).map(|(a, b)| a * b).sum::<f64>() * scale))
                    .collect();
                let max = logits.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| l.map_or(0.0, |l| (l - max).exp())).collect();
                let z: f64 = e.iter().sum();
                e.iter().map(|x| x / z).collect()
            })
            .collect()
    }

    /// One query at `qpos` has attended (`probs`: one row per query head of
    /// the group over `cands`): every candidate's score moves by the family.
    fn accumulate(policy: &RefPolicy, probs: &[Vec<f64>], cands: &mut [Slot], qpos: u32) {
        let Some(max) = policy.agg_max else { return };
        let visible = cands.iter().filter(|c| c.pos <= qpos).count() as f64;
        for (i, c) in cands.iter_mut().enumerate() {
            let col = probs.iter().map(|row| row[i]);
            let a = if max { col.fold(0.0, f64::max) } else { col.sum() };
            c.score = match policy.score {
                RefScore::Sum | RefScore::Norm => c.score + a,
                RefScore::Decay(g) => g * c.score + a,
                RefScore::Tova => a,
                RefScore::VNorm => c.score + a * c.v.iter().map(|x| x * x).sum::<f64>().sqrt(),
                RefScore::Persist { window, threshold } => {
                    let rows = if max { 1.0 } else { probs.len() as f64 };
                    let hit = a / rows >= threshold / visible;
                    let bits = (c.score as u64) * 2 + hit as u64;
                    (bits % (1u64 << window)) as f64
                }
            };
        }
    }

    /// What the lowest-score rule ranks: the score, or what the family
    /// derives from it (`now`: the position of the latest query).
    fn key(policy: &RefPolicy, c: &Slot, now: u32) -> f64 {
        match policy.score {
            RefScore::Norm => c.score / (now - c.pos + 1) as f64,
            RefScore::Persist { .. } => (c.score as u64).count_ones() as f64,
            _ => c.score,
        }
    }

    /// The victim among `cands` (docs/policies.md §1 steps 4–5) after the query at `now`.
    fn victim(&mut self, policy: &RefPolicy, cands: &[Slot], now: u32) -> Option<usize> {
        let mut by_pos: Vec<u32> = cands.iter().map(|c| c.pos).collect();
        by_pos.sort_unstable_by(|a, b| b.cmp(a));
        let recent: Vec<u32> = by_pos.iter().take(policy.recent).copied().collect();
        let mut eligible: Vec<usize> = (0..cands.len())
            .filter(|&i| !recent.contains(&cands[i].pos) && cands[i].pos as usize >= policy.sinks)
            .collect();
        if eligible.is_empty() {
            return None;
        }
        match policy.rule {
            Rule::LowestScore => eligible.into_iter().min_by(|&a, &b| {
                let (ka, kb) = (Self::key(policy, &cands[a], now), Self::key(policy, &cands[b], now));
                ka.partial_cmp(&kb).unwrap().then(cands[a].pos.cmp(&cands[b].pos))
            }),
            Rule::Oldest => eligible.into_iter().min_by_key(|&i| cands[i].pos),
            Rule::Random { .. } => {
                eligible.sort_by_key(|&i| cands[i].pos);
                let r = (splitmix(&mut self.rng) % eligible.len() as u64) as usize;
                Some(eligible[r])
            }
        }
    }

    /// A prefill chunk: tokens `(pos, q, k, v)`, all attending causally over
    /// the held slots and the chunk, then evictions down to the budget.
    pub fn prefill(&mut self, policy: &RefPolicy, chunk: &[RefToken]) {
        let cands = self.prefill_candidates(policy, chunk);
        let now = chunk.iter().map(|t| t.0).max().unwrap_or(0);
        self.prefill_commit(policy, cands, now);
    }

    /// The held slots and the chunk's tokens with the chunk's attention
    /// added to their scores (nothing evicted yet).
    pub fn prefill_candidates(&self, policy: &RefPolicy, chunk: &[RefToken]) -> Vec<Slot> {
        let mut cands = self.slots.clone();
        cands.extend(chunk.iter().map(|(p, _, k, v)| Slot { pos: *p, k: k.clone(), v: v.clone(), score: 0.0 }));
        if let Some(e) = policy.expect {
            self.expected_attention(policy, &e, chunk, &mut cands);
            return cands;
        }
        match policy.observe {
            None => {
                for (p, q, _, _) in chunk {
                    let probs = self.attend(q, *p, &cands);
                    Self::accumulate(policy, &probs, &mut cands, *p);
                }
                if let Some(mass) = policy.rkv {
                    Self::mass_then_diversity(mass, &mut cands);
                }
            }
            Some((window, pool)) => {
                // SnapKV: the last `window` queries' column sums, max-pooled
                // over `pool` neighbours by position, added to the scores
                let mut cols: Vec<Slot> = cands.iter().map(|c| Slot { score: 0.0, ..c.clone() }).collect();
                for (p, q, _, _) in &chunk[chunk.len().saturating_sub(window)..] {
                    let probs = self.attend(q, *p, &cols);
                    Self::accumulate(policy, &probs, &mut cols, *p);
                }
                let mut order: Vec<usize> = (0..cols.len()).collect();
                order.sort_by_key(|&i| cols[i].pos);
                for (r, &i) in order.iter().enumerate() {
                    let lo = r.saturating_sub(pool / 2);
                    let hi = (r + pool / 2 + 1).min(order.len());
                    cands[i].score += order[lo..hi].iter().map(|&j| cols[j].score).fold(f64::NEG_INFINITY, f64::max);
                }
            }
        }
        cands
    }

    /// ADAPTIVE_RKV: the candidates with the highest scores (newer first on
    /// ties), taken while they hold less than `mass` of the total score,
    /// score 2 + their score; every other one scores 1 − the mean cosine
    /// similarity of its key to each other candidate's key.
    fn mass_then_diversity(mass: f64, cands: &mut [Slot]) {
        let n = cands.len();
        if n < 2 {
            return;
        }
        let total: f64 = cands.iter().map(|c| c.score).sum();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            cands[b].score.partial_cmp(&cands[a].score).unwrap().then(cands[b].pos.cmp(&cands[a].pos))
        });
        let mut in_mass = vec![false; n];
        let mut held = 0.0;
        for &i in &order {
            if held >= mass * total {
                break;
            }
            in_mass[i] = true;
            held += cands[i].score;
        }
        let norm = |k: &[f64]| k.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cos = |a: &[f64], b: &[f64]| {
            let (na, nb) = (norm(a), norm(b));
            if na == 0.0 || nb == 0.0 {
                0.0
            } else {
                a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (na * nb)
            }
        };
        let diversity: Vec<f64> = (0..n)
            .map(|j| {
                let others: f64 = (0..n).filter(|&i| i != j).map(|i| cos(&cands[i].k, &cands[j].k)).sum();
                1.0 - others / (n - 1) as f64
            })
            .collect();
        for (j, c) in cands.iter_mut().enumerate() {
            c.score = if in_mass[j] { 2.0 + c.score } else { diversity[j] };
        }
    }

    /// KVzip: `chunk` is a prompt of `prompt` tokens followed by its
    /// probe's pieces, each `(lead, rows, piece)`: `lead` instruction rows
    /// (they attend, score nothing), then the repeat of the prompt tokens
    /// `piece`, `rows` in all, placed right after the prompt. A piece's rows
    /// see the first `sinks` candidates, the piece's prompt tokens and their
    /// own piece's rows up to themselves; each candidate gains the largest
    /// probability a repeat row of a piece that sees it gave it in any
    /// query head of the group; the probe's rows are not candidates
    /// afterwards.
    pub fn prefill_candidates_repeat(
        &self,
        chunk: &[RefToken],
        prompt: usize,
        pieces: &[(usize, usize, std::ops::Range<usize>)],
        sinks: usize,
    ) -> Vec<Slot> {
        let held = self.slots.len();
        let mut cands = self.slots.clone();
        cands.extend(chunk[..prompt].iter().map(|(p, _, k, v)| Slot {
            pos: *p,
            k: k.clone(),
            v: v.clone(),
            score: 0.0,
        }));
        let after = chunk[prompt - 1].0 + 1;
        let mut most = vec![0.0f64; cands.len()];
        let mut row = prompt;
        for (lead, rows, piece) in pieces {
            let first = held + piece.start;
            let seen: Vec<usize> = (0..first.min(sinks)).chain(first..held + piece.end).collect();
            let mut view: Vec<Slot> = seen.iter().map(|&i| cands[i].clone()).collect();
            for j in 0..*rows {
                let (_, q, k, v) = &chunk[row + j];
                let pos = after + j as u32;
                view.push(Slot { pos, k: k.clone(), v: v.clone(), score: 0.0 });
                if j < *lead {
                    continue;
                }
                for probs in self.attend(q, pos, &view) {
                    for (&i, x) in seen.iter().zip(probs) {
                        most[i] = most[i].max(x);
                    }
                }
            }
            row += rows;
        }
        assert_eq!(row, chunk.len(), "the pieces cover the probe's rows");
        for (c, m) in cands.iter_mut().zip(most) {
            c.score += m;
        }
        cands
    }

    /// KVzap: the held slots keep their scores; each chunk token joins
    /// with the score the predictor gave it (`scores[t]`), no attention.
    pub fn prefill_candidates_given(&self, chunk: &[RefToken], scores: &[f64]) -> Vec<Slot> {
        let mut cands = self.slots.clone();
        cands.extend(chunk.iter().zip(scores).map(|((p, _, k, v), &sc)| Slot {
            pos: *p,
            k: k.clone(),
            v: v.clone(),
            score: sc,
        }));
        cands
    }

    /// Expected attention: per query head of the group, the mean and
    /// covariance of the chunk's queries (positions from `skip`) with RoPE
    /// undone, both carried by the rotation averaged over the `future`
    /// positions after the chunk; each candidate from `skip` scores
    /// softmax(μ̃·k/√d + kᵀΣ̃k/(2d)), averaged (or maxed) over the group,
    /// times ‖v‖.
    fn expected_attention(&self, policy: &RefPolicy, e: &RefExpect, chunk: &[RefToken], cands: &mut [Slot]) {
        let d = self.d;
        let next = chunk.last().unwrap().0 as f64 + 1.0;
        let mut avg = vec![vec![0.0; d]; d];
        for p in 0..e.future {
            let r = rotation(d, e, |f| (((next + p as f64) * f).cos(), ((next + p as f64) * f).sin()));
            for (a, b) in avg.iter_mut().flatten().zip(r.iter().flatten()) {
                *a += b / e.future as f64;
            }
        }
        let scored: Vec<usize> = (0..cands.len()).filter(|&j| cands[j].pos as usize >= e.skip).collect();
        let rows: Vec<Vec<f64>> = (0..self.g)
            .map(|h| {
                let qs: Vec<Vec<f64>> = chunk
                    .iter()
                    .filter(|t| t.0 as usize >= e.skip)
                    .map(|(p, q, _, _)| {
                        let undo = rotation(d, e, |f| ((-(*p as f64) * f).cos(), (-(*p as f64) * f).sin()));
                        mat_vec(&undo, &q[h * d..(h + 1) * d])
                    })
                    .collect();
                let m = qs.len() as f64;
                let mu: Vec<f64> = (0..d).map(|i| qs.iter().map(|q| q[i]).sum::<f64>() / m).collect();
                let sigma: Vec<Vec<f64>> = (0..d)
                    .map(|i| {
                        (0..d).map(|j| qs.iter().map(|q| (q[i] - mu[i]) * (q[j] - mu[j])).sum::<f64>() / m).collect()
                    })
                    .collect();
                let mu = mat_vec(&avg, &mu);
                let sigma = mat_mul(&mat_mul(&avg, &sigma), &transpose(&avg));
                let logits: Vec<f64> = scored
                    .iter()
                    .map(|&j| {
                        let k = &cands[j].k;
                        let mean: f64 = mu.iter().zip(k).map(|(a, b)| a * b).sum();
                        let quad: f64 = mat_vec(&sigma, k).iter().zip(k).map(|(a, b)| a * b).sum();
                        mean / (d as f64).sqrt() + quad / (2.0 * d as f64)
                    })
                    .collect();
                let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                logits.iter().map(|l| (l - max).exp() / z).collect()
            })
            .collect();
        for (i, &j) in scored.iter().enumerate() {
            let col = rows.iter().map(|r| r[i]);
            let a =
                if policy.agg_max == Some(true) { col.fold(0.0, f64::max) } else { col.sum::<f64>() / self.g as f64 };
            // the engine keeps scores in f32: an expected attention below
            // f32's range (a head whose softmax peaks hard) is 0 there, and
            // such candidates tie; rounding here keeps the ranking comparable
            cands[j].score += (a * cands[j].v.iter().map(|x| x * x).sum::<f64>().sqrt()) as f32 as f64;
        }
    }

    /// Evicts among scored prefill candidates (after the query at `now`)
    /// down to the budget; the rest become the slots.
    pub fn prefill_commit(&mut self, policy: &RefPolicy, mut cands: Vec<Slot>, now: u32) {
        if let Some(b) = policy.budget {
            while cands.len() > b {
                let Some(v) = self.victim(policy, &cands, now) else { break };
                cands.remove(v);
            }
        }
        self.slots = cands;
    }

    /// One decode step.
    pub fn decode(&mut self, policy: &RefPolicy, pos: u32, q: &[f64], k: &[f64], v: &[f64]) {
        self.push(pos, k, v);
        self.decode_pushed(policy, pos, q);
    }

    /// A decode step's new token joins the slots (score 0).
    pub fn push(&mut self, pos: u32, k: &[f64], v: &[f64]) {
        self.slots.push(Slot { pos, k: k.to_vec(), v: v.to_vec(), score: 0.0 });
    }

    /// The rest of a decode step once the token is in: attend, score, evict.
    pub fn decode_pushed(&mut self, policy: &RefPolicy, pos: u32, q: &[f64]) {
        let probs = self.attend(q, pos, &self.slots.clone());
        let mut slots = std::mem::take(&mut self.slots);
        Self::accumulate(policy, &probs, &mut slots, pos);
        if let Some(b) = policy.budget {
            // one victim a step, more only right after an allocator cut
            // the budget below what the head holds
            while slots.len() > b {
                let Some(v) = self.victim(policy, &slots, pos) else { break };
                slots.remove(v);
            }
        }
        self.slots = slots;
    }

    /// Retained (position, score), ascending by position.
    pub fn kept(&self) -> Vec<(u32, f64)> {
        let mut v: Vec<(u32, f64)> = self.slots.iter().map(|s| (s.pos, s.score)).collect();
        v.sort_by_key(|x| x.0);
        v
    }
}

/// PyramidKV's heavy slots per layer, written out again: the ideal series
/// runs from 2H/(1+R) at the bottom to R times that at the top (mean H);
/// each layer gets the floor, and the slots still missing from L·H go one
/// each to the largest fractional parts (ties: lower layer).
pub fn ref_pyramid(heavy: usize, layers: usize, ratio: f64) -> Vec<usize> {
    if layers <= 1 || heavy == 0 {
        return vec![heavy; layers];
    }
    let bottom = 2.0 * heavy as f64 / (1.0 + ratio);
    let step = (ratio * bottom - bottom) / (layers - 1) as f64;
    let ideal: Vec<f64> = (0..layers).map(|l| (bottom + step * l as f64).max(0.0)).collect();
    let mut out: Vec<usize> = ideal.iter().map(|x| x.floor() as usize).collect();
    let mut by_frac: Vec<usize> = (0..layers).collect();
    by_frac.sort_by(|&a, &b| {
        let (fa, fb) = (ideal[a] - ideal[a].floor(), ideal[b] - ideal[b].floor());
        fb.partial_cmp(&fa).unwrap().then(a.cmp(&b))
    });
    let missing = heavy * layers - out.iter().sum::<usize>();
    for i in 0..missing {
        out[by_frac[i % layers]] += 1;
    }
    out
}

/// AdaKV's split of a layer's `heads.len() · heavy` heavy slots, written
/// out again: per head, its eligible candidates (not among the `recent`
/// newest, not sinks) best first by the family's key (ties: later
/// position); the first ⌊floor · heavy⌋ are the head's own; every other
/// eligible candidate of the layer competes (key, then later position,
/// then lower head) for the remaining slots; unclaimed slots are dealt
/// round-robin from head 0. Returns each head's heavy share.
pub fn ref_ada_shares(heavy: usize, floor: f64, policy: &RefPolicy, heads: &[Vec<Slot>]) -> Vec<usize> {
    let kv = heads.len();
    let own = ((floor * heavy as f64).floor() as usize).min(heavy);
    let mut contest: Vec<(f64, u32, usize)> = Vec::new();
    for (h, slots) in heads.iter().enumerate() {
        let now = slots.iter().map(|c| c.pos).max().unwrap_or(0);
        let mut by_pos: Vec<u32> = slots.iter().map(|c| c.pos).collect();
        by_pos.sort_unstable_by(|a, b| b.cmp(a));
        let recent: Vec<u32> = by_pos.iter().take(policy.recent).copied().collect();
        let mut eligible: Vec<(f64, u32)> = slots
            .iter()
            .filter(|c| !recent.contains(&c.pos) && c.pos as usize >= policy.sinks)
            .map(|c| (RefHead::key(policy, c, now), c.pos))
            .collect();
        eligible.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(b.1.cmp(&a.1)));
        contest.extend(eligible.iter().skip(own).map(|&(k, p)| (k, p, h)));
    }
    contest.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let pool = kv * (heavy - own);
    let mut shares = vec![own; kv];
    for c in contest.iter().take(pool) {
        shares[c.2] += 1;
    }
    let mut left = pool.saturating_sub(contest.len());
    let mut h = 0;
    while left > 0 {
        shares[h % kv] += 1;
        h += 1;
        left -= 1;
    }
    shares
}
