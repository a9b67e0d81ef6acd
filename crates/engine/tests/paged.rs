//! The paged KV store through the whole engine (issue #7): same results as
//! the fixed-slot store for every policy and page size, compaction that
//! changes nothing but the page count, page eviction that removes whole
//! pages and never a protected token, and copy-on-write between clones.
//!
//! Every run is teacher-forced on stories260K: the prompt is prefilled in
//! one call, then one token per decode step.

use kvslim_cache::{KvDtype, PagePool, PolicySpec, SequenceCache};
use kvslim_engine::Session;
use kvslim_models::{Logits, Model};
use std::collections::{BTreeMap, BTreeSet};
mod common;

use common::{stories, test_file, tokens};

/// A CHAI plan for stories260K (5 layers × 8 heads, k = 3 per layer), as
/// the chai and batch tests write them; static membership: consecutive heads.
fn chai_plan(name: &str) -> String {
    let heads = 8;
    let layer = serde_json::json!({
        "k": 3,
        "errors": (0..heads).map(|i| (heads - i) as f64).collect::<Vec<_>>(),
        "static_clusters": [[0, 1, 2], [3, 4, 5], [6, 7]],
    });
    let layers = vec![layer; 5];
    test_file(&format!("paged-chai-{name}.json"), &serde_json::json!({ "layers": layers }).to_string())
}

/// A stories260K plan with GQA-aware sharing: one of the 4 KV heads keeps
/// K in every layer (`kv_keep`), static membership as calibrated would
/// write it.
fn kv_keep_plan(name: &str) -> String {
    let layer = serde_json::json!({
        "k": 2,
        "errors": [],
        "kv_keep": 1,
        "static_clusters": [[0, 1, 4], [2, 3, 5, 6, 7]],
        "static_representatives": [4, 5],
    });
    test_file(
        &format!("paged-kvkeep-{name}.json"),
        &serde_json::json!({ "group": 2, "layers": vec![layer; 5] }).to_string(),
    )
}

/// `spec` with its storage switched to pages of `page` tokens (and the
/// other storage keys given).
fn paged(spec: &PolicySpec, page: usize) -> PolicySpec {
    let mut s = spec.clone();
    s.storage.page_size = Some(page);
    s
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Per (layer, KV head), in slot order: positions and score bits.
fn slots(c: &SequenceCache) -> Vec<(Vec<u32>, Vec<u32>)> {
    let st = c.store();
    (0..st.layers())
        .flat_map(|l| (0..st.kv_heads()).map(move |h| (l, h)))
        .map(|(l, h)| (st.head(l, h).positions().to_vec(), bits(st.head(l, h).scores())))
        .collect()
}

/// Feeds `ids` to every session in lockstep (prompt of `prompt_len` in one
/// call, then one token per call) and calls `check` after every call with
/// the call index and every session's logits.
fn lockstep(
    sessions: &mut [Session<'_>],
    ids: &[u32],
    prompt_len: usize,
    mut check: impl FnMut(usize, &[Session<'_>], &[Vec<f32>]),
) {
    let mut calls: Vec<&[u32]> = vec![&ids[..prompt_len]];
    calls.extend(ids[prompt_len..].chunks(1));
    for (step, part) in calls.into_iter().enumerate() {
        let logits: Vec<Vec<f32>> = sessions.iter_mut().map(|s| s.feed(part, Logits::Last).unwrap().to_vec()).collect();
        check(step, sessions, &logits);
    }
}

/// 1. `page=1` and `page=8` without compaction: bit-identical logits at every
///    step and identical slots (positions and scores, in slot order) per
///    layer and KV head, for every policy.
#[test]
fn paged_store_is_bit_identical_to_fixed_slots_for_every_policy() {
    let m = stories();
    let ids = tokens(&m, 300);
    let prompt_len = 40;
    let plan = chai_plan("identity");
    let kv_plan = kv_keep_plan("identity");
    let specs = [
        "full".to_string(),
        "window:recent=24".into(),
        "sink:sink=4,recent=20".into(),
        "heavy:heavy=24".into(),
        "random:budget=24,recent=8,seed=5".into(),
        "h2o:heavy=12,recent=12".into(),
        "h2o:heavy=12,recent=12,agg=max".into(),
        "h2o:heavy=12,recent=12,prefill=stream:7".into(),
        "h2o:heavy=8,recent=16,agg=max,prefill=stream:16".into(),
        "h2o:heavy=12,recent=12,prefill=snap:8".into(),
        "h2o:heavy=12,recent=12,sink=2,prefill=expect:64".into(),
        "h2o:heavy=12,recent=12,sink=2,prefill=kvzip".into(),
        "h2o:heavy=12,recent=12,prefill=rkv:0.8".into(),
        format!("h2o:heavy=12,recent=12+chai:plan={plan}"),
        format!("chai-static:plan={plan}"),
        format!("h2o:heavy=12,recent=12+chai-static:plan={plan}"),
        // score families and sinks on every family
        "h2o:heavy=12,recent=12,score=norm".into(),
        "h2o:heavy=12,recent=12,sink=4,score=decay:0.9".into(),
        "h2o:heavy=12,recent=12,score=tova,prefill=stream:7".into(),
        "h2o:heavy=12,recent=12,agg=max,score=vnorm".into(),
        "h2o:heavy=12,recent=12,score=persist:16".into(),
        "heavy:heavy=20,sink=4,score=tova".into(),
        "window:recent=20,sink=4".into(),
        "random:budget=20,recent=8,seed=5,sink=4".into(),
        format!("h2o:heavy=12,recent=12,score=vnorm+chai:plan={plan}"),
        format!("h2o:heavy=12,recent=12,sink=2,score=decay:0.5+chai-static:plan={plan}"),
        // budget allocators: ada decided in prefill (the prompt overflows)
        // and at the first overflowing decode step
        "h2o:heavy=12,recent=12,alloc=pyramid".into(),
        "h2o:heavy=12,recent=12,alloc=ada".into(),
        "h2o:heavy=24,recent=24,alloc=ada:0".into(),
        "h2o:heavy=12,recent=12,sink=2,score=norm,alloc=pyramid:0.5/ada:0.5".into(),
        format!("h2o:heavy=12,recent=12,alloc=pyramid+chai:plan={plan}"),
        // GQA-aware sharing (kv_keep), online and static
        format!("chai:plan={kv_plan}"),
        format!("h2o:heavy=12,recent=12+chai:plan={kv_plan}"),
        format!("h2o:heavy=12,recent=12+chai-static:plan={kv_plan}"),
    ];
    for text in &specs {
        let spec = PolicySpec::parse_and_load(text).unwrap();
        let layouts = [spec.clone(), paged(&spec, 1), paged(&spec, 8)];
        let mut sessions: Vec<Session<'_>> =
            layouts.iter().map(|s| Session::new(&m.model, s, ids.len(), ids.len()).unwrap()).collect();
        let mut holes = 0;
        lockstep(&mut sessions, &ids, prompt_len, |step, s, logits| {
            let want = slots(&s[0].cache);
            for k in 1..s.len() {
                let what = format!("{text} page={:?} call {step}", layouts[k].storage.page_size);
                assert_eq!(bits(&logits[k]), bits(&logits[0]), "{what}: logits");
                assert_eq!(slots(&s[k].cache), want, "{what}: slots");
                assert_eq!(s[k].cache.next_pos(), s[0].cache.next_pos(), "{what}");
            }
            holes = holes.max(s[2].cache.store().page_counts().unwrap().fragmentation);
        });
        let bounded = sessions[0].cache.policy().bounded();
        assert_eq!(bounded, sessions[0].cache.len() < ids.len(), "{text}: evicting policies evicted");
        // the page=8 run really had scattered holes (more than the tail pages' free rows)
        let tails = m.model.config.n_layers * m.model.config.n_kv_heads * 7;
        if bounded {
            assert!(holes > tails, "{text}: page=8 fragmentation {holes} ≤ {tails}: eviction left no holes");
        }
    }
}

/// 2. Compaction every N steps changes no result; right after a compaction
///    the store holds exactly Σ ceil(live / P) pages (per layer and KV
///    head; `PageCounts::pages` counts V pages, the pool holds as many K
///    pages again), and fewer than the same run without compaction.
#[test]
fn compaction_preserves_results_and_frees_scattered_pages() {
    let m = stories();
    let c = &m.model.config;
    let hd = c.head_dim;
    let ids = tokens(&m, 300);
    let prompt_len = 40;
    let p = 8;
    let base = PolicySpec::parse_and_load("h2o:heavy=12,recent=12,page=8").unwrap();
    for every in [1usize, 7, 32] {
        let mut compacting = base.clone();
        compacting.storage.compact_every = Some(every);
        let (pool_a, pool_b) = (PagePool::new(p, KvDtype::F32, hd), PagePool::new(p, KvDtype::F32, hd));
        let mut sessions = vec![
            Session::in_pool(&m.model, &base, ids.len(), ids.len(), Some(&pool_a)).unwrap(),
            Session::in_pool(&m.model, &compacting, ids.len(), ids.len(), Some(&pool_b)).unwrap(),
        ];
        // mirror of SequenceCache::advance: tokens since the last compaction
        let mut since = 0;
        let mut compactions = 0;
        let mut gap = 0usize;
        lockstep(&mut sessions, &ids, prompt_len, |step, s, logits| {
            let what = format!("compact={every} call {step}");
            assert_eq!(bits(&logits[1]), bits(&logits[0]), "{what}: logits");
            assert_eq!(slots(&s[1].cache), slots(&s[0].cache), "{what}: slots");
            since += if step == 0 { prompt_len } else { 1 };
            if since < every {
                return;
            }
            since = 0;
            compactions += 1;
            let st = &s[1].cache.store();
            let want: usize = (0..st.layers())
                .flat_map(|l| (0..st.kv_heads()).map(move |h| (l, h)))
                .map(|(l, h)| st.head(l, h).len().div_ceil(p))
                .sum();
            let got = st.page_counts().unwrap();
            assert_eq!(got.pages, want, "{what}: pages right after compaction");
            assert_eq!(got.fragmentation, want * p - got.live, "{what}");
            assert_eq!(pool_b.stats().pages_in_use, 2 * want, "{what}: K and V pages in the pool");
            let uncompacted = s[0].cache.store().page_counts().unwrap().pages;
            assert!(uncompacted >= want, "{what}: {uncompacted} < {want}");
            assert_eq!(pool_a.stats().pages_in_use, 2 * uncompacted, "{what}");
            gap = gap.max(uncompacted - want);
        });
        let (a, b) =
            (sessions[0].cache.store().page_counts().unwrap(), sessions[1].cache.store().page_counts().unwrap());
        eprintln!(
            "compact={every}: {compactions} compactions, end of run: {} V pages without compaction, {} with \
             ({} bytes moved), largest gap right after a compaction {gap}",
            a.pages, b.pages, b.bytes_moved
        );
        assert!(compactions >= 260 / every, "compact={every}: {compactions} compactions");
        assert!(b.bytes_moved > 0, "compact={every}: something moved");
        // scattered H2O evictions leave holes that only compaction returns
        assert!(gap > 0, "compact={every}: compaction never saved a page");
        // measured on this run (20 heads, budget 24+1, page 8): 220 V pages
        // without compaction at the end vs 60 (compact=1) or 80 (7, 32)
        assert!(a.pages > b.pages, "end of run: {} pages without compaction vs {} with", a.pages, b.pages);
    }
}

/// The kept positions of every (layer, KV head), with the page each lives on.
fn pages_of(c: &SequenceCache) -> Vec<BTreeMap<u32, u32>> {
    let st = c.store();
    (0..st.layers())
        .flat_map(|l| (0..st.kv_heads()).map(move |h| (l, h)))
        .map(|(l, h)| {
            let hs = st.head(l, h);
            hs.positions().iter().enumerate().map(|(i, &pos)| (pos, hs.page_of(i).unwrap())).collect()
        })
        .collect()
}

/// 3. Page eviction: bounded pages, whole pages leave, protected tokens stay.
#[test]
fn page_eviction_removes_whole_unprotected_pages() {
    let m = stories();
    let ids = tokens(&m, 400);
    let prompt_len = 40;
    let p = 8usize;
    // (spec, budget B, recent window); window/sink cannot page-evict (the parser says so)
    let cases = [
        ("h2o:heavy=24,recent=8,page=8,page_score=sum", 32, 8),
        ("h2o:heavy=24,recent=8,page=8,page_score=max", 32, 8),
        ("h2o:heavy=24,recent=8,page=8,page_score=topm:2", 32, 8),
        ("h2o:heavy=20,recent=12,agg=max,page=8,page_score=sum", 32, 12),
        ("random:budget=32,recent=8,seed=3,page=8,page_score=sum", 32, 8),
        // streamed prefill leaves pages with different live counts per KV head,
        // so heads then hold different numbers of slots
        ("h2o:heavy=24,recent=8,prefill=stream:16,page=8,page_score=sum", 32, 8),
    ];
    for (text, b, recent) in cases {
        let spec = PolicySpec::parse_and_load(text).unwrap();
        let mut s = Session::new(&m.model, &spec, ids.len(), ids.len()).unwrap();
        s.feed(&ids[..prompt_len], Logits::Last).unwrap();
        let (mut whole_pages, mut quiet, mut fallbacks) = (0, 0, 0);
        let bound = (b + 1usize).div_ceil(p) + 1;
        for (t, &id) in ids.iter().enumerate().skip(prompt_len) {
            let before = pages_of(&s.cache);
            s.feed(&[id], Logits::Last).unwrap();
            let after = pages_of(&s.cache);
            for (u, (bf, af)) in before.iter().zip(&after).enumerate() {
                let what = format!("{text} pos {t} head {u}");
                let kept: BTreeSet<u32> = af.keys().copied().collect();
                assert!(kept.contains(&(t as u32)), "{what}: the new token stays");
                let removed: Vec<u32> = bf.keys().copied().filter(|q| !kept.contains(q)).collect();
                assert!(kept.len() <= b, "{what}: {} > budget {b}", kept.len());
                let protected = |q: u32| q as usize + recent > t;
                if removed.is_empty() {
                    quiet += 1;
                } else {
                    let page = bf[&removed[0]];
                    let on_page: Vec<u32> = bf.iter().filter(|e| *e.1 == page).map(|e| *e.0).collect();
                    if removed == on_page {
                        whole_pages += 1;
                    } else {
                        // documented fallback: one token, only when every page held a protected token
                        assert_eq!(
                            removed.len(),
                            1,
                            "{what}: {removed:?} is neither a whole page ({on_page:?}) nor one token"
                        );
                        let mut unprotected: BTreeSet<u32> = bf.values().copied().collect();
                        for (&q, &pg) in bf {
                            if protected(q) {
                                unprotected.remove(&pg);
                            }
                        }
                        assert!(
                            unprotected.is_empty(),
                            "{what}: fell back to a token while pages {unprotected:?} were evictable"
                        );
                        fallbacks += 1;
                    }
                }
                for q in (t + 1).saturating_sub(recent)..=t {
                    assert!(kept.contains(&(q as u32)), "{what}: recent position {q} evicted");
                }
                let (l, h) = (u / s.cache.store().kv_heads(), u % s.cache.store().kv_heads());
                let pages = s.cache.store().head(l, h).page_counts().unwrap().pages;
                assert!(pages <= bound, "{what}: {pages} pages > ceil((B+1)/P)+1 = {bound}");
            }
        }
        eprintln!("{text}: {whole_pages} page evictions, {fallbacks} single-token fallbacks, {quiet} quiet head-steps");
        // heavy + 1 tokens are eligible at every eviction, so a page is always free to go
        assert!(whole_pages > 0 && fallbacks == 0, "{text}: {whole_pages} pages, {fallbacks} fallbacks");
    }
}

/// Prefill `prompt` then decode `more` alone under `spec`; logits per call.
fn solo(m: &Model, spec: &PolicySpec, prompt: &[u32], more: &[u32]) -> Vec<Vec<u32>> {
    let mut s = Session::new(m, spec, prompt.len() + more.len(), prompt.len()).unwrap();
    let mut out = vec![bits(s.feed(prompt, Logits::Last).unwrap())];
    out.extend(more.iter().map(|&t| bits(s.feed(&[t], Logits::Last).unwrap())));
    out
}

/// 4. Copy-on-write: two clones of a prefilled paged cache decode different
///    tokens; each equals a fresh solo run, and the only pages copied are the
///    shared partial tail page's K and V, once per layer × KV head per writer.
#[test]
fn clones_share_the_prompt_and_copy_only_the_tail_page_once() {
    let m = stories();
    let c = &m.model.config;
    let hd = c.head_dim;
    let units = c.n_layers * c.n_kv_heads;
    let ids = tokens(&m, 80);
    let p = 8;
    // (spec, prompt length): 21 and 29 kept tokens leave a partial tail page
    for (text, prompt_len) in [("full:page=8", 21usize), ("h2o:heavy=20,recent=9,page=8", 45)] {
        let spec = PolicySpec::parse_and_load(text).unwrap();
        let prompt = &ids[..prompt_len];
        let more: [Vec<u32>; 2] = [ids[prompt_len..prompt_len + 20].to_vec(), ids[50..70].to_vec()];
        let pool = PagePool::new(p, KvDtype::F32, hd);
        let mut base = Session::in_pool(&m.model, &spec, prompt_len + 20, prompt_len, Some(&pool)).unwrap();
        let first = bits(base.feed(prompt, Logits::Last).unwrap());
        let kept = base.cache.len();
        assert_ne!(kept % p, 0, "{text}: the test needs a partial tail page");
        let prompt_pages = pool.stats().pages_in_use;
        assert_eq!(prompt_pages, 2 * units * kept.div_ceil(p), "{text}");
        let forks = [base.cache.clone(), base.cache.clone()];
        let mut repacked = false;
        assert_eq!(pool.stats().pages_in_use, prompt_pages, "{text}: clones allocate nothing");
        assert_eq!(base.cache.store().page_counts().unwrap().shared_pages, units * kept.div_ceil(p));
        for (i, cache) in forks.into_iter().enumerate() {
            let mut s = Session::with_cache(&m.model, cache);
            let want = solo(&m.model, &spec, prompt, &more[i]);
            assert_eq!(first, want[0], "{text}");
            for (j, &t) in more[i].iter().enumerate() {
                assert_eq!(bits(s.feed(&[t], Logits::Last).unwrap()), want[j + 1], "{text}: fork {i} step {j}");
                let counts = s.cache.store().page_counts().unwrap();
                if counts.bytes_moved == 0 {
                    // until a head reaches its page cap and repacks (which
                    // may fill holes of shared pages), only the tail page
                    // is copied: K and V, once per head
                    assert_eq!(counts.cow_copies, 2 * units as u64, "{text}: fork {i} step {j}");
                }
            }
            repacked |= s.cache.store().page_counts().unwrap().bytes_moved > 0;
        }
        if !repacked {
            assert_eq!(
                pool.stats().cow_copies,
                2 * 2 * units,
                "{text}: K and V of the tail page, per head, per writer"
            );
        }
        // the original still reads its own prompt
        let want = solo(&m.model, &spec, prompt, &more[1][..1]);
        assert_eq!(bits(base.feed(&more[1][..1], Logits::Last).unwrap()), want[1], "{text}: original");
        assert_eq!(base.cache.store().page_counts().unwrap().cow_copies, 0, "{text}: the original is sole owner again");
    }
}
