//! Tests of the per-step cache operations (`step.rs`): decode eviction,
//! prefill candidates, allocators, the undo journal.

mod tests {
    use super::super::super::tests::cache_of;
    use super::super::*;
    use crate::policy::PolicySpec;
    use crate::CacheShape;

    #[test]
    fn append_past_capacity_is_a_cache_full_error() {
        let shape = CacheShape::plain(1, 2, 1, 4);
        let mut c = SequenceCache::new(&PolicySpec::parse("full").unwrap(), shape, 2, 2).unwrap();
        c.append(0, 0, &[0.0; 4], &[0.0; 4]).unwrap();
        c.append(0, 1, &[0.0; 4], &[0.0; 4]).unwrap();
        let err = c.append(0, 2, &[0.0; 4], &[0.0; 4]).unwrap_err();
        assert!(matches!(err, CacheError::Full(_)), "{err}");
    }

    #[test]
    fn a_decode_step_evicts_through_the_policy() {
        // h2o with 2 slots: the third token makes the policy evict one
        let mut c = cache_of("h2o:heavy=1,recent=1", 2);
        for l in 0..2 {
            c.append(l, 2, &[2.0; 4], &[-2.0; 4]).unwrap();
            let stride = c.max_capacity();
            let mut probs = vec![0f32; 2 * stride];
            probs[..3].copy_from_slice(&[0.1, 0.6, 0.3]);
            probs[stride..stride + 3].copy_from_slice(&[0.1, 0.6, 0.3]);
            c.after_decode_attention(l, &probs, stride);
            let mut kept = c.store().head(l, 0).positions().to_vec();
            kept.sort_unstable();
            assert_eq!(kept, [1, 2], "position 0 has the lowest score");
        }
    }

    #[test]
    fn prefill_candidates_commit_the_policys_choice() {
        let mut c = cache_of("h2o:heavy=2,recent=1", 2);
        let mut cand = PrefillCandidates::default();
        let keys: Vec<f32> = (0..8).map(|i| 10.0 + i as f32).collect();
        c.gather_candidates(0, 0, 2, &keys, &keys, 0, &mut cand).unwrap();
        assert_eq!(cand.held(), 2);
        assert_eq!(cand.positions(), &[0, 1, 2, 3]);
        assert_eq!(cand.keys(0).len(), 16);
        cand.add_column_sums(&[5.0, 0.0, 1.0, 0.0]);
        c.commit_candidates(0, 0, &mut cand).unwrap();
        let mut kept = c.store().head(0, 0).positions().to_vec();
        kept.sort_unstable();
        assert_eq!(kept, [0, 2, 3], "heavy: 0 and 2; recent: 3");
    }
}

mod alloc_tests {
    use super::super::*;
    use crate::policy::PolicySpec;
    use crate::CacheShape;

    /// `alloc=ada` deciding at the first decode step that overflows: head 0
    /// spreads its attention, head 1 gives each token all of it once, so
    /// head 1's old tokens rank higher and it wins three of the layer's
    /// four heavy slots; head 0 drops to its share in that same step
    /// (two victims), head 1 keeps growing; on a paged store the heads'
    /// capacities follow their shares.
    #[test]
    fn ada_splits_a_layer_at_its_first_overflow_and_the_loser_shrinks_at_once() {
        for layout in ["", ",page=2"] {
            let shape = CacheShape::plain(1, 2, 2, 4);
            let spec = PolicySpec::parse(&format!("h2o:heavy=2,recent=1,alloc=ada:0{layout}")).unwrap();
            let mut c = SequenceCache::new(&spec, shape, 64, 64).unwrap();
            let stride = c.max_capacity();
            for p in 0..4usize {
                c.append(0, p, &[p as f32; 8], &[p as f32; 8]).unwrap();
                let len = c.layer(0)[0].len();
                let mut probs = vec![0f32; 2 * stride];
                probs[..len].iter_mut().for_each(|x| *x = 1.0 / len as f32);
                probs[stride + len - 1] = 1.0;
                c.after_decode_attention(0, &probs, stride);
                c.advance(1);
            }
            assert_eq!((c.policy().head_budget(0, 0), c.policy().head_budget(0, 1)), (Some(2), Some(4)), "{layout}");
            let mut kept = c.layer(0)[0].positions().to_vec();
            kept.sort_unstable();
            assert_eq!(kept, [0, 3], "{layout}: head 0 kept its heaviest and the recent token");
            assert_eq!(c.layer(0)[1].len(), 4, "{layout}");
            let caps: Vec<usize> = c.layer(0).iter().map(|h| h.capacity()).collect();
            let want = if layout.is_empty() { vec![6, 6] } else { vec![3, 5] };
            assert_eq!(caps, want, "{layout}: fixed rows stay at the layer's most (1 + 4 + 1); pages follow shares");
        }
    }
}

mod journal_tests {
    use super::super::*;
    use crate::policy::PolicySpec;
    use crate::CacheShape;

    /// Feeds decode step `p` to every layer (deterministic keys, values and
    /// attention that vary with the position).
    fn step(c: &mut SequenceCache, p: usize) {
        let group = 2;
        for l in 0..c.store().layers() {
            let kv = c.store().kv_heads();
            let row: Vec<f32> = (0..kv * 8).map(|i| ((p * 7 + i * 3 + l) % 11) as f32 - 5.0).collect();
            c.append(l, p, &row, &row.iter().map(|x| x * 0.5).collect::<Vec<_>>()).unwrap();
            let (len, stride) = (c.layer(l)[0].len(), c.max_capacity());
            let mut probs = vec![0f32; group * kv * stride];
            for h in 0..group * kv {
                let w: Vec<f32> = (0..len).map(|i| 1.0 + ((i * 5 + p + h) % 7) as f32).collect();
                let total: f32 = w.iter().sum();
                probs[h * stride..h * stride + len].iter_mut().zip(&w).for_each(|(o, x)| *o = x / total);
            }
            c.after_decode_attention(l, &probs, stride);
        }
        c.advance(1);
    }

    /// Per head: positions, then the bits of scores, keys and values.
    type HeadState = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>);

    fn state(c: &SequenceCache) -> Vec<HeadState> {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut out = Vec::new();
        for l in 0..c.store().layers() {
            for h in c.layer(l) {
                let keys = h.decoded_keys().unwrap_or_default();
                out.push((h.positions().to_vec(), bits(h.scores()), bits(&keys), bits(&h.decoded_values())));
            }
        }
        out
    }

    /// After a checkpoint, steps that evict and then a rollback leave the
    /// cache exactly as a copy taken at the checkpoint (slots, rows,
    /// positions, scores, next position), and both continue identically
    /// (policy state included: `random` draws from its RNG at every
    /// eviction). A commit keeps the steps. Paged stores decline.
    #[test]
    fn rollback_returns_to_the_checkpoint_bit_for_bit() {
        for spec in
            ["h2o:heavy=3,recent=2", "random:budget=5,recent=1", "h2o:heavy=3,recent=2,kv_dtype=q8,score=persist:4"]
        {
            let shape = CacheShape::plain(2, 4, 2, 8);
            let mut c = SequenceCache::new(&PolicySpec::parse(spec).unwrap(), shape.clone(), 64, 64).unwrap();
            (0..9).for_each(|p| step(&mut c, p));
            let copy = c.clone();
            assert!(c.checkpoint(), "{spec}");
            (9..13).for_each(|p| step(&mut c, p));
            assert_ne!(state(&c), state(&copy), "{spec}: the steps changed something");
            c.rollback();
            assert_eq!(state(&c), state(&copy), "{spec}: rolled back");
            assert_eq!(c.next_pos(), copy.next_pos());
            let mut copy = copy;
            for p in 9..14 {
                step(&mut c, p);
                step(&mut copy, p);
            }
            assert_eq!(state(&c), state(&copy), "{spec}: continued");
            // commit keeps the steps
            assert!(c.checkpoint());
            step(&mut c, 14);
            c.commit();
            step(&mut copy, 14);
            assert_eq!(state(&c), state(&copy), "{spec}: committed");
            let paged = PolicySpec::parse(&format!("{spec},page=4")).unwrap();
            assert!(!SequenceCache::new(&paged, shape, 64, 64).unwrap().checkpoint(), "paged stores decline");
        }
    }

    /// Returning to any token of a journal equals a copy that was fed only
    /// the tokens up to it (every head evicting at every step), and both
    /// continue identically; where the policy's state moves with the steps
    /// (`random`) or a layer was split among its heads during the journal
    /// (`ada`'s first overflow), `rollback_to` declines and changes nothing.
    #[test]
    fn rollback_to_a_token_equals_feeding_only_the_tokens_before_it() {
        let shape = CacheShape::plain(2, 4, 2, 8);
        for spec in [
            "h2o:heavy=3,recent=2",
            "h2o:heavy=3,recent=2,kv_dtype=q8,score=persist:4",
            "h2o:heavy=3,recent=2,score=vnorm,sink=1",
            "h2o:heavy=4,recent=2,alloc=pyramid:0.5",
            "h2o:heavy=4,recent=2,alloc=ada:0.2",
            "h2o:heavy=3,recent=2,agg=max,score=tova",
            "full",
        ] {
            let spec = PolicySpec::parse(spec).unwrap();
            for kept in 0..=4 {
                let mut c = SequenceCache::new(&spec, shape.clone(), 64, 64).unwrap();
                (0..9).for_each(|p| step(&mut c, p));
                let mut copy = c.clone();
                (9..9 + kept).for_each(|p| step(&mut copy, p));
                assert!(c.checkpoint());
                (9..13).for_each(|p| step(&mut c, p));
                assert!(!c.rollback_to(5), "{spec}: only 4 tokens were fed");
                assert!(c.rollback_to(kept), "{spec}: back to token {kept}");
                assert_eq!(state(&c), state(&copy), "{spec}: after {kept} tokens");
                assert_eq!(c.next_pos(), copy.next_pos());
                for p in 9 + kept..16 {
                    step(&mut c, p);
                    step(&mut copy, p);
                }
                assert_eq!(state(&c), state(&copy), "{spec}: continued from {kept}");
            }
        }
        for (spec, before) in [("random:budget=5,recent=1", 9), ("h2o:heavy=4,recent=2,alloc=ada:0.2", 3)] {
            let mut c = SequenceCache::new(&PolicySpec::parse(spec).unwrap(), shape.clone(), 64, 64).unwrap();
            (0..before).for_each(|p| step(&mut c, p));
            let copy = c.clone();
            assert!(c.checkpoint());
            (before..before + 4).for_each(|p| step(&mut c, p));
            assert!(!c.rollback_to(2), "{spec} declines");
            c.rollback();
            assert_eq!(state(&c), state(&copy), "{spec}: the journal stayed open for rollback");
        }
    }
}
