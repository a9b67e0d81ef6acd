//! Speculative decoding for a greedy request decoding alone: drafts copied
//! from its prompt and output (and, with a draft model, the draft model's
//! where nothing is copied), verified in one pass.

use super::request::{DraftModel, Request};
use crate::metrics::Metrics;
use kvslim_engine::{
    CopyThenModel, DraftLength, Drafter, ModelDrafter, NgramDrafter, Session, Speculator, Verification,
};
use kvslim_models::Model;
use std::sync::atomic::Ordering::Relaxed;

/// A request's speculative decoding: the drafter follows its context
/// (prompt and output) across steps, speculative or batched.
pub(super) struct Speculation<'m> {
    speculator: Speculator,
    drafter: Box<dyn Drafter + 'm>,
    /// The prompt and the output so far.
    context: Vec<u32>,
    /// The tokens the last pass committed.
    committed: Vec<u32>,
}

/// Whether a sequence decoding alone runs speculative passes: greedy, no
/// log-probs, a beam of one, and at least two tokens still to go after
/// the `generated` ones.
pub(super) fn speculates(req: &Request, generated: usize) -> bool {
    req.sampling.temperature == 0.0
        && req.logprobs.is_none()
        && req.beams <= 1
        && req.max_tokens.saturating_sub(generated) >= 2
}

impl<'m> Speculation<'m> {
    /// For `req`, with `draft` behind the n-gram copier if there is one.
    pub fn new(model: &Model, req: &Request, draft: Option<&'m DraftModel>) -> Self {
        let drafter: Box<dyn Drafter + 'm> = match draft {
            Some(d) => {
                let policy = d.policy.clone().unwrap_or_else(|| req.policy.clone());
                Box::new(CopyThenModel::new(ModelDrafter::new(&d.model, policy, req.prompt.len() + req.max_tokens)))
            }
            None => Box::new(NgramDrafter::default()),
        };
        Speculation {
            speculator: Speculator::new(model, DraftLength::default(), Verification::Auto),
            drafter,
            context: req.prompt.to_vec(),
            committed: Vec::new(),
        }
    }

    /// One pass ([`Speculator::step`]) over `session`, whose request has a
    /// prompt of `prompt_len` tokens, has generated `generated` and may
    /// generate `left` more: the tokens it commits.
    pub fn pass(
        &mut self,
        model: &Model,
        session: &mut Session<'_>,
        prompt_len: usize,
        generated: &[u32],
        left: usize,
        m: &Metrics,
    ) -> Result<&[u32], String> {
        // the output since its last pass (batched steps included)
        let seen = self.context.len() - prompt_len;
        self.context.extend_from_slice(&generated[seen..]);
        let before = self.speculator.stats;
        let committed = self.speculator.step(model, session, self.drafter.as_mut(), &self.context, left);
        let committed = committed.map_err(|e| e.to_string())?;
        self.committed.clear();
        self.committed.extend_from_slice(committed);
        let after = self.speculator.stats;
        m.speculative_passes_total.fetch_add(1, Relaxed);
        m.draft_tokens_total.fetch_add((after.drafted - before.drafted) as u64, Relaxed);
        m.draft_tokens_accepted_total.fetch_add((after.accepted - before.accepted) as u64, Relaxed);
        Ok(&self.committed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::request;

    #[test]
    fn only_a_greedy_plain_request_with_two_tokens_to_go_speculates() {
        let (req, _rx) = request(vec![1, 11], 8);
        assert!(speculates(&req, 0) && speculates(&req, 6));
        assert!(!speculates(&req, 7), "one token left: a plain step");
        let (mut sampled, _rx) = request(vec![1, 11], 8);
        sampled.sampling.temperature = 0.7;
        let (mut logprobs, _rx) = request(vec![1, 11], 8);
        logprobs.logprobs = Some(0);
        let (mut beams, _rx) = request(vec![1, 11], 8);
        beams.beams = 2;
        assert!(![sampled, logprobs, beams].iter().any(|r| speculates(r, 0)));
    }
}
