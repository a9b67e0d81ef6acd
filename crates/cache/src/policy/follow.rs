//! A policy that makes no decisions of its own: it keeps exactly what a
//! reference run kept.
//!
//! Used to separate the two effects of a quantized KV cache: run a
//! reference session (same policy, K/V in f32 or f16) in lockstep with the
//! quantized one, and before each forward of the quantized session hand
//! this policy the reference's kept positions
//! ([`crate::KvStore::kept_positions`]). The quantized run then evicts the
//! same tokens as the reference, so its loss against the reference measures
//! quantization error only, not the feedback of quantized attention scores
//! on eviction decisions.

use super::{CachePolicy, ScoreAgg};
use super::{HeadId, PolicySlots};
use std::sync::{Arc, Mutex};

/// Kept positions per layer, per KV head, ascending (as
/// [`crate::KvStore::kept_positions`] returns them).
pub type KeptSets = Vec<Vec<Vec<u32>>>;

/// The shared handle a driver writes the reference's kept sets into.
pub type SharedKeptSets = Arc<Mutex<KeptSets>>;

/// Keeps, after every decode step and prefill chunk, exactly the positions
/// in the reference set of each (layer, KV head). A (layer, KV head) with
/// no reference set yet keeps everything. Positions the reference keeps but
/// this sequence does not hold are ignored (the driver compares the kept
/// sets to detect that).
#[derive(Clone)]
pub struct FollowDecisions {
    kept: SharedKeptSets,
    capacity: usize,
    bounded: bool,
    prefill_chunk: Option<usize>,
    victims: Vec<usize>,
}

impl FollowDecisions {
    /// Follows the sets in `kept`. `capacity` is the reference policy's
    /// capacity for the sequence (slots per (layer, KV head)); `bounded`
    /// and `prefill_chunk` are the reference policy's, so both sessions are
    /// chunked the same way.
    pub fn new(kept: SharedKeptSets, capacity: usize, bounded: bool, prefill_chunk: Option<usize>) -> Self {
        FollowDecisions { kept, capacity, bounded, prefill_chunk, victims: Vec::new() }
    }

    /// Mirrors `reference` (a freshly built policy) for a sequence of at most `max_len` tokens.
    pub fn mirroring(kept: SharedKeptSets, reference: &dyn CachePolicy, max_len: usize) -> Self {
        Self::new(kept, reference.capacity(max_len), reference.bounded(), reference.prefill_chunk())
    }

    /// A fresh, empty shared handle.
    pub fn handle() -> SharedKeptSets {
        Arc::new(Mutex::new(Vec::new()))
    }

    /// Whether `pos` is in the reference set of (layer, kv_head); `None`
    /// when there is no reference set for it.
    fn wanted<R>(&self, layer: usize, kv_head: usize, f: impl FnOnce(&[u32]) -> R) -> Option<R> {
        let sets = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        sets.get(layer).and_then(|l| l.get(kv_head)).map(|set| f(set))
    }
}

impl CachePolicy for FollowDecisions {
    fn name(&self) -> &str {
        "follow"
    }

    fn clone_box(&self) -> Box<dyn CachePolicy> {
        Box::new(self.clone())
    }

    fn capacity(&self, _max_len: usize) -> usize {
        self.capacity
    }

    fn save_state(&self, _out: &mut Vec<u64>) -> Result<(), String> {
        Err("a policy that replays another run's decisions cannot be saved".into())
    }

    fn bounded(&self) -> bool {
        self.bounded
    }

    fn score_aggregation(&self) -> Option<ScoreAgg> {
        None
    }

    fn prefill_chunk(&self) -> Option<usize> {
        self.prefill_chunk
    }

    /// Evicts every slot whose position the reference did not keep, from the
    /// highest slot index down, so each recorded index is the victim's index
    /// at its own eviction (the slot moved into a victim's place is one
    /// already checked).
    fn after_decode_step(&mut self, head: HeadId, slots: &mut PolicySlots<'_>, _probs: &[f32]) -> &[usize] {
        let HeadId { layer, kv_head } = head;
        self.victims.clear();
        let sets = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = sets.get(layer).and_then(|l| l.get(kv_head)) {
            for (i, p) in slots.positions().iter().enumerate().rev() {
                if set.binary_search(p).is_err() {
                    self.victims.push(i);
                }
            }
        }
        drop(sets);
        self.victims.iter().for_each(|&i| slots.evict(i));
        &self.victims
    }

    fn select_after_prefill(&mut self, head: HeadId, positions: &[u32], _scores: &[f32], keep: &mut Vec<usize>) {
        let HeadId { layer, kv_head } = head;
        keep.clear();
        let found = self.wanted(layer, kv_head, |set| {
            keep.extend((0..positions.len()).filter(|&i| set.binary_search(&positions[i]).is_ok()))
        });
        if found.is_none() {
            keep.extend(0..positions.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;
    use crate::store::HeadSlots;

    fn head(positions: &[u32]) -> HeadSlots {
        let mut h = HeadSlots::new(2, 8);
        for &p in positions {
            h.push(p, &[p as f32; 2], &[p as f32 + 0.5; 2]).unwrap();
        }
        h
    }

    #[test]
    fn decode_keeps_exactly_the_reference_set_and_reports_victims_in_order() {
        let kept = FollowDecisions::handle();
        *kept.lock().unwrap() = vec![vec![vec![0, 2, 5], vec![1, 2, 3, 4, 5]]];
        let mut f = FollowDecisions::new(kept.clone(), 6, true, None);
        let mut h = head(&[0, 1, 2, 3, 4, 5]);
        // a second head replays the victims, as the forward pass does for aligned heads
        let mut mirror = head(&[0, 1, 2, 3, 4, 5]);
        let victims = f.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut h), &[]).to_vec();
        assert_eq!(victims, [4, 3, 1], "highest index first");
        victims.iter().for_each(|&v| mirror.evict(v));
        let sorted = |h: &HeadSlots| {
            let mut p = h.positions().to_vec();
            p.sort_unstable();
            p
        };
        assert_eq!(sorted(&h), [0, 2, 5]);
        assert_eq!(mirror.positions(), h.positions());
        // K/V travel with their positions
        let v = h.decoded_values();
        for (i, &p) in h.positions().iter().enumerate() {
            assert_eq!(v[i * 2], p as f32 + 0.5);
        }
        // nothing to drop: no victims
        assert!(f.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut h), &[]).is_empty());
        // the other head follows its own set
        let mut h1 = head(&[0, 1, 2, 3, 4, 5]);
        assert_eq!(f.after_decode_step(HeadId::new(0, 1), &mut PolicySlots::new(&mut h1), &[]), &[0]);
        assert_eq!(sorted(&h1), [1, 2, 3, 4, 5]);
        // no set for layer 3: keep all
        let mut h3 = head(&[0, 1]);
        assert!(f.after_decode_step(HeadId::new(3, 0), &mut PolicySlots::new(&mut h3), &[]).is_empty());
        assert_eq!(h3.len(), 2);
    }

    #[test]
    fn prefill_keeps_the_candidates_in_the_set() {
        let kept = FollowDecisions::handle();
        let mut f = FollowDecisions::new(kept.clone(), 4, true, Some(16));
        let mut keep = Vec::new();
        f.select_after_prefill(HeadId::new(0, 0), &[7, 3, 9, 10], &[0.0; 4], &mut keep);
        assert_eq!(keep, [0, 1, 2, 3], "no reference yet: keep all");
        *kept.lock().unwrap() = vec![vec![vec![3, 9, 11]]];
        f.select_after_prefill(HeadId::new(0, 0), &[7, 3, 9, 10], &[0.0; 4], &mut keep);
        assert_eq!(keep, [1, 2]);
        assert_eq!(f.prefill_chunk(), Some(16));
    }

    #[test]
    fn mirrors_the_reference_policy() {
        let kept = FollowDecisions::handle();
        let spec = PolicySpec::parse("h2o:heavy=10,recent=6,prefill=stream:8").unwrap();
        let reference = spec.build(100);
        let f = FollowDecisions::mirroring(kept.clone(), reference.as_ref(), 100);
        assert_eq!(f.capacity(1), 17);
        assert!(f.bounded());
        assert_eq!(f.prefill_chunk(), Some(8));
        assert_eq!(f.score_aggregation(), None);
        let c = f.clone_box();
        assert_eq!((c.name(), c.capacity(5)), ("follow", 17));
        let full = FollowDecisions::mirroring(kept, PolicySpec::full().build(100).as_ref(), 100);
        assert_eq!((full.capacity(0), full.bounded()), (100, false));
    }
}
