//! A decode step: one batched forward pass over every running sequence,
//! or, for a greedy sequence decoding alone, a speculative pass.

use super::events::token_logprob;
use super::sequence::Running;
use super::Request;
use crate::metrics::Metrics;
use kvslim_engine::{DraftLength, NgramDrafter, Speculator, Verification};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{Model, Scratch, Tokenizer};
use std::sync::atomic::Ordering::Relaxed;

/// One batched decode step over `running`, each sequence's next token
/// sampled with its own sampler.
pub(super) fn batched_step(
    model: &Model,
    tok: &Tokenizer,
    m: &Metrics,
    running: &mut [Running<'_>],
    scratch: &mut BatchScratch,
) -> Result<(), String> {
    let mut items: Vec<BatchItem<'_>> =
        running.iter_mut().map(|r| BatchItem { token: r.next, cache: &mut r.session.cache }).collect();
    model.forward_batch(&mut items, scratch).map_err(|e| e.to_string())?;
    drop(items);
    for (i, r) in running.iter_mut().enumerate() {
        let row = scratch.logits(i);
        let id = r.sampler.sample(row);
        let lp = r.req.logprobs.map(|k| token_logprob(row, id, k));
        r.on_token(tok, m, id, lp);
    }
    Ok(())
}

/// A request's speculative decoding: the drafter follows its context
/// (prompt and output) across steps, speculative or batched.
pub(super) struct Speculation {
    speculator: Speculator,
    drafter: NgramDrafter,
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

/// One speculative pass for `r` ([`Speculator::step`]): its committed
/// tokens go out one by one, as a batched step's would, until one ends the
/// request. `scratch` is lent to its session for the pass.
pub(super) fn speculative_step(
    model: &Model,
    tok: &Tokenizer,
    m: &Metrics,
    r: &mut Running<'_>,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let mut spec = r.spec.take().unwrap_or_else(|| {
        Box::new(Speculation {
            speculator: Speculator::new(model, DraftLength::default(), Verification::Auto),
            drafter: NgramDrafter::default(),
            context: r.req.prompt.clone(),
            committed: Vec::new(),
        })
    });
    // the output since its last pass (batched steps included)
    let seen = spec.context.len() - r.req.prompt.len();
    spec.context.extend_from_slice(&r.out.generated()[seen..]);
    let left = r.req.max_tokens - r.out.generated().len();
    let before = spec.speculator.stats;
    std::mem::swap(&mut r.session.scratch, scratch);
    let result = spec.speculator.step(model, &mut r.session, &mut spec.drafter, &spec.context, left);
    std::mem::swap(&mut r.session.scratch, scratch);
    let committed = result.map_err(|e| e.to_string())?;
    spec.committed.clear();
    spec.committed.extend_from_slice(committed);
    let after = spec.speculator.stats;
    m.speculative_passes_total.fetch_add(1, Relaxed);
    m.draft_tokens_total.fetch_add((after.drafted - before.drafted) as u64, Relaxed);
    m.draft_tokens_accepted_total.fetch_add((after.accepted - before.accepted) as u64, Relaxed);
    for &id in &spec.committed {
        r.on_token(tok, m, id, None);
        if r.finished.is_some() {
            break;
        }
    }
    r.spec = Some(spec);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{greedy, prefilled, request, tiny_model, tokenizer};

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

    /// Decodes `prompts` greedily, in one batch or (one prompt) by
    /// speculative passes, until one of them ends; their tokens.
    fn decode(prompts: &[Vec<u32>], max_tokens: usize, speculative: bool) -> Vec<Vec<u32>> {
        let (model, tok, m) = (tiny_model(), tokenizer(), Metrics::default());
        let mut running: Vec<Running<'_>> = Vec::new();
        let mut receivers = Vec::new();
        for p in prompts {
            let (req, rx) = request(p.clone(), max_tokens);
            receivers.push(rx);
            let (r, logits) = prefilled(&model, req);
            running.push(r.start(&tok, &m, &logits).expect("the first token does not end it"));
        }
        let (mut batch, mut scratch) = (BatchScratch::new(), Scratch::new());
        while !running.iter().any(Running::ended) {
            if speculative {
                speculative_step(&model, &tok, &m, &mut running[0], &mut scratch).unwrap();
            } else {
                batched_step(&model, &tok, &m, &mut running, &mut batch).unwrap();
            }
        }
        running.iter().map(|r| r.out.generated().to_vec()).collect()
    }

    #[test]
    fn a_batched_step_gives_each_sequence_its_solo_greedy_tokens() {
        let model = tiny_model();
        let prompts = [vec![1, 11, 12, 13], vec![1, 14, 15]];
        // every step up to the first end was shared by both
        let out = decode(&prompts, 6, false);
        for (p, o) in prompts.iter().zip(&out) {
            assert_eq!(o[..], greedy(&model, p, 6)[..o.len()], "prompt {p:?}");
        }
    }

    #[test]
    fn speculative_passes_give_the_greedy_tokens() {
        let model = tiny_model();
        let prompt = vec![1, 11, 12, 11, 12, 11];
        let out = decode(std::slice::from_ref(&prompt), 12, true);
        assert_eq!(out[0], greedy(&model, &prompt, 12));
    }
}
