//! Next-token sampling: greedy, temperature, top-k, top-p, seeded.
//! All buffers are kept between calls, so sampling does not allocate in the
//! decode loop.

/// User-facing sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no top-k cut.
    pub top_k: usize,
    /// 1.0 = no nucleus cut.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the bad parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// The project-wide SplitMix64 generator.
pub use kvslim_cache::rng::SplitMix64 as Rng;

/// A sampler with its own RNG stream and reusable candidate buffer.
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    candidates: Vec<(f32, u32)>,
}

/// Index of the largest logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        Sampler { params, rng, candidates: Vec::new() }
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (l / p.temperature, i as u32)));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, |a, b| b.0.total_cmp(&a.0));
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let max = c[0].0;
        let mut sum = 0f32;
        for e in c.iter_mut() {
            e.0 = (e.0 - max).exp();
            sum += e.0;
        }
        c.iter_mut().for_each(|e| e.0 /= sum);
        if p.top_p < 1.0 {
            let mut acc = 0f32;
            let mut keep = c.len();
            for (i, e) in c.iter().enumerate() {
                acc += e.0;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
            let s: f32 = c.iter().map(|e| e.0).sum();
            c.iter_mut().for_each(|e| e.0 /= s);
        }
        let r = self.rng.next_f32();
        let mut acc = 0f32;
        for e in c.iter() {
            acc += e.0;
            if r < acc {
                return e.1;
            }
        }
        c.last().map_or(0, |e| e.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 3, top_p: 1.0, seed: 42 };
        let mut top3: Vec<u32> = (0..50).collect();
        top3.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        top3.truncate(3);
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().all(|t| top3.contains(t)));
        assert!(top3.iter().all(|t| a.contains(t)), "all of the top 3 appear in 200 draws");
        assert_ne!(a, draw(&SamplingParams { seed: 7, ..params.clone() }));
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let logits = [0.0, 5.0, 1.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.01, seed: 1 });
        assert!((0..20).all(|_| s.sample(&logits) == 1));
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(SamplingParams { temperature: -1.0, ..Default::default() }.validate().is_err());
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().is_err());
    }
}
