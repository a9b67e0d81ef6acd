//! Sliding-window layers under any token policy.
//!
//! On a *local* layer (Mistral's every layer, Gemma 3's five of six) a query
//! at position `p` attends only to positions `p + 1 − W ..= p`. A token that
//! leaves the window can never be read again on that layer, so the cache
//! drops it there whatever the policy says, and the layer never holds more
//! than `W` slots (the `W − 1` that the next query still sees, plus that
//! query's own). The token policy keeps governing every *global* layer,
//! and the local layers too wherever its budget is smaller than the
//! window: it picks its victims first, then the token that left the window
//! (if the policy still held it) follows. With `full`, a local layer is
//! exactly a window of `W − 1` recent tokens (llama.cpp keeps the same
//! bound for its SWA cache).

use super::{CachePolicy, EvictionEvent, ScoreAgg};
use super::{HeadId, PolicySlots};

/// A token policy with sliding-window layers (see the module docs).
pub struct SlidingWindowLayers {
    inner: Box<dyn CachePolicy>,
    window: usize,
    local: Vec<bool>,
    victims: Vec<usize>,
}

impl SlidingWindowLayers {
    /// Wraps `inner`; `local[l]` marks layer `l` as windowed by `window`.
    pub fn new(inner: Box<dyn CachePolicy>, window: usize, local: Vec<bool>) -> Self {
        assert!(window >= 1, "a sliding window holds at least the query's own token");
        SlidingWindowLayers { inner, window, local, victims: Vec::new() }
    }

    fn is_local(&self, layer: usize) -> bool {
        self.local.get(layer).copied().unwrap_or(false)
    }

    /// First position the query after `newest` can still see on a local layer.
    fn first_needed(&self, newest: u32) -> u64 {
        (newest as u64 + 2).saturating_sub(self.window as u64)
    }
}

impl CachePolicy for SlidingWindowLayers {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn clone_box(&self) -> Box<dyn CachePolicy> {
        Box::new(SlidingWindowLayers {
            inner: self.inner.clone_box(),
            window: self.window,
            local: self.local.clone(),
            victims: Vec::new(),
        })
    }

    fn capacity(&self, max_len: usize) -> usize {
        self.inner.capacity(max_len)
    }

    fn layer_capacity(&self, layer: usize, max_len: usize) -> usize {
        let inner = self.inner.layer_capacity(layer, max_len);
        if self.is_local(layer) {
            inner.min(self.window)
        } else {
            inner
        }
    }

    fn head_budget(&self, layer: usize, kv_head: usize) -> Option<usize> {
        self.inner.head_budget(layer, kv_head)
    }

    fn layer_decision_pending(&self, layer: usize, candidates: usize) -> bool {
        self.inner.layer_decision_pending(layer, candidates)
    }

    fn decide_layer(&mut self, layer: usize, heads: &[(&[u32], &[f32])]) {
        self.inner.decide_layer(layer, heads)
    }

    fn rolls_back_per_token(&self) -> bool {
        self.inner.rolls_back_per_token()
    }

    fn save_state(&self, out: &mut Vec<u64>) -> Result<(), String> {
        self.inner.save_state(out)
    }

    fn load_state(&mut self, words: &mut &[u64]) -> Result<(), String> {
        self.inner.load_state(words)
    }

    fn bounded(&self) -> bool {
        self.inner.bounded() || self.local.iter().all(|&l| l)
    }

    fn score_aggregation(&self) -> Option<ScoreAgg> {
        self.inner.score_aggregation()
    }

    fn score_rule(&self) -> super::ScoreRule {
        self.inner.score_rule()
    }

    fn prefill_chunk(&self) -> Option<usize> {
        self.inner.prefill_chunk()
    }

    fn observation(&self) -> Option<super::token::Observation> {
        self.inner.observation()
    }

    fn after_decode_step(&mut self, head: HeadId, slots: &mut PolicySlots<'_>, probs: &[f32]) -> &[usize] {
        if !self.is_local(head.layer) {
            return self.inner.after_decode_step(head, slots, probs);
        }
        let newest = slots.positions().last().copied();
        self.victims.clear();
        self.victims.extend_from_slice(self.inner.after_decode_step(head, slots, probs));
        let Some(newest) = newest else { return &self.victims };
        let first = self.first_needed(newest);
        // highest slot first: `evict` moves the last slot into the hole, and
        // every slot above `i` has already been checked
        for i in (0..slots.len()).rev() {
            if (slots.positions()[i] as u64) < first {
                slots.evict(i);
                self.victims.push(i);
            }
        }
        &self.victims
    }

    fn select_after_prefill(&mut self, head: HeadId, positions: &[u32], scores: &[f32], keep: &mut Vec<usize>) {
        self.inner.select_after_prefill(head, positions, scores, keep);
        if self.is_local(head.layer) {
            if let Some(&newest) = positions.iter().max() {
                let first = self.first_needed(newest);
                keep.retain(|&i| positions[i] as u64 >= first);
            }
        }
    }

    fn enable_trace(&mut self, every: u32) {
        self.inner.enable_trace(every)
    }

    fn take_events(&mut self) -> Vec<EvictionEvent> {
        self.inner.take_events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;
    use crate::store::HeadSlots;

    fn push(h: &mut HeadSlots, p: u32) {
        h.push(p, &[p as f32; 2], &[p as f32; 2]).unwrap();
    }

    /// Under `full`, a local layer holds exactly the last W − 1 positions
    /// after every step, and a global layer everything.
    #[test]
    fn full_policy_keeps_the_window_on_local_layers_only() {
        let w = 4;
        let mut p = SlidingWindowLayers::new(PolicySpec::parse("full").unwrap().build(100), w, vec![true, false]);
        assert_eq!(p.layer_capacity(0, 100), w);
        assert_eq!(p.layer_capacity(1, 100), 100);
        let mut local = HeadSlots::new(2, p.layer_capacity(0, 100));
        let mut global = HeadSlots::new(2, p.layer_capacity(1, 100));
        for pos in 0..20u32 {
            push(&mut local, pos);
            push(&mut global, pos);
            let probs = vec![1.0 / local.len() as f32; local.len()];
            p.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut local), &probs);
            let probs = vec![1.0 / global.len() as f32; global.len()];
            p.after_decode_step(HeadId::new(1, 0), &mut PolicySlots::new(&mut global), &probs);
            let mut held = local.positions().to_vec();
            held.sort_unstable();
            let from = (pos + 2).saturating_sub(w as u32);
            assert_eq!(held, (from..=pos).collect::<Vec<_>>(), "after position {pos}");
            assert_eq!(global.len(), pos as usize + 1);
        }
    }

    /// H2O with a budget below the window still decides on a local layer,
    /// and a heavy hitter that leaves the window is dropped.
    #[test]
    fn a_small_budget_governs_and_the_window_still_applies() {
        let w = 6;
        let spec = PolicySpec::parse("h2o:heavy=2,recent=1").unwrap();
        let mut p = SlidingWindowLayers::new(spec.build(100), w, vec![true]);
        assert_eq!(p.layer_capacity(0, 100), 4);
        let mut h = HeadSlots::new(2, 4);
        for pos in 0..30u32 {
            push(&mut h, pos);
            // position 0 would be the heaviest hitter forever
            let probs: Vec<f32> = h.positions().iter().map(|&q| if q == 0 { 0.9 } else { 0.01 }).collect();
            p.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut h), &probs);
            assert!(h.len() <= 3);
            let first = (pos + 2).saturating_sub(w as u32);
            assert!(h.positions().iter().all(|&q| q >= first), "position {pos}: {:?}", h.positions());
        }
        // prefill selection drops what the next query cannot see
        let positions: Vec<u32> = (0..10).collect();
        let mut keep = Vec::new();
        p.select_after_prefill(HeadId::new(0, 0), &positions, &[1.0; 10], &mut keep);
        assert!(keep.iter().all(|&i| positions[i] >= 5), "{keep:?}");
    }
}
