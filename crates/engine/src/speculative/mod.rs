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

mod model_draft;
mod ngram;
mod rollback;

pub use model_draft::{CopyThenModel, ModelDrafter};
pub use ngram::NgramDrafter;
use rollback::Rollback;

use crate::generate::{start_session, GenerateOptions};
use crate::generation::{take_token, Generation, StopReason};
use crate::sampling::argmax;
use crate::session::Session;
use crate::{EngineError, Result, Setting};
use kvslim_cache::SequenceCache;
use kvslim_models::{Logits, Model};
use std::time::Instant;

/// Proposes draft continuations of a token sequence.
pub trait Drafter {
    /// Up to `k` tokens expected to follow `context` (prompt and every
    /// committed token, the last one not yet run by the target).
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>>;
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
    /// matrix with integer products ([`kvslim_kernels::Products::Int8`]: a product over
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
            Verification::Auto if model.integer_products() => Verification::Fast,
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
    /// pass that accepts nothing it halves. A text that does not copy its
    /// context costs little more than plain decoding because the drafter
    /// proposes nothing there ([`NgramDrafter`] needs a suffix match of two
    /// tokens or an aligned copy).
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

/// The draft length of the next pass, and the rules that change it.
struct DraftControl {
    rule: DraftLength,
    k: usize,
}

impl DraftControl {
    fn new(rule: DraftLength) -> Self {
        let k = match rule {
            DraftLength::Fixed(k) => k,
            DraftLength::Adaptive { max } => (max / 2).max(1),
        };
        DraftControl { rule, k }
    }

    /// Tokens to draft now.
    fn next(&self) -> usize {
        self.k
    }

    /// This pass's drafts after `context`, never more than the `left`
    /// tokens still to be output after the target's next one.
    fn drafts(&self, draft: &mut dyn Drafter, context: &[u32], left: usize) -> Result<Vec<u32>> {
        let room = left.min(self.next());
        let mut drafts = if room > 0 { draft.draft(context, room)? } else { Vec::new() };
        drafts.truncate(room);
        Ok(drafts)
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
        } else {
            (self.k / 2).max(1)
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

/// Greedy speculative decoding one target pass at a time, for a loop that
/// owns its session and its output (the [`speculative_run`] loop, the
/// server's scheduler): each [`step`](Self::step) drafts after the
/// context, verifies the drafts in one pass, rolls rejected ones back (see
/// the module docs) and returns the tokens it committed — the accepted
/// drafts, then the target's own next token. The tokens equal greedy
/// decoding's whatever the drafter proposes.
pub struct Speculator {
    control: DraftControl,
    verification: Verification,
    committed: Vec<u32>,
    chunk: Vec<u32>,
    /// Acceptance counters so far.
    pub stats: SpecStats,
}

impl Speculator {
    /// Drafts of `k` tokens (fixed or adapted), verified as `verification`
    /// resolves for `model`.
    pub fn new(model: &Model, k: impl Into<DraftLength>, verification: Verification) -> Self {
        Speculator {
            control: DraftControl::new(k.into()),
            verification: verification.resolve(model),
            committed: Vec::new(),
            chunk: Vec::new(),
            stats: SpecStats::default(),
        }
    }

    /// One target pass. `context` is the prompt and every committed token,
    /// its last one the target's latest choice, not yet run; at most `left`
    /// tokens are committed (`left` ≥ 1: the drafts are at most `left − 1`).
    /// Returns the committed tokens: the accepted drafts, then the target's
    /// next token (which the caller treats like a sampled one: it may be an
    /// end of sequence, and it is run by the next pass).
    pub fn step(
        &mut self,
        model: &Model,
        session: &mut Session<'_>,
        draft: &mut dyn Drafter,
        context: &[u32],
        left: usize,
    ) -> Result<&[u32]> {
        let vocab = model.config.vocab_size;
        let &next =
            context.last().ok_or_else(|| EngineError::Request("speculative step on an empty context".into()))?;
        let mut drafts = self.control.drafts(draft, context, left.saturating_sub(1))?;
        drafts.retain(|&t| (t as usize) < vocab);
        self.stats.target_passes += 1;
        self.stats.drafted += drafts.len();
        self.committed.clear();
        if drafts.is_empty() {
            self.committed.push(argmax(session.feed(&[next], Logits::Last)?));
            return Ok(&self.committed);
        }
        self.chunk.clear();
        self.chunk.push(next);
        self.chunk.extend_from_slice(&drafts);
        let rollback = Rollback::before(&mut session.cache, self.chunk.len());
        self.verification.run(model, &self.chunk, session)?;
        let logits = session.scratch.logits();
        let mut accepted = 0;
        let mut target = argmax(&logits[..vocab]);
        while accepted < drafts.len() && drafts[accepted] == target {
            accepted += 1;
            target = argmax(&logits[accepted * vocab..(accepted + 1) * vocab]);
        }
        self.stats.accepted += accepted;
        self.control.update(drafts.len(), accepted);
        // back to the last accepted token (the pending one plus the accepted
        // drafts), replaying them where the cache went back to the start
        let keep = accepted + 1;
        if rollback.keep(&mut session.cache, keep, self.chunk.len()).map_err(kvslim_models::Error::from)? {
            self.verification.run(model, &self.chunk[..keep], session)?;
            self.stats.replays += 1;
        }
        self.committed.extend_from_slice(&drafts[..accepted]);
        self.committed.push(target);
        Ok(&self.committed)
    }
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
    let mut spec = Speculator::new(model, k, verification);
    opts.sampling.validate().map_err(EngineError::Request)?;
    if opts.sampling.temperature != 0.0 {
        return Err(EngineError::setting(Setting::Temperature, "speculative decoding is greedy only: drop ", ""));
    }
    let (mut session, max_new) = start_session(model, prompt, &opts.policy, opts.max_tokens)?;
    let start = Instant::now();
    let mut next = argmax(session.feed(prompt, Logits::Last)?);
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut out: Vec<u32> = Vec::with_capacity(max_new);
    let mut context: Vec<u32> = prompt.to_vec();
    let mut stop = StopReason::MaxTokens;
    'outer: while out.len() < max_new {
        // `next` is the target's; the committed drafts before it were output
        if let Some(reason) = take_token(next, &opts.eos, &mut out, &mut on_token) {
            stop = reason;
            break;
        }
        context.push(next);
        if out.len() == max_new {
            break;
        }
        let committed = spec.step(model, &mut session, draft, &context, max_new - out.len())?;
        let (&target, drafts) = committed.split_last().expect("a step commits the target's token");
        for &d in drafts {
            if let Some(reason) = take_token(d, &opts.eos, &mut out, &mut on_token) {
                stop = reason;
                break 'outer;
            }
            context.push(d);
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
        stats: spec.stats,
        cache: session.cache,
    })
}

/// What `draft` would accept on a known greedy answer, without a model:
/// the acceptance loop of [`speculative_run`] with the target's tokens read
/// from `answer` (greedy decoding's output does not depend on the
/// drafter, so this equals a real run's statistics). `on_pass` sees each
/// pass: the answer tokens committed before it, the drafts, how many were
/// accepted. Drafter work and tuning run in milliseconds instead of minutes
/// of model time (`examples/replay_drafts.rs`).
pub fn replay_drafts(
    draft: &mut dyn Drafter,
    prompt: &[u32],
    answer: &[u32],
    k: impl Into<DraftLength>,
    mut on_pass: impl FnMut(usize, &[u32], usize),
) -> Result<SpecStats> {
    let mut control = DraftControl::new(k.into());
    let mut stats = SpecStats::default();
    let n = answer.len();
    let mut context: Vec<u32> = prompt.to_vec();
    let mut done = 0;
    while done < n {
        // the target's token of the previous pass (or of the prefill)
        context.push(answer[done]);
        done += 1;
        if done == n {
            break;
        }
        let drafts = control.drafts(draft, &context, n - done - 1)?;
        stats.target_passes += 1;
        stats.drafted += drafts.len();
        let accepted = drafts.iter().zip(&answer[done..]).take_while(|(d, t)| d == t).count();
        on_pass(done, &drafts, accepted);
        stats.accepted += accepted;
        control.update(drafts.len(), accepted);
        context.extend_from_slice(&answer[done..done + accepted]);
        done += accepted;
    }
    Ok(stats)
}
