//! Paged KV storage: fixed-size pages from a shared [`PagePool`], a page
//! table per (sequence, layer, KV head), and a slot → address map.
//!
//! A sequence sees its slots densely (`0..len`, the order the policies and
//! the attention kernel use, identical to the fixed-slot store); each slot
//! maps to an address `entry × page_size + offset` in the page table. New
//! tokens append at the tail page. Evicting a slot only drops its address:
//! the page is returned to the pool when its last live token leaves, so
//! scattered evictions leave holes that keep pages allocated (the
//! fragmentation that [`PagedKv::compact`] removes by repacking the live
//! slots, in slot order, into full pages).
//!
//! Pages are reference counted: cloning a sequence (a beam, a request that
//! reuses a cached prompt) shares every page read-only; the first write into
//! a shared page copies it (copy-on-write, counted). Scores and positions
//! are per-sequence arrays, never shared, so one request's attention never
//! leaks into another's.

use super::rows::{RowBuf, RowIn};
use kvslim_kernels::attention::{axpy_group_f32, dot_group_f32, group_each, prefetch_bytes, SlotRows};
use kvslim_kernels::kvquant::KvDtype;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of a pool, shared by every sequence allocating from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Pages held by some sequence.
    pub pages_in_use: usize,
    /// Most pages in use at once.
    pub peak_pages: usize,
    /// Recycled pages waiting on the free list (still allocated).
    pub free_pages: usize,
    /// Shared pages copied on first write.
    pub cow_copies: usize,
    /// Bytes of one page (codes + scales of `page_size` rows).
    pub page_bytes: usize,
}

struct PoolInner {
    page_size: usize,
    dtype: KvDtype,
    head_dim: usize,
    page_bytes: usize,
    free: Mutex<Vec<RowBuf>>,
    in_use: AtomicUsize,
    peak: AtomicUsize,
    cow_copies: AtomicUsize,
}

/// A pool of pages of `page_size` rows of one head width and storage type.
/// Cheap to clone (a handle); pages return to its free list when dropped,
/// so steady-state decoding does not allocate.
#[derive(Clone)]
pub struct PagePool {
    inner: Arc<PoolInner>,
}

impl PagePool {
    pub fn new(page_size: usize, dtype: KvDtype, head_dim: usize) -> Self {
        assert!(page_size >= 1, "page size must be at least 1");
        let page_bytes = page_size * dtype.row_bytes(head_dim);
        PagePool {
            inner: Arc::new(PoolInner {
                page_size,
                dtype,
                head_dim,
                page_bytes,
                free: Mutex::new(Vec::new()),
                in_use: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                cow_copies: AtomicUsize::new(0),
            }),
        }
    }

    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }
    pub fn dtype(&self) -> KvDtype {
        self.inner.dtype
    }
    pub fn head_dim(&self) -> usize {
        self.inner.head_dim
    }

    /// Whether pages from this pool fit a store of this layout.
    pub fn fits(&self, page_size: usize, dtype: KvDtype, head_dim: usize) -> bool {
        (self.inner.page_size, self.inner.dtype, self.inner.head_dim) == (page_size, dtype, head_dim)
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            pages_in_use: self.inner.in_use.load(Ordering::Relaxed),
            peak_pages: self.inner.peak.load(Ordering::Relaxed),
            free_pages: self.inner.free.lock().map_or(0, |f| f.len()),
            cow_copies: self.inner.cow_copies.load(Ordering::Relaxed),
            page_bytes: self.inner.page_bytes,
        }
    }

    /// Releases the free list's memory (freed pages otherwise stay there for
    /// reuse, so a pool holds its peak; a server trims when idle).
    pub fn trim(&self) {
        if let Ok(mut f) = self.inner.free.lock() {
            f.clear();
        }
    }

    fn alloc(&self) -> Arc<Page> {
        let rows = self.inner.free.lock().ok().and_then(|mut f| f.pop());
        let rows = rows.unwrap_or_else(|| RowBuf::new(self.inner.dtype, self.inner.head_dim, self.inner.page_size));
        let n = self.inner.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.peak.fetch_max(n, Ordering::Relaxed);
        Arc::new(Page { rows, pool: Arc::clone(&self.inner) })
    }
}

/// One page of K or V rows; back to its pool's free list when the last
/// reference drops.
pub struct Page {
    rows: RowBuf,
    pool: Arc<PoolInner>,
}

impl Drop for Page {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
        let rows = std::mem::replace(&mut self.rows, RowBuf::new(self.pool.dtype, self.pool.head_dim, 0));
        if let Ok(mut f) = self.pool.free.lock() {
            f.push(rows);
        }
    }
}

/// Page-level counters of one (sequence, layer, KV head).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PageCounts {
    /// Pages referenced by the page table (shared ones included).
    pub pages: usize,
    /// Of those, pages another sequence also references.
    pub shared_pages: usize,
    /// Live tokens.
    pub live: usize,
    /// Allocated − live slots (holes and the tail page's unused rows).
    pub fragmentation: usize,
    /// Bytes copied by compaction so far.
    pub bytes_moved: u64,
    /// Shared pages this sequence copied on first write.
    pub cow_copies: u64,
}

impl std::ops::AddAssign for PageCounts {
    fn add_assign(&mut self, o: Self) {
        self.pages += o.pages;
        self.shared_pages += o.shared_pages;
        self.live += o.live;
        self.fragmentation += o.fragmentation;
        self.bytes_moved += o.bytes_moved;
        self.cow_copies += o.cow_copies;
    }
}

/// The paged K/V of one (sequence, layer, KV head).
#[derive(Clone)]
pub struct PagedKv {
    pool: PagePool,
    page_size: usize,
    has_keys: bool,
    key_pages: Vec<Option<Arc<Page>>>,
    value_pages: Vec<Option<Arc<Page>>>,
    /// Live tokens per page-table entry (0 = free entry).
    live: Vec<u32>,
    free_entries: Vec<u32>,
    /// Address of each occupied slot, in slot order.
    addr: Vec<u32>,
    /// (entry, next free offset) of the page new tokens go to.
    tail: Option<(u32, u32)>,
    /// f32 stores only: address of each entry's first K / V float (0 = no
    /// page), so attention finds a row with one load instead of chasing
    /// Arc → page → buffer. Valid while the entry's `Arc` is held here;
    /// page buffers never reallocate.
    key_base: Vec<usize>,
    value_base: Vec<usize>,
    bytes_moved: u64,
    cow_copies: u64,
    /// Most pages this head may reference ([`page_cap`]).
    max_pages: usize,
    /// Most K/V page bytes this head has referenced at once.
    peak_kv_bytes: usize,
}

/// Most pages a paged head of `capacity` slots may reference at once: one
/// more than its tokens need, or half as many again, whichever is more
/// (max(m + 1, ⌊3m/2⌋) with m = ⌈capacity / page_size⌉). Token eviction
/// leaves holes in pages; when the next token would need a page beyond
/// the cap, the head first repacks its live tokens ([`PagedKv::compact`]),
/// so a sequence's memory is bounded by its capacity, not by how its
/// evictions happened to scatter, and a reservation of the cap is within
/// 1.5× of what a head that fills its capacity holds (m ≥ 2). Repacking
/// leaves at least one free page of room, so it happens at most once
/// every `page_size` tokens.
pub fn page_cap(capacity: usize, page_size: usize) -> usize {
    let m = capacity.div_ceil(page_size).max(1);
    (m + 1).max(3 * m / 2)
}

impl PagedKv {
    pub fn new(pool: PagePool, capacity: usize) -> Self {
        PagedKv {
            max_pages: page_cap(capacity, pool.page_size()),
            peak_kv_bytes: 0,
            page_size: pool.page_size(),
            pool,
            has_keys: true,
            key_pages: Vec::new(),
            value_pages: Vec::new(),
            live: Vec::new(),
            free_entries: Vec::new(),
            addr: Vec::with_capacity(capacity),
            tail: None,
            key_base: Vec::new(),
            value_base: Vec::new(),
            bytes_moved: 0,
            cow_copies: 0,
        }
    }

    /// Lowers the head's capacity to `capacity` slots (an allocator's
    /// share, decided after the head was made): the page cap follows, and
    /// a head over the new cap repacks at once.
    pub fn limit(&mut self, capacity: usize) {
        self.max_pages = page_cap(capacity, self.page_size);
        if self.pages_referenced() > self.max_pages {
            self.compact();
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.pool.dtype()
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn has_keys(&self) -> bool {
        self.has_keys
    }

    /// The page-table entry holding slot `slot`.
    pub fn page_of(&self, slot: usize) -> u32 {
        self.addr[slot] / self.page_size as u32
    }

    fn new_entry(&mut self) -> u32 {
        let k = self.has_keys.then(|| self.pool.alloc());
        let v = Some(self.pool.alloc());
        let e = match self.free_entries.pop() {
            Some(e) => {
                self.key_pages[e as usize] = k;
                self.value_pages[e as usize] = v;
                e
            }
            None => {
                self.key_pages.push(k);
                self.value_pages.push(v);
                self.live.push(0);
                self.key_base.push(0);
                self.value_base.push(0);
                (self.live.len() - 1) as u32
            }
        };
        self.refresh_base(e as usize);
        self.peak_kv_bytes = self.peak_kv_bytes.max(self.kv_bytes());
        e
    }

    /// Re-reads entry `e`'s buffer addresses after its pages changed.
    fn refresh_base(&mut self, e: usize) {
        let base = |p: &Option<Arc<Page>>| match p {
            Some(p) if p.rows.dtype() == KvDtype::F32 => p.rows.as_f32().map_or(0, |f| f.as_ptr() as usize),
            _ => 0,
        };
        self.key_base[e] = base(&self.key_pages[e]);
        self.value_base[e] = base(&self.value_pages[e]);
    }

    /// A page this sequence may write: copied first if another sequence
    /// shares it (copy-on-write; only the rows in use are copied).
    fn writable<'a>(
        pool: &PagePool,
        slot: &'a mut Option<Arc<Page>>,
        used: usize,
        cow: &mut u64,
    ) -> Option<&'a mut RowBuf> {
        let page = slot.as_mut()?;
        if Arc::get_mut(page).is_none() {
            let mut fresh = pool.alloc();
            let dst = Arc::get_mut(&mut fresh).expect("a fresh page is unshared");
            for r in 0..used {
                dst.rows.copy_row(r, &page.rows, r);
            }
            *page = fresh;
            *cow += 1;
            pool.inner.cow_copies.fetch_add(1, Ordering::Relaxed);
        }
        Arc::get_mut(page).map(|p| &mut p.rows)
    }

    /// Appends a token; its slot is `len()` before the call.
    pub fn push(&mut self, key: RowIn<'_>, value: RowIn<'_>) {
        let (entry, off) = self.next_address();
        let e = entry as usize;
        let mut cow = 0;
        if let Some(rows) = Self::writable(&self.pool, &mut self.key_pages[e], off as usize, &mut cow) {
            rows.put(off as usize, key);
        }
        if let Some(rows) = Self::writable(&self.pool, &mut self.value_pages[e], off as usize, &mut cow) {
            rows.put(off as usize, value);
        }
        // both K and V of a shared page count as one copied page each
        self.cow_copies += cow;
        if cow > 0 {
            self.refresh_base(e);
        }
        self.occupy(entry, off);
    }

    /// Where the next token goes: the tail page's next row, or row 0 of a
    /// new page.
    fn next_address(&mut self) -> (u32, u32) {
        match self.tail {
            Some((e, o)) if (o as usize) < self.page_size => return (e, o),
            _ => {}
        }
        if self.pages_referenced() >= self.max_pages {
            // holes left by evictions: repack before growing past the cap
            self.compact();
            if let Some((e, o)) = self.tail.filter(|&(_, o)| (o as usize) < self.page_size) {
                return (e, o);
            }
        }
        (self.new_entry(), 0)
    }

    /// Records a token written at (entry, off) as the next slot.
    fn occupy(&mut self, entry: u32, off: u32) {
        self.live[entry as usize] += 1;
        self.tail = Some((entry, off + 1));
        self.addr.push(entry * self.page_size as u32 + off);
    }

    fn release(&mut self, address: u32) {
        let e = (address / self.page_size as u32) as usize;
        self.live[e] -= 1;
        if self.live[e] == 0 {
            self.key_pages[e] = None;
            self.value_pages[e] = None;
            self.refresh_base(e);
            self.free_entries.push(e as u32);
            if self.tail.is_some_and(|(t, _)| t as usize == e) {
                self.tail = None;
            }
        }
    }

    /// Evicts `victim` the way the fixed-slot store does: the last slot
    /// takes its place in slot order. Only addresses move.
    pub fn evict(&mut self, victim: usize) {
        let a = self.addr.swap_remove(victim);
        self.release(a);
    }

    /// Keeps exactly the listed slots (ascending), in that order. When the
    /// dropped slots were the last rows written to the tail page (a cut
    /// back to a prefix, as speculative decoding's rollback makes), the
    /// next token is written right after the last live row again instead
    /// of leaving a hole: rejected drafts cost no pages.
    pub fn retain_slots(&mut self, keep: &[usize]) {
        let (mut k, mut w) = (0, 0);
        for i in 0..self.addr.len() {
            let a = self.addr[i];
            if keep.get(k) == Some(&i) {
                self.addr[w] = a;
                w += 1;
                k += 1;
            } else {
                self.release(a);
            }
        }
        self.addr.truncate(w);
        // the tail page, or (when the cut freed it) the last slot's page
        let ps = self.page_size as u32;
        let Some(e) = self.tail.map(|(e, _)| e).or_else(|| self.addr.last().map(|a| a / ps)) else { return };
        let used = self.addr.iter().filter(|&&a| a / ps == e).map(|&a| a % ps + 1).max();
        // rows past the last live one of that page are free
        self.tail = used.map(|o| (e, o));
    }

    pub fn drop_keys(&mut self) {
        self.has_keys = false;
        self.key_pages.iter_mut().for_each(|p| *p = None);
        self.key_base.iter_mut().for_each(|b| *b = 0);
    }

    fn pages_referenced(&self) -> usize {
        self.value_pages.iter().filter(|p| p.is_some()).count()
    }

    /// Repacks the live tokens into `ceil(len / page_size)` pages, in place:
    /// the pages this sequence owns alone and then those holding the most
    /// live tokens stay, the tokens of the others move into their holes,
    /// and the emptied pages return to the pool (a shared page stays with
    /// its other owners). Only addresses change (slot order and contents are kept, so
    /// results are unchanged); no page is allocated except a copy of a
    /// page shared with a clone (copy-on-write), so repacking never holds
    /// more pages than before it. The bytes copied are counted.
    pub fn compact(&mut self) {
        let p = self.page_size;
        let need = self.addr.len().div_ceil(p);
        // target entries: pages this sequence owns alone first (filling a
        // shared page's holes would copy it), then the fullest (ties: lower
        // entry first)
        let shared = |e: usize| self.value_pages[e].as_ref().is_some_and(|p| Arc::strong_count(p) > 1);
        let mut entries: Vec<usize> = (0..self.live.len()).filter(|&e| self.live[e] > 0).collect();
        entries.sort_by_key(|&e| (shared(e), std::cmp::Reverse(self.live[e]), e));
        entries.truncate(need);
        let Some(&partial) = entries.last() else { return };
        let mut used = vec![false; self.live.len() * p];
        self.addr.iter().for_each(|&a| used[a as usize] = true);
        let mut is_target = vec![false; self.live.len()];
        entries.iter().for_each(|&e| is_target[e] = true);
        // holes to fill: the partial page's below the rows it keeps
        // (`partial_live`, so its free rows end it) first, so it never
        // empties while its extra rows move out; then every full target's
        let partial_live = self.addr.len() - (need - 1) * p;
        let mut holes: Vec<u32> =
            (partial * p..partial * p + partial_live).filter(|&a| !used[a]).map(|a| a as u32).collect();
        for &e in entries.iter().filter(|&&e| e != partial) {
            holes.extend((e * p..(e + 1) * p).filter(|&a| !used[a]).map(|a| a as u32));
        }
        let mut next_hole = 0;
        for s in 0..self.addr.len() {
            let a = self.addr[s] as usize;
            // a token moves when its page goes, or when it sits in the
            // partial page beyond the rows that page keeps
            if is_target[a / p] && !(a / p == partial && a % p >= partial_live) {
                continue;
            }
            self.move_row(s, holes[next_hole]);
            next_hole += 1;
        }
        self.tail = Some((partial as u32, partial_live as u32));
    }

    /// Moves slot `s`'s K and V rows to the free address `to`.
    fn move_row(&mut self, s: usize, to: u32) {
        let p = self.page_size;
        let from = self.addr[s];
        let (fe, fo, te, to_off) = ((from as usize) / p, (from as usize) % p, (to as usize) / p, (to as usize) % p);
        let mut cow = 0;
        let mut moved = 0u64;
        for pages in [&mut self.key_pages, &mut self.value_pages] {
            if pages[te].is_none() {
                continue;
            }
            if fe == te {
                if let Some(rows) = Self::writable(&self.pool, &mut pages[te], p, &mut cow) {
                    rows.copy_within(fo, to_off);
                    moved += rows.row_bytes() as u64;
                }
            } else {
                let src = pages[fe].clone().expect("a live token's page exists");
                if let Some(rows) = Self::writable(&self.pool, &mut pages[te], p, &mut cow) {
                    rows.copy_row(to_off, &src.rows, fo);
                    moved += rows.row_bytes() as u64;
                }
            }
        }
        self.cow_copies += cow;
        self.bytes_moved += moved;
        self.refresh_base(te);
        self.live[te] += 1;
        self.addr[s] = to;
        self.release(from);
    }

    /// Page-level counters.
    pub fn counts(&self) -> PageCounts {
        let pages = self.pages_referenced();
        let shared = self.value_pages.iter().flatten().filter(|p| Arc::strong_count(p) > 1).count();
        PageCounts {
            pages,
            shared_pages: shared,
            live: self.addr.len(),
            fragmentation: pages * self.page_size - self.addr.len(),
            bytes_moved: self.bytes_moved,
            cow_copies: self.cow_copies,
        }
    }

    /// Bytes of the pages this sequence references (shared pages counted in full).
    /// Most bytes [`PagedKv::kv_bytes`] has been at once (inside a step
    /// too: a token may take a new page before an eviction frees one).
    pub fn peak_kv_bytes(&self) -> usize {
        self.peak_kv_bytes
    }

    pub fn kv_bytes(&self) -> usize {
        let pb = self.pool.inner.page_bytes;
        self.key_pages.iter().chain(&self.value_pages).filter(|p| p.is_some()).count() * pb
    }

    /// Bytes of the page table, live counts and slot addresses.
    pub fn metadata_bytes(&self) -> usize {
        (self.key_pages.capacity() + self.value_pages.capacity()) * std::mem::size_of::<Option<Arc<Page>>>()
            + (self.live.capacity() + self.free_entries.capacity() + self.addr.capacity()) * 4
    }

    /// Slot `slot`'s K (`keys`) or V row as stored: codes and side values.
    pub fn coded(&self, slot: usize, keys: bool) -> (&[u8], &[f32]) {
        let rows = if keys { self.keys() } else { self.values() };
        let (p, r) = rows.split(slot);
        let pages = if keys { &self.key_pages } else { &self.value_pages };
        pages[p].as_ref().expect("a live slot's page is allocated").rows.coded(r)
    }

    /// Raises the head's capacity (a fork given room for more tokens).
    pub fn raise(&mut self, capacity: usize) {
        self.max_pages = self.max_pages.max(page_cap(capacity, self.page_size));
        self.addr.reserve(capacity.saturating_sub(self.addr.len()));
    }

    pub fn keys(&self) -> PagedRows<'_> {
        self.rows(&self.key_pages, &self.key_base)
    }
    pub fn values(&self) -> PagedRows<'_> {
        self.rows(&self.value_pages, &self.value_base)
    }

    fn rows<'a>(&'a self, pages: &'a [Option<Arc<Page>>], base: &'a [usize]) -> PagedRows<'a> {
        let f32_rows = self.pool.dtype() == KvDtype::F32;
        PagedRows {
            pages,
            base: if f32_rows { base } else { &[] },
            addr: &self.addr,
            page_size: self.page_size,
            shift: self.page_size.is_power_of_two().then(|| self.page_size.trailing_zeros()),
            d: self.pool.head_dim(),
        }
    }
}

/// Slot-order view of paged K or V rows.
#[derive(Clone, Copy)]
pub struct PagedRows<'a> {
    pages: &'a [Option<Arc<Page>>],
    /// Buffer addresses per entry (f32 pages only; empty otherwise).
    base: &'a [usize],
    addr: &'a [u32],
    page_size: usize,
    shift: Option<u32>,
    d: usize,
}

impl PagedRows<'_> {
    #[inline]
    fn split(&self, slot: usize) -> (usize, usize) {
        let a = self.addr[slot] as usize;
        match self.shift {
            Some(s) => (a >> s, a & (self.page_size - 1)),
            None => (a / self.page_size, a % self.page_size),
        }
    }

    /// [`SlotRows::dot_group_run`] (`DOT`) or `axpy_group_run` on coded
    /// pages: the fixed store's run kernel over each stretch of slots that
    /// sit on consecutive rows of one page (bit-identical to slot by slot,
    /// so paged and fixed stay equal); f32 pages slot by slot.
    #[inline]
    fn group_run<const DOT: bool>(&self, slots: Range<usize>, a: &[f32], buf: &mut [f32], b: &mut [f32]) {
        if !self.base.is_empty() {
            return group_each::<DOT, _>(self, slots, a, buf, b);
        }
        let g = if DOT { b.len() } else { a.len() } / slots.len().max(1);
        let mut j = 0;
        while j < slots.len() {
            let m = self.stretch(slots.start + j, slots.len() - j);
            let (rows, r) = self.locate(slots.start + j);
            if DOT {
                rows.dot_group_run(r, m, a, buf, &mut b[j * g..(j + m) * g]);
            } else {
                rows.axpy_group_run(r, m, &a[j * g..(j + m) * g], buf, b);
            }
            j += m;
        }
    }

    /// How many of the `max` slots from `slot` on sit on consecutive rows
    /// of `slot`'s page (at least 1).
    #[inline]
    fn stretch(&self, slot: usize, max: usize) -> usize {
        let (a, in_page) = (self.addr[slot], self.split(slot).1);
        let room = (self.page_size - in_page).min(max);
        (1..room).find(|&k| self.addr[slot + k] != a + k as u32).unwrap_or(room)
    }

    #[inline]
    fn locate(&self, slot: usize) -> (&RowBuf, usize) {
        let (p, r) = self.split(slot);
        let page = self.pages[p].as_ref().expect("a live slot's page is allocated");
        (&page.rows, r)
    }
}

impl SlotRows for PagedRows<'_> {
    #[inline]
    fn row<'a>(&'a self, slot: usize, buf: &'a mut [f32]) -> &'a [f32] {
        if !self.base.is_empty() {
            let (p, r) = self.split(slot);
            let base = self.base[p];
            assert!(base != 0, "a live slot's page is allocated");
            // SAFETY: `base` is the start of entry p's f32 page buffer
            // (page_size × d floats), kept alive by the Arc in `pages[p]`
            // that this view borrows; r < page_size.
            return unsafe { std::slice::from_raw_parts((base as *const f32).add(r * self.d), self.d) };
        }
        let (rows, r) = self.locate(slot);
        rows.row(r, buf)
    }

    /// Same kernel as the fixed store's on the same row ([`RowBuf`]), so
    /// paged and fixed slots stay bit-identical.
    #[inline]
    fn dot_group(&self, slot: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        if !self.base.is_empty() {
            return dot_group_f32(self.row(slot, buf), &queries[..out.len() * self.d], out);
        }
        let (rows, r) = self.locate(slot);
        rows.dot_group(r, queries, buf, out)
    }

    #[inline]
    fn axpy_group(&self, slot: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        if !self.base.is_empty() {
            return axpy_group_f32(self.row(slot, buf), probs, &mut outs[..probs.len() * self.d]);
        }
        let (rows, r) = self.locate(slot);
        rows.axpy_group(r, probs, buf, outs)
    }

    #[inline]
    fn dot_group_run(&self, start: usize, n: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        self.group_run::<true>(start..start + n, queries, buf, out)
    }

    #[inline]
    fn axpy_group_run(&self, start: usize, n: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        self.group_run::<false>(start..start + n, probs, buf, outs)
    }

    #[inline]
    fn prefetch(&self, slot: usize) {
        let (p, r) = self.split(slot);
        match self.base.get(p) {
            Some(&base) if base != 0 => {
                prefetch_bytes((base as *const f32).wrapping_add(r * self.d).cast(), self.d * 4)
            }
            _ => {
                if let Some(page) = self.pages.get(p).and_then(Option::as_ref) {
                    page.rows.prefetch(r);
                }
            }
        }
    }
}
