//! The entry points: [`Model::forward`] (a prefill chunk or one decode
//! step), [`Model::forward_sequential`] (consecutive decode steps sharing
//! weight reads) and [`Model::forward_batch`] (one decode step for several
//! sequences). They share every block step ([`super::block`]) and differ
//! only in how rows map to positions and caches.

use super::block::Products;
use super::prefill::Output;
use super::probe::{row_position, ProbeSegment};
use super::scratch::{BatchScratch, Scratch};
use super::{Logits, Model};
use crate::{Error, Result};
use kvslim_cache::{AttentionScores, ScoringKey, SequenceCache};
use rayon::prelude::*;

/// One sequence's next token in a batched decode step ([`Model::forward_batch`]).
pub struct BatchItem<'a> {
    /// The token to run at `cache.next_pos()`.
    pub token: u32,
    /// The sequence's own cache and policy state.
    pub cache: &'a mut SequenceCache,
}

/// A prefill chunk in progress ([`Model::prefill_begin`]): where it starts,
/// its size (and any KVzip probe's layout) and the next layer to run. The
/// hidden states live in the [`Scratch`] it was started with.
#[derive(Debug)]
pub struct PrefillRun {
    p0: usize,
    n: usize,
    /// KVzip's repeat-probe rows after the chunk's own, and their pieces.
    repeat: usize,
    probe: Vec<ProbeSegment>,
    logit_rows: usize,
    next_layer: usize,
}

impl PrefillRun {
    /// Rows each layer of this chunk runs (prompt plus any probe): the
    /// cost of one layer, for budgeting slices.
    pub fn rows(&self) -> usize {
        self.n + self.repeat
    }

    /// Layers run so far.
    pub fn layers_done(&self) -> usize {
        self.next_layer
    }
}

/// One sequence's tokens in [`Model::forward_steps_batch`].
pub struct StepsItem<'a> {
    /// Tokens to run at `cache.next_pos()..`, each as a decode step.
    pub tokens: &'a [u32],
    /// The sequence's own cache and policy state.
    pub cache: &'a mut SequenceCache,
    /// Which of its rows get logits.
    pub want: Logits,
}

impl Model {
    /// Runs `tokens` at positions `cache.next_pos()..`, appending their
    /// keys and values to the cache. n = 1 is a decode step (GEMV), n > 1 a
    /// prefill chunk (GEMM, tiled attention). Logits land in
    /// `scratch.logits()`.
    pub fn forward(&self, tokens: &[u32], cache: &mut SequenceCache, s: &mut Scratch, want: Logits) -> Result<()> {
        self.forward_shared(tokens, cache, &mut [], s, want)
    }

    /// A prompt's prefill shared by several fresh caches (the kvpress
    /// protocol): fed as one chunk to an empty cache, the prompt's hidden
    /// states, K and V do not depend on the policy
    /// ([`SequenceCache::shared_prefill_kernel`]), so every matrix product
    /// runs once; per layer each of `others` runs only its policy's side of
    /// the attention (scores, SnapKV's window, the choice of what stays),
    /// and one cache computes the output too: the first whose tiled pass
    /// sums columns anyway (it adds only the value products), else `cache`;
    /// caches whose policies score the same way
    /// ([`kvslim_cache::PrefillCandidates::scoring_key`]: H2O at every
    /// budget, its allocators, `score=norm`) attend once for all of them.
    /// Each cache ends bit-identical to
    /// its own [`Model::forward`] of `tokens`, and so do the logits. Fails
    /// unless every cache can share `cache`'s prefill
    /// ([`Model::shares_prefill`]: the same kernel, or tiled caches in a
    /// KVzip cache's run where the rows are independent). With no `others`
    /// this is [`Model::forward`].
    pub fn forward_shared(
        &self,
        tokens: &[u32],
        cache: &mut SequenceCache,
        others: &mut [&mut SequenceCache],
        s: &mut Scratch,
        want: Logits,
    ) -> Result<()> {
        if !others.is_empty() {
            let kernel = cache.shared_prefill_kernel();
            for (i, o) in others.iter().enumerate() {
                let theirs = o.shared_prefill_kernel();
                if !matches!((kernel, theirs), (Some(k), Some(t)) if self.shares_prefill(k, t)) {
                    return Err(Error::Unsupported(format!(
                        "cache {} cannot share this prefill: every cache must be empty, take the prompt as one \
                         chunk, have no head sharing and use the same prefill kernel, or be tiled beside a KVzip \
                         lead on a model whose products are all integer (here {theirs:?} and {kernel:?})",
                        i + 1
                    )));
                }
            }
            if tokens.len() < 2 || s.trace.is_some() {
                return Err(Error::Unsupported("only an untraced prefill of two or more tokens can be shared".into()));
            }
        }
        let mut run = self.begin_chunk(tokens, cache, others, s, want)?;
        // a shared prefill's scores per component and scoring key, per layer
        let mut scored = Vec::new();
        while run.next_layer < self.config.n_layers {
            self.chunk_layer(&mut run, cache, others, s, &mut scored)?;
        }
        self.finish_chunk(&run, cache, others, s);
        Ok(())
    }

    /// Starts `tokens` as a prefill chunk to be run a few layers at a time
    /// with [`Model::prefill_layers`] (a server runs decode steps for other
    /// sequences between the slices). The slices compute exactly what
    /// [`Model::forward`] computes, in the same order, so the cache and the
    /// logits end bit-identical to it. Until the run is done, `cache` and
    /// `s` belong to it: nothing else may feed that cache or use that
    /// scratch.
    pub fn prefill_begin(
        &self,
        tokens: &[u32],
        cache: &mut SequenceCache,
        s: &mut Scratch,
        want: Logits,
    ) -> Result<PrefillRun> {
        self.begin_chunk(tokens, cache, &mut [], s, want)
    }

    /// Runs up to `layers` more layers (at least one) of `run`; `true` when
    /// the chunk is done (its logits in `s.logits()`, the cache advanced).
    pub fn prefill_layers(
        &self,
        run: &mut PrefillRun,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        layers: usize,
    ) -> Result<bool> {
        let n_layers = self.config.n_layers;
        if run.next_layer >= n_layers {
            return Ok(true);
        }
        if cache.next_pos() != run.p0 {
            return Err(Error::Unsupported(format!(
                "this prefill started at position {} but its cache is now at {}: the cache was fed meanwhile",
                run.p0,
                cache.next_pos()
            )));
        }
        let stop = run.next_layer.saturating_add(layers.max(1)).min(n_layers);
        while run.next_layer < stop {
            self.chunk_layer(run, cache, &mut [], s, &mut Vec::new())?;
        }
        if run.next_layer < n_layers {
            return Ok(false);
        }
        self.finish_chunk(run, cache, &mut [], s);
        Ok(true)
    }

    /// Checks the input, sizes the scratch, embeds the rows and builds the
    /// RoPE tables: everything a chunk does before its first layer.
    fn begin_chunk(
        &self,
        tokens: &[u32],
        cache: &mut SequenceCache,
        others: &mut [&mut SequenceCache],
        s: &mut Scratch,
        want: Logits,
    ) -> Result<PrefillRun> {
        let c = &self.config;
        let n = tokens.len();
        let p0 = cache.next_pos();
        if n == 0 {
            return Ok(PrefillRun { p0, n, repeat: 0, probe: Vec::new(), logit_rows: 0, next_layer: c.n_layers });
        }
        self.check_input(tokens, cache)?;
        for o in others.iter() {
            self.check_input(tokens, o)?;
        }
        let logit_rows = match want {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => n,
        };
        // KVzip (`prefill=kvzip`): the chunk's tokens again after it, rows
        // that only score the chunk (every shared KVzip cache has the same
        // kernel, so the same probe; a tiled one ignores the probe's rows)
        let (tokens, probe) = match self.repeat_probe(tokens, cache) {
            Some((all, probe)) => (std::borrow::Cow::Owned(all), probe),
            None => (std::borrow::Cow::Borrowed(tokens), Vec::new()),
        };
        let (rows, repeat) = (tokens.len(), tokens.len() - n);
        let capacity = others.iter().map(|o| o.max_capacity()).fold(cache.max_capacity(), usize::max);
        s.ensure(c, rows, capacity, logit_rows);
        let pos = |t| row_position(p0, n, &probe, t);
        if let Some(t) = s.trace.as_mut() {
            t.begin((0..rows).map(pos).max().map_or(p0, |p| p + 1));
        }
        self.embed(&tokens, pos, &mut s.a.x, &mut s.a.proj);
        self.rope_tables(rows, pos, &mut s.cos, &mut s.sin);
        Ok(PrefillRun { p0, n, repeat, probe, logit_rows, next_layer: 0 })
    }

    /// Layer `run.next_layer` of a chunk: projections, attention (each of
    /// `others` runs only its policy's side of it), output and MLP.
    fn chunk_layer(
        &self,
        run: &mut PrefillRun,
        cache: &mut SequenceCache,
        others: &mut [&mut SequenceCache],
        s: &mut Scratch,
        scored: &mut Vec<(usize, ScoringKey, AttentionScores)>,
    ) -> Result<()> {
        let c = &self.config;
        let (d, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let (li, p0, n, rows) = (run.next_layer, run.p0, run.n, run.n + run.repeat);
        let scale = c.attention_scale();
        if let Some(t) = s.trace.as_mut() {
            t.hidden.push(s.a.x[..rows * d].to_vec());
        }
        self.project_qkv(li, &mut s.a, rows, Products::Gemm);
        if let Some(tap) = s.hidden_tap.as_mut() {
            tap.push(s.a.xn[..n * d].to_vec());
        }
        self.position_qk(li, &mut s.a.q, &mut s.a.k, rows, &s.cos, &s.sin);
        if let Some(t) = s.trace.as_mut() {
            t.qkv.push([s.a.q[..rows * qd].to_vec(), s.a.k[..rows * kvd].to_vec(), s.a.v[..rows * kvd].to_vec()]);
        }
        if n == 1 {
            self.decode_attention(li, cache, s, p0, scale)?;
        } else {
            scored.clear();
            // each cache's rows: a tiled cache in a KVzip lead's run attends
            // over the prompt's rows only
            let chunk = |c: &SequenceCache| {
                let probe = if c.repeat_probe().is_some() { &run.probe[..] } else { &[] };
                (p0, n, probe, scale, rows)
            };
            // the first cache whose policy sums columns in the tiled kernel
            // computes the prompt rows' output in the same pass (it is the
            // same for every cache), the rest load its scores where they
            // score alike; `cache` computes the rest of the output (a KVzip
            // probe's rows) or all of it
            let mut done = false;
            for o in others.iter_mut() {
                let output = if done { Output::No } else { Output::Offered };
                done |= self.prefill_attention(li, o, s, chunk(o), output, Some(&mut *scored))?;
            }
            let output = match (done, run.probe.is_empty()) {
                (false, _) => Output::Yes,
                (true, true) => Output::No,
                (true, false) => Output::ProbeRows,
            };
            self.prefill_attention(li, cache, s, chunk(cache), output, Some(&mut *scored))?;
        }
        if let Some(t) = s.trace.as_mut() {
            t.att_out.push(s.a.att[..rows * qd].to_vec());
        }
        self.output_and_mlp(li, &mut s.a, None, rows, Products::Gemm);
        run.next_layer += 1;
        Ok(())
    }

    /// After the last layer: the caches advance past the chunk and the
    /// wanted rows get logits.
    fn finish_chunk(
        &self,
        run: &PrefillRun,
        cache: &mut SequenceCache,
        others: &mut [&mut SequenceCache],
        s: &mut Scratch,
    ) {
        let (n, d) = (run.n, self.config.hidden_size);
        if n == 0 {
            return;
        }
        cache.advance(n);
        others.iter_mut().for_each(|o| o.advance(n));
        if run.logit_rows > 0 {
            let last = &s.a.x[(n - run.logit_rows) * d..n * d];
            self.project_logits(last, &mut s.a.xn, run.logit_rows, &mut s.logits, Products::Gemm);
        }
    }

    /// Runs `tokens` as consecutive decode steps, with logits for every
    /// token in `scratch.logits()` (`[n, vocab]`). The result — logits and
    /// cache state (slots, positions, scores, evictions) — is bit-identical
    /// to calling [`Model::forward`] with `&[t]` and [`Logits::Last`] once per
    /// token: every matrix product uses the GEMV arithmetic
    /// ([`kvslim_kernels::Matrix::matvec_many`]), and per layer each token
    /// runs RoPE, the decode attention and the policy's scoring/eviction in
    /// order, exactly as a decode step does. Only the weight reads are
    /// shared across the chunk (layer-major order is equivalent because
    /// policy state is per layer and KV head). Speculative decoding's
    /// exact mode verifies drafts with it.
    ///
    /// While online CHAI is still collecting its probe (clustering happens
    /// between two tokens) or a trace is recorded, it runs token by token.
    pub fn forward_sequential(&self, tokens: &[u32], cache: &mut SequenceCache, s: &mut Scratch) -> Result<()> {
        self.forward_steps(tokens, cache, s, Products::PerRow)
    }

    /// As [`Model::forward_sequential`] — per layer each token runs RoPE,
    /// the decode attention and the policy's scoring and eviction in order
    /// — but every matrix product is one GEMM over the chunk, as prefill
    /// does: a weight panel is dequantized once for all tokens. Logits
    /// differ from one decode step per token by rounding only (about 1e-6);
    /// the policy's decisions are the same rules on those numbers.
    /// Speculative decoding verifies drafts with it by default.
    pub fn forward_verify(&self, tokens: &[u32], cache: &mut SequenceCache, s: &mut Scratch) -> Result<()> {
        self.forward_steps(tokens, cache, s, Products::Gemm)
    }

    /// Consecutive decode steps over `tokens` sharing weight reads, with
    /// the matrix products of `products`.
    fn forward_steps(
        &self,
        tokens: &[u32],
        cache: &mut SequenceCache,
        s: &mut Scratch,
        products: Products,
    ) -> Result<()> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        if n == 1 || cache.collecting_probe() || s.trace.is_some() {
            let mut all = Vec::with_capacity(n * c.vocab_size);
            for &t in tokens {
                self.forward(&[t], cache, s, Logits::Last)?;
                all.extend_from_slice(&s.logits[..c.vocab_size]);
            }
            s.logits.clear();
            s.logits.extend_from_slice(&all);
            return Ok(());
        }
        self.check_input(tokens, cache)?;
        let p0 = cache.next_pos();
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        s.ensure(c, n, cache.max_capacity(), n);
        for (buf, len) in [(&mut s.rows.q, n * qd), (&mut s.rows.k, n * kvd), (&mut s.rows.v, n * kvd)] {
            buf.resize(len, 0.0);
        }
        s.rows.att.resize(n * qd, 0.0);
        self.embed(tokens, |t| p0 + t, &mut s.a.x, &mut s.a.proj);
        let scale = c.attention_scale();
        for li in 0..c.n_layers {
            // the chunk's projections move to `rows`; each token then runs
            // alone through the single-token buffers of `a`
            self.project_qkv(li, &mut s.a, n, products);
            std::mem::swap(&mut s.a.q, &mut s.rows.q);
            std::mem::swap(&mut s.a.k, &mut s.rows.k);
            std::mem::swap(&mut s.a.v, &mut s.rows.v);
            for t in 0..n {
                let pos = p0 + t;
                s.a.q[..qd].copy_from_slice(&s.rows.q[t * qd..(t + 1) * qd]);
                s.a.k[..kvd].copy_from_slice(&s.rows.k[t * kvd..(t + 1) * kvd]);
                s.a.v[..kvd].copy_from_slice(&s.rows.v[t * kvd..(t + 1) * kvd]);
                self.rope_tables(1, |_| pos, &mut s.cos, &mut s.sin);
                self.position_qk(li, &mut s.a.q, &mut s.a.k, 1, &s.cos, &s.sin);
                self.decode_attention(li, cache, s, pos, scale)?;
                s.rows.att[t * qd..(t + 1) * qd].copy_from_slice(&s.a.att[..qd]);
            }
            self.output_and_mlp(li, &mut s.a, Some(&s.rows.att), n, products);
        }
        cache.advance(n);
        self.project_logits(&s.a.x[..n * c.hidden_size], &mut s.a.xn, n, &mut s.logits, products);
        Ok(())
    }

    /// One decode step for several independent sequences at once. Every
    /// weight matrix is read once for the whole batch (a GEMM with one row
    /// per sequence); RoPE, attention and the cache policy run per sequence
    /// at its own position, through the same per-sequence code as a solo
    /// decode step ([`Model::forward`] with one token), so each sequence's
    /// slots, scores and evictions are its own. Logits of item `i` land in
    /// `scratch.logits(i)`.
    ///
    /// Every item is checked (position, token id) before any state changes.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>], s: &mut BatchScratch) -> Result<()> {
        self.batch_step(items, s, Products::Gemm)
    }

    /// [`Model::forward_batch`] with every product in the single-row
    /// arithmetic ([`Linear::forward_rows`](crate::weights::Linear::forward_rows)):
    /// each weight row is still read once for the whole batch, and every
    /// item's logits, slots and scores are bit-identical to its own solo
    /// decode step on any machine (the GEMM sums in another order unless
    /// the products are integer). For runs that must equal solo
    /// generation, such as an evaluation's cells decoded in lockstep.
    pub fn forward_batch_exact(&self, items: &mut [BatchItem<'_>], s: &mut BatchScratch) -> Result<()> {
        self.batch_step(items, s, Products::PerRow)
    }

    fn batch_step(&self, items: &mut [BatchItem<'_>], s: &mut BatchScratch, products: Products) -> Result<()> {
        let c = &self.config;
        let n = items.len();
        if n == 0 {
            return Ok(());
        }
        for it in items.iter() {
            self.check_input(&[it.token], it.cache)?;
        }
        let (d, qd) = (c.hidden_size, c.q_dim());
        s.ensure(c, n, n);
        for (i, it) in items.iter().enumerate() {
            let seq = &mut s.seqs[i];
            seq.ensure(c, 1, it.cache.max_capacity(), 0);
            seq.trace = None;
            self.embed(&[it.token], |_| it.cache.next_pos(), &mut s.a.x[i * d..(i + 1) * d], &mut s.a.proj);
        }
        let scale = c.attention_scale();
        let parallel = n > 1 && rayon::current_num_threads() > 1;
        for li in 0..c.n_layers {
            self.project_qkv(li, &mut s.a, n, products);
            let qkv = [&s.a.q[..], &s.a.k[..], &s.a.v[..]];
            // per sequence: RoPE at its position, then the solo decode attention
            let attend = |((i, it), (seq, out)): ((usize, &mut BatchItem<'_>), (&mut Scratch, &mut [f32]))| {
                self.attend_steps(li, it.cache, seq, qkv, i, 1, scale, out)
            };
            let seqs = &mut s.seqs[..n];
            if parallel {
                items
                    .par_iter_mut()
                    .enumerate()
                    .zip(seqs.par_iter_mut().zip(s.a.att.par_chunks_mut(qd)))
                    .try_for_each(attend)?;
            } else {
                items.iter_mut().enumerate().zip(seqs.iter_mut().zip(s.a.att.chunks_mut(qd))).try_for_each(attend)?;
            }
            self.output_and_mlp(li, &mut s.a, None, n, products);
        }
        items.iter_mut().for_each(|it| it.cache.advance(1));
        self.project_logits(&s.a.x, &mut s.a.xn, n, &mut s.logits, products);
        Ok(())
    }

    /// Consecutive decode steps for several sequences at once: what
    /// [`Model::forward_verify`] does for one sequence, with every matrix
    /// product one GEMM over all the sequences' tokens. Per sequence, each
    /// token runs RoPE, the decode attention and the policy's scoring and
    /// eviction in order, exactly as a decode step does, so the policy acts
    /// at every token; logits differ from solo decode steps by rounding
    /// only. Logits of the rows each item wants, in item order, land in
    /// `scratch.logits(r)`.
    ///
    /// Multiple-choice scoring runs contexts and forked continuations with
    /// it. A sequence still collecting an online CHAI probe (clustering must
    /// happen between two tokens) is refused: feed its probe first.
    pub fn forward_steps_batch(&self, items: &mut [StepsItem<'_>], s: &mut BatchScratch) -> Result<()> {
        let c = &self.config;
        let (d, qd) = (c.hidden_size, c.q_dim());
        let mut offsets = Vec::with_capacity(items.len() + 1);
        offsets.push(0);
        for it in items.iter() {
            if it.cache.collecting_probe() {
                return Err(Error::Unsupported(
                    "a sequence collecting its CHAI probe cannot run in a batch of decode steps; feed the probe first"
                        .into(),
                ));
            }
            self.check_input(it.tokens, it.cache)?;
            offsets.push(offsets.last().unwrap() + it.tokens.len());
        }
        let rows = *offsets.last().unwrap();
        if rows == 0 {
            return Ok(());
        }
        let logit_rows: usize = items
            .iter()
            .map(|it| match it.want {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => it.tokens.len(),
            })
            .sum();
        s.ensure(c, rows, logit_rows);
        for (i, it) in items.iter().enumerate() {
            let seq = &mut s.seqs[i];
            seq.ensure(c, 1, it.cache.max_capacity(), 0);
            seq.trace = None;
            let r = offsets[i]..offsets[i + 1];
            let p0 = it.cache.next_pos();
            self.embed(it.tokens, |t| p0 + t, &mut s.a.x[r.start * d..r.end * d], &mut s.a.proj);
        }
        let scale = c.attention_scale();
        for li in 0..c.n_layers {
            self.project_qkv(li, &mut s.a, rows, Products::Gemm);
            let qkv = [&s.a.q[..], &s.a.k[..], &s.a.v[..]];
            let mut outs = Vec::with_capacity(items.len());
            let mut rest = &mut s.a.att[..rows * qd];
            for it in items.iter() {
                let (mine, tail) = rest.split_at_mut(it.tokens.len() * qd);
                outs.push(mine);
                rest = tail;
            }
            // per sequence, its tokens in order: RoPE, the decode attention, the policy
            let attend = |((i, it), (seq, out)): ((usize, &mut StepsItem<'_>), (&mut Scratch, &mut &mut [f32]))| {
                self.attend_steps(li, it.cache, seq, qkv, offsets[i], it.tokens.len(), scale, out)
            };
            let seqs = &mut s.seqs[..items.len()];
            if items.len() > 1 && rayon::current_num_threads() > 1 {
                items
                    .par_iter_mut()
                    .enumerate()
                    .zip(seqs.par_iter_mut().zip(outs.par_iter_mut()))
                    .try_for_each(attend)?;
            } else {
                items.iter_mut().enumerate().zip(seqs.iter_mut().zip(outs.iter_mut())).try_for_each(attend)?;
            }
            self.output_and_mlp(li, &mut s.a, None, rows, Products::Gemm);
        }
        // the rows that get logits, gathered
        s.picked.clear();
        for (i, it) in items.iter_mut().enumerate() {
            let n = it.tokens.len();
            it.cache.advance(n);
            let keep = match it.want {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => n,
            };
            s.picked.extend_from_slice(&s.a.x[(offsets[i + 1] - keep) * d..offsets[i + 1] * d]);
        }
        if logit_rows > 0 {
            self.project_logits(&s.picked, &mut s.a.xn, logit_rows, &mut s.logits, Products::Gemm);
        }
        Ok(())
    }

    /// One sequence's `n` tokens of a batched call in layer `li`, each as a
    /// decode step in order: its projections are rows `row0..row0 + n` of
    /// `qkv`; RoPE at its position, the decode attention and the policy, as
    /// a solo step; attention outputs into `out` (`n` rows of `q_dim`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_steps(
        &self,
        li: usize,
        cache: &mut SequenceCache,
        seq: &mut Scratch,
        qkv: [&[f32]; 3],
        row0: usize,
        n: usize,
        scale: f32,
        out: &mut [f32],
    ) -> Result<()> {
        let (qd, kvd) = (self.config.q_dim(), self.config.kv_dim());
        let [q, k, v] = qkv;
        let p0 = cache.next_pos();
        for t in 0..n {
            let row = row0 + t;
            seq.a.q[..qd].copy_from_slice(&q[row * qd..(row + 1) * qd]);
            seq.a.k[..kvd].copy_from_slice(&k[row * kvd..(row + 1) * kvd]);
            seq.a.v[..kvd].copy_from_slice(&v[row * kvd..(row + 1) * kvd]);
            self.rope_tables(1, |_| p0 + t, &mut seq.cos, &mut seq.sin);
            self.position_qk(li, &mut seq.a.q, &mut seq.a.k, 1, &seq.cos, &seq.sin);
            self.decode_attention(li, cache, seq, p0 + t, scale)?;
            out[t * qd..(t + 1) * qd].copy_from_slice(&seq.a.att[..qd]);
        }
        Ok(())
    }
}
