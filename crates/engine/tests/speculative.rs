//! Speculative decoding: greedy equivalence with plain decoding under every
//! policy, bit-exact verification, and no trace of rejected drafts.

use kvslim_cache::PolicySpec;
use kvslim_engine::speculative::{
    replay_drafts, speculative_run, CopyThenModel, DraftLength, Drafter, ModelDrafter, NgramDrafter, Verification,
};
use kvslim_engine::{generate, GenerateOptions, SamplingParams, Session};
use kvslim_models::{load_model, Logits, Model, Scratch};
mod common;

use common::{assert_same_cache, chai_plan, shared};

struct Loaded {
    model: Model,
    tok: kvslim_models::tokenizer::Tokenizer,
}

fn stories() -> Loaded {
    let l = load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap();
    Loaded { model: l.model, tok: l.tokenizer.expect("stories260K ships a tokenizer") }
}

const SNIPPETS: [&str; 10] = [
    "Once upon a time, there was a little girl named Lily.",
    "One day, a boy named Tom went to the park with his mom.",
    "The cat sat on the mat. The cat was happy. The cat",
    "Lily and Ben were friends. They liked to play with the ball.",
    "There was a big red ball in the garden.",
    "Tim had a toy car. He loved his toy car very much.",
    "The sun was shining and the birds were singing.",
    "Mom said, \"Do not touch the hot stove.\"",
    "A little dog named Max found a bone under the tree.",
    "Sue wanted to bake a cake for her friend.",
];

fn opts(policy: &str, max_tokens: usize, eos: Vec<u32>) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 },
        policy: PolicySpec::parse_and_load(policy).unwrap(),
        eos,
    }
}

#[test]
fn forward_sequential_is_bit_identical_to_decode_steps() {
    let l = stories();
    let m = &l.model;
    let plan = chai_plan("spec", m.config.n_heads, &vec![3; m.config.n_layers]);
    let prompt = l.tok.encode(SNIPPETS[0]).unwrap();
    let more: Vec<u32> = (0..20).map(|i| ((i * 37 + 11) % m.config.vocab_size) as u32).collect();
    for spec in
        ["full", "h2o:heavy=4,recent=4", "sink:sink=2,recent=6", &format!("h2o:heavy=4,recent=4+chai:plan={plan}")]
    {
        let policy = PolicySpec::parse_and_load(spec).unwrap();
        let mut a = Session::new(m, &policy, 64, prompt.len()).unwrap();
        a.feed(&prompt, Logits::Last).unwrap();
        let mut b_cache = a.cache.clone();
        let mut b_scratch = Scratch::new();
        let mut want = Vec::new();
        for &t in &more {
            want.extend_from_slice(a.feed(&[t], Logits::Last).unwrap());
        }
        m.forward_sequential(&more, &mut b_cache, &mut b_scratch).unwrap();
        let got = b_scratch.logits();
        assert_eq!(got.len(), want.len(), "{spec}");
        assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{spec}: logits differ");
        assert_same_cache(&a.cache, &b_cache, spec);
    }
}

/// The policies speculative decoding is checked under: full, two token
/// policies and one composed with online CHAI.
fn policies(m: &Model) -> [String; 4] {
    let plan = chai_plan("spec", m.config.n_heads, &vec![3; m.config.n_layers]);
    [
        "full".to_string(),
        "h2o:heavy=8,recent=8".into(),
        "sink:sink=4,recent=12".into(),
        format!("h2o:heavy=8,recent=8+chai:plan={plan}"),
    ]
}

#[test]
fn speculative_greedy_equals_plain_greedy() {
    let l = stories();
    let m = &l.model;
    let specs = policies(m);
    let max_tokens = 40;
    for spec in &specs {
        for (pi, text) in SNIPPETS.iter().enumerate() {
            let prompt = l.tok.encode(text).unwrap();
            let o = opts(spec, max_tokens, l.tok.eos.clone());
            let plain = generate(m, &prompt, &o, |_| true).unwrap();
            for k in 1..=5 {
                let mut drafters: Vec<(&str, Box<dyn Drafter>)> = vec![
                    ("ngram", Box::new(NgramDrafter::default())),
                    ("self", Box::new(ModelDrafter::new(m, o.policy.clone(), prompt.len() + max_tokens))),
                ];
                if (pi + k) % 2 == 1 {
                    drafters.pop();
                }
                for (name, d) in drafters.iter_mut() {
                    let s = speculative_run(m, &prompt, &o, d.as_mut(), k, Verification::Exact, |_| true).unwrap();
                    assert_eq!(s.generation.token_ids, plain.token_ids, "{spec} prompt {pi} k {k} {name}");
                    assert_eq!(s.generation.stop, plain.stop, "{spec} prompt {pi} k {k} {name}");
                    if *name == "self" {
                        assert!(s.stats.accepted > 0, "self-draft should accept: {spec} {pi} {k}");
                    }
                }
            }
        }
    }
}

/// The default, fast verification (one GEMM per matrix over the chunk):
/// greedy outputs still equal plain greedy decoding on every test prompt,
/// policy and draft length (rounding could flip a near tie; none does here).
#[test]
fn fast_verification_equals_plain_greedy_on_the_test_prompts() {
    let l = stories();
    let m = &l.model;
    let specs = policies(m);
    let (mut runs, mut differing) = (0, Vec::new());
    for spec in &specs {
        for (pi, text) in SNIPPETS.iter().enumerate() {
            let prompt = l.tok.encode(text).unwrap();
            let o = opts(spec, 40, l.tok.eos.clone());
            let plain = generate(m, &prompt, &o, |_| true).unwrap();
            for k in 1..=5 {
                let s = speculative_run(m, &prompt, &o, &mut NgramDrafter::default(), k, Verification::Fast, |_| true)
                    .unwrap();
                runs += 1;
                if s.generation.token_ids != plain.token_ids {
                    differing.push(format!("{spec} prompt {pi} k {k}"));
                }
            }
        }
    }
    assert!(runs >= 40);
    assert!(differing.is_empty(), "{} of {runs} runs differ: {differing:?}", differing.len());
}

/// `forward_verify` runs the same rules as `forward_sequential` with GEMM
/// products: logits agree to rounding and the policy keeps the same slots.
#[test]
fn forward_verify_agrees_with_forward_sequential_to_rounding() {
    let l = stories();
    let m = &l.model;
    let ids = l.tok.encode(SNIPPETS[0]).unwrap();
    for spec in ["full", "h2o:heavy=4,recent=4"] {
        let spec = PolicySpec::parse_and_load(spec).unwrap();
        let (split, n) = (ids.len() / 2, ids.len());
        let mut a = m.new_cache(&spec, n, n).unwrap();
        let mut b = m.new_cache(&spec, n, n).unwrap();
        let (mut sa, mut sb) = (Scratch::new(), Scratch::new());
        m.forward(&ids[..split], &mut a, &mut sa, Logits::Last).unwrap();
        m.forward(&ids[..split], &mut b, &mut sb, Logits::Last).unwrap();
        m.forward_sequential(&ids[split..], &mut a, &mut sa).unwrap();
        m.forward_verify(&ids[split..], &mut b, &mut sb).unwrap();
        let worst = sa.logits().iter().zip(sb.logits()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-3, "{spec}: max |Δ logit| {worst}");
        assert_eq!(a.store().kept_positions(), b.store().kept_positions(), "{spec}: same kept slots");
    }
}

/// Proposes the token after the true greedy one: every draft is rejected.
struct WrongDrafter {
    prompt_len: usize,
    truth: Vec<u32>,
    vocab: u32,
}

impl Drafter for WrongDrafter {
    fn draft(&mut self, context: &[u32], k: usize) -> kvslim_engine::Result<Vec<u32>> {
        let i = context.len() - self.prompt_len;
        let bad = (self.truth[i] + 1) % self.vocab;
        Ok(vec![bad; k])
    }
}

#[test]
fn rejected_drafts_leave_no_trace() {
    let l = stories();
    let m = &l.model;
    let plan = chai_plan("spec", m.config.n_heads, &vec![3; m.config.n_layers]);
    let n = 30;
    for spec in [
        "full".to_string(),
        "h2o:heavy=8,recent=8".into(),
        "sink:sink=4,recent=12".into(),
        format!("h2o:heavy=8,recent=8+chai:plan={plan}"),
    ] {
        let prompt = l.tok.encode(SNIPPETS[2]).unwrap();
        let o = opts(&spec, n, Vec::new());
        let plain = generate(m, &prompt, &o, |_| true).unwrap();
        assert_eq!(plain.token_ids.len(), n);
        // plain decoding's cache: the prompt, then every token but the last
        let mut s = Session::new(m, &o.policy, prompt.len() + n, prompt.len()).unwrap();
        s.feed(&prompt, Logits::Last).unwrap();
        for &t in &plain.token_ids[..n - 1] {
            s.feed(&[t], Logits::Last).unwrap();
        }
        for k in [1, 3, 5] {
            let mut d = WrongDrafter {
                prompt_len: prompt.len(),
                truth: plain.token_ids.clone(),
                vocab: m.config.vocab_size as u32,
            };
            let r = speculative_run(m, &prompt, &o, &mut d, k, Verification::Exact, |_| true).unwrap();
            assert_eq!(r.generation.token_ids, plain.token_ids, "{spec} k {k}");
            assert_eq!(r.stats.accepted, 0);
            assert!(r.stats.drafted > 0);
            assert_same_cache(&s.cache, &r.cache, &format!("{spec} k {k}"));
            assert_eq!(r.generation.kv_bytes, plain.kv_bytes);
        }
    }
}

/// The reproduction from the issue tracker: n-gram drafts of 2–5 under H2O
/// once diverged from plain greedy decoding at the 14th token, because
/// rolling rejected drafts back by cutting the cache kept the attention
/// they had added to the kept slots' scores.
#[test]
fn ngram_drafts_under_h2o_match_plain_greedy_on_the_reported_prompt() {
    let l = stories();
    let m = &l.model;
    let prompt = l.tok.encode("Tom had a red ball and").unwrap();
    let o = opts("h2o:heavy=8,recent=8", 24, l.tok.eos.clone());
    let plain = generate(m, &prompt, &o, |_| true).unwrap();
    for k in 1..=6 {
        let s =
            speculative_run(m, &prompt, &o, &mut NgramDrafter::default(), k, Verification::Exact, |_| true).unwrap();
        assert_eq!(s.generation.token_ids, plain.token_ids, "draft length {k}");
    }
}

/// SplitMix64: a seeded stream for the randomized search below.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Knows plain greedy's output and proposes a random-length piece of it,
/// corrupted at a random place half of the time and replaced by random
/// tokens now and then: every acceptance length from none to all occurs.
struct PerturbedOracle {
    prompt_len: usize,
    truth: Vec<u32>,
    vocab: usize,
    rng: Stream,
}

impl Drafter for PerturbedOracle {
    fn draft(&mut self, context: &[u32], k: usize) -> kvslim_engine::Result<Vec<u32>> {
        let i = context.len() - self.prompt_len;
        let n = self.rng.below(k + 1);
        let mut d: Vec<u32> = self.truth[i..(i + n).min(self.truth.len())].to_vec();
        if !d.is_empty() && self.rng.below(2) == 0 {
            let at = self.rng.below(d.len());
            d[at] = (d[at] + 1 + self.rng.below(self.vocab - 1) as u32) % self.vocab as u32;
        }
        if self.rng.below(8) == 0 {
            d = (0..n).map(|_| self.rng.below(self.vocab) as u32).collect();
        }
        Ok(d)
    }
}

/// A randomized search for divergence: every policy family (scores,
/// aggregations, prefill modes, allocators, pages, quantized K/V, CHAI) ×
/// draft lengths 1–6 × random token streams and story prompts, drafts that
/// are accepted in part at random places. Speculative decoding must give
/// plain greedy's tokens and leave the cache bit-identical to plain
/// decoding's (same slots, positions, scores, K/V).
#[test]
fn randomized_search_finds_no_divergence_under_any_policy() {
    let l = stories();
    let m = &l.model;
    let plan = chai_plan("spec", m.config.n_heads, &vec![3; m.config.n_layers]);
    let specs = [
        "full".to_string(),
        "full:page=4".into(),
        "full:kv_dtype=q8".into(),
        "window:recent=12".into(),
        "window:recent=10,sink=2".into(),
        "sink:sink=4,recent=12".into(),
        "heavy:heavy=12".into(),
        "heavy:heavy=10,sink=2,score=tova".into(),
        "random:budget=16,recent=4,seed=3".into(),
        "h2o:heavy=8,recent=8".into(),
        "h2o:heavy=6,recent=6,agg=max".into(),
        "h2o:heavy=8,recent=8,prefill=snap:4".into(),
        "h2o:heavy=8,recent=8,prefill=stream:4".into(),
        "h2o:heavy=6,recent=6,score=norm".into(),
        "h2o:heavy=6,recent=6,score=decay:0.9".into(),
        "h2o:heavy=6,recent=6,agg=max,score=tova".into(),
        "h2o:heavy=6,recent=6,score=vnorm".into(),
        "h2o:heavy=6,recent=6,score=persist:4".into(),
        "h2o:heavy=20%,recent=20%,sink=2".into(),
        "h2o:heavy=8,recent=8,page=4".into(),
        "h2o:heavy=8,recent=8,kv_dtype=q8".into(),
        "h2o:heavy=8,recent=8,alloc=pyramid:0.5".into(),
        "h2o:heavy=8,recent=8,alloc=ada:0.2".into(),
        format!("h2o:heavy=8,recent=8+chai:plan={plan}"),
    ];
    let vocab = m.config.vocab_size;
    let mut rng = Stream(0x5EED);
    let mut prompts: Vec<Vec<u32>> = SNIPPETS[..4].iter().map(|t| l.tok.encode(t).unwrap()).collect();
    for _ in 0..4 {
        let len = 2 + rng.below(20);
        // ids 0–2 are <unk>, BOS and EOS; the rest are ordinary pieces
        let mut p = vec![1u32];
        p.extend((0..len).map(|_| (3 + rng.below(vocab - 3)) as u32));
        prompts.push(p);
    }
    let n = 36;
    let (mut runs, mut partial) = (0usize, 0usize);
    for spec in &specs {
        // a scoring policy returns to the last accepted token without a
        // replay; random eviction (RNG state), pages, CHAI and the pass in
        // which `ada` first splits a layer replay
        let replays_expected = ["random", "page=", "chai", "ada"].iter().any(|w| spec.contains(w));
        let o = opts(spec, n, Vec::new());
        let mut spec_replays = 0;
        for (pi, prompt) in prompts.iter().enumerate() {
            let plain = generate(m, prompt, &o, |_| true).unwrap();
            let mut s = Session::new(m, &o.policy, prompt.len() + n, prompt.len()).unwrap();
            s.feed(prompt, Logits::Last).unwrap();
            for &t in &plain.token_ids[..n - 1] {
                s.feed(&[t], Logits::Last).unwrap();
            }
            for k in 1..=6 {
                let what = format!("{spec} prompt {pi} draft length {k}");
                let mut d = PerturbedOracle {
                    prompt_len: prompt.len(),
                    truth: plain.token_ids.clone(),
                    vocab,
                    rng: Stream(rng.next()),
                };
                let r = speculative_run(m, prompt, &o, &mut d, k, Verification::Exact, |_| true).unwrap();
                assert_eq!(r.generation.token_ids, plain.token_ids, "{what}");
                assert_same_cache(&s.cache, &r.cache, &what);
                if !replays_expected {
                    assert_eq!(r.stats.replays, 0, "{what}: no replays");
                }
                spec_replays += r.stats.replays;
                runs += 1;
                partial += usize::from(r.stats.accepted > 0 && r.stats.accepted < r.stats.drafted);
            }
            // the adaptive draft length (backing off to plain steps) too
            let mut d = PerturbedOracle {
                prompt_len: prompt.len(),
                truth: plain.token_ids.clone(),
                vocab,
                rng: Stream(rng.next()),
            };
            let adaptive = DraftLength::Adaptive { max: 6 };
            let r = speculative_run(m, prompt, &o, &mut d, adaptive, Verification::Auto, |_| true).unwrap();
            let what = format!("{spec} prompt {pi} adaptive");
            assert_eq!(r.generation.token_ids, plain.token_ids, "{what}");
            assert_same_cache(&s.cache, &r.cache, &what);
        }
        if spec.starts_with("random") {
            assert!(spec_replays > 0, "{spec}: rejected passes replay");
        }
    }
    assert_eq!(runs, specs.len() * prompts.len() * 6);
    assert!(partial * 2 > runs, "most runs should accept some drafts and reject others ({partial} of {runs})");
}

/// On a quantized model whose matrices all take integer products, the
/// default verification (`Auto`) is the batched one, and it is a decode
/// step's arithmetic: `forward_verify` gives `forward_sequential`'s logits
/// and cache bit for bit, so speculative decoding reads the weights once
/// per pass and still equals plain greedy decoding (under full and H2O,
/// drafts accepted in part). Where the CPU has no integer path, `Auto` is
/// the token-by-token verification.
#[test]
fn auto_verification_is_batched_and_exact_on_integer_products() {
    let l = load_model(&shared().join("fixtures/gguf/qwen2/Q8_0.gguf")).unwrap();
    let m = &l.model;
    let int8 = m.weights.matrices().iter().all(|w| w.products() == kvslim_kernels::Products::Int8);
    let resolved = Verification::Auto.resolve(m);
    assert_eq!(resolved == Verification::Fast, int8, "Auto is Fast exactly when every product is integer");
    let vocab = m.config.vocab_size;
    let mut rng = Stream(11);
    for spec in ["full", "h2o:heavy=6,recent=6", "h2o:heavy=20%,recent=20%,score=tova,agg=max"] {
        let policy = PolicySpec::parse(spec).unwrap();
        for trial in 0..4 {
            let prompt: Vec<u32> = (0..(4 + rng.below(12))).map(|_| rng.below(vocab) as u32).collect();
            let more: Vec<u32> = (0..6).map(|_| rng.below(vocab) as u32).collect();
            if resolved == Verification::Fast {
                let mut a = m.new_cache(&policy, 64, 64).unwrap();
                let (mut sa, mut sb) = (Scratch::new(), Scratch::new());
                m.forward(&prompt, &mut a, &mut sa, Logits::Last).unwrap();
                let mut b = a.clone();
                m.forward_sequential(&more, &mut a, &mut sa).unwrap();
                m.forward_verify(&more, &mut b, &mut sb).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(sa.logits()), bits(sb.logits()), "{spec} trial {trial}: logits");
                assert_same_cache(&a, &b, &format!("{spec} trial {trial}"));
            }
            let o = opts(spec, 24, Vec::new());
            let plain = generate(m, &prompt, &o, |_| true).unwrap();
            let mut d = PerturbedOracle {
                prompt_len: prompt.len(),
                truth: plain.token_ids.clone(),
                vocab,
                rng: Stream(rng.next()),
            };
            let r =
                speculative_run(m, &prompt, &o, &mut d, DraftLength::default(), Verification::Auto, |_| true).unwrap();
            assert_eq!(r.generation.token_ids, plain.token_ids, "{spec} trial {trial}");
        }
    }
}

/// A separate draft model with the target's tokenizer (the same tiny Qwen2
/// quantized Q4_K_M drafting for its Q8_0 self, `--draft-model`): greedy's
/// tokens under full and H2O, with the drafter under the target's policy
/// or its own, alone or behind the n-gram copier, and drafts accepted.
/// The drafter keeps its accepted drafts' K/V between passes; a wrong
/// rollback there would feed it a wrong context and its drafts would stop
/// being accepted, so acceptance is asserted too.
#[test]
fn a_draft_model_gives_greedy_tokens_under_full_and_h2o() {
    let target = load_model(&shared().join("fixtures/gguf/qwen2/Q8_0.gguf")).unwrap().model;
    let draft = load_model(&shared().join("fixtures/gguf/qwen2/Q4_K_M.gguf")).unwrap().model;
    let vocab = target.config.vocab_size;
    let mut rng = Stream(23);
    let (mut drafted, mut accepted) = (0, 0);
    for spec in ["full", "h2o:heavy=6,recent=6"] {
        let o = opts(spec, 24, Vec::new());
        for (trial, draft_policy) in ["same", "window:recent=16", "h2o:heavy=4,recent=4"].iter().enumerate() {
            let draft_policy =
                if *draft_policy == "same" { o.policy.clone() } else { PolicySpec::parse(draft_policy).unwrap() };
            let prompt: Vec<u32> = (0..(6 + rng.below(10))).map(|_| rng.below(vocab) as u32).collect();
            let plain = generate(&target, &prompt, &o, |_| true).unwrap();
            let max_len = prompt.len() + o.max_tokens;
            for k in [DraftLength::Fixed(1), DraftLength::Fixed(3), DraftLength::default()] {
                let alone = ModelDrafter::new(&draft, draft_policy.clone(), max_len);
                let behind_copier = CopyThenModel::new(ModelDrafter::new(&draft, draft_policy.clone(), max_len));
                let drafters: [(&str, Box<dyn Drafter>); 2] =
                    [("model", Box::new(alone)), ("copy+model", Box::new(behind_copier))];
                for (name, mut d) in drafters {
                    let r = speculative_run(&target, &prompt, &o, d.as_mut(), k, Verification::Auto, |_| true).unwrap();
                    let what = format!("{spec}, trial {trial}, {k:?}, {name}");
                    assert_eq!(r.generation.token_ids, plain.token_ids, "{what}");
                    drafted += r.stats.drafted;
                    accepted += r.stats.accepted;
                }
            }
        }
    }
    assert!(accepted * 2 > drafted, "the Q4_K_M drafter should mostly agree with Q8_0: {accepted} of {drafted}");
}

/// A draft model keeps its accepted drafts' K/V between calls, exactly:
/// across random acceptances (none, some, all) its drafts are those of a
/// fresh session fed the same committed tokens in the same pieces (each
/// call's catch-up chunk, then the accepted drafts one step each), under
/// policies whose undo is a cut (`full`), the journal (H2O, TOVA) or a
/// copy (paged). Under `full` the pieces do not matter, and a drafter
/// started afresh on the whole context agrees too.
#[test]
fn a_draft_model_keeps_exactly_the_accepted_drafts() {
    let l = load_model(&shared().join("fixtures/gguf/qwen2/Q8_0.gguf")).unwrap();
    let m = &l.model;
    let vocab = m.config.vocab_size;
    let mut rng = Stream(5);
    let max_len = 64;
    for spec in ["full", "full:page=4", "h2o:heavy=6,recent=6", "h2o:heavy=6,recent=6,score=tova"] {
        let policy = PolicySpec::parse(spec).unwrap();
        let mut context: Vec<u32> = (0..8).map(|_| rng.below(vocab) as u32).collect();
        let mut kept = ModelDrafter::new(m, policy.clone(), max_len);
        // the committed tokens in the pieces the drafter fed them
        let mut pieces: Vec<Vec<u32>> = Vec::new();
        let mut committed = 0;
        let mut calls = 0;
        while context.len() + 6 < max_len {
            let k = 1 + rng.below(4);
            let drafts = kept.draft(&context, k).unwrap();
            let what = format!("{spec}: context of {} tokens, k {k}", context.len());
            let mut reference =
                Session::new(m, &policy, max_len, pieces.first().map_or(context.len(), Vec::len)).unwrap();
            for p in &pieces {
                reference.feed(p, Logits::Last).unwrap();
            }
            let catch_up = context[committed..].to_vec();
            let mut want = vec![kvslim_engine::sampling::argmax(reference.feed(&catch_up, Logits::Last).unwrap())];
            while want.len() < k {
                let next =
                    kvslim_engine::sampling::argmax(reference.feed(&[*want.last().unwrap()], Logits::Last).unwrap());
                want.push(next);
            }
            assert_eq!(drafts, want, "{what}");
            if spec == "full" {
                let fresh = ModelDrafter::new(m, policy.clone(), max_len).draft(&context, k).unwrap();
                assert_eq!(drafts, fresh, "{what}: a fresh drafter");
            }
            let accepted = rng.below(drafts.len() + 1);
            pieces.push(catch_up);
            let stepped = accepted.min(k - 1);
            pieces.extend(drafts[..stepped].iter().map(|&d| vec![d]));
            committed = context.len() + stepped;
            context.extend_from_slice(&drafts[..accepted]);
            let target = drafts.get(accepted).map_or(rng.below(vocab) as u32, |d| (d + 1) % vocab as u32);
            context.push(target);
            calls += 1;
        }
        assert!(calls >= 8, "{spec}: {calls} calls");
    }
}

/// The target drafting for itself under `full`: its drafts are its own
/// greedy continuation, so (up to the chunked catch-up's rounding) every
/// draft is accepted, which holds only if the drafter's cache kept exactly
/// the accepted drafts from one pass to the next.
#[test]
fn a_model_drafting_for_itself_is_accepted_almost_always() {
    let l = stories();
    let m = &l.model;
    let o = opts("full", 40, Vec::new());
    let (mut drafted, mut accepted) = (0, 0);
    for text in SNIPPETS {
        let prompt = l.tok.encode(text).unwrap();
        let mut d = ModelDrafter::new(m, o.policy.clone(), prompt.len() + o.max_tokens);
        let r = speculative_run(m, &prompt, &o, &mut d, 4, Verification::Exact, |_| true).unwrap();
        drafted += r.stats.drafted;
        accepted += r.stats.accepted;
    }
    assert!(accepted as f64 >= 0.95 * drafted as f64, "{accepted} of {drafted} self-drafts accepted");
}

/// `replay_drafts` on a recorded greedy answer gives a real run's
/// statistics (greedy output does not depend on the drafter), so drafter
/// work can be measured offline.
#[test]
fn replaying_drafts_on_the_greedy_answer_gives_the_run_statistics() {
    let l = stories();
    let m = &l.model;
    for (spec, text) in [("full", SNIPPETS[0]), ("h2o:heavy=8,recent=8", SNIPPETS[1]), ("full", SNIPPETS[2])] {
        let prompt = l.tok.encode(text).unwrap();
        let o = opts(spec, 48, Vec::new());
        let plain = generate(m, &prompt, &o, |_| true).unwrap();
        for k in [DraftLength::Fixed(3), DraftLength::default()] {
            let run =
                speculative_run(m, &prompt, &o, &mut NgramDrafter::default(), k, Verification::Auto, |_| true).unwrap();
            let mut passes = 0;
            let replay =
                replay_drafts(&mut NgramDrafter::default(), &prompt, &plain.token_ids, k, |_, _, _| passes += 1)
                    .unwrap();
            assert_eq!(replay, run.stats, "{spec} {k:?}");
            assert_eq!(passes, run.stats.target_passes);
            assert!(run.stats.accepted > 0, "{spec} {k:?}: the test needs accepted drafts");
        }
    }
}
