//! The store's heads: eviction, compaction, byte counts, and the paged
//! layout against the fixed one.

use super::*;

#[test]
fn evict_moves_candidate_into_victim_slot() {
    let mut h = HeadSlots::new(2, 4);
    for p in 0..4u32 {
        h.push(p, &[p as f32; 2], &[10.0 + p as f32; 2]).unwrap();
        h.scores_mut()[p as usize] = p as f32;
    }
    assert!(h.push(9, &[0.0; 2], &[0.0; 2]).is_none(), "capacity is a hard limit");
    h.evict(1);
    assert_eq!(h.positions(), &[0, 3, 2]);
    assert_eq!(h.scores(), &[0.0, 3.0, 2.0]);
    let (mut k, mut v) = (Vec::new(), Vec::new());
    h.gather_keys(&mut k);
    h.gather_values(&mut v);
    assert_eq!(&k[2..4], &[3.0, 3.0]);
    assert_eq!(&v[2..4], &[13.0, 13.0]);
}

#[test]
fn kept_scores_follow_kept_positions() {
    let mut s = KvStore::new(1, 1, 2, 4);
    let h = s.head_mut(0, 0);
    for p in 0..4u32 {
        h.push(p, &[0.0; 2], &[0.0; 2]).unwrap();
        h.scores_mut()[p as usize] = 10.0 * p as f32;
    }
    h.evict(1); // slots now hold positions 0, 3, 2
    assert_eq!(s.kept_positions(), vec![vec![vec![0, 2, 3]]]);
    assert_eq!(s.kept_scores(), vec![vec![vec![0.0, 20.0, 30.0]]]);
}

#[test]
fn bytes_are_exact_and_drop_keys_shrinks_them() {
    let mut s = KvStore::new(2, 3, 8, 10);
    assert_eq!(s.bytes(), KvBytes { kv: 2 * 3 * 2 * 10 * 8 * 4, metadata: 2 * 3 * 10 * 8 });
    s.head_mut(1, 2).drop_keys();
    assert_eq!(s.bytes().kv, 2 * 3 * 2 * 10 * 8 * 4 - 10 * 8 * 4);
    assert_eq!(s.layer_bytes(0).kv, 3 * 2 * 10 * 8 * 4);
}

#[test]
fn retain_slots_compacts() {
    let mut h = HeadSlots::new(1, 5);
    for p in 0..5u32 {
        h.push(p * 10, &[p as f32], &[p as f32]).unwrap();
    }
    h.retain_slots(&[1, 4]);
    assert_eq!(h.positions(), &[10, 40]);
    let mut v = Vec::new();
    h.gather_values(&mut v);
    assert_eq!(v, [1.0, 4.0]);
}

use crate::rng::SplitMix64;

fn row(pos: u32, salt: f32, d: usize) -> Vec<f32> {
    (0..d).map(|i| ((pos as f32 + 1.0) * (i as f32 + salt)).sin() * (1.0 + (pos % 5) as f32)).collect()
}

/// One random store operation (push / evict / prefill-like retain / compact),
/// applied identically to every head in `heads`.
fn random_op(rng: &mut SplitMix64, heads: &mut [HeadSlots], next_pos: &mut u32, d: usize) {
    let len = heads[0].len();
    let cap = heads[0].capacity();
    match rng.below(10) {
        0..=5 if len < cap => {
            let (k, v) = (row(*next_pos, 0.5, d), row(*next_pos, 1.5, d));
            for h in heads.iter_mut() {
                let s = h.push(*next_pos, &k, &v).unwrap();
                h.scores_mut()[s] = *next_pos as f32 * 0.1;
            }
            *next_pos += 1;
        }
        6..=7 if len > 0 => {
            let victim = rng.below(len);
            heads.iter_mut().for_each(|h| h.evict(victim));
        }
        8 if len > 1 => {
            let keep: Vec<usize> = (0..len).filter(|_| rng.below(3) != 0).collect();
            heads.iter_mut().for_each(|h| h.retain_slots(&keep));
        }
        _ => heads.iter_mut().for_each(HeadSlots::compact),
    }
}

fn snapshot(h: &HeadSlots) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    (
        h.positions().to_vec(),
        bits(h.scores().to_vec()),
        bits(h.decoded_keys().unwrap_or_default()),
        bits(h.decoded_values()),
    )
}

#[test]
fn paged_heads_match_the_fixed_store_op_for_op() {
    let d = 8;
    for dtype in KvDtype::ALL {
        let mut heads: Vec<HeadSlots> = [None, Some(1), Some(3), Some(8)]
            .into_iter()
            .map(|p| HeadSlots::with_layout(d, 20, StoreLayout { page_size: p, kv_dtype: dtype }, None))
            .collect();
        let mut rng = SplitMix64::new(7);
        let mut next = 0;
        for step in 0..600 {
            random_op(&mut rng, &mut heads, &mut next, d);
            let want = snapshot(&heads[0]);
            for h in &heads[1..] {
                assert_eq!(snapshot(h), want, "{dtype} page {:?} step {step}", h.page_size());
                let c = h.page_counts().unwrap();
                assert_eq!(c.live, h.len());
                assert_eq!(c.pages * h.page_size().unwrap(), c.live + c.fragmentation);
            }
        }
    }
}

#[test]
fn compaction_returns_pages_and_counts_bytes() {
    let (d, p) = (4, 4);
    let pool = PagePool::new(p, KvDtype::F32, d);
    let mut h = HeadSlots::with_layout(d, 64, StoreLayout { page_size: Some(p), kv_dtype: KvDtype::F32 }, Some(&pool));
    for t in 0..32u32 {
        h.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
    }
    assert_eq!(pool.stats().pages_in_use, 2 * 8, "K and V pages");
    // evict every other token: no page empties, so nothing is returned
    for v in (0..32).rev().step_by(2) {
        h.evict(v);
    }
    let before = h.page_counts().unwrap();
    assert_eq!((before.pages, before.live, before.fragmentation), (8, 16, 16));
    let want = snapshot(&h);
    h.compact();
    let after = h.page_counts().unwrap();
    assert_eq!(after.pages, 16usize.div_ceil(p), "pages in use = ceil(live / page size)");
    assert_eq!(pool.stats().pages_in_use, 2 * after.pages);
    // in place: the 4 fullest pages stay (2 live each), the 8 tokens of
    // the other 4 move into their holes, K and V once each
    assert_eq!(after.bytes_moved, 8 * 2 * (d as u64 * 4), "only the released pages' tokens move");
    assert_eq!(pool.stats().peak_pages, 2 * 8, "repacking allocates no page");
    assert_eq!(snapshot(&h), want, "compaction keeps slot order and contents");
    // a page whose tokens all leave goes back to the pool at once
    let mut g = HeadSlots::with_layout(d, 8, StoreLayout { page_size: Some(p), kv_dtype: KvDtype::F32 }, None);
    for t in 0..8u32 {
        g.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
    }
    g.retain_slots(&[4, 5, 6, 7]);
    assert_eq!(g.page_counts().unwrap().pages, 1);
}

/// Token eviction scatters holes over pages; a head never references
/// more than its page cap, because it repacks before growing past it,
/// and repacking keeps slot order and contents.
#[test]
fn eviction_churn_stays_within_the_page_cap() {
    let d = 4;
    for (p, capacity) in [(4, 25), (8, 25), (16, 129), (3, 7)] {
        let cap = paged::page_cap(capacity, p);
        let layout = StoreLayout { page_size: Some(p), kv_dtype: KvDtype::Q8 };
        let mut h = HeadSlots::with_layout(d, capacity, layout, None);
        let mut fixed = HeadSlots::with_layout(d, capacity, StoreLayout { page_size: None, ..layout }, None);
        let mut rng = SplitMix64::new(p as u64);
        let mut most = 0;
        for t in 0..2000u32 {
            if h.len() == capacity {
                let v = (rng.next_u64() % capacity as u64) as usize;
                h.evict(v);
                fixed.evict(v);
            }
            h.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
            fixed.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
            most = most.max(h.page_counts().unwrap().pages);
        }
        assert!(most <= cap, "page={p} capacity={capacity}: {most} pages > cap {cap}");
        assert!(h.page_counts().unwrap().bytes_moved > 0, "page={p}: holes were repacked");
        assert_eq!(snapshot(&h), snapshot(&fixed), "page={p}: same slots as the fixed store");
    }
}

#[test]
fn clones_share_pages_until_the_first_write() {
    let (d, p) = (4, 4);
    let pool = PagePool::new(p, KvDtype::Q8, d);
    let layout = StoreLayout { page_size: Some(p), kv_dtype: KvDtype::Q8 };
    let mut a = HeadSlots::with_layout(d, 64, layout, Some(&pool));
    for t in 0..10u32 {
        a.push(t, &row(t, 0.5, d), &row(t, 1.5, d)).unwrap();
    }
    let pages = pool.stats().pages_in_use;
    let mut b = a.clone();
    assert_eq!(pool.stats().pages_in_use, pages, "a clone allocates no pages");
    assert_eq!(b.page_counts().unwrap().shared_pages, 3);
    let original = snapshot(&a);
    // eviction and score updates never copy a page
    b.evict(2);
    b.scores_mut()[0] += 1.0;
    assert_eq!(pool.stats().cow_copies, 0);
    assert_eq!(snapshot(&a), original, "the other sequence does not see b's evictions or scores");
    // the first write into the shared tail page copies K and V once
    b.push(10, &row(10, 0.5, d), &row(10, 1.5, d)).unwrap();
    assert_eq!(b.page_counts().unwrap().cow_copies, 2);
    b.push(11, &row(11, 0.5, d), &row(11, 1.5, d)).unwrap();
    assert_eq!(b.page_counts().unwrap().cow_copies, 2, "copied only on the first write");
    assert_eq!(snapshot(&a), original);
    a.push(10, &row(10, 0.5, d), &row(10, 1.5, d)).unwrap();
    assert_eq!(a.page_counts().unwrap().cow_copies, 0, "b's copy left a the sole owner");
    drop(b);
    drop(a);
    assert_eq!(pool.stats().pages_in_use, 0);
}

/// Every live slot must decode to what was written for its position, in
/// every layout, after evictions, retains and compactions; with the
/// scale copy disabled (a fault injected into the row copy) the check
/// must fail, so it really guards the scale path.
#[test]
fn scales_move_with_their_slots() {
    let d = 40;
    let check = |skip: bool| -> bool {
        rows::SKIP_SCALE_COPY.with(|c| c.set(skip));
        let mut ok = true;
        for dtype in [KvDtype::Q8, KvDtype::Q4] {
            for page in [None, Some(4)] {
                let mut heads =
                    vec![HeadSlots::with_layout(d, 24, StoreLayout { page_size: page, kv_dtype: dtype }, None)];
                let mut truth = std::collections::HashMap::new();
                let mut rng = SplitMix64::new(11);
                let mut next = 0;
                for _ in 0..400 {
                    let before = next;
                    random_op(&mut rng, &mut heads, &mut next, d);
                    if next > before {
                        let h = &heads[0];
                        truth.insert(before, h.decoded_values()[(h.len() - 1) * d..].to_vec());
                    }
                    let h = &heads[0];
                    let vals = h.decoded_values();
                    for (i, p) in h.positions().iter().enumerate() {
                        ok &= vals[i * d..(i + 1) * d] == truth[p][..];
                    }
                }
            }
        }
        rows::SKIP_SCALE_COPY.with(|c| c.set(false));
        ok
    };
    assert!(check(false), "scales travel with codes");
    assert!(!check(true), "a row copy without its scales must be detected");
}
