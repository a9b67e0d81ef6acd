//! stories260K (llama2.c format) against the reference values published in
//! `../shared/README.md`.

use kvslim_cache::PolicySpec;
use kvslim_engine::sampling::argmax;
use kvslim_engine::{generate, perplexity, GenerateOptions, PerplexityOptions, SamplingParams};
use kvslim_models::{load_model, LoadedModel, Logits};
mod common;

use common::shared;

fn stories() -> LoadedModel {
    load_model(&shared().join("models/stories260K/stories260K.bin")).expect("load stories260K")
}

#[test]
fn encoding_matches_reference() {
    let m = stories();
    let tok = m.tokenizer.as_ref().expect("tok512.bin found beside the model");
    assert_eq!(tok.encode("Once upon a time").unwrap(), vec![1, 403, 407, 261, 378]);
    let text = "Once upon a time, there was a little girl named Lily. Ünïcödé 123!";
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids[0], 1, "BOS added");
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

#[test]
fn greedy_and_position_zero_logits_match_reference() {
    let m = stories();
    let want: Vec<u32> = "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394 261 370 432 352"
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    // position-0 logits
    let mut s = kvslim_engine::Session::new(&m.model, &PolicySpec::full(), 8, 8).unwrap();
    let logits = s.feed(&[1], Logits::Last).unwrap().to_vec();
    let first5 = [-6.22292f32, 8.40434, -6.22374, -6.22254, -6.22195];
    for (a, b) in logits.iter().zip(first5) {
        assert!((a - b).abs() <= 1e-4, "logit {a} vs {b}");
    }
    assert_eq!(argmax(&logits), 403);
    // greedy from BOS alone
    let opts = GenerateOptions {
        max_tokens: 40,
        sampling: SamplingParams::default(),
        policy: PolicySpec::full(),
        eos: vec![],
    };
    let g = generate(&m.model, &[1], &opts, |_| true).unwrap();
    assert_eq!(g.token_ids, want);
    let text = m.tokenizer.as_ref().unwrap().decode(&g.token_ids).unwrap();
    assert!(text.starts_with("Once upon a time, there was a little girl named Lily."), "{text}");
}

#[test]
fn tinystories_nll_in_published_range_and_prefill_equals_decode() {
    let m = stories();
    let text = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text[..20_000]).unwrap();
    ids.truncate(512);
    let decode = perplexity(&m.model, &ids, &PerplexityOptions::new(PolicySpec::full()), |_, _| {}).unwrap();
    assert!((1.2..=1.45).contains(&decode.nll), "mean NLL {} outside [1.2, 1.45]", decode.nll);
    let prefill = perplexity(
        &m.model,
        &ids,
        &PerplexityOptions { prefill: 300, ..PerplexityOptions::new(PolicySpec::full()) },
        |_, _| {},
    )
    .unwrap();
    assert!((prefill.nll - decode.nll).abs() < 1e-5, "prefill {} vs decode {}", prefill.nll, decode.nll);
    for (a, b) in prefill.logprobs.iter().zip(&decode.logprobs) {
        assert!((a - b).abs() < 1e-4);
    }
    eprintln!("stories260K mean NLL on 512 tokens: {:.4}", decode.nll);
}
