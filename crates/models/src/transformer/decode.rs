//! A decode step's attention in one layer (docs/policies.md §1 steps 1–5, §2 after
//! the probe): the new token becomes the candidate slot of every KV head;
//! each representative head attends over its KV head's candidates; every
//! other head applies its representative's probabilities to its own V;
//! then the cache runs the token policy (scores, evictions).

use super::scratch::{split_layout, Scratch};
use super::Model;
use crate::Result;
use kvslim_cache::SequenceCache;
use kvslim_kernels::attention::{
    chunk_factors, chunk_scores, chunk_values, merge_chunks, weighted_values, Visible, SPLIT_SLOTS,
};
use rayon::prelude::*;

/// Attention work (slots × dims × heads) above which heads run in parallel.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// One layer's decode step: where the token is, how attention is scaled,
/// the probability row stride (the layer's slot capacity), the most slots a
/// KV head holds, and whether heads run in parallel.
#[derive(Clone, Copy)]
struct Step {
    li: usize,
    p0: usize,
    scale: f32,
    stride: usize,
    most: usize,
    parallel: bool,
}

impl Model {
    /// Layer `li`'s decode attention for the token at `p0` (its Q, K and V
    /// positioned in `s.a`), output in `s.a.att[..q_dim]`.
    pub(super) fn decode_attention(
        &self,
        li: usize,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        p0: usize,
        scale: f32,
    ) -> Result<()> {
        let kvd = self.config.kv_dim();
        cache.append(li, p0, &s.a.k[..kvd], &s.a.v[..kvd])?;
        cache.check_keys(li)?;
        let c = &self.config;
        let layer = cache.layer(li);
        // KV heads may hold different counts (page eviction removes a page's
        // live tokens, which differ per head); heads tied by CHAI stay equal
        let most = layer.iter().map(|h| h.len()).max().unwrap_or(0);
        let step = Step {
            li,
            p0,
            scale,
            // heads of a layer may have different capacities (an allocator's
            // per-head shares on a paged store)
            stride: layer.iter().map(|h| h.capacity()).max().unwrap_or(0),
            most,
            parallel: most * c.head_dim * c.n_heads >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1,
        };
        let stride = step.stride;
        self.split_attention(step, cache, s);
        self.share_probabilities(step, cache, s);
        if s.trace.is_some() {
            self.trace_decode(li, cache, s, stride);
        }
        cache.record_decode_probe(li, p0, &s.probs, stride);
        cache.after_decode_attention(li, &s.probs, stride);
        Ok(())
    }

    /// Representatives' attention, split (flash-decoding): tasks of (KV
    /// head, chunk of SPLIT_SLOTS slots) read every K/V row once for the
    /// whole query group (f16/q8/q4 rows straight from their codes);
    /// between the two passes the log-sum-exp rule turns each chunk's local
    /// weights into final probabilities. Chunk boundaries are fixed, so the
    /// result is the same on any number of threads, and with one chunk it
    /// is the one-pass kernel's bit for bit; every core works on one long
    /// sequence even with few KV heads (Gemma 3 270M has one).
    fn split_attention(&self, step: Step, cache: &SequenceCache, s: &mut Scratch) {
        let Step { li, p0, scale, stride: slots, most, parallel } = step;
        let c = &self.config;
        let (hd, g) = (c.head_dim, c.group_size());
        let (layer, lh) = (cache.layer(li), cache.layer_heads(li));
        let layout = split_layout(c);
        let bl = layout.block_len();
        let nch = most.div_ceil(SPLIT_SLOTS).max(1);
        let visible = Visible::within(p0 as u32, c.layer_window(li));
        let q = &s.a.q;
        // a KV head without keys has no representative (checked by the cache)
        let live = |kvh: usize, ch: usize| ch * SPLIT_SLOTS < layer[kvh].len() && layer[kvh].has_keys();
        let scores = |(t, block): (usize, &mut [f32])| {
            let (kvh, ch) = (t / nch, t % nch);
            if let (true, Some(keys)) = (live(kvh, ch), layer[kvh].key_rows()) {
                // every head of the group (also CHAI members, whose rows are
                // then ignored): a head's result does not depend on the group
                let queries = &q[kvh * g * hd..(kvh + 1) * g * hd];
                chunk_scores(queries, &keys, layer[kvh].positions(), ch, visible, scale, layout, block);
            }
        };
        let values = |(t, block): (usize, &mut [f32])| {
            let (kvh, ch) = (t / nch, t % nch);
            if live(kvh, ch) {
                chunk_values(&layer[kvh].value_rows(), layer[kvh].len(), ch, layout, block);
            }
        };
        let split = &mut s.split[..c.n_kv_heads * nch * bl];
        if parallel {
            split.par_chunks_mut(bl).enumerate().for_each(scores);
        } else {
            split.chunks_mut(bl).enumerate().for_each(scores);
        }
        for (kvh, blocks) in split.chunks_mut(nch * bl).enumerate() {
            if live(kvh, 0) {
                (0..g).for_each(|j| chunk_factors(blocks, layout, layer[kvh].len(), j));
            }
        }
        if parallel {
            split.par_chunks_mut(bl).enumerate().for_each(values);
        } else {
            split.chunks_mut(bl).enumerate().for_each(values);
        }
        let split = &s.split[..c.n_kv_heads * nch * bl];
        let merge = |(kvh, (att, probs)): (usize, (&mut [f32], &mut [f32]))| {
            if !live(kvh, 0) {
                return;
            }
            let (len, blocks) = (layer[kvh].len(), &split[kvh * nch * bl..(kvh + 1) * nch * bl]);
            for j in (0..g).filter(|j| lh.representative_of[kvh * g + j] == kvh * g + j) {
                let (p, a) = (&mut probs[j * slots..j * slots + len], &mut att[j * hd..(j + 1) * hd]);
                merge_chunks(blocks, layout, len, j, p, a);
            }
        };
        let att = &mut s.a.att[..c.q_dim()];
        let probs = &mut s.probs[..c.n_heads * slots];
        if parallel && c.n_kv_heads > 1 {
            att.par_chunks_mut(g * hd).zip(probs.par_chunks_mut(g * slots)).enumerate().for_each(merge);
        } else {
            att.chunks_mut(g * hd).zip(probs.chunks_mut(g * slots)).enumerate().for_each(merge);
        }
    }

    /// CHAI members: their representative's probabilities over their own V.
    fn share_probabilities(&self, step: Step, cache: &SequenceCache, s: &mut Scratch) {
        let Step { li, stride: slots, parallel, .. } = step;
        let c = &self.config;
        let (hd, g) = (c.head_dim, c.group_size());
        let (layer, lh) = (cache.layer(li), cache.layer_heads(li));
        if lh.reps.len() == c.n_heads {
            return;
        }
        let probs = &s.probs;
        let share = |(h, out): (usize, &mut [f32])| {
            let r = lh.representative_of[h];
            if r != h {
                let len = layer[h / g].len();
                weighted_values(&probs[r * slots..r * slots + len], &layer[h / g].value_rows(), out);
            }
        };
        if parallel {
            s.a.att[..c.q_dim()].par_chunks_mut(hd).enumerate().for_each(share);
        } else {
            s.a.att[..c.q_dim()].chunks_mut(hd).enumerate().for_each(share);
        }
    }

    /// Records a decode step's probabilities and candidate sets (before eviction).
    fn trace_decode(&self, li: usize, cache: &SequenceCache, s: &mut Scratch, slots: usize) {
        let c = &self.config;
        let g = c.group_size();
        let (layer, lh) = (cache.layer(li), cache.layer_heads(li));
        let Some(t) = s.trace.as_mut() else { return };
        for h in 0..c.n_heads {
            let r = lh.representative_of[h];
            let positions = layer[r / g].positions();
            t.record_head_attn(c, h, 0, 1, positions, &s.probs[r * slots..r * slots + positions.len()]);
        }
        t.candidates.push(layer.iter().map(|head| head.positions().to_vec()).collect());
    }
}
