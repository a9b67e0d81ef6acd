//! The optimized engine (slot store + SIMD attention + policy) against the
//! f64 reference in `reference/`, step by step: identical kept position
//! sets and scores within 1e-5 relative, for every token policy and every
//! score family (`score=`) with sinks, on random model shapes and on
//! stories260K.

mod reference;

use kvslim_cache::policy::spec::{PrefillMode, TokenPolicySpec};
use kvslim_cache::policy::ScoreRule;
use kvslim_cache::PolicySpec;
use kvslim_engine::sampling::Rng;
use kvslim_engine::Session;
use kvslim_kernels::rope::RopeLayout;
use kvslim_kernels::DType;
use kvslim_models::config::ModelConfig;
use kvslim_models::kvzap::{KvzapMeta, KvzapPredictor};
use kvslim_models::transformer::PROBE_SINKS;
use kvslim_models::{Logits, Model, Trace};
use reference::{ref_ada_shares, ref_pyramid, RefExpect, RefHead, RefPolicy, RefScore, Rule};
use std::path::Path;
mod common;

use common::{stories, tokens};

/// The reference score family of the engine's parsed one.
fn ref_score(rule: ScoreRule) -> RefScore {
    match rule {
        ScoreRule::Sum => RefScore::Sum,
        ScoreRule::Norm => RefScore::Norm,
        ScoreRule::Decay(g) => RefScore::Decay(g as f64),
        ScoreRule::Tova => RefScore::Tova,
        ScoreRule::ValueNorm => RefScore::VNorm,
        ScoreRule::Persist { window, threshold } => RefScore::Persist { window, threshold: threshold as f64 },
    }
}

/// The reference parameters of a parsed spec for a base length.
fn ref_policy(spec: &PolicySpec, base: usize) -> RefPolicy {
    let r = |b: kvslim_cache::policy::Budget| b.resolve(base);
    let plain = RefPolicy {
        budget: None,
        recent: 0,
        sinks: 0,
        rule: Rule::Oldest,
        agg_max: None,
        score: RefScore::Sum,
        observe: None,
        expect: None,
        kvzip: None,
        rkv: None,
    };
    match spec.token {
        TokenPolicySpec::Full => plain,
        TokenPolicySpec::Window { recent, sink } => {
            RefPolicy { budget: Some(r(recent) + r(sink)), recent: r(recent), sinks: r(sink), ..plain }
        }
        TokenPolicySpec::Sink { sink, recent } => {
            RefPolicy { budget: Some(r(sink) + r(recent)), recent: r(recent), sinks: r(sink), ..plain }
        }
        TokenPolicySpec::Heavy { heavy, sink, score } => RefPolicy {
            budget: Some(r(heavy) + r(sink)),
            sinks: r(sink),
            rule: Rule::LowestScore,
            agg_max: Some(false),
            score: ref_score(score),
            ..plain
        },
        TokenPolicySpec::Random { budget, recent, seed, sink } => RefPolicy {
            budget: Some(r(budget) + r(sink)),
            recent: r(recent),
            sinks: r(sink),
            rule: Rule::Random { seed },
            ..plain
        },
        TokenPolicySpec::H2o { heavy, recent, agg, sink, score, prefill, .. } => RefPolicy {
            budget: Some(r(heavy) + r(recent) + r(sink)),
            recent: r(recent),
            sinks: r(sink),
            rule: Rule::LowestScore,
            agg_max: Some(agg == kvslim_cache::ScoreAgg::Max),
            score: ref_score(score),
            observe: match prefill {
                PrefillMode::Snap { window, pool } => Some((window, pool)),
                _ => None,
            },
            // the model's RoPE base is filled in by `compare`
            expect: match prefill {
                PrefillMode::Expect { future } => {
                    Some(RefExpect { future, skip: r(sink), theta: f64::NAN, half_split: true })
                }
                _ => None,
            },
            kvzip: match prefill {
                PrefillMode::Kvzip { chunk } => Some(chunk),
                _ => None,
            },
            rkv: match prefill {
                PrefillMode::Rkv { mass_permille } => Some(mass_permille as f64 / 1000.0),
                _ => None,
            },
        },
    }
}

/// KVzip's probe after `prompt` in pieces of `size` tokens, as its paper
/// lays it out: from the first token after a BOS, each piece of the prompt
/// after the instruction ("Repeat the previous context exactly."; for later
/// pieces "Repeat the part of the previous context exactly, starting
/// with" and the previous piece's last 8 tokens): (lead rows, rows, piece).
fn kvzip_pieces(model: &Model, prompt: &[u32], size: usize) -> Vec<(usize, usize, std::ops::Range<usize>)> {
    let skip = usize::from(model.config.bos_token_id == Some(prompt[0]));
    (skip..prompt.len())
        .step_by(size)
        .map(|start| {
            let lead = match start - skip {
                0 => model.repeat_prompt.len(),
                after => model.repeat_part_prompt.len() + after.min(8),
            };
            let piece = start..(start + size).min(prompt.len());
            (lead, lead + piece.len(), piece)
        })
        .collect()
}

/// The (heads, KV heads) shapes of the property tests.
const SHAPES: [(usize, usize); 6] = [(2, 2), (4, 2), (4, 1), (6, 2), (6, 3), (8, 4)];

/// Runs `cases` property-test cases (random stream `seed`), each a tiny
/// model with one of `shapes` and head dim 4, 8 or 16 (weights from
/// `weights + case`), `prompt.0 + pick(prompt.1)` prompt tokens and
/// `decode.0 + pick(decode.1)` more, under the spec `spec((case,
/// prompt length), pick)`
/// draws: optimized against the reference after every call (`tiled`:
/// and the tiled prefill's kept positions against the traced path's).
fn property_cases(
    (seed, cases, weights): (u64, usize, u64),
    shapes: &[(usize, usize)],
    (prompt, decode): ((usize, u64), (usize, u64)),
    tiled: bool,
    mut spec: impl FnMut((usize, usize), &mut dyn FnMut(u64) -> usize) -> String,
) {
    let mut rng = Rng::new(seed);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    for case in 0..cases {
        let (heads, kv_heads) = shapes[pick(shapes.len() as u64)];
        let head_dim = [4, 8, 16][pick(3)];
        let cfg = tiny_config(heads, kv_heads, head_dim);
        let model = kvslim_engine::synthetic::random_model(cfg, DType::F32, weights + case as u64, 3.0).unwrap();
        let prompt_len = prompt.0 + pick(prompt.1);
        let total = prompt_len + decode.0 + pick(decode.1);
        let tokens: Vec<u32> = (0..total).map(|_| pick(64) as u32).collect();
        let spec = PolicySpec::parse(&spec((case, prompt_len), &mut pick)).unwrap();
        let label = format!("case {case} {spec} H={heads}/{kv_heads} D={head_dim}");
        compare(&model, &spec, &tokens, prompt_len, &label);
        if tiled {
            assert_tiled_keeps_what_traced_keeps(&model, &spec, &tokens[..prompt_len], &label);
        }
    }
}

/// The TinyStories checks of every policy family: (tokens, [(spec, prompt
/// length)]).
const STORIES: [(usize, &[(&str, usize)]); 4] = [
    // token policies
    (
        260,
        &[
            ("h2o:heavy=16,recent=16", 60),
            ("h2o:heavy=8,recent=24,agg=max,prefill=stream:7", 60),
            ("sink:sink=4,recent=28", 60),
            ("heavy:heavy=24", 60),
        ],
    ),
    // score families
    (
        200,
        &[
            ("h2o:heavy=16,recent=16,score=norm", 60),
            ("h2o:heavy=16,recent=16,sink=4,score=decay:0.9", 60),
            ("h2o:heavy=16,recent=16,score=tova,prefill=stream:7", 60),
            ("h2o:heavy=16,recent=16,agg=max,score=vnorm", 60),
            ("h2o:heavy=16,recent=16,score=persist:16", 60),
            ("h2o:heavy=16,recent=16,score=decay:0", 60),
            ("heavy:heavy=24,sink=4,score=tova", 60),
        ],
    ),
    // one-shot prefill scores: expected attention, KVzip, ADAPTIVE_RKV
    (
        200,
        &[
            ("h2o:heavy=24,recent=8,sink=4,prefill=expect", 120),
            ("h2o:heavy=16,recent=16,prefill=expect", 120),
            ("h2o:heavy=24,recent=8,sink=4,prefill=expect:64", 120),
            ("h2o:heavy=24,recent=8,sink=4,prefill=kvzip", 120),
            ("h2o:heavy=24,recent=8,sink=4,prefill=kvzip:32", 120),
            ("h2o:heavy=16,recent=16,prefill=kvzip:16,alloc=ada:0.2", 120),
            ("h2o:heavy=16,recent=16,prefill=kvzip,alloc=ada:0.2", 120),
            ("h2o:heavy=16,recent=16,prefill=kvzip,alloc=global", 120),
            ("h2o:heavy=24,recent=4,sink=4,prefill=kvzip,alloc=global", 120),
            ("h2o:heavy=24,recent=8,sink=4,prefill=rkv", 120),
            ("h2o:heavy=16,recent=16,prefill=rkv:0.5,alloc=ada:0.2", 120),
        ],
    ),
    // budget allocators
    (
        200,
        &[
            ("h2o:heavy=16,recent=16,alloc=pyramid", 60),
            ("h2o:heavy=16,recent=16,alloc=ada", 60),
            ("h2o:heavy=16,recent=16,alloc=ada:0.5", 10),
            ("h2o:heavy=16,recent=16,alloc=global", 60),
            ("h2o:heavy=16,recent=16,alloc=global:0.5", 60),
            ("h2o:heavy=16,recent=16,score=tova,alloc=global", 60),
            ("h2o:heavy=12,recent=12,sink=2,score=norm,alloc=pyramid:0.5/ada", 60),
        ],
    ),
];

/// Every family's specs on the 260K TinyStories model ([`STORIES`]):
/// optimized == reference after every call.
#[test]
fn policies_equal_reference_on_stories260k() {
    let m = stories();
    for (n, cases) in STORIES {
        let ids = tokens(&m, n);
        for &(spec, prompt) in cases {
            let spec = PolicySpec::parse(spec).unwrap();
            compare(&m.model, &spec, &ids, prompt, &format!("stories260K {spec}"));
        }
    }
}

fn tiny_config(heads: usize, kv_heads: usize, head_dim: usize) -> ModelConfig {
    ModelConfig {
        context_len: 1024,
        ..kvslim_engine::synthetic::llama_config(2, 32, 48, heads, kv_heads, head_dim, 64)
    }
}

/// The reference's per-layer heavy slots under the spec's allocator (its
/// written heavy for every layer when uniform), and ada's floor.
fn ref_alloc(spec: &PolicySpec, base: usize, layers: usize) -> (Vec<usize>, Option<f64>) {
    let heavy = match spec.token {
        TokenPolicySpec::H2o { heavy, .. } => heavy.resolve(base),
        _ => 0,
    };
    let alloc = spec.alloc();
    let per_layer = match alloc.pyramid {
        Some(r) => ref_pyramid(heavy, layers, r),
        None => vec![heavy; layers],
    };
    (per_layer, alloc.ada)
}

/// Runs `tokens` through the engine under `spec` (prompt of `prompt_len`,
/// the rest decoded one by one) and the reference on the same q/k/v
/// streams; compares after every forward call. Under `alloc=`, each
/// (layer, KV head) of the reference gets its own budget: pyramid's per
/// layer, and ada's per head once the layer first overflows (decided
/// from every head's candidates, before any evicts); `global`'s per head
/// from every layer's and head's candidates of the first call, before any
/// unit commits.
fn compare(model: &Model, spec: &PolicySpec, tokens: &[u32], prompt_len: usize, label: &str) {
    let c = &model.config;
    let (hd, g) = (c.head_dim, c.group_size());
    // KVzap: the predictor's raw rows, read from its file (the scoring is the reference's)
    let kvzap = spec.kvzap().map(|f| KvzapPredictor::load(Path::new(f.expect("tests name the file"))).unwrap());
    let mut policy = ref_policy(spec, tokens.len());
    if let Some(e) = policy.expect.as_mut() {
        let rope = c.rope.as_ref().expect("expected attention is tested on RoPE models");
        assert_eq!(rope.rotary_dim, hd, "the reference rotates whole heads");
        e.theta = rope.theta as f64;
        e.half_split = rope.layout == RopeLayout::HalfSplit;
    }
    let (layer_heavy, ada) = ref_alloc(spec, tokens.len(), c.n_layers);
    let fixed = policy.recent + policy.sinks;
    let alloc = !spec.alloc().is_uniform();
    let layer_budget: Vec<Option<usize>> =
        layer_heavy.iter().map(|&h| policy.budget.map(|b| if alloc { (fixed + h).max(1) } else { b })).collect();
    let mut policies: Vec<Vec<RefPolicy>> =
        layer_budget.iter().map(|&budget| vec![RefPolicy { budget, ..policy }; c.n_kv_heads]).collect();
    let mut decided = vec![false; c.n_layers];
    // `global`: the first call's candidates of every unit, until the ranking
    let mut global_pending = spec.alloc().global;
    let mut stashed: Vec<Vec<Vec<reference::Slot>>> = Vec::new();
    let mut session = Session::new(model, spec, tokens.len(), tokens.len()).unwrap();
    let mut refs: Vec<Vec<RefHead>> =
        (0..c.n_layers).map(|l| (0..c.n_kv_heads).map(|h| RefHead::new(hd, g, &policy, l, h)).collect()).collect();
    let chunk = match spec.token {
        TokenPolicySpec::H2o { prefill: PrefillMode::Stream(c), .. } => c,
        _ => usize::MAX,
    };
    let mut calls: Vec<&[u32]> = tokens[..prompt_len].chunks(chunk.max(1)).collect();
    calls.extend(tokens[prompt_len..].chunks(1));
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    for (step, part) in calls.iter().enumerate() {
        let p0 = session.position();
        session.scratch.trace = Some(Trace::default());
        session.feed(part, Logits::Last).unwrap();
        let trace = session.scratch.trace.take().unwrap();
        let n = part.len();
        for (l, layer_refs) in refs.iter_mut().enumerate() {
            let [q, k, v] = &trace.qkv[l];
            let tok = |kvh: usize, t: usize| {
                let qs = f64s(&q[t * c.q_dim() + kvh * g * hd..t * c.q_dim() + (kvh + 1) * g * hd]);
                let ks = f64s(&k[t * c.kv_dim() + kvh * hd..t * c.kv_dim() + (kvh + 1) * hd]);
                let vs = f64s(&v[t * c.kv_dim() + kvh * hd..t * c.kv_dim() + (kvh + 1) * hd]);
                ((p0 + t) as u32, qs, ks, vs)
            };
            // ada splits the layer once, when its heads first hold more
            // candidates than the layer's per-head budget
            let mut decide = |cands: &[Vec<reference::Slot>], pols: &mut Vec<RefPolicy>| {
                if let (Some(floor), false, Some(b)) = (ada, decided[l], layer_budget[l]) {
                    if cands[0].len() > b {
                        let shares = ref_ada_shares(layer_heavy[l], floor, &policy, cands);
                        for (p, s) in pols.iter_mut().zip(shares) {
                            p.budget = Some((fixed + s).max(1));
                        }
                        decided[l] = true;
                    }
                }
            };
            if n == 1 {
                for (kvh, r) in layer_refs.iter_mut().enumerate() {
                    let (p, _, ks, vs) = tok(kvh, 0);
                    r.push(p, &ks, &vs);
                }
                let slots: Vec<Vec<reference::Slot>> = layer_refs.iter().map(|r| r.slots.clone()).collect();
                decide(&slots, &mut policies[l]);
                for (kvh, r) in layer_refs.iter_mut().enumerate() {
                    let (p, qs, _, _) = tok(kvh, 0);
                    r.decode_pushed(&policies[l][kvh], p, &qs);
                }
            } else {
                let cands: Vec<Vec<reference::Slot>> = layer_refs
                    .iter()
                    .enumerate()
                    .map(|(kvh, r)| {
                        if let Some(pred) = &kvzap {
                            let x = &trace.hidden[l];
                            let d = c.hidden_size;
                            let scores: Vec<f64> =
                                (0..n).map(|t| ref_kvzap_score(model, pred, l, kvh, &x[t * d..(t + 1) * d])).collect();
                            let chunk: Vec<_> = (0..n).map(|t| tok(kvh, t)).collect();
                            return r.prefill_candidates_given(&chunk, &scores);
                        }
                        if let Some(size) = policy.kvzip {
                            // the trace holds the probe's rows after the prompt's
                            let rows = q.len() / c.q_dim();
                            let chunk: Vec<_> = (0..rows).map(|t| tok(kvh, t)).collect();
                            let pieces = kvzip_pieces(model, part, size);
                            return r.prefill_candidates_repeat(&chunk, n, &pieces, PROBE_SINKS);
                        }
                        let chunk: Vec<_> = (0..n).map(|t| tok(kvh, t)).collect();
                        r.prefill_candidates(&policies[l][kvh], &chunk)
                    })
                    .collect();
                if global_pending {
                    stashed.push(cands);
                    continue;
                }
                decide(&cands, &mut policies[l]);
                for ((kvh, r), cand) in layer_refs.iter_mut().enumerate().zip(cands) {
                    r.prefill_commit(&policies[l][kvh], cand, (p0 + n - 1) as u32);
                }
            }
            check_layer(&session, l, layer_refs, &policy, &format!("{label}: call {step}"));
        }
        if global_pending {
            // one ranking over every unit, past each unit's floor (`global:F`; 0 by
            // default); then each unit commits
            let units: Vec<Vec<reference::Slot>> = stashed.iter().flatten().cloned().collect();
            let shares = ref_ada_shares(layer_heavy[0], spec.alloc().global_floor, &policy, &units);
            for (l, cands) in std::mem::take(&mut stashed).into_iter().enumerate() {
                for (kvh, cand) in cands.into_iter().enumerate() {
                    policies[l][kvh].budget = Some((fixed + shares[l * c.n_kv_heads + kvh]).max(1));
                    refs[l][kvh].prefill_commit(&policies[l][kvh], cand, (p0 + n - 1) as u32);
                }
                check_layer(&session, l, &mut refs[l], &policy, &format!("{label}: call {step}, global"));
            }
            global_pending = false;
        }
    }
}

/// The engine's layer `l` against the reference's heads after a call:
/// within its budget, the same kept positions, and the same scores where
/// they are maxima (sums are compared through the kept sets).
fn check_layer(session: &Session<'_>, l: usize, layer_refs: &mut [RefHead], policy: &RefPolicy, label: &str) {
    {
        {
            for (kvh, r) in layer_refs.iter_mut().enumerate() {
                let head = session.cache.store().head(l, kvh);
                if let Some(b) = session.cache.policy().head_budget(l, kvh) {
                    assert!(head.len() <= b, "{label} layer {l} kv head {kvh} holds {} > {b}", head.len());
                }
                let mut got: Vec<(u32, f32)> =
                    head.positions().iter().copied().zip(head.scores().iter().copied()).collect();
                got.sort_by_key(|x| x.0);
                let want = r.kept();
                let gp: Vec<u32> = got.iter().map(|x| x.0).collect();
                let wp: Vec<u32> = want.iter().map(|x| x.0).collect();
                assert_eq!(gp, wp, "{label} layer {l} kv head {kvh}: kept positions differ");
                if policy.agg_max.is_some() {
                    for ((p, a), (_, b)) in got.iter().zip(&want) {
                        let tol = 1e-5 * b.abs() + 1e-6;
                        assert!(
                            ((*a as f64) - b).abs() <= tol,
                            "{label} layer {l} kvh {kvh} pos {p}: score {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

/// Property test: random shapes, budgets, prefill sizes, chunk sizes and
/// policies; optimized == reference.
#[test]
fn token_policies_equal_reference() {
    property_cases((2024, 28, 0), &SHAPES, ((2, 40), (20, 60)), false, |(case, _), pick| {
        let b = 2 + pick(20);
        let r = 1 + pick(b as u64 - 1);
        match case % 8 {
            0 => format!("h2o:heavy={},recent={r}", b - r),
            1 => format!("h2o:heavy={},recent={r},agg=max", b - r),
            2 => format!("h2o:heavy={},recent={r},prefill=stream:{}", b - r, 1 + pick(12)),
            3 => format!("heavy:heavy={b}"),
            4 => format!("window:recent={b}"),
            5 => format!("sink:sink={},recent={r}", 1 + pick(4)),
            6 => format!("random:budget={b},recent={},seed={}", r - 1, pick(1000)),
            _ => format!("h2o:heavy=20%,recent=15%,agg={}", ["sum", "max"][pick(2)]),
        }
    });
}

/// The score families (`score=` on h2o and heavy) and `sink=` on every
/// evicting family: random shapes, budgets, prompts (one chunk or
/// streamed), aggregations; optimized == reference after every call.
#[test]
fn score_families_equal_reference() {
    property_cases((77, 30, 100), &SHAPES, ((2, 40), (20, 60)), false, |(case, _), pick| {
        let b = 2 + pick(20);
        let r = 1 + pick(b as u64 - 1);
        let score = match case % 6 {
            0 => "norm".to_string(),
            1 => format!("decay:{}", [0.5, 0.9, 0.99][pick(3)]),
            2 => "tova".to_string(),
            3 => "vnorm".to_string(),
            4 => format!("persist:{}", 1 + pick(24)),
            _ => format!("persist:{}:{}", 2 + pick(12), [0.5, 2.0][pick(2)]),
        };
        let agg = ["sum", "max"][pick(2)];
        let sink = pick(4);
        match case % 5 {
            0 | 1 => format!("h2o:heavy={},recent={r},agg={agg},sink={sink},score={score}", b - r),
            2 => format!("h2o:heavy={},recent={r},prefill=stream:{},score={score}", b - r, 1 + pick(12)),
            3 => format!("heavy:heavy={b},sink={sink},score={score}"),
            _ => match case % 3 {
                0 => format!("window:recent={r},sink={}", 1 + sink),
                1 => format!("random:budget={b},recent={},seed={},sink={sink}", r - 1, pick(1000)),
                _ => format!("h2o:heavy=20%,recent=15%,sink=2,score={score}"),
            },
        }
    });
}

/// SnapKV prefill (`prefill=snap:W:K`): only the prompt's last W queries
/// score it, max-pooled over K positions; then decode as H2O. Optimized ==
/// reference after every call (traced, so the query-by-query path), and
/// the tiled kernel with its observation pass keeps the same positions.
#[test]
fn snapkv_prefill_equals_reference() {
    let shapes = [(2, 2), (4, 2), (4, 1), (6, 3), (8, 4)];
    property_cases((4242, 16, 300), &shapes, ((8, 60), (10, 30)), true, |(_, prompt_len), pick| {
        let b = 2 + pick(20);
        let r = 1 + pick(b as u64 - 1);
        let (w, k) = (1 + pick(prompt_len as u64), [1, 3, 7][pick(3)]);
        let agg = ["sum", "max"][pick(2)];
        let score = ["sum", "norm", "vnorm"][pick(3)];
        format!("h2o:heavy={},recent={r},agg={agg},prefill=snap:{w}:{k},score={score}", b - r)
    });
    let m = stories();
    let ids = tokens(&m, 200);
    // Max-pooling gives neighbours exactly equal scores; the decode steps
    // after it then rank them by differences at f32 rounding level, which
    // an f64 reference cannot reproduce. So pooled specs are compared on
    // the prompt, unpooled ones (K = 1) on prompt and decode steps.
    for (spec, decode) in [
        ("h2o:heavy=16,recent=16,prefill=snap:16:1", true),
        ("h2o:heavy=24,recent=8,sink=2,prefill=snap:32:1,score=norm", true),
        ("h2o:heavy=24,recent=8,sink=4,prefill=snap:32:1,score=vnorm", true),
        ("h2o:heavy=16,recent=16,prefill=snap:16", false),
        ("h2o:heavy=24,recent=8,sink=2,prefill=snap:32:3,score=norm", false),
        ("h2o:heavy=24,recent=8,sink=4,prefill=snap:32,score=vnorm", false),
        // one chunk, every query scoring: vnorm's column sums times ‖v‖ in
        // the tiled kernel keep what query-by-query updates keep
        ("h2o:heavy=24,recent=8,sink=4,score=vnorm", false),
    ] {
        let spec = PolicySpec::parse(spec).unwrap();
        let tokens = if decode { &ids[..] } else { &ids[..120] };
        compare(&m.model, &spec, tokens, 120, &format!("stories260K {spec}"));
        assert_tiled_keeps_what_traced_keeps(&m.model, &spec, &ids[..120], &format!("stories260K {spec}"));
    }
}

/// Expected attention (`prefill=expect:F`): the prompt scored by its query
/// distribution through the averaged future rotation, then decode steps
/// as H2O; random shapes, sinks, max aggregation, score=norm; and the
/// 260K TinyStories model.
#[test]
fn expected_attention_prefill_equals_reference() {
    h2o_prefill_cases((5151, 16, 700), |pick| {
        let score = ["sum", "norm"][pick(2)];
        let future = [1, 16, 512][pick(3)];
        format!("score={score},prefill=expect:{future}")
    });
}

/// [`property_cases`] on random shapes (tiled too) of H2O with sinks and
/// either aggregation, each spec ending with `rest`'s options (which draws
/// them after the budget's).
fn h2o_prefill_cases(seeds: (u64, usize, u64), rest: impl Fn(&mut dyn FnMut(u64) -> usize) -> String) {
    let shapes = [(2, 2), (4, 2), (4, 1), (6, 3), (8, 4)];
    property_cases(seeds, &shapes, ((8, 60), (10, 30)), true, |_, pick| {
        let b = 4 + pick(20);
        let r = 1 + pick(b as u64 / 2);
        let sink = pick(3);
        let agg = ["sum", "max"][pick(2)];
        format!("h2o:heavy={},recent={r},sink={sink},agg={agg},{}", b - r, rest(pick))
    });
}

/// KVzip-style prefill (`prefill=kvzip[:C]`): the prompt fed again after
/// itself piece by piece, teacher-forced; every prompt token scored by the
/// most attention a repeat query of a piece that sees it (any head of its
/// group) paid it; the repeat rows leave; then decode steps as H2O. Random
/// shapes with sinks, max aggregation, score=norm and one or several
/// pieces (TinyStories, with ada's per-head budgets: [`STORIES`]).
#[test]
fn kvzip_prefill_equals_reference() {
    h2o_prefill_cases((6161, 16, 900), |pick| {
        format!("score={},prefill=kvzip{}", ["sum", "norm"][pick(2)], ["", ":16", ":40"][pick(3)])
    });
}

/// The KVzap score of one token in f64, written out from its definition:
/// the layer's input hidden state `x` through the attention RMSNorm
/// (x_i / √(mean x² + ε) · w_i), then bias + weights · x̂, then
/// exp(min(·, 0)).
fn ref_kvzap_score(model: &Model, pred: &KvzapPredictor, layer: usize, kv: usize, x: &[f32]) -> f64 {
    let c = &model.config;
    assert_eq!(c.norm, kvslim_models::config::NormKind::Rms, "the reference normalises by RMS");
    let w = &model.weights.layers[layer].attn_norm.weight;
    let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + c.norm_eps as f64).sqrt();
    let d = c.hidden_size;
    let row =
        &pred.weights[(layer * pred.meta.kv_heads + kv) * (d + 1)..(layer * pred.meta.kv_heads + kv + 1) * (d + 1)];
    let mut y = row[0] as f64;
    for i in 0..d {
        y += row[i + 1] as f64 * (x[i] as f64 * inv * w[i] as f64);
    }
    y.min(0.0).exp()
}

/// A predictor for `model` with seeded random rows (bias −4 ± 1, weights
/// ±`spread`), saved to `path`.
fn random_kvzap(model: &Model, seed: u64, spread: f32, path: &Path) {
    let c = &model.config;
    let mut rng = Rng::new(seed);
    let mut u = || (rng.next_u64() >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0;
    let per = c.hidden_size + 1;
    let weights =
        (0..c.n_layers * c.n_kv_heads * per).map(|i| if i % per == 0 { -4.0 + u() } else { spread * u() }).collect();
    let meta = KvzapMeta {
        kind: kvslim_models::kvzap::KVZAP_KIND.into(),
        model: model.fingerprint(),
        layers: c.n_layers,
        kv_heads: c.n_kv_heads,
        hidden: c.hidden_size,
        eps: 1e-6,
        calibration: serde_json::Value::Null,
        quality: serde_json::Value::Null,
    };
    KvzapPredictor { meta, weights }.save(path).unwrap();
}

/// KVzap-style prefill (`prefill=kvzap:FILE`): each prompt token scored by
/// the predictor from its normalised hidden state (per layer and KV head),
/// no attention, then decode steps as H2O; uniform, `ada` and `global`
/// budgets, sinks, max aggregation and score=norm, on stories260K and on
/// random shapes; optimized == reference after every call, and the tiled
/// prefill keeps what the traced one keeps.
#[test]
fn kvzap_prefill_equals_reference() {
    let dir = std::env::temp_dir().join(format!("kvslim-kvzap-ref-{}", std::process::id()));
    let m = stories();
    let file = dir.join("stories.kvzap");
    random_kvzap(&m.model, 31, 0.3, &file);
    let f = file.display();
    let ids = tokens(&m, 200);
    for spec in [
        format!("h2o:heavy=24,recent=8,sink=4,prefill=kvzap:{f}"),
        format!("h2o:heavy=16,recent=16,agg=max,score=norm,prefill=kvzap:{f}"),
        format!("h2o:heavy=16,recent=16,prefill=kvzap:{f},alloc=global"),
        format!("h2o:heavy=24,recent=4,sink=4,prefill=kvzap:{f},alloc=global"),
        format!("h2o:heavy=24,recent=4,prefill=kvzap:{f},alloc=global:0.25"),
        format!("h2o:heavy=16,recent=16,prefill=kvzap:{f},alloc=ada:0.2"),
    ] {
        let spec = PolicySpec::parse(&spec).unwrap();
        compare(&m.model, &spec, &ids, 120, &format!("stories260K {spec}"));
        assert_tiled_keeps_what_traced_keeps(&m.model, &spec, &ids[..120], &format!("stories260K {spec}"));
    }
    let mut rng = Rng::new(8181);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    for case in 0..12 {
        let (heads, kv_heads) = SHAPES[pick(SHAPES.len() as u64)];
        let cfg = tiny_config(heads, kv_heads, [4, 8, 16][pick(3)]);
        let model = kvslim_engine::synthetic::random_model(cfg, DType::F32, 1300 + case, 3.0).unwrap();
        let file = dir.join(format!("case{case}.kvzap"));
        random_kvzap(&model, case, 0.5, &file);
        let prompt_len = 8 + pick(60);
        let total = prompt_len + 10 + pick(30);
        let tokens: Vec<u32> = (0..total).map(|_| pick(64) as u32).collect();
        let b = 4 + pick(20);
        let r = 1 + pick(b as u64 / 2);
        let alloc = ["", ",alloc=global", ",alloc=ada:0.2"][pick(3)];
        let text = format!(
            "h2o:heavy={},recent={r},sink={},agg={},prefill=kvzap:{}{alloc}",
            b - r,
            pick(3),
            ["sum", "max"][pick(2)],
            file.display()
        );
        let spec = PolicySpec::parse(&text).unwrap();
        compare(&model, &spec, &tokens, prompt_len, &format!("case {case} {spec} H={heads}/{kv_heads}"));
        assert_tiled_keeps_what_traced_keeps(&model, &spec, &tokens[..prompt_len], &format!("case {case}"));
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// ADAPTIVE_RKV-style prefill (`prefill=rkv:P`): the prompt scored by
/// every query as plain H2O; the top tokens holding P of the attention mass
/// rank first, the rest by key diversity; then decode steps as H2O. Random
/// shapes with sinks, max aggregation and several mass shares (TinyStories,
/// with ada's per-head budgets: [`STORIES`]), and on TinyStories the budget
/// really fills by diversity (kept prompt tokens scored below 2).
#[test]
fn rkv_prefill_equals_reference() {
    h2o_prefill_cases((7171, 16, 1100), |pick| format!("prefill=rkv:{}", ["0.5", "0.7", "0.9", "1"][pick(4)]));
    let m = stories();
    let ids = tokens(&m, 120);
    let spec = PolicySpec::parse("h2o:heavy=24,recent=8,sink=4,prefill=rkv").unwrap();
    let mut s = Session::new(&m.model, &spec, ids.len(), ids.len()).unwrap();
    s.feed(&ids, Logits::Last).unwrap();
    let store = s.cache.store();
    let filled = (0..store.layers())
        .flat_map(|l| (0..m.model.config.n_kv_heads).map(move |h| (l, h)))
        .any(|(l, h)| store.head(l, h).scores().iter().any(|&x| x < 2.0));
    assert!(filled, "no head filled its budget by diversity");
}

/// The prompt's kept positions per KV head of layer 0 with and without a
/// trace (query-by-query path vs tiled kernel + observation pass). Only
/// layer 0: the two kernels' attention outputs differ by rounding, so
/// deeper layers see slightly different inputs and may break near-ties
/// differently; layer 0 sees the same q, k, v in both and must agree.
fn assert_tiled_keeps_what_traced_keeps(model: &Model, spec: &PolicySpec, prompt: &[u32], label: &str) {
    let kept = |trace: bool| {
        let mut s = Session::new(model, spec, prompt.len(), prompt.len()).unwrap();
        if trace {
            s.scratch.trace = Some(Trace::default());
        }
        s.feed(prompt, Logits::Last).unwrap();
        let mut all = Vec::new();
        for h in 0..model.config.n_kv_heads {
            let mut p = s.cache.store().head(0, h).positions().to_vec();
            p.sort();
            all.push(p);
        }
        all
    };
    assert_eq!(kept(false), kept(true), "{label}: tiled + observation pass vs query by query");
}

/// Budget allocators (`alloc=` on h2o): PyramidKV's per-layer heavy slots
/// and AdaKV's per-head shares, alone and together, with score families,
/// sinks, max aggregation and streamed prefill; random shapes (prompts
/// shorter and longer than the budget, so ada decides in prefill or at
/// the first decode step that overflows); optimized == reference after
/// every call, and the total budget is the plain spec's.
#[test]
fn allocators_equal_reference() {
    let mut rng = Rng::new(1414);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    let mut uneven = [0; 2];
    for case in 0..30 {
        let (heads, kv_heads) = [(2, 2), (4, 2), (4, 1), (6, 2), (6, 3), (8, 4)][pick(6)];
        let head_dim = [4, 8, 16][pick(3)];
        let layers = 2 + pick(4);
        let cfg = ModelConfig {
            context_len: 1024,
            ..kvslim_engine::synthetic::llama_config(layers, 32, 48, heads, kv_heads, head_dim, 64)
        };
        let model = kvslim_engine::synthetic::random_model(cfg, DType::F32, 500 + case as u64, 3.0).unwrap();
        let prompt_len = 2 + pick(50);
        let total = prompt_len + 20 + pick(60);
        let tokens: Vec<u32> = (0..total).map(|_| pick(64) as u32).collect();
        let heavy = 1 + pick(16);
        let recent = 1 + pick(8);
        let alloc = match case % 3 {
            0 => format!("pyramid:{}", [0.1, 0.25, 0.5, 1.0][pick(4)]),
            1 => format!("ada:{}", [0.0, 0.2, 0.5, 1.0][pick(4)]),
            _ => format!("pyramid:{}/ada:{}", [0.2, 0.5][pick(2)], [0.0, 0.3][pick(2)]),
        };
        let extra = match pick(5) {
            0 => ",agg=max".to_string(),
            1 => format!(",sink={}", 1 + pick(3)),
            2 => format!(",prefill=stream:{}", 1 + pick(12)),
            3 => format!(",score={}", ["norm", "decay:0.9", "tova", "vnorm", "persist:8"][pick(5)]),
            _ => String::new(),
        };
        let text = format!("h2o:heavy={heavy},recent={recent}{extra},alloc={alloc}");
        let spec = PolicySpec::parse(&text).unwrap();
        let label = format!("case {case} {spec} L={layers} H={heads}/{kv_heads} D={head_dim}");
        compare(&model, &spec, &tokens, prompt_len, &label);
        // the total budget is the plain spec's: Σ over layers and KV heads
        let mut session = Session::new(&model, &spec, tokens.len(), tokens.len()).unwrap();
        session.feed(&tokens, Logits::Last).unwrap();
        let plain = PolicySpec::parse(&text[..text.find(",alloc").unwrap()]).unwrap().budget(tokens.len()).unwrap();
        let held: usize = (0..layers)
            .flat_map(|l| (0..kv_heads).map(move |h| (l, h)))
            .map(|(l, h)| session.cache.policy().head_budget(l, h).unwrap())
            .sum();
        assert_eq!(held, plain * layers * kv_heads, "{label}: total budget");
        // the allocators really move slots: between layers, between heads
        let b = |l, h| session.cache.policy().head_budget(l, h).unwrap();
        uneven[0] += usize::from(b(0, 0) != b(layers - 1, 0));
        uneven[1] += usize::from((0..layers).any(|l| (0..kv_heads).any(|h| b(l, h) != b(l, 0))));
    }
    assert!(uneven[0] >= 5 && uneven[1] >= 5, "layers, heads with different budgets: {uneven:?}");
}
