//! The seed's behaviour tests for H2O on constructed attention streams
//! (no model): age bias, a kept distant hot spot, a stale hot spot after a
//! switch, an unrecoverable delayed first reference; and GQA aggregation.

use crate::policy::{CachePolicy, EvictionConfig, HeadId, PolicySlots, ScoreAgg, TokenEviction, VictimRule};
use crate::{HeadSlots, KvStore};

fn h2o(heavy: usize, recent: usize, agg: ScoreAgg) -> TokenEviction {
    TokenEviction::new(EvictionConfig {
        name: "h2o",
        budget: heavy + recent,
        recent,
        sinks: 0,
        rule: VictimRule::LowestScore,
        agg: Some(agg),
        prefill_chunk: None,
        observation: None,
    })
}

/// Decodes positions 0..steps; `attn(t, positions)` gives the `g × len`
/// probabilities over the current candidate slots. Returns the kept
/// positions after every step.
fn run(
    policy: &mut TokenEviction,
    g: usize,
    steps: u32,
    mut attn: impl FnMut(u32, &[u32]) -> Vec<f32>,
) -> (HeadSlots, Vec<Vec<u32>>) {
    let mut slots = HeadSlots::new(1, policy.budget() + 1);
    let mut history = Vec::new();
    for t in 0..steps {
        slots.push(t, &[0.0], &[0.0]).expect("capacity B+1 holds the candidate");
        let probs = attn(t, slots.positions());
        assert_eq!(probs.len(), g * slots.len());
        policy.after_decode_step(HeadId::new(0, 0), &mut PolicySlots::new(&mut slots), &probs);
        let mut kept = slots.positions().to_vec();
        kept.sort_unstable();
        history.push(kept);
    }
    (slots, history)
}

/// Normalised row with `mass` on `hot` (when present) and the rest uniform.
fn row_with(positions: &[u32], hot: &[(u32, f32)]) -> Vec<f32> {
    let mut row = vec![0f32; positions.len()];
    let mut used = 0.0;
    let mut cold = positions.len();
    for &(p, m) in hot {
        if let Some(i) = positions.iter().position(|&x| x == p) {
            row[i] = m;
            used += m;
            cold -= 1;
        }
    }
    for (i, r) in row.iter_mut().enumerate() {
        if !hot.iter().any(|&(p, _)| p == positions[i]) {
            *r = (1.0 - used) / cold.max(1) as f32;
        }
    }
    row
}

#[test]
fn uniform_attention_shows_the_age_bias() {
    let mut p = h2o(4, 4, ScoreAgg::Sum);
    let (_, hist) = run(&mut p, 1, 100, |_, pos| vec![1.0 / pos.len() as f32; pos.len()]);
    // older tokens were attended more often, so the oldest are the heavy hitters
    assert_eq!(hist.last().unwrap(), &vec![0, 1, 2, 3, 96, 97, 98, 99]);
}

#[test]
fn a_single_distant_hot_spot_is_kept() {
    let mut p = h2o(4, 16, ScoreAgg::Sum);
    let (_, hist) = run(&mut p, 1, 300, |_, pos| row_with(pos, &[(30, 0.5)]));
    for (t, kept) in hist.iter().enumerate().skip(30) {
        assert!(kept.contains(&30), "hot spot 30 evicted at step {t}: {kept:?}");
    }
    // without the hot spot, position 30 would not survive
    let mut q = h2o(4, 16, ScoreAgg::Sum);
    let (_, plain) = run(&mut q, 1, 300, |_, pos| vec![1.0 / pos.len() as f32; pos.len()]);
    assert!(!plain.last().unwrap().contains(&30));
}

#[test]
fn a_hot_spot_switch_leaves_the_old_hot_spot_resident() {
    let mut p = h2o(3, 16, ScoreAgg::Sum);
    let (_, hist) =
        run(&mut p, 1, 300, |t, pos| if t < 100 { row_with(pos, &[(10, 0.6)]) } else { row_with(pos, &[(120, 0.6)]) });
    let last = hist.last().unwrap();
    assert!(last.contains(&120), "new hot spot kept: {last:?}");
    assert!(last.contains(&10), "old hot spot still resident (accumulated score never decays): {last:?}");
}

#[test]
fn a_delayed_first_reference_cannot_be_recovered() {
    let mut p = h2o(3, 3, ScoreAgg::Sum);
    // position 12 receives no attention while the early tokens compete ...
    let (_, hist) = run(&mut p, 1, 150, |t, pos| {
        let mut row = row_with(pos, &[]);
        if t >= 80 {
            // ... from step 80 the queries want it, but only D_t can be attended
            row = row_with(pos, &[(12, 0.9)]);
        } else if let Some(i) = pos.iter().position(|&x| x == 12) {
            let spread = row[i] / (pos.len() - 1) as f32;
            row.iter_mut().for_each(|r| *r += spread);
            row[i] = 0.0;
        }
        row
    });
    let evicted_at = hist.iter().position(|k| k.iter().all(|&x| x != 12) && k.iter().any(|&x| x > 12)).unwrap();
    assert!(evicted_at < 80, "position 12 left before it was needed (step {evicted_at})");
    assert!(hist[80..].iter().all(|k| !k.contains(&12)), "an evicted position never comes back");
}

#[test]
fn gqa_sum_and_max_keep_different_sets_with_one_physical_set_per_kv_head() {
    // two query heads of one KV head: head 0 gives X=5 0.4 and Y=6 0.5,
    // head 1 gives X 0.4 and Y nothing: sum ranks X (0.8) over Y (0.5), max
    // ranks Y (0.5) over X (0.4); one heavy slot decides between them.
    let attn = |_: u32, pos: &[u32]| {
        let mut v = row_with(pos, &[(5, 0.4), (6, 0.5)]);
        v.extend(row_with(pos, &[(5, 0.4), (6, 0.0)]));
        v
    };
    let mut sum = h2o(1, 8, ScoreAgg::Sum);
    let mut max = h2o(1, 8, ScoreAgg::Max);
    let (_, hs) = run(&mut sum, 2, 60, attn);
    let (_, hm) = run(&mut max, 2, 60, attn);
    let (ks, km) = (hs.last().unwrap(), hm.last().unwrap());
    assert!(ks.contains(&5) && !ks.contains(&6), "sum keeps X: {ks:?}");
    assert!(km.contains(&6) && !km.contains(&5), "max keeps Y: {km:?}");
    // one slot set per KV head, whatever the group size: (B+1) slots of K and V
    let store = KvStore::new(1, 1, 64, sum.capacity(10_000));
    assert_eq!(store.bytes().kv, 2 * (9 + 1) * 64 * 4);
}
