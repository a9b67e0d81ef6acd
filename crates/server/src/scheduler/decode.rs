//! A decode step: one batched forward pass over every running sequence,
//! or, for a greedy sequence decoding alone, a speculative pass
//! ([`super::speculation`]).

use super::events::token_logprob;
use super::request::DraftModel;
use super::sequence::Running;
use super::speculation::Speculation;
use crate::metrics::Metrics;
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{Model, Scratch, Tokenizer};

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
    sample_batch(tok, m, running, scratch);
    Ok(())
}

/// Each of `running` samples its next token from its row of a batch's
/// logits, with its own sampler.
pub(super) fn sample_batch(tok: &Tokenizer, m: &Metrics, running: &mut [Running<'_>], scratch: &BatchScratch) {
    for (i, r) in running.iter_mut().enumerate() {
        let row = scratch.logits(i);
        let id = r.sampler.sample(row);
        let lp = r.req.logprobs.map(|k| token_logprob(row, id, k));
        r.on_token(tok, m, id, lp);
    }
}

/// One speculative pass for `r` ([`Speculator::step`]): its committed
/// tokens go out one by one, as a batched step's would, until one ends the
/// request. `scratch` is lent to its session for the pass.
pub(super) fn speculative_step<'m>(
    (model, draft): (&Model, Option<&'m DraftModel>),
    tok: &Tokenizer,
    m: &Metrics,
    r: &mut Running<'m>,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let mut spec = r.spec.take().unwrap_or_else(|| Box::new(Speculation::new(model, &r.req, draft)));
    let left = r.req.max_tokens - r.out.generated().len();
    std::mem::swap(&mut r.session.scratch, scratch);
    let result = spec.pass(model, &mut r.session, r.req.prompt.len(), r.out.generated(), left, m);
    std::mem::swap(&mut r.session.scratch, scratch);
    for &id in result? {
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
                speculative_step((&model, None), &tok, &m, &mut running[0], &mut scratch).unwrap();
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
