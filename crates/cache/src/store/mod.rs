//! Slot storage: per layer, per KV head, K, V, original position and
//! accumulated score of every retained token. Slot order is not position
//! order: an eviction moves the last slot into the victim's place.
//!
//! Two layouts hold K and V ([`StoreLayout`]): fixed arrays of `capacity`
//! rows allocated up front, or pages of a shared [`PagePool`] ([`paged`]);
//! rows are stored as f32, f16, int8 or 4-bit ([`rows`]). Policies and the
//! attention kernel see the same slot order in every layout.

pub mod paged;
pub mod rows;

pub use paged::{PageCounts, PagePool, PoolStats};
pub use rows::{RowBuf, RowIn};

use kvslim_kernels::attention::{DenseRows, SlotRows, MAX_HEAD_DIM};
use kvslim_kernels::kvquant::KvDtype;
use paged::{PagedKv, PagedRows};

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
    /// [`HeadSlots::checkpoint`]); kept allocated between checkpoints.
    undo: Option<Box<Undo>>,
}

/// What a fixed-slot head looked like at a checkpoint, and the old contents
/// of every row overwritten since, in order: rolling back restores the
/// metadata and writes the rows back newest first. Each token appended
/// since leaves a [`Mark`], so the head can also return to the moment just
/// before any of them ([`HeadSlots::rollback_to`]).
#[derive(Clone)]
struct Undo {
    active: bool,
    len: usize,
    capacity: usize,
    positions: Vec<u32>,
    scores: Vec<f32>,
    slots: Vec<usize>,
    keys: Option<RowBuf>,
    values: RowBuf,
    /// One per push since the checkpoint: the head just before it.
    marks: Vec<Mark>,
    /// The live positions and scores of every mark, back to back.
    mark_positions: Vec<u32>,
    mark_scores: Vec<f32>,
}

impl Undo {
    /// Writes the rows saved since entry `from` of the log back into `kv`,
    /// newest first.
    fn write_back(&self, kv: &mut Kv, from: usize) {
        let Kv::Slots { keys, values } = kv else { unreachable!("journals are for fixed slots") };
        for i in (from..self.slots.len()).rev() {
            if let (Some(k), Some(saved)) = (keys.as_mut(), self.keys.as_ref()) {
                k.copy_row(self.slots[i], saved, i);
            }
            values.copy_row(self.slots[i], &self.values, i);
        }
    }
}

/// A head's metadata just before one push inside a journal: its live slots'
/// positions and scores sit at `at..at + len` of the journal's mark arrays.
#[derive(Clone, Copy)]
struct Mark {
    len: usize,
    /// Saved rows at that moment (the undo log's length).
    saved: usize,
    at: usize,
}

/// Slot-order view of a head's K or V rows, for the attention kernel.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    Dense(DenseRows<'a>),
    Coded(&'a RowBuf),
    Paged(PagedRows<'a>),
}

impl SlotRows for Rows<'_> {
    #[inline]
    fn row<'a>(&'a self, slot: usize, buf: &'a mut [f32]) -> &'a [f32] {
        match self {
            Rows::Dense(r) => r.row(slot, buf),
            Rows::Coded(r) => r.row(slot, buf),
            Rows::Paged(r) => r.row(slot, buf),
        }
    }
    #[inline]
    fn dot_group(&self, slot: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        match self {
            Rows::Dense(r) => r.dot_group(slot, queries, buf, out),
            Rows::Coded(r) => r.dot_group(slot, queries, buf, out),
            Rows::Paged(r) => r.dot_group(slot, queries, buf, out),
        }
    }
    #[inline]
    fn axpy_group(&self, slot: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        match self {
            Rows::Dense(r) => r.axpy_group(slot, probs, buf, outs),
            Rows::Coded(r) => r.axpy_group(slot, probs, buf, outs),
            Rows::Paged(r) => r.axpy_group(slot, probs, buf, outs),
        }
    }
    #[inline]
    fn dot_group_run(&self, start: usize, n: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        match self {
            Rows::Dense(r) => r.dot_group_run(start, n, queries, buf, out),
            Rows::Coded(r) => r.dot_group_run(start, n, queries, buf, out),
            Rows::Paged(r) => r.dot_group_run(start, n, queries, buf, out),
        }
    }
    #[inline]
    fn axpy_group_run(&self, start: usize, n: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        match self {
            Rows::Dense(r) => r.axpy_group_run(start, n, probs, buf, outs),
            Rows::Coded(r) => r.axpy_group_run(start, n, probs, buf, outs),
            Rows::Paged(r) => r.axpy_group_run(start, n, probs, buf, outs),
        }
    }
    #[inline]
    fn prefetch(&self, slot: usize) {
        match self {
            // consecutive rows: the hardware prefetcher follows the stream,
            // and software prefetches only compete with it (measured: 6% of
            // a 4K-token decode step on Qwen2.5-Coder-1.5B with f16 K/V)
            Rows::Dense(_) | Rows::Coded(_) => {}
            Rows::Paged(r) => r.prefetch(slot),
        }
    }
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
        HeadSlots { head_dim, capacity, len: 0, kv, positions: vec![0; meta], scores: vec![0.0; meta], undo: None }
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
        let undo = self.undo.get_or_insert_with(|| {
            Box::new(Undo {
                active: false,
                len: 0,
                capacity: 0,
                positions: Vec::new(),
                scores: Vec::new(),
                slots: Vec::new(),
                keys: keys.as_ref().map(|k| RowBuf::new(k.dtype(), self.head_dim, 0)),
                values: RowBuf::new(values.dtype(), self.head_dim, 0),
                marks: Vec::new(),
                mark_positions: Vec::new(),
                mark_scores: Vec::new(),
            })
        });
        undo.active = true;
        (undo.len, undo.capacity) = (self.len, self.capacity);
        undo.positions.clone_from(&self.positions);
        undo.scores.clone_from(&self.scores);
        undo.slots.clear();
        if let Some(k) = undo.keys.as_mut() {
            k.clear();
        }
        undo.values.clear();
        undo.marks.clear();
        undo.mark_positions.clear();
        undo.mark_scores.clear();
        true
    }

    /// Ends the journal keeping every change since the checkpoint.
    pub(crate) fn commit(&mut self) {
        if let Some(u) = self.undo.as_mut() {
            u.active = false;
        }
    }

    /// Returns to the checkpoint: metadata restored, overwritten rows
    /// written back newest first. Panics without an active checkpoint.
    pub(crate) fn rollback(&mut self) {
        let u = self.undo.as_mut().filter(|u| u.active).expect("rollback without a checkpoint");
        u.write_back(&mut self.kv, 0);
        self.len = u.len;
        self.capacity = u.capacity;
        self.positions.clone_from(&u.positions);
        self.scores.clone_from(&u.scores);
        u.active = false;
    }

    /// Pushes since the checkpoint (each can be returned to).
    pub(crate) fn pushes_since_checkpoint(&self) -> usize {
        self.undo.as_ref().filter(|u| u.active).map_or(0, |u| u.marks.len())
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
        let u = self.undo.as_mut().filter(|u| u.active).expect("rollback without a checkpoint");
        let m = u.marks[pushes];
        u.write_back(&mut self.kv, m.saved);
        self.len = m.len;
        self.positions[..m.len].copy_from_slice(&u.mark_positions[m.at..m.at + m.len]);
        self.scores[..m.len].copy_from_slice(&u.mark_scores[m.at..m.at + m.len]);
        u.active = false;
    }

    /// Records a [`Mark`] in the active journal before a push.
    #[inline]
    fn mark(&mut self) {
        let Some(u) = self.undo.as_mut().filter(|u| u.active) else { return };
        let (len, at) = (self.len, u.mark_positions.len());
        u.marks.push(Mark { len, saved: u.slots.len(), at });
        u.mark_positions.extend_from_slice(&self.positions[..len]);
        u.mark_scores.extend_from_slice(&self.scores[..len]);
    }

    /// Saves row `slot` into the active journal before it is overwritten.
    #[inline]
    fn save_row(&mut self, slot: usize) {
        let Some(u) = self.undo.as_mut().filter(|u| u.active) else { return };
        if let Kv::Slots { keys, values } = &self.kv {
            if let (Some(saved), Some(k)) = (u.keys.as_mut(), keys.as_ref()) {
                saved.push_row_from(k, slot);
            }
            u.values.push_row_from(values, slot);
            u.slots.push(slot);
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
            Kv::Slots { keys, values } => {
                for rows in keys.iter_mut().chain(std::iter::once(values)) {
                    let mut grown = RowBuf::new(rows.dtype(), self.head_dim, capacity);
                    (0..self.len).for_each(|i| grown.copy_row(i, rows, i));
                    *rows = grown;
                }
                self.positions.resize(capacity, 0);
                self.scores.resize(capacity, 0.0);
            }
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
        let (mut k, mut v) = (Vec::new(), Vec::new());
        h.gather_keys(&mut k);
        h.gather_values(&mut v);
        assert_eq!(&k[2..4], &[3.0, 3.0]);
        assert_eq!(&v[2..4], &[13.0, 13.0]);
    }

    #[test]
    fn kept_scores_follow_kept_positions() {
        let mut s = KvStore::new(1, 1, 2, 4);
        let h = s.head_mut(0, 0);
        for p in 0..4u32 {
            h.push(p, &[0.0; 2], &[0.0; 2]).unwrap();
            h.scores_mut()[p as usize] = 10.0 * p as f32;
        }
        h.evict(1); // slots now hold positions 0, 3, 2
        assert_eq!(s.kept_positions(), vec![vec![vec![0, 2, 3]]]);
        assert_eq!(s.kept_scores(), vec![vec![vec![0.0, 20.0, 30.0]]]);
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
        let mut v = Vec::new();
        h.gather_values(&mut v);
        assert_eq!(v, [1.0, 4.0]);
    }

    use crate::rng::SplitMix64;

    fn row(pos: u32, salt: f32, d: usize) -> Vec<f32> {
        (0..d).map(|i| ((pos as f32 + 1.0) * (i as f32 + salt)).sin() * (1.0 + (pos % 5) as f32)).collect()
    }

    /// One random store operation (push / evict / prefill-like retain / compact),
    /// applied identically to every head in `heads`.
    fn random_op(rng: &mut SplitMix64, heads: &mut [HeadSlots], next_pos: &mut u32, d: usize) {
        let len = heads[0].len();
        let cap = heads[0].capacity();
        match rng.below(10) {
            0..=5 if len < cap => {
                let (k, v) = (row(*next_pos, 0.5, d), row(*next_pos, 1.5, d));
                for h in heads.iter_mut() {
                    let s = h.push(*next_pos, &k, &v).unwrap();
                    h.scores_mut()[s] = *next_pos as f32 * 0.1;
                }
                *next_pos += 1;
            }
            6..=7 if len > 0 => {
                let victim = rng.below(len);
                heads.iter_mut().for_each(|h| h.evict(victim));
            }
            8 if len > 1 => {
                let keep: Vec<usize> = (0..len).filter(|_| rng.below(3) != 0).collect();
                heads.iter_mut().for_each(|h| h.retain_slots(&keep));
            }
            _ => heads.iter_mut().for_each(HeadSlots::compact),
        }
    }

    fn snapshot(h: &HeadSlots) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        (
            h.positions().to_vec(),
            bits(h.scores().to_vec()),
            bits(h.decoded_keys().unwrap_or_default()),
            bits(h.decoded_values()),
        )
    }

    #[test]
    fn paged_heads_match_the_fixed_store_op_for_op() {
        let d = 8;
        for dtype in KvDtype::ALL {
            let mut heads: Vec<HeadSlots> = [None, Some(1), Some(3), Some(8)]
                .into_iter()
                .map(|p| HeadSlots::with_layout(d, 20, StoreLayout { page_size: p, kv_dtype: dtype }, None))
                .collect();
            let mut rng = SplitMix64::new(7);
            let mut next = 0;
            for step in 0..600 {
                random_op(&mut rng, &mut heads, &mut next, d);
                let want = snapshot(&heads[0]);
                for h in &heads[1..] {
                    assert_eq!(snapshot(h), want, "{dtype} page {:?} step {step}", h.page_size());
                    let c = h.page_counts().unwrap();
                    assert_eq!(c.live, h.len());
                    assert_eq!(c.pages * h.page_size().unwrap(), c.live + c.fragmentation);
                }
            }
        }
    }

    #[test]
    fn compaction_returns_pages_and_counts_bytes() {
        let (d, p) = (4, 4);
        let pool = PagePool::new(p, KvDtype::F32, d);
        let mut h =
            HeadSlots::with_layout(d, 64, StoreLayout { page_size: Some(p), kv_dtype: KvDtype::F32 }, Some(&pool));
        for t in 0..32u32 {
            h.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
        }
        assert_eq!(pool.stats().pages_in_use, 2 * 8, "K and V pages");
        // evict every other token: no page empties, so nothing is returned
        for v in (0..32).rev().step_by(2) {
            h.evict(v);
        }
        let before = h.page_counts().unwrap();
        assert_eq!((before.pages, before.live, before.fragmentation), (8, 16, 16));
        let want = snapshot(&h);
        h.compact();
        let after = h.page_counts().unwrap();
        assert_eq!(after.pages, 16usize.div_ceil(p), "pages in use = ceil(live / page size)");
        assert_eq!(pool.stats().pages_in_use, 2 * after.pages);
        // in place: the 4 fullest pages stay (2 live each), the 8 tokens of
        // the other 4 move into their holes, K and V once each
        assert_eq!(after.bytes_moved, 8 * 2 * (d as u64 * 4), "only the released pages' tokens move");
        assert_eq!(pool.stats().peak_pages, 2 * 8, "repacking allocates no page");
        assert_eq!(snapshot(&h), want, "compaction keeps slot order and contents");
        // a page whose tokens all leave goes back to the pool at once
        let mut g = HeadSlots::with_layout(d, 8, StoreLayout { page_size: Some(p), kv_dtype: KvDtype::F32 }, None);
        for t in 0..8u32 {
            g.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
        }
        g.retain_slots(&[4, 5, 6, 7]);
        assert_eq!(g.page_counts().unwrap().pages, 1);
    }

    /// Token eviction scatters holes over pages; a head never references
    /// more than its page cap, because it repacks before growing past it,
    /// and repacking keeps slot order and contents.
    #[test]
    fn eviction_churn_stays_within_the_page_cap() {
        let d = 4;
        for (p, capacity) in [(4, 25), (8, 25), (16, 129), (3, 7)] {
            let cap = paged::page_cap(capacity, p);
            let layout = StoreLayout { page_size: Some(p), kv_dtype: KvDtype::Q8 };
            let mut h = HeadSlots::with_layout(d, capacity, layout, None);
            let mut fixed = HeadSlots::with_layout(d, capacity, StoreLayout { page_size: None, ..layout }, None);
            let mut rng = SplitMix64::new(p as u64);
            let mut most = 0;
            for t in 0..2000u32 {
                if h.len() == capacity {
                    let v = (rng.next_u64() % capacity as u64) as usize;
                    h.evict(v);
                    fixed.evict(v);
                }
                h.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
                fixed.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
                most = most.max(h.page_counts().unwrap().pages);
            }
            assert!(most <= cap, "page={p} capacity={capacity}: {most} pages > cap {cap}");
            assert!(h.page_counts().unwrap().bytes_moved > 0, "page={p}: holes were repacked");
            assert_eq!(snapshot(&h), snapshot(&fixed), "page={p}: same slots as the fixed store");
        }
    }

    #[test]
    fn clones_share_pages_until_the_first_write() {
        let (d, p) = (4, 4);
        let pool = PagePool::new(p, KvDtype::Q8, d);
        let layout = StoreLayout { page_size: Some(p), kv_dtype: KvDtype::Q8 };
        let mut a = HeadSlots::with_layout(d, 64, layout, Some(&pool));
        for t in 0..10u32 {
            a.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
        }
        let pages = pool.stats().pages_in_use;
        let mut b = a.clone();
        assert_eq!(pool.stats().pages_in_use, pages, "a clone allocates no pages");
        assert_eq!(b.page_counts().unwrap().shared_pages, 3);
        let original = snapshot(&a);
        // eviction and score updates never copy a page
        b.evict(2);
        b.scores_mut()[0] += 1.0;
        assert_eq!(pool.stats().cow_copies, 0);
        assert_eq!(snapshot(&a), original, "the other sequence does not see b's evictions or scores");
        // the first write into the shared tail page copies K and V once
        b.push(10, &row(10, 0.5, d), &row(10, 1.5, d)).unwrap();
        assert_eq!(b.page_counts().unwrap().cow_copies, 2);
        b.push(11, &row(11, 0.5, d), &row(11, 1.5, d)).unwrap();
        assert_eq!(b.page_counts().unwrap().cow_copies, 2, "copied only on the first write");
        assert_eq!(snapshot(&a), original);
        a.push(10, &row(10, 0.5, d), &row(10, 1.5, d)).unwrap();
        assert_eq!(a.page_counts().unwrap().cow_copies, 0, "b's copy left a the sole owner");
        drop(b);
        drop(a);
        assert_eq!(pool.stats().pages_in_use, 0);
    }

    /// Every live slot must decode to what was written for its position, in
    /// every layout, after evictions, retains and compactions; with the
    /// scale copy disabled (a fault injected into the row copy) the check
    /// must fail, so it really guards the scale path.
    #[test]
    fn scales_move_with_their_slots() {
        let d = 40;
        let check = |skip: bool| -> bool {
            rows::SKIP_SCALE_COPY.with(|c| c.set(skip));
            let mut ok = true;
            for dtype in [KvDtype::Q8, KvDtype::Q4] {
                for page in [None, Some(4)] {
                    let mut heads =
                        vec![HeadSlots::with_layout(d, 24, StoreLayout { page_size: page, kv_dtype: dtype }, None)];
                    let mut truth = std::collections::HashMap::new();
                    let mut rng = SplitMix64::new(11);
                    let mut next = 0;
                    for _ in 0..400 {
                        let before = next;
                        random_op(&mut rng, &mut heads, &mut next, d);
                        if next > before {
                            let h = &heads[0];
                            truth.insert(before, h.decoded_values()[(h.len() - 1) * d..].to_vec());
                        }
                        let h = &heads[0];
                        let vals = h.decoded_values();
                        for (i, p) in h.positions().iter().enumerate() {
                            ok &= vals[i * d..(i + 1) * d] == truth[p][..];
                        }
                    }
                }
            }
            rows::SKIP_SCALE_COPY.with(|c| c.set(false));
            ok
        };
        assert!(check(false), "scales travel with codes");
        assert!(!check(true), "a row copy without its scales must be detected");
    }
}
