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

/// The first `n` tokens of the first `chars` bytes of TinyStories' validation text.
fn tinystories_ids(m: &LoadedModel, chars: usize, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(shared().join("data/tinystories/tinystories_val.txt")).unwrap();
    let mut ids = m.tokenizer.as_ref().unwrap().encode(&text[..chars]).unwrap();
    ids.truncate(n);
    ids
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
    let ids = tinystories_ids(&m, 20_000, 512);
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

/// With `after_prefill` only the continuation of the prefilled prompt
/// counts: the same run, its NLL over the decode steps' predictions, and
/// the prompt's own rows (attention over the whole chunk before SnapKV
/// compresses it) add no KL against the full cache.
#[test]
fn after_prefill_counts_only_the_compressed_prompts_continuation() {
    let m = stories();
    let ids = tinystories_ids(&m, 8_000, 256);
    let spec = PolicySpec::parse("h2o:heavy=24,recent=8,prefill=snap:8").unwrap();
    let opts = |after_prefill| PerplexityOptions {
        prefill: 192,
        after_prefill,
        compare_full: true,
        ..PerplexityOptions::new(spec.clone())
    };
    let all = perplexity(&m.model, &ids, &opts(false), |_, _| {}).unwrap();
    let cont = perplexity(&m.model, &ids, &opts(true), |_, _| {}).unwrap();
    assert_eq!((all.counted, cont.counted), (255, 63));
    assert_eq!(all.logprobs, cont.logprobs, "the same run, counted differently");
    let mean = -cont.logprobs[192..].iter().sum::<f64>() / 63.0;
    assert!((cont.nll - mean).abs() < 1e-12, "{} vs {mean}", cont.nll);
    let (kl_all, kl_cont) = (all.compare_full.unwrap().kl_mean, cont.compare_full.unwrap().kl_mean);
    assert!(kl_cont > 0.0, "32 of 192 prompt slots kept change the continuation");
    assert!((kl_all * 255.0 - kl_cont * 63.0).abs() <= 1e-9 * kl_cont * 63.0, "{kl_all} · 255 vs {kl_cont} · 63");
    let e = perplexity(&m.model, &ids, &PerplexityOptions { prefill: 255, ..opts(true) }, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("leaves no prediction"), "{e}");
}
