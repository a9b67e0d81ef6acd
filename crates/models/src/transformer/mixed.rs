//! [`Model::forward_mixed`]: a prefill chunk and a batch of decode steps in
//! one pass (chunked prefill with piggybacked decodes, as vLLM schedules
//! them). On a CPU a prefill chunk is compute-bound and a decode step
//! bandwidth-bound; in one pass the decode rows ride on the chunk's weight
//! reads instead of paying for their own.

use super::block::Products;
use super::forward::BatchItem;
use super::prefill::Output;
use super::scratch::{BatchScratch, Scratch};
use super::{Logits, Model};
use crate::{Error, Result};
use kvslim_cache::SequenceCache;
use rayon::prelude::*;

impl Model {
    /// Runs `tokens` as one prefill chunk of `cache` (what
    /// [`Model::forward`] does, logits in `s.logits()`) and, in the same
    /// pass, one decode step for each of `items` (what
    /// [`Model::forward_batch`] does, logits in `batch.logits(i)`). Every
    /// matrix product is one GEMM over the chunk's rows and then the
    /// items'; the chunk's attention runs over its own cache exactly as a
    /// prefill chunk's, each item's as a solo decode step's, so every
    /// cache ends as it would after its own call, and the logits match.
    ///
    /// The chunk must not carry a KVzip probe, a CHAI probe or a trace
    /// (those change the rows a chunk runs); every input is checked before
    /// any state changes.
    pub fn forward_mixed(
        &self,
        (tokens, cache, s, want): (&[u32], &mut SequenceCache, &mut Scratch, Logits),
        items: &mut [BatchItem<'_>],
        batch: &mut BatchScratch,
    ) -> Result<()> {
        let c = &self.config;
        let (n, b) = (tokens.len(), items.len());
        if n == 0 {
            return self.forward_batch(items, batch);
        }
        if cache.repeat_probe().is_some() || cache.probe_remaining() > 0 || s.trace.is_some() {
            return Err(Error::Unsupported(
                "a prefill chunk with a KVzip or CHAI probe, or traced, cannot share its pass with decode steps".into(),
            ));
        }
        self.check_input(tokens, cache)?;
        for it in items.iter() {
            self.check_input(&[it.token], it.cache)?;
        }
        let (d, qd) = (c.hidden_size, c.q_dim());
        let chunk_logits = match want {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => n,
        };
        let p0 = cache.next_pos();
        s.ensure(c, n + b, cache.max_capacity(), chunk_logits);
        batch.ensure(c, b, b);
        for (i, it) in items.iter().enumerate() {
            let seq = &mut batch.seqs[i];
            seq.ensure(c, 1, it.cache.max_capacity(), 0);
            seq.trace = None;
        }
        self.embed(tokens, |t| p0 + t, &mut s.a.x[..n * d], &mut s.a.proj);
        for (i, it) in items.iter().enumerate() {
            let row = &mut s.a.x[(n + i) * d..(n + i + 1) * d];
            self.embed(&[it.token], |_| it.cache.next_pos(), row, &mut s.a.proj);
        }
        self.rope_tables(n, |t| p0 + t, &mut s.cos, &mut s.sin);
        let scale = c.attention_scale();
        for li in 0..c.n_layers {
            self.project_qkv(li, &mut s.a, n + b, Products::Gemm);
            self.position_qk(li, &mut s.a.q, &mut s.a.k, n, &s.cos, &s.sin);
            if n == 1 {
                self.decode_attention(li, cache, s, p0, scale)?;
            } else {
                self.prefill_attention(li, cache, s, (p0, n, &[], scale, n), Output::Yes, None)?;
            }
            // the items' rows: RoPE at each one's position, its solo decode attention
            let qkv = [&s.a.q[..], &s.a.k[..], &s.a.v[..]];
            let outs = s.a.att[n * qd..(n + b) * qd].par_chunks_mut(qd);
            items.par_iter_mut().enumerate().zip(batch.seqs[..b].par_iter_mut().zip(outs)).try_for_each(
                |((i, it), (seq, out))| self.attend_steps(li, it.cache, seq, qkv, n + i, 1, scale, out),
            )?;
            self.output_and_mlp(li, &mut s.a, None, n + b, Products::Gemm);
        }
        cache.advance(n);
        items.iter_mut().for_each(|it| it.cache.advance(1));
        // the chunk's wanted rows and the items' rows are contiguous: one
        // output projection for both, then each set of logits to its owner
        let first = n - chunk_logits;
        let rows = chunk_logits + b;
        if rows == 0 {
            return Ok(());
        }
        let mut all = std::mem::take(&mut batch.logits);
        all.resize(rows * c.vocab_size, 0.0);
        self.project_logits(&s.a.x[first * d..(n + b) * d], &mut s.a.xn, rows, &mut all, Products::Gemm);
        let v = c.vocab_size;
        s.logits[..chunk_logits * v].copy_from_slice(&all[..chunk_logits * v]);
        all.drain(..chunk_logits * v);
        batch.logits = all;
        Ok(())
    }
}
