//! A greedy request decoding alone runs speculative passes
//! (`Limits::speculative`): the same text as solo greedy decoding under
//! `full` and H2O, paged (rolled back through a copy) and in fixed slots
//! (through the undo journal), drafts accepted, KV back to 0; with
//! speculation off no pass runs and the text is the same.

use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions};
use kvslim_server::scheduler;
use kvslim_server::Limits;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
mod common;

use common::{greedy, scheduler_request, smollm2, streamed};

#[test]
fn a_lone_greedy_request_speculates_with_the_same_text() {
    // integer products (Q4_1): the verification pass is one GEMM per matrix
    let m = smollm2();
    let tok = Arc::new(m.tokenizer.expect("tokenizer"));
    let model = Arc::new(m.model);
    // an answer that copies its prompt: the drafts have something to copy
    let prompt = tok.encode(&"Tom had a red ball. He liked to play with it in the park. ".repeat(4)).unwrap();
    let max_tokens = 64;
    for (spec, page_size) in [("full", 16), ("h2o:heavy=24,recent=24", 16), ("h2o:heavy=24,recent=24", 0), ("full", 0)]
    {
        let policy = PolicySpec::parse(spec).unwrap();
        let opts = GenerateOptions { max_tokens, sampling: greedy(), policy: policy.clone(), eos: tok.eos.clone() };
        let solo_ids = generate(&model, &prompt, &opts, |_| true).unwrap().token_ids;
        let solo = tok.decode(&solo_ids).unwrap();
        for speculative in [true, false] {
            let limits = Limits { prefix_cache: 0, kv_page_size: page_size, speculative, ..Limits::default() };
            let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
            let (req, rx) = scheduler_request(prompt.clone(), max_tokens, &policy);
            handle.submit(req).unwrap();
            let what = format!("{spec}, page size {page_size}, speculative {speculative}");
            assert_eq!(streamed(rx).0, solo, "{what}: the text differs from solo greedy decoding");
            let mt = &handle.metrics;
            let passes = mt.speculative_passes_total.load(Relaxed);
            let accepted = mt.draft_tokens_accepted_total.load(Relaxed);
            // the first token comes from the prefill, each pass commits its
            // accepted drafts and one more (an end of sequence is not output)
            let generated = mt.generated_tokens_total.load(Relaxed);
            assert_eq!(generated as usize, solo_ids.len(), "{what}");
            if speculative {
                assert!(accepted > 0, "{what}: no draft accepted");
                assert!(passes + accepted + 1 >= generated, "{what}: {passes} passes, {accepted} accepted");
                assert!(passes + 1 < generated, "{what}: {passes} passes for {generated} tokens");
            } else {
                assert_eq!(passes, 0, "{what}");
            }
            assert!(mt.draft_tokens_total.load(Relaxed) >= accepted);
            assert_eq!(mt.kv_bytes_in_use.load(Relaxed), 0, "{what}: KV back to 0");
        }
    }
}

/// With a draft model (`--draft-model`; here the same SmolLM2 with f32
/// products, a model of its own with the same vocabulary) a lone greedy
/// request on a prompt with nothing to copy gives solo greedy's text, and
/// the draft model's drafts are accepted.
#[test]
fn a_draft_model_drafts_where_nothing_is_copied() {
    let m = smollm2();
    let tok = Arc::new(m.tokenizer.expect("tokenizer"));
    let model = Arc::new(m.model);
    let mut draft = smollm2().model;
    draft.weights.set_products(kvslim_kernels::Products::F32);
    let draft = kvslim_server::DraftModel { model: Arc::new(draft), policy: None };
    let prompt = tok.encode("Once upon a time, there was a little girl named Lily. She").unwrap();
    let max_tokens = 40;
    for (spec, page_size) in [("full", 16), ("h2o:heavy=12,recent=12", 0)] {
        let policy = PolicySpec::parse(spec).unwrap();
        let opts = GenerateOptions { max_tokens, sampling: greedy(), policy: policy.clone(), eos: tok.eos.clone() };
        let solo = tok.decode(&generate(&model, &prompt, &opts, |_| true).unwrap().token_ids).unwrap();
        let limits =
            Limits { prefix_cache: 0, kv_page_size: page_size, draft: Some(draft.clone()), ..Limits::default() };
        let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
        let (req, rx) = scheduler_request(prompt.clone(), max_tokens, &policy);
        handle.submit(req).unwrap();
        assert_eq!(streamed(rx).0, solo, "{spec}: the text differs from solo greedy decoding");
        let mt = &handle.metrics;
        let (drafted, accepted) = (mt.draft_tokens_total.load(Relaxed), mt.draft_tokens_accepted_total.load(Relaxed));
        assert!(accepted * 2 > drafted && accepted > 8, "{spec}: {accepted} of {drafted} drafts accepted");
        assert_eq!(mt.kv_bytes_in_use.load(Relaxed), 0, "{spec}: KV back to 0");
    }
}
