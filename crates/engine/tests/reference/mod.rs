//! Obviously-correct f64 reference implementations of the token-eviction
//! policies (SPEC §1): one layer, one KV head, plain loops, sort-based
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

    fn accumulate(policy: &RefPolicy, probs: &[Vec<f64>], cands: &mut [Slot]) {
        let Some(max) = policy.agg_max else { return };
        for (i, c) in cands.iter_mut().enumerate() {
            let col = probs.iter().map(|row| row[i]);
            c.score += if max { col.fold(0.0, f64::max) } else { col.sum() };
        }
    }

    /// The victim among `cands` (SPEC §1 steps 4–5).
    fn victim(&mut self, policy: &RefPolicy, cands: &[Slot]) -> Option<usize> {
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
                cands[a].score.partial_cmp(&cands[b].score).unwrap().then(cands[a].pos.cmp(&cands[b].pos))
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
        let mut cands = self.slots.clone();
        cands.extend(chunk.iter().map(|(p, _, k, v)| Slot { pos: *p, k: k.clone(), v: v.clone(), score: 0.0 }));
        for (p, q, _, _) in chunk {
            let probs = self.attend(q, *p, &cands);
            Self::accumulate(policy, &probs, &mut cands);
        }
        if let Some(b) = policy.budget {
            while cands.len() > b {
                let Some(v) = self.victim(policy, &cands) else { break };
                cands.remove(v);
            }
        }
        self.slots = cands;
    }

    /// One decode step.
    pub fn decode(&mut self, policy: &RefPolicy, pos: u32, q: &[f64], k: &[f64], v: &[f64]) {
        self.slots.push(Slot { pos, k: k.to_vec(), v: v.to_vec(), score: 0.0 });
        let probs = self.attend(q, pos, &self.slots.clone());
        let mut slots = std::mem::take(&mut self.slots);
        Self::accumulate(policy, &probs, &mut slots);
        if let Some(b) = policy.budget {
            if slots.len() > b {
                if let Some(v) = self.victim(policy, &slots) {
                    slots.remove(v);
                }
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
