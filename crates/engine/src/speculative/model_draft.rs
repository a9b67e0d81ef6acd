//! A draft model: a smaller model with the target's tokenizer (or the
//! target drafting for itself) proposes tokens by greedy decoding.

use super::rollback::Rollback;
use super::{Drafter, NgramDrafter};
use crate::sampling::argmax;
use crate::session::Session;
use crate::Result;
use kvslim_cache::PolicySpec;
use kvslim_models::{Logits, Model};

/// Greedy drafts from a model in its own session, under its own policy.
///
/// Its cache follows the target's committed tokens: each call feeds only
/// the tokens committed since the last one (one chunk), then decodes the
/// drafts. The drafts stay in the cache as tentative tokens; the next call
/// keeps the ones the target accepted and undoes the rest (cut, journal or
/// copy, as the target's verification does), so accepted drafts are never
/// run twice.
pub struct ModelDrafter<'m> {
    model: &'m Model,
    policy: PolicySpec,
    max_len: usize,
    session: Option<Session<'m>>,
    /// Tokens in the drafter's cache: committed context, then own drafts.
    fed: Vec<u32>,
    /// The undo of the drafts at the end of `fed`, and where they start.
    tentative: Option<(Rollback, usize)>,
}

impl<'m> ModelDrafter<'m> {
    /// `max_len`: the longest context it will see (prompt + max tokens).
    pub fn new(model: &'m Model, policy: PolicySpec, max_len: usize) -> Self {
        ModelDrafter { model, policy, max_len, session: None, fed: Vec::new(), tentative: None }
    }

    /// Keeps the drafts that `context` accepted, undoes the others, and
    /// starts afresh when `context` does not continue what was fed.
    fn follow(&mut self, context: &[u32]) -> Result<()> {
        if let (Some((undo, base)), Some(s)) = (self.tentative.take(), self.session.as_mut()) {
            let drafted = self.fed.len() - base;
            let agree = if context.len() >= base && context[..base] == self.fed[..base] {
                self.fed[base..].iter().zip(&context[base..]).take_while(|(a, b)| a == b).count()
            } else {
                0
            };
            let replay = undo.keep(&mut s.cache, agree, drafted).map_err(kvslim_models::Error::from)?;
            self.fed.truncate(if replay { base } else { base + agree });
        }
        // a context that is not a continuation, or one with nothing unfed
        // to take the next logits from, starts a new session
        if self.session.is_none() || !context.starts_with(&self.fed) || context.len() == self.fed.len() {
            self.session = Some(Session::new(self.model, &self.policy, self.max_len, context.len())?);
            self.fed.clear();
        }
        Ok(())
    }
}

impl Drafter for ModelDrafter<'_> {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        self.follow(context)?;
        let room = self.max_len.min(self.model.config.context_len).saturating_sub(context.len());
        let k = k.min(room);
        if k == 0 {
            return Ok(Vec::new());
        }
        let s = self.session.as_mut().expect("follow() made one");
        let mut next = argmax(s.feed(&context[self.fed.len()..], Logits::Last)?);
        self.fed.extend_from_slice(&context[self.fed.len()..]);
        let mut out = Vec::with_capacity(k);
        out.push(next);
        if k > 1 {
            self.tentative = Some((Rollback::before(&mut s.cache, k - 1), context.len()));
            while out.len() < k {
                self.fed.push(next);
                next = argmax(s.feed(&[next], Logits::Last)?);
                out.push(next);
            }
        }
        Ok(out)
    }
}

/// Copies where the context offers a match ([`NgramDrafter`]), otherwise
/// asks a draft model: copying costs nothing, the model's drafts a decode
/// step of the draft model each. The model catches up on the copied tokens
/// in one chunk when it is next asked.
pub struct CopyThenModel<'m> {
    pub copy: NgramDrafter,
    pub model: ModelDrafter<'m>,
}

impl<'m> CopyThenModel<'m> {
    pub fn new(model: ModelDrafter<'m>) -> Self {
        CopyThenModel { copy: NgramDrafter::default(), model }
    }
}

impl Drafter for CopyThenModel<'_> {
    fn draft(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        let copied = self.copy.draft(context, k)?;
        if !copied.is_empty() {
            return Ok(copied);
        }
        self.model.draft(context, k)
    }
}
