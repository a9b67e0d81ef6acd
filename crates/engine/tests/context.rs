//! Compressed contexts ([`Context`]): a context saved to bytes and loaded
//! back answers bit for bit as the in-memory one, under `full`, H2O, H2O
//! with the KVzip-style prefill, random eviction (its RNG streams travel),
//! AdaKV's per-head shares, paged storage and q8/q4 rows; the context
//! itself is never changed by its questions; and every kind of bad file
//! (truncated, corrupted, another model, another version) is an error
//! naming the problem.

use kvslim_cache::PolicySpec;
use kvslim_engine::context::{Context, FORMAT_VERSION, MAGIC};
use kvslim_engine::{GenerateOptions, SamplingParams};
use kvslim_kernels::DType;
use kvslim_models::config::ModelConfig;
use kvslim_models::Model;
mod common;

const VOCAB: usize = 48;

fn model(seed: u64) -> Model {
    let cfg = ModelConfig { context_len: 512, ..kvslim_engine::synthetic::llama_config(3, 32, 48, 4, 2, 8, VOCAB) };
    kvslim_engine::synthetic::random_model(cfg, DType::F32, seed, 3.0).unwrap()
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + salt * 13 + i * i) % VOCAB as u32).collect()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, sampling: SamplingParams::default(), policy: PolicySpec::full(), eos: vec![] }
}

/// Every answer and the last logits of each question, bit for bit.
fn answers(m: &Model, ctx: &Context, questions: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<u32>)> {
    questions
        .iter()
        .map(|q| {
            let (_, logits) = ctx.ask(m, q, 12).unwrap();
            let g = ctx.generate(m, q, &greedy(12), |_| true).unwrap();
            (g.token_ids, logits.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

const POLICIES: [&str; 11] = [
    "full",
    "full:kv_dtype=q8",
    "h2o:heavy=12,recent=12",
    "h2o:heavy=25%,recent=12.5%,prefill=kvzip",
    "h2o:heavy=10,recent=10,page=8",
    "h2o:heavy=10,recent=10,kv_dtype=q4,page=8",
    "random:budget=20,seed=3",
    "h2o:heavy=8,recent=8,alloc=ada:0.2",
    "h2o:heavy=12.5%,recent=12.5%,prefill=snap:8",
    "h2o:heavy=12.5%,recent=12.5%,prefill=kvzip,alloc=global",
    "h2o:heavy=10,recent=4,alloc=global,page=8",
];

#[test]
fn saved_contexts_answer_bit_for_bit_as_in_memory() {
    let m = model(1);
    let ctx_tokens = tokens(96, 1);
    let questions = vec![tokens(5, 2), tokens(9, 3), tokens(1, 4)];
    for spec in POLICIES {
        let policy = PolicySpec::parse_and_load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let ctx = Context::compress(&m, &policy, &ctx_tokens).unwrap();
        let before = ctx.cache().store().kept_positions();
        let in_memory = answers(&m, &ctx, &questions);
        assert_eq!(ctx.cache().store().kept_positions(), before, "{spec}: questions must not change the context");
        let bytes = ctx.to_bytes().unwrap();
        let loaded = Context::from_bytes(&m, &bytes).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(loaded.tokens(), ctx.tokens());
        assert_eq!(loaded.cache().store().kept_positions(), before, "{spec}");
        assert_eq!(loaded.cache().store().kept_scores(), ctx.cache().store().kept_scores(), "{spec}");
        assert_eq!(answers(&m, &loaded, &questions), in_memory, "{spec}: loaded context answers differently");
        assert_eq!(loaded.to_bytes().unwrap(), bytes, "{spec}: a loaded context saves to the same bytes");
    }
}

/// A question on a fork equals the same tokens fed to a fresh cache that
/// took the context and then the question one decode step at a time, so
/// `niah_multiquery` and the CLI's `--context` share one definition.
#[test]
fn a_question_continues_the_prefill_as_decode_steps() {
    let m = model(2);
    let c = tokens(64, 5);
    let q = tokens(6, 6);
    let policy = PolicySpec::parse("h2o:heavy=10,recent=10").unwrap();
    let ctx = Context::compress(&m, &policy, &c).unwrap();
    let (_, logits) = ctx.ask(&m, &q, 4).unwrap();
    let mut s = kvslim_engine::Session::new(&m, &policy, c.len() + q.len() + 4, c.len()).unwrap();
    s.feed(&c, kvslim_models::Logits::Last).unwrap();
    for &t in &q[..q.len() - 1] {
        s.feed(&[t], kvslim_models::Logits::None).unwrap();
    }
    let want = s.feed(&q[q.len() - 1..], kvslim_models::Logits::Last).unwrap();
    assert_eq!(logits, want);
}

/// Under `full` the question goes in as one chunk: the same logits as
/// decode steps up to rounding.
#[test]
fn a_full_context_takes_the_question_in_one_chunk() {
    let m = model(7);
    let (c, q) = (tokens(64, 5), tokens(9, 6));
    let ctx = Context::compress(&m, &PolicySpec::full(), &c).unwrap();
    let (_, logits) = ctx.ask(&m, &q, 4).unwrap();
    let mut s = kvslim_engine::Session::new(&m, &PolicySpec::full(), c.len() + q.len(), c.len()).unwrap();
    s.feed(&c, kvslim_models::Logits::Last).unwrap();
    for &t in &q[..q.len() - 1] {
        s.feed(&[t], kvslim_models::Logits::None).unwrap();
    }
    let steps = s.feed(&q[q.len() - 1..], kvslim_models::Logits::Last).unwrap();
    let worst = logits.iter().zip(steps).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-3, "chunk vs decode steps differ by {worst}");
    assert_eq!(ctx.cache().next_pos(), c.len(), "the context itself is unchanged");
}

#[test]
fn the_kept_bytes_follow_the_budget() {
    let m = model(3);
    let c = tokens(256, 7);
    let full = Context::compress(&m, &PolicySpec::parse("full:kv_dtype=f16").unwrap(), &c).unwrap();
    let kept =
        Context::compress(&m, &PolicySpec::parse("h2o:heavy=6.25%,recent=6.25%,kv_dtype=f16").unwrap(), &c).unwrap();
    assert_eq!(full.kv_bytes().kv, full.kv_bytes_full());
    let (k, f) = (kept.to_bytes().unwrap().len(), full.to_bytes().unwrap().len());
    assert!(k * 100 <= f * 16, "a 12.5% context's file is {k} bytes against the full one's {f}");
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let m = model(4);
    let ctx = Context::compress(&m, &PolicySpec::parse("h2o:heavy=10,recent=10").unwrap(), &tokens(40, 1)).unwrap();
    let good = ctx.to_bytes().unwrap();
    let err = |bytes: &[u8]| Context::from_bytes(&m, bytes).err().expect("refused").to_string();
    assert!(err(&good[..good.len() / 2]).contains("truncated"));
    assert!(err(&good[..10]).contains("truncated"));
    assert!(err(b"not a context at all").contains("magic"));
    let mut flipped = good.clone();
    let at = flipped.len() - 40;
    flipped[at] ^= 0x10;
    assert!(err(&flipped).contains("checksum"));
    let mut version = good.clone();
    version[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(err(&version).contains("format version"));
    let other = model(5);
    let foreign = Context::from_bytes(&other, &good).err().expect("another model").to_string();
    assert!(foreign.contains("made with model"), "{foreign}");
    assert!(ctx.ask(&other, &[1, 2], 4).is_err(), "a fork refuses another model too");
    assert_eq!(&good[..8], MAGIC);
}

#[test]
fn chai_contexts_work_in_memory_but_refuse_to_save() {
    let m = model(6);
    let plan = common::chai_plan("context", 4, &[2; 3]);
    let spec = PolicySpec::parse_and_load(&format!("h2o:heavy=10,recent=10+chai:plan={plan},probe=5")).unwrap();
    let ctx = Context::compress(&m, &spec, &tokens(40, 2)).unwrap();
    ctx.ask(&m, &[3, 4], 4).unwrap();
    let e = ctx.to_bytes().expect_err("CHAI cannot be saved yet").to_string();
    assert!(e.contains("CHAI"), "{e}");
}

/// `auto` compressing a context becomes the context rows' choice for the
/// model (here: no rows of its own and no KVzap predictor, so the default
/// context rows), the context keeps and saves that spec, and the cache is
/// the one that spec builds.
#[test]
fn auto_compresses_a_context_under_the_context_rows_choice() {
    use kvslim_cache::policy::auto::{choose, AutoUse};
    let m = model(7);
    let c = tokens(64, 3);
    let auto = PolicySpec::parse("auto:budget=25%").unwrap();
    let ctx = Context::compress(&m, &auto, &c).unwrap();
    let want = auto.for_context(Some(&m.auto_key()), c.len(), false);
    assert_eq!(ctx.policy(), &want);
    assert!(ctx.policy().auto.is_none() && ctx.policy().budget(c.len()) == Some(16));
    let row = choose(Some(&m.auto_key()), 25.0, AutoUse::Context, false);
    assert_eq!((row.model, row.usage), ("*", AutoUse::Context));
    // the row's winner ran as a budget family: its 16 slots split as the evaluation split them
    let family = kvslim_cache::policy::PolicyFamily::parse(row.family.expect("a measured family")).unwrap();
    assert_eq!(want, family.at(16).unwrap());
    if let Some(a) = row.alloc {
        assert!(ctx.policy().to_string().contains(&format!("alloc={a}")), "{}", ctx.policy());
    }
    let direct = Context::compress(&m, &want, &c).unwrap();
    assert_eq!(ctx.to_bytes().unwrap(), direct.to_bytes().unwrap(), "the same cache as the resolved spec's");
    let loaded = Context::from_bytes(&m, &ctx.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.policy(), &want);
}

/// A context's questions under every policy, answered together in
/// lockstep (`Context::answer_each`: one pass over the weights per step),
/// equal each one answered alone, token for token, with the same stop and
/// the same kept bytes: questions of different lengths, a sampled option,
/// an option stopping at an EOS id, and a CHAI context (its probe runs
/// token by token beside the batch).
#[test]
fn questions_answered_in_lockstep_equal_each_alone() {
    let m = model(7);
    let doc = tokens(96, 5);
    let plan = common::chai_plan("lockstep", 4, &[2; 3]);
    let mut specs: Vec<PolicySpec> = POLICIES.iter().map(|s| PolicySpec::parse_and_load(s).unwrap()).collect();
    specs.push(PolicySpec::parse_and_load(&format!("h2o:heavy=10,recent=10+chai:plan={plan},probe=5")).unwrap());
    let contexts = Context::compress_each(&m, &specs, &doc).unwrap();
    let questions: Vec<Vec<u32>> = vec![vec![3], tokens(7, 1), tokens(12, 9)];
    let mut sampled = greedy(10);
    sampled.sampling = SamplingParams { temperature: 0.9, top_k: 20, top_p: 0.9, seed: 5 };
    let mut stopping = greedy(12);
    stopping.eos = vec![1, 2, 3];
    let options = [greedy(12), sampled, stopping];
    let mut asks = Vec::new();
    for (c, ctx) in contexts.iter().enumerate() {
        for (k, q) in questions.iter().enumerate() {
            asks.push((ctx, &q[..], &options[(c + k) % options.len()]));
        }
    }
    let together = Context::answer_each(&m, &asks).unwrap();
    assert_eq!(together.len(), asks.len());
    for ((ctx, q, o), g) in asks.iter().zip(&together) {
        let alone = ctx.generate(&m, q, o, |_| true).unwrap();
        let what = format!("{} question of {} tokens", ctx.policy(), q.len());
        assert_eq!(g.token_ids, alone.token_ids, "{what}");
        assert_eq!(g.stop, alone.stop, "{what}");
        assert_eq!(g.kv_bytes.kv, alone.kv_bytes.kv, "{what}");
        assert_eq!(g.prompt_tokens, alone.prompt_tokens, "{what}");
    }
    assert!(
        together.iter().any(|g| g.stop == kvslim_engine::generate::StopReason::Eos),
        "some answer stopped at an EOS id"
    );
}
