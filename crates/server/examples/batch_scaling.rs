//! Engine-only decode throughput of `Model::forward_batch` at several batch
//! sizes (no HTTP): `cargo run --release -p kvslim-server --example
//! batch_scaling -- MODEL [STEPS] [BATCH...]`.

use kvslim_cache::PolicySpec;
use kvslim_engine::sampling::argmax;
use kvslim_engine::Session;
use kvslim_models::transformer::{BatchItem, BatchScratch};
use kvslim_models::{load_model, Logits};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).map_or("../shared/models/stories260K/stories260K.bin", String::as_str);
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let batches: Vec<usize> =
        if args.len() > 3 { args[3..].iter().map(|s| s.parse().unwrap()).collect() } else { vec![1, 4, 16, 64] };
    let m = load_model(std::path::Path::new(path)).expect("load model");
    let tok = m.tokenizer.as_ref().expect("tokenizer");
    let prompt = tok.encode("Once upon a time").unwrap();
    let spec = PolicySpec::full();
    for &b in &batches {
        let mut sessions: Vec<Session<'_>> =
            (0..b).map(|_| Session::new(&m.model, &spec, prompt.len() + steps + 1, prompt.len()).unwrap()).collect();
        let mut next: Vec<u32> = sessions.iter_mut().map(|s| argmax(s.feed(&prompt, Logits::Last).unwrap())).collect();
        let mut scratch = BatchScratch::new();
        let t = Instant::now();
        for _ in 0..steps {
            let mut items: Vec<BatchItem<'_>> =
                sessions.iter_mut().zip(&next).map(|(s, &token)| BatchItem { token, cache: &mut s.cache }).collect();
            m.model.forward_batch(&mut items, &mut scratch).unwrap();
            drop(items);
            for (i, n) in next.iter_mut().enumerate() {
                *n = argmax(scratch.logits(i));
            }
        }
        let s = t.elapsed().as_secs_f64();
        println!("batch {b:3}: {:8.0} tok/s ({:.2} ms per step)", (b * steps) as f64 / s, s * 1e3 / steps as f64);
    }
}
