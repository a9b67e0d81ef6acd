//! Beam search for a request (`beams` > 1), run whole at admission.

use super::events::Event;
use super::pools::Pools;
use super::sequence::Running;
use crate::metrics::Metrics;
use kvslim_engine::beam::{beam_policy, beam_search_in, BeamStorage};
use kvslim_engine::BeamOptions;
use kvslim_models::{Model, Tokenizer};

/// The search's options for a request: greedy, early stopping, EOS from
/// the tokenizer.
fn options(r: &Running<'_>, tok: &Tokenizer) -> BeamOptions {
    BeamOptions {
        beams: r.req.beams,
        max_tokens: r.req.max_tokens,
        length_penalty: r.req.length_penalty,
        early_stopping: true,
        policy: r.req.policy.clone(),
        eos: tok.eos.clone(),
        keep_caches: false,
    }
}

/// Beam search for one request, run to completion on the scheduler thread
/// (other sequences wait meanwhile): the best hypothesis goes through the
/// same stop-string and length handling as sampled tokens. The beams draw
/// their (shared, copy-on-write) pages from the server's pool, so they show
/// in its page metrics.
pub(super) fn run_beams(model: &Model, tok: &Tokenizer, m: &Metrics, pools: &Pools, r: &mut Running<'_>) {
    let opts = options(r, tok);
    let spec = beam_policy(&opts.policy);
    let page = spec.storage.page_size.expect("beam_policy pages every spec");
    let pool = pools.get(page, spec.storage.kv_dtype, model.config.head_dim);
    let storage = BeamStorage { as_specified: false, pool: Some(&pool) };
    match beam_search_in(model, &r.req.prompt, &opts, storage, None) {
        Ok(hyps) => {
            let Some(best) = hyps.into_iter().next() else {
                r.finished = Some("length");
                return;
            };
            for &id in &best.token_ids {
                r.on_token(tok, m, id, None);
                if r.finished.is_some() {
                    return;
                }
            }
            r.finished = Some(if best.eos { "stop" } else { "length" });
            r.flush(tok);
        }
        Err(e) => {
            let _ = r.req.events.send(Event::Error(format!("beam search failed: {e}")));
            r.cancelled = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{events, outcome, prefilled, request, tiny_model, tokenizer};

    #[test]
    fn the_best_hypothesis_is_streamed_from_pages_of_the_servers_pool() {
        let (model, tok, m, pools) = (tiny_model(), tokenizer(), Metrics::default(), Pools::default());
        let (mut req, mut rx) = request(vec![1, 11, 12], 6);
        req.beams = 3;
        let (mut r, _) = prefilled(&model, req);
        run_beams(&model, &tok, &m, &pools, &mut r);
        let best = kvslim_engine::beam_search(&model, &r.req.prompt, &options(&r, &tok)).unwrap().remove(0);
        let reason = if best.eos { "stop" } else { "length" };
        let want = (tok.decode(&best.token_ids).unwrap(), Some((reason, best.token_ids.len())));
        assert_eq!(r.finished, Some(reason));
        r.release(&m);
        assert_eq!(outcome(&events(&mut rx)), want);
        let pool = &pools.all()[0];
        assert_eq!(pool.page_size(), kvslim_engine::beam::BEAM_PAGE_SIZE);
        assert_eq!(pool.stats().pages_in_use, 0, "the beams' pages went back");
    }
}
