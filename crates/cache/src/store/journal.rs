//! The undo journal of a fixed-slot head (speculative decoding rolls a
//! head back to a checkpoint, or to just before any push since): what the
//! head looked like at the checkpoint, and the old contents of every row
//! overwritten since, in order. Rolling back restores the metadata and
//! writes the rows back newest first, so nothing copies the whole head.

use super::rows::RowBuf;

/// A head's slot metadata, which a journal saves and restores beside its
/// rows.
pub(super) struct Meta<'a> {
    pub len: &'a mut usize,
    pub capacity: &'a mut usize,
    pub positions: &'a mut Vec<u32>,
    pub scores: &'a mut Vec<f32>,
}

/// A fixed-slot head's K (absent once dropped) and V rows.
pub(super) type KvRows<'a> = (&'a mut Option<RowBuf>, &'a mut RowBuf);

/// Records nothing until [`Journal::begin`]; kept allocated between
/// checkpoints, so a journal per decode step costs no allocation.
#[derive(Clone)]
pub(super) struct Journal {
    active: bool,
    len: usize,
    capacity: usize,
    positions: Vec<u32>,
    scores: Vec<f32>,
    /// The slot of every saved row, in the order they were saved.
    slots: Vec<usize>,
    keys: Option<RowBuf>,
    values: RowBuf,
    /// One per push since the checkpoint: the head just before it.
    marks: Vec<Mark>,
    /// The live positions and scores of every mark, back to back.
    mark_positions: Vec<u32>,
    mark_scores: Vec<f32>,
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

impl Journal {
    /// An inactive journal for rows of the types of `keys` and `values`.
    pub(super) fn new(head_dim: usize, keys: Option<&RowBuf>, values: &RowBuf) -> Self {
        Journal {
            active: false,
            len: 0,
            capacity: 0,
            positions: Vec::new(),
            scores: Vec::new(),
            slots: Vec::new(),
            keys: keys.map(|k| RowBuf::new(k.dtype(), head_dim, 0)),
            values: RowBuf::new(values.dtype(), head_dim, 0),
            marks: Vec::new(),
            mark_positions: Vec::new(),
            mark_scores: Vec::new(),
        }
    }

    /// Starts recording from a head of `len` live slots (of `capacity`)
    /// with these positions and scores, forgetting any earlier record.
    pub(super) fn begin(&mut self, len: usize, capacity: usize, positions: &[u32], scores: &[f32]) {
        self.active = true;
        (self.len, self.capacity) = (len, capacity);
        self.positions.clear();
        self.positions.extend_from_slice(positions);
        self.scores.clear();
        self.scores.extend_from_slice(scores);
        self.slots.clear();
        if let Some(k) = self.keys.as_mut() {
            k.clear();
        }
        self.values.clear();
        self.marks.clear();
        self.mark_positions.clear();
        self.mark_scores.clear();
    }

    /// Stops recording, keeping every change.
    pub(super) fn end(&mut self) {
        self.active = false;
    }

    /// Pushes recorded since [`Journal::begin`] (0 when not recording).
    pub(super) fn pushes(&self) -> usize {
        if self.active {
            self.marks.len()
        } else {
            0
        }
    }

    /// Records the head (`len` live slots) just before a push.
    #[inline]
    pub(super) fn mark(&mut self, len: usize, positions: &[u32], scores: &[f32]) {
        if !self.active {
            return;
        }
        let at = self.mark_positions.len();
        self.marks.push(Mark { len, saved: self.slots.len(), at });
        self.mark_positions.extend_from_slice(&positions[..len]);
        self.mark_scores.extend_from_slice(&scores[..len]);
    }

    /// Saves row `slot` of `keys` and `values` before it is overwritten.
    #[inline]
    pub(super) fn save_row(&mut self, keys: Option<&RowBuf>, values: &RowBuf, slot: usize) {
        if !self.active {
            return;
        }
        if let (Some(saved), Some(k)) = (self.keys.as_mut(), keys) {
            saved.push_row_from(k, slot);
        }
        self.values.push_row_from(values, slot);
        self.slots.push(slot);
    }

    /// Returns the head to the checkpoint and stops recording: rows written
    /// back newest first, metadata restored. Panics when not recording.
    pub(super) fn rollback(&mut self, rows: KvRows<'_>, head: Meta<'_>) {
        assert!(self.active, "rollback without a checkpoint");
        self.write_back(rows, 0);
        *head.len = self.len;
        *head.capacity = self.capacity;
        head.positions.clone_from(&self.positions);
        head.scores.clone_from(&self.scores);
        self.active = false;
    }

    /// Returns the head to just before push number `pushes` (at least 1)
    /// and stops recording: the live slots' rows, positions and scores as
    /// they were; slots beyond them may hold other stale data. Panics when
    /// not recording or with fewer pushes.
    pub(super) fn rollback_to(&mut self, pushes: usize, rows: KvRows<'_>, head: Meta<'_>) {
        assert!(self.active, "rollback without a checkpoint");
        let m = self.marks[pushes];
        self.write_back(rows, m.saved);
        *head.len = m.len;
        head.positions[..m.len].copy_from_slice(&self.mark_positions[m.at..m.at + m.len]);
        head.scores[..m.len].copy_from_slice(&self.mark_scores[m.at..m.at + m.len]);
        self.active = false;
    }

    /// Writes the rows saved since entry `from` of the log back, newest
    /// first (a slot saved twice ends with its oldest contents).
    fn write_back(&self, (keys, values): KvRows<'_>, from: usize) {
        for i in (from..self.slots.len()).rev() {
            if let (Some(k), Some(saved)) = (keys.as_mut(), self.keys.as_ref()) {
                k.copy_row(self.slots[i], saved, i);
            }
            values.copy_row(self.slots[i], &self.values, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslim_kernels::kvquant::KvDtype;

    const D: usize = 4;

    /// A head of `n` f32 rows, row `i` filled with `base + i`.
    fn rows(n: usize, base: f32) -> (Option<RowBuf>, RowBuf) {
        let (mut k, mut v) = (RowBuf::new(KvDtype::F32, D, n), RowBuf::new(KvDtype::F32, D, n));
        for i in 0..n {
            k.write(i, &[base + i as f32; D]);
            v.write(i, &[-(base + i as f32); D]);
        }
        (Some(k), v)
    }

    fn contents(k: &Option<RowBuf>, v: &RowBuf) -> (Vec<f32>, Vec<f32>) {
        (k.as_ref().unwrap().as_f32().unwrap().to_vec(), v.as_f32().unwrap().to_vec())
    }

    /// A head's metadata, as the journal sees it.
    struct Head {
        len: usize,
        capacity: usize,
        positions: Vec<u32>,
        scores: Vec<f32>,
    }

    impl Head {
        fn meta(&mut self) -> Meta<'_> {
            Meta {
                len: &mut self.len,
                capacity: &mut self.capacity,
                positions: &mut self.positions,
                scores: &mut self.scores,
            }
        }
    }

    /// Overwrites `slot` (saving it first) with `x`, as a push or an
    /// eviction does.
    fn overwrite(j: &mut Journal, (k, v): (&mut Option<RowBuf>, &mut RowBuf), slot: usize, x: f32) {
        j.save_row(k.as_ref(), v, slot);
        k.as_mut().unwrap().write(slot, &[x; D]);
        v.write(slot, &[x; D]);
    }

    #[test]
    fn rollback_restores_rows_and_metadata_bit_for_bit() {
        let (mut k, mut v) = rows(6, 1.0);
        let before = contents(&k, &v);
        let mut head = Head { len: 4, capacity: 6, positions: vec![0, 1, 2, 3, 0, 0], scores: vec![0.5; 6] };
        let mut j = Journal::new(D, k.as_ref(), &v);
        j.begin(head.len, head.capacity, &head.positions, &head.scores);
        // slot 2 overwritten twice: the oldest contents must win
        for (slot, x) in [(4, 9.0), (2, 7.0), (2, 8.0), (5, 6.0)] {
            overwrite(&mut j, (&mut k, &mut v), slot, x);
        }
        (head.len, head.capacity, head.positions[2], head.scores[1]) = (6, 8, 40, 3.0);
        head.positions.push(99);
        j.rollback((&mut k, &mut v), head.meta());
        assert_eq!(contents(&k, &v), before);
        assert_eq!((head.len, head.capacity), (4, 6));
        assert_eq!((head.positions, head.scores), (vec![0, 1, 2, 3, 0, 0], vec![0.5; 6]));
        assert_eq!(j.pushes(), 0, "a rollback ends the journal");
    }

    #[test]
    fn rollback_to_a_mark_keeps_the_pushes_before_it() {
        let (mut k, mut v) = rows(4, 1.0);
        let mut head = Head { len: 1, capacity: 4, positions: vec![10, 0, 0, 0], scores: vec![1.0, 0.0, 0.0, 0.0] };
        let mut j = Journal::new(D, k.as_ref(), &v);
        j.begin(head.len, head.capacity, &head.positions, &head.scores);
        let mut after_first = None;
        for p in 1..4 {
            j.mark(head.len, &head.positions, &head.scores);
            overwrite(&mut j, (&mut k, &mut v), head.len, 100.0 + p as f32);
            (head.positions[head.len], head.scores[head.len]) = (10 + p, p as f32);
            head.len += 1;
            if p == 1 {
                after_first = Some((contents(&k, &v), head.positions.clone(), head.scores.clone()));
            }
        }
        assert_eq!(j.pushes(), 3);
        j.rollback_to(1, (&mut k, &mut v), head.meta());
        let (rows_then, positions, scores) = after_first.unwrap();
        assert_eq!(head.len, 2);
        assert_eq!(contents(&k, &v).0[..2 * D], rows_then.0[..2 * D]);
        assert_eq!(contents(&k, &v).1[..2 * D], rows_then.1[..2 * D]);
        assert_eq!((&head.positions[..2], &head.scores[..2]), (&positions[..2], &scores[..2]));
        assert_eq!(j.pushes(), 0);
    }

    #[test]
    fn records_nothing_unless_begun_or_after_end() {
        let (mut k, mut v) = rows(3, 1.0);
        let mut j = Journal::new(D, k.as_ref(), &v);
        overwrite(&mut j, (&mut k, &mut v), 0, 5.0);
        j.mark(1, &[0], &[0.0]);
        assert_eq!((j.pushes(), j.slots.len()), (0, 0));
        j.begin(3, 3, &[0, 1, 2], &[0.0; 3]);
        j.mark(3, &[0, 1, 2], &[0.0; 3]);
        j.end();
        overwrite(&mut j, (&mut k, &mut v), 1, 5.0);
        assert_eq!((j.pushes(), j.slots.len()), (0, 0));
    }

    #[test]
    fn headless_rows_roll_back_values_alone() {
        let (_, mut v) = rows(3, 2.0);
        let mut k = None;
        let before = v.as_f32().unwrap().to_vec();
        let mut head = Head { len: 3, capacity: 3, positions: vec![0, 1, 2], scores: vec![0.0; 3] };
        let mut j = Journal::new(D, None, &v);
        j.begin(head.len, head.capacity, &head.positions, &head.scores);
        j.save_row(None, &v, 1);
        v.write(1, &[0.0; D]);
        j.rollback((&mut k, &mut v), head.meta());
        assert_eq!(v.as_f32().unwrap(), &before[..]);
    }

    #[test]
    #[should_panic(expected = "rollback without a checkpoint")]
    fn rollback_without_begin_panics() {
        let (mut k, mut v) = rows(1, 0.0);
        let mut head = Head { len: 1, capacity: 1, positions: vec![0], scores: vec![0.0] };
        Journal::new(D, k.as_ref(), &v).rollback((&mut k, &mut v), head.meta());
    }
}
