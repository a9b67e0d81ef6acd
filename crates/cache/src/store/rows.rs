//! A block of K or V rows in one storage type ([`KvDtype`]): the codes of
//! every row plus its f32 side values (scales, Q4 minimums). A row's codes
//! and side values always move together ([`RowBuf::copy_row`]): a row read
//! with another row's scale would still decode to finite numbers, so the
//! mistake would never announce itself.

use kvslim_kernels::attention::{axpy_group_f32, dot_group_f32, group_each, prefetch_bytes, SlotRows};
use kvslim_kernels::kvquant::{KvDtype, KvRun};

/// One row handed to a store: floats to encode, or a row already in the
/// store's dtype (its codes and side values, as [`RowBuf::coded`] gives
/// them), as a saved context brings them back without re-encoding (a
/// quantized row encoded twice need not come out the same).
#[derive(Clone, Copy)]
pub enum RowIn<'a> {
    Floats(&'a [f32]),
    Coded { codes: &'a [u8], side: &'a [f32] },
}

/// `rows` rows of `d` elements stored as `dtype`.
#[derive(Clone)]
pub struct RowBuf {
    dtype: KvDtype,
    d: usize,
    /// u32 words per row (codes are padded to 4 bytes so rows stay aligned).
    row_words: usize,
    scales_per_row: usize,
    data: Vec<u32>,
    scales: Vec<f32>,
}

#[cfg(test)]
thread_local! {
    /// Fault injection for the scale-path test: when set, row copies move
    /// the codes but leave the destination's old scales in place.
    pub(crate) static SKIP_SCALE_COPY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl RowBuf {
    /// Zeroed storage for `rows` rows.
    pub fn new(dtype: KvDtype, d: usize, rows: usize) -> Self {
        let row_words = dtype.data_bytes(d) / 4;
        let scales_per_row = dtype.scale_count(d);
        RowBuf {
            dtype,
            d,
            row_words,
            scales_per_row,
            data: vec![0; rows * row_words],
            scales: vec![0.0; rows * scales_per_row],
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Rows this block can hold.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.row_words).unwrap_or(0)
    }

    fn codes(&self, i: usize) -> &[u8] {
        let w = &self.data[i * self.row_words..(i + 1) * self.row_words];
        // SAFETY: any initialised u32 slice is a valid byte slice of 4× the length.
        unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) }
    }

    fn codes_mut(&mut self, i: usize) -> &mut [u8] {
        let w = &mut self.data[i * self.row_words..(i + 1) * self.row_words];
        // SAFETY: as in `codes`; every byte pattern is a valid u32.
        unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 4) }
    }

    /// Rows `i..i + n` as a run (the codes reach to the end of the store).
    fn run(&self, i: usize, n: usize) -> KvRun<'_> {
        let w = &self.data[i * self.row_words..];
        // SAFETY: as in `codes`.
        let codes = unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) };
        let spr = self.scales_per_row;
        KvRun { codes, stride: self.row_words * 4, scales: &self.scales[i * spr..], spr, n }
    }

    fn side(&self, i: usize) -> &[f32] {
        &self.scales[i * self.scales_per_row..(i + 1) * self.scales_per_row]
    }

    /// Encodes `src` (d floats) into row `i`.
    pub fn write(&mut self, i: usize, src: &[f32]) {
        let (dtype, spr) = (self.dtype, self.scales_per_row);
        // split borrows: codes live in `data`, side values in `scales`
        let w = &mut self.data[i * self.row_words..(i + 1) * self.row_words];
        // SAFETY: see `codes_mut`.
        let codes = unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 4) };
        dtype.encode(src, codes, &mut self.scales[i * spr..(i + 1) * spr]);
    }

    /// Writes `src` into row `i`: encoded from floats, or copied as coded.
    /// A coded row of another width panics (its length is checked by the
    /// caller that read it from a file).
    pub fn put(&mut self, i: usize, src: RowIn<'_>) {
        match src {
            RowIn::Floats(f) => self.write(i, f),
            RowIn::Coded { codes, side } => {
                self.codes_mut(i).copy_from_slice(codes);
                let spr = self.scales_per_row;
                self.scales[i * spr..(i + 1) * spr].copy_from_slice(side);
            }
        }
    }

    /// Row `i` as stored: its codes (padded to 4 bytes) and side values.
    pub fn coded(&self, i: usize) -> (&[u8], &[f32]) {
        (self.codes(i), self.side(i))
    }

    /// Code bytes per row (padded to 4) and side values per row: what
    /// [`RowBuf::coded`] returns for a `d`-wide row of `dtype`.
    pub fn coded_sizes(dtype: KvDtype, d: usize) -> (usize, usize) {
        (dtype.data_bytes(d) / 4 * 4, dtype.scale_count(d))
    }

    /// Decodes row `i` into `out` (d floats).
    pub fn read(&self, i: usize, out: &mut [f32]) {
        self.dtype.decode(self.codes(i), self.side(i), out);
    }

    /// Copies row `src` of `from` (same dtype and width) into row `dst`:
    /// codes and side values together.
    pub fn copy_row(&mut self, dst: usize, from: &RowBuf, src: usize) {
        debug_assert!(from.dtype == self.dtype && from.d == self.d);
        self.codes_mut(dst).copy_from_slice(from.codes(src));
        #[cfg(test)]
        if SKIP_SCALE_COPY.with(|c| c.get()) {
            return;
        }
        let spr = self.scales_per_row;
        self.scales[dst * spr..(dst + 1) * spr].copy_from_slice(from.side(src));
    }

    /// Appends a copy of row `src` of `from` (same dtype and width) as a new
    /// last row, growing the block (undo journals; amortised).
    pub fn push_row_from(&mut self, from: &RowBuf, src: usize) {
        debug_assert!(from.dtype == self.dtype && from.d == self.d);
        let (rw, spr) = (self.row_words, self.scales_per_row);
        self.data.extend_from_slice(&from.data[src * rw..(src + 1) * rw]);
        self.scales.extend_from_slice(&from.scales[src * spr..(src + 1) * spr]);
    }

    /// Forgets every row, keeping the allocation.
    pub fn clear(&mut self) {
        self.data.clear();
        self.scales.clear();
    }

    /// Moves row `src` onto row `dst` within this block (codes and side values).
    pub fn copy_within(&mut self, src: usize, dst: usize) {
        let rw = self.row_words;
        self.data.copy_within(src * rw..(src + 1) * rw, dst * rw);
        #[cfg(test)]
        if SKIP_SCALE_COPY.with(|c| c.get()) {
            return;
        }
        let spr = self.scales_per_row;
        self.scales.copy_within(src * spr..(src + 1) * spr, dst * spr);
    }

    /// Bytes one row occupies (codes + side values).
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.d)
    }

    /// Allocated bytes (codes + side values).
    pub fn bytes(&self) -> usize {
        self.data.capacity() * 4 + self.scales.capacity() * 4
    }

    /// The rows as plain floats when stored as f32 (the dense fast path).
    pub fn as_f32(&self) -> Option<&[f32]> {
        if self.dtype != KvDtype::F32 {
            return None;
        }
        // SAFETY: f32 rows are stored as their bit patterns; u32 and f32 share
        // size and alignment and every bit pattern is a valid f32.
        Some(unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<f32>(), self.data.len()) })
    }
}

impl SlotRows for RowBuf {
    #[inline]
    fn row<'a>(&'a self, slot: usize, buf: &'a mut [f32]) -> &'a [f32] {
        if self.dtype == KvDtype::F32 {
            let w = &self.data[slot * self.row_words..slot * self.row_words + self.d];
            // SAFETY: f32 rows are stored as their bit patterns (see `as_f32`).
            return unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<f32>(), w.len()) };
        }
        self.read(slot, buf);
        buf
    }

    /// Coded rows: the group kernel works on the codes (no f32 copy).
    #[inline]
    fn dot_group(&self, slot: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        if self.dtype == KvDtype::F32 {
            return dot_group_f32(self.row(slot, buf), &queries[..out.len() * self.d], out);
        }
        self.dtype.dot_group(self.codes(slot), self.side(slot), &queries[..out.len() * self.d], out);
    }

    #[inline]
    fn axpy_group(&self, slot: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        if self.dtype == KvDtype::F32 {
            return axpy_group_f32(self.row(slot, buf), probs, &mut outs[..probs.len() * self.d]);
        }
        self.dtype.axpy_group(self.codes(slot), self.side(slot), probs, &mut outs[..probs.len() * self.d]);
    }

    /// Coded rows: the run kernels (16 rows per horizontal reduction).
    #[inline]
    fn dot_group_run(&self, start: usize, n: usize, queries: &[f32], buf: &mut [f32], out: &mut [f32]) {
        if self.dtype == KvDtype::F32 {
            return group_each::<true, _>(self, start..start + n, queries, buf, out);
        }
        let q = &queries[..out.len() / n.max(1) * self.d];
        self.dtype.dot_group_run(self.run(start, n), q, out);
    }

    #[inline]
    fn axpy_group_run(&self, start: usize, n: usize, probs: &[f32], buf: &mut [f32], outs: &mut [f32]) {
        if self.dtype == KvDtype::F32 {
            return group_each::<false, _>(self, start..start + n, probs, buf, outs);
        }
        let outs = &mut outs[..probs.len() / n.max(1) * self.d];
        self.dtype.axpy_group_run(self.run(start, n), probs, outs);
    }

    #[inline]
    fn prefetch(&self, slot: usize) {
        let w = &self.data[slot * self.row_words..(slot + 1) * self.row_words];
        prefetch_bytes(w.as_ptr().cast(), w.len() * 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_scales_move_together() {
        let d = 40;
        for dtype in KvDtype::ALL {
            let mut a = RowBuf::new(dtype, d, 3);
            let rows: Vec<Vec<f32>> =
                (0..3).map(|r| (0..d).map(|i| ((i * 7 + r * 13) as f32).sin() * (r + 1) as f32).collect()).collect();
            for (r, row) in rows.iter().enumerate() {
                a.write(r, row);
            }
            let mut want = vec![0.0; d];
            a.read(2, &mut want);
            a.copy_within(2, 0);
            let mut got = vec![0.0; d];
            a.read(0, &mut got);
            assert_eq!(got, want, "{dtype}");
            let mut b = RowBuf::new(dtype, d, 1);
            b.copy_row(0, &a, 1);
            a.read(1, &mut want);
            b.read(0, &mut got);
            assert_eq!(got, want, "{dtype}");
        }
    }

    #[test]
    fn byte_accounting_counts_codes_and_scales() {
        let b = RowBuf::new(KvDtype::Q8, 64, 10);
        assert_eq!(b.bytes(), 10 * (64 + 2 * 4));
        assert_eq!(b.row_bytes(), 64 + 8);
        assert_eq!(RowBuf::new(KvDtype::F32, 64, 10).bytes(), 10 * 64 * 4);
    }
}
