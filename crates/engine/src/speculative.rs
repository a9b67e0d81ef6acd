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
use crate::sampling::argmax;
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

/// Prompt-lookup drafts for answers that copy their context with edits
/// (code changes, rewrites): a copy cursor into the context that survives
/// the edits, plus suffix matching to find where to copy from.
///
/// * **Where to copy from.** The longest suffix of the context (up to
///   [`max_match`](Self::max_match) tokens) that also occurs earlier, the
///   latest occurrence on ties; at least [`min_match`](Self::min_match)
///   tokens, so a lone common token does not start a copy.
/// * **A cursor that follows the copy.** After each committed token the
///   cursor moves on if the token is the source's next one. An inserted
///   token (a type hint, a new argument) leaves it where it is; a token
///   found up to [`lookahead`](Self::lookahead) source tokens ahead resyncs
///   it past the skipped ones (a deletion or a replacement). While aligned,
///   drafts continue from the cursor unless a longer suffix matches
///   elsewhere.
/// * **Learned replacements.** When a resync skipped source tokens after
///   inserting others (`tmp` → `running_total`), the pair is remembered and
///   later drafts apply it wherever the source shows those tokens again, so
///   a rename costs one miss, not one per occurrence.
///
/// The state follows one growing context: a context shorter than the last
/// one seen starts afresh.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Shortest suffix match that starts a copy from elsewhere.
    pub min_match: usize,
    /// Longest suffix compared when ranking occurrences.
    pub max_match: usize,
    /// Source tokens a resync may skip.
    pub lookahead: usize,
    /// Context index of the next source token to copy.
    cursor: Option<usize>,
    /// The last committed token was the source's (or ended a replacement).
    aligned: bool,
    /// Tokens committed since the cursor last matched (an insertion so far).
    pending: Vec<u32>,
    /// Learned replacements: source tokens → the tokens written instead.
    replacements: Vec<(Vec<u32>, Vec<u32>)>,
    /// Context tokens already observed.
    seen: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            min_match: 2,
            max_match: 16,
            lookahead: 8,
            cursor: None,
            aligned: false,
            pending: Vec::new(),
            replacements: Vec::new(),
            seen: 0,
        }
    }
}

/// Replacements remembered at most (the oldest is dropped first).
const MAX_REPLACEMENTS: usize = 64;
/// Tokens written away from the source after which the cursor is dropped
/// (an insertion that long is new text, and would make a poor replacement).
const MAX_INSERTION: usize = 32;

impl NgramDrafter {
    /// Moves the cursor over the tokens committed since the last call.
    fn observe(&mut self, context: &[u32]) {
        if context.len() < self.seen {
            *self = NgramDrafter {
                min_match: self.min_match,
                max_match: self.max_match,
                lookahead: self.lookahead,
                ..Default::default()
            };
        }
        for j in self.seen..context.len() {
            let Some(cur) = self.cursor else { break };
            let token = context[j];
            if self.pending.is_empty() && cur < j && context[cur] == token {
                self.cursor = Some(cur + 1);
                self.aligned = true;
                continue;
            }
            self.pending.push(token);
            self.aligned = false;
            if self.pending.len() > MAX_INSERTION {
                // new text, not an edit: copies start again from suffix matches
                self.cursor = None;
                self.pending.clear();
                continue;
            }
            // a known replacement written out in full
            let replaced = self
                .replacements
                .iter()
                .find(|(from, to)| {
                    *to == self.pending && cur + from.len() <= j && context[cur..cur + from.len()] == from[..]
                })
                .map(|(from, _)| from.len());
            if let Some(skip) = replaced {
                self.resync(cur + skip);
                continue;
            }
            // the source again, `skip` tokens on: what was written since the
            // cursor stopped replaced those tokens
            if let Some(skip) = (0..=self.lookahead).find(|&o| cur + o < j && context[cur + o] == token) {
                let inserted = &self.pending[..self.pending.len() - 1];
                if skip > 0 && !inserted.is_empty() {
                    let from = context[cur..cur + skip].to_vec();
                    let to = inserted.to_vec();
                    self.replacements.retain(|(f, _)| *f != from);
                    if self.replacements.len() == MAX_REPLACEMENTS {
                        self.replacements.remove(0);
                    }
                    self.replacements.push((from, to));
                }
                self.resync(cur + skip + 1);
            }
        }
        self.seen = context.len();
    }

    fn resync(&mut self, cursor: usize) {
        self.cursor = Some(cursor);
        self.pending.clear();
        self.aligned = true;
    }

    /// Length of the common suffix of `context[..=i]` and `context`.
    fn match_len(&self, context: &[u32], i: usize) -> usize {
        let last = context.len() - 1;
        (0..self.max_match.min(i + 1)).take_while(|&m| context[i - m] == context[last - m]).count()
    }

    /// Up to `k` tokens copied from `source` on, with learned replacements.
    fn copy_from(&self, context: &[u32], source: usize, k: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(k);
        let mut i = source;
        while out.len() < k && i < context.len() {
            let rest = &context[i..];
            let hit =
                self.replacements.iter().filter(|(from, _)| rest.starts_with(from)).max_by_key(|(from, _)| from.len());
            match hit {
                Some((from, to)) => {
                    out.extend_from_slice(to);
                    i += from.len();
                }
                None => {
                    out.push(context[i]);
                    i += 1;
                }
            }
        }
        out.truncate(k);
        out
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        self.observe(context);
        let Some(&last) = context.last() else { return Ok(Vec::new()) };
        let len = context.len();
        // the earlier `last` with the longest common suffix (latest on ties)
        let (mut best, mut best_len) = (None, 0);
        for i in (0..len - 1).rev() {
            if context[i] == last {
                let m = self.match_len(context, i);
                if m > best_len {
                    (best, best_len) = (Some(i), m);
                }
            }
        }
        if let Some(cur) = self.cursor.filter(|&c| self.aligned && c < len) {
            let at_cursor = if cur >= 1 && cur < len { self.match_len(context, cur - 1) } else { 0 };
            if at_cursor >= best_len || best_len < self.min_match {
                return Ok(self.copy_from(context, cur, k));
            }
        }
        match best {
            Some(i) if best_len >= self.min_match => {
                self.resync(i + 1);
                Ok(self.copy_from(context, i + 1, k))
            }
            _ => Ok(Vec::new()),
        }
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
        let mut next = argmax(s.feed(&context[self.fed.len()..], Logits::Last)?);
        self.fed = context.to_vec();
        if k == 0 {
            return Ok(Vec::new());
        }
        let snapshot = s.cache.clone();
        let mut out = vec![next];
        while out.len() < k {
            next = argmax(s.feed(&[next], Logits::Last)?);
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
        let start_pos = session.cache.next_pos();
        let rollback = if session.cache.rewindable_after(self.chunk.len()) {
            Rollback::Cut
        } else if session.cache.checkpoint() {
            Rollback::Journal
        } else {
            Rollback::Snapshot(Box::new(session.cache.clone()))
        };
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
        if accepted < drafts.len() {
            let keep = &self.chunk[..accepted + 1];
            match rollback {
                // nothing was or could be evicted: the first tokens' state
                // is theirs alone
                Rollback::Cut => session.cache.truncate(start_pos + keep.len()).map_err(kvslim_models::Error::from)?,
                // back to the last accepted token when the policy allows,
                // else to the pass's start, replaying the accepted tokens
                Rollback::Journal => {
                    if !session.cache.rollback_to(keep.len()) {
                        session.cache.rollback();
                        self.verification.run(model, keep, session)?;
                        self.stats.replays += 1;
                    }
                }
                Rollback::Snapshot(snapshot) => {
                    session.cache = *snapshot;
                    self.verification.run(model, keep, session)?;
                    self.stats.replays += 1;
                }
            }
        } else if let Rollback::Journal = rollback {
            session.cache.commit();
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
        let committed = spec.step(model, &mut session, draft, &context, max_new - out.len())?;
        let (&target, drafts) = committed.split_last().expect("a step commits the target's token");
        for &d in drafts {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Drafts `k` tokens after each prefix of `answer` appended to `source`,
    /// as a run would call the drafter (one growing context).
    fn drafts_along(source: &[u32], answer: &[u32], k: usize) -> Vec<Vec<u32>> {
        let mut d = NgramDrafter::default();
        let mut context = source.to_vec();
        let mut out = Vec::new();
        for &t in answer {
            context.push(t);
            out.push(d.draft(&context, k).unwrap());
        }
        out
    }

    #[test]
    fn copies_on_after_an_insertion() {
        // source: def f ( a , b ) : ; answer inserts `: int` after `a`
        let source = [1, 2, 3, 10, 4, 11, 5, 6, 99];
        let answer = [1, 2, 3, 10, 20, 21, 4];
        let drafts = drafts_along(&source, &answer, 3);
        assert_eq!(drafts[2], vec![10, 4, 11], "suffix `1 2 3` starts the copy");
        // after `20 21` (inserted) and `4` (the source's next token) the cursor is aligned again
        assert_eq!(drafts[6], vec![11, 5, 6]);
    }

    #[test]
    fn a_learned_replacement_is_applied_to_later_occurrences() {
        // source: x = tmp + tmp ; y = tmp  (tmp = 7); answer renames tmp → 30 31
        let source = [1, 2, 7, 3, 7, 4, 5, 2, 7, 9];
        let answer = [1, 2, 30, 31, 3];
        let drafts = drafts_along(&source, &answer, 6);
        // `30 31` replaced source `7`, so the rest of the copy renames too
        assert_eq!(drafts[4], vec![30, 31, 4, 5, 2, 30]);
    }

    #[test]
    fn a_lone_common_token_does_not_start_a_copy() {
        let source = [5, 6, 7, 8];
        assert!(drafts_along(&source, &[9, 6], 4)[1].is_empty());
        assert_eq!(drafts_along(&source, &[5, 6], 2)[1], vec![7, 8]);
    }

    #[test]
    fn the_longest_suffix_match_wins_over_the_latest() {
        // `2 3` occurs twice; only the first occurrence is preceded by `1`
        let source = [1, 2, 3, 40, 9, 2, 3, 50, 8];
        assert_eq!(drafts_along(&source, &[1, 2, 3], 1)[2], vec![40]);
        assert_eq!(drafts_along(&source, &[7, 2, 3], 1)[2], vec![50], "ties: the latest occurrence");
    }

    #[test]
    fn a_long_insertion_drops_the_cursor() {
        let source = [1, 2, 3, 4, 5, 6];
        let mut answer = vec![1, 2];
        answer.extend(100..100 + MAX_INSERTION as u32 + 1);
        answer.push(3);
        // `3` would resync the cursor after a short insertion; after a long one
        // only a suffix match can start a copy, and `… 3` has none of two tokens
        assert!(drafts_along(&source, &answer, 2).last().unwrap().is_empty());
        let short: Vec<u32> = vec![1, 2, 100, 101, 3];
        assert_eq!(drafts_along(&source, &short, 2).last().unwrap(), &vec![4, 5]);
    }

    #[test]
    fn a_shorter_context_starts_afresh() {
        let mut d = NgramDrafter::default();
        assert_eq!(d.draft(&[1, 2, 3, 4, 1, 2], 2).unwrap(), vec![3, 4]);
        assert_eq!(d.draft(&[5, 6, 5, 6], 2).unwrap(), vec![5, 6]);
    }
}
