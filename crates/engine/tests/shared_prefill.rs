//! The kvpress protocol: one prompt prefill shared by many policies
//! (`Model::forward_shared`, `generate_shared`) leaves every cache, every
//! logit and every generated token bit-identical to running each policy
//! alone, on a model with grouped-query attention and on one with
//! sliding-window layers; caches that cannot share are refused or run
//! alone.

use kvslim_cache::{PolicySpec, PrefillKernel, SequenceCache};
use kvslim_engine::{generate, generate_shared, share_groups, GenerateOptions, SamplingParams};
use kvslim_models::{load_model, Logits, Model, Scratch};
mod common;

use common::{assert_same_cache, shared, stories, tokens};

/// Policies that share a tiled prefill: no scores, column sums, SnapKV's
/// window, allocators, pages, quantized rows, sinks, value-norm weights
/// (which must not take the plain column sums' scores).
const TILED: [&str; 21] = [
    "full",
    "full:kv_dtype=q8",
    "h2o:heavy=25%,recent=25%",
    "h2o:heavy=25%,recent=25%,prefill=snap:8",
    "h2o:heavy=10%,recent=15%,prefill=snap:6:1,score=norm",
    "window:recent=20%",
    "sink:sink=4,recent=20%",
    "heavy:heavy=30%",
    "random:budget=30%,recent=5,seed=7",
    "h2o:heavy=20%,recent=20%,agg=max",
    "h2o:heavy=20%,recent=20%,alloc=pyramid:0.5",
    "h2o:heavy=20%,recent=20%,alloc=ada:0.2",
    "h2o:heavy=20%,recent=20%,sink=2,page=4",
    "h2o:heavy=20%,recent=20%,kv_dtype=q8,page=8",
    "h2o:heavy=20%,recent=20%,prefill=rkv",
    "h2o:heavy=25%,recent=25%,score=vnorm",
    "h2o:heavy=10%,recent=15%,sink=4,prefill=snap:6,score=vnorm",
    // order-dependent rules decided by the last queries, replayed after the tiled kernel
    "h2o:heavy=25%,recent=25%,score=tova",
    "h2o:heavy=20%,recent=20%,agg=max,score=tova",
    "h2o:heavy=25%,recent=25%,score=decay:0",
    "heavy:heavy=40%,score=persist:4",
];

/// Policies whose prefill scores query by query (the decode kernel).
const EVERY_QUERY: [&str; 2] = ["h2o:heavy=25%,recent=25%,score=decay:0.5", "h2o:heavy=25%,recent=25%,score=decay:0.9"];

/// KVzip policies: the prompt and its repeat probe through the tiled kernel.
const REPEAT: [&str; 4] = [
    "h2o:heavy=25%,recent=25%,prefill=kvzip",
    "h2o:heavy=10%,recent=10%,prefill=kvzip",
    "h2o:heavy=10%,recent=15%,sink=2,prefill=kvzip,score=norm",
    "h2o:heavy=20%,recent=20%,prefill=kvzip,alloc=ada:0.2",
];

/// KVzip policies repeating the prompt in pieces of 32 tokens.
const REPEAT_PIECES: [&str; 3] = [
    "h2o:heavy=25%,recent=25%,prefill=kvzip:32",
    "h2o:heavy=10%,recent=15%,sink=2,prefill=kvzip:32,score=norm",
    "h2o:heavy=20%,recent=20%,prefill=kvzip:32,alloc=global",
];

fn cache(model: &Model, spec: &str, n: usize) -> SequenceCache {
    model.new_cache(&PolicySpec::parse_and_load(spec).unwrap(), n + 8, n).unwrap()
}

/// Each policy's cache and logits after `forward_shared` equal its own
/// `forward` of the prompt, bit for bit; the first policy's prefill
/// kernel is `kernel`, and every other's can join it.
fn assert_shared_prefill_is_exact(model: &Model, prompt: &[u32], specs: &[&str], kernel: PrefillKernel) {
    let n = prompt.len();
    let mut alone = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut c = cache(model, spec, n);
        let own = c.shared_prefill_kernel().unwrap();
        assert!(if i == 0 { own == kernel } else { model.shares_prefill(kernel, own) }, "{spec}: {own:?}");
        let mut s = Scratch::new();
        model.forward(prompt, &mut c, &mut s, Logits::Last).unwrap();
        alone.push((c, s.logits().to_vec()));
    }
    let mut caches: Vec<SequenceCache> = specs.iter().map(|spec| cache(model, spec, n)).collect();
    let (lead, rest) = caches.split_first_mut().unwrap();
    let mut others: Vec<&mut SequenceCache> = rest.iter_mut().collect();
    let mut s = Scratch::new();
    model.forward_shared(prompt, lead, &mut others, &mut s, Logits::Last).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(s.logits()), bits(&alone[0].1), "logits");
    for ((spec, shared), (own, _)) in specs.iter().zip(&caches).zip(&alone) {
        assert_same_cache(shared, own, spec);
    }
    // the policies really differ: the test would not see a shared mistake otherwise
    let kept = |c: &SequenceCache| {
        (0..c.store().layers()).map(|l| c.store().head(l, 0).positions().to_vec()).collect::<Vec<_>>()
    };
    assert!(alone.iter().skip(1).any(|(c, _)| kept(c) != kept(&alone[0].0)), "policies kept the same set");
}

#[test]
fn a_shared_prefill_leaves_every_cache_as_its_own_prefill_would() {
    let m = stories();
    for n in [17, 64, 150] {
        let prompt = tokens(&m, n);
        assert_shared_prefill_is_exact(&m.model, &prompt, &TILED, PrefillKernel::Tiled);
        assert_shared_prefill_is_exact(&m.model, &prompt, &EVERY_QUERY, PrefillKernel::EveryQuery);
        assert_shared_prefill_is_exact(&m.model, &prompt, &REPEAT, PrefillKernel::Repeat { chunk: 2000 });
        assert_shared_prefill_is_exact(&m.model, &prompt, &REPEAT_PIECES, PrefillKernel::Repeat { chunk: 32 });
    }
}

#[test]
fn sliding_window_layers_share_too() {
    // a Gemma 3 fixture: a 16-token sliding window in layer 0, a global layer 1
    let l = load_model(&shared().join("fixtures/gguf/gemma3/Q8_0.gguf")).unwrap();
    assert!(l.model.config.features.sliding_window.is_some(), "the fixture has sliding-window layers");
    let tok = l.tokenizer.as_ref().unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(5);
    let prompt = tok.encode(&text).unwrap();
    assert!(prompt.len() > 64);
    assert_shared_prefill_is_exact(&l.model, &prompt, &TILED[..6], PrefillKernel::Tiled);
    // Expected Attention reads the layer kind's RoPE tables of the whole
    // run, the probe's rows included, beside a KVzip lead
    if l.model.integer_products() {
        let mixed = [REPEAT_PIECES[0], "full", "h2o:heavy=25%,recent=25%,prefill=expect", TILED[2]];
        assert_shared_prefill_is_exact(&l.model, &prompt, &mixed, PrefillKernel::Repeat { chunk: 32 });
    }
}

/// Tiled policies beside a KVzip lead (`Model::shares_prefill`): where
/// every product is integer (the qwen2 Q8_0 fixture on a CPU with AVX-512
/// VNNI) they share its run, the prompt's rows computed beside the probe's,
/// and every cache, logit and token is still each policy's own; elsewhere
/// `forward_shared` refuses the mix and `generate_shared` runs them apart.
#[test]
fn tiled_policies_share_a_kvzip_run_where_every_product_is_integer() {
    let l = load_model(&shared().join("fixtures/gguf/qwen2/Q8_0.gguf")).unwrap();
    let tok = l.tokenizer.as_ref().unwrap();
    let prompt = tok.encode(&"The quick brown fox jumps over the lazy dog. ".repeat(8)).unwrap();
    assert!(prompt.len() > 64);
    let mixed = [
        REPEAT_PIECES[0],
        "full",
        TILED[2],
        TILED[3],
        "h2o:heavy=25%,recent=25%,prefill=expect",
        TILED[17],
        TILED[15],
        REPEAT_PIECES[1],
    ];
    let m = &l.model;
    if m.integer_products() {
        assert_shared_prefill_is_exact(m, &prompt, &mixed, PrefillKernel::Repeat { chunk: 32 });
    } else {
        let n = prompt.len();
        let (mut a, mut b) = (cache(m, mixed[0], n), cache(m, mixed[1], n));
        let err = m.forward_shared(&prompt, &mut a, &mut [&mut b], &mut Scratch::new(), Logits::Last).unwrap_err();
        assert!(err.to_string().contains("cannot share"), "{err}");
    }
    let opts: Vec<GenerateOptions> = mixed.iter().map(|s| greedy(s, 12)).collect();
    let gens = generate_shared(m, &prompt, &opts, |_, _| true).unwrap();
    for (g, o) in gens.iter().zip(&opts) {
        let alone = generate(m, &prompt, o, |_| true).unwrap();
        assert_eq!(g.token_ids, alone.token_ids, "{}", o.policy);
    }
    // and `generate_shared` plans one run for all of them exactly then
    let kernels: Vec<_> = mixed.iter().map(|s| cache(m, s, prompt.len()).shared_prefill_kernel()).collect();
    let groups = share_groups(&kernels, |lead, member| m.shares_prefill(lead, member));
    assert_eq!(groups.len() == 1, m.integer_products(), "{groups:?}");
}

#[test]
fn caches_that_cannot_share_are_refused() {
    let m = stories();
    let prompt = tokens(&m, 40);
    let n = prompt.len();
    let mut s = Scratch::new();
    // different kernels round differently
    let (mut a, mut b) = (cache(&m.model, TILED[2], n), cache(&m.model, EVERY_QUERY[0], n));
    let err = m.model.forward_shared(&prompt, &mut a, &mut [&mut b], &mut s, Logits::Last).unwrap_err();
    assert!(err.to_string().contains("cannot share"), "{err}");
    assert_eq!(a.next_pos(), 0, "nothing ran");
    // a streamed prefill, a cache that already holds tokens, CHAI
    let stream = cache(&m.model, "h2o:heavy=8,recent=8,prefill=stream:8", n);
    assert_eq!(stream.shared_prefill_kernel(), None);
    let mut used = cache(&m.model, "full", n);
    m.model.forward(&prompt[..3], &mut used, &mut s, Logits::Last).unwrap();
    assert_eq!(used.shared_prefill_kernel(), None);
    let err = m.model.forward_shared(&prompt, &mut a, &mut [&mut used], &mut s, Logits::Last).unwrap_err();
    assert!(err.to_string().contains("cannot share"), "{err}");
}

fn greedy(spec: &str, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 },
        policy: PolicySpec::parse_and_load(spec).unwrap(),
        eos: vec![],
    }
}

#[test]
fn generate_shared_equals_generate_for_every_option() {
    let m = stories();
    let prompt = tokens(&m, 96);
    // both kernels, a policy that cannot share, and a sampled option
    let mut opts: Vec<GenerateOptions> =
        TILED.iter().chain(&EVERY_QUERY).chain(&REPEAT).map(|s| greedy(s, 24)).collect();
    opts.push(greedy("h2o:heavy=8,recent=8,prefill=stream:16", 24));
    let mut sampled = greedy("h2o:heavy=20%,recent=20%", 24);
    sampled.sampling = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 11 };
    opts.push(sampled);
    // one option stops early through its callback
    let stop_at = 5;
    let mut seen = vec![0usize; opts.len()];
    let gens = generate_shared(&m.model, &prompt, &opts, |i, _| {
        seen[i] += 1;
        !(i == 3 && seen[i] == stop_at)
    })
    .unwrap();
    assert_eq!(gens.len(), opts.len());
    for (i, (g, o)) in gens.iter().zip(&opts).enumerate() {
        let mut count = 0;
        let alone = generate(&m.model, &prompt, o, |_| {
            count += 1;
            !(i == 3 && count == stop_at)
        })
        .unwrap();
        assert_eq!(g.token_ids, alone.token_ids, "{}", o.policy);
        assert_eq!(g.stop, alone.stop, "{}", o.policy);
        assert_eq!(g.kv_bytes.kv, alone.kv_bytes.kv, "{}", o.policy);
        assert_eq!(g.prompt_tokens, prompt.len());
    }
    assert_eq!(gens[3].token_ids.len(), stop_at);
}
