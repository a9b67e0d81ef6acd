//! Beam search over a KV cache with a compression policy.
//!
//! The prompt is prefilled once; every beam then owns its copy of the
//! prompt's [`SequenceCache`] (positions, scores, the policy's state —
//! recent window, RNG streams — and the request's CHAI clusters), so each
//! beam's decode steps update only its own scores and evictions.
//!
//! K and V are paged by default ([`BEAM_PAGE_SIZE`]): a fork is a clone
//! that shares every page of its parent read-only, so `n` beams hold the
//! prompt's KV once, not `n` times; a beam's first write into a shared page
//! (the partial tail page of the prompt) copies that one page, and pages
//! diverge only as the beams do. Slot order, and therefore every result, is
//! bit-identical to the fixed-slot store. A spec that names its own `page=`
//! keeps it; [`BeamStorage::as_specified`] runs the spec's layout exactly
//! (fixed slots, every fork a deep copy).
//!
//! Reordering: when a step's survivors are chosen, each new beam takes its
//! parent's *whole* cache — KV and policy metadata move together. (Moving
//! only the K/V while a beam slot keeps its previous occupant's scores is
//! the classic bug; `tests/beam.rs` checks that it is detectable.)
//!
//! Scoring follows Hugging Face: a hypothesis' cumulative log-probability
//! (EOS included when it ended with EOS) divided by `len^length_penalty`,
//! `len` being its generated tokens without EOS (at least 1).
//!
//! Early stopping (`early_stopping = true`) uses an exact bound, so it never
//! changes the result: search stops once `beams` hypotheses are finished and
//! the best live beam cannot beat the worst of them. Log-probabilities only
//! decrease, so a live beam with cumulative log-prob `lp ≤ 0` after `L`
//! tokens can at best score `lp / max_new^α` when `α > 0` (growing longer
//! shrinks the penalty) and `lp / max(L,1)^α` when `α ≤ 0`.

use crate::generate::start_session;
use crate::session::Session;
use crate::{EngineError, Result};
use kvslim_cache::{PagePool, PolicySpec, SequenceCache};
use kvslim_models::{Logits, Model, Scratch};

/// What to search for and how.
#[derive(Clone, Debug)]
pub struct BeamOptions {
    /// Number of beams (≥ 1); also the number of hypotheses returned at most.
    pub beams: usize,
    pub max_tokens: usize,
    /// α in `score = logprob / len^α` (1.0 in Hugging Face's default).
    pub length_penalty: f32,
    /// Stop once `beams` hypotheses are finished and no live beam can beat
    /// them (exact; see the module docs). Without it the search runs until
    /// every beam has ended or reached `max_tokens`.
    pub early_stopping: bool,
    pub policy: PolicySpec,
    /// Token ids that end a hypothesis (not included in its tokens).
    pub eos: Vec<u32>,
    /// Return each hypothesis' cache (tests, diagnostics); costs a clone.
    pub keep_caches: bool,
}

/// One finished hypothesis.
pub struct Hypothesis {
    /// Generated ids (prompt and EOS excluded).
    pub token_ids: Vec<u32>,
    /// Cumulative log-probability (of EOS too when it ended with EOS).
    pub logprob: f64,
    /// `logprob / len^length_penalty`.
    pub score: f64,
    /// True when it ended with EOS (false: it reached `max_tokens`).
    pub eos: bool,
    /// With `keep_caches`: the beam's cache that scored its last choice. It
    /// holds the prompt and the first `fed` tokens of `token_ids` (all of
    /// them when it ended with EOS, all but the last otherwise).
    pub cache: Option<SequenceCache>,
    pub fed: usize,
}

impl std::fmt::Debug for Hypothesis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hypothesis")
            .field("token_ids", &self.token_ids)
            .field("logprob", &self.logprob)
            .field("score", &self.score)
            .field("eos", &self.eos)
            .field("fed", &self.fed)
            .finish()
    }
}

/// How a new beam gets its cache: from its parent's cache and the cache the
/// same beam slot held before the step. The correct rule is `parent.clone()`;
/// the hook exists so tests can plug in broken reorderings.
pub type ForkFn<'a> = dyn FnMut(&SequenceCache, &SequenceCache) -> SequenceCache + 'a;

/// `log_softmax(logits)` in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = logits.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&v| v as f64 - lse).collect()
}

struct Beam {
    tokens: Vec<u32>,
    logprob: f64,
    cache: SequenceCache,
    /// Log-probabilities of the next token.
    next: Vec<f64>,
}

/// Tokens per KV page when the spec does not choose a layout: beams share
/// the prompt's pages until they write into them. 16 keeps the one page a
/// beam copies on its first write (the prompt's partial tail page, per
/// layer and KV head) small, and the page table short; results do not
/// depend on it (paged slot order is the fixed store's).
pub const BEAM_PAGE_SIZE: usize = 16;

/// The spec beam search runs: `spec` itself when it is paged, otherwise
/// `spec` with `page=`[`BEAM_PAGE_SIZE`] (same results, shared prompt KV).
pub fn beam_policy(spec: &PolicySpec) -> PolicySpec {
    let mut s = spec.clone();
    s.storage.page_size.get_or_insert(BEAM_PAGE_SIZE);
    s
}

/// Where beam caches keep K and V (see [`beam_search_in`]).
#[derive(Clone, Copy, Default)]
pub struct BeamStorage<'p> {
    /// Use the spec's layout as given, fixed slots included (no default
    /// paging; every fork then copies the whole cache).
    pub as_specified: bool,
    /// Draw pages from this pool (it must match the effective spec's page
    /// size, KV dtype and the model's head width), e.g. to measure sharing.
    pub pool: Option<&'p PagePool>,
}

/// Beam search from `prompt`; returns up to `beams` hypotheses, best score
/// first (ties: higher log-prob, then smaller token ids). Beams share the
/// prompt's KV pages (see the module docs).
pub fn beam_search(model: &Model, prompt: &[u32], opts: &BeamOptions) -> Result<Vec<Hypothesis>> {
    beam_search_in(model, prompt, opts, BeamStorage::default(), None)
}

/// [`beam_search`] with a custom reordering rule (see [`ForkFn`]).
pub fn beam_search_with(
    model: &Model,
    prompt: &[u32],
    opts: &BeamOptions,
    fork: Option<&mut ForkFn<'_>>,
) -> Result<Vec<Hypothesis>> {
    beam_search_in(model, prompt, opts, BeamStorage::default(), fork)
}

/// [`beam_search_with`] with an explicit KV layout and page pool.
pub fn beam_search_in(
    model: &Model,
    prompt: &[u32],
    opts: &BeamOptions,
    storage: BeamStorage<'_>,
    mut fork: Option<&mut ForkFn<'_>>,
) -> Result<Vec<Hypothesis>> {
    if opts.beams == 0 {
        return Err(EngineError::Request("beams must be at least 1".into()));
    }
    let policy = if storage.as_specified { opts.policy.clone() } else { beam_policy(&opts.policy) };
    let (mut session, max_new) = start_session(model, prompt, &policy, opts.max_tokens)?;
    if let Some(pool) = storage.pool {
        session = Session::in_pool(model, &policy, prompt.len() + opts.max_tokens, prompt.len(), Some(pool))?;
    }
    let alpha = opts.length_penalty as f64;
    let score_of = |lp: f64, len: usize| lp / (len.max(1) as f64).powf(alpha);
    let first = log_softmax(session.feed(prompt, Logits::Last)?);
    let mut scratch = Scratch::new();
    let mut live = vec![Beam { tokens: Vec::new(), logprob: 0.0, cache: session.cache, next: first }];
    let mut finished: Vec<Hypothesis> = Vec::new();
    let beams = opts.beams;
    let keep = opts.keep_caches;
    // keeps the best `beams` finished hypotheses
    let add = |finished: &mut Vec<Hypothesis>, h: Hypothesis| {
        finished.push(h);
        finished.sort_by(|a, b| {
            b.score.total_cmp(&a.score).then(b.logprob.total_cmp(&a.logprob)).then(a.token_ids.cmp(&b.token_ids))
        });
        finished.truncate(beams);
    };
    for step in 1..=max_new {
        if live.is_empty() {
            break;
        }
        // candidates: each beam's best 2·beams continuations, merged
        let per_beam = (2 * beams).min(live[0].next.len());
        let mut cand: Vec<(f64, usize, u32)> = Vec::with_capacity(live.len() * per_beam);
        for (b, beam) in live.iter().enumerate() {
            let mut row: Vec<(f64, u32)> = beam.next.iter().enumerate().map(|(t, &l)| (l, t as u32)).collect();
            let cmp = |x: &(f64, u32), y: &(f64, u32)| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1));
            if per_beam < row.len() {
                row.select_nth_unstable_by(per_beam - 1, cmp);
                row.truncate(per_beam);
            }
            cand.extend(row.into_iter().map(|(l, t)| (beam.logprob + l, b, t)));
        }
        cand.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let last = step == max_new;
        let mut chosen: Vec<(f64, usize, u32)> = Vec::with_capacity(beams);
        for &(lp, b, t) in &cand {
            if chosen.len() == beams {
                break;
            }
            let parent = &live[b];
            if opts.eos.contains(&t) {
                let h = Hypothesis {
                    token_ids: parent.tokens.clone(),
                    logprob: lp,
                    score: score_of(lp, parent.tokens.len()),
                    eos: true,
                    cache: keep.then(|| parent.cache.clone()),
                    fed: parent.tokens.len(),
                };
                add(&mut finished, h);
            } else if last {
                let mut token_ids = parent.tokens.clone();
                token_ids.push(t);
                let h = Hypothesis {
                    score: score_of(lp, token_ids.len()),
                    token_ids,
                    logprob: lp,
                    eos: false,
                    cache: keep.then(|| parent.cache.clone()),
                    fed: parent.tokens.len(),
                };
                add(&mut finished, h);
                chosen.push((lp, b, t));
            } else {
                chosen.push((lp, b, t));
            }
        }
        if last {
            break;
        }
        // reorder: each survivor takes its parent's whole cache
        let mut uses = vec![0usize; live.len()];
        chosen.iter().for_each(|c| uses[c.1] += 1);
        let mut next_live = Vec::with_capacity(chosen.len());
        let mut new_caches: Vec<Option<SequenceCache>> = Vec::with_capacity(chosen.len());
        if let Some(f) = fork.as_deref_mut() {
            for (i, &(_, b, _)) in chosen.iter().enumerate() {
                let previous = &live[if i < live.len() { i } else { b }].cache;
                new_caches.push(Some(f(&live[b].cache, previous)));
            }
        }
        let mut old: Vec<Option<Beam>> = live.into_iter().map(Some).collect();
        for (i, &(lp, b, t)) in chosen.iter().enumerate() {
            uses[b] -= 1;
            let (mut tokens, cache) = if let Some(c) = new_caches.get_mut(i).and_then(Option::take) {
                (old[b].as_ref().expect("parent").tokens.clone(), c)
            } else if uses[b] == 0 {
                let p = old[b].take().expect("parent");
                (p.tokens, p.cache)
            } else {
                let p = old[b].as_ref().expect("parent");
                (p.tokens.clone(), p.cache.clone())
            };
            tokens.push(t);
            let mut cache = cache;
            model.forward(&[t], &mut cache, &mut scratch, Logits::Last)?;
            let next = log_softmax(scratch.logits());
            next_live.push(Beam { tokens, logprob: lp, cache, next });
        }
        live = next_live;
        if opts.early_stopping && finished.len() == beams {
            if let Some(best) = live.first() {
                let len = if alpha > 0.0 { max_new } else { best.tokens.len() };
                let bound = score_of(best.logprob, len);
                if bound <= finished[beams - 1].score {
                    break;
                }
            }
        }
    }
    Ok(finished)
}
