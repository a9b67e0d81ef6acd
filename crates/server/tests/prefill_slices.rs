//! A long prompt arriving while another request generates is prefilled a
//! few layers per decode step (`Limits::prefill_chunk`), or under `full` a
//! chunk per pass together with the running request's decode steps
//! (`Limits::mixed_chunk`): the running request keeps decoding meanwhile,
//! and both give exactly their solo greedy outputs, the long one under
//! `full`, H2O and SnapKV; a client leaving mid-prefill frees its KV.

use kvslim_cache::PolicySpec;
use kvslim_engine::{generate, GenerateOptions};
use kvslim_models::{Model, Tokenizer};
use kvslim_server::metrics::Metrics;
use kvslim_server::scheduler::{self, Event, Request};
use kvslim_server::Limits;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;
mod common;

use common::{greedy, scheduler_request, smollm2, streamed};

/// A greedy request reporting its tokens' log-probs (their ids are the
/// output compared).
fn request(prompt: Vec<u32>, max_tokens: usize, policy: &PolicySpec) -> (Request, UnboundedReceiver<Event>) {
    let (mut req, rx) = scheduler_request(prompt, max_tokens, policy);
    req.logprobs = Some(0);
    (req, rx)
}

/// The greedy tokens of `prompt` run alone under `policy`.
fn solo(model: &Model, tok: &Tokenizer, prompt: &[u32], max_tokens: usize, policy: &PolicySpec) -> Vec<u32> {
    let opts = GenerateOptions { max_tokens, sampling: greedy(), policy: policy.clone(), eos: tok.eos.clone() };
    generate(model, prompt, &opts, |_| true).unwrap().token_ids
}

/// The generated token ids a request reported, once it is done.
fn ids(rx: UnboundedReceiver<Event>) -> Vec<u32> {
    streamed(rx).1
}

#[test]
fn a_long_prompt_is_prefilled_between_decode_steps_with_the_same_outputs() {
    // SmolLM2-135M (not stories260K): its 150 decode steps take about a
    // second, far longer than the next submit even on a loaded machine,
    // so the short request is surely running when the long one arrives
    let m = smollm2();
    let tok = Arc::new(m.tokenizer.expect("tokenizer"));
    let layers = m.model.config.n_layers as u64;
    let short = tok.encode("Count from 1 to 100: 1, 2, 3,").unwrap();
    let long = tok.encode(&"Tom had a red ball. He liked to play with it in the park. ".repeat(12)).unwrap();
    assert!(long.len() < 400, "{} tokens", long.len());
    assert!(long.len() > 150, "{} tokens", long.len());
    let model = Arc::new(m.model);
    let full = PolicySpec::full();
    let solo = |prompt: &[u32], max_tokens, policy: &PolicySpec| solo(&model, &tok, prompt, max_tokens, policy);
    // the running request: under `full` it counts on for all 150 tokens (no EOS)
    let running = solo(&short, 150, &full);
    assert_eq!(running.len(), 150);
    for spec in ["full", "h2o:heavy=16,recent=16", "h2o:heavy=16,recent=16,prefill=snap:8"] {
        let policy = PolicySpec::parse(spec).unwrap();
        // one prompt token per step: each slice is one layer of the long
        // prompt (no mixed batches, which would take `full` in chunks)
        let limits = Limits { prefix_cache: 0, prefill_chunk: 1, mixed_chunk: 0, ..Limits::default() };
        let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
        let (a, rx_a) = request(short.clone(), 150, &full);
        let (b, rx_b) = request(long.clone(), 24, &policy);
        handle.submit(a).unwrap();
        handle.submit(b).unwrap();
        assert_eq!(ids(rx_b), solo(&long, 24, &policy), "{spec}: the sliced prefill changed the long request");
        assert_eq!(ids(rx_a), running, "{spec}: the running request changed");
        let mt = &handle.metrics;
        // the short prompt in one slice (nothing was decoding), the long one a layer per slice
        assert!(mt.prefill_slices_total.load(Relaxed) > layers, "{spec}: prefill slices");
        assert!(
            mt.decode_steps_during_prefill_total.load(Relaxed) >= layers - 1,
            "{spec}: decode steps during the prefill"
        );
        assert_eq!(mt.kv_bytes_in_use.load(Relaxed), 0, "{spec}: KV back to 0");
        assert_eq!(mt.prefilling.load(Relaxed), 0, "{spec}");
    }
}

/// A client that leaves while its prompt is being prefilled in slices
/// frees its KV at the next slice; the running request is not disturbed.
#[test]
fn a_request_cancelled_mid_prefill_frees_its_kv() {
    let m = smollm2();
    let tok = Arc::new(m.tokenizer.expect("tokenizer"));
    let layers = m.model.config.n_layers as u64;
    let model = Arc::new(m.model);
    let short = tok.encode("Count from 1 to 100: 1, 2, 3,").unwrap();
    let long = tok.encode(&"Tom had a red ball. He liked to play with it in the park. ".repeat(80)).unwrap();
    let running = solo(&model, &tok, &short, 150, &PolicySpec::full());
    let limits = Limits { prefix_cache: 0, prefill_chunk: 1, mixed_chunk: 0, ..Limits::default() };
    let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
    leave_mid_prefill(&handle, (short, long), &running, |mt| mt.prefilling.load(Relaxed) > 0);
    let mt = &handle.metrics;
    assert!(mt.prefill_slices_total.load(Relaxed) < 1 + layers, "the cancelled prefill ran to its end");
    assert_eq!(mt.prefilling.load(Relaxed), 0);
}

/// Submits `short` (150 greedy tokens under `full`, `running` alone) and
/// then `long`, whose client leaves once `started` sees its prefill
/// part-way: the running request is not disturbed, the other is counted
/// cancelled and the KV is back to 0.
fn leave_mid_prefill(
    handle: &scheduler::SchedulerHandle,
    (short, long): (Vec<u32>, Vec<u32>),
    running: &[u32],
    started: impl Fn(&Metrics) -> bool,
) {
    let full = PolicySpec::full();
    let (a, rx_a) = request(short, 150, &full);
    let (b, rx_b) = request(long, 8, &full);
    handle.submit(a).unwrap();
    handle.submit(b).unwrap();
    let mt = &handle.metrics;
    let t0 = std::time::Instant::now();
    while !started(mt) {
        assert!(t0.elapsed().as_secs() < 60, "the long prompt never started its prefill");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(rx_b);
    assert_eq!(ids(rx_a), running, "the running request changed");
    assert_eq!(mt.requests_cancelled_total.load(Relaxed), 1);
    assert_eq!(mt.kv_bytes_in_use.load(Relaxed), 0, "KV back to 0");
}

/// Mixed batches: under `full` the long prompt runs a chunk per pass with
/// the running request's decode step, and both give their solo greedy
/// outputs; under H2O (its prefill chooses what stays) it joins one pass
/// whole when it is at most 4 mixed chunks, else it runs in layer slices.
/// A client leaving part-way frees its KV.
#[test]
fn a_long_prompt_in_mixed_batches_gives_the_solo_outputs() {
    let m = smollm2();
    let tok = Arc::new(m.tokenizer.expect("tokenizer"));
    let short = tok.encode("Count from 1 to 100: 1, 2, 3,").unwrap();
    let long = tok.encode(&"Tom had a red ball. He liked to play with it in the park. ".repeat(12)).unwrap();
    let model = Arc::new(m.model);
    let full = PolicySpec::full();
    let solo = |prompt: &[u32], max_tokens, policy: &PolicySpec| solo(&model, &tok, prompt, max_tokens, policy);
    let running = solo(&short, 150, &full);
    // chunks of 32, a last one of a single token joined to the one before
    let chunks = (long.len().div_ceil(32) - usize::from(long.len() % 32 == 1)) as u64;
    assert!(long.len() > 4 * 32 && long.len() <= 4 * 64, "{} tokens", long.len());
    // (a quantized cache's chunks read the earlier ones back quantized, so
    // its outputs may differ from one prefill's: crates/engine/tests/mixed_batch.rs)
    for (spec, chunk, want) in
        [("full", 32, chunks), ("h2o:heavy=16,recent=16", 32, 0), ("h2o:heavy=16,recent=16", 64, 1)]
    {
        let policy = PolicySpec::parse(spec).unwrap();
        let limits = Limits { prefix_cache: 0, mixed_chunk: chunk, ..Limits::default() };
        let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
        let (a, rx_a) = request(short.clone(), 150, &full);
        let (b, rx_b) = request(long.clone(), 24, &policy);
        handle.submit(a).unwrap();
        handle.submit(b).unwrap();
        assert_eq!(ids(rx_b), solo(&long, 24, &policy), "{spec}: the long request changed");
        assert_eq!(ids(rx_a), running, "{spec}: the running request changed");
        let passes = handle.metrics.mixed_passes_total.load(Relaxed);
        assert_eq!(passes, want, "{spec}, mixed chunk {chunk}: mixed passes");
        assert_eq!(handle.metrics.kv_bytes_in_use.load(Relaxed), 0, "{spec}: KV back to 0");
    }
    // a client leaving part-way through a mixed prefill
    let limits = Limits { prefix_cache: 0, mixed_chunk: 1, ..Limits::default() };
    let handle = scheduler::spawn(model.clone(), tok.clone(), limits);
    let n = long.len() as u64;
    leave_mid_prefill(&handle, (short, long), &running, |mt| mt.mixed_passes_total.load(Relaxed) > 0);
    assert!(handle.metrics.mixed_passes_total.load(Relaxed) < n, "the cancelled prefill ran to its end");
}
