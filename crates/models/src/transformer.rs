//! The forward pass shared by every architecture: embeddings → blocks
//! (norm, attention over the cache's slots, MLP) → final norm → logits.
//!
//! One call processes a chunk of tokens: n = 1 is a decode step (GEMV), n > 1
//! a prefill (GEMM). All scratch memory lives in [`Scratch`], allocated on
//! the first call and reused, so decode steps do not allocate.

use crate::config::{ModelConfig, NormKind};
use crate::weights::{NormWeights, Weights};
use crate::{Error, Result};
use kvslim_cache::policy::chai::LayerHeads;
use kvslim_cache::{CacheShape, HeadSlots, SequenceCache};
use kvslim_kernels::attention::{
    attend_causal_tiled, attend_group, chunk_factors, chunk_scores, chunk_values, merge_chunks, pack_keys_tiled,
    weighted_values, DenseRows, SplitLayout, TiledQueries, TiledRep, TiledScratch, TiledTarget, Visible, MAX_HEAD_DIM,
    SPLIT_SLOTS,
};
use kvslim_kernels::ops::{layer_norm, rms_norm};
use kvslim_kernels::rope::Rope;
use rayon::prelude::*;

/// Which logits a forward call should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (pure prefill of a prompt prefix).
    None,
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher forcing, parity tests).
    All,
}

/// Optional record of intermediate values for parity tests and diagnostics.
/// Recording allocates; it is never on in the decode hot loop.
#[derive(Default, Debug)]
pub struct Trace {
    /// Per layer, the input hidden states `[n, hidden]`.
    pub hidden: Vec<Vec<f32>>,
    /// Per layer, attention probabilities `[heads, n, ctx]` indexed by
    /// original position (ctx = last position + 1).
    pub attn: Vec<Vec<f32>>,
    /// Width of the `attn` rows.
    pub ctx: usize,
    /// Per layer, the queries `[n, q_dim]`, keys and values `[n, kv_dim]`
    /// after RoPE: the streams a policy reference is driven with.
    pub qkv: Vec<[Vec<f32>; 3]>,
    /// Decode steps only: per layer, per KV head, the original positions of
    /// the candidate set D_t the new token attended over.
    pub candidates: Vec<Vec<Vec<u32>>>,
    /// Per layer, every query head's attention output `[n, q_dim]` (before W_O).
    pub att_out: Vec<Vec<f32>>,
}

/// Reusable buffers for one sequence's forward calls.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    probs: Vec<f32>,
    /// Decode attention's per-chunk partial states (see [`SplitLayout`]):
    /// KV head × chunk blocks.
    split: Vec<f32>,
    logits: Vec<f32>,
    // prefill candidates of one KV head: held slots, then the chunk
    cand_keys: Vec<Vec<f32>>,
    cand_values: Vec<Vec<f32>>,
    /// Candidate keys per KV head packed for the tiled prefill kernel.
    packed_keys: Vec<Vec<f32>>,
    comp_probs: Vec<f32>,
    cand_scores: Vec<f32>,
    cand_positions: Vec<u32>,
    keep: Vec<usize>,
    /// Set to `Some(Trace::default())` to record the next forward call.
    pub trace: Option<Trace>,
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sizes buffers for `n` tokens and `slots` cache slots. Shrinking keeps
    /// the capacity, so steady-state decode never allocates.
    fn ensure(&mut self, c: &ModelConfig, n: usize, slots: usize, logit_rows: usize) {
        let kinds =
            if c.features.sliding_window.as_ref().is_some_and(|w| w.local_rope_theta.is_some()) { 2 } else { 1 };
        let rot = c.rope.map_or(0, |r| r.rotary_dim / 2) * kinds;
        let sizes = [
            (&mut self.x, n * c.hidden_size),
            (&mut self.xn, n * c.hidden_size),
            (&mut self.q, n * c.q_dim()),
            (&mut self.k, n * c.kv_dim()),
            (&mut self.v, n * c.kv_dim()),
            (&mut self.att, n * c.q_dim()),
            (&mut self.proj, n * c.hidden_size),
            (&mut self.gate, n * c.ffn_size),
            (&mut self.up, n * c.ffn_size),
            (&mut self.cos, n * rot),
            (&mut self.sin, n * rot),
            (&mut self.probs, c.n_heads * slots),
            (&mut self.comp_probs, c.n_heads * slots),
            (&mut self.split, c.n_kv_heads * slots.div_ceil(SPLIT_SLOTS).max(1) * split_layout(c).block_len()),
            (&mut self.logits, logit_rows * c.vocab_size),
        ];
        for (buf, len) in sizes {
            buf.resize(len, 0.0);
        }
        self.cand_keys.resize(c.n_kv_heads, Vec::new());
        self.cand_values.resize(c.n_kv_heads, Vec::new());
        self.packed_keys.resize(c.n_kv_heads, Vec::new());
    }

    /// Logits of the last forward call: `[rows, vocab]`.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// The chunk-state layout of split decode attention for this model.
fn split_layout(c: &ModelConfig) -> SplitLayout {
    SplitLayout { g: c.group_size(), d: c.head_dim }
}

/// A loaded model ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    /// RoPE per kind: `[global]`, or `[global, local]` when sliding-window
    /// layers use their own base (Gemma 3).
    ropes: Vec<Rope>,
    /// Per layer, its index into `ropes`.
    layer_rope: Vec<usize>,
    /// Head structure of a layer without head sharing.
    dense_heads: LayerHeads,
}

fn norm(kind: NormKind, w: &NormWeights, eps: f32, x: &[f32], out: &mut [f32]) {
    match kind {
        NormKind::Rms => rms_norm(x, &w.weight, eps, out),
        NormKind::Layer => layer_norm(x, &w.weight, w.bias.as_deref(), eps, out),
    }
}

fn norm_rows(kind: NormKind, w: &NormWeights, eps: f32, x: &[f32], out: &mut [f32], dim: usize) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        norm(kind, w, eps, xr, or);
    }
}

impl Model {
    /// Checks that weights match the config and precomputes RoPE tables.
    pub fn new(config: ModelConfig, weights: Weights) -> Result<Self> {
        config.validate().map_err(|r| Error::Format { path: "<model>".into(), reason: r })?;
        weights.check_against(&config)?;
        let c = &config;
        let max_hd = MAX_HEAD_DIM;
        if c.head_dim > max_hd {
            let reason = format!("head_dim {} exceeds the {max_hd} the attention kernel supports", c.head_dim);
            return Err(Error::Format { path: "<model>".into(), reason });
        }
        let bf16 = weights.token_embedding.dtype() == kvslim_kernels::DType::BF16;
        let make_rope = |r: crate::config::RopeConfig, theta: f32| {
            let rope = Rope::new(theta, r.rotary_dim, r.layout);
            if bf16 {
                rope.with_bf16_frequencies()
            } else {
                rope
            }
        };
        let mut ropes = Vec::new();
        let mut layer_rope = vec![0; c.n_layers];
        if let Some(r) = config.rope {
            ropes.push(make_rope(r, r.theta));
            if let Some(w) = &c.features.sliding_window {
                if let Some(theta) = w.local_rope_theta {
                    ropes.push(make_rope(r, theta));
                    for (l, &local) in w.local_layers.iter().enumerate() {
                        layer_rope[l] = usize::from(local);
                    }
                }
            }
        }
        let dense_heads = LayerHeads::dense(config.n_heads, config.n_kv_heads);
        Ok(Model { config, weights, ropes, layer_rope, dense_heads })
    }

    /// A cache for one sequence of at most `max_len` tokens under `spec`.
    /// Percentage budgets resolve against `base_len` (prompt length for
    /// generation, sequence length for perplexity).
    /// Fails when a CHAI plan does not match this model.
    pub fn new_cache(&self, spec: &kvslim_cache::PolicySpec, max_len: usize, base_len: usize) -> Result<SequenceCache> {
        self.new_cache_in(spec, max_len, base_len, None)
    }

    /// As [`Model::new_cache`], with pages drawn from a shared pool (which
    /// must match the spec's page size and KV dtype).
    pub fn new_cache_in(
        &self,
        spec: &kvslim_cache::PolicySpec,
        max_len: usize,
        base_len: usize,
        pool: Option<&kvslim_cache::PagePool>,
    ) -> Result<SequenceCache> {
        SequenceCache::in_pool(spec, self.cache_shape(), max_len.min(self.config.context_len), base_len, pool)
            .map_err(|reason| Error::Format { path: "<policy>".into(), reason })
    }

    /// The cache dimensions of this model.
    pub fn cache_shape(&self) -> CacheShape {
        let c = &self.config;
        CacheShape {
            layers: c.n_layers,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            sliding_window: c.features.sliding_window.as_ref().map(|w| (w.window, w.local_layers.clone())),
        }
    }

    /// Runs `tokens` at positions `cache.next_pos..`, appending their keys and
    /// values to the cache. Logits land in `scratch.logits()`.
    pub fn forward(&self, tokens: &[u32], cache: &mut SequenceCache, s: &mut Scratch, want: Logits) -> Result<()> {
        let c = &self.config;
        let w = &self.weights;
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        let p0 = cache.next_pos;
        // RoPE models may run past their trained context when the cache is
        // bounded (StreamingLLM-style); learned position tables cannot.
        let past_context_ok = c.learned_positions.is_none() && cache.policy.bounded();
        if p0 + n > c.context_len && !past_context_ok {
            return Err(Error::ContextOverflow { pos: p0 + n - 1, context: c.context_len });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab: c.vocab_size });
        }
        let d = c.hidden_size;
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let logit_rows = match want {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => n,
        };
        let slots = cache.store.max_capacity();
        s.ensure(c, n, slots, logit_rows);
        if let Some(t) = s.trace.as_mut() {
            t.ctx = p0 + n;
            t.hidden.clear();
            t.attn.clear();
            t.qkv.clear();
            t.candidates.clear();
            t.att_out.clear();
        }

        self.embed(tokens, p0, &mut s.x, &mut s.proj);
        self.rope_tables(p0, n, &mut s.cos, &mut s.sin);
        let scale = c.attention_scale();

        for (li, lw) in w.layers.iter().enumerate() {
            if let Some(t) = s.trace.as_mut() {
                t.hidden.push(s.x[..n * d].to_vec());
            }
            norm_rows(c.norm, &lw.attn_norm, c.norm_eps, &s.x, &mut s.xn, d);
            lw.q.forward(&s.xn, n, &mut s.q);
            lw.k.forward(&s.xn, n, &mut s.k);
            lw.v.forward(&s.xn, n, &mut s.v);
            self.position_qk(li, &mut s.q, &mut s.k, n, &s.cos, &s.sin);
            if let Some(t) = s.trace.as_mut() {
                t.qkv.push([s.q[..n * qd].to_vec(), s.k[..n * kvd].to_vec(), s.v[..n * kvd].to_vec()]);
            }
            if n == 1 {
                self.decode_attention(li, cache, s, p0, scale)?;
            } else {
                self.prefill_attention(li, cache, s, p0, n, scale)?;
            }
            if let Some(t) = s.trace.as_mut() {
                t.att_out.push(s.att[..n * qd].to_vec());
            }

            output_and_mlp(
                c,
                lw,
                n,
                BlockBuffers {
                    x: &mut s.x,
                    xn: &mut s.xn,
                    att: &s.att,
                    proj: &mut s.proj,
                    gate: &mut s.gate,
                    up: &mut s.up,
                },
                false,
            );
        }
        cache.advance(n);

        if logit_rows > 0 {
            let first = n - logit_rows;
            norm_rows(c.norm, &w.final_norm, c.norm_eps, &s.x[first * d..n * d], &mut s.xn[..logit_rows * d], d);
            w.output().matmul(&s.xn[..logit_rows * d], logit_rows, &mut s.logits);
        }
        Ok(())
    }
}

impl Model {
    /// Runs `tokens` as consecutive decode steps, with logits for every
    /// token in `scratch.logits()` (`[n, vocab]`). The result — logits and
    /// cache state (slots, positions, scores, evictions) — is bit-identical
    /// to calling [`Model::forward`] with `&[t]` and [`Logits::Last`] once per
    /// token: every matrix product uses the GEMV arithmetic
    /// ([`kvslim_kernels::Matrix::matvec_many`]), and per layer each token
    /// runs RoPE, the decode attention and the policy's scoring/eviction in
    /// order, exactly as a decode step does. Only the weight reads are
    /// shared across the chunk (layer-major order is equivalent because
    /// policy state is per layer and KV head). Speculative decoding
    /// verifies drafts with it.
    ///
    /// While online CHAI is still collecting its probe (clustering happens
    /// between two tokens) or a trace is recorded, it runs token by token.
    pub fn forward_sequential(&self, tokens: &[u32], cache: &mut SequenceCache, s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        let w = &self.weights;
        let n = tokens.len();
        if n == 0 {
            return Ok(());
        }
        let probing = cache.heads.as_ref().is_some_and(|h| h.collecting_probe());
        if n == 1 || probing || s.trace.is_some() {
            let mut all = Vec::with_capacity(n * c.vocab_size);
            for &t in tokens {
                self.forward(&[t], cache, s, Logits::Last)?;
                all.extend_from_slice(&s.logits[..c.vocab_size]);
            }
            s.logits.clear();
            s.logits.extend_from_slice(&all);
            return Ok(());
        }
        let p0 = cache.next_pos;
        let past_context_ok = c.learned_positions.is_none() && cache.policy.bounded();
        if p0 + n > c.context_len && !past_context_ok {
            return Err(Error::ContextOverflow { pos: p0 + n - 1, context: c.context_len });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab: c.vocab_size });
        }
        let d = c.hidden_size;
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let slots = cache.store.max_capacity();
        s.ensure(c, n, slots, n);
        self.embed(tokens, p0, &mut s.x, &mut s.proj);
        let scale = c.attention_scale();
        let (mut qa, mut ka, mut va, mut atta) =
            (vec![0f32; n * qd], vec![0f32; n * kvd], vec![0f32; n * kvd], vec![0f32; n * qd]);
        for (li, lw) in w.layers.iter().enumerate() {
            norm_rows(c.norm, &lw.attn_norm, c.norm_eps, &s.x, &mut s.xn, d);
            lw.q.forward_rows(&s.xn, n, &mut qa);
            lw.k.forward_rows(&s.xn, n, &mut ka);
            lw.v.forward_rows(&s.xn, n, &mut va);
            for t in 0..n {
                let pos = p0 + t;
                s.q[..qd].copy_from_slice(&qa[t * qd..(t + 1) * qd]);
                s.k[..kvd].copy_from_slice(&ka[t * kvd..(t + 1) * kvd]);
                s.v[..kvd].copy_from_slice(&va[t * kvd..(t + 1) * kvd]);
                self.rope_tables(pos, 1, &mut s.cos, &mut s.sin);
                self.position_qk(li, &mut s.q, &mut s.k, 1, &s.cos, &s.sin);
                self.decode_attention(li, cache, s, pos, scale)?;
                atta[t * qd..(t + 1) * qd].copy_from_slice(&s.att[..qd]);
            }
            output_and_mlp(
                c,
                lw,
                n,
                BlockBuffers {
                    x: &mut s.x,
                    xn: &mut s.xn,
                    att: &atta,
                    proj: &mut s.proj,
                    gate: &mut s.gate,
                    up: &mut s.up,
                },
                true,
            );
        }
        cache.advance(n);
        norm_rows(c.norm, &w.final_norm, c.norm_eps, &s.x[..n * d], &mut s.xn[..n * d], d);
        w.output().matvec_many(&s.xn[..n * d], n, &mut s.logits);
        Ok(())
    }
}

impl Model {
    /// Decode step of one layer (SPEC §1 steps 1–5, §2 after the probe):
    /// the new token becomes the candidate slot of every KV head; each
    /// representative head attends over its KV head's candidates; every
    /// other head applies its representative's probabilities to its own V;
    /// the token policy updates scores and evicts once per component of
    /// KV heads that must stay aligned (one per KV head when dense).
    fn decode_attention(
        &self,
        li: usize,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        p0: usize,
        scale: f32,
    ) -> Result<()> {
        /// Attention work (slots × dims × heads) above which heads run in parallel.
        const PARALLEL_MIN_WORK: usize = 1 << 16;
        let c = &self.config;
        let (hd, g) = (c.head_dim, c.group_size());
        let window = c.layer_window(li);
        for kvh in 0..c.n_kv_heads {
            let r = kvh * hd;
            if cache.store.head_mut(li, kvh).push(p0 as u32, &s.k[r..r + hd], &s.v[r..r + hd]).is_none() {
                return Err(cache.store.full_error(li, kvh).into());
            }
        }
        let lh = cache.heads.as_ref().and_then(|h| h.layer(li)).unwrap_or(&self.dense_heads);
        let layer = cache.store.layer(li);
        if let Some(&r) = lh.reps.iter().find(|&&r| !layer[r / g].has_keys()) {
            return Err(missing_keys(li, r / g));
        }
        // KV heads may hold different counts (page eviction removes a page's
        // live tokens, which differ per head); heads tied by CHAI stay equal
        let slots = layer[0].capacity();
        let most = layer.iter().map(HeadSlots::len).max().unwrap_or(0);
        let q = &s.q;
        let parallel = most * hd * c.n_heads >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1;
        // split attention (flash-decoding): tasks of (KV head, chunk of
        // SPLIT_SLOTS slots) read every K/V row once for the whole query
        // group (f16/q8/q4 rows straight from their codes); between the two
        // passes the log-sum-exp rule turns each chunk's local weights into
        // final probabilities. Chunk boundaries are fixed, so the result is
        // the same on any number of threads, and with one chunk it is the
        // one-pass kernel's bit for bit; every core works on one long
        // sequence even with few KV heads (Gemma 3 270M has one).
        let layout = split_layout(c);
        let bl = layout.block_len();
        let nch = most.div_ceil(SPLIT_SLOTS).max(1);
        let visible = Visible::within(p0 as u32, window);
        // a KV head without keys has no representative (checked above)
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
                merge_chunks(
                    blocks,
                    layout,
                    len,
                    j,
                    &mut probs[j * slots..j * slots + len],
                    &mut att[j * hd..(j + 1) * hd],
                );
            }
        };
        let att = &mut s.att[..c.q_dim()];
        let probs = &mut s.probs[..c.n_heads * slots];
        if parallel && c.n_kv_heads > 1 {
            att.par_chunks_mut(g * hd).zip(probs.par_chunks_mut(g * slots)).enumerate().for_each(merge);
        } else {
            att.chunks_mut(g * hd).zip(probs.chunks_mut(g * slots)).enumerate().for_each(merge);
        }
        // members: their representative's probabilities, their own V
        if lh.reps.len() < c.n_heads {
            let probs = &s.probs;
            let share = |(h, out): (usize, &mut [f32])| {
                let r = lh.representative_of[h];
                if r != h {
                    let len = layer[h / g].len();
                    weighted_values(&probs[r * slots..r * slots + len], &layer[h / g].value_rows(), out);
                }
            };
            if parallel {
                s.att[..c.q_dim()].par_chunks_mut(hd).enumerate().for_each(share);
            } else {
                s.att[..c.q_dim()].chunks_mut(hd).enumerate().for_each(share);
            }
        }
        if s.trace.is_some() || cache.heads.as_ref().is_some_and(|h| h.collecting_probe()) {
            self.observe_decode(li, cache, s, p0, slots);
        }
        // token policy, once per aligned component
        let lh = cache.heads.as_ref().and_then(|h| h.layer(li)).unwrap_or(&self.dense_heads);
        for comp in &lh.components {
            let len = cache.store.head(li, comp.leader).len();
            let rows = &mut s.comp_probs[..comp.reps.len() * len];
            for (i, &r) in comp.reps.iter().enumerate() {
                rows[i * len..(i + 1) * len].copy_from_slice(&s.probs[r * slots..r * slots + len]);
            }
            let victims = cache.policy.after_decode_step(li, comp.leader, cache.store.head_mut(li, comp.leader), rows);
            for &kv in comp.kv_heads.iter().filter(|&&kv| kv != comp.leader) {
                let head = cache.store.head_mut(li, kv);
                victims.iter().for_each(|&v| head.evict(v));
            }
        }
        Ok(())
    }

    /// Trace and probe bookkeeping of a decode step (before eviction).
    fn observe_decode(&self, li: usize, cache: &mut SequenceCache, s: &mut Scratch, p0: usize, slots: usize) {
        let c = &self.config;
        let g = c.group_size();
        let dense = &self.dense_heads;
        let lh = cache.heads.as_ref().and_then(|h| h.layer(li)).unwrap_or(dense).clone();
        for h in 0..c.n_heads {
            let r = lh.representative_of[h];
            let positions = cache.store.head(li, r / g).positions();
            let row = &s.probs[r * slots..r * slots + positions.len()];
            if let Some(t) = s.trace.as_mut() {
                record_head_attn(t, c, h, 0, 1, positions, row);
            }
            if let Some(sharing) = cache.heads.as_mut() {
                sharing.record_probe(li, h, p0, positions, row);
            }
        }
        if let Some(t) = s.trace.as_mut() {
            t.candidates.push((0..c.n_kv_heads).map(|kv| cache.store.head(li, kv).positions().to_vec()).collect());
        }
    }

    /// Prefill of one layer: per component of aligned KV heads, the
    /// candidates are the slots already held plus the chunk's tokens; every
    /// chunk token attends causally over them (representatives compute
    /// q·k, members reuse their probabilities with their own V); column
    /// scores are summed when the policy wants them; the policy picks what
    /// stays and every KV head of the component absorbs the same choice.
    /// The store never holds more than the policy's capacity.
    fn prefill_attention(
        &self,
        li: usize,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        p0: usize,
        n: usize,
        scale: f32,
    ) -> Result<()> {
        /// Tokens per parallel task; fixed so column sums add up in the
        /// same order whatever the thread count.
        const TOKEN_BLOCK: usize = 16;
        let c = &self.config;
        let (hd, g, qd, kvd) = (c.head_dim, c.group_size(), c.q_dim(), c.kv_dim());
        let window = c.layer_window(li);
        let agg = cache.policy.score_aggregation();
        let lh = cache.heads.as_ref().and_then(|h| h.layer(li)).unwrap_or(&self.dense_heads).clone();
        let observe =
            s.trace.is_some() || cache.heads.as_ref().is_some_and(|h| h.collecting_probe() && p0 < h.probe_len());
        for comp in &lh.components {
            let leader = cache.store.head(li, comp.leader);
            let old = leader.len();
            let total = old + n;
            s.cand_positions.clear();
            s.cand_positions.extend_from_slice(leader.positions());
            s.cand_positions.extend((0..n).map(|t| (p0 + t) as u32));
            s.cand_scores.clear();
            s.cand_scores.extend_from_slice(leader.scores());
            s.cand_scores.resize(total, 0.0);
            for &kv in &comp.kv_heads {
                let head = cache.store.head(li, kv);
                let (ck, cv) = (&mut s.cand_keys[kv], &mut s.cand_values[kv]);
                ck.clear();
                if head.gather_keys(ck) {
                    for t in 0..n {
                        ck.extend_from_slice(&s.k[t * kvd + kv * hd..t * kvd + (kv + 1) * hd]);
                    }
                }
                cv.clear();
                head.gather_values(cv);
                for t in 0..n {
                    cv.extend_from_slice(&s.v[t * kvd + kv * hd..t * kvd + (kv + 1) * hd]);
                }
            }
            if let Some(&r) = comp.reps.iter().find(|&&r| s.cand_keys[r / g].is_empty()) {
                return Err(missing_keys(li, r / g));
            }
            let (keys, values, positions, q) = (&s.cand_keys, &s.cand_values, &s.cand_positions, &s.q);
            let nreps = comp.reps.len();
            // one token: reps' probabilities land in `probs` (nreps × visible)
            let attend_token = |t: usize, row: &mut [f32], probs: &mut Vec<f32>, columns: &mut [f32]| {
                let visible = old + t + 1;
                probs.resize(nreps * visible, 0.0);
                for (i, &r) in comp.reps.iter().enumerate() {
                    let kv = r / g;
                    attend_group(
                        &q[t * qd + r * hd..t * qd + (r + 1) * hd],
                        &DenseRows { data: &keys[kv][..visible * hd], d: hd },
                        &DenseRows { data: &values[kv][..visible * hd], d: hd },
                        &positions[..visible],
                        Visible::within((p0 + t) as u32, window),
                        hd,
                        scale,
                        &mut probs[i * visible..(i + 1) * visible],
                        visible,
                        &mut row[r * hd..(r + 1) * hd],
                    );
                }
                for &kv in &comp.kv_heads {
                    for h in kv * g..(kv + 1) * g {
                        let r = lh.representative_of[h];
                        if r != h {
                            let i =
                                comp.reps.iter().position(|&x| x == r).expect("members share their rep's component");
                            weighted_values(
                                &probs[i * visible..(i + 1) * visible],
                                &DenseRows { data: &values[kv][..visible * hd], d: hd },
                                &mut row[h * hd..(h + 1) * hd],
                            );
                        }
                    }
                }
                if let Some(a) = agg {
                    a.accumulate(&probs[..nreps * visible], nreps, &mut columns[..visible]);
                }
            };
            let col_len = if agg.is_some() { total } else { 0 };
            if observe {
                let mut probs = Vec::new();
                let mut columns = vec![0f32; col_len];
                for t in 0..n {
                    attend_token(t, &mut s.att[t * qd..(t + 1) * qd], &mut probs, &mut columns);
                    let visible = old + t + 1;
                    for &kv in &comp.kv_heads {
                        for h in kv * g..(kv + 1) * g {
                            let i =
                                comp.reps.iter().position(|&x| x == lh.representative_of[h]).expect("same component");
                            let row = &probs[i * visible..(i + 1) * visible];
                            if let Some(tr) = s.trace.as_mut() {
                                record_head_attn(tr, c, h, t, n, &positions[..visible], row);
                            }
                            if let Some(sharing) = cache.heads.as_mut() {
                                sharing.record_probe(li, h, p0 + t, &positions[..visible], row);
                            }
                        }
                    }
                }
                s.cand_scores.iter_mut().zip(&columns).for_each(|(sc, p)| *sc += p);
            } else {
                // tiled kernel: each block of TOKEN_BLOCK queries attends
                // tile by tile; reps' probabilities feed their members too
                let mut packed = std::mem::take(&mut s.packed_keys);
                for &kv in comp.kv_heads.iter().filter(|&&kv| comp.reps.iter().any(|&r| r / g == kv)) {
                    pack_keys_tiled(&s.cand_keys[kv], hd, &mut packed[kv]);
                }
                let targets: Vec<TiledTarget> = comp
                    .kv_heads
                    .iter()
                    .flat_map(|&kv| (kv * g..(kv + 1) * g).map(move |h| (kv, h)))
                    .map(|(kv, h)| TiledTarget {
                        rep: comp.reps.iter().position(|&x| x == lh.representative_of[h]).expect("same component"),
                        values: &s.cand_values[kv],
                        out_offset: h * hd,
                    })
                    .collect();
                let (positions, q, packed_ref) = (&s.cand_positions, &s.q, &packed);
                let partial_columns: Vec<Vec<f32>> = s.att[..n * qd]
                    .par_chunks_mut(TOKEN_BLOCK * qd)
                    .enumerate()
                    // one kernel scratch per worker, reused across its blocks
                    .map_init(TiledScratch::default, |scratch, (b, rows)| {
                        let (t0, nq) = (b * TOKEN_BLOCK, rows.len() / qd);
                        let seen = old + t0 + nq;
                        let reps: Vec<TiledRep> = comp
                            .reps
                            .iter()
                            .map(|&r| TiledRep {
                                queries: &q[t0 * qd + r * hd..],
                                q_stride: qd,
                                packed_keys: &packed_ref[r / g],
                            })
                            .collect();
                        let mut columns = vec![0f32; if agg.is_some() { seen } else { 0 }];
                        let accumulate = |p: &[f32], group: usize, sc: &mut [f32]| {
                            if let Some(a) = agg {
                                a.accumulate(p, group, sc);
                            }
                        };
                        attend_causal_tiled(
                            &reps,
                            &targets,
                            &positions[..seen],
                            TiledQueries { pos0: (p0 + t0) as u32, n: nq, window },
                            hd,
                            scale,
                            rows,
                            qd,
                            agg.is_some().then_some((&mut columns[..], &accumulate as _)),
                            scratch,
                        );
                        columns
                    })
                    .collect();
                for part in &partial_columns {
                    s.cand_scores.iter_mut().zip(part).for_each(|(sc, p)| *sc += p);
                }
                s.packed_keys = packed;
            }
            cache.policy.select_after_prefill(li, comp.leader, &s.cand_positions, &s.cand_scores, &mut s.keep);
            for &kv in &comp.kv_heads {
                let head = cache.store.head_mut(li, kv);
                let chunk_keys = if s.cand_keys[kv].is_empty() { &[][..] } else { &s.cand_keys[kv][old * hd..] };
                let ok = head.absorb_chunk(
                    &s.keep,
                    &s.cand_scores,
                    chunk_keys,
                    &s.cand_values[kv][old * hd..],
                    &s.cand_positions[old..],
                );
                if !ok {
                    return Err(cache.store.full_error(li, kv).into());
                }
            }
        }
        Ok(())
    }
}

impl Model {
    /// Embeds `tokens` at positions `p0..` into `x` (`[n, hidden]`): token
    /// rows, learned positions where the model has them (`tmp` holds one
    /// row), then the embedding scale (Gemma).
    fn embed(&self, tokens: &[u32], p0: usize, x: &mut [f32], tmp: &mut [f32]) {
        let (c, w) = (&self.config, &self.weights);
        let d = c.hidden_size;
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut x[t * d..(t + 1) * d];
            w.token_embedding.row_into(tok as usize, row);
            if let (Some(pe), Some(off)) = (&w.position_embedding, c.learned_positions) {
                let pos_row = &mut tmp[..d];
                pe.row_into(p0 + t + off, pos_row);
                row.iter_mut().zip(pos_row.iter()).for_each(|(a, b)| *a += b);
            }
            if let Some(scale) = c.features.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    /// RoPE tables of positions `p0..p0 + n` for every RoPE kind: kind
    /// `k`'s row `t` starts at `(k·n + t)·rotary_dim/2`.
    fn rope_tables(&self, p0: usize, n: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (k, rope) in self.ropes.iter().enumerate() {
            let half = rope.rotary_dim / 2;
            for t in 0..n {
                let at = (k * n + t) * half;
                rope.tables((p0 + t) as u32, &mut cos[at..at + half], &mut sin[at..at + half]);
            }
        }
    }

    /// Layer `li`'s per-head QK norm (when the model has one), then RoPE
    /// with the layer's kind of tables, on `n` rows of queries and keys
    /// (tables from [`Model::rope_tables`] for the same `n`).
    fn position_qk(&self, li: usize, q: &mut [f32], k: &mut [f32], n: usize, cos: &[f32], sin: &[f32]) {
        let c = &self.config;
        let lw = &self.weights.layers[li];
        let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            let mut buf = [0f32; MAX_HEAD_DIM];
            for (rows, w) in [(&mut q[..n * qd], qn), (&mut k[..n * kvd], kn)] {
                for h in rows.chunks_exact_mut(hd) {
                    buf[..hd].copy_from_slice(h);
                    rms_norm(&buf[..hd], &w.weight, c.norm_eps, h);
                }
            }
        }
        let kind = self.layer_rope[li];
        let Some(rope) = self.ropes.get(kind) else { return };
        let half = rope.rotary_dim / 2;
        for t in 0..n {
            let at = (kind * n + t) * half;
            let (cs, sn) = (&cos[at..at + half], &sin[at..at + half]);
            for h in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope.apply(h, cs, sn);
            }
            for h in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope.apply(h, cs, sn);
            }
        }
    }
}

/// One sequence's next token in a batched decode step ([`Model::forward_batch`]).
pub struct BatchItem<'a> {
    /// The token to run at `cache.next_pos`.
    pub token: u32,
    /// The sequence's own cache and policy state.
    pub cache: &'a mut SequenceCache,
}

/// Reusable buffers for batched decode steps: the batch's activations
/// (`[n, …]`, one row per sequence) and one attention scratch per sequence.
#[derive(Default)]
pub struct BatchScratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    vocab: usize,
    seqs: Vec<Scratch>,
}

impl BatchScratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Logits of item `i` of the last [`Model::forward_batch`] call.
    pub fn logits(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}

impl Model {
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
        let c = &self.config;
        let w = &self.weights;
        let n = items.len();
        if n == 0 {
            return Ok(());
        }
        for it in items.iter() {
            let past_context_ok = c.learned_positions.is_none() && it.cache.policy.bounded();
            if it.cache.next_pos + 1 > c.context_len && !past_context_ok {
                return Err(Error::ContextOverflow { pos: it.cache.next_pos, context: c.context_len });
            }
            if it.token as usize >= c.vocab_size {
                return Err(Error::TokenOutOfRange { id: it.token, vocab: c.vocab_size });
            }
        }
        let d = c.hidden_size;
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let sizes = [
            (&mut s.x, n * d),
            (&mut s.xn, n * d),
            (&mut s.q, n * qd),
            (&mut s.k, n * kvd),
            (&mut s.v, n * kvd),
            (&mut s.att, n * qd),
            (&mut s.proj, n * d),
            (&mut s.gate, n * c.ffn_size),
            (&mut s.up, n * c.ffn_size),
            (&mut s.logits, n * c.vocab_size),
        ];
        for (buf, len) in sizes {
            buf.resize(len, 0.0);
        }
        s.vocab = c.vocab_size;
        if s.seqs.len() < n {
            s.seqs.resize_with(n, Scratch::new);
        }
        for (i, it) in items.iter().enumerate() {
            let p0 = it.cache.next_pos;
            let seq = &mut s.seqs[i];
            seq.ensure(c, 1, it.cache.store.max_capacity(), 0);
            seq.trace = None;
            self.rope_tables(p0, 1, &mut seq.cos, &mut seq.sin);
            self.embed(&[it.token], p0, &mut s.x[i * d..(i + 1) * d], &mut s.proj);
        }
        let scale = c.attention_scale();
        let parallel = n > 1 && rayon::current_num_threads() > 1;

        for (li, lw) in w.layers.iter().enumerate() {
            norm_rows(c.norm, &lw.attn_norm, c.norm_eps, &s.x, &mut s.xn, d);
            lw.q.forward(&s.xn, n, &mut s.q);
            lw.k.forward(&s.xn, n, &mut s.k);
            lw.v.forward(&s.xn, n, &mut s.v);
            let (q, k, v) = (&s.q, &s.k, &s.v);
            // per sequence: RoPE at its position, then the solo decode attention
            let attend = |((i, it), (seq, out)): ((usize, &mut BatchItem<'_>), (&mut Scratch, &mut [f32]))| {
                seq.q[..qd].copy_from_slice(&q[i * qd..(i + 1) * qd]);
                seq.k[..kvd].copy_from_slice(&k[i * kvd..(i + 1) * kvd]);
                seq.v[..kvd].copy_from_slice(&v[i * kvd..(i + 1) * kvd]);
                let Scratch { q, k, cos, sin, .. } = seq;
                self.position_qk(li, q, k, 1, cos, sin);
                let p0 = it.cache.next_pos;
                self.decode_attention(li, it.cache, seq, p0, scale)?;
                out.copy_from_slice(&seq.att[..qd]);
                Ok::<(), Error>(())
            };
            let seqs = &mut s.seqs[..n];
            if parallel {
                items
                    .par_iter_mut()
                    .enumerate()
                    .zip(seqs.par_iter_mut().zip(s.att.par_chunks_mut(qd)))
                    .try_for_each(attend)?;
            } else {
                items.iter_mut().enumerate().zip(seqs.iter_mut().zip(s.att.chunks_mut(qd))).try_for_each(attend)?;
            }

            output_and_mlp(
                c,
                lw,
                n,
                BlockBuffers {
                    x: &mut s.x,
                    xn: &mut s.xn,
                    att: &s.att,
                    proj: &mut s.proj,
                    gate: &mut s.gate,
                    up: &mut s.up,
                },
                false,
            );
        }
        items.iter_mut().for_each(|it| it.cache.advance(1));
        norm_rows(c.norm, &w.final_norm, c.norm_eps, &s.x, &mut s.xn, d);
        w.output().matmul(&s.xn, n, &mut s.logits);
        Ok(())
    }
}

/// The activations a block's second half works on.
struct BlockBuffers<'a> {
    x: &'a mut [f32],
    xn: &'a mut [f32],
    att: &'a [f32],
    proj: &'a mut [f32],
    gate: &'a mut [f32],
    up: &'a mut [f32],
}

/// The rest of a block after attention, for `n` rows: W_O, the residual(s)
/// and the MLP (sequential or GPT-NeoX's parallel residual).
/// `rows_exact` computes every product with the single-row arithmetic
/// ([`Linear::forward_rows`](crate::weights::Linear::forward_rows)).
fn output_and_mlp(c: &ModelConfig, lw: &crate::weights::LayerWeights, n: usize, b: BlockBuffers, rows_exact: bool) {
    let d = c.hidden_size;
    let lin = |l: &crate::weights::Linear, x: &[f32], out: &mut [f32]| {
        if rows_exact {
            l.forward_rows(x, n, out)
        } else {
            l.forward(x, n, out)
        }
    };
    lin(&lw.o, b.att, b.proj);
    if let Some(pn) = &lw.post_attn_norm {
        post_norm_rows(c, pn, b.proj, b.xn);
    }
    if c.parallel_residual {
        // x + attn(ln1 x) + mlp(ln2 x): the MLP reads the block input
        norm_rows(c.norm, &lw.mlp_norm, c.norm_eps, b.x, b.xn, d);
        b.x.iter_mut().zip(b.proj.iter()).for_each(|(a, p)| *a += p);
    } else {
        b.x.iter_mut().zip(b.proj.iter()).for_each(|(a, p)| *a += p);
        norm_rows(c.norm, &lw.mlp_norm, c.norm_eps, b.x, b.xn, d);
    }
    if let Some(gate) = &lw.gate {
        lin(gate, b.xn, b.gate);
        lin(&lw.up, b.xn, b.up);
        for (gv, uv) in b.gate.iter_mut().zip(b.up.iter()) {
            *gv = c.activation.apply(*gv) * uv;
        }
        lin(&lw.down, b.gate, b.proj);
    } else {
        lin(&lw.up, b.xn, b.up);
        b.up.iter_mut().for_each(|v| *v = c.activation.apply(*v));
        lin(&lw.down, b.up, b.proj);
    }
    if let Some(pn) = &lw.post_mlp_norm {
        post_norm_rows(c, pn, b.proj, b.xn);
    }
    b.x.iter_mut().zip(b.proj.iter()).for_each(|(a, p)| *a += p);
}

/// Normalises `rows` in place (a sandwich norm of a block output; `tmp`
/// is a free buffer of the same size).
fn post_norm_rows(c: &ModelConfig, w: &NormWeights, rows: &mut [f32], tmp: &mut [f32]) {
    let len = rows.len();
    tmp[..len].copy_from_slice(rows);
    norm_rows(c.norm, w, c.norm_eps, &tmp[..len], rows, c.hidden_size);
}

fn missing_keys(layer: usize, kv_head: usize) -> Error {
    Error::Format {
        path: "<cache>".into(),
        reason: format!("layer {layer} KV head {kv_head} has no keys (dropped by a head-sharing policy)"),
    }
}

/// Scatters one head's probabilities into the trace by original position.
fn record_head_attn(
    t: &mut Trace,
    c: &ModelConfig,
    head: usize,
    tok: usize,
    rows: usize,
    positions: &[u32],
    probs: &[f32],
) {
    let ctx = t.ctx;
    if t.attn.len() < t.hidden.len() {
        t.attn.push(vec![0f32; c.n_heads * rows * ctx]);
    }
    let layer = t.attn.last_mut().expect("pushed above");
    let row = &mut layer[(head * rows + tok) * ctx..(head * rows + tok + 1) * ctx];
    for (&p, &w) in positions.iter().zip(probs) {
        row[p as usize] = w;
    }
}
