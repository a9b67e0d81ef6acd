//! A prefill chunk's attention in one layer. Per component of aligned KV
//! heads, the cache gathers the candidates (the slots already held plus
//! the chunk's tokens); every chunk token attends causally over them
//! (representatives compute q·k, members reuse their probabilities with
//! their own V); column scores are summed when the policy wants them (a
//! score family that is not a column sum, such as TOVA or a decayed sum,
//! is applied query by query, in order; SnapKV's observation window
//! attends again for its last queries only); the cache commits the
//! policy's choice to every KV head of the component.
//! The store never holds more than the policy's capacity.

use super::probe::{ProbeSegment, PROBE_SINKS};
use super::scratch::Scratch;
use super::Model;
use crate::Result;
use kvslim_cache::policy::chai::Component;
use kvslim_cache::{repeat_attention_into, AttentionScores, PrefillCandidates, ScoreAgg, ScoringKey, SequenceCache};
use kvslim_kernels::attention::{
    attend_causal_tiled, attend_group, pack_keys_tiled, weighted_values, DenseRows, TiledQueries, TiledRep,
    TiledScratch, TiledTarget, Visible,
};
use rayon::prelude::*;

/// Tokens per parallel task; fixed so column sums add up in the same order
/// whatever the thread count.
const TOKEN_BLOCK: usize = 16;

/// One chunk of `n` rows at `p0` in one layer, with its attention scale;
/// the rows after the first `prompt` are a KVzip repeat probe laid out as
/// `probe` says (they attend and score, the cache drops them).
#[derive(Clone, Copy)]
struct Chunk<'a> {
    li: usize,
    p0: usize,
    n: usize,
    prompt: usize,
    probe: &'a [ProbeSegment],
    scale: f32,
}

/// Which cache of a shared prefill computes a layer's attention output
/// (`s.a.att`): the others run only their policy's side, and leave `s.a.att`
/// as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Output {
    /// This cache computes it.
    Yes,
    /// This cache computes it if its own pass runs the tiled kernel with
    /// column sums anyway (the output then adds only the value products to
    /// a pass that is paid already), else only its policy's side.
    Offered,
    /// The output of a KVzip probe's rows only: a tiled cache computed the
    /// prompt's rows (the same there for every cache).
    ProbeRows,
    /// Only the policy's side: another cache computes the output.
    No,
}

/// How the tiled kernel folds a block of queries' attention into the
/// candidates' columns.
#[derive(Clone, Copy)]
enum Fold {
    /// The policy's aggregation, summed over queries (blocks add up).
    Sum(ScoreAgg),
    /// KVzip's maximum over queries and the group (blocks merge by max).
    RepeatMax,
}

impl Model {
    /// Layer `li`'s attention for `n` chunk tokens at `p0..` and the rows
    /// of a KVzip probe's pieces after them (Q, K, V positioned in `s.a`),
    /// output in `s.a.att[..rows · q_dim]`. Without the output (see
    /// [`Output`]) only the policy's side runs (scores and the choice of
    /// what stays, for a cache sharing another's prefill, whose output is
    /// the same): the tiled kernel then skips its value products, or runs
    /// not at all for a policy without scores, and `s.a.att` is not
    /// written. Returns whether this cache computed the output.
    /// `scored` (a shared prefill's, per layer): the scores each component's
    /// attention gave under each scoring key so far; a cache whose key is
    /// there loads them instead of attending.
    pub(super) fn prefill_attention(
        &self,
        li: usize,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        (p0, n, probe, scale, rope_rows): (usize, usize, &[ProbeSegment], f32, usize),
        output: Output,
        mut scored: Option<&mut Vec<(usize, ScoringKey, AttentionScores)>>,
    ) -> Result<bool> {
        let kvd = self.config.kv_dim();
        let repeat: usize = probe.iter().map(|p| p.rows).sum();
        let rows = n + repeat;
        let chunk = Chunk { li, p0, n: rows, prompt: n, probe, scale };
        let components = cache.layer_heads(li).components.clone();
        // an offered output is taken or declined once, for every component
        let mut takes = match output {
            Output::Yes => Some(true),
            Output::Offered => None,
            Output::ProbeRows | Output::No => Some(false),
        };
        let probe_output = matches!(output, Output::Yes | Output::ProbeRows);
        for (ci, comp) in components.iter().enumerate() {
            let (k, v) = (&s.a.k[..rows * kvd], &s.a.v[..rows * kvd]);
            cache.gather_candidates(li, ci, p0, k, v, repeat, &mut s.cand)?;
            let key = s.cand.scoring_key();
            // trace and CHAI's probe need every probability row, and so does
            // a score rule that depends on the order of every query
            let observed = s.trace.is_some() || cache.probe_remaining() > 0 || s.cand.needs_every_query();
            let folds = s.cand.column_sum_aggregation().is_some() && repeat == 0;
            let output = *takes.get_or_insert(!observed && folds);
            // scores attended for another cache load instead, unless this
            // cache still owes an output
            if let (Some(k), false, false, Some(done)) = (key, output, probe_output, scored.as_deref()) {
                if let Some((_, _, sc)) = done.iter().find(|(c, kk, _)| *c == ci && *kk == k) {
                    s.cand.load_attention_scores(sc);
                    cache.commit_candidates(li, ci, &mut s.cand)?;
                    continue;
                }
            }
            if observed {
                self.attend_observed(chunk, comp, cache, s, output);
            } else {
                // a KVzip chunk's prompt rows do not score (its probe does)
                if output || folds {
                    self.attend_tiled(chunk, comp, cache, s, output);
                }
                if let Some(w) = s.cand.observation_queries() {
                    self.observe_window(chunk, comp, s, w);
                }
            }
            if repeat > 0 {
                self.attend_probe(chunk, comp, cache, s, (probe_output, observed));
            }
            if let Some(e) = s.cand.expected_attention() {
                self.expected_scores(li, comp, s, (p0, n, scale, rope_rows), e);
            }
            if let Some(file) = s.cand.kvzap() {
                self.kvzap_scores(li, comp, s, n, file)?;
            }
            if let (Some(k), Some(done)) = (key, scored.as_deref_mut()) {
                done.push((ci, k, s.cand.attention_scores()));
            }
            cache.commit_candidates(li, ci, &mut s.cand)?;
        }
        Ok(takes == Some(true))
    }

    /// KVzap: adds each of the chunk's `n` tokens' predicted score (from
    /// its normalised hidden state, `s.a.xn`, and the predictor's row for
    /// the component's leader) to its candidate; held slots get nothing.
    fn kvzap_scores(
        &self,
        li: usize,
        comp: &Component,
        s: &mut Scratch,
        n: usize,
        file: Option<&'static str>,
    ) -> Result<()> {
        let p = self.kvzap_predictor(file)?;
        let d = self.config.hidden_size;
        let held = s.cand.held();
        let mut add = vec![0f32; held + n];
        let xn = &s.a.xn;
        add[held..]
            .par_iter_mut()
            .enumerate()
            .for_each(|(t, a)| *a = p.score(li, comp.leader, &xn[t * d..(t + 1) * d]));
        s.cand.add_column_sums(&add);
        Ok(())
    }

    /// Token by token with the decode kernel, recording every head's
    /// probabilities into the trace and CHAI's probe, and each query's
    /// attention into the candidates' scores; outputs into `s.a.att` with
    /// `output`, else into a row that is dropped.
    fn attend_observed(
        &self,
        chunk: Chunk,
        comp: &Component,
        cache: &mut SequenceCache,
        s: &mut Scratch,
        output: bool,
    ) {
        let c = &self.config;
        let (hd, g, qd) = (c.head_dim, c.group_size(), c.q_dim());
        let Chunk { li, p0, n, prompt, .. } = chunk;
        let lh = cache.layer_heads(li).clone();
        let old = s.cand.held();
        let rep_index =
            |h: usize| comp.reps.iter().position(|&x| x == lh.representative_of[h]).expect("same component");
        let mut probs = Vec::new();
        let mut dropped = if output { Vec::new() } else { vec![0f32; qd] };
        for t in 0..prompt {
            let visible = old + t + 1;
            let row = if output { &mut s.a.att[t * qd..(t + 1) * qd] } else { &mut dropped[..] };
            self.attend_representatives(chunk, comp, &s.cand, &s.a.q, t, &mut probs, row);
            let cand = &s.cand;
            let positions = &cand.positions()[..visible];
            for h in comp.kv_heads.iter().flat_map(|&kv| kv * g..(kv + 1) * g) {
                let p = &probs[rep_index(h) * visible..(rep_index(h) + 1) * visible];
                if lh.representative_of[h] != h {
                    let values = DenseRows { data: &cand.values(h / g)[..visible * hd], d: hd };
                    weighted_values(p, &values, &mut row[h * hd..(h + 1) * hd]);
                }
                if let Some(tr) = s.trace.as_mut() {
                    tr.record_head_attn(c, h, t, n, positions, p);
                }
                cache.record_probe(li, h, p0 + t, positions, p);
            }
            s.cand.observe_query(visible, &probs, comp.reps.len());
        }
    }

    /// SnapKV's observation window after the tiled kernel: the chunk's last
    /// `w` queries attend again (representatives only, outputs discarded)
    /// and report their probabilities to the candidates' scores.
    fn observe_window(&self, chunk: Chunk, comp: &Component, s: &mut Scratch, w: usize) {
        let (mut probs, mut discarded) = (Vec::new(), vec![0f32; self.config.q_dim()]);
        for t in chunk.n - w..chunk.n {
            self.attend_representatives(chunk, comp, &s.cand, &s.a.q, t, &mut probs, &mut discarded);
            s.cand.observe_query(s.cand.held() + t + 1, &probs, comp.reps.len());
        }
    }

    /// Chunk query `t` of every representative of `comp` over the
    /// candidates it sees (the decode kernel): probabilities into `probs`
    /// (`reps × visible`), outputs into the representatives' heads of `row`.
    #[allow(clippy::too_many_arguments)]
    fn attend_representatives(
        &self,
        chunk: Chunk,
        comp: &Component,
        cand: &PrefillCandidates,
        q: &[f32],
        t: usize,
        probs: &mut Vec<f32>,
        row: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, g, qd) = (c.head_dim, c.group_size(), c.q_dim());
        let visible = cand.held() + t + 1;
        let window = Visible::within((chunk.p0 + t) as u32, c.layer_window(chunk.li));
        probs.resize(comp.reps.len() * visible, 0.0);
        for (i, &r) in comp.reps.iter().enumerate() {
            let kv = r / g;
            attend_group(
                &q[t * qd + r * hd..t * qd + (r + 1) * hd],
                &DenseRows { data: &cand.keys(kv)[..visible * hd], d: hd },
                &DenseRows { data: &cand.values(kv)[..visible * hd], d: hd },
                &cand.positions()[..visible],
                window,
                hd,
                chunk.scale,
                &mut probs[i * visible..(i + 1) * visible],
                visible,
                &mut row[r * hd..(r + 1) * hd],
            );
        }
    }

    /// The tiled kernel over the prompt's rows: each block of TOKEN_BLOCK
    /// queries attends tile by tile over the candidates; representatives'
    /// probabilities feed their members too; the policy's column sums come
    /// from a second pass per block. Without `output` no head is a target:
    /// only the softmax statistics and the column sums are computed.
    fn attend_tiled(&self, chunk: Chunk, comp: &Component, cache: &SequenceCache, s: &mut Scratch, output: bool) {
        let lh = cache.layer_heads(chunk.li);
        let fold = if chunk.probe.is_empty() { s.cand.column_sum_aggregation().map(Fold::Sum) } else { None };
        let mut packed = std::mem::take(&mut s.packed_keys);
        let parts = self.tiled_pass(
            chunk,
            comp,
            &lh.representative_of,
            (&s.cand, &mut packed),
            (&s.a.q, &mut s.a.att),
            &[(0, chunk.prompt, fold)],
            output,
        );
        s.packed_keys = packed;
        for (_, part) in parts {
            part.iter().for_each(|p| s.cand.add_column_sums(p));
        }
    }

    /// KVzip's probe, piece by piece ([`super::probe`]): each piece's rows
    /// attend over a view of the candidates (the first sinks, the piece,
    /// then the piece's own rows), through the tiled kernel or, `observed`,
    /// token by token (recording the trace); outputs in `s.a.att` with
    /// `output`. Each candidate gains the most attention a
    /// scoring row of a piece that sees it paid it (any query head of the
    /// group): its own piece's, and every piece's for a sink.
    fn attend_probe(
        &self,
        chunk: Chunk,
        comp: &Component,
        cache: &SequenceCache,
        s: &mut Scratch,
        (output, observed): (bool, bool),
    ) {
        let c = &self.config;
        let (hd, g, qd) = (c.head_dim, c.group_size(), c.q_dim());
        let lh = cache.layer_heads(chunk.li);
        let old = s.cand.held();
        let mut most = vec![0f32; old + chunk.prompt];
        let mut view = std::mem::take(&mut s.probe_view);
        let mut packed = std::mem::take(&mut s.packed_keys);
        for seg in chunk.probe {
            let first = old + seg.piece.start;
            let sinks = first.min(PROBE_SINKS);
            let own = old + seg.row..old + seg.row + seg.rows;
            let pos0 = chunk.p0 + chunk.prompt;
            s.cand.gather_probe_piece((sinks, first..old + seg.piece.end, own), pos0 as u32, &comp.kv_heads, &mut view);
            let piece = Chunk { p0: pos0, n: seg.rows, prompt: seg.rows, probe: &[], ..chunk };
            let (q, att) = (&s.a.q[seg.row * qd..], &mut s.a.att[seg.row * qd..]);
            let mut columns = vec![0f32; view.held()];
            if observed {
                let mut probs = Vec::new();
                let mut dropped = if output { Vec::new() } else { vec![0f32; qd] };
                for j in 0..seg.rows {
                    let row = if output { &mut att[j * qd..(j + 1) * qd] } else { &mut dropped[..] };
                    self.attend_representatives(piece, comp, &view, q, j, &mut probs, row);
                    let visible = view.held() + j + 1;
                    let positions = &view.positions()[..visible];
                    for h in comp.kv_heads.iter().flat_map(|&kv| kv * g..(kv + 1) * g) {
                        let r = comp.reps.iter().position(|&x| x == lh.representative_of[h]).expect("same component");
                        let p = &probs[r * visible..(r + 1) * visible];
                        if lh.representative_of[h] != h {
                            let values = DenseRows { data: &view.values(h / g)[..visible * hd], d: hd };
                            weighted_values(p, &values, &mut row[h * hd..(h + 1) * hd]);
                        }
                        if let Some(tr) = s.trace.as_mut() {
                            tr.record_head_attn(c, h, seg.row + j, chunk.n, positions, p);
                        }
                    }
                    if j >= seg.lead {
                        let held = view.held();
                        for r in 0..comp.reps.len() {
                            let p = &probs[r * visible..r * visible + held];
                            columns.iter_mut().zip(p).for_each(|(m, &x)| *m = m.max(x));
                        }
                    }
                }
            } else {
                let lead = (0, seg.lead, None);
                let repeat = (seg.lead, seg.rows - seg.lead, Some(Fold::RepeatMax));
                let parts = self.tiled_pass(
                    piece,
                    comp,
                    &lh.representative_of,
                    (&view, &mut packed),
                    (q, att),
                    &[lead, repeat],
                    output,
                );
                for p in parts.iter().flat_map(|(_, p)| p) {
                    columns.iter_mut().zip(p).for_each(|(m, &x)| *m = m.max(x));
                }
            }
            for (i, m) in columns.into_iter().enumerate() {
                let at = if i < sinks { i } else { first + i - sinks };
                most[at] = most[at].max(m);
            }
        }
        s.packed_keys = packed;
        s.probe_view = view;
        s.cand.add_column_sums(&most);
    }

    /// Runs `segments` ((first row, rows, fold) of `q`/`att`, in order)
    /// of a chunk through the tiled kernel over `cand` (keys packed into
    /// `packed`); segments without a fold run only with `output`. Returns
    /// each folding segment's block columns, in block order.
    #[allow(clippy::too_many_arguments)]
    fn tiled_pass(
        &self,
        chunk: Chunk,
        comp: &Component,
        representative_of: &[usize],
        (cand, packed): (&PrefillCandidates, &mut [Vec<f32>]),
        (q, att): (&[f32], &mut [f32]),
        segments: &[(usize, usize, Option<Fold>)],
        output: bool,
    ) -> Vec<(Option<Fold>, Vec<Vec<f32>>)> {
        let c = &self.config;
        let (hd, g) = (c.head_dim, c.group_size());
        for &kv in comp.kv_heads.iter().filter(|&&kv| comp.reps.iter().any(|&r| r / g == kv)) {
            pack_keys_tiled(cand.keys(kv), hd, &mut packed[kv]);
        }
        let targets: Vec<TiledTarget> = comp
            .kv_heads
            .iter()
            .filter(|_| output)
            .flat_map(|&kv| (kv * g..(kv + 1) * g).map(move |h| (kv, h)))
            .map(|(kv, h)| TiledTarget {
                rep: comp.reps.iter().position(|&x| x == representative_of[h]).expect("same component"),
                values: cand.values(kv),
                out_offset: h * hd,
            })
            .collect();
        let mut folded = Vec::new();
        for &(t_first, count, fold) in segments {
            if count == 0 || (!output && fold.is_none()) {
                continue;
            }
            let part = self.tiled_rows(chunk, comp, (cand, packed, &targets), q, att, (t_first, count), fold);
            if fold.is_some() {
                folded.push((fold, part));
            }
        }
        folded
    }

    /// Rows `t_first .. t_first + count` of the chunk through the tiled
    /// kernel, in parallel blocks of TOKEN_BLOCK queries; each block's
    /// column scores under `fold` (none without one), in block order.
    #[allow(clippy::too_many_arguments)]
    fn tiled_rows(
        &self,
        chunk: Chunk,
        comp: &Component,
        (cand, packed, targets): (&PrefillCandidates, &[Vec<f32>], &[TiledTarget]),
        q: &[f32],
        att: &mut [f32],
        (t_first, count): (usize, usize),
        fold: Option<Fold>,
    ) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (hd, g, qd) = (c.head_dim, c.group_size(), c.q_dim());
        let Chunk { li, p0, scale, .. } = chunk;
        let (old, window) = (cand.held(), c.layer_window(li));
        let positions = cand.positions();
        att[t_first * qd..(t_first + count) * qd]
            .par_chunks_mut(TOKEN_BLOCK * qd)
            .enumerate()
            // one kernel scratch per worker, reused across its blocks
            .map_init(TiledScratch::default, |scratch, (b, rows)| {
                let (t0, nq) = (t_first + b * TOKEN_BLOCK, rows.len() / qd);
                let seen = old + t0 + nq;
                let reps: Vec<TiledRep> = comp
                    .reps
                    .iter()
                    .map(|&r| TiledRep { queries: &q[t0 * qd + r * hd..], q_stride: qd, packed_keys: &packed[r / g] })
                    .collect();
                let mut columns = vec![0f32; if fold.is_some() { seen } else { 0 }];
                let accumulate = |p: &[f32], group: usize, sc: &mut [f32]| match fold {
                    Some(Fold::Sum(a)) => a.accumulate(p, group, sc),
                    Some(Fold::RepeatMax) => repeat_attention_into(p, group, sc),
                    None => {}
                };
                attend_causal_tiled(
                    &reps,
                    targets,
                    &positions[..seen],
                    TiledQueries { pos0: (p0 + t0) as u32, n: nq, window },
                    hd,
                    scale,
                    rows,
                    qd,
                    fold.is_some().then_some((&mut columns[..], &accumulate as _)),
                    scratch,
                );
                columns
            })
            .collect()
    }
}
