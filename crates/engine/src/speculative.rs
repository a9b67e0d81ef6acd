//! Greedy speculative decoding: a [`Drafter`] proposes up to `k` tokens,
//! the target verifies them in one chunk, and the longest agreeing prefix
//! plus the target's own next token is committed. `k` is fixed or adapts
//! to the acceptance so far ([`DraftLength`]).
//!
//! # Verification: batched where exact, else token by token
//!
//! [`Verification::Fast`] runs [`Model::forward_verify`]: per layer each
//! token's RoPE, attention, score update and eviction in order, exactly the
//! rules of a decode step, but every matrix product is one GEMM over the
//! chunk, as prefill does, so the weights are read once per pass. With
//! integer products of quantized weights (`kvslim_kernels::int8`) a product
//! over several tokens equals single-token products bit for bit, and the
//! pass is a decode step's arithmetic; with f32 products its logits differ
//! from one decode step per token by rounding (about 1e-6), so the greedy
//! output can in principle differ from plain greedy decoding at a near tie.
//!
//! [`Verification::Exact`] runs [`Model::forward_sequential`], which
//! reproduces one decode step per token bit for bit (and reads the weights
//! once per token). [`Verification::Auto`], the default, is `Fast` where
//! every matrix has integer products and `Exact` elsewhere: with greedy
//! sampling the output equals plain greedy [`generate`](crate::generate())
//! under the same policy whatever the drafter proposes, and the committed
//! cache state (kept slots, positions, scores, `next_pos`) is bit-identical
//! to plain decoding's.
//!
//! # Rollback
//!
//! Rejected drafts must leave no trace (no score increments, no evicted
//! victims). While nothing was or can be evicted during the pass and the
//! policy keeps no attention scores (`full`, or `window`/`sink` before
//! their budget fills) the cache is rewound by cutting it back to the
//! committed tokens ([`SequenceCache::truncate`]), which costs nothing. A
//! scoring policy (H2O and its kin) takes the journal even before its
//! budget fills: the rejected drafts' attention was added to the kept
//! slots' scores, and cutting would keep it.
//! Otherwise the cache starts an undo journal before verification
//! ([`SequenceCache::checkpoint`]: each head's positions and scores, the
//! policy's state, then only the rows an eviction overwrites and, before
//! each token, the live slots' positions and scores — no copy of the K/V
//! slots). Unless every draft is accepted, the cache returns to the state
//! just after the last accepted token ([`SequenceCache::rollback_to`]):
//! each token's step in a pass depends only on the tokens before it, so
//! that state is exactly plain decoding's and nothing is recomputed. Where
//! the policy's state moves with the steps (`random`'s RNG, a trace) or an
//! allocator split a layer during the pass, the cache rolls back to the
//! pass's start and replays exactly the accepted tokens (the pending token
//! plus the accepted drafts), one more forward pass. Either way scoring
//! and eviction happen only for committed tokens. Where a journal does not
//! apply (paged stores, whose copies share pages anyway; CHAI head
//! sharing) the cache is copied instead and the accepted tokens replayed.

use crate::generate::start_session;
use crate::generate::{GenerateOptions, Generation, StopReason};
use crate::sampling::Sampler;
use crate::session::Session;
use crate::{EngineError, Result, Setting};
use kvslim_cache::{PolicySpec, SequenceCache};
use kvslim_kernels::Products;
use kvslim_models::{Logits, Model};
use std::time::Instant;

/// How a verification pass is undone when drafts are rejected.
enum Rollback {
    /// Cut the cache back (nothing was or can be evicted).
    Cut,
    /// The cache's undo journal ([`SequenceCache::checkpoint`]).
    Journal,
    /// A copy taken before the pass (paged stores, CHAI).
    Snapshot(Box<SequenceCache>),
}

/// Proposes draft continuations of a token sequence.
pub trait Drafter {
    /// Up to `k` tokens expected to follow `context` (prompt and every
    /// committed token, the last one not yet run by the target).
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>>;
}

/// Prompt-lookup draft: finds the latest earlier occurrence of the last
/// n-gram (n = `max_ngram`..=1) of the context and proposes what followed it.
pub struct NgramDrafter {
    pub max_ngram: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { max_ngram: 3 }
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        let len = context.len();
        for n in (1..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
                let from = i + n;
                return Ok(context[from..(from + k).min(len)].to_vec());
            }
        }
        Ok(Vec::new())
    }
}

/// Draft model (any model with the target's tokenizer, e.g. a model
/// drafting for itself): greedy decoding in its own session under its own
/// policy; its cache is snapshotted before drafting and restored after, so
/// it only ever holds committed tokens.
pub struct ModelDrafter<'m> {
    model: &'m Model,
    policy: PolicySpec,
    max_len: usize,
    session: Option<Session<'m>>,
    fed: Vec<u32>,
}

impl<'m> ModelDrafter<'m> {
    /// `max_len`: the longest context it will see (prompt + max tokens).
    pub fn new(model: &'m Model, policy: PolicySpec, max_len: usize) -> Self {
        ModelDrafter { model, policy, max_len, session: None, fed: Vec::new() }
    }
}

impl Drafter for ModelDrafter<'_> {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        if self.session.is_none() || !context.starts_with(&self.fed) || context.len() == self.fed.len() {
            self.session = Some(Session::new(self.model, &self.policy, self.max_len, context.len())?);
            self.fed.clear();
        }
        let s = self.session.as_mut().expect("created above");
        let ctx_len = self.model.config.context_len;
        let k = k.min((self.max_len.min(ctx_len)).saturating_sub(context.len()));
        let mut next = crate::sampling::argmax(s.feed(&context[self.fed.len()..], Logits::Last)?);
        self.fed = context.to_vec();
        if k == 0 {
            return Ok(Vec::new());
        }
        let snapshot = s.cache.clone();
        let mut out = vec![next];
        while out.len() < k {
            next = crate::sampling::argmax(s.feed(&[next], Logits::Last)?);
            out.push(next);
        }
        s.cache = snapshot;
        Ok(out)
    }
}

/// How the target verifies a chunk of drafts (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verification {
    /// One GEMM per matrix over the chunk ([`Model::forward_verify`]).
    Fast,
    /// One decode step's arithmetic per token ([`Model::forward_sequential`]):
    /// output and cache bit-identical to plain greedy decoding.
    Exact,
    /// `Fast` where it is the same arithmetic as a decode step — every
    /// matrix with integer products ([`Products::Int8`]: a product over
    /// several tokens equals single-token products bit for bit), so the
    /// weights are read once per pass and the output is still plain greedy
    /// decoding's — else `Exact`.
    #[default]
    Auto,
}

impl Verification {
    /// What `Auto` means for `model`; the others are themselves.
    pub fn resolve(self, model: &Model) -> Verification {
        match self {
            Verification::Auto if model.weights.matrices().iter().all(|m| m.products() == Products::Int8) => {
                Verification::Fast
            }
            Verification::Auto => Verification::Exact,
            v => v,
        }
    }

    fn run(self, model: &Model, chunk: &[u32], session: &mut Session<'_>) -> kvslim_models::Result<()> {
        match self {
            Verification::Fast => model.forward_verify(chunk, &mut session.cache, &mut session.scratch),
            Verification::Exact | Verification::Auto => {
                model.forward_sequential(chunk, &mut session.cache, &mut session.scratch)
            }
        }
    }
}

/// How many tokens to draft for each target pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftLength {
    /// Always up to this many.
    Fixed(usize),
    /// Adapted to the acceptance so far, between 1 and `max`: after a pass
    /// that accepts every draft the next draft is one longer, after a
    /// partial acceptance it is one longer than what was accepted, after a
    /// pass that accepts nothing it halves; from 1, a rejection backs off
    /// to [`BACK_OFF_STEPS`] plain decode steps before drafting again, so a
    /// text that does not copy its context costs little more than plain
    /// decoding.
    Adaptive { max: usize },
}

impl From<usize> for DraftLength {
    fn from(k: usize) -> Self {
        DraftLength::Fixed(k)
    }
}

impl Default for DraftLength {
    fn default() -> Self {
        DraftLength::Adaptive { max: 8 }
    }
}

/// Plain decode steps after a single draft is rejected (adaptive drafting).
pub const BACK_OFF_STEPS: usize = 8;

/// The draft length of the next pass, and the rules that change it.
struct DraftControl {
    rule: DraftLength,
    k: usize,
    /// Plain steps left before drafting again.
    pause: usize,
}

impl DraftControl {
    fn new(rule: DraftLength) -> Self {
        let k = match rule {
            DraftLength::Fixed(k) => k,
            DraftLength::Adaptive { max } => (max / 2).max(1),
        };
        DraftControl { rule, k, pause: 0 }
    }

    /// Tokens to draft now (0: a plain decode step).
    fn next(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.k
    }

    fn update(&mut self, drafted: usize, accepted: usize) {
        let DraftLength::Adaptive { max } = self.rule else { return };
        if drafted == 0 {
            return;
        }
        self.k = if accepted == drafted {
            (self.k + 1).min(max)
        } else if accepted > 0 {
            (accepted + 1).min(max)
        } else if self.k == 1 {
            self.pause = BACK_OFF_STEPS;
            1
        } else {
            self.k / 2
        };
    }
}

/// Acceptance counters of a speculative run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Target forward passes after the prompt (verifications and plain steps).
    pub target_passes: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Extra forward passes that replayed accepted tokens after a rollback
    /// to a pass's start (policies that cannot return to a single token;
    /// see the module docs). Not in `target_passes`.
    pub replays: usize,
}

impl SpecStats {
    /// Tokens committed per target pass (1 = no speed-up from drafting).
    pub fn tokens_per_pass(&self) -> f64 {
        if self.target_passes == 0 {
            0.0
        } else {
            (self.accepted + self.target_passes) as f64 / self.target_passes as f64
        }
    }
}

/// A speculative run with its final target cache (for state checks).
pub struct SpecOutcome {
    pub generation: Generation,
    pub stats: SpecStats,
    pub cache: SequenceCache,
}

/// Greedy speculative generation with drafts of `k` tokens (fixed or
/// adapted): the same tokens as greedy [`generate`](crate::generate())
/// (see the module docs), with the statistics and the target's cache.
pub fn speculative_run(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    draft: &mut dyn Drafter,
    k: impl Into<DraftLength>,
    verification: Verification,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<SpecOutcome> {
    let mut control = DraftControl::new(k.into());
    let verification = verification.resolve(model);
    opts.sampling.validate().map_err(EngineError::Request)?;
    if opts.sampling.temperature != 0.0 {
        return Err(EngineError::setting(Setting::Temperature, "speculative decoding is greedy only: drop ", ""));
    }
    let (mut session, max_new) = start_session(model, prompt, &opts.policy, opts.max_tokens)?;
    let mut sampler = Sampler::new(opts.sampling.clone());
    let mut stats = SpecStats::default();
    let start = Instant::now();
    let mut next = sampler.sample(session.feed(prompt, Logits::Last)?);
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut out: Vec<u32> = Vec::with_capacity(max_new);
    let mut context: Vec<u32> = prompt.to_vec();
    let mut stop = StopReason::MaxTokens;
    let vocab = model.config.vocab_size;
    'outer: while out.len() < max_new {
        if opts.eos.contains(&next) {
            stop = StopReason::Eos;
            break;
        }
        out.push(next);
        context.push(next);
        if !on_token(next) {
            stop = StopReason::Cancelled;
            break;
        }
        if out.len() == max_new {
            break;
        }
        // drafts never run past the last token that will be output
        let room = (max_new - out.len() - 1).min(control.next());
        let mut drafts = if room > 0 { draft.draft(&context, room)? } else { Vec::new() };
        drafts.truncate(room);
        drafts.retain(|&t| (t as usize) < vocab);
        stats.target_passes += 1;
        stats.drafted += drafts.len();
        if drafts.is_empty() {
            next = sampler.sample(session.feed(&[next], Logits::Last)?);
            continue;
        }
        let mut chunk = Vec::with_capacity(drafts.len() + 1);
        chunk.push(next);
        chunk.extend_from_slice(&drafts);
        let start_pos = session.cache.next_pos();
        let rollback = if session.cache.rewindable_after(chunk.len()) {
            Rollback::Cut
        } else if session.cache.checkpoint() {
            Rollback::Journal
        } else {
            Rollback::Snapshot(Box::new(session.cache.clone()))
        };
        verification.run(model, &chunk, &mut session)?;
        let logits = session.scratch.logits();
        let mut accepted = 0;
        let mut target = sampler.sample(&logits[..vocab]);
        while accepted < drafts.len() && drafts[accepted] == target {
            accepted += 1;
            target = sampler.sample(&logits[accepted * vocab..(accepted + 1) * vocab]);
        }
        stats.accepted += accepted;
        control.update(drafts.len(), accepted);
        if accepted < drafts.len() {
            let keep = &chunk[..accepted + 1];
            match rollback {
                // nothing was or could be evicted: the first tokens' state
                // is theirs alone
                Rollback::Cut => session.cache.truncate(start_pos + keep.len()).map_err(kvslim_models::Error::from)?,
                // back to the last accepted token when the policy allows,
                // else to the pass's start, replaying the accepted tokens
                Rollback::Journal => {
                    if !session.cache.rollback_to(keep.len()) {
                        session.cache.rollback();
                        verification.run(model, keep, &mut session)?;
                        stats.replays += 1;
                    }
                }
                Rollback::Snapshot(snapshot) => {
                    session.cache = *snapshot;
                    verification.run(model, keep, &mut session)?;
                    stats.replays += 1;
                }
            }
        } else if let Rollback::Journal = rollback {
            session.cache.commit();
        }
        for &d in &drafts[..accepted] {
            if opts.eos.contains(&d) {
                stop = StopReason::Eos;
                break 'outer;
            }
            out.push(d);
            context.push(d);
            if !on_token(d) {
                stop = StopReason::Cancelled;
                break 'outer;
            }
        }
        next = target;
    }
    let kv_bytes = session.kv_bytes();
    Ok(SpecOutcome {
        generation: Generation {
            token_ids: out,
            prompt_tokens: prompt.len(),
            stop,
            time_to_first_token_s: ttft,
            decode_s: decode_start.elapsed().as_secs_f64(),
            kv_bytes,
        },
        stats,
        cache: session.cache,
    })
}
