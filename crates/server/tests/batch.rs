//! Batched decode equals solo decode: 8 sequences with different policies
//! joining the batch at different steps (continuous batching), greedy.

use kvslim_cache::PolicySpec;
use kvslim_engine::sampling::argmax;
use kvslim_engine::{generate, GenerateOptions, SamplingParams, Session};
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{load_model, LoadedModel, Logits};
mod common;

use common::shared;

/// Per sequence: full, window, h2o, sink, CHAI, H2O+CHAI, CHAI-static, full.
fn policies(m: &LoadedModel) -> Vec<String> {
    let c = &m.model.config;
    let k = (c.n_heads / 3).max(1);
    // a plan with k clusters in every layer; static membership: consecutive heads
    let per = c.n_heads.div_ceil(k);
    let static_clusters: Vec<Vec<usize>> =
        (0..c.n_heads).collect::<Vec<_>>().chunks(per).map(|ch| ch.to_vec()).collect();
    let layer = serde_json::json!({
        "k": static_clusters.len(),
        "errors": (0..c.n_heads).map(|i| (c.n_heads - i) as f64).collect::<Vec<_>>(),
        "static_clusters": static_clusters,
    });
    let plan = serde_json::json!({ "layers": vec![layer; c.n_layers] });
    // a fixed name (runs replace their file), written whole before it appears
    let dir = std::env::temp_dir().join("kvslim-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("batch-plan-{}.json", c.n_layers));
    let tmp = dir.join(format!(".batch-plan-{}.{}", c.n_layers, std::process::id()));
    std::fs::write(&tmp, plan.to_string()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let p = path.display();
    vec![
        "full".into(),
        "window:recent=16".into(),
        "h2o:heavy=8,recent=8".into(),
        "sink:sink=4,recent=12".into(),
        format!("chai:plan={p}"),
        format!("h2o:heavy=8,recent=8+chai:plan={p}"),
        format!("chai-static:plan={p}"),
        "full".into(),
    ]
}
const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "Lily and Ben went to the park",
    "The little dog was sad because",
    "One day, a big bird",
    "Tom had a red ball. He",
    "Mom said, \"Let's go home",
    "The sun was hot and the",
    "There was a girl who loved to",
];

fn check_model(m: &LoadedModel, steps: usize) {
    let tok = m.tokenizer.as_ref().expect("tokenizer");
    let model = &m.model;
    let names = policies(m);
    let specs: Vec<PolicySpec> = names.iter().map(|p| PolicySpec::parse_and_load(p).unwrap()).collect();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p).unwrap()).collect();
    let solo: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            let opts = GenerateOptions {
                max_tokens: steps,
                sampling: SamplingParams::default(),
                policy: specs[i].clone(),
                eos: Vec::new(),
            };
            generate(model, &prompts[i], &opts, |_| true).unwrap().token_ids
        })
        .collect();
    // sequence i joins at step 3 * i
    let mut sessions: Vec<Option<Session<'_>>> = (0..8).map(|_| None).collect();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); 8];
    let mut scratch = BatchScratch::new();
    let mut step = 0;
    while out.iter().any(|o| o.len() < steps) {
        for i in 0..8 {
            if sessions[i].is_none() && step >= 3 * i {
                let n = prompts[i].len();
                let mut s = Session::new(model, &specs[i], n + steps, n).unwrap();
                out[i].push(argmax(s.feed(&prompts[i], Logits::Last).unwrap()));
                sessions[i] = Some(s);
            }
        }
        let live: Vec<usize> = (0..8).filter(|&i| sessions[i].is_some() && out[i].len() < steps).collect();
        let mut items: Vec<BatchItem<'_>> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .map(|(i, s)| BatchItem { token: *out[i].last().unwrap(), cache: &mut s.as_mut().unwrap().cache })
            .collect();
        model.forward_batch(&mut items, &mut scratch).unwrap();
        drop(items);
        for (k, &i) in live.iter().enumerate() {
            out[i].push(argmax(scratch.logits(k)));
        }
        step += 1;
    }
    for i in 0..8 {
        assert_eq!(out[i], solo[i], "sequence {i} (policy {}) differs from its solo run", names[i]);
    }
    // the bounded policies really evicted
    let s = sessions[2].as_ref().unwrap();
    assert!(s.cache.len() <= 17, "h2o holds at most B+1 slots, got {}", s.cache.len());
}

#[test]
fn batched_greedy_equals_solo_stories260k() {
    let m = load_model(&shared().join("models/stories260K/stories260K.bin")).expect("load stories260K");
    check_model(&m, 48);
}

#[test]
fn batched_greedy_equals_solo_smollm2() {
    let path = shared().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is absent: the tests need ../shared (or KVSLIM_SHARED)", path.display());
    let m = load_model(&path).expect("load SmolLM2");
    check_model(&m, 12);
}
