//! Beam search: exactness against brute force under `full`, beam
//! reordering under `h2o` against per-beam solo runs (with a deliberately
//! broken reordering that the check must catch), and the paged default
//! that lets beams share the prompt's KV: same hypotheses as fixed slots,
//! the prompt's pages held once.

use kvslim_cache::{KvDtype, PagePool};
use kvslim_cache::{PolicySpec, SequenceCache};
use kvslim_engine::beam::{beam_search_in, beam_search_with, log_softmax, BeamStorage, ForkFn, BEAM_PAGE_SIZE};
use kvslim_engine::{beam_search, BeamOptions, Hypothesis, Session};
use kvslim_kernels::DType;
use kvslim_models::config::ModelConfig;
use kvslim_models::{Logits, Model};
mod common;

use common::{shared, test_file};

const VOCAB: usize = 6;
const EOS: u32 = 0;

fn tiny_model(seed: u64) -> Model {
    let head_dim = 8;
    let cfg =
        ModelConfig { context_len: 64, ..kvslim_engine::synthetic::llama_config(2, 32, 48, 4, 2, head_dim, VOCAB) };
    // a large output gain makes the next-token distributions peaky, so the
    // best sequence is not the greedy one by accident of uniformity
    kvslim_engine::synthetic::random_model(cfg, DType::F32, seed, 3.0).unwrap()
}

/// Log-prob of `seq` after `prompt` from one independent full forward.
fn forward_logprob(model: &Model, prompt: &[u32], seq: &[u32]) -> f64 {
    let all: Vec<u32> = prompt.iter().chain(seq).copied().collect();
    let mut s = Session::new(model, &PolicySpec::full(), all.len(), all.len()).unwrap();
    let logits = s.feed(&all, Logits::All).unwrap().to_vec();
    let v = model.config.vocab_size;
    seq.iter()
        .enumerate()
        .map(|(j, &t)| {
            let row = prompt.len() - 1 + j;
            log_softmax(&logits[row * v..(row + 1) * v])[t as usize]
        })
        .sum()
}

/// Every hypothesis of at most `max` tokens: non-EOS tokens then EOS, or
/// `max` non-EOS tokens. Returns (generated tokens, EOS-ended).
fn all_hypotheses(max: usize, with_eos: bool) -> Vec<(Vec<u32>, bool)> {
    if !with_eos {
        let mut all: Vec<Vec<u32>> = vec![vec![]];
        for _ in 0..max {
            all = all.iter().flat_map(|p| (0..VOCAB as u32).map(move |t| [p.clone(), vec![t]].concat())).collect();
        }
        return all.into_iter().map(|s| (s, false)).collect();
    }
    let mut out = Vec::new();
    let mut prefixes: Vec<Vec<u32>> = vec![vec![]];
    for len in 0..=max {
        for p in &prefixes {
            if len < max {
                out.push((p.clone(), true));
            } else {
                out.push((p.clone(), false));
            }
        }
        if len < max {
            prefixes = prefixes
                .iter()
                .flat_map(|p| {
                    (1..VOCAB as u32).map(move |t| {
                        let mut q = p.clone();
                        q.push(t);
                        q
                    })
                })
                .collect();
        }
    }
    out
}

fn opts(beams: usize, max_tokens: usize, alpha: f32, policy: &str, eos: Vec<u32>) -> BeamOptions {
    BeamOptions {
        beams,
        max_tokens,
        length_penalty: alpha,
        early_stopping: true,
        policy: PolicySpec::parse_and_load(policy).unwrap(),
        eos,
        keep_caches: true,
    }
}

#[test]
fn beam_search_with_full_matches_brute_force() {
    const MAX: usize = 4;
    let mut beats_greedy = false;
    for (seed, with_eos) in [(1u64, true), (2, true), (3, true), (4, false), (5, false), (6, false)] {
        let hyps = all_hypotheses(MAX, with_eos);
        assert_eq!(hyps.len(), if with_eos { 1 + 5 + 25 + 125 + 625 } else { 1296 });
        let eos = if with_eos { vec![EOS] } else { vec![] };
        let model = tiny_model(seed);
        let prompt = [3u32, 1, 4];
        // exact log-probs of every hypothesis, EOS included when it ends one
        let exact: Vec<(Vec<u32>, bool, f64)> = hyps
            .iter()
            .map(|(seq, eos)| {
                let mut full = seq.clone();
                if *eos {
                    full.push(EOS);
                }
                (seq.clone(), *eos, forward_logprob(&model, &prompt, &full))
            })
            .collect();
        let total: f64 = exact.iter().map(|e| e.2.exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "hypotheses cover the whole distribution: {total}");
        for alpha in [0.0f32, 1.0, -0.5] {
            let score = |seq: &[u32], lp: f64| lp / (seq.len().max(1) as f64).powf(alpha as f64);
            let best = exact.iter().max_by(|a, b| score(&a.0, a.2).total_cmp(&score(&b.0, b.2))).unwrap();
            // 6^3 beams hold every live prefix (at most 6^3), so the search is exhaustive
            let out = beam_search(&model, &prompt, &opts(216, MAX, alpha, "full", eos.clone())).unwrap();
            let top = &out[0];
            assert_eq!((&top.token_ids, top.eos), (&best.0, best.1), "seed {seed} alpha {alpha}");
            assert!((top.logprob - best.2).abs() < 1e-4, "seed {seed}: {} vs {}", top.logprob, best.2);
            assert!((top.score - score(&best.0, best.2)).abs() < 1e-4);
            let greedy = beam_search(&model, &prompt, &opts(1, MAX, alpha, "full", eos.clone())).unwrap();
            beats_greedy |= greedy[0].token_ids != best.0;
            // fewer beams: whatever comes back is scored with its true log-prob
            for beams in [1usize, 2, 3, 5] {
                let out = beam_search(&model, &prompt, &opts(beams, MAX, alpha, "full", eos.clone())).unwrap();
                assert!(!out.is_empty() && out.len() <= beams);
                for h in &out {
                    let truth = exact.iter().find(|e| e.0 == h.token_ids && e.1 == h.eos).unwrap().2;
                    assert!((h.logprob - truth).abs() < 1e-4, "beams {beams}: {} vs {truth}", h.logprob);
                    assert!((h.score - score(&h.token_ids, truth)).abs() < 1e-4);
                    // the brute force scores by prefill (GEMM) and the search by
                    // decode steps (GEMV): the same sums in another order
                    assert!(h.score <= score(&best.0, best.2) + 1e-6);
                }
                assert!(out.windows(2).all(|w| w[0].score >= w[1].score));
                // the early-stopping bound is exact: running on changes nothing
                let o = BeamOptions { early_stopping: false, ..opts(beams, MAX, alpha, "full", eos.clone()) };
                let late = beam_search(&model, &prompt, &o).unwrap();
                assert_eq!(late[0].token_ids, out[0].token_ids, "beams {beams}");
            }
        }
    }
    assert!(beats_greedy, "some case where the best sequence is not the greedy one");
}

/// Per (layer, KV head): kept (position, score) pairs sorted by position.
fn kept(cache: &SequenceCache) -> Vec<Vec<(u32, f32)>> {
    let st = &cache.store();
    let mut out = Vec::new();
    for l in 0..st.layers() {
        for h in 0..st.kv_heads() {
            let hs = st.head(l, h);
            let mut v: Vec<(u32, f32)> = hs.positions().iter().copied().zip(hs.scores().iter().copied()).collect();
            v.sort_by_key(|e| e.0);
            out.push(v);
        }
    }
    out
}

/// The hypothesis replayed alone: prompt, then one decode step per token.
/// Returns its log-prob and the cache after its first `fed` tokens.
fn solo(model: &Model, prompt: &[u32], h: &Hypothesis, o: &BeamOptions) -> (f64, SequenceCache) {
    let mut s = Session::new(model, &o.policy, prompt.len() + o.max_tokens, prompt.len()).unwrap();
    let mut next = log_softmax(s.feed(prompt, Logits::Last).unwrap());
    let mut lp = 0.0;
    for (j, &t) in h.token_ids.iter().enumerate() {
        lp += next[t as usize];
        if j < h.fed {
            next = log_softmax(s.feed(&[t], Logits::Last).unwrap());
        }
    }
    (lp, s.cache)
}

/// True when the hypothesis differs from its solo replay.
fn differs(model: &Model, prompt: &[u32], h: &Hypothesis, o: &BeamOptions) -> bool {
    let (lp, cache) = solo(model, prompt, h, o);
    let mine = kept(h.cache.as_ref().unwrap());
    let theirs = kept(&cache);
    let same_sets = mine.len() == theirs.len()
        && mine
            .iter()
            .zip(&theirs)
            .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() <= 1e-5));
    (lp - h.logprob).abs() > 1e-4 || !same_sets
}

#[test]
fn beam_reordering_moves_scores_with_kv_under_h2o() {
    let m = kvslim_models::load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let prompt = tok.encode("Once upon a time, there was a little girl named Lily. She").unwrap();
    let o = opts(4, 16, 1.0, "h2o:heavy=2,recent=2", vec![]);
    let out = beam_search(&m.model, &prompt, &o).unwrap();
    assert_eq!(out.len(), 4);
    for (i, h) in out.iter().enumerate() {
        assert_eq!(h.fed + 1, h.token_ids.len());
        let (lp, cache) = solo(&m.model, &prompt, h, &o);
        assert!((lp - h.logprob).abs() < 1e-4, "beam {i}: {} vs solo {lp}", h.logprob);
        assert_eq!(cache.next_pos(), h.cache.as_ref().unwrap().next_pos());
        assert!(!differs(&m.model, &prompt, h, &o), "beam {i} matches its solo run");
    }
    // the classic bug: the beam slot takes its parent's KV but keeps the
    // scores of the beam that held the slot before
    let mut broken = |parent: &SequenceCache, previous: &SequenceCache| {
        let mut c = parent.clone();
        for l in 0..c.store().layers() {
            for h in 0..c.store().kv_heads() {
                let old = previous.store().head(l, h).scores();
                let new = c.scores_mut_for_fault_injection(l, h);
                let n = old.len().min(new.len());
                new[..n].copy_from_slice(&old[..n]);
            }
        }
        c
    };
    let fork: &mut ForkFn<'_> = &mut broken;
    let bad = beam_search_with(&m.model, &prompt, &o, Some(fork)).unwrap();
    let caught = bad.iter().filter(|h| differs(&m.model, &prompt, h, &o)).count();
    assert!(caught >= 1, "the broken reordering must differ from solo runs for some beam");
    // and the correct rule through the same hook matches
    let mut right = |parent: &SequenceCache, _: &SequenceCache| parent.clone();
    let fork: &mut ForkFn<'_> = &mut right;
    let good = beam_search_with(&m.model, &prompt, &o, Some(fork)).unwrap();
    assert!(good.iter().all(|h| !differs(&m.model, &prompt, h, &o)));
    assert_eq!(
        good.iter().map(|h| &h.token_ids).collect::<Vec<_>>(),
        out.iter().map(|h| &h.token_ids).collect::<Vec<_>>()
    );
}

/// Tokens, log-prob and score bits, EOS flag of every hypothesis.
fn fingerprint(hyps: &[Hypothesis]) -> Vec<(Vec<u32>, u64, u64, bool)> {
    hyps.iter().map(|h| (h.token_ids.clone(), h.logprob.to_bits(), h.score.to_bits(), h.eos)).collect()
}

#[test]
fn paged_beams_match_fixed_slots_and_hold_the_prompt_once() {
    let m = kvslim_models::load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let c = &m.model.config;
    let units = c.n_layers * c.n_kv_heads;
    let prompt =
        tok.encode("Once upon a time, there was a little girl named Lily. She liked to play with her").unwrap();
    let beams = 4;
    // (policy, prompt tokens kept after prefill)
    for (policy, kept) in
        [("full", prompt.len()), ("h2o:heavy=10,recent=10", 20), ("h2o:heavy=6,recent=12,agg=max", 18)]
    {
        assert!(prompt.len() >= kept && kept % BEAM_PAGE_SIZE != 0, "{policy}: the prompt needs a partial tail page");
        let o = opts(beams, 12, 1.0, policy, tok.eos.clone());
        let fixed =
            beam_search_in(&m.model, &prompt, &o, BeamStorage { as_specified: true, pool: None }, None).unwrap();
        assert!(
            fixed[0].cache.as_ref().unwrap().store().page_counts().is_none(),
            "{policy}: as specified = fixed slots"
        );
        let default = beam_search(&m.model, &prompt, &o).unwrap();
        let cache = default[0].cache.as_ref().unwrap();
        assert_eq!(cache.store().head(0, 0).page_size(), Some(BEAM_PAGE_SIZE), "{policy}: paged by default");
        assert_eq!(fingerprint(&default), fingerprint(&fixed), "{policy}: default paging vs fixed slots");
        let o4 = opts(beams, 12, 1.0, &format!("{policy},page=4").replace("full,", "full:"), tok.eos.clone());
        let page4 = beam_search(&m.model, &prompt, &o4).unwrap();
        assert_eq!(
            page4[0].cache.as_ref().unwrap().store().head(0, 0).page_size(),
            Some(4),
            "{policy}: spec's page kept"
        );
        assert_eq!(fingerprint(&page4), fingerprint(&fixed), "{policy}: page=4 vs fixed slots");

        // pages in use, seen from the fork hook (called for every new beam before it decodes)
        let pool = PagePool::new(BEAM_PAGE_SIZE, KvDtype::F32, c.head_dim);
        let mut seen: Vec<(usize, usize, usize)> = Vec::new();
        let mut record = |parent: &SequenceCache, _: &SequenceCache| {
            let child = parent.clone();
            let pc = parent.store().page_counts().unwrap();
            seen.push((pool.stats().pages_in_use, pc.shared_pages, pc.pages));
            child
        };
        let fork: &mut ForkFn<'_> = &mut record;
        let storage = BeamStorage { as_specified: false, pool: Some(&pool) };
        let hooked = beam_search_in(&m.model, &prompt, &o, storage, Some(fork)).unwrap();
        assert_eq!(fingerprint(&hooked), fingerprint(&fixed), "{policy}: through the pool");
        let prompt_pages = units * kept.div_ceil(BEAM_PAGE_SIZE);
        assert!(seen.len() > beams, "{policy}: more than one step");
        for (i, &(in_use, shared, pages)) in seen[..beams].iter().enumerate() {
            // K and V pages of the prompt, once, however many beams share them
            assert_eq!(in_use, 2 * prompt_pages, "{policy}: fork {i} of the prompt");
            assert_eq!((shared, pages), (prompt_pages, prompt_pages), "{policy}: fork {i}: every prompt page shared");
        }
        // after the first step each beam owns a copy of the prompt's partial
        // tail page (K and V, per layer and KV head); the prompt's own tail
        // left with the prompt cache; the full pages are still shared
        let (in_use, _, _) = seen[beams];
        assert_eq!(in_use, 2 * (prompt_pages - units + beams * units), "{policy}: step 2, first fork");
        assert!(in_use < 2 * beams * prompt_pages || kept < 2 * BEAM_PAGE_SIZE, "{policy}: less than a copy per beam");
        assert_eq!(pool.stats().cow_copies % (2 * units), 0, "{policy}: whole tail pages copied");
        eprintln!(
            "{policy}: prompt {} tokens ({kept} kept), {} pages at the fork for {beams} beams, {} after step 1, {} copied",
            prompt.len(),
            seen[0].0,
            in_use,
            pool.stats().cow_copies
        );
    }
}

/// A CHAI plan for stories260K (5 layers × 8 heads, k = 3), online and static.
fn chai_plan() -> String {
    let layer = serde_json::json!({
        "k": 3,
        "errors": (0..8).map(|i| (8 - i) as f64).collect::<Vec<_>>(),
        "static_clusters": [[0, 1, 2], [3, 4, 5], [6, 7]],
    });
    test_file("beam-chai.json", &serde_json::json!({ "layers": vec![layer; 5] }).to_string())
}

#[test]
fn paged_beams_match_fixed_slots_under_chai() {
    let m = kvslim_models::load_model(&shared().join("models/stories260K/stories260K.bin")).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let prompt = tok.encode("Once upon a time, there was a little girl named Lily. She").unwrap();
    let p = chai_plan();
    for policy in
        [format!("chai:plan={p}"), format!("h2o:heavy=6,recent=6+chai:plan={p}"), format!("chai-static:plan={p}")]
    {
        let o = opts(3, 10, 1.0, &policy, tok.eos.clone());
        let fixed =
            beam_search_in(&m.model, &prompt, &o, BeamStorage { as_specified: true, pool: None }, None).unwrap();
        let default = beam_search(&m.model, &prompt, &o).unwrap();
        assert!(default[0].cache.as_ref().unwrap().store().page_counts().is_some(), "{policy}: paged by default");
        assert_eq!(fingerprint(&default), fingerprint(&fixed), "{policy}");
    }
}
