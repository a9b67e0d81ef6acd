//! Slot storage: per layer, per KV head, K, V, original position and
//! accumulated score of every retained token. Slot order is not position
//! order: an eviction moves the last slot into the victim's place.
//!
//! Two layouts hold K and V ([`StoreLayout`]): fixed arrays of `capacity`
//! rows allocated up front, or pages of a shared [`PagePool`] ([`paged`]);
//! rows are stored as f32, f16, int8 or 4-bit ([`rows`]). Policies and the
//! attention kernel see the same slot order in every layout.

mod journal;
pub mod paged;
pub mod rows;
mod view;

pub use paged::{PageCounts, PagePool, PoolStats};
pub use rows::{RowBuf, RowIn};
pub use view::Rows;

use journal::{Journal, KvRows, Meta};
use kvslim_kernels::attention::{DenseRows, SlotRows, MAX_HEAD_DIM};
use kvslim_kernels::kvquant::KvDtype;
use paged::PagedKv;

/// Error when a write would exceed the capacity chosen at creation.
#[derive(Debug, thiserror::Error)]
#[error("KV cache full: layer {layer} KV head {kv_head} holds {capacity} slots (the policy's capacity)")]
pub struct CacheFull {
    pub layer: usize,
    pub kv_head: usize,
    pub capacity: usize,
}

/// How a store keeps its rows: one fixed array of slots, or pages from a
/// pool; and the storage type of K and V.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreLayout {
    /// `None`: fixed slot arrays allocated up front. `Some(P)`: pages of P tokens.
    pub page_size: Option<usize>,
    pub kv_dtype: KvDtype,
}

#[derive(Clone)]
enum Kv {
    /// `capacity` rows allocated up front; an eviction moves the last row.
    Slots {
        keys: Option<RowBuf>,
        values: RowBuf,
    },
    Paged(PagedKv),
}

/// The slots of one (layer, KV head) "scoring unit".
///
/// Slots `0..len` are occupied, in the order policies and attention see
/// them (not position order: an eviction moves the last slot into the
/// victim's place). Positions and scores are this sequence's own arrays;
/// K and V live in fixed arrays or in pages ([`paged`]), in any
/// [`KvDtype`]. K may be absent when a head-sharing policy dropped it.
///
/// Readers are public; every mutator is crate-private, so only the
/// sequence cache (through its policy) changes a live head, and each
/// mutator asserts its preconditions beside it. Outside the crate a head is
/// built whole ([`HeadSlots::from_rows`]) and only read.
#[derive(Clone)]
pub struct HeadSlots {
    head_dim: usize,
    capacity: usize,
    len: usize,
    kv: Kv,
    positions: Vec<u32>,
    scores: Vec<f32>,
    /// Undo journal since a checkpoint (fixed slots only; see
    /// [`HeadSlots::checkpoint`]).
    journal: Option<Box<Journal>>,
}

impl HeadSlots {
    /// Allocates `capacity` fixed f32 slots of `head_dim` floats for K and V.
    pub fn new(head_dim: usize, capacity: usize) -> Self {
        Self::with_layout(head_dim, capacity, StoreLayout::default(), None)
    }

    /// A head in `layout`; paged heads draw pages from `pool` (which must
    /// fit the layout; see [`PagePool::fits`]) or from a private pool.
    pub fn with_layout(head_dim: usize, capacity: usize, layout: StoreLayout, pool: Option<&PagePool>) -> Self {
        let kv = match layout.page_size {
            None => Kv::Slots {
                keys: Some(RowBuf::new(layout.kv_dtype, head_dim, capacity)),
                values: RowBuf::new(layout.kv_dtype, head_dim, capacity),
            },
            Some(p) => {
                let pool = pool.cloned().unwrap_or_else(|| PagePool::new(p, layout.kv_dtype, head_dim));
                assert!(pool.fits(p, layout.kv_dtype, head_dim), "page pool does not fit the store layout");
                Kv::Paged(PagedKv::new(pool, capacity))
            }
        };
        // fixed slots allocate their metadata up front too; a paged head grows
        // it with its live tokens (amortised), like its pages
        let meta = if layout.page_size.is_some() { 0 } else { capacity };
        HeadSlots { head_dim, capacity, len: 0, kv, positions: vec![0; meta], scores: vec![0.0; meta], journal: None }
    }

    /// A head in `layout` holding exactly the given rows, slot `i` at
    /// `positions[i]` with score 0 (`keys` and `values` are `len × head_dim`):
    /// a finished head for benchmarks and tests outside the crate, which
    /// cannot push into a live one.
    pub fn from_rows(head_dim: usize, layout: StoreLayout, positions: &[u32], keys: &[f32], values: &[f32]) -> Self {
        let len = positions.len();
        assert!(keys.len() == len * head_dim && values.len() == len * head_dim, "{len} rows of {head_dim}");
        let mut h = Self::with_layout(head_dim, len, layout, None);
        for (i, &p) in positions.iter().enumerate() {
            let row = i * head_dim..(i + 1) * head_dim;
            h.push(p, &keys[row.clone()], &values[row]).expect("capacity is the row count");
        }
        h
    }

    /// Starts an undo journal (fixed slots only: returns false for a paged
    /// head, whose clone already shares its pages): from now on every row
    /// about to be overwritten is saved first, and [`HeadSlots::rollback`]
    /// returns the head to this moment bit for bit. Costs a copy of the
    /// positions and scores, and one saved row per overwrite (no K/V copy
    /// of the whole head, unlike a clone). The buffers are reused.
    pub(crate) fn checkpoint(&mut self) -> bool {
        let Kv::Slots { keys, values } = &self.kv else { return false };
        let d = self.head_dim;
        let j = self.journal.get_or_insert_with(|| Box::new(Journal::new(d, keys.as_ref(), values)));
        j.begin(self.len, self.capacity, &self.positions, &self.scores);
        true
    }

    /// Ends the journal keeping every change since the checkpoint.
    pub(crate) fn commit(&mut self) {
        if let Some(j) = self.journal.as_mut() {
            j.end();
        }
    }

    /// Returns to the checkpoint: metadata restored, overwritten rows
    /// written back newest first. Panics without an active checkpoint.
    pub(crate) fn rollback(&mut self) {
        let (j, rows, head) = self.journal_parts();
        j.rollback(rows, head);
    }

    /// Pushes since the checkpoint (each can be returned to).
    pub(crate) fn pushes_since_checkpoint(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| j.pushes())
    }

    /// Returns to the moment just before push number `pushes` since the
    /// checkpoint (0: the checkpoint itself) and ends the journal: the rows
    /// overwritten since are written back newest first, the live slots'
    /// positions and scores restored. Slots beyond the live ones may hold
    /// other stale data than before; nothing reads them. Panics without an
    /// active checkpoint or with fewer pushes.
    pub(crate) fn rollback_to(&mut self, pushes: usize) {
        if pushes == 0 {
            return self.rollback();
        }
        let (j, rows, head) = self.journal_parts();
        j.rollback_to(pushes, rows, head);
    }

    /// The journal, the rows and the metadata it restores, borrowed apart.
    fn journal_parts(&mut self) -> (&mut Journal, KvRows<'_>, Meta<'_>) {
        let j = self.journal.as_deref_mut().expect("rollback without a checkpoint");
        let Kv::Slots { keys, values } = &mut self.kv else { unreachable!("journals are for fixed slots") };
        let head = Meta {
            len: &mut self.len,
            capacity: &mut self.capacity,
            positions: &mut self.positions,
            scores: &mut self.scores,
        };
        (j, (keys, values), head)
    }

    /// Records the head in the journal before a push.
    #[inline]
    fn mark(&mut self) {
        if let Some(j) = self.journal.as_mut() {
            j.mark(self.len, &self.positions, &self.scores);
        }
    }

    /// Saves row `slot` into the journal before it is overwritten.
    #[inline]
    fn save_row(&mut self, slot: usize) {
        if let (Some(j), Kv::Slots { keys, values }) = (self.journal.as_mut(), &self.kv) {
            j.save_row(keys.as_ref(), values, slot);
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

    /// Lowers a paged head's capacity to `capacity` (≥ its live slots):
    /// an allocator's per-head share, decided after the head was made, so
    /// the head's pages follow its share. Fixed slot arrays were allocated
    /// once and stay as they are (the policy's budget limits them).
    pub(crate) fn limit_capacity(&mut self, capacity: usize) {
        if let Kv::Paged(p) = &mut self.kv {
            assert!(
                capacity >= self.len && capacity <= self.capacity,
                "a limit between the live slots and the capacity"
            );
            self.capacity = capacity;
            p.limit(capacity);
        }
    }

    /// Cuts the head down to `capacity` slots (≥ its live slots): fixed
    /// arrays are reallocated to that many rows (a copy), so the bytes
    /// follow a share decided after the head was allocated for a whole
    /// prompt (`alloc=global`); paged heads lower their page cap.
    pub(crate) fn shrink_to(&mut self, capacity: usize) {
        assert!(capacity >= self.len && capacity <= self.capacity, "a limit between the live slots and the capacity");
        match &mut self.kv {
            Kv::Slots { .. } => self.reallocate_slots(capacity),
            Kv::Paged(p) => p.limit(capacity),
        }
        self.capacity = capacity;
    }

    /// Fixed slot arrays of `capacity` rows holding the live slots (a copy).
    fn reallocate_slots(&mut self, capacity: usize) {
        if let Kv::Slots { keys, values } = &mut self.kv {
            for rows in keys.iter_mut().chain(std::iter::once(values)) {
                let mut moved = RowBuf::new(rows.dtype(), self.head_dim, capacity);
                (0..self.len).for_each(|i| moved.copy_row(i, rows, i));
                *rows = moved;
            }
            self.positions.resize(capacity, 0);
            self.positions.shrink_to_fit();
            self.scores.resize(capacity, 0.0);
            self.scores.shrink_to_fit();
        }
    }

    /// Tokens per page (`None` for the fixed-slot layout).
    pub fn page_size(&self) -> Option<usize> {
        match &self.kv {
            Kv::Slots { .. } => None,
            Kv::Paged(p) => Some(p.page_size()),
        }
    }

    /// The page holding slot `slot` (a page-table entry; `None` when not paged).
    pub fn page_of(&self, slot: usize) -> Option<u32> {
        match &self.kv {
            Kv::Slots { .. } => None,
            Kv::Paged(p) => Some(p.page_of(slot)),
        }
    }

    /// Appends a token into the next free slot and returns the slot index.
    /// `key` is the RoPE-rotated key at `pos` (ignored once keys were
    /// dropped). Score starts at 0. `None` when the head is full.
    pub(crate) fn push(&mut self, pos: u32, key: &[f32], value: &[f32]) -> Option<usize> {
        debug_assert_eq!(value.len(), self.head_dim, "a value row is head_dim wide");
        debug_assert!(!self.has_keys() || key.len() == self.head_dim, "a key row is head_dim wide");
        self.push_rows(pos, RowIn::Floats(key), RowIn::Floats(value))
    }

    /// As [`HeadSlots::push`], for rows already in the store's dtype (a
    /// saved context coming back: bit for bit, no re-encoding), with the
    /// slot's score.
    pub(crate) fn push_coded(&mut self, pos: u32, score: f32, key: RowIn<'_>, value: RowIn<'_>) -> Option<usize> {
        let s = self.push_rows(pos, key, value)?;
        self.scores[s] = score;
        Some(s)
    }

    /// Slot `slot`'s K (`keys`; `None` once dropped) or V row as stored.
    pub fn coded_row(&self, slot: usize, keys: bool) -> Option<(&[u8], &[f32])> {
        assert!(slot < self.len, "slot {slot} of {}", self.len);
        match &self.kv {
            Kv::Slots { keys: k, values } => {
                if keys {
                    k.as_ref().map(|k| k.coded(slot))
                } else {
                    Some(values.coded(slot))
                }
            }
            Kv::Paged(p) => (!keys || p.has_keys()).then(|| p.coded(slot, keys)),
        }
    }

    /// The storage type of K and V.
    pub fn dtype(&self) -> KvDtype {
        match &self.kv {
            Kv::Slots { values, .. } => values.dtype(),
            Kv::Paged(p) => p.dtype(),
        }
    }

    /// Raises the capacity to `capacity` slots (no-op when it holds that
    /// many already): a fork of a compressed context given room for a
    /// question and its answer. Fixed slots grow their arrays (a copy);
    /// paged heads only their page cap.
    pub(crate) fn reserve(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        match &mut self.kv {
            Kv::Slots { .. } => self.reallocate_slots(capacity),
            Kv::Paged(p) => p.raise(capacity),
        }
        self.capacity = capacity;
    }

    fn push_rows(&mut self, pos: u32, key: RowIn<'_>, value: RowIn<'_>) -> Option<usize> {
        if self.len == self.capacity {
            return None;
        }
        let s = self.len;
        self.mark();
        self.save_row(s);
        match &mut self.kv {
            Kv::Slots { keys, values } => {
                if let Some(k) = keys.as_mut() {
                    k.put(s, key);
                }
                values.put(s, value);
            }
            Kv::Paged(p) => p.push(key, value),
        }
        if s == self.positions.len() {
            self.positions.push(pos);
            self.scores.push(0.0);
        } else {
            self.positions[s] = pos;
            self.scores[s] = 0.0;
        }
        self.len += 1;
        Some(s)
    }

    /// After a prefill chunk: keeps the candidates listed in `keep`, where
    /// indices below `len()` are current slots and the rest index the
    /// chunk's tokens (`chunk_*`, `head_dim` floats each). `scores` holds
    /// every candidate's new score; `chunk_keys` is empty for a head whose
    /// keys were dropped. Returns false (and changes nothing) when
    /// the kept set would not fit the capacity.
    pub(crate) fn absorb_chunk(
        &mut self,
        keep: &[usize],
        scores: &[f32],
        chunk_keys: &[f32],
        chunk_values: &[f32],
        chunk_positions: &[u32],
    ) -> bool {
        let old = self.len;
        if keep.len() > self.capacity {
            return false;
        }
        let mut kept_old: Vec<usize> = keep.iter().copied().filter(|&i| i < old).collect();
        kept_old.sort_unstable();
        self.retain_slots(&kept_old);
        for (j, &i) in kept_old.iter().enumerate() {
            self.scores[j] = scores[i];
        }
        let d = self.head_dim;
        for &i in keep.iter().filter(|&&i| i >= old) {
            let c = i - old;
            // a head without keys (CHAI) receives an empty `chunk_keys`
            let key = chunk_keys.get(c * d..(c + 1) * d).unwrap_or(&[]);
            let s = self.push(chunk_positions[c], key, &chunk_values[c * d..(c + 1) * d]).expect("checked above");
            self.scores[s] = scores[i];
        }
        true
    }

    /// Evicts `victim`: the most recently pushed slot (the candidate) moves
    /// into the victim's slot with its K, V, position and score, and the
    /// occupied count shrinks by one. No other slot moves. (Paged: only the
    /// slot's address moves; the page returns to the pool once empty.)
    pub(crate) fn evict(&mut self, victim: usize) {
        // a free slot holds stale data: moving the candidate there would
        // lose a live token and keep a dead one
        assert!(victim < self.len, "evicting an empty slot");
        let last = self.len - 1;
        if victim != last {
            self.save_row(victim);
        }
        match &mut self.kv {
            Kv::Slots { keys, values } => {
                if victim != last {
                    if let Some(k) = keys.as_mut() {
                        k.copy_within(last, victim);
                    }
                    values.copy_within(last, victim);
                }
            }
            Kv::Paged(p) => p.evict(victim),
        }
        self.positions[victim] = self.positions[last];
        self.scores[victim] = self.scores[last];
        self.len -= 1;
    }

    /// Keeps exactly the slots listed (ascending), compacting them to the
    /// front. Used after a prefill chunk when many tokens leave at once.
    /// Ascending order is what makes the in-place moves safe: slot `dst`
    /// is never read again once written.
    pub(crate) fn retain_slots(&mut self, keep: &[usize]) {
        debug_assert!(keep.windows(2).all(|w| w[0] < w[1]), "retain_slots needs ascending indices");
        debug_assert!(keep.last().is_none_or(|&s| s < self.len), "retain_slots keeps live slots only");
        if let Kv::Paged(p) = &mut self.kv {
            p.retain_slots(keep);
        }
        for (dst, &src) in keep.iter().enumerate() {
            if dst != src {
                self.save_row(dst);
                if let Kv::Slots { keys, values } = &mut self.kv {
                    if let Some(k) = keys.as_mut() {
                        k.copy_within(src, dst);
                    }
                    values.copy_within(src, dst);
                }
                self.positions[dst] = self.positions[src];
                self.scores[dst] = self.scores[src];
            }
        }
        self.len = keep.len();
    }

    /// Whether K is still stored (a head-sharing policy may drop it).
    pub fn has_keys(&self) -> bool {
        match &self.kv {
            Kv::Slots { keys, .. } => keys.is_some(),
            Kv::Paged(p) => p.has_keys(),
        }
    }

    /// K rows of the occupied slots, in slot order, if still stored.
    pub fn key_rows(&self) -> Option<Rows<'_>> {
        match &self.kv {
            Kv::Slots { keys, .. } => keys.as_ref().map(|k| Self::dense_or_coded(k, self.head_dim)),
            Kv::Paged(p) => p.has_keys().then(|| Rows::Paged(p.keys())),
        }
    }

    /// V rows of the occupied slots, in slot order.
    pub fn value_rows(&self) -> Rows<'_> {
        match &self.kv {
            Kv::Slots { values, .. } => Self::dense_or_coded(values, self.head_dim),
            Kv::Paged(p) => Rows::Paged(p.values()),
        }
    }

    fn dense_or_coded(rows: &RowBuf, d: usize) -> Rows<'_> {
        match rows.as_f32() {
            Some(data) => Rows::Dense(DenseRows { data, d }),
            None => Rows::Coded(rows),
        }
    }

    /// Appends the occupied slots' keys, decoded to f32 (`len × head_dim`);
    /// false (nothing appended) when keys were dropped.
    pub fn gather_keys(&self, out: &mut Vec<f32>) -> bool {
        match self.key_rows() {
            Some(rows) => self.gather(rows, out),
            None => return false,
        }
        true
    }

    /// Appends the occupied slots' values, decoded to f32 (`len × head_dim`).
    pub fn gather_values(&self, out: &mut Vec<f32>) {
        self.gather(self.value_rows(), out)
    }

    fn gather(&self, rows: Rows<'_>, out: &mut Vec<f32>) {
        let mut buf = [0f32; MAX_HEAD_DIM];
        out.reserve(self.len * self.head_dim);
        for i in 0..self.len {
            out.extend_from_slice(rows.row(i, &mut buf[..self.head_dim]));
        }
    }

    /// The occupied slots' keys decoded to f32, if stored (tests, reports).
    pub fn decoded_keys(&self) -> Option<Vec<f32>> {
        let mut out = Vec::new();
        self.gather_keys(&mut out).then_some(out)
    }

    /// The occupied slots' values decoded to f32 (tests, reports).
    pub fn decoded_values(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.gather_values(&mut out);
        out
    }

    /// Original positions of the occupied slots.
    pub fn positions(&self) -> &[u32] {
        &self.positions[..self.len]
    }
    /// Accumulated attention scores of the occupied slots.
    pub fn scores(&self) -> &[f32] {
        &self.scores[..self.len]
    }
    /// Mutable scores of the live slots only (policies accumulate attention
    /// here; a free slot's score is reset by the push that fills it).
    pub(crate) fn scores_mut(&mut self) -> &mut [f32] {
        &mut self.scores[..self.len]
    }

    /// Frees the keys for good (head sharing: no representative reads
    /// this head's keys any more). Values stay.
    pub(crate) fn drop_keys(&mut self) {
        match &mut self.kv {
            Kv::Slots { keys, .. } => *keys = None,
            Kv::Paged(p) => p.drop_keys(),
        }
    }

    /// Repacks a paged head's live slots into full pages (no-op for fixed slots).
    pub(crate) fn compact(&mut self) {
        if let Kv::Paged(p) = &mut self.kv {
            p.compact();
        }
    }

    /// Page counters (`None` for fixed slots).
    pub fn page_counts(&self) -> Option<PageCounts> {
        match &self.kv {
            Kv::Slots { .. } => None,
            Kv::Paged(p) => Some(p.counts()),
        }
    }

    /// Bytes allocated for K and V (codes and scales; a paged head counts
    /// the pages it references).
    pub fn kv_bytes(&self) -> usize {
        match &self.kv {
            Kv::Slots { keys, values } => keys.as_ref().map_or(0, RowBuf::bytes) + values.bytes(),
            Kv::Paged(p) => p.kv_bytes(),
        }
    }

    /// K/V bytes of the live slots: what one decode step's attention reads
    /// from this head (keys only where this head still holds them; the
    /// storage dtype's codes and scales).
    pub fn attended_kv_bytes(&self) -> usize {
        let dtype = self.dtype();
        self.len() * dtype.row_bytes(self.head_dim) * (1 + usize::from(self.has_keys()))
    }

    /// Most K/V bytes this head has held at once (fixed slots: all of
    /// them, from the start).
    pub fn peak_kv_bytes(&self) -> usize {
        match &self.kv {
            Kv::Slots { .. } => self.kv_bytes(),
            Kv::Paged(p) => p.peak_kv_bytes(),
        }
    }

    /// Bytes allocated for positions, scores and (paged) the page table.
    pub fn metadata_bytes(&self) -> usize {
        let paged = match &self.kv {
            Kv::Slots { .. } => 0,
            Kv::Paged(p) => p.metadata_bytes(),
        };
        self.positions.capacity() * 4 + self.scores.capacity() * 4 + paged
    }
}

/// Allocated bytes of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
        Self::with_layout(layers, kv_heads, head_dim, capacity, StoreLayout::default(), None)
    }

    /// A store in `layout`; paged stores draw from `pool` when given (it
    /// must fit the layout) or from a pool of their own.
    pub fn with_layout(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        layout: StoreLayout,
        pool: Option<&PagePool>,
    ) -> Self {
        Self::with_layer_capacities(&vec![capacity; layers], kv_heads, head_dim, layout, pool)
    }

    /// As [`KvStore::with_layout`] with a capacity per layer (one entry per
    /// layer): a sliding-window layer needs no more slots than its window.
    pub fn with_layer_capacities(
        capacities: &[usize],
        kv_heads: usize,
        head_dim: usize,
        layout: StoreLayout,
        pool: Option<&PagePool>,
    ) -> Self {
        let layers = capacities.len();
        let own;
        let pool = match (layout.page_size, pool) {
            (Some(p), None) => {
                own = PagePool::new(p, layout.kv_dtype, head_dim);
                Some(&own)
            }
            (_, pool) => pool,
        };
        let heads = capacities
            .iter()
            .flat_map(|&capacity| (0..kv_heads).map(move |_| HeadSlots::with_layout(head_dim, capacity, layout, pool)))
            .collect();
        KvStore { layers, kv_heads, heads }
    }

    /// The most slots any head may hold (scratch buffers are sized by it).
    pub fn max_capacity(&self) -> usize {
        self.heads.iter().map(HeadSlots::capacity).max().unwrap_or(0)
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
    pub(crate) fn head_mut(&mut self, layer: usize, kv_head: usize) -> &mut HeadSlots {
        &mut self.heads[layer * self.kv_heads + kv_head]
    }
    /// All heads of one layer, mutable (only [`crate::SequenceCache`] changes a store).
    pub(crate) fn layer_mut(&mut self, layer: usize) -> &mut [HeadSlots] {
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

    /// K/V bytes one decode step's attention reads over all layers and
    /// heads (see [`HeadSlots::attended_kv_bytes`]).
    pub fn attended_kv_bytes(&self) -> usize {
        self.heads.iter().map(HeadSlots::attended_kv_bytes).sum()
    }

    /// Σ over heads of each head's most K/V bytes at once: a bound on the
    /// sequence's peak that counts moments inside a step, which reading
    /// [`KvStore::bytes`] between steps misses.
    pub fn peak_kv_bytes(&self) -> usize {
        self.heads.iter().map(HeadSlots::peak_kv_bytes).sum()
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

    /// Accumulated scores of the retained slots per layer and KV head, in
    /// the order of [`KvStore::kept_positions`] (ascending position).
    pub fn kept_scores(&self) -> Vec<Vec<Vec<f32>>> {
        (0..self.layers)
            .map(|l| {
                self.layer(l)
                    .iter()
                    .map(|h| {
                        let mut pairs: Vec<(u32, f32)> =
                            h.positions().iter().copied().zip(h.scores().iter().copied()).collect();
                        pairs.sort_unstable_by_key(|p| p.0);
                        pairs.into_iter().map(|p| p.1).collect()
                    })
                    .collect()
            })
            .collect()
    }

    /// Repacks every paged head into full pages (see [`paged`]).
    pub(crate) fn compact(&mut self) {
        self.heads.iter_mut().for_each(HeadSlots::compact);
    }

    /// Page counters summed over layers and heads (`None` when not paged).
    pub fn page_counts(&self) -> Option<PageCounts> {
        let mut total = PageCounts::default();
        for h in &self.heads {
            total += h.page_counts()?;
        }
        Some(total)
    }

    /// Error value for a full head, for the forward pass to return.
    pub fn full_error(&self, layer: usize, kv_head: usize) -> CacheFull {
        CacheFull { layer, kv_head, capacity: self.head(layer, kv_head).capacity }
    }
}

#[cfg(test)]
mod tests;
