//! Slot storage: per layer, per KV head, fixed-capacity arrays of K, V,
//! original position and accumulated score. Slots are physical addresses:
//! their order is not position order, and an eviction overwrites in place.

/// Error when a write would exceed the capacity chosen at creation.
#[derive(Debug, thiserror::Error)]
#[error("KV cache full: layer {layer} KV head {kv_head} holds {capacity} slots (the policy's capacity)")]
pub struct CacheFull {
    pub layer: usize,
    pub kv_head: usize,
    pub capacity: usize,
}

/// The slots of one (layer, KV head) "scoring unit".
///
/// Invariant: slots `0..len` are occupied; `keys`/`values` hold
/// `capacity × head_dim` floats (keys may be absent when a head-sharing
/// policy dropped them); `positions`/`scores` hold `capacity` entries.
#[derive(Clone)]
pub struct HeadSlots {
    head_dim: usize,
    capacity: usize,
    len: usize,
    keys: Option<Vec<f32>>,
    values: Vec<f32>,
    positions: Vec<u32>,
    scores: Vec<f32>,
}

impl HeadSlots {
    /// Allocates `capacity` slots of `head_dim` floats for K and V.
    pub fn new(head_dim: usize, capacity: usize) -> Self {
        HeadSlots {
            head_dim,
            capacity,
            len: 0,
            keys: Some(vec![0.0; capacity * head_dim]),
            values: vec![0.0; capacity * head_dim],
            positions: vec![0; capacity],
            scores: vec![0.0; capacity],
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Appends a token into the next free slot and returns the slot index.
    /// `key` is the RoPE-rotated key at `pos`. Score starts at 0.
    pub fn push(&mut self, pos: u32, key: &[f32], value: &[f32]) -> Option<usize> {
        if self.len == self.capacity {
            return None;
        }
        let s = self.len;
        self.write(s, pos, key, value);
        self.len += 1;
        Some(s)
    }

    fn write(&mut self, slot: usize, pos: u32, key: &[f32], value: &[f32]) {
        let d = self.head_dim;
        if let Some(k) = self.keys.as_mut() {
            k[slot * d..(slot + 1) * d].copy_from_slice(key);
        }
        self.values[slot * d..(slot + 1) * d].copy_from_slice(value);
        self.positions[slot] = pos;
        self.scores[slot] = 0.0;
    }

    /// After a prefill chunk: keeps the candidates listed in `keep`, where
    /// indices below `len()` are current slots and the rest index the
    /// chunk's tokens (`chunk_*`, `head_dim` floats each). `scores` holds
    /// every candidate's new score; `chunk_keys` is empty for a head whose
    /// keys were dropped. Returns false (and changes nothing) when
    /// the kept set would not fit the capacity.
    pub fn absorb_chunk(
        &mut self,
        keep: &[usize],
        scores: &[f32],
        chunk_keys: &[f32],
        chunk_values: &[f32],
        chunk_positions: &[u32],
    ) -> bool {
        let old = self.len;
        let kept_old: Vec<usize> = keep.iter().copied().filter(|&i| i < old).collect();
        if keep.len() > self.capacity {
            return false;
        }
        let mut sorted_old = kept_old;
        sorted_old.sort_unstable();
        self.retain_slots(&sorted_old);
        for (j, &i) in sorted_old.iter().enumerate() {
            self.scores[j] = scores[i];
        }
        let d = self.head_dim;
        for &i in keep.iter().filter(|&&i| i >= old) {
            let c = i - old;
            let s = self.len;
            // a head without keys (CHAI) receives an empty `chunk_keys`
            let key = chunk_keys.get(c * d..(c + 1) * d).unwrap_or(&[]);
            self.write(s, chunk_positions[c], key, &chunk_values[c * d..(c + 1) * d]);
            self.scores[s] = scores[i];
            self.len += 1;
        }
        true
    }

    /// Evicts `victim`: the most recently pushed slot (the candidate) moves
    /// into the victim's slot with its K, V, position and score, and the
    /// occupied count shrinks by one. No other slot moves.
    pub fn evict(&mut self, victim: usize) {
        assert!(victim < self.len, "evicting an empty slot");
        let last = self.len - 1;
        if victim != last {
            let d = self.head_dim;
            if let Some(k) = self.keys.as_mut() {
                k.copy_within(last * d..(last + 1) * d, victim * d);
            }
            self.values.copy_within(last * d..(last + 1) * d, victim * d);
            self.positions[victim] = self.positions[last];
            self.scores[victim] = self.scores[last];
        }
        self.len -= 1;
    }

    /// Keeps exactly the slots listed (ascending), compacting them to the
    /// front. Used after a prefill chunk when many tokens leave at once.
    pub fn retain_slots(&mut self, keep: &[usize]) {
        debug_assert!(keep.windows(2).all(|w| w[0] < w[1]), "retain_slots needs ascending indices");
        let d = self.head_dim;
        for (dst, &src) in keep.iter().enumerate() {
            if dst != src {
                if let Some(k) = self.keys.as_mut() {
                    k.copy_within(src * d..(src + 1) * d, dst * d);
                }
                self.values.copy_within(src * d..(src + 1) * d, dst * d);
                self.positions[dst] = self.positions[src];
                self.scores[dst] = self.scores[src];
            }
        }
        self.len = keep.len();
    }

    /// Keys of the occupied slots (`len × head_dim`), if still stored.
    pub fn keys(&self) -> Option<&[f32]> {
        self.keys.as_deref().map(|k| &k[..self.len * self.head_dim])
    }
    /// Values of the occupied slots (`len × head_dim`).
    pub fn values(&self) -> &[f32] {
        &self.values[..self.len * self.head_dim]
    }
    /// Original positions of the occupied slots.
    pub fn positions(&self) -> &[u32] {
        &self.positions[..self.len]
    }
    /// Accumulated attention scores of the occupied slots.
    pub fn scores(&self) -> &[f32] {
        &self.scores[..self.len]
    }
    /// Mutable scores (policies accumulate attention here).
    pub fn scores_mut(&mut self) -> &mut [f32] {
        &mut self.scores[..self.len]
    }

    /// Frees the key array for good (head sharing: no representative reads
    /// this head's keys any more). Values stay.
    pub fn drop_keys(&mut self) {
        self.keys = None;
    }

    /// Bytes allocated for K and V.
    pub fn kv_bytes(&self) -> usize {
        let k = self.keys.as_ref().map_or(0, |k| k.capacity());
        (k + self.values.capacity()) * std::mem::size_of::<f32>()
    }

    /// Bytes allocated for positions and scores.
    pub fn metadata_bytes(&self) -> usize {
        self.positions.capacity() * 4 + self.scores.capacity() * 4
    }
}

/// Allocated bytes of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvBytes {
    /// K and V arrays.
    pub kv: usize,
    /// Positions and scores.
    pub metadata: usize,
}

/// All slots of one sequence: `layers × kv_heads` [`HeadSlots`].
#[derive(Clone)]
pub struct KvStore {
    layers: usize,
    kv_heads: usize,
    heads: Vec<HeadSlots>,
}

impl KvStore {
    /// Allocates `capacity` slots for every layer and KV head, up front:
    /// the store never grows, so its bytes are known at creation.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let heads = (0..layers * kv_heads).map(|_| HeadSlots::new(head_dim, capacity)).collect();
        KvStore { layers, kv_heads, heads }
    }

    pub fn layers(&self) -> usize {
        self.layers
    }
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }
    pub fn head(&self, layer: usize, kv_head: usize) -> &HeadSlots {
        &self.heads[layer * self.kv_heads + kv_head]
    }
    pub fn head_mut(&mut self, layer: usize, kv_head: usize) -> &mut HeadSlots {
        &mut self.heads[layer * self.kv_heads + kv_head]
    }
    /// All heads of one layer, mutable (the forward pass writes them in parallel).
    pub fn layer_mut(&mut self, layer: usize) -> &mut [HeadSlots] {
        &mut self.heads[layer * self.kv_heads..(layer + 1) * self.kv_heads]
    }
    pub fn layer(&self, layer: usize) -> &[HeadSlots] {
        &self.heads[layer * self.kv_heads..(layer + 1) * self.kv_heads]
    }

    /// Exact allocated bytes over all layers and heads.
    pub fn bytes(&self) -> KvBytes {
        self.heads.iter().fold(KvBytes::default(), |a, h| KvBytes {
            kv: a.kv + h.kv_bytes(),
            metadata: a.metadata + h.metadata_bytes(),
        })
    }

    /// Allocated bytes of one layer.
    pub fn layer_bytes(&self, layer: usize) -> KvBytes {
        self.layer(layer).iter().fold(KvBytes::default(), |a, h| KvBytes {
            kv: a.kv + h.kv_bytes(),
            metadata: a.metadata + h.metadata_bytes(),
        })
    }

    /// Retained original positions per layer and KV head, ascending
    /// (`--kept-out`).
    pub fn kept_positions(&self) -> Vec<Vec<Vec<u32>>> {
        (0..self.layers)
            .map(|l| {
                self.layer(l)
                    .iter()
                    .map(|h| {
                        let mut p = h.positions().to_vec();
                        p.sort_unstable();
                        p
                    })
                    .collect()
            })
            .collect()
    }

    /// Empties every head (a new sequence reusing the allocation).
    pub fn clear(&mut self) {
        self.heads.iter_mut().for_each(|h| h.len = 0);
    }

    /// Error value for a full head, for the forward pass to return.
    pub fn full_error(&self, layer: usize, kv_head: usize) -> CacheFull {
        CacheFull { layer, kv_head, capacity: self.head(layer, kv_head).capacity }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evict_moves_candidate_into_victim_slot() {
        let mut h = HeadSlots::new(2, 4);
        for p in 0..4u32 {
            h.push(p, &[p as f32; 2], &[10.0 + p as f32; 2]).unwrap();
            h.scores_mut()[p as usize] = p as f32;
        }
        assert!(h.push(9, &[0.0; 2], &[0.0; 2]).is_none(), "capacity is a hard limit");
        h.evict(1);
        assert_eq!(h.positions(), &[0, 3, 2]);
        assert_eq!(h.scores(), &[0.0, 3.0, 2.0]);
        assert_eq!(&h.keys().unwrap()[2..4], &[3.0, 3.0]);
        assert_eq!(&h.values()[2..4], &[13.0, 13.0]);
    }

    #[test]
    fn bytes_are_exact_and_drop_keys_shrinks_them() {
        let mut s = KvStore::new(2, 3, 8, 10);
        assert_eq!(s.bytes(), KvBytes { kv: 2 * 3 * 2 * 10 * 8 * 4, metadata: 2 * 3 * 10 * 8 });
        s.head_mut(1, 2).drop_keys();
        assert_eq!(s.bytes().kv, 2 * 3 * 2 * 10 * 8 * 4 - 10 * 8 * 4);
        assert_eq!(s.layer_bytes(0).kv, 3 * 2 * 10 * 8 * 4);
    }

    #[test]
    fn retain_slots_compacts() {
        let mut h = HeadSlots::new(1, 5);
        for p in 0..5u32 {
            h.push(p * 10, &[p as f32], &[p as f32]).unwrap();
        }
        h.retain_slots(&[1, 4]);
        assert_eq!(h.positions(), &[10, 40]);
        assert_eq!(h.values(), &[1.0, 4.0]);
    }
}
