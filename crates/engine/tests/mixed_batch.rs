//! A prompt's chunks run in the same passes as other sequences' decode
//! steps (`Session::begin_feed_mixed` / `feed_mixed`, the server's mixed
//! batches) give every sequence the kept sets and, to rounding, the logits
//! of the chunks fed alone and the steps batched without them (a GEMM of
//! more rows may sum in another order, as a batch does against solo
//! steps): a full cache's prompt cut into chunks, a choosing policy's
//! whole (or in its streamed chunks); a chunked prefill of a cache that
//! keeps every token differs from one feed by rounding only; a probe
//! never mixes.

use kvslim_cache::{PolicySpec, SequenceCache};
use kvslim_engine::{Feed, Session};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{LoadedModel, Logits};
mod common;

use common::{stories, tokens};

fn session<'m>(m: &'m LoadedModel, spec: &str, n: usize) -> Session<'m> {
    let policy = PolicySpec::parse_and_load(spec).unwrap();
    Session::new(&m.model, &policy, n + 120, n).unwrap()
}

/// Largest difference between two rows of logits; a row mixed up with
/// another moves them (std ~1) by whole units, rounding by far less.
fn diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs()))
}

const ROUNDING: f32 = 1e-3;

/// Chunks of `chunk` tokens, a last one of a single token joined to the
/// one before.
fn passes(len: usize, chunk: usize) -> usize {
    match len.div_ceil(chunk) {
        n if chunk > 1 && n > 1 && len % chunk == 1 => n - 1,
        n => n,
    }
}

/// Positions held per layer and KV head, and the next position.
fn kept(c: &SequenceCache) -> (Vec<Vec<u32>>, usize) {
    let st = c.store();
    let heads = (0..st.layers()).flat_map(|l| (0..st.kv_heads()).map(move |h| st.head(l, h).positions().to_vec()));
    (heads.collect(), c.next_pos())
}

/// Feeds `prompt` under `spec` through `begin` (a chunked or whole feed)
/// and `Session::feed_mixed`, beside two sequences decoding (full and H2O),
/// against the same feed run by `feed_some` one chunk of `part(step)`
/// tokens at a time and the decode steps batched alone: the same passes,
/// kept sets and (to rounding) logits.
fn check_mixed(
    m: &LoadedModel,
    (spec, what): (&str, &str),
    text: &[u32],
    begin: impl Fn(&mut Session<'_>, Vec<u32>) -> Feed,
    part: impl Fn(usize) -> usize,
) {
    let n_layers = m.model.config.n_layers;
    let prompt = &text[..90];
    let decoding = [("full", &text[90..120]), ("h2o:heavy=6,recent=6", &text[120..150])];
    let mut others: Vec<Session<'_>> = decoding
        .iter()
        .map(|(s, p)| {
            let mut o = session(m, s, p.len());
            o.feed(p, Logits::Last).unwrap();
            o
        })
        .collect();
    let mut alone: Vec<Session<'_>> = others.iter().map(|o| Session::with_cache(&m.model, o.cache.clone())).collect();
    let mut mixed = session(m, spec, prompt.len());
    let mut feed = begin(&mut mixed, prompt.to_vec());
    let mut chunked = session(m, spec, prompt.len());
    let mut reference = begin(&mut chunked, prompt.to_vec());
    let (mut batch, mut batch_alone) = (BatchScratch::new(), BatchScratch::new());
    let mut step = 0;
    loop {
        let next = |i: usize| text[150 + (step + 7 * i) % 50];
        let mut items: Vec<BatchItem<'_>> =
            others.iter_mut().enumerate().map(|(i, o)| BatchItem { token: next(i), cache: &mut o.cache }).collect();
        let done = mixed.feed_mixed(&mut feed, &mut items, &mut batch).unwrap();
        let (done_alone, _) = chunked.feed_some(&mut reference, part(step) * n_layers).unwrap();
        assert_eq!(done, done_alone, "{what}: one chunk per pass");
        let mut items: Vec<BatchItem<'_>> =
            alone.iter_mut().enumerate().map(|(i, o)| BatchItem { token: next(i), cache: &mut o.cache }).collect();
        m.model.forward_batch(&mut items, &mut batch_alone).unwrap();
        for i in 0..decoding.len() {
            let d = diff(batch.logits(i), batch_alone.logits(i));
            assert!(d < ROUNDING, "{what}: step {step}, item {i}: {d}");
        }
        step += 1;
        if done {
            break;
        }
    }
    let d = diff(mixed.fed_logits(&feed), chunked.fed_logits(&reference));
    assert!(d < ROUNDING, "{what}: prompt logits {d}");
    assert_eq!(kept(&mixed.cache), kept(&chunked.cache), "{what}");
    for (o, a) in others.iter().zip(&alone) {
        assert_eq!(kept(&o.cache), kept(&a.cache), "{what}: a decoding sequence");
    }
}

#[test]
fn mixed_chunks_of_a_full_cache_equal_the_chunks_alone_and_batched_steps() {
    let m = stories();
    let text = tokens(&m, 200);
    for spec in ["full", "full:kv_dtype=q8", "full:kv_dtype=f16,page=4"] {
        assert!(session(&m, spec, 8).cache.prefill_chunkable(), "{spec}");
        for want in [Logits::Last, Logits::All] {
            for chunk in [1, 7, 32, 89, 500] {
                let what = format!("{spec}, {want:?}, chunk {chunk}");
                let begin = |s: &mut Session<'_>, p: Vec<u32>| s.begin_feed_mixed(&p, want, chunk).expect("mixes");
                // the chunk left at this step: a last single token joins the one before
                let part = |step: usize| {
                    let left = 90 - chunk * step;
                    if passes(left, chunk) == 1 {
                        left
                    } else {
                        chunk
                    }
                };
                check_mixed(&m, (spec, &what), &text, begin, part);
                let mut s = session(&m, spec, 90);
                let mut feed = s.begin_feed_chunked(text[..90].to_vec(), want, chunk);
                let mut count = 0;
                while !s.feed_mixed(&mut feed, &mut [], &mut BatchScratch::new()).unwrap() {
                    count += 1;
                }
                assert_eq!(count + 1, passes(90, chunk), "{what}: passes");
            }
        }
    }
}

/// A policy that must see its chunks whole mixes them whole: one pass for
/// the prompt, or one per streamed chunk.
#[test]
fn whole_prompts_under_choosing_policies_mix_as_fed_alone() {
    let m = stories();
    let text = tokens(&m, 200);
    let cases = [
        ("h2o:heavy=25%,recent=25%", 90),
        ("h2o:heavy=25%,recent=25%,prefill=snap:8", 90),
        ("h2o:heavy=25%,recent=25%,score=tova", 90),
        ("h2o:heavy=8,recent=8,prefill=stream:16", 16),
    ];
    for (spec, chunk) in cases {
        assert!(!session(&m, spec, 8).cache.prefill_chunkable(), "{spec}");
        // whole when the prompt (or each streamed chunk) is at most 4 mixed chunks
        let begin = |s: &mut Session<'_>, p: Vec<u32>| s.begin_feed_mixed(&p, Logits::Last, 23).expect("mixes");
        let part = |step: usize| chunk.min(90 - chunk * step);
        check_mixed(&m, (spec, spec), &text, begin, part);
        let mut s = session(&m, spec, 90);
        assert!(s.begin_feed_mixed(&text[..90], Logits::Last, 22).is_none() == (chunk == 90), "{spec}");
    }
}

#[test]
fn a_chunked_prefill_of_a_full_cache_differs_from_one_feed_by_rounding() {
    let m = stories();
    let prompt = tokens(&m, 90);
    let mut whole = session(&m, "full", prompt.len());
    let expected = whole.feed(&prompt, Logits::All).unwrap().to_vec();
    let mut chunked = session(&m, "full", prompt.len());
    let mut feed = chunked.begin_feed_chunked(prompt.clone(), Logits::All, 16);
    let (done, _) = chunked.feed_some(&mut feed, usize::MAX).unwrap();
    assert!(done);
    let d = diff(chunked.fed_logits(&feed), &expected);
    assert!(d < ROUNDING, "chunked against whole: {d}");
}

#[test]
fn a_probe_never_mixes() {
    let m = stories();
    let prompt = tokens(&m, 40);
    for spec in ["h2o:heavy=25%,recent=25%,prefill=kvzip", "window:recent=20"] {
        assert!(!session(&m, spec, 40).cache.prefill_chunkable(), "{spec}");
    }
    let mut s = session(&m, "h2o:heavy=25%,recent=25%,prefill=kvzip", prompt.len());
    assert!(s.begin_feed_mixed(&prompt, Logits::Last, 1000).is_none());
    let mut s = session(&m, "h2o:heavy=25%,recent=25%,prefill=kvzip", prompt.len());
    let mut feed = s.begin_feed_chunked(prompt, Logits::Last, 20);
    let err = s.feed_mixed(&mut feed, &mut [], &mut BatchScratch::new()).unwrap_err();
    assert!(err.to_string().contains("probe"), "{err}");
    assert_eq!(s.cache.next_pos(), 0, "nothing ran");
}
