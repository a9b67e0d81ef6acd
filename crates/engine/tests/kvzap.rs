//! KVzap-style calibration and loading: training pairs from a KVzip-style
//! prefill that evicts nothing, a deterministic fit, and the errors a
//! policy gives for a missing or mismatched predictor.

mod common;

use common::{stories, tokens};
use kvslim_cache::PolicySpec;
use kvslim_engine::kvzap::{collect_pairs, fit_kvzap, KvzapOptions};
use kvslim_engine::Session;
use kvslim_models::kvzap::KvzapPredictor;
use kvslim_models::Logits;

/// The pairs are every token's KVzip score, as the KVzip-style prefill
/// gives it, with the layer's normalised hidden state; the fit of the same
/// pairs is the same bytes, and it predicts held-out scores better than
/// chance.
#[test]
fn pairs_fit_deterministically() {
    let m = stories();
    let ids = tokens(&m, 400);
    let c = &m.model.config;
    let windows: Vec<&[u32]> = ids.chunks(100).collect();
    let pairs: Vec<_> = windows.iter().map(|w| collect_pairs(&m.model, w).unwrap()).collect();
    let p = &pairs[0];
    assert_eq!(p.hidden.len(), c.n_layers);
    assert_eq!(p.hidden[0].len(), 100 * c.hidden_size);
    assert_eq!((p.scores.len(), p.scores[0].len(), p.scores[0][0].len()), (c.n_layers, c.n_kv_heads, 100));
    // the scores are the KVzip-style prefill's own: a budget below the
    // prompt keeps the top scores of layer 0, KV head 0
    let spec = PolicySpec::parse("h2o:heavy=40,recent=1,prefill=kvzip").unwrap();
    let mut s = Session::new(&m.model, &spec, 100, 100).unwrap();
    s.feed(windows[0], Logits::None).unwrap();
    let head = s.cache.store().head(0, 0);
    for (&pos, &sc) in head.positions().iter().zip(head.scores()) {
        assert_eq!(sc, p.scores[0][0][pos as usize], "position {pos}");
    }
    let opts = KvzapOptions { text: "tinystories".into(), seq_len: 100 };
    let (a, q) = fit_kvzap(&m.model, &pairs[..3], &pairs[3..], &opts, |_, _| {}).unwrap();
    let (b, _) = fit_kvzap(&m.model, &pairs[..3], &pairs[3..], &opts, |_, _| {}).unwrap();
    assert_eq!(a.to_bytes(), b.to_bytes(), "same pairs, same file");
    assert!(q.spearman_mean > 0.2, "held-out Spearman {}", q.spearman_mean);
    assert!(q.global_overlap_25 > 0.25, "held-out global overlap at 25%: {}", q.global_overlap_25);
    // a fitted file runs as a policy
    let dir = std::env::temp_dir().join(format!("kvslim-kvzap-fit-{}", std::process::id()));
    let file = dir.join("stories.kvzap");
    a.save(&file).unwrap();
    assert_eq!(KvzapPredictor::load(&file).unwrap(), a);
    let spec =
        PolicySpec::parse(&format!("h2o:heavy=20,recent=10,prefill=kvzap:{},alloc=global", file.display())).unwrap();
    let mut s = Session::new(&m.model, &spec, 120, 100).unwrap();
    s.feed(&ids[..100], Logits::Last).unwrap();
    s.feed(&ids[100..101], Logits::Last).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// A predictor for another model, a damaged file, a missing file and no
/// file for the model at all are errors naming the problem (no panic).
#[test]
fn bad_predictors_are_errors() {
    let m = stories();
    let dir = std::env::temp_dir().join(format!("kvslim-kvzap-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ids = tokens(&m, 60);
    let pairs = vec![collect_pairs(&m.model, &ids).unwrap()];
    let opts = KvzapOptions { text: "t".into(), seq_len: 60 };
    let (mut p, _) = fit_kvzap(&m.model, &pairs, &[], &opts, |_, _| {}).unwrap();
    let session_error = |file: &std::path::Path| {
        let spec = PolicySpec::parse(&format!("h2o:heavy=8,recent=8,prefill=kvzap:{}", file.display())).unwrap();
        match Session::new(&m.model, &spec, 60, 60) {
            Ok(_) => panic!("{} was accepted", file.display()),
            Err(e) => e.to_string(),
        }
    };
    p.meta.model = "llama-9l-64d-512v-00000000".into();
    let other = dir.join("other.kvzap");
    p.save(&other).unwrap();
    assert!(session_error(&other).contains("not this one"), "{}", session_error(&other));
    p.meta.model = m.model.fingerprint();
    p.meta.kv_heads += 1;
    p.weights.extend(vec![0.0; m.model.config.n_layers * (m.model.config.hidden_size + 1)]);
    let shape = dir.join("shape.kvzap");
    p.save(&shape).unwrap();
    assert!(session_error(&shape).contains("KV heads"), "{}", session_error(&shape));
    let damaged = dir.join("damaged.kvzap");
    std::fs::write(&damaged, &p.to_bytes()[..100]).unwrap();
    assert!(session_error(&damaged).contains("checksum"), "{}", session_error(&damaged));
    let missing = dir.join("missing.kvzap");
    assert!(session_error(&missing).contains("missing.kvzap"), "{}", session_error(&missing));
    // no file named and none kept for this model: the command that makes one
    let spec = PolicySpec::parse("h2o:heavy=8,recent=8,prefill=kvzap").unwrap();
    if let Err(e) = Session::new(&m.model, &spec, 60, 60) {
        assert!(e.to_string().contains("kvslim calibrate --kvzap"), "{e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
